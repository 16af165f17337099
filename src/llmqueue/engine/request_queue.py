"""``RequestQueue``: the waiting room of one replica, ordered by an ordering policy.

As vLLM's ``FCFSRequestQueue`` / ``PriorityRequestQueue``: ``add`` a new arrival, ``prepend``
a preempted request (to the front in FCFS order; a keyed queue simply re-inserts it under its
key), ``peek`` and ``pop`` the head. ``remove`` takes out a request that leaves while waiting
(a client timeout, queue-time shedding) in O(1): its entry stays until it reaches the head and
is skipped there, as the request is finished by then. ``count(class_name)`` serves per-class
admission limits.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Final

from llmqueue.engine.policies import FCFS, ordering_policy
from llmqueue.engine.request import Request, RequestStatus

FINISHED: Final = RequestStatus.FINISHED


class RequestQueue:
    """Waiting requests in the order of ``policy`` (a name or a policy object)."""

    def __init__(self, policy=FCFS.name):
        self.policy = ordering_policy(policy)
        self._fifo: deque[Request] | None = deque() if self.policy.fifo else None
        self._heap: list = []
        self.size = 0  # requests waiting (read-only outside: the hot loops read it, not len())
        self._by_class: dict[str, int] = {}  # waiting requests per class

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self):
        """The waiting requests in queue order."""
        if self._fifo is not None:
            return iter([r for r in self._fifo if not r.is_finished])
        return iter([e[-1] for e in sorted(self._heap, key=lambda e: e[:-1]) if not e[-1].is_finished])

    def count(self, class_name: str) -> int:
        return self._by_class.get(class_name, 0)

    def add(self, request: Request) -> None:
        self.size += 1
        self._by_class[request.class_name] = self._by_class.get(request.class_name, 0) + 1
        if self._fifo is not None:
            self._fifo.append(request)
        else:
            heapq.heappush(self._heap, (*self.policy.key(request), request))

    def prepend(self, request: Request) -> None:
        """A preempted request rejoins: at the front (FCFS), else under its key."""
        if self._fifo is not None:
            self.size += 1
            self._by_class[request.class_name] = self._by_class.get(request.class_name, 0) + 1
            self._fifo.appendleft(request)
        else:
            self.add(request)

    def peek(self) -> Request | None:
        """The head (None when empty), skipping the entries of requests removed earlier."""
        if self._fifo is not None:
            q = self._fifo
            while q and q[0].status is FINISHED:
                q.popleft()
            return q[0] if q else None
        h = self._heap
        while h and h[0][-1].status is FINISHED:
            heapq.heappop(h)
        return h[0][-1] if h else None

    def pop(self) -> Request | None:
        r = self.peek()
        if r is not None:
            self.take_head(r)
        return r

    def take_head(self, r: Request) -> None:
        """Remove the head ``r`` that :meth:`peek` just returned."""
        if self._fifo is not None:
            self._fifo.popleft()
        else:
            heapq.heappop(self._heap)
        self.size -= 1
        self._by_class[r.class_name] -= 1

    def remove(self, request: Request) -> None:
        """Take out a waiting request that leaves (mark it finished: its entry is skipped later)."""
        self.size -= 1
        self._by_class[request.class_name] -= 1
