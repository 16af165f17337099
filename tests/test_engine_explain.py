"""``simulate --explain K``: the fast replica's decision of engine step K, as a SchedulerOutput, equals
the reference replica's of the same step, and explaining a step changes no record."""

import numpy as np
import pytest

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.explain import parse_steps
from llmqueue.engine.options import SimOptions
from llmqueue.errors import InputError
from llmqueue.workload import Workload

from test_engine_equivalence import EXACT_COLS, FLOAT_COLS, _scenario


def _kv_bound(step="0.0372"):
    """Seed 004's 1:1 setting at 3x its KV capacity for a minute: decoders preempted often."""
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)
    reqs = Workload("poisson:9.8", prompt="uniform:10:1600", output="uniform:10:1600").generate(seed=4, duration=60)
    return cfg, step, reqs, SimOptions(horizon_s=60.0, sample_dt=0.5)


def _with(opts, explain):
    import copy

    o = copy.copy(opts)
    o.explain = tuple(explain)
    return o


def _steps_to_explain(res, k=6):
    """Steps of a reference run worth explaining: the first one, the first ``k`` that preempted,
    some spread over the run."""
    pre = np.nonzero(res.steps["preempted"] > 0)[0]
    n = res.num_steps
    return sorted({0, *res.steps["step"][pre[:k]].tolist(), *range(n // 7, n, n // 7)})


def _same_decision(a, b):
    assert a.step == b.step
    assert a.scheduled == b.scheduled, a.step
    assert a.preempted == b.preempted, a.step
    assert a.composition == b.composition, a.step
    assert (a.kv_blocks_free_before, a.kv_blocks_free_after, a.num_waiting_before, a.num_waiting_after,
            a.num_running_before, a.num_running_after) == (b.kv_blocks_free_before, b.kv_blocks_free_after,
                                                         b.num_waiting_before, b.num_waiting_after,
                                                         b.num_running_before, b.num_running_after), a.step
    assert a.start_s == pytest.approx(b.start_s, rel=1e-9) and a.end_s == pytest.approx(b.end_s, rel=1e-9)


def _same_records(a, b):
    """The same records (within the equivalence tests' tolerance for times: a stretch cut at the
    explained step adds its durations in another order)."""
    ra, rb = a.requests, b.requests
    for c in EXACT_COLS:
        assert (ra[c] == rb[c]).all(), c
    for c in FLOAT_COLS:
        np.testing.assert_allclose(ra[c], rb[c], rtol=1e-12, atol=1e-9, err_msg=c)
    assert a.num_steps == b.num_steps
    for c in ("prefill_tokens", "preempted", "steps"):
        assert a.steps[c].sum() == b.steps[c].sum(), c
    assert (a.steps["decode_seqs"] * a.steps["steps"]).sum() == (b.steps["decode_seqs"] * b.steps["steps"]).sum()
    np.testing.assert_allclose(a.steps["duration_s"].sum(), b.steps["duration_s"].sum(), rtol=1e-12)
    np.testing.assert_allclose(a.timeseries["t_s"], b.timeseries["t_s"])
    for c in ("num_waiting", "num_running", "kv_tokens"):
        assert (a.timeseries[c] == b.timeseries[c]).all(), c


@pytest.mark.parametrize("step", ["0.0372", "linear:c0=0.02:prefill=1e-6:decode=4e-5"])
def test_an_explained_step_is_the_references_schedule_output(step):
    cfg, step, reqs, opts = _kv_bound(step)
    ref = simulate(cfg, step, reqs, options=opts, reference=True)
    ks = _steps_to_explain(ref)
    assert len(ks) > 8
    fast = simulate(cfg, step, reqs, options=_with(opts, ks))
    ref_x = simulate(cfg, step, reqs, options=_with(opts, ks), reference=True)
    assert [e.step for e in fast.explained] == [e.step for e in ref_x.explained] == ks
    for a, b in zip(fast.explained, ref_x.explained):
        _same_decision(a, b)
    assert sum(len(e.preempted) for e in fast.explained) > 0  # decoders preempted, the victims named
    plain = simulate(cfg, step, reqs, options=opts)
    assert plain.stretches > 0 and not plain.explained
    _same_records(fast, plain)


@pytest.mark.parametrize("seed", [0, 3, 5, 11, 17, 23])
def test_explained_steps_of_randomized_scenarios(seed):
    """Every policy and preemption mode (priority preemption gives a scheduled victim's tokens
    back), prefix-free admission limits, timeouts, noisy and drifting step times."""
    cfg, step, reqs, opts = _scenario(seed)
    ref = simulate(cfg, step, reqs, options=opts, reference=True)
    ks = _steps_to_explain(ref, k=4)
    fast = simulate(cfg, step, reqs, options=_with(opts, ks))
    ref_x = simulate(cfg, step, reqs, options=_with(opts, ks), reference=True)
    assert [e.step for e in fast.explained] == [e.step for e in ref_x.explained]
    for a, b in zip(fast.explained, ref_x.explained):
        _same_decision(a, b)
    _same_records(fast, simulate(cfg, step, reqs, options=opts))


def test_a_step_inside_an_epoch_is_taken_alone():
    """A calm run with a constant step: epochs carry it, and stop before an explained step."""
    reqs = Workload("poisson:20", prompt="lognormal:mean=200:sd=200:max=1500",
                    output="lognormal:mean=60:sd=80:max=600").generate(seed=1, n=3000)
    cfg = EngineConfig.from_capacity(10**6, max_num_batched_tokens=4096, max_num_seqs=512)
    plain = simulate(cfg, 0.01, reqs)
    ks = [plain.num_steps // 3, plain.num_steps // 3 + 1, 2 * plain.num_steps // 3]
    fast = simulate(cfg, 0.01, reqs, options=SimOptions(explain=tuple(ks)))
    ref = simulate(cfg, 0.01, reqs, options=SimOptions(explain=tuple(ks)), reference=True)
    assert plain.epoch_steps > 0.9 * plain.num_steps and fast.epoch_steps > 0.9 * fast.num_steps
    assert [e.step for e in fast.explained] == ks
    for a, b in zip(fast.explained, ref.explained):
        _same_decision(a, b)
    _same_records(fast, plain)


def test_parse_steps_and_the_cli(capsys):
    from llmqueue.cli.main import main

    assert parse_steps("12, 3,12") == (3, 12) and parse_steps(None) == ()
    for bad in ("x", "-1"):
        with pytest.raises(InputError, match="explain"):
            parse_steps(bad)
    args = ["simulate", "--capacity-tokens", "3000", "--block-size", "4", "--max-num-batched-tokens", "128",
            "--max-num-seqs", "32", "--step-time", "0.02", "--arrival", "poisson:30", "--prompt-len", "uniform:1:300",
            "--output-len", "uniform:1:120", "--num-requests", "300", "--seed", "3", "--explain", "40,99999"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "engine step 40:" in out and "composition: prefill_tokens=" in out and "KV blocks free:" in out
    assert "engine step 99999: not taken" in out
    assert main([*args, "--replicas", "2"]) == 2
    assert "--explain" in capsys.readouterr().err
