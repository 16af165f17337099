"""Interactive figures (plotly) for the page: shared layout, log-axis buttons, the inline script.

Each figure of a report is a :class:`plotly.graph_objects.Figure` rendered as a ``<div>`` and a
``Plotly.newPlot`` call; plotly.js itself is inlined once in the page's head
(:func:`plotly_js`), so the page stays one file that needs no network: hover, zoom, pan, the
legend's toggles, the log/linear buttons and the modebar's "download as PNG" all run offline.
The PNG files of ``--png-dir`` are drawn by :mod:`llmqueue.report.figures` (matplotlib).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: plotly's config for every figure: no logo (it links to plotly's site), PNG export at 2x.
CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
          "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
          "toImageButtonOptions": {"format": "png", "scale": 2}}
FONT = '-apple-system, "Segoe UI", Helvetica, Arial, sans-serif'


@dataclass
class Panel:
    """One figure of a report: the interactive figure, its optional PNG twin and the caption."""

    name: str     # file stem of the PNG and the div's id
    title: str    # the section heading
    plot: object  # plotly Figure
    caption: str
    png: object = None  # matplotlib Figure written to --png-dir, or None


def figure(rows: int = 1, cols: int = 1, *, titles=None, height: int = 380, shared_x: bool = False,
           shared_y: bool = False, widths=None, hovermode: str = "closest", legend_below: bool = True):
    """An empty figure of ``rows`` x ``cols`` subplots in the report's style."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_xaxes=shared_x, shared_yaxes=shared_y,
                        column_widths=widths, horizontal_spacing=0.07 if cols > 1 else None,
                        vertical_spacing=0.08 if rows > 1 else None)
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=60, r=20, t=76, b=40),
                      font=dict(family=FONT, size=12), hovermode=hovermode,
                      hoverlabel=dict(namelength=-1), title_font_size=14)
    if legend_below:
        fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.16, xanchor="left", x=0))
        fig.update_layout(margin=dict(b=90))
    fig.update_annotations(font_size=13)  # the subplot titles
    return fig


def axis_names(fig, letter: str) -> list[str]:
    """Layout names of the figure's ``x`` or ``y`` axes (``xaxis``, ``xaxis2``, ...)."""
    return sorted(k for k in fig.layout.to_plotly_json() if k.startswith(f"{letter}axis"))


def log_buttons(fig, axes: str = "y", *, log: bool = False, label: str | None = None) -> None:
    """Linear / log buttons above the plot for every ``axes`` axis (``"x"``, ``"y"`` or ``"xy"``);
    ``log``: start on log axes."""
    names = [n for a in axes for n in axis_names(fig, a)]
    kind = "log" if log else "linear"
    for n in names:
        fig.layout[n].type = kind
    what = label or {"x": "x axis", "y": "y axis", "xy": "axes"}[axes]
    buttons = [dict(label=f"{what}: {k}", method="relayout", args=[{f"{n}.type": k for n in names}])
               for k in ("linear", "log")]
    fig.update_layout(updatemenus=[dict(type="buttons", direction="right", buttons=buttons, active=int(log),
                                        x=1.0, xanchor="right", y=1.0, yanchor="bottom", pad=dict(t=0, b=20),
                                        showactive=True, font=dict(size=11))])


def wide(x) -> bool:
    """Whether positive values span more than two decades (then a log axis reads better)."""
    x = np.asarray(x, dtype=np.float64)
    pos = x[np.isfinite(x) & (x > 0)]
    return bool(len(pos)) and pos.max() / pos.min() > 100


def time_scale(t) -> tuple[float, str]:
    """Seconds, or minutes / hours for long runs: ``(divide by, unit)``."""
    from llmqueue.report.figures import _time_axis

    return _time_axis(np.asarray(t, dtype=np.float64))


def shade_warmup(fig, warmup_s, scale: float) -> bool:
    """Grey band over the warm-up on every subplot; whether there was one."""
    if isinstance(warmup_s, (int, float)) and math.isfinite(warmup_s) and warmup_s > 0:
        fig.add_vrect(x0=0, x1=warmup_s / scale, fillcolor="#bbbbbb", opacity=0.25, line_width=0, layer="below",
                      row="all", col="all")
        return True
    return False


def arr(x, digits: int = 6) -> np.ndarray:
    """Values rounded to ``digits`` significant digits (a smaller page, the same plot)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.where(np.isfinite(x) & (x != 0), np.floor(np.log10(np.abs(x))), 0.0)
    f = 10.0 ** (digits - 1 - mag)
    return np.round(x * f) / f


def div(fig, name: str) -> str:
    """The figure as a ``<div>`` and its ``Plotly.newPlot`` call (plotly.js itself not included)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}", config=CONFIG,
                       default_width="100%", default_height=f"{fig.layout.height or 380}px")


def plotly_js() -> str:
    """plotly.js (minified) for one inline ``<script>`` in the page's head."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()
