"""Dimension roles (pase/model/roles.py) and the parallel rules keyed by them
(pase/planning/rules.py): declared by each source, read by the mesh mapping, exported as priced."""

import json
import os

import numpy as np
import pytest

import graphs
from cli_runner import run as _run
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, Elementwise, SoftmaxCrossEntropy
from pase.model.roles import ROLES, TENSOR_PARALLEL_ROLES, propagate, roles_of, weight_only_dims
from pase.planning.mesh import Mesh, MeshMapper, mesh_config
from pase.planning.rules import ParallelRules, default_rules, rules_from_json
from pase.sources.graph_json import network_from_json, network_to_json
from pase.sources.registry import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(argv):
    return _run(*argv)


# ---------------------------------------------------------------------------------------
# Declared where built


def test_builtin_decoder_roles_come_from_its_letter_map():
    net = graphs.build("llama3-8b", 2, 16)
    layer = dict(zip(net.names, net.layers))
    assert roles_of(layer["embedding"]) == ("batch", "sequence", "model", "vocab")
    assert roles_of(layer["block1.attn.q"]) == ("batch", "kv_groups", "heads", "sequence", "head_width", "model")
    assert roles_of(layer["block1.attn.scores"])[4] == "key_sequence"
    assert roles_of(layer["block1.ff.down"]) == ("batch", "sequence", "model", "mlp")
    assert roles_of(layer["head.logits"]) == ("batch", "sequence", "vocab", "model")


def test_builder_refuses_an_unknown_role():
    with pytest.raises(ValueError, match="unknown role 'hidden'"):
        GraphBuilder("x", roles={"h": "hidden"})
    g = GraphBuilder("x")
    x = g.input((4, 8), "x", letters="bk")
    with pytest.raises(ValueError, match="one entry"):
        g.add("fc", FC(x, 16), roles=("batch",))


def test_graph_file_carries_roles_and_old_files_still_read():
    net = graphs.build("gpt2-small", 2)
    data = network_to_json(net)
    again = network_from_json(json.loads(json.dumps(data)))
    assert [l.roles for l in again.layers] == [l.roles for l in net.layers]
    # An old file (no roles field): read, layers without roles but the declared batch.
    for spec in data["layers"]:
        spec.pop("roles", None)
    old = network_from_json(data)
    assert old.layers[2].roles is None or not any(r in TENSOR_PARALLEL_ROLES for r in old.layers[2].roles)
    assert roles_of(old.layers[2])[old.layers[2].batch_dim] == "batch"
    data["layers"][2]["roles"] = ["batch"]
    with pytest.raises(ValueError, match="roles must give one entry"):
        network_from_json(data)


def test_alexnet_graph_file_is_unchanged_by_roles():
    # A network nobody declared roles for writes the file it always wrote.
    with open(os.path.join(ROOT, "tests", "data", "golden", "export-graph", "net.json")) as f:
        golden = json.load(f)
    assert "roles" not in json.dumps(golden["layers"])
    assert not any("roles" in spec for spec in network_to_json(network_from_json(golden))["layers"])


def test_propagation_carries_declared_roles_along_tensors():
    # x (batch, seq, model) -> up FC (own features) -> add -> down FC -> loss over the classes.
    g = GraphBuilder("mlp")
    x = g.input((4, 8, 16), "x", letters="blk")
    up = g.add("up", FC(x, 32))
    act = g.add("act", Elementwise(up, up))
    down = g.add("down", FC(act, 16))
    g.add("loss", SoftmaxCrossEntropy(down), roles=(None, "sequence", "classes"))
    net = g.build()
    assert weight_only_dims(net.layers[0]) == (2,)  # up's output features: no input names them

    def inner(v, layer, roles):
        return tuple("mlp" if j in weight_only_dims(layer) and r is None else None for j, r in enumerate(roles))

    roles = propagate(net.layers, fallback=inner)
    # The sequence comes back from the loss; down's output features are the classes; up's own
    # features are named mlp by the fallback and carried forward into act and down's input.
    assert roles[0] == ("batch", "sequence", "mlp", None)
    assert roles[1] == ("batch", "sequence", "mlp")
    assert roles[2] == ("batch", "sequence", "classes", "mlp")
    assert roles[3] == ("batch", "sequence", "classes")


# ---------------------------------------------------------------------------------------
# Rules as data


def test_default_rules_file_is_the_dataclass_default():
    assert default_rules() == ParallelRules()
    assert set(default_rules().tensor_roles()) <= set(ROLES)


@pytest.mark.parametrize("data, message", [
    ([], "must hold a JSON object"),
    ({"format": "x", "version": 1}, "field 'format'"),
    ({"format": "pase-parallel-rules", "version": 2}, "version 2"),
    ({"format": "pase-parallel-rules", "version": 1, "tp": [["hidden"]]}, "unknown role 'hidden'"),
    ({"format": "pase-parallel-rules", "version": 1, "pp": []}, "unknown field 'pp'"),
    ({"format": "pase-parallel-rules", "version": 1, "dp": []}, "at least one role"),
])
def test_bad_rules(data, message):
    with pytest.raises(ValueError, match=message):
        rules_from_json(data)


def test_mesh_by_rules_on_llama_by_hand():
    net = graphs.build("llama3-8b", 8, 64)
    layer = dict(zip(net.names, net.layers))
    mesh = Mesh(dp=2, tp=4)
    # 8 key/value groups take tp=4 whole; batch 8 / dp 2.
    assert mesh_config(layer["block1.attn.q"], mesh) == (2, 4, 1, 1, 1, 1)
    assert mesh_config(layer["block1.ff.gate"], mesh) == (2, 1, 4, 1)  # column-parallel: mlp
    assert mesh_config(layer["block1.ff.down"], mesh) == (2, 1, 1, 4)  # row-parallel: mlp reduced
    # Rules that give tp the MLP only: attention replicated, or split over the sequence with
    # sequence parallelism (the rules' sp).
    mlp_only = ParallelRules(tp=(("mlp",),))
    assert mesh_config(layer["block1.attn.q"], Mesh(2, 4, sp=False), rules=mlp_only) == (2, 1, 1, 1, 1, 1)
    assert mesh_config(layer["block1.attn.q"], mesh, rules=mlp_only) == (2, 1, 1, 4, 1, 1)
    assert mesh_config(layer["block1.ff.gate"], mesh, rules=mlp_only) == (2, 1, 4, 1)
    assert mesh_config(layer["head.logits"], Mesh(2, 4, sp=False), rules=mlp_only) == (2, 1, 1, 1)


def test_user_rules_file_on_the_command_line(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "pase-parallel-rules", "version": 1, "tp": [["mlp"]]}))
    argv = ["-g", "llama3-8b", "-m", "64", "-p", "4", "-b", "8", "--machine", "h100-sxm", "--recipe",
            "dp=2,tp=2,sp=false", "--json"]
    status, out, err = run_cli(argv + ["--rules", str(rules)])
    assert status == 0, err
    layers = {l["name"]: l["config"] for l in json.loads(out)["layers"]}
    assert layers["block1.ff.up"] == [2, 1, 2, 1] and layers["block1.attn.q"] == [2, 1, 1, 1, 1, 1]
    status, out, err = run_cli(argv)
    assert json.loads(out)["layers"][2]["config"] == [2, 2, 1, 1, 1, 1]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    status, out, err = run_cli(argv + ["--rules", str(bad)])
    assert status == 2 and out == "" and "rules file" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------
# Priced as exported: every weight product split tp ways over its tensor-parallel role


def _check_tensor_parallel(network, configs, tp):
    """Every weight product (q, k, v, o, gate, up, down, head, the lookup) has a weight with a
    tensor-parallel dimension, and every weight that has one is split ``tp`` ways over them
    (heads, groups, MLP width, expert width or vocabulary). A mixture's router is replicated."""
    tensor_roles = set(default_rules().tensor_roles())
    checked = 0
    for name, layer, config in zip(network.names, network.layers, configs):
        if not (layer.product or layer.lookup_table or layer.op == "MoE"):
            continue
        roles = roles_of(layer)
        weights = [dims for shape, dims, _ in layer.parameter_tensors() if len(shape) >= 2 and dims]  # not held ones
        # A down-projection into a latent width (DeepSeek's q_a, kv_a) is replicated, as
        # Megatron-Core runs it: no tensor-parallel role to split.
        weights = [dims for dims in weights if not ({roles[d] for d in dims} <= {"model", "latent"}
                                                     and "latent" in {roles[d] for d in dims})]
        split = [dims for dims in weights if any(roles[d] in tensor_roles for d in dims)]
        if layer.op != "MoE":
            assert len(split) == len(weights), (name, roles)
        for dims in split:
            ways = int(np.prod([config[d] for d in dims if roles[d] in tensor_roles]))
            # Fewer key/value groups than tp (DeepSeek's one shared rotary key): replicated over
            # the rest, as Megatron runs grouped-query attention; else split tp ways.
            size = int(np.prod([layer.domain[d] for d in dims if roles[d] in tensor_roles]))
            assert ways == (tp if size >= tp else size), (name, roles, config)
            checked += 1
    return checked


LANGUAGE_MODELS = [
    ("llama3-8b", ["-m", "64"]), ("gpt2-small", []), ("transformer", []), ("mixtral-8x7b", ["-m", "32"]),
] + [(f"hf:examples/hf/{name}", ["-m", "64"]) for name in sorted(os.listdir(os.path.join(ROOT, "examples", "hf")))
     # GPT-2's vocabulary of 50257 splits no way (engines pad it to a multiple of 128 tp).
     if name != "gpt2.json"]


@pytest.mark.parametrize("graph, extra", LANGUAGE_MODELS)
def test_builtin_and_hf_language_models_split_every_weight_product(graph, extra, tmp_path):
    _priced_equals_exported(graph, extra, tmp_path, 2)


TORCH_MODELS = ["examples/hf_llama.py:tiny_llama", "examples/hf_gpt2.py:gpt2_tiny", "examples/hf_mixtral.py:tiny_mixtral",
                "examples/hf_mixtral.py:tiny_qwen2_moe", "examples/hf_mixtral.py:tiny_qwen3_moe"]


@pytest.mark.parametrize("spec", TORCH_MODELS)
def test_imported_language_models_split_every_weight_product(spec, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    _priced_equals_exported(f"torch:{spec}", [], tmp_path, 2)


def _priced_equals_exported(graph, extra, tmp_path, tp):
    argv = ["-g", graph, "-p", "4", "-b", "8", "--machine", "h100-sxm", "--recipe", f"dp=2,tp={tp}", "--json",
            "--memory", "100000"] + extra
    status, out, err = run_cli(argv)
    assert status == 0, err
    plan = json.loads(out)
    assert plan["training"]["mesh"]["tp"] == tp
    network = load(graph, 8 // plan["training"]["microbatches"], int(extra[1]) if extra else None)
    configs = [tuple(l["config"]) for l in plan["layers"]]
    assert [l["name"] for l in plan["layers"]] == list(network.names)
    assert _check_tensor_parallel(network, configs, tp) >= 4
    # What the exporters write is the degree that was priced: tests/test_engines.py (an export
    # keeps the search to what its engine runs, so it is checked there, engine by engine).


def test_sequence_parallel_flags_follow_roles_not_ops():
    net = graphs.build("gpt2-small", 4)
    flags = dict(zip(net.names, MeshMapper(net).sequence_parallel(Mesh(1, 4, sp=True))))
    assert flags["block1.attn.qkv"] and flags["block1.ff.up"] and not flags["embedding"]


# ---------------------------------------------------------------------------------------
# Blocks declared by the source


def test_builtin_blocks_are_the_models_own():
    resnet = graphs.build("resnet101", 2)
    assert len({b for b in resnet.blocks if b is not None}) == 33  # 3 + 4 + 23 + 3 bottlenecks
    first = resnet.names.index("stage1.block1.conv1")
    assert resnet.blocks[first - 1] is None and resnet.blocks[resnet.names.index("stage1.block1.add")] == 0
    transformer = graphs.build("transformer", 2)
    assert len({b for b in transformer.blocks if b is not None}) == 12  # 6 encoder and 6 decoder layers
    assert transformer.blocks[transformer.names.index("dec.embedding")] == 6  # the first decoder layer's
    inception = graphs.build("inception3", 2)
    assert len({b for b in inception.blocks if b is not None}) == 11  # mixed5b ... mixed7c
    assert network_from_json(network_to_json(resnet)).blocks == resnet.blocks


@pytest.mark.parametrize("spec, blocks", [("examples/hf_llama.py:tiny_llama", 2),
                                          ("examples/torchvision_cnns.py:resnet18_small", 8)])
def test_imported_blocks_are_module_list_children(spec, blocks):
    pytest.importorskip("torch")
    pytest.importorskip("transformers" if "hf_" in spec else "torchvision")
    net = load(f"torch:{spec}", 2)
    assert len({b for b in net.blocks if b is not None}) == blocks


VIT = """import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        b, n, e = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, e)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, patches=16, patch=48, width=32, classes=10):
        super().__init__()
        self.embed = nn.Linear(patch, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(2)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def tiny_vit(batch):
    return ViT(), (torch.zeros(batch, 16, 48),)
"""


def test_an_imported_vit_takes_its_roles_from_attention_and_its_stream(tmp_path):
    # No token ids: the patch projection makes the residual stream (model), attention declares
    # its heads, the MLP's inner width is named mlp; tp splits heads and MLP, not the stream.
    pytest.importorskip("torch")
    (tmp_path / "vit.py").write_text(VIT)
    net = load(f"torch:{tmp_path / 'vit.py'}:tiny_vit", 4)
    roles = {name: roles_of(layer) for name, layer in zip(net.names, net.layers)}
    assert roles["embed"][:3] == ("batch", "sequence", "model")
    assert roles["blocks.0.qkv"] == ("batch", "sequence", "stack", "heads", "head_width", "model")
    assert roles["blocks.0.fc1"] == ("batch", "sequence", "mlp", "model")
    assert roles["blocks.0.fc2"] == ("batch", "sequence", "model", "mlp")
    assert roles["head"] == ("batch", "classes", "model")
    configs = dict(zip(net.names, MeshMapper(net).configs(Mesh(2, 2, sp=False))))
    assert configs["blocks.0.fc1"] == (2, 1, 2, 1) and configs["blocks.0.add"] == (2, 1, 1)
    assert len({b for b in net.blocks if b is not None}) == 2


def test_an_old_graph_file_gets_its_blocks_from_structure(tmp_path):
    # A file without "block" fields: each copy of a run of equal, equally wired layers
    # (pase.search.blocks) is a block; Llama's 2 decoder layers here, as declared.
    from pase.sources.graph_json import load_graph_file

    net = graphs.build("llama3-8b", 2, 16)
    data = network_to_json(net)
    for spec in data["layers"]:
        spec.pop("block", None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert network_from_json(data).blocks is None  # re-batching keeps what the source said
    assert load_graph_file(str(path), None, None).blocks == net.blocks
