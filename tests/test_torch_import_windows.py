"""Shifted windows (Swin) against hand-built layers: the Roll layer and its exchange, a Softmax
over several axes (a window's tokens), padding by nothing, the 1-D pooler; the refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pase import GraphBuilder, Machine  # noqa: E402
from pase.costing.memory import parameter_count  # noqa: E402
from pase.model.layers import FC, ReduceMean, Roll, Softmax, SoftmaxCrossEntropy  # noqa: E402
from pase.sources.graph_json import network_from_json, network_to_json  # noqa: E402
from pase.sources.torch.importer import UnmappableOpsError, from_torch  # noqa: E402

from test_torch_import import Lambda, assert_same_network  # noqa: E402


def _moved_by_brute_force(shape, shifts, axes, config) -> int:
    """Elements of device 0's block that land on another device, found by rolling owner ids."""
    owner = np.zeros(shape, dtype=np.int64)
    for i, (n, c) in enumerate(zip(shape, config)):
        ids = (np.arange(n) // (n // c)).reshape([-1 if j == i else 1 for j in range(len(shape))])
        owner = owner * c + ids
    moved = np.roll(owner, shifts, axes) != owner  # where an element lands, against where it was
    # Per device, the elements arriving from elsewhere equal those leaving; take device 0's.
    return int(np.sum(moved & (owner == 0)))


def test_roll_exchanges_the_elements_that_leave_a_device_forward_and_back():
    machine = Machine()
    g = GraphBuilder("r", cutoff=1)
    x = g.input((2, 8, 8), "x")
    roll = Roll(x, [3, -3], [1, 2])
    assert roll.shifts == (3, 5) and roll.domain == (2, 8, 8) and roll.output_shapes == ((2, 8, 8),)
    # Split 2 ways along axis 1 (blocks of 4): a shift by 3 sends 3 of 4 rows to the next
    # block: 2 * 3 * 8 = 48 elements a device, exchanged forward and back: 96 rho.
    C = np.array([[1, 2, 1]])
    assert roll.moved(C).tolist() == [48.0]
    assert roll.costs(C, machine).communication.tolist() == [96 * machine.rho]
    # Split along both rolled axes (4 x 4 blocks): an element stays only if it stays along
    # both, 1/4 * 1/4 of the 2*4*4 = 32: 30 leave, 60 rho.
    assert roll.costs(np.array([[1, 2, 2]]), machine).communication.tolist() == [60 * machine.rho]
    # Not split along a rolled axis (the batch split): nothing moves, nothing computed.
    cost = roll.costs(np.array([[2, 1, 1], [1, 1, 1]]), machine)
    assert cost.communication.tolist() == [0.0, 0.0] and cost.compute.tolist() == [0.0, 0.0]
    # Every configuration against rolling the owners' ids.
    for config in itertools.product((1, 2), (1, 2, 4, 8), (1, 2, 4)):
        assert roll.moved(np.array([config]))[0] == _moved_by_brute_force((2, 8, 8), (3, -3), (1, 2), config)
    # A shift by whole blocks (4 rows; blocks of 4, 2, 1) moves every element of a device's block.
    whole = Roll(x, 4, 1)
    assert whole.moved(np.array([[1, 2, 1], [1, 4, 1], [1, 8, 1]])).tolist() == [64.0, 32.0, 16.0]
    again = network_from_json(network_to_json(_one_layer_network(Roll, x=(2, 8, 8), shifts=[3, -3], axes=[1, 2])))
    assert again.layers[0].args == {"shifts": [3, 5], "axes": [1, 2], "batch_dim": 0}


def _one_layer_network(cls, x, **args):
    g = GraphBuilder("one", cutoff=1)
    y = g.add("layer", cls(g.input(x, "x"), **args))
    g.add("loss", SoftmaxCrossEntropy(y))
    return g.build()


def test_a_softmax_over_two_axes_prices_them_as_one():
    machine = Machine()
    g = GraphBuilder("s", cutoff=1)
    x = g.input((2, 3, 4), "x")
    layer = Softmax(x, [1, 2])
    assert layer.axes == (1, 2) and layer.args["axis"] == [1, 2]
    # Split 2 ways along axis 2: E = 2*3*2 = 12 per device, over 3*4 = 12 elements a row:
    # compute 4E + 12E = 192; all-reduces of e = 12 / (3*2) = 2, e*12 = 24, 2 elements over
    # 2 devices, rho each: 28 rho.
    cost = layer.costs(np.array([[1, 1, 2]]), machine)
    assert cost.compute.tolist() == [192.0] and cost.communication.tolist() == [28 * machine.rho]
    # One axis in a list is the one-axis Softmax.
    C = np.array([[1, 1, 2], [2, 3, 1], [1, 1, 1]])
    single = Softmax(x, [2])
    assert single.args["axis"] == 2
    assert single.costs(C, machine).total.tolist() == Softmax(x, 2).costs(C, machine).total.tolist()
    assert network_from_json(network_to_json(_one_layer_network(Softmax, x=(2, 3, 4), axis=[1, 2]))).layers[
        0].axes == (1, 2)
    with pytest.raises(ValueError, match="repeat"):
        Softmax(x, [1, -2])


def _window_attention(m, x):
    """Swin's shifted-window attention, small: 8 x 8 tokens, 4 x 4 windows, shift 2."""
    b = x.shape[0]
    h = torch.roll(m.norm(x), (-2, -2), (1, 2))
    w = h.view(b, 2, 4, 2, 4, 8).permute(0, 1, 3, 2, 4, 5).reshape(b * 4, 16, 8)
    q, k, v = m.q(w), m.k(w), m.v(w)
    y = torch.softmax(q @ k.transpose(1, 2), -1) @ v
    y = y.view(b, 2, 2, 4, 4, 8).permute(0, 1, 3, 2, 4, 5).reshape(b, 8, 8, 8)
    return m.out(torch.roll(y, (2, 2), (1, 2)))


def _window_model():
    return Lambda(_window_attention, norm=nn.LayerNorm(8), q=nn.Linear(8, 8, bias=False),
                  k=nn.Linear(8, 8, bias=False), v=nn.Linear(8, 8, bias=False), out=nn.Linear(8, 8))


def test_shifted_window_attention_imports_with_two_rolls_and_a_softmax_over_a_window():
    model = _window_model()
    net = from_torch(model, (torch.randn(2, 8, 8, 8),))
    rolls = [layer for layer in net.layers if layer.op == "Roll"]
    assert [(r.args["shifts"], r.args["axes"]) for r in rolls] == [([6, 6], [1, 2]), ([2, 2], [1, 2])]
    # The scores' keys are a window's 4 x 4 tokens: one Softmax over both.
    (softmax,) = [layer for layer in net.layers if layer.op == "Softmax"]
    assert len(softmax.axes) == 2 and [softmax.domain[a] for a in softmax.axes] == [4, 4]
    assert parameter_count(net) == sum(p.numel() for p in model.parameters())


def test_shifted_window_attention_runs_sharded_under_jax():
    pytest.importorskip("jax")
    import pase
    from pase.outputs.jax.verify import verify

    net = from_torch(_window_model(), (torch.randn(8, 8, 8, 8),), name="windows")
    found = pase.plan(net, 4, pase.Machine(10.0, 16000.0))
    result = verify(found)
    assert result.ok, result.table()
    # The optimum splits the batch only; split the rolls along both shifted axes and the
    # softmax along one of its two axes, so the run shifts across devices.
    configs = [list(c) for c in found.configs]
    for v, layer in enumerate(net.layers):
        if layer.op == "Roll":
            configs[v] = [1, 2, 2, 1]
        elif layer.op == "Softmax":
            configs[v] = [1] * len(layer.domain)
            configs[v][layer.axes[0]] = 2
            configs[v][0] = 2
    result = verify(net, configs, 4)
    assert result.ok, result.table()


def test_a_roll_read_by_a_layer_is_the_hand_built_roll():
    model = Lambda(lambda m, x: m.out(torch.roll(m.fc(x), -3, 1)), fc=nn.Linear(4, 6), out=nn.Linear(6, 5))
    net = from_torch(model, (torch.randn(2, 8, 4),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 8, 4), "x")
    y = g.add("fc", FC(x, 6, bias=True))
    y = g.add("roll", Roll(y, [5], [1]))
    y = g.add("out", FC(y, 5, bias=True))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build(), procs=(1, 2, 4))


def test_padding_by_nothing_is_the_tensor_and_the_pooler_a_reduce_mean():
    def forward(m, x):
        y = nn.functional.pad(m.fc(x), (0, 0, 0, 0))  # Swin's pad to a multiple of the window
        return m.out(nn.functional.adaptive_avg_pool1d(y, 1).flatten(1))  # (b, 8, 6) -> (b, 8)

    model = Lambda(forward, fc=nn.Linear(4, 6), out=nn.Linear(8, 5))
    net = from_torch(model, (torch.randn(2, 8, 4),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 8, 4), "x")
    y = g.add("fc", FC(x, 6, bias=True))
    y = g.add("mean", ReduceMean(y, [2]))
    y = g.add("out", FC(y, 5, bias=True))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build(), procs=(1, 2))


@pytest.mark.parametrize("forward, words", [
    (lambda m, x: m.fc(nn.functional.pad(x, (0, 1))), "padding by [0, 1] to a larger shape"),
    (lambda m, x: m.fc(torch.roll(x, 1, 0)), "a roll along the batch"),
])
def test_padding_to_a_larger_shape_and_a_roll_of_the_batch_are_refused_in_one_line(forward, words):
    model = Lambda(forward, fc=nn.Linear(5 if "pad" in words else 4, 3))
    with pytest.raises(UnmappableOpsError) as err:
        from_torch(model, (torch.randn(2, 6, 4),))
    message = str(err.value)
    assert "\n" not in message and words in message


def test_a_split_roll_and_a_softmax_over_two_axes_run_under_dtensor():
    from pase.outputs.torch.verify import verify_torch

    def forward(m, x):
        y = torch.roll(m.fc(x), 1, 1)
        z = torch.softmax(y.flatten(1, 2), 1).view(x.shape[0], 4, 4, 8)  # over 4 x 4 positions
        return m.out(z)

    net = from_torch(Lambda(forward, fc=nn.Linear(8, 8), out=nn.Linear(8, 8)), (torch.randn(4, 4, 4, 8),))
    assert [layer.op for layer in net.layers] == ["FC", "Roll", "Softmax", "FC", "SoftmaxCrossEntropy"]
    # The roll and the softmax split along the rolled, normalised axis; the rest the batch.
    configs = [[2 if i == (1 if layer.op in ("Roll", "Softmax") else 0) else 1 for i in range(len(layer.domain))]
               for layer in net.layers]
    result = verify_torch(net, configs, 2, timeout=300)
    assert result.ok, result.table()
