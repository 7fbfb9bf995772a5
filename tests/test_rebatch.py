"""pase.sources.rebatch: one imported model at several batch sizes, imported as few times as it can be."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pase import GraphBuilder  # noqa: E402
from pase.model.layers import FC, Elementwise, Ravel, SoftmaxCrossEntropy, Unravel  # noqa: E402
from pase.sources.rebatch import Rebatcher, fingerprint, rebatched  # noqa: E402


def chain(batch: int):
    """An FC, a residual add and the loss: nothing in it holds the batch but the input."""
    g = GraphBuilder("chain", cutoff=1, batch=batch)
    x = g.input((batch, 6), "x", letters="bk")
    h = g.add("fc", FC(x, 6, pw=1))
    r = g.add("add", Elementwise(h, x))
    g.add("loss", SoftmaxCrossEntropy(r))
    return g.build()


def reshaping(batch: int):
    """A flatten and an unflatten whose target shape holds the batch: a re-batched graph file
    keeps the old shape, so it is refused (the elements no longer match)."""
    g = GraphBuilder("reshaping", cutoff=1, batch=batch)
    x = g.input((batch, 6), "x", letters="bk")
    flat = g.add("ravel", Ravel(x))
    y = g.add("unravel", Unravel(flat, (batch, 6)))
    g.add("fc", FC(y, 4))
    return g.build()


class Counting:
    def __init__(self, build):
        self.build, self.calls = build, []

    def __call__(self, batch):
        self.calls.append(batch)
        return self.build(batch)


def test_rebatched_equals_the_network_built_at_that_batch():
    for batch in (2, 3, 16):
        assert fingerprint(rebatched(chain(8), batch)) == fingerprint(chain(batch))
    # The fingerprint sees the batch: the network at 8 is not the one at 4.
    assert fingerprint(chain(8)) != fingerprint(chain(4))


def test_imports_twice_then_rebatches():
    load = Counting(chain)
    nets = Rebatcher(load)
    got = [nets(b) for b in (8, 4, 2, 16, 4, 32)]
    # 8 (the first), 4 (checked against 8 re-batched: equal), then nothing more is imported;
    # the repeated 4 is the same object.
    assert load.calls == [8, 4] and nets.imports == 2
    assert got[1] is got[4]
    for net, b in zip(got, (8, 4, 2, 16, 4, 32)):
        assert fingerprint(net) == fingerprint(chain(b))


def test_a_batch_in_a_layer_argument_imports_every_size():
    load = Counting(reshaping)
    nets = Rebatcher(load)
    for b in (8, 4, 2, 16):
        assert fingerprint(nets(b)) == fingerprint(reshaping(b))
    assert load.calls == [8, 4, 2, 16]


def test_a_model_that_changes_with_the_batch_is_imported_every_time():
    # The re-batched file is valid here but is not what the model gives at that batch (a
    # factory that builds another network for small batches): the check sees it.
    def shifty(batch):
        if batch >= 8:
            return chain(batch)
        g = GraphBuilder("chain", cutoff=1, batch=batch)
        x = g.input((batch, 6), "x", letters="bk")
        h = g.add("fc", FC(x, 6, pw=2))  # another point-wise count
        r = g.add("add", Elementwise(h, x))
        g.add("loss", SoftmaxCrossEntropy(r))
        return g.build()

    load = Counting(shifty)
    nets = Rebatcher(load)
    for b in (8, 4, 2):
        assert fingerprint(nets(b)) == fingerprint(shifty(b))
    assert load.calls == [8, 4, 2]


def test_a_batch_of_one_is_always_imported_and_never_the_check():
    load = Counting(chain)
    nets = Rebatcher(load)
    nets(8)
    nets(1)  # imported; the check waits for a size above one
    nets(2)  # imported and checked
    nets(4)  # re-batched
    nets(1)  # asked before: the same network
    assert load.calls == [8, 1, 2]
    base_one = Counting(chain)
    from_one = Rebatcher(base_one)
    for b in (1, 4, 2):
        from_one(b)
    assert base_one.calls == [1, 4, 2]  # a network of batch one is never re-batched


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs torch and transformers")
def test_an_imported_decoder_rebatches_as_it_imports():
    # Issue 24: the training search asks for a torch model at every micro-batch size; after two
    # imports, re-batching must give exactly what importing gives (tiny Mixtral: MoE vertices,
    # causal attention, tied-free weights).
    from pase.sources import load

    spec = "torch:" + os.path.join(ROOT, "examples", "hf_mixtral.py") + ":tiny_mixtral"
    counted = Counting(lambda b: load(spec, b))
    nets = Rebatcher(counted)
    for b in (8, 4, 2):
        nets(b)
    assert counted.calls == [8, 4]
    assert fingerprint(nets(2)) == fingerprint(load(spec, 2))
