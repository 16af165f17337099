"""Knobs given together with a scenario: each one overrides that field of the scenario.

:func:`scenario_with` loads a scenario file (or a shipped example), applies knob overrides under
their flag names (:mod:`llmqueue.knobs`) and validates the result, so an override meets the same
checks as the file (``max_num_batched_tokens >= max_num_seqs``, the KV cache holding
``max_model_len``...). Only the knobs given are passed: a default never overrides the file.

Where each knob goes (the knob's ``scenario``):

- ``deployment.*`` / ``run.*``: that key of the file (``policy`` -> ``scheduling_policy``,
  ``chunk`` -> ``max_num_batched_tokens``, ``duration`` -> ``duration_s``, which drops the file's
  ``num_requests``, and the reverse);
- ``arrival``: replaces the workload's arrival process; a scenario whose classes have their
  own processes, or that replays a trace, is rescaled instead to the given process's long-run
  rate (:func:`scale_rate`, every process keeps its shape; a note says so);
- ``prompt``/``output``/``lengths``: the lengths of a scenario with one request class;
- ``slos`` and ``spec`` knobs (SLO thresholds, ``preemption``, ``srpt_predictor_cv``,
  ``prefix_block_tokens``, ``sample_dt``): not in the file; returned for the built spec;
- a knob without a place (``trace``): an error naming it.

Any field, fleet sections included, can also be assigned by path (``--set
deployment.autoscalers[0].provisioning_delay_s=300``, ``--set deployment.autoscalers=[]``):
:func:`apply_sets`, applied before the knobs.

Errors name the knob (the CLI turns ``max_num_seqs`` into ``--max-num-seqs``), also for a
problem the file's validation finds in an overridden field.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from llmqueue.errors import InputError

LENGTH_KNOBS = ("prompt", "output", "lengths")


@dataclass
class Overridden:
    """A validated scenario with overrides, the knobs for the built spec, and notes."""

    scenario: object
    spec_knobs: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


# --- the file and its rates ----------------------------------------------------------------------

def scenario_data(scenario) -> tuple:
    """``(data, text, path)`` of a scenario file or shipped example (data: the parsed YAML)."""
    from llmqueue.scenario.load import example_names, example_path, read_yaml

    s = str(scenario)
    p = Path(s).expanduser()
    if not p.is_file():
        key = s[:-5] if s.endswith(".yaml") else s
        if "/" not in s and "\\" not in s and key in example_names():
            p = example_path(key)
        else:
            raise InputError("scenario", f"{s!r}: no such scenario file, and no shipped example of that name",
                             f"examples: {', '.join(example_names())}")
    from llmqueue._files import read_text

    text = read_text("scenario", p, what="scenario file")
    return read_yaml(text, s), text, p


def scenario_rate(data) -> float:
    """The total long-run arrival rate of scenario data (req/s): the shared process plus every
    class's own, or a replayed trace's ``rate``."""
    from llmqueue.workload.parse import parse_arrival

    w = (data or {}).get("workload") or {}
    if w.get("trace") is not None:
        rate = (w["trace"] or {}).get("rate")
        if rate is None:
            raise InputError("rate", "the scenario replays a trace without workload.trace.rate",
                             "set workload.trace.rate in the file, or give the rates explicitly")
        return float(rate)
    total = 0.0
    if w.get("arrival") is not None:
        total += parse_arrival(w["arrival"]).rate
    for c in w.get("classes") or ():
        if isinstance(c, dict) and c.get("arrival") is not None:
            total += parse_arrival(c["arrival"]).rate
    if total <= 0:
        raise InputError("rate", "the scenario has no arrival process to rescale")
    return total


def scale_arrival(arrival, lam: float):
    """The arrival process ``arrival`` (a spec or an object) rescaled to long-run rate ``lam``.

    The shape is kept: a Gamma process keeps its ``cv``, an on/off process its period lengths
    (both levels scale), time-varying processes their profile (every level scales). Returns an
    :class:`~llmqueue.workload.arrivals.ArrivalProcess` (its ``spec`` is the new spec string).
    """
    from llmqueue._validate import positive
    from llmqueue.workload import arrivals as A
    from llmqueue.workload import nonstationary as N
    from llmqueue.workload.parse import parse_arrival

    lam = positive("rate", lam)
    proc = parse_arrival(arrival)
    base = proc.rate
    if not base or not math.isfinite(base):
        raise InputError("rate", f"the arrival process {proc.spec} has no finite long-run rate to rescale")
    f = lam / base
    if isinstance(proc, A.Poisson):
        return A.Poisson(lam)
    if isinstance(proc, A.Gamma):
        return A.Gamma(lam, proc.cv)
    if isinstance(proc, A.Deterministic):
        return A.Deterministic(lam)
    if isinstance(proc, A.OnOff):
        return A.OnOff(proc.rate_on * f, proc.on, proc.off, proc.rate_off * f)
    if isinstance(proc, N.Spike):
        return N.Spike(proc.base * f, proc.k, proc.at, proc.duration, period=proc.period, cv=proc.cv,
                       gaps=proc.gaps)
    if isinstance(proc, N.Piecewise):
        return N.Piecewise(list(zip(proc.starts.tolist(), (proc.rates * f).tolist())), period=proc.period,
                           cv=proc.cv, gaps=proc.gaps, counts=proc.counts, _window=proc.window)
    if isinstance(proc, N.Diurnal):
        return N.Diurnal(proc.mean * f, proc.amp, period=proc.period, phase=proc.phase, cv=proc.cv,
                         gaps=proc.gaps)
    raise InputError("rate", f"cannot rescale the arrival process {proc.spec}",
                     "use poisson, gamma, deterministic, onoff, piecewise, spike or diurnal")


def scale_rate(data: dict, rate: float) -> None:
    """Rescale scenario data (in place) to total rate ``rate``: a replayed trace's ``rate``, or
    the shared process and every class's own by the same factor (each keeps its shape)."""
    from llmqueue.workload.parse import parse_arrival

    w = data.get("workload") or {}
    if w.get("trace") is not None:
        w["trace"]["rate"] = rate
        return
    f = rate / scenario_rate(data)
    if w.get("arrival") is not None:
        a = parse_arrival(w["arrival"])
        w["arrival"] = scale_arrival(a, a.rate * f).spec
    for c in w.get("classes") or ():
        if isinstance(c, dict) and c.get("arrival") is not None:
            a = parse_arrival(c["arrival"])
            c["arrival"] = scale_arrival(a, a.rate * f).spec


# --- overrides -----------------------------------------------------------------------------------

def _from_cwd(name: str, value):
    """A file named on the command line is relative to the working directory, not the scenario's."""
    if not isinstance(value, str):
        return value
    cwd = Path.cwd()
    if name == "model":
        p = Path(value).expanduser()
        return str(p.resolve()) if not p.is_absolute() and p.exists() else value
    if name == "step_time":
        from llmqueue.engine.step_time import with_base

        return with_base(value, cwd)
    if name == "trace":
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else cwd / p)
    if name in LENGTH_KNOBS:
        from llmqueue.scenario.model import _with_base

        try:
            return _with_base(value, cwd, name, "joint" if name == "lengths" else "length")
        except InputError:
            return value  # the parse below reports it
    return value


def _section(data: dict, name: str) -> dict:
    sec = data.get(name)
    if sec is None:
        sec = data[name] = {}
    if not isinstance(sec, dict):
        raise InputError(name, f"the scenario's {name} section is not a mapping")
    return sec


def _apply_run(data: dict, given: dict) -> None:
    if given.get("duration") is not None and given.get("num_requests") is not None:
        raise InputError("num_requests", "give --num-requests or --duration, not both")
    run = _section(data, "run")
    warm = given.get("warmup", run.get("warmup_s") or 0.0)
    dur = given.get("duration", run.get("duration_s") if "num_requests" not in given else None)
    if isinstance(dur, (int, float)) and isinstance(warm, (int, float)) and warm >= dur:
        who = "duration" if "duration" in given else "warmup"
        raise InputError(who, f"the run ({dur:g} s) is not longer than the warm-up ({warm:g} s)",
                         "give a longer --duration or a shorter --warmup")
    if "duration" in given:
        run.pop("num_requests", None)
    if "num_requests" in given:
        run.pop("duration_s", None)


def _apply_arrival(data: dict, value, notes: list) -> None:
    from llmqueue.workload.parse import parse_arrival

    proc = parse_arrival(value, "arrival")
    w = _section(data, "workload")
    own = any(isinstance(c, dict) and c.get("arrival") is not None for c in w.get("classes") or ())
    if w.get("trace") is None and not own:
        w["arrival"] = value if isinstance(value, str) else proc.spec
        return
    scale_rate(data, proc.rate)
    what = "replays a trace" if w.get("trace") is not None else "has classes with their own arrival processes"
    notes.append(f"--arrival {proc.spec}: the scenario {what}; its total rate was scaled to {proc.rate:g} req/s, "
                 "every process keeping its shape")


def _apply_trace(data: dict, path: str, given: dict, notes: list) -> None:
    """``--trace FILE``: the scenario's arrivals become the trace's (its arrival process removed);
    without --duration or --num-requests the run is the whole trace (a warm-up not shorter than
    the trace is dropped, with a note, as ``bench`` does)."""
    from llmqueue.workload.traces import load_trace

    w = _section(data, "workload")
    w.pop("arrival", None)
    w["trace"] = {"path": path}
    if {"duration", "num_requests"} & set(given):
        return
    try:
        tr = load_trace(path)
    except InputError as e:
        raise InputError("trace", e.problem, e.fix) from None
    run = _section(data, "run")
    run.pop("duration_s", None)
    run["num_requests"] = max(len(tr), 1)
    warm = given.get("warmup", run.get("warmup_s") or 0.0)
    if isinstance(warm, (int, float)) and warm > 0 and warm >= tr.span_s:
        run["warmup_s"] = 0.0
        notes.append(f"warm-up {warm:g} s is not shorter than the trace ({tr.span_s:.3g} s): ignored")


def _apply_lengths(data: dict, given: dict) -> None:
    from llmqueue.workload.parse import parse_joint, parse_length

    names = [n for n in LENGTH_KNOBS if n in given]
    if "lengths" in given and len(names) > 1:
        raise InputError("lengths", "give either --lengths or --prompt-len/--output-len, not both")
    for n in names:
        (parse_joint if n == "lengths" else parse_length)(given[n], n)
    w = _section(data, "workload")
    classes = w.get("classes") or []
    if len(classes) > 1:
        raise InputError(names[0], f"the scenario has {len(classes)} request classes; a length flag applies to a "
                         "scenario with one", "set each class's lengths in the scenario file, or drop the flag")
    c = classes[0] if classes and isinstance(classes[0], dict) else None
    tgt = c if c is not None and any(c.get(n) is not None for n in LENGTH_KNOBS) else w
    if "lengths" in given:
        tgt.pop("prompt", None)
        tgt.pop("output", None)
        tgt["lengths"] = given["lengths"]
        return
    pair = tgt.get("prompt") is not None and tgt.get("output") is not None
    if not pair and len(names) == 1:
        other = "output" if names[0] == "prompt" else "prompt"
        where = "are joint pairs" if tgt.get("lengths") is not None else "come from its trace"
        raise InputError(other, f"is needed too: the scenario's lengths {where}", f"give --{other}-len as well")
    tgt.pop("lengths", None)
    for n in names:
        tgt[n] = given[n]


def apply_overrides(data: dict, overrides: dict) -> tuple[dict, list]:
    """Apply knob ``overrides`` (flag names; None values skipped) to scenario ``data`` in place.
    Returns ``(spec_knobs, notes)``: the knobs for the built spec, and what was rescaled."""
    from llmqueue.knobs import check, knob

    given = {k.replace("-", "_"): v for k, v in overrides.items() if v is not None}
    given = {k: check(k, v) for k, v in given.items()}
    if "chunk" in given and "max_num_batched_tokens" in given:
        raise InputError("chunk", "give --chunk or --max-num-batched-tokens, not both (they are the same knob)")
    spec_knobs: dict = {}
    notes: list = []
    for name, v in given.items():
        k = knob(name)
        if k.scenario is None:
            raise InputError(name, "cannot be applied to a scenario",
                             f"set it in the scenario file, or drop {k.flag_name} or --scenario")
        if k.scenario in ("spec", "slos"):
            spec_knobs[name] = v
        elif k.scenario_field is not None:
            section, key = k.scenario_field
            _section(data, section)[key] = _from_cwd(name, v)
    if {"duration", "num_requests", "warmup"} & set(given):
        _apply_run(data, given)
    if "trace" in given:
        _apply_trace(data, _from_cwd("trace", given["trace"]), given, notes)
    if "arrival" in given:
        _apply_arrival(data, given["arrival"], notes)
    if "rate" in given:  # every process rescaled by one factor, each keeping its shape
        scale_rate(data, given["rate"])
    if set(LENGTH_KNOBS) & set(given):
        _apply_lengths(data, {n: _from_cwd(n, v) for n, v in given.items() if n in LENGTH_KNOBS})
    return spec_knobs, notes


_SET_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*|\[\d+\]")


def _set_path(path: str) -> list:
    """``deployment.autoscalers[0].provisioning_delay_s`` -> ``["deployment", "autoscalers", 0, ...]``."""
    out: list = []
    for part in path.split("."):
        toks = _SET_PATH.findall(part)
        if not part or "".join(toks) != part or toks[0].startswith("["):
            raise InputError("set", f"{path!r} is not a field path",
                             "write KEY.KEY[INDEX].KEY=VALUE, e.g. deployment.autoscalers[0].provisioning_delay_s=300")
        out += [int(t[1:-1]) if t.startswith("[") else t for t in toks]
    return out


def apply_sets(data: dict, sets) -> None:
    """``--set PATH=VALUE`` assignments applied to scenario ``data`` in place, in order. ``PATH``
    names a field (``deployment.autoscalers[0].provisioning_delay_s``; missing mappings on the
    way are created, a list index must exist or be the list's length, which appends); ``VALUE``
    is read as YAML (``300``, ``true``, ``[]``, ``{pool: chat}``). ``deployment.autoscalers=[]``
    removes every autoscaler. The scenario is validated afterwards as if the file said so."""
    from llmqueue.scenario.load import read_yaml

    for item in sets or ():
        text = str(item)
        path, eq, raw = text.partition("=")
        path = path.strip()
        if not eq or not path:
            raise InputError("set", f"{text!r} is not PATH=VALUE", "e.g. --set deployment.autoscalers[0].target=4")
        keys = _set_path(path)
        value = read_yaml(raw, "set") if raw.strip() else None
        node, where = data, ""
        for i, k in enumerate(keys):
            last = i == len(keys) - 1
            here = f"{where}[{k}]" if isinstance(k, int) else (f"{where}.{k}" if where else k)
            if isinstance(k, int):
                if not isinstance(node, list):
                    raise InputError("set", f"{where} is not a list (in {path!r})")
                if k > len(node):
                    raise InputError("set", f"{here}: {where} has {len(node)} entries (in {path!r})",
                                     f"use an index up to {len(node)} ({len(node)} appends)")
                if k == len(node):
                    node.append(value if last else ({} if not isinstance(keys[i + 1], int) else []))
                elif last:
                    node[k] = value
            else:
                if not isinstance(node, dict):
                    raise InputError("set", f"{where} is not a mapping (in {path!r})")
                if last:
                    node[k] = value
                elif node.get(k) is None:
                    node[k] = [] if isinstance(keys[i + 1], int) else {}
            if not last:
                node = node[k]
            where = here


def _named(err: InputError, given: dict) -> InputError:
    """A validation error in an overridden field, renamed to the knob that set it."""
    from llmqueue.knobs import knob

    for name in given:
        k = knob(name)
        if k.scenario_field is None:
            continue
        path = ".".join(k.scenario_field)
        if err.field == path or err.field.startswith(path + ".") or err.field.startswith(path + "["):
            return InputError(name, err.problem, err.fix)
    return err


def scenario_with(scenario, *, rate: float | None = None, sets=(), **overrides) -> Overridden:
    """A validated scenario with field assignments ``sets`` (``PATH=VALUE``, :func:`apply_sets`),
    then knob ``overrides`` (flag names), and a new total ``rate`` (:func:`scale_rate`, applied
    after an ``arrival`` override)."""
    from llmqueue.scenario.load import validate_scenario

    data, _, path = scenario_data(scenario)
    data = copy.deepcopy(data)
    spec_knobs, notes = {}, []
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(data, dict):
        apply_sets(data, sets)
        spec_knobs, notes = apply_overrides(data, given)
        if rate is not None:
            scale_rate(data, rate)
    try:
        sc = validate_scenario(data, base_dir=path.resolve().parent, source=str(path), name=str(scenario))
    except InputError as e:
        raise _named(e, given) from None
    return Overridden(sc, spec_knobs, notes)


def overridden_rate(scenario, *, sets=(), **overrides) -> float:
    """The total arrival rate of a scenario after ``sets`` and ``overrides`` (an ``arrival`` among
    them)."""
    data, _, _ = scenario_data(scenario)
    data = copy.deepcopy(data)
    if isinstance(data, dict):
        apply_sets(data, sets)
        apply_overrides(data, overrides)
    return scenario_rate(data)
