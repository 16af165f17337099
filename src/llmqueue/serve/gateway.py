"""``llmqueue gateway``: the fleet's control plane in front of real engines, running the
simulator's own policy objects.

Each request, in the source documents' order (seed 000 section 6, seed 003 sections 6-10):

1. **classify**: its class from ``X-Request-Class`` (a class the scenario names; else 400), else
   the lanes' prompt geometry; its tenant from ``X-Tenant``, else its API key (kept as a short
   hash, never the key), else ``anonymous`` (both headers: printable ASCII, at most
   :data:`MAX_LABEL_CHARS` characters, else 400 naming the header; neither is sent upstream); its prompt length exact for token ids, else by
   :func:`llmqueue.serve.openai.text_tokens`'s stated rule;
2. **lane**: the scenario's lanes pick the pool (unmatched: the first pool);
3. **admit or shed**: the scenario's gateway rules (:class:`~llmqueue.cluster.gateway.GatewayRuntime`:
   class and tenant rate limits, fallback to another pool while its queue ages, degradation (a
   class's ``max_tokens`` capped in the body forwarded, or another pool, while the queue is old),
   a bound on queue depth or age, tier shedding): ``429`` with ``Retry-After`` from the bucket's refill, ``503``
   with ``Retry-After`` from the pool's predicted drain time, OpenAI-style bodies;
4. **route**: the pool's router (:mod:`llmqueue.cluster.routers`) on the pool's
   :class:`~llmqueue.cluster.view.PoolView`, filled here from the gateway's bookkeeping and each
   engine's scraped ``/metrics`` (:mod:`llmqueue.serve.live`); the ``central`` router holds the
   request in the gateway's queue (FIFO, or weighted fair between tenants) until a replica has a
   free sequence slot;
5. **forward** the body to the engine and relay its answer as it arrives
   (:mod:`llmqueue.serve.relay`); a connect error, a 5xx or an answer that cannot be read (not
   HTTP, broken chunking, events that are not server-sent events, a whole answer that is not JSON)
   before the first byte is sent again to another routable replica (at most ``max_retries`` times,
   counted; none left: ``502`` with the last failure); a failure mid-stream ends the client's
   stream with an error event and takes the replica out until its ``/health`` answers; an engine
   with no answer head by ``upstream_first_byte_timeout_s`` or no whole answer by
   ``upstream_timeout_s`` gets its connection closed and the client ``504`` (or its stream cut),
   recorded as ``timeout``;
   a client that goes away closes the engine's connection (the engine aborts the request and frees
   its KV), counted as cancelled.

The policies are the objects the simulator runs (no live copy); every decision is recorded with
the numbers it read (``decisions.jsonl``, :mod:`llmqueue.cluster.decisions`), so a run can be
replayed through them. Each request's record goes to the run folder in the project's one schema
(``requests.parquet``, through a journal every 64 requests or second), with its pool, replica, lane,
class, tenant, served model and, for refusals, the reason; ``/metrics`` has the dashboard
(:mod:`llmqueue.serve.gateway_metrics`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time

from llmqueue.serve.http import IDLE_TIMEOUT_S, MAX_CONNECTIONS, REQUEST_TIMEOUT_S, HttpServer
from llmqueue.serve.openai import ApiError, text_tokens

MAX_LABEL_CHARS = 64   # X-Tenant and X-Request-Class values
ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET", "/health": "GET",
          "/metrics": "GET"}
FLUSH_S = 1.0           # the records reach the disk at least this often (a crash loses at most this)
FLUSH_ROWS = 64         # and as soon as this many wait: one flush stalls the loop ~0.7 ms, not ~5 ms at 500 req/s
FLUSH_TICK_S = 0.05


class GatewayRequest:
    """What the gateway knows of one request while it is in flight."""

    __slots__ = ("r", "cls", "tenant", "lane", "pool", "replica", "body", "path", "stream", "t_arrival",
                 "t_dispatch", "first", "finish", "out_tokens", "status", "reason", "attempt", "ex", "relay", "held",
                 "gaps", "model", "failure", "asked", "degraded")

    def __init__(self, r, cls: str, tenant: str, lane: str, body: bytes, path: str, stream: bool, ex):
        self.r = r
        self.cls, self.tenant, self.lane = cls, tenant, lane
        self.pool = ""
        self.replica = -1
        self.body, self.path, self.stream, self.ex = body, path, stream, ex
        self.t_arrival = r.arrival_time
        self.t_dispatch = math.nan
        self.first = self.finish = math.nan
        self.out_tokens = 0
        self.status = "ok"
        self.failure = ""   # why the last replica tried did not answer (a retry's reason)
        self.reason = ""
        self.attempt = 1
        self.relay = None
        self.held: asyncio.Future | None = None
        self.gaps: tuple = ()
        self.model: str | None = None   # the model the client asked for
        self.asked = r.max_tokens   # the max_tokens the client asked for (a degrade rule may cap it)
        self.degraded = ""          # how the gateway served it smaller ("max_tokens 128", "to small"; "": as asked)


class Gateway:
    """The gateway (see the module docstring).

    ``fleet``: a :class:`~llmqueue.cluster.spec.FleetSpec` (pools, lanes, gateway rules);
    ``backends``: pool name -> engine base URLs (one per replica); ``classes``: class name ->
    priority (the scenario's); ``out_dir``: the run folder (None: no files); ``upstream_keys``: pool
    -> an API key sent only to that pool's engines; ``forward_client_key``: pass the client's
    ``Authorization`` to the engines (off: client keys never leave the gateway);
    ``upstream_timeout_s``: an answer not whole by then is cut (504, or the stream ended);
    ``upstream_first_byte_timeout_s``: an engine whose answer has not begun by then (None: the
    total) is cut the same way; ``request_timeout_s``, ``idle_timeout_s``, ``max_connections``:
    the client side's limits (:class:`~llmqueue.serve.http.HttpServer`)."""

    def __init__(self, fleet, backends: dict, *, classes: dict | None = None, seed: int = 0, out_dir=None,
                 upstream_keys: dict | None = None, forward_client_key: bool = False, max_retries: int = 2,
                 upstream_timeout_s: float = 600.0, scrape_interval_s: float = 1.0, max_body_bytes: int = 8 << 20,
                 served_model: str | None = None, upstream_first_byte_timeout_s: float | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS):
        from llmqueue.cluster.decisions import DecisionLog
        from llmqueue.cluster.gateway import GatewayRuntime
        from llmqueue.serve.gateway_metrics import GatewayMetrics
        from llmqueue.serve.live import LivePool

        _check(fleet, backends)
        self.fleet = fleet
        self.t0 = time.perf_counter()
        self.t0_epoch = time.time()
        g = fleet.gateway
        self.tenants: dict = {}   # request -> tenant (the policies' tenant_of)
        fair = g.fair_share if g is not None else None
        self.pools = {p.name: LivePool(p, k, backends[p.name], seed=seed, clock=self.now, fair_share=fair)
                      for k, p in enumerate(fleet.pools)}
        for pool in self.pools.values():
            if pool.fair is not None:
                pool.fair.tenant_of = self.tenant_of
        self.views = {name: p.view for name, p in self.pools.items()}
        self.classes = dict(classes or {})
        self.out_dir = out_dir
        self.records = None   # a GatewayRecords, opened once the gateway listens (a refused start writes nothing)
        self.decisions = DecisionLog(sink=self._decision if out_dir is not None else None)
        for pool in self.pools.values():
            pool.router = self.decisions.router(pool.name, pool.router, self.now)
        self.rules = (self.decisions.gateway(GatewayRuntime(g, tenant_of=self.tenant_of)) if g is not None else None)
        self.metrics = GatewayMetrics(self.pools, clock=self.now,
                                      depth_bound=g.max_queue_depth if g is not None else None)
        self.upstream_keys = dict(upstream_keys or {})
        self.forward_client_key = forward_client_key
        self.max_retries = max_retries
        self.upstream_timeout_s = upstream_timeout_s
        self.first_byte_timeout_s = (upstream_first_byte_timeout_s if upstream_first_byte_timeout_s is not None
                                     and upstream_first_byte_timeout_s < upstream_timeout_s else None)
        self.scrape_interval_s = scrape_interval_s
        self.served_model = served_model or next((p.model for p in fleet.pools if p.model), "llmqueue")
        self.engine_models: list = []
        self.pool_models: dict = {}   # pool -> the model names its engines serve
        self.server = HttpServer(self.handle, max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s,
                                 idle_timeout_s=idle_timeout_s, max_connections=max_connections)
        self.in_flight: set = set()
        self.waiting: dict = {}   # request -> its GatewayRequest, while held in a pool's gateway queue
        self.n = 0
        self._tasks: list = []

    def now(self) -> float:
        """The gateway's clock: seconds since it started (the records' time origin)."""
        return time.perf_counter() - self.t0

    def _decision(self, rec: dict) -> None:
        if self.records is not None:
            self.records.decision(rec)

    def tenant_of(self, r) -> str:
        return self.tenants.get(r, r.class_name)

    # -- serving -----------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 8080) -> "Gateway":
        from llmqueue.bench.http import Pool

        loop = asyncio.get_running_loop()
        for name, pool in self.pools.items():
            headers = [("Content-Type", "application/json")]
            if name in self.upstream_keys:
                headers.append(("Authorization", f"Bearer {self.upstream_keys[name]}"))
            for b in pool.backends:
                for path in ("/v1/completions", "/v1/chat/completions"):
                    up = Pool(loop, b.url + path, headers)
                    await up.resolve()
                    b.upstream[path] = up
        await self._discover_models()
        await self.server.start(host, port, field="listen")
        if self.out_dir is not None:
            from llmqueue.serve.gateway_records import GatewayRecords

            self.records = GatewayRecords(self.out_dir, self.t0_epoch,
                                          degraded=bool(self.fleet.gateway is not None and self.fleet.gateway.degrade))
        self._tasks = [asyncio.ensure_future(self._scrape_loop())]
        if self.records is not None:
            self._tasks.append(asyncio.ensure_future(self._flush_loop()))
        return self

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    async def drain(self, timeout_s: float) -> int:
        """Stop taking requests and wait for those in flight, up to ``timeout_s``; returns how many
        were still in flight (then cut)."""
        self.server.stop_listening()
        end = time.perf_counter() + timeout_s
        while self.in_flight and time.perf_counter() < end:
            await asyncio.sleep(0.05)
        left = len(self.in_flight)
        for q in list(self.in_flight):
            self._cut(q, "cancelled", "gateway stopped")
        return left

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await self.server.close()
        for pool in self.pools.values():
            for b in pool.backends:
                for up in b.upstream.values():
                    up.close()
        if self.records is not None:
            self.records.close()

    def handle(self, ex):
        want = ROUTES.get(ex.path)
        if want is None:
            return ex.respond(404, b'{"detail":"Not Found"}')
        if ex.method != want:
            return ex.respond(405, b'{"detail":"Method Not Allowed"}')
        if ex.path == "/health":
            return ex.respond(200, b"", "text/plain")
        if ex.path == "/metrics":
            return ex.respond(200, self.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
        if ex.path == "/v1/models":
            return ex.respond_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "owned_by": "llmqueue-gateway"} for m in self._models()]})
        return self._completion(ex)

    def _models(self) -> list:
        """The model names the gateway answers for: what its engines serve (``/v1/models`` at the
        start), else the scenario's pool models."""
        if self.engine_models:
            return self.engine_models
        return list(dict.fromkeys([self.served_model, *(p.model for p in self.fleet.pools if p.model)]))

    async def _discover_models(self) -> None:
        import httpx

        names: list = []
        async with httpx.AsyncClient(timeout=2.0) as client:
            for pool in self.pools.values():
                served: list = []
                for b in pool.backends:
                    try:
                        doc = (await client.get(b.url + "/v1/models")).json()
                        served += [m["id"] for m in doc.get("data", []) if isinstance(m, dict) and "id" in m]
                    except Exception:  # noqa: BLE001 - an engine not up yet: its names are not known
                        continue
                self.pool_models[pool.name] = list(dict.fromkeys(served))
                names += served
        self.engine_models = list(dict.fromkeys(names))
        if self.engine_models:
            self.served_model = self.engine_models[0]

    # -- a completion ---------------------------------------------------------------------------------
    async def _completion(self, ex) -> None:
        from llmqueue.engine.request import Request

        t = self.now()
        try:
            body, s, o, stream, model = self._parse(ex)
            cls = self._class(ex)
            tenant = self._tenant(ex)
        except ApiError as e:
            self.metrics.requests.labels("", "", "rejected", "bad request").inc()
            return ex.respond(e.status, e.body())
        self.n += 1
        r = Request(request_id=self.n, arrival_time=t, num_prompt_tokens=s, max_tokens=o, class_name=cls,
                    priority=self.classes.get(cls, 0), seq=self.n)
        self.tenants[r] = tenant
        lane, pool_name = self.fleet.lane_of(cls, s)
        q = GatewayRequest(r, cls, tenant, lane, body, ex.path, stream, ex)
        q.model = model
        pool = self.pools[pool_name]
        self.metrics.arrived(pool.name, t)
        try:
            if self.rules is not None:
                view, why = self.rules.decide(r, pool.view, self.views, t)
                pool = self.pools[view.name]
                if why is not None:
                    return self._refuse(q, pool, why)
                if self.rules.degraded is not None:
                    self._degrade(q, self.rules.degraded)
            q.pool = pool.name
            self.in_flight.add(q)
            await self._serve(q, pool)
        finally:
            self.tenants.pop(r, None)

    @staticmethod
    def _degrade(q: GatewayRequest, rule) -> None:
        """Served smaller under a degrade rule: a cap rewrites the body's ``max_tokens`` (and a chat
        body's ``max_completion_tokens``) to what :func:`~llmqueue.cluster.gateway.capped` gives;
        a switch went to its pool already. Marked in the record's ``degraded``."""
        from llmqueue.cluster.gateway import capped

        q.degraded = rule.label
        o = capped(q.r.max_tokens, rule)
        if o < q.r.max_tokens:
            q.r.max_tokens = o
            doc = json.loads(q.body)
            doc["max_tokens"] = o
            if "max_completion_tokens" in doc:
                doc["max_completion_tokens"] = o
            q.body = json.dumps(doc, separators=(",", ":")).encode()

    def _parse(self, ex) -> tuple:
        """``(body, prompt tokens, max_tokens, stream)`` of a completion request."""
        try:
            doc = json.loads(ex.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"JSON decode error: {e}", "BadRequestError", "body") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "the body must be a JSON object", "BadRequestError", "body")
        model = doc.get("model")
        if model is not None and model not in self._models():
            raise ApiError(404, f"The model `{model}` does not exist. Valid models: {', '.join(self._models())}.",
                           "NotFoundError", "model")
        chat = ex.path.endswith("chat/completions")
        p = doc.get("messages") if chat else doc.get("prompt")
        if chat and isinstance(p, list):
            s = sum(text_tokens(m.get("content") or "") if isinstance(m, dict) and isinstance(m.get("content"), str)
                    else 0 for m in p) + 4 * len(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            s = len(p)
        elif isinstance(p, str):
            s = text_tokens(p)
        elif isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            s = text_tokens(p[0])
        else:
            raise ApiError(400, "prompt: text, or a list of token ids" if not chat else "messages: a list of messages",
                           "BadRequestError", "messages" if chat else "prompt")
        o = doc.get("max_completion_tokens") if chat else None
        o = doc.get("max_tokens") if o is None else o
        if o is None:
            o = 16
        if isinstance(o, bool) or not isinstance(o, int) or o < 1:
            raise ApiError(400, f"max_tokens must be a positive integer (got {json.dumps(o)[:40]})",
                           "BadRequestError", "max_tokens")
        return ex.body, max(s, 1), o, bool(doc.get("stream")), model

    def _class(self, ex) -> str:
        cls = ex.headers.get("x-request-class")
        if cls is None:
            return next(iter(self.classes), "default")
        _check_label("X-Request-Class", cls)
        if self.classes and cls not in self.classes:
            raise ApiError(400, f"X-Request-Class: unknown class {cls[:64]!r}; classes: {', '.join(self.classes)}",
                           "BadRequestError", "x-request-class")
        return cls

    @staticmethod
    def _tenant(ex) -> str:
        t = ex.headers.get("x-tenant")
        if t:
            _check_label("X-Tenant", t)
            return t
        auth = ex.headers.get("authorization")
        if auth:
            return "key-" + hashlib.sha256(auth.encode("utf-8", "replace")).hexdigest()[:12]
        return "anonymous"

    def _refuse(self, q: GatewayRequest, pool, why: str) -> None:
        """Refused at the gateway: 429 for a rate limit, 503 for a full or old queue, with
        ``Retry-After``; counted and recorded."""
        limited = why.startswith(("rate limited", "token limited"))
        if limited:
            wait = self.rules.retry_after_s
            e = ApiError(429, f"Too many requests ({why}); retry after {wait:.3g} s", "RateLimitError")
        else:
            wait = self._drain_s(pool)
            e = ApiError(503, f"The service is overloaded ({why}); retry after {wait:.3g} s",
                         "ServiceUnavailableError")
        q.pool = pool.name
        q.ex.respond(e.status, e.body(), headers=(("Retry-After", str(max(1, math.ceil(wait)))),))
        q.status, q.reason, q.finish = "rejected", why, self.now()
        self.metrics.refused(pool.name, q.cls, "rate_limited" if limited else "shed", why, q.finish)
        self._record(q)

    def _drain_s(self, pool) -> float:
        """The pool's predicted drain time: its queue over its service rate (``c mu``), 1 s unknown."""
        pred = self.metrics.prediction(pool.name)
        rate = pred["c"] * pred["mu"]
        return pool.view.queue_depth() / rate if rate == rate and rate > 0 else 1.0

    async def _serve(self, q: GatewayRequest, pool) -> None:
        ex = q.ex
        ex.on_close = lambda: self._client_gone(q)  # a cycle (q -> ex -> this -> q) until the end below
        try:
            while True:
                i = await self._place(q, pool)
                if i is None:
                    return  # cut while held (the client went away, or the gateway stopped)
                if q.status != "ok":  # gone between its dispatch and now: the slot is given back
                    self._taken_back(pool, i, q)
                    break
                outcome = await self._forward(q, pool, i)
                self._taken_back(pool, i, q)
                if outcome == "retry" and q.attempt <= self.max_retries and pool.routable:
                    q.attempt += 1
                    self.metrics.retries.labels(pool.name).inc()
                    continue
                if outcome == "retry":  # nothing left to try: the engine's failure is the answer
                    self._fail_whole(q, 502, f"no replica answered (the last: {q.failure})" if q.failure
                                     else "no replica answered")
                break
            self._end(q, pool)
        finally:
            ex.on_close = None  # the request's objects are freed when it ends, not by the collector

    async def _place(self, q: GatewayRequest, pool):
        """A replica for ``q``: routed now, or after waiting in the pool's gateway queue (the
        central router, or no replica serving). A replica that failed is out of the routable set,
        so a retry goes elsewhere."""
        if not pool.central and pool.routable and not pool.held:
            i = pool.router.route(q.r, pool.view)
            self._hand_over(pool, i, q)
            return i
        q.held = asyncio.get_running_loop().create_future()
        pool.held.append(q.r)
        pool.no_token.setdefault(q.r, q.t_arrival)
        self.waiting[q.r] = q
        self._dispatch_held(pool)
        try:
            return await q.held
        finally:
            q.held = None

    def _dispatch_held(self, pool) -> None:
        held = pool.held
        while held and pool.routable:
            i = pool.router.route(held[0], pool.view)
            if i is None:
                return
            r = held.popleft()
            q = self.waiting.pop(r)
            pool.no_token.pop(r, None)
            self._hand_over(pool, i, q)  # now, not when its coroutine resumes: the slot is taken
            if q.held is not None and not q.held.done():
                q.held.set_result(i)

    def _hand_over(self, pool, i: int, q: GatewayRequest) -> None:
        """``q`` goes to replica ``i``: counted there at once (a decision that follows sees it)."""
        q.replica = i
        q.t_dispatch = self.now()
        self.metrics.dispatched(pool.name, q.cls, q.t_dispatch - q.t_arrival, q.t_dispatch)
        r = q.r
        pool.count(i, 1)
        pool.pending_prefill[i] += r.num_prompt_tokens
        pool.by_class[q.cls] += 1
        pool.no_token.setdefault(r, q.t_arrival)
        if pool.fair is not None:
            pool.fair.charge(q.tenant, r.num_prompt_tokens)

    def _taken_back(self, pool, i: int, q: GatewayRequest) -> None:
        r = q.r
        pool.count(i, -1)
        if r in pool.no_token:
            pool.no_token.pop(r, None)
            pool.pending_prefill[i] -= r.num_prompt_tokens
        pool.by_class[q.cls] -= 1
        if pool.fair is not None and q.out_tokens:
            pool.fair.charge(q.tenant, q.out_tokens)
        if pool.held:
            self._dispatch_held(pool)

    async def _forward(self, q: GatewayRequest, pool, i: int) -> str:
        """Send ``q`` to replica ``i`` and relay its answer: ``ok``, ``retry`` (failed before any
        byte reached the client; ``q.reason`` says how) or ``failed``."""
        from llmqueue.bench.http import Lost, StreamError, conn_message
        from llmqueue.serve.relay import Relay

        b = pool.backends[i]
        def first_token(pool=pool, i=i, r=q.r):  # out of the prefill backlog and the queue age
            if r in pool.no_token:
                pool.no_token.pop(r, None)
                pool.pending_prefill[i] -= r.num_prompt_tokens

        relay = q.relay = Relay(q.ex, q.stream, self.now, on_first=first_token)
        timer = late = None
        if self.first_byte_timeout_s is not None:  # no answer head by then: cut as a timeout
            task, late = asyncio.current_task(), []
            def no_first_byte():
                if relay.nbytes == 0:
                    late.append(True)
                    task.cancel()
            timer = asyncio.get_running_loop().call_later(self.first_byte_timeout_s, no_first_byte)
        try:
            async with asyncio.timeout(self.upstream_timeout_s):  # in this task: wait_for adds one, a turn each way
                await b.upstream[q.path].send(relay, self._body(q, pool), self._headers(q, pool))
        except asyncio.CancelledError:
            relay.abandon()
            if not late:
                raise
            asyncio.current_task().uncancel()
            return self._timed_out(q, pool, i, f"the engine did not begin its answer in {self.first_byte_timeout_s:g} s")
        except (OSError, Lost, StreamError) as e:
            if isinstance(e, TimeoutError) and e.errno is None:  # the deadline's, not a socket's
                return self._timed_out(q, pool, i, f"the engine did not finish its answer in "
                                       f"{self.upstream_timeout_s:g} s")
            relay.abandon()
            if q.status == "cancelled":
                return "failed"
            why = (f"the engine's answer could not be read ({e})" if isinstance(e, StreamError)
                   else f"the engine's connection failed ({conn_message(e)})")
            if not relay.started:
                pool.fail(i)
                b.errors += 1
                q.failure = why
                return "retry"
            return self._cut_stream(q, pool, i, f"the engine failed mid-answer: {why}")
        finally:
            if timer is not None:
                timer.cancel()
        if q.status == "cancelled":
            return "failed"
        st = relay.http_status
        if st is not None and st >= 500 and not relay.started:
            pool.fail(i)
            q.failure = f"engine answered {st}"
            return "retry"
        if not q.stream or st != 200:
            relay.send_whole()
        else:
            q.ex.end()
        q.first, q.finish = relay.first, self.now()
        q.out_tokens = relay.output_tokens
        q.gaps = tuple(relay.gaps)
        q.reason = ""
        if st != 200:
            q.status, q.reason = ("rejected" if st in (400, 404, 413, 422, 429) else "error"), f"engine answered {st}"
        return "ok"

    def _timed_out(self, q: GatewayRequest, pool, i: int, why: str) -> str:
        """The engine was too slow: its connection is closed (it aborts the request); the client
        gets 504, or, mid-stream, an error event; recorded as ``timeout``."""
        q.relay.abandon()
        if q.status == "cancelled":
            return "failed"
        if not q.relay.started:
            e = ApiError(504, why, "GatewayTimeoutError")
            q.ex.respond(e.status, e.body())
            q.status, q.reason, q.finish = "timeout", why, self.now()
            return "failed"
        self._cut_stream(q, pool, i, why)
        q.status = "timeout"
        return "failed"

    def _body(self, q: GatewayRequest, pool) -> bytes:
        """The body for ``pool``'s engines: as sent, unless the model asked for is not one they serve
        (a fallback to another pool, another model): then that pool's model."""
        served = self.pool_models.get(pool.name)
        if not served or q.model in served:
            return q.body
        doc = json.loads(q.body)
        doc["model"] = served[0]
        return json.dumps(doc, separators=(",", ":")).encode()

    def served_by(self, pool) -> str:
        """The model a pool's engines serve (the records' ``model``)."""
        served = self.pool_models.get(pool.name)
        return served[0] if served else (pool.spec.model or self.served_model)

    def _headers(self, q: GatewayRequest, pool) -> bytes:
        """The client's ``Authorization``, only when asked for and the pool has no key of its own
        (a pool's key goes to its engines only: it is part of the pool's connection head)."""
        if not self.forward_client_key or pool.name in self.upstream_keys:
            return b""
        auth = q.ex.headers.get("authorization")
        if not auth or "\r" in auth or "\n" in auth:
            return b""
        return b"Authorization: " + auth.encode("latin-1", "replace") + b"\r\n"

    def _cut_stream(self, q: GatewayRequest, pool, i: int, why: str) -> str:
        """A failure after bytes reached the client: an error event ends its stream; the replica is
        out until its health probe answers."""
        err = json.dumps({"error": {"message": why, "type": "BadGatewayError", "param": None, "code": 502}})
        lead = "\n\n" if q.relay.carry or q.relay.bad else ""  # an event left unfinished is ended first
        q.ex.end(f"{lead}data: {err}\n\ndata: [DONE]\n\n".encode())
        pool.fail(i)
        q.status, q.reason, q.finish = "error", why, self.now()
        q.first = q.relay.first
        q.out_tokens = q.relay.output_tokens
        return "failed"

    def _fail_whole(self, q: GatewayRequest, status: int, why: str) -> None:
        e = ApiError(status, why, "BadGatewayError")
        q.ex.respond(e.status, e.body())
        q.status, q.reason, q.finish = "error", why, self.now()

    def _client_gone(self, q: GatewayRequest) -> None:
        """The client disconnected: close the engine's connection (it aborts the request)."""
        if q.status != "ok":
            return
        q.status, q.reason, q.finish = "cancelled", "client disconnected", self.now()
        if q.relay is not None:
            q.first = q.relay.first
            q.out_tokens = q.relay.output_tokens
            q.relay.abandon()  # the engine sees its connection close and aborts the request
            q.relay.fail(ConnectionAbortedError("the client went away"))  # ends the wait for the answer
        if q.held is not None and not q.held.done():
            pool = self.pools[q.pool]
            try:
                pool.held.remove(q.r)
            except ValueError:
                pass
            pool.no_token.pop(q.r, None)
            self.waiting.pop(q.r, None)
            q.held.set_result(None)

    def _cut(self, q: GatewayRequest, status: str, why: str) -> None:
        """End ``q`` from the gateway's side (it is stopping)."""
        if q.status == "ok":
            q.status, q.reason, q.finish = status, why, self.now()
        if q.relay is not None:
            q.relay.abandon()
            q.relay.fail(ConnectionAbortedError("the gateway stopped"))
        if q.held is not None and not q.held.done():
            q.held.set_result(None)
        q.ex.reset()

    def _end(self, q: GatewayRequest, pool) -> None:
        self.in_flight.discard(q)
        if q.finish != q.finish:
            q.finish = self.now()
        outcome = {"ok": "admitted", "cancelled": "cancelled"}.get(q.status, "failed")
        service = q.finish - q.t_dispatch if q.t_dispatch == q.t_dispatch else None
        ttft = q.first - q.t_arrival if q.first == q.first else None
        self.metrics.ended(pool.name, q.cls, outcome, q.reason, q.finish, service, ttft, q.gaps)
        self._record(q)

    def _record(self, q: GatewayRequest) -> None:
        if self.records is not None:
            pool = self.pools.get(q.pool)
            model = self.served_by(pool) if pool is not None else ""
            gid = (sum(len(p.backends) for p in list(self.pools.values())[:pool.k]) + q.replica
                   if pool is not None and q.replica >= 0 else -1)
            self.records.add(q, gid, model)

    # -- background ---------------------------------------------------------------------------------
    async def _scrape_loop(self) -> None:
        """Every ``scrape_interval_s``: each engine's ``/metrics`` (its load) and, for a replica
        taken out, its ``/health`` (back in when it answers 200); the engines are asked at once, so
        one slow engine ages its own numbers only."""
        import httpx

        async def one(client, pool, b) -> None:
            try:
                if b.failed_until > 0:
                    h = await client.get(b.url + "/health")
                    if h.status_code == 200:
                        pool.recover(b.index)
                        if pool.held:
                            self._dispatch_held(pool)
                    return
                m = await client.get(b.url + "/metrics")
                if m.status_code == 200:
                    pool.read_metrics(b.index, m.text, self.now())
            except Exception:  # noqa: BLE001 - an engine that does not answer is read as before
                pass

        async with httpx.AsyncClient(timeout=max(self.scrape_interval_s, 1.0), trust_env=False) as client:
            while True:
                await asyncio.gather(*(one(client, pool, b) for pool in self.pools.values() for b in pool.backends))
                await asyncio.sleep(self.scrape_interval_s)

    async def _flush_loop(self) -> None:
        """The records and decisions to disk every ``FLUSH_S``, or sooner once ``FLUSH_ROWS``
        requests wait: the flush runs on the event loop, so a small one often keeps it from
        holding the requests that arrive meanwhile."""
        last = self.now()
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            now = self.now()
            if len(self.records.rows) >= FLUSH_ROWS or now - last >= FLUSH_S:
                self.records.flush()
                last = now


def _check_label(header: str, value: str) -> None:
    """A class or tenant name from a header: printable ASCII of at most :data:`MAX_LABEL_CHARS`
    characters (it goes into records, decisions and metric labels), else 400 naming the header."""
    if len(value) > MAX_LABEL_CHARS or not (value.isascii() and value.isprintable()):
        raise ApiError(400, f"{header}: give at most {MAX_LABEL_CHARS} printable ASCII characters "
                       f"(got {len(value)} characters: {value[:32]!r})", "BadRequestError", header.lower())


def _check(fleet, backends: dict) -> None:
    from llmqueue.errors import InputError

    names = [p.name for p in fleet.pools]
    for name in backends:
        if name not in names:
            raise InputError("backend", f"no pool named {name!r} in the scenario", f"pools: {', '.join(names)}")
    for p in fleet.pools:
        if not backends.get(p.name):
            raise InputError("backend", f"pool {p.name!r} has no engines", f"give --backend {p.name}=URL[,URL...]")
    if fleet.disaggregation is not None:
        raise InputError("scenario", "P/D disaggregation needs the KV sent between engines, which the gateway does "
                         "not do", "simulate it, or serve mixed pools")
    if any(ln.batch_window_s > 0 or ln.batch_size for ln in fleet.lanes):
        raise InputError("scenario", "lanes with batch windows are simulated only",
                         "drop batch_window_s / batch_size from the lanes for the gateway")

