"""One self-contained HTML page: inline CSS, inline plotly.js and figures, no network.

Nothing in the page refers outside it: plotly.js is one inline ``<script>`` in the head (see
:mod:`llmqueue.report.interactive`), each figure an inline ``<div>`` and its ``Plotly.newPlot``
call, the stylesheet is inline and the favicon is an empty ``data:`` URI (so a browser asks
nothing of the network or the disk). Every piece of text is escaped.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

CSS = """
:root { --fg: #1d1d1f; --muted: #6e6e73; --line: #d9d9de; --ok: #1e7b34; --bad: #b3261e; --mid: #8a6d00; }
* { box-sizing: border-box; }
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--fg); margin: 0;
       background: #f6f6f8; font-size: 14px; line-height: 1.45; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 28px 40px; background: #fff; min-height: 100vh; }
header { border-bottom: 1px solid var(--line); padding-bottom: 10px; margin-bottom: 8px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.sub { color: var(--muted); font-size: 13px; margin: 0; word-break: break-all; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; font-weight: 600; font-size: 13px;
         color: #fff; margin-right: 8px; }
.badge.ok { background: var(--ok); } .badge.bad { background: var(--bad); } .badge.mid { background: var(--mid); }
.verdict { margin: 10px 0 0; font-size: 14px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ececf0; text-align: right; vertical-align: top; }
th { background: #f2f2f5; font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
td.text { text-align: left; }
tr.group td { background: #fafafa; font-weight: 600; text-align: left; color: var(--muted); }
.ci { color: var(--muted); font-size: 12px; }
.cols { display: flex; flex-wrap: wrap; gap: 28px; align-items: flex-start; }
figure { margin: 8px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figure.plot { border: 1px solid #eee; padding: 4px 4px 6px; }
figure.plot figcaption { padding: 0 8px; }
figcaption { color: var(--muted); font-size: 12.5px; max-width: 1100px; }
.note { color: var(--muted); font-size: 12.5px; }
footer { margin-top: 30px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); padding-top: 8px; }
"""


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def num(x, digits: int = 4) -> str:
    """A number for a table: 4 significant digits, thousands separators, "-" for none."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x != 0 and (abs(x) >= 1e9 or abs(x) < 1e-4):
            return f"{x:.{digits}g}"
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def with_ci(value, ci) -> str:
    """``value [lo, hi]`` as HTML (the interval muted), escaped."""
    s = esc(num(value))
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and value is not None:
        s += f' <span class="ci">[{esc(num(ci[0]))}, {esc(num(ci[1]))}]</span>'
    return s


@dataclass
class Table:
    """A table; cells: numbers (formatted, right-aligned), text (escaped, left-aligned) or :class:`Raw` HTML
    (right-aligned, e.g. :func:`with_ci`). ``group(title)`` adds a sub-heading row."""

    headers: list
    rows: list = field(default_factory=list)
    title: str | None = None

    def add(self, *cells):
        row = []
        for c in cells:
            if isinstance(c, Raw):
                row.append(("", str(c)))
            elif isinstance(c, str):
                row.append((' class="text"', esc(c)))
            else:
                row.append(("", esc(num(c))))
        self.rows.append(row)

    def group(self, title: str):
        self.rows.append(("group", title))

    def html(self) -> str:
        out = []
        if self.title:
            out.append(f"<h3>{esc(self.title)}</h3>")
        out.append("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in self.headers) + "</tr></thead><tbody>")
        for row in self.rows:
            if isinstance(row, tuple) and row[0] == "group":
                out.append(f'<tr class="group"><td colspan="{len(self.headers)}">{esc(row[1])}</td></tr>')
                continue
            out.append("<tr>" + "".join(f"<td{cls}>{c}</td>" for cls, c in row) + "</tr>")
        out.append("</tbody></table>")
        return "".join(out)


class Raw(str):
    """A string already escaped (HTML)."""


def plot_html(div: str, caption: str | None = None) -> str:
    """An interactive figure (its ``<div>`` and script, from :func:`llmqueue.report.interactive.div`)
    with its caption."""
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure class="plot">{div}{cap}</figure>'


def script(js: str) -> str:
    """An inline script; a ``</script`` inside it (in a string) is escaped so it cannot end the element."""
    import re

    return "<script>" + re.sub(r"</(script)", r"<\\/\1", js, flags=re.I) + "</script>"


def badge(word: str) -> str:
    cls = {"bounded": "ok", "stable": "ok", "growing": "bad", "unstable": "bad", "overloaded": "bad"}.get(word, "mid")
    return f'<span class="badge {cls}">{esc(word)}</span>'


def page(*, title: str, subtitle: str, body: list[str], head_extra: str = "", footer: str = "") -> str:
    """The whole document; ``body`` holds HTML fragments (already escaped)."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<meta name=\"generator\" content=\"llmqueue report\">"
        "<link rel=\"icon\" href=\"data:,\">"
        f"<title>{esc(title)}</title><style>{CSS}</style>{head_extra}</head>\n<body><main>"
        f"<header><h1>{esc(title)}</h1><p class=\"sub\">{esc(subtitle)}</p></header>\n"
        + "\n".join(body)
        + f"\n<footer>{footer}</footer></main></body></html>\n"
    )


def section(title: str, *parts: str, anchor: str | None = None) -> str:
    a = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{a}><h2>{esc(title)}</h2>" + "".join(parts) + "</section>"


def para(text: str, cls: str = "note") -> str:
    return f'<p class="{esc(cls)}">{esc(text)}</p>'
