"""An OpenAI-compatible streaming server over transformers' continuous batching, for a GPU run.

The GPU machines lent to this project have PyTorch and transformers but no vLLM. This server puts
transformers' own continuous-batching engine (``ContinuousBatchingManager``: paged KV cache,
decode-first FIFO scheduler, chunked prefill under a token budget) behind the part of vLLM's
OpenAI API that ``llmqueue bench`` and ``llmqueue profile`` use:

- ``POST /v1/completions`` with ``prompt: [token ids]``, ``max_tokens``, ``stream: true`` and
  ``stream_options.include_usage``: one server-sent event per generated token (vLLM's chunk
  layout), then a usage chunk and ``data: [DONE]``. End-of-sequence is off (a random-weight
  model's output would otherwise stop anywhere): every request gets exactly ``max_tokens`` tokens,
  as ``ignore_eos`` gives on vLLM. ``stream: false`` gets one JSON body.
- ``GET /health``, ``GET /v1/models`` (with ``max_model_len``).

The engine's step log, in vLLM's ``--enable-logging-iteration-details`` line format with the
epoch prefix of ``VLLM_LOGGING_PREFIX='%(created).6f '`` (``--step-log FILE``), so that the
project's step-log reader takes it as it takes vLLM's: one line per engine iteration, stamped at
the iteration's end, with its context (prefill) requests and tokens, generation (decode)
requests, the iteration's elapsed time (scheduling, the forward pass, sampling and the state
update: the whole engine cycle) and the KV cache's used fraction. A context request is one that
had generated no token when scheduled (its prompt tokens, or a chunk of them, are in the step).

The model: ``--model llama-3.1-8b`` (Llama-3.1-8B's shape, bf16, random weights, built on the
device with no download) or ``tiny:HIDDENxLAYERS`` (a small Llama for a CPU test). No tokenizer:
prompts are token ids, generated text is a placeholder per token.

What this engine is not (stated with every result): no CUDA graphs and no flash attention (the
paged SDPA path, which needs an attention mask, so transformers turns graphs and asynchronous
batching off), one Python thread for the engine loop sharing the GIL with the HTTP server, no
/metrics, and under KV pressure it offloads or recomputes differently from vLLM (the GPU protocol
sizes the cache so that it never binds: the engine is slot-bound by ``--max-num-seqs``).

Usage::

    python benchmarks/hf_server.py --model llama-3.1-8b --device cuda --port 8011 \\
        --max-num-seqs 64 --max-num-batched-tokens 2048 --block-size 256 --num-blocks 512 \\
        --step-log server.log

prints ``hf-server listening on http://127.0.0.1:PORT`` when ready. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

READY_PREFIX = "hf-server listening on "

LLAMA_31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                   rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                   bos_token_id=128000, eos_token_id=128001)


def model_config(name: str) -> dict:
    """The LlamaConfig keyword arguments of ``--model``."""
    if name == "llama-3.1-8b":
        return dict(LLAMA_31_8B)
    if name.startswith("tiny:"):
        hidden, layers = (int(x) for x in name[5:].split("x"))
        return dict(vocab_size=4096, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                    num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                    max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    bos_token_id=1, eos_token_id=2)
    raise SystemExit(f"error: --model: unknown model {name!r} (llama-3.1-8b or tiny:HIDDENxLAYERS)")


def build_model(name: str, device: str, dtype: str, seed: int):
    """A random-weight Llama of ``name``'s shape on ``device`` (initialized there: no download)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    cfg = LlamaConfig(**model_config(name))
    cfg._attn_implementation = "sdpa"
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval(), cfg


class StepLog:
    """The engine's iterations as vLLM iteration-detail lines (see the module docstring)."""

    def __init__(self, path: str | None, cache_blocks):
        self.f = open(path, "a", buffering=1, encoding="utf-8") if path else None
        self.n = 0
        self.pid = os.getpid()
        self.cache_blocks = cache_blocks  # () -> (free, total)
        self.t0 = 0.0
        self.comp = (0, 0, 0)

    def scheduled(self, future_states) -> None:
        ctx_r = ctx_t = gen = 0
        for fs in future_states or ():
            if fs.state.generated_len() == 0:
                ctx_r += 1
                ctx_t += fs.query_length
            else:
                gen += 1
        self.comp = (ctx_r, ctx_t, gen)

    def ended(self) -> None:
        if self.f is None:
            return
        t1 = time.time()
        ms = (t1 - self.t0) * 1e3
        free, total = self.cache_blocks()
        use = 100.0 * (1.0 - free / total) if total else 0.0
        ctx_r, ctx_t, gen = self.comp
        self.n += 1
        self.f.write(f"{t1:.6f} (APIServer pid={self.pid}) INFO {time.strftime('%m-%d %H:%M:%S', time.localtime(t1))} "
                     f"[loggers.py:199] Engine 000: Iteration({self.n}): {ctx_r} context requests, {ctx_t} context "
                     f"tokens, {gen} generation requests, {gen} generation tokens, iteration elapsed time: "
                     f"{ms:.2f} ms, KV cache usage: {use:.1f}%\n")


def make_manager(model, a, steplog_path: str | None):
    """transformers' continuous-batching manager with ``a``'s engine settings, its iterations logged."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=16, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=a.block_size, num_blocks=a.num_blocks,
                                  max_batch_tokens=a.max_num_batched_tokens, max_requests_per_batch=a.max_num_seqs,
                                  allow_block_sharing=False, use_cuda_graph=False, use_async_batching=False,
                                  scheduler_type="fifo", seed=a.seed)
    mgr = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    holder: dict = {}

    def blocks():
        bp = holder.get("bp")
        if bp is None:
            return 0, 0
        c = bp.cache
        return c.get_num_free_blocks(), c.num_blocks

    log = StepLog(steplog_path, blocks)
    orig_create = getattr(mgr, "_create_batch_processor", None)
    if orig_create is None:  # another transformers: serve without a step log rather than not at all
        print("warning: this transformers has no ContinuousBatchingManager._create_batch_processor: no step log",
              file=sys.stderr, flush=True)
        return mgr, holder

    def create():  # wrap the engine loop's processor: time each iteration, note its composition
        bp = orig_create()
        holder["bp"] = bp
        sched, prep, upd = bp.scheduler.schedule_batch, bp.prepare_next_batch, bp.update_batch

        def schedule_batch(token_budget, cache_budget):
            res = sched(token_budget, cache_budget)
            log.scheduled(res[0])
            return res

        def prepare_next_batch():
            log.t0 = time.time()
            return prep()

        def update_batch():
            upd()
            log.ended()

        bp.scheduler.schedule_batch = schedule_batch
        bp.prepare_next_batch = prepare_next_batch
        bp.update_batch = update_batch
        return bp

    mgr._create_batch_processor = create
    return mgr, holder


def serve(a) -> None:
    from aiohttp import web

    t_start = time.time()
    model, cfg = build_model(a.model, a.device, a.dtype, a.seed)
    if a.device == "cuda":
        import torch

        torch.cuda.synchronize()
    t_model = time.time() - t_start
    mgr, holder = make_manager(model, a, a.step_log)
    mgr.start()
    name = a.served_model_name or a.model
    created = int(time.time())
    m = json.dumps(name)
    cmpl = ('data: {"id":"cmpl-%s","object":"text_completion","created":' + str(created) + ',"model":' + m
            + ',"choices":[{"index":0,"text":" t","logprobs":null,"finish_reason":%s,"stop_reason":null}],'
            '"usage":null}\n\n')
    usage = ('data: {"id":"cmpl-%s","object":"text_completion","created":' + str(created) + ',"model":' + m
             + ',"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,'
             '"prompt_tokens_details":null}}\n\n')
    counter = {"n": 0, "running": 0, "done": 0, "failed": 0}
    lock = threading.Lock()

    def error(status: int, message: str):
        return web.json_response({"object": "error", "message": message, "type": "BadRequestError",
                                  "param": None, "code": status}, status=status)

    async def completions(request):
        try:
            body = json.loads(await request.read())
        except ValueError:
            return error(400, "request body is not JSON")
        ids = body.get("prompt")
        if not (isinstance(ids, list) and ids and all(isinstance(x, int) for x in ids)):
            return error(400, "prompt must be a list of token ids")
        if any(x < 0 or x >= cfg.vocab_size for x in ids):
            return error(400, f"token ids must be in [0, {cfg.vocab_size})")
        n_out = int(body.get("max_tokens") or 16)
        if len(ids) + n_out > a.max_model_len:
            return error(400, f"This model's maximum context length is {a.max_model_len} tokens. However, you "
                         f"requested {len(ids) + n_out} tokens ({len(ids)} in the messages, {n_out} in the "
                         "completion). Please reduce the length of the messages or completion.")
        with lock:
            counter["n"] += 1
            rid = str(counter["n"])
        q: asyncio.Queue = asyncio.Queue()
        mgr.register_result_handler(rid, q.put_nowait)
        if mgr.add_request(ids, request_id=rid, max_new_tokens=n_out, streaming=True, eos_token_id=-1) is None:
            return error(503, "the engine is not accepting requests")
        stream = bool(body.get("stream"))
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
        sent = 0
        counter["running"] += 1
        try:
            while True:
                out = await q.get()
                if out.error:
                    counter["failed"] += 1
                    if stream:
                        await resp.write(('data: {"object":"error","message":%s}\n\n' % json.dumps(out.error)).encode())
                        await resp.write_eof()
                        return resp
                    return error(500, out.error)
                n = len(out.generated_tokens)
                if stream and n > sent:
                    await resp.write("".join(cmpl % (rid, '"length"' if i == n_out - 1 else "null")
                                             for i in range(sent, n)).encode())
                sent = max(sent, n)
                if out.is_finished():
                    break
            counter["done"] += 1
            if not stream:
                return web.json_response({"id": f"cmpl-{rid}", "object": "text_completion", "created": created,
                                          "model": name, "choices": [{"index": 0, "text": " t" * sent,
                                                                      "finish_reason": "length"}],
                                          "usage": {"prompt_tokens": len(ids), "completion_tokens": sent,
                                                    "total_tokens": len(ids) + sent}})
            if with_usage:
                await resp.write((usage % (rid, len(ids), len(ids) + sent, sent)).encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except ConnectionResetError:  # the client went away (e.g. cancelled at a drain cap): abort, as vLLM does
            mgr.cancel_request(rid)
            counter["client_gone"] = counter.get("client_gone", 0) + 1
            return resp
        except asyncio.CancelledError:
            mgr.cancel_request(rid)
            raise
        finally:
            counter["running"] -= 1

    async def health(request):
        return web.Response(text="")

    async def models(request):
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "hf-server",
             "max_model_len": a.max_model_len}]})

    async def stats(request):
        bp = holder.get("bp")
        return web.json_response({**counter, "model_build_s": t_model,
                                  "num_blocks": bp.cache.num_blocks if bp else None,
                                  "block_size": bp.cache.block_size if bp else None})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health),
                    web.get("/v1/models", models), web.get("/stats", stats)])

    async def main():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, a.host, a.port, backlog=4096)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print(f"model built in {t_model:.1f} s", file=sys.stderr, flush=True)
        print(f"{READY_PREFIX}http://{a.host}:{port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(main())
    finally:
        mgr.stop(block=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-8b", help="llama-3.1-8b or tiny:HIDDENxLAYERS")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--num-blocks", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--step-log", default=None, help="write the engine's iterations here (vLLM's line format)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("error: --host: loopback addresses only (127.0.0.1)")
    serve(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
