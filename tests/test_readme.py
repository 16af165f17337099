"""Every shell block of README.md runs as printed, each command exiting 0.

Each block runs as one bash script (``tests/_readme.py``), in a temporary working directory beside
a ``shared`` link to the team's ``../shared`` (so ``../shared/traces/...`` resolves as it does from
a checkout), with the venv's ``llmqueue`` and ``python`` first on PATH and ``aiohttp`` made
unimportable: the README needs only ``pip install .``, not the test extra.

What the README assumes and the test provides:

- a server at http://127.0.0.1:8000 ("my-model", a vLLM started with its iteration log in
  ``vllm.log``): ``llmqueue emulate`` on that port, logging to ``vllm.log`` in the blocks' directory,
  when the port is free (the blocks that use it skip, saying so, when it is not);
- the other clients' files the import examples read (``vllm-result.json``, guidellm's
  ``benchmarks.json`` of a sweep, AIPerf's ``profile_export.jsonl``, a server log), a ShareGPT file
  and a Hugging Face ``config.json``: small stand-ins written by the test under the README's names;
- the blocks that start their own servers (``emulate``, ``gateway``) on fixed ports skip when a
  port is taken.

The blocks of :data:`SHARED` run in one directory, in README order (a later one reads an earlier
one's ``runs/`` or ``calibration.yaml``; a test of one first runs the earlier ones it has not run).
Skipped, with the reason: :data:`SKIP` (installing the package over the running environment; the
suite itself), and ``../shared/traces`` commands where that folder is absent (a user's clone).
Real vLLM is covered by ``scripts/ci_vllm.sh``. The blocks of :data:`SLOW` (minutes of wall-clock
benchmarks, or long simulations) run with ``python -m pytest -m slow``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _readme import Block, run_block, shell_blocks

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
SHARED_DIR = REPO.parent / "shared"
BLOCKS = shell_blocks((REPO / "README.md").read_text())

# command text -> why it does not run here
SKIP = {
    "pip install . && llmqueue example": "installs the package over the environment this suite runs in "
                                         "(llmqueue example itself: tests/test_cli_example.py)",
    'pip install -e ".[test]" && python -m pytest -q': "runs this test suite, of which this test is part",
}
# blocks that run in one directory, in README order (later ones read earlier ones' runs)
SHARED = ("simulate-a-replica-or-a-fleet", "measure-a-real-server-calibrate-validate",
          "the-step-time-surface-llmqueue-profile", "measurements-from-another-client-llmqueue-import-2",
          "sweeps-capacity-plans-reports")
# minutes of wall-clock benchmarking or simulation: python -m pytest -m slow
SLOW = ("measure-a-real-server-calibrate-validate", "the-step-time-surface-llmqueue-profile",
        "measurements-from-another-client-llmqueue-import-2", "sweeps-capacity-plans-reports",
        "the-fleet-llmqueue-cluster")
# a command that the README says exits non-zero: {text in the command: exit code}
ALLOWED = {"wait %4": 130}
SERVER_PORT = 8000  # the README's vLLM
SERVER_MODEL = "my-model"


# -- the stand-ins for files a user has --------------------------------------------------------

def _vllm_result(path: Path) -> None:
    """A ``vllm bench serve --save-result --save-detailed`` JSON (200 requests at 4 req/s)."""
    rnd, t = random.Random(3), 0.0
    inl, outl, ttfts, itls, lats, starts = [], [], [], [], [], []
    for _ in range(200):
        t += rnd.expovariate(4.0)
        k = rnd.randint(3, 20)
        gaps = [0.01 + 0.002 * rnd.random() for _ in range(k - 1)]
        ttft = 0.03 + 0.02 * rnd.random()
        starts.append(1000.0 + t)
        inl.append(rnd.randint(10, 300))
        outl.append(k)
        ttfts.append(ttft)
        itls.append(gaps)
        lats.append(ttft + sum(gaps))
    path.write_text(json.dumps({
        "date": "20250101-000000", "backend": "vllm", "model_id": "m", "tokenizer_id": "m", "num_prompts": 200,
        "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None, "duration": t, "completed": 200,
        "total_input_tokens": sum(inl), "total_output_tokens": sum(outl), "request_throughput": 4.0,
        "input_lens": inl, "output_lens": outl, "ttfts": ttfts, "itls": itls, "latencies": lats,
        "start_times": starts, "generated_texts": [""] * 200, "errors": [""] * 200}))


def _import_files(d: Path) -> None:
    _vllm_result(d / "vllm-result.json")
    gl = json.loads((DATA / "guidellm_v0.7_benchmarks.json").read_text())
    gl["benchmarks"] = (gl["benchmarks"] * 2)[:3]  # a sweep of three
    (d / "benchmarks.json").write_text(json.dumps(gl))
    shutil.copy(DATA / "vllm_0.32_iteration.log", d / "vllm.log")
    (d / "artifacts" / "my-run").mkdir(parents=True)
    shutil.copy(DATA / "aiperf_profile_export.jsonl", d / "artifacts" / "my-run" / "profile_export.jsonl")


def _sharegpt(d: Path) -> None:
    rnd = random.Random(5)
    words = "the queue grows when arrivals outpace service and the cache fills".split()
    convs = [{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(rnd.choices(words, k=rnd.randint(5, 60)))},
        {"from": "gpt", "value": " ".join(rnd.choices(words, k=rnd.randint(5, 40)))}]} for i in range(100)]
    (d / "ShareGPT_V3_unfiltered_cleaned_split.json").write_text(json.dumps(convs))


def _hf_config(d: Path) -> None:
    (d / "path" / "to").mkdir(parents=True)
    (d / "path" / "to" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16"}))


FILES = {"measurements-from-another-client-llmqueue-import": _import_files,
         "measurements-from-another-client-llmqueue-import-2": _sharegpt,
         "commands": _hf_config}


# -- the environment ---------------------------------------------------------------------------

def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(block: Block) -> set[int]:
    """The fixed ports a block's commands serve or call on 127.0.0.1."""
    import re

    return {int(p) for p in re.findall(r"(?:127\.0\.0\.1:|--port )(\d+)", block.text)}


class Workspace:
    """The temporary directories, the environment of the commands, the emulated server on port
    8000 and which shared blocks already ran."""

    def __init__(self, root: Path):
        self.root = root
        if SHARED_DIR.is_dir():
            (root / "shared").symlink_to(SHARED_DIR.resolve())
        site = root / "_site"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import sys\nsys.modules['aiohttp'] = None  # not installed\n")
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = str(site)
        env["MPLBACKEND"] = "Agg"
        env.pop("PYTEST_CURRENT_TEST", None)
        self.env = env
        self.ran: dict[str, object] = {}
        self.server: subprocess.Popen | None = None

    def dir_for(self, block: Block) -> Path:
        d = self.root / ("shared-blocks" if block.id in SHARED else block.id)
        d.mkdir(exist_ok=True)
        return d

    def start_server(self, cwd: Path) -> None:
        """``llmqueue emulate`` as the README's vLLM on port 8000, its iteration log in vllm.log."""
        if self.server is not None:
            return
        self.server = subprocess.Popen(
            ["llmqueue", "emulate", "--port", str(SERVER_PORT), "--served-model-name", SERVER_MODEL,
             "--step-time", "linear:c0=0.01:decode=2e-4:prefill=2e-5", "--max-num-seqs", "32",
             "--capacity-tokens", "65536", "--enable-logging-iteration-details", "--log-file", "vllm.log"],
            cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        line = self.server.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"the emulated server did not start: {line}")

    def close(self) -> None:
        if self.server is not None:
            try:
                os.killpg(self.server.pid, signal.SIGTERM)
                self.server.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.stdout.close()

    def skips(self, block: Block) -> dict[int, str]:
        """{command line: reason} of the commands of ``block`` that do not run here, and of those
        that read what a skipped one writes (its ``-o``/``--out``)."""
        import re

        out, unwritten = {}, []
        for c in block.commands:
            flat = " ".join(c.text.split())
            for text, why in SKIP.items():
                if text in flat:
                    out[c.line] = why
            if "../shared/" in c.text and not SHARED_DIR.is_dir():
                out[c.line] = f"needs the team's ../shared (not at {SHARED_DIR}; a user's clone has none)"
            for path in unwritten:
                if re.search(rf"(?<![\w/.-]){re.escape(path)}(?![\w.-])", flat):
                    out[c.line] = f"reads {path}, which a skipped command writes"
            if c.line in out:
                unwritten += re.findall(r"(?:^|\s)(?:-o|--out)\s+(\S+)", flat)
        return out

    def run(self, block: Block):
        """Run ``block`` (after the earlier shared blocks it may read from); returns its run, or a
        skip reason (str)."""
        if block.id in self.ran:
            return self.ran[block.id]
        if block.id in SHARED:
            for earlier in BLOCKS:
                if earlier is block:
                    break
                if earlier.id in SHARED:
                    r = self.run(earlier)
                    if not isinstance(r, str) and not r.ok:
                        return self._done(block, f"FAILED: it reads the runs of block {earlier.id}, which failed")
        skip = self.skips(block)
        if len(skip) == len(block.commands):
            return self._done(block, "; ".join(sorted(set(skip.values()))))
        cwd = self.dir_for(block)
        ports = _ports(block)
        if SERVER_PORT in ports:
            if self.server is None and not _port_free(SERVER_PORT):
                return self._done(block, f"port {SERVER_PORT} is taken: the README's server cannot be emulated")
            self.start_server(cwd)
            ports.discard(SERVER_PORT)
        busy = sorted(p for p in ports if "--port" in block.text and not _port_free(p))
        if busy:
            return self._done(block, f"the block serves on fixed ports {busy}, which are taken")
        if block.id in FILES:
            FILES[block.id](cwd)
        allowed = {c.line: code for c in block.commands for text, code in ALLOWED.items() if text in c.text}
        t0 = time.monotonic()
        r = run_block(block, cwd, env=self.env, skip=skip, allowed=allowed, timeout_s=1200)
        r.seconds = time.monotonic() - t0
        r.skipped = skip
        return self._done(block, r)

    def _done(self, block: Block, r):
        self.ran[block.id] = r
        return r


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = Workspace(tmp_path_factory.mktemp("readme"))
    yield ws
    ws.close()


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.id in SLOW else [])
                                   for b in BLOCKS])
def test_readme_block_runs_as_printed(block, workspace):
    r = workspace.run(block)
    if isinstance(r, str):
        if r.startswith("FAILED"):
            pytest.fail(r)
        pytest.skip(r)
    for line, why in r.skipped.items():
        print(f"README line {line} skipped: {why}")
    print(f"block at README line {block.line}: {r.seconds:.1f} s")
    assert r.ok, r.report()


# -- the runner itself -------------------------------------------------------------------------

def test_the_tables_name_blocks_and_commands_of_the_readme():
    ids = [b.id for b in BLOCKS]
    assert len(ids) == len(set(ids))
    for name in (*SHARED, *SLOW, *FILES):
        assert name in ids, name
    flat = [" ".join(c.text.split()) for b in BLOCKS for c in b.commands]
    for text in (*SKIP, *ALLOWED):
        assert sum(text in f for f in flat) == 1, text


def test_the_extractor_splits_commands_as_bash_does():
    md = ("# T\n\n```bash\n# a comment\nllmqueue kv \\\n    --list\npython - <<'EOF'\nprint(1)\nEOF\n"
          "for d in 1 2; do echo $d \\\n  x; done\nsleep 1 &\n```\n\n```python\nprint(2)\n```\n")
    (b,) = shell_blocks(md)
    assert b.id == "t" and b.line == 4
    assert [(c.line, c.text.splitlines()[0]) for c in b.commands] == [
        (5, "llmqueue kv \\"), (7, "python - <<'EOF'"), (10, "for d in 1 2; do echo $d \\"), (12, "sleep 1 &")]
    assert b.commands[1].last_line == 9


def test_a_broken_command_fails_the_block(tmp_path):
    md = ("## S\n\n```bash\nllmqueue queue mmc --rate 2 --mu 1 --c 3\nllmqueue queue mmc --rate 2 \\\n"
          "    --mu 1 --c one\nsleep 60 &\nfalse\nkill %1; wait %1\nsleep 60 &\necho done\n```\n")
    (b,) = shell_blocks(md)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    t0 = time.monotonic()
    r = run_block(b, tmp_path, env=env, timeout_s=60)
    assert time.monotonic() - t0 < 50  # the background sleep left running was ended
    assert not r.ok
    assert [(ln, rc) for ln, rc, _ in r.failures] == [(5, 2), (8, 1), (9, 143)]
    assert "done" in r.output and "README line 5: exit 2: llmqueue queue mmc" in r.report()
    # a skipped command and an exit the README documents are not failures
    r = run_block(b, tmp_path, env=env, skip={5: "x", 8: "y"}, allowed={9: 143}, timeout_s=60)
    assert r.ok, r.report()


def test_a_readme_command_broken_on_purpose_fails_its_block(tmp_path):
    """The real README with one command of its command list broken: that block fails, naming it."""
    text = (REPO / "README.md").read_text()
    good = "llmqueue queue mmc --rate 2 --mu 1 --c 3"
    assert text.count(good) == 1
    broken = shell_blocks(text.replace(good, "llmqueue queue mmc --rate 2 --mu 1 --c three"))
    (b,) = [b for b in broken if "--c three" in b.text]
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    skip = {c.line: "" for c in b.commands if "config.json" in c.text}
    r = run_block(b, tmp_path, env=env, skip=skip, timeout_s=300)
    assert [(rc, t.split(" #")[0].strip()) for _, rc, t in r.failures] == [
        (2, "llmqueue queue mmc --rate 2 --mu 1 --c three")]
    assert r.failures[0][0] == text[:text.index(good)].count("\n") + 1


def test_the_readme_runs_without_the_test_extra(workspace):
    """The commands' environment cannot import aiohttp (the test extra's): the README's demos need
    only ``pip install .``."""
    r = subprocess.run(["python", "-c", "import aiohttp"], env=workspace.env, capture_output=True, text=True)
    assert r.returncode != 0 and "aiohttp" in r.stderr
    r = subprocess.run(["llmqueue", "--version"], env=workspace.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_without_shared_traces_their_commands_and_readers_skip(monkeypatch, tmp_path):
    import test_readme

    monkeypatch.setattr(test_readme, "SHARED_DIR", tmp_path / "absent")
    (b,) = shell_blocks("## T\n```bash\nllmqueue workload fit ../shared/traces/x.csv -o conv.yaml\n"
                        "llmqueue simulate --workload conv.yaml\nllmqueue scenario list\n```\n")
    ws = Workspace.__new__(Workspace)
    assert sorted(ws.skips(b)) == [3, 4]
