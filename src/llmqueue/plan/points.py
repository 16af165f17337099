"""Points of a plan: what one simulation of a sweep or a capacity search is, its key and its seed.

A *point* is a JSON-able dict of parameters handed to a *spec factory*, a module-level
function ``factory(**params) -> SimSpec`` (module-level so that worker processes and Ray
workers import it by name). Two factories exist:

- :func:`llmqueue.spec.scenario_spec`: a scenario file or shipped example (``scenario="chat"``)
  with overrides: ``rate`` (total arrival rate) and any knob of :data:`SCENARIO_KNOBS` under its
  flag name (``max_num_seqs``, ``chunk``, ``policy``, ``arrival``, ``duration``, ``seed``, ...);
- :func:`llmqueue.spec.build_spec`: the knobs alone (:mod:`llmqueue.knobs`);
  :func:`llmqueue.knobs.flag_defaults` (``**overrides``) gives every knob with its default.

Arrival rate: a point's ``rate`` rescales the base arrival process to that long-run rate and
keeps its shape (:func:`scale_arrival`; with no base arrival process, Poisson): ``poisson:R``, ``gamma:R:cv=C`` (same ``cv``),
``deterministic:R``, ``onoff`` (both levels scaled, the on/off periods kept), ``piecewise``,
``spike`` and ``diurnal`` (every level scaled, the profile kept). With the flags factory the base
``arrival`` spec is rewritten; a scenario scales its total arrival process and every class's own
process by the same factor (or sets ``workload.trace.rate`` for a replayed trace).

Key: :func:`point_key` is the SHA-256 of the factory's name, the package version and the
point's full parameters (canonical JSON; a scenario contributes its file's bytes, so editing
the file changes the key, and the bytes of the files its workload names, :func:`scenario_files`:
a replayed trace, joint or empirical lengths). Other files a parameter names (``fitted:FILE``, ``profile:DIR``, a
trace: any string value ``PATH`` or ``HEAD:PATH`` whose path exists) contribute their bytes
too (a directory: every file under it), so a recalibrated step model is not answered from the
cache. The SLO targets are not in the key: a point's simulation does not depend on them, and
the judgement is made afresh from its summary.

Seed: :func:`derive_seed` gives each grid point its own seed from the base seed and the point's
grid coordinates (never from its position in the grid or the backend), so the same point gets
the same stream in any order, on any backend. ``seeds="common"`` instead gives every point the
base seed: common random numbers (the same arrival uniforms rescaled in time, the same lengths),
which makes differences between points smoother (the capacity search uses it).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from llmqueue.errors import InputError
from llmqueue.knobs import KNOBS, flag_knobs
from llmqueue.scenario.override import scale_arrival, scenario_data as _scenario_data
from llmqueue.spec import build_spec, fitted_arrival, rate_arrival, scenario_spec

__all__ = ["SCENARIO_KNOBS", "base_rate", "build_spec", "canonical", "check_param", "derive_seed", "factory_name",
           "jsonable", "point_key", "resolve", "scale_arrival", "scenario_spec"]

#: Knobs a scenario point may override: flag name -> where it goes (see :mod:`llmqueue.knobs`).
SCENARIO_KNOBS = {k.name: k.scenario for k in KNOBS if k.scenario}


def base_rate(factory, params: dict) -> float:
    """The long-run arrival rate of the base parameters (req/s)."""
    if _is_scenario(factory):
        from llmqueue.scenario.override import overridden_rate

        knobs = {k: v for k, v in params.items() if k not in ("scenario", "rate")}
        return overridden_rate(params["scenario"], **knobs)
    arrival = params.get("arrival") or fitted_arrival(params.get("workload"))
    if arrival is None:
        raise InputError("arrival", "no arrival process to take the rate from", "give --arrival, e.g. poisson:5")
    from llmqueue.workload.parse import parse_arrival

    return float(parse_arrival(arrival).rate)


# --- resolving a point into factory keywords ------------------------------------------------------

def _is_scenario(factory) -> bool:
    return factory is scenario_spec


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
        params["arrival"] = rate_arrival(rate, params.get("arrival"), params.get("workload"))
    return params


def check_param(factory, name: str, base: dict) -> str:
    """Normalise a swept parameter's name (``max-num-seqs`` -> ``max_num_seqs``) and check it."""
    key = name.strip().replace("-", "_")
    if key in ("rate", "seed"):
        return key
    if _is_scenario(factory):
        if key in SCENARIO_KNOBS:
            return key
        known = sorted(SCENARIO_KNOBS)
    else:
        flags = {k.name for k in flag_knobs()}
        if key in base or key in flags:
            return key
        known = sorted(flags)
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
        data, text, path = _scenario_data(params["scenario"])
        payload["scenario_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        named = scenario_files(data, Path(path).resolve().parent)
        if named:
            payload["scenario_files_sha256"] = named
    files = {k: h for k, v in params.items() if k != "scenario" and (h := _file_digest(v)) is not None}
    if files:
        payload["files_sha256"] = files
    return hashlib.sha256(canonical(payload).encode()).hexdigest()[:20]


def scenario_files(data, base: Path) -> dict:
    """SHA-256 of each file a scenario's workload names (``workload.trace.path``, the ``joint:`` /
    ``empirical:`` length files of the workload and its classes; relative to ``base``, the
    scenario's directory), by field: a replayed trace edited in place changes the key."""
    w = data.get("workload") if isinstance(data, dict) else None
    if not isinstance(w, dict):
        return {}
    found = {}
    tr = w.get("trace")
    if isinstance(tr, dict) and isinstance(tr.get("path"), str):
        found["workload.trace.path"] = tr["path"]
    sections = [("workload", w)] + [(f"workload.classes[{i}]", c) for i, c in enumerate(w.get("classes") or [])
                                    if isinstance(c, dict)]
    for where, sec in sections:
        for k in ("prompt", "output", "lengths"):
            v = sec.get(k)
            if isinstance(v, str) and v.strip().split(":", 1)[0].lower() in ("joint", "empirical"):
                found[f"{where}.{k}"] = v.strip().split(":")[1]
    out = {}
    for k, f in found.items():
        p = Path(f).expanduser()
        h = _file_digest(str(p if p.is_absolute() else base / p))
        if h is not None:
            out[k] = h
    return out


def _file_digest(value) -> str | None:
    """SHA-256 of the file (or of every file under the directory) a parameter value names:
    ``PATH`` or ``HEAD:PATH``; None when it names none."""
    if not isinstance(value, str) or not value.strip() or len(value) > 4096 or "\n" in value:
        return None
    text = value.strip()
    for cand in (text, text.partition(":")[2]):
        if not cand:
            continue
        p = Path(cand).expanduser()
        try:
            if p.is_file():
                return hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_dir():
                h = hashlib.sha256()
                for f in sorted(x for x in p.rglob("*") if x.is_file()):
                    h.update(str(f.relative_to(p)).encode() + b"\0" + f.read_bytes())
                return h.hexdigest()
        except OSError:
            return None
    return None


def derive_seed(base_seed: int, coords: dict) -> int:
    """A point's own seed: a 31-bit hash of the base seed and its grid coordinates."""
    h = hashlib.sha256(canonical({"seed": int(base_seed), "point": coords}).encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF
