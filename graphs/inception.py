"""InceptionV3 (``docs/graphs.md``): 219 vertices of inception modules A-E, cut-off 4.

Module names follow the usual ``mixed5b`` ... ``mixed7c``; branches are ``b0``, ``b1``, ...
"""

from __future__ import annotations

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import FC, BatchNorm, Concat, Conv, Pooling, ReduceMean, SoftmaxCrossEntropy
from pase.model.tensor import Tensor

__all__ = ["inception3"]


def _bc(g: GraphBuilder, name: str, x: Tensor, n: int, kernel, stride=1, pad=0) -> Tensor:
    """A convolution without point-wise op, then a batch norm (two vertices)."""
    y = g.add(f"{name}.conv", Conv(x, n, kernel, stride=stride, pad=pad))
    return g.add(f"{name}.bn", BatchNorm(y))


def _module_a(g, name, x, pool_features):
    b0 = _bc(g, f"{name}.b0", x, 64, 1)
    b1 = _bc(g, f"{name}.b1.1", x, 48, 1)
    b1 = _bc(g, f"{name}.b1.2", b1, 64, 5, pad=2)
    b2 = _bc(g, f"{name}.b2.1", x, 64, 1)
    b2 = _bc(g, f"{name}.b2.2", b2, 96, 3, pad=1)
    b2 = _bc(g, f"{name}.b2.3", b2, 96, 3, pad=1)
    b3 = g.add(f"{name}.b3.pool", Pooling(x, 3, stride=1, pad=1))
    b3 = _bc(g, f"{name}.b3", b3, pool_features, 1)
    return g.add(f"{name}.concat", Concat([b0, b1, b2, b3], axis=1))


def _module_b(g, name, x):
    b0 = _bc(g, f"{name}.b0", x, 384, 3, stride=2)
    b1 = _bc(g, f"{name}.b1.1", x, 64, 1)
    b1 = _bc(g, f"{name}.b1.2", b1, 96, 3, pad=1)
    b1 = _bc(g, f"{name}.b1.3", b1, 96, 3, stride=2)
    b2 = g.add(f"{name}.b2.pool", Pooling(x, 3, stride=2))
    return g.add(f"{name}.concat", Concat([b0, b1, b2], axis=1))


def _module_c(g, name, x, c7):
    b0 = _bc(g, f"{name}.b0", x, 192, 1)
    b1 = _bc(g, f"{name}.b1.1", x, c7, 1)
    b1 = _bc(g, f"{name}.b1.2", b1, c7, (1, 7), pad=(0, 3))
    b1 = _bc(g, f"{name}.b1.3", b1, 192, (7, 1), pad=(3, 0))
    b2 = _bc(g, f"{name}.b2.1", x, c7, 1)
    b2 = _bc(g, f"{name}.b2.2", b2, c7, (7, 1), pad=(3, 0))
    b2 = _bc(g, f"{name}.b2.3", b2, c7, (1, 7), pad=(0, 3))
    b2 = _bc(g, f"{name}.b2.4", b2, c7, (7, 1), pad=(3, 0))
    b2 = _bc(g, f"{name}.b2.5", b2, 192, (1, 7), pad=(0, 3))
    b3 = g.add(f"{name}.b3.pool", Pooling(x, 3, stride=1, pad=1))
    b3 = _bc(g, f"{name}.b3", b3, 192, 1)
    return g.add(f"{name}.concat", Concat([b0, b1, b2, b3], axis=1))


def _module_d(g, name, x):
    b0 = _bc(g, f"{name}.b0.1", x, 192, 1)
    b0 = _bc(g, f"{name}.b0.2", b0, 320, 3, stride=2)
    b1 = _bc(g, f"{name}.b1.1", x, 192, 1)
    b1 = _bc(g, f"{name}.b1.2", b1, 192, (1, 7), pad=(0, 3))
    b1 = _bc(g, f"{name}.b1.3", b1, 192, (7, 1), pad=(3, 0))
    b1 = _bc(g, f"{name}.b1.4", b1, 192, 3, stride=2)
    b2 = g.add(f"{name}.b2.pool", Pooling(x, 3, stride=2))
    return g.add(f"{name}.concat", Concat([b0, b1, b2], axis=1))


def _module_e(g, name, x):
    b0 = _bc(g, f"{name}.b0", x, 320, 1)
    b1 = _bc(g, f"{name}.b1.1", x, 384, 1)
    b1a = _bc(g, f"{name}.b1.2a", b1, 384, (1, 3), pad=(0, 1))
    b1b = _bc(g, f"{name}.b1.2b", b1, 384, (3, 1), pad=(1, 0))
    b1 = g.add(f"{name}.b1.concat", Concat([b1a, b1b], axis=1))
    b2 = _bc(g, f"{name}.b2.1", x, 448, 1)
    b2 = _bc(g, f"{name}.b2.2", b2, 384, 3, pad=1)
    b2a = _bc(g, f"{name}.b2.3a", b2, 384, (1, 3), pad=(0, 1))
    b2b = _bc(g, f"{name}.b2.3b", b2, 384, (3, 1), pad=(1, 0))
    b2 = g.add(f"{name}.b2.concat", Concat([b2a, b2b], axis=1))
    b3 = g.add(f"{name}.b3.pool", Pooling(x, 3, stride=1, pad=1))
    b3 = _bc(g, f"{name}.b3", b3, 192, 1)
    return g.add(f"{name}.concat", Concat([b0, b1, b2, b3], axis=1))


def inception3(batch: int = 128) -> Network:
    """InceptionV3 on ``(batch, 3, 299, 299)`` images, without the auxiliary classifier.

    >>> net = inception3(128)
    >>> len(net), net.names[-1]
    (219, 'loss')
    """
    g = GraphBuilder("inception3", cutoff=4, batch=batch)
    x = g.input((batch, 3, 299, 299), "image", letters="bchw")
    x = _bc(g, "stem.1", x, 32, 3, stride=2)
    x = _bc(g, "stem.2", x, 32, 3)
    x = _bc(g, "stem.3", x, 64, 3, pad=1)
    x = g.add("stem.pool1", Pooling(x, 3, stride=2))
    x = _bc(g, "stem.4", x, 80, 1)
    x = _bc(g, "stem.5", x, 192, 3)
    x = g.add("stem.pool2", Pooling(x, 3, stride=2))
    modules = [(_module_a, "mixed5b", (32,)), (_module_a, "mixed5c", (64,)), (_module_a, "mixed5d", (64,)),
               (_module_b, "mixed6a", ()), (_module_c, "mixed6b", (128,)), (_module_c, "mixed6c", (160,)),
               (_module_c, "mixed6d", (160,)), (_module_c, "mixed6e", (192,)), (_module_d, "mixed7a", ()),
               (_module_e, "mixed7b", ()), (_module_e, "mixed7c", ())]
    for module, name, args in modules:
        with g.block():  # each Inception module is a repeated block
            x = module(g, name, x, *args)
    x = g.add("head.mean", ReduceMean(x, (2, 3)))
    x = g.add("head.fc", FC(x, 1000))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()
