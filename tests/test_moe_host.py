"""Issue 42: the host time of a mixture-of-experts block (``moe_block_overhead_seconds``), worked
out by hand: counted once per MoE block and micro-batch on top of any block's own, without and
with a pipeline, again for the recomputed forwards under ``recompute=full`` and ``block``, as
Megatron's profile states it, in a fit's terms (``calibrate --from-runs``) and in the plan's
text."""

from __future__ import annotations

import numpy as np
import pytest

from cli_runner import run
from pase.costing.training import TrainingCosting, TrainingOptions
from pase.machines.calibrated import CalibratedMachine
from pase.model.builder import GraphBuilder
from pase.model.layers import MoE, RMSNorm
from pase.planning.calibrate_runs import RunTerms
from pase.planning.engine import load_engine
from pase.planning.host_floor import expert_block_count, host_seconds
from pase.planning.mesh_rows import row_totals
from pase.planning.pipeline import _expert_blocks, _recomputed_host, _Timing, stage_layout

#: 1 TFLOPS, 1 GB/s of memory, 2-byte activations: the toy of tests/test_cluster_mechanisms.py.
BASE = {"name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
        "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
        "act_bytes": 2, "grad_bytes": 4}


def _network():
    """Three blocks on tokens (4, 4) of width 32: the first two an RMSNorm and a MoE of 16 experts
    of width 64, top 2; the third an RMSNorm alone (a block without experts)."""
    g = GraphBuilder("moe-host", 1, batch=4)
    x = g.input((4, 4, 32), "x", letters="ble")
    for i in (1, 2):
        with g.block():
            h = g.add(f"block{i}.norm", RMSNorm(x))
            x = g.add(f"block{i}.moe", MoE(h, 16, 2, 64))
    with g.block():
        g.add("block3.norm", RMSNorm(x))
    return g.build()


def _costing():
    net = _network()
    return net, TrainingCosting(net, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers],
                                CalibratedMachine(BASE))


def test_expert_blocks_are_counted_by_the_blocks_that_hold_them():
    net, costing = _costing()
    st = costing.structure
    assert expert_block_count(st.blocks, st.experts) == 2
    # Cumulative over the layout's blocks: MoE, MoE, none.
    assert list(_expert_blocks(costing, stage_layout(st.blocks))) == [0.0, 1.0, 2.0, 2.0]


def test_an_expert_block_pays_its_host_time_without_a_pipeline():
    net, costing = _costing()
    none = np.zeros((0, 1))
    # Parameters: per MoE block its norm 32, router 32 x 16 = 512 and 3 x 16 x 32 x 64 = 98,304
    # expert weights; the last norm 32: 2 x 98,848 + 32 = 197,728. On one device the step after
    # the micro-batches is the optimizer's, 28 B each at 1 GB/s = 5.536384 ms.
    rest = 28 * 197_728 / 1e9
    plain, _, _ = row_totals(costing, TrainingOptions(microbatches=2), 2.0, none, [])
    # The device's work is under a millisecond a micro-batch (the plain step less the optimizer).
    assert 0 < (plain[0] - rest) / 2 < 1e-3
    # 10 ms a MoE block: 2 micro-batches x 2 MoE blocks x 10 ms = 40 ms after which the optimizer.
    o = TrainingOptions(microbatches=2, moe_block_overhead_seconds=1e-2)
    step, _, _ = row_totals(costing, o, 2.0, none, [])
    assert step[0] == pytest.approx(rest + 2 * 2 * 1e-2, rel=1e-9)
    # With 5 ms for every block as well: (3 x 5 + 2 x 10) ms a micro-batch, 70 ms.
    both = TrainingOptions(microbatches=2, moe_block_overhead_seconds=1e-2, block_overhead_seconds=5e-3)
    assert row_totals(costing, both, 2.0, none, [])[0][0] == pytest.approx(rest + 2 * 35e-3, rel=1e-9)
    # Full recomputation issues each block's forward again from the host: 4/3 of it, 53.33 ms.
    full = TrainingOptions(microbatches=2, moe_block_overhead_seconds=1e-2, recompute="full")
    assert row_totals(costing, full, 2.0, none, [])[0][0] == pytest.approx(rest + 2 * 2 * 1e-2 * 4 / 3, rel=1e-9)


def test_a_network_without_experts_pays_none():
    g = GraphBuilder("dense", 1, batch=4)
    x = g.input((4, 4, 32), "x", letters="ble")
    for i in (1, 2):
        with g.block():
            x = g.add(f"block{i}.norm", RMSNorm(x))
    net = g.build()
    costing = TrainingCosting(net, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers],
                              CalibratedMachine(BASE))
    none = np.zeros((0, 1))
    plain = row_totals(costing, TrainingOptions(microbatches=2), 2.0, none, [])[0][0]
    o = TrainingOptions(microbatches=2, moe_block_overhead_seconds=1.0)
    assert row_totals(costing, o, 2.0, none, [])[0][0] == plain
    assert float(host_seconds(o, 2, False)) == 0.0


def test_each_pipeline_stage_pays_for_its_own_expert_blocks():
    # Two stages, 4 micro-batches: stage 0 holds 2 blocks, both MoE, stage 1 one dense block.
    # 1 ms a MoE block: stage 0's micro-batch takes max(1.5, 2) = 2 ms, stage 1's its 2.5 ms of
    # work (no MoE block, no floor); no sends, no fixed chunk time.
    o = TrainingOptions(microbatches=4, moe_block_overhead_seconds=1e-3)
    timing = _Timing(2, 4, o, np.array([2.0, 1.0]), np.array([[1.0], [0.0]]) * (2 / 3), 0.0)
    zero = np.zeros((1, 2, 1))
    stage = {"micro": np.array([[[1.5e-3], [2.5e-3]]]), "step": zero, "sync": zero, "sync_raw": zero,
             "state": zero, "acts": zero, "logits": zero}
    t, step, *_ = timing.figures(stage, np.array([0.0]), np.zeros(1), 1, np.array([[2, 1]]),
                                 experts=np.array([[2, 0]]))
    assert t[0, :, 0] == pytest.approx([2e-3, 2.5e-3])
    # Stage 1 dense and slowest: 1F1B's (4 + 1) slots of 2.5 ms.
    assert step[0, 0] == pytest.approx(5 * 2.5e-3)
    # The MoE blocks on the last stage instead: 2 x 1 ms < 2.5 ms there, 1.5 ms on stage 0.
    t2, *_ = timing.figures(stage, np.array([0.0]), np.zeros(1), 1, np.array([[2, 1]]), experts=np.array([[0, 1]]))
    assert t2[0, :, 0] == pytest.approx([1.5e-3, 2.5e-3])


def test_megatrons_profile_states_it_and_others_do_not():
    # Fitted on NVIDIA's two Qwen3-30B-A3B layouts (benchmarks/fit_moe_host.py: 9.52 and 9.27 ms).
    assert load_engine("megatron").base_options().moe_block_overhead_seconds == 0.0094
    for name in ("nanotron", "torchtitan", "fsdp", "deepspeed", "megatron-deepspeed"):
        assert load_engine(name).base_options().moe_block_overhead_seconds == 0.0
    with pytest.raises(ValueError, match="moe_block_overhead_seconds must be a non-negative number"):
        TrainingOptions(moe_block_overhead_seconds=-1.0)


def test_block_recomputation_issues_the_recomputed_forwards_again():
    # recompute=block without a pipeline recomputes the network's first n blocks: their forwards
    # are issued again, a third of their host time. 10 ms a MoE block, 2 micro-batches: n = 1
    # (a MoE block) 2 x (20 + 10/3) ms; n = 3 (both MoE blocks and the dense one) 2 x (20 + 20/3).
    net, costing = _costing()
    none = np.zeros((0, 1))
    rest = 28 * 197_728 / 1e9
    for n, host in ((1, 20e-3 + 10e-3 / 3), (2, 20e-3 + 20e-3 / 3), (3, 20e-3 + 20e-3 / 3)):
        o = TrainingOptions(microbatches=2, moe_block_overhead_seconds=1e-2, recompute="block", recompute_layers=n)
        assert row_totals(costing, o, 2.0, none, [])[0][0] == pytest.approx(rest + 2 * host, rel=1e-9), n


def test_a_fit_counts_full_recomputation_and_keeps_the_moe_host_time_as_stated():
    # A run of 10 block slots on its critical path, recomputed in full, its MoE blocks' stated host
    # time 50 ms in all: with 10 ms a block the host takes 10 x 4/3 x 10 ms + 50 ms = 183.3 ms,
    # above 0.1 s of device work and below 1 s of it.
    p = np.array([1.0, 1.0, 1.0, 0.01, 0.0, 0.0])
    terms = RunTerms(0.1, (0.0, 0.0), (0.0, 0.0), 10.0, 0.0, again=4 / 3, moe_host=0.05)
    assert terms.step(p) == pytest.approx(10 * 4 / 3 * 0.01 + 0.05)
    assert RunTerms(1.0, (0.0, 0.0), (0.0, 0.0), 10.0, 0.0, again=4 / 3, moe_host=0.05).step(p) == 1.0


def test_the_plan_says_when_the_host_bounds_it():
    # NVIDIA's ep 16 layout of Qwen3-30B-A3B on 16 H100: 48 MoE blocks x 9.4 ms = 0.451 s of host
    # time a micro-batch, above the device's work (about 0.33 s): the plan says so.
    qwen = ["-g", "hf:examples/hf/qwen3-30b-a3b.json", "-p", "16", "-b", "1024", "-m", "4096", "--machine",
            "h100-sxm", "--recipe", "dp=16,tp=1,ep=16,zero=1,microbatch=1,recompute=none,dispatcher=hybridep,"
            "precision=fp8,scaling=current"]
    status, out, err = run(*qwen, "--engine", "megatron")
    assert status == 0, err
    assert "the host bounds the step" in out and "9.4 ms a block and micro-batch" in out
    status, out, err = run(*qwen, "--engine", "megatron,moe_block_overhead_seconds=0")
    assert status == 0, err
    assert "the host bounds the step" not in out and "waiting for the host" not in out


def test_a_pipelines_recomputed_blocks_issue_their_forwards_again():
    # recompute=block on a pipeline: each recomputed block adds a third of its host time to its
    # stage's micro-batch, 10 ms / 3 a MoE block and none for the dense one (no per-block time).
    net, costing = _costing()
    o = TrainingOptions(moe_block_overhead_seconds=1e-2, recompute="block", recompute_layers=1)
    assert _recomputed_host(costing, o, 2) == pytest.approx(np.array([[1e-2 / 3] * 2, [1e-2 / 3] * 2, [0.0] * 2]))
    # A stage of 2 MoE blocks at 1 ms, one of them recomputed (1/3 ms more): max(1.5, 2 + 1/3) ms.
    timing = _Timing(2, 4, TrainingOptions(microbatches=4, moe_block_overhead_seconds=1e-3), np.array([2.0, 1.0]),
                     np.array([[1.0], [0.0]]) * (2 / 3), 0.0)
    zero = np.zeros((1, 2, 1))
    stage = {"micro": np.array([[[1.5e-3], [2.5e-3]]]), "step": zero, "sync": zero, "sync_raw": zero,
             "state": zero, "acts": zero, "logits": zero, "host_extra": np.array([[[1e-3 / 3], [0.0]]])}
    t, *_ = timing.figures(stage, np.array([0.0]), np.zeros(1), 1, np.array([[2, 1]]), experts=np.array([[2, 0]]))
    assert t[0, :, 0] == pytest.approx([2e-3 + 1e-3 / 3, 2.5e-3])
