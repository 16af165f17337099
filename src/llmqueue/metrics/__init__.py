"""Run summaries from records: vLLM bench serve metrics, confidence intervals, SLO goodput,
Little's-law check and a stability verdict. The same code serves simulated and measured runs.

Submodules:
- ``summary``: :func:`summarize` (one dict per run, vLLM key names plus intervals and checks),
  :func:`summary_of` (a run directory's, or its records' where a killed writer left none).
- ``ci``: batch-means / batch-quantile / replication confidence intervals (:class:`Interval`).
- ``little``: :func:`little_check` (time-average number in system vs ``lam * W``).
- ``stability``: :func:`stability_verdict` (trend of the number in system after warm-up).
- ``slo``: :func:`request_goodput` (vLLM's definition), :func:`slo_attainment` (per class).
- ``fleet``: :func:`fleet_summary` (a fleet's pools and classes, retries, replicas, queues, cost,
  quality and the recovery after a spike), :func:`recovery_time`.

Names are imported lazily so ``import llmqueue.metrics`` stays cheap.
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports


_EXPORTS = {
    "summarize": "summary",
    "summary_of": "summary",
    "itl_samples": "summary",
    "METRICS": "summary",
    "Interval": "ci",
    "batch_means_ci": "ci",
    "batch_quantile_ci": "ci",
    "replication_ci": "ci",
    "weighted_percentile": "ci",
    "little_check": "little",
    "LittleCheck": "little",
    "in_system_integral": "little",
    "stability_verdict": "stability",
    "StabilityVerdict": "stability",
    "request_goodput": "slo",
    "slo_attainment": "slo",
    "good_mask": "slo",
    "parse_targets": "slo",
    "fleet_summary": "fleet",
    "recovery_time": "fleet",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, tuple(__all__))
