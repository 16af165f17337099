"""The roofline's tensor- and pipeline-parallel step times against published figures (issue 39, item 2).

1. **Decode steps of Llama-3.1-70B on H100 SXM at TP 1/2/4/8** against Lambda's vLLM benchmark
   (github.com/LambdaLabsML/vllm-benchmark, commit a4f9f4371a1ccac781293837fce2bce0cc6d25cc,
   ``results/prompt_10/{N}xH100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp{N}_len2048.json``):
   vLLM 0.6.0, ``neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8`` (fp8 weights, 16-bit KV),
   ``--max-model-len 2048``, 10 ShareGPT prompts sent at once (``request_rate inf``), benchmark_serving.
   Its stream carries 10 tokens a chunk (multi-step scheduling: request 0's 120 tokens arrive in 12
   chunks after the first), so a decode step lasts the inter-chunk time over 10. Two phases are read
   off the per-chunk times (``itls``): *early*, chunks 2-11 of request 0 (median), when about 7
   requests decode (8 start, one ends after 6 tokens, another near token 70) over prompts of 91
   tokens on average, ~150 tokens of context each; *late*, chunks 26-60 of request 1 (median), when
   only the two longest requests (658-770 tokens) are left, ~430 tokens of context each.
2. **One all-reduce (and one send) on an H100 DGX** against Vidur's profile (github.com/microsoft/vidur,
   commit 7d47513, ``data/profiling/network/h100_dgx/all_reduce.csv`` and ``send_recv.csv``:
   NCCL through torch.distributed; the median of the five profiled sizes nearest to the message):
   Vidur prices a step's communication the same way (two all-reduces a layer, one send a stage
   boundary, ``S = tokens x hidden x 2`` bytes) but by a regression on these profiled times, where
   llmqueue uses the alpha-beta closed form.
3. **PP 2**: the roofline's step at TP 4 x PP 2 and TP 1 x PP 2 beside TP 4 and TP 2 (no published
   per-step figure for Llama-3.1-70B with pipeline parallelism on H100 was found: stated, not compared).

The roofline keeps its defaults (mfu 0.6, mbu 0.8, overhead 2 ms, link efficiency 0.8, the
catalog's 25 us per collective): nothing is fitted to the figures compared here.

Usage: python benchmarks/parallel_roofline.py [--json]
"""

from __future__ import annotations

import argparse
import json

from llmqueue.engine.step_time import roofline_model
from llmqueue.hardware import get_gpu, get_model
from llmqueue.hardware.interconnect import ACT_BYTES, LINK_EFFICIENCY, allreduce_time, parallel_comm, send_time

MODEL, GPU = "llama-3.1-70b", "h100-sxm"
#: Lambda's per-chunk times (s, 10 decode steps each): {tp: (early median, late median)}, read from
#: the files named in the module docstring (request 0 chunks 2-11; request 1 chunks 26-60)
LAMBDA_CHUNK_S = {1: (0.31545, 0.3077), 2: (0.1935, 0.1884), 4: (0.12918, 0.1240), 8: (0.09966, 0.0939)}
#: the phases' compositions (decoding sequences n, total context C tokens)
PHASES = {"early": (7, 7 * 150), "late": (2, 2 * 430)}
#: Vidur's profiled H100 DGX medians (us; the CSV holds ms) by tokens per message (x 16 KiB): all-reduce per tp,
#: and send/recv
VIDUR_US = {2: {1: 7.0, 8: 11.0, 64: 43.0, 512: 46.0, 4096: 245.0},
            4: {1: 38.0, 8: 41.0, 64: 42.0, 512: 62.0, 4096: 317.0},
            8: {1: 35.0, 8: 21.0, 64: 33.0, 512: 74.0, 4096: 346.0},
            "send": {1: 7.0, 8: 8.0, 64: 10.0, 512: 30.0, 4096: 192.0}}


def steps() -> list[dict]:
    rows = []
    for tp, chunks in LAMBDA_CHUNK_S.items():
        m = roofline_model(MODEL, GPU, tensor_parallel_size=tp, weight_dtype="fp8")
        comm = parallel_comm(MODEL, GPU, tensor_parallel_size=tp)
        for (phase, (n, C)), chunk in zip(PHASES.items(), chunks):
            pub = chunk / 10 * 1e3
            ours = float(m.base(0, n, C)) * 1e3
            no_comm = ours - comm.seconds(n) * 1e3
            rows.append({"tp": tp, "phase": phase, "n": n, "C": C, "published_ms": pub, "roofline_ms": ours,
                         "error_pct": 100 * (ours / pub - 1), "without_comm_ms": no_comm,
                         "without_comm_error_pct": 100 * (no_comm / pub - 1), "comm_ms": comm.seconds(n) * 1e3})
    return rows


def collectives() -> list[dict]:
    g = get_gpu(GPU)
    h = get_model(MODEL).hidden_size
    bw = g.link_bytes_per_s * LINK_EFFICIENCY
    rows = []
    for key, by_tokens in VIDUR_US.items():
        for T, vidur in by_tokens.items():
            S = T * h * ACT_BYTES
            ours = (send_time(S=S, bw=bw, alpha=g.link_latency_s) if key == "send"
                    else allreduce_time(S=S, tp=key, bw=bw, alpha=g.link_latency_s))
            rows.append({"collective": "send" if key == "send" else f"all-reduce tp{key}", "tokens": T,
                         "bytes": S, "vidur_us": vidur, "alpha_beta_us": ours * 1e6,
                         "ratio": ours * 1e6 / vidur})
    return rows


def pipeline() -> list[dict]:
    from llmqueue.hardware import kv_capacity

    rows = []
    for tp, pp in ((2, 1), (1, 2), (4, 1), (4, 2), (8, 1)):
        m = roofline_model(MODEL, GPU, tensor_parallel_size=tp, pipeline_parallel_size=pp)
        cap = kv_capacity(MODEL, GPU, tensor_parallel_size=tp, pipeline_parallel_size=pp)
        rows.append({"tp": tp, "pp": pp, "gpus": tp * pp, "M": cap.M,
                     "weights_gib_per_gpu": cap.weight_bytes_per_gpu / 2**30,
                     "decode8_ms": float(m.base(0, 8, 8 * 1000)) * 1e3,
                     "prefill2048_ms": float(m.base(2048, 0, 0)) * 1e3})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"steps": steps(), "collectives": collectives(), "pipeline": pipeline()}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("Llama-3.1-70B (fp8 weights) decode step on H100 SXM: Lambda's vLLM 0.6.0 figures against the roofline")
    print(f"{'tp':>3} {'phase':>6} {'n':>3} {'C':>5} {'published ms':>13} {'roofline ms':>12} {'error':>7} "
          f"{'no-comm ms':>11} {'error':>7} {'comm ms':>8}")
    for r in out["steps"]:
        print(f"{r['tp']:>3} {r['phase']:>6} {r['n']:>3} {r['C']:>5} {r['published_ms']:>13.2f} {r['roofline_ms']:>12.2f} "
              f"{r['error_pct']:>+6.1f}% {r['without_comm_ms']:>11.2f} {r['without_comm_error_pct']:>+6.1f}% "
              f"{r['comm_ms']:>8.2f}")
    print("\nOne collective on an H100 DGX: Vidur's profiled NCCL medians against the alpha-beta closed form")
    print(f"{'collective':>15} {'tokens':>7} {'bytes':>10} {'Vidur us':>9} {'alpha-beta us':>14} {'ratio':>6}")
    for r in out["collectives"]:
        print(f"{r['collective']:>15} {r['tokens']:>7} {r['bytes']:>10} {r['vidur_us']:>9.1f} {r['alpha_beta_us']:>14.1f} "
              f"{r['ratio']:>6.2f}")
    print("\nPipeline parallelism (bf16 weights): the roofline's step and the KV capacity (no published figure)")
    print(f"{'tp':>3} {'pp':>3} {'gpus':>5} {'M tokens':>10} {'weights GiB/GPU':>16} {'decode n=8 ms':>14} "
          f"{'prefill 2048 ms':>16}")
    for r in out["pipeline"]:
        print(f"{r['tp']:>3} {r['pp']:>3} {r['gpus']:>5} {r['M']:>10,} {r['weights_gib_per_gpu']:>16.1f} "
              f"{r['decode8_ms']:>14.2f} {r['prefill2048_ms']:>16.2f}")


if __name__ == "__main__":
    main()
