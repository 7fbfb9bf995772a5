"""AlexNet (``docs/graphs.md``): a path of 14 vertices, five convolutions and three FC layers."""

from __future__ import annotations

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import FC, Conv, Pooling, SoftmaxCrossEntropy

__all__ = ["alexnet"]


def alexnet(batch: int = 128) -> Network:
    """AlexNet on ``(batch, 3, 227, 227)`` images, cut-off 4.

    >>> net = alexnet(128)
    >>> len(net), net.names[0], net.layers[0].domain
    (14, 'conv1', (128, 3, 55, 55, 11, 11, 96))
    """
    g = GraphBuilder("alexnet", cutoff=4, batch=batch)
    x = g.input((batch, 3, 227, 227), "image", letters="bchw")
    x = g.add("conv1", Conv(x, 96, 11, stride=4, pad=0, pw=1))
    x = g.add("pool1", Pooling(x, 3, stride=2))
    x = g.add("conv2", Conv(x, 256, 5, stride=1, pad=2, pw=1))
    x = g.add("pool2", Pooling(x, 3, stride=2))
    x = g.add("conv3", Conv(x, 384, 3, pad=1, pw=1))
    x = g.add("conv4", Conv(x, 384, 3, pad=1, pw=1))
    x = g.add("conv5", Conv(x, 256, 3, pad=1, pw=1))
    x = g.add("pool5", Pooling(x, 3, stride=2))
    x = g.reshape("flatten", x, (batch, 256 * 6 * 6), letters="bk")
    x = g.add("fc6", FC(x, 4096, pw=1))
    x = g.add("fc7", FC(x, 4096, pw=1))
    x = g.add("fc8", FC(x, 1024))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()
