"""Points of a plan: what one simulation of a sweep or a capacity search is, its key and its seed.

A *point* is a JSON-able dict of parameters handed to a *spec factory*, a module-level
function ``factory(**params) -> SimSpec`` (module-level so that worker processes and Ray
workers import it by name). Two factories exist:

- :func:`scenario_spec` (here): a scenario file or shipped example (``scenario="chat"``) with
  overrides: ``rate`` (total arrival rate), ``duration``, ``num_requests``, ``seed``,
  ``warmup`` and deployment knobs under the simulate command's names (``max_num_seqs``,
  ``max_num_batched_tokens`` or ``chunk``, ``step_time``, ``capacity_tokens``, ``policy``, ...);
- ``llmqueue.cli.simulate_cmd.build_spec``: the ``llmqueue simulate`` flags (every keyword it
  takes); ``llmqueue.cli.sweep_cmd.simulate_flags(**overrides)`` fills in the flags' defaults.

Arrival rate: a point's ``rate`` rescales the base arrival process to that long-run rate and
keeps its shape (:func:`scale_arrival`; with no base arrival process, Poisson): ``poisson:R``, ``gamma:R:cv=C`` (same ``cv``),
``deterministic:R``, ``onoff`` (both levels scaled, the on/off periods kept), ``piecewise``,
``spike`` and ``diurnal`` (every level scaled, the profile kept). With the flags factory the base
``arrival`` spec is rewritten; a scenario scales its total arrival process and every class's own
process by the same factor (or sets ``workload.trace.rate`` for a replayed trace).

Key: :func:`point_key` is the SHA-256 of the factory's name, the package version and the
point's full parameters (canonical JSON; a scenario contributes its file's bytes, so editing
the file changes the key). Other files a spec names (traces, ``empirical:``/``fitted:`` files)
enter by path only.

Seed: :func:`derive_seed` gives each grid point its own seed from the base seed and the point's
grid coordinates (never from its position in the grid or the backend), so the same point gets
the same stream in any order, on any backend. ``seeds="common"`` instead gives every point the
base seed: common random numbers (the same arrival uniforms rescaled in time, the same lengths),
which makes differences between points smoother (the capacity search uses it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

from llmqueue.errors import InputError

#: Deployment knobs a scenario point may override: simulate's flag name -> scenario key.
SCENARIO_KNOBS = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "chunk": "max_num_batched_tokens",
    "block_size": "block_size",
    "step_time": "step_time",
    "capacity_tokens": "capacity_tokens",
    "model": "model",
    "gpu": "gpu",
    "tensor_parallel_size": "tensor_parallel_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "enable_prefix_caching",
    "policy": "scheduling_policy",
    "max_waiting": "max_waiting",
    "max_queue_time": "max_queue_time_s",
    "replicas": "replicas",
}
_SCENARIO_RUN = ("rate", "duration", "num_requests", "seed", "warmup")


# --- arrival rates -------------------------------------------------------------------------------

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


def base_rate(factory, params: dict) -> float:
    """The long-run arrival rate of the base parameters (req/s)."""
    if _is_scenario(factory):
        data, _, _ = _scenario_data(params["scenario"])
        return _scenario_rate(data)
    arrival = params.get("arrival")
    if arrival is None:
        raise InputError("arrival", "no arrival process to take the rate from", "give --arrival, e.g. poisson:5")
    from llmqueue.workload.parse import parse_arrival

    return float(parse_arrival(arrival).rate)


# --- resolving a point into factory keywords ------------------------------------------------------

def _is_scenario(factory) -> bool:
    return getattr(factory, "__name__", "") == "scenario_spec" and factory.__module__ == __name__


def resolve(factory, base: dict, point: dict) -> dict:
    """The factory's keywords for ``point`` (grid coordinates) on top of ``base``.

    ``rate`` rewrites the flags' ``arrival`` spec (:func:`scale_arrival`) or is passed on to
    :func:`scenario_spec`; ``chunk`` and ``max_num_batched_tokens`` are one knob, so setting
    either clears the other.
    """
    params = dict(base)
    for k, v in point.items():
        if k in ("chunk", "max_num_batched_tokens") and not _is_scenario(factory):
            params["chunk"] = None
            params["max_num_batched_tokens"] = None
        if k in ("chunk", "max_num_batched_tokens") and _is_scenario(factory):
            params.pop("chunk", None)
            params.pop("max_num_batched_tokens", None)
        params[k] = v
    if "rate" in point and not _is_scenario(factory):
        rate = params.pop("rate")
        if params.get("trace") is not None:
            raise InputError("rate", "a replayed trace's rate cannot be rescaled here",
                             "use a scenario with workload.trace (it rescales to the point's rate), or drop --rates")
        # without an arrival process, a rate means Poisson arrivals at that rate
        params["arrival"] = scale_arrival(params.get("arrival") or "poisson:1", rate).spec
    return params


def check_param(factory, name: str, base: dict) -> str:
    """Normalise a swept parameter's name (``max-num-seqs`` -> ``max_num_seqs``) and check it."""
    key = name.strip().replace("-", "_")
    if key in ("rate", "seed"):
        return key
    if _is_scenario(factory):
        if key in SCENARIO_KNOBS or key in _SCENARIO_RUN:
            return key
        known = sorted({*SCENARIO_KNOBS, *_SCENARIO_RUN})
    else:
        if key in base:
            return key
        known = sorted(base)
    import difflib

    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    raise InputError("param", f"{name!r} is not a parameter of the simulation",
                     f"did you mean {near[0]!r}?" if near else f"parameters: {', '.join(known)}")


# --- keys and seeds ------------------------------------------------------------------------------

def canonical(obj) -> str:
    """Canonical JSON (sorted keys, no spaces) of a JSON-able object."""
    return json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def jsonable(obj):
    """``obj`` as plain JSON values: numpy scalars as numbers, NaN/inf as None, tuples as lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return jsonable(obj.item())
    if hasattr(obj, "tolist"):
        return jsonable(obj.tolist())
    return str(obj)


def factory_name(factory) -> str:
    return f"{factory.__module__}:{getattr(factory, '__qualname__', factory.__name__)}"


def point_key(factory, params: dict) -> str:
    """SHA-256 (hex, 20 characters) of the factory, the package version and the full parameters."""
    from llmqueue import __version__

    payload = {"factory": factory_name(factory), "version": __version__, "params": params}
    if _is_scenario(factory):
        _, text, _ = _scenario_data(params["scenario"])
        payload["scenario_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return hashlib.sha256(canonical(payload).encode()).hexdigest()[:20]


def derive_seed(base_seed: int, coords: dict) -> int:
    """A point's own seed: a 31-bit hash of the base seed and its grid coordinates."""
    h = hashlib.sha256(canonical({"seed": int(base_seed), "point": coords}).encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


# --- scenarios -----------------------------------------------------------------------------------

def _scenario_data(scenario: str):
    """``(data, text, path)`` of a scenario file or shipped example."""
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
    text = p.read_text(encoding="utf-8")
    return read_yaml(text, s), text, p


def _scenario_rate(data) -> float:
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


def scenario_with(scenario: str, *, rate: float | None = None, warmup: float | None = None, **knobs):
    """A validated :class:`~llmqueue.scenario.Scenario` with a new total rate and deployment knobs."""
    from llmqueue.scenario.load import validate_scenario

    data, _, path = _scenario_data(scenario)
    data = copy.deepcopy(data) if isinstance(data, dict) else data
    if isinstance(data, dict):
        dep = data.setdefault("deployment", {}) or {}
        data["deployment"] = dep
        for k, v in knobs.items():
            if k not in SCENARIO_KNOBS:
                raise InputError(k, "is not a deployment knob a scenario point can set",
                                 f"knobs: {', '.join(sorted(SCENARIO_KNOBS))}")
            if v is None:
                continue
            dep[SCENARIO_KNOBS[k]] = v
        if warmup is not None:
            data.setdefault("run", {})["warmup_s"] = warmup
        if rate is not None:
            w = data.get("workload") or {}
            if w.get("trace") is not None:
                w["trace"]["rate"] = rate
            else:
                f = rate / _scenario_rate(data)
                from llmqueue.workload.parse import parse_arrival

                if w.get("arrival") is not None:
                    a = parse_arrival(w["arrival"])
                    w["arrival"] = scale_arrival(a, a.rate * f).spec
                for c in w.get("classes") or ():
                    if isinstance(c, dict) and c.get("arrival") is not None:
                        a = parse_arrival(c["arrival"])
                        c["arrival"] = scale_arrival(a, a.rate * f).spec
    return validate_scenario(data, base_dir=path.resolve().parent, source=str(path), name=str(scenario))


def scenario_spec(*, scenario: str, rate: float | None = None, duration: float | None = None,
                  num_requests: int | None = None, seed: int | None = None, warmup: float | None = None,
                  **knobs):
    """A :class:`~llmqueue.simulate.SimSpec` from a scenario with overrides (a spec factory).

    ``duration``/``num_requests`` replace the file's run length, ``seed`` its seed, ``warmup``
    its warm-up; ``rate`` rescales the total arrival rate (:func:`scenario_with`); other keywords
    are deployment knobs under the simulate command's names (:data:`SCENARIO_KNOBS`).
    """
    from llmqueue.simulate import spec_from_scenario

    sc = scenario_with(scenario, rate=rate, warmup=warmup, **knobs)
    if duration is not None and sc.run.warmup_s >= duration:
        raise InputError("duration", f"{duration:g} s is not longer than the warm-up ({sc.run.warmup_s:g} s)",
                         "give a longer --duration or a shorter --warmup")
    return spec_from_scenario(sc, seed=seed, duration_s=duration, num_requests=num_requests)
