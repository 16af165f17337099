"""The planner's theory side: for one deployment, its cost, an upper bound on the arrival rate
it can sustain and lower bounds on its latencies, all in closed form (no simulation).

For a :class:`~llmqueue.plan.space.Config` (``R`` replicas of ``tp`` GPUs):

- **cost** (USD/h) = the catalog's indicative price per GPU-hour x ``tp`` x ``R``;
- **rate bound** ``R mu``: ``mu`` is one replica's capacity (req/s), the least of the KV bound
  ``M / (b E[g])`` (Nie et al.), the slot bound ``max_num_seqs / (b E[steps])`` and the
  token-budget bound ``max_num_batched_tokens / (b E[s + o - 1])``
  (:func:`~llmqueue.theory.replica.saturated_capacity`: ``b`` the roofline step time of the
  model on ``tp`` GPUs priced at the capacity point). Arrivals at ``lam`` give the fleet load
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


def deployment(scenario: str, gpu: str, tp: int):
    """``(M, step-time model, long_prefill_token_threshold)`` of the scenario's model on ``tp``
    GPUs of type ``gpu`` (vLLM's KV arithmetic, the roofline), exactly as its simulation builds
    them. Raises :class:`InputError` when the model does not fit."""
    from llmqueue.scenario.override import scenario_with

    sc = scenario_with(scenario, gpu=gpu, tensor_parallel_size=tp).scenario
    d = sc.deployment
    _, st = sc.engine()
    return float(d.M), st, int(d.long_prefill_token_threshold or 0)


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


def gpu_price(gpu: str) -> float:
    from llmqueue.hardware import get_gpu

    return float(get_gpu(gpu).price_per_hour)


def try_deployment(scenario: str, gpu: str, tp: int):
    """:func:`deployment`, or the one-line reason it fails (a str)."""
    try:
        return deployment(scenario, gpu, tp)
    except InputError as e:
        return str(getattr(e, "problem", e))
