"""Hand-worked values of issue 41's mechanisms: collectives priced from the machine's own measured
curves by kind (weight reduce-scatters and all-gathers, sequence parallelism's reduce-scatter,
edges as all-gathers, pipeline sends), nanotron's ZeRO-1, the host floor, the pipeline's fixed
time per chunk, balanced pipeline cuts, tensor parallelism across nodes, and fitted machines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pase.costing.training import TrainingCosting, TrainingOptions
from pase.machines.base import Group
from pase.machines.calibrated import CalibratedMachine
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, SoftmaxCrossEntropy
from pase.planning.engine import load_engine
from pase.planning.mesh_rows import row_totals
from pase.planning.pipeline import _p2p, _Timing, cuts

#: Round numbers: 1 TFLOPS, 1 GB/s of memory, 2-byte activations, 4-byte gradients, 4 devices a
#: node; the links 100 GB/s inside a node and 10 between, no latency (tests/test_training.py's toy).
BASE = {"name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
        "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
        "act_bytes": 2, "grad_bytes": 4}


def _fc_net():
    g = GraphBuilder("fc", 1, batch=8)
    x = g.input((8, 1000), "x", letters="bk")
    g.add("fc", FC(x, 500))
    return g.build()


def test_zero1_reads_the_measured_reduce_scatter_and_all_gather():
    # FC weight 1000 x 500 = 5e5 elements, the batch split 4 ways in one node. Its gradient all-
    # reduce by the links: 2 (3/4) 5e5 x 4 B / 100 GB/s = 3e-5 s; at the weight's 2 bytes 1.5e-5.
    # Measured: a reduce-scatter of 2e6 bytes at 100 GB/s of bus bandwidth, 3/4 x 2e6 / 1e11 =
    # 1.5e-5 s; an all-gather of 1e6 bytes at 50 GB/s, 3/4 x 1e6 / 5e10 = 1.5e-5 s.
    m = CalibratedMachine({**BASE, "collectives": {"reduce_scatter": [[4, 1, 2e6, 100]],
                                                   "all_gather": [[4, 1, 1e6, 50]]}})
    costing = TrainingCosting(_fc_net(), [np.array([[4, 1, 1]])], m)
    assert costing.sync(0, TrainingOptions(zero=0))[0] == pytest.approx(3e-5)
    assert costing.sync(0, TrainingOptions(zero=1))[0] == pytest.approx(1.5e-5 + 1.5e-5)
    # nanotron all-reduces the whole gradient under ZeRO-1, then gathers: 3e-5 + 1.5e-5.
    assert costing.sync(0, TrainingOptions(zero=1, zero1_reduce="all_reduce"))[0] == pytest.approx(4.5e-5)
    # ZeRO-2 with 2 micro-batches: 2 RS + AG = 3e-5 + 1.5e-5.
    assert costing.sync(0, TrainingOptions(zero=2, microbatches=2))[0] == pytest.approx(4.5e-5)
    # Without measured curves they are halves of the all-reduce: 1.5e-5 + 0.75e-5.
    bare = TrainingCosting(_fc_net(), [np.array([[4, 1, 1]])], CalibratedMachine(BASE))
    assert bare.sync(0, TrainingOptions(zero=1))[0] == pytest.approx(2.25e-5)
    # Overlap: ZeRO-1 hides behind the layer's compute (6 x 2 x 1000 x 500 / 1e12 = 6e-6 s) ...
    assert costing.exposed_sync(0, TrainingOptions(zero=1))[0] == pytest.approx(3e-5 - 6e-6)
    # ... unless the engine reduces after the backward pass (nanotron's ZeRO-1).
    assert costing.exposed_sync(0, TrainingOptions(zero=1, zero1_overlap=False))[0] == pytest.approx(3e-5)


def test_sequence_parallels_reduce_scatter_reads_its_curve():
    # The FC's 1000 inputs split 2 ways in a node: its 8 x 500 outputs all-reduced, 2 (1/2) x
    # 4000 x 2 B / 100 GB/s = 8e-8 s; sequence parallel (scale 1/2) charged half: 4e-8 s. Measured
    # reduce-scatter of 8000 bytes at 8 GB/s: 1/2 x 8000 / 8e9 = 5e-7 s instead.
    m = CalibratedMachine({**BASE, "collectives": {"reduce_scatter": [[2, 1, 8000, 8]]}})
    costing = TrainingCosting(_fc_net(), [np.array([[1, 1, 2]])], m)
    assert costing.charged_activation(0)[0] == pytest.approx(8e-8)
    costing.activation_scale = np.full((1, 1), 0.5)
    assert costing.charged_activation(0)[0] == pytest.approx(5e-7)
    bare = TrainingCosting(_fc_net(), [np.array([[1, 1, 2]])], CalibratedMachine(BASE))
    bare.activation_scale = np.full((1, 1), 0.5)
    assert bare.charged_activation(0)[0] == pytest.approx(4e-8)


def test_edges_and_pipeline_sends_read_their_curves():
    m = CalibratedMachine({**BASE, "collectives": {"all_gather": [[4, 1, 1.6e7, 200]], "send_recv": [[2, 2, 1e8, 20]]}})
    # An edge moving 6e6 elements (1.2e7 bytes) over 4 devices is a gather of 1.2e7 x 4/3 = 1.6e7
    # bytes, the curve's point: 3/4 x 1.6e7 / 200e9 = 6e-5 s (the links: 1.2e7 / 1e11 = 1.2e-4).
    assert float(m.redistribute(6e6, 4)) == pytest.approx(6e-5)
    assert float(CalibratedMachine(BASE).redistribute(6e6, 4)) == pytest.approx(1.2e-4)
    # Spanning 8 devices on 2 nodes the table has no curve: the links, 1.2e7 / 10 GB/s.
    assert float(m.redistribute(6e6, 8)) == pytest.approx(1.2e-3)
    # A pipeline's sends, stages 4 devices apart (two nodes): twice 5e7 x 2 B / 20 GB/s = 1e-2 s.
    assert float(_p2p(m, np.array([5e7]), 4)[0]) == pytest.approx(1e-2)
    # Stages 1 device apart, one node: no curve there, twice the exchange: 2 x 1e8 / 1e11.
    assert float(_p2p(m, np.array([5e7]), 1)[0]) == pytest.approx(2e-3)


def _blocks(n: int = 2):
    g = GraphBuilder("blocks", 1, batch=8)
    x = g.input((8, 64), "x", letters="bk")
    for i in range(n):
        with g.block():
            for name in "ab":
                x = g.add(f"block{i}.{name}", FC(x, 64))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def test_the_host_floor_without_a_pipeline():
    # Two blocks of two FC 8 x 64 -> 64 on one device: each 6 x 8 x 64 x 64 / 1e12 = 1.97e-7 s of
    # compute, far below a host time of 1 ms per block: 2 micro-batches of 2 blocks take 4e-3 s,
    # and the optimizer step after them 28 B x 4 x 4096 parameters / 1 GB/s = 4.58752e-4 s.
    net = _blocks()
    costing = TrainingCosting(net, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers],
                              CalibratedMachine(BASE))
    none = np.zeros((0, 1))
    host = TrainingOptions(microbatches=2, block_overhead_seconds=1e-3)
    step, _, _ = row_totals(costing, host, 2.0, none, [])
    assert step[0] == pytest.approx(4e-3 + 28 * 4 * 4096 / 1e9, rel=1e-9)
    # Without a host time: the work alone, far below the floor (the optimizer step and
    # 2 x 4 x 1.97e-7 s of compute, about 4.6e-4 s).
    plain, _, _ = row_totals(costing, TrainingOptions(microbatches=2), 2.0, none, [])
    assert 4.5e-4 < plain[0] < 5e-4


def test_the_host_floor_and_chunk_time_on_a_pipeline():
    # Two stages of one block each, 4 micro-batches, tp 4 on every column: a stage's micro-batch
    # takes at least 1 x (1 ms + log2(4) x 0.5 ms) = 2 ms of host time; its device time 1.5 ms
    # (stage 0) and 2.5 ms (stage 1); sends 0.1 ms a chunk; a fixed 0.2 ms per chunk on top.
    o = TrainingOptions(microbatches=4, block_overhead_seconds=1e-3, pipeline_tp_wait_seconds=5e-4,
                        chunk_overhead_seconds=2e-4)
    timing = _Timing(2, 4, o, np.array([2.0, 1.0]), np.array([[1.0], [0.0]]) * (2 / 3), 0.0, np.array([4.0]))
    zero = np.zeros((1, 2, 1))
    stage = {"micro": np.array([[[1.5e-3], [2.5e-3]]]), "step": zero, "sync": zero, "sync_raw": zero,
             "state": zero, "acts": zero, "logits": zero}
    t, step, _, _, sends = timing.figures(stage, np.array([1e-4]), np.zeros(1), 1, np.array([[1, 1]]))
    # Stage 0: max(1.5, 2) + 0.1 + 0.2 = 2.3 ms; stage 1: max(2.5, 2) + 0.3 = 2.8 ms.
    assert t[0, :, 0] == pytest.approx([2.3e-3, 2.8e-3])
    assert sends[0, :, 0] == pytest.approx([3e-4, 3e-4])
    # 1F1B: (4 + 1) slots of the slowest stage, nothing after: 14 ms.
    assert step[0, 0] == pytest.approx(5 * 2.8e-3)
    # Without tensor parallelism (log2 1 = 0) the floor is the block's 1 ms: 1.5 + 0.3 = 1.8 ms.
    t1, *_ = timing.figures(stage, np.array([1e-4]), np.zeros(1), 1, np.array([[1, 1]]), np.array([1.0]))
    assert t1[0, 0, 0] == pytest.approx(1.8e-3)


def test_a_tensor_parallel_group_across_nodes_waits_per_block_and_node():
    # The two blocks of test_the_host_floor_without_a_pipeline, 2 micro-batches, a wait of 1 ms per
    # block, micro-batch and doubling of the nodes; 4 GPUs a node. tp 4 spans one node: no wait;
    # tp 8 two nodes, one doubling: 2 x 2 x 1 x 1 ms = 4 ms; tp 16 four nodes, two: 8 ms; tp 32
    # eight nodes, three: 12 ms (device time, added to the work whatever the host floor).
    net = _blocks()
    costing = TrainingCosting(net, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers],
                              CalibratedMachine(BASE))
    none = np.zeros((0, 1))
    plain, _, _ = row_totals(costing, TrainingOptions(microbatches=2), 2.0, none, [])
    waits = TrainingOptions(microbatches=2, tp_node_wait_seconds=1e-3)
    got = [row_totals(costing, waits, 2.0, none, [], tp=np.array([tp]))[0][0] for tp in (4.0, 8.0, 16.0, 32.0)]
    assert got == pytest.approx([plain[0], plain[0] + 4e-3, plain[0] + 8e-3, plain[0] + 12e-3], rel=1e-9)
    # On a pipeline stage of 3 blocks, tp 8 on 4-GPU nodes: 3 ms a micro-batch on top of its
    # 1.5 ms of work; a stage of 1 block at tp 4 waits none.
    o = TrainingOptions(microbatches=4, tp_node_wait_seconds=1e-3)
    timing = _Timing(2, 4, o, np.array([2.0, 1.0]), np.array([[1.0], [0.0]]) * (2 / 3), 0.0, np.array([8.0]),
                     domain=4.0)
    zero = np.zeros((1, 2, 1))
    stage = {"micro": np.array([[[1.5e-3], [1.5e-3]]]), "step": zero, "sync": zero, "sync_raw": zero,
             "state": zero, "acts": zero, "logits": zero}
    t, *_ = timing.figures(stage, np.array([0.0]), np.zeros(1), 1, np.array([[3, 1]]))
    assert t[0, :, 0] == pytest.approx([4.5e-3, 2.5e-3])
    t4, *_ = timing.figures(stage, np.array([0.0]), np.zeros(1), 1, np.array([[3, 1]]), np.array([4.0]))
    assert t4[0, :, 0] == pytest.approx([1.5e-3, 1.5e-3])


def test_balanced_cuts_reach_stages_equal_middles_cannot():
    # 28 blocks on 16 stages: equal middle stages leave 8/1 x 14/6; a balanced cut holds at most 2.
    assert min(max(c) for c in cuts(28, 16)) == 2
    assert (2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1) not in cuts(28, 16)  # larger middles last
    assert any(max(c) == 2 and sum(c) == 28 and len(c) == 16 for c in cuts(28, 16))


def test_a_fitted_machine_scales_its_collectives_by_level():
    fitted = {"engine": "nanotron", "compute_efficiency": 0.9, "block_overhead_seconds": 2e-3,
              "pipeline_tp_wait_seconds": 1e-3, "collective_scale": {"intra_node": 0.5, "inter_node": 3.0}}
    bare = CalibratedMachine(BASE)
    m = bare.with_fitted(fitted)
    inside, across = Group(np.array([[4]]), np.array([[1]])), Group(np.array([[8]]), np.array([[1]]))
    # Inside a node: 2 (3/4) 1e6 x 2 B / 1e11 = 3e-5 s, halved; across two nodes the hierarchical
    # ring (3e-5 inside + 2 (1/2) (2e6 / 4) / 1e10 = 5e-5 across) times 3.
    assert float(bare.all_reduce(1e6, inside)[0]) == pytest.approx(3e-5)
    assert float(m.all_reduce(1e6, inside)[0]) == pytest.approx(1.5e-5)
    assert float(m.all_reduce(1e6, across)[0]) == pytest.approx(3 * 8e-5)
    assert float(m.reduce_scatter(1e6, across)[0]) == pytest.approx(3 * 4e-5)
    assert float(m.redistribute(1e6, 8)) == pytest.approx(3 * 2e6 / 1e10)
    # The engine the runs used takes the fitted compute efficiency and host times; another does not.
    o = load_engine("nanotron").base_options(m)
    assert (o.compute_efficiency, o.block_overhead_seconds, o.pipeline_tp_wait_seconds) == (0.9, 2e-3, 1e-3)
    # A fit without a wait across nodes (written before it existed) waits none; one with it, its own.
    assert o.tp_node_wait_seconds == 0.0
    waited = load_engine("nanotron").base_options(bare.with_fitted({**fitted, "tp_node_wait_seconds": 4e-3}))
    assert waited.tp_node_wait_seconds == 4e-3
    assert load_engine("megatron").base_options(m).compute_efficiency == load_engine("megatron").base_options(
        bare).compute_efficiency
    assert m.describe()["fitted"]["collective_scale"] == {"intra_node": 0.5, "inter_node": 3.0}
    assert bare.with_fitted(None).fitted is None and math.isclose(m.fitted["compute_efficiency"], 0.9)


def test_a_group_sends_across_nodes_on_its_own_share_of_the_network():
    # An all-reduce measured over whole nodes (8 ranks, 4 on each of 2 nodes) at 4 GB/s of bus
    # bandwidth: the ring sends a node's bytes at 4 GB/s, one GB/s for each GPU's share
    # (inter_node). 2.5e8 gradient elements of 4 bytes, 1e9 bytes:
    m = CalibratedMachine({**BASE, "inter_node": {"gbps": 1, "latency_us": 0},
                           "collectives": {"all_reduce": [[8, 2, 1e9, 4]]}})
    whole = Group(np.array([[8]]), np.array([[1]]))       # 4 a node: the curve, 2 (7/8) 1e9 / 4e9
    one = Group(np.array([[2]]), np.array([[4]]))         # 1 a node, 2 nodes
    two = Group(np.array([[2, 2]]), np.array([[1, 4]]))   # 2 a node, 2 nodes
    assert float(m.all_reduce(2.5e8, whole, grad=True)[0]) == pytest.approx(0.4375)
    # One GPU a node sends all its bytes on its own share: 2 (1/2) 1e9 / 1e9 = 1 s, not the
    # curve's 2 (1/2) 1e9 / 4e9 = 0.25 s (the three other groups on its node send at once).
    assert float(m.all_reduce(2.5e8, one, grad=True)[0]) == pytest.approx(1.0)
    # Two a node: each sends half across, 2 (1/2) (1e9 / 2) / 1e9 = 0.5 s (the curve: 2 (3/4)
    # 1e9 / 4e9 = 0.375 s); the all-gather with no curve of its own is half the all-reduce.
    assert float(m.all_reduce(2.5e8, two, grad=True)[0]) == pytest.approx(0.5)
    assert float(m.all_gather(2.5e8, two, grad=True)[0]) == pytest.approx(0.25)
    # Inside a node nothing crosses: the one-node links (no curve there), 2 (3/4) 1e9 / 100e9.
    inside = Group(np.array([[4]]), np.array([[1]]))
    assert float(m.all_reduce(2.5e8, inside, grad=True)[0]) == pytest.approx(0.015)


def test_split_sends_are_an_equal_share_of_the_whole_output():
    # The FC's 8 x 500 output: split over its inputs (k) on 2 devices it is whole on both, 4,000
    # elements each, and a split send is 2,000; split over the batch it is 2,000 each already.
    from pase.planning.pipeline import sent_elements
    costing = TrainingCosting(_fc_net(), [np.array([[1, 1, 2], [2, 1, 1]])], CalibratedMachine(BASE))
    assert sent_elements(costing, 0, 2, False).tolist() == [4000.0, 2000.0]
    assert sent_elements(costing, 0, 2, True).tolist() == [2000.0, 2000.0]
