"""The decisions a fleet's policies made, with the view each one saw, and their replay.

Every routing and admission decision is a function of a policy object's own state (a token
bucket's tokens, a round-robin counter, a random stream, a prefix table) and of the numbers it
read: a pool's :class:`~llmqueue.cluster.view.PoolView` (outstanding requests and prefill
backlog per replica, the routable replicas, the replicas' loads it asked for, the sum of their
queues when it asked for that (``replicas_waiting``), the gateway queue's length and the age of
its oldest request without a first token) and the request's own attributes.
:class:`DecisionLog` wraps the policy objects so that each call is written down with exactly the
numbers it read; :func:`replay` runs fresh policy objects of the same description on
the recorded calls, in order, and returns the decisions they make. A live gateway records its
decisions the same way: replaying them checks that its decisions are those of the simulator's
objects (no live copy of a policy), and comparing them with a simulated run of the same arrivals
shows where the simulated fleet and the real one part.

A record is a plain dict (JSON-ready): ``kind`` (``route`` or ``admit``), ``t``, ``pool``, the
request's attributes (``request``), the view(s) read (``views``: pool -> snapshot) and the
decision (``out``: the replica index, None to hold; or ``[pool, reason]``). A snapshot's ``loads``
(replica index -> :class:`~llmqueue.engine.api.ReplicaLoad`) become lists when written
(:func:`encode`).
"""

from __future__ import annotations

from llmqueue.cluster.view import PoolView
from llmqueue.engine.api import ReplicaLoad

#: request attributes a policy may read
REQUEST_FIELDS = ("request_id", "class_name", "num_prompt_tokens", "max_tokens", "priority", "hash_ids",
                  "session_id", "arrival_time", "attempt")


def request_fields(r) -> dict:
    out = {k: getattr(r, k, None) for k in REQUEST_FIELDS}
    if out["hash_ids"] is not None:
        out["hash_ids"] = [int(h) for h in out["hash_ids"]]
    return out


class RecordedRequest:
    """A request rebuilt from its recorded attributes (what the policies read)."""

    def __init__(self, fields: dict):
        for k in REQUEST_FIELDS:
            setattr(self, k, fields.get(k))
        if self.hash_ids is not None:
            self.hash_ids = tuple(self.hash_ids)


class _Tap:
    """A view that notes the replica loads a policy asks for (the rest is copied when the call ends)."""

    def __init__(self, view: PoolView):
        self.view = view
        self.loads: dict = {}
        self.waiting = None   # replicas_waiting(), once read

    def load(self, i: int) -> ReplicaLoad:
        x = self.loads.get(i)
        if x is None:
            x = self.loads[i] = self.view.load(i)
        return x

    def replicas_waiting(self) -> int:
        if self.waiting is None:
            self.waiting = self.view.replicas_waiting()
        return self.waiting

    def tapped(self) -> PoolView:
        v = self.view
        return PoolView(v.name, v.outstanding, v.routable, load=self.load, max_num_seqs=v.max_num_seqs,
                        kv_blocks_total=v.kv_blocks_total, block_size=v.block_size,
                        hash_block_tokens=v.hash_block_tokens, pending_prefill=v.pending_prefill, held=v.held,
                        no_token=v.no_token, replicas_waiting=self.replicas_waiting)

    def snapshot(self) -> dict:
        v = self.view
        oldest = next(iter(v.no_token.values()), None)
        return {"outstanding": list(v.outstanding), "pending_prefill": list(v.pending_prefill),
                "routable": list(v.routable), "held": len(v.held), "oldest_no_token": oldest,
                "loads": self.loads,  # ReplicaLoad snapshots (immutable): made JSON by :func:`encode` when written
                "replicas_waiting": self.waiting,
                "max_num_seqs": v.max_num_seqs, "kv_blocks_total": v.kv_blocks_total, "block_size": v.block_size,
                "hash_block_tokens": v.hash_block_tokens}


def encode(o):
    """``json.dumps(record, default=encode)``: a record's replica loads as lists
    ``[num_waiting, num_running, kv_blocks_free, kv_blocks_total, busy, age_s]`` (the decision keeps
    the objects it read; turning them into text is left to the writer, off the request's path)."""
    if isinstance(o, ReplicaLoad):
        return [o.num_waiting, o.num_running, o.kv_blocks_free, o.kv_blocks_total, o.busy, o.age_s]
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def view_from(name: str, snap: dict) -> PoolView:
    """A :class:`PoolView` holding a snapshot's numbers (loads not recorded were not read)."""
    loads = {int(i): x if isinstance(x, ReplicaLoad) else ReplicaLoad(*x) for i, x in snap["loads"].items()}

    def load(i: int) -> ReplicaLoad:
        try:
            return loads[i]
        except KeyError:
            raise KeyError(f"replay read replica {i}'s load, which the recorded decision did not read") from None

    oldest = snap["oldest_no_token"]
    waiting = snap.get("replicas_waiting")  # absent in a record written before it was kept: the sum of the loads
    return PoolView(name, list(snap["outstanding"]), list(snap["routable"]), load=load,
                    max_num_seqs=snap["max_num_seqs"], kv_blocks_total=snap["kv_blocks_total"],
                    block_size=snap["block_size"], hash_block_tokens=snap["hash_block_tokens"],
                    pending_prefill=list(snap["pending_prefill"]), held=range(snap["held"]),
                    no_token={} if oldest is None else {None: oldest},
                    replicas_waiting=None if waiting is None else lambda: waiting)


class DecisionLog:
    """Records the decisions of a fleet's routers and gateway (see the module docstring).
    ``records``: the calls in the order they were made; ``sink(record)``: also called with each
    (a live gateway writes them to its run as they come)."""

    def __init__(self, sink=None):
        self.records: list = []
        self.sink = sink

    def _add(self, rec: dict) -> None:
        self.records.append(rec)
        if self.sink is not None:
            self.sink(rec)

    def router(self, pool: str, router, clock):
        """``router`` wrapped: each ``route(request, view)`` is recorded (``clock()``: the time, when
        the driver has one to give; routing reads no time)."""
        return _RecordingRouter(self, pool, router, clock)

    def gateway(self, gateway):
        """A gateway runtime wrapped: each ``decide(request, view, views, t)`` is recorded."""
        return _RecordingGateway(self, gateway)


class _RecordingRouter:
    def __init__(self, log: DecisionLog, pool: str, router, clock):
        self.log, self.pool, self.router, self.clock = log, pool, router, clock
        self.name = router.name
        self.central = getattr(router, "central", False)

    def route(self, request, view):
        tap = _Tap(view)
        out = self.router.route(request, tap.tapped())
        self.log._add({"kind": "route", "t": self.clock() if self.clock is not None else None, "pool": self.pool, "request": request_fields(request),
                       "views": {self.pool: tap.snapshot()}, "out": out})
        return out


class _RecordingGateway:
    def __init__(self, log: DecisionLog, gateway):
        self.log, self.gateway = log, gateway

    def __getattr__(self, name):
        return getattr(self.gateway, name)

    def decide(self, request, view, views: dict, t: float):
        taps = {k: _Tap(v) for k, v in views.items()}
        tapped = {k: tp.tapped() for k, tp in taps.items()}
        out_view, why = self.gateway.decide(request, tapped[view.name], tapped, t)
        self.log._add({"kind": "admit", "t": t, "pool": view.name, "request": request_fields(request),
                       "views": {k: tp.snapshot() for k, tp in taps.items()}, "out": [out_view.name, why]})
        return views[out_view.name], why


def fresh_policies(spec, seed: int) -> tuple[dict, object]:
    """New policy objects of fleet ``spec`` (a :class:`~llmqueue.cluster.spec.FleetSpec`) as a run
    with ``seed`` starts them: ``(routers by pool name, gateway runtime or None)``."""
    from llmqueue.cluster.gateway import GatewayRuntime
    from llmqueue.cluster.pool import pool_router

    routers = {p.name: pool_router(p, k, seed) for k, p in enumerate(spec.pools)}
    return routers, (GatewayRuntime(spec.gateway) if spec.gateway is not None else None)


def replay(records, *, routers: dict, gateway=None) -> list:
    """The decisions fresh policy objects make on recorded calls, in order: ``routers`` (pool ->
    a new router of that pool's kind and seed), ``gateway`` (a new
    :class:`~llmqueue.cluster.gateway.GatewayRuntime` of the same rules). Returns each call's
    decision in the recorded form (compare with each record's ``out``)."""
    out = []
    for rec in records:
        views = {name: view_from(name, snap) for name, snap in rec["views"].items()}
        req = RecordedRequest(rec["request"])
        if rec["kind"] == "route":
            out.append(routers[rec["pool"]].route(req, views[rec["pool"]]))
        else:
            v, why = gateway.decide(req, views[rec["pool"]], views, rec["t"])
            out.append([v.name, why])
    return out
