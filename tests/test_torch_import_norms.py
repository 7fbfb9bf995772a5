"""Vector norms (``torch.linalg.vector_norm``, ``Tensor.norm``, ``F.normalize``) against
hand-built layers: dividing a tensor by its own norm over the last axis is an RMSNorm; a norm
read otherwise is a statistic priced like the mean (a ReduceMean). And the product of such a
norm's reshaped output with a tensor that keeps the dimensions it merged (Swin-v2's cosine
attention over windows)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pase import GraphBuilder  # noqa: E402
from pase.model.layers import FC, Einsum, Norm, ReduceMean, RMSNorm, SoftmaxCrossEntropy  # noqa: E402
from pase.sources.torch.importer import from_torch  # noqa: E402

from test_torch_import import Lambda, assert_same_network  # noqa: E402


def test_normalize_over_the_last_axis_is_an_rms_norm_without_a_scale():
    # x / max(||x||, eps) = x / (sqrt(n) rms(x)): an RMSNorm up to a constant, no learnt vector.
    def forward(m, x):
        return m.b(F.normalize(m.a(x), dim=-1))

    net = from_torch(Lambda(forward, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (torch.randn(4, 5, 8),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 5, 8), "x")
    x = g.add("a", FC(x, 16))
    x = g.add("norm", RMSNorm(x, axis=-1, learnt=0))  # norm, clamp_min, expand_as, div: the norm
    x = g.add("b", FC(x, 4))
    g.add("loss", SoftmaxCrossEntropy(x))
    assert_same_network(net, g.build())
    assert net.layers[1].op == "RMSNorm"


def test_divided_by_its_vector_norm_is_the_same_rms_norm():
    # Cosine attention's q / q.norm(dim=-1, keepdim=True), written without F.normalize.
    def written(m, x):
        y = m.a(x)
        return m.b(y / torch.linalg.vector_norm(y, dim=-1, keepdim=True))

    def library(m, x):
        return m.b(F.normalize(m.a(x), dim=-1))

    x = torch.randn(4, 5, 8)
    got = from_torch(Lambda(written, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (x,))
    want = from_torch(Lambda(library, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (x,))
    assert_same_network(got, want)


def test_a_norm_read_by_a_layer_is_a_reduce_mean():
    # The norm over the sequence, read by a Linear: a statistic over axis 1, like the mean.
    def forward(m, x):
        return m.b(torch.linalg.vector_norm(m.a(x), dim=1))

    net = from_torch(Lambda(forward, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (torch.randn(4, 5, 8),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 5, 8), "x")
    x = g.add("a", FC(x, 16))
    x = g.add("norm", ReduceMean(x, 1))
    x = g.add("b", FC(x, 4))
    g.add("loss", SoftmaxCrossEntropy(x))
    assert_same_network(net, g.build())


def test_a_product_with_its_norm_is_not_a_norm():
    # Only a division by the norm normalises: y * ||y|| is the statistic and a broadcast product,
    # as y * sum(y) is.
    def normed(m, x):
        y = m.a(x)
        return m.b(y * y.norm(dim=-1, keepdim=True))

    def meaned(m, x):
        y = m.a(x)
        return m.b(y * y.sum(-1, keepdim=True))

    x = torch.randn(4, 5, 8)
    got = from_torch(Lambda(normed, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (x,))
    want = from_torch(Lambda(meaned, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (x,))
    assert "RMSNorm" not in [layer.op for layer in got.layers]
    assert [layer.op for layer in got.layers][:2] == ["FC", "ReduceMean"]
    assert_same_network(got, want)


def test_a_norm_over_another_axis_divides_by_broadcast():
    # ||y|| over the sequence (axis 1), not the last axis: no norm layer, a ReduceMean and an
    # Elementwise whose second operand (4, 1, 16) broadcasts along the sequence.
    def forward(m, x):
        y = m.a(x)
        return m.b(y / y.norm(dim=1, keepdim=True))

    net = from_torch(Lambda(forward, a=nn.Linear(8, 16), b=nn.Linear(16, 4)), (torch.randn(4, 5, 8),))
    ops = [layer.op for layer in net.layers]
    assert "RMSNorm" not in ops and "ReduceMean" in ops
    product = next(layer for layer in net.layers if layer.op == "Elementwise")
    assert [t.shape for t in product.inputs] == [(4, 5, 16), (4, 1, 16)] and product.broadcast == ((), (1,))


def test_a_product_of_a_merged_dimension_and_its_pieces_reshapes_both_operands():
    # (images, windows) = (2, 3) merged into 6: the transposed norm reads a Reshape whose output
    # has one frozen atom of 6; the other operand still has the norm's 2 and 3, frozen by that
    # Reshape. They cannot be paired, so the second operand is reshaped too (once refused).
    def forward(m, x):
        y = m.ln(x).reshape(6, 4, 8)
        q = F.normalize(y.transpose(1, 2), dim=-1)  # (6, 8, 4): normalised over the 4 tokens
        return m.b(q @ y)

    net = from_torch(Lambda(forward, ln=nn.LayerNorm(8), b=nn.Linear(8, 5)), (torch.randn(2, 3, 4, 8),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 3, 4, 8), "x")
    y = g.add("ln", Norm(x, axis=-1))
    q = g.add("norm", RMSNorm(g.reshape("reshape", y, (6, 8, 4)), axis=-1, learnt=0))
    y = g.reshape("reshape_2", y, (6, 4, 8))
    z = g.add("matmul", Einsum("wdt,wte->wde", q, y))
    z = g.add("b", FC(z, 5))
    g.add("loss", SoftmaxCrossEntropy(z))
    assert_same_network(net, g.build())
