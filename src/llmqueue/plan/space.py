"""The planner's configuration space: model x GPU type x tensor-parallel size x pipeline-parallel
size x (aggregated replicas, or P:D splits) x ``max_num_seqs`` x ``max_num_batched_tokens`` x router.

The model axis (``--models``) changes the step model ``b(P, D, C)`` (the roofline of that model
on that GPU, ``tp`` and ``pp``) and the KV capacity ``M`` of each configuration; it also changes answer
quality, which the planner does not judge. The pipeline axis (``--pp``) splits the layers, weights
and KV over ``pp`` stages of ``tp`` GPUs: a replica rents ``tp x pp`` GPUs, holds more KV (``M``
grows) and pays the stage sends a step, not a shorter step
(:func:`llmqueue.engine.step_time.roofline_model`).

Aggregated serving: every one of ``R`` replicas prefills and decodes. A P:D split: ``P`` prefill
and ``D`` decode replicas of the same engine (same GPU, ``tp`` and knobs), the KV crossing a link
(``kv_link_gbps``, ``kv_link_latency_ms``), as ``llmqueue simulate --disaggregate P:D`` builds it.

A :class:`Config` is one deployment; :func:`configurations` enumerates the cartesian product;
:func:`parse_ints` reads the command line's lists (``1,2,4`` or ranges ``1..16``),
:func:`parse_splits` the P:D splits (``1:1,1:2,2..3:4``). Sizes are refused before any work:
an axis of more than :data:`MAX_AXIS` values, a space of more than :data:`MAX_CONFIGS`
configurations (the theory of each is kept in memory, about 8 kB a configuration).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llmqueue.errors import InputError

#: The most values one axis (``--replicas``, ``--tp``, ``--pd-splits`` ...) may list
MAX_AXIS = 4096
#: The most configurations a space may hold
MAX_CONFIGS = 50_000
#: Defaults of the command line.
DEFAULT_TP = (1, 2, 4)
DEFAULT_PP = (1,)
DEFAULT_REPLICAS = tuple(range(1, 17))
DEFAULT_MAX_NUM_SEQS = (64, 128, 256)
DEFAULT_MAX_NUM_BATCHED_TOKENS = (2048, 8192)
#: The KV link of a P:D split when none is given: one 100 Gbit/s port, 0.05 ms (as the shipped
#: ``pd`` example assumes).
DEFAULT_KV_LINK_GBPS = 100.0
DEFAULT_KV_LINK_LATENCY_MS = 0.05


@dataclass(frozen=True, order=True)
class Config:
    """One deployment: ``replicas`` replicas of ``tensor_parallel_size x pipeline_parallel_size``
    GPUs of type ``gpu``, each a vLLM engine with these knobs, behind ``router``. Aggregated when ``prefill_replicas``
    is 0; else a P:D split, ``replicas = prefill_replicas + decode_replicas``, the KV crossing
    a link of ``kv_link_gbps`` (Gbit/s) and ``kv_link_latency_ms``; ``router`` routes within each
    pool."""

    gpu: str
    tensor_parallel_size: int
    replicas: int
    max_num_seqs: int
    max_num_batched_tokens: int
    router: str
    prefill_replicas: int = 0
    decode_replicas: int = 0
    kv_link_gbps: float = 0.0
    kv_link_latency_ms: float = 0.0
    #: the served model (a catalog name or a config.json path); "" is the scenario's own
    model: str = ""
    pipeline_parallel_size: int = 1

    @property
    def gpus(self) -> int:
        """GPUs the deployment rents: ``tp x pp x replicas``."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.replicas

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    @property
    def split(self) -> str | None:
        """``"P:D"``, or None for aggregated serving."""
        return f"{self.prefill_replicas}:{self.decode_replicas}" if self.disaggregated else None

    def knobs(self) -> dict:
        """The deployment as a record: the vLLM knobs, the replicas, ``disaggregate`` (``"P:D"``
        or None) and, for a split, its link."""
        d = asdict(self)
        for k in ("prefill_replicas", "decode_replicas", "kv_link_gbps", "kv_link_latency_ms"):
            d.pop(k)
        d["disaggregate"] = self.split
        if self.disaggregated:
            d["kv_link_gbps"], d["kv_link_latency_ms"] = self.kv_link_gbps, self.kv_link_latency_ms
        return d

    def point(self) -> dict:
        """The overrides of :func:`llmqueue.spec.scenario_spec` that simulate it: the knobs, and for
        a split the scenario's ``deployment.pools`` (``prefill`` and ``decode``, each inheriting the
        knobs) and ``deployment.disaggregation`` (with the link) as ``sets``."""
        d = {k: v for k, v in asdict(self).items() if k in ("gpu", "tensor_parallel_size", "replicas", "max_num_seqs",
                                                             "max_num_batched_tokens", "router")}
        if self.model:
            d["model"] = self.model
        if self.pipeline_parallel_size > 1:
            d["pipeline_parallel_size"] = self.pipeline_parallel_size
        if not self.disaggregated:
            return d
        del d["replicas"]
        import math

        gbps = f"kv_link_gbps: {self.kv_link_gbps!r}, " if math.isfinite(self.kv_link_gbps) else ""  # left out: free
        d["sets"] = [f"deployment.pools=[{{name: prefill, role: prefill, replicas: {self.prefill_replicas}}}, "
                     f"{{name: decode, role: decode, replicas: {self.decode_replicas}}}]",
                     f"deployment.disaggregation={{prefill: prefill, decode: decode, {gbps}"
                     f"kv_link_latency_ms: {self.kv_link_latency_ms!r}}}"]
        return d

    def label(self) -> str:
        who = (f"P:D {self.split} ({self.kv_link_gbps:g} Gbit/s link) x" if self.disaggregated
               else f"{self.replicas} x")
        model = f"{self.model} on " if self.model else ""
        pp = f" pp{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        return (f"{model}{who} {self.gpu} tp{self.tensor_parallel_size}{pp}, max_num_seqs {self.max_num_seqs}, "
                f"max_num_batched_tokens {self.max_num_batched_tokens}, {self.router}")


def parse_ints(name: str, text, *, minimum: int = 1) -> tuple[int, ...]:
    """``"1,2,4"``, ``"1..16"`` or a mix (``"1..4,8,16"``) as sorted distinct integers >= ``minimum``."""
    if isinstance(text, (list, tuple)):
        items = [str(x) for x in text]
    else:
        items = [t for t in str(text).split(",")]
    out: set[int] = set()
    for item in items:
        t = item.strip()
        if not t:
            continue
        try:
            a, b = (int(x) for x in t.split("..", 1)) if ".." in t else (int(t), int(t))
            if b < a:
                raise ValueError
        except ValueError:
            raise InputError(name, f"{t!r} is not an integer or a range A..B", "e.g. 1,2,4 or 1..16") from None
        if b - a + 1 > MAX_AXIS:
            raise InputError(name, f"{t} holds {b - a + 1} values (the limit is {MAX_AXIS})",
                             "narrow the range or step it by hand (e.g. 1..8,16,32,64)")
        out.update(range(a, b + 1))
        if len(out) > MAX_AXIS:
            raise InputError(name, f"lists more than {MAX_AXIS} values (the limit)", "give fewer values")
    bad = sorted(v for v in out if v < minimum)
    if bad:
        raise InputError(name, f"{bad[0]} is below {minimum}", f"give values >= {minimum}")
    return tuple(sorted(out))


def parse_names(name: str, text) -> tuple[str, ...]:
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = tuple(dict.fromkeys(str(t).strip() for t in items if str(t).strip()))
    return out


def parse_splits(name: str, text) -> tuple[tuple[int, int], ...]:
    """``"1:1,1:2,2..3:4"``: P:D pairs (each side an integer or a range ``A..B``, expanded), sorted
    and distinct; empty text gives none."""
    items = text if isinstance(text, (list, tuple)) else [t for t in str(text or "").split(",")]
    out: set[tuple[int, int]] = set()
    for item in items:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            item = f"{item[0]}:{item[1]}"
        t = str(item).strip()
        if not t:
            continue
        p, sep, d = t.partition(":")
        if not sep:
            raise InputError(name, f"{t!r} is not P:D", "give prefill:decode replicas, e.g. 1:1,1:2,2..3:4")
        ps = parse_ints(name, p, minimum=1)
        ds = parse_ints(name, d, minimum=1)
        if not ps or not ds:
            raise InputError(name, f"{t!r} is not P:D", "give prefill:decode replicas, e.g. 1:1,1:2,2..3:4")
        if len(out) + len(ps) * len(ds) > MAX_AXIS:
            raise InputError(name, f"{t} adds {len(ps) * len(ds)} splits to {len(out)}: more than {MAX_AXIS} "
                             "(the limit)", "give fewer splits")
        out.update((a, b) for a in ps for b in ds)
    return tuple(sorted(out))


def configurations(*, gpus, tp, replicas, max_num_seqs, max_num_batched_tokens, routers, pd_splits=(),
                   kv_link_gbps: float = DEFAULT_KV_LINK_GBPS,
                   kv_link_latency_ms: float = DEFAULT_KV_LINK_LATENCY_MS, models=("",),
                   pp=DEFAULT_PP) -> list[Config]:
    """The cartesian product of the axes (GPU names resolved to the catalog's): the aggregated
    deployments of ``replicas``, then the splits of ``pd_splits`` (``(P, D)`` pairs), for each of
    ``models`` (names as :func:`model_names` gives them; ``""``: the scenario's own model) and
    each pipeline size of ``pp``."""
    from llmqueue.hardware import get_gpu

    names = tuple(dict.fromkeys(get_gpu(g).name for g in gpus))
    models = tuple(dict.fromkeys(models)) or ("",)
    size = (len(models) * len(names) * len(tp) * len(pp) * (len(replicas) + len(pd_splits)) * len(max_num_seqs)
            * len(max_num_batched_tokens) * len(routers))
    if size > MAX_CONFIGS:
        raise InputError("replicas", f"the space holds {size:,} configurations ({len(models)} model(s) x "
                         f"{len(names)} GPU(s) x {len(tp)} tp x {len(pp)} pp x {len(replicas) + len(pd_splits)} replica counts and "
                         f"splits x {len(max_num_seqs)} max_num_seqs x {len(max_num_batched_tokens)} "
                         f"max_num_batched_tokens x {len(routers)} router(s)); the limit is {MAX_CONFIGS:,}",
                         "narrow --replicas, --gpus, --tp, --pp or the knob lists")
    out = [Config(g, t, r, s, b, rt, model=m, pipeline_parallel_size=q) for m in models for g in names for t in tp
           for q in pp for r in replicas for s in max_num_seqs for b in max_num_batched_tokens for rt in routers]
    out += [Config(g, t, P + D, s, b, rt, P, D, float(kv_link_gbps), float(kv_link_latency_ms), model=m,
                   pipeline_parallel_size=q)
            for m in models for g in names for t in tp for q in pp for P, D in pd_splits for s in max_num_seqs
            for b in max_num_batched_tokens for rt in routers]
    return out


def model_names(text) -> tuple[str, ...]:
    """``--models``: catalog names (or aliases, resolved to the catalog's name) or config.json
    paths (made absolute), distinct, in the order given. An unknown name is an error on ``models``."""
    from pathlib import Path

    from llmqueue.hardware import get_model
    from llmqueue.hardware.catalog import _looks_like_path

    out = []
    for m in parse_names("models", text):
        try:
            spec = get_model(m)
        except InputError as e:
            raise InputError("models", e.problem, e.fix) from None
        out.append(str(Path(m).expanduser().resolve()) if _looks_like_path(m) and spec.name != m else spec.name)
    if not out:
        raise InputError("models", "names no model", "e.g. --models llama-3.1-8b,llama-3.1-70b (llmqueue kv --list)")
    return tuple(dict.fromkeys(out))
