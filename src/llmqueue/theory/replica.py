"""The closed forms for one continuous-batching replica: its capacity ``mu``, which constraint
binds, and (one request at a time) the M/G/1 mean response.

A replica with step time ``b`` serves requests of prompt ``s`` and output ``o`` tokens under three
bounds; its capacity is the least of them:

- ``mu_kv``: Nie et al.'s KV-memory capacity ``M / (b E[g])`` (:func:`llmqueue.theory.kv.kv_stability`);
- ``mu_seqs``: the slot bound ``max_num_seqs / (b E[steps per request])`` (Little's law on the
  running set: at most ``max_num_seqs`` requests hold a slot, each for ``ceil(s / chunk) + o - 1``
  steps);
- ``mu_tokens``: the token-budget bound ``max_num_batched_tokens / (b E[s + o - 1])``.

For ``lam`` arrivals per second, ``rho = lam / mu``; the verdict is ``unstable`` above ``mu``,
``stable`` below ``mu (1 - delta)`` (``delta``: the KV model's band, 0 for the other bounds),
``indeterminate`` in between.

A step time that depends on the step's composition (prompt tokens ``P``, decodes ``D``, context ``C``:
``b = base(P, D, C)``) has no single ``b``: it grows with the load. :func:`saturated_capacity`
prices the step at the capacity it implies: at throughput ``mu`` a step holds ``P = mu b E[s]``
prompt tokens and ``D = mu b E[o - 1]`` decodes over a context ``C = D E[o (s + o/2)] / E[o]``
(capped at ``M``), so ``b = base(P, D, C)`` and ``mu = bound(b)`` are solved together (a fixed point).
The mean step of a run at a low load (Nie et al. measure ``b`` at saturation) would overstate ``mu``.

With one request at a time (``max_num_seqs = 1``), Poisson arrivals and fixed lengths, a request's
service is ``k = ceil(s / chunk) + o - 1`` steps of i.i.d. durations: the replica is exactly an
M/G/1 queue with ``mu = 1 / (k b)`` and service SCV ``scv_step / k`` (Pollaczek-Khinchine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import positive, positive_int

BINDING = {"mu_kv": "KV cache (Nie et al. 2026)", "mu_seqs": "max_num_seqs", "mu_tokens": "token budget"}


@dataclass(frozen=True)
class ReplicaCapacity(Result):
    """``mu`` (req/s) = min of the bounds present; ``binding`` names it; ``rho`` and ``verdict``
    when ``lam`` is known; ``delta`` and ``E_g`` from the KV model when ``M`` was given."""

    b: float
    lam: float | None
    mu_seqs: float
    mu_tokens: float
    mu_kv: float | None
    mu: float
    binding: str
    rho: float | None
    verdict: str | None
    delta: float | None
    E_g: float | None


def replica_capacity(*, b: float, max_num_seqs: int, max_num_batched_tokens: int, prompt_tokens, output_tokens,
                     M: float | None = None, lam: float | None = None, prompt=None, output=None) -> ReplicaCapacity:
    """Capacity bounds of one replica (see the module docstring).

    ``prompt_tokens``, ``output_tokens``: samples (or the whole stream) of ``s`` and ``o``, for the
    slot and budget bounds; ``prompt`` / ``output``: length distributions, used by the KV model
    when given (exact pmfs), else the samples' pairs; ``M``: KV capacity in tokens (None: unlimited).
    """
    b = positive("b", b)
    seqs = positive_int("max_num_seqs", max_num_seqs)
    chunk = positive_int("max_num_batched_tokens", max_num_batched_tokens)
    s = np.asarray(prompt_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    bounds = {
        "mu_seqs": seqs / (b * float(np.mean(np.ceil(s / chunk) + o - 1))),
        "mu_tokens": chunk / (b * float(np.mean(s + o - 1))),
    }
    delta = E_g = None
    if M is not None:
        from llmqueue.theory.kv import kv_stability

        kvargs = dict(prompt=prompt, output=output) if prompt is not None and output is not None else dict(pairs=(s, o))
        kv = kv_stability(M=M, b=b, chunk=chunk, **kvargs)
        bounds["mu_kv"] = kv.mu
        delta, E_g = kv.delta, kv.E_g
    name = min(bounds, key=bounds.get)
    mu = bounds[name]
    rho = verdict = None
    if lam is not None:
        rho = lam / mu
        band = (delta or 0.0) if name == "mu_kv" else 0.0
        verdict = "unstable" if lam > mu else ("stable" if lam < mu * (1 - band) else "indeterminate")
    return ReplicaCapacity(b=b, lam=lam, mu_seqs=bounds["mu_seqs"], mu_tokens=bounds["mu_tokens"],
                           mu_kv=bounds.get("mu_kv"), mu=mu, binding=BINDING[name], rho=rho, verdict=verdict,
                           delta=delta, E_g=E_g)


def saturated_capacity(base, *, max_num_seqs: int, max_num_batched_tokens: int, prompt_tokens, output_tokens,
                       M: float | None = None, lam: float | None = None, prompt=None, output=None,
                       tol: float = 1e-9, max_iter: int = 200) -> ReplicaCapacity | None:
    """:func:`replica_capacity` with the step time ``b`` of the capacity point (see the module
    docstring): ``base(P, D, C)`` (seconds) is the step-time model's noise-free price of a step.
    None when the fixed point is not found (a model whose steps grow faster than the work)."""
    s = np.asarray(prompt_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    Es, Eo1 = float(s.mean()), float(np.maximum(o - 1, 0).mean())
    ctx = float(np.mean(o * (s + o / 2)) / max(float(o.mean()), 1e-12))
    kw = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, prompt_tokens=s,
              output_tokens=o, M=M, lam=lam, prompt=prompt, output=output)
    b = float(base(0, 1, ctx))
    if not b > 0:
        return None
    for _ in range(max_iter):
        cap = replica_capacity(b=b, **kw)
        per_step = cap.mu * b  # requests started (and finished) per step at capacity
        D = min(per_step * Eo1, float(max_num_seqs))
        P = min(per_step * Es, float(max_num_batched_tokens))
        C = D * ctx if M is None else min(D * ctx, float(M))
        b_new = float(base(P, D, C))
        if not b_new > 0 or not math.isfinite(b_new):
            return None
        if abs(b_new - b) <= tol * b:
            return replica_capacity(b=b_new, **kw)
        b = 0.5 * (b + b_new)
    return None


@dataclass(frozen=True)
class OneAtATime(Result):
    """The M/G/1 view of a replica serving one request at a time."""

    service_steps: int
    scv_s: float
    mu: float
    rho: float
    stable: bool
    mean_e2el_ms: float | None
    mean_queue_ms: float | None


def one_at_a_time(*, lam: float, b: float, prompt_tokens: int, output_tokens: int, chunk: int,
                  scv_step: float = 0.0) -> OneAtATime:
    """Poisson ``lam``, fixed ``s`` and ``o``, steps of mean ``b`` and SCV ``scv_step``: M/G/1 with
    ``k = ceil(s / chunk) + o - 1`` steps a request (Pollaczek-Khinchine mean response)."""
    from llmqueue.theory.classic import mg1

    k = math.ceil(prompt_tokens / chunk) + output_tokens - 1
    scv = scv_step / k  # the sum of k i.i.d. steps
    mu = 1.0 / (k * b)
    if lam >= mu:
        return OneAtATime(service_steps=k, scv_s=scv, mu=mu, rho=lam / mu, stable=False, mean_e2el_ms=None,
                          mean_queue_ms=None)
    r = mg1(lam=lam, mu=mu, scv_s=scv)
    return OneAtATime(service_steps=k, scv_s=scv, mu=mu, rho=r.rho, stable=True, mean_e2el_ms=r.W * 1e3,
                      mean_queue_ms=r.Wq * 1e3)
