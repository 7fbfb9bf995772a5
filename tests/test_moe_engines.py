"""Mixture of experts as the engines run them (issue 42, item 3), by hand: the token dispatchers
(alltoall, allgather, DeepEP / HybridEP), Megatron-Core's batch-level EP overlap and shared-expert
overlap, the expert products one GEMM per local expert; their recipe words and refusals."""

import json

import numpy as np
import pytest

from cli_runner import run
from pase.costing.training import TrainingCosting, TrainingOptions
from pase.costing.training.compute import gemm_seconds
from pase.costing.training.experts import remote_domains
from pase import load_machine
from pase.machines.calibrated import PRESETS, CalibratedMachine
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, MoE
from pase.planning.mesh import parse_recipe

H100 = CalibratedMachine(PRESETS["h100-sxm"])  # no table: 450 GB/s + 3 us in a node, 50 GB/s + 10 us across
B_IN, A_IN, B_OUT, A_OUT = 450e9, 3e-6, 50e9, 10e-6


def _net(shared=0):
    """Two blocks, each an FC (32 -> 32) then a MoE of 16 experts of width 64, top 2, on tokens
    (16, 16) of width 32 (T = 256 tokens)."""
    g = GraphBuilder("moe", 1, batch=16)
    x = g.input((16, 16, 32), "x", letters="ble")
    for i in (1, 2):
        with g.block():
            x = g.add(f"block{i}.fc", FC(x, 32))
            x = g.add(f"block{i}.moe", MoE(x, 16, 2, 64, shared=shared, shared_hidden=64 if shared else 0))
    return g.build()


def _costing(shared=0, machine=H100):
    net = _net(shared)
    # The experts split 16 ways (two nodes of 8 on the H100), the FC's batch 16 ways.
    configs = [np.array([[16, 1, 1, 1]]), np.array([[1, 1, 16, 1, 1]])] * 2
    return net, TrainingCosting(net, configs, machine)


def test_remote_domains_by_hand():
    # 16 experts over 2 domains, top 2: a token misses the other domain with C(8, 2) / C(16, 2)
    # = 28 / 120: it reaches 1 - 28/120 = 0.7667 of it.
    assert float(remote_domains(16, 2, 2)[()]) == pytest.approx(1 - 28 / 120)
    # 8 experts over 4 domains (2 each), top 2: a given other domain is missed with
    # (6/8)(5/7) = 30/56: 3 x (1 - 30/56) = 1.3929 others reached; capped by the copies' share.
    assert float(remote_domains(8, 2, 4)[()]) == pytest.approx(3 * (1 - 30 / 56))
    assert float(remote_domains(8, 2, 4, copies=1.0)[()]) == pytest.approx(0.75)
    assert float(remote_domains(8, 2, 1)[()]) == 0.0


def test_dispatchers_by_hand():
    net, costing = _costing()
    v = 1
    # t_loc = 256 / 16 = 16 tokens a device; k t_loc D = 2 x 16 x 32 = 1024 elements (2048 B)
    # per all-to-all; 16 devices on two nodes of 8.
    alltoall = 4 * max(7 / 16 * 2048 / B_IN + A_IN, 8 / 16 * 2048 / B_OUT + A_OUT)
    got = costing.experts.dispatch(v, TrainingOptions())
    assert got[0] == pytest.approx(alltoall, rel=1e-12)
    assert costing.experts.default(v)[0] == pytest.approx(alltoall, rel=1e-12)
    # HybridEP / DeepEP: the 16 x 32 = 512 token elements cross to the other node once for the
    # 0.7667 of tokens with an expert there (392.5 elements, 785.1 B at 50 GB/s + 10 us), and the
    # 2 copies of each fan out inside the node (512 x 2 x 7/8 = 896 elements at 450 GB/s + 3 us):
    # the longer, four times.
    across = 512 * (1 - 28 / 120) * 2 / B_OUT + A_OUT
    inside = 512 * 2 * 7 / 8 * 2 / B_IN + A_IN
    for kind in ("hybridep", "deepep"):
        got = costing.experts.dispatch(v, TrainingOptions(moe_dispatcher=kind))
        assert got[0] == pytest.approx(4 * max(across, inside), rel=1e-12)
    # allgather: each device gathers the 512 elements of all 16 (8192, 16384 B) and reduce-scatters
    # them back, forward and again backward: twice an all-reduce of 16384 B over the 16 (ring in
    # the node, then across: 2 (7/8) n / B_in + 14 a_in + 2 (1/2)(n / 8) / B_out + 2 a_out).
    n = 8192 * 2
    all_reduce = 2 * 7 / 8 * n / B_IN + 14 * A_IN + 2 * 0.5 * (n / 8) / B_OUT + 2 * A_OUT
    got = costing.experts.dispatch(v, TrainingOptions(moe_dispatcher="allgather"))
    assert got[0] == pytest.approx(2 * all_reduce, rel=1e-12)
    # The activation collectives charged change by the dispatcher's difference (the FC has none).
    base = costing.exposed_activation(v, TrainingOptions())[0]
    hybrid = costing.exposed_activation(v, TrainingOptions(moe_dispatcher="hybridep"))[0]
    assert base - hybrid == pytest.approx(alltoall - 4 * max(across, inside), rel=1e-9)
    # Megatron's --tp-comm-overlap pipelines tensor-parallel collectives with their GEMMs, not the
    # expert all-to-alls: they stay exposed under tp_overlap (they were hidden behind the layer's
    # compute before).
    overlapped = costing.exposed_activation(v, TrainingOptions(tp_overlap=True, overlap_efficiency=1.0))[0]
    assert overlapped == pytest.approx(base, rel=1e-9)


def test_ep_overlap_by_hand():
    """Megatron-Core's batch-level overlap: of m micro-batches, m - 1 merged steps hide a layer's
    all-to-alls a behind its block's compute c; the first forward and last backward run alone:
    exposed (a + (m - 1) max(0, a - e c) (+ share x hidden)) / m."""
    net, costing = _costing()
    v, m = 1, 4
    options = TrainingOptions(microbatches=m, ep_overlap=True)
    a = costing.experts.dispatch(v, options)[0]
    c = sum(costing.step_compute.compute(w, options)[0] for w in (0, 1))
    left = max(0.0, a - c)
    assert costing.experts.exposed(v, options)[0] == pytest.approx((a + (m - 1) * left) / m, rel=1e-12)
    # On the toy numbers the compute (tiny GEMMs at peak) is far below the all-to-alls' latency.
    assert c < a
    # With comm_sm_share 0.1 and efficiency 0.5: left = a - 0.5 c + 0.1 x 0.5 c.
    o = options.but(overlap_efficiency=0.5, comm_sm_share=0.1)
    hidden = min(a, 0.5 * c)
    assert costing.experts.exposed(v, o)[0] == pytest.approx((a + (m - 1) * (a - hidden + 0.1 * hidden)) / m)
    # One micro-batch: nothing to pair with; full recomputation or allgather: Megatron runs none.
    assert costing.experts.exposed(v, options.but(microbatches=1))[0] == pytest.approx(a)
    assert costing.experts.exposed(v, options.but(recompute="full"))[0] == pytest.approx(a)


def test_shared_expert_overlap_by_hand():
    """--moe-shared-expert-overlap: the shared experts' forward (a third of their three
    products) hides behind the forward dispatch and combine (half the all-to-alls)."""
    net, costing = _costing(shared=1)
    v = 1
    options = TrainingOptions(shared_overlap=True)
    a = costing.experts.dispatch(v, options)[0]
    # Shared experts of width 64, gated: gate+up 16 x 128 x 32 and down 16 x 32 x 64 per device,
    # each priced for forward and backward (6 M N K / 989e12 at the preset's peak, no table).
    shared = (6 * 16 * 128 * 32 + 6 * 16 * 32 * 64) / 989e12
    assert gemm_seconds(H100, [(1, 16, 128, 32), (1, 16, 32, 64)])[0] == pytest.approx(shared)
    hidden = min(a / 2, shared / 3)
    assert costing.experts.exposed(v, options)[0] == pytest.approx(a - hidden, rel=1e-12)


def test_expert_products_one_gemm_per_expert():
    """Transformer Engine's GroupedLinear runs one GEMM per local expert: each priced at its own
    shape, B gemm(1, M, N, K) - gemm(B, M, N, K) more than the grouped kernel."""
    machine = load_machine("h100-sxm")  # with its measured table
    net = _net()
    # 2 experts a device (experts split 8 ways), 16 rows each: tiny GEMMs the table prices per launch.
    configs = [np.array([[8, 1, 1, 1]]), np.array([[1, 1, 8, 1, 1]])] * 2
    costing = TrainingCosting(net, configs, machine)
    layer = net.layers[1]
    gemms = layer.expert_gemms(configs[1])
    # Gate and up fused (2 x 64 columns) and down, 2 local experts of 2 x 256 / 16 = 32 rows.
    assert [tuple(float(np.asarray(x).ravel()[0]) for x in g) for g in gemms] == [(2, 32, 128, 32), (2, 32, 32, 64)]
    each = sum(2 * float(machine.gemm(1, 32, n, k)) for n, k in ((128, 32), (32, 64)))
    grouped = sum(float(machine.gemm(2, 32, n, k)) for n, k in ((128, 32), (32, 64)))
    delta = costing.step_compute.expert_gemm_delta(1, TrainingOptions(expert_gemm="per_expert"))
    assert float(delta[0]) == pytest.approx(max(each - grouped, 0.0))
    assert costing.step_compute.expert_gemm_delta(1, TrainingOptions()) == 0.0
    assert costing.step_compute.expert_gemm_delta(0, TrainingOptions(expert_gemm="per_expert")) == 0.0


def test_recipe_words_and_megatrons_refusals():
    r = parse_recipe("ep=8,dispatcher=hybridep")
    assert r.dispatcher == "hybridep"
    for bad, why in [("dispatcher=nccl", "dispatcher must be alltoall, allgather, deepep or hybridep"),
                     ("ep_overlap=true,dispatcher=allgather", "needs the alltoall, deepep or hybridep dispatcher"),
                     ("ep_overlap=true,recompute=full", "runs without full recomputation"),
                     ("ep_overlap=true,shared_overlap=true", "runs one of them"),
                     ("shared_overlap=true,dispatcher=deepep", "needs the alltoall dispatcher"),
                     ("ep_overlap=true,pp=2,schedule=1f1b", "needs schedule=interleaved"),
                     ("ep_overlap=maybe", "must be true or false")]:
        with pytest.raises(ValueError, match=why):
            parse_recipe(bad)


QWEN = ["-g", "hf:examples/hf/qwen3-30b-a3b.json", "-p", "16", "-b", "1024", "-m", "4096", "--machine", "h100-sxm",
        "--engine", "megatron"]


def test_nvidias_two_qwen3_layouts_within_15_percent():
    """NVIDIA's two Qwen3-30B-A3B layouts on 16 H100 (Megatron-Bridge performance summary, 26.02.01
    and 26.04.01: 28.9 s and 29.3 s a step), priced as its recipes run them: ep 16 over two nodes
    with HybridEP (QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: moe_flex_dispatcher_backend
    hybridep, no A2A overlap) and pp 2 x vp 12 with ep 8 and the A2A overlap (the H100 preset of
    Dec 2025: moe_a2a_overlap). They were 1.58x apart with the all-to-all of every copy exposed,
    1.14x with the recipes' settings; both put 3,072 MoE blocks a step on a GPU, whose host time
    (moe_block_overhead_seconds, tests/test_moe_host.py) bounds them alike: each within 10 % of
    its measured step."""
    steps = []
    for recipe in ("dp=16,tp=1,pp=1,zero=1,ep=16,microbatch=1,precision=fp8,scaling=current,dispatcher=hybridep",
                   "dp=8,tp=1,pp=2,zero=1,schedule=interleaved,vpp=12,ep=8,microbatch=1,precision=fp8,"
                   "scaling=current,ep_overlap=true"):
        status, out, err = run(*QWEN, "--recipe", recipe, "--json")
        assert status == 0, err
        steps.append(json.loads(out)["training"]["step_seconds"])
    assert max(steps) / min(steps) <= 1.15
    assert steps == pytest.approx([29.257, 28.941], rel=0.10)


def test_nvidias_gpt_oss_layout_on_b200_fits():
    # NVIDIA's GPT-OSS 120B on 64 B200 (Megatron-Bridge perf_recipes/gpt_oss/b200/gpt_oss.py:
    # tp 1, pp 1, ep 8, micro-batch 4, GBS 1280, recompute modules layernorm and moe_act; its
    # common settings reduce the gradients in bf16, grad_reduce_in_fp32 False) ran: it must fit.
    status, out, err = run("-g", "hf:examples/hf/gpt-oss-120b.json", "-p", "64", "-b", "1280", "-m", "4096",
                           "--machine", "b200", "--engine", "megatron,grad_reduce=bf16", "--recipe",
                           "dp=64,tp=1,ep=8,zero=1,microbatch=4,recompute=selective,"
                           "recompute_modules=moe_act+layernorm", "--json")
    assert status == 0, err
    training = json.loads(out)["training"]
    assert training["fit"] in ("fits", "tight")
    # Megatron's loss: one fp32 logit-sized buffer (softmax, then gradient, in place) beside a
    # bf16 one, 1.5 x 4 B x 4 sequences x 4,096 tokens x 201,088 words = 19,767,754,752 B.
    assert training["memory"]["logits"] == 1.5 * 4 * 4 * 4096 * 201088
