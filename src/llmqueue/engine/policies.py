"""Scheduling policies as small objects: the waiting queue's order and the preemption victim.

A policy decides from a read-only view (the requests' fields, the running list) and returns a
decision; it holds no engine state, so a gateway in front of real engines can call the same
objects. Queueing terms: the ordering policy is the queue discipline of the waiting room
(FCFS, priority classes, shortest job first, shortest remaining processing time), the victim
policy chooses which customer in service is sent back to the queue when the KV memory ``M``
runs out (preemptive-repeat: its work is recomputed).

- :class:`FCFS`: arrival order; a preempted request goes back to the *front* (vLLM's FCFS queue).
- :class:`Priority`: smallest ``priority`` value first, then arrival (vLLM's priority scheduling).
- :class:`SJF`: shortest prompt first, then arrival.
- :class:`SRPT`: shortest predicted remaining output first (``predicted_output_tokens`` minus
  the tokens produced; the true length when no predictor is given: an oracle).
- :class:`PreemptNewest`: the last request in the running list (vLLM's FCFS preemption).
- :class:`PreemptLowestPriority`: the running request with the largest ``(priority,
  arrival_time)`` (vLLM's priority preemption).

To add one: a class with ``name``, ``help`` (a line for ``--help``) and ``key(request)``
(ordering; ``fifo = True`` keeps arrival order without a key) or ``victim(running)``
(preemption), registered in :data:`ORDERINGS` or :data:`VICTIMS`: the command line's
``--policy``/``--preemption`` and a scenario's ``scheduling_policy`` read them.
"""

from __future__ import annotations

from llmqueue.errors import InputError


class FCFS:
    """First come, first served; preempted requests rejoin at the front."""

    name = "fcfs"
    help = "arrival order (vLLM's default)"
    fifo = True

    def key(self, r):
        return (r.arrival_time, r.seq)


class Priority:
    """Smallest ``priority`` first (ties: earliest arrival)."""

    name = "priority"
    help = "smallest priority value first, then arrival (vLLM's)"
    fifo = False

    def key(self, r):
        return (r.priority, r.arrival_time, r.seq)


class SJF:
    """Shortest prompt first (ties: earliest arrival)."""

    name = "sjf"
    help = "shortest prompt first"
    fifo = False

    def key(self, r):
        return (r.num_prompt_tokens, r.arrival_time, r.seq)


class SRPT:
    """Shortest predicted remaining output first (ties: earliest arrival)."""

    name = "srpt"
    help = "shortest predicted remaining output first"
    fifo = False

    def key(self, r):
        return (r.predicted_remaining, r.arrival_time, r.seq)


class PreemptNewest:
    """The newest running request (the list's tail) is preempted."""

    name = "newest"
    help = "the newest running request (vLLM's, except under priority)"

    def victim(self, running):
        return running[-1]


class PreemptLowestPriority:
    """The running request with the largest ``(priority, arrival_time)`` is preempted."""

    name = "lowest-priority"
    help = "the running request of the largest priority value, newest first (vLLM's under priority)"

    def victim(self, running):
        return max(running, key=lambda r: (r.priority, r.arrival_time, r.seq))


#: Every waiting-queue ordering by name (``--policy``, a scenario's ``deployment.scheduling_policy``)
ORDERINGS = {p.name: p for p in (FCFS, Priority, SJF, SRPT)}
#: Every preemption victim by name (``--preemption``)
VICTIMS = {p.name: p for p in (PreemptNewest, PreemptLowestPriority)}


def default_victim(ordering: str) -> str:
    """vLLM's preemption victim under ``ordering``: the lowest-priority request under priority
    scheduling, else the newest."""
    return PreemptLowestPriority.name if ordering == Priority.name else PreemptNewest.name


def ordering_policy(name_or_policy):
    """The ordering policy object for a name (``fcfs``, ``priority``, ``sjf``, ``srpt``) or an object."""
    if not isinstance(name_or_policy, str):
        return name_or_policy
    cls = ORDERINGS.get(name_or_policy)
    if cls is None:
        raise InputError("policy", f"unknown scheduling policy {name_or_policy!r}",
                         f"choose one of: {', '.join(ORDERINGS)}")
    return cls()


def victim_policy(name_or_policy):
    """The preemption-victim policy object for a name (``newest``, ``lowest-priority``) or an object."""
    if not isinstance(name_or_policy, str):
        return name_or_policy
    cls = VICTIMS.get(name_or_policy)
    if cls is None:
        raise InputError("preemption", f"unknown preemption mode {name_or_policy!r}",
                         f"choose one of: {', '.join(VICTIMS)}")
    return cls()
