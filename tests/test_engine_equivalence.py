"""The fast replica must produce the same records as the plain reference stepper.

Randomized scenarios cover chunked and unchunked prefill, tiny KV caches (preemption),
token budgets that bind, every policy and preemption mode, noisy, drifting and
composition-dependent step times, client timeouts, retries, admission limits and horizons.
"""

import numpy as np
import pytest

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.options import SimOptions
from llmqueue.workload import Workload

FLOAT_COLS = ("arrival_s", "dispatched_s", "first_scheduled_s", "first_token_s", "finish_s")
EXACT_COLS = ("request_id", "prompt_tokens", "output_tokens", "status", "preemptions", "attempt", "class")


def _scenario(seed: int):
    rng = np.random.default_rng(seed)
    block = int(rng.choice([1, 4, 16]))
    max_len = int(rng.choice([64, 300, 2000]))
    prompt = f"uniform:1:{max_len}"
    output = f"uniform:1:{int(rng.choice([5, 50, 400]))}"
    # KV from "barely fits one request" to "plenty"
    kv_tokens = int(rng.choice([max_len + 400, 2 * max_len + 800, 20 * max_len + 8000]))
    chunked = bool(rng.random() < 0.75)
    budget = int(rng.choice([32, 128, 512, 4096])) if chunked else int(rng.choice([2500, 5000]))
    policy = str(rng.choice(["fcfs", "fcfs", "priority", "sjf", "srpt"]))
    cfg = EngineConfig.from_capacity(
        kv_tokens, block_size=block, max_num_batched_tokens=budget,
        max_num_seqs=int(rng.choice([1, 3, 16, 256])), enable_chunked_prefill=chunked,
        long_prefill_token_threshold=int(rng.choice([0, 0, 40])), policy=policy,
        preemption="lowest-priority" if policy == "priority" and rng.random() < 0.5 else "newest",
        max_waiting=int(rng.choice([0, 0, 20])), max_queue_time_s=float(rng.choice([0, 0, 30])),
        class_priority={"a": 0, "b": 1},
        class_max_waiting={"b": 8} if rng.random() < 0.3 else {},
        class_max_queue_time_s={"a": 3.0} if rng.random() < 0.3 else {})
    step = str(rng.choice(["0.02", "exp:0.02", "linear:c0=0.005:prefill=2e-5:decode=3e-4:ctx=1e-7",
                           "linear:c0=0.01:decode=1e-4:noise=gamma:cv=0.5", "0.02:drift=0.3:span=0.7",
                           "linear:c0=0.005:prefill=2e-5:decode=3e-4:ctx=1e-7:drift=0.2:span=1.3:noise=exp"]))
    rate = float(rng.choice([2, 10, 40]))
    wa = Workload(f"poisson:{rate}", prompt=prompt, output=output, class_name="a").generate(seed=seed, n=150)
    wb = Workload(f"gamma:{rate / 2}:cv=2", prompt=prompt, output=output, class_name="b").generate(seed=seed + 1000, n=100)
    from llmqueue.workload.generate import RequestArrays
    reqs = RequestArrays.merge(wa, wb)
    retry = None
    if rng.random() < 0.4:
        def retry(rid, attempt, status, t, _n=int(rng.choice([2, 3]))):
            return t + 0.5 * attempt if attempt < _n and status in ("rejected", "timeout") else None
    opts = SimOptions(horizon_s=float(rng.choice([1e9, 20.0])), seed=seed,
                      timeout_s={"b": float(rng.choice([2.0, 60.0]))} if rng.random() < 0.5 else {},
                      ttft_timeout_s={"a": float(rng.choice([1.0, 5.0]))} if rng.random() < 0.3 else {},
                      retry=retry, sample_dt=0.5,
                      predicted_output=np.asarray(reqs.output_tokens) * rng.uniform(0.5, 1.5, len(reqs)))
    tier = np.random.default_rng(seed + 8888)  # a host KV tier, on its own stream
    if tier.random() < 0.4:
        import dataclasses

        cfg = dataclasses.replace(cfg, kv_offload_tokens=int(kv_tokens * tier.choice([0.3, 1.0, 5.0])),
                                  kv_offload_s_per_token=float(tier.choice([1e-6, 1e-4])))
    if np.random.default_rng(seed + 7777).random() < 0.35:  # its own stream: the draws above stay as they were
        from llmqueue.workload.patience import Patience

        opts.patience = {"a": Patience.parse("exp:2").bind(seed), "b": Patience.parse("uniform:0.5:4").bind(seed)}
    return cfg, step, reqs, opts


def _compare(a, b):
    ra, rb = a.requests, b.requests
    assert len(ra["request_id"]) == len(rb["request_id"])
    for c in EXACT_COLS:
        assert (ra[c] == rb[c]).all(), c
    for c in FLOAT_COLS:
        x, y = ra[c], rb[c]
        assert (np.isnan(x) == np.isnan(y)).all(), c
        m = ~np.isnan(x)
        np.testing.assert_allclose(x[m], y[m], rtol=1e-9, atol=1e-7, err_msg=c)
    assert a.num_steps == b.num_steps
    sa, sb = a.steps, b.steps
    assert sa["steps"].sum() == sb["steps"].sum() == a.num_steps
    np.testing.assert_allclose(sa["duration_s"].sum(), sb["duration_s"].sum(), rtol=1e-9)
    assert (sa["prefill_tokens"].sum(), (sa["decode_seqs"] * sa["steps"]).sum()) == \
        (sb["prefill_tokens"].sum(), sb["decode_seqs"].sum())
    # the time series agree too (same sample times, same state)
    ta, tb = a.timeseries, b.timeseries
    np.testing.assert_allclose(ta["t_s"], tb["t_s"])
    for c in ("num_waiting", "num_running", "kv_tokens"):
        assert (ta[c] == tb[c]).all(), c


@pytest.mark.parametrize("seed", [*range(40), 10136])  # 10136: an epoch admitting two requests in one
def test_fast_path_equals_reference(seed):                 # step under SJF (their running order decides a victim)
    cfg, step, reqs, opts = _scenario(seed)
    fast = simulate(cfg, step, reqs, options=opts)
    ref = simulate(cfg, step, reqs, options=opts, reference=True)
    _compare(fast, ref)


def test_fast_path_jumps_decode_stretches():
    # a composition-dependent step time: no vectorized epochs, only decode stretches
    reqs = Workload("poisson:2", prompt="uniform:10:200", output="uniform:200:400").generate(seed=3, n=300)
    cfg = EngineConfig.from_capacity(200_000, max_num_batched_tokens=2048)
    step = "linear:c0=0.01:decode=1e-5"
    fast = simulate(cfg, step, reqs)
    ref = simulate(cfg, step, reqs, reference=True)
    _compare(fast, ref)
    assert fast.stretches > 0
    # far fewer step rows than steps: decode runs were taken in jumps
    assert len(fast.steps["step"]) < fast.num_steps / 3


@pytest.mark.parametrize("seed", range(12))
def test_vectorized_epochs_equal_reference(seed):
    """Constant step time, no client deadlines: the epoch path carries most of the run, and the
    budget, max_num_seqs and KV limits bind now and then (the run must hand over and back)."""
    rng = np.random.default_rng(100 + seed)
    block = int(rng.choice([1, 16]))
    cfg = EngineConfig.from_capacity(int(rng.choice([6000, 30000, 10**6])), block_size=block,
                                     max_num_batched_tokens=int(rng.choice([600, 2048])),
                                     max_num_seqs=int(rng.choice([8, 64, 512])),
                                     enable_chunked_prefill=bool(rng.random() < 0.8),
                                     long_prefill_token_threshold=int(rng.choice([0, 0, 300])))
    reqs = Workload(f"poisson:{rng.choice([5, 20, 60])}", prompt="lognormal:mean=200:sd=200:max=1500",
                    output="lognormal:mean=60:sd=80:max=600").generate(seed=seed, n=1500)
    opts = SimOptions(horizon_s=float(rng.choice([1e9, 30.0])), sample_dt=0.25)
    fast = simulate(cfg, 0.01, reqs, options=opts)
    ref = simulate(cfg, 0.01, reqs, options=opts, reference=True)
    _compare(fast, ref)
    assert fast.stretches > 0


def test_epochs_carry_a_calm_run():
    reqs = Workload("poisson:20", prompt="lognormal:mean=200:sd=200:max=1500",
                    output="lognormal:mean=60:sd=80:max=600").generate(seed=1, n=3000)
    cfg = EngineConfig.from_capacity(10**6, max_num_batched_tokens=4096, max_num_seqs=512)
    fast = simulate(cfg, 0.01, reqs)
    _compare(fast, simulate(cfg, 0.01, reqs, reference=True))
    assert fast.epoch_steps > 0.9 * fast.num_steps


class ConcaveDecode:
    """A user's step-time model through the protocol alone: a decode step's cost concave in the
    batch (interpolated from a table, as a profile would give it) plus a per-prefill-token cost."""

    spec = "concave-table"

    def __init__(self):
        self.batch = np.array([1, 2, 4, 8, 16, 64, 256])
        self.seconds = np.array([0.010, 0.012, 0.014, 0.016, 0.019, 0.030, 0.080])

    def base(self, prefill_tokens, decode_seqs, context_tokens):
        return float(np.interp(max(decode_seqs, 1), self.batch, self.seconds)) + 2e-5 * prefill_tokens

    def decode_stretch(self, n, ctx0, k):
        return np.full(k, float(np.interp(n, self.batch, self.seconds)))


@pytest.mark.parametrize("wrap", ["none", "noise", "drift"])
def test_a_model_written_to_the_protocol_runs_on_both_replicas(wrap):
    from llmqueue.engine.step_model import StepTime, with_drift, with_noise

    model = ConcaveDecode()
    assert isinstance(model, StepTime)
    if wrap == "noise":
        model = with_noise(model, "gamma", 0.4)
    elif wrap == "drift":
        model = with_drift(model, 0.2, 0.7)
    reqs = Workload("poisson:30", prompt="uniform:1:300", output="uniform:1:100").generate(seed=5, n=300)
    cfg = EngineConfig.from_capacity(3000, block_size=4, max_num_batched_tokens=256, max_num_seqs=64)
    fast = simulate(cfg, model, reqs, options=SimOptions(seed=2))
    ref = simulate(cfg, model, reqs, options=SimOptions(seed=2), reference=True)
    _compare(fast, ref)
    d = fast.steps["duration_s"] / fast.steps["steps"]
    one = (fast.steps["decode_seqs"] == 1) & (fast.steps["prefill_tokens"] == 0)
    if wrap == "none":  # the table's price, exactly
        np.testing.assert_allclose(d[one], 0.010)
    else:  # perturbed around it
        assert d[one].std() > 0
    assert fast.requests["preemptions"].sum() > 0  # a KV-bound run


def _profile_dir(tmp_path):
    """A measured-looking profile (``llmqueue profile``'s file): two context rows, concave in the batch."""
    import json

    cells = []
    for prompt, ctx, times in ((64, 96, (0.010, 0.013, 0.015, 0.018, 0.022)),
                               (512, 544, (0.012, 0.016, 0.020, 0.027, 0.040))):
        cells += [{"prompt_tokens": prompt, "context_tokens": ctx, "batch": b, "median_s": t, "count": 40}
                  for b, t in zip((1, 2, 4, 8, 16), times)]
    doc = {"format": "llmqueue-profile", "version": 1, "decode": cells,
           "prefill": {"per_token_s": 2e-5, "intercept_s": 0.011}}
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    return tmp_path


@pytest.mark.parametrize("suffix", ["", ":noise=gamma:cv=0.4", ":drift=0.2:span=0.7", ":scale=1.3"])
def test_a_profile_model_runs_on_both_replicas(tmp_path, suffix):
    """``profile:DIR`` (llmqueue profile's surface) through both replicas: equal records, and the
    one-sequence decode steps priced at the profile's batch-1 row values."""
    from llmqueue.engine.step_time import parse_step_time

    spec = f"profile:{_profile_dir(tmp_path)}{suffix}"
    reqs = Workload("poisson:30", prompt="uniform:1:300", output="uniform:1:100").generate(seed=5, n=300)
    cfg = EngineConfig.from_capacity(3000, block_size=4, max_num_batched_tokens=256, max_num_seqs=64)
    fast = simulate(cfg, spec, reqs, options=SimOptions(seed=2))
    ref = simulate(cfg, spec, reqs, options=SimOptions(seed=2), reference=True)
    _compare(fast, ref)
    assert fast.stretches > 0  # decode runs were priced by decode_stretch, the rest by base
    d = fast.steps["duration_s"] / fast.steps["steps"]
    one = (fast.steps["decode_seqs"] == 1) & (fast.steps["prefill_tokens"] == 0)
    assert one.any()
    if suffix in ("", ":scale=1.3"):  # between the rows' batch-1 steps (contexts 96..544), times the scale
        f = 1.3 if suffix else 1.0
        assert (d[one] >= 0.010 * f - 1e-12).all() and (d[one] <= 0.012 * f + 1e-12).all()
        assert parse_step_time(spec).base(0, 1, 96) == pytest.approx(0.010 * f)
    else:
        assert d[one].std() > 0


@pytest.mark.parametrize("step", ["0.0372", "linear:c0=0.02:prefill=1e-6:decode=4e-5"])
def test_kv_bound_overload_equals_reference(step):
    """Seed 004's 1:1 setting (M = 131,000, chunk 512) at 3x its KV capacity for 150 s: the cache
    binds, decoders are preempted, the queue grows; arrivals pass through decode stretches (the
    FCFS head is blocked), and the records still equal the reference's."""
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)
    reqs = Workload("poisson:9.8", prompt="uniform:10:1600", output="uniform:10:1600").generate(seed=4, duration=150)
    opts = SimOptions(horizon_s=150.0, sample_dt=0.5)
    fast = simulate(cfg, step, reqs, options=opts)
    ref = simulate(cfg, step, reqs, options=opts, reference=True)
    _compare(fast, ref)
    assert (fast.requests["preemptions"] > 0).any()
    assert fast.stretch_arrivals > 50  # arrivals seen inside stretches, at their step boundaries


def _peak_mib(fn):
    """``fn()`` and the peak memory it allocated (MiB; numpy reports its arrays to tracemalloc)."""
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return out, peak / 2**20


def test_idle_time_costs_nothing_at_low_load():
    """300 requests at 0.001 req/s with a constant step time (about 300,000 simulated seconds,
    almost all idle): the epoch path used to build per-step arrays across every idle gap (over
    120 s and 3 GB); now well under the acceptance's 2 s, and the records equal the reference's."""
    import time

    reqs = Workload("poisson:0.001", prompt="uniform:10:1600", output="uniform:10:1600").generate(seed=1, n=300)
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)
    t0 = time.perf_counter()
    fast = simulate(cfg, "0.0372", reqs)
    assert time.perf_counter() - t0 < 30.0  # a hang guard: the old path took over 120 s (well under 2 s alone)
    assert fast.epoch_steps > 0  # the epoch path carried the busy periods
    _compare(fast, simulate(cfg, "0.0372", reqs, reference=True))


@pytest.mark.parametrize("step", ["0.0372", "exp:0.0372"])
def test_a_request_a_day_later_allocates_nothing_for_the_gap(step):
    """Two requests a day apart (2.3 million constant steps of idle time between them): the
    epoch path's arrays stop at the first idle step and the idle time series is one block of
    columns, so the run's peak memory is the 86,400 samples' (about 3.5 MB), not the gap's steps'."""
    from llmqueue.workload.generate import RequestArrays

    reqs = RequestArrays([0, 1], [0.5, 86400.5], [700, 300], [900, 50])
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)
    fast, peak = _peak_mib(lambda: simulate(cfg, step, reqs))
    assert peak < 40, f"{peak:.0f} MiB"
    assert (fast.requests["status"] == "ok").all()
    ts = fast.timeseries["t_s"]
    assert len(ts) == int(fast.horizon_s) + 1  # one a second to the last finish, idle time included
    np.testing.assert_allclose(np.diff(ts), 1.0)
    _compare(fast, simulate(cfg, step, reqs, reference=True))


def test_sample_times_are_whole_multiples_of_the_interval():
    """Sample ``k`` is at ``k * sample_dt`` on both replicas (not a running sum, which drifts),
    so a vectorized idle gap and a sample taken one at a time agree to the last bit."""
    reqs = Workload("poisson:0.05", prompt="uniform:10:300", output="uniform:10:300").generate(seed=2, n=40)
    cfg = EngineConfig.from_capacity(20000, max_num_batched_tokens=512)
    opts = SimOptions(sample_dt=0.1)
    fast = simulate(cfg, "0.02", reqs, options=opts)
    ts = fast.timeseries["t_s"]
    assert (ts == np.arange(len(ts)) * 0.1).all()
    _compare(fast, simulate(cfg, "0.02", reqs, options=opts, reference=True))
