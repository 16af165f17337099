"""Workloads: requests, arrival processes, token-length distributions, joint lengths, generation.

Pure data and seeded random numbers; nothing here knows about engines. Everything is built from
one compact spec syntax shared by CLI flags and config files (see :mod:`.spec` and
:mod:`.parse`)::

    from llmqueue.workload import Workload
    w = Workload("poisson:5", prompt="uniform:10:1600", output="lognormal:mean=300:sd=200")
    reqs = w.generate(seed=1, n=1_000_000)      # columnar RequestArrays

Submodules: ``request`` (Request), ``spec`` (grammar), ``parse`` (parse_length, parse_arrival,
parse_joint), ``lengths`` (Fixed, Uniform, Normal, LogNormal, Empirical, Discrete),
``arrivals`` (Poisson, Gamma, Deterministic, OnOff), ``nonstationary`` (Piecewise, Diurnal,
Spike: time-varying rates), ``fit`` (fit_workload, load_fitted, FittedWorkload), ``joint`` (JointLengths), ``trace`` (Trace), ``traces``
(load_trace, write_trace, read_trace, replay transforms), ``stats`` (trace_stats, spec_stats), ``tables``
(file reading), ``generate`` (Workload, RequestArrays).

Names are imported lazily on first use, so ``import llmqueue.workload`` stays cheap.
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports


_EXPORTS = {
    "Request": "request",
    "parse_length": "parse",
    "parse_arrival": "parse",
    "parse_joint": "parse",
    "LengthDist": "lengths",
    "Fixed": "lengths",
    "Uniform": "lengths",
    "Normal": "lengths",
    "LogNormal": "lengths",
    "Empirical": "lengths",
    "Discrete": "lengths",
    "ArrivalProcess": "arrivals",
    "Poisson": "arrivals",
    "Gamma": "arrivals",
    "Deterministic": "arrivals",
    "OnOff": "arrivals",
    "TimeVarying": "nonstationary",
    "Piecewise": "nonstationary",
    "Diurnal": "nonstationary",
    "Spike": "nonstationary",
    "fit_workload": "fit",
    "load_fitted": "fit",
    "FittedWorkload": "fit",
    "Trace": "trace",
    "load_trace": "traces",
    "detect_format": "traces",
    "write_trace": "traces",
    "read_trace": "traces",
    "time_scale": "traces",
    "rescale_rate": "traces",
    "window": "traces",
    "loop": "traces",
    "trace_to_requests": "traces",
    "trace_from_requests": "traces",
    "TraceStats": "stats",
    "trace_stats": "stats",
    "spec_stats": "stats",
    "JointLengths": "joint",
    "Workload": "generate",
    "RequestArrays": "generate",
    "RequestClass": "classes",
    "ClassMix": "classes",
    "SLO": "classes",
    "ClientBehavior": "client",
    "RetryPolicy": "client",
    "BoundClient": "client",
    "retry_amplification": "client",
    "retry_success_probability": "client",
    "jitter_uniform": "client",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ())
