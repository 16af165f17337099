"""``run_cli``: run the ``llmqueue`` command in-process, isolated, as the tests do.

Each run gets a fresh :class:`click.testing.CliRunner`'s isolation: its own stdout and stderr
(kept apart), an empty stdin, the environment overrides given (restored afterwards) and click's
help width fixed at 80 columns, so that no run sees another's output or settings and the help
text does not depend on the terminal the tests run in. The command runs through
:func:`llmqueue.cli.main.main`, the console script's entry point: its exit codes and one-line
errors are what a user gets. A bug still raises its traceback in the test.
"""

from __future__ import annotations

import json
import sys
from typing import NamedTuple

from click.testing import CliRunner

from llmqueue.cli.main import main


class CliRun(NamedTuple):
    """One run: the exit code and what it printed on stdout and on stderr."""

    code: int
    out: str
    err: str

    def json(self):
        """stdout as JSON (the run must have succeeded)."""
        assert self.code == 0, self.err
        return json.loads(self.out)


def run_cli(*args, input: str | bytes | None = None, env: dict | None = None) -> CliRun:
    """Run ``llmqueue ARGS`` (each argument passed through :class:`str`) in-process, with ``input``
    on stdin and ``env`` overriding the environment (a value of None removes the variable)."""
    runner = CliRunner()
    with runner.isolation(input=input, env=env) as (out, err, _):
        code = main([str(a) for a in args])
        sys.stdout.flush()
        sys.stderr.flush()
        return CliRun(code, out.getvalue().decode(runner.charset), err.getvalue().decode(runner.charset, "replace"))
