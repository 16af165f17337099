"""The serving engine's settings, as a run learned them, each with its source (``server.json``).

``calibrate`` and ``validate`` replay a measured run through the simulator with the server's
engine settings; an assumed value (vLLM's defaults differ by version and hardware: 256 or 1,024
sequences, 2,048 to 16,384 batched tokens) silently changes the prediction. So every setting is
recorded with where it came from, and a setting nobody recorded stops those commands with one
line naming the flag that supplies it (:func:`require`).

Sources, most trusted first (a later source never overrides an earlier one; a disagreement
becomes a note in ``server.json``):

- ``metrics``: the server's ``/metrics`` ``vllm:cache_config_info`` labels (``block_size``,
  ``num_gpu_blocks``, ``gpu_memory_utilization``, ``enable_prefix_caching``, ... every label,
  typed), read by the benchmark's metrics sampler;
- ``server log FILE``: the server's startup lines (:func:`parse_server_log`): the launch command
  ``llmqueue.bench.engine.VllmServer`` writes first (``$ python -m vllm... --max-num-seqs 64``),
  vLLM's ``non-default args: {...}``, its ``args: Namespace(...)`` (older versions), the engine's
  ``with config: ... enable_chunked_prefill=True, max_seq_len=...`` and ``KV cache size: N tokens``;
- ``flag --server-...``: what the user said the server runs (``bench --server-max-num-seqs``...),
  or ``import`` flags.

``server.json`` keeps each setting as a top-level key (``"max_num_seqs": 64``) and its source
under ``"sources"`` (``{"max_num_seqs": "flag --server-max-num-seqs"}``).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from llmqueue.errors import InputError

#: The settings the simulator needs, with the bench flag that supplies each.
ENGINE_SETTINGS = {
    "max_num_seqs": "--server-max-num-seqs",
    "max_num_batched_tokens": "--server-max-num-batched-tokens",
    "block_size": "--server-block-size",
    "max_model_len": "--server-max-model-len",
    "enable_chunked_prefill": "--server-enable-chunked-prefill",
    "num_gpu_blocks": "--server-num-gpu-blocks",
}

#: settings ``calibrate``/``validate`` cannot do without (the rest have the simulator's defaults)
REQUIRED = ("max_num_seqs", "max_num_batched_tokens")

_INT = {"max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len", "num_gpu_blocks",
        "num_gpu_blocks_override", "kv_cache_size_tokens", "max_seq_len"}
_LOG_KEYS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len", "enable_chunked_prefill",
             "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks_override", "max_seq_len",
             "kv_cache_dtype", "dtype", "tensor_parallel_size", "swap_space", "cpu_offload_gb")


def typed(value):
    """A label or log value as Python: ``"32"`` -> 32, ``"0.9"`` -> 0.9, ``"True"`` -> True,
    ``"None"`` -> None, anything else the string."""
    if not isinstance(value, str):
        return value
    v = value.strip().strip("'\"")
    if v in ("None", "", "null"):
        return None
    if v in ("True", "true"):
        return True
    if v in ("False", "false"):
        return False
    try:
        return int(v.replace(",", "")) if re.fullmatch(r"-?[\d,]+", v) else float(v)
    except ValueError:
        return v


def from_cache_config(labels: dict) -> dict:
    """Every ``vllm:cache_config_info`` label, typed (``num_gpu_blocks_override`` wins over the
    profiled ``num_gpu_blocks`` when given, as :func:`llmqueue.bench.prom.cache_config` reads it)."""
    out = {k: typed(v) for k, v in labels.items() if not k.startswith("_") and k != "engine"}
    if out.get("num_gpu_blocks_override") is not None:
        out["num_gpu_blocks"] = out["num_gpu_blocks_override"]
    return {k: v for k, v in out.items() if v is not None}


def _flag_values(cmd: str) -> dict:
    """``--max-num-seqs 64 --enable-chunked-prefill --no-enable-prefix-caching`` -> values."""
    out: dict = {}
    toks = cmd.split()
    for i, t in enumerate(toks):
        if not t.startswith("--"):
            continue
        name, eq, val = t[2:].partition("=")
        key = name.replace("-", "_")
        if key.startswith("no_") and key[3:] in _LOG_KEYS:
            out[key[3:]] = False
            continue
        if key not in _LOG_KEYS:
            continue
        if not eq:
            val = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else "True"
        out[key] = typed(val)
    return out


def _keyvals(text: str) -> dict:
    """``key=value`` pairs of the known keys in a ``Namespace(...)`` or ``with config:`` line."""
    out = {}
    for m in re.finditer(r"\b(\w+)=('[^']*'|\"[^\"]*\"|[^,()\s]+)", text):
        if m.group(1) in _LOG_KEYS:
            out[m.group(1)] = typed(m.group(2))
    return out


def parse_server_log(lines) -> dict:
    """The engine settings a vLLM server's log states (see the module docstring); the last
    server start in the log wins (a log appended to by several starts). ``lines``: an iterable
    of lines or a path."""
    if isinstance(lines, (str, Path)):
        with open(lines, encoding="utf-8", errors="replace") as f:
            return parse_server_log(f)
    out: dict = {}
    for line in lines:
        if line.startswith("$ ") and "vllm" in line:  # VllmServer's launch command: a new start
            out = _flag_values(line[2:])
            continue
        if "non-default args:" in line:
            text = line.split("non-default args:", 1)[1].strip()
            try:
                d = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                d = {m.group(1): typed(m.group(2))
                     for m in re.finditer(r"'(\w+)':\s*('[^']*'|[^,}]+)", text)}
            if isinstance(d, dict):
                out.update({k: typed(v) for k, v in d.items() if k in _LOG_KEYS})
        elif "args: Namespace(" in line:
            out.update(_keyvals(line.split("Namespace(", 1)[1]))
        elif "with config:" in line:
            kv = _keyvals(line.split("with config:", 1)[1])
            out.update({k: v for k, v in kv.items() if k not in out})
        else:
            m = re.search(r"KV cache size: ([\d,]+) tokens", line)
            if m:
                out["kv_cache_size_tokens"] = int(m.group(1).replace(",", ""))
    if "max_model_len" not in out and out.get("max_seq_len") is not None:
        out["max_model_len"] = out["max_seq_len"]
    out.pop("max_seq_len", None)
    if out.get("num_gpu_blocks_override") is not None:
        out["num_gpu_blocks"] = out["num_gpu_blocks_override"]
    return {k: v for k, v in out.items() if v is not None}


def merge(server: dict, values: dict, source: str) -> dict:
    """``server`` with ``values`` recorded as coming from ``source``: a value already recorded
    from another source stays, and a disagreement becomes a note. Returns ``server`` (updated)."""
    sources = server.setdefault("sources", {})
    for k, v in values.items():
        if v is None:
            continue
        if k in server and server[k] is not None and k != "sources":
            if server[k] != v:
                server.setdefault("notes", []).append(
                    f"{k}: {source} says {v!r}, {sources.get(k, 'the run')} says {server[k]!r}; "
                    f"kept {server[k]!r}")
            continue
        server[k] = v
        sources[k] = source
    return server


def record(out_dir, *, flags: dict | None = None, log=None, flag_source: str = "flag") -> dict:
    """Add the settings the server's log (``log``: a path) and ``flags`` (setting -> value, the
    user's word) state to ``out_dir/server.json`` (kept: what the metrics sampler wrote, with
    source ``metrics``). Returns the file's new content; writes nothing when there is nothing."""
    p = Path(out_dir) / "server.json"
    server = json.loads(p.read_text()) if p.exists() else {}
    if server and "sources" not in server:  # written by the metrics sampler
        server["sources"] = {k: "metrics" for k in server
                             if k not in ("metrics_url", "cache_config_info", "M", "M_usable")}
    if log is not None:
        try:
            merge(server, parse_server_log(log), f"server log {log}")
        except OSError as e:
            server.setdefault("notes", []).append(f"server log {log} not read ({e.strerror or e})")
    if flags:
        for k, v in flags.items():
            if v is not None:
                flag = ENGINE_SETTINGS.get(k) if flag_source == "flag" else None
                merge(server, {k: v}, f"{flag_source} {flag or '--' + k.replace('_', '-')}")
    if server.get("M_usable") is None and server.get("num_gpu_blocks") and server.get("block_size"):
        server["M"] = int(server["num_gpu_blocks"]) * int(server["block_size"])
        server["M_usable"] = (int(server["num_gpu_blocks"]) - 1) * int(server["block_size"])  # vLLM's null block
        server.setdefault("sources", {})["M_usable"] = "(num_gpu_blocks - 1) x block_size (vLLM keeps one null block)"
    if server and server != {"sources": {}}:
        from llmqueue._files import write_atomic

        write_atomic(p, json.dumps(server, indent=2, default=str) + "\n")
    return server


def require(known: dict, name: str, *, where: str, here_flag: str | None = None, imported: bool = False) -> int:
    """``known[name]`` as an int, or one-line :class:`InputError` naming the flags that supply it:
    ``bench``'s, or ``import``'s for a run that ``llmqueue import`` wrote (``imported``)."""
    v = known.get(name)
    if v is None or isinstance(v, bool):
        here = f", or {here_flag} N here" if here_flag else ""
        flag, cmd = ("--" + name.replace("_", "-"), "import") if imported else (ENGINE_SETTINGS[name], "bench")
        raise InputError(where, f"{name} unknown", f"pass {flag} N (or --server-log FILE) to {cmd}{here}")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise InputError(where, f"{name} is {v!r}, not a number") from None
