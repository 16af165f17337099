"""The planner's configuration space: GPU type x tensor-parallel size x replicas x
``max_num_seqs`` x ``max_num_batched_tokens`` x router (aggregated serving: every replica
prefills and decodes; P/D splits are not in this space yet).

A :class:`Config` is one deployment; :func:`configurations` enumerates the cartesian product;
:func:`parse_ints` reads the command line's lists (``1,2,4`` or ranges ``1..16``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llmqueue.errors import InputError

#: Defaults of the command line.
DEFAULT_TP = (1, 2, 4)
DEFAULT_REPLICAS = tuple(range(1, 17))
DEFAULT_MAX_NUM_SEQS = (64, 128, 256)
DEFAULT_MAX_NUM_BATCHED_TOKENS = (2048, 8192)
DEFAULT_ROUTERS = ("least-outstanding",)


@dataclass(frozen=True, order=True)
class Config:
    """One aggregated deployment: ``replicas`` replicas of ``tensor_parallel_size`` GPUs of type
    ``gpu``, each a vLLM engine with these knobs, behind ``router``."""

    gpu: str
    tensor_parallel_size: int
    replicas: int
    max_num_seqs: int
    max_num_batched_tokens: int
    router: str

    @property
    def gpus(self) -> int:
        """GPUs the deployment rents: ``tp x replicas``."""
        return self.tensor_parallel_size * self.replicas

    def knobs(self) -> dict:
        """The scenario overrides under their flag (vLLM) names."""
        return asdict(self)

    def label(self) -> str:
        return (f"{self.replicas} x {self.gpu} tp{self.tensor_parallel_size}, max_num_seqs {self.max_num_seqs}, "
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
            if ".." in t:
                a, b = (int(x) for x in t.split("..", 1))
                if b < a:
                    raise ValueError
                out.update(range(a, b + 1))
            else:
                out.add(int(t))
        except ValueError:
            raise InputError(name, f"{t!r} is not an integer or a range A..B", "e.g. 1,2,4 or 1..16") from None
    bad = sorted(v for v in out if v < minimum)
    if bad:
        raise InputError(name, f"{bad[0]} is below {minimum}", f"give values >= {minimum}")
    return tuple(sorted(out))


def parse_names(name: str, text) -> tuple[str, ...]:
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = tuple(dict.fromkeys(str(t).strip() for t in items if str(t).strip()))
    return out


def configurations(*, gpus, tp, replicas, max_num_seqs, max_num_batched_tokens, routers) -> list[Config]:
    """The cartesian product of the axes (GPU names resolved to the catalog's)."""
    from llmqueue.hardware import get_gpu

    names = tuple(dict.fromkeys(get_gpu(g).name for g in gpus))
    return [Config(g, t, r, s, b, rt) for g in names for t in tp for r in replicas for s in max_num_seqs
            for b in max_num_batched_tokens for rt in routers]
