"""The planner's pipeline-parallel axis (``--pp``): GPUs, price, fit and the point it simulates."""

from __future__ import annotations

import pytest

from llmqueue.plan.planner import PRUNED, scenario_workload, theory
from llmqueue.plan.space import configurations
from llmqueue.plan.bounds import gpu_price
from test_plan_planner import SLOS, write_tiny

SPACE = dict(gpus=["h100-sxm"], tp=(1, 2), replicas=(1, 2), max_num_seqs=(16,), max_num_batched_tokens=(512,),
             routers=("least-outstanding",), models=("llama-3.1-70b",))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return write_tiny(tmp_path_factory, "plan_pp")


def test_the_pp_axis_multiplies_the_space_and_each_replicas_gpus():
    one, two = configurations(**SPACE), configurations(**SPACE, pp=(1, 2))
    assert len(two) == 2 * len(one) and {c.pipeline_parallel_size for c in two} == {1, 2}
    for c in two:
        assert c.gpus == c.tensor_parallel_size * c.pipeline_parallel_size * c.replicas
        assert ("pipeline_parallel_size" in c.point()) == (c.pipeline_parallel_size > 1)
        assert c.knobs()["pipeline_parallel_size"] == c.pipeline_parallel_size
    assert [c.point() for c in one] == [c.point() for c in two if c.pipeline_parallel_size == 1]


def test_theory_prices_tp_x_pp_x_replicas_and_pp_lets_a_70b_fit_on_one_gpu_a_stage(scenario):
    wl = scenario_workload(scenario, seed=3, duration=120.0)
    cands = theory(scenario, configurations(**SPACE, pp=(1, 2)), wl, slos=SLOS)
    price = gpu_price("h100-sxm")
    by = {(c.config.tensor_parallel_size, c.config.pipeline_parallel_size, c.config.replicas): c for c in cands}
    for (tp, pp, r), c in by.items():
        assert c.cost_per_hour == pytest.approx(price * tp * pp * r)
    # 141 GB of bf16 weights: not on one H100, but on two stages of one GPU, or one stage of two
    assert by[(1, 1, 1)].status == PRUNED and by[(1, 1, 1)].reason.startswith("does not fit")
    for key in ((1, 2, 1), (2, 1, 1)):
        assert not (by[key].reason or "").startswith("does not fit")
    # pp spreads the weights: more KV than tp 2 alone leaves, at the same 2 GPUs, and the step pays a send
    assert by[(2, 2, 1)].rate_bound >= by[(2, 1, 1)].rate_bound * 0.99
