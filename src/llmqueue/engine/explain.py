"""``StepExplanation``: why an engine step scheduled what it did (``simulate --explain K``).

A snapshot of one step's :class:`~llmqueue.engine.output.SchedulerOutput`, taken as the step
begins: the requests scheduled with their new tokens (a decode, or a prefill chunk of a prompt or
of a recomputation), the requests preempted (sent back to the queue, their KV freed: the
preemptive-repeat discipline when the memory ``M`` runs out), the step's composition (what the
step-time model prices), the free KV blocks before and after the schedule, and the queue and
batch lengths before and after. Both replicas give the same explanation of the same step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledRequest:
    """One scheduled request as the step saw it: ``num_computed_tokens`` of ``num_tokens`` (its
    prompt and outputs so far) computed before the step, ``num_new_tokens`` scheduled now."""

    request_id: int
    seq: int
    num_new_tokens: int
    num_computed_tokens: int
    num_tokens: int
    decode: bool


@dataclass(frozen=True)
class PreemptedRequest:
    request_id: int
    seq: int
    num_preemptions: int


@dataclass(frozen=True)
class StepExplanation:
    """One step's decision (see the module docstring)."""

    step: int
    start_s: float
    end_s: float
    scheduled: tuple
    preempted: tuple
    composition: tuple  # (prefill_tokens, decode_seqs, context_tokens)
    kv_blocks_free_before: int
    kv_blocks_free_after: int
    num_waiting_before: int
    num_waiting_after: int
    num_running_before: int
    num_running_after: int

    @classmethod
    def of(cls, step: int, start_s: float, end_s: float, out, before: tuple, after: tuple) -> "StepExplanation":
        """The explanation of step ``step`` from its output ``out`` (its requests as they stand
        before the step ends); ``before`` / ``after``: (free KV blocks, waiting, running)."""
        sched = tuple(ScheduledRequest(r.request_id, r.seq, n, r.num_computed_tokens, r.num_tokens,
                                       n == 1 and r.is_decoding) for r, n in out.scheduled)
        pre = tuple(PreemptedRequest(r.request_id, r.seq, r.num_preemptions) for r in out.preempted)
        return cls(step, start_s, end_s, sched, pre, out.composition.as_tuple(), before[0], after[0], before[1],
                   after[1], before[2], after[2])

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d["composition"] = dict(zip(("prefill_tokens", "decode_seqs", "context_tokens"), self.composition))
        return d

    def text(self) -> str:
        """The explanation as readable lines: prefill chunks one a line, decodes as one list."""
        import textwrap

        p, d, c = self.composition
        lines = [f"engine step {self.step}: {self.start_s:.6f} s to {self.end_s:.6f} s, {len(self.scheduled)} "
                 f"scheduled ({sum(s.num_new_tokens for s in self.scheduled)} tokens), {len(self.preempted)} preempted",
                 f"  composition: prefill_tokens={p} decode_seqs={d} context_tokens={c}",
                 f"  KV blocks free: {self.kv_blocks_free_before} before, {self.kv_blocks_free_after} after the schedule",
                 f"  waiting: {self.num_waiting_before} before, {self.num_waiting_after} after; "
                 f"running: {self.num_running_before} before, {self.num_running_after} after"]
        for s in self.scheduled:
            if not s.decode:
                lines.append(f"  prefill: request {s.request_id} (seq {s.seq}) {s.num_new_tokens} tokens "
                             f"[{s.num_computed_tokens} of {s.num_tokens} computed before]")
        decodes = [str(s.request_id) for s in self.scheduled if s.decode]
        if decodes:
            lines += textwrap.wrap(f"decode, one token each ({len(decodes)}): requests " + ", ".join(decodes),
                                   width=110, initial_indent="  ", subsequent_indent="    ")
        for v in self.preempted:
            lines.append(f"  preempted: request {v.request_id} (seq {v.seq}), {v.num_preemptions} preemptions so far")
        return "\n".join(lines)


def parse_steps(text) -> tuple:
    """``--explain K[,K2...]``: the engine step indices (non-negative integers), sorted."""
    from llmqueue.errors import InputError

    if text is None or text == "" or text == ():
        return ()
    if isinstance(text, (list, tuple)):
        parts = [str(x) for x in text]
    else:
        parts = [p for p in str(text).replace(" ", "").split(",") if p]
    out = set()
    for p in parts:
        try:
            k = int(p)
        except ValueError:
            raise InputError("explain", f"{p!r} is not an engine step index", "give --explain K[,K2...], e.g. 120,121") from None
        if k < 0:
            raise InputError("explain", f"{k} is negative", "engine steps count from 0")
        out.add(k)
    return tuple(sorted(out))
