"""A layer's cost in parts (``Layer.work``, ``pase.model.layers.work``): the parts the training
model reads add up to the paper's ``costs`` for every layer type, each piece is priced by the
machine's own protocol call, and a machine or a piece nobody prices raises instead of being
counted in every part."""

import numpy as np
import pytest

from pase.costing.training import layer_parts, structure_key
from pase.machines.base import Group
from pase.machines.calibrated import PRESETS, CalibratedMachine
from pase.machines.paper import Machine as PaperMachine
from pase.machines.registry import load_machine
from pase.model.builder import GraphBuilder
from pase.model.configs import enumerate_configs
from pase.model.layers import (
    FC, LAYER_TYPES, LSTM, BatchNorm, Concat, Conv, Einsum, Elementwise, Layer, MoE, Norm, Pooling, Ravel,
    ReduceMean, RMSNorm, Roll, Softmax, SoftmaxCrossEntropy, Stack, Unravel, Unstack,
)
from pase.model.layers.work import AllReduce, Exchange, Gemm, LayerWork, Nothing, Pass, Piece
from pase.sources.registry import load

PROCS = 8


def every_layer_type():
    """One network with the layer types the built-in graphs lack (grouped convolution, pooling,
    roll, stack, a banded product with a fused pass, a mixture of experts with shared experts ...)."""
    g = GraphBuilder("every-type", 1, batch=8)
    x = g.input((8, 16, 12, 12), "x", letters="bchw")
    c = g.add("gconv", Conv(x, 32, 3, pad=1, pw=1, bias=True, groups=4))
    p = g.add("pool", Pooling(c, 2, stride=2))
    bn = g.add("bn", BatchNorm(p, pw=1))
    r = g.add("roll", Roll(bn, [1, 2], [2, 3]))
    gate = g.input((8, 32, 1, 1), "gate", letters="bchw")
    e = g.add("se", Elementwise(r, gate, pw=1))
    m = g.add("mean", ReduceMean(e, (2, 3)))
    st = g.add("stack", Stack([m, m], axis=0))
    un = g.add("unstack", Unstack(st, axis=0))
    cat = g.add("cat", Concat([un[0], un[1]], axis=1))
    flat = g.add("ravel", Ravel(cat))
    shaped = g.add("unravel", Unravel(flat, (8, 64), letters="bk"))
    f = g.add("fc", FC(shaped, 64, pw=2, bias=True))
    g.add("loss", SoftmaxCrossEntropy(f))
    q = g.input((8, 64, 8), "q", letters="bsd")
    k = g.input((8, 64, 8), "k", letters="btd")
    scores = g.add("band", Einsum("bsd,btd->bst", q, k, pw=1, window=16, band="st"))
    probs = g.add("sm", Softmax(scores, axis=-1, causal=True, window=16, alibi=True, softcap=30.0))
    ctx = g.add("ctx", Einsum("bst,btd->bsd", probs, k))
    w = g.weight((8, 8), "w", letters="de")
    o = g.add("proj", Einsum("bsd,de->bse", ctx, w, bias=True))
    one = g.input((8, 1, 8), "one", letters="bse")
    joined = g.add("joined", Concat([o, one], axis=2))
    n = g.add("ln", Norm(joined, pw=1))
    n = g.add("rms", RMSNorm(n))
    g.add("moe", MoE(n, 8, 2, 16, shared=1, shared_hidden=16, shared_gate=True, groups=4, group_top=2,
                     capacity=1.25, imbalance=1.5))
    seq = g.input((8, 10, 32), "seq", letters="bsk")
    g.add("lstm", LSTM(seq, 2))
    return g.build()


NETWORKS = {
    "every-type": every_layer_type,
    "alexnet": lambda: load("alexnet", 8),
    "inception3": lambda: load("inception3", 8),
    "rnnlm": lambda: load("rnnlm", 8),
    "transformer": lambda: load("transformer", 8, 128),
    "gpt2-small": lambda: load("gpt2-small", 8, 128),
    "llama3-8b": lambda: load("llama3-8b", 4, 256),
    "deepseek-v3": lambda: load("deepseek-v3", 4, 128),
    "gpt-oss-120b": lambda: load("gpt-oss-120b", 4, 256),
    "hf-gemma-3": lambda: load("hf:examples/hf/gemma-3-27b.json", 2, 2048),
}


def _distinct_layers(network):
    seen = {}
    for layer in network.layers:
        seen.setdefault(structure_key(layer), layer)
    return list(seen.values())


def _check_parts_sum_to_costs(network, machine) -> set:
    types = set()
    for layer in _distinct_layers(network):
        types.add(layer.op)
        C = enumerate_configs(layer.domain, PROCS, 1, layer.unsplit, layer.contiguous)
        cost = layer.costs(C, machine)
        parts = layer_parts(layer, C, machine)
        compute = np.asarray(cost.compute, dtype=np.float64) * np.ones(len(C))
        communication = np.asarray(cost.communication, dtype=np.float64) * np.ones(len(C))
        # The compute part is the paper's compute, to the bit; the collectives split into the
        # activation and the weight-gradient parts, which add up to its communication.
        assert np.array_equal(parts.compute, compute), layer
        assert parts.activation + parts.gradient == pytest.approx(communication, rel=1e-12, abs=1e-300), layer
        # Every piece is in one part: nothing is counted twice nor left out.
        assert parts.compute + parts.activation + parts.gradient == pytest.approx(compute + communication,
                                                                                   rel=1e-12, abs=1e-300), layer
    return types


@pytest.mark.parametrize("machine_name", ["h100-sxm", "paper"])
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_parts_sum_to_costs(name, machine_name):
    _check_parts_sum_to_costs(NETWORKS[name](), load_machine(machine_name))


@pytest.mark.parametrize("machine_name", ["h100-sxm", "paper"])
def test_parts_sum_to_costs_for_an_imported_model(machine_name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    network = load("torch:examples/hf_llama.py:tiny_llama", 4)
    _check_parts_sum_to_costs(network, load_machine(machine_name))


def test_the_networks_cover_every_layer_type():
    types = set()
    for name in ("every-type", "rnnlm", "gpt2-small"):
        types |= {layer.op for layer in NETWORKS[name]().layers}
    # Embedding (gpt2-small) and every other registered type: a new type needs a line above.
    assert types == set(LAYER_TYPES)


def test_a_layer_type_without_work_says_so():
    class Opaque(Layer):  # no op: not registered
        pass

    layer = Opaque.__new__(Opaque)
    with pytest.raises(NotImplementedError, match="Opaque describes no work"):
        layer.costs(np.ones((1, 1), dtype=np.int64), PaperMachine())


# ---------------------------------------------------------------------------------------
# Priced by hand, through the protocol


def test_parts_of_a_tensor_parallel_fc_by_hand():
    # FC 8 x 1000 -> 500 split 2 ways over the units n and 2 over the batch: per device a GEMM of
    # B = 1, M = 4, N = 250, K = 1000. Paper machine (rho = 10 * 1000 / (16 / 8) = 5000):
    g = GraphBuilder("fc", 1, batch=8)
    x = g.input((8, 1000), "x", letters="bk")
    g.add("fc", FC(x, 500))
    layer = g.build().layers[0]
    C = np.array([[2, 2, 1]])
    parts = layer_parts(layer, C, PaperMachine())
    # compute: 3 M N K = 3 x 4 x 250 x 1000 = 3e6
    assert parts.compute.tolist() == [3e6]
    # activation: the input's gradient (4 x 1000 elements) all-reduced over the 2 devices of n:
    # rho (4000 / 2) 2 (2 - 1) = 5000 x 4000 = 2e7
    assert parts.activation.tolist() == [2e7]
    # weight gradient (250 x 1000) over the 2 devices of the batch: 5000 x 250000 = 1.25e9; the
    # paper machine prices a gradient like an activation, so gather = gradient.
    assert parts.gradient.tolist() == [1.25e9] and parts.gather.tolist() == [1.25e9]
    # GEMM shapes for another format: operands 4 x 1000 + 1000 x 250 + 4 x 250 = 255000
    assert parts.gemm_elements().tolist() == [255000.0]
    assert parts.gemm_seconds(PaperMachine()).tolist() == [3e6]


def test_a_work_expression_adds_in_the_formula_order():
    # 1 GEMM 2 x 4 by 4 x 3 (3 M N K = 72 on the paper machine) plus twice a pass of 18 FLOPs,
    # times 0.5: (72 + 2 x 18) x 0.5 = 54; a piece nobody prices (None) counts nothing.
    work = (Gemm(1.0, 2.0, 3.0, 4.0) + 2 * Pass("gelu", 6.0, 18.0)) * 0.5
    machine = PaperMachine()
    assert work.value(lambda piece: piece.priced(machine)) == 54.0
    assert work.value(lambda piece: piece.priced(machine) if isinstance(piece, Gemm) else None) == 36.0
    assert work.value(lambda piece: None) is None
    assert [type(p).__name__ for p in work.pieces()] == ["Gemm", "Pass"]
    assert LayerWork(Nothing(), Nothing()).cost(machine, rows=2).total.tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------------------------
# Nothing priced behind the protocol's back


class _WithoutAllToAll:
    """An H100 that answers every call of the protocol but ``all_to_all`` (no ``__getattr__``)."""

    def __init__(self):
        self._m = CalibratedMachine(PRESETS["h100-sxm"])
        for name in ("name", "cost_unit", "act_bytes", "grad_bytes", "devices_per_node"):
            setattr(self, name, getattr(self._m, name))

    def gemm(self, *args, **kwargs):
        return self._m.gemm(*args, **kwargs)

    def memory_bound(self, *args, **kwargs):
        return self._m.memory_bound(*args, **kwargs)

    def all_reduce(self, *args, **kwargs):
        return self._m.all_reduce(*args, **kwargs)

    def exchange(self, *args, **kwargs):
        return self._m.exchange(*args, **kwargs)

    def all_gather(self, *args, **kwargs):
        return self._m.all_gather(*args, **kwargs)

    def reduce_scatter(self, *args, **kwargs):
        return self._m.reduce_scatter(*args, **kwargs)


def _moe():
    g = GraphBuilder("moe")
    x = g.input((8, 16, 32), "x", letters="ble")
    g.add("moe", MoE(x, 8, 2, 64))
    return g.build().layers[0]


def test_a_machine_lacking_a_call_raises():
    layer = _moe()
    C = np.array([[1, 1, 8, 1, 1]])  # experts split 8 ways: four all-to-alls
    machine = _WithoutAllToAll()
    with pytest.raises(AttributeError, match="all_to_all"):
        layer_parts(layer, C, machine)
    with pytest.raises(AttributeError, match="all_to_all"):
        layer.costs(C, machine)
    # A layer that makes no all-to-all is priced as on the machine itself.
    dense = FC(GraphBuilder("x").input((8, 32), "x", letters="bk"), 16)
    D = np.array([[2, 2, 1]])
    assert np.array_equal(layer_parts(dense, D, machine).gradient, layer_parts(dense, D, machine._m).gradient)


class _Broadcast(Piece):
    """A collective the training model has no part for."""

    def __init__(self, elements, group):
        self.elements, self.group = elements, group

    def priced(self, machine):
        return machine.exchange(self.elements, self.group)


class _Novel(FC):
    """An FC that also broadcasts its output (no op of its own: not registered)."""

    def work(self, C):
        work = super().work(C)
        (group,) = self._groups(C, (0,))
        return LayerWork(work.compute, work.communication + _Broadcast(self._E(C), group))


def test_a_piece_no_part_prices_raises():
    layer = _Novel(GraphBuilder("x").input((8, 32), "x", letters="bk"), 16)
    C = np.array([[2, 1, 1]])
    machine = load_machine("h100-sxm")
    # The paper's cost prices it (its own call) ...
    assert layer.costs(C, machine).communication[0] > 0
    # ... the training model, which would have to put it in one part, refuses.
    with pytest.raises(TypeError, match="prices no _Broadcast"):
        layer_parts(layer, C, machine)


def test_collectives_say_which_part_they_are():
    group = Group.flat(2)
    assert AllReduce(1.0, group).activation and not AllReduce(1.0, group).weight
    assert AllReduce(1.0, group, weight=True).weight and not AllReduce(1.0, group, weight=True).activation
    assert Exchange(1.0, group).activation
    assert not Gemm(1, 1, 1, 1).activation and not Pass("add", 1.0, 1.0).weight


def test_a_lookup_runs_no_gemm_a_format_would_convert():
    # The transformer's decoder embedding sits in its first decoder block; a lookup is a gather
    # (a copy pass), so its parts list no GEMM (0 operand elements) and FP8 leaves it in BF16.
    from pase.costing.training import TrainingCosting
    network = load("transformer", 2, 64)
    v = next(i for i, layer in enumerate(network.layers) if layer.lookup_table and network.blocks[i] is not None)
    costing = TrainingCosting(network, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in network.layers],
                              load_machine("h100-sxm"))
    assert costing.parts[v].gemm_elements().tolist() == [0.0]
    assert not costing.precision.eligible()[v]
    # Its copy pass still counts the product it stands for on the paper machine: the einsum of
    # the one-hot (2 x 256 tokens, 50000 words) by the (50000 x 64) table, 3 M N K =
    # 3 x 512 x 64 x 50000 FLOP-equivalents.
    layer = network.layers[v]
    assert layer.domain == (2, 256, 64, 50000)
    C = np.ones((1, 4), dtype=np.int64)
    assert layer.costs(C, PaperMachine()).compute.tolist() == [3.0 * 512 * 64 * 50000]
