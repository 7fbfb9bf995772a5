"""Strided slices (``x[..., ::2]``, ``x[..., 1::2]``) against hand-built layers: an interleaved
rotary that puts its pieces back costs no layer, a piece a layer reads is an Unstack of the
refined dimension, and the strided slices no layer expresses are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pase import GraphBuilder, Machine  # noqa: E402
from pase.costing.memory import parameter_count  # noqa: E402
from pase.model.layers import Concat, Einsum, FC, SoftmaxCrossEntropy, Unstack  # noqa: E402
from pase.sources.torch.importer import UnmappableOpsError, from_torch  # noqa: E402

from test_torch_import import Lambda, assert_same_network  # noqa: E402


def test_interleaved_partial_rotary_costs_no_layer():
    # GPT-J's rotate_every_two on the first 4 of 8 channels of each head.
    cos, sin = torch.randn(4, 1, 4), torch.randn(4, 1, 4)

    def rotate_every_two(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    def forward(m, x):
        q = m.q(x).view(2, 4, 2, 8)
        rot, rest = q[..., :4], q[..., 4:]
        rot = rot * cos + rotate_every_two(rot) * sin
        return m.out(torch.cat((rot, rest), dim=-1).flatten(2))

    model = Lambda(forward, q=nn.Linear(16, 16, bias=False), out=nn.Linear(16, 16, bias=False))
    net = from_torch(model, (torch.randn(2, 4, 16),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 4, 16), "x")
    # The pieces stacked back are the rotary's channels reordered within the head, which the
    # cost model does not see: the mul, neg, mul and add ride along with q (pw 4), as the
    # rotate_half rotary's do; no Unstack, no Stack, no Concat.
    h = g.add("q", Einsum("bst,nct->bsnc", x, g.weight((2, 8, 16)), pw=4))
    y = g.add("out", Einsum("bscd,ncd->bsn", h, g.weight((16, 2, 8))))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build(), procs=(1, 4))


def test_a_strided_piece_read_by_a_layer_is_an_unstack_of_the_refined_dimension():
    model = Lambda(lambda m, x: m.out(m.q(x).view(2, 4, 16)[..., 1::2]), q=nn.Linear(16, 16, bias=False),
                   out=nn.Linear(8, 5, bias=False))
    net = from_torch(model, (torch.randn(2, 4, 16),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 4, 16), "x")
    # x[..., 1::2] is element 1 of the inner factor of 16 = (8, 2): q writes (b, s, 8, 2)
    # and an Unstack of its last axis hands its second output to the FC.
    h = g.add("q", Einsum("bst,nct->bsnc", x, g.weight((8, 2, 16))))
    _, odd = g.add("split", Unstack(h, 3, batch_dim=0))
    y = g.add("out", FC(odd, 5))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build(), procs=(1, 2, 4))
    assert sorted(net.edges) == [(0, 1), (1, 2), (2, 3)]
    assert net.edges[(1, 2)][0].output_index == 1
    # The Unstack moves nothing: it keeps its axis whole and costs nothing.
    split = net.layers[1]
    assert split.domain == (2, 4, 8, 1)
    assert split.costs(np.array([[2, 1, 2, 1]]), Machine()).total.tolist() == [0.0]
    assert parameter_count(net) == 16 * 16 + 8 * 5


@pytest.mark.parametrize("index", [slice(1, 7, 2), slice(2, None, 2), slice(None, None, 3)])
def test_a_strided_slice_that_is_not_every_step_th_element_is_refused_in_one_line(index):
    model = Lambda(lambda m, x: m.out(m.q(x)[..., index]), q=nn.Linear(16, 16, bias=False),
                   out=nn.Linear(len(range(16)[index]), 5))
    with pytest.raises(UnmappableOpsError) as err:
        from_torch(model, (torch.randn(2, 4, 16),))
    message = str(err.value)
    assert "\n" not in message and "aten.slice" in message and "strided slice" in message


def _mla_key(m, x, heads):
    """MLA's key: a per-head part and one shared rotary head, written by slice assignment."""
    b = x.shape[0]
    nope = m.nope(x).view(b, 4, heads, 6).transpose(1, 2)  # (b, h, l, 6)
    rope = m.rope(x).view(b, 1, 4, 2).expand(-1, heads, -1, -1)  # one head, every head's
    k = nope.new_empty(b, heads, 4, 8)
    k[..., :6].copy_(nope)
    k[..., 6:].copy_(rope)
    return k


def test_slice_assignment_into_a_new_tensor_is_a_concat_that_broadcasts_a_shared_head():
    model = Lambda(lambda m, x: m.out(_mla_key(m, x, 2).transpose(1, 2).flatten(2)),
                   nope=nn.Linear(8, 12, bias=False), rope=nn.Linear(8, 2, bias=False), out=nn.Linear(16, 5))
    net = from_torch(model, (torch.randn(2, 4, 8),))
    concat = next(layer for layer in net.layers if layer.op == "Concat")
    assert [t.shape for t in concat.inputs] == [(2, 2, 4, 6), (2, 1, 4, 2)]
    assert concat.output_shapes == ((2, 2, 4, 8),) and concat.broadcast == ((), (1,))
    assert parameter_count(net) == sum(p.numel() for p in model.parameters())
    # Split the heads 2 ways: the shared head (2*1*4*2 = 16 elements) is whole on each device,
    # and its gradient sums over the heads: an all-reduce of 16 elements over 2 devices,
    # rho * 16 / 2 * 2 * (2 - 1) = 16 rho; the per-head part is split like the output.
    machine = Machine()
    C = np.array([[1, 2, 1, 1], [2, 1, 2, 1]])
    assert [c.tolist() for c in concat.input_configs(C)] == [C.tolist(), [[1, 1, 1, 1], [2, 1, 2, 1]]]
    assert concat.costs(C, machine).communication.tolist() == [16 * machine.rho, 0.0]
    # Not broadcast: the reference Concat stays free of communication.
    g = GraphBuilder("c", cutoff=1)
    plain = Concat([g.input((2, 2, 4, 6), "a"), g.input((2, 2, 4, 2), "b")], 3)
    assert plain.broadcast == ((), ()) and plain.costs(C, machine).communication.tolist() == [0.0, 0.0]


def test_a_broadcast_concat_keeps_its_shapes_in_the_graph_file_and_runs_under_jax():
    pytest.importorskip("jax")
    import pase
    from pase.outputs.jax.verify import verify
    from pase.sources.graph_json import network_from_json, network_to_json

    model = Lambda(lambda m, x: m.out(_mla_key(m, x, 4).transpose(1, 2).flatten(2)),
                   nope=nn.Linear(8, 24, bias=False), rope=nn.Linear(8, 2, bias=False), out=nn.Linear(32, 5))
    net = from_torch(model, (torch.randn(8, 4, 8),), name="mla_key")
    again = network_from_json(network_to_json(net))
    concat = next(layer for layer in again.layers if layer.op == "Concat")
    assert concat.broadcast == ((), (1,))
    found = pase.plan(net, 4, pase.Machine(10.0, 16000.0))
    # The plan splits the Concat's heads, so the run broadcasts the shared head on each device.
    v = next(i for i, layer in enumerate(net.layers) if layer.op == "Concat")
    assert found.configs[v][1] > 1
    result = verify(found)
    assert result.ok, result.table()


def test_reading_a_tensor_written_only_in_part_by_slice_assignment_is_refused_in_one_line():
    def forward(m, x):
        k = x.new_zeros(2, 4, 8)
        k[..., :6].copy_(m.a(x))
        return m.out(k)

    model = Lambda(forward, a=nn.Linear(8, 6, bias=False), out=nn.Linear(8, 5))
    with pytest.raises(UnmappableOpsError) as err:
        from_torch(model, (torch.randn(2, 4, 8),))
    message = str(err.value)
    assert "\n" not in message and "only partly written by slice assignment" in message
