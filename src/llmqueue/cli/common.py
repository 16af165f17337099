"""Shared CLI plumbing: the command class, ``--json`` output and table printing."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterable, Sequence

import click

from llmqueue.errors import LlmqueueError


class FieldError(Exception):
    """An :class:`LlmqueueError` raised inside a subcommand, with that command's context
    so the error line can name the flag (``--lam``) rather than the library field (``lam``)."""

    def __init__(self, err: LlmqueueError, ctx: click.Context):
        super().__init__(str(err))
        self.err, self.ctx = err, ctx


class Command(click.Command):
    """click.Command that hands library errors to ``main`` together with its context, and
    Ctrl-C as :class:`~llmqueue.cli.interrupt.Interrupted` naming what it had written."""

    def invoke(self, ctx):
        import time

        started = time.time()
        try:
            return super().invoke(ctx)
        except LlmqueueError as err:
            raise FieldError(err, ctx) from None
        except KeyboardInterrupt:
            from llmqueue.cli.interrupt import Interrupted, kept

            raise Interrupted(kept(ctx.params, started)) from None


def command(name: str | None = None, **kwargs):
    """``@click.command`` using :class:`Command`."""
    kwargs.setdefault("cls", Command)
    kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"], "max_content_width": 100})
    return click.command(name, **kwargs)


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return _clean(obj.to_dict())
    if hasattr(obj, "item") and callable(obj.item):
        return _clean(obj.item())
    return obj


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON (infinities and NaN as null)."""
    click.echo(json.dumps(_clean(obj), indent=2, allow_nan=False))


def fmt(x: Any, digits: int = 4) -> str:
    """Format a number for tables: ``inf`` as the symbol, floats to ``digits`` significant digits."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if math.isnan(x):
            return "nan"
        if abs(x) >= 1e7 or (x != 0 and abs(x) < 1e-4):
            return f"{x:.{digits}g}"
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    """Print an aligned plain-text table."""
    from tabulate import tabulate

    if title:
        click.echo(title)
    body = [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    click.echo(tabulate(body, headers=list(headers), tablefmt="simple", disable_numparse=True))


def print_kv(pairs: Iterable[tuple[str, Any]], title: str | None = None) -> None:
    """Print ``name  value`` lines (a two-column table without headers)."""
    from tabulate import tabulate

    if title:
        click.echo(title)
    body = [[k, v if isinstance(v, str) else fmt(v)] for k, v in pairs]
    click.echo(tabulate(body, tablefmt="plain", disable_numparse=True))


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
