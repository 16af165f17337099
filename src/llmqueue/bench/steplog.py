"""A server's per-step log, turned into the run's step records (``steps.parquet``).

vLLM started with ``--enable-logging-iteration-details`` logs one line per engine step (its
prefill tokens, decode sequences, elapsed time and KV usage). Those lines, written while a
benchmark ran, are the step composition that :func:`llmqueue.bench.calibrate.fit_linear` needs
for the linear step-time model ``c0 + c_prefill P + c_decode D + c_ctx C`` and that the step
cycle estimator of b-bar uses. The cycle (one step's start to the next's) needs sub-second
time stamps: vLLM's own stamp has whole seconds, so start the server with
``VLLM_LOGGING_PREFIX='%(created).6f '`` (``llmqueue.bench.engine.VllmServer`` does).

Measured on vLLM 0.32's CPU build: the API server logs a step about 100 ms after the step's
output reached a streaming client, the same for every step, so step durations and cycles are
exact and ``start_s`` is late by that much (see :func:`llmqueue.bench.prom.iteration_steps`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from llmqueue.errors import InputError

PREFIX_HINT = "start vLLM with VLLM_LOGGING_PREFIX='%(created).6f ' and --enable-logging-iteration-details"


def log_offset(path) -> int:
    """The size of the server's log now: where a run that starts now begins in it."""
    p = Path(path)
    if not p.is_file():
        raise InputError("server_log", f"{p} is not a file",
                         "give the file the server's output goes to (e.g. vllm serve ... > vllm.log 2>&1)")
    return p.stat().st_size


LOG_LAG_S = 1.0
"""How long after the run's end a step line still counts (the log lags the steps by ~0.1 s)."""


def wait_for_steps(path, *, offset: int = 0, after_epoch_s: float, quiet_s: float = LOG_LAG_S,
                   timeout_s: float = 5.0, poll_s: float = 0.05) -> bool:
    """Wait until the server's log holds the step that produced a run's last token.

    The API server logs a step after streaming its output (about 0.1 s later on vLLM 0.32's CPU
    build, more when the machine is busy), so a log read the moment the last answer arrived can
    miss the run's last steps. Polls the lines written after byte ``offset``: True as soon as a
    step line stamped at or after ``after_epoch_s`` (epoch seconds of the last answer) is there;
    False when no new step line came for ``quiet_s`` (a server that logs before streaming, or
    logs no steps) or after ``timeout_s`` in all."""
    from llmqueue.bench.prom import parse_iteration_log

    t_start = time.monotonic()
    t_new = t_start
    pos, tail = offset, ""
    while True:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        lines = (tail + chunk).split("\n")
        tail = lines.pop()                       # a line still being written
        t = parse_iteration_log(lines)["t_log"]
        now = time.monotonic()
        if len(t):
            if np.nanmax(t) >= after_epoch_s:
                return True
            t_new = now
        if now - t_new >= quiet_s or now - t_start >= timeout_s:
            return False
        time.sleep(poll_s)


def steps_from_log(path, *, offset: int = 0, t0_epoch_s: float, t_end_s: float | None = None,
                   M: float | None = None):
    """The steps logged in ``path`` after byte ``offset``, ending in the run (after its
    ``t0_epoch_s``, epoch seconds of its t = 0, and by ``t_end_s`` run seconds plus
    :data:`LOG_LAG_S`), as :class:`~llmqueue.records.StepRecords`, and a note (None when all is
    well). The steps of the server's own start (dummy runs) and of other runs are left out;
    without sub-second time stamps the note says so and no step is returned (a cycle cannot be
    measured from whole seconds)."""
    from llmqueue.bench.prom import iteration_steps, parse_iteration_log

    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        cols = parse_iteration_log(f.read())
    t = np.asarray(cols["t_log"], dtype=np.float64)
    if len(t) == 0:
        return None, f"{path}: no per-step lines ({PREFIX_HINT})"
    if np.all(~np.isfinite(t) | (t == np.floor(t))):
        return None, f"{path}: the step lines have whole-second time stamps ({PREFIX_HINT})"
    steps = iteration_steps(cols, t0_wall=t0_epoch_s, M=int(M) if M else None)
    end = np.asarray(steps["start_s"]) + np.asarray(steps["duration_s"])
    keep = end >= 0.0
    if t_end_s is not None:
        keep &= end <= t_end_s + LOG_LAG_S
    if not keep.any():
        return None, f"{path}: no step logged after the run started"
    return steps.select(keep), None


def write_run_steps(run_dir, path, *, offset: int = 0, t0_epoch_s: float, t_end_s: float | None = None,
                    M: float | None = None, finish_s=None) -> tuple[int, str | None]:
    """:func:`steps_from_log` written as ``run_dir/steps.parquet``; returns (steps, note).
    ``finish_s``: the run's answer times (run seconds; NaN for none): the log is read once the
    last answer's step is in it (:func:`wait_for_steps`)."""
    from llmqueue.records import write_records

    fin = np.asarray(finish_s if finish_s is not None else (), dtype=np.float64)
    fin = fin[np.isfinite(fin)]
    if len(fin):
        wait_for_steps(path, offset=offset, after_epoch_s=t0_epoch_s + float(fin.max()))
    steps, note = steps_from_log(path, offset=offset, t0_epoch_s=t0_epoch_s, t_end_s=t_end_s, M=M)
    if steps is None:
        return 0, note
    write_records(Path(run_dir) / "steps.parquet", steps)
    return len(steps), None
