"""ResNet-101 (``docs/graphs.md``): 245 vertices of bottleneck blocks, cut-off 4."""

from __future__ import annotations

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import FC, BatchNorm, Conv, Elementwise, Pooling, ReduceMean, SoftmaxCrossEntropy
from pase.model.tensor import Tensor

__all__ = ["resnet101"]

#: (planes, blocks, stride) of the four stages.
STAGES = ((64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2))
EXPANSION = 4


def _bottleneck(g: GraphBuilder, name: str, x: Tensor, planes: int, stride: int, first: bool) -> Tensor:
    """Main path, then the projection shortcut (first block only, when needed), then the sum."""
    in_channels = x.shape[1]
    y = g.add(f"{name}.conv1", Conv(x, planes, 1))
    y = g.add(f"{name}.bn1", BatchNorm(y))
    y = g.add(f"{name}.conv2", Conv(y, planes, 3, stride=stride, pad=1))
    y = g.add(f"{name}.bn2", BatchNorm(y))
    y = g.add(f"{name}.conv3", Conv(y, EXPANSION * planes, 1))
    y = g.add(f"{name}.bn3", BatchNorm(y))
    shortcut = x
    if first and (stride != 1 or in_channels != EXPANSION * planes):
        shortcut = g.add(f"{name}.shortcut.conv", Conv(x, EXPANSION * planes, 1, stride=stride))
        shortcut = g.add(f"{name}.shortcut.bn", BatchNorm(shortcut))
    return g.add(f"{name}.add", Elementwise(y, shortcut, pw=1))


def resnet101(batch: int = 128) -> Network:
    """ResNet-101 on ``(batch, 3, 227, 227)`` images.

    >>> net = resnet101(128)
    >>> len(net), net.names[-1]
    (245, 'loss')
    """
    g = GraphBuilder("resnet101", cutoff=4, batch=batch)
    x = g.input((batch, 3, 227, 227), "image", letters="bchw")
    x = g.add("stem.conv", Conv(x, 64, 7, stride=2, pad=3))
    x = g.add("stem.bn", BatchNorm(x))
    x = g.add("stem.pool", Pooling(x, 3, stride=2, pad=1))
    for stage, (planes, blocks, stride) in enumerate(STAGES, start=1):
        for block in range(blocks):
            with g.block():  # each bottleneck is a repeated block
                x = _bottleneck(
                    g, f"stage{stage}.block{block + 1}", x, planes, stride if block == 0 else 1, block == 0
                )
    x = g.add("head.mean", ReduceMean(x, (2, 3)))
    x = g.add("head.fc", FC(x, 1000))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()
