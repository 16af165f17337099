"""Where a step-time model misprices an engine: measured step cycles against the model's price,
by decode batch size, from a run's iteration log.

For each run directory (its ``steps.parquet``, the server's iteration log as the benchmark wrote
it), the busy step cycles (:func:`llmqueue.bench.cycles.step_cycles`: start to next start while
the engine went straight on) are grouped by kind and batch: decode-only steps by their number of
sequences ``n`` (bins 1, 2-3, 4-7, ..., 48-64, 65+), and the steps with prompt tokens as one group.
Each group prints its measured mean cycle and, for each step model of the calibration (the profile,
the linear fit, the constant b), the model's price of the same steps relative to it (``+5 %``: the
model says 5 % longer). The KV tokens of a step are taken less half a block a sequence (the context
it attends over), as ``calibrate --profile`` does.

A model whose errors cancel over a saturation run (one scale factor, one line) can still be off at
the batch sizes a lighter load runs; this table shows where.

Usage: python benchmarks/step_pricing.py RUN [RUN ...] --calibration CAL.yaml [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

BINS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 47), (48, 64), (65, 10**9))
MODELS = ("profile", "linear", "constant")


def models_of(cal: dict) -> dict:
    """The calibration's step models by name (those it has)."""
    from llmqueue.engine.step_time import parse_step_time

    out = {}
    for name in MODELS:
        spec = cal.get(f"step_time_{name}") or (cal.get("b") if name == "constant" else None)
        if spec:
            out[name] = parse_step_time(spec)
    return out


def _bin_name(lo: int, hi: int) -> str:
    if lo == hi:
        return f"decode {lo}"
    return f"decode {lo}+" if hi >= 10**9 else f"decode {lo}-{hi}"


def pricing(run_dir, models: dict, block_size: int) -> dict:
    """``{"groups": [...], "steps": n}``: per group, ``n`` steps, ``measured_ms`` and each model's
    relative error on the same steps."""
    from llmqueue.bench.cycles import step_cycles
    from llmqueue.errors import InputError
    from llmqueue.records import read_run

    steps = read_run(run_dir).steps
    if steps is None or not len(steps):
        raise InputError("run", f"{run_dir} has no steps.parquet (benchmark with --server-log)")
    mask, cyc, _ = step_cycles(steps)
    P = np.asarray(steps["prefill_tokens"], dtype=np.int64)
    D = np.asarray(steps["decode_seqs"], dtype=np.int64)
    C = np.maximum(np.asarray(steps["kv_tokens"], dtype=np.int64) - D * (block_size - 1) // 2, 0)
    groups = [(_bin_name(lo, hi), mask & (P == 0) & (D >= lo) & (D <= hi)) for lo, hi in BINS]
    groups.append(("with prompt tokens", mask & (P > 0)))
    rows = []
    for name, sel in groups:
        if not sel.any():
            continue
        took = float(cyc[sel].sum())
        row = {"group": name, "steps": int(sel.sum()), "measured_ms": 1e3 * took / int(sel.sum()),
               "context_per_seq": float(np.mean(C[sel] / np.maximum(D[sel], 1)))}
        for m, model in models.items():
            said = sum(model.base(int(p), int(d), int(c)) for p, d, c in zip(P[sel], D[sel], C[sel]))
            row[m] = said / took - 1.0
        rows.append(row)
    return {"run": str(run_dir), "steps": int(mask.sum()), "groups": rows}


def main(argv=None) -> int:
    from llmqueue.bench.calibrate import load_calibration
    from llmqueue.errors import InputError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        cal = load_calibration(a.calibration)
        models = models_of(cal)
        out = [pricing(r, models, int(cal.get("block_size") or 16)) for r in a.runs]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    for res in out:
        print(f"{res['run']}: {res['steps']} busy steps")
        print("  group                  steps  ctx/seq  measured ms  " + "  ".join(f"{m:>8s}" for m in models))
        for g in res["groups"]:
            errs = "  ".join(f"{100 * g[m]:+7.1f}%" for m in models)
            print(f"  {g['group']:<21s} {g['steps']:6d}  {g['context_per_seq']:7.0f}  {g['measured_ms']:11.1f}  {errs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
