"""A measured step-time surface (``llmqueue profile``) as a step-time model: ``profile:DIR``.

In queueing terms the engine is a batch server whose service time per step depends on the
batch it serves. A linear law ``c0 + c_decode n`` fitted where a saturation run spends its time
(batches of 30-60) misses the small batches a lightly loaded server runs, because a decode
step's cost is concave in the batch: the weights are read once per step whatever the batch, so
the first sequences cost little more than one. Measured on vLLM (issue 17): one-sequence steps
took 19.6 ms where the line said 9.7 ms, so TPOT at low load was under-predicted by 40 %.

:class:`ProfileStepTime` prices a step from the measured surface instead:

- **decode**: per profiled context length (a row), the measured step time at each decode batch
  size ``n`` (the median inter-token latency of a closed loop of ``n`` sequences, or the median
  step cycle of the server's iteration log), made non-decreasing in ``n`` *within the noise*
  (:func:`pool_within_noise`: pool-adjacent-violators, weighted by the samples, that pools two
  neighbours only where the larger batch's dip is within two standard errors of their levels), and
  joined by monotone cubic interpolation (PCHIP: it passes through every point, never overshoots,
  and keeps a concave curve concave). A dip beyond the noise is the engine's, and is kept: a step
  at ``n`` sequences need not cost more than at ``n - 1`` when the kernels change with the batch
  (vLLM's CPU build on an AMD EPYC ran batch 4's decode step in 6.6 ms against batch 2's 8.5 ms,
  in both passes of the profile and in held-out runs alike).
  A level's standard error is its median's (from the quartiles and the sample count) and the
  engine's wander between passes (:func:`level_noise`); a profile of one pass cannot tell that
  wander from a dip, so its dips are all pooled (on an H100 under ``transformers serve``, one
  pass measured 73, 119, 131 and 82 ms at batch 1, 2, 4 and 8, and the pooled curve predicted the
  0.5x load's TTFT and TPOT within 15 % where the followed one missed its TTFT p50 by 38 %).
  At each batch the rows are made non-decreasing in the context (pool-adjacent-violators, every
  violation pooled: more KV read never costs less). Below a row's smallest
  batch the step costs what it costs there; above its largest, the row's last segment goes on
  (its slope at least 0). Between rows the step is linear in the per-sequence context
  ``C / n`` (exact for attention whose cost is proportional to the KV tokens read); below the
  shortest profiled context it costs what it costs there, above the longest the two longest
  rows' slope goes on (at least 0).
- **prefill**: ``intercept + per_token x P`` fitted on isolated requests' prefill times (their
  TTFT, less the server's frontend delay where the iteration log measured it).
- **mixed step** (``P`` prompt tokens and ``n >= 1`` decodes): ``decode(n, C) + per_token x P``.
  A step's fixed cost (weights streamed once, scheduling, sampling) is paid once per step: it is
  already in the decode curve (a one-sequence step is mostly that) and in the prefill
  intercept, so only the prompt tokens' marginal cost (the prefill line's slope) is added.
  A prefill-only step is ``intercept + per_token x P``.

``scale``: every step that many times as long (``calibrate --profile``: the profile gives the
shape, a saturation run the level). Noise and drift suffixes wrap the model as for the built-in
ones. Spec: ``profile:DIR`` or ``profile:DIR/profile.json``, optionally ``:scale=X``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from llmqueue.engine.step_model import with_drift
from llmqueue.errors import InputError

PROFILE_FILE = "profile.json"
FORMAT = "llmqueue-profile"

_cache: dict = {}


def isotonic(y, w=None) -> np.ndarray:
    """The non-decreasing sequence closest to ``y`` in weighted least squares (pool adjacent violators)."""
    return pool_within_noise(y, w)


NOISE_Z = 2.0
"""A dip (a larger batch measured faster) is kept when it exceeds this many standard errors."""
MIN_LEVEL_NOISE = 0.02
"""The least relative standard error of a pooled level: an engine's level never repeats closer."""


def _pass_rel_se(c: dict) -> float | None:
    """A cell's relative standard error from its passes: ``sd(pass medians) / mean / sqrt(k)``;
    None with fewer than two passes."""
    pm = c.get("pass_medians_s")
    if not isinstance(pm, list) or len(pm) < 2:
        return None
    v = np.asarray(pm, dtype=np.float64)
    if not (np.isfinite(v).all() and v.mean() > 0):
        return None
    return float(v.std(ddof=1) / v.mean() / math.sqrt(len(v)))


def level_noise(cells) -> float | None:
    """The relative standard error of a pooled level from the engine's wander between passes: the
    median over the cells measured in two or more passes of their own (:func:`_pass_rel_se`), at
    least :data:`MIN_LEVEL_NOISE`; None when no cell was measured twice (a one-pass profile cannot
    tell the engine's wander between levels from a dip of the engine's own)."""
    rel = [r for r in (_pass_rel_se(c) for c in cells) if r is not None]
    if not rel:
        return None
    return max(float(np.median(rel)), MIN_LEVEL_NOISE)


def cell_sd(c: dict, noise: float | None) -> float:
    """A decode cell's standard error (seconds): its median's, ``1.2533 x (IQR / 1.349) / sqrt(count)``
    where the quartiles are known, and its level's, the profile's relative ``noise`` of it, in
    quadrature (infinite with ``noise`` None: every dip is then pooled). The level's noise is
    pooled over the profile's cells: a cell's own two passes are one degree of freedom."""
    if noise is None:
        return math.inf
    m = float(c["median_s"])
    se = 0.0
    try:
        iqr = float(c["p75_s"]) - float(c["p25_s"])
        cnt = max(float(c.get("count", 1)), 1.0)
        if math.isfinite(iqr) and iqr > 0:
            se = 1.2533 * iqr / 1.349 / math.sqrt(cnt)
    except (KeyError, TypeError, ValueError):
        pass
    return math.hypot(se, noise * m)


def pool_within_noise(y, w=None, sd=None, z: float = NOISE_Z) -> np.ndarray:
    """``y`` made non-decreasing where its dips are noise: pool adjacent violators (weighted by ``w``),
    but two neighbouring blocks whose dip exceeds ``z`` standard errors (``sd``: each point's; a
    pooled block's is the weighted mean of its points') stay apart. Without ``sd`` every dip is
    pooled (:func:`isotonic`: the weighted least-squares non-decreasing fit)."""
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(len(y)) if w is None else np.asarray(w, dtype=np.float64)
    sd = np.full(len(y), math.inf) if sd is None else np.asarray(sd, dtype=np.float64)
    vals: list[float] = []
    wts: list[float] = []
    var: list[float] = []
    sizes: list[int] = []
    for yi, wi, si in zip(y.tolist(), w.tolist(), sd.tolist()):
        vals.append(yi)
        wts.append(wi)
        var.append(si * si)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1] and vals[-2] - vals[-1] <= z * math.sqrt(var[-2] + var[-1]):
            wsum = wts[-2] + wts[-1]
            vals[-2:] = [(vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum]
            var[-2:] = [(var[-2] * wts[-2] + var[-1] * wts[-1]) / wsum]
            wts[-2:] = [wsum]
            sizes[-2:] = [sizes[-2] + sizes[-1]]
    return np.repeat(vals, sizes)


def profile_path(where, field: str = "step_time") -> Path:
    """``DIR/profile.json`` for a directory, the file itself for a file; an :class:`InputError` otherwise."""
    p = Path(str(where)).expanduser()
    if p.is_dir():
        p = p / PROFILE_FILE
    if not p.is_file():
        raise InputError(field, f"no profile at {where} (no {PROFILE_FILE})",
                         "give the --out directory of llmqueue profile")
    return p


def rebase_spec(spec, base, *, relative: bool):
    """A ``profile:DIR[:...]`` step-time spec with DIR made relative to ``base`` (a calibration
    file's folder, when DIR lies under it: the file and its profile then move together) or, with
    ``relative=False``, a relative DIR resolved against ``base``. Any other spec is returned as is."""
    import os

    if not isinstance(spec, str) or not spec.startswith("profile:"):
        return spec
    parts = spec.split(":")
    keep = [i for i, x in enumerate(parts[1:], 1) if "=" not in x]
    if not keep:
        return spec
    path = ":".join(parts[i] for i in keep)
    base = Path(base)
    if relative:
        full = Path(path).resolve()
        try:
            new = full.relative_to(base.resolve()).as_posix() or "."
        except ValueError:
            return spec
    else:
        if os.path.isabs(os.path.expanduser(path)):
            return spec
        new = str(base / path)
    rest = [x for i, x in enumerate(parts[1:], 1) if i not in keep]
    return ":".join(["profile", new, *rest])


def read_profile(where, field: str = "step_time") -> dict:
    """The content of a ``profile.json`` (checked: the keys the model needs, finite positive times)."""
    p = profile_path(where, field)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InputError(field, f"{p} is not a readable profile ({type(e).__name__})",
                         "rerun llmqueue profile") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(field, f"{p} is not an llmqueue profile (format is not {FORMAT!r})", "rerun llmqueue profile")
    cells = doc.get("decode")
    pre = doc.get("prefill")
    if not isinstance(cells, list) or not cells or not isinstance(pre, dict):
        raise InputError(field, f"{p} has no decode cells or no prefill fit", "rerun llmqueue profile")
    for i, c in enumerate(cells):
        try:
            ok = (isinstance(c, dict) and int(c["batch"]) >= 1 and math.isfinite(float(c["median_s"]))
                  and float(c["median_s"]) > 0 and math.isfinite(float(c["context_tokens"]))
                  and float(c["context_tokens"]) >= 0 and not isinstance(c["batch"], bool))
        except (KeyError, TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise InputError(field, f"{p}: decode cell {i} is malformed",
                             "each needs batch >= 1, median_s > 0 and context_tokens >= 0")
    try:
        slope, icpt = float(pre["per_token_s"]), float(pre["intercept_s"])
    except (KeyError, TypeError, ValueError):
        raise InputError(field, f"{p}: the prefill fit needs per_token_s and intercept_s") from None
    if not (math.isfinite(slope) and math.isfinite(icpt) and slope >= 0 and icpt >= 0 and slope + icpt > 0):
        raise InputError(field, f"{p}: the prefill fit must be finite and >= 0, not both 0 "
                                f"(per_token_s {slope!r}, intercept_s {icpt!r})")
    return doc


def _rows(cells, noise: float | None = None) -> list[tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Decode cells grouped by their row (``row`` key, else the prompt length, else the context):
    ``(context per sequence, batches, seconds, samples, standard errors)`` sorted by context,
    batches ascending (:func:`cell_sd` with the level ``noise``)."""
    groups: dict = {}
    for c in cells:
        key = c.get("row", c.get("prompt_tokens", c["context_tokens"]))
        groups.setdefault(key, []).append(c)
    rows = []
    for cs in groups.values():
        by_batch: dict[int, list] = {}
        for c in cs:
            by_batch.setdefault(int(c["batch"]), []).append(c)
        b = np.array(sorted(by_batch), dtype=np.int64)
        # one cell per batch (a repeated batch: the sample-weighted mean of its medians)
        w = np.array([sum(max(float(c.get("count", 1)), 1.0) for c in by_batch[k]) for k in b.tolist()])
        s = np.array([np.average([float(c["median_s"]) for c in by_batch[k]],
                                 weights=[max(float(c.get("count", 1)), 1.0) for c in by_batch[k]]) for k in b.tolist()])
        sd = np.array([np.average([c["_sd"] if "_sd" in c else cell_sd(c, noise) for c in by_batch[k]],
                                  weights=[max(float(c.get("count", 1)), 1.0) for c in by_batch[k]]) for k in b.tolist()])
        ctx = float(np.mean([float(c["context_tokens"]) for c in cs]))
        rows.append((ctx, b, s, w, sd))
    rows.sort(key=lambda r: r[0])
    # two rows at one context: keep them apart by merging (their mean at each shared batch)
    merged: list = []
    for r in rows:
        if merged and r[0] == merged[-1][0]:
            cells2 = [{"row": 0, "batch": int(b), "median_s": float(s), "count": float(w), "context_tokens": r[0],
                       "_sd": float(sd)} for rr in (r, merged[-1]) for b, s, w, sd in zip(*rr[1:])]
            merged[-1] = _rows(cells2, noise)[0]
        else:
            merged.append(r)
    return merged


class ProfileStepTime:
    """A step-time model from a measured profile (see the module docstring).

    ``contexts``: per-sequence context of each row (tokens); ``rows``: per row, ``(batches,
    seconds)``, the measured levels pooled within the noise (``level_noise``: the level's relative
    standard error; ``monotone``: every dip pooled, the rule before dips were kept, for
    comparison); ``table[j, n]``: row ``j``'s decode step at ``n``
    sequences for ``n <= nmax``; ``tail[j]``: its slope beyond. ``prefill_per_token_s``,
    ``prefill_intercept_s``: the prefill line. ``scale``: a factor on every step.
    """

    def __init__(self, doc: dict, *, source: str = "", scale: float = 1.0, monotone: bool = False):
        from scipy.interpolate import PchipInterpolator

        self.source = str(source)
        self.scale = float(scale)
        self.monotone = bool(monotone)
        self.doc = doc
        pre = doc["prefill"]
        self.prefill_per_token_s = float(pre["per_token_s"])
        self.prefill_intercept_s = float(pre["intercept_s"])
        self.frontend_latency_s = pre.get("frontend_latency_s")
        self.level_noise = level_noise(doc["decode"])
        rows = _rows(doc["decode"], self.level_noise)
        self.contexts = np.array([r[0] for r in rows], dtype=np.float64)
        self.rows = [(r[1], isotonic(r[2], r[3]) if monotone else pool_within_noise(r[2], r[3], r[4])) for r in rows]
        self.nmax = int(max(int(b.max()) for b, _ in self.rows))
        n = np.arange(self.nmax + 1, dtype=np.float64)
        table = np.empty((len(rows), self.nmax + 1))
        tail = np.zeros(len(rows))
        for j, (b, s) in enumerate(self.rows):
            bf = b.astype(np.float64)
            if len(b) >= 2:
                slope = max(float((s[-1] - s[-2]) / (bf[-1] - bf[-2])), 0.0)
                inside = np.clip(n, bf[0], bf[-1])
                v = PchipInterpolator(bf, s)(inside)
                v = np.where(n > bf[-1], s[-1] + slope * (n - bf[-1]), v)
            else:
                slope = 0.0
                v = np.full(len(n), s[0])
            table[j] = v
            tail[j] = slope
        if len(rows) > 1:  # non-decreasing in the context too, at every batch (more KV read never costs less)
            w = np.array([float(r[3].sum()) for r in rows])
            for n_ in range(self.nmax + 1):
                col = table[:, n_]
                if (np.diff(col) < 0).any():
                    table[:, n_] = isotonic(col, w)
            tail = np.maximum.accumulate(tail) if (np.diff(tail) < 0).any() else tail
        self.table = table
        self.tail = tail
        self._hi = float(self.contexts[-1])
        self.spec = f"profile:{self.source}" + (f":scale={self.scale:g}" if self.scale != 1.0 else "")

    # -- the decode surface ---------------------------------------------------------------------
    def _row_values(self, n: int) -> np.ndarray:
        """Every row's decode step at ``n`` sequences."""
        if n <= self.nmax:
            return self.table[:, n]
        return self.table[:, self.nmax] + self.tail * (n - self.nmax)

    def _hi_slope(self, v: np.ndarray) -> float:
        if len(v) < 2:
            return 0.0
        s = (v[-1] - v[-2]) / (self.contexts[-1] - self.contexts[-2])
        return float(s) if s > 0 else 0.0

    def decode_step(self, n: int, per_seq_context) -> np.ndarray | float:
        """The (unscaled) decode step of ``n`` sequences at this per-sequence context (array or number)."""
        v = self._row_values(int(n))
        x = np.interp(per_seq_context, self.contexts, v)
        hs = self._hi_slope(v)
        if hs > 0:
            x = x + hs * np.maximum(np.asarray(per_seq_context, dtype=np.float64) - self._hi, 0.0)
        return x

    # -- the StepTime protocol --------------------------------------------------------------------
    def base(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Seconds of a step of ``prefill_tokens`` prompt tokens and ``decode_seqs`` decodes over
        ``context_tokens`` KV tokens (see the module docstring for the mixed-step rule)."""
        if decode_seqs >= 1:
            d = self.decode_step(decode_seqs, np.array([context_tokens / decode_seqs]))[0]
            if prefill_tokens:
                d = d + self.prefill_per_token_s * prefill_tokens
            return float(d * self.scale)
        return float((self.prefill_intercept_s + self.prefill_per_token_s * prefill_tokens) * self.scale)

    def decode_stretch(self, n: int, ctx0: int, k: int) -> np.ndarray:
        """``k`` decode-only steps of ``n`` sequences, the context growing by ``n`` a step: the
        same prices as :meth:`base`, vectorized."""
        ctx = ctx0 + n * np.arange(k, dtype=np.float64)
        return self.decode_step(n, ctx / n) * self.scale

    # -- what the commands ask of a step-time model ------------------------------------------------
    def scaled(self, f: float) -> "ProfileStepTime":
        """This model with every step ``f`` times as long."""
        from llmqueue._validate import positive

        return ProfileStepTime(self.doc, source=self.source, scale=self.scale * positive("scale", f),
                               monotone=self.monotone)

    def with_drift(self, sd: float, span_s: float = 10.0):
        """This model with the engine's speed drifting by ``sd`` over windows of ``span_s`` seconds."""
        return with_drift(self, sd, span_s) if sd > 0 else self

    def mean_factor(self) -> float:
        return 1.0


def load_profile_model(where, *, scale: float = 1.0, field: str = "step_time") -> ProfileStepTime:
    """The :class:`ProfileStepTime` of ``DIR`` (or ``DIR/profile.json``), cached by path and mtime."""
    p = profile_path(where, field)
    key = (str(p.resolve()), p.stat().st_mtime_ns)
    doc = _cache.get(key)
    if doc is None:
        doc = read_profile(p, field)
        _cache.clear()
        _cache[key] = doc
    src = str(where)
    try:
        return ProfileStepTime(doc, source=src, scale=scale)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise InputError(field, f"{p}: the decode cells do not make a step-time surface ({e})",
                         "rerun llmqueue profile") from None
