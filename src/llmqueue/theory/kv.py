"""The KV-memory stability model of Nie et al. 2026 (Nie, Si, Zhou, ICML 2026).

A replica holds at most ``M`` tokens of KV cache. A request with prompt length
``s`` and output length ``o``, prefilled in chunks of ``s_hat`` tokens and then
decoded one token per step, occupies ``min(k*s_hat, s)`` tokens after its k-th
prefill step and ``s + j`` tokens after its j-th decode step. Summed over its
steps this is its lifetime memory-work

    g(s, o) = sum_k min(k s_hat, s) + sum_{j=1..o} (s + j)        (token-steps)

whose closed form (exact when ``s_hat`` divides ``s``) is

    g(s, o) = ((1 + s/s_hat) s + 2 o s + (1 + o) o) / 2.

Each engine step (duration ``b``) can hold, hence retire, at most ``M``
token-steps of memory-work, while arrivals bring ``lam * E[g]`` token-steps per
second. So the service rate is

    mu = M / (b * E[g])

and (Theorems 4.1 and 4.2 of the paper) the queue grows without bound under any
policy when ``lam > mu``, and is stable under a work-conserving policy when
``lam < mu (1 - delta)`` with ``delta = max(s + o) / M``. Between the two the
model gives no verdict ("indeterminate").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import positive, positive_int, probability
from llmqueue.errors import InputError

__all__ = [
    "g_steps", "g_exact", "g_closed", "g_paged", "prefill_work", "expected_g", "KvStability", "kv_stability",
    "verdict", "mu_mix", "replicas_needed", "b_bar", "BBar",
]


# --- g(s, o) ------------------------------------------------------------------------------------

def g_steps(s: int, o: int, chunk: int) -> list[int]:
    """KV tokens held by one request after each of its engine steps (the literal trajectory).

    Prefill: ``ceil(s/chunk)`` steps, holding ``min(k*chunk, s)`` tokens after step k;
    decode: ``o`` steps holding ``s+1, ..., s+o``. ``sum(g_steps(s, o, chunk)) == g_exact(s, o, chunk)``.
    """
    s = positive_int("s", s)
    o = positive_int("o", o, minimum=0)
    chunk = positive_int("chunk", chunk)
    pre = [min(k * chunk, s) for k in range(1, -(-s // chunk) + 1)]
    return pre + [s + j for j in range(1, o + 1)]


def prefill_work(s, chunk: int, *, exact: bool = True):
    """Memory-work of the prefill phase: ``sum_k min(k*chunk, s)`` (exact) or ``(1 + s/chunk) s / 2``.

    With ``n = ceil(s/chunk)`` chunks the exact sum is ``chunk * n (n-1) / 2 + s``. Works on scalars
    and numpy arrays.
    """
    s_arr = np.asarray(s, dtype=np.float64)
    if exact:
        n = np.ceil(s_arr / chunk)
        out = chunk * n * (n - 1) / 2.0 + s_arr
    else:
        out = (1.0 + s_arr / chunk) * s_arr / 2.0
    return out if out.ndim else float(out)


def g_exact(s, o, chunk: int):
    """Lifetime KV memory-work g(s, o) in token-steps, summed step by step (vectorized)."""
    s_arr = np.asarray(s, dtype=np.float64)
    o_arr = np.asarray(o, dtype=np.float64)
    out = prefill_work(s_arr, chunk, exact=True) + o_arr * s_arr + o_arr * (o_arr + 1.0) / 2.0
    return out if np.ndim(out) else float(out)


def _blocks_sum(n, B: int):
    """``sum_{x=1..n} ceil(x/B) B``: tokens held, rounded up to whole blocks, summed over x."""
    n = np.asarray(n, dtype=np.float64)
    q = np.floor(n / B)
    r = n - q * B
    return B * B * q * (q + 1.0) / 2.0 + r * B * (q + 1.0)


def g_paged(s, o, chunk: int, block_size: int):
    """g(s, o) with paged KV: the same trajectory as :func:`g_exact`, each step's holding rounded
    up to whole blocks of ``block_size`` tokens (what a paged engine such as vLLM allocates).

    ``sum_k B ceil(min(k chunk, s)/B) + sum_{j=1..o} B ceil((s+j)/B)``; equal to ``g_exact``
    for ``block_size = 1`` (vectorized).
    """
    B = positive_int("block_size", block_size)
    chunk = positive_int("chunk", chunk)
    s_arr = np.asarray(s, dtype=np.float64)
    o_arr = np.asarray(o, dtype=np.float64)
    s_b, o_b = np.broadcast_arrays(s_arr, o_arr)
    n = np.ceil(s_b / chunk)
    pre = B * np.ceil(s_b / B)  # the last prefill step holds the whole prompt
    kmax = int(n.max()) if n.size else 0
    for k in range(1, kmax):  # the full chunks before the last one
        pre = pre + np.where(k < n, B * np.ceil(k * chunk / B), 0.0)
    dec = _blocks_sum(s_b + o_b, B) - _blocks_sum(s_b, B)
    out = pre + dec
    return out if out.ndim else float(out)


def g_closed(s, o, chunk: int):
    """Nie et al.'s closed form ``((1 + s/chunk) s + 2 o s + (1 + o) o) / 2`` (vectorized)."""
    s_arr = np.asarray(s, dtype=np.float64)
    o_arr = np.asarray(o, dtype=np.float64)
    out = ((1.0 + s_arr / chunk) * s_arr + 2.0 * o_arr * s_arr + (1.0 + o_arr) * o_arr) / 2.0
    return out if np.ndim(out) else float(out)


def _pmf_of(dist, field: str):
    """(values, probs) of a length distribution object (with ``pmf()``) or of a sample array."""
    if hasattr(dist, "pmf"):
        v, p = dist.pmf()
        return np.asarray(v, dtype=np.float64), np.asarray(p, dtype=np.float64)
    arr = np.asarray(dist, dtype=np.float64).ravel()
    if arr.size == 0:
        raise InputError(field, "no samples given")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InputError(field, "lengths must be finite and >= 0")
    v, counts = np.unique(arr, return_counts=True)
    return v, counts / counts.sum()


def expected_g(*, chunk: int, prompt=None, output=None, pairs=None, exact: bool = True,
               block_size: int | None = None) -> float:
    """E[g(s, o)] in token-steps.

    ``block_size``: memory-work in whole KV blocks (:func:`g_paged`); with marginals the
    expectation is then taken over the product of the two pmfs.

    Either independent marginals ``prompt`` and ``output`` (length-distribution objects with
    ``pmf()``, or arrays of samples), for which the expectation is computed exactly from the
    pmfs using ``E[g] = E[pre(s)] + E[s] E[o] + E[o (o+1)] / 2``; or ``pairs``, an object with
    ``prompts``/``outputs`` arrays or a ``(prompts, outputs)`` tuple of equal-length samples whose
    correlation is kept (the sample average of g).
    """
    chunk = positive_int("chunk", chunk)
    if pairs is not None:
        s, o = _pairs_arrays(pairs)
        if block_size:
            return float(np.mean(g_paged(s, o, chunk, block_size)))
        g = g_exact(s, o, chunk) if exact else g_closed(s, o, chunk)
        return float(np.mean(g))
    if prompt is None or output is None:
        raise InputError("prompt/output", "give both prompt and output length distributions, or pairs")
    sv, sp = _pmf_of(prompt, "prompt")
    ov, op = _pmf_of(output, "output")
    if block_size:
        g = g_paged(sv[:, None], ov[None, :], chunk, block_size)
        return float(sp @ g @ op)
    e_pre = float(np.dot(sp, prefill_work(sv, chunk, exact=exact)))
    e_s = float(np.dot(sp, sv))
    e_o = float(np.dot(op, ov))
    e_oo = float(np.dot(op, ov * (ov + 1.0)))
    return e_pre + e_s * e_o + e_oo / 2.0


def _pairs_arrays(pairs):
    if hasattr(pairs, "prompts") and hasattr(pairs, "outputs"):
        s, o = pairs.prompts, pairs.outputs
    else:
        s, o = pairs
    s = np.asarray(s, dtype=np.float64).ravel()
    o = np.asarray(o, dtype=np.float64).ravel()
    if s.size == 0 or s.size != o.size:
        raise InputError("pairs", f"need equal, non-zero numbers of prompt and output lengths (got {s.size} and {o.size})")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(o))) or np.any(s < 0) or np.any(o < 0):
        raise InputError("pairs", "lengths must be finite and >= 0")
    return s, o


def _max_total(prompt=None, output=None, pairs=None) -> float:
    """ess sup (s + o): the largest request, used for delta."""
    if pairs is not None:
        s, o = _pairs_arrays(pairs)
        return float(np.max(s + o))
    return float(np.max(_pmf_of(prompt, "prompt")[0]) + np.max(_pmf_of(output, "output")[0]))


# --- the stability threshold --------------------------------------------------------------------

def verdict(lam: float, mu: float, delta: float) -> str:
    """Nie et al.'s verdict: ``"stable"`` if ``lam < mu (1 - delta)``, ``"unstable"`` if ``lam > mu``,
    else ``"indeterminate"`` (the theorems do not decide the band in between)."""
    lam = positive("lam", lam)
    if lam > mu:
        return "unstable"
    if lam < mu * (1.0 - delta):
        return "stable"
    return "indeterminate"


def replicas_needed(lam: float, mu: float, rho_target: float) -> int:
    """Identical replicas ``G >= lam / (mu rho_target)`` behind a balanced router (Nie et al. 2026, 8.2).

    A thin wrapper over :func:`llmqueue.theory.cost.replicas_for_utilization`.
    """
    from llmqueue.theory.cost import replicas_for_utilization

    return replicas_for_utilization(lam=lam, mu=mu, rho_target=rho_target).c


def mu_mix(mus: Sequence[float], weights: Sequence[float]) -> float:
    """Service rate of a piecewise-stationary mix: ``(sum_l q_l / mu_l)^-1`` (harmonic, Nie et al. 2026 5.1).

    ``weights`` are the request shares ``q_l`` (normalized here); the mix spends ``q_l / mu_l``
    seconds of capacity per request of workload ``l``.
    """
    if len(mus) == 0 or len(mus) != len(weights):
        raise InputError("weights", f"need one weight per mu (got {len(mus)} mus, {len(weights)} weights)")
    mus = [positive("mu", m) for m in mus]
    w = [positive("weights", q) for q in weights]
    total = sum(w)
    return 1.0 / sum((q / total) / m for q, m in zip(w, mus))


@dataclass(frozen=True)
class KvStability(Result):
    """Nie et al.'s capacity for one replica.

    ``M`` KV capacity (tokens), ``b`` representative step time (s), ``chunk`` prefill chunk,
    ``E_g`` and ``E_g_closed`` expected memory-work per request (token-steps; step-exact sum and
    the paper's closed form), ``mu`` and ``mu_closed_form`` the matching service rates (req/s),
    ``delta = max(s+o)/M``, ``mu_stable_below = mu (1 - delta)``. With a rate: ``lam``, ``rho = lam/mu``,
    ``verdict``; with a target utilization: ``rho_target`` and ``replicas`` (G). ``block_size``:
    set when ``E_g`` was counted in whole KV blocks (paged).
    """

    M: float
    b: float
    chunk: int
    E_g: float
    E_g_closed: float
    mu: float
    mu_closed_form: float
    delta: float
    max_request_tokens: float
    mu_stable_below: float
    lam: float | None = None
    rho: float | None = None
    verdict: str | None = None
    rho_target: float | None = None
    replicas: int | None = None
    block_size: int | None = None


def kv_stability(*, M: float, b: float, chunk: int, prompt=None, output=None, pairs=None,
                 lam: float | None = None, rho_target: float | None = None,
                 block_size: int | None = None) -> KvStability:
    """Nie et al.'s ``mu = M / (b E[g])`` with ``delta``, and optionally a verdict and a replica count.

    ``prompt``/``output``: independent length distributions (objects with ``pmf()``) or samples;
    ``pairs``: joint samples that keep the (s, o) correlation. ``block_size``: paged KV, ``E[g]``
    counted in whole blocks (:func:`g_paged`; ``E_g`` then holds the paged value and
    ``E_g_closed`` stays the paper's token-granular closed form).
    """
    M = positive("M", M)
    b = positive("b", b)
    chunk = positive_int("chunk", chunk)
    if block_size is not None:
        block_size = positive_int("block_size", block_size)
    e_g = expected_g(chunk=chunk, prompt=prompt, output=output, pairs=pairs, exact=True, block_size=block_size)
    e_gc = expected_g(chunk=chunk, prompt=prompt, output=output, pairs=pairs, exact=False)
    if not (e_g > 0 and e_gc > 0):
        raise InputError("lengths" if pairs is not None else "prompt", "every request has 0 prompt and 0 output "
                         "tokens: it holds no KV memory, so mu = M / (b E[g]) is unbounded",
                         "give lengths of at least 1 token")
    mu = M / (b * e_g)
    max_tot = _max_total(prompt, output, pairs)
    delta = max_tot / M
    fields = dict(block_size=block_size, M=M, b=b, chunk=chunk, E_g=e_g, E_g_closed=e_gc, mu=mu, mu_closed_form=M / (b * e_gc),
                  delta=delta, max_request_tokens=max_tot, mu_stable_below=mu * max(0.0, 1.0 - delta))
    if lam is not None:
        lam = positive("lam", lam)
        fields.update(lam=lam, rho=lam / mu, verdict=verdict(lam, mu, delta))
    if rho_target is not None:
        if lam is None:
            raise InputError("rho_target", "a replica count needs an arrival rate", "give lam (--rate) too")
        fields.update(rho_target=rho_target, replicas=replicas_needed(lam, mu, rho_target))
    return KvStability(**fields)


# --- estimating b ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class BBar(Result):
    """Estimators of the representative step time ``b`` from step-time samples (seconds):
    mean, median and alpha-trimmed means (Nie et al. 2026, appendix C), with the sample count and CV."""

    n: int
    mean: float
    median: float
    trimmed: dict
    cv: float


def b_bar(step_times, *, alphas: Sequence[float] = (0.05, 0.10)) -> BBar:
    """Mean, median and alpha-trimmed means (``alpha`` cut from each tail) of step times.

    Nie et al. 2026 uses the median for concentrated step times and 5-10% trimmed means when the
    distribution has a heavy tail (prompt-heavy workloads).
    """
    x = np.asarray(step_times, dtype=np.float64).ravel()
    if x.size == 0:
        raise InputError("step_times", "no samples given")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise InputError("step_times", "step times must be finite and > 0")
    from scipy.stats import trim_mean

    trimmed = {}
    for a in alphas:
        a = probability("alpha", a, open_low=False)
        if a >= 0.5:
            raise InputError("alpha", f"must be < 0.5 (got {a})")
        trimmed[f"{a:g}"] = float(trim_mean(x, a))
    mean = float(x.mean())
    return BBar(n=int(x.size), mean=mean, median=float(np.median(x)), trimmed=trimmed,
                cv=float(x.std(ddof=1) / mean) if x.size > 1 else 0.0)
