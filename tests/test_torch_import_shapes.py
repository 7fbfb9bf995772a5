"""Issue 23's mappings against hand-built layers: unequal and empty slices, grouped and 1-D
convolutions, products that broadcast, index lists, complex rotary, tied weights, and the
one-line refusals of data-dependent operations."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pase import GraphBuilder, Machine  # noqa: E402
from pase.costing.memory import MemoryModel, charged_parameters, parameter_count  # noqa: E402
from pase.costing.strategy import evaluate  # noqa: E402
from pase.model.layers import Conv, Einsum, Elementwise, FC, SoftmaxCrossEntropy, Unstack  # noqa: E402
from pase.sources.graph_json import network_from_json, network_to_json  # noqa: E402
from pase.sources.torch.importer import UnmappableOpsError, from_torch  # noqa: E402

from test_torch_import import Lambda, assert_same_network  # noqa: E402


def own_parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_grouped_depthwise_convolution_is_a_conv_with_a_group_dimension():
    model = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
    net = from_torch(model, (torch.randn(4, 8, 6, 6),))
    g = GraphBuilder("want", cutoff=4)
    x = g.input((4, 8, 6, 6), "x")
    y = g.add("conv", Conv(x, 8, 3, pad=1, groups=8))
    g.add("loss", SoftmaxCrossEntropy(y))
    want = g.build()
    assert_same_network(net, want)
    assert net.layers[0].domain == (4, 8, 1, 6, 6, 3, 3, 1)  # (b, g, c/g, ho, wo, r, s, n/g)
    # One device: the batched GEMM B=8 groups, M = 4*6*6 = 144, N = 1, K = 1*3*3 = 9:
    # 3 B M N K = 3 * 8 * 144 * 9 = 31104; the loss over (4, 8, 6, 6), classes 6:
    # 4 E + 2 bpp = 4 * 1152 + 2 * 192 = 4992.
    assert evaluate(net, [(1,) * 8, (1,) * 4], Machine()).total == 31104 + 4992
    # The group dimension splits like a batch: no collective (the paper machine's AR is 0 for it).
    G = net.graph(2)
    configs = G.nodes[0]["configs"]
    split_g = [i for i, c in enumerate(configs) if tuple(c) == (1, 2, 1, 1, 1, 1, 1, 1)]
    cost = net.layers[0].costs(configs[split_g], Machine())
    assert cost.communication.tolist() == [0.0]
    assert parameter_count(net) == own_parameters(model) == 8 * 1 * 3 * 3


def test_grouped_convolution_input_and_output_split_by_group_and_channel():
    g = GraphBuilder("g", cutoff=4)
    x = g.input((2, 8, 5, 5), "x")
    conv = Conv(x, 12, 3, groups=4)  # 2 channels and 3 filters per group
    C = np.array([[1, 2, 2, 1, 1, 1, 1, 3]])
    assert conv.input_configs(C)[0].tolist() == [[1, 4, 1, 1]]  # channels split 2 x 2
    assert conv.output_configs(C)[0].tolist() == [[1, 6, 1, 1]]  # filters split 2 x 3
    assert conv.parameters() == [((4, 3, 2, 3, 3), (1, 7, 2, 5, 6))]


def test_conv1d_is_a_conv_of_height_one_with_its_bias():
    model = nn.Conv1d(4, 6, 3, padding=1)
    net = from_torch(model, (torch.randn(2, 4, 10),))
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 4, 10), "x")
    y = g.add("conv", Conv(x, 6, (1, 3), pad=(0, 1), bias=True))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build())
    assert net.layers[0].output_shapes == ((2, 6, 10),)
    # One device: M = 2*1*10 = 20, N = 6, K = 4*1*3 = 12: 3 M N K = 4320; the loss over
    # (2, 6, 10): 4 * 120 + 2 * 12 = 504.
    assert evaluate(net, [(1,) * 7, (1,) * 3], Machine()).total == 4320 + 504
    assert parameter_count(net) == own_parameters(model) == 6 * 4 * 3 + 6


def test_squeeze_excitation_gate_is_a_broadcast_elementwise():
    gate = nn.Conv2d(8, 8, 4, bias=False)  # (b, 8, 4, 4) -> (b, 8, 1, 1)
    model = Lambda(lambda m, x: x * torch.sigmoid(m.gate(x)), gate=gate)
    net = from_torch(model, (torch.randn(2, 8, 4, 4),))
    g = GraphBuilder("want", cutoff=4)
    x = g.input((2, 8, 4, 4), "x")
    s = g.add("gate", Conv(x, 8, 4, pw=1))  # the sigmoid rides along
    y = g.add("mul", Elementwise(x, s))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build(), procs=(1, 2, 4))
    layer = net.layers[1]
    assert layer.broadcast == ((), (2, 3))
    # Split the height 2 ways: the gate is (2, 8, 1, 1) whole on each device, and its
    # gradient sums over the height: an all-reduce of 2*8 = 16 elements over 2 devices,
    # rho * 16 / 2 * 2 * (2 - 1) = 16 rho.
    machine = Machine()
    C = np.array([[1, 1, 2, 1]])
    assert layer.input_configs(C)[1].tolist() == [[1, 1, 1, 1]]
    assert layer.costs(C, machine).communication.tolist() == [16 * machine.rho]
    # Not split along a broadcast dimension: no collective.
    assert layer.costs(np.array([[2, 1, 1, 1]]), machine).communication.tolist() == [0.0]


def test_a_fused_projection_split_unequally_is_one_unstack_with_sizes():
    # Falcon's multi-query fusion: 4 query heads, then one key and one value head of width 2.
    def forward(m, x):
        qkv = m.qkv(x).view(2, 3, 6, 2)
        q, k, v = qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]
        return m.out(q.flatten(2)) + m.kv(k.flatten(2)) + m.kv2(v.flatten(2))

    model = Lambda(forward, qkv=nn.Linear(8, 12, bias=False), out=nn.Linear(8, 5), kv=nn.Linear(2, 5),
                   kv2=nn.Linear(2, 5))
    net = from_torch(model, (torch.randn(2, 3, 8),))
    splits = [layer for layer in net.layers if layer.op == "Unstack"]
    assert len(splits) == 1 and splits[0].args["sizes"] == [4, 1, 1]
    assert [s[splits[0].axis] for s in splits[0].output_shapes] == [4, 1, 1]
    assert parameter_count(net) == own_parameters(model)
    # The same Unstack built by hand prices nothing and keeps the split axis whole.
    g = GraphBuilder("u", cutoff=1)
    t = g.input((2, 3, 6, 2), "t")
    u = Unstack(t, 2, sizes=[4, 1, 1])
    assert u.domain == (2, 3, 1, 2) and u.output_shapes == ((2, 3, 4, 2), (2, 3, 1, 2), (2, 3, 1, 2))
    assert u.costs(np.array([[2, 1, 1, 1]]), Machine()).total.tolist() == [0.0]
    assert network_from_json(network_to_json(net)).layers[splits[0] and net.layers.index(splits[0])].args[
        "sizes"] == [4, 1, 1]


def test_partial_rotary_and_the_zero_width_slice_cost_no_layer():
    cos, sin = torch.randn(4, 8), torch.randn(4, 8)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(m, x, width):
        q = m.q(x).view(2, 4, 2, 8)
        rot, rest = q[..., :width], q[..., width:]
        rot = rot * cos[:, None, :width] + rotate_half(rot) * sin[:, None, :width]
        return m.out(torch.cat((rot, rest), dim=-1).flatten(2))

    for width, wanted in ((4, 4), (8, 4)):  # a quarter of each head, then the whole head
        model = Lambda(lambda m, x, w=width: forward(m, x, w), q=nn.Linear(16, 16, bias=False),
                       out=nn.Linear(16, 16, bias=False))
        net = from_torch(model, (torch.randn(2, 4, 16),))
        g = GraphBuilder("want", cutoff=1)
        x = g.input((2, 4, 16), "x")
        # The heads view makes q an Einsum with a head letter; the rotary's mul, neg, mul,
        # add ride along with it (4 point-wise ops) whichever part of the head it covers,
        # and the zero-width rest (width 8) is dropped by the cat: no Unstack, no Concat.
        h = g.add("q", Einsum("bst,nct->bsnc", x, g.weight((2, 8, 16)), pw=wanted))
        y = g.add("out", Einsum("bscd,ncd->bsn", h, g.weight((16, 2, 8))))
        g.add("loss", SoftmaxCrossEntropy(y))
        assert_same_network(net, g.build(), procs=(1, 4))


def test_complex_rotary_is_the_real_rotary_it_computes():
    freqs = torch.polar(torch.ones(4, 4), torch.randn(4, 4))

    def forward(m, x):
        q = m.q(x).view(2, 4, 8)
        z = torch.view_as_complex(q.float().reshape(2, 4, 4, 2)) * freqs
        return m.out(torch.view_as_real(z).flatten(2))

    model = Lambda(forward, q=nn.Linear(8, 8, bias=False), out=nn.Linear(8, 8, bias=False))
    net = from_torch(model, (torch.randn(2, 4, 8),))
    g = GraphBuilder("want", cutoff=1)
    x = g.input((2, 4, 8), "x")
    # The (4, 2) pairs make q an Einsum; the complex product rides along with it (pw 1).
    h = g.add("q", Einsum("bst,nct->bsnc", x, g.weight((4, 2, 8)), pw=1))
    y = g.add("out", Einsum("bscd,ncd->bsn", h, g.weight((8, 4, 2))))
    g.add("loss", SoftmaxCrossEntropy(y))
    assert_same_network(net, g.build())


def test_tied_embedding_is_one_parameter_in_every_memory_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=64,
                                     bos_token_id=0, eos_token_id=0, use_cache=False)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
        ids = torch.zeros(2, 16, dtype=torch.long)
    net = from_torch(model, (ids,))
    # 124M-style GPT-2 at width 32: the lm_head is the token table, counted once; the
    # position table (16 x 32) is held by a layer though no layer prices it.
    assert parameter_count(net) == own_parameters(model)
    tied = [v for v, layer in enumerate(net.layers) if layer.tied]
    assert [net.layers[v].op for v in tied] == ["Embedding", "FC"]
    assert charged_parameters(net)[tied[0]][0] and not charged_parameters(net)[tied[1]][0]
    # The head holds no weight bytes: only its outputs (2 * 16 * 64 logits at 2 bytes).
    head = net.layers[tied[1]]
    C = np.ones((1, len(head.domain)), dtype=np.int64)
    assert MemoryModel().vectors(net, [np.ones((1, len(l.domain)), dtype=np.int64) for l in net.layers])[
        tied[1]].tolist() == [2.0 * 2 * 16 * 64]
    assert MemoryModel().layer_memory(head, C).tolist() == [16.0 * 64 * 32 + 2.0 * 2 * 16 * 64]
    # The graph file keeps the tie.
    again = network_from_json(network_to_json(net))
    assert parameter_count(again) == parameter_count(net)


@pytest.mark.parametrize("forward, op, words", [
    # RoBERTa's positions: counted from the ids that are not padding.
    (lambda m, x: m.emb(x) + m.emb(torch.cumsum((x != 0).int(), 1)), "aten.cumsum",
     "pass the model its position_ids"),
    (lambda m, x: m.emb(x).sum(1)[torch.arange(2), x.argmax(-1)], "aten.argmax", "end-of-text token"),
])
def test_data_dependent_operations_are_refused_in_one_line(forward, op, words):
    model = Lambda(forward, emb=nn.Embedding(10, 4))
    with pytest.raises(UnmappableOpsError) as err:
        from_torch(model, (torch.zeros(2, 5, dtype=torch.long),))
    message = str(err.value)
    assert "\n" not in message and f"{op} in the top-level module" in message and words in message
