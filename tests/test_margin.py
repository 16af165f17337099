"""Regime margins (llmqueue.margin): the distance of a run without preemption to the
preemption cliff of a KV-bound engine, in Nie et al.'s 1:1 setting (M = 131,000 tokens, chunk
512, b = 0.0372 s, U(10, 1600) prompts and outputs; their thrashing capacity mu = 3.263 req/s)."""

import json

import pytest
from _cli import run_cli

from llmqueue.margin import preemptions, regime_margin
from llmqueue.spec import spec_from_flags

FLAGS = ["--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512", "--prompt-len", "uniform:10:1600",
         "--output-len", "uniform:10:1600", "--duration", "1800", "--seed", "1", "--no-progress"]


def _run(rate, *extra):
    code, out, err = run_cli("simulate", *FLAGS, "--rate", str(rate), "--json", *extra)
    assert code == 0, err
    d = json.loads(out)
    return d


@pytest.fixture(scope="module")
def margins():
    """The spec and stream exactly as `llmqueue simulate` builds them, and each run's margin."""
    from llmqueue.cli.flags import given_flags
    from llmqueue.cli.simulate_cmd import simulate as cmd
    from llmqueue.simulate import generate_requests

    out = {}
    for rate in (1.5, 2.3, 2.6):
        ctx = cmd.make_context("simulate", [*FLAGS, "--rate", str(rate)])
        flags = {k: v for k, v in ctx.params.items()
                 if k not in ("scenario", "sets", "out_dir", "progress", "as_json", "margin", "speed_spread")}
        spec = spec_from_flags(flags, scenario=None, given=given_flags(ctx, flags), sets=())
        spec.options.horizon_s = spec.duration_s
        reqs = generate_requests(spec)
        out[rate] = (spec, reqs, regime_margin(spec, reqs, margin=0.1))
    return out


def test_a_run_far_from_the_cliff_is_clear_and_one_near_it_metastable(margins):
    _, _, far = margins[1.5]
    _, _, near = margins[2.3]
    assert far["regime"] == "clear" and far["preemptions"] == 0
    assert far["speed_factor"] > 1.3 and far["rate_factor"] > 1.3
    assert near["regime"] == "metastable"
    assert 1.0 < near["rate_factor"] <= 1.1 and 1.0 < near["speed_factor"] <= 1.1


def test_the_bisection_brackets_the_cliff(margins):
    """Just past the factor found the same arrivals preempt; 1/128 before it (the bisection's
    resolution on [1, 2]) they do not."""
    spec, reqs, m = margins[2.3]
    k = m["rate_factor"]
    assert preemptions(spec, reqs, rate=k) > 0
    assert preemptions(spec, reqs, rate=k - 1 / 128) == 0
    f = m["speed_factor"]
    assert preemptions(spec, reqs, speed=f) > 0
    assert preemptions(spec, reqs, speed=f - 1 / 128) == 0


def test_the_rate_without_preemption_is_one_capacity_below_the_thrashing_one(margins):
    """Found from below (runs at 1.5 and 2.3 req/s) and from above (2.6 req/s, already preempting),
    the rate sustained without preemption agrees to 2 %, and lies below Nie et al.'s mu = M/(b E[g])
    = 3.263 req/s, the throughput of the thrashing state: the two capacities of a KV-bound engine."""
    rates = [margins[r][2]["rate_without_preemption"] for r in (1.5, 2.3, 2.6)]
    assert margins[2.6][2]["regime"] == "preempting"
    assert max(rates) / min(rates) < 1.02, rates
    assert max(rates) < 0.9 * 3.263


def test_the_command_line_says_metastable():
    d = _run(2.3, "--margin", "0.1")
    assert d["verdict"].startswith("metastable") and d["regime_margin"]["regime"] == "metastable"
    d = _run(1.5, "--margin", "0.1")
    assert d["verdict"].startswith("stable") and d["regime_margin"]["regime"] == "clear"


def test_a_path_that_preempts_without_queue_growth_is_at_the_cliff_not_stable():
    """The verdict line agrees with the margin (issue 36 item 2): at 2.6 req/s the path preempts
    but its queue does not grow; "stable" beside "preempting" contradicted itself."""
    d = _run(2.6, "--margin", "0.1")
    assert d["regime_margin"]["regime"] == "preempting"
    assert d["verdict"].startswith("at the cliff") and "preempts" in d["verdict"], d["verdict"]


@pytest.mark.parametrize("extra,fragment", [(["--margin", "0"], "margin"), (["--margin", "5"], "margin"),
                                            (["--margin", "0.1", "--replicas", "2"], "margin")])
def test_bad_margins_are_one_line(extra, fragment):
    code, _, err = run_cli("simulate", *FLAGS, "--rate", "1", *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("rate", [2.3, 2.6])
def test_the_stated_tipping_probability_matches_a_lab_whose_engine_speed_varies(margins, rate):
    """A simulated lab (issue 36 item 5): the same arrivals served by an engine whose speed varies
    run to run with a known spread (step time x exp(0.05 Z)); the share of its 80 runs that
    preempted is within 10 points of the probability stated from one margin search."""
    import numpy as np

    from llmqueue.margin import tipping

    spec, reqs, m = margins[rate]
    stated = tipping(m, 0.05, "the lab's")["probability"]
    speeds = np.exp(0.05 * np.random.default_rng(7).standard_normal(80))
    tipped = np.mean([preemptions(spec, reqs, speed=float(s)) > 0 for s in speeds])
    assert abs(stated - tipped) <= 0.10, (stated, tipped)
    assert 0.02 < stated < 0.98   # a case where the spread matters, not a certainty either way


def test_calibrate_measures_the_run_to_run_spread_or_states_its_default(tmp_path):
    """calibrate's speed_spread: from --steps-from runs of the same engine at other speeds (the
    simulator's steps, step time 0.0372 against x1.1 and x0.92), else the stated default."""
    from llmqueue.margin import DEFAULT_SPEED_SPREAD

    runs = []
    for k, st in enumerate(("0.0372", "0.04092", "0.034224")):
        d = tmp_path / f"r{k}"
        code, _, err = run_cli("simulate", *FLAGS[:2], "--step-time", st, *FLAGS[4:], "--rate", "1.5",
                               "--duration", "300", "--out", str(d), "--json")
        assert code == 0, err
        runs.append(d)
    r = run_cli("calibrate", str(runs[0]), "-o", str(tmp_path / "c1.yaml"), "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["speed_spread"] == DEFAULT_SPEED_SPREAD and "default" in doc["speed_spread_source"]
    r = run_cli("calibrate", str(runs[0]), "--steps-from", str(runs[1]), "--steps-from", str(runs[2]),
                "-o", str(tmp_path / "c2.yaml"), "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    import numpy as np

    want = float(np.std(np.log([1.0, 1.1, 0.92]), ddof=1))
    assert doc["speed_spread"] == pytest.approx(want, rel=0.05), doc["speed_spread"]
    # simulate on the calibration ("simulate --calibration"): the margin and the tipping
    # probability come by default, with the spread the calibration measured
    r = run_cli("simulate", *FLAGS[:2], "--step-time", f"fitted:{tmp_path / 'c2.yaml'}", *FLAGS[4:], "--rate", "2.3",
                "--duration", "600", "--json")
    assert r.code == 0, r.err
    m = json.loads(r.out)["regime_margin"]
    assert m["tipping"]["spread"] == pytest.approx(doc["speed_spread"]) and m["margin"] == pytest.approx(0.1)
