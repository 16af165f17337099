"""Fleet cases that exercise every part of the fleet (routers on a KV-bound pool, lanes, the
gateway's rules, P/D, an autoscaler, a fault, client timeouts and retries), shared by the contract
tests and ``benchmarks/fleet_records_diff.py`` (records before and after a change)."""

import llmqueue.cluster.spec as _spec
from llmqueue.cluster.spec import (Autoscaler, Disaggregation, Fallback, Fault, FleetSpec, Gateway, Lane, Pool,
                                   RateLimit, Shed)
from llmqueue.engine import EngineConfig
from llmqueue.engine.options import SimOptions
from llmqueue.workload import Workload
from llmqueue.workload.generate import RequestArrays


def mixed(seed, n=600, rate=30.0):
    wa = Workload(f"poisson:{rate}", prompt="uniform:1:400", output="uniform:1:80",
                  class_name="chat").generate(seed=seed, n=n)
    wb = Workload(f"gamma:{rate / 3}:cv=2", prompt="uniform:200:1200", output="uniform:1:30",
                  class_name="batch").generate(seed=seed + 7, n=n // 3)
    return RequestArrays.merge(wa, wb)


KV_BOUND = EngineConfig.from_capacity(2400, block_size=16, max_num_batched_tokens=512, max_num_seqs=32,
                                      class_priority={"chat": 0, "batch": 1})
ROOMY = EngineConfig.from_capacity(1 << 16, block_size=16, max_num_batched_tokens=1024, max_num_seqs=16)
SMALL = EngineConfig.from_capacity(1 << 16, block_size=16, max_num_batched_tokens=256, max_num_seqs=4)
STEP = "linear:c0=0.004:prefill=2e-5:decode=4e-4:ctx=1e-7"


def _pd_link(prefill: str, decode: str, gbps: float, latency_ms: float):
    """P/D over a link of ``gbps`` and ``latency_ms``; in the older fleet description (a ``KVLink``
    object) too, so that ``benchmarks/fleet_records_diff.py`` runs these cases on older code."""
    if hasattr(_spec, "KVLink"):
        return Disaggregation(prefill, decode, _spec.KVLink(gbps=gbps, latency_ms=latency_ms))
    return Disaggregation(prefill, decode, kv_link_gbps=gbps, kv_link_latency_ms=latency_ms)


def retry_policy(request_id, attempt, status, t_end):
    return t_end + 0.3 * attempt if attempt < 3 and status in ("timeout", "error") else None


CASES = {
    # routers on a KV-bound pool (preemptions), noisy steps
    **{f"router-{name}": (lambda name=name: FleetSpec(pools=[Pool("p", KV_BOUND, STEP + ":noise=gamma:cv=0.3", 3,
                                                                   name)]), SimOptions(seed=3, sample_dt=0.5))
       for name in ("random", "round-robin", "least-outstanding", "least-prefill", "power-of-two", "least-kv",
                    "central")},
    # lanes, the gateway (rate limits, depth, age, tier shedding, fallback)
    "lanes-gateway": (lambda: FleetSpec(
        pools=[Pool("fast", SMALL, STEP, 1, "least-outstanding", model="big"),
               Pool("bulk", KV_BOUND, STEP, 1, "least-kv", model="small", quality=0.7)],
        lanes=[Lane("short", "fast", classes=("chat",), prompt_max=300), Lane("rest", "bulk", batch_window_s=0.2,
                                                                               batch_size=4)],
        gateway=Gateway(rate_limits={"batch": RateLimit(5.0, 3.0)}, max_queue_depth=12, max_queue_age_s=4.0,
                        shed=[Shed(min_priority=1, queue_age_s=1.0)], fallbacks=[Fallback("fast", "bulk", 0.5)])),
        SimOptions(seed=5, sample_dt=1.0)),
    # P/D through the KV link
    "pd": (lambda: FleetSpec(pools=[Pool("pre", ROOMY, STEP, 2, "least-prefill", role="prefill",
                                         kv_bytes_per_token=2e5),
                                    Pool("dec", KV_BOUND, STEP, 2, "least-kv", role="decode", kv_bytes_per_token=2e5)],
                             disaggregation=_pd_link("pre", "dec", 50.0, 2.0)),
           SimOptions(seed=2, sample_dt=0.5)),
    # an autoscaler, a fault whose requests are retried, client timeouts and retries
    "autoscale-fault-retry": (lambda: FleetSpec(
        pools=[Pool("p", KV_BOUND, "exp:0.02", 2, "least-outstanding")],
        autoscalers=[Autoscaler("p", metric="waiting", target=4.0, min_replicas=1, max_replicas=4, interval_s=2.0,
                                provisioning_delay_s=3.0, cooldown_s=5.0)],
        faults=[Fault("p", 1, at_s=6.0, repair_s=4.0, inflight="retry")]),
        SimOptions(seed=4, sample_dt=1.0, timeout_s={"batch": 6.0}, ttft_timeout_s={"chat": 3.0}, retry=retry_policy)),
}


if hasattr(_spec, "Degrade"):  # graceful degradation (absent from older code: fleet_records_diff runs there too)
    CASES["degrade"] = (lambda: FleetSpec(
        pools=[Pool("fast", SMALL, STEP, 1, "least-outstanding", model="big"),
               Pool("bulk", KV_BOUND, STEP, 1, "least-kv", model="small", quality=0.7)],
        lanes=[Lane("all", "fast")],
        gateway=Gateway(degrade=[_spec.Degrade("fast", 0.3, classes=("batch",), max_tokens=8, quality=0.5),
                                 _spec.Degrade("fast", 1.0, classes=("chat",), to="bulk")],
                        shed=[Shed(min_priority=1, queue_age_s=2.0)])),
        SimOptions(seed=6, sample_dt=1.0))
