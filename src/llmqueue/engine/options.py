"""Run options of a replica simulation, and the record columns a replica fills."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

STEP_FIELDS = ("step", "start_s", "duration_s", "prefill_tokens", "decode_seqs", "num_running", "num_waiting",
               "kv_tokens", "preempted", "steps")
TS_FIELDS = ("t_s", "num_waiting", "num_running", "kv_tokens")


class StopRun(Exception):
    """Raised by a run's ``progress`` callback (:class:`SimOptions`) to end the run at simulated
    time ``t`` (Ctrl-C): the callback is called between steps, where the replica's state is whole,
    and the driver then closes the run as at a horizon ``t`` (requests still in the system are
    recorded ``unfinished``; ``SimResult.interrupted_s`` is ``t``)."""

    def __init__(self, t: float):
        super().__init__(t)
        self.t = float(t)


@dataclass
class SimOptions:
    """Run options shared by the replicas.

    ``horizon_s``: stop at this simulated time (None: run until every request is done).
    ``timeout_s``: per class name, the client's timeout (seconds from arrival; absent = none).
    ``ttft_timeout_s``: per class name, the client gives up if no first token came by then.
    ``patience``: per class name, ``patience(request_id) -> seconds``: a request never scheduled
    by its arrival plus that is withdrawn, ``cancelled`` (reneging; :mod:`llmqueue.workload.patience`).
    ``retry``: the client's retry function ``retry(request_id, attempt, status, t_end) -> t_next | None``;
    a new attempt (same ``request_id``, ``attempt + 1``) then arrives at ``t_next``.
    ``predicted_output``: per-request predicted output lengths (the ``srpt`` policy's key);
    defaults to the true output lengths (an oracle).
    ``sample_dt``: time-series sampling interval (seconds); 0 disables the time series.
    ``seed``: seeds the step-time noise and drift streams.
    ``hash_ids``: per request, its prompt's prefix-unit ids (or None), for prefix caching;
    ``hash_block_tokens``: tokens per unit (Mooncake traces: 512).
    ``early_stop``: stop a run with a horizon once it is certainly overloaded (see
    :func:`llmqueue.engine.run.simulate`); the result's ``stopped_early_s`` says when.
    ``progress``: called now and then with the simulated time, between steps (a progress bar);
    raising :class:`StopRun` from it ends the run there.
    ``explain``: engine step indices whose scheduling decision the result keeps
    (``SimResult.explained``: :class:`~llmqueue.engine.explain.StepExplanation`; one replica).
    """

    horizon_s: float | None = None
    timeout_s: dict = field(default_factory=dict)
    ttft_timeout_s: dict = field(default_factory=dict)
    patience: dict = field(default_factory=dict)
    retry: Callable | None = None
    predicted_output: np.ndarray | None = None
    sample_dt: float = 1.0
    seed: int = 0
    progress: Callable | None = None
    hash_ids: list | None = None
    hash_block_tokens: int = 512
    early_stop: bool = False
    explain: tuple = ()
