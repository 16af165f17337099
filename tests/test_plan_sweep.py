"""Sweeps: rate rescaling, per-point seeds, identical numbers on every backend, the cache, the knee."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llmqueue.spec import build_spec
from llmqueue.knobs import flag_defaults
from llmqueue.errors import InputError
from llmqueue.plan.backends import Backend, LocalBackend, SerialBackend, get_backend
from llmqueue.plan.points import derive_seed, point_key, resolve, scale_arrival, scenario_spec
from llmqueue.plan.sweep_run import knee, make_grid, run_points, sweep

# seed 004's 1:1 setting (M = 131,000 tokens, b = 0.0372 s, chunk 512), short runs
SEED004 = dict(capacity_tokens=131000, step_time="0.0372", chunk=512, prompt="uniform:10:1600",
               output="uniform:10:1600", duration=120.0, seed=3)


def base(**kw):
    return flag_defaults(**{**SEED004, **kw})


# --- rates ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["poisson:3", "gamma:3:cv=2", "deterministic:3",
                                  "onoff:7:on=300:off=300:rate_off=4.06", "piecewise:2@0,6@600:period=1200",
                                  "spike:3:k=2:at=100:for=50:period=1000", "diurnal:mean=3:amp=0.5:period=3600"])
def test_scale_arrival_sets_the_rate_and_keeps_the_shape(spec):
    from llmqueue.workload.parse import parse_arrival

    a = parse_arrival(spec)
    b = scale_arrival(spec, 7.5)
    assert b.rate == pytest.approx(7.5, rel=1e-12)
    assert type(b) is type(a)
    # the shape is kept: the same inter-arrival SCV and index of dispersion (a time change of the
    # renewal processes; both levels scaled for on/off and the time-varying forms)
    if type(a).__name__ in ("Poisson", "Gamma", "Deterministic"):
        assert b.scv == pytest.approx(a.scv, rel=1e-12)
    # simulated counts: the mean rate of 20,000 s of arrivals is the new rate
    t = b.sample_times(np.random.default_rng(1), horizon=20000.0)
    assert len(t) / 20000.0 == pytest.approx(7.5, rel=0.05)


def test_a_rate_without_an_arrival_process_means_poisson():
    p = resolve(build_spec, base(), {"rate": 2.5})
    assert p["arrival"] == "poisson:2.5"
    p = resolve(build_spec, base(arrival="gamma:1:cv=3"), {"rate": 2.5})
    assert p["arrival"] == "gamma:2.5:cv=3"


def test_chunk_and_budget_are_one_knob():
    p = resolve(build_spec, base(), {"max_num_batched_tokens": 2048})
    assert p["chunk"] is None and p["max_num_batched_tokens"] == 2048
    build_spec(**{**p, "arrival": "poisson:1"})  # no "give --chunk or --max-num-batched-tokens" error


def test_scenario_point_rescales_every_level_and_sets_knobs():
    spec = scenario_spec(scenario="chat", rate=11.0, duration=120.0, max_num_seqs=64, seed=5)
    arr = spec.workload.arrival
    assert arr.rate == pytest.approx(11.0)
    assert (arr.on, arr.off) == (300, 300)  # the on/off periods are kept
    assert arr.rate_on / arr.rate_off == pytest.approx(7 / 4.06)
    assert spec.engine.max_num_seqs == 64 and spec.seed == 5 and spec.duration_s == 120.0


def test_grid_is_the_product_with_rates_inner():
    g = make_grid([1, 2], {"max_num_seqs": [8, 16]})
    assert g == [{"max_num_seqs": 8, "rate": 1.0}, {"max_num_seqs": 8, "rate": 2.0},
                 {"max_num_seqs": 16, "rate": 1.0}, {"max_num_seqs": 16, "rate": 2.0}]
    assert make_grid() == [{}]
    with pytest.raises(InputError, match="positive"):
        make_grid([1, -2])


# --- seeds and keys -------------------------------------------------------------------------------

def test_seed_depends_on_the_point_not_its_position():
    s1 = derive_seed(0, {"max_num_seqs": 8, "rate": 1.0})
    assert s1 == derive_seed(0, {"rate": 1.0, "max_num_seqs": 8})  # key order is irrelevant
    assert s1 != derive_seed(0, {"max_num_seqs": 8, "rate": 2.0})
    assert s1 != derive_seed(1, {"max_num_seqs": 8, "rate": 1.0})
    fwd = run_points(build_spec, base(), [{"rate": 1.0}, {"rate": 2.0}])
    rev = run_points(build_spec, base(), [{"rate": 2.0}, {"rate": 1.0}])
    assert [p.seed for p in fwd] == [p.seed for p in rev][::-1]
    assert fwd[0].summary["completed"] == rev[1].summary["completed"]
    assert fwd[0].summary["p99_ttft_ms"] == rev[1].summary["p99_ttft_ms"]


def test_common_seeds_give_common_random_numbers():
    pts = run_points(build_spec, base(), [{"rate": 1.0}, {"rate": 2.0}], seeds="common")
    assert {p.seed for p in pts} == {3}
    # the same uniforms rescaled in time: twice the rate, about twice the arrivals
    a1, a2 = (p.summary["arrivals"] for p in pts)
    assert a2 == pytest.approx(2 * a1, rel=0.02)


def test_key_covers_the_full_spec():
    p1 = resolve(build_spec, base(), {"rate": 1.0})
    assert point_key(build_spec, p1) == point_key(build_spec, dict(reversed(p1.items())))
    assert point_key(build_spec, p1) != point_key(build_spec, {**p1, "duration": 121.0})
    assert point_key(build_spec, p1) != point_key(build_spec, {**p1, "block_size": 32})


# --- backends -------------------------------------------------------------------------------------

RATES = [1.0, 3.0, 5.0]
PARAMS = {"max_num_seqs": [16, 256]}


def _numbers(backend, **kw):
    res = sweep(build_spec, base(), rates=RATES, params=PARAMS, backend=backend, **kw)
    assert res.ran == len(RATES) * 2
    return res.numbers()


def test_serial_and_local_pool_give_identical_numbers():
    serial = _numbers("serial")
    with LocalBackend(workers=2) as be:
        local = _numbers(be)
    assert local == serial
    assert json.dumps(local) == json.dumps(serial)  # bit for bit, not just approximately
    # and the points differ from one another: the seeds are real
    assert len({r["p99_ttft_ms"] for r in serial}) == len(serial)


def test_ray_gives_the_same_numbers():
    pytest.importorskip("ray", reason="ray is not installed (pip install 'llmqueue[ray]')")
    serial = _numbers("serial")
    be = get_backend("ray", workers=2)
    try:
        assert be.name == "ray"
        ray_numbers = _numbers(be)
    finally:
        be.close()
    assert ray_numbers == serial


def test_backend_names_and_errors():
    assert isinstance(get_backend("serial"), SerialBackend)
    assert get_backend("local", workers=3).workers == 3
    with pytest.raises(InputError, match="unknown backend"):
        get_backend("threads")
    with pytest.raises(InputError, match="only the ray backend"):
        get_backend("local", address="auto")
    with pytest.raises(InputError, match="workers"):
        get_backend("local", workers=0)


# --- the cache ------------------------------------------------------------------------------------

class _Interrupted(Exception):
    pass


class StopAfter(Backend):
    """A serial backend that is 'killed' after ``n`` simulations (the sweep is interrupted)."""

    name = "stop-after"

    def __init__(self, n):
        self.n = n

    def map(self, fn, tasks):
        for i, t in enumerate(tasks):
            if i == self.n:
                raise _Interrupted
            yield i, fn(t)


def test_interrupted_sweep_resumes_and_reruns_only_missing_points(tmp_path):
    b = base()
    with pytest.raises(_Interrupted):
        sweep(build_spec, b, rates=RATES, params=PARAMS, backend=StopAfter(4), out_dir=tmp_path)
    assert len(list((tmp_path / "points").glob("*.json"))) == 4
    res = sweep(build_spec, b, rates=RATES, params=PARAMS, backend="serial", out_dir=tmp_path)
    assert (res.ran, res.cached) == (2, 4)
    # the same numbers as a sweep that was never interrupted
    fresh = sweep(build_spec, b, rates=RATES, params=PARAMS, backend="serial")
    assert res.numbers() == fresh.numbers()
    again = sweep(build_spec, b, rates=RATES, params=PARAMS, backend="serial", out_dir=tmp_path)
    assert (again.ran, again.cached) == (0, 6)
    # a changed point (one more rate) simulates only what is new
    more = sweep(build_spec, b, rates=RATES + [2.0], params=PARAMS, backend="serial", out_dir=tmp_path)
    assert (more.ran, more.cached) == (2, 6)
    # a damaged cache file is simulated again, not trusted
    victim = next((tmp_path / "points").glob("*.json"))
    victim.write_text("{not json")
    assert sweep(build_spec, b, rates=RATES, params=PARAMS, backend="serial", out_dir=tmp_path).ran == 1


def test_keep_runs_writes_records_and_reruns_points_without_them(tmp_path):
    res = sweep(build_spec, base(), rates=[1.0], backend="serial", out_dir=tmp_path, keep_runs=True)
    run_dir = tmp_path / "runs" / res.points[0].key
    assert (run_dir / "requests.parquet").is_file() and (run_dir / "summary.json").is_file()
    assert res.rows[0]["run_dir"] == str(run_dir)
    files = res.write(tmp_path)
    assert [f.name for f in files] == ["sweep.parquet", "sweep.json"]
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "sweep.parquet")
    assert t.num_rows == 1 and "p99_ttft_ms_ci_hi" in t.column_names


def test_errors_from_workers_name_the_point():
    with pytest.raises(InputError, match="rate=1"):
        sweep(build_spec, base(step_time="nonsense:1"), rates=[1.0], backend="serial")
    with pytest.raises(InputError, match="max_num_seq"):
        sweep(build_spec, base(), rates=[1.0], params={"max_num_seq": [8]}, backend="serial")


# --- curves and knees -----------------------------------------------------------------------------

def test_knee_of_the_mm1_p99_curve():
    # M/M/1 (mu = 10): the sojourn time is Exp(mu - lam), so p99 = ln(100) / (mu - lam). It doubles
    # from its value at lam = 1 where mu - lam = 9 / 2: lam = 5.5.
    rates = list(np.arange(1.0, 9.01, 0.25))
    p99 = [math.log(100) / (10 - r) for r in rates]
    k = knee(rates, p99, rates, factor=2.0)
    assert k["rate"] == pytest.approx(5.5, abs=0.02)
    assert k["bracket"] == [5.5, 5.5] or k["bracket"][0] <= 5.5 <= k["bracket"][1]
    assert k["threshold"] == pytest.approx(2 * math.log(100) / 9)
    # a coarse grid: geometric interpolation inside the bracket [5, 7]
    k = knee([1, 3, 5, 7], [math.log(100) / (10 - r) for r in (1, 3, 5, 7)], factor=2.0)
    assert k["bracket"] == [5, 7] and 5 < k["rate"] < 7
    assert knee([1, 2], [1.0, 1.5]) is None  # never reached
    assert knee([1, 2], [1.0, None])["rate"] == 2  # no completions at 2: the knee is at the bracket's top
