"""``Arrivals``: the requests still to arrive at a fast replica, in arrival order.

The arrival process comes from two sources: a fed :class:`~llmqueue.engine.stream.RequestStream`
(sorted by arrival time, read a chunk of columns at a time, a :class:`Request` made only as it
arrives, so memory holds what is in flight) and a heap of submitted requests (a fleet's routed
ones, a client's retries), ordered by time, first attempts before retries, then stream position.
At equal times the stream's request comes first.
"""

from __future__ import annotations

import heapq
import math
from typing import Final

from llmqueue.engine.request import Request
from llmqueue.engine.stream import CHUNK, ChunkLists, RequestStream

_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop


class Arrivals:
    """The requests a replica has been handed and not yet seen (see the module docstring)."""

    __slots__ = ("submitted", "stream", "chunk", "times", "lists", "pos", "next_stream_time")

    def __init__(self) -> None:
        self.submitted: list = []  # heap of (time, retry?, seq, request): see admission.arrival_entry
        self.stream: RequestStream | None = None
        self.chunk = 0                 # the next chunk of the stream to load
        self.times: list[float] = []   # the loaded chunk's arrival times (its lists' [1], kept at hand)
        self.lists: ChunkLists | None = None  # the loaded chunk's columns (RequestStream.lists)
        self.pos = 0                   # the next request's position in the loaded chunk
        self.next_stream_time = math.inf

    def push(self, entry: tuple) -> None:
        """A submitted request's heap entry (:func:`~llmqueue.engine.admission.arrival_entry`)."""
        _heappush(self.submitted, entry)

    def feed(self, stream: RequestStream) -> None:
        """Take a whole stream (sorted by arrival time), read from its first request."""
        self.stream = stream
        self.chunk = 0
        self._load_chunk()

    def _load_chunk(self, pos: int = 0) -> None:
        """Load the stream's next chunk (from its ``pos``-th request)."""
        s = self.stream
        if s is None or self.chunk * CHUNK + pos >= s.n:
            self.times, self.lists, self.next_stream_time = [], None, math.inf
            return
        lists = s.lists(self.chunk)
        self.lists = lists
        self.times = lists[1]
        self.chunk += 1
        self.pos = pos
        self.next_stream_time = self.times[pos]

    def position(self) -> int:
        """Requests of the fed stream taken so far."""
        if self.stream is None:
            return 0
        if self.next_stream_time == math.inf:
            return self.stream.n
        return (self.chunk - 1) * CHUNK + self.pos

    def seek(self, i: int) -> None:
        """The stream's next request is its ``i``-th (the epoch path took those before it)."""
        assert self.stream is not None
        if i >= self.stream.n:
            self.times, self.lists, self.next_stream_time = [], None, math.inf
            return
        if self.next_stream_time != math.inf and i // CHUNK == self.chunk - 1:  # inside the loaded chunk
            self.pos = i % CHUNK
            self.next_stream_time = self.times[self.pos]
            return
        self.chunk = i // CHUNK
        self._load_chunk(i % CHUNK)

    def next_time(self) -> float:
        """When the next request arrives (``inf``: none left)."""
        t = self.next_stream_time
        a = self.submitted
        return a[0][0] if a and a[0][0] < t else t

    def take(self, t: float) -> Request | None:
        """The next request arriving by ``t`` (the stream's before a submitted one at equal times),
        taken from its source; None when none is left."""
        a = self.submitted
        ts = self.next_stream_time
        if ts <= t and (not a or ts <= a[0][0]):
            s = self.stream
            lists = self.lists
            assert s is not None and lists is not None
            r = s.make_in(lists, self.pos)
            self.pos += 1
            if self.pos == len(self.times):
                self._load_chunk()
            else:
                self.next_stream_time = self.times[self.pos]
            return r
        if a and a[0][0] <= t:
            return _heappop(a)[3]
        return None

    def count_class(self, class_name: str) -> int:
        """Submitted requests of one class not yet seen."""
        return sum(1 for e in self.submitted if e[3].class_name == class_name)

    def arrived_by(self, t: float) -> list:
        """Submitted requests whose arrival time has come by ``t``, not yet seen by the scheduler."""
        return [e[3] for e in self.submitted if e[0] <= t]

    def drain(self) -> list:
        """The submitted requests not yet seen, handed back (in heap order)."""
        held = [e[3] for e in self.submitted]
        self.submitted.clear()
        return held
