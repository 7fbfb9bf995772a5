"""RNNLM (``docs/graphs.md``): embedding, a two-layer LSTM, the output FC and the loss."""

from __future__ import annotations

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import FC, LSTM, Embedding, SoftmaxCrossEntropy

__all__ = ["rnnlm", "VOCAB", "UNITS", "SEQUENCE"]

VOCAB = 100000
UNITS = 2048
SEQUENCE = 256


def rnnlm(batch: int = 128, model: int | None = None) -> Network:
    """Two-layer LSTM language model; ``model`` is the embedding width and LSTM units.

    >>> net = rnnlm(128)
    >>> [layer.op for layer in net.layers]
    ['Embedding', 'LSTM', 'FC', 'SoftmaxCrossEntropy']
    """
    units = UNITS if model is None else model
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise ValueError(f"rnnlm width (-m) must be a positive integer, got {units!r}")
    g = GraphBuilder("rnnlm", cutoff=1, batch=batch, roles={"b": "batch", "s": "sequence"})
    ids = g.input((batch, SEQUENCE), "ids", letters="bs")
    x = g.add("embedding", Embedding(ids, VOCAB, units))
    x = g.add("lstm", LSTM(x, 2))
    x = g.add("fc", FC(x, VOCAB))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()
