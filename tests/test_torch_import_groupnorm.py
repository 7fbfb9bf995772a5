"""Group norms, weight-normalised and dilated filters (Wav2Vec2's feature extractor and position
convolution, PoolFormer's norms, DeepLab's atrous convolutions) against hand-built layers and
the models' own parameter counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pase import GraphBuilder  # noqa: E402
from pase.costing.memory import parameter_count  # noqa: E402
from pase.model.layers import Conv, Norm  # noqa: E402
from pase.sources.torch.importer import UnmappableOpsError, from_torch  # noqa: E402

from test_torch_import import Lambda, assert_same_network  # noqa: E402


def _own(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_one_group_per_channel_of_a_sequence_is_a_norm_over_the_length():
    # GroupNorm(4, 4) of (b, 4, w): each channel normalised over its 15 positions.
    def forward(m, x):
        return m.c2(F.gelu(m.gn(m.c1(x))))

    model = Lambda(forward, c1=nn.Conv1d(1, 4, 5, stride=2), gn=nn.GroupNorm(4, 4), c2=nn.Conv1d(4, 6, 3))
    net = from_torch(model, (torch.randn(2, 1, 33),), loss=None)
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 1, 33), "x")
    y = g.add("c1", Conv(x, 4, (1, 5), stride=(1, 2), bias=True))  # 15 positions
    y = g.add("gn", Norm(y, axis=2, pw=1, learnt=0))  # the gelu fused; its scale and shift held
    g.add("c2", Conv(y, 6, (1, 3), bias=True))
    assert_same_network(net, g.build())
    # The per-channel scale and shift (4 each) are read, not the Norm's own (its axis is 15).
    assert parameter_count(net) == _own(model) == 4 * 5 + 4 + 2 * 4 + 6 * 4 * 3 + 6


def test_groups_of_channels_over_an_image_are_a_norm_between_two_reshapes():
    # GroupNorm(2, 4) of (b, 4, 8, 8): statistics over 2 channels x 64 positions each.
    def forward(m, x):
        return m.c2(m.gn(m.c1(x)))

    model = Lambda(forward, c1=nn.Conv2d(3, 4, 3, padding=1), gn=nn.GroupNorm(2, 4), c2=nn.Conv2d(4, 5, 1))
    net = from_torch(model, (torch.randn(2, 3, 8, 8),), loss=None)
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 3, 8, 8), "x")
    y = g.add("c1", Conv(x, 4, 3, pad=1, bias=True))
    y = g.reshape("gn.reshape", y, (2, 2, 128))
    y = g.add("gn", Norm(y, axis=2, learnt=0))
    y = g.reshape("gn.reshape_2", y, (2, 4, 8, 8))
    g.add("c2", Conv(y, 5, 1, bias=True))
    assert_same_network(net, g.build())
    assert parameter_count(net) == _own(model)


def test_a_weight_normalised_filter_is_held_once():
    # weight_norm: the filter is g * v / ||v||, computed from v (the filter's shape) and g (one
    # magnitude per kernel position, dim=2): the Conv holds v, and g is held beside it.
    def forward(m, x):
        return m.conv(m.inp(x))

    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=1, groups=2), dim=2)
    model = Lambda(forward, inp=nn.Conv1d(2, 4, 1), conv=conv)
    net = from_torch(model, (torch.randn(2, 2, 10),), loss=None)
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 2, 10), "x")
    y = g.add("inp", Conv(x, 4, (1, 1), bias=True))
    g.add("conv", Conv(y, 6, (1, 3), pad=(0, 1), bias=True, groups=2))
    assert_same_network(net, g.build())
    v, magnitude = 6 * 2 * 3, 3
    assert parameter_count(net) == _own(model) == 2 * 4 + 4 + v + magnitude + 6


def test_a_dilated_convolution_is_the_undilated_kernel_with_less_padding():
    # 3 x 3 dilated by 2 spans 5 x 5: padding 2 keeps 8 x 8, as the undilated 3 x 3 with padding
    # 1 does, with the same 9 products per output (DeepLab's atrous convolutions).
    def forward(m, x):
        return m.b(m.a(x))

    model = Lambda(forward, a=nn.Conv2d(3, 4, 3, padding=2, dilation=2),
                   b=nn.Conv2d(4, 5, (3, 1), padding=(3, 0), dilation=(3, 1)))
    net = from_torch(model, (torch.randn(2, 3, 8, 8),), loss=None)
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 3, 8, 8), "x")
    y = g.add("a", Conv(x, 4, 3, pad=1, bias=True))
    g.add("b", Conv(y, 5, (3, 1), pad=(1, 0), bias=True))  # 3 rows dilated by 3 span 7, 4 more: 2 less each side
    assert_same_network(net, g.build())
    assert net.layers[1].output_shapes == ((2, 5, 8, 8),)


def test_a_dilated_convolution_padded_less_than_it_spreads_is_refused():
    model = nn.Conv2d(3, 4, 3, padding=1, dilation=3)  # spans 7: 1 each side is less than the 2 added
    with pytest.raises(UnmappableOpsError) as info:
        from_torch(model, (torch.randn(2, 3, 12, 12),), loss=None)
    assert "\n" not in str(info.value) and "dilated convolution padded by less" in str(info.value)
