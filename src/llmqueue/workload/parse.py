"""``parse_length``, ``parse_arrival``, ``parse_joint``: spec strings to workload objects.

The grammar is in :mod:`llmqueue.workload.spec`. Forms (positional order; ``[...]`` optional;
every parameter may also be given as ``key=value``):

Length distributions (``parse_length``)::

    fixed:N
    uniform:LO:HI
    normal:MEAN:SD[:MIN[:MAX]]              keys mean, sd, min, max
    lognormal:MEAN:SD[:MIN[:MAX]]           keys mean, sd, min, max; or mu=, sigma= (of the log)
    empirical:PATH[:column=NAME]

A bare number ``N`` means ``fixed:N``.

Arrival processes (``parse_arrival``)::

    poisson:RATE
    gamma:RATE:CV                            key cv
    deterministic:RATE                       alias fixed:RATE
    onoff:RATE:ON:OFF[:RATE_OFF]             keys rate, on, off, rate_off

A bare number ``R`` means ``poisson:R`` (like ``vllm bench serve --request-rate``).

Time-varying arrival processes (``parse_arrival``; :mod:`llmqueue.workload.nonstationary`),
non-homogeneous Poisson, or modulated Gamma with ``cv=``::

    piecewise:RATE@START,RATE@START,...[:period=P]   windows from START s, first at 0
    piecewise:RATE,RATE,...:window=W[:period=P]       equal windows of W s
    piecewise:...:period=P:counts=fixed              each window gets its expected count
    diurnal:MEAN:AMP[:PERIOD[:PHASE]]                keys mean, amp, period (86400), phase
    spike:RATE:K:AT:FOR[:period=P]                   keys rate, k, at, for

each with optional ``cv=CV`` (Gamma gaps in operational time; 1 = Poisson) and ``gaps=h2``
(balanced-means hyperexponential gaps instead, cv >= 1).

Joint lengths (``parse_joint``)::

    joint:PATH[:prompt=COL][:output=COL]

Objects of the right type pass through unchanged, so library functions can accept either.
"""

from __future__ import annotations

import math
from numbers import Real

from llmqueue.errors import InputError
from llmqueue.workload.spec import Form, fmt, is_number, spec_error, split_spec, wrap

_F = "float"
_I = "int"
_S = "str"

LENGTH_FORMS: dict[str, Form] = {
    "fixed": Form("fixed", (("n", _I),), 1, ("n",), "fixed:N", "fixed:512"),
    "uniform": Form("uniform", (("lo", _I), ("hi", _I)), 2, ("lo", "hi"), "uniform:LO:HI",
                    "uniform:10:1600"),
    "normal": Form("normal", (("mean", _F), ("sd", _F), ("min", _I), ("max", _I)), 4,
                   ("mean", "sd"), "normal:mean=M:sd=S[:min=A][:max=B]", "normal:mean=800:sd=200"),
    "lognormal": Form("lognormal", (("mean", _F), ("sd", _F), ("min", _I), ("max", _I), ("mu", _F),
                                    ("sigma", _F)), 4, (),
                      "lognormal:mean=M:sd=S[:min=A][:max=B] (or mu=:sigma= of the log)",
                      "lognormal:mean=600:sd=400:max=8192"),
    "geometric": Form("geometric", (("mean", _F), ("max", _I)), 2, ("mean",), "geometric:mean=M[:max=B]",
                      "geometric:mean=300"),
    "empirical": Form("empirical", (("path", _S), ("column", _S)), 1, ("path",),
                      "empirical:PATH[:column=NAME]", "empirical:lengths.csv:column=prompt_tokens",
                      path=True),
}

_DET = Form("deterministic", (("rate", _F),), 1, ("rate",), "deterministic:RATE", "deterministic:5")
ARRIVAL_FORMS: dict[str, Form] = {
    "poisson": Form("poisson", (("rate", _F),), 1, ("rate",), "poisson:RATE", "poisson:5"),
    "gamma": Form("gamma", (("rate", _F), ("cv", _F)), 2, ("rate", "cv"), "gamma:RATE:cv=CV",
                  "gamma:5:cv=2"),
    "deterministic": _DET,
    "fixed": _DET,
    "onoff": Form("onoff", (("rate", _F), ("on", _F), ("off", _F), ("rate_off", _F)), 4,
                  ("rate", "on", "off"), "onoff:RATE:on=SECONDS:off=SECONDS[:rate_off=R]",
                  "onoff:20:on=30:off=90"),
}

#: Time-varying rates (:mod:`llmqueue.workload.nonstationary`); kept apart from ARRIVAL_FORMS so
#: that messages list the stationary and the time-varying processes separately.
TIME_VARYING_FORMS: dict[str, Form] = {
    "piecewise": Form("piecewise", (("windows", _S), ("window", _F), ("period", _F), ("cv", _F),
                                    ("gaps", _S), ("counts", _S)), 1, ("windows",),
                      "piecewise:RATE@START,...[:period=P][:cv=CV][:gaps=gamma|h2]"
                      "[:counts=random|fixed] or piecewise:RATE,...:window=W[:...]",
                      "piecewise:5@0,10@3600,5@4200"),
    "diurnal": Form("diurnal", (("mean", _F), ("amp", _F), ("period", _F), ("phase", _F), ("cv", _F),
                                ("gaps", _S)), 4, ("mean", "amp"),
                    "diurnal:mean=R:amp=A[:period=86400][:phase=S][:cv=CV][:gaps=gamma|h2]",
                    "diurnal:mean=5:amp=0.5:period=86400"),
    "spike": Form("spike", (("rate", _F), ("k", _F), ("at", _F), ("for", _F), ("period", _F),
                            ("cv", _F), ("gaps", _S)), 4, ("rate", "k", "at", "for"),
                  "spike:RATE:k=K:at=T:for=D[:period=P][:cv=CV][:gaps=gamma|h2]",
                  "spike:5:k=2:at=43200:for=600"),
}

JOINT_FORMS: dict[str, Form] = {
    "joint": Form("joint", (("path", _S), ("prompt", _S), ("output", _S)), 1, ("path",),
                  "joint:PATH[:prompt=COL][:output=COL]",
                  "joint:trace.csv:prompt=ContextTokens:output=GeneratedTokens", path=True),
}


def _number_to_text(spec, field: str):
    """A bare number (e.g. from a YAML config) as spec text; NaN and infinities are rejected."""
    if isinstance(spec, Real) and not isinstance(spec, bool):
        if not math.isfinite(float(spec)):
            raise InputError(field, f"must be a finite number or a spec string (got {spec!r})")
        return fmt(spec)
    return spec


def parse_length(spec, field: str = "prompt"):
    """A :class:`~llmqueue.workload.lengths.LengthDist` from a spec such as ``uniform:10:1600``.

    ``field`` names the caller's option in errors (``prompt``, ``output``); for ``empirical``
    files with several columns it also picks the known prompt or output column.
    """
    from llmqueue.workload import lengths as L

    if isinstance(spec, L.LengthDist):
        return spec
    spec = _number_to_text(spec, field)
    if isinstance(spec, str) and is_number(spec):
        spec = f"fixed:{spec.strip()}"
    form, v = split_spec(spec, field, LENGTH_FORMS, "length distribution")
    text = spec.strip()
    try:
        if form.name == "fixed":
            return L.Fixed(v["n"])
        if form.name == "uniform":
            return L.Uniform(v["lo"], v["hi"])
        if form.name == "normal":
            return L.Normal(v["mean"], v["sd"], min=v.get("min", 1), max=v.get("max"))
        if form.name == "lognormal":
            if not (("mean" in v and "sd" in v) or ("mu" in v and "sigma" in v)) or \
                    ("mean" in v or "sd" in v) and ("mu" in v or "sigma" in v):
                raise spec_error(field, text, "lognormal needs mean=:sd= (of the token count) or "
                                 "mu=:sigma= (of its log), one pair", form)
            return L.LogNormal(v.get("mean"), v.get("sd"), mu=v.get("mu"), sigma=v.get("sigma"),
                               min=v.get("min", 1), max=v.get("max"))
        if form.name == "geometric":
            return L.Geometric(v["mean"], max=v.get("max"))
        return L.Empirical.from_file(v["path"], v.get("column"),
                                     role=field if field in ("prompt", "output") else None)
    except InputError as e:
        if e.problem.startswith("cannot parse"):
            raise
        raise wrap(field, text, form, e) from None


def parse_arrival(spec, field: str = "arrival"):
    """An :class:`~llmqueue.workload.arrivals.ArrivalProcess` from a spec such as ``poisson:5``."""
    from llmqueue.workload import arrivals as A

    if isinstance(spec, A.ArrivalProcess):
        return spec
    spec = _number_to_text(spec, field)
    if isinstance(spec, str) and is_number(spec):
        spec = f"poisson:{spec.strip()}"
    if isinstance(spec, str):
        name = spec.strip().partition(":")[0].strip().lower()
        if name in TIME_VARYING_FORMS:
            return _parse_time_varying(spec, field)
        if spec.strip() and name not in ARRIVAL_FORMS:
            raise spec_error(field, spec.strip(), f"unknown arrival process {name!r} (valid: "
                             f"{', '.join(sorted(ARRIVAL_FORMS))}; time-varying: "
                             f"{', '.join(sorted(TIME_VARYING_FORMS))})",
                             forms={**ARRIVAL_FORMS, **TIME_VARYING_FORMS})
    form, v = split_spec(spec, field, ARRIVAL_FORMS, "arrival process")
    try:
        if form.name == "poisson":
            return A.Poisson(v["rate"])
        if form.name == "gamma":
            return A.Gamma(v["rate"], v["cv"])
        if form.name == "deterministic":
            return A.Deterministic(v["rate"])
        return A.OnOff(v["rate"], v["on"], v["off"], v.get("rate_off", 0.0))
    except InputError as e:
        raise wrap(field, spec.strip(), form, e) from None


def _parse_time_varying(spec: str, field: str):
    from llmqueue.workload import nonstationary as N

    form, v = split_spec(spec, field, TIME_VARYING_FORMS, "arrival process")
    law = dict(cv=v.get("cv", 1.0), gaps=v.get("gaps", "gamma"))
    try:
        if form.name == "piecewise":
            return N.Piecewise.from_text(v["windows"], window=v.get("window"), period=v.get("period"),
                                         counts=v.get("counts", "random").lower(), **law)
        if form.name == "diurnal":
            return N.Diurnal(v["mean"], v["amp"], period=v.get("period", 86400.0),
                             phase=v.get("phase", 0.0), **law)
        return N.Spike(v["rate"], v["k"], v["at"], v["for"], period=v.get("period"), **law)
    except InputError as e:
        raise wrap(field, spec.strip(), form, e) from None


def parse_joint(spec, field: str = "lengths"):
    """A :class:`~llmqueue.workload.joint.JointLengths` from ``joint:PATH[:prompt=COL:output=COL]``."""
    from llmqueue.workload.joint import JointLengths

    if isinstance(spec, JointLengths):
        return spec
    form, v = split_spec(spec, field, JOINT_FORMS, "joint length source")
    try:
        return JointLengths.from_file(v["path"], v.get("prompt"), v.get("output"))
    except InputError as e:
        raise wrap(field, spec.strip(), form, e) from None
