"""A host KV tier against recomputation: when loading a preempted request's KV back pays.

A KV-bound replica past its cliff preempts (Nie et al. 2026: the thrashing state whose
throughput is ``mu = M / (b E[g])``). vLLM recomputes a preempted request's ``c`` computed tokens
when it resumes: a prefill of ``c`` tokens, which a composition-dependent step prices at ``p``
seconds a token (the step model's marginal prefill cost, ``linear:...:prefill=p``). With a host
tier (:mod:`llmqueue.engine.host_tier`) the ``c`` tokens' KV is loaded back instead, at ``s =
(B / tp) / BW`` seconds a token (``B`` KV bytes of a token over the replica's ``tp`` GPUs, each
loading its share over its own link of ``BW`` bytes/s), the step waiting for it.

**First order.** Both cost the engine time in proportion to ``c`` and stall every request in the
step alike, so the tier beats recomputation exactly when a token loads faster than it recomputes:
``s < p``, i.e. ``BW > BW* = (B / tp) / p``. In Nie et al.'s own setting, a constant step ``b``
whatever the step holds, recomputation costs no time (only the KV it takes while rebuilding), so
no tier can beat it there and a slow one only loses.

**Second order: the token budget.** A loaded request takes its ``c`` tokens whole in its admission
step; a recomputed one rebuilds them through the step's token budget ``C`` (the chunk,
``max_num_batched_tokens``), ``C - n`` tokens a step beside the ``n`` decoding sequences, over ``m =
c / (C - n)`` steps. Thrashing, the engine frees the decoders' growth, ``n`` tokens a step, by
preempting the newest running request, about ``c`` tokens a preemption: ``n / c`` preemptions a
step. A resumed request is the newest while it rebuilds, so a preemption lands on it mid-rebuild
with probability ``n m / c = n / (C - n)``; recomputation then loses only what it had rebuilt,
half of ``c`` on average, where the tier's victim is always whole and loses (reloads) all of
``c``. Per restored token the tier pays ``1 + n / (2 (C - n))`` times recomputation's restore work,
so the crossover rises to ``BW* = (B / tp) / p x (1 + n / (2 (C - n)))`` (:func:`offload_parity`
with ``max_num_batched_tokens`` and ``decode_batch``). ``n``, the decode batch of a full KV cache:
``M`` over a decoding request's mean context, ``E[P] + E[O^2] / (2 E[O])`` (a request decodes ``O``
steps, its context growing from ``P`` to ``P + O``) (:func:`thrashing_decode_batch`). Against the
simulator (``benchmarks/kv_offload.py``, nine settings: chunks 256 to 8,192, loads 1.2x to 2x,
prompt-heavy and output-heavy mixes): within 7.5 % everywhere, where the first order misses by up
to 29 % at small chunks; with ``C`` large the correction vanishes and both agree.
"""

from __future__ import annotations

from llmqueue._validate import positive
from llmqueue.errors import InputError


def thrashing_decode_batch(capacity_tokens: float, mean_prompt: float, mean_output: float,
                           output_second_moment: float) -> float:
    """``n``: decoding sequences in a KV cache of ``M = capacity_tokens`` tokens held full by
    running requests (the thrashing state): ``M / (E[P] + E[O^2] / (2 E[O]))``, the denominator a
    decoding request's context averaged over its decode steps."""
    m = positive("capacity_tokens", capacity_tokens)
    eo = positive("mean_output", mean_output)
    return m / (max(float(mean_prompt), 0.0) + positive("output_second_moment", output_second_moment) / (2 * eo))


def offload_parity(*, prefill_s_per_token: float, bytes_per_token: float, tensor_parallel_size: int = 1,
                   max_num_batched_tokens: int | None = None, decode_batch: float | None = None) -> dict:
    """The crossover of a host KV tier against recomputation (module docstring):
    ``{"s_per_token": p, "gbps": (B / tp) / p / 1e9}``, the first order: a tier whose links move a
    token's KV faster than ``p`` (bandwidth above ``gbps`` GB/s per GPU) raises the thrashing
    engine's throughput, a slower one lowers it. With the token budget ``max_num_batched_tokens``
    (``C``) and the decode batch ``decode_batch`` (``n``, :func:`thrashing_decode_batch`) also the
    second order: ``budget_factor = 1 + n / (2 (C - n))`` and ``second_order_gbps = gbps x
    budget_factor``."""
    p = positive("prefill_s_per_token", prefill_s_per_token)
    b = positive("bytes_per_token", bytes_per_token)
    tp = max(int(tensor_parallel_size), 1)
    out = {"s_per_token": p, "gbps": b / tp / p / 1e9}
    if max_num_batched_tokens is not None and decode_batch is not None:
        c = positive("max_num_batched_tokens", max_num_batched_tokens)
        n = positive("decode_batch", decode_batch)
        if n >= c:
            raise InputError("decode_batch", f"{n:g} sequences leave no room in a token budget of {c:g} for a rebuild",
                             "give a larger max_num_batched_tokens (the budget binds before the KV cache does)")
        out["budget_factor"] = 1 + n / (2 * (c - n))
        out["second_order_gbps"] = out["gbps"] * out["budget_factor"]
    return out
