"""Scenario files: one YAML file holding a workload, a deployment, SLOs and run settings.

``load_scenario(path_or_name)`` validates a file (or a shipped example: ``chat``, ``code``,
``rag``, ``summarization``, ``mixed``; the fleets ``pd``, ``lanes``, ``noon-spike``, ``tiers``) into a
:class:`~llmqueue.scenario.model.Scenario`; see :mod:`llmqueue.scenario.model` for the schema and
:mod:`llmqueue.scenario.fleet` for ``deployment.pools`` and the rest of a fleet (``Scenario.fleet``:
its :class:`~llmqueue.cluster.spec.FleetSpec`). ``scenario_with(path_or_name, **knobs)`` applies
knob overrides (flag names) first (:mod:`llmqueue.scenario.override`). ``llmqueue scenario
check FILE`` prints the resolved summary. Names are imported lazily.
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports


_EXPORTS = {
    "Scenario": "model",
    "load_scenario": "load",
    "validate_scenario": "load",
    "example_names": "load",
    "example_path": "load",
    "scenario_with": "override",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ())
