"""Where a plan's workload comes from: the scenario's, a replayed trace or a fitted workload.

``llmqueue plan`` takes the arrival process (rate ``lam``) and the prompt / output lengths
``s``, ``o`` from one of:

- the scenario (``--scenario``): its ``workload`` section, as before;
- a trace (``--trace FILE``: Azure CSV, Mooncake JSONL, canonical Parquet, any format
  ``llmqueue simulate --trace`` reads): every simulation replays the recorded requests, their
  arrival times and lengths. Without ``--duration`` the whole trace is replayed; with it, its
  first ``--duration`` seconds (the requests arriving in ``[0, duration)``). The theory bounds use
  the replayed requests' empirical lengths and their mean rate ``lam = (n - 1) / span`` (the
  traces README's definition: ``n`` requests, ``span`` from the first to the last arrival).
- a fitted workload (``--workload FILE``, written by ``llmqueue workload fit``): its arrival
  process (rate ``lam`` its long-run rate) and its length distributions (the empirical pairs, or
  lognormal marginals), generated afresh for the plan's seed; ``--duration`` as for a scenario
  (default: the fit's span, longer when a p99 interval needs more requests).

With ``--scenario`` too, the scenario still gives the deployment (model, engine knobs), the SLO
defaults and the run's seed and warm-up; its whole ``workload`` section (classes and client
behaviour included) is replaced. Without it the model comes from ``--models`` and the run has
no warm-up and seed 0.

How: :func:`plan_scenario` writes a scenario file holding that workload (``workload.trace`` with ``rate: lam``, ``end_s`` for a window; or the fitted
``arrival`` and ``lengths``/``prompt``/``output`` with absolute paths), so theory, every
simulation, the sensitivity rows and the margin search read one scenario, as for ``--scenario``
alone. The file is named by its content's hash in the temporary directory
(``llmqueue-plan/<sha256>.yaml``: the same inputs give the same path, hence the same cache keys
on a rerun, and a refused plan writes nothing into ``--out``); :func:`keep_copy` puts a copy in
the output directory (``plan-scenario.yaml``) once the plan ran. Its cache keys cover the trace's (and the pairs file's) bytes:
:func:`llmqueue.plan.points.point_key` hashes the files a scenario's workload names.

Two approximations are stated where they apply (``notes``): the fitted pairs are resampled
i.i.d. (the fit's *balanced* permutations draw from the same distribution with less resampling
noise; a scenario has no such option), and a replayed trace carries no request classes.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

from llmqueue._files import write_atomic
from llmqueue.errors import InputError

#: The file :func:`plan_scenario` writes into the plan's output directory.
PLAN_SCENARIO = "plan-scenario.yaml"


@dataclass
class PlanScenario:
    """The scenario a plan runs (a file or shipped example name), the run length it fixes
    (``duration``: a trace's replayed span; None: the planner's default), and what
    ``plan.json`` records about the workload (``source``) and its approximations (``notes``)."""

    scenario: str
    duration: float | None
    source: dict
    notes: list = field(default_factory=list)


def plan_scenario(scenario: str | None, *, trace=None, workload=None, models=(), gpus=(), tp=(),
                  duration: float | None = None) -> PlanScenario:
    """The scenario of a plan (see the module docstring). Refuses in one line: ``--trace`` with
    ``--workload``, neither of them without ``--scenario``, no model without ``--scenario``."""
    if trace is not None and workload is not None:
        raise InputError("trace", "give --trace or --workload, not both",
                         "a trace replays recorded requests, a fitted workload generates new ones: choose one")
    if trace is None and workload is None:
        if scenario is None:
            raise InputError("scenario", "is required without --trace or --workload",
                             "give --scenario NAME_OR_FILE (llmqueue scenario list), or --trace FILE / --workload "
                             "FILE with --models")
        return PlanScenario(str(scenario), duration, {"kind": "scenario", "scenario": str(scenario)})
    if scenario is None and not models:
        raise InputError("models", "is required without --scenario: no model to plan for",
                         "give --models, e.g. --models llama-3.1-8b (llmqueue kv --list)")
    if duration is not None and not duration > 0:
        raise InputError("duration", f"must be positive (got {duration:g})")
    data = _base_data(scenario, models, gpus, tp)
    run = data.setdefault("run", {})
    notes = []
    if isinstance(data.get("workload"), dict) and data["workload"]:
        notes.append("the scenario's workload section (classes, client behaviour) is replaced by "
                     + ("the trace" if trace is not None else "the fitted workload"))
    if trace is not None:
        w, src, duration = _trace_workload(trace, duration)
        run_s = duration
    else:  # the run's length: --duration, else the planner's default (at least the fit's span)
        w, src, wnotes = _fitted_workload(workload)
        notes += wnotes
        run_s = src["duration_s"] if duration is None else duration
    data["workload"] = w
    run.pop("num_requests", None)
    run["duration_s"] = float(run_s)
    warm = float(run.get("warmup_s") or 0.0)
    if warm >= 0.5 * run["duration_s"]:
        notes.append(f"the scenario's warm-up {warm:g} s is at least half the {run['duration_s']:g} s run: none used")
        warm = 0.0
    run["warmup_s"] = warm
    run.setdefault("seed", 0)
    data["description"] = f"llmqueue plan: {src['kind']} {src['path']}" + (f" with scenario {scenario}" if scenario
                                                                            else "")
    path = _write(data)
    src["scenario"] = None if scenario is None else str(scenario)
    src["plan_scenario"] = str(path)
    return PlanScenario(str(path), None if duration is None else float(duration), src, notes)


# --- the parts ------------------------------------------------------------------------------------

def _base_data(scenario, models, gpus, tp) -> dict:
    """The scenario's data with the deployment's relative paths made absolute, or (no scenario) a
    deployment of the first model of ``models`` on the first GPU and ``tp`` of the space it fits."""
    if scenario is not None:
        from llmqueue.scenario.override import scenario_data

        data, _, p = scenario_data(scenario)
        data = copy.deepcopy(data) if isinstance(data, dict) else {}
        dep = data.get("deployment") if isinstance(data.get("deployment"), dict) else {}
        base = Path(p).resolve().parent
        m = dep.get("model")
        if isinstance(m, str) and not Path(m).expanduser().is_absolute() and (base / m).exists():
            dep["model"] = str(base / m)
        if "step_time" in dep:
            from llmqueue.engine.step_time import with_base

            dep["step_time"] = with_base(dep["step_time"], base)
        return data
    from llmqueue.hardware import get_gpu
    from llmqueue.hardware.memory import kv_capacity

    for m in models:
        for g in gpus:
            for t in tp:
                try:
                    kv_capacity(m, g, tensor_parallel_size=t)
                except InputError:
                    continue
                return {"deployment": {"model": m, "gpu": get_gpu(g).name, "tensor_parallel_size": int(t)},
                        "run": {"seed": 0}}
    raise InputError("models", f"{', '.join(models)}: no model fits any GPU of the space at any tensor-parallel size",
                     "add larger GPUs or tensor-parallel sizes (--gpus, --tp), or a smaller model")


def _trace_workload(trace, duration):
    """``workload.trace`` for the replay (the whole trace, or its first ``duration`` s), what the
    plan records, and the run's length (s)."""
    from llmqueue._files import input_file
    from llmqueue.plan.points import _file_digest
    from llmqueue.workload.traces import load_trace, window

    path = Path(input_file("trace", trace, what="trace file")).resolve()
    try:
        tr = load_trace(path)
    except InputError as e:
        raise InputError("trace", e.problem, e.fix) from None
    total = len(tr)
    if duration is not None:
        try:
            tr = window(tr, 0.0, duration)
        except InputError as e:
            raise InputError("duration", e.problem, e.fix) from None
    if len(tr) < 2 or not tr.span_s > 0:
        raise InputError("trace" if duration is None else "duration",
                         f"the replayed requests ({len(tr)}) have no time span, so no arrival rate",
                         "give a trace (or a --duration window) with at least 2 distinct arrival times")
    lam = float(tr.mean_rate)
    tc = {"path": str(path), "rate": lam}
    if duration is not None:
        tc["end_s"] = float(duration)
        run_s = float(duration)
        replay = f"the trace's first {duration:g} s: {len(tr)} of its {total} requests"
    else:
        run_s = float(math.floor(tr.span_s) + 1.0)  # every arrival in [0, span]
        replay = f"the whole trace: {total} requests over {tr.span_s:.6g} s"
    src = {"kind": "trace", "path": str(path), "sha256": _file_digest(str(path)), "replayed": replay,
           "requests": len(tr), "span_s": float(tr.span_s), "lam": lam,
           "lam_rule": "(n - 1) / span of the replayed requests"}
    return {"trace": tc}, src, run_s


def _fitted_workload(workload):
    """The fitted file's arrival process and lengths as a scenario's ``workload`` section (paths
    made absolute), what the plan records, and notes."""
    from llmqueue._files import input_file, load_yaml
    from llmqueue.plan.points import _file_digest
    from llmqueue.workload.fit import _resolve_path_spec, load_fitted
    from llmqueue.workload.parse import JOINT_FORMS, LENGTH_FORMS

    path = Path(input_file("workload", workload, what="fitted workload file")).resolve()
    try:
        fw = load_fitted(path)
    except InputError as e:
        raise InputError("workload", e.problem, e.fix) from None
    doc = load_yaml("workload", path, what="fitted workload file")
    w: dict = {"arrival": fw.arrival.spec}
    notes = []

    def absolute(spec, name, forms):
        if not (isinstance(spec, str) and spec.strip().split(":", 1)[0].lower() in forms):
            return spec
        form, v, fp = _resolve_path_spec(spec, path.parent, name, forms)
        extra = [f"{k}={v[k]}" for k in ("prompt", "output", "column") if v.get(k) is not None]
        return ":".join([form.name, fp, *extra])

    if "lengths" in doc:
        w["lengths"] = absolute(doc["lengths"], "lengths", JOINT_FORMS)
        if doc.get("length_sampling", "iid") == "balanced":
            notes.append("the fitted (prompt, output) pairs are resampled i.i.d. (the fit's balanced permutations "
                         "draw from the same pairs with less resampling noise; a scenario has no such option)")
    else:
        w["prompt"] = absolute(doc["prompt"], "prompt", LENGTH_FORMS)
        w["output"] = absolute(doc["output"], "output", LENGTH_FORMS)
    src = {"kind": "fitted workload", "path": str(path), "sha256": _file_digest(str(path)),
           "arrival": fw.arrival.spec, "lam": float(fw.rate), "duration_s": float(fw.duration_s)}
    return w, src, notes


def _write(data: dict) -> Path:
    """The scenario file, named by the SHA-256 of its text, under the temporary directory."""
    import hashlib
    import tempfile

    import yaml

    text = ("# written by llmqueue plan: the scenario every simulation of the plan runs (its workload from "
            "--trace or --workload)\n" + yaml.safe_dump(data, sort_keys=False))
    d = Path(tempfile.gettempdir()) / "llmqueue-plan"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.yaml"
    if p.is_symlink():
        p.unlink()  # a link planted in the shared temporary folder is never followed
    if not p.is_file() or p.read_text() != text:
        write_atomic(p, text)  # a concurrent plan reads the whole file or none
    return p.resolve()


def keep_copy(src: PlanScenario, out_dir) -> None:
    """Copy the plan's scenario file into ``out_dir`` (``plan-scenario.yaml``) when it was
    written for ``--trace``/``--workload``; ``src.source["plan_scenario_copy"]`` names it."""
    if out_dir is None or src.source.get("kind") == "scenario":
        return
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / PLAN_SCENARIO, Path(src.scenario).read_text())
    src.source["plan_scenario_copy"] = str(d / PLAN_SCENARIO)
