"""Admission control at a replica's door and the client's deadlines: what happens to a request
before and around the scheduler, the same for both replicas (the scheduling itself is theirs).

- :func:`reject_reason`: at arrival, a request that can never run (an empty prompt or output,
  prompt + output above ``max_model_len`` or the whole KV cache ``M``) or that finds the waiting
  room full (``max_waiting``, in all or for its class: a finite waiting room, M/G/c/K-like) is
  rejected.
- :func:`deadlines`: its client's timeout (from arrival), its time-to-first-token timeout, its
  client's patience (its own, drawn per request: withdrawn if never scheduled by then, status
  ``cancelled``: reneging, Erlang A's abandonment) and queue-time shedding (``max_queue_time_s``,
  for a request never scheduled, ``rejected``: the server's rule).
- :func:`late_outcome`: a request whose last token came after its client gave up (inside the
  last step) timed out at the deadline.
"""

from __future__ import annotations

DEADLINE_TOTAL, DEADLINE_SHED, DEADLINE_TTFT, DEADLINE_PATIENCE = 0, 1, 2, 3


def arrival_entry(request, at: float | None = None) -> tuple:
    """A replica's arrivals-heap entry for ``request``: it arrives at ``request.arrival_time``, or a
    gateway dispatches it at ``at`` (set as its ``dispatch_time``; the replica sees it then).
    Ordered by time, first attempts before retries, then stream position."""
    if at is not None:
        request.dispatch_time = at
    t = request.arrival_time if at is None else at
    return (t, request.attempt > 1, request.seq, request)


def reject_reason(config, r, waiting) -> str | None:
    """Why ``r`` is rejected at arrival (None: it joins the queue). ``waiting``: the queue it
    would join (its length and per-class counts)."""
    s, o = r.num_prompt_tokens, r.max_tokens
    if s < 1 or o < 1:
        return "empty prompt or output"
    if config.max_model_len and s + o > config.max_model_len:
        return f"prompt+output {s + o} > max_model_len {config.max_model_len}"
    if s + o > config.capacity_tokens:
        return f"prompt+output {s + o} exceeds the KV cache ({config.capacity_tokens} tokens)"
    if config.max_waiting and len(waiting) >= config.max_waiting:
        return "waiting queue full"
    if config.class_max_waiting:
        cap = config.class_max_waiting.get(r.class_name)
        if cap and waiting.count(r.class_name) >= cap:
            return f"waiting queue of class {r.class_name} full"
    return None


def deadlines(config, r, timeout_s: dict, ttft_timeout_s: dict, patience: dict | None = None) -> dict:
    """``{kind: time}`` of ``r``'s deadlines (empty when none applies)."""
    marks = {}
    if patience:
        pp = patience.get(r.class_name)
        if pp is not None:
            marks[DEADLINE_PATIENCE] = r.arrival_time + pp(r.request_id)
    to = timeout_s.get(r.class_name)
    if to:
        marks[DEADLINE_TOTAL] = r.arrival_time + to
    tt = ttft_timeout_s.get(r.class_name)
    if tt:
        marks[DEADLINE_TTFT] = r.arrival_time + tt
    qt = config.class_max_queue_time_s.get(r.class_name) or config.max_queue_time_s
    if qt:
        marks[DEADLINE_SHED] = r.arrival_time + qt
    return marks


def late_outcome(marks: dict | None, r, outcome: str, t: float) -> tuple[str, float]:
    """``(outcome, time)`` of a request that finished ``ok`` at ``t``: a timeout at the earliest
    deadline its client had already passed (the total one, or the TTFT one before its first token)."""
    if outcome != "ok" or not marks:
        return outcome, t
    late = [d for k, d in marks.items() if (k == DEADLINE_TOTAL and d < t) or (k == DEADLINE_TTFT and d < r.first_token_time)]
    return ("timeout", min(late)) if late else (outcome, t)
