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
from pase.model.layers import Einsum, FC, SoftmaxCrossEntropy, Unstack  # noqa: E402
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
