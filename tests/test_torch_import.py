"""Importing PyTorch models (``pase.sources.torch.importer``): every mapped op against hand-built layers.

Each test builds a small ``nn.Module``, imports it, and compares the result with the network
written by hand with ``GraphBuilder`` (layer types, iteration spaces, ``pw`` counts, edges,
and every cost vector and edge matrix at a few device counts). Skipped without torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import graphs  # noqa: E402
from pase.sources import load  # noqa: E402
from pase import GraphBuilder, Machine  # noqa: E402
from pase.model.layers import (  # noqa: E402
    FC, BatchNorm, Concat, Conv, Einsum, Elementwise, Embedding, Norm, Pooling, ReduceMean, RMSNorm, Softmax,
    SoftmaxCrossEntropy, Stack, Unravel, Unstack,
)
from pase.costing.strategy import evaluate  # noqa: E402
from pase.sources.torch.importer import (  # noqa: E402
    INSTALL_HINT, FactoryError, TorchImportError, TorchNotInstalledError, UnmappableOpsError, from_torch,
    load_factory, load_torch_graph,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------
# Helpers


def assert_same_network(got, want, procs=(1, 4, 8)):
    """Same layers (type, iteration space, pw), same edges, same cost tables (under the imported
    network's reader rule)."""
    want = want.with_readers(got.readers)
    assert len(got.layers) == len(want.layers), (got.names, want.names)
    for i, (a, b) in enumerate(zip(got.layers, want.layers)):
        where = f"layer {i} ({got.names[i]} vs {want.names[i]})"
        assert a.op == b.op, where
        assert tuple(a.domain) == tuple(b.domain), where
        assert getattr(a, "pw", None) == getattr(b, "pw", None), where
        assert a.output_shapes == b.output_shapes, where
    assert sorted(got.edges) == sorted(want.edges)
    assert got.cutoff == want.cutoff
    for p in procs:
        G, H = got.graph(p), want.graph(p)
        for v in G.nodes:
            np.testing.assert_allclose(G.nodes[v]["cost"], H.nodes[v]["cost"], rtol=1e-12)
        for u, v in G.edges:
            np.testing.assert_allclose(G.edges[u, v]["cost"], H.edges[u, v]["cost"], rtol=1e-12)


class Lambda(nn.Module):
    """A module running ``fn`` (so that each test writes its forward inline)."""

    def __init__(self, fn, **children):
        super().__init__()
        self.fn = fn
        for name, child in children.items():
            setattr(self, name, child)

    def forward(self, *args):
        return self.fn(self, *args)


# ---------------------------------------------------------------------------------------
# One op family at a time


def test_linear_relu_linear_is_two_fcs_and_the_loss():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    net = from_torch(model, (torch.randn(32, 64),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((32, 64), "x")
    h = g.add("0", FC(x, 128, pw=1))  # pw 1: the ReLU rides along with the first FC
    y = g.add("2", FC(h, 10))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build())
    assert net.names == ("0", "2", "loss")  # layers are named by their module path
    assert net.batch == 32


def test_cost_of_a_tiny_model_worked_by_hand():
    # Linear(4 -> 2) on a batch of 8, then the loss, on one device (no communication):
    # FC: a GEMM M=8, N=2, K=4: 3 M N K = 3 * 8 * 2 * 4 = 192 (forward and two backward).
    # SoftmaxCrossEntropy on (8, 2): 4 E + 2 bpp = 4 * 16 + 2 * 8 = 80.
    net = from_torch(nn.Linear(4, 2), (torch.randn(8, 4),))
    total = evaluate(net, [(1, 1, 1), (1, 1)], Machine()).total
    assert total == 192 + 80


def test_convolution_block_matches_the_built_in_layers():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5, stride=2, padding=2, bias=False), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
    )
    net = from_torch(model, (torch.randn(16, 3, 32, 32),))
    g = GraphBuilder("want", cutoff=4)  # a model with convolutions gets the CNN cut-off
    x = g.input((16, 3, 32, 32), "x")
    x = g.add("0", Conv(x, 8, 3, stride=1, pad=1))  # (32 - 3 + 2) / 1 + 1 = 32
    x = g.add("1", BatchNorm(x, pw=1))  # the ReLU
    x = g.add("3", Pooling(x, 2, stride=2))  # 32 -> 16
    x = g.add("4", Conv(x, 16, 5, stride=2, pad=2, pw=1))  # (16 - 5 + 4) / 2 + 1 = 8
    x = g.add("6", ReduceMean(x, (2, 3)))  # the global average pooling
    x = g.add("8", FC(x, 5))
    g.add("loss", SoftmaxCrossEntropy(x))
    assert_same_network(net, g.build())


def test_residual_add_is_an_elementwise_and_relu_after_it_a_pw():
    def forward(m, x):
        return F.relu(m.b(m.a(x)) + x)

    model = Lambda(forward, a=nn.Linear(32, 32), b=nn.Linear(32, 32))
    net = from_torch(model, (torch.randn(8, 32),), loss=None)
    g = GraphBuilder("want", cutoff=1)
    x = g.input((8, 32), "x")
    h = g.add("a", FC(x, 32))
    h = g.add("b", FC(h, 32))
    g.add("add", Elementwise(h, x, pw=1))
    assert_same_network(net, g.build())


def test_a_sum_is_declared_a_sum_and_keeps_nothing_for_its_backward():
    # y = a(x) + b(x) - x, then a product with x: the two sums' backward passes read no operand
    # (the gradient passes through), so a's and b's outputs are not kept for them; the product's
    # backward reads both of its operands (each is the other's gradient factor).
    def forward(m, x):
        s = m.a(x) + m.b(x)
        return (s - x) * x

    model = Lambda(forward, a=nn.Linear(32, 32), b=nn.Linear(32, 32))
    net = from_torch(model, (torch.randn(8, 32),), loss=None)
    combines = [layer.combine for layer in net.layers if layer.op == "Elementwise"]
    assert combines == ["add", "add", "multiply"]
    a, b = net.names.index("a"), net.names.index("b")
    readers = [layer for layer in net.layers if any(t.producer is not None and t.producer in (a, b)
                                                   for t in layer.inputs)]
    assert [r.op for r in readers] == ["Elementwise"]
    assert not readers[0].backward_reads(0, (True, True)) and not readers[0].backward_reads(1, (True, True))
    product = net.layers[-1]
    assert product.backward_reads(0, (True, True)) and product.backward_reads(1, (True, True))


def test_concatenation_of_two_branches():
    def forward(m, x):
        return torch.cat([m.a(x), m.b(x)], dim=1)

    model = Lambda(forward, a=nn.Conv2d(4, 6, 1), b=nn.Conv2d(4, 10, 3, padding=1))
    net = from_torch(model, (torch.randn(8, 4, 12, 12),), loss=None)
    g = GraphBuilder("want", cutoff=4)
    x = g.input((8, 4, 12, 12), "x")
    a = g.add("a", Conv(x, 6, 1))
    b = g.add("b", Conv(x, 10, 3, pad=1))
    g.add("concat", Concat([a, b], axis=1))
    assert_same_network(net, g.build())


def test_a_transposed_input_is_absorbed_by_the_product():
    # h = proj(x) is (b, l, d); h.transpose(1, 2) @ W, W (l, e), is the Einsum
    # "bld,le->bde": no vertex for the transpose, the product reads h in its own order.
    w = torch.randn(12, 24)

    def forward(m, x):
        return m.proj(x).transpose(1, 2) @ m.w

    model = Lambda(forward, proj=nn.Linear(10, 16))
    model.register_buffer("w", w)
    net = from_torch(model, (torch.randn(4, 12, 10),), loss=None)
    assert [layer.op for layer in net.layers] == ["FC", "Einsum"]
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 12, 10), "x")
    h = g.add("proj", FC(x, 16))  # (b, l, d)
    g.add("matmul", Einsum("bld,le->bde", h, g.input((12, 24), "w")))
    assert_same_network(net, g.build())
    assert net.layers[1].equation.count(",") == 1


def test_a_product_writes_its_output_in_the_order_its_reader_needs():
    # A sequence-first linear (torch's MultiheadAttention layout) whose output is turned
    # back to batch-first for a residual add: the product writes (b, l, n) directly, so
    # neither transpose is a vertex, and the layer is a plain FC.
    def forward(m, x):
        return m.fc(x.transpose(0, 1)).transpose(0, 1) + x

    net = from_torch(Lambda(forward, fc=nn.Linear(16, 16)), (torch.randn(4, 6, 16),), loss=None)
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 6, 16), "x")
    y = g.add("fc", FC(x, 16))
    g.add("add", Elementwise(y, x))
    assert_same_network(net, g.build())


def test_ceil_mode_pooling_is_a_padded_window():
    # MaxPool2d(3, 2, ceil_mode=True) on 9 x 9: ceil((9 - 3) / 2) + 1 = 4 outputs, which
    # floor((9 - 3 + 2 * 0) / 2) + 1 = 4 gives already; on 8 x 8: ceil(5 / 2) + 1 = 4, which
    # needs pad 1: floor((8 - 3 + 2) / 2) + 1 = 4.
    for size, pad in ((9, 0), (8, 1)):
        net = from_torch(nn.MaxPool2d(3, 2, ceil_mode=True), (torch.randn(2, 4, size, size),), loss=None)
        g = GraphBuilder("want", cutoff=1)
        g.add("pool", Pooling(g.input((2, 4, size, size), "x"), 3, stride=2, pad=pad))
        assert_same_network(net, g.build())
        assert net.layers[0].domain == (2, 4, 4, 4)


def test_split_heads_projection_becomes_one_einsum_and_an_unstack():
    # GPT-2's pattern: one projection to 3e, split in three, each viewed as (b, l, h, k):
    # the projection's output dimension is refined to (3, h, k) and the split is an Unstack.
    b, l, e, h = 2, 8, 32, 4
    k = e // h

    def forward(m, x):
        q, key, v = m.qkv(x).split(e, dim=2)
        q, key, v = (t.view(b, l, h, k).transpose(1, 2) for t in (q, key, v))
        return F.scaled_dot_product_attention(q, key, v)

    net = from_torch(Lambda(forward, qkv=nn.Linear(e, 3 * e)), (torch.randn(b, l, e),), loss=None)
    assert [layer.op for layer in net.layers] == ["Einsum", "Unstack", "Einsum", "Softmax", "Einsum"]
    g = GraphBuilder("want", cutoff=1)
    x = g.input((b, l, e), "x")
    qkv = g.add("qkv", Einsum("ble,eshk->blshk", x, g.weight((e, 3, h, k), "w")))
    q, key, v = g.add("split", Unstack(qkv, axis=2))
    # Scores: the scale is one point-wise op on them (no mask here).
    s = g.add("scores", Einsum("blhk,bmhk->bhlm", q, key, pw=1))
    p = g.add("softmax", Softmax(s, axis=3))
    g.add("context", Einsum("bhlm,bmhk->bhlk", p, v))
    assert_same_network(net, g.build())


def test_grouped_query_attention_groups_the_query_heads():
    # 8 query heads over 2 key/value heads: the query heads are refined into (g=2, r=4),
    # the keys and values are read once per group.
    b, l, e, kv, h = 2, 8, 64, 2, 8
    d = e // h

    def forward(m, x):
        q = m.q(x).view(b, l, h, d).transpose(1, 2)
        key = m.k(x).view(b, l, kv, d).transpose(1, 2)
        v = m.v(x).view(b, l, kv, d).transpose(1, 2)
        return F.scaled_dot_product_attention(q, key, v, is_causal=True, enable_gqa=True)

    model = Lambda(forward, q=nn.Linear(e, e, bias=False), k=nn.Linear(e, kv * d, bias=False),
                   v=nn.Linear(e, kv * d, bias=False))
    net = from_torch(model, (torch.randn(b, l, e),), loss=None)
    g = GraphBuilder("want", cutoff=1)
    x = g.input((b, l, e), "x")
    q = g.add("q", Einsum("ble,egrk->blgrk", x, g.weight((e, kv, h // kv, d), "wq")))
    key = g.add("k", Einsum("ble,egk->blgk", x, g.weight((e, kv, d), "wk")))
    v = g.add("v", Einsum("ble,egk->blgk", x, g.weight((e, kv, d), "wv")))
    s = g.add("scores", Einsum("blgrk,bmgk->bgrlm", q, key, pw=2))  # the scale and the causal mask
    p = g.add("softmax", Softmax(s, axis=4))
    g.add("context", Einsum("bgrlm,bmgk->bgrlk", p, v))
    assert_same_network(net, g.build())


def _softmax_causal(model, x):
    net = from_torch(model, (x,), loss=None)
    return [layer.args.get("causal", False) for layer in net.layers if layer.op == "Softmax"]


def test_attention_softmax_is_causal_when_asked_or_built_by_a_causal_module():
    # Causal attention masks half the scores, which fused attention skips (docs/training.md);
    # the importer marks the softmax causal when SDPA says is_causal=True, or when a mask is
    # passed by a module that declares itself causal (Hugging Face's attention classes, which
    # under torch.export pass their causal mask as a tensor), over square scores.
    b, l, e = 2, 8, 16

    def attend(m, x, **kw):
        q = x.view(b, l, 2, e // 2).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, **kw)

    class Attention(nn.Module):
        def __init__(self, is_causal, **kw):
            super().__init__()
            self.is_causal, self.kw = is_causal, kw

        def forward(self, x):
            mask = torch.ones(l, l, dtype=torch.bool, device=x.device).tril() if self.kw.get("mask") else None
            return attend(self, x, attn_mask=mask, is_causal=self.kw.get("flag", False))

    x = torch.randn(b, l, e)
    assert _softmax_causal(Lambda(lambda m, x: attend(m, x, is_causal=True)), x) == [True]
    assert _softmax_causal(Lambda(lambda m, x: attend(m, x)), x) == [False]
    assert _softmax_causal(Attention(True, mask=True), x) == [True]  # HF: a causal module's mask
    assert _softmax_causal(Attention(False, mask=True), x) == [False]  # an encoder's mask (BERT)
    assert _softmax_causal(Attention(None, mask=True), x) == [False]  # nothing declared: not assumed
    assert _softmax_causal(Attention(True, flag=True), x) == [True]


def test_repeat_kv_attention_is_the_same_graph_as_enable_gqa():
    # Hugging Face's repeat_kv (unsqueeze, expand, reshape) instead of enable_gqa=True.
    b, l, e, kv, h = 2, 8, 64, 2, 8
    d = e // h

    def make(repeat):
        def forward(m, x):
            q = m.q(x).view(b, l, h, d).transpose(1, 2)
            key = m.k(x).view(b, l, kv, d).transpose(1, 2)
            v = m.v(x).view(b, l, kv, d).transpose(1, 2)
            if repeat:
                key, v = (t[:, :, None].expand(b, kv, h // kv, l, d).reshape(b, h, l, d) for t in (key, v))
                return F.scaled_dot_product_attention(q, key, v, is_causal=True)
            return F.scaled_dot_product_attention(q, key, v, is_causal=True, enable_gqa=True)

        torch.manual_seed(0)
        return Lambda(forward, q=nn.Linear(e, e, bias=False), k=nn.Linear(e, kv * d, bias=False),
                      v=nn.Linear(e, kv * d, bias=False))

    x = torch.randn(b, l, e)
    assert_same_network(from_torch(make(True), (x,), loss=None), from_torch(make(False), (x,), loss=None))


def test_eager_attention_is_the_same_graph_as_sdpa():
    # matmul, scale, mask, softmax, dropout, matmul written out = scaled_dot_product_attention.
    b, l, e, h = 2, 8, 32, 4
    d = e // h
    mask = torch.triu(torch.full((l, l), float("-inf")), 1)

    def make(eager):
        def forward(m, x):
            q, key, v = (t.view(b, l, h, d).transpose(1, 2) for t in m.qkv(x).chunk(3, dim=-1))
            if eager:
                s = (q @ key.transpose(-1, -2)) * d ** -0.5 + m.mask
                y = F.dropout(s.softmax(-1), 0.1, m.training) @ v
            else:
                y = F.scaled_dot_product_attention(q, key, v, attn_mask=m.mask, dropout_p=0.1)
            return m.out(y.transpose(1, 2).reshape(b, l, e))

        model = Lambda(forward, qkv=nn.Linear(e, 3 * e), out=nn.Linear(e, e))
        model.register_buffer("mask", mask)
        return model

    x = torch.randn(b, l, e)
    got, want = from_torch(make(True), (x,)), from_torch(make(False), (x,))
    assert_same_network(got, want)
    # The output projection reads the heads merged back: "bhlk,hke->ble", one Einsum.
    assert got.layers[5].op == "Einsum" and got.layers[5].domain == (b, l, e, h, d)


def test_hand_written_rms_norm_is_one_layer():
    class RMS(nn.Module):  # Hugging Face's LlamaRMSNorm
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + 1e-6)).to(x.dtype)

    def forward(m, x):
        return m.fc(m.norm(m.inp(x)))

    model = Lambda(forward, inp=nn.Linear(16, 32), norm=RMS(32), fc=nn.Linear(32, 8))
    net = from_torch(model, (torch.randn(4, 5, 16),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 5, 16), "x")
    x = g.add("inp", FC(x, 32))
    x = g.add("norm", RMSNorm(x, axis=-1))  # pow, mean, add, rsqrt, mul and the scale: all the norm
    x = g.add("fc", FC(x, 8))
    g.add("loss", SoftmaxCrossEntropy(x))
    assert_same_network(net, g.build())
    assert net.layers[1].op == "RMSNorm"


def test_layer_norm_and_hand_written_layer_norm():
    def written(m, x):
        x = m.inp(x)
        centred = x - x.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * m.w + m.b

    def library(m, x):
        return m.ln(m.inp(x))

    a = Lambda(written, inp=nn.Linear(16, 32))
    a.w, a.b = nn.Parameter(torch.ones(32)), nn.Parameter(torch.zeros(32))
    b = Lambda(library, inp=nn.Linear(16, 32), ln=nn.LayerNorm(32))
    x = torch.randn(4, 16)
    got, want = from_torch(a, (x,)), from_torch(b, (x,))
    assert [layer.op for layer in want.layers] == ["FC", "Norm", "SoftmaxCrossEntropy"]
    assert_same_network(got, want)


def test_embedding_with_replicated_positions():
    # Token ids are a graph input; the position embedding (from arange) does not depend on
    # the batch: no vertex, its add is a point-wise op of the Embedding (which has no pw).
    def forward(m, ids):
        positions = torch.arange(ids.shape[1])
        return m.head(m.tok(ids) + m.pos(positions))

    model = Lambda(forward, tok=nn.Embedding(100, 16), pos=nn.Embedding(10, 16), head=nn.Linear(16, 100))
    net = from_torch(model, (torch.zeros(4, 10, dtype=torch.long),))
    g = GraphBuilder("want", cutoff=1)
    ids = g.input((4, 10), "ids", letters="bl")
    x = g.add("tok", Embedding(ids, 100, 16))
    x = g.add("head", FC(x, 100))
    g.add("loss", SoftmaxCrossEntropy(x))
    assert_same_network(net, g.build())


def test_flattened_token_ids_are_looked_up_as_given():
    # The lookup reads the (b, l) ids; flattening them first only changes the view.
    def forward(m, ids):
        return m.head(m.tok(ids.flatten()).view(ids.shape[0], ids.shape[1], 16))

    net = from_torch(Lambda(forward, tok=nn.Embedding(50, 16), head=nn.Linear(16, 50)),
                     (torch.zeros(4, 10, dtype=torch.long),))
    g = GraphBuilder("want", cutoff=1)
    x = g.add("tok", Embedding(g.input((4, 10), "ids"), 50, 16))
    g.add("loss", SoftmaxCrossEntropy(g.add("head", FC(x, 50))))
    assert_same_network(net, g.build())


def test_point_wise_ops_count_once_each_and_casts_count_nothing():
    # After the FC: gelu, * 2, + 1, a cast, dropout (training), and an add of the FC's own
    # output (the same tensor twice: a point-wise op, not an Elementwise): 5 point-wise ops.
    def forward(m, x):
        y = m.fc(x)
        z = F.dropout((F.gelu(y) * 2 + 1).to(torch.float32), 0.1, True)
        return m.out(z + y)

    net = from_torch(Lambda(forward, fc=nn.Linear(8, 8), out=nn.Linear(8, 4)), (torch.randn(2, 8),))
    assert [layer.op for layer in net.layers] == ["FC", "FC", "SoftmaxCrossEntropy"]
    assert net.layers[0].pw == 5 and net.layers[1].pw == 0


def test_eval_mode_dropout_is_nothing():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 4)).eval()
    net = from_torch(model, (torch.randn(2, 8),))
    assert net.layers[0].pw == 0


def test_a_mask_from_constants_ties_nothing_together():
    # A causal mask built from torch.ones/triu is replicated: adding it is a point-wise op
    # of the scores, and it makes no edge between distant layers.
    def forward(m, x):
        s = m.a(x) @ m.b(x).transpose(1, 2)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        return s.masked_fill(mask, float("-inf")).softmax(-1)

    net = from_torch(Lambda(forward, a=nn.Linear(8, 8), b=nn.Linear(8, 8)), (torch.randn(2, 6, 8),), loss=None)
    assert [layer.op for layer in net.layers] == ["FC", "FC", "Einsum", "Softmax"]
    assert net.layers[2].pw == 1
    assert sorted(net.edges) == [(0, 2), (1, 2), (2, 3)]


def test_chunked_halves_read_by_layers_are_an_unstack():
    def forward(m, x):
        a, b = m.inp(x).chunk(2, dim=-1)
        return m.fa(a) + m.fb(b)

    model = Lambda(forward, inp=nn.Linear(8, 32), fa=nn.Linear(16, 4), fb=nn.Linear(16, 4))
    net = from_torch(model, (torch.randn(2, 8),), loss=None)
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 8), "x")
    h = g.add("inp", Einsum("bk,ksn->bsn", x, g.weight((8, 2, 16), "w")))  # 32 refined to (2, 16)
    a, b = g.add("split", Unstack(h, axis=1))
    a = g.add("fa", FC(a, 4))
    b = g.add("fb", FC(b, 4))
    g.add("add", Elementwise(a, b))
    assert_same_network(net, g.build())


def test_stack_of_two_branches_and_select_of_a_token():
    # stack -> Stack; x[:, 0] (a class token) read by a layer -> one output of an Unstack
    # over the sequence (5 outputs, the first read).
    def forward(m, x):
        y = torch.stack([m.a(x), m.b(x)], dim=1)  # (b, 2, l, n)
        return m.head(y.sum(1)[:, 0])

    model = Lambda(forward, a=nn.Linear(8, 6), b=nn.Linear(8, 6), head=nn.Linear(6, 3))
    net = from_torch(model, (torch.randn(4, 5, 8),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((4, 5, 8), "x")
    a = g.add("a", FC(x, 6))
    b = g.add("b", FC(x, 6))
    y = g.add("stack", Stack([a, b], axis=1, batch_dim=0))
    y = g.add("sum", ReduceMean(y, 1))  # a sum read by a layer: priced as the mean's all-reduce
    tokens = g.add("split", Unstack(y, axis=1))
    y = g.add("head", FC(tokens[0], 3))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build())
    assert len(net.layers[4].output_shapes) == 5


def test_rotate_half_is_put_back_together_at_no_cost():
    # Rotary embedding: x * cos + cat(-x2, x1) * sin with replicated tables: four
    # point-wise ops (mul, neg, mul, add) on the projection; no vertex, no Unstack.
    def forward(m, x):
        q = m.q(x)
        x1, x2 = q[..., :8], q[..., 8:]
        return m.out(q * m.cos + torch.cat((-x2, x1), dim=-1) * m.sin)

    model = Lambda(forward, q=nn.Linear(16, 16), out=nn.Linear(16, 4))
    model.register_buffer("cos", torch.randn(5, 16))
    model.register_buffer("sin", torch.randn(5, 16))
    net = from_torch(model, (torch.randn(2, 5, 16),), loss=None)
    assert [layer.op for layer in net.layers] == ["FC", "FC"]
    assert net.layers[0].pw == 4


def test_a_reshape_no_view_can_express_is_a_reshape_pair():
    # A layer norm over a flattened image: the norm's axis is three dimensions of the conv
    # output merged, which one Norm cannot take; a Ravel and an Unravel make it (b, c*h*w).
    def forward(m, x):
        return m.ln(m.conv(x).flatten(1))

    model = Lambda(forward, conv=nn.Conv2d(3, 4, 3, padding=1), ln=nn.LayerNorm(4 * 8 * 8))
    net = from_torch(model, (torch.randn(2, 3, 8, 8),), loss=None)
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 3, 8, 8), "x")
    x = g.add("conv", Conv(x, 4, 3, pad=1))
    x = g.reshape("ln.reshape", x, (2, 256))
    g.add("ln", Norm(x, axis=-1))
    assert_same_network(net, g.build())
    assert isinstance(net.layers[2], Unravel)


def test_the_loss_goes_on_the_last_axis_and_can_be_left_out():
    model = nn.Linear(8, 6)
    with_loss = from_torch(model, (torch.randn(3, 4, 8),))
    assert with_loss.layers[-1].op == "SoftmaxCrossEntropy" and with_loss.layers[-1].domain == (3, 4, 6)
    for none in (None, "none"):
        assert [layer.op for layer in from_torch(model, (torch.randn(3, 4, 8),), loss=none).layers] == ["FC"]
    with pytest.raises(TorchImportError, match="loss must be"):
        from_torch(model, (torch.randn(3, 8),), loss="mse")


def test_cutoff_default_and_override():
    conv = nn.Conv2d(3, 4, 3)
    assert from_torch(conv, (torch.randn(2, 3, 8, 8),)).cutoff == 4
    assert from_torch(conv, (torch.randn(2, 3, 8, 8),), cutoff=2).cutoff == 2
    assert from_torch(nn.Linear(4, 4), (torch.randn(2, 4),)).cutoff == 1
    with pytest.raises(TorchImportError, match="cut-off"):
        from_torch(conv, (torch.randn(2, 3, 8, 8),), cutoff=0)


def test_a_module_on_the_meta_device_imports_without_its_weights():
    # 2 x 50000 x 50000 float32 weights would be 20 GB; on the meta device they are nothing.
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(50000, 50000), nn.Linear(50000, 50000))
        x = torch.empty(64, 50000)
    net = from_torch(model, (x,), name="huge")
    assert net.name == "huge" and net.layers[0].domain == (64, 50000, 50000)


def test_import_is_deterministic():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))

    a = from_torch(build(), (torch.randn(2, 8),))
    b = from_torch(build(), (torch.randn(2, 8),))
    assert a.names == b.names and [x.args for x in a.layers] == [x.args for x in b.layers]
    assert a.edges == b.edges


# ---------------------------------------------------------------------------------------
# Errors


def test_unmappable_ops_are_named_once_with_their_module():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = Odd()
            self.second = Odd()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            y = self.second(self.first(self.fc(x)))
            return torch.sort(y, dim=1).values

    with pytest.raises(UnmappableOpsError) as info:
        from_torch(Model(), (torch.randn(2, 8),))
    message = str(info.value)
    assert "\n" not in message
    assert message.count("aten.cumsum") == 1 and "aten.sort" in message
    assert "in first" in message and "1 more" in message  # the second cumsum is counted, not repeated
    assert [op for op, *_ in info.value.ops] == ["aten.cumsum", "aten.sort"]
    assert isinstance(info.value, ValueError)  # the CLI's usage errors: exit status 2


def test_ops_on_replicated_tensors_never_fail():
    # cumsum of a constant does not depend on the batch: whatever it is, it is replicated.
    def forward(m, x):
        return m.fc(x) * torch.cumsum(torch.ones(8), 0)

    assert len(from_torch(Lambda(forward, fc=nn.Linear(8, 8)), (torch.randn(2, 8),)).layers) == 2


def test_broadcast_between_batch_dependent_tensors_is_an_elementwise():
    # Issue 23: once refused, now an Elementwise whose second operand (2, 1) broadcasts.
    def forward(m, x):
        return m.a(x) * m.b(x).mean(-1, keepdim=True).exp()

    net = from_torch(Lambda(forward, a=nn.Linear(8, 8), b=nn.Linear(8, 8)), (torch.randn(2, 8),))
    product = next(layer for layer in net.layers if layer.op == "Elementwise")
    assert [t.shape for t in product.inputs] == [(2, 8), (2, 1)] and product.broadcast == ((), (1,))


def test_bad_arguments():
    with pytest.raises(TorchImportError, match="torch.nn.Module"):
        from_torch(lambda x: x, (torch.randn(2),))
    with pytest.raises(TorchImportError, match="tuple"):
        from_torch(nn.Linear(2, 2), 3)
    with pytest.raises(TorchImportError, match="no input carries a batch"):
        from_torch(Lambda(lambda m, ids: m.fc(ids.float()), fc=nn.Linear(4, 4)),
                   (torch.zeros(2, 4, dtype=torch.long),))
    with pytest.raises(TorchImportError, match="torch.export could not trace"):
        from_torch(Lambda(lambda m, x: x if x.sum() > 0 else -x), (torch.randn(2, 4),))


def test_a_single_tensor_is_taken_as_the_inputs():
    assert len(from_torch(nn.Linear(4, 4), torch.randn(2, 4)).layers) == 2


def test_torch_missing_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" now raises ImportError
    with pytest.raises(TorchNotInstalledError) as info:
        from_torch(object(), ())
    assert INSTALL_HINT in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ImportError) and isinstance(info.value, ValueError)


def test_a_factory_without_torch_is_the_same_clear_line(tmp_path, monkeypatch):
    path = write(tmp_path, "import torch\ndef model(batch): pass\n")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TorchNotInstalledError, match=r"pip install '\.\[torch\]'"):
        load_factory(f"{path}:model", 4)


def test_import_pase_stays_torch_free():
    code = "import sys, pase, graphs, pase.sources.torch.importer; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------
# Factories


def write(tmp_path, text, name="factories.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_load_factory_from_a_file_with_kwargs(tmp_path):
    path = write(tmp_path, """
        import torch

        def model(batch):
            return torch.nn.Linear(4, 3), (torch.randn(batch, 4),), {}

        def pair(batch):
            return torch.nn.Linear(4, 3), torch.randn(batch, 4)
    """)
    module, args, kwargs = load_factory(f"{path}:model", 5)
    assert isinstance(module, nn.Linear) and args[0].shape == (5, 4) and kwargs == {}
    _, args, kwargs = load_factory(f"{path}:pair", 2)
    assert isinstance(args, tuple) and args[0].shape == (2, 4) and kwargs == {}
    net = load_torch_graph(f"{path}:model", 7)
    assert net.name == "model" and net.batch == 7


def test_load_factory_from_a_module():
    pytest.importorskip("transformers")
    module, args, _ = load_factory("examples.hf_llama:tiny_llama", 3)
    assert args[0].shape == (3, 16)


@pytest.mark.parametrize("body, spec, match", [
    ("", "missing.py:model", "file .*missing.py does not exist"),
    ("def other(batch): pass", "{path}:model", "has no function 'model'"),
    ("model = 3", "{path}:model", "'model' in .* is not a function"),
    ("def model(batch): raise RuntimeError('boom')", "{path}:model", "raised RuntimeError: boom"),
    ("def model(batch): return 3", "{path}:model", "must return \\(module, args\\)"),
    ("import torch\ndef model(batch): return 3, (torch.zeros(1),)", "{path}:model", "where a torch.nn.Module belongs"),
    ("import torch\ndef model(batch): return torch.nn.Linear(1, 1), 3", "{path}:model", "expected a tuple"),
    ("raise ValueError('broken file')", "{path}:model", "importing .* failed: ValueError: broken file"),
    ("", "no_such_package.models:model", "cannot import module no_such_package.models: .*"
                                           "pip install no_such_package"),
    ("import no_such_dependency", "{path}:model", "No module named 'no_such_dependency' .pip install"),
    ("", "{path}", "FILE.py:FUNCTION"),
])
def test_factory_errors_name_the_factory_and_the_problem(tmp_path, body, spec, match):
    path = write(tmp_path, body)
    spec = spec.format(path=path)
    with pytest.raises(FactoryError, match=match) as info:
        load_factory(spec, 4)
    assert "\n" not in str(info.value)
    if ":" in spec:
        assert str(info.value).startswith(f"factory {spec}")


def test_graphs_load_takes_a_torch_spec(tmp_path):
    path = write(tmp_path, """
        import torch

        def mlp(batch):
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)), (torch.randn(batch, 4),)
    """)
    net = load(f"torch:{path}:mlp", 16)
    assert [layer.op for layer in net.layers] == ["FC", "FC", "SoftmaxCrossEntropy"] and net.batch == 16
    with pytest.raises(ValueError, match="does not exist"):
        load(f"torch:{path}x:mlp", 16)


# ---------------------------------------------------------------------------------------
# The shipped examples and whole models


def test_tiny_llama_blocks_are_identical():
    pytest.importorskip("transformers")
    net = load("torch:examples/hf_llama.py:tiny_llama", 4)
    ops = [layer.op for layer in net.layers]
    # embedding, 2 x 15 block vertices, final norm, head, loss
    assert len(net.layers) == 1 + 2 * 15 + 3
    block = ops[1:16]
    assert block == ops[16:31] == [
        "RMSNorm", "Einsum", "Einsum", "Einsum", "Einsum", "Softmax", "Einsum", "Einsum", "Elementwise",
        "RMSNorm", "FC", "FC", "Elementwise", "FC", "Elementwise",
    ]
    assert [x.domain for x in net.layers[1:16]] == [x.domain for x in net.layers[16:31]]
    assert [getattr(x, "pw", None) for x in net.layers[1:16]] == [getattr(x, "pw", None) for x in net.layers[16:31]]
    # q and k carry the rotary embedding (mul, neg, mul, add); gate the SiLU.
    assert [net.layers[i].pw for i in (2, 3, 4, 11)] == [4, 4, 0, 1]
    internal = sorted((u - 1, v - 1) for u, v in net.edges if 1 <= u < 16 and 1 <= v < 16)
    assert internal == sorted((u - 16, v - 16) for u, v in net.edges if 16 <= u < 31 and 16 <= v < 31)
    # grouped-query attention: scores over (b, g=2, r=4, l, m, k)
    assert net.layers[5].domain == (4, 2, 4, 16, 16, 8)
    assert net.names[2] == "model.layers.0.self_attn.q_proj"


def test_hugging_face_eager_and_sdpa_attention_give_one_graph():
    transformers = pytest.importorskip("transformers")

    def gpt2(impl):
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                                         bos_token_id=0, eos_token_id=0, attn_implementation=impl, use_cache=False)
        with torch.device("meta"):
            return transformers.GPT2LMHeadModel(config), (torch.zeros(2, 16, dtype=torch.long),)

    def llama(impl):
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                          bos_token_id=0, eos_token_id=0, attn_implementation=impl,
                                          use_cache=False)
        with torch.device("meta"):
            return transformers.LlamaForCausalLM(config), (torch.zeros(2, 16, dtype=torch.long),)

    for build in (gpt2, llama):
        a, b = build("eager"), build("sdpa")
        assert_same_network(from_torch(*a), from_torch(*b), procs=(4,))
    net = from_torch(*gpt2("sdpa"))
    # GPT-2's block: 12 vertices, like the built-in's: ln, c_attn, split, scores, softmax,
    # context, c_proj, add, ln, c_fc, c_proj, add.
    assert len(net.layers) == 1 + 2 * 12 + 3
    # gelu_new written out: mul, pow, mul, add, mul, tanh, add, mul; and dropout on c_proj.
    assert net.layers[10].pw == 8 and net.layers[11].pw == 1


def test_torchvision_resnet101_is_the_built_in_resnet101():
    torchvision = pytest.importorskip("torchvision")
    net = load("torch:examples/torchvision_cnns.py:resnet101", 32)
    ref = graphs.build("resnet101", 32)
    ops = [layer.op for layer in net.layers]
    assert (ops.count("Conv"), ops.count("BatchNorm"), ops.count("FC")) == (104, 104, 1)
    assert ops == [layer.op for layer in ref.layers]
    assert [layer.domain for layer in net.layers] == [layer.domain for layer in ref.layers]
    assert sorted(net.edges) == sorted(ref.edges)
    # The one difference: the ReLU after a batch norm rides along with it (pw 1); the
    # built-in graph has no pw there.
    relu_after_bn = [i for i, layer in enumerate(net.layers) if layer.op == "BatchNorm" and layer.pw]
    assert len(relu_after_bn) == 2 * 33 + 1  # bn1, bn2 of every block, and the stem
    assert all(not layer.pw for layer in ref.layers if layer.op == "BatchNorm")
    assert torchvision is not None


def test_tiny_llama_parameters_are_the_models_own():
    # Llama has no biases and untied embeddings: every weight of the model is one parameter
    # tensor of one layer (Embedding, the Einsums and FCs, one scale per RMSNorm).
    from pase.costing.memory import parameter_count

    pytest.importorskip("transformers")
    module, args, kwargs = load_factory("examples/hf_llama.py:tiny_llama", 4)
    net = from_torch(module, args, kwargs)
    assert parameter_count(net) == sum(p.numel() for p in module.parameters())


def test_an_imported_network_survives_the_graph_file_round_trip():
    from pase import network_from_json, network_to_json

    pytest.importorskip("transformers")
    net = load("torch:examples/hf_llama.py:tiny_llama", 4)
    assert_same_network(network_from_json(network_to_json(net)), net, procs=(4,))


def test_import_is_the_same_under_every_hash_seed():
    code = textwrap.dedent("""
        import json, sys, torch
        sys.path.insert(0, %r)
        from pase import network_to_json
        from pase.sources.torch.importer import from_torch
        torch.manual_seed(0)
        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)
            def forward(self, x):
                q, k, v = (t.view(2, 4, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.out(y.transpose(1, 2).reshape(2, 4, 16)) + x
        net = from_torch(Attention(), (torch.randn(2, 4, 16),))
        print(json.dumps(network_to_json(net), sort_keys=True))
    """ % ROOT)
    # The three interpreters run at once (each spends most of its time importing torch).
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=dict(os.environ, PYTHONHASHSEED=seed))
                for seed in ("0", "1", "12345")]
    outputs = set()
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        outputs.add(out)
    assert len(outputs) == 1
