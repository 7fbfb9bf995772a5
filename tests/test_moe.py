"""Mixture of experts: the MoE layer's volumes, costs and memory by hand, the all-to-all inside
and across nodes, expert parallelism in meshes and recipes, the models from configs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import graphs
from graphs.decoder import DecoderConfig, MoEConfig, decoder, distinct_parameter_count
from pase.costing.training import layer_parts, model_flops
from pase.machines.base import Group
from pase.machines.calibrated import PRESETS, CalibratedMachine
from pase.machines.paper import Machine
from pase.model.builder import GraphBuilder
from pase.model.layers import MoE
from pase.planning.mesh import Mesh, Recipe, mesh_config, parse_recipe
from pase.planning.training_search import search_meshes
from pase.sources.graph_json import network_from_json, network_to_json

from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = CalibratedMachine(PRESETS["h100-sxm"])  # no table: the collectives are what is tested


def moe_layer(**kwargs):
    """Tokens (8, 16), width 32; 8 experts of width 64, top 2 (T = 128 tokens)."""
    g = GraphBuilder("t")
    x = g.input((8, 16, 32), "x", letters="ble")
    g.add("moe", MoE(x, 8, 2, 64, **kwargs))
    return g.build().layers[0]


# ---------------------------------------------------------------------------------------
# The all-to-all


def test_all_to_all_on_the_paper_machine():
    # rho = 10e3 / (16 / 8) = 5000; 8 elements over 4 devices: 5000 * 8 * 3/4 = 30000.
    assert Machine(10.0, 16.0).all_to_all(8.0, Group.flat(4)).tolist() == [30000.0]
    assert Machine(10.0, 16.0).all_to_all(8.0, Group.flat(1)).tolist() == [0.0]


@pytest.mark.parametrize("size, stride, expected", [
    # One node, 8 devices: 1e6 elements of 2 bytes = 2e6 bytes, 7/8 of them over NVLink:
    # 7/8 * 2e6 / 450e9 + 3e-6 = 3.8889e-6 + 3e-6.
    (8, 1, 7 / 8 * 2e6 / 450e9 + 3e-6),
    # 16 devices on 2 nodes (8 each): NVLink 7/16 * 2e6 / 450e9 + 3e-6 = 4.94e-6; network
    # 8/16 * 2e6 / 50e9 + 10e-6 = 2e-5 + 1e-5 = 3e-5, the slower.
    (16, 1, 3e-5),
    # 32 devices on 4 nodes: network 24/32 * 2e6 / 50e9 + 1e-5 = 3e-5 + 1e-5.
    (32, 1, 4e-5),
    # 8 devices one per node (stride 8): all 7/8 over the network: 3.5e-5 + 1e-5.
    (8, 8, 4.5e-5),
    (1, 1, 0.0),
])
def test_all_to_all_inside_and_across_nodes(size, stride, expected):
    group = Group(np.array([[size]]), np.array([[stride]]))
    assert H100.all_to_all(1e6, group)[0] == pytest.approx(expected, rel=1e-12)


def test_all_to_all_is_activation_traffic_in_the_training_parts():
    layer = moe_layer()
    C = np.array([[1, 1, 8, 1, 1]])  # experts only: no weight gradient to reduce but the router's
    parts = layer_parts(layer, C, H100)
    # Dispatched per device: k (T / c_x) D = 2 * (128 / 8) * 32 = 1024 elements, 2048 bytes;
    # four all-to-alls of 7/8 * 2048 / 450e9 + 3e-6 each.
    assert parts.activation[0] == pytest.approx(4 * (7 / 8 * 2048 / 450e9 + 3e-6))
    # The router's (32 x 8) gradient all-reduced over the 8 token holders at 4 bytes:
    # 2 * 7/8 * 1024 / 450e9 + 2 * 7 * 3e-6.
    assert parts.gradient[0] == pytest.approx(2 * 7 / 8 * 1024 / 450e9 + 14 * 3e-6)


# ---------------------------------------------------------------------------------------
# Volumes, capacity and imbalance


def test_token_counts_capacity_and_imbalance():
    C = np.array([[2, 1, 4, 1, 1]])
    # t_loc = 128 / (2 * 4) = 16 tokens; rows per expert k T / (c_t E) = 2 * 128 / (2 * 8) = 16;
    # dispatched k t_loc D = 2 * 16 * 32 = 1024 elements.
    layer = moe_layer()
    assert layer.per_device_tokens(C).tolist() == [16.0]
    assert layer.expert_rows(C).tolist() == [16.0]
    assert layer.dispatched(C).tolist() == [1024.0]
    # Imbalance 1.5, dropless: the busiest device 1.5x: 24 rows, 1536 elements.
    layer = moe_layer(imbalance=1.5)
    assert (layer.expert_rows(C).tolist(), layer.dispatched(C).tolist()) == ([24.0], [1536.0])
    # Capacity 1.25 cuts it: min(1.5, 1.25) = 1.25: 20 rows, 1280 elements.
    layer = moe_layer(imbalance=1.5, capacity=1.25)
    assert (layer.expert_rows(C).tolist(), layer.dispatched(C).tolist()) == ([20.0], [1280.0])
    # Capacity above the imbalance changes nothing.
    assert moe_layer(imbalance=1.5, capacity=2.0).expert_rows(C).tolist() == [24.0]


def test_costs_on_the_paper_machine_by_hand():
    layer = moe_layer()
    cost = layer.costs(np.array([[2, 1, 4, 1, 1]]), Machine(10.0, 16.0))
    # Compute (multiply-adds, three products a step): router 3 * 16 * 8 * 32 = 12288; softmax
    # 5 * 16 * 8 = 640; gate+up 2 experts * 3 * 16 * 128 * 32 = 393216 and its activation pass
    # 3 * (2 * 16 * 128) = 12288; down 2 * 3 * 16 * 32 * 64 = 196608; permute, unpermute and the
    # weighted sum 3 * 1024 = 3072. Total 618112.
    assert cost.compute.tolist() == [618112.0]
    # Communication (rho = 5000): router gradient (256 elements) over 8 token holders
    # 5000 * 256/8 * 2 * 7 = 2240000; gate+up gradient (2 * 128 * 32 = 8192) over the 2
    # token splits 5000 * 4096 * 2 = 40960000; down (2 * 32 * 64 = 4096) 20480000; four
    # all-to-alls of 1024 elements over 4: 4 * 5000 * 1024 * 3/4 = 15360000. Total 79040000.
    assert cost.communication.tolist() == [79040000.0]


def test_tensor_parallel_experts_all_reduce_over_the_width():
    layer = moe_layer()
    one = layer.costs(np.array([[1, 1, 1, 1, 1]]), Machine(10.0, 16.0)).communication[0]
    assert one == 0.0
    two = layer.costs(np.array([[1, 1, 1, 2, 1]]), Machine(10.0, 16.0)).communication[0]
    # f split 2: gate+up's input gradient (8 experts x 32 rows x 32 = 8192 elements, rows
    # 2 * 128 / 8 = 32) and down's output (the same 8192) all-reduced over 2:
    # 2 * 5000 * 8192/2 * 2 * 1 = 81920000.
    assert two == 81920000.0


def test_shared_experts_by_hand():
    plain = moe_layer().costs(np.array([[2, 1, 1, 1, 1]]), Machine(10.0, 16.0))
    shared = moe_layer(shared=2, shared_hidden=16, shared_gate=True).costs(np.array([[2, 1, 1, 1, 1]]),
                                                                           Machine(10.0, 16.0))
    # t_loc = 64 tokens, width 2 * 16 = 32: gate+up 3 * 64 * 64 * 32 = 393216 plus its pass
    # 3 * 64 * 64 = 12288; down 3 * 64 * 32 * 32 = 196608; the add 64 * 32 = 2048; the sigmoid
    # gate 3 * 64 * 1 * 32 = 6144. Total 610304.
    assert shared.compute[0] - plain.compute[0] == 610304.0


def test_expert_parallel_memory():
    layer = moe_layer(shared=1, shared_hidden=16)
    parts = layer_parts(layer, np.array([[2, 1, 4, 1, 1], [1, 1, 8, 1, 1]]), Machine())
    router, gate, up, down, s_gate, s_up, s_down = parts.params
    # Each expert matrix (8, 32, 64) = 16384 elements over c_x = 4: 4096 a device, replicated
    # over the 2 token splits (ZeRO shards over those); c_x = 8: 2048, no replica.
    for matrix in (gate, up, down):
        assert matrix[0].tolist() == [4096.0, 2048.0]
        assert matrix[1].tolist() == [2.0, 1.0]
    # The router (32 x 8) and the shared expert (32 x 16) are whole on every device.
    assert router[0].tolist() == [256.0, 256.0] and router[1].tolist() == [8.0, 8.0]
    assert s_up[0].tolist() == [512.0, 512.0]
    # Stored activations: the (8, 16, 32) output over the 8 devices holding its tokens: 512.
    assert parts.activations.tolist() == [512.0, 512.0]


def test_tokens_split_by_the_expert_split_on_the_batch():
    layer = moe_layer()
    configs = layer.input_configs(np.array([[2, 1, 4, 1, 1], [1, 4, 2, 2, 1]]))[0]
    # The batch takes c_b c_x: 2 * 4 = 8 with the sequence whole; 1 * 2 with the sequence 4; the
    # width f is replicated, D unsplit.
    assert configs.tolist() == [[8, 1, 1], [2, 4, 1]]


def test_forward_flops_and_bad_arguments():
    layer = moe_layer()
    # 2 T D E + 2 k T 3 D H = 2 * 128 * 32 * 8 + 2 * 2 * 128 * 3 * 32 * 64 = 65536 + 3145728.
    assert layer.forward_flops() == 3211264.0
    g = GraphBuilder("t")
    x = g.input((8, 32), "x")
    for kwargs, words in (({"top_k": 9}, "more than its 8 experts"), ({"capacity": 0.5}, "capacity"),
                          ({"imbalance": float("nan")}, "imbalance"), ({"shared": 1}, "count and a width"),
                          ({"gated": 1}, "true or false")):
        args = {"experts": 8, "top_k": 2, "hidden": 4, **kwargs}
        with pytest.raises(ValueError, match=words):
            MoE(x, **args)


def test_json_round_trip():
    g = GraphBuilder("t", batch=8)
    x = g.input((8, 16, 32), "x", letters="ble")
    g.add("moe", MoE(x, 8, 2, 64, capacity=1.25, shared=1, shared_hidden=16, shared_gate=True))
    net = g.build()
    back = network_from_json(json.loads(json.dumps(network_to_json(net))))
    assert back.layers[0].args == net.layers[0].args
    C = np.array([[2, 1, 4, 2, 1]])
    assert back.layers[0].cost(C, Machine()).tolist() == net.layers[0].cost(C, Machine()).tolist()


# ---------------------------------------------------------------------------------------
# Meshes and recipes


def test_mesh_with_expert_parallelism():
    net = graphs.build("mixtral-8x7b", 64, 16)
    v = net.names.index("block1.ff.moe")
    # ep 8 carved out of dp 64: the batch 8 ways, the experts 8 ways; tp goes to the width f.
    assert mesh_config(net.layers[v], Mesh(64, ep=8)) == (8, 1, 8, 1, 1)
    assert mesh_config(net.layers[v], Mesh(8, tp=8)) == (8, 1, 1, 8, 1)
    # Every other layer is as without ep: attention q keeps the batch 64 ways.
    q = net.names.index("block1.attn.q")
    assert mesh_config(net.layers[q], Mesh(64, ep=8)) == mesh_config(net.layers[q], Mesh(64))
    # The MoE input is then the batch split 8 * 8 = 64 ways: no redistribution from attention.
    assert net.layers[v].input_configs(np.array([[8, 1, 8, 1, 1]]))[0].tolist() == [[64, 1, 1]]
    # ep 8 over dp 4 (folded) has no sequence or tensor ranks to take the other 2 ways from.
    with pytest.raises(ValueError, match="expert parallelism 8 does not divide"):
        mesh_config(net.layers[v], Mesh(4, ep=8))


def test_recipe_ep():
    assert parse_recipe("dp=64,ep=8").ep == 8
    with pytest.raises(ValueError, match="ep must be a positive integer"):
        parse_recipe("ep=0")
    with pytest.raises(ValueError, match=r"ep=8 x etp=1 must divide dp=4 x cp=1 x tp=1"):
        parse_recipe("dp=4,tp=1,cp=1,ep=8").check(4)


def small_moe(batch):
    cfg = DecoderConfig(2, 64, 4, 2, 16, 128, 256, sequence=32, moe=MoEConfig(4, 2, 96))
    return decoder(cfg, batch, "small-moe")


def test_search_tries_expert_degrees_and_recipes_fix_them():
    machine = CalibratedMachine(dict(PRESETS["h100-sxm"], devices_per_node=4))
    found = search_meshes(small_moe, 8, 8, machine, None, 2.0, keep_all=True)
    assert found.experts
    eps = {priced.mesh.ep for priced in found.candidates}
    assert eps == {1, 2, 4}  # divisors of dp dividing 4 experts
    fixed = search_meshes(small_moe, 8, 8, machine, None, 2.0, Recipe(ep=2, tp=1))
    assert fixed.best.mesh.ep == 2 and "ep=2" in fixed.best.recipe()
    dense = lambda b: decoder(DecoderConfig(2, 64, 4, 2, 16, 128, 256, sequence=32), b)  # noqa: E731
    with pytest.raises(ValueError, match="no mixture-of-experts layer"):
        search_meshes(dense, 8, 8, machine, None, 2.0, Recipe(ep=2))


def test_expert_flops_count_in_model_flops():
    net = small_moe(2)
    moe = [layer for layer in net.layers if layer.op == "MoE"]
    dense = [layer for layer in net.layers if layer.op in ("Einsum", "FC")]
    expected = 3.0 * (sum(2.0 * np.prod(layer.domain) for layer in dense) + sum(m.forward_flops() for m in moe))
    assert model_flops(net) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------
# Models


def test_mixtral_parameters():
    # L (2 e^2 + 2 e g k + e E + 3 E e f + 2 e) + 2 V e + e with e 4096, g k 1024, E 8,
    # f 14336, V 32000: 32 * 1451270144 + 262144000 + 4096 = 46702792704 (HF: 46.7B).
    net = graphs.build("mixtral-8x7b", 1, 16)
    assert distinct_parameter_count(net) == 46702792704


def _hf_count(config_cls, model_cls, **kwargs):
    torch = pytest.importorskip("torch")
    cfg = config_cls(**kwargs)
    with torch.device("meta"):
        model = model_cls(cfg)
    return cfg, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_hf_configs_match_the_models_on_meta(kind, tmp_path):
    transformers = pytest.importorskip("transformers")
    small = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=1000, num_experts_per_tok=2)
    if kind == "mixtral":
        cfg, count = _hf_count(transformers.MixtralConfig, transformers.MixtralForCausalLM, intermediate_size=128,
                               num_local_experts=4, **small)
    elif kind == "qwen2_moe":
        cfg, count = _hf_count(transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM, intermediate_size=512,
                               moe_intermediate_size=64, shared_expert_intermediate_size=128, num_experts=8,
                               decoder_sparse_step=2, mlp_only_layers=[0], **small)
    else:
        cfg, count = _hf_count(transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, intermediate_size=512,
                               moe_intermediate_size=64, num_experts=8, head_dim=32, mlp_only_layers=[1], **small)
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(cfg.to_dict(), default=str))
    from pase.sources.hf import load_hf
    net = load_hf(str(path), 2, 16)
    assert abs(distinct_parameter_count(net) - count) <= 1e-3 * count
    assert any(layer.op == "MoE" for layer in net.layers)


def test_cli_plan_is_deterministic_across_hash_seeds():
    args = [sys.executable, "-m", "pase", "-g", "mixtral-8x7b", "-m", "256", "-b", "16", "-p", "16",
            "--machine", "h100-sxm", "--training"]
    outs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=ROOT)
        done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
        outs.append([line for line in done.stdout.splitlines() if not line.startswith("search:")])
    assert outs[0] == outs[1]
    assert any("ep" in line for line in outs[0])


def test_verify_jax_with_experts_and_their_width_split(tmp_path):
    pytest.importorskip("jax")
    import pase
    from pase.sources.hf import load_hf
    path = tmp_path / "small.json"
    path.write_text(json.dumps({
        "model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, "num_local_experts": 4,
        "num_experts_per_tok": 2, "max_position_embeddings": 64}))
    net = load_hf(str(path), 2, 16)
    configs = [tuple([1] * len(layer.domain)) for layer in net.layers]
    for v, layer in enumerate(net.layers):
        if layer.op == "MoE":
            configs[v] = (1, 1, 4, 2, 1)  # the experts 4 ways, each expert's width 2 ways
    assert pase.verify(net, configs, 8).ok
