"""``llmqueue workload``: traces and workload models. Subcommands live in their own modules."""

from __future__ import annotations

import importlib

import click

# name -> (module, attribute, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "convert": ("llmqueue.cli.workload_convert", "convert", "Convert a trace (Azure, Mooncake, BurstGPT, vLLM bench JSON, CSV/JSONL/Parquet) to canonical Parquet."),
    "stats": ("llmqueue.cli.workload_stats", "stats", "Statistics of a trace or a workload spec: rates, burstiness, lengths, E[g], prefix reuse."),
    "fit": ("llmqueue.cli.workload_fit", "fit", "Fit an arrival and length model to a trace and write it as a spec file."),
}


class _LazySubGroup(click.Group):
    def list_commands(self, ctx):
        return list(SUBCOMMANDS)

    def get_command(self, ctx, name):
        entry = SUBCOMMANDS.get(name)
        if entry is None:
            return None
        return getattr(importlib.import_module(entry[0]), entry[1])

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl([(n, h) for n, (_, _, h) in SUBCOMMANDS.items()])


@click.group("workload", cls=_LazySubGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def workload():
    """Traces and workload models: convert a trace to canonical Parquet, measure it, fit a model to it."""
