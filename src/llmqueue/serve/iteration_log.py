"""A served engine's log in vLLM's format, so that ``--server-log`` reads it as a vLLM server's.

Two kinds of line, each with the epoch time stamp ``VLLM_LOGGING_PREFIX='%(created).6f '`` gives
vLLM (:mod:`llmqueue.bench.steplog`, :func:`llmqueue.bench.server_info.parse_server_log`):

- at start, vLLM's ``non-default args: {...}`` (the engine settings) and ``KV cache size: N tokens``;
- with ``--enable-logging-iteration-details``, one line per engine step, written when the step
  ends and stamped with its scheduled end (vLLM logs its steps about 100 ms late; here the stamp
  is exact)::

    1795673372.594229 (APIServer pid=26987) INFO 11-26 06:09:32 [loggers.py:199] Engine 000:
    Iteration(32): 0 context requests, 0 context tokens, 32 generation requests, 32 generation
    tokens, iteration elapsed time: 226.09 ms, CPU KV cache usage: 7.8%

  ``context requests`` counts the running requests that are not decoding (all of them computed
  prompt tokens, unless the token budget left one out of the step); recomputed tokens after a
  preemption are context tokens.
"""

from __future__ import annotations

import os
import sys
import time


class StepLog:
    """Write one engine's log lines to ``stream`` (a text file; flushed per line). ``t0_epoch``:
    epoch seconds of the engine's time 0."""

    def __init__(self, stream=None, *, t0_epoch: float, iteration_details: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        self.t0_epoch = t0_epoch
        self.iteration_details = iteration_details
        self.pid = os.getpid()

    def _line(self, t_engine: float, where: str, text: str) -> None:
        t = self.t0_epoch + t_engine
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(t))
        self.stream.write(f"{t:.6f} (APIServer pid={self.pid}) INFO {stamp} [{where}] {text}\n")
        self.stream.flush()

    def startup(self, settings: dict, kv_tokens: int, t_engine: float = 0.0) -> None:
        """The engine's settings, as vLLM states them when it starts."""
        self._line(t_engine, "api_utils.py:286", f"non-default args: {settings!r}")
        self._line(t_engine, "kv_cache_utils.py:2327", f"KV cache size: {kv_tokens:,} tokens")

    def step(self, row: tuple, kv_usage: float) -> None:
        """One step (a replica's step row: index, start, duration, prefill tokens, decode sequences,
        running, waiting, ...) at its end."""
        if not self.iteration_details:
            return
        k, start, dur, prefill, decode, running = row[:6]
        ctx_reqs = max(running - decode, 0) if prefill else 0
        self._line(start + dur, "loggers.py:199",
                   f"Engine 000: Iteration({k}): {ctx_reqs} context requests, {prefill} context tokens, {decode} "
                   f"generation requests, {decode} generation tokens, iteration elapsed time: {1e3 * dur:.2f} ms, "
                   f"CPU KV cache usage: {100 * kv_usage:.1f}%")
