"""The gateway's ``/metrics``: the source documents' dashboard, with queueing theory's prediction
beside each measured figure.

Measured (Prometheus names under ``llmqueue_gateway_``): requests by pool, class, outcome
(``admitted``, ``rate_limited``, ``shed``, ``rejected``, ``failed``, ``cancelled``) and reason; the
gateway queue's depth by class and the pool's whole queue (gateway plus engines); the wait before
admission (arrival to dispatch, a histogram); the age of the oldest request by pool and class, in
the gateway's queue and in the whole pool (no first token yet: the queue age the gateway's rules
read), the leading indicator of a queue that grows; cancellations; retries on another replica
(retry amplification); each replica's outstanding requests and whether it serves, and the numbers
the policies read of it (waiting, running, KV blocks and usage, and their age: a scrape that
stopped shows here); TTFT and time
per output token (histograms, the gateway's clock: the spread of the token gaps, p99 over p50, is
the decode step's variance as a client sees it). The queues are read when scraped, nothing is
added to a request's path. ``deploy/grafana/llmqueue-gateway.json`` draws these,
``deploy/prometheus/llmqueue-gateway-alerts.yml`` alerts on the leading indicators
(``docs/gateway-observability.md``).

Predicted, per pool, from the last ``window_s`` seconds: the arrival rate ``lam`` (requests
offered), the service rate of one sequence slot ``mu = 1 / E[S]`` (``S``: dispatch to end, the
engine's time), ``c`` = serving replicas x ``max_num_seqs`` slots, and, when the gateway bounds the
pool's queue (``max_queue_depth``), the room ``K = c + max_queue_depth x replicas``: the M/M/c
(Erlang C) or M/M/c/K mean wait before service and probability of shedding, beside the measured
mean admission wait and shed ratio, ``rho = lam / (c mu)`` and the stability verdict (``rho < 1``,
or always stable with a bound). Exact for one request at a time with exponential service and
Poisson arrivals (the tests check it there); a first-order reading of a batching engine.
"""

from __future__ import annotations

import math
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from llmqueue.serve.histograms import observe_many
from llmqueue.serve.vllm_metrics import ITL_BUCKETS, TTFT_BUCKETS

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Window:
    """Events of the last ``window_s`` seconds: (time, value)."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.items: deque = deque()

    def add(self, t: float, v: float = 1.0) -> None:
        self.items.append((t, v))

    def trim(self, now: float) -> deque:
        it = self.items
        while it and it[0][0] < now - self.window_s:
            it.popleft()
        return it


class PoolStats:
    """One pool's windows: arrivals, sheds, admission waits, service times."""

    def __init__(self, window_s: float):
        self.arrivals = _Window(window_s)
        self.shed = _Window(window_s)
        self.waits = _Window(window_s)
        self.service = _Window(window_s)


class GatewayMetrics:
    """The registry (see the module docstring). ``pools``: name -> the gateway's live pools (for
    outstanding counts and queues); ``depth_bound``: the gateway's ``max_queue_depth`` or None;
    ``clock()``: the gateway's time."""

    def __init__(self, pools: dict, *, clock, depth_bound: float | None = None, window_s: float = 60.0):
        self.pools = pools
        self.clock = clock
        self.depth_bound = depth_bound
        self.window_s = window_s
        self.stats = {name: PoolStats(window_s) for name in pools}
        r = self.registry = CollectorRegistry()
        p = "llmqueue_gateway_"
        self.requests = Counter(p + "requests", "Requests by pool, class, outcome and reason",
                                ["pool", "class", "outcome", "reason"], registry=r)
        self.wait = Histogram(p + "admission_wait_seconds", "Arrival at the gateway to dispatch to a replica",
                              ["pool", "class"], buckets=WAIT_BUCKETS, registry=r)
        self.cancellations = Counter(p + "cancellations", "Clients that went away before their answer ended",
                                     ["pool", "class"], registry=r)
        self.retries = Counter(p + "retries", "Requests sent again to another replica after a failure before "
                               "their first byte (retry amplification)", ["pool"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival at the gateway to the first token",
                              ["pool", "class"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Gaps between tokens, as the gateway relays them",
                              ["pool", "class"], buckets=ITL_BUCKETS, registry=r)
        r.register(_Live(self))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- events -------------------------------------------------------------------------------------
    def arrived(self, pool: str, t: float) -> None:
        self.stats[pool].arrivals.add(t)

    def refused(self, pool: str, cls: str, outcome: str, reason: str, t: float) -> None:
        self.requests.labels(pool, cls, outcome, reason).inc()
        if outcome in ("shed", "rate_limited"):
            self.stats[pool].shed.add(t)

    def dispatched(self, pool: str, cls: str, wait_s: float, t: float) -> None:
        self.wait.labels(pool, cls).observe(wait_s)
        self.stats[pool].waits.add(t, wait_s)

    def ended(self, pool: str, cls: str, outcome: str, reason: str, t: float, service_s: float | None,
              ttft_s: float | None, gaps) -> None:
        self.requests.labels(pool, cls, outcome, reason).inc()
        if outcome == "cancelled":
            self.cancellations.labels(pool, cls).inc()
        if service_s is not None and outcome == "admitted":
            self.stats[pool].service.add(t, service_s)
        if ttft_s is not None and ttft_s == ttft_s:
            self.ttft.labels(pool, cls).observe(ttft_s)
        if gaps:
            observe_many(self.tpot.labels(pool, cls), gaps)

    # -- predictions -------------------------------------------------------------------------------
    def prediction(self, name: str) -> dict:
        """The pool's measured rates and queueing theory's prediction at them (see the module docstring)."""
        from llmqueue.theory.classic import mmc, mmck

        now = self.clock()
        st, pool = self.stats[name], self.pools[name]
        w = min(self.window_s, max(now, 1e-9))
        arrivals = len(st.arrivals.trim(now))
        lam = arrivals / w
        svc = [v for _, v in st.service.trim(now)]
        waits = [v for _, v in st.waits.trim(now)]
        shed = len(st.shed.trim(now))
        serving = len(pool.routable)
        c = serving * pool.max_num_seqs
        out = {"lam": lam, "mu": math.nan, "c": c, "rho": math.nan, "predicted_wait_s": math.nan,
               "predicted_shed_ratio": math.nan, "stable": math.nan,
               "measured_wait_s": sum(waits) / len(waits) if waits else math.nan,
               "measured_shed_ratio": shed / arrivals if arrivals else math.nan}
        if not svc or c < 1:
            return out
        mu = len(svc) / sum(svc) if sum(svc) > 0 else math.nan
        out["mu"] = mu
        if not (mu > 0) or lam <= 0:
            return out
        out["rho"] = lam / (c * mu)
        if self.depth_bound is not None:
            K = c + int(self.depth_bound * serving)
            r = mmck(lam=lam, mu=mu, c=c, K=K)
            out.update(predicted_wait_s=r.Wq, predicted_shed_ratio=r.P_block, stable=1.0)
        elif out["rho"] < 1:
            r = mmc(lam=lam, mu=mu, c=c)
            out.update(predicted_wait_s=r.Wq, predicted_shed_ratio=0.0, stable=1.0)
        else:
            out.update(predicted_wait_s=math.inf, predicted_shed_ratio=0.0, stable=0.0)
        return out


class _Live:
    """Gauges read when scraped: queues, outstanding counts, the predictions."""

    def __init__(self, m: GatewayMetrics):
        self.m = m

    def collect(self):
        p = "llmqueue_gateway_"
        depth = GaugeMetricFamily(p + "queue_depth", "Requests waiting in the gateway's queue, by pool and class",
                                  labels=["pool", "class"])
        held_age = GaugeMetricFamily(p + "queue_oldest_age_seconds", "Age of the oldest request waiting in the "
                                     "gateway's queue, by pool and class (0: none waiting)", labels=["pool", "class"])
        pool_age = GaugeMetricFamily(p + "pool_oldest_age_seconds", "Age of the oldest request of the pool with no "
                                     "first token yet, by class: in the gateway's queue, an engine's queue or its "
                                     "prefill (the queue age the gateway's rules read; 0: none)",
                                     labels=["pool", "class"])
        pool_q = GaugeMetricFamily(p + "pool_waiting", "Requests waiting in the pool: the gateway's queue and the "
                                   "engines' (scraped)", labels=["pool"])
        out = GaugeMetricFamily(p + "replica_outstanding", "Requests handed to a replica and not ended",
                                labels=["pool", "replica"])
        up = GaugeMetricFamily(p + "replica_serving", "1 while the replica takes requests", labels=["pool", "replica"])
        seen = {k: GaugeMetricFamily(p + "replica_" + k, h, labels=["pool", "replica"]) for k, h in (
            ("waiting", "Requests queued at the replica, as the policies read it (scraped, capped by outstanding)"),
            ("running", "Requests in the replica's running batch, as the policies read it"),
            ("kv_blocks", "The replica's KV blocks (vllm:cache_config_info when published)"),
            ("kv_usage", "Share of the replica's KV blocks in use, as the policies read it"),
            ("load_age_seconds", "Age of the replica's numbers the policies read (its last /metrics scrape; "
                                 "0 when read from the gateway's own count)"))}
        fams = {k: GaugeMetricFamily(p + k, h, labels=["pool"]) for k, h in (
            ("arrival_rate", "lam: requests offered per second (window)"),
            ("service_rate", "mu: one sequence slot's service rate, 1 / mean engine time (window)"),
            ("servers", "c: serving replicas x max_num_seqs"),
            ("utilization", "rho = lam / (c mu)"),
            ("predicted_wait_seconds", "M/M/c (or M/M/c/K with a depth bound) mean wait before service"),
            ("measured_wait_seconds", "Mean admission wait measured (window)"),
            ("predicted_shed_ratio", "M/M/c/K blocking probability (0 without a depth bound)"),
            ("measured_shed_ratio", "Shed and rate-limited share of the arrivals (window)"),
            ("stable", "1 when the prediction is a steady state (rho < 1, or a bounded queue)"))}
        keys = {"arrival_rate": "lam", "service_rate": "mu", "servers": "c", "utilization": "rho",
                "predicted_wait_seconds": "predicted_wait_s", "measured_wait_seconds": "measured_wait_s",
                "predicted_shed_ratio": "predicted_shed_ratio", "measured_shed_ratio": "measured_shed_ratio",
                "stable": "stable"}
        now = self.m.clock()
        for name, pool in self.m.pools.items():
            by_class: dict = {}
            held_first: dict = {}   # class -> the earliest arrival waiting in the gateway's queue
            for r in pool.held:
                c, a = r.class_name, r.arrival_time
                by_class[c] = by_class.get(c, 0) + 1
                if a < held_first.get(c, math.inf):
                    held_first[c] = a
            pool_first: dict = {}   # class -> the earliest arrival with no first token
            for r, a in pool.no_token.items():
                if a < pool_first.get(r.class_name, math.inf):
                    pool_first[r.class_name] = a
            for cls in sorted(set(by_class) | set(pool.by_class) | set(pool_first)):
                depth.add_metric([name, cls], by_class.get(cls, 0))
                held_age.add_metric([name, cls], max(now - held_first.get(cls, now), 0.0))
                pool_age.add_metric([name, cls], max(now - pool_first.get(cls, now), 0.0))
            pool_q.add_metric([name], pool.view.queue_depth())
            for i, n in enumerate(pool.outstanding):
                out.add_metric([name, str(i)], n)
                up.add_metric([name, str(i)], 1 if i in pool.routable else 0)
                x = pool.load(i)
                for k, v in (("waiting", x.num_waiting), ("running", x.num_running), ("kv_blocks", x.kv_blocks_total),
                             ("kv_usage", x.kv_usage), ("load_age_seconds", x.age_s)):
                    seen[k].add_metric([name, str(i)], v)
            pred = self.m.prediction(name)
            for k, fam in fams.items():
                v = pred[keys[k]]
                if v == v:  # NaN: not measured yet
                    fam.add_metric([name], v)
        yield from (depth, held_age, pool_age, pool_q, out, up, *seen.values(), *fams.values())
