"""What a report is made from: a run directory, a sweep directory, or a simulated twin.

A **run directory** (``llmqueue simulate --out DIR``, ``llmqueue bench --out DIR``) holds
``requests.parquet`` and, optionally, ``steps.parquet``, ``timeseries.parquet``,
``summary.json``, ``workload.parquet`` and, for a fleet, ``pools.parquet`` (see :mod:`llmqueue.records.io`). It may also hold
``validate.json`` (the JSON object ``llmqueue validate --json`` prints): its rows become a
predicted-versus-measured table, and when it names a simulated run directory under
``"sim_dir"`` (absolute, or relative to the run directory) that run is overlaid on the
measured one, as ``llmqueue report DIR --compare SIM_DIR`` does.

A **sweep directory** holds ``sweep.json``. The report reads this small interface (every key
but ``points`` is optional; unknown keys are ignored)::

    {
      "swept": ["max_num_seqs", "rate"],          # names of the swept parameters
      "slo": {"p99_ttft_ms": 2000, "p99_tpot_ms": 100},   # targets for every point (ms)
      "points": [
        {
          "params": {"max_num_seqs": 64, "rate": 3.0},    # the swept parameters of this point
          "rate": 3.0,                                    # offered load, req/s
          "request_throughput": 2.98,                     # completed req/s
          "p99_ttft_ms": 812.0,  "p99_ttft_ms_ci": [790.1, 840.3],
          "p99_tpot_ms": 41.2,   "p99_tpot_ms_ci": [40.8, 41.9],
          "p99_e2el_ms": 30120., "p99_e2el_ms_ci": null,
          "verdict": "stable",                            # or "unstable: queue grows ..."
          "theory_mu": 3.262,                             # closed-form capacity, req/s
          "slo": {"p99_ttft_ms": 2000},                   # this point's targets, if its own
          "run_dir": "points/007",                        # its run directory, if kept
          "p50_ttft_ms": 300.0, "p90_ttft_ms": 610.0,     # optional, drawn against the offered
          "utilization": 0.93, "kv_utilization": 0.71,    # load: p50_/p90_ of each latency,
          "queue_growth_per_s": 0.01                      # busy fraction, KV use, queue trend
        }, ...
      ]
    }

A point's run directory (``run_dir``; or ``runs/<key>``, as ``llmqueue sweep --keep-runs``
writes it) feeds the per-point figures: queue length over time and latency CDFs.

Accepted spellings, so that a sweep writer need not match the names exactly: the swept
parameters as ``params`` in each point or, as ``llmqueue sweep`` writes them, as flat keys of the
point named by the top-level ``grid`` (``{"max_num_seqs": [32, 256], "rate": [...]}``) or
``swept``; the rate as ``rate``, ``lam``, ``offered_rate``, ``arrival_rate`` or ``params.rate``
/ ``params.lam``; the throughput as ``request_throughput`` or ``throughput``; intervals as
``p99_X_ms_ci: [lo, hi]`` or ``p99_X_ms_ci_lo`` / ``p99_X_ms_ci_hi``; the capacity as
``theory_mu``, ``mu_theory``, ``mu`` or ``theory.mu``; metrics may sit in the point itself or in
its ``summary`` (or ``metrics``) object; ``slo`` may be spelled ``slos``; ``sweep.json`` may also
be a bare list of points. Points whose parameters other than the rate differ are drawn as
separate curves.

Optional, from ``llmqueue sweep``: ``slo_met`` per point (its SLO judgement, used as is instead
of comparing the p99 estimates with the targets), and ``curves``, one per setting of the
non-rate parameters, ``{"group": {...}, "metric": "p99_ttft_ms", "knee": {"rate", "throughput",
"latency"} or null, "max_rate_meeting_slo": ...}``, with the rules in ``knee_rule`` /
``slo_rule``: the report then marks the sweep's own knee and SLO-bounded point rather than
finding its own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from llmqueue.errors import InputError

SWEEP_FILE = "sweep.json"
VALIDATE_FILE = "validate.json"
ARG = "RUN_OR_SWEEP_DIR"

#: Keys of the rate among a point's parameters, in order of preference.
RATE_KEYS = ("rate", "lam", "offered_rate", "arrival_rate", "request_rate")
P99_METRICS = ("ttft", "tpot", "e2el")
#: Optional numbers of a point that the sweep report plots against the offered load.
POINT_VALUES = tuple(f"{q}_{m}_ms" for m in P99_METRICS for q in ("p50", "p90")) + (
    "utilization", "kv_utilization", "queue_growth_per_s", "output_throughput")


@dataclass
class RunData:
    """A run directory's contents (absent files are ``None``) and a label for legends."""

    path: Path
    requests: object  # llmqueue.records.RequestRecords
    steps: object = None
    timeseries: object = None
    summary: dict = field(default_factory=dict)
    validate: dict | None = None
    label: str = "run"
    pools: object = None  # llmqueue.records.PoolSeries: a fleet's pools series (pools.parquet), if any
    notes: list = field(default_factory=list)  # what reading it found (a killed run's journals: Run.notes)


@dataclass
class SweepPoint:
    """One point of a sweep, with ``None`` wherever the sweep did not say."""

    params: dict
    rate: float | None
    throughput: float | None
    p99: dict  # metric -> (value_ms or None, [lo, hi] or None)
    verdict: str | None
    stable: bool | None
    mu: float | None
    slo: dict
    run_dir: str | None = None
    slo_met: bool | None = None  # the sweep's own SLO judgement, when it gives one
    failed_share: float | None = None  # rejected, timed out, cancelled or failed, of the arrivals
    goodput: float | None = None       # requests meeting the SLOs per second
    values: dict = field(default_factory=dict)  # further numbers the point gives (:data:`POINT_VALUES`)
    key: str | None = None             # llmqueue sweep's point key (its run directory is runs/<key>)

    def group(self) -> tuple:
        """The parameters other than the rate: points with the same group form one curve."""
        return group_key(self.params)


def group_key(params: dict) -> tuple:
    """A curve's identity: the sorted ``(name, value)`` pairs of the parameters other than the rate."""
    return tuple(sorted((k, _hashable(v)) for k, v in params.items() if k not in RATE_KEYS))


@dataclass
class SweepData:
    path: Path
    points: list
    swept: list
    slo: dict
    meta: dict
    curves: list = field(default_factory=list)  # llmqueue sweep's curves (knee, SLO-bounded rate), if any


def _hashable(v):
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v


def _num(x) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _ci(x) -> list | None:
    if isinstance(x, (list, tuple)) and len(x) == 2:
        lo, hi = _num(x[0]), _num(x[1])
        if lo is not None and hi is not None:
            return [lo, hi]
    return None


def kind_of(path, *, arg: str = ARG) -> str:
    """``"run"``, ``"sweep"`` or ``"plan"`` (``llmqueue plan --out DIR``); raises :class:`InputError` (naming ``arg``) for anything else."""
    p = Path(path)
    if not p.exists():
        raise InputError(arg, f"{p} does not exist", "give a run directory (llmqueue simulate --out DIR) "
                                                     "or a sweep directory (llmqueue sweep --out DIR)")
    if p.is_file():
        if p.name == SWEEP_FILE:
            return "sweep"
        if p.name == "plan.json":
            return "plan"
        raise InputError(arg, f"{p} is a file, not a directory", "give the run or sweep directory that holds it")
    if not any(p.iterdir()):
        raise InputError(arg, f"{p} is empty", "give a run directory (requests.parquet) or a sweep directory "
                                               "(sweep.json)")
    from llmqueue.records.journal import exists

    if exists(p / "requests.parquet"):  # or the journal a benchmark killed outright left
        return "run"
    if (p / SWEEP_FILE).exists():
        return "sweep"
    if (p / "plan.json").exists():
        return "plan"
    raise InputError(arg, f"{p} is neither a run directory (no requests.parquet) nor a sweep directory "
                          f"(no {SWEEP_FILE})", "write one with llmqueue simulate --out DIR or llmqueue sweep --out DIR")


def load(path, *, label: str | None = None):
    """A :class:`RunData` or :class:`SweepData` for ``path`` (see the module docstring)."""
    kind = kind_of(path)
    return load_run(path, label=label) if kind == "run" else load_sweep(path)


def load_run(path, *, label: str | None = None, arg: str = ARG) -> RunData:
    """Read a run directory; ``validate.json`` too, when it is there."""
    from llmqueue.records import read_run

    p = Path(path)
    if kind_of(p, arg=arg) != "run":
        raise InputError(arg, f"{p} is a sweep directory, not a run directory")
    from llmqueue.metrics.summary import summary_of

    run = read_run(p)
    summary = summary_of(run)
    val = None
    vp = p / VALIDATE_FILE
    if vp.exists():
        from llmqueue._files import load_json

        val = load_json(arg, vp)
        if not isinstance(val, dict):
            raise InputError(arg, f"{vp} must hold a JSON object (llmqueue validate --json)")
    if label is None:
        label = "simulated" if _looks_simulated(summary) else "measured"
    return RunData(path=p, requests=run.requests, steps=run.steps, timeseries=run.timeseries,
                   summary=summary, validate=val, label=label, pools=run.pools, notes=run.notes)


def _looks_simulated(summary: dict) -> bool:
    return "engine_steps" in summary or "simulated_requests_per_wall_s" in summary


def twin_dir(run: RunData) -> Path | None:
    """The simulated twin named by the run's ``validate.json`` (``"sim_dir"``), if any."""
    if not run.validate:
        return None
    d = run.validate.get("sim_dir") or run.validate.get("simulated_dir")
    if not d:
        return None
    d = Path(d)
    return d if d.is_absolute() else run.path / d


def load_sweep(path) -> SweepData:
    """Read ``sweep.json`` (see the module docstring for the interface)."""
    p = Path(path)
    f = p if p.is_file() else p / SWEEP_FILE
    from llmqueue._files import load_json

    doc = load_json(ARG, f)
    if isinstance(doc, list):
        doc = {"points": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
        raise InputError(ARG, f"{f} has no list of points", 'write {"points": [{"rate": ..., '
                                                            '"request_throughput": ..., ...}, ...]}')
    slo = _slo(doc)
    swept = doc.get("swept") or doc.get("parameters") or doc.get("grid") or []
    if isinstance(swept, dict):
        swept = list(swept)
    swept = [str(k) for k in swept] if isinstance(swept, list) else []
    points = [_point(x, i, f, swept) for i, x in enumerate(doc["points"])]
    if not points:
        raise InputError(ARG, f"{f} lists no points")
    if not swept:
        swept = sorted({k for pt in points for k in pt.params})
    curves = [c for c in doc.get("curves") or [] if isinstance(c, dict) and isinstance(c.get("group", {}), dict)]
    meta = {k: v for k, v in doc.items() if k not in ("points", "curves")}
    return SweepData(path=p if p.is_dir() else p.parent, points=points, swept=list(swept), slo=slo, meta=meta,
                     curves=curves)


def _slo(d: dict) -> dict:
    s = d.get("slo", d.get("slos", d.get("slo_targets")))
    if not isinstance(s, dict):
        return {}
    return {k: v for k, v in ((k, _num(v)) for k, v in s.items()) if v is not None}


def _point(x, i: int, f: Path, swept=()) -> SweepPoint:
    if not isinstance(x, dict):
        raise InputError(ARG, f"{f}: point {i} is not a JSON object")
    layers = [x] + [x[k] for k in ("summary", "metrics", "result") if isinstance(x.get(k), dict)]

    def get(*names):
        for layer in layers:
            for n in names:
                if n in layer and layer[n] is not None:
                    return layer[n]
        return None

    params = x.get("params") or x.get("parameters") or {}
    if not isinstance(params, dict):
        params = {}
    if not params and swept:  # llmqueue sweep: the coordinates are flat keys of the point
        params = {k: x[k] for k in swept if k in x}
    rate = _num(get(*RATE_KEYS))
    if rate is None:
        rate = next((_num(params[k]) for k in RATE_KEYS if k in params and _num(params[k]) is not None), None)
    if rate is None:  # an arrival spec such as "poisson:3"
        spec = params.get("arrival") or x.get("arrival")
        if isinstance(spec, str) and ":" in spec:
            rate = _num(spec.split(":")[1])
    theory = get("theory")
    mu = _num(get("theory_mu", "mu_theory"))
    if mu is None and isinstance(theory, dict):
        mu = _num(theory.get("mu"))
    if mu is None:
        mu = _num(get("mu"))
    p99 = {m: (_num(get(f"p99_{m}_ms")), _ci(get(f"p99_{m}_ms_ci")) or _ci([get(f"p99_{m}_ms_ci_lo"),
                                                                          get(f"p99_{m}_ms_ci_hi")]))
           for m in P99_METRICS}
    verdict = get("verdict")
    verdict = str(verdict) if verdict is not None else None
    stable = get("stable")
    if not isinstance(stable, bool):
        stable = None if verdict is None else (True if verdict.startswith("stable") else
                                               False if verdict.startswith(("unstable", "overloaded")) else None)
    return SweepPoint(params=dict(params), rate=rate, throughput=_num(get("request_throughput", "throughput")),
                      p99=p99, verdict=verdict, stable=stable, mu=mu, slo=_slo(x),
                      run_dir=x.get("run_dir") if isinstance(x.get("run_dir"), str) else None,
                      slo_met=x.get("slo_met") if isinstance(x.get("slo_met"), bool) else None,
                      failed_share=_num(get("failed_share")), goodput=_num(get("request_goodput", "goodput")),
                      values={k: v for k in POINT_VALUES if (v := _num(get(k))) is not None},
                      key=x.get("key") if isinstance(x.get("key"), str) else None)


def point_run_dir(sweep: SweepData, p: SweepPoint) -> Path | None:
    """A point's run directory (one holding ``requests.parquet``), or ``None``.

    Looked for at ``run_dir`` (absolute, or relative to the sweep directory or to the working
    directory) and at ``<sweep>/runs/<name>``, where ``llmqueue sweep --keep-runs`` writes it.
    """
    cands = []
    if p.run_dir:
        r = Path(p.run_dir)
        cands += [r] if r.is_absolute() else [sweep.path / r, r]
        cands.append(sweep.path / "runs" / r.name)
    if p.key:
        cands.append(sweep.path / "runs" / p.key)
    return next((c for c in cands if (c / "requests.parquet").is_file()), None)
