"""Request classes (lanes, tenants) and their superposition into one request stream.

The Queueing System essay: "Separate tenants and request classes early"; an interactive lane, a throughput lane
and a long-context lane each have their own geometry (prompt and output lengths), urgency and
latency targets. A :class:`RequestClass` holds one lane: how its requests arrive, how long they
are, their ``priority`` (an int, lower = more urgent, as in vLLM's ``--scheduling-policy
priority``), its SLO targets (:class:`SLO`, e.g. p99 TTFT <= 2 s) and its client behaviour
(:class:`~llmqueue.workload.client.ClientBehavior`: timeouts and retries).

A class's arrivals are either its own process (``arrival="poisson:2"``) or a ``share`` of a
total arrival process given to :class:`ClassMix`. Shares split the total stream by independent
marking (thinning): each arrival of the total process belongs to class ``c`` with probability
``share_c``, so the classes inherit the total's burstiness together (one burst hits every lane at
once), and for a Poisson total they are independent Poisson streams of rate ``share_c * lam``.

Seeding (:meth:`ClassMix.generate`): from ``SeedSequence(seed)``, every class gets its own child
keyed by a hash of its *name*, whose streams 0, 1, 2 are, as in
:class:`~llmqueue.workload.generate.Workload`, its arrivals, prompt lengths and output lengths;
the total process of the shares and the marking draws use two further children. So adding,
removing or reordering a class with its own arrival process leaves every other class's requests
exactly as they were; changing the shares re-splits the total stream (the total stream itself is
unchanged); renaming a class gives it new draws.
"""

from __future__ import annotations

import hashlib
import math
import operator
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import positive, positive_int
from llmqueue.errors import InputError
from llmqueue.workload.arrivals import ArrivalProcess
from llmqueue.workload.client import BoundClient, ClientBehavior
from llmqueue.workload.generate import RequestArrays, Workload, _streams
from llmqueue.workload.joint import JointLengths
from llmqueue.workload.lengths import LengthDist
from llmqueue.workload.parse import parse_arrival, parse_joint, parse_length

#: SLO metrics, named as vLLM bench serve names them.
SLO_METRICS = ("ttft", "tpot", "itl", "e2el")

_CLASS_STREAM = 0x636C6173  # "clas": per-class children of the run's SeedSequence
_MIX_STREAM = 0x6D697820  # "mix ": the total arrival process of the shares (0), the marking (1)
_SHARE_TOL = 1e-6


@dataclass(frozen=True)
class SLO(Result):
    """A latency target: the ``percentile``-th percentile of ``metric`` is at most ``max_s`` seconds.

    ``metric`` is ``ttft``, ``tpot``, ``itl`` or ``e2el`` (vLLM bench serve's names). Equivalently
    at least ``percentile`` % of requests meet ``metric <= max_s`` (``attainment``), the
    per-request reading used for goodput.
    """

    metric: str
    percentile: float
    max_s: float

    def __post_init__(self):
        if self.metric not in SLO_METRICS:
            raise InputError("metric", f"unknown SLO metric {self.metric!r}", f"choose one of {', '.join(SLO_METRICS)}")
        p = positive("percentile", self.percentile)
        if p > 100:
            raise InputError("percentile", f"must be in (0, 100] (got {p:g})")
        object.__setattr__(self, "percentile", p)
        object.__setattr__(self, "max_s", positive("max_s", self.max_s))

    @property
    def attainment(self) -> float:
        """Fraction of requests that must meet the threshold: ``percentile / 100``."""
        return self.percentile / 100.0

    def __str__(self) -> str:
        return f"p{self.percentile:g} {self.metric} <= {self.max_s:g} s"


def _name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InputError("name", f"must be a non-empty string (got {name!r})")
    if name != name.strip():
        raise InputError("name", f"has leading or trailing spaces ({name!r})")
    return name


@dataclass(frozen=True)
class RequestClass:
    """One request class (lane): arrivals, lengths, priority, SLOs and client behaviour.

    Give exactly one of ``share`` (a fraction in (0, 1] of the :class:`ClassMix`'s total arrival
    process) and ``arrival`` (its own process or spec, e.g. ``"gamma:2:cv=3"``). Lengths are
    ``prompt`` and ``output`` (distributions or specs) or ``joint`` (``joint:FILE``); a share
    class may leave them out only when its lengths come from a replayed trace
    (:meth:`ClassMix.replay`). ``priority``: int, lower = served first under priority scheduling.
    ``slos``: :class:`SLO` objects (at most one per metric and percentile).
    """

    name: str
    share: float | None = None
    arrival: ArrivalProcess | None = None
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    joint: JointLengths | None = None
    priority: int = 0
    slos: tuple[SLO, ...] = ()
    client: ClientBehavior = field(default_factory=ClientBehavior)

    def __post_init__(self):
        object.__setattr__(self, "name", _name(self.name))
        if (self.share is None) == (self.arrival is None):
            raise InputError("share" if self.share is None else "arrival",
                             "give either share (a fraction of the total arrival process) or arrival "
                             "(the class's own process), not " + ("neither" if self.share is None else "both"))
        if self.share is not None:
            s = positive("share", self.share)
            if s > 1:
                raise InputError("share", f"must be in (0, 1] (got {s:g})")
            object.__setattr__(self, "share", s)
        else:
            object.__setattr__(self, "arrival", parse_arrival(self.arrival, "arrival"))
        if self.joint is not None:
            if self.prompt is not None or self.output is not None:
                raise InputError("lengths", "give prompt and output distributions, or joint lengths, not both")
            object.__setattr__(self, "joint", parse_joint(self.joint, "lengths"))
        elif self.prompt is not None or self.output is not None:
            if self.prompt is None or self.output is None:
                missing = "prompt" if self.prompt is None else "output"
                raise InputError(missing, "is missing: give both prompt and output, or joint lengths")
            object.__setattr__(self, "prompt", parse_length(self.prompt, "prompt"))
            object.__setattr__(self, "output", parse_length(self.output, "output"))
        elif self.arrival is not None:
            raise InputError("prompt", "a class with its own arrival process needs lengths",
                             "give prompt and output (e.g. uniform:10:1600), or joint lengths")
        if isinstance(self.priority, bool):
            raise InputError("priority", f"must be an integer (got {self.priority!r})")
        try:
            object.__setattr__(self, "priority", operator.index(self.priority))
        except TypeError:
            raise InputError("priority", f"must be an integer (got {self.priority!r})") from None
        slos = tuple(self.slos)
        seen = set()
        for s in slos:
            if not isinstance(s, SLO):
                raise InputError("slos", f"expected SLO objects, got {s!r}")
            if (s.metric, s.percentile) in seen:
                raise InputError("slos", f"two targets for p{s.percentile:g} {s.metric}")
            seen.add((s.metric, s.percentile))
        object.__setattr__(self, "slos", slos)
        c = self.client
        if isinstance(c, dict):
            c = ClientBehavior(**c)
        elif not isinstance(c, ClientBehavior):
            raise InputError("client", f"expected a ClientBehavior, got {c!r}")
        object.__setattr__(self, "client", c)

    @property
    def has_lengths(self) -> bool:
        return self.joint is not None or self.prompt is not None

    def mean_prompt(self) -> float:
        if self.joint is not None:
            return self.joint.mean_prompt()
        return self.prompt.mean() if self.prompt is not None else math.nan

    def mean_output(self) -> float:
        if self.joint is not None:
            return self.joint.mean_output()
        return self.output.mean() if self.output is not None else math.nan

    def workload(self) -> Workload:
        """This class as a single-class :class:`Workload` (classes with their own arrival process)."""
        if self.arrival is None:
            raise InputError("arrival", f"class {self.name!r} takes a share of the total arrival process; "
                             "it has no workload of its own")
        return Workload(self.arrival, prompt=self.prompt, output=self.output, joint=self.joint,
                        class_name=self.name)

    def specs(self) -> dict:
        """Canonical spec strings and settings, e.g. for a report or JSON."""
        d: dict = {"name": self.name}
        if self.share is not None:
            d["share"] = self.share
        else:
            d["arrival"] = self.arrival.spec
        if self.joint is not None:
            d["lengths"] = self.joint.spec
        elif self.prompt is not None:
            d["prompt"], d["output"] = self.prompt.spec, self.output.spec
        d["priority"] = self.priority
        d["slos"] = [s.to_dict() for s in self.slos]
        d["client"] = self.client.to_dict()
        return d


def _root(seed) -> np.random.SeedSequence:
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
        raise InputError("seed", f"must be a non-negative integer (got {seed!r})")
    return np.random.SeedSequence(int(seed))


def _child(root: np.random.SeedSequence, *key: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, *key), pool_size=root.pool_size)


def _name_key(name: str) -> tuple[int, ...]:
    d = hashlib.sha256(name.encode("utf-8")).digest()
    return tuple(int.from_bytes(d[i:i + 4], "little") for i in range(0, 16, 4))


def class_seed(seed, name: str) -> np.random.SeedSequence:
    """The SeedSequence of class ``name`` in a run seeded with ``seed`` (see the module docstring)."""
    return _child(_root(seed), _CLASS_STREAM, *_name_key(_name(name)))


def _draw_lengths(c: RequestClass, ss: np.random.SeedSequence, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``m`` (prompt, output) pairs from class ``c``'s length streams (1 and 2, as Workload uses)."""
    _, p_ss, o_ss = _streams(ss, 3)
    if c.joint is not None:
        return c.joint.sample(np.random.default_rng(p_ss), m)
    return (c.prompt.sample(np.random.default_rng(p_ss), m),
            c.output.sample(np.random.default_rng(o_ss), m))


def _head(r: RequestArrays, n: int) -> RequestArrays:
    if len(r) <= n:
        return r
    return RequestArrays(r.request_id[:n], r.arrival_s[:n], r.prompt_tokens[:n], r.output_tokens[:n],
                         r.class_name[:n] if n else "default")


class ClassMix:
    """Several :class:`RequestClass` es served together: one merged request stream.

    ``arrival`` is the total arrival process split among the classes that give a ``share``
    (their shares must sum to 1); it is required when any class has a share and refused when
    none has. Classes with their own ``arrival`` are superposed on top. ``rate`` is the total
    arrival rate ``lam``; ``rates()`` each class's.

    ``generate(seed, n=... | duration=...)`` gives a :class:`RequestArrays` over all classes in
    arrival order (ids 0..n-1, ``class_name`` per request); ``replay(...)`` does the same with
    the total arrival times (and optionally lengths) taken from a trace. ``clients(seed)`` gives
    each class's :class:`~llmqueue.workload.client.BoundClient` for the retry protocol of
    :mod:`llmqueue.workload.client`.
    """

    def __init__(self, classes, arrival: ArrivalProcess | str | None = None):
        classes = tuple(classes)
        if not classes:
            raise InputError("classes", "give at least one request class")
        names = set()
        for i, c in enumerate(classes):
            if not isinstance(c, RequestClass):
                raise InputError("classes", f"item {i} is not a RequestClass (got {type(c).__name__})")
            if c.name in names:
                raise InputError("classes", f"two classes are named {c.name!r}", "class names must be unique")
            names.add(c.name)
        self.classes = classes
        shares = [c for c in classes if c.share is not None]
        total = sum(c.share for c in shares)
        if shares and abs(total - 1.0) > _SHARE_TOL:
            listed = ", ".join(f"{c.name}={c.share:g}" for c in shares)
            raise InputError("classes", f"shares sum to {total:.6g}, not 1 ({listed})",
                             "make the shares of the total arrival process add up to 1")
        if arrival is not None:
            if not shares:
                raise InputError("arrival", "no class takes a share of the total arrival process",
                                 "give some classes a share, or drop the total arrival process")
            arrival = parse_arrival(arrival, "arrival")
        self.arrival = arrival

    # -- lookups -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.classes)

    def __iter__(self):
        return iter(self.classes)

    def __getitem__(self, name: str) -> RequestClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise InputError("class", f"no class named {name!r}", f"classes: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    @property
    def priorities(self) -> dict[str, int]:
        return {c.name: c.priority for c in self.classes}

    @property
    def slos(self) -> dict[str, tuple[SLO, ...]]:
        return {c.name: c.slos for c in self.classes}

    def clients(self, seed: int) -> dict[str, BoundClient]:
        """Each class's client behaviour bound to the run's ``seed`` (request ids are unique in a run)."""
        return {c.name: c.client.bind(seed) for c in self.classes}

    def patience(self, seed: int) -> dict:
        """``{class: BoundPatience}`` for the classes whose client has a patience law (each
        request's own patience, drawn from ``(seed, request_id)``)."""
        return {c.name: c.client.patience.bind(seed) for c in self.classes if c.client.patience is not None}

    def timeouts(self) -> dict[str, float]:
        """``{class: timeout_s}`` for the classes whose client has a timeout."""
        return {c.name: c.client.timeout_s for c in self.classes if c.client.timeout_s is not None}

    def retry_function(self, seed: int, requests: RequestArrays):
        """``decide(request_id, attempt, status, t_end) -> t_next | None`` over a whole run.

        Looks up each request's class in ``requests`` (the stream the run serves) and applies
        that class's :meth:`~llmqueue.workload.client.ClientBehavior.decide` with ``seed``: the
        single callable a runner that does not track classes (e.g. the engine's ``retry``
        option) needs.
        """
        clients = self.clients(seed)
        by_index = [clients.get(name) for name in requests.classes]
        unknown = [n for n, c in zip(requests.classes, by_index) if c is None]
        if unknown:
            raise InputError("requests", f"requests of class {unknown[0]!r}, which is not in this mix",
                             f"classes: {', '.join(self.names)}")
        ids = requests.request_id
        if len(ids) and np.array_equal(ids, np.arange(len(ids))):
            cls_of = requests.class_index.tolist()

            def lookup(rid):
                if rid < 0:
                    raise IndexError(rid)
                return cls_of[rid]
        else:
            table = dict(zip(ids.tolist(), requests.class_index.tolist()))

            def lookup(rid):
                return table[rid]

        def decide(request_id, attempt, status, t_end):
            try:
                k = lookup(int(request_id))
            except (KeyError, IndexError):
                raise InputError("request_id", f"{request_id} is not a request of this run") from None
            return by_index[k].decide(request_id, attempt, status, t_end)

        return decide

    # -- rates and means -----------------------------------------------------------------------
    def rates(self) -> dict[str, float]:
        """Each class's long-run arrival rate (req/s); NaN for shares of a trace (no process)."""
        total = self.arrival.rate if self.arrival is not None else math.nan
        return {c.name: (c.share * total if c.share is not None else c.arrival.rate) for c in self.classes}

    @property
    def rate(self) -> float:
        """Total arrival rate ``lam`` (req/s)."""
        return math.fsum(self.rates().values())

    def _weighted(self, f) -> float:
        r = self.rates()
        tot = math.fsum(r.values())
        return math.fsum(r[c.name] * f(c) for c in self.classes) / tot if tot > 0 else math.nan

    def mean_prompt(self) -> float:
        """Rate-weighted mean prompt length E[s] over the classes."""
        return self._weighted(RequestClass.mean_prompt)

    def mean_output(self) -> float:
        """Rate-weighted mean output length E[o] over the classes."""
        return self._weighted(RequestClass.mean_output)

    # -- generation ----------------------------------------------------------------------------
    def _split(self, root, times, s_given, o_given) -> list[RequestArrays]:
        """Mark each total arrival with a share class (sorted by name, so order does not matter)."""
        share_classes = sorted((c for c in self.classes if c.share is not None), key=lambda c: c.name)
        u = np.random.default_rng(_child(root, _MIX_STREAM, 1)).random(times.size)
        cum = np.cumsum([c.share for c in share_classes])
        cum /= cum[-1]
        idx = np.minimum(np.searchsorted(cum, u, side="right"), len(share_classes) - 1)
        parts = []
        for j, c in enumerate(share_classes):
            mask = idx == j
            t = times[mask]
            if c.has_lengths:
                s, o = _draw_lengths(c, class_seed(root, c.name), t.size)
            elif s_given is not None:
                s, o = s_given[mask], o_given[mask]
            else:
                raise InputError("prompt", f"class {c.name!r} has no prompt and output lengths",
                                 "give prompt and output (or joint lengths), or replay a trace with lengths")
            parts.append(RequestArrays(np.arange(t.size), t, s, o, c.name))
        return parts

    def _own(self, root, n, duration) -> list[RequestArrays]:
        own = sorted((c for c in self.classes if c.arrival is not None), key=lambda c: c.name)
        return [c.workload().generate(class_seed(root, c.name), n=n, duration=duration) for c in own]

    def generate(self, seed, *, n: int | None = None, duration: float | None = None) -> RequestArrays:
        """The first ``n`` requests over all classes, or all arriving in ``[0, duration)`` seconds.

        ``seed``: a non-negative int or a ``SeedSequence``; see the module docstring.
        """
        if (n is None) == (duration is None):
            raise InputError("n/duration", "give exactly one of n (requests) and duration (s)")
        if n is not None:
            n = positive_int("n", n, minimum=0)
        else:
            duration = positive("duration", duration)
        from llmqueue.workload.generate import check_stream_size

        check_stream_size(n=n, duration=duration, rate=self.rate)
        root = _root(seed)
        parts = []
        if any(c.share is not None for c in self.classes):
            if self.arrival is None:
                raise InputError("arrival", "classes with a share need the total arrival process",
                                 "give ClassMix(..., arrival='poisson:5'), or replay a trace with replay()")
            times = self.arrival.sample_times(np.random.default_rng(_child(root, _MIX_STREAM, 0)),
                                              n=n, horizon=duration)
            parts += self._split(root, times, None, None)
        parts += self._own(root, n, duration)
        merged = RequestArrays.merge(*parts)
        return _head(merged, n) if n is not None else merged

    def replay(self, seed, arrival_s, *, prompt_tokens=None, output_tokens=None,
               duration: float | None = None) -> RequestArrays:
        """Split given total arrival times (e.g. a trace's) among the share classes.

        Share classes with their own lengths draw them; the others take ``prompt_tokens`` and
        ``output_tokens`` (one per arrival, e.g. the trace's recorded lengths). Classes with their
        own arrival process are generated over ``[0, duration)``; ``duration`` defaults to the
        last given arrival and, when given, also cuts the replayed arrivals.
        """
        t = np.asarray(arrival_s, dtype=np.float64)
        if t.ndim != 1 or not np.all(np.isfinite(t)) or (t.size and (t[0] < 0 or np.any(np.diff(t) < 0))):
            raise InputError("arrival_s", "must be a 1-d array of finite, non-negative, sorted times")
        if (prompt_tokens is None) != (output_tokens is None):
            raise InputError("output_tokens" if output_tokens is None else "prompt_tokens",
                             "give both prompt_tokens and output_tokens, or neither")
        s = o = None
        if prompt_tokens is not None:
            s, o = np.asarray(prompt_tokens, dtype=np.int64), np.asarray(output_tokens, dtype=np.int64)
            if s.shape != t.shape or o.shape != t.shape:
                raise InputError("prompt_tokens", f"need one prompt and output length per arrival ({t.size})")
        if not any(c.share is not None for c in self.classes):
            raise InputError("classes", "no class takes a share of the replayed arrivals",
                             "give the classes that the trace feeds a share")
        if duration is not None:
            duration = positive("duration", duration)
            keep = t < duration
            t = t[keep]
            if s is not None:
                s, o = s[keep], o[keep]
        root = _root(seed)
        parts = self._split(root, t, s, o)
        if any(c.arrival is not None for c in self.classes):
            horizon = duration if duration is not None else (float(t[-1]) if t.size else None)
            if not horizon:
                raise InputError("duration", "needed for the classes with their own arrival process "
                                 "(no replayed arrival gives the horizon)")
            parts += self._own(root, None, horizon)
        return RequestArrays.merge(*parts)

    def __repr__(self) -> str:
        total = f", arrival={self.arrival.spec!r}" if self.arrival is not None else ""
        return f"ClassMix({list(self.names)}{total})"
