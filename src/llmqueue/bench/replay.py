"""A measured run as a simulation's input: the replica the calibrated server runs, and the stream sent.

:func:`engine_config` is the replica (KV capacity ``M``, the server's knobs as the calibration
recorded them); :func:`measured_stream` the request stream the run intended to send (arrival
times, prompt and output lengths), :func:`sent_stream` the same with each arrival at its actual
send time, :func:`tiled_stream` a longer path at the same rate and mix. Validation
(:mod:`llmqueue.bench.validate`) and the frontend-latency probe (:mod:`llmqueue.bench.calibrate`)
replay a run through the simulator with these.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmqueue.errors import InputError


def engine_config(calibration: dict, M: float, **knobs):
    """The replica the calibrated server runs: KV capacity ``M`` (tokens), the server's engine
    knobs as the calibration recorded them, and ``knobs`` (flag names) overriding them."""
    from llmqueue.knobs import BY_NAME
    from llmqueue.spec import engine_config as build

    from llmqueue.bench.server_info import require

    eng = calibration.get("engine") or {}
    default = {k: BY_NAME[k].default for k in ("block_size", "enable_chunked_prefill")}
    base = {"block_size": int(eng.get("block_size") or calibration.get("block_size") or default["block_size"]),
            "enable_chunked_prefill": bool(eng.get("enable_chunked_prefill", default["enable_chunked_prefill"]))}
    # the two limits that shape the batch: the server's as recorded, or given; never assumed
    where = "calibration"
    if knobs.get("max_num_seqs") is None:
        base["max_num_seqs"] = require(eng, "max_num_seqs", where=where, here_flag="--max-num-seqs")
    if knobs.get("chunk") is None and knobs.get("max_num_batched_tokens") is None:
        base["max_num_batched_tokens"] = require(eng, "max_num_batched_tokens", where=where,
                                                 here_flag="--max-num-batched-tokens")
    return build(M, **{**base, **{k: v for k, v in knobs.items() if v is not None}})


def replaced(requests, **cols):
    """The request records with some columns replaced (new arrays; the others shared)."""
    from llmqueue.records import RequestRecords

    return RequestRecords.from_columns({**requests.to_dict(), **cols})


def sent_view(requests):
    """The records with each attempt's ``arrival_s`` replaced by its actual send time
    (``dispatched_s``, where there is one): latencies then count from the send, as vLLM bench
    serve counts them, and a client that fell behind its schedule is not charged to the server."""
    d = np.asarray(requests["dispatched_s"])
    return replaced(requests, arrival_s=np.where(np.isfinite(d), d, np.asarray(requests["arrival_s"])))


def sent_stream(stream, requests):
    """``stream`` with each request's arrival moved to its first attempt's actual send time."""
    from llmqueue.workload.generate import RequestArrays

    first = (np.asarray(requests["attempt"]) == 1) & np.isfinite(np.asarray(requests["dispatched_s"]))
    sent = dict(zip(np.asarray(requests["request_id"])[first].tolist(),
                    np.asarray(requests["dispatched_s"])[first].tolist()))
    t = np.array([sent.get(i, a) for i, a in zip(np.asarray(stream.request_id).tolist(),
                                                   np.asarray(stream.arrival_s).tolist())])
    o = np.argsort(t, kind="stable")
    return RequestArrays(np.asarray(stream.request_id)[o], t[o], np.asarray(stream.prompt_tokens)[o],
                         np.asarray(stream.output_tokens)[o], np.asarray(stream.class_name)[o])


def server_errors(requests) -> set:
    """Request ids whose every attempt the server answered with an error (status ``error``):
    no engine work the simulator could model, so a replay leaves them out (else it would serve
    them, and its throughput would be high by their share)."""
    rid = np.asarray(requests["request_id"])
    err = np.asarray(requests["status"]).astype(str) == "error"
    return set(rid[err].tolist()) - set(rid[~err].tolist())


def tiled_stream(stream, copies: int):
    """``stream`` replayed ``copies`` times back to back: copy ``j`` is the same requests shifted by
    ``j`` spans (a span: first to last arrival plus one mean gap, so the copies join at the
    stream's own rate), with new request ids. A longer path at the same rate and mix, for a
    stability verdict that one finite path leaves undecided."""
    from llmqueue.workload.generate import RequestArrays

    t = np.asarray(stream.arrival_s, dtype=np.float64)
    n = len(t)
    span = (t[-1] - t[0]) * n / (n - 1) if n > 1 and t[-1] > t[0] else 1.0
    ids = np.asarray(stream.request_id, dtype=np.int64)
    step = int(ids.max()) + 1
    return RequestArrays(np.concatenate([ids + j * step for j in range(copies)]),
                         np.concatenate([t + j * span for j in range(copies)]),
                         np.tile(np.asarray(stream.prompt_tokens), copies),
                         np.tile(np.asarray(stream.output_tokens), copies),
                         np.tile(np.asarray(stream.class_name), copies))


def without(stream, ids: set):
    """``stream`` less the requests whose ids are in ``ids``."""
    from llmqueue.workload.generate import RequestArrays

    keep = ~np.isin(np.asarray(stream.request_id), np.asarray(sorted(ids)))
    return RequestArrays(np.asarray(stream.request_id)[keep], np.asarray(stream.arrival_s)[keep],
                         np.asarray(stream.prompt_tokens)[keep], np.asarray(stream.output_tokens)[keep],
                         np.asarray(stream.class_name)[keep])


def measured_stream(run_dir: Path, requests):
    """The request stream the run intended to send, as a RequestArrays."""
    from llmqueue.workload.generate import RequestArrays

    wp = run_dir / "workload.parquet"
    if wp.exists():
        import pyarrow.parquet as pq

        from llmqueue._files import input_file, reading

        with reading("workload.parquet", input_file("workload.parquet", wp)):
            t = pq.read_table(wp).to_pydict()
        need = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
        missing = [c for c in need if c not in t]
        if missing:
            raise InputError("workload.parquet", f"{wp} has no {', '.join(missing)} column "
                             f"(it has {', '.join(t) or 'none'})",
                             "a run's workload.parquet holds the request ids of requests.parquet: write it with "
                             "llmqueue bench, or bring outside measurements with llmqueue import")
        return RequestArrays(np.asarray(t["request_id"]), np.asarray(t["arrival_s"]),
                             np.asarray(t["prompt_tokens"]), np.asarray(t["output_tokens"]),
                             np.asarray(t.get("class", ["default"] * len(t["request_id"])), dtype=object))
    first = requests["attempt"] == 1
    ok = requests["status"] == "ok"
    if not ok[first].all():
        raise InputError("run", "the run has unfinished or failed requests and no workload.parquet",
                         "benchmark with a version that writes workload.parquet")
    return RequestArrays(requests["request_id"][first], requests["arrival_s"][first],
                         requests["prompt_tokens"][first], requests["output_tokens"][first],
                         requests["class"][first])


def measured_hashes(run_dir: Path, stream) -> tuple[list | None, int]:
    """The prompts' prefix-block hashes of a run that built its prompts from a trace's hash ids
    (``workload.parquet``'s ``hash_ids``), in ``stream``'s order, and the tokens a hash stands
    for; ``(None, 0)`` for a run without them."""
    wp = Path(run_dir) / "workload.parquet"
    if not wp.exists():
        return None, 0
    import pyarrow.parquet as pq

    t = pq.read_table(wp)
    if "hash_ids" not in t.column_names:
        return None, 0
    H = int((t.schema.metadata or {}).get(b"llmqueue.hash_block_tokens", b"512"))
    by_id = dict(zip(t.column("request_id").to_pylist(), t.column("hash_ids").to_pylist()))
    return [by_id.get(i) or None for i in np.asarray(stream.request_id).tolist()], H
