"""Entry point of the ``llmqueue`` command.

Subcommands live in their own modules and are imported only when invoked, so
``llmqueue --help`` and the theory commands start fast. Every
:class:`~llmqueue.errors.LlmqueueError` and every click usage error becomes one
line on stderr and exit code 2; Ctrl-C becomes ``llmqueue: interrupted; kept ...`` (what the
command had written, which stays) and exit code 130.
"""

from __future__ import annotations

import importlib
import sys

import click

from llmqueue import __version__
from llmqueue.cli.common import FieldError
from llmqueue.cli.interrupt import Interrupted
from llmqueue.errors import LlmqueueError

# name -> (module, attribute, one-line help shown by `llmqueue --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "example": ("llmqueue.cli.example_cmd", "example", "Run the built-in example: KV capacity, stability and batch sizing side by side."),
    "kv": ("llmqueue.cli.kv_cmd", "kv", "KV cache per token and per request, weights, and KV capacity M of a GPU."),
    "stability": ("llmqueue.cli.stability_cmd", "stability", "KV-memory stability threshold mu = M / (b E[g]) (Nie et al. 2026) and a verdict for a rate."),
    "batch": ("llmqueue.cli.batch_cmd", "batch", "Batch-service model T_svc(B) = T_fixed + t_req*B (Inference Foundations): table, B_min, P99 and action."),
    "queue": ("llmqueue.cli.queue_cmd", "queue", "Classic queueing models: M/M/1, M/D/1, M/G/1, M/M/c, M/M/c/K, G/G/1, G/G/c, Little."),
    "cost": ("llmqueue.cli.cost_cmd", "cost", "Tokens per dollar, cost per million tokens, error budgets and replica counts."),
    "workload": ("llmqueue.cli.workload_cmd", "workload", "Traces and workload models: convert, stats, fit."),
    "scenario": ("llmqueue.cli.scenario_cmd", "scenario", "Scenario files (workload + deployment + SLOs): check."),
    "simulate": ("llmqueue.cli.simulate_cmd", "simulate", "Simulate a serving replica or a fleet step by step: records, summary, verdict."),
    "bench": ("llmqueue.cli.bench_cmd", "bench", "Open-loop benchmark of an OpenAI-compatible server: records, summary, client checks."),
    "import": ("llmqueue.cli.import_cmd", "import_", "Another client's per-request measurements (vLLM bench serve, JSONL, CSV) as a run directory."),
    "emulate": ("llmqueue.cli.emulate_cmd", "emulate", "Serve the simulator's replica on the wall clock behind vLLM's API and /metrics (an engine emulator)."),
    "gateway": ("llmqueue.cli.gateway_cmd", "gateway", "Run a scenario's control plane (lanes, admission, shedding, routing, fallback) in front of real engines."),
    "profile": ("llmqueue.cli.profile_cmd", "profile", "Measure a server's step-time surface (decode ladders, prefill probes) as a step-time model."),
    "calibrate": ("llmqueue.cli.calibrate_cmd", "calibrate", "Measure M, b-bar and a step-time model from a run directory."),
    "validate": ("llmqueue.cli.calibrate_cmd", "validate", "Theory and simulation with calibrated inputs against a measured run."),
    "sweep": ("llmqueue.cli.sweep_cmd", "sweep", "Sweep arrival rates and engine knobs: latency vs load, knee, stability boundary."),
    "capacity": ("llmqueue.cli.sweep_cmd", "capacity", "Highest arrival rate meeting p99 TTFT/TPOT SLOs (bisection, confirmed)."),
    "plan": ("llmqueue.cli.plan_cmd", "plan", "Cheapest deployment (GPU, tp, replicas, knobs) meeting p99 SLOs: theory-pruned, simulated."),
    "report": ("llmqueue.cli.report_cmd", "report", "One self-contained HTML report (plots inlined) of a run or sweep directory."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        mod, attr, _ = entry
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx, formatter):
        # Use the static help strings so `--help` imports no subcommand module.
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx: click.Context, param, value) -> None:
    """``--version``: the version and whether the engine runs compiled (checked only when asked)."""
    if not value or ctx.resilient_parsing:
        return
    from llmqueue.compiled import status

    click.echo(f"llmqueue {__version__} (engine: {status()})")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
def cli():
    """llmqueue: LLM inference serving as a queueing system.

    Theory (closed forms), hardware/KV arithmetic and workload models in one tool.
    Every command prints a readable table; add --json for machine output.
    """


def _flag_for(ctx: click.Context | None, field: str | None) -> str | None:
    """Map a library field name (``lam``) to the flag of the running command (``--rate``)."""
    if ctx is None or field is None:
        return None
    cmd = ctx.command
    for p in getattr(cmd, "params", []):
        if p.name == field.replace("-", "_") and getattr(p, "opts", None):
            return _shown_flag(p)
    flag = "--" + field.replace("_", "-")  # a field named as its flag, the parameter named otherwise
    for p in getattr(cmd, "params", []):
        if flag in getattr(p, "opts", ()):
            return _shown_flag(p)
    return None


def _shown_flag(p) -> str:
    """The name ``--help`` shows for option ``p``: its first long name that is not an old one."""
    names = [o for o in p.opts if o not in getattr(p, "old", ())]
    longs = [o for o in names if o.startswith("--")]
    return longs[0] if longs else max(names, key=len)


COMPLETE_VAR = "_LLMQUEUE_COMPLETE"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input or unstable steady-state request)."""
    import os

    if os.environ.get(COMPLETE_VAR):
        # shell completion (`eval "$(_LLMQUEUE_COMPLETE=bash_source llmqueue)"`): click's own
        # entry point answers it and exits
        cli.main(args=[] if argv is None else list(argv), prog_name="llmqueue", complete_var=COMPLETE_VAR)
    try:
        with cli.make_context("llmqueue", list(sys.argv[1:] if argv is None else argv)) as ctx:
            cli.invoke(ctx)
        sys.stdout.flush()  # a full or broken stdout fails here, inside the handlers below
    except FieldError as w:
        msg = str(w.err)
        flag = _flag_for(w.ctx, getattr(w.err, "field", None))
        if flag and msg.startswith(f"{w.err.field}:"):
            msg = flag + msg[len(w.err.field):]
        elif flag and f"lower {w.err.field} " in msg:
            msg = msg.replace(f"lower {w.err.field} ", f"lower {flag} ")
        elif flag and flag not in msg:
            msg = f"{msg} [{flag}]"
        click.echo(f"llmqueue: error: {msg}", err=True)
        return 2
    except LlmqueueError as err:
        click.echo(f"llmqueue: error: {err}", err=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("llmqueue: aborted", err=True)
        return 130
    except Interrupted as e:
        click.echo(f"llmqueue: interrupted; kept {e.kept}", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("llmqueue: interrupted; kept nothing (no output written yet)", err=True)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        return _os_error(e)
    except click.exceptions.NoArgsIsHelpError as e:
        # `llmqueue` or a command group with no arguments: show its help, as click would.
        click.echo(e.ctx.get_help() if e.ctx is not None else str(e))
        return 0
    except click.ClickException as e:
        # One line: "llmqueue: error: <message>" (usage errors included), exit 2.
        msg = e.format_message().replace("\n", " ")
        click.echo(f"llmqueue: error: {msg}", err=True)
        return 2 if e.exit_code in (1, 2) else e.exit_code
    return 0


def _discard_stdout() -> None:
    """Point the real stdout at /dev/null, so the interpreter's last flush cannot fail again."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (captured in tests): nothing is flushed at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)


def _os_error(e: OSError) -> int:
    """One line for an OSError the environment caused (stdout on a full device, a disk that
    filled while writing records, ...), exit 2."""
    reason = e.strerror or str(e) or type(e).__name__
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and tb.tb_frame.f_code.co_name in ("echo", "main") and not e.filename:
        where = "cannot write to stdout"  # click.echo, or the final flush in main
        _discard_stdout()
    else:
        where = f"cannot write {e.filename!r}" if e.filename else "cannot write the output"
    click.echo(f"llmqueue: error: {where}: {reason}; free space or write somewhere else", err=True)
    return 2


#: OpenBLAS (numpy's and scipy's wheels each bundle one) starts a thread per core when it loads:
#: about 50 ms of CPU at numpy's import on two cores, more on a large host. The commands' linear
#: algebra is small (the theory's sums over length pmfs, a least-squares fit of a few columns), and
#: a plan's local backend runs a process per core already, so the command line loads it with one
#: thread; a value set in the environment is kept.
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}


def run() -> None:  # pragma: no cover - the console script
    """The ``llmqueue`` command: :func:`main` with one BLAS thread (:data:`BLAS_THREADS`), set
    before anything imports numpy."""
    import os

    for k, v in BLAS_THREADS.items():
        os.environ.setdefault(k, v)
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
