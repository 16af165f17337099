"""Closed-form queueing results for LLM serving: pure functions, no simulation.

Submodules:
- ``little``: Little's law.
- ``classic``: M/M/1, M/D/1, M/G/1 (Pollaczek-Khinchine), M/M/c (Erlang C), M/M/c/K,
  G/G/1 (Kingman), G/G/c (Allen-Cunneen).
- ``batch``: the batch-service model of seed 002 (T_svc(B) = T_fixed + t_req*B).
- ``kv``: the KV-memory stability model of seed 004 (mu = M / (b E[g])).
- ``cost``: tokens per dollar, cost per million tokens, SLO error budgets, replicas.

Names are imported lazily on first use so that ``import llmqueue.theory`` is cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "little": "little",
    "LittleResult": "little",
}


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'llmqueue.theory' has no attribute {name!r}")
    return getattr(importlib.import_module(f"llmqueue.theory.{mod}"), name)


def __dir__():
    return sorted(_EXPORTS)
