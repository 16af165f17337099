"""``RequestStream``: a run's arrivals, made into engine :class:`Request` objects as they arrive.

The arrival process of the queue as compact columns (a generated workload or a trace, sorted by
arrival time), read in chunks: a replica holds only the requests that have arrived and not left,
so memory grows with what is in flight, not with the length of the run. ``seq`` of a request is
its position in the stream (records come back in that order).
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from llmqueue.engine.request import Request
from llmqueue.errors import InputError

CHUNK = 8192
#: a chunk's columns as lists: (first position, arrival times, request ids, prompt tokens, output
#: tokens, class indices, SRPT predictions (or Nones), session ids or None)
ChunkLists = tuple[int, list[float], list[int], list[int], list[int], list[int], list, "list[int] | None"]


class RequestStream:
    """Columns of a request stream (``RequestArrays``-like) with the engine's per-request extras:
    class priorities (``class_priority``), SRPT predictions (``predicted_output``), prefix hash ids, and
    the session (conversation) id of each request when the columns have a ``session_id`` column
    (one int per request; negative: none)."""

    def __init__(self, requests, *, class_priority: dict | None = None, predicted_output=None, hash_ids=None):
        n = len(requests)
        self.n = n
        self.request_id = np.asarray(requests.request_id, dtype=np.int64)
        self.arrival_s = np.asarray(requests.arrival_s, dtype=np.float64)
        self.prompt = np.asarray(requests.prompt_tokens, dtype=np.int64)
        self.output = np.asarray(requests.output_tokens, dtype=np.int64)
        if hasattr(requests, "class_index"):
            self.classes, self.class_index = tuple(requests.classes), np.asarray(requests.class_index)
        else:
            cls = requests.class_name
            names = [str(c) for c in cls] if not isinstance(cls, str) else [cls] * n
            uniq = sorted(set(names))
            pos = {c: i for i, c in enumerate(uniq)}
            self.classes, self.class_index = tuple(uniq), np.asarray([pos[c] for c in names], dtype=np.int32)
        prio = class_priority or {}
        self.class_prio = tuple(int(prio.get(c, 0)) for c in self.classes)
        self.predicted = None if predicted_output is None else np.asarray(predicted_output, dtype=np.float64)
        if hash_ids is not None and len(hash_ids) != n:
            raise InputError("hash_ids", f"{len(hash_ids)} hash lists for {n} requests")
        self.hash_ids = hash_ids
        sess = getattr(requests, "session_id", None)
        self.session = None if sess is None else np.asarray(sess, dtype=np.int64)
        if self.session is not None and self.session.shape != (n,):
            raise InputError("session_id", f"{self.session.size} session ids for {n} requests")
        self._cached_c = -1
        self._cached: ChunkLists | None = None

    def __len__(self) -> int:
        return self.n

    def lists(self, c: int) -> ChunkLists:
        """Chunk ``c`` (positions ``c * CHUNK`` on): its columns as Python lists, the arrival times
        second (the last chunk asked for is kept); :meth:`make_in` makes its requests."""
        if self._cached_c == c and self._cached is not None:
            return self._cached
        lo, hi = c * CHUNK, min(self.n, (c + 1) * CHUNK)
        pred = self.predicted[lo:hi].tolist() if self.predicted is not None else [None] * (hi - lo)
        sess = self.session[lo:hi].tolist() if self.session is not None else None
        lists: ChunkLists = (lo, self.arrival_s[lo:hi].tolist(), self.request_id[lo:hi].tolist(),
                             self.prompt[lo:hi].tolist(), self.output[lo:hi].tolist(), self.class_index[lo:hi].tolist(),
                             pred, sess)
        self._cached = lists
        self._cached_c = c
        return lists

    def make_in(self, lists: ChunkLists, j: int) -> Request:
        """The ``j``-th request of the chunk whose :meth:`lists` are ``lists``."""
        lo, times, ids, ps, os_, ci, pred, sess = lists
        k = ci[j]
        h = None
        if self.hash_ids is not None:
            h = self.hash_ids[lo + j]
            h = tuple(int(x) for x in h) if h is not None and len(h) else None
        r = Request(ids[j], times[j], ps[j], os_[j], self.classes[k], self.class_prio[k], 1, h, pred[j], lo + j)
        if sess is not None and sess[j] >= 0:
            r.session_id = sess[j]
        return r

    def make(self, i: int) -> Request:
        """The request at position ``i``."""
        return self.make_in(self.lists(i // CHUNK), i % CHUNK)

    def requests(self):
        """An iterator over the stream's requests in arrival order, made a chunk at a time as the
        caller reaches them: memory holds one chunk of requests beyond those in flight, and a
        chunk's requests lie together in memory (made in one pass, not between the events)."""
        return chain.from_iterable(self._chunk_requests())

    def _chunk_requests(self):
        make = self.make_in
        out = []
        for c in range(-(-self.n // CHUNK)):
            lists = self.lists(c)
            out += [make(lists, j) for j in range(len(lists[1]))]
            if len(out) >= 8 * CHUNK:
                yield out
                out = []
        yield out
