"""``llmqueue queue``: the classic queueing models as subcommands."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, json_option, print_json, print_kv


@click.group("queue", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def queue():
    """Classic queueing models: Little's law, M/M/1, M/D/1, M/G/1, M/M/c, M/M/c/K, G/G/1, G/G/c.

    Rates are per second, times in seconds. A steady-state quantity asked of an
    unstable queue (rho >= 1) is an error that says "unstable" (exit 2).
    """


@command("little")
@click.option("--L", "L", type=float, help="Mean number in system.")
@click.option("--lam", type=float, help="Arrival rate = throughput (req/s).")
@click.option("--W", "W", type=float, help="Mean time in system (s).")
@json_option
def little_cmd(L, lam, W, as_json):
    """Little's law L = lam * W: give two, get the third (seed 000: --lam 900 --W 0.12 gives L = 108)."""
    from llmqueue.theory.little import little

    r = little(L=L, lam=lam, W=W)
    if as_json:
        print_json(r)
    else:
        print_kv([("L (in system)", r.L), ("lam (req/s)", r.lam), ("W (s)", r.W)], title="Little's law L = lam * W")


queue.add_command(little_cmd)
