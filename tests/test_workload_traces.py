"""Trace loading, checks and repairs, the canonical Parquet file, and replay transforms.

Independent truths: timestamps written by the test and their exact differences computed in
integer nanoseconds; the shared traces' row counts and spans from ``summary_stats.json``;
hand-counted repairs of small malformed files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.workload.trace import Trace
from llmqueue.workload.traces import (
    detect_format, load_trace, loop, read_trace, rescale_rate, time_scale, trace_to_requests, window,
    write_trace,
)

REPO = Path(__file__).resolve().parents[1]


def shared_traces() -> Path:
    """``../shared/traces`` beside the repository; skip when absent (a user's clone has none)."""
    d = REPO.parent / "shared" / "traces"
    if not (d / "summary_stats.json").is_file():
        pytest.skip(f"shared traces not found at {d} (only the team's workspace has ../shared)")
    return d


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:46.6805901,396,109\n"
         "2023-11-16 18:15:50.9951690,12,1\n"
         "2023-11-16 19:15:50.0000000,7,3\n")


# --- formats -------------------------------------------------------------------------------------

def test_azure_timestamps_are_exact_to_100ns(tmp_path):
    p = write(tmp_path / "azure.csv", AZURE)
    assert detect_format(p) == "azure"
    tr = load_trace(p)
    # Differences in integer nanoseconds, then one division: exactly what the loader must give.
    ns = np.array([0, 100, 4_314_579_000, 3_603_319_410_000])
    assert np.array_equal(tr.arrival_s, ns / 1e9)
    assert tr.arrival_s[1] == 1e-7
    assert tr.prompt_tokens.tolist() == [374, 396, 12, 7]
    assert tr.output_tokens.tolist() == [44, 109, 1, 3]
    assert tr.prompt_tokens.dtype == np.int64 and tr.repairs == []


def test_shared_azure_and_mooncake_rows_and_spans():
    d = shared_traces()
    ref = json.loads((d / "summary_stats.json").read_text())
    for rel in ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
                "mooncake_fast25/conversation_trace.jsonl", "mooncake_fast25/synthetic_trace.jsonl"):
        tr = load_trace(d / rel)
        assert len(tr) == ref[rel]["rows"]
        assert tr.arrival_s[0] == 0 and np.all(np.diff(tr.arrival_s) >= 0)
        assert tr.span_s == pytest.approx(ref[rel]["span_s"], abs=1e-3)
    mc = load_trace(d / "mooncake_fast25/conversation_trace.jsonl")
    assert detect_format(d / "mooncake_fast25/conversation_trace.jsonl") == "mooncake"
    assert mc.hash_ids is not None and len(mc.hash_ids) == len(mc)
    assert mc.hash_ids[0].tolist() == list(range(14))  # the file's first record
    # 90 % of the gaps are 0 (3 s ticks): reported, with the way out.
    assert any("share the timestamp" in r and "90.2%" in r and "spread_ties" in r for r in mc.repairs)


def test_mooncake_spread_ties_spreads_evenly_within_the_tick(tmp_path):
    rows = [(0, 10, 1), (0, 11, 2), (0, 12, 3), (3000, 13, 4), (6000, 14, 5), (6000, 15, 6)]
    p = write(tmp_path / "mc.jsonl", "".join(
        json.dumps({"timestamp": t, "input_length": s, "output_length": o, "hash_ids": [s]}) + "\n"
        for t, s, o in rows))
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == [0, 0, 0, 3, 6, 6]
    assert any(r.startswith("3 rows share the timestamp") for r in tr.repairs)
    sp = load_trace(p, spread_ties=True)
    # tick = median non-zero gap = 3 s; the group of 3 at t=0 goes to 0, 1, 2; the last pair
    # (no next time) spreads over one tick: 6, 7.5.
    assert sp.arrival_s.tolist() == [0, 1, 2, 3, 6, 7.5]
    assert sp.prompt_tokens.tolist() == [10, 11, 12, 13, 14, 15]
    assert any("spread each group of ties" in r for r in sp.repairs)


def test_burstgpt_from_its_documented_schema(tmp_path):
    p = write(tmp_path / "BurstGPT_1.csv",
              "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "5,ChatGPT,472,18,490,Conversation log\n"
              "45,ChatGPT,1087,0,1087,Conversation log\n"
              "118,GPT-4,417,276,693,API log\n"
              "130.5,ChatGPT,1360,7,1367,Conversation log\n")
    assert detect_format(p) == "burstgpt"
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == [0, 40, 113, 125.5]
    assert tr.prompt_tokens.tolist() == [472, 1087, 417, 1360]
    assert tr.output_tokens.tolist() == [18, 0, 276, 7]
    assert tr.class_name.tolist() == ["ChatGPT", "ChatGPT", "GPT-4", "ChatGPT"]
    assert any("1 rows have output length 0" in r for r in tr.repairs)
    by_log = load_trace(p, mapping="class=Log Type")
    assert by_log.class_name.tolist()[2] == "API log"


def _vllm_result(**over):
    d = {"date": "20250101-000000", "backend": "vllm", "request_rate": 4.0, "burstiness": 1.0,
         "num_prompts": 4, "duration": 2.0, "completed": 3, "request_throughput": 1.5,
         "input_lens": [100, 200, 300, 400], "output_lens": [10, 20, 0, 40],
         "ttfts": [0.1, 0.2, 0.0, 0.3], "itls": [[0.01] * 9, [0.01] * 19, [], [0.01] * 39],
         "start_times": [1000.25, 1000.5, 1001.0, 1000.75],
         "errors": ["", "", "timeout", ""]}
    d.update(over)
    return d


def test_vllm_result_with_start_times(tmp_path):
    p = write(tmp_path / "vllm-4.0qps-model.json", json.dumps(_vllm_result()))
    assert detect_format(p) == "vllm"
    tr = load_trace(p)
    # perf_counter start times rebased to the first; the 4th was launched before the 3rd.
    assert tr.arrival_s.tolist() == [0, 0.25, 0.5, 0.75]
    assert tr.prompt_tokens.tolist() == [100, 200, 400, 300]
    assert tr.output_tokens.tolist() == [10, 20, 40, 0]
    assert any(r.startswith("sorted 1 out-of-order rows") for r in tr.repairs)
    assert any("1 requests failed" in r for r in tr.repairs)


def test_vllm_result_without_start_times(tmp_path):
    d = _vllm_result()
    del d["start_times"]
    p = write(tmp_path / "old.json", json.dumps(d))
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == [0, 0.25, 0.5, 0.75]  # evenly at the file's 4 req/s
    assert any("reconstructed" in r and "not the measured arrival process" in r for r in tr.repairs)
    assert load_trace(p, request_rate=2).arrival_s.tolist() == [0, 0.5, 1.0, 1.5]
    d["request_rate"] = "inf"
    write(p, json.dumps(d))
    with pytest.raises(InputError, match="request_rate.*cannot be reconstructed.*--request-rate"):
        load_trace(p)
    d2 = _vllm_result()
    for k in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "errors"):
        del d2[k]
    write(p, json.dumps(d2))
    with pytest.raises(InputError, match="--save-detailed"):
        load_trace(p)


def test_generic_csv_jsonl_parquet_with_mapping_and_known_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = write(tmp_path / "t.csv", "t_ms,in,out,tenant\n0,5,6,a\n250,7,8,b\n1000,9,10,a\n")
    tr = load_trace(p, mapping="time=t_ms,prompt=in,output=out,class=tenant")
    assert tr.arrival_s.tolist() == [0, 0.25, 1.0]  # unit from the _ms suffix
    assert tr.class_name.tolist() == ["a", "b", "a"]
    assert load_trace(p, mapping={"time": "t_ms", "prompt": "in", "output": "out", "time_unit": "s"}
                      ).arrival_s.tolist() == [0, 250, 1000]
    # Known names, no mapping: arrival_s, prompt_tokens/output_tokens, class.
    q = write(tmp_path / "k.jsonl", "".join(json.dumps({"arrival_s": t, "input_tokens": s, "output_tokens": o,
                                                          "class": c}) + "\n"
                                            for t, s, o, c in [(1.5, 3, 4, "x"), (2.0, 5, 6, "y")]))
    tk = load_trace(q)
    assert tk.arrival_s.tolist() == [0, 0.5] and tk.prompt_tokens.tolist() == [3, 5]
    assert tk.class_name.tolist() == ["x", "y"]
    pq.write_table(pa.table({"time": [0.0, 0.1, 0.2], "prompt_len": [1, 2, 3], "output_len": [4, 5, 6]}),
                   tmp_path / "g.parquet")
    assert detect_format(tmp_path / "g.parquet") == "parquet"
    tg = load_trace(tmp_path / "g.parquet")
    assert tg.output_tokens.tolist() == [4, 5, 6] and tg.arrival_s.tolist() == [0.0, 0.1, 0.2]
    # ISO 8601 text timestamps in a generic file.
    iso = write(tmp_path / "iso.csv", "time,prompt,output\n2024-01-01T00:00:00,1,1\n2024-01-01T00:00:01.5,2,2\n")
    assert load_trace(iso).arrival_s.tolist() == [0, 1.5]


# --- malformed traces ----------------------------------------------------------------------------

def test_missing_column_is_named_with_the_columns_found(tmp_path):
    p = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(InputError, match=r"no output column 'GeneratedTokens' \(columns found: "
                                         r"TIMESTAMP, ContextTokens\)"):
        load_trace(p, format="azure")
    with pytest.raises(InputError, match=r"no output column .*columns found: TIMESTAMP, ContextTokens.*output="):
        load_trace(p)  # detected as generic CSV: the output column is missing
    with pytest.raises(InputError, match=r"time='nope'.*columns found"):
        load_trace(p, mapping="time=nope")


def test_negative_nan_and_non_integer_lengths_error_with_row_or_drop(tmp_path):
    p = write(tmp_path / "bad.csv", "arrival_s,prompt_tokens,output_tokens\n"
                                    "0,10,5\n1,-3,5\n2,10,NaN\n3,10,\n4,2.5,5\n5,-7,5\n6,8,9\n")
    with pytest.raises(InputError) as e:
        load_trace(p)
    msg = str(e.value)
    assert msg.startswith("prompt_tokens: data row 2 ") and "negative length: -3" in msg
    assert "5 bad rows" in msg and "--drop-bad" in msg and "\n" not in msg
    tr = load_trace(p, drop_bad=True)
    assert tr.prompt_tokens.tolist() == [10, 8] and tr.arrival_s.tolist() == [0, 6]
    assert "dropped 2 rows with missing or non-numeric lengths (first: data row 3, output_tokens = an empty cell)" \
        in tr.repairs
    assert any(r.startswith("dropped 2 rows with negative lengths (first: data row 2") for r in tr.repairs)
    assert any(r.startswith("dropped 1 rows with non-integer lengths (first: data row 5, prompt_tokens = 2.5)")
               for r in tr.repairs)
    # A non-number in a numeric column.
    q = write(tmp_path / "text.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,abc,1\n")
    with pytest.raises(InputError, match=r"prompt_tokens: data row 2 .*non-numeric length: 'abc'"):
        load_trace(q)
    assert load_trace(q, drop_bad=True).prompt_tokens.tolist() == [1]


def test_unsorted_timestamps_are_sorted_stably_and_reported(tmp_path):
    p = write(tmp_path / "u.csv", "arrival_s,prompt_tokens,output_tokens\n"
                                  "0,1,1\n5,2,1\n1,3,1\n2,4,1\n5,5,1\n6,6,1\n")
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == [0, 1, 2, 5, 5, 6]
    assert tr.prompt_tokens.tolist() == [1, 3, 4, 2, 5, 6]  # the tie at 5 keeps file order
    assert tr.repairs[0].startswith("sorted 2 out-of-order rows")
    assert any(r.startswith("1 rows share the timestamp") for r in tr.repairs)


def test_empty_and_header_only_files(tmp_path):
    with pytest.raises(InputError, match=r"file: .* is empty"):
        load_trace(write(tmp_path / "e.csv", ""))
    with pytest.raises(InputError, match=r"is empty"):
        load_trace(write(tmp_path / "e.jsonl", "\n\n"))
    with pytest.raises(InputError, match=r"no requests \(a header but no data rows"):
        load_trace(write(tmp_path / "h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"))
    with pytest.raises(InputError, match=r"does not exist"):
        load_trace(tmp_path / "missing.csv")


def test_milliseconds_read_as_seconds_are_caught(tmp_path):
    # 200 requests 200 ms apart, times in ms under a unit-less name.
    rows = "".join(f"{200 * i},{10 + i},{5}\n" for i in range(200))
    p = write(tmp_path / "ms.csv", "timestamp,prompt,output\n" + rows)
    with pytest.raises(InputError) as e:
        load_trace(p)
    msg = str(e.value)
    assert msg.startswith("time_unit: time column 'timestamp' read as seconds spans")
    assert "looks like milliseconds (39.8 s at 5 req/s)" in msg and "time_unit=ms" in msg
    assert load_trace(p, time_unit="ms").mean_rate == pytest.approx(5.0, rel=1e-12)
    # Given explicitly as seconds: accepted, with a warning among the repairs.
    tr = load_trace(p, time_unit="s")
    assert tr.span_s == 39_800 and any(r.startswith("warning:") and "milliseconds" in r for r in tr.repairs)


def test_unknown_format_and_bad_mapping(tmp_path):
    p = write(tmp_path / "a.csv", AZURE)
    with pytest.raises(InputError, match="format: unknown trace format 'xml'"):
        load_trace(p, format="xml")
    with pytest.raises(InputError, match="map: unknown key 'tim'"):
        load_trace(p, mapping="tim=TIMESTAMP")
    with pytest.raises(InputError, match="map: 'time' is not KEY=COLUMN"):
        load_trace(p, mapping="time")
    with pytest.raises(InputError, match="time_unit: unknown time unit 'h'"):
        load_trace(p, time_unit="h")


# --- canonical file ------------------------------------------------------------------------------

def test_round_trip_is_exact_with_classes_hash_ids_and_metadata(tmp_path):
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    t = np.sort(rng.random(500) * 100)
    t -= t[0]
    tr = Trace(t, rng.integers(1, 5000, 500), rng.integers(0, 900, 500),
               class_name=np.array(["a", "bb"] * 250), hash_ids=[rng.integers(0, 50, k) for k in
                                                                rng.integers(0, 6, 500)],
               source="somewhere/trace.csv", repairs=["sorted 3 out-of-order rows"])
    out = write_trace(tr, tmp_path / "t.parquet")
    meta = pq.read_schema(out).metadata
    assert meta[b"llmqueue.version"] == b"1" and meta[b"llmqueue.source"] == b"somewhere/trace.csv"
    assert json.loads(meta[b"llmqueue.repairs"]) == ["sorted 3 out-of-order rows"]
    assert pq.read_schema(out).names == ["arrival_s", "prompt_tokens", "output_tokens", "class", "hash_ids"]
    back = read_trace(out)
    assert detect_format(out) == "canonical"
    assert np.array_equal(back.arrival_s, tr.arrival_s) and back.arrival_s.dtype == np.float64
    assert np.array_equal(back.prompt_tokens, tr.prompt_tokens)
    assert np.array_equal(back.output_tokens, tr.output_tokens)
    assert back.class_name.tolist() == tr.class_name.tolist()
    assert all(np.array_equal(a, b) for a, b in zip(back.hash_ids, tr.hash_ids))
    assert back.source == tr.source and back.repairs == tr.repairs


def test_round_trip_of_shared_traces(tmp_path):
    d = shared_traces()
    for rel in ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", "mooncake_fast25/synthetic_trace.jsonl"):
        a = load_trace(d / rel)
        b = load_trace(write_trace(a, tmp_path / "x.parquet"))
        for k in ("arrival_s", "prompt_tokens", "output_tokens"):
            assert np.array_equal(getattr(a, k), getattr(b, k))
        assert (a.hash_ids is None) == (b.hash_ids is None)
        if a.hash_ids is not None:
            assert all(np.array_equal(x, y) for x, y in zip(a.hash_ids, b.hash_ids))
        assert b.repairs == a.repairs and b.source == str(d / rel)


# --- replay --------------------------------------------------------------------------------------

def _small():
    return Trace(np.array([0.0, 1.0, 1.0, 4.0, 6.0]), np.array([1, 2, 3, 4, 5]), np.array([5, 4, 3, 2, 1]),
                 class_name=np.array(["a", "b", "a", "b", "a"]), hash_ids=[np.array([i]) for i in range(5)],
                 source="small")


def test_time_scale_and_rescale_rate():
    tr = _small()
    half = time_scale(tr, 0.5)
    assert half.arrival_s.tolist() == [0, 0.5, 0.5, 2, 3]
    assert half.mean_rate == 2 * tr.mean_rate and tr.arrival_s[1] == 1.0  # the input is untouched
    assert half.repairs[-1] == "scaled times by 0.5 (rate x2)"
    r = rescale_rate(tr, 10)
    assert r.mean_rate == pytest.approx(10, rel=1e-14)
    assert np.array_equal(r.arrival_s, tr.arrival_s * (tr.mean_rate / 10))
    assert r.prompt_tokens.tolist() == tr.prompt_tokens.tolist()
    with pytest.raises(InputError, match="scale: must be > 0"):
        time_scale(tr, 0)


def test_window_and_loop():
    tr = _small()
    w = window(tr, 1, 6)
    assert w.arrival_s.tolist() == [0, 0, 3] and w.prompt_tokens.tolist() == [2, 3, 4]
    assert w.class_name.tolist() == ["b", "a", "b"] and [h.tolist() for h in w.hash_ids] == [[1], [2], [3]]
    assert window(tr, 2).arrival_s.tolist() == [0, 2]
    with pytest.raises(InputError, match=r"window: \[7, 9\) s holds no requests"):
        window(tr, 7, 9)
    lp = loop(tr, 3)
    period = 6 * 5 / 4  # the span plus one mean gap keeps the mean rate
    assert lp.arrival_s.tolist() == [t + k * period for k in range(3) for t in tr.arrival_s.tolist()]
    assert lp.prompt_tokens.tolist() == tr.prompt_tokens.tolist() * 3
    assert len(lp.hash_ids) == 15 and lp.class_name.tolist() == tr.class_name.tolist() * 3
    lu = loop(tr, until_s=9)
    assert lu.arrival_s.tolist() == [0, 1, 1, 4, 6, 7.5, 8.5, 8.5]
    assert loop(tr, 2, period_s=10).arrival_s.tolist() == [0, 1, 1, 4, 6, 10, 11, 11, 14, 16]
    with pytest.raises(InputError, match="period_s: must exceed"):
        loop(tr, 2, period_s=5)


def test_trace_to_requests():
    tr = _small()
    reqs = trace_to_requests(tr)
    assert len(reqs) == 5 and reqs.request_id.tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(reqs.arrival_s, tr.arrival_s)
    assert reqs.class_name.tolist() == tr.class_name.tolist()
    assert reqs[3].prompt_tokens == 4 and reqs[3].output_tokens == 2
    plain = trace_to_requests(Trace(np.array([0.0, 1.0]), np.array([3, 4]), np.array([5, 6])))
    assert plain.classes == ("default",)
