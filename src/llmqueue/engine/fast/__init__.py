"""The fast replica: the reference's nouns, twinned for speed (same records, tested).

| the reference (the specification) | the fast path |
|---|---|
| :class:`~llmqueue.engine.reference.ReferenceReplica` | :class:`~llmqueue.engine.fast.replica.Replica` (facade, clock, door, deadlines, steps, stretches) |
| :class:`~llmqueue.engine.scheduler.Scheduler` (``schedule()``) | :class:`~llmqueue.engine.fast.scheduler.Scheduler` (``schedule()`` exact, ``schedule_aggregated()``) |
| :class:`~llmqueue.engine.kv_cache_manager.KVCacheManager` | :class:`~llmqueue.engine.fast.ledger.BlockLedger` |
| running requests decoding one token a step | :class:`~llmqueue.engine.fast.decoders.DecoderPool` (implicit decoders) |
| one step at a time | :class:`~llmqueue.engine.fast.stretch.DecodeStretch`, :mod:`~llmqueue.engine.fast.epoch` |
| step rows as tuples | :class:`~llmqueue.engine.fast.recorder.StepRecorder` (packed rows, column chunks) |

Both price steps with :class:`~llmqueue.engine.pricing.StepPricer` on a
:class:`~llmqueue.engine.output.Composition` and decide with the same
:class:`~llmqueue.engine.request_queue.RequestQueue`, policies and
:class:`~llmqueue.engine.request.Request`.
"""

from llmqueue.engine.fast.recorder import stack_columns
from llmqueue.engine.fast.replica import Replica

__all__ = ["Replica", "stack_columns"]
