"""Tensor- and pipeline-parallel communication (hardware/interconnect.py) and its place in the roofline."""

from __future__ import annotations

import dataclasses

import pytest

from llmqueue.engine.step_time import roofline_model
from llmqueue.errors import InputError
from llmqueue.hardware import get_gpu, get_model, kv_capacity, per_gpu_kv_bytes_per_token
from llmqueue.hardware.interconnect import ACT_BYTES, LINK_EFFICIENCY, allreduce_time, parallel_comm, send_time

H100 = get_gpu("h100-sxm")
L70 = get_model("llama-3.1-70b")


def test_ring_allreduce_is_the_alpha_beta_closed_form():
    # 2 (tp - 1) / tp of the message through each link, plus the latency once
    assert allreduce_time(S=1e6, tp=8, bw=1e11, alpha=1e-5) == pytest.approx(1e-5 + 2 * 7 / 8 * 1e6 / 1e11)
    assert allreduce_time(S=4e6, tp=2, bw=2e11, alpha=0.0) == pytest.approx(4e6 / 2e11)  # 2 (1/2) = 1
    assert allreduce_time(S=1e9, tp=1, bw=1.0, alpha=1.0) == 0.0  # one GPU: nothing to reduce
    assert send_time(S=3e6, bw=1e11, alpha=2e-6) == pytest.approx(2e-6 + 3e-5)


def test_a_steps_communication_counts_two_allreduces_a_layer_and_one_send_a_boundary():
    c = parallel_comm(L70, H100, tensor_parallel_size=8, pipeline_parallel_size=2)
    bw = 450e9 * LINK_EFFICIENCY
    msg = 8192 * ACT_BYTES  # one token's activations
    assert (c.allreduces, c.sends) == (160, 1)
    a = H100.link_latency_s
    assert a > 0 and c.tp_c0 == pytest.approx(160 * a) and c.pp_c0 == pytest.approx(a)
    assert c.tp_c_tok == pytest.approx(160 * 2 * 7 / 8 * msg / bw)
    assert c.pp_c_tok == pytest.approx(msg / bw)
    T = 300
    assert c.seconds(T) == pytest.approx(160 * allreduce_time(S=T * msg, tp=8, bw=bw, alpha=a)
                                         + send_time(S=T * msg, bw=bw, alpha=a))
    one = parallel_comm(L70, H100)
    assert (one.c0, one.c_tok, one.allreduces, one.sends) == (0.0, 0.0, 0, 0)


def _plain_roofline(m, g, tp, ov=0.002, mfu=0.6, mbu=0.8):
    """The roofline without communication, from the model's published figures (independent of the code)."""
    from llmqueue.hardware import active_param_count, kv_bytes_per_token, weight_bytes

    flops, bw = g.bf16_dense_flops * tp * mfu, g.hbm_bytes_per_s * tp * mbu
    per_tok = 2.0 * active_param_count(m) / flops
    attn = 4.0 * m.n_layers * m.n_heads * m.head_dim / flops

    def base(P, D, C):
        return ov + max(per_tok * (P + D) + attn * C, weight_bytes(m) / bw + kv_bytes_per_token(m) / bw * C)
    return base


@pytest.mark.parametrize("P, D, C", [(0, 1, 500), (0, 64, 64 * 2000), (2048, 0, 0), (512, 32, 40000)])
def test_tp1_step_times_are_unchanged_and_tp_adds_exactly_the_communication(P, D, C):
    one = roofline_model(L70, H100)
    assert one.spec == "roofline:llama-3.1-70b:h100-sxm:tp=1"
    assert one.base(P, D, C) == pytest.approx(_plain_roofline(L70, H100, 1)(P, D, C), rel=1e-12)
    for tp in (2, 4, 8):
        comm = parallel_comm(L70, H100, tensor_parallel_size=tp).seconds(P + D)
        got = roofline_model(L70, H100, tensor_parallel_size=tp).base(P, D, C)
        assert got == pytest.approx(_plain_roofline(L70, H100, tp)(P, D, C) + comm, rel=1e-12)
        assert comm > 0


def test_the_decode_stretch_keeps_the_communication():
    m = roofline_model(L70, H100, tensor_parallel_size=4, pipeline_parallel_size=2)
    n, ctx0, k = 16, 16 * 700, 5
    want = [m.base(0, n, ctx0 + n * i) for i in range(k)]
    assert list(m.decode_stretch(n, ctx0, k)) == pytest.approx(want, rel=1e-12)


def test_a_tp8_step_on_pcie_costs_more_than_on_nvlink():
    pcie = dataclasses.replace(H100, name="h100-sxm-on-pcie", link="PCIe Gen5 x16", link_bytes_per_s=64e9,
                               link_latency_s=get_gpu("h100-pcie").link_latency_s)
    for P, D, C in [(0, 1, 1000), (0, 128, 128 * 1000), (4096, 0, 0)]:
        nv = roofline_model(L70, H100, tensor_parallel_size=8).base(P, D, C)
        pc = roofline_model(L70, pcie, tensor_parallel_size=8).base(P, D, C)
        assert pc > nv
    # on the catalog's PCIe card, the all-reduces of a 4096-token prefill cost more than a tenth of the step
    l40s = roofline_model("llama-3.1-70b", "l40s", tensor_parallel_size=8)
    assert parallel_comm(L70, "l40s", tensor_parallel_size=8).seconds(4096) > 0.1 * l40s.base(4096, 0, 0)


def test_pp2_doubles_the_gpus_halves_the_weights_per_gpu_and_pays_one_send():
    a = kv_capacity(L70, H100, tensor_parallel_size=4)
    b = kv_capacity(L70, H100, tensor_parallel_size=4, pipeline_parallel_size=2)
    assert (a.gpus, b.gpus) == (4, 8)
    assert b.weight_bytes_per_gpu == pytest.approx(a.weight_bytes_per_gpu / 2)
    assert b.per_gpu_kv_bytes_per_token * 2 == a.per_gpu_kv_bytes_per_token  # 40 of the 80 layers a GPU
    assert b.M > a.M
    # the step: the same compute and memory as tp 4 alone, plus one send of the step's activations
    for P, D, C in [(0, 8, 8000), (1024, 16, 30000)]:
        extra = (roofline_model(L70, H100, tensor_parallel_size=4, pipeline_parallel_size=2).base(P, D, C)
                 - roofline_model(L70, H100, tensor_parallel_size=4).base(P, D, C))
        assert extra == pytest.approx(send_time(S=(P + D) * 8192 * ACT_BYTES, bw=450e9 * LINK_EFFICIENCY,
                                                alpha=H100.link_latency_s))
    # uneven stages: the largest one (ceil) bounds the KV a GPU holds
    assert per_gpu_kv_bytes_per_token("llama-3.1-8b", 1, "bf16", 3) == 2 * 11 * 8 * 128 * 2


def test_pp_counts_in_a_scenarios_gpus_and_price():
    from llmqueue.scenario import scenario_with

    def check(pp):
        sc = scenario_with("chat", tensor_parallel_size=2, pipeline_parallel_size=pp).scenario
        return sc.summary()["deployment"]["total_gpus"], sc.deployment.replicas
    (g1, r1), (g2, r2) = check(1), check(2)
    assert r1 == r2 and (g1, g2) == (2 * r1, 4 * r1)


def test_bad_pipeline_sizes_and_a_gpu_without_a_link_are_refused_in_one_line():
    with pytest.raises(InputError, match="pipeline_parallel_size.*exceed"):
        kv_capacity("llama-3.1-8b", H100, pipeline_parallel_size=33)
    with pytest.raises(InputError, match="pipeline_parallel_size"):
        kv_capacity("llama-3.1-8b", H100, pipeline_parallel_size=0)
    nolink = dataclasses.replace(H100, name="mystery", link="", link_bytes_per_s=0.0)
    with pytest.raises(InputError, match="interconnect"):
        roofline_model(L70, nolink, tensor_parallel_size=2)
    roofline_model(L70, nolink)  # one GPU needs no link
