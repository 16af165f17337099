"""``llmqueue import`` checks every number of every format (issue 37, item 5): a text, NaN,
inf or an out-of-range value in a numeric field is one line naming the row and the field, exit
2; a request whose times cannot have happened (TTFT longer than its latency, a finish before
its send) is dropped and counted (the notes and ``imported.dropped``).

Each case edits one request of a good file of its format (the fixtures of tests/data, a CSV and
a vLLM bench result written here) and imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import run_cli

DATA = Path(__file__).parent / "data"
CSV_HEAD = "send_s,ttft_s,e2el_s,prompt_tokens,output_tokens\n"
CSV_ROWS = ["0,0.1,0.5,10,5", "1,0.2,0.6,11,5", "2,0.1,0.4,12,4", "3,0.1,0.5,13,6"]


def _set(path: list, value):
    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


def guidellm(tmp: Path, edit) -> Path:
    g = json.loads((DATA / "guidellm_v0.7_benchmarks.json").read_text())
    g["benchmarks"] = [g["benchmarks"][1]]
    edit(g["benchmarks"][0]["requests"]["successful"][3])
    p = tmp / "benchmarks.json"
    p.write_text(json.dumps(g))
    return p


def guidellm_v03(tmp: Path, edit) -> Path:
    g = json.loads((DATA / "guidellm_v0.3_benchmarks.json").read_text())
    edit(g["benchmarks"][0]["requests"]["successful"][2])
    p = tmp / "benchmarks.json"
    p.write_text(json.dumps(g))
    return p


def aiperf(tmp: Path, edit) -> Path:
    lines = (DATA / "aiperf_profile_export.jsonl").read_text().splitlines()
    d = json.loads(lines[5])
    edit(d)
    lines[5] = json.dumps(d)
    p = tmp / "profile_export.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def vllm(tmp: Path, edit) -> Path:
    n = 6
    d = {"request_rate": 4.0, "input_lens": [10 + i for i in range(n)], "output_lens": [5] * n,
         "ttfts": [0.05] * n, "latencies": [0.3] * n, "itls": [[0.0625] * 4 for _ in range(n)],
         "start_times": [1000.0 + i for i in range(n)], "errors": [""] * n}
    edit(d)
    p = tmp / "result.json"
    p.write_text(json.dumps(d))
    return p


def csv(tmp: Path, row: str) -> Path:
    p = tmp / "client.csv"
    p.write_text(CSV_HEAD + "\n".join(CSV_ROWS[:1] + [row] + CSV_ROWS[2:]) + "\n")
    return p


def _lst(key, i, value):
    return lambda d: d[key].__setitem__(i, value)


# (id, format, make(tmp) -> file, extra args, fragments the one line must hold)
REFUSED = [
    ("guidellm-first-nan-text", "guidellm", lambda t: guidellm(t, _set(["info", "timings", "first_token_iteration"],
                                                                         "NaN")),
     (), ("info.timings.first_token_iteration", "requests.successful[3]", "not finite")),
    ("guidellm-first-word", "guidellm", lambda t: guidellm(t, _set(["info", "timings", "first_token_iteration"],
                                                                     "soon")),
     (), ("info.timings.first_token_iteration", "requests.successful[3]", "not a number")),
    ("guidellm-prompt-word", "guidellm", lambda t: guidellm(t, _set(["prompt_tokens"], "many")),
     (), ("prompt_tokens", "requests.successful[3]", "not a number")),
    ("guidellm-output-fraction", "guidellm", lambda t: guidellm(t, _set(["output_tokens"], 7.5)),
     (), ("output_tokens", "requests.successful[3]", "whole number")),
    ("guidellm-send-1e300", "guidellm", lambda t: guidellm(t, _set(["info", "timings", "request_start"], 1e300)),
     (), ("info.timings.request_start", "out of range")),
    ("guidellm-v03-prompt-word", "guidellm", lambda t: guidellm_v03(t, _set(["prompt_tokens"], "lots")),
     (), ("prompt_tokens", "requests.successful[2]")),
    ("guidellm-v03-start-bool", "guidellm", lambda t: guidellm_v03(t, _set(["start_time"], True)),
     (), ("start_time", "requests.successful[2]")),
    ("aiperf-ttft-nan-text", "aiperf", lambda t: aiperf(t, _set(["metrics", "time_to_first_token", "value"], "NaN")),
     (), ("metrics.time_to_first_token", "line 6", "not finite")),
    ("aiperf-ttft-word", "aiperf", lambda t: aiperf(t, _set(["metrics", "time_to_first_token", "value"], "fast")),
     (), ("metrics.time_to_first_token", "line 6", "not a number")),
    ("aiperf-isl-word", "aiperf", lambda t: aiperf(t, _set(["metrics", "input_sequence_length", "value"], "x")),
     (), ("metrics.input_sequence_length", "line 6")),
    ("aiperf-osl-fraction", "aiperf", lambda t: aiperf(t, _set(["metrics", "output_sequence_length", "value"], 2.5)),
     (), ("metrics.output_sequence_length", "whole number")),
    ("aiperf-start-word", "aiperf", lambda t: aiperf(t, _set(["metadata", "request_start_ns"], "x")),
     (), ("metadata.request_start_ns", "line 6")),
    ("aiperf-start-1e300", "aiperf", lambda t: aiperf(t, _set(["metadata", "request_start_ns"], 1e300)),
     (), ("metadata.request_start_ns", "out of range")),
    ("aiperf-itl-word", "aiperf", lambda t: aiperf(t, _set(["metrics", "inter_chunk_latency", "value"], ["a"])),
     (), ("metrics.inter_chunk_latency", "line 6")),
    ("aiperf-latency-negative", "aiperf", lambda t: aiperf(t, _set(["metrics", "request_latency", "value"], -5.0)),
     (), ("metrics.request_latency", "out of range")),
    ("vllm-ttft-word", "vllm-bench", lambda t: vllm(t, _lst("ttfts", 2, "x")), (), ("ttfts", "request 3")),
    ("vllm-latency-inf", "vllm-bench", lambda t: vllm(t, _lst("latencies", 2, "inf")), (), ("latencies", "request 3")),
    ("vllm-start-1e300", "vllm-bench", lambda t: vllm(t, _lst("start_times", 1, 1e300)), (), ("start_times",)),
    ("vllm-input-negative", "vllm-bench", lambda t: vllm(t, _lst("input_lens", 0, -3)), (), ("input_lens",)),
    ("vllm-itl-word", "vllm-bench", lambda t: vllm(t, lambda d: d["itls"].__setitem__(4, ["z"])), (),
     ("itls", "request 5")),
    ("csv-ttft-nan", "csv", lambda t: csv(t, "1,nan,0.6,11,5"), (), ("ttft_s", "row 2", "not finite")),
    ("csv-ttft-word", "csv", lambda t: csv(t, "1,soon,0.6,11,5"), (), ("ttft_s", "row 2", "not a number")),
    ("csv-send-1e300", "csv", lambda t: csv(t, "1e300,0.2,0.6,11,5"), (), ("send_s", "row 2", "out of range")),
    ("csv-send-1e17-ms", "csv", lambda t: csv(t, "1e17,0.2,0.6,11,5"), ("--time-unit", "ms"), ("send_s", "row 2")),
    ("csv-output-huge", "csv", lambda t: csv(t, "1,0.2,0.6,11,1e30"), (), ("output_tokens", "row 2")),
    ("csv-origin-1e300", "csv", lambda t: csv(t, CSV_ROWS[1]), ("--time-origin", "-1e300"), ("--time-origin",)),
    ("csv-origin-nan", "csv", lambda t: csv(t, CSV_ROWS[1]), ("--time-origin", "nan"), ("--time-origin",)),
    ("csv-origin-inf", "csv", lambda t: csv(t, CSV_ROWS[1]), ("--time-origin", "inf"), ("--time-origin",)),
]

# (id, format, make(tmp) -> file, requests left, a fragment of the note)
DROPPED = [
    ("csv-ttft-longer-than-latency", "csv", lambda t: csv(t, "1,0.9,0.3,11,5"), 3, "TTFT longer"),
    ("guidellm-first-after-last", "guidellm",
     lambda t: guidellm(t, _set(["info", "timings", "first_token_iteration"], 1767225699.0)), None, "TTFT longer"),
    ("guidellm-last-before-send", "guidellm",
     lambda t: guidellm(t, lambda r: r["info"]["timings"].update(last_token_iteration=1000.0, request_end=1000.0)),
     None, "finish before the send"),
    ("aiperf-ttft-longer-than-latency", "aiperf",
     lambda t: aiperf(t, _set(["metrics", "time_to_first_token", "value"], 5000.0)), 39, "TTFT longer"),
    ("vllm-ttft-longer-than-latency", "vllm-bench", lambda t: vllm(t, _lst("ttfts", 2, 0.9)), 5, "TTFT longer"),
]


def _line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("llmqueue: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("fmt, make, extra, words", [pytest.param(f, m, e, w, id=i) for i, f, m, e, w in REFUSED])
def test_a_bad_number_is_one_line_naming_the_row_and_field(tmp_path, fmt, make, extra, words):
    src = make(tmp_path)
    code, _, err = run_cli("import", fmt, src, "--out", tmp_path / "run", *extra)
    assert code == 2, err
    line = _line(err)
    assert all(w in line for w in words), (words, line)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fmt, make, left, words", [pytest.param(f, m, n, w, id=i) for i, f, m, n, w in DROPPED])
def test_impossible_times_are_dropped_and_counted(tmp_path, fmt, make, left, words):
    src = make(tmp_path)
    code, out, err = run_cli("import", fmt, src, "--out", tmp_path / "run", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["imported"]["dropped"] == 1
    if left is not None:
        assert s["imported"]["requests"] == left
    note = next(n for n in s["notes"] if "impossible times" in n)
    assert note.startswith("1 request(s)") and words in note, note
    # the table says it too
    code, out, err = run_cli("import", fmt, src, "--out", tmp_path / "run2")
    assert code == 0 and "dropped (impossible times)" in out and "impossible times dropped" in out


def test_a_file_of_only_impossible_times_is_one_line(tmp_path):
    src = tmp_path / "c.csv"
    src.write_text(CSV_HEAD + "0,0.9,0.5,10,5\n1,0.9,0.2,10,5\n")
    code, _, err = run_cli("import", "csv", src, "--out", tmp_path / "run")
    assert code == 2
    assert "impossible times" in _line(err)
