"""``Trace``: a recorded (or generated) request stream in columnar form.

The canonical in-memory form of any trace, whatever file it came from: sorted arrival
times in seconds from the first request, prompt and output lengths, and optionally a
class name per request and the prefix-block hash ids (Mooncake). Loaders in
``llmqueue.workload.traces`` build it; ``llmqueue.workload.stats`` measures it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Trace:
    """Columns: ``arrival_s`` (float64, sorted, starting at 0), ``prompt_tokens`` and
    ``output_tokens`` (int64 >= 0), optional ``class_name`` (array of str), optional
    ``hash_ids`` (list of int64 arrays, one per request), ``source`` (path or spec) and
    ``repairs`` (human-readable notes of every repair the loader made)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    class_name: np.ndarray | None = None
    hash_ids: list | None = None
    source: str = ""
    repairs: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def mean_rate(self) -> float:
        """``(n - 1) / span``: the mean arrival rate (req/s), as the traces README defines it."""
        return (len(self) - 1) / self.span_s if self.span_s > 0 else float("nan")
