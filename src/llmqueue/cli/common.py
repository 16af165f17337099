"""Shared CLI plumbing: the command class, path options, ``--json`` output and table printing."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterable, Sequence

import click

from llmqueue.errors import LlmqueueError


class FieldError(Exception):
    """An :class:`LlmqueueError` raised inside a subcommand, with that command's context
    so the error line can name the flag (``--rate``) rather than the library field (``lam``)."""

    def __init__(self, err: LlmqueueError, ctx: click.Context):
        super().__init__(str(err))
        self.err, self.ctx = err, ctx


# What a run directory holds (llmqueue simulate/bench --out): read by calibrate, validate, report.
RUN_FILES = ("requests.parquet", "steps.parquet", "timeseries.parquet", "pools.parquet", "tokens.parquet",
             "workload.parquet", "summary.json", "server.json")


class InputPath(click.Path):
    """A path the command reads. ``kind="file"``: checked to be a regular file before the command
    runs (``-`` allowed when ``stdin``); ``"dir"``/``"any"``: a run directory (or sweep file) whose
    ``reads`` files the outputs must not overwrite. Conversion does no checks of its own: the
    command's check gives the one-line error."""

    def __init__(self, kind: str = "file", *, reads=RUN_FILES, stdin: bool = False):
        super().__init__(file_okay=kind != "dir", dir_okay=kind != "file", allow_dash=stdin)
        self.kind, self.reads, self.stdin = kind, tuple(reads), stdin

    def convert(self, value, param, ctx):
        return value if isinstance(value, str) else str(value)

    def files(self, value) -> list:
        """The files of ``value`` that the command reads."""
        from pathlib import Path

        p = Path(value).expanduser()
        return [p / n for n in self.reads] if p.is_dir() else [p]


class OutputPath(click.Path):
    """A file or directory (``kind``) the command writes: checked before the command runs
    (:func:`llmqueue._files.output_path`); missing parent directories are created when writing.
    ``also(path)``: the other paths written with it (checked against the inputs too)."""

    def __init__(self, kind: str = "file", *, also=None):
        super().__init__(file_okay=kind == "file", dir_okay=kind == "dir")
        self.kind, self.also = kind, also

    def convert(self, value, param, ctx):
        return value if isinstance(value, str) else str(value)


def run_outputs(p) -> list:
    """The files a run directory ``--out`` receives (``OutputPath("dir", also=run_outputs)``),
    the journals a benchmark writes its records through included."""
    return [p / n for n in RUN_FILES] + [p / f"{n}.journal" for n in RUN_FILES if n.endswith(".parquet")]


def param_label(p: click.Parameter) -> str:
    """How the user wrote parameter ``p``: its longest flag, or an argument's metavar."""
    if isinstance(p, click.Argument):
        return (p.metavar or p.name.upper()).strip("[].")
    return max(p.opts, key=len)


def check_paths(ctx: click.Context) -> None:
    """Before a command runs: its input files are regular files, and its outputs can be written
    without overwriting an input (``--trace`` and a ``--scenario`` file count as inputs)."""
    from pathlib import Path

    from llmqueue._files import input_file, output_path

    inputs, outputs = [], []
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if v is None:
            continue
        if isinstance(p.type, InputPath):
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                if p.type.kind == "file" and not (p.type.stdin and x == "-"):
                    input_file("file" if isinstance(p, click.Argument) else p.name, x)
                inputs += [(param_label(p), f) for f in p.type.files(x)] if x != "-" else []
        elif isinstance(p.type, OutputPath):
            outputs.append((p, v))
    for name in ("trace", "scenario"):
        v = ctx.params.get(name)
        if isinstance(v, str) and v.strip() and Path(v).expanduser().is_file():
            inputs.append((f"--{name}", Path(v)))
    for p, v in outputs:
        also = p.type.also(Path(v).expanduser()) if p.type.also is not None and str(v).strip() else ()
        output_path(p.name, v, kind=p.type.kind, inputs=inputs, also=also)


class Command(click.Command):
    """click.Command that checks its path options first (:func:`check_paths`), hands library
    errors to ``main`` together with its context, and Ctrl-C as
    :class:`~llmqueue.cli.interrupt.Interrupted` naming what it had written."""

    def invoke(self, ctx):
        import time

        started = time.time()
        try:
            check_paths(ctx)
            return super().invoke(ctx)
        except LlmqueueError as err:
            raise FieldError(err, ctx) from None
        except KeyboardInterrupt:
            from llmqueue.cli.interrupt import Interrupted, kept

            raise Interrupted(kept(ctx.params, started)) from None


class Renamed(click.Option):
    """An option whose ``old`` names still work but are left out of ``--help`` (renamed flags)."""

    def __init__(self, *args, old=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.old = tuple(old)

    def get_help_record(self, ctx):
        opts = self.opts
        self.opts = [o for o in opts if o not in self.old]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


def server_setting_options(f):
    """The ``--server-*`` flags that say what a vLLM server runs with (``max_num_seqs``,
    ``max_num_batched_tokens``, ``block_size``, ``max_model_len``, KV blocks), shared by the commands
    that measure a server (bench, profile): recorded in server.json, never assumed."""
    opts = [
        click.option("--server-max-num-seqs", type=int, metavar="N", help="The server's --max-num-seqs, recorded "
                     "in server.json [default: from --server-log; never assumed]."),
        click.option("--server-max-num-batched-tokens", type=int, metavar="N", help="The server's "
                     "--max-num-batched-tokens, recorded in server.json [default: from --server-log; never assumed]."),
        click.option("--server-block-size", type=int, metavar="N", help="The server's --block-size [default: from "
                     "/metrics or --server-log]."),
        click.option("--server-max-model-len", type=int, metavar="N", help="The server's --max-model-len [default: "
                     "from /v1/models or --server-log]."),
        click.option("--server-num-gpu-blocks", type=int, metavar="N", help="The server's KV blocks [default: from "
                     "/metrics or --server-log]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def server_settings(params: dict) -> dict:
    """What the ``--server-*`` flags (:func:`server_setting_options`) say, by setting name
    (``max_num_seqs``...; None: not given), each checked to be a positive integer."""
    from llmqueue.errors import InputError

    out = {}
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len", "num_gpu_blocks"):
        v = params[f"server_{name}"]
        if v is not None and v < 1:
            raise InputError(f"server_{name}", f"must be a positive integer (got {v})")
        out[name] = v
    return out


def renamed_option(*decls, old=(), **kwargs):
    """``click.option`` with earlier flag names ``old`` accepted but hidden (:class:`Renamed`)."""
    return click.option(*decls, *old, cls=Renamed, old=old, **kwargs)


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
