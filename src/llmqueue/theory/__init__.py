"""Closed-form queueing results for LLM serving: pure functions, no simulation.

Submodules:
- ``littles_law``: Little's law (``little``).
- ``classic``: M/M/1, M/D/1, M/G/1 (Pollaczek-Khinchine), M/M/c (Erlang C), M/M/c/K,
  G/G/1 (Kingman), G/G/c (Allen-Cunneen).
- ``batch``: the batch-service model of Inference Foundations (T_svc(B) = T_fixed + t_req*B).
- ``kv``: the KV-memory stability model of Nie et al. 2026 (mu = M / (b E[g])).
- ``pd``: prefill/decode disaggregation as a tandem: each pool's ``mu`` and the KV link's load.
- ``cost``: tokens per dollar, cost per million tokens, SLO error budgets, replicas.

Names are imported lazily on first use so that ``import llmqueue.theory`` is cheap.
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports


_EXPORTS = {
    "little": "littles_law",
    "LittleResult": "littles_law",
    "mm1": "classic",
    "md1": "classic",
    "mg1": "classic",
    "mmc": "classic",
    "mmck": "classic",
    "mmck_distribution": "classic",
    "gg1_kingman": "classic",
    "ggc_allen_cunneen": "classic",
    "erlang_b": "classic",
    "erlang_c": "classic",
    "mmc_wait_tail": "classic",
    "mmc_response_tail": "classic",
    "mmc_wait_quantile": "classic",
    "mmc_response_quantile": "classic",
    "MM1Result": "classic",
    "MG1Result": "classic",
    "MMcResult": "classic",
    "MMcKResult": "classic",
    "GGApproxResult": "classic",
    "service_time": "batch",
    "b_min_stability": "batch",
    "b_min_target": "batch",
    "accumulation_delay": "batch",
    "erlang_batch_wait": "batch",
    "batch_row": "batch",
    "batch_action": "batch",
    "choose_batch_size": "batch",
    "candidate_sizes": "batch",
    "batch_table": "batch",
    "BatchMin": "batch",
    "BatchRow": "batch",
    "BatchDecision": "batch",
    "BatchTable": "batch",
    "g_steps": "kv",
    "g_exact": "kv",
    "g_closed": "kv",
    "prefill_work": "kv",
    "expected_g": "kv",
    "kv_stability": "kv",
    "verdict": "kv",
    "mu_mix": "kv",
    "replicas_needed": "kv",
    "b_bar": "kv",
    "KvStability": "kv",
    "BBar": "kv",
    "token_cost": "cost",
    "tokens_per_dollar": "cost",
    "dollars_per_million_tokens": "cost",
    "error_budget": "cost",
    "replicas_for_utilization": "cost",
    "TokenCost": "cost",
    "ErrorBudget": "cost",
    "ReplicaCount": "cost",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ())
