"""``observe_many`` (serve/histograms.py) against ``prometheus_client``'s own ``observe``: the same
exposition for the same values, bounds included."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from llmqueue.serve.histograms import observe_many
from llmqueue.serve.vllm_metrics import ITL_BUCKETS


def _pair():
    hs = []
    for _ in range(2):
        r = CollectorRegistry()
        hs.append((r, Histogram("gap_seconds", "gaps", ["pool"], buckets=ITL_BUCKETS, registry=r).labels("p")))
    return hs


def _samples(r) -> dict:
    """The exposition's samples (name, labels) -> value, less the creation times."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(generate_latest(r).decode())
            for smp in fam.samples if not smp.name.endswith("_created")}


@pytest.mark.parametrize("with_nan", [False, True])
def test_many_at_once_is_one_by_one(with_nan):
    """Bucket counts and the count equal exactly; the sum to rounding (summed in another order);
    NaN counts in no bucket and makes the sum NaN, as ``observe`` does."""
    rng = random.Random(5)
    (ra, a), (rb, b) = _pair()
    kinds = (0.0, 1e9, -0.5) + ((math.nan,) if with_nan else ())
    for _ in range(300):
        vals = [rng.choice((rng.expovariate(20.0), rng.choice(ITL_BUCKETS), rng.choice(kinds)))
                for _ in range(rng.randrange(0, 70))]
        observe_many(a, vals)
        for v in vals:
            b.observe(v)
    sa, sb = _samples(ra), _samples(rb)
    assert sa.keys() == sb.keys()
    buckets = [k for k in sa if k[0].endswith("_bucket")]
    assert len(buckets) == len(ITL_BUCKETS) + 1 and sum(sa[k] for k in buckets) > 0
    for k in sa:
        if k[0].endswith("_sum"):
            assert (math.isnan(sa[k]) and math.isnan(sb[k])) if with_nan else sa[k] == pytest.approx(sb[k], rel=1e-12)
        else:
            assert sa[k] == sb[k], k


def test_without_the_histograms_insides_each_value_is_observed():
    class Plain:
        def __init__(self):
            self.seen = []

        def observe(self, v):
            self.seen.append(v)

    h = Plain()
    observe_many(h, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert h.seen == [0.1, 0.2, 0.3, 0.4, 0.5]
