"""``vllm bench serve``'s flags as ``llmqueue bench`` understands them: each value parsed and
checked in one line naming the flag (:class:`~llmqueue.errors.InputError`), and each alias mapped
to the native knob (``--request-rate``/``--burstiness`` to an arrival process,
``--max-concurrency`` to ``--concurrency``, ``--num-prompts`` to ``--num-requests``).

vLLM's meanings (``vllm/benchmarks/serve.py``):

- ``--request-rate R``: requests per second; ``inf`` sends every request at time 0. Finite: the
  gaps are Gamma with shape ``burstiness`` and mean ``1/R`` (``--burstiness 1``: Poisson;
  ``inf``: evenly spaced), i.e. llmqueue's ``gamma:R:cv=1/sqrt(burstiness)``; with a number of
  requests the times are then scaled so that the last one is at ``N/R``, as vLLM scales them.
- ``--goodput ttft:MS tpot:MS e2el:MS``: per-request thresholds (ms); a request is good when it
  meets all of them (TPOT 0 for one output token).
- ``--percentile-metrics ttft,tpot,itl,e2el`` and ``--metric-percentiles 25,50,99``: which
  metrics and percentiles the result file reports (the percentiles also become the summary's).
"""

from __future__ import annotations

import json
import math

from llmqueue.errors import InputError

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
#: flags that take several values after one flag name (vLLM's ``nargs="+"``)
MULTI_VALUE_FLAGS = ("--goodput",)


def expand_multi(args: list[str]) -> list[str]:
    """``--goodput a b`` (vLLM's spelling) as ``--goodput a --goodput b``: values after the flag
    up to the next one starting with ``-`` each get the flag."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        out.append(a)
        i += 1
        if a == "--":
            out += args[i:]
            break
        if a in MULTI_VALUE_FLAGS:
            if i < len(args):
                out.append(args[i])
                i += 1
            while i < len(args) and not args[i].startswith("-"):
                out += [a, args[i]]
                i += 1
    return out


def parse_request_rate(text: str) -> float:
    """A positive rate (req/s) or ``inf``."""
    try:
        r = float(str(text).strip())
    except ValueError:
        raise InputError("request_rate", f"{text!r} is not a number", "give requests per second, e.g. 20, "
                         "or inf (every request at once)") from None
    if not r > 0:  # NaN too
        raise InputError("request_rate", f"must be > 0 or inf (got {text})", "e.g. 20, or inf")
    return r


def arrival_spec(rate: float, burstiness: float) -> str:
    """llmqueue's arrival spec of vLLM's ``--request-rate`` (finite) and ``--burstiness``."""
    if burstiness == math.inf:
        return f"deterministic:{rate!r}"
    if burstiness == 1.0:
        return f"poisson:{rate!r}"
    return f"gamma:{rate!r}:cv={1 / math.sqrt(burstiness)!r}"


def check_burstiness(b: float) -> float:
    if not b > 0:
        raise InputError("burstiness", f"must be > 0 (got {b})", "1: Poisson; < 1 burstier; > 1 more even")
    return float(b)


def parse_goodput(items) -> dict:
    """``("ttft:500", "tpot:50")`` -> ``{"ttft_ms": 500.0, "tpot_ms": 50.0}`` (summarize's slos)."""
    out: dict = {}
    for item in items:
        for part in str(item).split():
            name, sep, val = part.partition(":")
            name = name.strip().lower()
            if not sep or name not in GOODPUT_METRICS:
                raise InputError("goodput", f"{part!r} is not METRIC:MS with METRIC one of {', '.join(GOODPUT_METRICS)}",
                                 "e.g. --goodput ttft:500 tpot:50")
            try:
                ms = float(val)
            except ValueError:
                raise InputError("goodput", f"{part!r}: {val!r} is not a number of milliseconds",
                                 "e.g. --goodput ttft:500") from None
            if not (math.isfinite(ms) and ms >= 0):
                raise InputError("goodput", f"{part!r}: must be a finite number >= 0 of milliseconds")
            if f"{name}_ms" in out:
                raise InputError("goodput", f"{name} given twice")
            out[f"{name}_ms"] = ms
    return out


def parse_percentile_metrics(text: str) -> tuple:
    from llmqueue.bench.vllm_result import PERCENTILE_METRICS

    names = [x.strip().lower() for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in PERCENTILE_METRICS]
    if not names or bad:
        raise InputError("percentile_metrics", f"unknown metric {bad[0]!r}" if bad else "is empty",
                         f"a comma-separated list of {', '.join(PERCENTILE_METRICS)}")
    return tuple(dict.fromkeys(names))


def parse_metric_percentiles(text: str) -> tuple:
    out = []
    for x in str(text).split(","):
        try:
            p = float(x)
        except ValueError:
            raise InputError("metric_percentiles", f"{x.strip()!r} is not a number", "e.g. 25,50,99") from None
        if not 0 < p <= 100:
            raise InputError("metric_percentiles", f"{x.strip()} is not in (0, 100]", "e.g. 25,50,99")
        out.append(int(p) if p == int(p) else p)
    return tuple(sorted(set(out)))


def parse_extra_body(text: str) -> dict:
    try:
        d = json.loads(text)
    except ValueError as e:
        raise InputError("extra_body", f"is not valid JSON ({e})",
                         "give a JSON object, e.g. '{\"temperature\": 0}'") from None
    if not isinstance(d, dict):
        raise InputError("extra_body", f"must be a JSON object (got {type(d).__name__})",
                         "e.g. '{\"temperature\": 0}'")
    return d


def one_of(native: str, alias: str, native_value, alias_value):
    """The value of a knob given by its native flag or its vLLM alias; both: one-line error."""
    if native_value is not None and alias_value is not None:
        raise InputError(alias, f"--{alias.replace('_', '-')} is vLLM's name for --{native.replace('_', '-')}: "
                         "give one of them", f"drop --{native.replace('_', '-')} or --{alias.replace('_', '-')}")
    return alias_value if alias_value is not None else native_value
