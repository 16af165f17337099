"""``Request``: one request (one attempt) inside a replica, with vLLM v1's field names.

The engine's customer. It carries what the scheduler needs, in the names of vLLM's
``vllm/v1/request.py``: ``num_prompt_tokens``, ``max_tokens`` (the output length it will produce,
``ignore_eos``), ``num_computed_tokens`` (tokens whose KV is computed), ``num_output_tokens``,
``status``, ``priority``, ``arrival_time``, ``num_preemptions``, ``num_cached_tokens`` (prompt
tokens found in the prefix cache at the first scheduling, -1 until then). In queueing terms
its service demand is ``s = num_prompt_tokens`` prefill tokens plus ``o = max_tokens`` decode
steps, and it holds ``ceil(num_computed_tokens / block_size)`` KV blocks while it runs.

The request's lifetime times (``first_scheduled_time``, ``first_token_time``, ``finish_time``)
and its record status (``outcome``: ``ok``, ``rejected``, ``timeout`` or ``unfinished``) become its
row in the request records (:mod:`llmqueue.records.schema`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

NAN = math.nan


class RequestStatus(Enum):
    """Where a request is inside the replica (vLLM's ``RequestStatus``, without its variants
    for structured output and KV transfer)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue after a preemption (recompute)
    FINISHED = "finished"    # left the replica; ``outcome`` says how


@dataclass(eq=False, slots=True)
class Request:
    """One attempt of one request (see the module docstring). Equality is identity."""

    request_id: int
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    class_name: str = "default"
    priority: int = 0
    attempt: int = 1
    hash_ids: tuple | None = None
    predicted_output_tokens: float | None = None
    seq: int = 0  # tie-breaker among equal keys: the order the replica's driver created it
    # --- state (not constructor arguments) ------------------------------------------------------
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    num_output_tokens: int = field(default=0, init=False)
    num_preemptions: int = field(default=0, init=False)
    num_cached_tokens: int = field(default=-1, init=False)
    dispatch_time: float = field(default=NAN, init=False)  # when a gateway handed it over (NaN: at arrival)
    first_scheduled_time: float = field(default=NAN, init=False)
    first_token_time: float = field(default=NAN, init=False)
    finish_time: float = field(default=NAN, init=False)
    outcome: str = field(default="", init=False)
    reason: str | None = field(default=None, init=False)
    offloaded_tokens: int = field(default=0, init=False)  # its KV held in the host tier while preempted
    loaded_tokens: int = field(default=0, init=False)  # KV tokens it loaded from the host tier (resumptions, prefix hits)
    session_id: int | None = None  # the conversation it belongs to, when the stream has one (session routing)

    def __init__(self, request_id: int, arrival_time: float, num_prompt_tokens: int, max_tokens: int,
                 class_name: str = "default", priority: int = 0, attempt: int = 1, hash_ids: tuple | None = None,
                 predicted_output_tokens: float | None = None, seq: int = 0, session_id: int | None = None) -> None:
        # the dataclass's own __init__, written out: the compiled build (llmqueue/compiled.py) makes
        # this one native, where the generated one would run as Python (a request is made per arrival)
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.class_name = class_name
        self.priority = priority
        self.attempt = attempt
        self.hash_ids = hash_ids
        self.predicted_output_tokens = predicted_output_tokens
        self.seq = seq
        self.session_id = session_id
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.dispatch_time = NAN
        self.first_scheduled_time = NAN
        self.first_token_time = NAN
        self.finish_time = NAN
        self.outcome = ""
        self.reason = None
        self.offloaded_tokens = 0
        self.loaded_tokens = 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus the output tokens produced so far (vLLM's ``num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_decoding(self) -> bool:
        """Has its prompt (and any recomputation) done: the next step makes one token from one."""
        return self.num_output_tokens > 0 and self.num_computed_tokens == self.num_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def predicted_remaining(self) -> float:
        """Predicted output tokens still to come (the SRPT key; the true length when no predictor)."""
        pred = self.max_tokens if self.predicted_output_tokens is None else self.predicted_output_tokens
        return pred - self.num_output_tokens
