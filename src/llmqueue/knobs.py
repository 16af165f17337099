"""Every engine, workload and run knob, declared once: name, type, default, help, unit.

:data:`KNOBS` is the one table. From it come

- the command-line flags of ``simulate``, ``sweep``, ``capacity``, ``validate`` (and the workload
  flags of ``bench``): :func:`llmqueue.cli.flags.knob_options`, ``--max-num-seqs`` for
  ``max_num_seqs``, ``--x/--no-x`` for a boolean;
- the fields of a scenario file's ``deployment:`` and ``run:`` sections
  (:mod:`llmqueue.scenario.model`), under the name the file uses (``scenario``: the field's
  path, e.g. ``deployment.scheduling_policy`` for ``policy``);
- the keywords and defaults of the flags-to-spec builder (:func:`llmqueue.spec.build_spec`)
  and the knobs a scenario point may override (:data:`llmqueue.plan.points.SCENARIO_KNOBS`).

Defaults follow vLLM v1's OpenAI server (``vllm serve``) where vLLM has the knob; the help says
where and why one differs. ``None`` means "derived", and the help says from what.

``scenario``: where the knob lives in a scenario file; ``"workload"`` (arrival and lengths,
rewritten by :mod:`llmqueue.scenario.override`), ``"slos"`` (the SLO thresholds), ``"spec"``
(not in the file: applied to the built :class:`~llmqueue.simulate.SimSpec`), or ``None`` (it
cannot apply to a scenario; given with ``--scenario`` it is an error).

Another table of knobs uses the same :class:`Knob` declaration, flags and checks: the options of
a benchmark run against a real server (:data:`llmqueue.bench.options.OPTIONS`, whose fields make
:class:`~llmqueue.bench.options.BenchOptions`).
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmqueue.errors import InputError

GROUPS = ("engine", "workload", "run")


def load_registry(path: str) -> dict:
    """The registry ``"module:NAME"`` (a dict by name of help lines, or of policies or forms with
    ``help``), imported on first use: a knob's choices and help read it, and ``llmqueue kv``
    starts without the simulator."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Knob:
    """One knob. ``type``: ``int``, ``float``, ``bool``, ``str``, or ``object`` (a spec given as
    text on the command line, text or a number in a scenario file). ``text``: its help, which
    lists the entries of ``registry`` (``"module:NAME"``, see :func:`load_registry`: a ``str``
    knob's value is one of their names, an ``object`` knob's a spec of one of their forms). ``ge``/``gt``/``le``: bounds
    (checked by :func:`check` and by the scenario's fields). ``flag``: whether commands take it
    as a flag (``replicas``, ``preemption_mode``: scenario files only). ``alias_of``: another
    name for that knob (``chunk``).

    Checks beyond the bounds: ``problem``, what a number that fails its bounds (or is NaN, or
    infinite where ``allow_inf`` is false) is told, instead of the bound itself; ``per_class``:
    the value may also be a ``{class: value}`` mapping, each value checked; ``check``: a function
    checking (and returning) a value the bounds cannot judge (a URL). On the command line:
    ``parse`` turns the flag's text into the value (a JSON object); ``flag_unset``: the flag
    holds None when not given (the command decides, and the help says what applies);
    ``switch``: a boolean flag without ``--no-x``; ``multiple``: repeatable; ``envvar``: read from
    that environment variable when not given."""

    name: str
    type: type
    default: Any
    text: str
    unit: str | None = None
    group: str = "engine"
    scenario: str | None = None
    registry: str | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    flag: bool = True
    alias_of: str | None = None
    metavar: str | None = None
    flag_as: str | None = None   # the flag's name when it is not the knob's (``--prompt-len`` for ``prompt``)
    old_flags: tuple = ()        # earlier names of the flag: still accepted, not shown in --help
    problem: str | None = None
    allow_inf: bool = False
    per_class: bool = False
    check: Callable[[Any], Any] | None = None
    parse: Callable[[str], Any] | None = None
    flag_unset: bool = False
    switch: bool = False
    multiple: bool = False
    envvar: str | None = None

    @property
    def choices(self) -> tuple:
        """The names a ``str`` knob with a registry takes (empty: any value)."""
        return tuple(load_registry(self.registry)) if self.registry and self.type is str else ()

    @property
    def help(self) -> str:
        """``text``, then the registry's entries, each with its line of help."""
        if not self.registry:
            return self.text
        shown = {getattr(v, "usage", k): v if isinstance(v, str) else v.help
                 for k, v in load_registry(self.registry).items()}
        return f"{self.text} " + ", ".join(f"{k} ({h})" for k, h in shown.items()) + "."

    @property
    def flag_name(self) -> str:
        return self.flag_as or "--" + self.name.replace("_", "-")

    @property
    def scenario_field(self) -> tuple[str, str] | None:
        """``(section, key)`` of a scenario file's field holding this knob, or None."""
        if self.scenario and "." in self.scenario:
            section, key = self.scenario.split(".", 1)
            return section, key
        return None


_VLLM = "vLLM's default"

KNOBS: tuple[Knob, ...] = (
    # --- the model and the hardware ---------------------------------------------------------------
    Knob("model", str, None, "Model: catalog name or a Hugging Face config.json. With --gpu it gives the KV "
         "capacity M (vLLM's arithmetic) and the roofline step time.", scenario="deployment.model", metavar="NAME"),
    Knob("gpu", str, None, "GPU (catalog name, `llmqueue kv --list`); required with --model unless "
         "--capacity-tokens gives M and --step-time the step time (vLLM runs on the GPU it finds: no default).",
         scenario="deployment.gpu", metavar="NAME"),
    Knob("tensor_parallel_size", int, 1, f"GPUs per pipeline stage ({_VLLM}); a replica has tensor_parallel_size "
         "x pipeline_parallel_size GPUs.", scenario="deployment.tensor_parallel_size", ge=1),
    Knob("pipeline_parallel_size", int, 1, f"Pipeline stages per replica ({_VLLM}): the layers, weights and KV "
         "split over the stages; a step crosses them one after the other (the roofline pays the sends, "
         "not a shorter step).", scenario="deployment.pipeline_parallel_size", ge=1),
    Knob("replicas", int, 1, "Replicas of the engine on one clock behind --router (a fleet); with --scenario, "
         "the scenario's deployment.replicas. At most 4,096 (each replica is simulated: memory and time grow "
         "with the count).",
         scenario="deployment.replicas", ge=1, le=4096),
    Knob("router", str, "random", "How a fleet (--replicas > 1) routes:", scenario="spec",
         registry="llmqueue.cluster.routers:ROUTER_HELP"),
    Knob("disaggregate", str, None, "Prefill/decode disaggregation: P:D (e.g. 2:3) replicas of the engine, P "
         "computing prompts and first tokens and D decoding, the KV crossing a link (--kv-link-gbps, "
         "--kv-link-latency-ms); --router routes within each pool. Not with --replicas > 1; a scenario "
         "describes P/D in deployment.pools and deployment.disaggregation.", metavar="P:D"),
    Knob("kv_link_gbps", float, None, "P/D: bandwidth of the link carrying each request's KV from prefill to "
         "decode (transfers queue on it). Default: free (infinite). With --scenario it replaces "
         "deployment.disaggregation.kv_link_gbps.", unit="Gbit/s", scenario="spec", gt=0, metavar="GBPS"),
    Knob("kv_link_latency_ms", float, 0.0, "P/D: propagation latency of the KV link, added to every transfer. "
         "With --scenario it replaces deployment.disaggregation.kv_link_latency_ms.", unit="ms", scenario="spec",
         ge=0),
    # --- the scheduler ----------------------------------------------------------------------------
    Knob("max_num_seqs", int, 256, f"At most this many requests run (hold KV) at once ({_VLLM} on a large GPU).",
         scenario="deployment.max_num_seqs", ge=1),
    Knob("max_num_batched_tokens", int, 8192, "Per-step token budget, the prefill chunk with chunked prefill "
         "(vLLM v1's default for the OpenAI server on a large GPU).", unit="tokens",
         scenario="deployment.max_num_batched_tokens", ge=1),
    Knob("chunk", int, None, "Prefill chunk = per-step token budget (alias of --max-num-batched-tokens).",
         unit="tokens", scenario="deployment.max_num_batched_tokens", ge=1, alias_of="max_num_batched_tokens"),
    Knob("block_size", int, 16, f"KV block size ({_VLLM}).", unit="tokens", scenario="deployment.block_size", ge=1),
    Knob("gpu_memory_utilization", float, 0.9, f"Share of GPU memory for weights and KV cache ({_VLLM}).",
         scenario="deployment.gpu_memory_utilization", gt=0, le=1),
    Knob("enable_chunked_prefill", bool, True, "Split long prompts across steps (on by default in vLLM v1).",
         scenario="deployment.enable_chunked_prefill"),
    Knob("long_prefill_token_threshold", int, 0, f"Cap on one request's prefill chunk per step (0: off, {_VLLM}).",
         unit="tokens", scenario="deployment.long_prefill_token_threshold", ge=0),
    Knob("max_model_len", int, None, "Reject prompt + output above this (vLLM answers 400). Default: the model's "
         "context length (vLLM's), no limit without --model; 0: no limit.", unit="tokens",
         scenario="deployment.max_model_len", ge=0),
    Knob("enable_prefix_caching", bool, False, "Reuse the KV of cached prompt prefixes. vLLM v1 turns it on by "
         "default; here it is off by default because the simulator models it only for requests that carry "
         "prefix hash ids (a Mooncake --trace), and scenario workloads carry none.",
         scenario="deployment.enable_prefix_caching"),
    Knob("policy", str, "fcfs", "Waiting-queue order:", scenario="deployment.scheduling_policy",
         registry="llmqueue.engine.policies:ORDERINGS"),
    Knob("preemption_mode", str, "recompute", "How a preempted request resumes: recompute (vLLM v1's only mode).",
         flag=False, scenario="deployment.preemption_mode"),
    Knob("preemption", str, None, "Victim when KV blocks run out (default: vLLM's for the --policy):", scenario="spec",
         registry="llmqueue.engine.policies:VICTIMS"),
    Knob("kv_cache_dtype", str, "auto", "KV cache data type; enters M (vLLM's name and default: the model's).",
         scenario="deployment.kv_cache_dtype", metavar="DTYPE"),
    Knob("dtype", str, "auto", "Weight data type; enters M (vLLM's name and default: the model's).",
         scenario="deployment.dtype", metavar="DTYPE"),
    Knob("max_waiting", int, 0, "Admission control: reject arrivals while this many wait (0: off; vLLM has no "
         "such limit).", scenario="deployment.max_waiting", ge=0),
    Knob("max_queue_time", float, 0.0, "Shed requests that waited longer than this before starting (0: off).",
         unit="s", scenario="deployment.max_queue_time_s", ge=0),
    Knob("kv_offloading_size", float, 0.0, "A host-memory KV tier per replica, summed over its GPUs (vLLM's "
         "--kv-offloading-size; 0: none): a preempted request's KV waits there and is loaded back when it "
         "resumes, instead of being recomputed.", unit="GiB", scenario="deployment.kv_offloading_size", ge=0),
    Knob("kv_offloading_gbps", float, 25.0, "Bandwidth between the host KV tier and each GPU (PCIe Gen4 x16 "
         "moves about 25 GB/s); a resumed request's load waits this long in its step.", unit="GB/s",
         scenario="deployment.kv_offloading_gbps", gt=0),
    Knob("kv_bytes_per_token", float, None, "KV bytes of one token over the replica's GPUs, for the host tier "
         "(default: the model's, from its layers, KV heads and --kv-cache-dtype).", unit="B",
         scenario="deployment.kv_bytes_per_token", gt=0),
    Knob("step_time", object, None, "Step-time model (default: the roofline of --model and --gpu; any takes "
         ":noise=exp|gamma|lognormal[:cv=X] and :drift=SD):", scenario="deployment.step_time",
         registry="llmqueue.engine.step_time:FORMS", metavar="SPEC"),
    Knob("capacity_tokens", float, None, "KV capacity M of one replica. Default: from --model and --gpu, "
         "unlimited without them.", unit="tokens", scenario="deployment.capacity_tokens", gt=0),
    Knob("srpt_predictor_cv", float, 0.0, "srpt policy: output-length predictor noise (lognormal CV; 0: oracle).",
         scenario="spec", ge=0),
    Knob("prefix_block_tokens", int, 512, "Tokens per prefix hash id (Mooncake: 512; a multiple of the KV block "
         "size).", unit="tokens", scenario="spec", ge=1),
    # --- the workload -------------------------------------------------------------------------------
    Knob("trace", str, None, "Replay a trace file (Azure CSV, Mooncake JSONL, canonical Parquet, ...). With "
         "--scenario it replaces the scenario's arrivals; a trace whose classes are the scenario's (a gateway run's "
         "workload.parquet) is replayed request by request, each with its class and recorded lengths.",
         group="workload", scenario="workload", metavar="FILE"),
    Knob("workload", str, None, "A workload fitted to a trace (the spec file of `llmqueue workload fit -o FILE`): "
         "its arrival process and lengths; --arrival replaces its arrival process; its span is the default "
         "--duration.", group="workload", metavar="FILE"),
    Knob("rate", float, None, "Arrival rate (req/s): rescales the arrival process (--arrival, the scenario's, "
         "the fitted --workload's) to this long-run rate, keeping its shape; Poisson when there is none.",
         unit="req/s", group="workload", scenario="workload", gt=0, metavar="REQ/S"),
    Knob("arrival", str, None, "Arrival process: poisson:RATE | gamma:RATE:cv=CV | deterministic:RATE | onoff:... "
         "With --scenario it replaces the scenario's arrival process (a mix of classes with their own "
         "processes, or a trace, is rescaled to its rate).", group="workload", scenario="workload", metavar="SPEC"),
    Knob("prompt", str, None, "Prompt length spec (tokens), e.g. uniform:10:1600.", group="workload",
         scenario="workload", metavar="SPEC", flag_as="--prompt-len", old_flags=("--prompt",)),
    Knob("output", str, None, "Output length spec (tokens), e.g. uniform:10:1600.", group="workload",
         scenario="workload", metavar="SPEC", flag_as="--output-len", old_flags=("--output",)),
    Knob("lengths", str, None, "Joint (prompt, output) pairs: joint:FILE[:prompt=COL:output=COL].",
         group="workload", scenario="workload", metavar="SPEC"),
    # --- the run (the flag names are vLLM bench's; a scenario file's keys carry the unit) ---------
    Knob("duration", float, None, "Simulated seconds (also the horizon).", unit="s", group="run",
         scenario="run.duration_s", gt=0),
    Knob("num_requests", int, None, "Number of requests.", group="run", scenario="run.num_requests", ge=1),
    Knob("seed", int, 0, "Random seed of the request stream and the step-time noise.", group="run",
         scenario="run.seed", ge=0),
    Knob("warmup", float, 0.0, "Seconds left out of the statistics.", unit="s", group="run",
         scenario="run.warmup_s", ge=0),
    Knob("sample_dt", float, 1.0, "Time-series sampling interval.", unit="s", group="run", scenario="spec", gt=0),
    Knob("early_stop", bool, False, "Stop an overloaded run once its outcome is certain: after a fifth of the "
         "duration, when the number in the system grew in each of the last five of fifty slices, by at least a "
         "tenth of their arrivals, past twice max_num_seqs. The summary says when it stopped.", group="run",
         scenario="spec"),
    Knob("slo_ttft_ms", float, None, "SLO on TTFT: simulate counts goodput against it (a scenario's targets on "
         "TTFT are replaced); sweep and capacity judge the --percentile.", unit="ms", group="run",
         scenario="slos", ge=0),
    Knob("slo_tpot_ms", float, None, "SLO on TPOT (as --slo-ttft-ms).", unit="ms", group="run", scenario="slos",
         ge=0),
    Knob("slo_e2el_ms", float, None, "SLO on end-to-end latency (as --slo-ttft-ms).", unit="ms", group="run",
         scenario="slos", ge=0),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    """The knob named ``name`` (``max-num-seqs`` and ``max_num_seqs`` both work)."""
    key = str(name).strip().replace("-", "_")
    if key not in BY_NAME:
        import difflib

        near = difflib.get_close_matches(key, list(BY_NAME), n=1, cutoff=0.6)
        raise InputError(key, "is not a knob", f"did you mean {near[0]!r}?" if near else
                         f"knobs: {', '.join(BY_NAME)}")
    return BY_NAME[key]


def flag_knobs(*groups: str) -> list[Knob]:
    """The knobs commands take as flags, in the given groups (all groups when none)."""
    return [k for k in KNOBS if k.flag and (not groups or k.group in groups)]


def flag_default(k: Knob):
    """The value a flag holds when not given: the knob's default, except for a knob that has an
    alias (``max_num_batched_tokens``), which holds None so that giving both can be told apart."""
    if any(o.alias_of == k.name for o in KNOBS):
        return None
    return k.default


def flag_defaults(**overrides) -> dict:
    """Every flag knob with its :func:`flag_default`, updated with ``overrides`` (checked names):
    the keywords of :func:`llmqueue.spec.build_spec`, e.g. the base of a flags sweep."""
    out = {k.name: flag_default(k) for k in flag_knobs()}
    for name in overrides:
        if name not in out:
            k = BY_NAME.get(name)
            why = "is set in scenario files only" if k is not None else "is not a flag of llmqueue simulate"
            raise InputError(name, why)
    out.update(overrides)
    return out


def scenario_fields(section: str) -> list[Knob]:
    """The knobs a scenario file holds in ``section`` (``deployment`` or ``run``), in order."""
    return [k for k in KNOBS if k.alias_of is None and k.scenario_field and k.scenario_field[0] == section]


def _bound_problem(k: Knob, x: float) -> str | None:
    if k.ge is not None and x < k.ge:
        return f"must be >= {k.ge:g} (got {x:g})"
    if k.gt is not None and x <= k.gt:
        return f"must be > {k.gt:g} (got {x:g})"
    if k.le is not None and x > k.le:
        return f"must be <= {k.le:g} (got {x:g})"
    return None


def check(name: str, value):
    """``value`` checked against knob ``name``'s type, bounds and choices (None passes: "not
    given" or "derived"); returns it (an integral float as int for an int knob)."""
    return check_value(knob(name), value)


def check_value(k: Knob, value, field: str | None = None):
    """``value`` checked against knob ``k`` (of any table; see :func:`check`); ``field``: the
    name its errors give (default: the knob's)."""
    if value is None:
        return None
    if field is not None:
        k = replace(k, name=field)
    if k.per_class and isinstance(value, Mapping):
        one = replace(k, per_class=False)
        return {c: check_value(one, v) for c, v in value.items()}
    if k.type is bool:
        if not isinstance(value, bool):
            raise InputError(k.name, f"must be true or false (got {value!r})")
        return value
    if k.type in (int, float):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            what = "a whole number" if k.type is int else "a number"
            raise InputError(k.name, f"must be {what} (got {value!r})")
        if k.problem is not None:
            return _number_with_problem(k, value)
        if not math.isfinite(value):
            raise InputError(k.name, f"must be a finite number (got {value})")
        if k.type is int:
            if value != int(value):
                raise InputError(k.name, f"must be a whole number (got {value!r})")
            value = int(value)
        problem = _bound_problem(k, value)
        if problem:
            raise InputError(k.name, problem)
        return value
    if k.choices and value not in k.choices:
        raise InputError(k.name, f"unknown {k.name.replace('_', ' ')} {value!r}",
                         f"choose one of: {', '.join(k.choices)}")
    return k.check(value) if k.check is not None else value


def _number_with_problem(k: Knob, value):
    """A number of a knob with its own ``problem``: NaN, an infinity (unless ``allow_inf``) or a
    value out of bounds are told that problem."""
    x = float(value)
    if math.isnan(x) or (math.isinf(x) and not (k.allow_inf and x > 0)) or _bound_problem(k, x):
        shown = f"{value:g}" if isinstance(value, float) else f"{value}"
        raise InputError(k.name, f"{k.problem} (got {shown})")
    if k.type is int and math.isfinite(x):
        if x != int(x):
            raise InputError(k.name, f"must be a whole number (got {value!r})")
        return int(value)
    return value


def convert(name: str, text: str):
    """A value given as text (``--param max_num_seqs=8,16``) converted to knob ``name``'s type
    and checked; names that are no knob (``rate``) become a number when they read as one."""
    t = str(text).strip()
    k = BY_NAME.get(str(name).strip().replace("-", "_"))
    if k is None:
        for cast in (int, float):
            try:
                return cast(t)
            except ValueError:
                pass
        return t
    if k.type is bool:
        low = t.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise InputError(k.name, f"{t!r} is not true or false")
    if k.type in (int, float):
        try:
            v = float(t) if k.type is float else int(t)
        except ValueError:
            what = "a whole number" if k.type is int else "a number"
            raise InputError(k.name, f"{t!r} is not {what}") from None
        return check(k.name, v)
    return check(k.name, t)
