"""``observe_many``: many observations into one Prometheus histogram at once.

A streamed answer's inter-token gaps are observed one by one in ``prometheus_client`` at about
1.6 us each (a lock per value and a linear walk of the bucket bounds): 64 gaps cost the gateway
more than relaying the answer. Here the values are counted into their buckets with a binary
search and each bucket, and the sum, is incremented once. The exposition is the one the values
observed one by one give (``tests/test_serve_histograms.py``). It reaches into the histogram's
bucket values (``_buckets``, ``_sum``, ``_upper_bounds``, stable in ``prometheus_client`` since
0.4); where a version lacks them, each value is observed one by one.
"""

from __future__ import annotations

from bisect import bisect_left


def observe_many(h, values) -> None:
    """Observe every value of ``values`` in ``h`` (a labelled child of a ``Histogram``): a value
    falls in the first bucket whose upper bound ``le`` is at least the value, as ``observe`` does."""
    bounds = getattr(h, "_upper_bounds", None)
    if bounds is None or not hasattr(h, "_buckets") or not hasattr(h, "_sum") or len(values) < 4:
        for v in values:  # a few values, or a prometheus_client without these insides
            h.observe(v)
        return
    buckets, total = h._buckets, h._sum
    counts: dict = {}
    s = 0.0
    for v in values:
        s += v
        if v == v:  # NaN falls in no bucket (observe's comparisons all fail), only in the sum
            i = bisect_left(bounds, v)
            counts[i] = counts.get(i, 0) + 1
    for i, n in counts.items():
        buckets[i].inc(n)
    total.inc(s)
