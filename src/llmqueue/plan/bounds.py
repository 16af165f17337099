"""The planner's theory side: for one deployment, its cost, an upper bound on the arrival rate
it can sustain and lower bounds on its latencies, all in closed form (no simulation).

For a :class:`~llmqueue.plan.space.Config` (``R`` replicas of ``tp x pp`` GPUs):

- **cost** (USD/h) = the catalog's indicative price per GPU-hour x ``tp`` x ``pp`` x ``R``;
- **rate bound** ``R mu``: ``mu`` is one replica's capacity (req/s), the least of the KV bound
  ``M / (b E[g])`` (Nie et al.), the slot bound ``max_num_seqs / (b E[steps])`` and the
  token-budget bound ``max_num_batched_tokens / (b E[s + o - 1])``
  (:func:`~llmqueue.theory.replica.saturated_capacity`: ``b`` the roofline step time of the
  model on ``tp x pp`` GPUs priced at the capacity point: ``pp`` raises ``M`` through the
  weights and KV it spreads, not ``1 / b``, which pays the stage sends). Arrivals at ``lam`` give the fleet load
  ``rho = lam / (R mu)``; a deployment with ``rho`` above the ceiling (default 0.95) cannot hold
  a stationary queue whose p99 means anything;
- **latency bounds** of one request alone on an idle replica (the noise-free step-time model
  ``base(P, D, C)`` is increasing in every argument, so any other work in a step only lengthens
  it): TTFT >= the prefill of the mean prompt ``E[s]`` in ``k = ceil(E[s] / chunk)`` steps of
  ``E[s] / k`` tokens each (by convexity of the roofline step in ``P``, no split of the prompt
  into ``k`` or more steps is faster), and TPOT >= one decode step ``base(0, 1, E[s])``. Each
  request's latency is at least its bound, and the bound grows with its prompt, so a percentile
  at or above the median of a right-skewed prompt distribution is at least the bound at the mean
  prompt. A p99 target below a bound cannot be met by any load or router.

A **P:D split** (``P`` prefill and ``D`` decode replicas, a KV link) is a tandem
(:mod:`llmqueue.theory.pd`): its rate bound is the least of ``P mu_P`` (the prefill replica's
slot, budget and prefill-only KV bounds), ``D mu_D / q`` (seed 004's ``mu`` with the prefill
removed, over the share ``q`` of requests that decode) and the link's ``r / (q beta E[s])``
(``beta`` KV bytes per token, ``r`` bytes/s). Its TTFT bound is the aggregated one (the prefill
pool makes the first token); its TPOT bound adds the transfer, ``(beta s / r + latency) / (o - 1)``,
to one decode step (the median over requests of the per-request bound).

Prefix caching shortens prefills of shared prompts; the bounds ignore it, so for workloads
with shared prefixes (a replayed trace with hash ids) the TTFT bound is not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmqueue.errors import InputError


@dataclass
class Workload:
    """What the bounds need of the scenario's workload: ``lam`` (req/s), samples of the prompt
    ``s`` and output ``o`` lengths, and whether prompts share prefixes."""

    lam: float
    prompt: np.ndarray
    output: np.ndarray
    shared_prefixes: bool = False
    #: the arrival path the simulation serves (s, sorted) and its warm-up, for the burst bound
    #: (:mod:`llmqueue.plan.burst`)
    arrivals: np.ndarray | None = None
    warmup_s: float = 0.0

    @property
    def mean_prompt(self) -> float:
        return float(self.prompt.mean())


@dataclass
class ReplicaTheory:
    """One replica's closed forms: ``M`` (tokens), the step model, ``mu`` (req/s) and its binding
    bound, ``b`` (s) at the capacity point, the latency bounds (ms); ``error`` when the model
    does not fit (then nothing else is set)."""

    M: float | None = None
    step_time: object = None
    mu: float | None = None
    binding: str | None = None
    b: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    error: str | None = None


def deployment(scenario: str, gpu: str, tp: int, **inputs):
    """``(M, step-time model, long_prefill_token_threshold, KV bytes per token)`` of the
    scenario's model on ``tp`` GPUs of type ``gpu`` (vLLM's KV arithmetic, the roofline, or the
    ``step_time`` / ``capacity_tokens`` of ``inputs``), exactly as its simulation builds them.
    Raises :class:`InputError` when the model does not fit."""
    from llmqueue.scenario.fleet import _kv_bytes_per_token
    from llmqueue.scenario.override import scenario_with

    sc = scenario_with(scenario, gpu=gpu, tensor_parallel_size=tp, **inputs).scenario
    d = sc.deployment
    _, st = sc.engine()
    return float(d.M), st, int(d.long_prefill_token_threshold or 0), _kv_bytes_per_token(d)


def prefill_bound_s(base, s: float, chunk: int) -> float:
    """The fastest prefill of ``s`` tokens alone: ``k = ceil(s / chunk)`` equal steps (seconds)."""
    k = max(1, math.ceil(s / chunk))
    return k * float(base(s / k, 0, 0))


def decode_bound_s(base, context: float) -> float:
    """One decode step of one request over ``context`` tokens, alone (seconds)."""
    return float(base(0, 1, context))


def replica_theory(wl: Workload, M: float, step_time, *, max_num_seqs: int, max_num_batched_tokens: int,
                   long_prefill_token_threshold: int = 0) -> ReplicaTheory:
    """The closed forms of one replica (see the module docstring)."""
    from llmqueue.theory.replica import replica_capacity, saturated_capacity

    kw = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, prompt_tokens=wl.prompt,
              output_tokens=wl.output, M=M)
    b = getattr(step_time, "constant_step", None)
    cap = replica_capacity(b=b, **kw) if b is not None else saturated_capacity(step_time.base, **kw)
    if cap is None:  # no fixed point: price the step at a full batch
        cap = replica_capacity(b=float(step_time.base(max_num_batched_tokens, max_num_seqs, M)), **kw)
    chunk = max_num_batched_tokens
    if long_prefill_token_threshold:
        chunk = min(chunk, long_prefill_token_threshold)
    base = step_time.base
    ttft = None if wl.shared_prefixes else prefill_bound_s(base, wl.mean_prompt, chunk) * 1e3
    return ReplicaTheory(M=M, step_time=step_time, mu=cap.mu, binding=cap.binding, b=cap.b, ttft_ms=ttft,
                         tpot_ms=decode_bound_s(base, wl.mean_prompt) * 1e3)


@dataclass
class SplitTheory:
    """A P:D split's closed forms (:mod:`llmqueue.theory.pd`): ``rate_bound`` (total arrivals,
    req/s) and the station that binds, each station's capacity, the latency bounds (ms)."""

    rate_bound: float
    binding: str
    stations: dict
    ttft_ms: float | None
    tpot_ms: float | None


def split_theory(wl: Workload, M: float, step_time, *, prefill_replicas: int, decode_replicas: int,
                 max_num_seqs: int, max_num_batched_tokens: int, long_prefill_token_threshold: int,
                 kv_bytes_per_token: float, kv_link_gbps: float, kv_link_latency_ms: float, cache: dict) -> SplitTheory:
    """The tandem's bounds (see the module docstring); ``cache`` keeps the per-replica capacities
    and the TPOT floor between configurations that share them."""
    import numpy as np

    from llmqueue.theory import pd

    base = step_time.base
    key = (max_num_seqs, max_num_batched_tokens)
    if ("P",) + key not in cache:
        cache[("P",) + key] = pd.prefill_capacity(base, M=M, max_num_seqs=max_num_seqs,
                                                  max_num_batched_tokens=max_num_batched_tokens,
                                                  prompt_tokens=wl.prompt,
                                                  long_prefill_token_threshold=long_prefill_token_threshold)
        cache[("D",) + key] = pd.decode_capacity(base, M=M, max_num_seqs=max_num_seqs,
                                                 max_num_batched_tokens=max_num_batched_tokens,
                                                 prompt_tokens=wl.prompt, output_tokens=wl.output)
    link = (kv_link_gbps, kv_link_latency_ms)
    if ("L",) + link not in cache:
        cache[("L",) + link] = (
            pd.link_capacity(gbps=kv_link_gbps, kv_bytes_per_token=kv_bytes_per_token, prompt_tokens=wl.prompt,
                             output_tokens=wl.output),
            pd.tpot_floor(base, gbps=kv_link_gbps, latency_ms=kv_link_latency_ms,
                          kv_bytes_per_token=kv_bytes_per_token, prompt_tokens=wl.prompt, output_tokens=wl.output))
    cp, cd = cache[("P",) + key], cache[("D",) + key]
    link_cap, tpot = cache[("L",) + link]
    q = float(np.mean(np.asarray(wl.output) > 1))
    inf = float("inf")
    rates = {"prefill pool": prefill_replicas * cp.mu if cp is not None else inf,
             "decode pool": decode_replicas * cd.mu / q if cd is not None and q > 0 else inf,
             "KV link": link_cap / q if q > 0 else inf}
    name = min(rates, key=rates.get)
    binding = {"prefill pool": f"prefill pool ({cp.binding})" if cp is not None else "prefill pool",
               "decode pool": f"decode pool ({cd.binding})" if cd is not None else "decode pool",
               "KV link": "KV link"}[name]
    stations = {"prefill_mu": None if cp is None else cp.mu, "prefill_binding": None if cp is None else cp.binding,
                "decode_mu": None if cd is None else cd.mu, "decode_binding": None if cd is None else cd.binding,
                "decode_share": q, "link_capacity": None if math.isinf(link_cap) else link_cap,
                "rho_prefill": None, "rho_decode": None, "rho_link": None}
    for st, r in (("prefill", rates["prefill pool"]), ("decode", rates["decode pool"]), ("link", rates["KV link"])):
        stations[f"rate_bound_{st}"] = None if math.isinf(r) else r
        stations[f"rho_{st}"] = wl.lam / r if r > 0 and not math.isinf(r) else 0.0
    chunk = max_num_batched_tokens
    if long_prefill_token_threshold:
        chunk = min(chunk, long_prefill_token_threshold)
    ttft = None if wl.shared_prefixes else prefill_bound_s(base, wl.mean_prompt, chunk) * 1e3
    return SplitTheory(rate_bound=rates[name], binding=binding, stations=stations, ttft_ms=ttft,
                       tpot_ms=None if tpot is None else tpot * 1e3)


def gpu_price(gpu: str) -> float:
    from llmqueue.hardware import get_gpu

    return float(get_gpu(gpu).price_per_hour)


def try_deployment(scenario: str, gpu: str, tp: int, **inputs):
    """:func:`deployment`, or the one-line reason it fails (a str)."""
    try:
        return deployment(scenario, gpu, tp, **inputs)
    except InputError as e:
        return str(getattr(e, "problem", e))
