"""The fleet's records: request columns a batch at a time, the replicas' step and time-series
records, the pools series (replicas and queue depth per pool and class over time) and the facts
the summary needs (:class:`FleetRecords`, a part of the fleet simulator
:mod:`llmqueue.cluster.fleet`)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from llmqueue.cluster.events import KV, SAMPLE
from llmqueue.cluster.pool import PROVISIONING
from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS
from llmqueue.engine.fast.recorder import stack_columns
from llmqueue.engine.run import SimResult, merge_by_seq, with_seq



class FleetRecords:
    """The record-keeping half of the fleet (mixed into its simulator)."""

    # the fleet's state this half reads, set by the simulator (llmqueue.cluster.fleet): declared
    # here so that the compiled build (llmqueue/compiled.py) gives them fixed places
    spec: Any
    pools: list
    classes: Any
    columns: bool
    done: list
    chunks: list
    reasons: dict
    lane_of: dict
    degraded: dict
    pd_info: dict
    decode: Any
    ev: list
    gateway: Any
    link: Any
    horizon: float
    sample_dt: float
    samples: list
    scale_events: list

    def _push(self, t: float, kind: int, a=None, b=None) -> None:
        raise NotImplementedError

    def _periodic_next(self, t: float) -> bool:
        raise NotImplementedError

    def _sample(self, k: int) -> None:
        t = k * self.sample_dt
        for pool in self.pools:
            prov = pool.count(PROVISIONING)
            serving = pool.view.serving()
            for c in self.classes:
                held = sum(1 for r in pool.held if r.class_name == c)
                waiting = pool.count_waiting(c)  # the gateway queue's included
                self.samples.append((t, pool.name, c, serving, prov, waiting, pool.by_class[c] - waiting + held))
        if self._periodic_next((k + 1) * self.sample_dt):
            self._push((k + 1) * self.sample_dt, SAMPLE, k + 1)

    def _result(self, t0: float) -> SimResult:
        horizon = self.horizon
        left = []
        for pool in self.pools:
            for i, rep in enumerate(pool.reps):
                if rep is None:
                    continue
                rep.run(horizon)  # the rest is each replica's own (to the horizon, or until idle)
                left += [(pool.k, pool.gid[i], q) for q in rep.drain()]
            left += [(pool.k, -1, q) for q in pool.held]
        left += [(self.decode.k, -1, e[3]) for e in self.ev if e[1] == KV]
        for _, _, q in left:
            q.outcome = "unfinished"
            q.finish_time = math.nan
        same = {}  # object columns with one value in every row (one pool, no lanes): filled, not gathered
        if self.columns and len(self.pools) == 1:
            same = {"pool": self.pools[0].name, "model": self.pools[0].spec.model}
            if not self.spec.lanes:
                same["lane"] = ""
        req = merge_by_seq([*self.chunks, self._columns([*self.done, *left])], fill=same)
        steps, ts, pools = [], [], []
        for pool in self.pools:
            for i, rep in pool.all_replicas():
                steps.append((pool.gid[i], rep.step_chunks()))
                ts.append((pool.gid[i], rep.timeseries_chunks()))
                pools.append(pool.name)
        step_cols = stack_columns(steps, STEP_FIELDS, ("start_s", "duration_s"))
        ts_cols = stack_columns(ts, TS_FIELDS, ("t_s",))
        if self.columns:
            counts = [sum(len(c["t_s"]) for c in chunks) for _, chunks in ts]
            rep = ts_cols.pop("replica")  # the column order of before: the pool, then the replica
            ts_cols["pool"] = np.repeat(np.asarray(pools, dtype=object), counts)
            ts_cols["replica"] = rep
        fin = req["finish_s"]
        res = SimResult(requests=req, steps=step_cols, timeseries=ts_cols,
                        horizon_s=horizon if horizon < math.inf else (float(np.nanmax(fin)) if np.isfinite(fin).any() else 0.0),
                        wall_s=time.perf_counter() - t0,
                        num_steps=sum(rep.steps_taken for p in self.pools for _, rep in p.all_replicas()),
                        capacity_tokens=self.spec.pools[0].config.capacity_tokens,
                        reject_reasons=self.reasons)
        tiers = [a for p in self.pools for _, rep in p.all_replicas() if (a := rep.tier_account()) is not None]
        if tiers:  # the host KV tiers' account, summed over the replicas
            from llmqueue.engine.host_tier import merge_stats

            res.kv_tier = merge_stats(tiers)
        if self.columns:
            res.pools = self._pool_columns()
            res.fleet = self._facts()
        return res

    def _columns(self, rows: list) -> dict:
        """Record columns (and ``seq``) of ``rows``: (pool index, replica id, request)."""
        reqs = [q for _, _, q in rows]
        req = with_seq(reqs, any(p.config.kv_offload_tokens for p in self.spec.pools))
        req["replica"] = np.fromiter((i for _, i, _ in rows), np.int64, len(rows))
        if not (req["status"] == "ok").all():  # only a failed request has a reason
            for q in reqs:
                if q.reason:
                    self.reasons[q.seq] = q.reason
        if self.columns:
            self._fleet_columns(req, rows)
        return req

    def _fleet_columns(self, req: dict, rows: list) -> None:
        names = [p.name for p in self.pools]
        models = [p.spec.model for p in self.pools]
        n = len(rows)
        if len(names) > 1:  # one pool: _result fills pool, model (and, without lanes, lane) once
            req["pool"] = np.asarray([names[k] for k, _, _ in rows], dtype=object)
            req["model"] = np.asarray([models[k] for k, _, _ in rows], dtype=object)
        lanes = self.lane_of
        if self.spec.lanes:
            req["lane"] = np.asarray([lanes.pop(q.seq, "") for _, _, q in rows], dtype=object)
        elif len(names) > 1:
            req["lane"] = np.full(n, "", dtype=object)
        pre = np.full(n, -1, dtype=np.int64)
        kv = np.full(n, np.nan)
        dec = np.full(n, np.nan)
        if self.pd_info:
            disp, first = req["dispatched_s"], req["first_scheduled_s"]
            for j, (k, _, q) in enumerate(rows):
                if self.pools[k] is self.decode:
                    info = self.pd_info.pop(q.seq, None)
                    if info is not None:  # the request's times are its prefill's; decode's admission apart
                        dec[j] = first[j]
                        pre[j], kv[j], disp[j], first[j] = info
        if self.spec.gateway is not None and self.spec.gateway.degrade:
            dg = self.degraded
            req["degraded"] = np.asarray([dg[q.seq][0] if q.seq in dg else "" for _, _, q in rows], dtype=object)
        req["prefill_replica"] = pre
        req["kv_transfer_s"] = kv
        if self.decode is not None:
            req["decode_scheduled_s"] = dec

    def _pool_columns(self) -> dict:
        s = self.samples
        return {"t_s": np.asarray([x[0] for x in s], dtype=np.float64),
                "pool": np.asarray([x[1] for x in s], dtype=object),
                "class": np.asarray([x[2] for x in s], dtype=object),
                "replicas": np.asarray([x[3] for x in s], dtype=np.int64),
                "provisioning": np.asarray([x[4] for x in s], dtype=np.int64),
                "num_waiting": np.asarray([x[5] for x in s], dtype=np.int64),
                "num_running": np.asarray([x[6] for x in s], dtype=np.int64)}

    def _facts(self) -> dict:
        """What the summary needs beyond the records: each pool's model, cost and quality, the
        scaling events, fallbacks taken, the link's busy time."""
        return {"pools": {p.name: {"model": p.spec.model, "role": p.spec.role, "replicas": p.spec.replicas,
                                   "cost_per_replica_hour": p.spec.cost_per_replica_hour, "quality": p.spec.quality}
                          for p in self.pools},
                "scale_events": [list(e) for e in self.scale_events],
                "fallbacks": self.gateway.fallbacks_taken if self.gateway else 0,
                "kv_link_busy_s": self.link.busy_s if self.link else 0.0}
