"""``observe_many`` (serve/histograms.py) against ``prometheus_client``'s own ``observe``: the same
exposition for the same values, bounds included."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from llmqueue.serve.histograms import observe_many
from llmqueue.serve.vllm_metrics import ITL_BUCKETS


def _pair():
    hs = []
    for _ in range(2):
        r = CollectorRegistry()
        hs.append((r, Histogram("gap_seconds", "gaps", ["pool"], buckets=ITL_BUCKETS, registry=r).labels("p")))
    return hs


def _text(r) -> str:
    return "\n".join(ln for ln in generate_latest(r).decode().splitlines() if "_created" not in ln)


def test_many_at_once_is_one_by_one():
    rng = random.Random(5)
    (ra, a), (rb, b) = _pair()
    for _ in range(300):
        vals = [rng.choice((rng.expovariate(20.0), rng.choice(ITL_BUCKETS), 0.0, 1e9, math.nan, -0.5))
                for _ in range(rng.randrange(0, 70))]
        observe_many(a, vals)
        for v in vals:
            b.observe(v)
    ta, tb = _text(ra), _text(rb)
    assert ta == tb
    assert 'le="0.01"' in ta and "gap_seconds_count" in ta and ta.count("_bucket") == len(ITL_BUCKETS) + 1


def test_without_the_histograms_insides_each_value_is_observed():
    class Plain:
        def __init__(self):
            self.seen = []

        def observe(self, v):
            self.seen.append(v)

    h = Plain()
    observe_many(h, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert h.seen == [0.1, 0.2, 0.3, 0.4, 0.5]
