"""Bad input to every command: one line on stderr naming the flag or field, exit 2, no traceback,
quickly, and nothing written.

Each case runs the command line in a fresh directory holding the probe files below (a trace, a
truncated gzip, bytes that are not UTF-8, nesting too deep to parse, a Python YAML tag, a FIFO,
...). In-process cases run the CLI (``run_cli``) in a thread (so a hang fails after 10 s instead
of blocking the suite); cases where a real file descriptor matters (a FIFO, stdout
on a full device) run the CLI in a subprocess. Every case checks the directory is unchanged
afterwards. The cases come from the issue tracker's probes and from probing each flag with the
wrong type, a negative, zero, NaN, inf, an unknown name, a missing file, a directory instead of a
file, an empty file and malformed content. Refusals of unbounded work (a huge --duration,
--num-requests, --bins ...) and Ctrl-C are tested elsewhere.
"""

from __future__ import annotations

import gzip
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _cli import run_cli

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 60.0  # a hang guard, not a speed test: refusals take well under a second alone, but
# a fresh clone's first run beside busy processes once took over 10 s (and a case left running
# in its thread then wrote into the next case's captured output)

# A small, fast simulation (the flags each case changes come after and override nothing: each
# case builds its own command line from these pieces).
M = "--capacity-tokens 131000 --step-time 0.0372 --chunk 512"
WL = "--prompt uniform:10:1600 --output uniform:10:1600 --arrival poisson:1 --duration 20 --seed 1"
SIM = f"simulate {M} {WL} --no-progress"
SWEEP = f"sweep {M} {WL} --rates 1,2 --backend serial --no-progress"
CAP = f"capacity {M} {WL} --slo-ttft-ms 2000 --backend serial --no-progress"
BENCH = "bench --url http://127.0.0.1:9 --model m --prompt fixed:10 --output fixed:10 --arrival poisson:1 --duration 5"
STAB = "stability --capacity-tokens 131000 --step-time 0.0372 --prompt uniform:10:1600 --output uniform:10:1600"
BATCH = "batch --lam 100 --t-fixed-ms 50 --t-req-ms 0.5"
SEED2 = "report --batch-figure"
STEP = f"simulate --capacity-tokens 131000 {WL} --no-progress --step-time"
PROF = "profile --url http://127.0.0.1:9 --model m --out o --no-progress"


def _write_files(d: Path) -> None:
    """The probe files, in directory ``d``."""
    rows = "".join(f"{i},{10 + i % 7},{5 + i % 5}\n" for i in range(1, 80))
    (d / "t.csv").write_text("time,prompt,output\n" + rows)
    (d / "empty.csv").write_text("")
    (d / "header.csv").write_text("time,prompt,output\n")
    (d / "blank.jsonl").write_text("\n\n")
    data = gzip.compress(("time,prompt,output\n" + rows * 40).encode())
    (d / "trunc.csv.gz").write_bytes(data[: len(data) // 2])
    (d / "notgz.csv.gz").write_bytes(b"plain text, not gzip\n")
    (d / "bad.jsonl").write_bytes(b'{"timestamp": 1, "input_length": 10, "output_length": 5}\n\xff\xfe bad\n')
    (d / "bad.csv").write_bytes(b"time,prompt,output\n1,10,10\n2,\xff\xfe,20\n")
    (d / "inf.csv").write_text("time,prompt,output\n1,10,10\ninf,20,20\n")
    (d / "big.csv").write_text("time,prompt,output\n1,10,10\n1e300,20,20\n")
    (d / "big17.csv").write_text("time,prompt,output\n1,10,10\n2,20,20\n1e17,20,20\n")
    (d / "neg.csv").write_text("time,prompt,output\n1,10,10\n2,-5,20\n")
    (d / "frac.csv").write_text("time,prompt,output\n1,10,10\n2,5.5,20\n")
    (d / "text.csv").write_text("time,prompt,output\n1,10,10\n2,many,20\n")
    (d / "nan.csv").write_text("time,prompt,output\n1,10,10\nnan,5,20\n")
    (d / "cols.csv").write_text("a,b,c\n1,2,3\n")
    (d / "reqs.csv").write_text("send_s,ttft_s,e2el_s,prompt_tokens,output_tokens\n"
                                + "".join(f"{i * 0.5},0.05,0.2,{10 + i},8\n" for i in range(20)))
    (d / "zero.csv").write_text("time,prompt,output\n1,0,0\n2,0,0\n3,0,0\n")
    (d / "strhash.jsonl").write_text(
        '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": "abc"}\n'
        '{"timestamp": 2, "input_length": 10, "output_length": 5, "hash_ids": "abc"}\n')
    (d / "mixhash.jsonl").write_text(
        '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": ["a"]}\n'
        '{"timestamp": 2, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    (d / "badline.jsonl").write_text('{"timestamp": 1, "input_length": 10, "output_length": 5}\n{oops\n')
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (d / "tag.yaml").write_text('step_time: !!python/object/apply:os.system ["echo hi"]\n')
    (d / "bin.yaml").write_bytes(bytes(range(128, 256)) * 2)
    (d / "unclosed.yaml").write_text("step_time: [unclosed\n")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "nostep.yaml").write_text("M: 1000\n")
    (d / "notjson.json").write_text("{not json")
    (d / "config.json").write_text('{"hidden_size": "big"}')
    (d / "adir").mkdir()
    (d / "emptydir").mkdir()
    os.mkfifo(d / "fifo")
    # run directories a report refuses: a NaN summary, a summary that is no object, a symlink loop
    # and a FIFO where requests.parquet should be (the records are never read: the refusal comes first)
    for name, summary in (("runnan", '{"duration": NaN, "completed": 3}'), ("runlist", "[1, 2]")):
        (d / name).mkdir()
        (d / name / "requests.parquet").write_bytes(b"PAR1 not read PAR1")
        (d / name / "summary.json").write_text(summary)
    (d / "runloop").mkdir()
    (d / "runloop" / "requests.parquet").symlink_to("requests.parquet")
    (d / "runfifo").mkdir()
    os.mkfifo(d / "runfifo" / "requests.parquet")
    # links planted where outputs go (issue 37 item 8): nothing may be written through them
    (d / "victim.txt").write_text("not to be overwritten\n")
    for link, target in [("link.yaml", "victim.txt"), ("link.parquet", "victim.txt"), ("link.html", "victim.txt"),
                         ("dangling.yaml", "nowhere/x.yaml"), ("fitx.pairs.csv", "victim.txt"),
                         ("linkrun/requests.parquet", "../victim.txt"), ("linksum/summary.json", "../victim.txt"),
                         ("linkdang/workload.parquet", "../nowhere.parquet"),
                         ("linkjournal/requests.parquet.journal", "../victim.txt"),
                         ("linksweep/sweep.json", "../victim.txt"), ("linkplan/plan.json", "../victim.txt"),
                         ("linkprof/profile.json", "../victim.txt"),
                         ("linkgw/decisions.jsonl", "../victim.txt")]:
        (d / link).parent.mkdir(exist_ok=True)
        os.symlink(target, d / link)


def _snapshot(d: Path) -> dict:
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(d))] = (st.st_mode, st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


# (id, command line, fragment the one line must hold: the flag or field it names)
CASES: list[tuple[str, str, str]] = [
    # --- the emulator: refused before it listens ---------------------------------------------------
    ("emulate-no-step-time", "emulate", "--step-time"),
    ("emulate-step-time-bad", "emulate --step-time nope", "--step-time"),
    ("emulate-replicas-zero", "emulate --step-time 0.02 --replicas 0", "--replicas"),
    ("emulate-port-range", "emulate --step-time 0.02 --port 70000", "--port"),
    ("emulate-slow-factor-text", "emulate --step-time 0.02 --slow-factor x", "--slow-factor"),
    ("emulate-slow-factor-window", "emulate --step-time 0.02 --slow-factor 2@5:1", "--slow-factor"),
    ("emulate-reject-fraction", "emulate --step-time 0.02 --reject-fraction 2", "--reject-fraction"),
    ("emulate-host-foreign", "emulate --step-time 0.02 --host 192.0.2.1 --port 0", "--host"),
    ("emulate-scenario-missing", "emulate --scenario no-such-scenario", "--scenario"),
    ("gateway-no-backend", "gateway --scenario chat --out o", "--backend"),
    ("gateway-backend-form", "gateway --scenario chat --backend x --out o", "--backend"),
    ("gateway-backend-scheme", "gateway --scenario chat --backend default=ftp://a --out o", "--backend"),
    ("gateway-backend-unknown-pool", "gateway --scenario chat --backend nope=http://127.0.0.1:9 --out o", "--backend"),
    ("gateway-backend-pool-missing", "gateway --scenario lanes --backend latency=http://127.0.0.1:9 --out o", "--backend"),
    ("gateway-listen-form", "gateway --scenario chat --backend default=http://127.0.0.1:9 --listen abc --out o", "--listen"),
    ("gateway-listen-foreign", "gateway --scenario chat --backend default=http://127.0.0.1:9 --listen 192.0.2.1:0 --out o",
     "--listen"),
    ("gateway-key-unset", "gateway --scenario chat --backend default=http://127.0.0.1:9 --upstream-key default=LLMQ_NO_SUCH_VAR "
     "--out o", "--upstream-key"),
    ("gateway-key-form", "gateway --scenario chat --backend default=http://127.0.0.1:9 --upstream-key default --out o",
     "--upstream-key"),
    ("gateway-scenario-missing", "gateway --scenario no-such --backend default=http://127.0.0.1:9 --out o", "--scenario"),
    ("gateway-retries-negative", "gateway --scenario chat --backend default=http://127.0.0.1:9 --max-retries -1 --out o",
     "--max-retries"),
    ("gateway-client-timeout-zero", "gateway --scenario chat --backend default=http://127.0.0.1:9 --client-timeout 0 "
     "--out o", "--client-timeout"),
    ("gateway-idle-timeout-text", "gateway --scenario chat --backend default=http://127.0.0.1:9 --idle-timeout soon "
     "--out o", "--idle-timeout"),
    ("gateway-max-connections-zero", "gateway --scenario chat --backend default=http://127.0.0.1:9 --max-connections 0 "
     "--out o", "--max-connections"),
    ("gateway-first-byte-negative", "gateway --scenario chat --backend default=http://127.0.0.1:9 "
     "--upstream-first-byte-timeout -1 --out o", "--upstream-first-byte-timeout"),
    # --- output paths that cannot be written (checked before the work) ---------------------------
    ("simulate-replicas-huge", f"{SIM} --replicas 5000", "--replicas"),
    ("simulate-out-proc", f"{SIM} --out /proc/llmq-x", "--out"),
    ("simulate-out-devnull", f"{SIM} --out /dev/null", "--out"),
    ("simulate-out-under-file", f"{SIM} --out t.csv/sub", "--out"),
    ("simulate-out-is-file", f"{SIM} --out t.csv", "--out"),
    ("simulate-out-empty", f"{SIM} --out ''", "--out"),
    ("simulate-out-sys", f"{SIM} --out /sys/llmq-x", "--out"),
    ("sweep-out-proc", f"{SWEEP} --out /proc/llmq-x", "--out"),
    ("sweep-out-under-file", f"{SWEEP} --out t.csv/sub", "--out"),
    ("sweep-out-devnull", f"{SWEEP} --out /dev/null", "--out"),
    ("sweep-out-empty", f"{SWEEP} --out ''", "--out"),
    ("capacity-out-under-file", f"{CAP} --out t.csv/sub", "--out"),
    ("capacity-out-devnull", f"{CAP} --out /dev/null", "--out"),
    ("plan-slo-below-prefill", "plan --scenario chat --slo-ttft-p99-ms 5 --out o", "below the fastest single-request"),
    ("plan-budget-below-cheapest", "plan --scenario chat --budget-per-hour 0.1 --out o", "--budget-per-hour"),
    ("plan-replicas-zero", "plan --scenario chat --replicas 0 --out o", "--replicas"),
    ("plan-pp-zero", "plan --scenario chat --pp 0 --out o", "--pp"),
    ("plan-empty-space", "plan --scenario chat --tp , --out o", "space is empty"),
    ("plan-unknown-gpu", "plan --scenario chat --gpus h1000 --out o", "h1000"),
    ("plan-out-devnull", "plan --scenario chat --out /dev/null", "--out"),
    ("plan-no-scenario", "plan --out o", "--scenario"),
    ("plan-trace-and-workload", "plan --trace t.csv --workload list.yaml --models llama-3.1-8b --out o", "not both"),
    ("plan-trace-no-model", "plan --trace t.csv --slo-ttft-p99-ms 100 --out o", "--models"),
    ("plan-unknown-model", "plan --scenario chat --models llama-9b --out o", "llama-9b"),
    ("plan-step-time-two-models", "plan --scenario chat --models llama-3.1-8b,llama-3.1-70b --step-time 0.03 "
     "--gpus h100-sxm --tp 1 --out o", "--step-time"),
    ("report-o-proc", f"{SEED2} -o /proc/llmq-x/r.html", "--out"),
    ("report-o-under-file", f"{SEED2} -o t.csv/r.html", "--out"),
    ("report-o-dir", f"{SEED2} -o adir", "--out"),
    ("report-o-empty", f"{SEED2} -o ''", "--out"),
    ("report-o-devnull", f"{SEED2} -o /dev/null", "--out"),
    ("report-png-dir-file", f"{SEED2} -o r.html --png-dir t.csv", "--png-dir"),
    ("report-png-dir-proc", f"{SEED2} -o r.html --png-dir /proc/llmq-x", "--png-dir"),
    ("report-png-dir-empty", f"{SEED2} -o r.html --png-dir ''", "--png-dir"),
    ("calibrate-o-proc", "calibrate emptydir -o /proc/llmq-x.yaml", "--out"),
    ("calibrate-o-under-file", "calibrate emptydir -o t.csv/c.yaml", "--out"),
    ("calibrate-o-dir", "calibrate emptydir -o adir", "--out"),
    ("calibrate-o-empty", "calibrate emptydir -o ''", "--out"),
    ("fit-o-proc", "workload fit t.csv -o /proc/llmq-x.yaml", "--out"),
    ("fit-o-under-file", "workload fit t.csv -o t.csv/x.yaml", "--out"),
    ("fit-o-dir", "workload fit t.csv -o adir", "--out"),
    ("fit-o-empty", "workload fit t.csv -o ''", "--out"),
    ("fit-o-is-input", "workload fit t.csv -o t.csv", "--out"),
    ("convert-o-is-input", "workload convert t.csv -o t.csv", "--out"),
    ("convert-o-is-input-relative", "workload convert t.csv -o ./adir/../t.csv", "--out"),
    ("convert-o-proc", "workload convert t.csv -o /proc/llmq-x.parquet", "--out"),
    ("convert-o-under-file", "workload convert t.csv -o t.csv/o.parquet", "--out"),
    ("convert-o-dir", "workload convert t.csv -o adir", "--out"),
    ("convert-o-empty", "workload convert t.csv -o ''", "--out"),
    ("convert-o-devnull", "workload convert t.csv -o /dev/null", "--out"),
    ("bench-out-under-file", f"{BENCH} --out t.csv/run", "--out"),
    ("bench-out-devnull", f"{BENCH} --out /dev/null", "--out"),
    ("bench-out-empty", f"{BENCH} --out ''", "--out"),
    # --- a symbolic link planted where an output goes: refused before the work (issue 37 item 8) ---
    ("simulate-out-link-records", f"{SIM} --out linkrun", "linkrun/requests.parquet"),
    ("simulate-out-link-summary", f"{SIM} --out linksum", "linksum/summary.json"),
    ("simulate-out-link-dangling", f"{SIM} --out linkdang", "linkdang/workload.parquet"),
    ("import-out-link", "import csv t.csv --out linkrun", "linkrun/requests.parquet"),
    ("bench-out-link", f"{BENCH} --out linkrun", "linkrun/requests.parquet"),
    ("bench-out-link-journal", f"{BENCH} --out linkjournal", "requests.parquet.journal"),
    ("simulate-speed-spread-without-margin", f"{SIM} --speed-spread 0.05", "--speed-spread"),
    ("simulate-speed-spread-range", f"{SIM} --margin 0.1 --speed-spread 2", "--speed-spread"),
    ("gateway-out-link", "gateway --scenario chat --backend default=http://127.0.0.1:9 --out linkgw",
     "linkgw/decisions.jsonl"),
    ("sweep-out-link", f"{SWEEP} --out linksweep", "linksweep/sweep.json"),
    ("capacity-out-link", f"{CAP} --out linksweep", "linksweep/sweep.json"),
    ("plan-out-link", "plan --scenario chat --out linkplan", "linkplan/plan.json"),
    ("profile-out-link", "profile --url http://127.0.0.1:9 --model m --out linkprof --no-progress",
     "linkprof/profile.json"),
    ("calibrate-o-link", "calibrate emptydir -o link.yaml", "link.yaml"),
    ("calibrate-o-dangling", "calibrate emptydir -o dangling.yaml", "dangling.yaml"),
    ("fit-o-link", "workload fit t.csv -o link.yaml", "link.yaml"),
    ("fit-pairs-link", "workload fit t.csv -o fitx.yaml", "fitx.pairs.csv"),
    ("convert-o-link", "workload convert t.csv -o link.parquet", "link.parquet"),
    ("report-o-link", f"{SEED2} -o link.html", "link.html"),
    # --- trace files -----------------------------------------------------------------------------
    ("stats-truncated-gz", "workload stats trunc.csv.gz", "trunc.csv.gz"),
    ("stats-not-gz", "workload stats notgz.csv.gz", "notgz.csv.gz"),
    ("stats-non-utf8-jsonl", "workload stats bad.jsonl", "bad.jsonl"),
    ("stats-non-utf8-csv", "workload stats bad.csv", "prompt"),
    ("stats-inf-time", "workload stats inf.csv", "time"),
    ("stats-inf-time-unit", "workload stats inf.csv --time-unit s", "time"),
    ("stats-1e300-time", "workload stats big.csv", "time"),
    ("stats-1e300-time-unit", "workload stats big.csv --time-unit s", "time"),
    ("stats-1e17-time-unit", "workload stats big17.csv --time-unit s", "time"),
    ("stats-1e300-map-unit", "workload stats big.csv --map time=time,prompt=prompt,output=output,time_unit=s",
     "time"),
    ("stats-string-hash-ids", "workload stats strhash.jsonl", "hash_ids"),
    ("stats-mixed-hash-ids", "workload stats mixhash.jsonl", "hash_ids"),
    ("stats-deep-json", "workload stats deep.json", "deep.json"),
    ("stats-zero-lengths", "workload stats zero.csv", "zero.csv"),
    ("stats-missing", "workload stats nope.csv", "nope.csv"),
    ("stats-directory", "workload stats adir", "adir"),
    ("stats-empty", "workload stats empty.csv", "empty.csv"),
    ("stats-header-only", "workload stats header.csv", "header.csv"),
    ("stats-blank-lines", "workload stats blank.jsonl", "blank.jsonl"),
    ("stats-negative-length", "workload stats neg.csv", "prompt"),
    ("stats-fractional-length", "workload stats frac.csv", "prompt"),
    ("stats-text-length", "workload stats text.csv", "prompt"),
    ("stats-nan-time", "workload stats nan.csv", "time"),
    ("stats-unknown-columns", "workload stats cols.csv", "cols.csv"),
    ("stats-bad-json-line", "workload stats badline.jsonl", "badline.jsonl"),
    ("stats-not-json", "workload stats notjson.json", "notjson.json"),
    ("stats-unknown-format", "workload stats t.csv --format nope", "--format"),
    ("stats-bad-map", "workload stats t.csv --map time", "--map"),
    ("stats-map-unknown-key", "workload stats t.csv --map when=time", "--map"),
    ("stats-map-missing-column", "workload stats t.csv --map time=nope,prompt=prompt,output=output", "--map"),
    ("stats-bad-time-unit", "workload stats t.csv --time-unit weeks", "--time-unit"),
    ("stats-request-rate-not-vllm", "workload stats t.csv --request-rate 5", "--request-rate"),
    ("stats-request-rate-text", "workload stats t.csv --request-rate fast", "--request-rate"),
    ("stats-bins-text", "workload stats t.csv --bins a,b", "--bins"),
    ("stats-chunk-zero", "workload stats t.csv --chunk 0", "--chunk"),
    ("stats-chunk-text", "workload stats t.csv --chunk big", "--chunk"),
    ("stats-trace-and-spec", "workload stats t.csv --arrival poisson:5", "--arrival"),
    ("stats-spec-no-output", "workload stats --arrival poisson:5 --prompt fixed:5", "--out"),
    ("stats-spec-bad-arrival", "workload stats --arrival nope:5 --prompt fixed:5 --output fixed:5", "--arrival"),
    ("stats-spec-nan-rate", "workload stats --arrival poisson:nan --prompt fixed:5 --output fixed:5", "--arrival"),
    ("stats-spec-negative-length", "workload stats --arrival poisson:5 --prompt fixed:-5 --output fixed:5",
     "--prompt"),
    ("stats-no-input", "workload stats", "trace"),
    ("convert-truncated-gz", "workload convert trunc.csv.gz -o o.parquet", "trunc.csv.gz"),
    ("convert-non-utf8", "workload convert bad.jsonl -o o.parquet", "bad.jsonl"),
    ("convert-1e300-time", "workload convert big.csv --time-unit s -o o.parquet", "time"),
    ("convert-inf-time", "workload convert inf.csv --time-unit s -o o.parquet", "time"),
    ("convert-scale-huge", "workload convert t.csv -o o.parquet --scale 1e300", "--scale"),
    ("convert-scale-zero", "workload convert t.csv -o o.parquet --scale 0", "--scale"),
    ("convert-scale-nan", "workload convert t.csv -o o.parquet --scale nan", "--scale"),
    ("convert-scale-negative", "workload convert t.csv -o o.parquet --scale -2", "--scale"),
    ("convert-rate-tiny", "workload convert t.csv -o o.parquet --rate 1e-300", "--rate"),
    ("convert-rate-inf", "workload convert t.csv -o o.parquet --rate inf", "--rate"),
    ("convert-rate-subnormal", "workload convert t.csv -o o.parquet --rate 1e-320", "--rate"),
    ("convert-scale-and-rate", "workload convert t.csv -o o.parquet --scale 2 --rate 3", "--scale"),
    ("convert-window-bad", "workload convert t.csv -o o.parquet --window 9", "--window"),
    ("convert-window-text", "workload convert t.csv -o o.parquet --window a:b", "--window"),
    ("convert-window-empty", "workload convert t.csv -o o.parquet --window 1000:2000", "--window"),
    ("convert-window-reversed", "workload convert t.csv -o o.parquet --window 50:10", "--window"),
    ("convert-loop-zero", "workload convert t.csv -o o.parquet --loop 0", "--loop"),
    ("convert-missing-input", "workload convert nope.csv -o o.parquet", "nope.csv"),
    ("convert-input-dir", "workload convert adir -o o.parquet", "adir"),
    ("convert-empty-input", "workload convert empty.csv -o o.parquet", "empty.csv"),
    ("convert-no-output", "workload convert t.csv", "--out"),
    ("fit-truncated-gz", "workload fit trunc.csv.gz", "trunc.csv.gz"),
    ("fit-zero-lengths", "workload fit zero.csv", "zero.csv"),
    ("fit-1e300-time", "workload fit big.csv --time-unit s", "time"),
    ("fit-1e17-time", "workload fit big17.csv --time-unit s", "time"),
    ("fit-deep-json", "workload fit deep.json", "deep.json"),
    ("fit-window-zero", "workload fit t.csv --window-s 0", "--window-s"),
    ("fit-window-nan", "workload fit t.csv --window-s nan", "--window-s"),
    ("fit-window-inf", "workload fit t.csv --window-s inf", "--window-s"),
    ("fit-alpha-one", "workload fit t.csv --alpha 1", "--alpha"),
    ("fit-alpha-negative", "workload fit t.csv --alpha -0.1", "--alpha"),
    ("fit-lengths-unknown", "workload fit t.csv --lengths pareto", "--lengths"),
    ("fit-counts-unknown", "workload fit t.csv --counts some", "--counts"),
    ("fit-seed-negative", "workload fit t.csv --seed -1", "--seed"),
    ("fit-missing", "workload fit nope.csv", "nope.csv"),
    ("fit-directory", "workload fit adir", "adir"),
    # --- simulate: files inside specs ------------------------------------------------------------
    ("simulate-scenario-trace-missing", "simulate --scenario chat --trace nope.csv --no-progress", "--trace"),
    ("simulate-scenario-trace-bad", "simulate --scenario chat --trace bad.jsonl --no-progress", "--trace"),
    ("simulate-scenario-trace-warmup", "simulate --scenario lanes --trace t.csv --duration 10 --no-progress",
     "--duration"),
    ("simulate-trace-zero-lengths", f"simulate {M} --duration 20 --no-progress --trace zero.csv", "zero.csv"),
    ("simulate-trace-deep-json", f"simulate {M} --duration 20 --no-progress --trace deep.json", "deep.json"),
    ("simulate-trace-non-utf8", f"simulate {M} --duration 20 --no-progress --trace bad.jsonl", "bad.jsonl"),
    ("simulate-trace-truncated-gz", f"simulate {M} --duration 20 --no-progress --trace trunc.csv.gz",
     "trunc.csv.gz"),
    ("simulate-trace-1e300", f"simulate {M} --duration 20 --no-progress --trace big.csv", "time"),
    ("simulate-trace-missing", f"simulate {M} --duration 20 --no-progress --trace nope.csv", "--trace"),
    ("simulate-trace-dir", f"simulate {M} --duration 20 --no-progress --trace adir", "--trace"),
    ("simulate-trace-with-arrival", f"{SIM} --trace t.csv", "--trace"),
    ("simulate-step-fitted-yaml-tag", f"{STEP} fitted:tag.yaml", "--step-time"),
    ("simulate-step-fitted-binary", f"{STEP} fitted:bin.yaml", "--step-time"),
    ("simulate-step-fitted-deep", f"{STEP} fitted:deep.yaml", "--step-time"),
    ("simulate-step-fitted-dir", f"{STEP} fitted:adir", "--step-time"),
    ("simulate-step-fitted-missing", f"{STEP} fitted:nope.yaml", "--step-time"),
    ("simulate-step-fitted-unclosed", f"{STEP} fitted:unclosed.yaml", "--step-time"),
    ("simulate-step-fitted-no-key", f"{STEP} fitted:nostep.yaml", "--step-time"),
    ("simulate-step-time-zero", f"{STEP} 0", "--step-time"),
    ("simulate-step-time-nan", f"{STEP} nan", "--step-time"),
    ("simulate-step-time-negative", f"{STEP} -1", "--step-time"),
    ("simulate-step-time-unknown", f"{STEP} warp:1", "--step-time"),
    ("simulate-lengths-deep", f"simulate {M} --arrival poisson:1 --duration 20 --no-progress "
     "--lengths joint:deep.json", "--lengths"),
    ("simulate-lengths-non-utf8", f"simulate {M} --arrival poisson:1 --duration 20 --no-progress "
     "--lengths joint:bad.jsonl", "--lengths"),
    ("simulate-prompt-empirical-missing", f"simulate {M} --arrival poisson:1 --duration 20 --no-progress "
     "--prompt empirical:nope.csv --output fixed:10", "--prompt"),
    ("simulate-scenario-deep", "simulate --scenario deep.yaml --no-progress", "deep.yaml"),
    ("simulate-scenario-binary", "simulate --scenario bin.yaml --no-progress", "--scenario"),
    ("simulate-scenario-tag", "simulate --scenario tag.yaml --no-progress", "tag.yaml"),
    ("simulate-scenario-list", "simulate --scenario list.yaml --no-progress", "list.yaml"),
    ("simulate-scenario-unknown", "simulate --scenario nosuch --no-progress", "--scenario"),
    ("simulate-capacity-negative", f"simulate --capacity-tokens -5 --step-time 0.03 {WL} --no-progress",
     "--capacity-tokens"),
    ("simulate-capacity-nan", f"simulate --capacity-tokens nan --step-time 0.03 {WL} --no-progress",
     "--capacity-tokens"),
    ("simulate-capacity-text", f"simulate --capacity-tokens lots --step-time 0.03 {WL} --no-progress",
     "--capacity-tokens"),
    ("simulate-max-num-seqs-zero", f"{SIM} --max-num-seqs 0", "--max-num-seqs"),
    ("simulate-max-num-seqs-text", f"{SIM} --max-num-seqs many", "--max-num-seqs"),
    ("simulate-chunk-zero", f"simulate --capacity-tokens 131000 --step-time 0.03 --chunk 0 {WL} --no-progress",
     "--chunk"),
    ("simulate-block-size-zero", f"{SIM} --block-size 0", "--block-size"),
    ("simulate-policy-unknown", f"{SIM} --policy lifo", "--policy"),
    ("simulate-router-unknown", f"{SIM} --replicas 2 --router nearest", "--router"),
    ("simulate-replicas-zero", f"{SIM} --replicas 0", "--replicas"),
    ("simulate-arrival-unknown", f"simulate {M} --prompt fixed:10 --output fixed:10 --duration 20 "
     "--no-progress --arrival sometimes:5", "--arrival"),
    ("simulate-arrival-negative", f"simulate {M} --prompt fixed:10 --output fixed:10 --duration 20 "
     "--no-progress --arrival poisson:-5", "--arrival"),
    ("simulate-arrival-inf", f"simulate {M} --prompt fixed:10 --output fixed:10 --duration 20 "
     "--no-progress --arrival poisson:inf", "--arrival"),
    ("simulate-prompt-unknown", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 "
     "--no-progress --prompt zipf:3", "--prompt"),
    ("simulate-prompt-reversed", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 "
     "--no-progress --prompt uniform:100:10", "--prompt"),
    ("simulate-duration-negative", f"simulate {M} --prompt fixed:10 --output fixed:10 --arrival poisson:1 "
     "--no-progress --duration -5", "--duration"),
    ("simulate-duration-nan", f"simulate {M} --prompt fixed:10 --output fixed:10 --arrival poisson:1 "
     "--no-progress --duration nan", "--duration"),
    ("simulate-seed-text", f"{SIM} --seed abc", "--seed"),
    ("simulate-gpu-unknown", f"simulate --model llama-3.1-8b --gpu abacus {WL} --no-progress", "--gpu"),
    ("simulate-model-unknown", f"simulate --model no-such-model {WL} --no-progress", "--model"),
    ("simulate-unknown-flag", f"{SIM} --warp-speed 9", "--warp-speed"),
    # --- bench (flag checks before any connection) -------------------------------------------------
    ("bench-url-ipv6-open", "bench --url http://[::1 --model m --prompt fixed:10 --output fixed:10 "
     "--arrival poisson:1 --duration 5", "--url"),
    ("bench-url-no-scheme", "bench --url localhost:8000 --model m --prompt fixed:10 --output fixed:10 "
     "--arrival poisson:1 --duration 5", "--url"),
    ("bench-url-ftp", "bench --url ftp://host --model m --prompt fixed:10 --output fixed:10 "
     "--arrival poisson:1 --duration 5", "--url"),
    ("bench-url-bad-port", "bench --url http://127.0.0.1:99999 --model m --prompt fixed:10 --output fixed:10 "
     "--arrival poisson:1 --duration 5", "--url"),
    ("bench-url-empty", "bench --url '' --model m --prompt fixed:10 --output fixed:10 "
     "--arrival poisson:1 --duration 5", "--url"),
    ("bench-metrics-url-bad", f"{BENCH} --metrics-url http://[::1", "--metrics-url"),
    ("bench-concurrency-zero", f"{BENCH} --concurrency 0", "--concurrency"),
    ("bench-timeout-negative", f"{BENCH} --timeout -1", "--timeout"),
    ("bench-timeout-nan", f"{BENCH} --timeout nan", "--timeout"),
    ("bench-ttft-timeout-zero", f"{BENCH} --ttft-timeout 0", "--ttft-timeout"),
    ("bench-max-attempts-zero", f"{BENCH} --max-attempts 0", "--max-attempts"),
    ("bench-vocab-size-small", f"{BENCH} --vocab-size 3", "--vocab-size"),
    ("bench-warmup-negative", f"{BENCH} --warmup -1", "--warmup"),
    ("bench-warmup-requests-negative", f"{BENCH} --warmup-requests -1", "--warmup-requests"),
    ("bench-endpoint-unknown", f"{BENCH} --endpoint embeddings", "--endpoint"),
    ("bench-prefix-block-zero", f"{BENCH} --prefix-block-tokens 0", "--prefix-block-tokens"),
    ("bench-trace-zero-lengths", "bench --url http://127.0.0.1:9 --model m --trace zero.csv", "zero.csv"),
    ("bench-no-url", "bench --model m --prompt fixed:10 --output fixed:10 --arrival poisson:1 --duration 5",
     "--url"),
    # --- import ----------------------------------------------------------------------------------
    ("import-format-unknown", "import parquet t.csv --out imp", "FORMAT"),
    ("import-file-missing", "import csv nope.csv --out imp", "nope.csv"),
    ("import-no-send-column", "import csv t.csv --out imp", "send_s"),
    ("import-map-no-equals", "import csv t.csv --out imp --map time", "--map"),
    ("import-map-unknown-field", "import csv t.csv --out imp --map when=time", "--map"),
    ("import-map-absent-column", "import csv t.csv --out imp --map send_s=t0", "t0"),
    ("import-vllm-binary", "import vllm-bench bin.yaml --out imp", "bin.yaml"),
    ("import-time-origin-text", "import csv t.csv --out imp --time-origin soon", "--time-origin"),
    ("import-time-zero-text", "import csv reqs.csv --out imp --time-zero soon", "--time-zero"),
    ("import-time-zero-inf", "import csv reqs.csv --out imp --time-zero inf", "--time-zero"),
    ("import-status-map-no-equals", "import csv reqs.csv --out imp --status-map aborted", "--status-map"),
    ("import-status-map-unknown-status", "import csv reqs.csv --out imp --status-map aborted=gone", "--status-map"),
    ("import-metrics-missing", "import csv reqs.csv --out imp --metrics nope.prom", "nope.prom"),
    ("import-metrics-no-time-column", "import csv reqs.csv --out imp --metrics cols.csv", "--metrics"),
    ("import-metrics-binary", "import csv reqs.csv --out imp --metrics bin.yaml", "--metrics"),
    ("import-metrics-truncated-gz", "import csv reqs.csv --out imp --metrics trunc.csv.gz", "trunc.csv.gz"),
    ("import-metrics-text-no-time", "import csv reqs.csv --out imp --metrics header.csv", "--metrics"),
    ("import-warmup-negative", "import csv reqs.csv --out imp --warmup -1", "--warmup"),
    ("import-warmup-nan", "import csv reqs.csv --out imp --warmup nan", "--warmup"),
    # --- profile --------------------------------------------------------------------------------
    ("profile-unreachable", f"{PROF} --server-max-num-seqs 4", "--url"),
    ("profile-url-not-http", "profile --url ftp://x --model m --out o", "--url"),
    ("profile-out-under-file", f"{PROF} --out t.csv/p", "--out"),
    ("profile-out-devnull", f"{PROF} --out /dev/null", "--out"),
    ("profile-contexts-text", f"{PROF} --contexts a,b", "--contexts"),
    ("profile-batches-zero", f"{PROF} --batches 0,2", "--batches"),
    ("profile-seqs-zero", f"{PROF} --server-max-num-seqs 0", "--server-max-num-seqs"),
    ("profile-server-log-missing", f"{PROF} --server-log nope.log", "--server-log"),
    ("profile-server-log-dir", f"{PROF} --server-log adir", "--server-log"),
    ("simulate-step-profile-missing", f"{STEP} profile:nope", "--step-time"),
    ("simulate-step-profile-empty-dir", f"{STEP} profile:emptydir", "--step-time"),
    ("simulate-step-profile-not-json", f"{STEP} profile:notjson.json", "--step-time"),
    ("simulate-step-profile-bad-key", f"{STEP} profile:emptydir:speed=2", "--step-time"),
    # --- calibrate / validate -------------------------------------------------------------------
    ("calibrate-run-missing", "calibrate nope -o c.yaml", "nope"),
    ("calibrate-run-empty-dir", "calibrate emptydir -o c.yaml", "emptydir"),
    ("calibrate-to-before-from", "calibrate emptydir -o c.yaml --from 10 --to 5", "--to"),
    ("calibrate-to-text", "calibrate emptydir -o c.yaml --to soon", "--to"),
    ("calibrate-from-text", "calibrate emptydir -o c.yaml --from soon", "--from"),
    ("validate-calibration-tag", "validate emptydir --calibration tag.yaml", "calibration"),
    ("validate-calibration-binary", "validate emptydir --calibration bin.yaml", "calibration"),
    ("validate-calibration-deep", "validate emptydir --calibration deep.yaml", "calibration"),
    ("validate-calibration-dir", "validate emptydir --calibration adir", "--calibration"),
    ("validate-calibration-missing", "validate emptydir --calibration nope.yaml", "--calibration"),
    ("validate-calibration-unclosed", "validate emptydir --calibration unclosed.yaml", "calibration"),
    ("validate-calibration-no-step-time", "validate emptydir --calibration nostep.yaml", "calibration"),
    ("validate-step-model-unknown", "validate emptydir --calibration nostep.yaml --step-model cubic",
     "--step-model"),
    ("validate-drift-reps-zero", "validate emptydir --calibration nostep.yaml --drift-reps 0", "--drift-reps"),
    # --- report ----------------------------------------------------------------------------------
    ("report-missing-dir", "report nope -o r.html", "nope"),
    ("report-empty-dir", "report emptydir -o r.html", "emptydir"),
    ("report-file-not-dir", "report t.csv -o r.html", "t.csv"),
    ("report-no-dir", "report -o r.html", "RUN_OR_SWEEP_DIR"),
    ("report-both-figures", "report --kv-stability-figure --batch-figure -o r.html", "--kv-stability-figure"),
    ("report-figure-with-dir", "report emptydir --batch-figure -o r.html", "RUN_OR_SWEEP_DIR"),
    ("report-slo-zero", f"{SEED2} -o r.html --slo-ms 0", "--slo-ms"),
    ("report-slo-nan", f"{SEED2} -o r.html --slo-ms nan", "--slo-ms"),
    ("report-duration-negative", "report --kv-stability-figure -o r.html --duration -1", "--duration"),
    ("report-not-html", f"{SEED2} -o r.txt", "--out"),
    # --- stability ------------------------------------------------------------------------------
    ("stability-block-size-zero-paged", f"{STAB} --paged --block-size 0", "--block-size"),
    ("stability-block-size-negative-paged", f"{STAB} --paged --block-size -16", "--block-size"),
    ("stability-prompt-over-M", "stability --capacity-tokens 100 --step-time 0.0372 --prompt fixed:1000 "
     "--output fixed:10 --rate 1", "--capacity-tokens"),
    ("stability-tail-over-M", "stability --capacity-tokens 1000 --step-time 0.0372 --prompt uniform:10:5000 "
     "--output fixed:10", "--capacity-tokens"),
    ("stability-zero-lengths", "stability --capacity-tokens 1000 --step-time 0.0372 --prompt fixed:0 "
     "--output fixed:0", "--prompt"),
    ("stability-step-time-zero", "stability --capacity-tokens 131000 --step-time 0 --prompt fixed:10 "
     "--output fixed:10", "--step-time"),
    ("stability-step-time-nan", "stability --capacity-tokens 131000 --step-time nan --prompt fixed:10 "
     "--output fixed:10", "--step-time"),
    ("stability-capacity-negative", "stability --capacity-tokens -1 --step-time 0.03 --prompt fixed:10 "
     "--output fixed:10", "capacity"),
    ("stability-capacity-inf", "stability --capacity-tokens inf --step-time 0.03 --prompt fixed:10 "
     "--output fixed:10", "capacity"),
    ("stability-chunk-zero", f"{STAB} --chunk 0", "--chunk"),
    ("stability-rate-negative", f"{STAB} --rate -1", "--rate"),
    ("stability-rate-nan", f"{STAB} --rate nan", "--rate"),
    ("stability-utilization-no-rate", f"{STAB} --utilization 0.5", "--utilization"),
    ("stability-utilization-over-one", f"{STAB} --rate 1 --utilization 1.5", "--utilization"),
    ("stability-no-capacity", "stability --step-time 0.03 --prompt fixed:10 --output fixed:10", "--capacity-tokens"),
    ("stability-model-unknown", "stability --model no-such-model --step-time 0.03 --prompt fixed:10 "
     "--output fixed:10", "--model"),
    ("stability-lengths-missing-file", "stability --capacity-tokens 1000 --step-time 0.03 "
     "--lengths joint:nope.csv", "--lengths"),
    ("stability-lengths-deep", "stability --capacity-tokens 1000 --step-time 0.03 --lengths joint:deep.json",
     "--lengths"),
    ("stability-prompt-missing", "stability --capacity-tokens 1000 --step-time 0.03 --output fixed:10", "--prompt"),
    # --- queue ----------------------------------------------------------------------------------
    ("mm1-subnormal", "queue mm1 --lam 1e-320 --mu 1e-310", "--rate"),
    ("mm1-overflow", "queue mm1 --lam 3e-308 --mu 5e-308", "--rate"),
    ("mm1-unstable", "queue mm1 --lam 10 --mu 5", "--rate"),
    ("mm1-negative", "queue mm1 --lam -1 --mu 5", "--rate"),
    ("mm1-zero-mu", "queue mm1 --lam 1 --mu 0", "--mu"),
    ("mm1-nan", "queue mm1 --lam nan --mu 5", "--rate"),
    ("mm1-inf", "queue mm1 --lam 1 --mu inf", "--mu"),
    ("mm1-text", "queue mm1 --lam fast --mu 5", "--rate"),
    ("mm1-missing-mu", "queue mm1 --lam 1", "--mu"),
    ("md1-subnormal", "queue md1 --lam 1e-320 --mu 1e-310", "--rate"),
    ("mg1-scv-negative", "queue mg1 --lam 1 --mu 5 --scv-s -1", "--scv-s"),
    ("mg1-scv-nan", "queue mg1 --lam 1 --mu 5 --scv-s nan", "--scv-s"),
    ("mmc-c-zero", "queue mmc --lam 1 --mu 5 --c 0", "--c"),
    ("mmc-c-text", "queue mmc --lam 1 --mu 5 --c two", "--c"),
    ("mmc-subnormal", "queue mmc --lam 1e-320 --mu 1e-310 --c 2", "--rate"),
    ("mmck-K-below-c", "queue mmck --lam 1 --mu 5 --c 3 --K 2", "--K"),
    ("gg1-scv-a-inf", "queue gg1 --lam 1 --mu 5 --scv-a inf", "--scv-a"),
    ("ggc-c-negative", "queue ggc --lam 1 --mu 5 --c -2", "--c"),
    ("little-one-given", "queue little --lam 5", "lam"),
    ("little-negative", "queue little --lam -5 --W 1", "--rate"),
    ("queue-unknown-model", "queue mm2 --lam 1 --mu 2", "mm2"),
    # --- cost -----------------------------------------------------------------------------------
    ("replicas-1e18", "cost replicas --lam 1e18 --mu 1", "--rate"),
    ("replicas-1e300", "cost replicas --lam 1e300 --mu 1", "--rate"),
    ("replicas-rho-one", "cost replicas --lam 10 --mu 1 --rho-target 1", "--rho-target"),
    ("replicas-rho-zero", "cost replicas --lam 10 --mu 1 --rho-target 0", "--rho-target"),
    ("replicas-mu-zero", "cost replicas --lam 10 --mu 0", "--mu"),
    ("replicas-subnormal", "cost replicas --lam 1 --mu 1e-320", "--mu"),
    ("tokens-negative", "cost tokens --tokens-per-s -5 --price-per-hour 8", "--tokens-per-s"),
    ("tokens-price-nan", "cost tokens --tokens-per-s 5 --price-per-hour nan", "--price-per-hour"),
    ("tokens-utilization-zero", "cost tokens --tokens-per-s 5 --price-per-hour 8 --utilization 0",
     "--utilization"),
    ("tokens-utilization-over", "cost tokens --tokens-per-s 5 --price-per-hour 8 --utilization 2",
     "--utilization"),
    ("budget-target-one", "cost error-budget --slo-target 1 --requests 100", "--slo-target"),
    ("budget-target-negative", "cost error-budget --slo-target -0.5 --requests 100", "--slo-target"),
    ("budget-no-requests", "cost error-budget --slo-target 0.999", "requests"),
    ("budget-negative-requests", "cost error-budget --slo-target 0.999 --requests -5", "--requests"),
    # --- batch, kv, example, scenario -------------------------------------------------------------
    ("batch-lam-negative", "batch --lam -1 --t-fixed-ms 50 --t-req-ms 0.5", "--rate"),
    ("batch-lam-nan", "batch --lam nan --t-fixed-ms 50 --t-req-ms 0.5", "--rate"),
    ("batch-t-fixed-negative", "batch --lam 100 --t-fixed-ms -50 --t-req-ms 0.5", "--t-fixed-ms"),
    ("batch-sizes-text", f"{BATCH} --sizes a,b", "--sizes"),
    ("batch-sizes-zero", f"{BATCH} --sizes 0,4", "--sizes"),
    ("batch-rho-over", f"{BATCH} --rho-target 1.5", "--rho-target"),
    ("batch-p99-unknown", f"{BATCH} --p99 lognormal", "--p99"),
    ("batch-slo-negative", f"{BATCH} --slo-ms -1", "--slo-ms"),
    ("kv-model-unknown", "kv --model no-such-model", "--model"),
    ("kv-gpu-unknown", "kv --model llama-3.1-8b --gpu abacus", "--gpu"),
    ("kv-model-deep-json", "kv --model deep.json", "--model"),
    ("kv-model-bad-config", "kv --model config.json", "--model"),
    ("kv-model-not-json", "kv --model notjson.json", "--model"),
    ("kv-model-fifo-json", "kv --model fifo", "--model"),
    ("kv-tp-zero", "kv --model llama-3.1-8b --tensor-parallel-size 0", "--tensor-parallel-size"),
    ("kv-pp-zero", "kv --model llama-3.1-8b --pipeline-parallel-size 0", "--pipeline-parallel-size"),
    ("simulate-pp-zero", f"simulate --model llama-3.1-8b --gpu h100-sxm --pipeline-parallel-size 0 {WL} --no-progress",
     "--pipeline-parallel-size"),
    ("simulate-pp-over-layers", f"simulate --model llama-3.1-8b --gpu h100-sxm --pipeline-parallel-size 64 {WL} "
     "--no-progress", "--pipeline-parallel-size"),
    ("kv-gmu-over", "kv --model llama-3.1-8b --gpu-memory-utilization 1.5", "--gpu-memory-utilization"),
    ("kv-gmu-nan", "kv --model llama-3.1-8b --gpu-memory-utilization nan", "--gpu-memory-utilization"),
    ("kv-block-size-zero", "kv --model llama-3.1-8b --block-size 0", "--block-size"),
    ("kv-context-negative", "kv --model llama-3.1-8b --context -5", "--context"),
    ("kv-dtype-unknown", "kv --model llama-3.1-8b --kv-cache-dtype int3", "--kv-cache-dtype"),
    ("kv-reserve-negative", "kv --model llama-3.1-8b --reserve-gib -1", "--reserve-gib"),
    ("example-extra-argument", "example extra", "extra"),
    ("example-unknown-flag", "example --fast", "--fast"),
    ("scenario-check-deep", "scenario check deep.yaml", "deep.yaml"),
    ("scenario-check-binary", "scenario check bin.yaml", "bin.yaml"),
    ("scenario-check-tag", "scenario check tag.yaml", "tag.yaml"),
    ("scenario-check-list", "scenario check list.yaml", "list.yaml"),
    ("scenario-check-empty", "scenario check empty.csv", "empty.csv"),
    ("scenario-check-missing", "scenario check nosuch", "nosuch"),
    ("scenario-check-dir", "scenario check adir", "adir"),
    ("scenario-check-fifo", "scenario check fifo", "fifo"),
    # --- fleets: scenario sections (bad values set into the shipped examples) and P/D flags ----
    ("fleet-lane-no-pool", "scenario check lanes --set deployment.lanes[0].pool=gpu-big", "deployment.lanes[0].pool"),
    ("fleet-lane-no-class", "scenario check lanes --set deployment.lanes[1].classes=[bulk]",
     "deployment.lanes[1].classes[0]"),
    ("fleet-pd-no-decode", "scenario check pd --set deployment.disaggregation=null --set deployment.pools[1].role=mixed",
     "deployment.pools"),
    ("fleet-pd-wrong-role", "scenario check pd --set deployment.pools[1].role=mixed", "deployment.disaggregation.decode"),
    ("fleet-negative-provisioning",
     "simulate --scenario noon-spike --no-progress --set deployment.autoscalers[0].provisioning_delay_s=-5",
     "deployment.autoscalers[0].provisioning_delay_s"),
    ("fleet-p99-negative-target",
     "simulate --scenario noon-spike --no-progress --set deployment.autoscalers[0].metric=p99_ttft "
     "--set deployment.autoscalers[0].target=-2", "deployment.autoscalers[0].target"),
    ("fleet-p99-unknown-also", "scenario check noon-spike --set 'deployment.autoscalers[0].also={p99: 2}'",
     "deployment.autoscalers[0].also.p99"),
    ("fleet-degrade-both", "scenario check tiers --set deployment.gateway.degrade[0].to=shared",
     "deployment.gateway.degrade[0].max_tokens"),
    ("fleet-degrade-neither", "scenario check tiers --set 'deployment.gateway.degrade=[{pool: shared, queue_age_s: 1}]'",
     "deployment.gateway.degrade[0].max_tokens"),
    ("fleet-degrade-no-pool", "scenario check tiers --set deployment.gateway.degrade[0].pool=big",
     "deployment.gateway.degrade[0].pool"),
    ("fleet-degrade-own-pool", "scenario check lanes --set "
     "'deployment.gateway.degrade=[{pool: latency, to: latency, queue_age_s: 1}]'", "deployment.gateway.degrade[0].to"),
    ("fleet-degrade-switch-quality", "scenario check lanes --set "
     "'deployment.gateway.degrade=[{pool: latency, to: small, queue_age_s: 1, quality: 0.5}]'",
     "deployment.gateway.degrade[0].quality"),
    ("fleet-degrade-zero-cap", "scenario check tiers --set deployment.gateway.degrade[0].max_tokens=0",
     "deployment.gateway.degrade[0].max_tokens"),
    ("fleet-degrade-negative-age", "scenario check tiers --set deployment.gateway.degrade[0].queue_age_s=-1",
     "deployment.gateway.degrade[0].queue_age_s"),
    ("fleet-degrade-no-class", "scenario check tiers --set 'deployment.gateway.degrade[0].classes=[bulk]'",
     "deployment.gateway.degrade[0].classes[0]"),
    ("fleet-unknown-router", "scenario check lanes --set deployment.pools[0].router=fastest",
     "deployment.pools[0].router"),
    ("fleet-fault-replica", "scenario check noon-spike --set 'deployment.faults=[{pool: chat, replica: 9, at_s: 10}]'",
     "deployment.faults[0].replica"),
    ("fleet-pool-engine-knob", "scenario check pd --set deployment.pools[0].max_num_seqs=0",
     "deployment.pools[0].max_num_seqs"),
    ("fleet-pool-unknown-key", "scenario check pd --set deployment.pools[0].max_num_seq=8",
     "deployment.pools[0].max_num_seq"),
    ("fleet-replicas-and-pools", "simulate --scenario pd --no-progress --replicas 3", "--replicas"),
    ("fleet-lanes-without-pools", "scenario check chat --set 'deployment.lanes=[{pool: a}]'", "deployment.lanes"),
    ("fleet-set-bad-path", "scenario check pd --set deployment..x=1", "--set"),
    ("fleet-set-no-value", "scenario check pd --set deployment.pools", "--set"),
    ("fleet-set-index", "scenario check pd --set deployment.pools[5].replicas=1", "--set"),
    ("simulate-set-no-scenario", f"{SIM} --set deployment.replicas=2", "--set"),
    ("simulate-disaggregate-one-number", f"{SIM} --disaggregate 2", "--disaggregate"),
    ("simulate-disaggregate-text", f"{SIM} --disaggregate a:b", "--disaggregate"),
    ("simulate-disaggregate-zero", f"{SIM} --disaggregate 0:1", "--disaggregate"),
    ("simulate-disaggregate-negative", f"{SIM} --disaggregate 1:-2", "--disaggregate"),
    ("simulate-disaggregate-huge", f"{SIM} --disaggregate 1:5000", "--disaggregate"),
    ("simulate-disaggregate-replicas", f"{SIM} --disaggregate 1:1 --replicas 2", "--disaggregate"),
    ("simulate-disaggregate-scenario", "simulate --scenario chat --no-progress --disaggregate 1:1", "--disaggregate"),
    ("simulate-kv-link-alone", f"{SIM} --kv-link-gbps 100", "--kv-link-gbps"),
    ("simulate-kv-link-zero", f"{SIM} --disaggregate 1:1 --kv-link-gbps 0", "--kv-link-gbps"),
    ("simulate-kv-link-nan", f"{SIM} --disaggregate 1:1 --kv-link-gbps nan", "--kv-link-gbps"),
    ("simulate-kv-latency-negative", f"{SIM} --disaggregate 1:1 --kv-link-latency-ms -1", "--kv-link-latency-ms"),
    ("simulate-kv-link-no-pd-scenario", "simulate --scenario chat --no-progress --kv-link-gbps 10",
     "--kv-link-gbps"),
    # --- sweep / capacity -----------------------------------------------------------------------
    ("sweep-rates-text", f"sweep {M} {WL} --backend serial --no-progress --rates a,b", "--rates"),
    ("sweep-param-bad", f"{SWEEP} --param max_num_seqs", "--param"),
    ("sweep-param-unknown", f"{SWEEP} --param warp=1,2", "--param"),
    ("sweep-param-twice", f"{SWEEP} --param max_num_seqs=1 --param max_num_seqs=2", "--param"),
    ("sweep-knee-metric-unknown", f"{SWEEP} --knee-metric p99_fun_ms", "--knee-metric"),
    ("sweep-backend-unknown", f"{SWEEP} --backend cloud", "--backend"),
    ("sweep-url-ipv6-open", f"{SWEEP} --url http://[::1 --served-model m", "--url"),
    ("sweep-served-model-no-url", f"{SWEEP} --served-model m", "--served-model"),
    ("sweep-scenario-deep", "sweep --scenario deep.yaml --rates 1,2 --backend serial --no-progress", "deep.yaml"),
    ("capacity-no-slo", f"capacity {M} {WL} --backend serial --no-progress", "--slo-ttft-ms"),
    # --- sizes refused up front, with the count and the limit (issue 37, item 6) ------------------
    ("plan-replicas-range-huge", "plan --scenario chat --replicas 1..100000 --out o", "--replicas"),
    ("plan-replicas-range-1e12", "plan --scenario chat --replicas 1..1000000000000 --out o", "limit is 4096"),
    ("plan-space-too-large", "plan --scenario chat --replicas 1..4096 --out o", "configurations"),
    ("plan-pd-splits-huge", "plan --scenario chat --replicas '' --pd-splits 1..100:1..100 --out o", "--pd-splits"),
    ("autoscaler-interval-tiny", "simulate --scenario noon-spike --no-progress "
     "--set deployment.autoscalers[0].interval_s=1e-9", "deployment.autoscalers[0].interval_s"),
    ("autoscaler-interval-below-floor", "scenario check noon-spike --set deployment.autoscalers[0].interval_s=0.01",
     ">= 0.1"),
    ("sweep-rates-10000", f"sweep {M} {WL} --backend serial --no-progress --rates "
     + ",".join(f"{1 + i / 1000:g}" for i in range(10_000)), "10,000 points"),
    ("sweep-grid-too-large", f"{SWEEP} --param max_num_seqs=" + ",".join(str(i) for i in range(1, 2001)),
     "the limit is 1,000"),
    ("report-summary-nan", "report runnan -o r.html", "NaN"),
    ("report-summary-not-object", "report runlist -o r.html", "summary.json"),
    ("report-requests-symlink-loop", "report runloop -o r.html", "symlink loop"),
    # --- overflow in distribution parameters; a prompt over the token budget (issue 37, item 7) ---
    ("simulate-prompt-fixed-1e308", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 --no-progress "
     "--prompt fixed:1e308", "--prompt"),
    ("simulate-output-fixed-1e308", f"simulate {M} --arrival poisson:1 --prompt fixed:10 --duration 20 --no-progress "
     "--output fixed:1e308", "--output"),
    ("simulate-prompt-uniform-1e308", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 "
     "--no-progress --prompt uniform:1:1e308", "--prompt"),
    ("simulate-prompt-normal-max-1e308", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 "
     "--no-progress --prompt normal:mean=100:sd=10:max=1e308", "--prompt"),
    ("simulate-prompt-lognormal-sd-1e308", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 "
     "--no-progress --prompt lognormal:mean=100:sd=1e308", "--prompt"),
    ("simulate-prompt-lognormal-mu-1e308", f"simulate {M} --arrival poisson:1 --output fixed:10 --duration 20 "
     "--no-progress --prompt lognormal:mu=1e308:sigma=1", "--prompt"),
    ("simulate-arrival-gamma-cv-1e308", f"simulate {M} --prompt fixed:10 --output fixed:10 --duration 20 "
     "--no-progress --arrival gamma:1:cv=1e308", "--arrival"),
    ("simulate-arrival-diurnal-cv-1e308", f"simulate {M} --prompt fixed:10 --output fixed:10 --duration 20 "
     "--no-progress --arrival diurnal:mean=1:amp=0.5:cv=1e308", "--arrival"),
    ("stats-spec-gamma-cv-1e308", "workload stats --arrival gamma:5:cv=1e308 --prompt fixed:5 --output fixed:5",
     "--arrival"),
    ("simulate-prompt-over-budget-no-chunking", "simulate --capacity-tokens 131000 --step-time 0.0372 "
     "--arrival poisson:1 --num-requests 20 --no-progress --prompt fixed:1000 --output fixed:10 "
     "--max-num-batched-tokens 512 --no-enable-chunked-prefill", "--enable-chunked-prefill"),
    ("simulate-prompts-some-over-budget", "simulate --capacity-tokens 131000 --step-time 0.0372 "
     "--arrival poisson:1 --duration 20 --no-progress --prompt uniform:10:1000 --output fixed:10 "
     "--max-num-batched-tokens 512 --no-enable-chunked-prefill", "--max-num-batched-tokens"),
    ("capacity-scenario-binary", "capacity --scenario bin.yaml --slo-ttft-ms 2000 --backend serial --no-progress",
     "--scenario"),
]


def _run_in_process(argv: list[str]) -> tuple[object, str, str]:
    """``run_cli(*argv)`` in a thread, given ``LIMIT_S`` seconds; (exit code or 'hung', stdout, stderr)."""
    box: dict = {}

    def target():
        try:
            box["run"] = run_cli(*argv)
        except BaseException as e:  # noqa: BLE001 - the test reports what escaped
            box["run"] = (f"raised {type(e).__name__}: {e}", "", "")

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(LIMIT_S)
    return ("hung", "", "") if th.is_alive() else tuple(box["run"])


def _assert_one_line(code, err: str, fragment: str) -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("llmqueue: error: "), line
    assert fragment in line, (fragment, line)
    assert len(line) > len("llmqueue: error: ") + len(fragment) + 10, line  # says what is wrong, not only where


@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    _write_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("cmdline,fragment", [pytest.param(c, f, id=i) for i, c, f in CASES])
def test_bad_input_is_one_line(probe_dir, cmdline, fragment):
    before = _snapshot(probe_dir)
    t0 = time.monotonic()
    code, out, err = _run_in_process(shlex.split(cmdline))
    assert code != "hung", f"no answer within {LIMIT_S} s"
    assert time.monotonic() - t0 < LIMIT_S
    _assert_one_line(code, err, fragment)
    assert _snapshot(probe_dir) == before, "the refused command wrote or changed files"


def test_the_table_covers_every_command_and_enough_cases():
    from llmqueue.cli.main import COMMANDS

    assert len(CASES) + len(SUBPROCESS_CASES) >= 150
    assert len({i for i, _, _ in CASES}) == len(CASES)
    firsts = {shlex.split(c)[0] for _, c, _ in CASES}
    assert set(COMMANDS) <= firsts, set(COMMANDS) - firsts
    workload = {shlex.split(c)[1] for _, c, _ in CASES if c.startswith("workload ")}
    assert {"convert", "stats", "fit"} <= workload


# --- where a real file descriptor matters: a subprocess -------------------------------------------

# (id, command line, fragment, stdout to /dev/full)
SUBPROCESS_CASES: list[tuple[str, str, str, bool]] = [
    ("simulate-step-time-fifo", f"{STEP} fitted:fifo",
     "--step-time", False),
    ("validate-calibration-fifo", "validate emptydir --calibration fifo", "--calibration", False),
    ("stats-trace-fifo", "workload stats fifo", "fifo", False),
    ("convert-input-fifo", "workload convert fifo -o o.parquet", "fifo", False),
    ("simulate-trace-fifo", f"simulate {M} --duration 20 --no-progress --trace fifo", "--trace", False),
    ("simulate-scenario-fifo", "simulate --scenario fifo --no-progress", "--scenario", False),
    ("stability-lengths-fifo", "stability --capacity-tokens 1000 --step-time 0.03 --lengths joint:fifo",
     "--lengths", False),
    ("report-requests-fifo", "report runfifo -o r.html", "requests.parquet", False),
    ("queue-stdout-full", "queue mm1 --lam 1 --mu 2", "stdout", True),
    ("queue-json-stdout-full", "queue mm1 --lam 1 --mu 2 --json", "stdout", True),
    ("help-stdout-full", "--help", "stdout", True),
    ("cost-stdout-full", "cost replicas --lam 300 --mu 100", "stdout", True),
    ("kv-stdout-full", "kv --model llama-3.1-8b", "stdout", True),
]


@pytest.mark.parametrize("cmdline,fragment,full", [pytest.param(c, f, u, id=i) for i, c, f, u in SUBPROCESS_CASES])
def test_bad_input_is_one_line_in_a_process(probe_dir, cmdline, fragment, full):
    if full and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    before = _snapshot(probe_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    stdout = open("/dev/full", "w") if full else subprocess.DEVNULL  # noqa: SIM115
    try:
        r = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", *shlex.split(cmdline)], cwd=probe_dir,
                           stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, text=True,
                           env=env, timeout=LIMIT_S + 20)  # interpreter start-up on a busy machine
    finally:
        if full:
            stdout.close()
    _assert_one_line(r.returncode, r.stderr, fragment)
    assert _snapshot(probe_dir) == before


def test_missing_output_parents_are_created(probe_dir):
    """The other side of the output check: a path whose parents are missing is written, parents made."""
    code, out, err = _run_in_process(["workload", "convert", "t.csv", "-o", "new/deeper/t.parquet"])
    assert code == 0, err
    assert (probe_dir / "new" / "deeper" / "t.parquet").is_file()
    code, out, err = _run_in_process(["workload", "fit", "t.csv", "-o", "specs/a/fit.yaml"])
    assert code == 0, err
    assert (probe_dir / "specs" / "a" / "fit.yaml").is_file()
