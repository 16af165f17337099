"""Joint prompt/output lengths ``(s, o)`` observed together, so their dependence is kept.

Nie et al. 2026 insists on it: ``E[g(s, o)]`` depends on the joint law ``p(s, o)``, not only on the
marginals ("collect pairs (s, o), not isolated means"). :class:`JointLengths` resamples whole
observed pairs with replacement.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue._validate import positive_int
from llmqueue.errors import InputError
from llmqueue.workload.lengths import Empirical, as_tokens


class JointLengths:
    """The empirical joint distribution of (prompt, output) token counts.

    ``JointLengths(prompts, outputs)`` from equal-length arrays, or
    ``joint:PATH[:prompt=COL][:output=COL]`` (see :mod:`llmqueue.workload.tables` for the file
    formats; the known column names of the shared traces are found without naming them).
    ``sample(rng, n)`` draws ``n`` row indices uniformly with replacement and returns that
    row's pair, so every sampled pair was observed.
    """

    def __init__(self, prompts, outputs, *, spec: str | None = None):
        self._s = as_tokens("prompts", prompts)
        self._o = as_tokens("outputs", outputs)
        if self._s.shape != self._o.shape:
            raise InputError("outputs", f"need as many outputs as prompts (got {self._o.size} "
                             f"and {self._s.size})")
        self._s.setflags(write=False)
        self._o.setflags(write=False)
        self.spec = spec if spec is not None else f"joint:<{self._s.size} pairs>"

    @classmethod
    def from_file(cls, path: str, prompt: str | None = None, output: str | None = None) -> "JointLengths":
        from llmqueue.workload.tables import read_table

        table = read_table(path)
        if len(table.names) < 2:
            raise InputError("file", f"{path!r} has one column; joint lengths need a prompt and an "
                             "output column")
        ps, os_ = table.resolve(prompt, "prompt"), table.resolve(output, "output")
        if ps == os_:
            raise InputError("output", f"prompt and output are the same column {ps!r}")
        return cls(table.tokens(ps), table.tokens(os_),
                   spec=f"joint:{path}:prompt={ps}:output={os_}")

    def __len__(self) -> int:
        return int(self._s.size)

    def __repr__(self) -> str:
        return f"JointLengths({self.spec!r})"

    @property
    def prompts(self) -> np.ndarray:
        return self._s

    @property
    def outputs(self) -> np.ndarray:
        return self._o

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) pairs, resampled whole; two int64 arrays."""
        n = positive_int("n", n, minimum=0)
        idx = rng.integers(0, self._s.size, n)
        return self._s[idx], self._o[idx]

    def pmf_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct pairs ``(prompts, outputs, probs)``, sorted by prompt then output."""
        pairs, counts = np.unique(np.stack([self._s, self._o], axis=1), axis=0, return_counts=True)
        return pairs[:, 0].copy(), pairs[:, 1].copy(), counts / counts.sum()

    def prompt_dist(self) -> Empirical:
        """The prompt marginal as an :class:`Empirical`."""
        return Empirical(self._s, spec=f"{self.spec}#prompt")

    def output_dist(self) -> Empirical:
        """The output marginal as an :class:`Empirical`."""
        return Empirical(self._o, spec=f"{self.spec}#output")

    def mean_prompt(self) -> float:
        return float(self._s.mean())

    def mean_output(self) -> float:
        return float(self._o.mean())

    def correlation(self) -> float:
        """Pearson correlation of prompt and output lengths; NaN if either is constant."""
        s, o = self._s.astype(np.float64), self._o.astype(np.float64)
        ds, do = s - s.mean(), o - o.mean()
        den = math.sqrt(float(np.dot(ds, ds)) * float(np.dot(do, do)))
        return float(np.dot(ds, do)) / den if den > 0 else math.nan

    def expect(self, f) -> float:
        """``E[f(s, o)]`` over the observed pairs; ``f`` takes two float64 arrays (vectorized).

        For example Nie et al.'s ``E[g(s, o)]``.
        """
        return float(np.mean(f(self._s.astype(np.float64), self._o.astype(np.float64))))
