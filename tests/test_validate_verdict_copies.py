"""``validate --verdict-copies``: the simulated verdict on the run's stream replayed back to back.

On the H100 fixture (run 2's 0.8x load, 234 requests over 75 s; ``tests/data/gpu_h100``): at the
calibrated speed the long path stays stable; with an engine 1.5x slower (the same arrivals at
about 1.1x of its capacity) it is unstable while the replay's own path, kept beside it, is not
decided (stable).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from llmqueue.bench.replay import tiled_stream
from llmqueue.bench.validate import validate
from llmqueue.errors import InputError
from llmqueue.workload.generate import RequestArrays

DATA = Path(__file__).resolve().parent / "data" / "gpu_h100"


def test_tiled_stream_keeps_the_rate_and_the_mix():
    s = RequestArrays(np.array([3, 4, 5]), np.array([1.0, 2.0, 4.0]), np.array([10, 20, 30]), np.array([1, 2, 3]),
                      np.array(["a", "b", "a"]))
    t = tiled_stream(s, 3)
    assert len(set(t.request_id.tolist())) == 9
    # span = (4 - 1) x 3 / 2 = 4.5: the copies join at the stream's mean gap (1.5 s)
    assert t.arrival_s.tolist() == pytest.approx([1, 2, 4, 5.5, 6.5, 8.5, 10, 11, 13])
    assert t.prompt_tokens.tolist() == [10, 20, 30] * 3 and t.class_name.tolist() == ["a", "b", "a"] * 3
    assert t.request_id.tolist() == [3, 4, 5, 9, 10, 11, 15, 16, 17]


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration

    d = tmp_path_factory.mktemp("run2")
    with tarfile.open(DATA / "run2.tar.gz") as t:
        t.extractall(d, filter="data")
    run = d / "gpu_run"
    import json

    window = tuple(json.loads((run / "stages.json").read_text())["sat"]["window"])
    write_calibration(calibrate(run / "sat", capacity_tokens=None, window=window), run / "calibration.yaml")
    c = load_calibration(run / "calibration.yaml")
    c["capacity_tokens"] = json.loads((run / "sat" / "server.json").read_text())["M_usable"]
    return run, c


def test_the_long_path_judges_the_rate(run2):
    run, c = run2
    kw = dict(speed_band=0.0, drift=0.0, verdict_copies=4)
    at_speed = validate(run / "x0.8", c, **kw)["verdicts"]
    assert at_speed["simulated"].startswith("stable") and at_speed["simulated_copies"] == 4
    assert "simulated_path" in at_speed
    # 1.5x slower: the same arrivals at about 1.1x of that engine's capacity; the replay's 75-s path
    # cannot tell its growth from zero, the four copies can
    slow_res = validate(run / "x0.8", c, speed_factor=1.5, **kw)
    slow = slow_res["verdicts"]
    assert slow["simulated"].startswith(("unstable", "overloaded")), slow
    assert slow["simulated_path"] == "stable"
    # the theory runs at the applied speed too: its b x1.5, its capacity /1.5, its verdict unstable
    fast_res = validate(run / "x0.8", c, **kw)
    assert slow_res["capacity"]["theory"] == pytest.approx(fast_res["capacity"]["theory"] / 1.5, rel=1e-9)
    assert fast_res["verdicts"]["theory"] == "stable" and slow["theory"] == "unstable", (fast_res["verdicts"], slow)
    one = validate(run / "x0.8", c, speed_band=0.0, drift=0.0)["verdicts"]
    assert "simulated_path" not in one  # one copy: the replay's own path, as before
    with pytest.raises(InputError, match="verdict_copies"):
        validate(run / "x0.8", c, speed_band=0.0, drift=0.0, verdict_copies=0)
