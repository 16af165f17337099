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
