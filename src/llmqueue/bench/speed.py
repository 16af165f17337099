"""The engine's speed in one run against another, on steps of the same composition.

:func:`llmqueue.bench.calibrate.run_speed` measures a run's speed against the *linear step
model* fitted on the calibration run: a ratio above 1 means either that the engine ran slower
(the machine, another process, the API server's load) or that the model mispredicts the run's
steps (a load run's small batches and short contexts lie outside the saturation run's range,
where the fit is extrapolated). :func:`matched_speed` tells the two apart without a model: it
compares the step cycles of two runs only where their steps had the same composition (prefill
tokens, decode sequences, context), so a ratio away from 1 is the engine's speed, and one near
1 beside a ``run_speed`` away from 1 is the step model's error.
"""

from __future__ import annotations

import numpy as np

from llmqueue.bench.cycles import step_cycles


def _cells(steps, window, prefill_bin: int, decode_bin: int, ctx_bin: int):
    """The busy step rows in ``window``: their composition cells (prefill tokens, decode
    sequences and KV tokens, each in bins) and their cycle times per step."""
    mask, cyc, _ = step_cycles(steps, window)
    key = np.stack([np.asarray(steps["prefill_tokens"], dtype=np.int64) // prefill_bin,
                    np.asarray(steps["decode_seqs"], dtype=np.int64) // decode_bin,
                    np.asarray(steps["kv_tokens"], dtype=np.int64) // ctx_bin], axis=1)
    return key[mask], cyc[mask]


def matched_speed(steps, ref_steps, *, prefill_bin: int = 32, decode_bin: int = 4, ctx_bin: int = 2048,
                  min_steps: int = 5, window=None, ref_window=None) -> dict | None:
    """How much longer the engine's steps took in ``steps`` than in ``ref_steps`` for the same
    work: busy step cycles (as in ``b``, start to next start) grouped in composition cells of
    ``prefill_bin`` prefill tokens x ``decode_bin`` decode sequences x ``ctx_bin`` KV tokens;
    in each cell with at least ``min_steps`` busy steps in both runs, the ratio of the median
    cycles; the speed is their geometric mean weighted by the smaller of the two counts (1.2:
    the same steps took 20 % longer). A service-time ratio, in queueing terms ``mu_ref / mu``
    at equal work per step.

    Returns ``{"speed", "cells", "steps", "share", "ratios_iqr"}`` (``steps``: the matched busy
    step rows of ``steps``, a row of a simulated decode stretch counting once; ``share``: their fraction of its busy steps; ``ratios_iqr``: the spread of
    the cells' ratios), or None when no cell has enough steps in both runs.
    """
    ka, ca = _cells(steps, window, prefill_bin, decode_bin, ctx_bin)
    kb, cb = _cells(ref_steps, ref_window, prefill_bin, decode_bin, ctx_bin)
    if not len(ka) or not len(kb):
        return None
    ua, ia = np.unique(ka, axis=0, return_inverse=True)
    ub, ib = np.unique(kb, axis=0, return_inverse=True)
    ia, ib = ia.ravel(), ib.ravel()
    where_b = {tuple(k): j for j, k in enumerate(ub)}
    logs, weights, matched = [], [], 0
    for i, k in enumerate(ua):
        j = where_b.get(tuple(k))
        if j is None:
            continue
        xa, xb = ca[ia == i], cb[ib == j]
        if len(xa) < min_steps or len(xb) < min_steps:
            continue
        logs.append(np.log(np.median(xa) / np.median(xb)))
        weights.append(min(len(xa), len(xb)))
        matched += len(xa)
    if not logs:
        return None
    lr, w = np.asarray(logs), np.asarray(weights, dtype=np.float64)
    q1, q3 = np.exp(np.percentile(lr, [25, 75]))
    return {"speed": float(np.exp(np.sum(w * lr) / w.sum())), "cells": len(lr), "steps": int(matched),
            "share": matched / len(ka), "ratios_iqr": (float(q1), float(q3))}


def run_to_run_spread(steps, extra: list, window, names, notes: list) -> tuple[float, str]:
    """The engine's run-to-run speed spread (a log-scale sd): each ``--steps-from`` run's speed
    against this run's on steps of the same composition (:func:`matched_speed`,
    a service-time ratio ``mu_ref / mu`` at equal work), this run counting one; with fewer than two
    runs measured, :data:`llmqueue.margin.DEFAULT_SPEED_SPREAD`, said so. The figure ``validate``
    and ``simulate --margin`` turn into a probability of tipping over the preemption cliff."""
    import math

    from llmqueue.margin import DEFAULT_SPEED_SPREAD

    logs = [0.0]
    if steps is not None and len(steps) and "prefill_tokens" in steps:
        for st in extra:
            m = matched_speed(st, steps, ref_window=window)
            if m is not None and m["speed"] > 0:
                logs.append(math.log(m["speed"]))
    if len(logs) >= 2:
        sd = float(np.std(logs, ddof=1))
        src = f"measured over {len(logs)} runs (this and --steps-from {', '.join(map(str, names))})"
        notes.append(f"engine speed run to run: sd {100 * sd:.3g} % over {len(logs)} runs")
        return sd, src
    return DEFAULT_SPEED_SPREAD, ("a stated default (vLLM's CPU build moved about 7 % run to run on one server); "
                                  "calibrate --steps-from other runs of the server measures it")
