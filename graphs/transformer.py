"""The encoder-decoder Transformer (``docs/graphs.md``): 6 + 6 layers, 204 vertices.

The encoder output feeds all six encoder-decoder attentions: a high-degree vertex with a
long live range, which makes this graph the hardest for the search.
"""

from __future__ import annotations

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import (
    Einsum,
    Elementwise,
    Embedding,
    Norm,
    Softmax,
    SoftmaxCrossEntropy,
    Stack,
    Unstack,
)
from pase.model.tensor import Tensor

#: What this module's letters mean (``pase.model.roles``), for the Transformer and the GPT
#: decoders (``graphs/gpt.py``): ``s`` stacks the query, key and value projections, ``h`` is a
#: head, ``m`` the keys' positions in attention's two products.
ROLES = {
    "b": "batch", "l": "sequence", "m": "key_sequence", "s": "stack", "h": "heads", "k": "head_width",
    "e": "model", "d": "model", "f": "mlp", "v": "vocab",
}

__all__ = ["transformer", "multi_head", "attention", "feed_forward"]

SEQUENCE = 256
VOCAB = 50000
WIDTH = 512
HEADS = 8
LAYERS = 6


def multi_head(g: GraphBuilder, name: str, xs: list, heads: int, key: int, causal: bool = False) -> Tensor:
    """The attention core: q, k, v projections, scores, softmax, context, output projection.

    ``xs`` is ``[x]`` (self-attention: one Einsum projects ``x``) or ``[x, mem, mem]``
    (encoder-decoder: the three are stacked first). Returns the ``(b, l, e)`` output,
    before any residual or norm. Shared by the Transformer and the GPT graphs; ``causal``
    marks a decoder's masked attention.
    """
    width = xs[0].shape[-1]
    wqkv = g.weight((3, heads, width, key), f"{name}.wqkv", letters="shek")
    if len(xs) == 1:
        qkv = g.add(f"{name}.qkv", Einsum("ble,shek->sbhlk", xs[0], wqkv))
    else:
        stacked = g.add(f"{name}.stack", Stack(xs, axis=0))
        qkv = g.add(f"{name}.qkv", Einsum("sble,shek->sbhlk", stacked, wqkv))
    q, k, v = g.add(f"{name}.split", Unstack(qkv, axis=0))
    scores = g.add(f"{name}.scores", Einsum("bhlk,bhmk->bhlm", q, k))
    weights = g.add(f"{name}.softmax", Softmax(scores, axis=3, causal=causal))
    context = g.add(f"{name}.context", Einsum("bhlm,bhmk->bhlk", weights, v))
    wo = g.weight((heads, width, key), f"{name}.wo", letters="hek")
    return g.add(f"{name}.out", Einsum("bhlk,hek->ble", context, wo))


def attention(g: GraphBuilder, name: str, xs: list, heads: int, key: int) -> Tensor:
    """Multi-head attention on ``[x]`` (self) or ``[x, mem, mem]`` (encoder-decoder),
    then the residual with ``x`` and a layer norm (post-norm, as in the paper's model)."""
    out = multi_head(g, name, xs, heads, key)
    res = g.add(f"{name}.residual", Elementwise(xs[0], out, combine="add"))
    return g.add(f"{name}.norm", Norm(res, axis=-1))


def feed_forward(g: GraphBuilder, name: str, x: Tensor, hidden: int) -> Tensor:
    """Two Einsums (the first with two fused point-wise ops), residual, layer norm."""
    width = x.shape[-1]
    w1 = g.weight((width, hidden), f"{name}.w1", letters="ef")
    w2 = g.weight((hidden, width), f"{name}.w2", letters="fe")
    h = g.add(f"{name}.up", Einsum("ble,ef->blf", x, w1, pw=2))
    y = g.add(f"{name}.down", Einsum("blf,fe->ble", h, w2))
    res = g.add(f"{name}.residual", Elementwise(x, y, combine="add"))
    return g.add(f"{name}.norm", Norm(res, axis=-1))


def transformer(batch: int = 128, model: int | None = None) -> Network:
    """The Transformer of the paper; ``model`` is the width ``e`` (default 512).

    Heads stay 8, so the key width is ``e / 8``; the feed-forward width is ``4 e``.

    >>> net = transformer(128)
    >>> len(net), net.names[2]
    (204, 'enc1.attn.qkv')
    """
    width = WIDTH if model is None else model
    if isinstance(width, bool) or not isinstance(width, int) or width < 1 or width % HEADS:
        raise ValueError(f"transformer width (-m) must be a positive multiple of {HEADS}, got {width!r}")
    key, hidden = width // HEADS, 4 * width
    g = GraphBuilder("transformer", cutoff=1, batch=batch, roles=ROLES)
    enc_ids = g.input((batch, SEQUENCE), "encoder ids", letters="bl")
    dec_ids = g.input((batch, SEQUENCE), "decoder ids", letters="bl")
    position = g.input((batch, SEQUENCE, width), "positional encoding", letters="ble")

    x = g.add("enc.embedding", Embedding(enc_ids, VOCAB, width, letters="bl"))
    x = g.add("enc.position", Elementwise(x, position, combine="add"))
    # The repeated blocks: each encoder layer, each decoder layer (the first with the decoder's
    # embedding, which the vertex order puts after the encoder).
    for i in range(1, LAYERS + 1):
        with g.block():
            x = attention(g, f"enc{i}.attn", [x], HEADS, key)
            x = feed_forward(g, f"enc{i}.ff", x, hidden)
    memory = x

    for i in range(1, LAYERS + 1):
        with g.block():
            if i == 1:
                y = g.add("dec.embedding", Embedding(dec_ids, VOCAB, width, letters="bl"))
                y = g.add("dec.position", Elementwise(y, position, combine="add"))
            y = attention(g, f"dec{i}.attn", [y], HEADS, key)
            y = attention(g, f"dec{i}.cross", [y, memory, memory], HEADS, key)
            y = feed_forward(g, f"dec{i}.ff", y, hidden)

    w = g.weight((width, VOCAB), "output weight", letters="ev")
    logits = g.add("head.logits", Einsum("ble,ev->blv", y, w))
    g.add("loss", SoftmaxCrossEntropy(logits))
    return g.build()
