"""One engine step's decision (vLLM v1's ``vllm/v1/core/sched/output.py``), shared by both replicas.

- :class:`Composition`: the work of a step as the step-time model prices it, ``b =
  base(prefill_tokens, decode_seqs, context_tokens)``: the service time of one iteration of the
  batch server depends on its prefill tokens, its one-token decodes and the KV tokens they
  attend over.
- :class:`SchedulerOutput`: the step's schedule, the requests scheduled with their new tokens,
  the requests preempted (sent back to the queue: preemptive-repeat), and its composition.
"""

from __future__ import annotations

from llmqueue.engine.request import Request


class Composition:
    """The covariates of one step's service time: ``prefill_tokens`` prompt (or recomputed)
    tokens, ``decode_seqs`` one-token decodes and ``context_tokens``, the KV tokens the decodes
    attend over (each decode's new token included). ``load_tokens``: KV tokens loaded back from
    the host tier for the requests it resumes (priced apart, by the tier's bandwidth)."""

    __slots__ = ("prefill_tokens", "decode_seqs", "context_tokens", "load_tokens")

    def __init__(self, prefill_tokens: int = 0, decode_seqs: int = 0, context_tokens: int = 0) -> None:
        self.prefill_tokens = prefill_tokens
        self.decode_seqs = decode_seqs
        self.context_tokens = context_tokens
        self.load_tokens = 0

    def reset(self, decode_seqs: int, context_tokens: int) -> None:
        """Start a step's count with ``decode_seqs`` decodes over ``context_tokens`` KV tokens
        (the fast replica's implicit decoders) and no prefill (``load_tokens`` is zeroed where it
        is priced, :meth:`llmqueue.engine.fast.replica.Replica._record_step`: most steps load none)."""
        self.prefill_tokens = 0
        self.decode_seqs = decode_seqs
        self.context_tokens = context_tokens

    def add(self, request: Request, num_new_tokens: int) -> None:
        """Count one scheduled request: one new token of a request whose prompt is computed is a
        decode (it attends over its KV tokens and the new one); any other chunk is prefill work."""
        o = request.num_output_tokens
        c = request.num_computed_tokens
        if num_new_tokens == 1 and o > 0 and c == request.num_prompt_tokens + o - 1:  # request.is_decoding
            self.decode_seqs += 1
            self.context_tokens += c + 1
        else:
            self.prefill_tokens += num_new_tokens

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.prefill_tokens, self.decode_seqs, self.context_tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Composition) and self.as_tuple() == other.as_tuple()

    def __repr__(self) -> str:
        return (f"Composition(prefill_tokens={self.prefill_tokens}, decode_seqs={self.decode_seqs}, "
                f"context_tokens={self.context_tokens})")


class SchedulerOutput:
    """One step's schedule (plain data).

    ``scheduled``: ``(request, num_new_tokens)`` in schedule order; ``preempted``: requests sent
    back to the waiting queue in this step; ``composition``: what the step-time model prices
    (:class:`Composition`).
    """

    __slots__ = ("scheduled", "preempted", "composition")

    def __init__(self) -> None:
        self.scheduled: list[tuple[Request, int]] = []
        self.preempted: list[Request] = []
        self.composition = Composition()

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def count(self) -> None:
        """Fill :attr:`composition` from :attr:`scheduled` (once the schedule is final)."""
        comp = self.composition
        for r, new in self.scheduled:
            comp.add(r, new)
