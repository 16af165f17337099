"""Generate request streams: arrival process x length distributions, seeded and vectorized.

Seeding: ``np.random.SeedSequence(seed).spawn(3)`` gives independent streams, in this order,
for arrivals (0), prompt lengths (1) and output lengths (2); joint lengths use stream 1. So
changing a length distribution leaves the arrival times unchanged, and changing the arrival
process leaves request ``i``'s lengths unchanged (common random numbers across what-if runs).
Lengths are drawn by inverse transform, so request ``i`` keeps its quantile when a length
distribution changes. Streams added later will take indices 3, 4, ..., which leaves these
unchanged. The same seed gives identical arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

from llmqueue._validate import positive, positive_int
from llmqueue.errors import InputError
from llmqueue.workload.arrivals import ArrivalProcess
from llmqueue.workload.joint import JointLengths
from llmqueue.workload.lengths import LengthDist
from llmqueue.workload.parse import parse_arrival, parse_joint, parse_length
from llmqueue.workload.request import Request

ARRIVAL_STREAM, PROMPT_STREAM, OUTPUT_STREAM = 0, 1, 2


class RequestArrays:
    """A request stream as columns: ``request_id``, ``arrival_s``, ``prompt_tokens``,
    ``output_tokens`` (numpy arrays, read-only) and each request's class.

    Classes are stored as ``class_index`` (int32) into the tuple ``classes``; ``class_name``
    gives the per-request names as an array. ``len()``, iteration and ``[i]`` give
    :class:`Request` objects; ``to_columns()`` gives a dict in the record schema's names.
    """

    def __init__(self, request_id, arrival_s, prompt_tokens, output_tokens, class_name="default"):
        cols = [np.asarray(request_id, dtype=np.int64), np.asarray(arrival_s, dtype=np.float64),
                np.asarray(prompt_tokens, dtype=np.int64), np.asarray(output_tokens, dtype=np.int64)]
        n = cols[0].size
        if any(c.ndim != 1 or c.size != n for c in cols):
            raise InputError("request_arrays", "all columns must be 1-d arrays of the same length")
        if isinstance(class_name, str):
            classes, index = (class_name,), np.zeros(n, dtype=np.int32)
        else:
            names = np.asarray(class_name, dtype=str)
            if names.shape != (n,):
                raise InputError("class_name", f"need one class per request (got {names.shape}, "
                                 f"expected ({n},))")
            uniq, inv = np.unique(names, return_inverse=True)
            classes, index = tuple(str(u) for u in uniq), inv.astype(np.int32)
        for c in (*cols, index):
            c.setflags(write=False)
        self.request_id, self.arrival_s, self.prompt_tokens, self.output_tokens = cols
        self.class_index = index
        self.classes = classes

    @property
    def class_name(self) -> np.ndarray:
        """Each request's class name (a str array built on demand)."""
        return np.asarray(self.classes)[self.class_index]

    def __len__(self) -> int:
        return int(self.request_id.size)

    def __getitem__(self, i: int) -> Request:
        return Request(int(self.request_id[i]), float(self.arrival_s[i]), int(self.prompt_tokens[i]),
                       int(self.output_tokens[i]), self.classes[self.class_index[i]])

    def __iter__(self):
        names = self.classes
        for rid, t, s, o, c in zip(self.request_id.tolist(), self.arrival_s.tolist(),
                                   self.prompt_tokens.tolist(), self.output_tokens.tolist(),
                                   self.class_index.tolist()):
            yield Request(rid, t, s, o, names[c])

    def to_requests(self) -> list[Request]:
        return list(self)

    def to_columns(self) -> dict[str, np.ndarray]:
        """Columns under the record schema's names (``class`` for the class name)."""
        return {"request_id": self.request_id, "class": self.class_name, "arrival_s": self.arrival_s,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}

    def __eq__(self, other) -> bool:
        if not isinstance(other, RequestArrays):
            return NotImplemented
        return (len(self) == len(other)
                and all(np.array_equal(getattr(self, k), getattr(other, k))
                        for k in ("request_id", "arrival_s", "prompt_tokens", "output_tokens"))
                and np.array_equal(self.class_name, other.class_name))

    __hash__ = None

    def __repr__(self) -> str:
        span = f", last arrival {self.arrival_s[-1]:.6g} s" if len(self) else ""
        return f"RequestArrays({len(self)} requests{span}, classes {list(self.classes)})"

    @staticmethod
    def merge(*parts: "RequestArrays") -> "RequestArrays":
        """Superpose streams (e.g. one per class) in arrival order; ids are renumbered 0..n-1.

        Ties in arrival time keep the order of ``parts`` (stable sort).
        """
        if not parts:
            raise InputError("parts", "give at least one RequestArrays to merge")
        t = np.concatenate([p.arrival_s for p in parts])
        order = np.argsort(t, kind="stable")
        names = np.concatenate([p.class_name for p in parts])
        return RequestArrays(np.arange(t.size), t[order],
                             np.concatenate([p.prompt_tokens for p in parts])[order],
                             np.concatenate([p.output_tokens for p in parts])[order],
                             names[order] if t.size else "default")


@dataclass(frozen=True)
class Workload:
    """An open-loop workload: an arrival process with independent prompt and output length
    distributions, or with joint (prompt, output) pairs.

    Each field accepts an object or a spec string (parsed with the field's name in errors):
    ``Workload("poisson:5", prompt="uniform:10:1600", output="uniform:10:1600")`` or
    ``Workload("gamma:5:cv=2", joint="joint:trace.csv")``. Prompt and output lengths are
    independent unless given jointly.
    """

    arrival: ArrivalProcess
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    joint: JointLengths | None = None
    class_name: str = "default"

    def __post_init__(self):
        object.__setattr__(self, "arrival", parse_arrival(self.arrival, "arrival"))
        if self.joint is not None:
            if self.prompt is not None or self.output is not None:
                raise InputError("lengths", "give prompt and output distributions, or joint "
                                 "lengths, not both")
            object.__setattr__(self, "joint", parse_joint(self.joint, "lengths"))
        else:
            if self.prompt is None or self.output is None:
                raise InputError("lengths", "give both prompt and output distributions, or joint "
                                 "lengths", "e.g. prompt='uniform:10:1600', output='uniform:10:1600'")
            object.__setattr__(self, "prompt", parse_length(self.prompt, "prompt"))
            object.__setattr__(self, "output", parse_length(self.output, "output"))
        if not isinstance(self.class_name, str) or not self.class_name:
            raise InputError("class_name", f"must be a non-empty string (got {self.class_name!r})")

    @property
    def rate(self) -> float:
        """Long-run arrival rate ``lam`` (req/s)."""
        return self.arrival.rate

    def mean_prompt(self) -> float:
        return self.joint.mean_prompt() if self.joint is not None else self.prompt.mean()

    def mean_output(self) -> float:
        return self.joint.mean_output() if self.joint is not None else self.output.mean()

    def specs(self) -> dict[str, str]:
        """The canonical spec strings, e.g. for a report or a JSON record of the run."""
        d = {"arrival": self.arrival.spec}
        if self.joint is not None:
            d["lengths"] = self.joint.spec
        else:
            d["prompt"], d["output"] = self.prompt.spec, self.output.spec
        d["class"] = self.class_name
        return d

    def generate(self, seed, *, n: int | None = None, duration: float | None = None) -> RequestArrays:
        """Generate ``n`` requests, or all arriving in ``[0, duration)`` seconds.

        ``seed`` is a non-negative int (or a ``np.random.SeedSequence``); see the module
        docstring for the streams. Vectorized: a million requests take well under a second.
        """
        if (n is None) == (duration is None):
            raise InputError("n/duration", "give exactly one of n (requests) and duration (s)")
        if n is not None:
            n = positive_int("n", n, minimum=0)
        else:
            duration = positive("duration", duration)
        check_stream_size(n=n, duration=duration, rate=self.arrival.rate)
        arr_ss, prompt_ss, output_ss = _streams(seed, 3)
        t = self.arrival.sample_times(np.random.default_rng(arr_ss), n=n, horizon=duration)
        m = t.size
        if self.joint is not None:
            s, o = self.joint.sample(np.random.default_rng(prompt_ss), m)
        else:
            s = self.prompt.sample(np.random.default_rng(prompt_ss), m)
            o = self.output.sample(np.random.default_rng(output_ss), m)
        return RequestArrays(np.arange(m, dtype=np.int64), t, s, o, self.class_name)


MAX_STREAM_REQUESTS = 3_000_000
"""The most requests one generated stream may hold: the simulator keeps about 500 bytes per
request (measured), so this bounds a run near 1.5 GB. Longer runs: several seeds, or a shorter
window."""


def check_stream_size(*, n: int | None, duration: float | None, rate: float) -> None:
    """Refuse, before generating, a stream of more than :data:`MAX_STREAM_REQUESTS` requests
    (``n`` given, or ``rate x duration`` expected), with the estimate and the flags to change."""
    if n is not None:
        if n > MAX_STREAM_REQUESTS:
            raise InputError("num_requests", f"{n:,} requests are more than the {MAX_STREAM_REQUESTS:,} one run "
                             "holds in memory (about 500 bytes each)", "give a smaller --num-requests")
        return
    expected = rate * duration
    if expected > MAX_STREAM_REQUESTS:
        raise InputError("duration", f"about {expected:.3g} requests would arrive ({rate:g} req/s x {duration:g} s), "
                         f"more than the {MAX_STREAM_REQUESTS:,} one run holds in memory (about 500 bytes each)",
                         f"give --duration {0.9 * MAX_STREAM_REQUESTS / rate:.3g} or less, or a lower rate")


def _streams(seed, k: int) -> list[np.random.SeedSequence]:
    """The first ``k`` children of ``SeedSequence(seed)``, as ``spawn(k)`` on a fresh one gives.

    Built from the spawn key rather than by calling ``spawn`` so that a ``SeedSequence`` passed
    in twice gives the same streams twice (``spawn`` advances its counter).
    """
    if isinstance(seed, np.random.SeedSequence):
        ss = seed
    elif isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
        raise InputError("seed", f"must be a non-negative integer (got {seed!r})")
    else:
        ss = np.random.SeedSequence(int(seed))
    return [np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, i), pool_size=ss.pool_size)
            for i in range(k)]
