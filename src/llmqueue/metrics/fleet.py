"""A fleet's account: per-pool and per-class service, retries, replicas, queues, cost and recovery.

A fleet (:mod:`llmqueue.cluster`) is a network of queues: a gateway routes each request by its
lane to a *pool* of replicas, each pool a multi-server station (its replicas) with its own
waiting room; an autoscaler changes the number of servers over time. The records carry where a
request was served (the request columns ``pool``, ``lane``, ``model``, ``prefill_replica``,
``kv_transfer_s``) and the pools series (:class:`~llmqueue.records.PoolSeries`) samples each
station: servers serving and starting, and each class's requests waiting and running.

:func:`fleet_summary` is the one entry point; the pieces are public too:

- :func:`group_rows`: per pool, per class, per (pool, class): throughput, goodput, TTFT/TPOT
  percentiles, completed/failed counts, the wait before admission and the KV transfer time;
- :func:`retry_amplification`: attempts per user request (the extra load retries put on the
  stations: a retry is a new arrival);
- :func:`pd_stages`: a P/D request's time split over the tandem's stations (prefill wait and
  prefill, KV transfer, decode admission wait and decode), whose means sum to the mean E2EL;
- :func:`pool_tracks`, :func:`replica_summary`, :func:`queue_depth`: the pools series per pool;
- :func:`cost_account`, :func:`quality_account`, :func:`model_mix`: what the fleet paid and served;
- :func:`recovery_time`: the transient after a load spike, until the waiting queue is back within
  its pre-spike range and stays there.

Conventions as in :func:`llmqueue.metrics.summarize`: the measurement window is ``[warmup_s,
horizon_s]``; latencies of ``ok`` requests arriving in the window; throughputs count requests
finishing in the window per second of it; times in ms in the keys ending ``_ms``. Sample-and-hold
series: each sample holds until the next one of the same pool (and class), the last until the
horizon.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue.errors import InputError
from llmqueue.metrics._common import StepFunction, window
from llmqueue.metrics.slo import good_mask, goodput_targets, has_per_request

DEFAULT_TOLERANCE = 0.1
DEFAULT_HOLD_S = 30.0
DEFAULT_HOLD_SAMPLES = 5
NO_POOL = "fleet"  # the group name of records that carry no ``pool`` column


def _pct(x: np.ndarray, q: float):
    return float(np.percentile(x, q)) if len(x) else None


def _ms(v):
    return None if v is None else 1000.0 * v


def _mean(x: np.ndarray):
    return float(np.mean(x)) if len(x) else None


class _Req:
    """Per-request values and masks shared by the group rows."""

    def __init__(self, requests, t0, t1, slos):
        self.r = requests
        self.t0, self.t1, self.T = t0, t1, t1 - t0
        a = requests["arrival_s"]
        fin = requests["finish_s"]
        self.arrived = (a >= t0) & (a < t1)
        with np.errstate(invalid="ignore"):
            self.fin_in = np.isfinite(fin) & (fin >= t0) & (fin <= t1)
        self.ok = requests["status"] == "ok"
        self.d = requests.derived()
        self.admit = requests["dispatched_s"] - a
        self.good = None
        if slos:
            targets = goodput_targets(slos)
            if has_per_request(targets):
                self.good = good_mask(requests, targets)
        self.pool = requests["pool"] if "pool" in requests else np.full(len(requests), NO_POOL)
        self.kv = requests["kv_transfer_s"] if "kv_transfer_s" in requests else None

    def row(self, m: np.ndarray) -> dict:
        r, T = self.r, self.T
        arr = self.arrived & m
        departed = self.ok & self.fin_in & m  # the throughput's: ok, finishing in the window
        completed = departed & arr  # ... of the window's arrivals, as arrivals counts (<= arrivals)
        failed = self.fin_in & ~self.ok & arr
        lat = arr & self.ok
        out = {
            "arrivals": int(arr.sum()),
            "completed": int(completed.sum()),
            "failed": int(failed.sum()),
            "in_flight": int((arr & np.isnan(r["finish_s"])).sum()),
            "finished_in_window": int(departed.sum()),
            "request_throughput": float(departed.sum()) / T,
            "output_throughput": float(r["output_tokens"][departed].sum()) / T,
            "request_goodput": None,
            "good_share": None,
        }
        if self.good is not None:
            out["request_goodput"] = float((self.good & self.fin_in & m).sum()) / T
            out["good_share"] = float((self.good & arr).sum()) / arr.sum() if arr.any() else None
        for name in ("ttft", "tpot"):
            x = self.d[f"{name}_s"][lat]
            x = x[np.isfinite(x)]
            out[f"p50_{name}_ms"] = _ms(_pct(x, 50))
            out[f"p99_{name}_ms"] = _ms(_pct(x, 99))
        for key, x in (("admission_wait", self.admit[arr]), ("queue", self.d["queue_s"][arr])):
            x = x[np.isfinite(x)]
            out[f"mean_{key}_ms"] = _ms(_mean(x))
            out[f"p99_{key}_ms"] = _ms(_pct(x, 99))
        if self.kv is not None:
            x = self.kv[arr]
            x = x[np.isfinite(x)]
            out["kv_transfers"] = int(len(x))
            out["mean_kv_transfer_ms"] = _ms(_mean(x))
            out["p99_kv_transfer_ms"] = _ms(_pct(x, 99))
        return out


def _names(x: np.ndarray) -> list[str]:
    """Distinct values in order of first appearance."""
    _, first = np.unique(x, return_index=True)
    return [str(x[i]) for i in sorted(first)]


def group_rows(requests, *, warmup_s: float = 0.0, horizon_s: float | None = None, slos=None) -> dict:
    """Per-pool, per-class and per-(pool, class) rows of the requests' service.

    Each station of the fleet (a pool; a class's traffic through it) is summarised as a queue
    is: its arrivals in the window; of those, ``completed`` (``ok``, finishing in the window) and
    ``failed`` (ending there otherwise), so neither exceeds ``arrivals`` (as in
    :func:`llmqueue.metrics.summarize`); throughput (``request_throughput`` req/s and
    ``output_throughput`` tok/s) of every ``ok`` request finishing in the window, whenever it
    arrived (``finished_in_window``), per second of the window; ``request_goodput``
    and ``good_share`` (with ``slos``, :mod:`llmqueue.metrics.slo`'s per-request thresholds;
    else None), ``p50_/p99_ttft_ms`` and ``tpot`` of the ``ok`` arrivals, the time waiting before
    admission (``mean_/p99_admission_wait_ms``: ``dispatched_s - arrival_s``, the gateway's queue
    and routing) and the time to the first scheduled step (``mean_/p99_queue_ms``: both queues),
    and, where the records carry ``kv_transfer_s`` (P/D), ``kv_transfers`` and
    ``mean_/p99_kv_transfer_ms`` (the transfer link as a delay station). ``served_share``: the
    pool's share of all completed requests.

    Returns ``{"pools": {pool: row}, "classes": {class: row}, "pool_class": {pool: {class: row}}}``.
    Records without a ``pool`` column form one pool, ``"fleet"``.
    """
    t0, t1 = window(requests, warmup_s, horizon_s)
    q = _Req(requests, t0, t1, slos)
    return _group_rows(q)


def _group_rows(q: _Req, prefill_pool: str | None = None) -> dict:
    cls = q.r["class"]
    pools = _names(q.pool)
    pre = None
    if prefill_pool is not None and "prefill_replica" in q.r:
        pre = q.r["prefill_replica"] >= 0  # records of P/D requests: their decode side's, prefilled there
        if prefill_pool not in pools and pre.any():
            pools.insert(0, prefill_pool)
    classes = _names(cls)
    total = int((q.ok & q.fin_in).sum())
    out = {"pools": {}, "classes": {}, "pool_class": {}}
    for p in pools:
        mp = q.pool == p
        if pre is not None and p == prefill_pool:
            mp = mp | pre  # the prefill pool served every P/D request's prompt and first token
        row = q.row(mp)
        if pre is not None and p == prefill_pool:  # the prefill station makes the first token only
            row.update(p50_tpot_ms=None, p99_tpot_ms=None, kv_transfers=None, mean_kv_transfer_ms=None,
                       p99_kv_transfer_ms=None)
        elif pre is not None and p != prefill_pool and np.any(mp & pre):
            row.update(p50_ttft_ms=None, p99_ttft_ms=None)  # its first token was made on the prefill side
            if "decode_scheduled_s" in q.r:  # the decode station's own wait: KV arrived -> admitted
                w = q.r["decode_scheduled_s"] - q.r["first_token_s"] - q.r["kv_transfer_s"]
                x = w[q.arrived & mp & pre & q.ok]
                x = x[np.isfinite(x)]
                row.update(mean_admission_wait_ms=_ms(_mean(x)), p99_admission_wait_ms=_ms(_pct(x, 99)))
        row["served_share"] = row["completed"] / total if total else None
        out["pools"][p] = row
        out["pool_class"][p] = {c: q.row(mp & (cls == c)) for c in classes if np.any(mp & (cls == c))}
    for c in classes:
        out["classes"][c] = q.row(cls == c)
    return out


def pd_stages(requests, *, warmup_s: float = 0.0, horizon_s: float | None = None) -> dict | None:
    """A P/D request's time through the tandem, station by station (``ok`` requests arriving in
    the window that were prefilled on the prefill pool; None when the records have none):

    - ``prefill_wait``: arrival -> first scheduled on a prefill replica (the gateway and the
      prefill queue);
    - ``prefill``: first scheduled -> first token (its prompt's steps, shared with others');
    - ``transfer``: the KV crossing the link (its queue and its transfer);
    - ``decode_wait``: the KV arrived -> first scheduled on a decode replica (a slot and KV room);
    - ``decode``: admitted -> the last token (``o - 1`` decode steps); ``decode_tpot`` that over
      ``o - 1`` (the decode station's own time per token, without the transfer and the wait).

    Each has ``mean_ms`` and ``p99_ms``; the five means sum to ``mean_e2el_ms`` (the stages
    partition each request's latency), given as ``sum_ms``."""
    need = ("prefill_replica", "kv_transfer_s", "decode_scheduled_s")
    if any(c not in requests for c in need):
        return None
    t0, t1 = window(requests, warmup_s, horizon_s)
    a = requests["arrival_s"]
    m = (requests["prefill_replica"] >= 0) & (requests["status"] == "ok") & (a >= t0) & (a < t1)
    if not m.any():
        return None
    first, ft, fin = requests["first_scheduled_s"][m], requests["first_token_s"][m], requests["finish_s"][m]
    kv, dec, arr = requests["kv_transfer_s"][m], requests["decode_scheduled_s"][m], a[m]
    o = requests["output_tokens"][m].astype(np.float64)
    parts = {"prefill_wait": first - arr, "prefill": ft - first, "transfer": kv, "decode_wait": dec - ft - kv,
             "decode": fin - dec}
    out = {k: {"mean_ms": _ms(_mean(v)), "p99_ms": _ms(_pct(v, 99))} for k, v in parts.items()}
    many = o > 1
    tp = (fin - dec)[many] / (o[many] - 1)
    out["decode_tpot"] = {"mean_ms": _ms(_mean(tp)), "p99_ms": _ms(_pct(tp, 99))}
    out["sum_ms"] = sum(out[k]["mean_ms"] for k in parts)
    out["mean_e2el_ms"] = _ms(_mean(fin - arr))
    out["requests"] = int(m.sum())
    return out


def retry_amplification(requests, *, warmup_s: float = 0.0, horizon_s: float | None = None) -> dict:
    """Attempts per user request: rows / distinct ``request_id``, overall and per class.

    A retry is a new arrival at the stations, so the offered load is the users' rate times this
    factor (1 without retries). The user requests counted are those whose first attempt arrived in
    the window (all their attempts count, even those after it). Returns ``{"attempts",
    "user_requests", "amplification", "by_class": {class: {...the same}}}``.
    """
    t0, t1 = window(requests, warmup_s, horizon_s)
    return _retries(requests, t0, t1)


def _retries(requests, t0, t1) -> dict:
    ids = requests["request_id"]
    a = requests["arrival_s"]
    uniq, inv = np.unique(ids, return_inverse=True)
    first = np.full(len(uniq), np.inf)
    np.minimum.at(first, inv, a)
    keep = ((first >= t0) & (first < t1))[inv]

    def one(m):
        n = int(m.sum())
        users = int(len(np.unique(ids[m])))
        return {"attempts": n, "user_requests": users, "amplification": n / users if users else None}

    out = one(keep)
    cls = requests["class"]
    out["by_class"] = {c: one(keep & (cls == c)) for c in _names(cls)}
    return out


def model_mix(requests, *, warmup_s: float = 0.0, horizon_s: float | None = None) -> dict | None:
    """The served model mix: per ``model``, the completed requests (``ok``, finishing in the window)
    and their share. None when the records carry no ``model`` column."""
    if "model" not in requests:
        return None
    t0, t1 = window(requests, warmup_s, horizon_s)
    return _model_mix(_Req(requests, t0, t1, None))


def _model_mix(q: _Req) -> dict | None:
    if "model" not in q.r:
        return None
    done = q.ok & q.fin_in
    models = q.r["model"][done]
    n = len(models)
    return {m: {"completed": int(np.sum(models == m)), "share": float(np.sum(models == m)) / n}
            for m in _names(models)} if n else {}


# -- the pools series --------------------------------------------------------------------------------

def pool_tracks(pools) -> dict:
    """The pools series per pool, on the pool's sample times: ``{pool: {"t_s", "replicas",
    "provisioning", "num_waiting", "num_running" (totals over classes), "classes": {class:
    {"num_waiting", "num_running"}}}}`` (numpy arrays). A class without a row at some sample time
    holds its previous value there (zero before its first)."""
    out = {}
    t_all, p_all, c_all = pools["t_s"], pools["pool"], pools["class"]
    for p in _names(p_all):
        mp = p_all == p
        t = t_all[mp]
        times, first = np.unique(t, return_index=True)
        track = {"t_s": times, "replicas": pools["replicas"][mp][first].astype(np.float64),
                 "provisioning": pools["provisioning"][mp][first].astype(np.float64),
                 "num_waiting": np.zeros(len(times)), "num_running": np.zeros(len(times)), "classes": {}}
        for c in _names(c_all[mp]):
            mc = mp & (c_all == c)
            tc = t_all[mc]
            order = np.argsort(tc, kind="stable")
            tc = tc[order]
            idx = np.searchsorted(tc, times, side="right") - 1
            cl = {}
            for col in ("num_waiting", "num_running"):
                v = pools[col][mc][order].astype(np.float64)
                held = np.where(idx >= 0, v[np.maximum(idx, 0)], 0.0)
                cl[col] = held
                track[col] = track[col] + held
            track["classes"][c] = cl
        out[p] = track
    return out


def _series_stats(t, v, t0, t1) -> dict:
    """Time-average, min and max of a sample-and-hold series over ``[t0, t1]``."""
    if len(t) == 0:
        return {"mean": None, "min": None, "max": None}
    f = StepFunction(t, v, v0=float(v[0]))
    _, _, vals = f.pieces(t0, t1)
    return {"mean": f.mean(t0, t1), "min": float(np.min(vals)), "max": float(np.max(vals))}


def _integral(t, v, t0, t1) -> float:
    return StepFunction(t, v, v0=float(v[0])).integral(t0, t1) if len(t) else 0.0


def replica_summary(tracks: dict, t0: float, t1: float) -> dict:
    """Servers over time per pool: serving replicas' ``min`` / ``max`` / time-``mean`` over the
    window, ``mean_provisioning`` (starting, ordered by the autoscaler, not serving yet), and
    ``serving_replica_hours`` / ``provisioning_replica_hours`` (the integrals over the window)."""
    out = {}
    for p, tr in tracks.items():
        s = _series_stats(tr["t_s"], tr["replicas"], t0, t1)
        out[p] = {"min": s["min"], "max": s["max"], "mean": s["mean"],
                  "mean_provisioning": _series_stats(tr["t_s"], tr["provisioning"], t0, t1)["mean"],
                  "serving_replica_hours": _integral(tr["t_s"], tr["replicas"], t0, t1) / 3600.0,
                  "provisioning_replica_hours": _integral(tr["t_s"], tr["provisioning"], t0, t1) / 3600.0}
    return out


def queue_depth(tracks: dict, t0: float, t1: float) -> dict:
    """Number waiting and running per pool (totals) and per class, time-``mean`` and ``max`` over
    the window: ``{pool: {"mean_waiting", "max_waiting", "mean_running", "max_running", "by_class":
    {class: {the same}}}}`` (L_q and the number in service of each station, Little's law's L)."""
    def one(t, d):
        w = _series_stats(t, d["num_waiting"], t0, t1)
        r = _series_stats(t, d["num_running"], t0, t1)
        return {"mean_waiting": w["mean"], "max_waiting": w["max"], "mean_running": r["mean"], "max_running": r["max"]}

    out = {}
    for p, tr in tracks.items():
        row = one(tr["t_s"], tr)
        row["by_class"] = {c: one(tr["t_s"], d) for c, d in tr["classes"].items()}
        out[p] = row
    return out


def cost_account(replicas: dict, pool_costs: dict | None, completed: int | None = None) -> dict:
    """What the fleet paid: per pool, ``replica_hours`` (serving plus provisioning: a starting
    replica holds its GPUs) times ``cost_per_replica_hour``; ``total_cost`` and, given the completed
    requests, ``cost_per_request``. A pool missing from ``pool_costs`` has cost None (and is left out
    of the total, which ``complete`` then says)."""
    pool_costs = pool_costs or {}
    out: dict = {"pools": {}, "total_cost": 0.0, "complete": True}
    for p, r in replicas.items():
        hours = r["serving_replica_hours"] + r["provisioning_replica_hours"]
        price = pool_costs.get(p)
        cost = None if price is None else float(price) * hours
        out["pools"][p] = {"replica_hours": hours, "cost_per_replica_hour": price, "cost": cost}
        if cost is None:
            out["complete"] = False
        else:
            out["total_cost"] += cost
    out["cost_per_request"] = out["total_cost"] / completed if completed else None
    return out


def quality_account(group: dict, pool_quality: dict | None, capped: dict | None = None) -> dict | None:
    """The quality of what was served: each completed request weighted by its pool's ``quality``
    (relative, 1 = the primary model; a pool not in ``pool_quality`` counts 1), times the quality
    factor of a cap it was served under (``capped``: ``{pool: [(completed capped requests,
    factor), ...]}``, the gateway's degradation): ``quality_weighted_share`` = sum of the weights /
    completed requests, and per pool its ``served_share`` and ``quality``. None without
    ``pool_quality``."""
    if pool_quality is None:
        return None
    pools = group["pools"]
    done = sum(r["completed"] for r in pools.values())
    out = {"pools": {p: {"quality": float(pool_quality.get(p, 1.0)), "served_share": r.get("served_share")}
                     for p, r in pools.items()}}
    weighted = sum(float(pool_quality.get(p, 1.0)) * r["completed"] for p, r in pools.items())
    for p, caps in (capped or {}).items():  # a capped answer loses (1 - factor) of its pool's weight
        weighted -= sum(float(pool_quality.get(p, 1.0)) * n * (1.0 - f) for n, f in caps)
    out["quality_weighted_share"] = weighted / done if done else None
    return out


def degraded_account(q: _Req, degrade_quality: dict) -> tuple[dict, dict]:
    """The gateway's degradation in the window: ``({class: {how: completed requests}}, {pool:
    [(completed capped requests, quality factor), ...]})`` from the records' ``degraded``
    column (``how``: ``max_tokens N`` or ``to POOL``; ``degrade_quality``: ``{how: factor}`` of
    the caps)."""
    r = q.r
    done = q.ok & q.fin_in & q.arrived
    how = r["degraded"]
    by_class: dict = {}
    capped: dict = {}
    for label in _names(how[done]):
        if not label:
            continue
        m = done & (how == label)
        for c in _names(r["class"][m]):
            by_class.setdefault(c, {})[label] = int((m & (r["class"] == c)).sum())
        if label in degrade_quality:
            for p in _names(q.pool[m]):
                capped.setdefault(p, []).append((int((m & (q.pool == p)).sum()), float(degrade_quality[label])))
    return by_class, capped


def refusals(requests, reasons: dict, *, warmup_s: float = 0.0, horizon_s: float | None = None) -> dict:
    """``{class: {reason: requests}}``: the attempts arriving in the window that the gateway or an
    engine refused (status ``rejected``), by class and reason with its numbers grouped
    (``shed (priority 1)``, ``queue age``, ``rate limited (batch)``); ``reasons``: seq -> reason
    (the simulator's, a record's row being its seq)."""
    t0, t1 = window(requests, warmup_s, horizon_s)
    a, st, cls = requests["arrival_s"], requests["status"], requests["class"]
    out: dict = {}
    for seq, why in sorted(reasons.items()):
        if seq < len(st) and st[seq] == "rejected" and t0 <= a[seq] < t1:
            kind = why if why.startswith("shed") else reason_kind(why)  # a shed's tier kept
            row = out.setdefault(str(cls[seq]), {})
            row[kind] = row.get(kind, 0) + 1
    return out


def reason_kind(reason: str) -> str:
    """A refusal's reason with its numbers grouped (``shed (priority N)``); one that starts with a
    number (a request's own size against a limit) by its first word."""
    import re

    return reason.split(" ")[0] if reason[:1].isdigit() else re.sub(r"\d+(\.\d+)?", "N", reason)


def recovery_time(t, waiting, spike, *, end_s: float | None = None, tolerance: float = DEFAULT_TOLERANCE,
                  hold_s: float = DEFAULT_HOLD_S, hold_samples: int = DEFAULT_HOLD_SAMPLES) -> dict:
    """How long a station's waiting queue takes to drain after a load spike ``[t0, t1]``.

    During the spike the arrival rate exceeds the service rate (or the servers are too few, until
    the autoscaler's replicas arrive), so work piles up; after ``t1`` the queue drains at the
    service rate's excess over the arrivals (a fluid model's ``Q(t1) / (mu - lam)``). The
    *recovery time* is from ``t1`` until the waiting queue is back within its pre-spike range and
    stays there:

    - the pre-spike range: the maximum of the (sample-and-hold) queue over ``[t0 - W, t0)``, ``W``
      the spike's length (shortened to the samples available); the *threshold* is that maximum
      times ``1 + tolerance``, or plus one request, whichever is larger;
    - back within it: the first moment ``tau >= t1`` (``t1`` itself, or a sample time after it)
      from which the queue stays at or under the threshold for at least ``hold = max(hold_s,
      hold_samples x the median sample interval)`` seconds (the last sample holds until ``end_s``,
      default the last sample's time).

    Returns ``{"spike_s": [t0, t1], "pre_window_s": [a, t0], "baseline_max", "threshold", "hold_s",
    "peak", "peak_t_s", "recovered", "recovery_s", "recovered_at_s", "note"}``: ``recovered`` False
    and ``recovery_s`` inf (JSON null) when the queue was not back by the end (``note`` says how
    far it got); ``recovered`` None when there is no sample before the spike to set the range.
    """
    t = np.asarray(t, dtype=np.float64)
    w = np.asarray(waiting, dtype=np.float64)
    if t.shape != w.shape:
        raise InputError("waiting", f"{len(w)} values for {len(t)} sample times")
    try:
        t0, t1 = (float(x) for x in spike)
    except (TypeError, ValueError):
        raise InputError("spike", f"must be (start_s, end_s) (got {spike!r})") from None
    if not (math.isfinite(t0) and math.isfinite(t1) and t1 > t0):
        raise InputError("spike", f"[{t0:g}, {t1:g}] is not a window", "give start_s < end_s")
    order = np.argsort(t, kind="stable")
    t, w = t[order], w[order]
    out = {"spike_s": [t0, t1], "pre_window_s": None, "baseline_max": None, "threshold": None, "hold_s": None,
           "peak": None, "peak_t_s": None, "recovered": None, "recovery_s": None, "recovered_at_s": None, "note": ""}
    if len(t) == 0 or t[0] >= t0:
        out["note"] = "no sample before the spike: its pre-spike range is unknown"
        return out
    end = float(t[-1]) if end_s is None else max(float(end_s), float(t[-1]))
    a = max(t0 - (t1 - t0), float(t[0]))
    f = StepFunction(t, w, v0=float(w[0]))
    _, _, pre = f.pieces(a, t0)
    base = float(np.max(pre))
    thr = max(base * (1 + tolerance), base + 1)
    dt = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
    hold = max(float(hold_s), hold_samples * dt)
    out.update(pre_window_s=[a, t0], baseline_max=base, threshold=thr, hold_s=hold)
    notes = [] if a <= t0 - (t1 - t0) else [f"pre-spike window shortened to the {t0 - a:g} s sampled before it"]
    if t1 >= end:
        out.update(recovered=False, recovery_s=math.inf,
                   note="; ".join([*notes, "the run ends before the spike does"]))
        return out
    # evaluation points: t1 (the value held there), then every sample after it
    after = t > t1
    ev_t = np.concatenate([[t1], t[after]])
    held = w[np.searchsorted(t, t1, side="right") - 1] if t[0] <= t1 else w[0]
    ev_w = np.concatenate([[held], w[after]])
    _, _, spike_vals = f.pieces(t0, t1)
    ok = ev_w <= thr
    rec_at = None
    i, n = 0, len(ev_t)
    last_run = None
    while i < n:
        if not ok[i]:
            i += 1
            continue
        j = i
        while j < n and ok[j]:
            j += 1
        run_end = ev_t[j] if j < n else end
        if run_end - ev_t[i] >= hold:
            rec_at = float(ev_t[i])
            break
        last_run = (float(ev_t[i]), float(run_end - ev_t[i]))
        i = j
    upto = rec_at if rec_at is not None else end
    m = (ev_t <= upto)
    peak_vals = np.concatenate([spike_vals, ev_w[m]])
    peak_times = np.concatenate([f.pieces(t0, t1)[0], ev_t[m]])
    k = int(np.argmax(peak_vals))
    out.update(peak=float(peak_vals[k]), peak_t_s=float(peak_times[k]))
    if rec_at is not None:
        out.update(recovered=True, recovery_s=rec_at - t1, recovered_at_s=rec_at,
                   note="; ".join(notes + [f"back within {thr:g} waiting {rec_at - t1:g} s after the spike"]))
    else:
        why = f"not recovered by the end ({end:g} s)"
        if last_run is not None and last_run[0] + last_run[1] >= end:
            why += f": back within range at {last_run[0]:g} s, but only for {last_run[1]:g} s (hold {hold:g} s)"
        else:
            why += f": still {float(ev_w[-1]):g} waiting, over the threshold {thr:g}"
        out.update(recovered=False, recovery_s=math.inf, note="; ".join([*notes, why]))
    return out


def fleet_summary(requests, pools=None, *, warmup_s: float = 0.0, horizon_s: float | None = None, slos=None,
                  pool_costs: dict | None = None, pool_quality: dict | None = None, spike=None,
                  prefill_pool: str | None = None, degrade_quality: dict | None = None,
                  tolerance: float = DEFAULT_TOLERANCE, hold_s: float = DEFAULT_HOLD_S,
                  hold_samples: int = DEFAULT_HOLD_SAMPLES) -> dict:
    """A fleet's account from its request records and, optionally, its pools series.

    ``requests``: :class:`~llmqueue.records.RequestRecords` (the optional ``pool``, ``model``,
    ``kv_transfer_s`` columns used where present); ``pools``: a
    :class:`~llmqueue.records.PoolSeries` or None; ``warmup_s`` / ``horizon_s``: the window (pass
    the simulator's ``horizon_s``); ``slos``: targets as :func:`llmqueue.metrics.summarize` takes
    them; ``pool_costs`` / ``pool_quality``: ``{pool: cost per replica-hour}`` / ``{pool: relative
    quality}``; ``spike``: ``(t0, t1)`` seconds of a load spike, or None; ``prefill_pool``: a P/D
    fleet's prefill pool (its row then counts every request it prefilled, whose record is the
    decode side's: TTFT is its station's, E2EL and TPOT the request's); ``degrade_quality``:
    ``{how: quality factor}`` of the gateway's caps (the ``degraded`` column's values); ``tolerance``, ``hold_s``,
    ``hold_samples``: :func:`recovery_time`'s.

    Keys: ``window_s`` ``[t0, t1]``; ``pools`` / ``classes`` / ``pool_class`` (:func:`group_rows`);
    ``model_mix`` (:func:`model_mix`, None without a ``model`` column); ``retries``
    (:func:`retry_amplification`); ``quality`` (:func:`quality_account`, None without
    ``pool_quality``); with a ``degraded`` column, ``degraded`` (:func:`degraded_account`'s
    completed requests by class and how); with a pools series also ``replicas`` (:func:`replica_summary`),
    ``queue_depth`` (:func:`queue_depth`), ``cost`` (:func:`cost_account`), and with ``spike``,
    ``spike_s`` and ``recovery`` ``{pool: recovery_time(...), "all": ...}`` on each pool's total
    waiting queue and on the whole fleet's (``"all"``).
    """
    t0, t1 = window(requests, warmup_s, horizon_s)
    q = _Req(requests, t0, t1, slos)
    out: dict = {"window_s": [t0, t1]}
    out.update(_group_rows(q, prefill_pool))
    out["model_mix"] = _model_mix(q)
    if prefill_pool is not None:
        out["stages"] = pd_stages(requests, warmup_s=warmup_s, horizon_s=horizon_s)
    out["retries"] = _retries(requests, t0, t1)
    capped = None
    if "degraded" in requests:
        out["degraded"], capped = degraded_account(q, degrade_quality or {})
    out["quality"] = quality_account(out, pool_quality, capped)
    if pools is not None and len(pools):
        tracks = pool_tracks(pools)
        out["replicas"] = replica_summary(tracks, t0, t1)
        out["queue_depth"] = queue_depth(tracks, t0, t1)
        done = int((q.ok & q.fin_in).sum())
        out["cost"] = cost_account(out["replicas"], pool_costs, done)
        if spike is not None:
            out["spike_s"] = [float(spike[0]), float(spike[1])]
            kw = dict(end_s=t1, tolerance=tolerance, hold_s=hold_s, hold_samples=hold_samples)
            rec = {p: recovery_time(tr["t_s"], tr["num_waiting"], spike, **kw) for p, tr in tracks.items()}
            if len(tracks) > 1:
                tt, ww = fleet_waiting(tracks)
                rec["all"] = recovery_time(tt, ww, spike, **kw)
            out["recovery"] = rec
    return out


def fleet_waiting(tracks: dict) -> tuple[np.ndarray, np.ndarray]:
    """The whole fleet's waiting queue: the pools' totals, held between samples, summed on the
    union of their sample times."""
    times = np.unique(np.concatenate([tr["t_s"] for tr in tracks.values()]))
    total = np.zeros(len(times))
    for tr in tracks.values():
        idx = np.searchsorted(tr["t_s"], times, side="right") - 1
        total += np.where(idx >= 0, tr["num_waiting"][np.maximum(idx, 0)], 0.0)
    return times, total
