"""``RequestQueue``: the waiting room of one replica, ordered by an ordering policy.

As vLLM's ``FCFSRequestQueue`` / ``PriorityRequestQueue``: ``add`` a new arrival, ``prepend``
a preempted request (to the front in FCFS order; a keyed queue simply re-inserts it under its
key), ``peek`` and ``pop`` the head. ``remove`` takes out a request that leaves while waiting
(a client timeout, queue-time shedding). ``count(class_name)`` serves per-class admission limits.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque

from llmqueue.engine.policies import ordering_policy


class RequestQueue:
    """Waiting requests in the order of ``policy`` (a name or a policy object)."""

    def __init__(self, policy="fcfs"):
        self.policy = ordering_policy(policy)
        self._fifo: deque | None = deque() if self.policy.fifo else None
        self._heap: list = []
        self._by_class: Counter = Counter()

    def __len__(self) -> int:
        return len(self._fifo) if self._fifo is not None else len(self._heap)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self):
        """The waiting requests in queue order."""
        if self._fifo is not None:
            return iter(list(self._fifo))
        return iter([e[-1] for e in sorted(self._heap, key=lambda e: e[:-1])])

    def count(self, class_name: str) -> int:
        return self._by_class[class_name]

    def add(self, request) -> None:
        self._by_class[request.class_name] += 1
        if self._fifo is not None:
            self._fifo.append(request)
        else:
            heapq.heappush(self._heap, (*self.policy.key(request), request))

    def prepend(self, request) -> None:
        """A preempted request rejoins: at the front (FCFS), else under its key."""
        if self._fifo is not None:
            self._by_class[request.class_name] += 1
            self._fifo.appendleft(request)
        else:
            self.add(request)

    def peek(self):
        if self._fifo is not None:
            return self._fifo[0] if self._fifo else None
        return self._heap[0][-1] if self._heap else None

    def pop(self):
        r = self._fifo.popleft() if self._fifo is not None else heapq.heappop(self._heap)[-1]
        self._by_class[r.class_name] -= 1
        return r

    def remove(self, request) -> None:
        """Take ``request`` out wherever it is (O(n): leaving while waiting is rare)."""
        if self._fifo is not None:
            self._fifo.remove(request)
        else:
            self._heap = [e for e in self._heap if e[-1] is not request]
            heapq.heapify(self._heap)
        self._by_class[request.class_name] -= 1
