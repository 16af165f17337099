"""Load sweeps: simulate a grid of points and tabulate their summaries, curves, knees and boundaries.

A sweep is the cartesian product of arrival rates (``rates``) and other parameters of the
simulation (``params``: engine knobs such as ``max_num_seqs``, ``max_num_batched_tokens`` /
``chunk``, ``step_time``, ``capacity_tokens``, ...; see :mod:`llmqueue.plan.points` for how a
point becomes a :class:`~llmqueue.simulate.SimSpec`). Each point runs with its own seed derived
from the base seed and the point's coordinates (``seeds="derived"``), or with the base seed
(``seeds="common"``: common random numbers), so a point's numbers do not depend on the order in
which points run or on the backend (:mod:`llmqueue.plan.backends`).

Cache: with ``out_dir`` every finished point is written at once to
``out_dir/points/<key>.json`` (its parameters, seed, summary and theory), ``key`` being the hash
of the point's full parameters (:func:`~llmqueue.plan.points.point_key`); a rerun (an
interrupted sweep resumed, or a grid extended) reads those files and simulates only the
missing points. ``keep_runs`` also writes each point's records to ``out_dir/runs/<key>/``.

Per point, the table (:meth:`SweepResult.rows`) holds the coordinates, the seed, throughputs,
TTFT/TPOT/ITL/E2EL/queue latencies (mean, p50, p90, p99, with the 95% confidence intervals of
the mean and p99 as ``..._ci_lo``/``..._ci_hi``), the stability verdict, Little's-law gap, the
closed-form capacity ``theory_mu`` (and which bound binds) and, with SLOs, the SLO judgement of
:func:`llmqueue.plan.slo_judge.judge`.

Curves (one per combination of the non-rate parameters, when rates are swept): latency versus
load with

- the **knee**: the offered rate at which the curve's latency (``knee_metric``, default p99 TTFT)
  first reaches ``knee_factor`` (default 2) times its value at the lowest swept rate. Between the
  last point below and the first point at or above the threshold (the ``bracket``, the knee's
  resolution) the rate is interpolated linearly in log latency; the throughput there linearly
  in the rate. A coarse grid gives a wide bracket: add rates inside it. A point with no
  completed request counts as above the threshold. No knee when the curve never reaches it. The
  lowest swept rate stands in for "low load", so sweep from a light load.
- the **stability boundary**: the theory's ``mu`` (``theory_mu`` of the highest-rate point the
  simulation judged stable, as the step time ``b`` of composition-dependent step-time models is
  measured under load; the lowest point's when none is stable), and the simulated bracket
  ``stable_up_to`` / ``unstable_from`` (highest stable and lowest unstable swept rate);
- the **SLO line**: the targets, and ``max_rate_meeting_slo``, the highest swept rate such that
  it and every lower swept rate meet the SLOs.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmqueue._files import staged, write_atomic
from llmqueue.errors import InputError, LlmqueueError
from llmqueue.plan.points import (
    _is_scenario,
    _scenario_data,
    canonical,
    derive_seed,
    factory_name,
    jsonable,
    point_key,
    resolve,
)

#: Summary fields that measure the wall clock, not the model: they differ between runs.
VOLATILE = ("wall_s", "simulated_requests_per_wall_s")
SEEDS = ("derived", "common")
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")


# --- one point -----------------------------------------------------------------------------------

@dataclass
class PointResult:
    """One simulated (or cached) point: its coordinates, full parameters, seed, summary, theory."""

    key: str
    coords: dict
    params: dict
    seed: int | None
    summary: dict
    theory: dict
    cached: bool = False
    run_dir: str | None = None

    def to_dict(self) -> dict:
        return {"key": self.key, "coords": self.coords, "seed": self.seed, "params": self.params,
                "summary": self.summary, "theory": self.theory, "run_dir": self.run_dir}


def simulate_point(task: dict) -> dict:
    """Worker: build the point's SimSpec with its factory, simulate, return plain JSON values.

    ``task``: ``{"factory": fn, "params": {...}, "run_dir": path or None}``. Library errors come
    back as ``{"error": {...}}`` (an exception with extra fields does not survive pickling).
    """
    from llmqueue.simulate import run_simulation, write_outcome

    try:
        spec = task["factory"](**task["params"])
        out = run_simulation(spec)
        if task.get("run_dir"):
            write_outcome(out, task["run_dir"])
        res = {"summary": out.summary, "theory": out.theory}
    except LlmqueueError as e:
        return {"error": {"field": getattr(e, "field", None), "problem": getattr(e, "problem", str(e)),
                          "fix": getattr(e, "fix", None), "message": str(e)}}
    # a JSON round trip: every backend, and the cache, hand back the very same plain values
    return json.loads(json.dumps(jsonable(res), allow_nan=False))


def bench_point(task: dict) -> dict:
    """Worker for sweeps against a real server (``task["target"] = {"url", "model"}``): the
    point's request stream (built by the same factory as a simulated point) is sent open-loop to
    the server by :func:`llmqueue.bench.client.run_bench`; returns its summary."""
    from llmqueue.bench.client import run_bench
    from llmqueue.simulate import generate_requests

    try:
        spec = task["factory"](**task["params"])
        requests = generate_requests(spec)
        tgt = task["target"]
        res = run_bench(tgt["url"], tgt["model"], requests, out_dir=task.get("run_dir"), warmup_s=spec.warmup_s,
                        seed=spec.seed)
        out = {"summary": res.summary, "theory": {}}
    except LlmqueueError as e:
        return {"error": {"field": getattr(e, "field", None), "problem": getattr(e, "problem", str(e)),
                          "fix": getattr(e, "fix", None), "message": str(e)}}
    return json.loads(json.dumps(jsonable(out), allow_nan=False))


def base_seed(factory, base: dict) -> int:
    """The seed of the base parameters (a scenario's ``run.seed`` when none is given)."""
    seed = base.get("seed")
    if seed is None and _is_scenario(factory):
        data, _, _ = _scenario_data(base["scenario"])
        seed = ((data or {}).get("run") or {}).get("seed", 0) if isinstance(data, dict) else 0
    return int(seed or 0)


def point_params(factory, base: dict, coords: dict, seeds: str = "derived") -> tuple[dict, int | None]:
    """The factory keywords and the seed of the point at ``coords``."""
    if seeds not in SEEDS:
        raise InputError("seeds", f"unknown seeding {seeds!r}", f"choose one of: {', '.join(SEEDS)}")
    params = resolve(factory, base, coords)
    if "seed" in coords:
        seed = coords["seed"]
    elif seeds == "derived":
        seed = derive_seed(base_seed(factory, base), coords)
    else:
        seed = base.get("seed")
        if seed is None and not _is_scenario(factory):
            seed = 0
    params["seed"] = seed
    return params, seed


def _read_cache(path: Path, key: str) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or "summary" not in rec:
        return None
    return rec


def _write_cache(path: Path, rec: dict) -> None:
    write_atomic(path, json.dumps(rec, indent=1, allow_nan=False) + "\n")  # an interrupted write leaves no half file


@dataclass
class RunStats:
    ran: int = 0
    cached: int = 0
    wall_s: float = 0.0


def run_points(factory, base: dict, coords_list: list[dict], *, seeds: str = "derived", backend=None,
               cache_dir=None, keep_runs: bool = False, progress: bool = False, desc: str = "points",
               stats: RunStats | None = None, target: dict | None = None, bar=None) -> list[PointResult]:
    """Simulate the points ``coords_list`` (reading and writing the cache in ``cache_dir``).

    Returns one :class:`PointResult` per point, in the order given; ``stats`` (if given)
    counts the simulations run and the points read from the cache. ``bar``: a caller's progress
    bar (one over several calls, e.g. a capacity search's rounds) moved one step per point,
    instead of a bar of this call's own (``progress``).
    """
    from llmqueue.plan.backends import SerialBackend, get_backend

    t0 = time.perf_counter()
    stats = stats if stats is not None else RunStats()
    cache = Path(cache_dir) if cache_dir is not None else None
    if keep_runs and cache is None:
        raise InputError("keep_runs", "needs an output directory", "give --out DIR")
    results: list[PointResult | None] = [None] * len(coords_list)
    todo = []
    seen: dict[str, int] = {}
    for i, coords in enumerate(coords_list):
        params, seed = point_params(factory, base, coords, seeds)
        key = point_key(factory, params if target is None else {**params, "_server": target["url"]})
        run_dir = str(cache / "runs" / key) if keep_runs else None
        if key in seen:  # the same point twice in one call: simulate once
            todo.append((i, None, key, coords, params, seed, run_dir))
            continue
        seen[key] = i
        rec = _read_cache(cache / "points" / f"{key}.json", key) if cache is not None else None
        if rec is not None and (run_dir is None or (Path(run_dir) / "summary.json").is_file()):
            results[i] = PointResult(key, coords, params, seed, rec["summary"], rec.get("theory") or {},
                                     cached=True, run_dir=run_dir)
            stats.cached += 1
            continue
        task = {"factory": factory, "params": params, "run_dir": run_dir}
        if target is not None:
            task["target"] = target
        todo.append((i, task, key, coords, params, seed, run_dir))
    tasks = [t for t in todo if t[1] is not None]
    be = backend if backend is not None else SerialBackend()
    be = get_backend(be)
    own = bar is None and progress and bool(tasks)
    if own:
        from tqdm import tqdm

        bar = tqdm(total=len(coords_list), initial=len(coords_list) - len(todo), desc=desc, unit="pt",
                   leave=False, dynamic_ncols=True, mininterval=0.5)
    elif bar is not None and len(coords_list) > len(tasks):
        bar.update(len(coords_list) - len(tasks))  # cached and repeated points are done already
    try:
        for j, res in be.map(simulate_point if target is None else bench_point, [t[1] for t in tasks]):
            i, _, key, coords, params, seed, run_dir = tasks[j]
            if "error" in res:
                e = res["error"]
                raise InputError(e.get("field") or "point", f"at {_label(coords)}: {e.get('problem')}", e.get("fix"))
            rec = {"key": key, "factory": factory_name(factory), "coords": jsonable(coords), "seed": seed,
                   "params": jsonable(params), **res}
            if cache is not None:
                _write_cache(cache / "points" / f"{key}.json", rec)
            results[i] = PointResult(key, coords, params, seed, res["summary"], res.get("theory") or {},
                                     run_dir=run_dir)
            stats.ran += 1
            if bar is not None:
                bar.update(1)
    finally:
        if own:
            bar.close()
    for i, _, key, coords, params, seed, run_dir in todo:  # duplicates take their twin's numbers
        if results[i] is None:
            twin = results[seen[key]]
            results[i] = PointResult(key, coords, params, seed, twin.summary, twin.theory, cached=True,
                                     run_dir=run_dir)
    stats.wall_s += time.perf_counter() - t0
    return results


def _label(coords: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in coords.items()) or "the base point"


# --- the grid ------------------------------------------------------------------------------------

#: The most points a sweep's grid may hold (each one a whole simulate run)
MAX_POINTS = 1000


def make_grid(rates=None, params: dict | None = None) -> list[dict]:
    """The grid's points as coordinate dicts: the product of ``params`` (outer, in the order
    given) and ``rates`` (inner), so each curve's points are adjacent. No rates, no params: one
    point, the base itself."""
    axes: list[tuple[str, list]] = []
    for k, vals in (params or {}).items():
        vals = list(vals)
        if not vals:
            raise InputError("param", f"{k}: no values given", f"e.g. {k}=8,16,32")
        axes.append((k, vals))
    if rates is not None:
        rates = [float(r) for r in rates]
        if not rates:
            raise InputError("rates", "no rates given", "e.g. --rates 1,3,5,20,50")
        for r in rates:
            if not (math.isfinite(r) and r > 0):
                raise InputError("rates", f"every rate must be a positive number (got {r:g})")
        axes.append(("rate", rates))
    if not axes:
        return [{}]
    size = math.prod(len(a[1]) for a in axes)
    if size > MAX_POINTS:
        shape = " x ".join(f"{len(v)} {'rates' if k == 'rate' else f'values of {k}'}" for k, v in axes)
        raise InputError("rates" if rates is not None else "param",
                         f"the grid holds {size:,} points ({shape}); the limit is {MAX_POINTS:,}",
                         "sweep fewer values (each point is a whole simulate run)")
    names = [a[0] for a in axes]
    if len(set(names)) != len(names):
        raise InputError("param", "a parameter is swept twice", "give each name once")
    return [dict(zip(names, combo)) for combo in itertools.product(*(a[1] for a in axes))]


# --- rows ----------------------------------------------------------------------------------------

def _ci(v, i):
    return v[i] if isinstance(v, (list, tuple)) and len(v) == 2 else None


def point_row(p: PointResult, slos: dict | None = None) -> dict:
    """The table row of one point (plain values; CIs flattened to ``_ci_lo``/``_ci_hi``)."""
    s, th = p.summary, p.theory
    row: dict = dict(p.coords)
    if "rate" not in row:
        row["rate"] = th.get("lam")
    row.update(key=p.key, seed=p.seed, offered_rate=th.get("lam"), arrival_rate=s.get("arrival_rate"),
               arrivals=s.get("arrivals"), completed=s.get("completed"), failed=s.get("failed"),
               failed_share=s.get("failed_share"), request_goodput=s.get("request_goodput"),
               good_share=s.get("good_share"),
               request_throughput=s.get("request_throughput"), output_throughput=s.get("output_throughput"),
               total_token_throughput=s.get("total_token_throughput"))
    for m in LATENCIES:
        row[f"mean_{m}_ms"] = s.get(f"mean_{m}_ms")
        row[f"mean_{m}_ms_ci_lo"] = _ci(s.get(f"mean_{m}_ms_ci"), 0)
        row[f"mean_{m}_ms_ci_hi"] = _ci(s.get(f"mean_{m}_ms_ci"), 1)
        for q in ("p50", "p90", "p99"):
            row[f"{q}_{m}_ms"] = s.get(f"{q}_{m}_ms")
        row[f"p99_{m}_ms_ci_lo"] = _ci(s.get(f"p99_{m}_ms_ci"), 0)
        row[f"p99_{m}_ms_ci_hi"] = _ci(s.get(f"p99_{m}_ms_ci"), 1)
    row.update(verdict=s.get("verdict"), stable=s.get("stable"), queue_growth_per_s=s.get("queue_growth_per_s"),
               little_gap=s.get("little_gap"), utilization=s.get("utilization"),
               mean_batch_size=s.get("mean_batch_size"), kv_utilization=s.get("kv_utilization"),
               theory_mu=th.get("mu"), theory_binding=th.get("binding"), theory_rho=th.get("rho"),
               theory_verdict=th.get("verdict"), theory_b=th.get("b"), theory_mu_kv=th.get("mu_kv"),
               theory_mu_seqs=th.get("mu_seqs"), theory_mu_tokens=th.get("mu_tokens"))
    if slos:
        from llmqueue.plan.slo_judge import judge

        j = judge(s, slos)
        row["slo_met"] = j["meets"]
        row["slo_basis"] = j["basis"]
        row["slo_reasons"] = "; ".join(j["reasons"]) or None
    row["wall_s"] = s.get("wall_s")
    row["run_dir"] = p.run_dir
    return row


# --- curves --------------------------------------------------------------------------------------

def _interp(x0, y0, x1, y1, x):
    if y0 is None or y1 is None:
        return None
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1


def knee(rates, latency, throughput=None, *, factor: float = 2.0) -> dict | None:
    """The knee of a latency-versus-load curve (see the module docstring).

    ``rates`` increasing; ``latency[i]`` None means no completed request (above any threshold).
    Returns ``{"rate", "throughput", "latency", "threshold", "low_load_latency", "bracket"}``
    or None when the curve never reaches ``factor`` times its lowest-rate latency.
    """
    if len(rates) < 2 or latency[0] is None or not latency[0] > 0:
        return None
    thr = factor * latency[0]
    throughput = throughput or [None] * len(rates)
    for i in range(1, len(rates)):
        y = latency[i]
        if y is not None and y < thr:
            continue
        r0, r1 = rates[i - 1], rates[i]
        y0 = latency[i - 1]
        if y is None:
            r, lat = r1, None
        else:
            # geometric in the latency (latencies grow multiplicatively near saturation)
            r = r0 + (r1 - r0) * math.log(thr / y0) / math.log(y / y0) if y > y0 > 0 else r1
            lat = thr
        return {"rate": r, "throughput": _interp(r0, throughput[i - 1], r1, throughput[i], r),
                "latency": lat, "threshold": thr, "low_load_latency": latency[0], "bracket": [r0, r1],
                "factor": factor}
    return None


def curves(results: list[PointResult], rows: list[dict], *, metric: str = "p99_ttft_ms",
           factor: float = 2.0, slos: dict | None = None) -> list[dict]:
    """One latency-versus-load curve per combination of the non-rate coordinates."""
    if not results or not any("rate" in p.coords for p in results):
        return []
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(results):
        g = {k: v for k, v in p.coords.items() if k != "rate"}
        groups.setdefault(canonical(g), []).append(i)
    out = []
    for g, idx in groups.items():
        idx = sorted(idx, key=lambda i: results[i].coords["rate"])
        rates = [results[i].coords["rate"] for i in idx]
        lat = [rows[i].get(metric) for i in idx]
        thr = [rows[i].get("request_throughput") for i in idx]
        stable = [rows[i].get("stable") for i in idx]
        st_rates = [r for r, s in zip(rates, stable) if s]
        un_rates = [r for r, s in zip(rates, stable) if s is False]
        mu_i = max((i for i in idx if rows[i].get("stable")), key=lambda i: results[i].coords["rate"], default=idx[0])
        c = {"group": json.loads(g), "metric": metric, "rates": rates, "throughput": thr, "latency": lat,
             "latency_ci_hi": [rows[i].get(f"{metric}_ci_hi") for i in idx] if metric.startswith("p99_") else None,
             "verdicts": [rows[i].get("verdict") for i in idx],
             "knee": knee(rates, lat, thr, factor=factor),
             "theory_mu": rows[mu_i].get("theory_mu"), "theory_binding": rows[mu_i].get("theory_binding"),
             "theory_mu_at_rate": rows[mu_i].get("rate"),
             "stable_up_to": max(st_rates) if st_rates else None,
             "unstable_from": min(un_rates) if un_rates else None}
        if slos:
            best = None
            for i in idx:
                if not rows[i].get("slo_met"):
                    break
                best = rows[i]["rate"]
            c["slo"] = dict(slos)
            c["max_rate_meeting_slo"] = best
        out.append(c)
    return out


KNEE_RULE = ("knee: the offered rate at which {metric} first reaches {factor:g} x its value at the "
             "lowest swept rate (interpolated linearly in log latency between the swept rates around it, "
             "its bracket)")


# --- the sweep -----------------------------------------------------------------------------------

@dataclass
class SweepResult:
    """What :func:`sweep` returns: per-point results and rows, the curves and how it ran."""

    points: list[PointResult]
    rows: list[dict]
    curves: list[dict]
    grid: dict
    meta: dict = field(default_factory=dict)

    @property
    def ran(self) -> int:
        return self.meta.get("ran", 0)

    @property
    def cached(self) -> int:
        return self.meta.get("cached", 0)

    def numbers(self) -> list[dict]:
        """The rows without wall-clock fields: identical for the same seed on every backend."""
        return [{k: v for k, v in r.items() if k not in VOLATILE} for r in self.rows]

    def to_dict(self) -> dict:
        return jsonable({**self.meta, "grid": self.grid, "curves": self.curves, "points": self.rows})

    def to_arrow(self):
        import pyarrow as pa

        return pa.Table.from_pylist(self.rows)

    def write(self, out_dir, *, csv: bool = False) -> list[Path]:
        """Write ``sweep.parquet`` (or ``sweep.csv``) and ``sweep.json`` into ``out_dir``."""
        out = Path(out_dir)
        tbl = self.to_arrow()
        if csv:
            import pyarrow.csv as pcsv

            path, write = out / "sweep.csv", pcsv.write_csv
        else:
            import pyarrow.parquet as pq

            path, write = out / "sweep.parquet", pq.write_table
        with staged(path) as tmp:
            write(tbl, tmp)
        js = write_atomic(out / "sweep.json", json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        return [path, js]


def sweep(factory, base: dict, *, rates=None, params: dict | None = None, seeds: str = "derived",
          backend="local", workers: int | None = None, address: str | None = None, out_dir=None,
          keep_runs: bool = False, slos: dict | None = None, knee_metric: str = "p99_ttft_ms",
          knee_factor: float = 2.0, progress: bool = False, target: dict | None = None) -> SweepResult:
    """Simulate the grid ``rates`` x ``params`` on top of ``base`` and tabulate it.

    ``factory``/``base``: see :mod:`llmqueue.plan.points` (``scenario_spec`` with
    ``{"scenario": "chat", ...}``, or ``build_spec`` with the simulate flags). ``params``:
    ``{name: [values]}``. ``backend``: ``local`` (processes), ``serial``, ``ray``, or a
    :class:`~llmqueue.plan.backends.Backend`. ``out_dir``: the cache (``points/``), the runs
    (``runs/`` with ``keep_runs``) and, written by :meth:`SweepResult.write`, the table. ``slos``:
    ``{"p99_ttft_ms": 2000, "p99_tpot_ms": 50}`` (judged as :func:`llmqueue.plan.slo_judge.judge`).
    """
    from llmqueue._validate import positive
    from llmqueue.plan.backends import get_backend
    from llmqueue.plan.points import check_param

    positive("knee_factor", knee_factor)
    if knee_factor <= 1:
        raise InputError("knee_factor", f"must be > 1 (got {knee_factor:g})")
    norm = {}
    for k, v in (params or {}).items():
        name = check_param(factory, k, base)
        if name == "rate":
            raise InputError("param", "the rate has its own option", "use --rates 1,3,5")
        norm[name] = v
    grid = make_grid(rates, norm)
    stats = RunStats()
    if target is not None:
        backend = "serial"  # one real server: its points run one after another
    own = not hasattr(backend, "map")
    be = get_backend(backend, workers=workers, address=address)
    try:
        results = run_points(factory, base, grid, seeds=seeds, backend=be, cache_dir=out_dir, keep_runs=keep_runs,
                             progress=progress, desc="sweep", stats=stats, target=target)
        described = be.describe()
    finally:
        if own:
            be.close()
    rows = [point_row(p, slos) for p in results]
    cv = curves(results, rows, metric=knee_metric, factor=knee_factor, slos=slos)
    meta = {"factory": factory_name(factory), "base": jsonable(base), "seeds": seeds, "backend": described,
            "ran": stats.ran, "cached": stats.cached, "wall_s": stats.wall_s, "slos": slos,
            "knee_rule": KNEE_RULE.format(metric=knee_metric, factor=knee_factor),
            "slo_rule": _slo_rule() if slos else None}
    g = {k: list(v) for k, v in norm.items()}
    if rates is not None:
        g["rate"] = [float(r) for r in rates]
    return SweepResult(points=results, rows=rows, curves=cv, grid=g, meta=meta)


def _slo_rule() -> str:
    from llmqueue.plan.slo_judge import SLO_RULE

    return SLO_RULE
