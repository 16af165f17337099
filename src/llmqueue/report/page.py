"""One report page: the HTML file with its interactive figures inlined, and the figures' PNGs.

A page's body holds :func:`fig` placeholders; :func:`write` renders each panel
(:class:`~llmqueue.report.interactive.Panel`) into its placeholder, writes the PNG of those that
have a static twin to ``png_dir`` (default: ``<report stem>_png/`` beside the HTML) and the page.
Every report (:mod:`~llmqueue.report.build`, :mod:`~llmqueue.report.plan_page`,
:mod:`~llmqueue.report.seeds`) is written here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from llmqueue.errors import InputError
from llmqueue.report import html as H


@dataclass
class Report:
    """What a report wrote (:func:`write`): the page, its PNGs, what it was made from, its notes."""

    kind: str  # "run", "sweep", "kv-stability-figure", "batch-figure"
    html_path: Path
    png_paths: list = field(default_factory=list)
    source: str | None = None
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "html": str(self.html_path), "png": [str(p) for p in self.png_paths],
                "source": self.source, "notes": list(self.notes)}


_FIG = re.compile(r"<!--figure:(\w+)-->")


def fig(name: str) -> str:
    """A placeholder in the body that :func:`write` replaces with the rendered figure ``name``."""
    return f"<!--figure:{name}-->"


def default_png_dir(out) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}_png")


def _version() -> str:
    from llmqueue import __version__

    return __version__


def check_output(out) -> Path:
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise InputError("output", f"{out} does not end in .html", "name the report e.g. report.html")
    if out.is_dir():
        raise InputError("output", f"{out} is a directory", "give a file name such as report.html")
    return out


def write(kind: str, out, png_dir, title: str, subtitle: str, body: list, panels: list, *,
          source: str | None = None, notes=(), bar=None) -> Report:
    """Render ``panels`` (:class:`~llmqueue.report.interactive.Panel`) into the page where ``body``
    holds their :func:`fig` placeholders, write each panel's PNG (those that have one) and the page.
    ``bar``: a progress bar, moved one step per PNG and one for the page."""
    from llmqueue._files import write_atomic
    from llmqueue.report import interactive as I
    from llmqueue.report.figures import png_bytes

    out = check_output(out)
    png_dir = Path(png_dir) if png_dir is not None else default_png_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    rendered = {}
    for p in panels:
        if p.png is not None:
            path = png_dir / f"{p.name}.png"
            write_atomic(path, png_bytes(p.png), field="png_dir")
            paths.append(path)
            if bar is not None:
                bar.update(1)
        rendered[p.name] = H.plot_html(I.div(p.plot, p.name), p.caption)
    parts = [_FIG.sub(lambda m: rendered.get(m.group(1), ""), b) for b in body]
    footer = (f"Made by llmqueue {H.esc(_version())} <code>llmqueue report</code>. The page is self-contained "
              "(plotly.js is inlined; it needs no network). On a figure: hover for values, drag to zoom, "
              "double-click to zoom out, click a legend entry to hide it; the buttons above a figure switch "
              "between linear and log axes and the camera icon saves it as PNG.")
    if paths:
        footer += f" The static figures are also in {H.esc(str(png_dir))}/."
    head = H.script(I.plotly_js()) if panels else ""
    write_atomic(out, H.page(title=title, subtitle=subtitle, body=parts, head_extra=head, footer=footer))
    if bar is not None:
        bar.update(1)
    return Report(kind=kind, html_path=out, png_paths=paths, source=source, notes=list(notes))
