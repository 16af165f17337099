"""matched_speed: the engine's speed between two runs, on steps of the same composition."""

import numpy as np
import pytest

from llmqueue.bench.calibrate import fit_linear, run_speed
from llmqueue.bench.speed import matched_speed


def _truth(P, D, C):
    """An engine whose step time is not linear in the batch: decode cost grows as D^1.5."""
    return 0.012 + 0.0009 * P + 0.0004 * D ** 1.5 + 1e-7 * C


def _run(decode, prefill, ctx, slow=1.0, seed=0):
    """Back-to-back steps (no idle gaps) of the given compositions, each ``slow`` times the
    truth, with 3 % per-step noise."""
    rng = np.random.default_rng(seed)
    d = np.asarray(decode, dtype=float)
    p = np.asarray(prefill, dtype=float)
    c = np.asarray(ctx, dtype=float)
    dur = slow * _truth(p, d, c) * rng.lognormal(0.0, 0.03, len(d))
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    return {"start_s": start, "duration_s": dur, "prefill_tokens": p, "decode_seqs": d, "kv_tokens": c}


def _calibration_run(rng):
    # a saturation run: mostly full batches (40-64 sequences, long contexts), a drain down to 1
    n = 6000
    d = np.where(rng.random(n) < 0.85, rng.integers(40, 65, n), rng.integers(1, 40, n))
    p = np.where(rng.random(n) < 0.2, rng.integers(1, 256, n), 0)
    return d, p, 100 * d


def _load_run(rng):
    # a run at half the capacity: small batches, short contexts
    n = 3000
    d = rng.integers(1, 30, n)
    p = np.where(rng.random(n) < 0.3, rng.integers(1, 256, n), 0)
    return d, p, 100 * d


def test_matched_speed_finds_the_engine_speed_without_a_model():
    rng = np.random.default_rng(1)
    ref = _run(*_calibration_run(rng), seed=2)
    comp = _load_run(rng)
    same = _run(*comp, slow=1.0, seed=3)
    slower = _run(*comp, slow=1.25, seed=4)
    m1, m2 = matched_speed(same, ref), matched_speed(slower, ref)
    assert m1["speed"] == pytest.approx(1.0, abs=0.03)
    assert m2["speed"] == pytest.approx(1.25, rel=0.03)
    assert m1["cells"] >= 10 and 0.3 < m1["share"] <= 1.0
    # the linear model fitted on the saturation run's steps extrapolates to the small batches:
    # against it the same engine reads as slower or faster than it was, the matched ratio does not
    lin = fit_linear(ref)
    rs = run_speed(same, lin)
    assert abs(rs - 1.0) > 0.05, rs
    assert abs(m1["speed"] - 1.0) < abs(rs - 1.0) / 3


def test_matched_speed_needs_shared_compositions():
    ref = _run(np.full(500, 60), np.zeros(500), np.full(500, 6000))
    other = _run(np.full(500, 5), np.zeros(500), np.full(500, 500))
    assert matched_speed(other, ref) is None
    # too few steps in the shared cell
    assert matched_speed(_run(np.full(3, 60), np.zeros(3), np.full(3, 6000)), ref) is None
