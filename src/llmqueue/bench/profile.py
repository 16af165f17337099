"""``llmqueue profile``: an engine's step-time surface, measured through the OpenAI API alone.

A saturation run samples the engine where it is busiest (batches near ``max_num_seqs``); the
small batches a lightly loaded server runs are a handful of its steps, too few to fit, and a
decode step's cost is concave in the batch. The profile measures the surface directly:

- **decode ladders**: for each of two or three prompt lengths (contexts), closed loops of
  ``c = 1, 2, 4, ...`` requests up to ``max_num_seqs`` or the KV cache's limit, each with a long
  fixed output (``ignore_eos``). The ``c`` requests are sent together, so after the last one's
  first token and before the first one's last, the engine decodes exactly ``c`` sequences a
  step; a streaming client sees one token per step, so the inter-token latencies in that window
  are the decode step's cycle at batch ``c`` (its start to the next step's start: the time the
  simulator advances per step). With the server's iteration log (vLLM's
  ``--enable-logging-iteration-details``), the logged pure-decode steps of ``c`` sequences give
  the same cycle without the client's and the network's jitter; they are preferred when there
  are enough of them.
- **prefill probes**: isolated requests (one at a time) at several prompt lengths, two output
  tokens each: TTFT is the server's frontend delay plus one prefill step. A line
  ``intercept + per_token x P`` is fitted; with the iteration log the prefill steps' own times
  are fitted and the frontend delay (TTFT less the step) is kept apart.

Everything runs within a time budget (default 180 s): each context's batches are measured
smallest and largest first (the range a saturation run reaches), then the middles; a level whose
estimated time (from the levels already measured) does not fit its context's share of what is
left is skipped, with a note, and once the first step time is measured a note says how long
the whole ladder takes (and the ``--budget`` that would measure all of it). ``repeat_spread``:
how far the passes' levels moved (the spread of a profile taken again). ``DIR/profile.json`` holds the surface (per context and batch: the median, quartiles and
count of the step times, and the per-sequence context), the prefill fit, the server settings
used (``server.json`` beside it) and notes; ``DIR/runs/`` the raw per-request records of every
level (the benchmark client's run directories). ``--step-time profile:DIR`` prices steps from
it (:mod:`llmqueue.engine.profile_step`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from llmqueue._files import write_atomic
from llmqueue.errors import InputError

DEFAULT_BUDGET_S = 180.0
DEFAULT_OUTPUT_TOKENS = 128
DEFAULT_CONTEXTS = (64, 512, 2048)
DEFAULT_PREFILL_LENGTHS = (16, 128, 512, 2048)
PREFILL_OUTPUT_TOKENS = 2
MIN_LOG_STEPS = 10
"""Logged pure-decode steps of a level needed to prefer the iteration log over the client's ITLs."""


def coverage_order(batches) -> list[int]:
    """The order a context's batches are measured in: the smallest and the largest first (the
    range a saturation run reaches, up to ``max_num_seqs`` or the KV limit, is covered before the
    budget runs short), then the middles by halving (``1, 32, 4, 16, 2, 8``: the surface
    interpolates between measured batches, so spread points first)."""
    b = sorted(set(int(x) for x in batches))
    if len(b) <= 2:
        return b
    out, spans = [b[0], b[-1]], [(0, len(b) - 1)]
    while spans:
        nxt = []
        for lo, hi in spans:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            out.append(b[mid])
            nxt += [(lo, mid), (mid, hi)]
        spans = nxt
    return out


def repeat_spread(cells: list[dict]) -> float | None:
    """How far a repeated profile's levels move: the sd of ``ln(pass median / cell median)`` over
    every cell measured in more than one pass (the engine's speed wandering between passes minutes
    apart; the noise of a profile taken again). None with one pass."""
    logs = [math.log(m / c["median_s"]) for c in cells if len(c.get("pass_medians_s") or []) > 1 and c["median_s"] > 0
            for m in c["pass_medians_s"] if m > 0]
    return float(np.std(logs, ddof=1)) if len(logs) >= 2 else None


def ladder(cap: int) -> list[int]:
    """``1, 2, 4, ...`` up to ``cap``, and ``cap`` itself."""
    out, c = [], 1
    while c <= cap:
        out.append(c)
        c *= 2
    if out and out[-1] != cap:
        out.append(cap)
    return out


def _http_get(url: str, path: str, api_key: str | None, timeout_s: float = 10.0):
    """GET ``url``'s origin + ``path`` (no proxy): the response, or None when the server answers
    an error; a server that cannot be reached is a :class:`BenchConnectError`, one that does not
    answer within ``timeout_s`` (connect, then each read) an :class:`InputError` naming ``--url``."""
    import httpx

    from llmqueue.bench.client import BenchConnectError
    from llmqueue.bench.http import base_url

    base = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(trust_env=False, timeout=timeout_s) as c:
            r = c.get(base + path, headers=headers)
    except httpx.ConnectError as e:
        msg = str(e) or type(e).__name__
        raise BenchConnectError(base, "connection refused" if "refused" in msg.lower() else msg) from None
    except httpx.TimeoutException as e:
        what = "accept the connection" if isinstance(e, httpx.ConnectTimeout) else f"answer GET {path}"
        raise InputError("url", f"{base} did not {what} within {timeout_s:.3g} s",
                         "check the server (is it still loading the model?), or give a larger --budget") from None
    except httpx.HTTPError:
        return None
    return r if r.status_code == 200 else None


def server_settings(url: str, *, api_key: str | None = None, server_log=None, flags: dict | None = None,
                    timeout_s: float = 10.0) -> dict:
    """The engine settings the ladder needs, each with its source (:mod:`llmqueue.bench.server_info`):
    ``/metrics``' ``vllm:cache_config_info`` (the KV cache), ``/v1/models`` (``max_model_len``),
    the server's log (its startup lines) and the ``--server-*`` flags. ``timeout_s``: each GET's
    connect and read timeout (a server that does not answer: one line)."""
    from llmqueue.bench.server_info import from_cache_config, merge, parse_server_log

    server: dict = {"sources": {}}
    r = _http_get(url, "/metrics", api_key, timeout_s)
    if r is not None:
        try:
            from llmqueue.bench.prom import cache_config

            cc = cache_config(r.text)
            merge(server, {**from_cache_config(cc.labels), "num_gpu_blocks": cc.num_gpu_blocks,
                           "block_size": cc.block_size}, "metrics")
        except InputError:
            pass  # not vLLM's /metrics
    r = _http_get(url, "/v1/models", api_key, timeout_s)
    if r is not None:
        try:
            mml = r.json()["data"][0].get("max_model_len")
            if isinstance(mml, int) and not isinstance(mml, bool) and mml > 0:
                merge(server, {"max_model_len": mml}, "/v1/models")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            pass
    if server_log is not None:
        merge(server, parse_server_log(server_log), f"server log {server_log}")
    from llmqueue.bench.server_info import ENGINE_SETTINGS

    for k, v in (flags or {}).items():
        if v is not None:
            merge(server, {k: v}, f"flag {ENGINE_SETTINGS.get(k, '--server-' + k.replace('_', '-'))}")
    if server.get("num_gpu_blocks") and server.get("block_size"):
        server["M"] = int(server["num_gpu_blocks"]) * int(server["block_size"])
        server["M_usable"] = (int(server["num_gpu_blocks"]) - 1) * int(server["block_size"])
    elif server.get("kv_cache_size_tokens"):
        server["M_usable"] = int(server["kv_cache_size_tokens"])
    return server


def require_limits(server: dict) -> tuple[int, int]:
    """``(max_num_seqs, usable KV tokens)``: the ladder's two limits, or one line naming the flag."""
    seqs = server.get("max_num_seqs")
    if not isinstance(seqs, int) or isinstance(seqs, bool) or seqs < 1:
        raise InputError("max_num_seqs", "unknown (the ladder stops at the engine's max_num_seqs)",
                         "pass --server-max-num-seqs N, or --server-log FILE (the server's log)")
    if not server.get("M_usable"):
        raise InputError("num_gpu_blocks", "the KV cache's size is unknown (the ladder stops at its limit)",
                         "pass --server-num-gpu-blocks N and --server-block-size N, or --server-log FILE "
                         "(vLLM's /metrics gives it when reachable)")
    return seqs, int(server["M_usable"])


def kv_cap(server: dict, prompt: int, output: int) -> int:
    """Sequences of ``prompt + output`` tokens the KV cache holds at once (whole blocks each)."""
    bs = server.get("block_size")
    if bs and server.get("num_gpu_blocks"):
        per = math.ceil((prompt + output) / int(bs))
        return (int(server["num_gpu_blocks"]) - 1) // per
    return int(server["M_usable"]) // (prompt + output)


def kv_tokens_per_seq(server: dict, batch: int) -> int:
    """The KV tokens each of ``batch`` sequences can hold when they share the cache evenly (whole
    blocks each, vLLM's null block held back)."""
    bs = server.get("block_size")
    if bs and server.get("num_gpu_blocks"):
        return ((int(server["num_gpu_blocks"]) - 1) // int(batch)) * int(bs)
    return int(server["M_usable"]) // int(batch)


def level_output(server: dict, prompt: int, batch: int, output: int) -> int:
    """A level's output tokens: ``output``, or as many as fit where ``batch`` requests of ``prompt +
    output`` tokens would not all fit the KV cache at once. A KV-bound engine at saturation runs
    exactly such batches (more sequences, each shorter: the cache full), so the ladder goes on
    past ``kv_cap(prompt, output)`` with shorter requests, down to :data:`MIN_LEVEL_OUTPUT_TOKENS`,
    instead of stopping below the batches a saturation run reaches."""
    return min(int(output), kv_tokens_per_seq(server, batch) - int(prompt))


MIN_LEVEL_OUTPUT_TOKENS = 24   # the fewest output tokens of a level (a short budget's cut, or a KV-bound batch)


def plan(server: dict, *, contexts=None, batches=None, output_tokens: int = DEFAULT_OUTPUT_TOKENS,
         prefill_lengths=None) -> dict:
    """The levels to measure: ``{"contexts": {prompt: [batches]}, "prefill": [lengths], "notes": [...]}``.

    Default contexts: :data:`DEFAULT_CONTEXTS` that fit ``max_model_len`` with the output, and,
    where a longer default does not fit, the longest prompt that does (a second row: the surface
    is linear in the per-sequence context between rows, and one row cannot give its slope).
    Each context's batches go up to ``max_num_seqs`` or the KV cache's limit at
    :data:`MIN_LEVEL_OUTPUT_TOKENS` output tokens (:func:`level_output`)."""
    seqs, _ = require_limits(server)
    notes: list[str] = []
    mml = server.get("max_model_len")
    if contexts is None:
        contexts = [p for p in DEFAULT_CONTEXTS if mml is None or p + output_tokens <= mml]
        if mml and len(contexts) < len(DEFAULT_CONTEXTS):
            top = int(mml) - output_tokens  # the longest prompt that fits beside the output
            if top >= 1 and top >= 2 * max(contexts, default=0):
                contexts.append(top)
                if len(contexts) > 1:
                    notes.append(f"context {top}: the longest prompt that fits max_model_len {mml} beside "
                                 f"{output_tokens} output tokens (in place of the defaults that do not)")
        if not contexts and mml:
            contexts = [max(int(mml) - output_tokens, 1)]
        if mml is None:
            notes.append("max_model_len unknown: contexts 64 and 512 (give --contexts to choose)")
            contexts = contexts[:2]
    levels: dict[int, list[int]] = {}
    for p in sorted(set(int(x) for x in contexts)):
        if mml is not None and p + output_tokens > mml:
            raise InputError("contexts", f"prompt {p} + output {output_tokens} tokens exceed the server's "
                             f"max_model_len {mml}", "give shorter --contexts or fewer --output-tokens")
        cap = min(seqs, kv_cap(server, p, min(output_tokens, MIN_LEVEL_OUTPUT_TOKENS)))
        full = kv_cap(server, p, output_tokens)
        if kv_cap(server, p, output_tokens) < 1:
            raise InputError("contexts", f"one request of {p} + {output_tokens} tokens does not fit the KV cache",
                             "give shorter --contexts or fewer --output-tokens")
        bs = ladder(cap) if batches is None else sorted({int(b) for b in batches if int(b) <= cap})
        if batches is not None and max(int(b) for b in batches) > cap:
            notes.append(f"context {p}: batches above {cap} left out (max_num_seqs {seqs} or the KV cache)")
        if bs:
            levels[p] = bs
            cut = [b for b in bs if b > full]
            if cut:
                notes.append(f"context {p}: batches {', '.join(map(str, cut))} with fewer output tokens "
                             f"({', '.join(str(level_output(server, p, b, output_tokens)) for b in cut)}): "
                             f"{output_tokens} would not fit the KV cache at once (a KV-bound engine's batches)")
    limit = mml - PREFILL_OUTPUT_TOKENS if mml else None
    mnbt = server.get("max_num_batched_tokens")
    if isinstance(mnbt, int) and not isinstance(mnbt, bool) and server.get("enable_chunked_prefill") is not False:
        limit = min(limit, mnbt) if limit else mnbt  # one prefill step a probe
    if prefill_lengths is None:
        prefill_lengths = [x for x in DEFAULT_PREFILL_LENGTHS if limit is None or x <= limit]
        if limit is not None and len(prefill_lengths) < 3:
            prefill_lengths = sorted({max(1, limit // 16), max(1, limit // 4), limit})
    else:
        prefill_lengths = sorted({int(x) for x in prefill_lengths})
        if limit is not None and prefill_lengths[-1] > limit:
            raise InputError("prefill_lengths", f"{prefill_lengths[-1]} tokens exceed what one prefill step takes "
                             f"({limit}: max_model_len and max_num_batched_tokens)", f"give lengths up to {limit}")
    return {"contexts": levels, "prefill": prefill_lengths, "notes": notes}


def _quartiles(x: np.ndarray) -> dict:
    q = np.percentile(x, [25, 50, 75])
    return {"median_s": float(q[1]), "p25_s": float(q[0]), "p75_s": float(q[2]), "count": int(len(x))}


def level_itl(records, tokens, prompt: int) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Inter-token gaps of a ladder level while every request decodes: ``(gaps, their later
    token's context per sequence, (window start, end))``, the window from the last request's
    first token to the first request's end."""
    first = np.asarray(records["first_token_s"], dtype=np.float64)
    fin = np.asarray(records["finish_s"], dtype=np.float64)
    status = np.asarray(records["status"])
    used = np.isin(status, ("ok", "cancelled", "unfinished")) & np.isfinite(first)
    if not used.any():
        return np.zeros(0), np.zeros(0), (math.nan, math.nan)
    lo, hi = float(first[used].max()), float(np.nanmin(fin[used]))
    rid = np.asarray(tokens["request_id"])
    att = np.asarray(tokens["attempt"])
    idx = np.asarray(tokens["index"])
    t = np.asarray(tokens["t_s"], dtype=np.float64)
    o = np.lexsort((idx, att, rid))
    rid, att, idx, t = rid[o], att[o], idx[o], t[o]
    same = (rid[1:] == rid[:-1]) & (att[1:] == att[:-1]) & (idx[1:] == idx[:-1] + 1)
    inside = same & (t[:-1] >= lo) & (t[1:] <= hi)
    return np.diff(t)[inside], prompt + idx[1:][inside].astype(np.float64), (lo, hi)


def _level_steps(run_dir: Path, server_log, offset: int, res, M) -> object | None:
    from llmqueue.bench.steplog import write_run_steps
    from llmqueue.records import read_run

    b = res.summary.get("bench") or {}
    if b.get("t0_epoch_s") is None:
        return None
    n, _ = write_run_steps(run_dir, server_log, offset=offset, t0_epoch_s=b["t0_epoch_s"], t_end_s=b.get("t_end_s"),
                           M=M, finish_s=res.records["finish_s"])
    return read_run(run_dir).steps if n else None


def logged_decode_cycles(steps, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cycles, elapsed)`` of the logged pure-decode steps of exactly ``batch`` sequences that
    the engine went straight on from (:func:`llmqueue.bench.cycles.step_cycles`)."""
    from llmqueue.bench.cycles import step_cycles

    mask, cyc, _ = step_cycles(steps)
    pure = (np.asarray(steps["prefill_tokens"]) == 0) & (np.asarray(steps["decode_seqs"]) == batch)
    m = mask & pure & np.isfinite(cyc)
    return cyc[m], np.asarray(steps["duration_s"], dtype=np.float64)[m]


def fit_prefill(lengths, seconds, weights=None) -> dict:
    """``seconds = intercept + per_token x length`` by (weighted) non-negative least squares, with R2."""
    from scipy.optimize import nnls

    x = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    w = np.sqrt(np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64))
    X = np.column_stack([np.ones(len(x)), x])
    sc = np.maximum(np.abs(X).max(axis=0), 1e-12)
    coef, _ = nnls((X / sc) * w[:, None], y * w)
    coef = coef / sc
    pred = X @ coef
    ss = float(np.sum(w * w * (y - np.average(y, weights=w * w)) ** 2))
    return {"intercept_s": float(coef[0]), "per_token_s": float(coef[1]),
            "r2": 1 - float(np.sum(w * w * (y - pred) ** 2)) / ss if ss > 0 else 1.0}


class _Budget:
    """Seconds left, shared out over the contexts still to measure."""

    def __init__(self, budget_s: float):
        self.t0 = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def timeout(self, *, share: float, floor: float = 1.0, cap: float = 10.0) -> float:
        """A network wait's limit: ``share`` of what is left, at least ``floor``, at most ``cap`` s for a
        single GET (the whole of a phase's requests when ``cap`` is infinite)."""
        return min(max(self.left() * share, floor), cap)


def _estimate(cells: list[dict], prompt: int, batch: int, output: int, prefill: dict | None) -> float | None:
    """Seconds a level should take, from the levels measured so far (None: no basis yet)."""
    same = sorted((c["batch"], c["median_s"]) for c in cells if c["prompt_tokens"] == prompt)
    other = [c["median_s"] for c in cells if c["batch"] == batch]
    if len(same) >= 2:
        (b1, s1), (b2, s2) = same[-2], same[-1]
        step = s2 + max((s2 - s1) / (b2 - b1), 0.0) * (batch - b2)
    elif same:
        step = same[-1][1] * max(batch / same[-1][0], 1.0) ** 0.5
    elif other:
        step = max(other)
    else:
        return None
    pre = (prefill["intercept_s"] + prefill["per_token_s"] * prompt * batch) if prefill else 0.0
    return pre + (output - 1) * step


MIN_SIZED_OUTPUT_TOKENS = MIN_LEVEL_OUTPUT_TOKENS   # the fewest output tokens a short budget cuts a level to


def _sized_output(cells, ctx_list, passes: int, output: int, prefill, budget, notes: list) -> int:
    """The output tokens of the levels still to measure, sized by the first step time measured:
    the whole ladder's estimated time ``passes x sum(prefill + (o - 1) step(c))`` against the time
    left; when it does not fit, ``o`` shrinks in proportion (not below
    :data:`MIN_SIZED_OUTPUT_TOKENS`) so every batch up to the saturation range is still measured,
    each with fewer samples. A note says how long the ladder takes and what was done."""
    levels = [(q, b) for q, bs in ctx_list for b in bs]
    need = passes * sum(_estimate(cells, q, b, output, prefill) or 0.0 for q, b in levels)
    left = budget.left()
    text = (f"the planned ladder ({len(levels)} levels x {passes} passes) takes about {need:.0f} s by the first "
            f"step measured; {left:.0f} s of the budget {budget.budget_s:g} s left")
    o = output
    if need > left > 0 and output > MIN_SIZED_OUTPUT_TOKENS:
        o = max(MIN_SIZED_OUTPUT_TOKENS, int(output * 0.85 * left / need))
        text += f": each level's output cut to {o} tokens so that every batch is measured"
    if need * o / output > left:
        text += f" (give --budget {math.ceil(need * 1.2 + budget.elapsed()):d} to measure all at {output} tokens)"
    notes.append(text)
    return o


def run_profile(url: str, model: str, out_dir, *, contexts=None, batches=None,
                output_tokens: int = DEFAULT_OUTPUT_TOKENS, prefill_lengths=None, prefill_repeats: int = 5,
                budget_s: float = DEFAULT_BUDGET_S, server_log=None, server_flags: dict | None = None,
                api_key: str | None = None, vocab_size: int | None = None, seed: int = 0,
                passes: int = 2, on_level=None) -> dict:
    """Measure the step-time surface (see the module docstring); writes ``out_dir/profile.json``,
    ``out_dir/server.json`` and ``out_dir/runs/``; returns the profile. ``on_level(text, total)``
    is called before each level (a progress bar), ``total`` the number of levels planned."""
    from llmqueue.engine.profile_step import FORMAT, PROFILE_FILE
    from llmqueue.workload.generate import RequestArrays

    if not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and budget_s > 0):
        raise InputError("budget", f"must be a positive number of seconds (got {budget_s!r})")
    if output_tokens < 8:
        raise InputError("output_tokens", f"must be at least 8 (got {output_tokens}): the ladder reads the gaps "
                         "while every request decodes")
    if not isinstance(passes, int) or passes < 1:
        raise InputError("passes", f"must be a positive integer (got {passes!r})")
    if prefill_repeats < 1:
        raise InputError("prefill_repeats", f"must be at least 1 (got {prefill_repeats})")
    if server_log is not None:
        from llmqueue.bench.steplog import log_offset

        log_offset(server_log)  # a file, or one line saying what to give
    budget = _Budget(float(budget_s))
    server = server_settings(url, api_key=api_key, server_log=server_log, flags=server_flags,
                             timeout_s=budget.timeout(share=0.5))
    levels = plan(server, contexts=contexts, batches=batches, output_tokens=output_tokens,
                  prefill_lengths=prefill_lengths)
    out = Path(out_dir)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "server.json", json.dumps(server, indent=2, default=str) + "\n")
    notes = list(levels["notes"])
    net = dict(api_key=api_key, vocab_size=vocab_size, seed=seed, progress=False)
    total = 1 + passes * sum(len(v) for v in levels["contexts"].values())
    tell = on_level or (lambda text, total: None)
    M = server.get("M_usable")

    def offset():
        if server_log is None:
            return 0
        from llmqueue.bench.steplog import log_offset

        return log_offset(server_log)

    # -- prefill probes: isolated requests, lengths interleaved ---------------------------------
    tell("prefill probes", total)
    lens = np.tile(np.asarray(levels["prefill"], dtype=np.int64), prefill_repeats)
    reqs = RequestArrays(np.arange(len(lens)), np.zeros(len(lens)), lens, np.full(len(lens), PREFILL_OUTPUT_TOKENS))
    off = offset()
    phase = budget.timeout(share=0.25, cap=math.inf)  # every probe (and the warm-up) ends within it
    # one probe alone first: a server that does not answer stops the profile after one timeout,
    # not after one per probe (15 of them, one after another, ran 15 s past a 4-s budget)
    one = RequestArrays(np.arange(1), np.zeros(1), lens[:1], np.full(1, PREFILL_OUTPUT_TOKENS))
    res = _run_bench(url, model, one, out_dir=runs / "prefill-check", concurrency=1, drain_timeout_s=phase,
                     timeout_s=phase, **net)
    if (np.asarray(res.records["status"]) == "ok").any():  # else reported below, as the probes' failure
        res = _run_bench(url, model, reqs, out_dir=runs / "prefill", concurrency=1, warmup_requests=1,
                         drain_timeout_s=phase, timeout_s=phase, **net)
    r = res.records
    ok = (np.asarray(r["status"]) == "ok") & np.isfinite(np.asarray(r["first_token_s"], dtype=np.float64))
    if ok.sum() < 2:
        timed_out = int((np.asarray(r["status"]) == "timeout").sum())
        why = (f"{timed_out} timed out after {phase:.3g} s: the server did not answer" if timed_out else
               res.error or "see " + str(runs / "prefill"))
        raise InputError("url", f"only {int(ok.sum())} of {len(r['status'])} prefill probes were answered ({why})",
                         "check the server and --model, or give a larger --budget")
    ttft = (np.asarray(r["first_token_s"], dtype=np.float64) - np.asarray(r["dispatched_s"], dtype=np.float64))[ok]
    plen = np.asarray(r["prompt_tokens"], dtype=np.int64)[ok]
    pre_y, pre_src, frontend = ttft, "ttft", None
    if server_log is not None:
        steps = _level_steps(runs / "prefill", server_log, off, res, M)
        logged = _logged_prefills(steps, np.asarray(r["dispatched_s"], dtype=np.float64)[ok], plen)
        if logged is not None:
            frontend = float(np.median(ttft - logged))
            pre_y, pre_src = logged, "iteration log"
        else:
            notes.append("prefill probes: the iteration log's prefill steps did not match the probes one to one; "
                         "fitted on TTFT (the frontend delay inside the intercept)")
    points = [{"prompt_tokens": int(L), "ttft_median_s": float(np.median(ttft[plen == L])),
               "prefill_median_s": float(np.median(pre_y[plen == L])), "count": int((plen == L).sum())}
              for L in np.unique(plen)]
    # the line through the lengths' medians (a late probe on a busy machine moves no fit)
    fit = fit_prefill([q["prompt_tokens"] for q in points], [q["prefill_median_s"] for q in points],
                      [q["count"] for q in points])
    prefill = {**fit, "source": pre_src, "frontend_latency_s": frontend, "points": points}

    # -- decode ladders, ``passes`` times over (an engine's speed wanders: pooled passes average it) --
    measured: dict[tuple[int, int], list[dict]] = {}
    skipped: list[str] = []
    ctx_list = [(p, coverage_order(b)) for p, b in levels["contexts"].items()]
    told, out_tok = False, output_tokens
    for k in range(passes):
        pass_end = budget.elapsed() + budget.left() / (passes - k)
        for ci, (p, batch_list) in enumerate(ctx_list):
            share_end = budget.elapsed() + (pass_end - budget.elapsed()) / (len(ctx_list) - ci)
            todo = batch_list if k == 0 else [c for c in batch_list if (p, c) in measured]
            left_out = []
            for c in todo:
                cells_now = pool_cells(measured)
                if cells_now and not told:  # sized by the first step time measured: say how long it takes
                    told = True
                    out_tok = _sized_output(cells_now, ctx_list, passes, output_tokens, prefill, budget, notes)
                    tell(notes[-1], total)
                o_level = level_output(server, p, c, out_tok)
                est = _estimate(cells_now, p, c, o_level, prefill)
                if budget.left() <= 0 or (est is not None and budget.elapsed() + est > share_end):
                    left_out.append(c)  # a smaller level may still fit: the next is tried
                    continue
                tell(f"pass {k + 1}: context {p}, batch {c}", total)
                level_s = max(share_end - budget.elapsed(), 1.0)  # the level's requests end within it
                cell = measure_level(url, model, p, c, o_level, runs / f"ctx{p}-b{c}" / f"pass{k + 1}",
                                     server_log=server_log, M=M, notes=notes, drain_timeout_s=level_s,
                                     timeout_s=level_s, **net)
                if cell is not None:
                    measured.setdefault((p, c), []).append(cell)
            if left_out and k == 0:
                skipped.append(f"context {p}: batches {', '.join(map(str, sorted(left_out)))} (time budget)")
    cells = pool_cells(measured)
    if not cells:
        raise InputError("budget", f"no decode level was measured within {budget_s:g} s",
                         "give a larger --budget or fewer --output-tokens")
    srcs = {c["source"] for c in cells}
    doc = {"format": FORMAT, "version": 1, "url": url, "model": model,
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "source": srcs.pop() if len(srcs) == 1 else "mixed", "output_tokens": int(output_tokens),
           "output_tokens_measured": int(out_tok),
           "decode": sorted(cells, key=lambda c: (c["prompt_tokens"], c["batch"])), "prefill": prefill,
           "repeat_spread": repeat_spread(cells), "skipped": skipped, "notes": notes,
           "budget_s": float(budget_s), "elapsed_s": round(budget.elapsed(), 3),
           "server": {k: v for k, v in server.items() if k != "cache_config_info"}}
    write_atomic(out / PROFILE_FILE, json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def _run_bench(url: str, model: str, reqs, **options):
    """One level's closed loop (:func:`llmqueue.bench.client.run_bench`). Ctrl-C stops the profile:
    the level's records stay in its run directory, and no model is written from a partial ladder."""
    from llmqueue.bench.client import run_bench

    res = run_bench(url, model, reqs, **options)
    if res.interrupted:
        raise KeyboardInterrupt
    return res


def measure_level(url: str, model: str, prompt: int, batch: int, output: int, run_dir, *, server_log=None,
                  M=None, drain_timeout_s: float | None = None, notes: list | None = None, **bench) -> dict | None:
    """One ladder level: ``batch`` requests of ``prompt`` + ``output`` tokens sent together (records
    in ``run_dir``); the decode step at that batch from the gaps while all of them decode, and from
    the server's iteration log when it has at least :data:`MIN_LOG_STEPS` such steps. Returns the
    cell (``median_s`` from the preferred source, ``itl_median_s`` always), or None (noted) when
    fewer than 5 gaps fell in the window."""
    from llmqueue.workload.generate import RequestArrays

    notes = notes if notes is not None else []
    name = Path(run_dir).name
    off = 0
    if server_log is not None:
        from llmqueue.bench.steplog import log_offset

        off = log_offset(server_log)
    c = int(batch)
    reqs = RequestArrays(np.arange(c), np.zeros(c), np.full(c, int(prompt)), np.full(c, int(output)))
    res = _run_bench(url, model, reqs, out_dir=run_dir, concurrency=c, drain_timeout_s=drain_timeout_s, **bench)
    gaps, ctx, _ = level_itl(res.records, res.tokens, int(prompt))
    if len(gaps) < 5:
        notes.append(f"{name}: {len(gaps)} inter-token gaps while all {c} requests decoded; left out")
        return None
    cell = {"prompt_tokens": int(prompt), "batch": c, "context_tokens": float(ctx.mean()),
            **_quartiles(gaps), "source": "inter-token latencies", "itl_median_s": float(np.median(gaps)),
            "_itl": gaps, "_ctx": ctx}
    if server_log is not None:
        steps = _level_steps(Path(run_dir), server_log, off, res, M)
        if steps is not None:
            cyc, el = logged_decode_cycles(steps, c)
            if len(cyc) >= MIN_LOG_STEPS:
                cell.update(_quartiles(cyc), source="iteration log", elapsed_median_s=float(np.median(el)),
                            _cycles=cyc, _elapsed=el)
            else:
                notes.append(f"{name}: {len(cyc)} logged decode steps of {c} sequences; the inter-token "
                             "latencies used")
    return cell


def pool_cells(measured) -> list[dict]:
    """One cell per (prompt, batch) from the repeated measurements of :func:`measure_level`
    (``{(prompt, batch): [cells]}`` or a list of cells): their samples pooled, the iteration log's
    when every pass had it, else the inter-token gaps; the raw sample arrays left out."""
    if not isinstance(measured, dict):
        groups: dict = {}
        for c in measured:
            groups.setdefault((c["prompt_tokens"], c["batch"]), []).append(c)
        measured = groups
    out = []
    for (p, b), cs in measured.items():
        itl = np.concatenate([c["_itl"] for c in cs])
        ctx = np.concatenate([c["_ctx"] for c in cs])
        cell = {"prompt_tokens": int(p), "batch": int(b), "context_tokens": float(ctx.mean()), **_quartiles(itl),
                "source": "inter-token latencies", "itl_median_s": float(np.median(itl)), "passes": len(cs)}
        key = "_itl"
        if all("_cycles" in c for c in cs):
            key = "_cycles"
            cyc = np.concatenate([c["_cycles"] for c in cs])
            el = np.concatenate([c["_elapsed"] for c in cs])
            cell.update(_quartiles(cyc), source="iteration log", elapsed_median_s=float(np.median(el)))
        # each pass's own median: how far the engine's level wandered between passes (the model's noise)
        cell["pass_medians_s"] = [float(np.median(c[key])) for c in cs]
        out.append(cell)
    return out


def _logged_prefills(steps, send: np.ndarray, prompt: np.ndarray) -> np.ndarray | None:
    """The probes' prefill step times from the log: its steps with prompt tokens, in time order,
    one a probe (sent one at a time, in ``send`` order) with the probe's prompt length; None when
    they do not match one to one."""
    if steps is None or not len(steps):
        return None
    pf = np.asarray(steps["prefill_tokens"], dtype=np.int64)
    st = np.asarray(steps["start_s"], dtype=np.float64)
    d = np.asarray(steps["duration_s"], dtype=np.float64)
    has = pf > 0
    o = np.argsort(st[has], kind="stable")
    lp, ld = pf[has][o], d[has][o]
    so = np.argsort(send, kind="stable")
    if len(lp) != len(send) or not (lp == prompt[so]).all():
        return None
    out = np.empty(len(send))
    out[so] = ld
    return out


def predict_table(model, cells: list[dict]) -> list[dict]:
    """Each measured cell beside ``model``'s decode step for it (``model.base(0, batch, batch x context)``)."""
    rows = []
    for c in cells:
        pred = model.base(0, int(c["batch"]), int(round(c["batch"] * c["context_tokens"])))
        rows.append({**c, "model_s": pred, "rel_err": pred / c["median_s"] - 1.0})
    return rows
