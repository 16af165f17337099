"""A host KV tier against recomputation: when loading a preempted request's KV back pays.

A KV-bound replica past its cliff preempts (Nie et al. 2026: the thrashing state whose
throughput is ``mu = M / (b E[g])``). vLLM recomputes a preempted request's ``c`` computed tokens
when it resumes: a prefill of ``c`` tokens, which a composition-dependent step prices at ``p``
seconds a token (the step model's marginal prefill cost, ``linear:...:prefill=p``). With a host
tier (:mod:`llmqueue.engine.host_tier`) the ``c`` tokens' KV is loaded back instead, at ``s =
(B / tp) / BW`` seconds a token (``B`` KV bytes of a token over the replica's ``tp`` GPUs, each
loading its share over its own link of ``BW`` bytes/s), the step waiting for it.

To first order both cost the engine time in proportion to ``c`` and stall every request in the
step alike, so the tier beats recomputation exactly when a token loads faster than it recomputes:
``s < p``, i.e. ``BW > BW* = (B / tp) / p`` (:func:`offload_parity`). In Nie et al.'s own setting,
a constant step ``b`` whatever the step holds, recomputation costs no time (only the KV it takes
while rebuilding), so no tier can beat it there and a slow one only loses.

What the first order leaves out (measured, ``docs/benchmarks.md``): a request loaded back takes
its whole KV at once, where a recomputed one grows it chunk by chunk, so the offloading engine
preempts more often per completed request (17 % more in the 1:1 setting at 1.5x with a linear
step), which moves the crossover below ``p`` by about as much.
"""

from __future__ import annotations

from llmqueue._validate import positive


def offload_parity(*, prefill_s_per_token: float, bytes_per_token: float, tensor_parallel_size: int = 1) -> dict:
    """The first-order crossover of a host KV tier against recomputation (module docstring):
    ``{"s_per_token": p, "gbps": (B / tp) / p / 1e9}``: a tier whose links move a token's KV faster
    than ``p`` (bandwidth above ``gbps`` GB/s per GPU) raises the thrashing engine's throughput, a
    slower one lowers it."""
    p = positive("prefill_s_per_token", prefill_s_per_token)
    b = positive("bytes_per_token", bytes_per_token)
    tp = max(int(tensor_parallel_size), 1)
    return {"s_per_token": p, "gbps": b / tp / p / 1e9}
