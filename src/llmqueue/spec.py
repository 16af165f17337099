"""From knobs to a :class:`~llmqueue.simulate.SimSpec`: the one builder behind ``simulate``,
``sweep`` and ``capacity`` (the command line only parses the flags and prints).

- :func:`build_spec`: the knobs alone (``--arrival``, ``--prompt``, ``--capacity-tokens``, ...),
  every knob left out at its default from :data:`llmqueue.knobs.KNOBS`;
- :func:`scenario_spec`: a scenario file or shipped example, the knobs given overriding its
  fields (:mod:`llmqueue.scenario.override`);
- :func:`spec_from_flags`: either, as a command gets them (its flag values and which were given);
- :func:`engine_config`: an :class:`~llmqueue.engine.config.EngineConfig` from ``M`` and knobs
  (also used by ``validate`` on a calibrated server).

``build_spec`` and ``scenario_spec`` are the spec factories of :mod:`llmqueue.plan` (module
level, so worker processes import them by name).
"""

from __future__ import annotations

from llmqueue.errors import InputError
from llmqueue.knobs import BY_NAME, check, flag_defaults

# EngineConfig's field for each engine knob that is one (the knob's name unless listed)
_ENGINE = ("block_size", "max_num_seqs", "enable_chunked_prefill", "long_prefill_token_threshold",
           "max_model_len", "policy", "preemption", "max_waiting", "max_queue_time", "enable_prefix_caching")
_ENGINE_FIELD = {"max_queue_time": "max_queue_time_s"}


def engine_config(M: float, **knobs):
    """One replica's :class:`~llmqueue.engine.config.EngineConfig`: KV capacity ``M`` (tokens)
    and engine knobs under their flag names (those left out at their defaults).

    ``chunk`` and ``max_num_batched_tokens`` are one knob (giving both is an error);
    ``preemption`` None picks vLLM's victim for the policy (lowest priority under ``priority``,
    else the newest request); ``max_model_len`` None is no limit (0).
    """
    from llmqueue.engine.config import EngineConfig

    unknown = set(knobs) - set(_ENGINE) - {"chunk", "max_num_batched_tokens"}
    if unknown:
        raise InputError(sorted(unknown)[0], "is not an engine knob")
    chunk, budget = knobs.get("chunk"), knobs.get("max_num_batched_tokens")
    if chunk is not None and budget is not None:
        raise InputError("chunk", "give --chunk or --max-num-batched-tokens, not both (they are the same knob)")
    budget = check("chunk", chunk) if chunk is not None else budget
    kw = {name: check(name, knobs.get(name, BY_NAME[name].default)) for name in _ENGINE}
    if kw["preemption"] is None:
        from llmqueue.engine.policies import default_victim

        kw["preemption"] = default_victim(kw["policy"])
    kw["max_model_len"] = kw["max_model_len"] or 0
    kw = {_ENGINE_FIELD.get(k, k): v for k, v in kw.items()}
    block_size = kw.pop("block_size")
    budget = check("max_num_batched_tokens", budget if budget is not None
                   else BY_NAME["max_num_batched_tokens"].default)
    return EngineConfig.from_capacity(M, block_size=block_size, max_num_batched_tokens=budget, **kw)


def _capacity(f: dict):
    """``(M, unlimited, model)``: KV capacity from ``capacity_tokens``, else the hardware module."""
    from llmqueue.simulate import UNLIMITED_KV_TOKENS

    model = None
    if f["model"] is not None:
        from llmqueue.hardware import get_model

        model = get_model(f["model"])
    if f["capacity_tokens"] is not None:
        return f["capacity_tokens"], False, model
    if model is None:
        return UNLIMITED_KV_TOKENS, True, None
    if f["gpu"] is None:
        raise InputError("gpu", "is required with --model, to compute the KV capacity M",
                         "e.g. --gpu h100-sxm (llmqueue kv --list shows the catalog), or give --capacity-tokens")
    from llmqueue.hardware import kv_capacity

    cap = kv_capacity(model, f["gpu"], tensor_parallel_size=f["tensor_parallel_size"],
                      pipeline_parallel_size=f["pipeline_parallel_size"],
                      gpu_memory_utilization=f["gpu_memory_utilization"], block_size=f["block_size"],
                      kv_dtype=f["kv_cache_dtype"], weight_dtype=f["dtype"])
    return cap.M, False, model


def _step_time(f: dict, model):
    from llmqueue.engine.step_time import is_roofline, parse_step_time, roofline_model

    st = f["step_time"]
    if st is None or is_roofline(st):
        if model is None or f["gpu"] is None:
            raise InputError("step_time", "no step-time model" if st is None else "roofline needs --model and --gpu",
                             "give --step-time (e.g. 0.0372, exp:0.1, linear:c0=..:decode=..) or --model and --gpu "
                             "for a roofline")
        return roofline_model(model, f["gpu"], tensor_parallel_size=f["tensor_parallel_size"],
                              pipeline_parallel_size=f["pipeline_parallel_size"])
    return parse_step_time(st, field="step_time")


def engine_from_knobs(f: dict):
    """One replica from checked knobs ``f`` (every flag knob present, as :func:`build_spec` holds
    them): ``(EngineConfig, step-time model, unlimited, model)``; ``unlimited``: no KV capacity was
    given or derived; ``model``: the catalog's ``ModelSpec`` of ``--model`` or None.
    ``max_model_len`` None is the model's context length (vLLM's default), no limit without one."""
    M, unlimited, model = _capacity(f)
    eng = {k: f[k] for k in (*_ENGINE, "chunk", "max_num_batched_tokens")}
    if eng["max_model_len"] is None and model is not None:
        eng["max_model_len"] = model.max_model_len
    from llmqueue.engine.host_tier import with_host_tier

    config = with_host_tier(engine_config(M, **eng), f["kv_offloading_size"], f["kv_offloading_gbps"],
                            f["kv_bytes_per_token"], model,
                            f["tensor_parallel_size"] * f["pipeline_parallel_size"], f["kv_cache_dtype"])
    return config, _step_time(f, model), unlimited, model


def build_spec(**flags):
    """A :class:`~llmqueue.simulate.SimSpec` from knobs under their flag names (see
    :data:`llmqueue.knobs.KNOBS`; those left out take their defaults).

    ``M``: ``capacity_tokens``, else from ``model`` and ``gpu`` (vLLM's arithmetic), else
    unlimited. Step time: ``step_time``, else the roofline of ``model`` and ``gpu``.
    ``max_model_len`` None: the model's context length (vLLM's default), no limit without one.
    """
    from llmqueue.engine.options import SimOptions
    from llmqueue.simulate import SimSpec

    f = flag_defaults(**flags)
    f = {k: check(k, v) for k, v in f.items()}
    engine, st, unlimited, model = engine_from_knobs(f)
    if f["rate"] is not None:
        f["arrival"] = rate_arrival(f["rate"], f["arrival"], f["workload"], f["trace"])
    if f["workload"] is not None and f["duration"] is None and f["num_requests"] is None:
        from llmqueue.workload import load_fitted

        f["duration"] = load_fitted(f["workload"]).duration_s  # the fitted trace's span
    wl, requests, hash_ids = workload_from_flags(**{k: f[k] for k in ("trace", "arrival", "prompt", "output",
                                                                        "lengths", "num_requests", "duration",
                                                                        "workload")})
    slos = {m: f[f"slo_{m}"] for m in ("ttft_ms", "tpot_ms", "e2el_ms") if f[f"slo_{m}"] is not None} or None
    opts = SimOptions(seed=f["seed"], sample_dt=f["sample_dt"], hash_ids=hash_ids, early_stop=f["early_stop"],
                      hash_block_tokens=f["prefix_block_tokens"])
    fleet = pd_fleet(f, engine, st, model)
    return SimSpec(engine=engine, step_time=st, workload=wl, requests=requests,
                   num_requests=None if requests is not None else f["num_requests"],
                   duration_s=f["duration"], seed=f["seed"], warmup_s=f["warmup"], slos=slos, options=opts,
                   kv_unlimited=unlimited, predictor_cv=f["srpt_predictor_cv"], replicas=f["replicas"],
                   router=f["router"], fleet=fleet)


def parse_disaggregate(text) -> tuple[int, int]:
    """``--disaggregate P:D``: ``(P, D)``, the prefill and decode replicas (each 1..4096)."""
    t = str(text).strip()
    p, sep, d = t.partition(":")
    try:
        if not sep:
            raise ValueError
        P, D = int(p.strip()), int(d.strip())
    except ValueError:
        raise InputError("disaggregate", f"{t!r} is not P:D", "give the prefill and decode replicas, e.g. 1:1 "
                         "or 2:3") from None
    for side, n in (("prefill", P), ("decode", D)):
        if not 1 <= n <= 4096:
            raise InputError("disaggregate", f"{t!r}: {n} {side} replicas", "each side needs 1 to 4096 replicas")
    return P, D


def pd_fleet(f: dict, engine, step_time, model):
    """The P/D :class:`~llmqueue.cluster.spec.FleetSpec` of ``--disaggregate P:D`` (None without
    it): pools ``prefill`` and ``decode`` of the one engine, both behind ``--router``, and the KV
    link of ``--kv-link-gbps`` / ``--kv-link-latency-ms``."""
    if f.get("disaggregate") is None:
        for name in ("kv_link_gbps", "kv_link_latency_ms"):
            if f.get(name) not in (None, BY_NAME[name].default):
                raise InputError(name, "applies to a P/D fleet only", "give --disaggregate P:D too, or drop it")
        return None
    from llmqueue.cluster.spec import DECODE, PREFILL, Disaggregation, FleetSpec, Pool

    P, D = parse_disaggregate(f["disaggregate"])
    if f.get("replicas", 1) > 1:
        raise InputError("disaggregate", f"give --disaggregate P:D or --replicas N, not both (got --replicas "
                         f"{f['replicas']})", "--disaggregate sets the replicas of each side")
    kv_tok = 0.0
    if model is not None:
        from llmqueue.hardware import kv_bytes_per_token, resolve_dtype

        kv_tok = float(kv_bytes_per_token(model, resolve_dtype(f["kv_cache_dtype"], model, kv=True)))
    name = model.name if model is not None else ""
    pools = [Pool(role, engine, step_time, n, f["router"], model=name, role=role, kv_bytes_per_token=kv_tok)
             for role, n in ((PREFILL, P), (DECODE, D))]  # each pool named for its role
    pd = Disaggregation(PREFILL, DECODE, f.get("kv_link_gbps"), f.get("kv_link_latency_ms") or 0.0)
    return FleetSpec(pools=pools, disaggregation=pd)


def rate_arrival(rate: float, arrival=None, workload=None, trace=None) -> str:
    """The arrival spec for ``--rate``: ``arrival`` (or the fitted ``workload``'s process) rescaled
    to ``rate`` req/s with its shape kept, or Poisson at ``rate`` when there is none."""
    from llmqueue.scenario.override import scale_arrival

    if trace is not None:
        raise InputError("rate", "a replayed trace keeps its own times here",
                         "rescale it with `llmqueue workload convert TRACE --rate R -o FILE`, or drop --rate")
    base = arrival if arrival is not None else fitted_arrival(workload)
    return scale_arrival(base or "poisson:1", rate).spec


def fitted_arrival(workload) -> str | None:
    """The arrival spec of a fitted workload file (``--workload``); None without one."""
    if workload is None:
        return None
    from llmqueue.workload import load_fitted

    return load_fitted(workload).arrival.spec


def workload_from_flags(*, trace=None, arrival=None, prompt=None, output=None, lengths=None, num_requests=None,
                        duration=None, workload=None):
    """The workload knobs (shared by ``simulate`` and ``bench``): ``(workload, requests, hash_ids)``,
    a Workload to generate from, or (with ``trace``) the replayed requests and their prefix hashes.
    ``workload``: the spec file of a fitted workload (``llmqueue workload fit -o FILE``); ``arrival``
    then replaces its arrival process."""
    from llmqueue._validate import positive, positive_int
    from llmqueue.workload import Workload

    if num_requests is not None and duration is not None:
        raise InputError("num_requests", "give --num-requests or --duration, not both")
    if num_requests is not None:
        positive_int("num_requests", num_requests)
    if duration is not None:
        positive("duration", duration)
    if trace is not None:
        if arrival is not None or prompt is not None or output is not None or lengths is not None:
            raise InputError("trace", "a trace brings its own arrivals and lengths",
                             "drop --arrival/--prompt-len/--output-len/--lengths, or drop --trace")
        from llmqueue._files import input_file
        from llmqueue.workload.traces import load_trace, trace_to_requests, window

        tr = load_trace(input_file("trace", trace, what="trace file"))
        if duration is not None:
            tr = window(tr, 0.0, duration)
        if num_requests is not None and len(tr):
            tr = window(tr, 0.0, float(tr.arrival_s[min(num_requests, len(tr)) - 1]) + 1e-9)
        return None, trace_to_requests(tr), tr.hash_ids
    if workload is not None:
        if trace is not None or prompt is not None or output is not None or lengths is not None:
            raise InputError("workload", "a fitted workload brings its own lengths",
                             "drop --trace/--prompt-len/--output-len/--lengths, or drop --workload")
        from llmqueue.workload import load_fitted

        fw = load_fitted(workload)
        arr = arrival if arrival is not None else fw.arrival.spec
        wl = (Workload(arr, joint=fw.joint) if fw.joint is not None
              else Workload(arr, prompt=fw.prompt, output=fw.output))
        if num_requests is None and duration is None:
            raise InputError("num_requests", "the run has no end", "give --num-requests N or --duration SECONDS")
        return wl, None, None
    if arrival is None:
        raise InputError("arrival", "missing arrival process",
                         "give --arrival, e.g. poisson:3.5 or gamma:3.5:cv=2, or --trace FILE, --workload FILE "
                         "or --scenario NAME")
    if lengths is not None:
        if prompt is not None or output is not None:
            raise InputError("lengths", "give either --lengths or --prompt-len/--output-len, not both")
        wl = Workload(arrival, joint=lengths)
    else:
        if prompt is None or output is None:
            raise InputError("prompt" if prompt is None else "output", "missing length distribution",
                             "give --prompt-len SPEC and --output-len SPEC (e.g. uniform:10:1600), or --lengths joint:FILE")
        wl = Workload(arrival, prompt=prompt, output=output)
    if num_requests is None and duration is None:
        raise InputError("num_requests", "the run has no end", "give --num-requests N or --duration SECONDS")
    return wl, None, None


def _with_thresholds(slos: dict | None, classes, thresholds: dict) -> dict:
    """Per-class targets with the given per-request thresholds (``{"ttft_ms": 2000}``) replacing
    every target on those metrics (``p99_ttft_ms`` included)."""
    metrics = {k[:-3] for k in thresholds}
    out = {}
    for name in classes:
        keep = {k: v for k, v in (slos or {}).get(name, {}).items()
                if not (k.endswith("_ms") and k[:-3].rsplit("_", 1)[-1] in metrics)}
        out[name] = {**keep, **thresholds}
    return out


def apply_spec_knobs(spec, knobs: dict, classes=()) -> None:
    """Knobs a scenario file does not hold, applied to its built spec (in place): ``preemption``,
    ``srpt_predictor_cv``, ``prefix_block_tokens``, ``sample_dt``, ``router`` (every pool's, for a
    scenario's fleet), the KV link of a scenario's P/D pair and SLO thresholds."""
    if knobs.get("preemption") is not None:
        spec.engine = spec.engine.with_(preemption=knobs["preemption"])
    if knobs.get("srpt_predictor_cv") is not None:
        spec.predictor_cv = knobs["srpt_predictor_cv"]
    if knobs.get("prefix_block_tokens") is not None:
        spec.options.hash_block_tokens = knobs["prefix_block_tokens"]
    if knobs.get("sample_dt") is not None:
        spec.options.sample_dt = knobs["sample_dt"]
    if knobs.get("early_stop") is not None:
        spec.options.early_stop = knobs["early_stop"]
    if knobs.get("router") is not None:
        spec.router = knobs["router"]
        if spec.fleet is not None:  # every pool of a scenario's fleet
            for p in spec.fleet.pools:
                p.router = knobs["router"]
    link = {k: knobs[k] for k in ("kv_link_gbps", "kv_link_latency_ms") if knobs.get(k) is not None}
    if link:
        dis = spec.fleet.disaggregation if spec.fleet is not None else None
        if dis is None:
            name = next(iter(link))
            raise InputError(name, "the scenario has no deployment.disaggregation (a P/D pair) for it to apply to",
                             "drop it, or describe P/D in the scenario")
        for name, v in link.items():  # in range: the knobs are checked
            setattr(dis, name, v)

    thresholds = {m: knobs[f"slo_{m}"] for m in ("ttft_ms", "tpot_ms", "e2el_ms") if knobs.get(f"slo_{m}") is not None}
    if thresholds:
        spec.slos = _with_thresholds(spec.slos, classes, thresholds)


def scenario_spec(*, scenario: str, rate: float | None = None, sets=(), **overrides):
    """A :class:`~llmqueue.simulate.SimSpec` from a scenario with knob overrides (a spec factory).

    ``overrides``: knobs under their flag names (``max_num_seqs``, ``policy``, ``arrival``,
    ``duration``, ``seed``, ``warmup``, ...; None values are "not given"), applied as
    :func:`llmqueue.scenario.override.scenario_with` says; ``rate`` then rescales the total
    arrival rate, keeping every process's shape. ``sets``: field assignments ``PATH=VALUE``
    (``--set``, :func:`llmqueue.scenario.override.apply_sets`), applied first.
    """
    from llmqueue.scenario.override import scenario_with
    from llmqueue.simulate import spec_from_scenario

    o = scenario_with(scenario, rate=rate, sets=sets, **overrides)
    spec = spec_from_scenario(o.scenario, router=o.spec_knobs.get("router") or BY_NAME["router"].default)
    apply_spec_knobs(spec, o.spec_knobs, classes=[c.name for c in o.scenario.mix.classes])
    spec.notes = [*spec.notes, *o.notes]
    return spec


def spec_from_flags(flags: dict, *, scenario: str | None = None, given=None, sets=()):
    """The spec a command's flags ask for: ``scenario`` with the ``given`` flags (names) overriding
    its fields, or the flags alone. A flag's default never overrides a scenario. ``sets``:
    ``--set PATH=VALUE`` field assignments (a scenario's only)."""
    if scenario is None:
        if sets:
            raise InputError("set", "assigns a scenario's fields", "give --scenario too, or drop --set")
        return build_spec(**flags)
    names = flags if given is None else given
    return scenario_spec(scenario=scenario, sets=tuple(sets or ()), **{k: flags[k] for k in names})


def scenario_engine(scenario: str, *, pool: str | None = None, sets=(), **overrides) -> dict:
    """One pool's engine from a scenario (the knobs given overriding its fields), for a server
    that runs it (``llmqueue emulate``): ``{"engine", "step_time", "replicas", "seed", "model",
    "pool"}``. ``pool``: a pool of ``deployment.pools`` by name (default: the first); a
    deployment without pools is its one engine. ``model``: the deployment's model name or None."""
    from llmqueue.scenario.override import scenario_with

    o = scenario_with(scenario, sets=tuple(sets or ()), **overrides)
    sc = o.scenario
    d = sc.deployment
    if d.pools:
        names = [p.name for p in d.pools]
        if pool is None:
            pool = names[0]
        if pool not in names:
            raise InputError("pool", f"no pool {pool!r} in the scenario", f"its pools: {', '.join(names)}")
        i = names.index(pool)
        dep, replicas = d.pool_deployments[i], d.pools[i].replicas
    elif pool is not None:
        raise InputError("pool", "the scenario has no deployment.pools", "drop --pool")
    else:
        dep, replicas = d, d.replicas
    engine, step_time = sc.engine(dep)
    if o.spec_knobs.get("preemption") is not None:
        engine = engine.with_(preemption=o.spec_knobs["preemption"])
    return {"engine": engine, "step_time": step_time, "replicas": replicas, "seed": sc.run.seed,
            "model": getattr(dep, "model", None), "pool": pool}
