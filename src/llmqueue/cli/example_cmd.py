"""``llmqueue example``: the built-in example, the seeds' worked numbers recomputed end to end.

It runs the analytic core on the settings of the source documents and prints our
numbers beside the ones the documents print, so a user sees in one screen what each
part of the tool computes and how it compares with published results.
"""

from __future__ import annotations

import click

from llmqueue.cli.common import command, fmt, json_option, print_json, print_table

# Nie et al. 2026 (Nie, Si, Zhou, ICML 2026), Table 1: Llama-3-8B on one A100, vLLM v1, chunk 512,
# M = 131,000 tokens. (prompt spec, output spec, b, paper's mu_theory, paper's measured mu_gpu)
SEED004_SETTINGS = [
    ("1:1", "uniform:10:1600", "uniform:10:1600", 0.0372, 3.263, 3.387),
    ("2:1", "uniform:10:2133", "uniform:10:1066", 0.0430, 3.956, 3.650),
    ("1:2", "uniform:10:1066", "uniform:10:2133", 0.0337, 2.902, 2.969),
]
SEED004_M = 131_000
SEED004_CHUNK = 512
SEED004_RATES = (1, 3, 5, 20, 50)

# The Queueing System essay's Little's-law table: (lam req/s, W s, printed L).
SEED000_LITTLE = [(900, 0.120, 108), (900, 0.180, 162), (1050, 0.180, 189)]

# Inference Foundations' worked GPT-3 example: lam = 100 req/s, T_svc(B) = 50 + 0.5 B ms; Table 1's E[T] (ms).
SEED002 = dict(lam=100.0, T_fixed=0.050, t_req=0.0005, sizes=(1, 4, 8, 16, 32))
SEED002_ET_MS = {8: 150.1, 16: 154.5, 32: 234.6}


def build_example() -> dict:
    """Compute every section of the example; returns plain data (also the ``--json`` output)."""
    from llmqueue.hardware import kv_capacity, max_concurrent_requests
    from llmqueue.theory.batch import batch_table
    from llmqueue.theory.kv import kv_stability
    from llmqueue.theory.littles_law import little
    from llmqueue.workload import parse_length

    out: dict = {}
    out["little"] = [
        {"lam": lam, "W_s": W, "L": little(lam=lam, W=W).L, "source_L": printed}
        for lam, W, printed in SEED000_LITTLE
    ]

    cap = kv_capacity("llama-3-8b", "a100-80gb")
    conc = max_concurrent_requests("llama-2-7b", "a100-80gb", 4096)
    out["kv"] = {
        "llama-3-8b_on_a100-80gb": {"kv_bytes_per_token": cap.kv_bytes_per_token, "M_tokens": cap.M,
                                    "num_blocks": cap.num_blocks,
                                    "gpu_memory_utilization": cap.gpu_memory_utilization},
        "llama-2-7b_4096_on_a100-80gb": {"kv_bytes_per_request": conc.kv_bytes_per_request,
                                         "max_concurrent_requests": conc.B, "source_says_about": 24},
    }

    rows = []
    for name, p, o, b, paper_theory, paper_measured in SEED004_SETTINGS:
        r = kv_stability(M=SEED004_M, b=b, chunk=SEED004_CHUNK, prompt=parse_length(p, field="prompt"),
                         output=parse_length(o, field="output"))
        verdicts = {str(lam): kv_stability(M=SEED004_M, b=b, chunk=SEED004_CHUNK,
                                           prompt=parse_length(p), output=parse_length(o), lam=lam).verdict
                    for lam in SEED004_RATES}
        rows.append({"setting": name, "prompt": p, "output": o, "b": b, "mu": r.mu,
                     "mu_closed_form": r.mu_closed_form, "paper_mu_theory": paper_theory,
                     "paper_mu_measured": paper_measured, "gap_vs_measured": abs(r.mu - paper_measured) / paper_measured,
                     "delta": r.delta, "verdicts": verdicts})
    out["stability"] = {"M": SEED004_M, "chunk": SEED004_CHUNK, "settings": rows}

    t = batch_table(**SEED002)
    out["batch"] = {
        "lam": SEED002["lam"], "T_fixed_ms": 50.0, "t_req_ms": 0.5,
        "B_min_stability": t.b_min_stability.B_min, "B_min_rho_0.75": t.b_min_target.B_min,
        "B_min_rho_0.75_int": t.b_min_target.B_min_int,
        "rows": [{"B": r.B, "stable": r.stable, "rho": r.rho, "mean_response_ms": r.W * 1e3,
                  "source_mean_response_ms": SEED002_ET_MS.get(r.B),
                  "refined_mean_response_ms": r.W_refined * 1e3} for r in t.rows],
    }
    out["simulation"] = simulate_seed004()
    return out


SIM_RATES = (3.0, 50.0)
SIM_DURATION_S = 1200.0


def simulate_seed004() -> list[dict]:
    """Nie et al.'s 1:1 setting simulated at a stable rate and at saturation (lam = 50)."""
    from llmqueue.engine.config import EngineConfig
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.simulate import SimSpec, run_simulation
    from llmqueue.workload import Workload

    name, p, o, b, paper_theory, paper_measured = SEED004_SETTINGS[0]
    rows = []
    for lam in SIM_RATES:
        spec = SimSpec(engine=EngineConfig.from_capacity(SEED004_M, max_num_batched_tokens=SEED004_CHUNK),
                       step_time=parse_step_time(b), workload=Workload(f"poisson:{lam}", prompt=p, output=o),
                       duration_s=SIM_DURATION_S, seed=1, warmup_s=200.0)
        r = run_simulation(spec)
        s, th = r.summary, r.theory
        rows.append({"setting": name, "lam": lam, "throughput": s["request_throughput"], "mu_theory": th["mu"],
                     "paper_mu_measured": paper_measured, "verdict": s["verdict"], "theory_verdict": th["verdict"],
                     "p99_ttft_ms": s.get("p99_ttft_ms"), "mean_tpot_ms": s.get("mean_tpot_ms"),
                     "little_gap": s.get("little_gap"), "wall_s": s["wall_s"]})
    return rows


@command("example")
@json_option
def example(as_json):
    """Recompute the source documents' worked numbers and print them beside the published ones.

    Sections: Little's law (the Queueing System essay), KV capacity (the Continuous Batching essay and Nie et al. 2026), the KV-memory stability
    threshold mu = M/(b E[g]) with verdicts (Nie et al. 2026, Table 1), the batch-service model with
    its Erlang-B/D/1 refinement (Inference Foundations, Table 1), and a step-level simulation of Nie et al.'s
    setting beside the theory and the paper's measurement.
    """
    d = build_example()
    if as_json:
        print_json(d)
        return
    print_table(["lam (req/s)", "W (s)", "L = lam W", "the Queueing System essay says"],
                [[r["lam"], r["W_s"], r["L"], r["source_L"]] for r in d["little"]],
                title="1. Little's law: requests in flight (the Queueing System essay)")
    k = d["kv"]["llama-3-8b_on_a100-80gb"]
    c = d["kv"]["llama-2-7b_4096_on_a100-80gb"]
    click.echo("")
    click.echo("2. KV capacity (hardware catalog; gpu_memory_utilization 0.9, 1 GiB reserve)")
    click.echo(f"   Llama-3-8B on A100 80GB: {fmt(k['kv_bytes_per_token'])} B/token, M = {fmt(k['M_tokens'])} tokens "
               f"(Nie et al. 2026 used an effective M = 131,000)")
    click.echo(f"   Llama-2-7B, 4096-token requests: {c['kv_bytes_per_request'] / 1e9:.2f} GB each, "
               f"{c['max_concurrent_requests']} fit on an A100 80GB after weights (the Continuous Batching essay says about 24)")
    click.echo("")
    s = d["stability"]
    print_table(["P/D", "b (s)", "mu (ours)", "paper theory", "paper measured", "gap vs measured",
                 *[f"lam={x}" for x in SEED004_RATES]],
                [[r["setting"], r["b"], f"{r['mu']:.3f}", f"{r['paper_mu_theory']:.3f}",
                  f"{r['paper_mu_measured']:.3f}", f"{100 * r['gap_vs_measured']:.1f}%",
                  *[r["verdicts"][str(x)] for x in SEED004_RATES]] for r in s["settings"]],
                title=f"3. KV-memory stability mu = M/(b E[g]), M = {s['M']:,}, chunk {s['chunk']} (Nie et al. 2026)")
    click.echo("")
    bt = d["batch"]
    print_table(["B", "rho", "E[T] ms (M/D/1 on batches)", "Inference Foundations prints", "E[T] ms (Erlang-B/D/1)"],
                [[r["B"], f"{100 * r['rho']:.1f}%" + ("" if r["stable"] else " unstable"),
                  f"{r['mean_response_ms']:.1f}" if r["stable"] else "inf",
                  r["source_mean_response_ms"] if r["source_mean_response_ms"] is not None else "-",
                  f"{r['refined_mean_response_ms']:.1f}" if r["stable"] else "inf"] for r in bt["rows"]],
                title=f"4. Batch-service model T_svc(B) = 50 + 0.5 B ms at lam = 100 req/s (Inference Foundations); "
                      f"B_min(rho=0.75) = {bt['B_min_rho_0.75']:.2f} -> {bt['B_min_rho_0.75_int']}")
    click.echo("   The source treats batches as a Poisson stream (M/D/1); batches formed from Poisson requests")
    click.echo("   arrive as an Erlang-B stream, hence the lower refined E[T].")
    click.echo("")
    print_table(["lam (req/s)", "simulated throughput", "theory mu", "paper measured", "simulated verdict",
                 "theory verdict", "p99 TTFT ms", "mean TPOT ms"],
                [[r["lam"], f"{r['throughput']:.3f}", f"{r['mu_theory']:.3f}", f"{r['paper_mu_measured']:.3f}",
                  r["verdict"], r["theory_verdict"], r["p99_ttft_ms"], r["mean_tpot_ms"]] for r in d["simulation"]],
                title=f"5. Step-level simulation of Nie et al.'s 1:1 setting ({SIM_DURATION_S:.0f} s, vLLM v1 scheduling, "
                      f"chunk {SEED004_CHUNK}, M = {SEED004_M:,})")
