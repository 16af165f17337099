"""Plots and a single-file HTML report of a run directory, a sweep directory or a seed's figure.

- ``build``: :func:`build_report` (``llmqueue report DIR -o report.html``).
- ``page``: one page written with its figures and PNGs (:func:`~llmqueue.report.page.write`), :class:`Report`.
- ``plan_page``: the report of a plan directory.
- ``sources``: what a report reads: run directories (and ``validate.json`` / a simulated twin),
  sweep directories and the ``sweep.json`` interface (:func:`load`, :func:`kind_of`).
- ``series``: the numbers behind the plots (queue and KV series, latencies over time and per
  class, output tokens per second, thinned CDFs, the latency decomposition, the verdict note,
  :func:`knee_index`).
- ``run_panels`` / ``sweep_panels``: the interactive figures of a run and of a sweep, each with
  the caption of what it draws; panels without data are left out and named.
- ``interactive``: the plotly helpers (layout, log/linear buttons, the inline plotly.js).
- ``figures``: the static matplotlib figures written as PNG (Agg canvas, no pyplot), :func:`png_bytes`.
- ``html``: the page (inline CSS, inline plotly.js and figures, no network).
- ``seeds``: Nie et al.'s Figure 2 (:func:`seed004_figure2`) and Inference Foundations' (:func:`seed002_figure2`).

Names are imported lazily so ``import llmqueue.report`` does not import matplotlib or plotly.
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports

_EXPORTS = {
    "build_report": "build",
    "run_report": "build",
    "sweep_report": "build",
    "default_png_dir": "page",
    "Report": "page",
    "load": "sources",
    "load_run": "sources",
    "load_sweep": "sources",
    "kind_of": "sources",
    "RunData": "sources",
    "SweepData": "sources",
    "SweepPoint": "sources",
    "knee_index": "series",
    "verdict_note": "series",
    "png_bytes": "figures",
    "seed004_figure2": "seeds",
    "seed002_figure2": "seeds",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, tuple(__all__))
