"""The live side of a pool's view: real engines behind the gateway, seen as numbers.

A :class:`LivePool` holds what the fleet simulator's pool runtime holds, for engines the gateway
reaches over HTTP: per replica (a backend URL) the requests the gateway has handed it and not
seen end (``outstanding``, ``N_i``) and their prompt tokens without a first token (the prefill
backlog), the routable replicas (up, not failed), the pool's gateway queue (``held``: FIFO, or
weighted fair between tenants) and its requests without a first token (the queue age). The
replicas' own numbers (waiting, running, KV blocks free) come from each engine's ``/metrics``
(:class:`Backend`, scraped every ``scrape_interval_s`` and served with their age); an engine that
publishes none is read from the gateway's bookkeeping (running = its outstanding up to
``max_num_seqs``, the rest waiting). A scrape is up to an interval old, so its counts are capped by
what the gateway has handed the engine now (running at most the outstanding requests, waiting at
most the rest): a request that ended since the scrape is not counted as queued. Requests a scrape
finds waiting while the engine has free sequence slots and KV (below ``FULL_KV``), and that the
scrape before found none, arrived during the step the scrape caught: they are counted as running
(they start at the next step), not as a queue that would stand for the interval; waiting seen on
two scrapes in a row, or with the slots or the KV full, is a queue. The pool's :class:`~llmqueue.cluster.view.PoolView` is built
over these numbers exactly as the simulator builds it, so the same router, admission and fallback
objects decide here.
"""

from __future__ import annotations

from collections import Counter, deque

from llmqueue.cluster.fairness import FairQueue
from llmqueue.cluster.pool import pool_router
from llmqueue.cluster.view import PoolView
from llmqueue.engine.api import ReplicaLoad


#: KV usage from which an engine's waiting requests are taken to wait for memory
FULL_KV = 0.9


class Backend:
    """One engine (``url``: its base URL) of a pool: the scraped load, and whether it serves.

    ``scraped``: ``(num_waiting, num_running, kv_usage, t, persistent)`` from its last ``/metrics``
    (``persistent``: requests were waiting at the scrape before too), or None;
    ``kv_blocks_total``: from ``vllm:cache_config_info`` when published; ``failed_until``: a replica
    that failed mid-answer or refused connections is out of the routable set until a health probe
    answers (``inf`` until then)."""

    __slots__ = ("url", "index", "scraped", "kv_blocks_total", "failed_until", "upstream", "errors")

    def __init__(self, url: str, index: int):
        self.url = url.rstrip("/")
        self.index = index
        self.scraped: tuple | None = None
        self.kv_blocks_total: int | None = None
        self.failed_until = 0.0
        self.upstream: dict = {}   # endpoint path -> llmqueue.bench.http.Pool (keep-alive connections)
        self.errors = 0

    def read_metrics(self, text: str, t: float) -> None:
        """Take a ``/metrics`` text scraped at ``t`` (vLLM's names; an engine without them keeps
        being read from the gateway's bookkeeping)."""
        from llmqueue.bench.prom import ALIASES, cache_config, parse_metrics

        names = [*ALIASES["num_waiting"], *ALIASES["num_running"], *ALIASES["kv_usage"], "vllm:cache_config_info"]
        snap = parse_metrics(text, names)
        w, r = snap.first(ALIASES["num_waiting"]), snap.first(ALIASES["num_running"])
        if w != w or r != r:  # NaN: not published
            return
        if self.kv_blocks_total is None and "vllm:cache_config_info" in snap:
            cc = cache_config(snap)
            if cc.num_gpu_blocks:
                self.kv_blocks_total = int(cc.num_gpu_blocks)
        kv = snap.first(ALIASES["kv_usage"], 0.0)
        seen_before = self.scraped is not None and self.scraped[0] > 0
        self.scraped = (int(w), int(r), float(kv) if kv == kv else 0.0, t, seen_before and w > 0)


class LivePool:
    """The replicas of pool ``spec`` (index ``k``) reached at ``urls`` (see the module docstring).
    ``clock()``: the gateway's time (seconds since it started)."""

    def __init__(self, spec, k: int, urls: list, *, seed: int, clock, fair_share: dict | None = None,
                 hash_block_tokens: int = 512):
        self.spec = spec
        self.k = k
        self.name = spec.name
        self.config = spec.config
        self.clock = clock
        self.backends = [Backend(u, i) for i, u in enumerate(urls)]
        n = len(urls)
        self.outstanding = [0] * n
        self.pending_prefill = [0] * n
        self.waiting = [0] * n   # each replica's queue as its load counts it, kept by _recount()
        self.waiting_sum = 0
        self.routable = list(range(n))
        self.by_class: Counter = Counter()
        self.fair = FairQueue(fair_share) if fair_share else None
        self.held = self.fair if fair_share else deque()
        self.no_token: dict = {}
        self.router = pool_router(spec, k, seed)
        self.central = getattr(self.router, "central", False)
        c = self.config
        self.max_num_seqs = int(c.max_num_seqs)
        self.blocks = int(c.num_kv_blocks)   # a replica's KV blocks until its engine publishes its own
        self.view = PoolView(self.name, self.outstanding, self.routable, load=self.load, max_num_seqs=c.max_num_seqs,
                             kv_blocks_total=c.num_kv_blocks, block_size=c.block_size,
                             hash_block_tokens=hash_block_tokens, pending_prefill=self.pending_prefill,
                             held=self.held, no_token=self.no_token, replicas_waiting=self.replicas_waiting)

    def _counts(self, i: int) -> tuple:
        """Replica ``i``'s ``(waiting, running, scrape or None)``: scraped, capped by the
        gateway's outstanding count, else from the gateway's bookkeeping."""
        n = self.outstanding[i]  # what the gateway has there now: a scrape up to an interval old never says more
        s = self.backends[i].scraped
        if s is None:
            run = n if n < self.max_num_seqs else self.max_num_seqs
            return n - run, run, None
        w, r, kv, t, persistent = s
        if w and not persistent and r + w <= self.max_num_seqs and kv < FULL_KV:
            r, w = r + w, 0  # arrived during the step the scrape caught: they start at the next one
        r = min(r, n)
        return min(w, n - r), r, s

    def load(self, i: int) -> ReplicaLoad:
        """Replica ``i``'s load: scraped (with its age), else from the gateway's bookkeeping."""
        total = self.backends[i].kv_blocks_total or self.blocks
        w, r, s = self._counts(i)
        if s is None:
            return ReplicaLoad(w, r, total, total, r > 0, 0.0)
        return ReplicaLoad(w, r, int(round(total * (1.0 - s[2]))), total, r > 0, max(self.clock() - s[3], 0.0))

    def count(self, i: int, d: int) -> None:
        """Replica ``i`` holds ``d`` more requests (``-1``: one ended): ``N_i`` and its queue in
        the pool's sum (the outstanding counts change here only)."""
        self.outstanding[i] += d
        self._recount(i)

    def read_metrics(self, i: int, text: str, t: float) -> None:
        """Replica ``i``'s ``/metrics`` text scraped at ``t`` (:meth:`Backend.read_metrics`)."""
        self.backends[i].read_metrics(text, t)
        self._recount(i)

    def _recount(self, i: int) -> None:
        """Replica ``i``'s queue in the pool's sum anew (:meth:`replicas_waiting` is then one read,
        not ``n`` loads)."""
        w = self._counts(i)[0]
        self.waiting_sum += w - self.waiting[i]
        self.waiting[i] = w

    def replicas_waiting(self) -> int:
        """Requests queued at the pool's replicas (``sum_i Q_i``), as their loads count them."""
        return self.waiting_sum

    def fail(self, i: int) -> None:
        """Replica ``i`` failed: out of the routable set until a probe finds it healthy."""
        self.backends[i].failed_until = float("inf")
        if i in self.routable:
            self.routable.remove(i)

    def recover(self, i: int) -> None:
        self.backends[i].failed_until = 0.0
        if i not in self.routable:
            self.routable.append(i)
            self.routable.sort()

    def free_slot(self) -> int | None:
        """For the central router's dispatch: is any routable replica below ``max_num_seqs``?"""
        out = self.outstanding
        return next((i for i in self.routable if out[i] < self.max_num_seqs), None)
