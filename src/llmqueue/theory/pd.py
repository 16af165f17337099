"""Closed forms for prefill/decode disaggregation: a tandem of two batch-server pools and a link.

A P/D deployment is a tandem (Jackson-like) network: ``P`` prefill replicas compute each prompt
and its first token, the request's KV (``beta`` bytes per token x ``s`` prompt tokens) crosses a
FCFS link of rate ``r`` bytes/s, and ``D`` decode replicas generate the remaining ``o - 1``
tokens. Arrivals at ``lam`` enter the prefill pool; the share ``q = P(o > 1)`` goes on to the link
and the decode pool (``lam_D = q lam``). Each station needs its own load below one:

- **prefill replica** (one request = ``ceil(s / chunk)`` steps, no decode): with step time ``b``
  at the capacity point, the slot bound ``mu_seqs = max_num_seqs / (b E[ceil(s / chunk)])``,
  the token-budget bound ``mu_tokens = chunk / (b E[s])`` and the KV bound of Nie et al. with
  only the prefill's memory-work ``g_P(s) = sum_k min(k chunk, s)``: ``mu_kv = M / (b E[g_P])``;
  ``b = base(P_tok, 0, 0)`` with ``P_tok = min(mu b E[s], chunk)`` prompt tokens a step (a fixed
  point, as :func:`llmqueue.theory.replica.saturated_capacity`);
- **decode replica** (seed 004's ``mu`` with the prefill removed: a request arrives with its
  prompt's KV and holds ``s + j`` tokens after its ``j``-th decode step, ``j = 1 .. o - 1``):
  ``g_D(s, o) = (o - 1) s + (o - 1) o / 2`` token-steps, ``mu_kv = M / (b E[g_D])``, the slot
  bound ``mu_seqs = max_num_seqs / (b E[o - 1])`` and the budget bound
  ``mu_tokens = max_num_batched_tokens / (b E[o - 1])`` (one token a decode), the expectations
  over the requests that decode (``o > 1``); ``b = base(0, n, C)`` with
  ``n = min(mu b E[o - 1], max_num_seqs)`` running decodes over a context
  ``C = n E[(o - 1)(s + o / 2)] / E[o - 1]`` (capped at ``M``);
- **the link**, an M/G/1 server with service ``beta s / r``: utilization
  ``rho_L = lam_D beta E[s | o > 1] / r``; its capacity in decoding requests is
  ``r / (beta E[s | o > 1])``.

The deployment's rate bound (total arrivals, req/s) is the least of ``P mu_P``,
``D mu_D / q`` and ``r / (q beta E[s | o > 1])``.

**TPOT lower bound.** A request's TPOT is ``(finish - first token) / (o - 1)``, and its first
token is made on the prefill side, so the transfer sits inside it: alone on an idle link and
decode replica, ``TPOT_i >= base(0, 1, s_i) + (beta s_i / r + latency) / (o_i - 1)``. Every
request's TPOT is at least its own bound, so any percentile of TPOT is at least the same
percentile of the bounds (order statistics are monotone); :func:`tpot_floor` returns the
median of the bounds (a percentile target at or above the 50th is at least that).
``base(0, 1, C)`` grows with ``C``, so evaluating it at ``s_i`` rounded down to a grid keeps the
bound a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmqueue.theory.replica import BINDING


@dataclass(frozen=True)
class PoolCapacity:
    """One replica of a P/D pool: ``mu`` (req/s it serves), the binding bound's name (as
    :data:`llmqueue.theory.replica.BINDING`), ``b`` (s) at the capacity point and every bound."""

    mu: float
    binding: str
    b: float
    bounds: dict


def _fixed_point(bounds_of, step_of, b0: float, tol: float = 1e-9, max_iter: int = 200) -> PoolCapacity | None:
    """Solve ``b = step_of(mu(b))`` with ``mu(b) = min(bounds_of(b))`` by damped iteration."""
    b = b0
    if not (b > 0 and math.isfinite(b)):
        return None
    for _ in range(max_iter):
        bounds = bounds_of(b)
        mu = min(bounds.values())
        b_new = float(step_of(mu, b))
        if not (b_new > 0 and math.isfinite(b_new)):
            return None
        if abs(b_new - b) <= tol * b:
            bounds = bounds_of(b_new)
            name = min(bounds, key=bounds.get)
            return PoolCapacity(mu=bounds[name], binding=BINDING[name], b=b_new, bounds=bounds)
        b = 0.5 * (b + b_new)
    return None


def prefill_capacity(base, *, M: float, max_num_seqs: int, max_num_batched_tokens: int, prompt_tokens,
                     long_prefill_token_threshold: int = 0) -> PoolCapacity | None:
    """``mu_P`` of one prefill replica (see the module docstring); None without a fixed point."""
    from llmqueue.theory.kv import prefill_work

    s = np.asarray(prompt_tokens, dtype=np.float64)
    budget = int(max_num_batched_tokens)
    chunk = min(budget, long_prefill_token_threshold) if long_prefill_token_threshold else budget
    Es = float(s.mean())
    steps = float(np.mean(np.ceil(s / chunk)))
    g = float(np.mean(prefill_work(s, chunk)))

    def bounds_of(b):
        return {"mu_seqs": max_num_seqs / (b * steps), "mu_tokens": budget / (b * Es), "mu_kv": M / (b * g)}

    def step_of(mu, b):
        return base(min(mu * b * Es, float(budget)), 0, 0)

    return _fixed_point(bounds_of, step_of, float(base(min(Es, budget), 0, 0)))


def _decoding(prompt_tokens, output_tokens):
    """The (prompt, output) lengths of the requests that decode (``o > 1``: they reach the decode
    pool), as float arrays; None when none does."""
    s = np.asarray(prompt_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    keep = o > 1
    if not keep.any():
        return None
    return s[keep], o[keep]


def decode_capacity(base, *, M: float, max_num_seqs: int, max_num_batched_tokens: int, prompt_tokens,
                    output_tokens) -> PoolCapacity | None:
    """``mu_D`` of one decode replica over the requests that decode (``o > 1``); None when none
    does or without a fixed point."""
    got = _decoding(prompt_tokens, output_tokens)
    if got is None:
        return None
    s, o = got
    k = o - 1.0
    Ek = float(k.mean())
    g = float(np.mean(k * s + k * o / 2.0))
    ctx = float(np.mean(k * (s + o / 2.0)) / Ek)

    def bounds_of(b):
        return {"mu_seqs": max_num_seqs / (b * Ek), "mu_tokens": max_num_batched_tokens / (b * Ek),
                "mu_kv": M / (b * g)}

    def step_of(mu, b):
        n = min(mu * b * Ek, float(max_num_seqs))
        return base(0, n, min(n * ctx, float(M)))

    return _fixed_point(bounds_of, step_of, float(base(0, 1, ctx)))


def link_rate(gbps: float) -> float:
    """Bytes per second of a link of ``gbps`` Gbit/s (``inf`` for a free link)."""
    return math.inf if not math.isfinite(gbps) else gbps * 1e9 / 8.0


def link_capacity(*, gbps: float, kv_bytes_per_token: float, prompt_tokens, output_tokens) -> float:
    """Decoding requests per second the link carries at utilization one: ``r / (beta E[s | o > 1])``."""
    s = np.asarray(prompt_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    s = s[o > 1]
    per = kv_bytes_per_token * float(s.mean()) if s.size else 0.0
    r = link_rate(gbps)
    return math.inf if per <= 0 or math.isinf(r) else r / per


def tpot_floor(base, *, gbps: float, latency_ms: float, kv_bytes_per_token: float, prompt_tokens, output_tokens,
               grid: int = 64) -> float | None:
    """The median over requests (``o > 1``) of ``base(0, 1, s) + (beta s / r + latency) / (o - 1)``
    (seconds), ``s`` rounded down to one of ``grid`` quantiles for ``base``; None when no request
    decodes."""
    got = _decoding(prompt_tokens, output_tokens)
    if got is None:
        return None
    s, o = got
    pts = np.unique(np.quantile(s, np.linspace(0.0, 1.0, grid), method="lower"))
    step = np.array([float(base(0, 1, float(p))) for p in pts])
    idx = np.searchsorted(pts, s, side="right") - 1  # the grid point at or below s
    r = link_rate(gbps)
    link = (0.0 if math.isinf(r) else kv_bytes_per_token * s / r) + latency_ms / 1e3
    return float(np.median(step[idx] + link / (o - 1.0)))
