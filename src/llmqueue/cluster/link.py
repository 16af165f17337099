"""``KVLinkQueue``: the prefill -> decode KV transfer as a FCFS queue.

A transfer of B bytes holds the link for ``B / rate`` seconds (so transfers queue behind one
another: an M/G/1 server fed by prefill completions) and arrives ``latency`` after it leaves
the link. A free link (infinite rate, zero latency) delivers at once.
"""

from __future__ import annotations


class KVLinkQueue:
    """The link of a :class:`~llmqueue.cluster.spec.Disaggregation` (``kv_link_gbps``,
    ``kv_link_latency_ms``)."""

    def __init__(self, pd):
        self.rate = pd.kv_link_gbps * 1e9 / 8.0   # bytes per second
        self.latency = pd.kv_link_latency_ms / 1e3
        self.free_at = 0.0
        self.busy_s = 0.0

    def transfer(self, t: float, nbytes: float) -> float:
        """When the KV of ``nbytes`` handed over at ``t`` reaches the decode pool."""
        hold = nbytes / self.rate
        start = t if t > self.free_at else self.free_at
        self.free_at = start + hold
        self.busy_s += hold
        return self.free_at + self.latency
