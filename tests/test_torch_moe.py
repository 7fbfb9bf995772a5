"""Mixture-of-experts blocks through the PyTorch importer (``pase.sources.torch.moe``): Hugging
Face's Mixtral and Qwen-MoE blocks, whatever their experts implementation, and hand-written
blocks, each one ``MoE`` vertex with the arguments the ``hf:`` graph gives; refusals in one
line; the user's model left as it was. Skipped without torch."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import graphs  # noqa: E402
from pase import GraphBuilder  # noqa: E402
from pase.costing.memory import parameter_count  # noqa: E402
from pase.model.layers import FC, MoE, SoftmaxCrossEntropy  # noqa: E402
from pase.sources import load  # noqa: E402
from pase.sources.torch.importer import TorchImportError, UnmappableOpsError, from_torch, load_factory  # noqa: E402
from pase.sources.torch.moe import find_blocks  # noqa: E402

from cli_runner import run  # noqa: E402


def moe_layers(net) -> list:
    return [(layer.domain, layer.args) for layer in net.layers if layer.op == "MoE"]


def hf_graph(module, tmp_path, batch, sequence):
    """The ``hf:`` graph of the config the module was built from."""
    from pase.sources.hf import load_hf

    path = tmp_path / "config.json"
    path.write_text(json.dumps(module.config.to_dict(), default=str))
    return load_hf(str(path), batch, sequence)


def assert_same_costs(got, want, procs=(1, 4)):
    assert [(a.op, a.domain) for a in got.layers] == [(b.op, b.domain) for b in want.layers]
    assert sorted(got.edges) == sorted(want.edges)
    for p in procs:
        G, H = got.graph(p), want.graph(p)
        for v in G.nodes:
            np.testing.assert_allclose(G.nodes[v]["cost"], H.nodes[v]["cost"], rtol=1e-12)
        for u, v in G.edges:
            np.testing.assert_allclose(G.edges[u, v]["cost"], H.edges[u, v]["cost"], rtol=1e-12)


# ---------------------------------------------------------------------------------------
# Hugging Face models


@pytest.mark.parametrize("factory", ["tiny_mixtral", "tiny_qwen3_moe"])
def test_hugging_face_moe_blocks_are_the_hf_graphs_moe_vertices(factory, tmp_path):
    pytest.importorskip("transformers")
    module, args, kwargs = load_factory(f"examples/hf_mixtral.py:{factory}", 2)
    net = from_torch(module, args, kwargs)
    ref = hf_graph(module, tmp_path, 2, 16)
    assert len(moe_layers(net)) == 2
    assert moe_layers(net) == moe_layers(ref)
    # Every weight of the model is counted once: the MoE vertex owns router and experts.
    assert parameter_count(net) == sum(p.numel() for p in module.parameters()) == parameter_count(ref)
    ops = [layer.op for layer in net.layers]
    assert ops[ops.index("MoE") - 1: ops.index("MoE") + 2] == ["RMSNorm", "MoE", "Elementwise"]
    assert "model.layers.0.mlp.moe" in net.names


def test_qwen2_moe_shared_expert_and_its_gate(tmp_path):
    transformers = pytest.importorskip("transformers")
    module, args, kwargs = load_factory("examples/hf_mixtral.py:tiny_qwen2_moe", 2)
    net = from_torch(module, args, kwargs)
    ref = hf_graph(module, tmp_path, 2, 16)
    (domain, moe), _ = moe_layers(net)
    assert domain == (2, 16, 8, 32, 64)
    assert (moe["experts"], moe["top_k"], moe["hidden"], moe["gated"]) == (8, 2, 32, True)
    assert (moe["shared"], moe["shared_hidden"], moe["shared_gate"]) == (1, 64, True)
    assert moe_layers(net) == moe_layers(ref)
    # The importer drops the q/k/v biases of Qwen2's attention (2 layers x (64 + 16 + 16)); the
    # MoE blocks are counted in full.
    assert parameter_count(net) == sum(p.numel() for p in module.parameters()) - 2 * 96
    assert parameter_count(ref) == sum(p.numel() for p in module.parameters())
    # A dense block of a sparse model (mlp_only_layers) stays three FCs.
    config = module.config
    config.mlp_only_layers = [0]
    with torch.device("meta"):
        mixed = transformers.Qwen2MoeForCausalLM(config)
    ops = [layer.op for layer in from_torch(mixed, args).layers]
    assert ops.count("MoE") == 1 and ops.count("FC") == 3 + 1


def test_every_experts_implementation_gives_one_graph():
    transformers = pytest.importorskip("transformers")
    nets = []
    for impl in ("eager", "grouped_mm", "batched_mm"):
        config = transformers.MixtralConfig(
            hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=4, num_experts_per_tok=2, vocab_size=64, attn_implementation="sdpa", use_cache=False,
            experts_implementation=impl)
        with torch.device("meta"):
            model = transformers.MixtralForCausalLM(config)
        nets.append(from_torch(model, (torch.zeros(2, 8, dtype=torch.long),)))
    assert_same_costs(nets[1], nets[0])
    assert_same_costs(nets[2], nets[0])


def test_mixtral_8x7b_from_its_pytorch_model():
    pytest.importorskip("transformers")
    module, args, kwargs = load_factory("examples/hf_mixtral.py:mixtral_8x7b", 1)
    net = from_torch(module, args, kwargs)
    ref = graphs.build("mixtral-8x7b", 1)
    assert parameter_count(net) == sum(p.numel() for p in module.parameters()) == 46_702_792_704
    assert moe_layers(net) == moe_layers(ref)
    assert len(moe_layers(net)) == 32


def test_cli_plans_a_torch_mixture_of_experts():
    pytest.importorskip("transformers")
    status, out, err = run("-g", "torch:examples/hf_mixtral.py:tiny_mixtral", "-b", "8", "-p", "4")
    assert status == 0, err
    assert "tiny_mixtral" in out


# ---------------------------------------------------------------------------------------
# Hand-written blocks


class Expert(nn.Module):
    def __init__(self, width, hidden, gated):
        super().__init__()
        self.w_in = nn.Linear(width, hidden, bias=False)
        self.w_gate = nn.Linear(width, hidden, bias=False) if gated else None
        self.w_out = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        h = F.silu(self.w_gate(x)) * self.w_in(x) if self.w_gate is not None else F.relu(self.w_in(x))
        return self.w_out(h)


class LoopMoE(nn.Module):
    """Top-k routing written out: a softmax router, a loop over the experts, index_add_."""

    def __init__(self, width, hidden, experts, k, gated=False, bias=False):
        super().__init__()
        self.scorer = nn.Linear(width, experts, bias=bias)  # not named gate or router
        self.experts = nn.ModuleList(Expert(width, hidden, gated) for _ in range(experts))
        self.num_experts_per_tok = k

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = torch.topk(F.softmax(self.scorer(x), dim=-1), self.num_experts_per_tok, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(shape)


class Net(nn.Module):
    def __init__(self, moe, width=16, vocab=10):
        super().__init__()
        self.proj = nn.Linear(width, width, bias=False)
        self.moe = moe
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x):
        return self.head(self.moe(self.proj(x)))


def test_a_hand_written_expert_loop_is_one_moe_vertex():
    model = Net(LoopMoE(16, 24, 4, 2))
    x = torch.randn(8, 5, 16)
    before = model(x)  # the block runs eagerly: it is a real mixture of experts
    net = from_torch(model, (x,))
    g = GraphBuilder("Net", cutoff=1, batch=8)
    t = g.input((8, 5, 16), "x")
    t = g.add("proj", FC(t, 16))
    t = g.add("moe.moe", MoE(t, 4, 2, 24, gated=False))
    t = g.add("head", FC(t, 10))
    g.add("loss", SoftmaxCrossEntropy(t))
    assert_same_costs(net, g.build())
    assert list(net.names) == ["proj", "moe.moe", "head", "loss"]
    assert parameter_count(net) == sum(p.numel() for p in model.parameters())
    # The model is as it was: its own block, computing the same.
    assert type(model.moe) is LoopMoE
    torch.testing.assert_close(model(x), before)


def test_gated_experts_and_a_block_imported_on_its_own():
    block = LoopMoE(16, 24, 4, 1, gated=True)
    net = from_torch(block, (torch.randn(3, 16),), loss=None)
    [layer] = net.layers
    assert layer.op == "MoE" and layer.domain == (3, 4, 24, 16)
    assert (layer.args["gated"], layer.args["top_k"]) == (True, 1)
    assert parameter_count(net) == sum(p.numel() for p in block.parameters())


def test_fused_expert_weights_transposed_or_not():
    class Fused(nn.Module):
        def __init__(self, transposed):
            super().__init__()
            shape = (4, 16, 48) if transposed else (4, 48, 16)
            self.gate_up = nn.Parameter(torch.zeros(shape))
            self.down = nn.Parameter(torch.zeros((4, 24, 16) if transposed else (4, 16, 24)))

    class Block(nn.Module):
        def __init__(self, transposed):
            super().__init__()
            self.router = nn.Linear(16, 4, bias=False)
            self.experts = Fused(transposed)
            self.top_k = 2

    for transposed in (False, True):
        [(_, _, _, found)] = find_blocks(Block(transposed))
        assert (found.experts, found.top_k, found.hidden, found.gated, found.width) == (4, 2, 24, True, 16)


# ---------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("change, reason", [
    (lambda m: setattr(m.moe, "scorer", nn.Linear(16, 4, bias=True)), "router 'scorer' has a bias"),
    (lambda m: [setattr(e, "w_in", nn.Linear(16, 24, bias=True)) for e in m.moe.experts], "have biases"),
    (lambda m: setattr(m.moe.experts[1], "w_in", nn.Linear(16, 32, bias=False)), "not all of one shape"),
    (lambda m: setattr(m.moe, "num_experts_per_tok", 5), "top-k count 5"),
    (lambda m: setattr(m.moe, "scorer", nn.Linear(16, 6, bias=False)), "no router"),
    (lambda m: (delattr(m.moe, "scorer"), setattr(m.moe, "gate", nn.Linear(16, 6, bias=False))), "not 4 experts"),
])
def test_a_block_that_cannot_be_read_is_refused_in_one_line(change, reason):
    model = Net(LoopMoE(16, 24, 4, 2))
    change(model)
    children = dict(model.named_modules())
    with pytest.raises(TorchImportError, match=reason) as info:
        from_torch(model, (torch.randn(8, 5, 16),))
    message = str(info.value)
    assert "\n" not in message and message.startswith("moe (LoopMoE) looks like a mixture of experts")
    assert dict(model.named_modules()) == children


def test_routing_without_an_experts_child_is_named_by_its_ops():
    class Inline(nn.Module):
        def __init__(self):
            super().__init__()
            self.scorer = nn.Linear(16, 4, bias=False)
            self.w = nn.Parameter(torch.zeros(4, 16, 16))

        def forward(self, x):
            _, chosen = torch.topk(self.scorer(x), 1, dim=-1)
            return torch.einsum("btd,btde->bte", x, self.w[chosen[..., 0]])

    with pytest.raises(UnmappableOpsError, match="topk"):
        from_torch(Inline(), (torch.randn(2, 3, 16),))


def test_the_model_is_restored_when_export_fails():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = LoopMoE(16, 24, 4, 2)

        def forward(self, x):
            raise RuntimeError("no")

    model = Broken()
    block = model.moe
    with pytest.raises(TorchImportError, match="RuntimeError: no"):
        from_torch(model, (torch.randn(2, 16),))
    assert model.moe is block
