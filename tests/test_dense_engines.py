"""Two dense mechanisms as torchtitan runs them (issue 42, item 4), by hand: torchao's FP8
``rowwise`` recipe (tensor parallelism in BF16, the gathered operand cast whole; async TP fusing
only its matmul-reduce-scatters) and torch's asynchronous tensor parallelism over symmetric memory
(one step per peer with nothing to hide behind, the reduce-scatter's partials summed after)."""

import numpy as np
import pytest

from pase.costing.precision import tp_overlap_share
from pase.costing.training import TrainingOptions
from pase.model.layers.work import AllReduce
from pase.planning.mesh import Mesh

# As tests/test_calibration_nemo.py (the same machine and Llama 3.1 8B costing): no measured table, a
# GEMM at its format's peak, memory-bound work at 2000 GB/s; 450 GB/s + 3 us inside a node.
from test_calibration_nemo import _llama  # noqa: E402

CURRENT = TrainingOptions(precision="fp8", fp8_scaling="current")  # 6 bytes a cast element
ROWWISE = TrainingOptions(precision="fp8", fp8_scaling="rowwise")  # 6 bytes too, per orientation fused


def _delta(costing, v, gemm_flops, options):
    """FP8 compute minus BF16 compute of layer v, less the GEMM's own change: the casts."""
    after = float(costing.compute(v, options)[0]) - float(costing.compute(v, TrainingOptions())[0])
    return after - (gemm_flops / 2000e12 - gemm_flops / 1000e12)


def test_rowwise_casts_the_gathered_operand_whole():
    """tp 2 with sequence parallelism: under tensorwise (current) scaling q casts its local input
    shard before an FP8 all-gather (128 x 4096 / 2 = 262,144, tests/test_calibration_nemo.py);
    torchao's rowwise recipe gathers in BF16 and casts the gathered 524,288 on every device
    (torchtitan docs/float8.md: "all distributed communication is done in high precision")."""
    sp = _llama(Mesh(dp=1, tp=2, sp=True))
    q, o = 2, 10
    # q: input 524,288 + output gradient 128 x 2048 = 262,144 + weight 2048 x 4096 = 8,388,608.
    assert _delta(sp, q, 6 * 128 * 2048 * 4096, CURRENT) == pytest.approx(8_912_896 * 6 / 2000e9, rel=1e-9)
    assert _delta(sp, q, 6 * 128 * 2048 * 4096, ROWWISE) == pytest.approx(9_175_040 * 6 / 2000e9, rel=1e-9)
    # o (row-parallel): its output gradient gathered in the backward pass, 524,288 cast whole.
    assert _delta(sp, o, 6 * 128 * 4096 * 2048, ROWWISE) == pytest.approx(9_175_040 * 6 / 2000e9, rel=1e-9)


def test_rowwise_async_tp_hides_half_of_the_tensor_parallel_collectives():
    """Async TP fuses the matmul-reduce-scatters with rowwise scales, not the all-gather-matmuls
    (pytorch issue 149990): of a layer's collectives a (as many all-gathered as reduce-scattered)
    at most a / 2 hide behind its compute c; nothing is left to hide the redistribution into it."""
    assert tp_overlap_share(ROWWISE) == 0.5 and tp_overlap_share(CURRENT) == 1.0
    sp = _llama(Mesh(dp=1, tp=2, sp=True))
    q = 2
    for base in (CURRENT, ROWWISE):
        o = base.but(tp_overlap=True, overlap_efficiency=1.0, comm_sm_share=0.0)
        a = float(sp.collectives.charged_activation(q)[0])
        c = float(sp.step_compute.compute(q, o)[0])
        pooled = sum(float(sp.collectives.charged_activation(w)[0]) for w, rows in
                     sp.collectives.reader_pools().get(q, ()) if rows[0])
        pooled_c = sum(float(sp.step_compute.compute(w, o)[0]) for w, rows in
                       sp.collectives.reader_pools().get(q, ()) if rows[0])
        a, c = a + pooled, c + pooled_c
        share = tp_overlap_share(base)
        assert float(sp.collectives.exposed_activation(q, o)[0]) == pytest.approx(a - min(a * share, c), rel=1e-9)
    leftover = sp.collectives.overlap_leftover(q, ROWWISE.but(tp_overlap=True))
    assert float(np.asarray(leftover).ravel()[0]) == 0.0


def test_async_tp_over_symmetric_memory_by_hand():
    """torch's micro-pipelined TP (tp_overlap_kind symmetric_memory): per activation all-reduce of
    n elements over q devices, 1/q of the collective runs with nothing to hide behind, and the
    q partials (n elements) are summed after the last copy: n (1 + 1/q) elements streamed."""
    sp = _llama(Mesh(dp=1, tp=2, sp=True))
    machine = sp.machine
    v = 2  # q: column-parallel, its input gradient all-reduced over the 2 (a reduce-scatter under sp)
    pieces = [p for p in sp.parts[v].work.communication.pieces() if isinstance(p, AllReduce) and not p.weight
              and int(np.asarray(p.group.size).ravel()[0]) > 1]  # an all-reduce over one device costs nothing
    assert len(pieces) == 1 and int(np.asarray(pieces[0].group.size).ravel()[0]) == 2
    expected = 0.0
    for p in pieces:
        n, q = float(np.asarray(p.elements).ravel()[0]), 2.0
        assert n == 128 * 4096  # the input gradient: 128 tokens x 4096
        # all_reduce of n elements over 2 in one node: 2 (1/2) 2n / 450e9 + 2 x 3e-6, over q = 2;
        # the partials: n (1 + 1/2) elements read and written once: 2 bytes each, copy traffic.
        fill = (2 * 0.5 * 2 * n / 450e9 + 2 * 3e-6) / q
        partials = float(machine.memory_bound("copy", n * (1 + 1 / q) / 2))
        expected += fill + partials
    expected *= float(sp.collectives.activation_scale[v][0])
    o = TrainingOptions(tp_overlap=True, tp_overlap_kind="symmetric_memory")
    assert float(np.asarray(sp.collectives.async_tp_extra(v, o)).ravel()[0]) == pytest.approx(expected, rel=1e-9)
    assert sp.collectives.async_tp_extra(v, o.but(tp_overlap_kind="userbuffers")) == 0.0
    assert sp.collectives.async_tp_extra(v, o.but(tp_overlap=False)) == 0.0
