"""Weight products reading one tensor share its tensor-parallel collectives in the training
model (the reader rule "summed" of ``TrainingCosting``): one all-gather of the input forward,
one reduction of its summed gradient backward, as Megatron's fused ``linear_qkv`` / ``linear_fc1``
and torchtitan's one ``PrepareModuleInput`` gather run them.

Hand values use the h100-sxm preset: no measured collective curves, NVLink ``B_in = 450e9``
bytes/s and ``a_in = 3e-6`` s per step, ``act_bytes = 2``. Over ``q = 4`` devices of one node an
all-reduce of ``n`` bytes costs ``2 (q - 1)/q n / B_in + 2 (q - 1) a_in``; a reduce-scatter
(sequence parallelism, ``activation_scale`` 0.5) half of it. An edge moving ``e`` elements
(forward plus backward) costs ``e act_bytes / B_in + 2 a_in``.
"""

import numpy as np
import pytest

from pase.costing.training import TrainingCosting, TrainingOptions
from pase.machines.registry import as_machine
from pase.model.builder import GraphBuilder
from pase.model.layers import Einsum, Elementwise, RMSNorm
from pase.model.readers import alike_readers, reader_groups
from pase.planning.mesh_rows import PartsMemo
from pase.planning.training_search import evaluate_candidate

H100 = as_machine("h100-sxm")
S, D, N = 1024, 512, 256  # sequence, model width, each product's output width


def qkv(residual=False):
    """``norm(x)`` read by three products ``q``, ``k``, ``v`` (``bsd,dn->bsn``); with
    ``residual`` also by a sum ``r = norm(x) + y`` (no weights)."""
    g = GraphBuilder("qkv", cutoff=1)
    x = g.input((1, S, D), "x", letters="bsd")
    h = g.add("norm", RMSNorm(x))
    for name in "qkv":
        w = g.input((D, N), name + ".w", letters="dn", param=True)
        g.add(name, Einsum("bsd,dn->bsn", h, w))
    if residual:
        y = g.input((1, S, D), "y", letters="bsd")
        g.add("r", Elementwise(h, y))
    return g.build()


#: The norm's output sequence-sharded over 4 devices (sequence parallelism); a product's
#: iteration space is ``(b, s, n, d)``: column-parallel splits ``n`` in 4.
NORM_SP = (1, 4, 1)
COLUMN = (1, 1, 4, 1)


def priced(net, configs, readers, options=TrainingOptions(), halved=None):
    """The step of one strategy as the mesh search prices it: one row per layer, products'
    activation collectives halved (reduce-scatters) where ``halved``."""
    rows = [np.asarray([c], dtype=np.int64) for c in configs]
    costing = TrainingCosting(net, rows, H100, readers=readers)
    halved = halved if halved is not None else [net.layers[v].op == "Einsum" for v in range(len(net.layers))]
    costing.activation_scale = np.where(np.array(halved)[:, None], 0.5, 1.0)
    edges, targets = PartsMemo(H100, 4).edge_seconds(net, rows)
    moved = float(costing.edge_rows(edges, targets, options).sum())
    return costing, costing.summarize([0] * len(configs), options, 2.0, moved, 4)


# Hand values (S x D = 524,288 elements of the norm's output per device once gathered):
#   input-gradient all-reduce over 4: n = 524288 x 2 = 1,048,576 bytes,
#     2 x 3/4 x 1048576 / 450e9 + 2 x 3 x 3e-6 = 3.49525e-6 + 18e-6 = 21.49525e-6 s;
#   its reduce-scatter (sequence parallelism): half, 10.747627e-6 s;
#   the edge norm -> product (sequence-sharded -> replicated): a device lacks 3/4 of the
#     524,288 elements, forward and backward 2 x 393,216 = 786,432 elements,
#     786432 x 2 / 450e9 + 2 x 3e-6 = 3.49525e-6 + 6e-6 = 9.49525e-6 s.
REDUCE_SCATTER = (2 * 3 / 4 * S * D * 2 / 450e9 + 2 * 3 * 3e-6) / 2
GATHER_EDGE = 2 * (3 / 4) * S * D * 2 / 450e9 + 2 * 3e-6


def test_hand_values():
    assert REDUCE_SCATTER == pytest.approx(10.747627e-6, rel=1e-6)
    assert GATHER_EDGE == pytest.approx(9.49525e-6, rel=1e-6)


def test_three_column_parallel_readers_reduce_and_gather_once_by_hand():
    net = qkv()
    configs = [NORM_SP, COLUMN, COLUMN, COLUMN]
    _, each = priced(net, configs, "each")
    costing, summed = priced(net, configs, "summed")
    # Three reduce-scatters and three gathers, against one of each.
    assert each.time["activation_comm"] == pytest.approx(3 * REDUCE_SCATTER, rel=1e-9)
    assert summed.time["activation_comm"] == pytest.approx(REDUCE_SCATTER, rel=1e-9)
    assert each.time["redistribution"] == pytest.approx(3 * GATHER_EDGE, rel=1e-9)
    assert summed.time["redistribution"] == pytest.approx(GATHER_EDGE, rel=1e-9)
    # Compute and memory are the same; the first reader pays, the others are pooled at it.
    assert summed.time["compute"] == pytest.approx(each.time["compute"], rel=1e-12)  # summed in another order
    assert summed.peak_memory_bytes == each.peak_memory_bytes
    pools = costing.reader_pools()
    assert sorted(pools) == [1] and [w for w, _ in pools[1]] == [2, 3]
    assert costing.exposed_activation(1, TrainingOptions())[0] == pytest.approx(REDUCE_SCATTER, rel=1e-9)
    assert costing.exposed_activation(2, TrainingOptions())[0] == 0.0


def test_the_one_gather_hides_behind_the_readers_combined_compute():
    # tp_overlap: exposed = max(0, a - e c) with a and c summed over the pool. The products'
    # compute is read off the costing (measured GEMM tables); the rule is checked by hand on it.
    net = qkv()
    configs = [NORM_SP, COLUMN, COLUMN, COLUMN]
    options = TrainingOptions(tp_overlap=True, overlap_efficiency=0.5)
    costing, summed = priced(net, configs, "summed", options)
    c = sum(float(costing.compute(v, options)[0]) for v in (1, 2, 3))
    left = max(0.5 * c - REDUCE_SCATTER, 0.0)
    assert summed.time["activation_comm"] == pytest.approx(max(REDUCE_SCATTER - 0.5 * c, 0.0), abs=1e-15)
    assert summed.time["redistribution"] == pytest.approx(max(GATHER_EDGE - left, 0.0), abs=1e-15)
    # Each on its own (the rule "each"): every reader hides its own behind its own compute.
    _, each = priced(net, configs, "each", options)
    alone = [float(costing.compute(v, options)[0]) for v in (1, 2, 3)]
    assert each.time["redistribution"] == pytest.approx(
        sum(max(GATHER_EDGE - max(0.5 * x - REDUCE_SCATTER, 0.0), 0.0) for x in alone), abs=1e-15)


def test_readers_split_otherwise_each_pay():
    net = qkv()
    # k splits n in 2 and d in 2: it holds half the input and reduces over other devices.
    configs = [NORM_SP, COLUMN, (1, 1, 2, 2), COLUMN]
    _, each = priced(net, configs, "each")
    _, summed = priced(net, configs, "summed")
    assert reader_groups(net) == (((1, 0), (2, 0), (3, 0)),)
    lead = alike_readers(net, reader_groups(net)[0], [np.asarray([c]) for c in configs])
    assert lead[:, 0].tolist() == [0, 1, 0]  # v is laid out like q, k like none before it
    # v's reduce-scatter and gather go (hand values above); k's stay.
    assert each.time["activation_comm"] - summed.time["activation_comm"] == pytest.approx(REDUCE_SCATTER, rel=1e-9)
    assert each.time["redistribution"] - summed.time["redistribution"] == pytest.approx(GATHER_EDGE, rel=1e-9)
    # No two alike: nothing shared.
    apart = [NORM_SP, COLUMN, (1, 1, 2, 2), (1, 2, 2, 1)]
    assert priced(net, apart, "summed")[1].time == priced(net, apart, "each")[1].time


def test_a_reader_without_weights_is_not_pooled():
    net = qkv(residual=True)
    assert reader_groups(net) == (((1, 0), (2, 0), (3, 0)),)
    # The sum reads the norm's output replicated, as the products do: its gather stays.
    configs = [NORM_SP, COLUMN, COLUMN, COLUMN, (1, 1, 1)]
    halved = [False, True, True, True, False]
    _, each = priced(net, configs, "each", halved=halved)
    _, summed = priced(net, configs, "summed", halved=halved)
    # The sum's edge spans the 4 devices as the products' do: GATHER_EDGE too.
    assert each.time["redistribution"] == pytest.approx(4 * GATHER_EDGE, rel=1e-9)
    assert summed.time["redistribution"] == pytest.approx(2 * GATHER_EDGE, rel=1e-9)


def test_per_layer_rows_refuse_the_summed_rule():
    net = qkv()
    rows = [np.asarray([NORM_SP]), np.asarray([COLUMN, COLUMN]), np.asarray([COLUMN]), np.asarray([COLUMN])]
    with pytest.raises(ValueError, match="line up"):
        TrainingCosting(net, rows, H100)
    TrainingCosting(net, rows, H100, readers="each")


def test_llama_70b_nemo_mesh_drops_collectives_not_compute():
    """The NeMo row's mesh (tp 4, sequence parallel) of Llama 3.1 70B, one micro-batch of one
    sequence of 8192 tokens, without tp_overlap: per block k and v share q's reduce-scatter and
    gather, up shares gate's.

    The blocks' input per device once gathered: 8192 x 8192 = 67,108,864 elements,
    134,217,728 bytes. Reduce-scatter over 4: (2 x 3/4 x 134217728 / 450e9 + 18e-6) / 2 =
    (447.392e-6 + 18e-6) / 2 = 232.696e-6 s. Gather edge: 2 x 3/4 x 67108864 x 2 bytes /
    450e9 + 6e-6 = 447.392e-6 + 6e-6 = 453.392e-6 s. Three of each fewer per block, 80 blocks.
    """
    from pase.planning.mesh import Mesh, mesh_configs
    from pase.sources.registry import load

    net = load("hf:examples/hf/llama-3.1-70b.json", 2, 8192)  # dp 2: one sequence per rank
    mesh = Mesh(dp=2, tp=4, sp=True)
    configs = mesh_configs(net, mesh)
    options = TrainingOptions()
    each = evaluate_candidate(net, configs, 8, H100, options, 2.0, mesh=mesh, readers="each").summary
    summed = evaluate_candidate(net, configs, 8, H100, options, 2.0, mesh=mesh).summary
    rs = (2 * 3 / 4 * 8192 * 8192 * 2 / 450e9 + 18e-6) / 2
    edge = 2 * 3 / 4 * 8192 * 8192 * 2 / 450e9 + 6e-6
    assert rs == pytest.approx(232.696e-6, rel=1e-5) and edge == pytest.approx(453.392e-6, rel=1e-5)
    assert each.time["compute"] == summed.time["compute"]
    assert each.time["activation_comm"] - summed.time["activation_comm"] == pytest.approx(80 * 3 * rs, rel=1e-9)
    assert each.time["redistribution"] - summed.time["redistribution"] == pytest.approx(80 * 3 * edge, rel=1e-9)
    assert summed.peak_memory_bytes == each.peak_memory_bytes


def test_the_nemo_row_of_llama_70b_drops_its_collectives_not_its_compute():
    """NeMo's Llama 3.1 70B row (FP8, tp 4, pp 8 interleaved on the even split, tp_overlap as
    NVIDIA's recipe sets it: benchmarks/nemo_runs.TP_OVERLAP_PRESETS): before the readers
    shared, its step told compute 22.66 s, activation collectives 0.4088 s and redistribution
    1.451 s. The compute stays; both collectives fall (three of the five gathers and
    reduce-scatters of a block go, and the rest hide behind the pooled products)."""
    import re

    from cli_runner import run

    status, out, err = run("-g", "hf:examples/hf/llama-3.1-70b.json", "-p", "64", "-b", "256", "-m", "8192",
                           "--machine", "h100-sxm", "--engine", "megatron", "--recipe",
                           "dp=2,tp=4,pp=8,cp=1,zero=1,schedule=interleaved,vpp=5,ep=1,microbatch=1,"
                           "tp_overlap=true,precision=fp8,scaling=current,stages=10/10/10/10/10/10/10/10")
    assert status == 0, err
    step = re.search(r"compute ([0-9.]+), activation collectives ([0-9.]+), redistribution ([0-9.]+)", out)
    compute, activation, moved = (float(x) for x in step.groups())
    assert compute == 22.66
    assert activation < 0.4088 / 2 and moved < 1.451 / 2
