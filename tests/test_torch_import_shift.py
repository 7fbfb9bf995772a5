"""A token shift (a slice padded back to its source's size: MobileBERT's trigram embedding)
against hand-built layers: a Roll along the shifted dimension; other paddings stay refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pase import GraphBuilder  # noqa: E402
from pase.model.layers import FC, Concat, Roll, SoftmaxCrossEntropy  # noqa: E402
from pase.sources.torch.importer import UnmappableOpsError, from_torch  # noqa: E402

from test_torch_import import Lambda, assert_same_network  # noqa: E402


def test_a_slice_padded_back_to_size_is_a_roll():
    # y[:, 1:] padded by one row at the end is y shifted back by one, the last row zero: a Roll
    # by -1 moves the same rows across devices (the one it brings round is the zero row).
    def forward(m, x):
        y = m.a(x)
        left = F.pad(y[:, 1:], (0, 0, 0, 1))
        right = F.pad(y[:, :-1], (0, 0, 1, 0))
        return m.b(torch.cat([left, y, right], dim=2))

    net = from_torch(Lambda(forward, a=nn.Linear(8, 8), b=nn.Linear(24, 5)), (torch.randn(4, 6, 8),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 6, 8), "x")
    y = g.add("a", FC(x, 8))
    left = g.add("roll", Roll(y, [-1], [1]))
    right = g.add("roll_2", Roll(y, [1], [1]))
    z = g.add("concat", Concat([left, y, right], axis=2))
    z = g.add("b", FC(z, 5))
    g.add("loss", SoftmaxCrossEntropy(z))
    assert_same_network(net, g.build())
    assert [layer.shifts for layer in net.layers[1:3]] == [(5,), (1,)]


@pytest.mark.parametrize("pad", [
    (0, 0, 0, 2),  # two rows after a slice that dropped one: larger than the source
    (1, 0, 0, 1),  # the channels padded as well
    (0, 0, 0, 0, 0, 1),  # along another dimension than the slice's
])
def test_other_paddings_of_a_slice_stay_refused(pad):
    def forward(m, x):
        return m.b(F.pad(m.a(x)[:, 1:], pad).sum(1)[:, :8])

    with pytest.raises(UnmappableOpsError) as info:
        from_torch(Lambda(forward, a=nn.Linear(8, 8), b=nn.Linear(8, 5)), (torch.randn(4, 6, 8),))
    assert "\n" not in str(info.value) and "aten.pad" in str(info.value) and "larger shape" in str(info.value)
