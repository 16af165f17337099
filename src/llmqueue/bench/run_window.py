"""The window a measured run's statistics cover, as ``bench`` sets it and ``import`` repeats it.

``[warm-up, horizon)``: the horizon is the run's end (the client's, when it knows it) or its last
finish or arrival, whichever is later; the requests arriving in the warm-up are left out. A
warm-up not shorter than the run is ignored, said in a note. vLLM's ITL (the gaps between
streamed chunks) counts the ok requests arriving in the window, in the order the gaps ended.
"""

from __future__ import annotations

import numpy as np


def run_window(recs, warmup_s: float, t_end: float, notes: list) -> tuple[float, float]:
    """``(warm-up, horizon)`` of the statistics of the records ``recs`` (arrival and finish times
    from the run's start) for a run that ended at ``t_end`` (0 when unknown); a warm-up not
    shorter than the run is ignored (appended to ``notes``)."""
    n = len(recs)
    fin = recs["finish_s"]
    horizon = max(t_end, float(np.nanmax(fin)) if n and np.isfinite(fin).any() else t_end,
                  float(recs["arrival_s"].max()) if n else 0.0)
    warm = float(warmup_s)
    if not horizon > warm:
        notes.append(f"warm-up {warm:g} s is not shorter than the run ({horizon:.3g} s): ignored")
        warm = 0.0
    return warm, (horizon if horizon > 0 else 1e-9)


def window_itl(recs, counts, offs, tt, window) -> np.ndarray:
    """vLLM's ITL: the inter-chunk gaps of the ok attempts arriving in ``window``, in time order;
    attempt ``r``'s chunk times are ``tt[offs[r]:offs[r] + counts[r]]``."""
    warm, horizon = window
    arr = recs["arrival_s"]
    ok = (recs["status"] == "ok") & (arr >= warm) & (arr < horizon)
    gaps_t, gaps = [], []
    for r in np.flatnonzero(ok & (counts > 1)).tolist():
        t = tt[offs[r]:offs[r] + counts[r]]
        gaps_t.append(t[1:])
        gaps.append(np.diff(t))
    if not gaps:
        return np.zeros(0)
    return np.concatenate(gaps)[np.argsort(np.concatenate(gaps_t), kind="stable")]
