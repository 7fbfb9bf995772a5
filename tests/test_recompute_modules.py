"""Megatron-Core's selective recomputation by module (``--recompute-modules``, issue 42): which
layers each module covers, what it stops keeping and what it runs again, by hand; the recipe
words, the refusals, and the search's own use of NVIDIA's MoE modules."""

import json

import numpy as np
import pytest

from cli_runner import run
from pase.costing.training import TrainingCosting, TrainingOptions
from pase.machines.calibrated import CalibratedMachine
from pase.model.builder import GraphBuilder
from pase.model.layers import MoE, RMSNorm
from pase.planning.mesh import Mesh, mesh_configs, parse_recipe
from pase.sources.registry import load

# No measured table: memory-bound work at the HBM's 2000 GB/s, 2-byte activations.
PEAK = {"name": "peak", "devices_per_node": 8, "memory_gb": 80, "peak_tflops": 1000, "hbm_gbps": 2000,
        "intra_node": {"gbps": 450, "latency_us": 3}, "inter_node": {"gbps": 50, "latency_us": 10},
        "act_bytes": 2, "grad_bytes": 4}
NONE = TrainingOptions()
MOE_ACT = TrainingOptions(recompute="selective", recompute_modules=("moe_act",))
LAYERNORM = TrainingOptions(recompute="selective", recompute_modules=("layernorm",))


def _moe_costing():
    """Two blocks, each an RMSNorm and a MoE of 16 experts of width 64, top 2, on tokens (16, 16)
    of width 32 (T = 256); the norm's batch and the experts split 16 ways."""
    g = GraphBuilder("moe", 1, batch=16)
    x = g.input((16, 16, 32), "x", letters="ble")
    for i in (1, 2):
        with g.block():
            h = g.add(f"block{i}.norm", RMSNorm(x))
            x = g.add(f"block{i}.moe", MoE(h, 16, 2, 64))
    net = g.build()
    configs = [np.array([[16, 1, 1]]), np.array([[1, 1, 16, 1, 1]])] * 2
    return net, TrainingCosting(net, configs, CalibratedMachine(PEAK))


def test_moe_act_drops_the_experts_activation_by_hand():
    net, costing = _moe_costing()
    v = 1
    # A device holds T / c_x = 16 tokens, k = 2 copies each: 32 routed rows. It keeps its output
    # (the block's, 16 x 32 = 512) and inside it 32 x (2 D + 3 H) + 16 E = 8448; the
    # activation's output among them is 32 x H = 32 x 64 = 2048 elements.
    assert costing.stored_activations(v, NONE)[0] == pytest.approx(16 * 32 + 32 * (2 * 32 + 3 * 64) + 16 * 16)
    assert costing.stored_activations(v, NONE)[0] - costing.stored_activations(v, MOE_ACT)[0] == pytest.approx(2048)
    # It runs again from the gated products' output: one point-wise pass over 2 x 2048 elements,
    # 5 element accesses each forward and backward at 2 bytes and 2000 GB/s, of which the
    # forward share 1/3: 4096 x 5 x 2 / 2e12 / 3 = 6.827e-9 s; nothing else of the layer again.
    time = costing.layer_time(v, MOE_ACT)
    assert time["recompute"][0] == pytest.approx(4096 * 5 * 2 / 2e12 / 3)
    assert time["compute"][0] == pytest.approx(costing.layer_time(v, NONE)["compute"][0])
    # While its backward runs, the one activation it ran again is alive: 2048 elements.
    assert costing.working_activations(v, MOE_ACT)[0] == pytest.approx(2048)
    assert not costing.recomputed(v, MOE_ACT)


def test_layernorm_drops_the_norm_before_the_experts_by_hand():
    net, costing = _moe_costing()
    v = 0
    # The norm's output, 16 x 16 x 32 / 16 = 512 elements a device, kept for the experts'
    # backward pass under none; discarded and run again (its forward share) under layernorm.
    assert costing.stored_activations(v, NONE)[0] == pytest.approx(512)
    assert costing.stored_activations(v, LAYERNORM)[0] == 0.0
    assert costing.recomputed(v, LAYERNORM) and not costing.recomputed(v, MOE_ACT)
    compute = costing.layer_time(v, NONE)["compute"][0]
    assert costing.layer_time(v, LAYERNORM)["recompute"][0] == pytest.approx(compute / 3)


def _places(config):
    net = load(config, 1, 128)
    costing = TrainingCosting(net, [np.asarray([c], dtype=np.int64) for c in mesh_configs(net, Mesh(dp=1))],
                              CalibratedMachine(PEAK))
    places = costing.recomputation.places
    block = lambda k: [n for v, n in enumerate(net.names) if n.startswith(f"block{k}.")]  # noqa: E731
    marked = lambda mask, k: [n for v, n in enumerate(net.names) if mask[v] and n.startswith(f"block{k}.")]  # noqa: E731
    return places, block, marked


def test_the_modules_are_megatrons_module_boundaries():
    # Megatron-Core's Transformer Engine spec (models/gpt/gpt_layer_specs.py) fuses every norm
    # into the linear after it but before experts and under multi-latent attention, where
    # layernorm recomputes it (transformer_layer.py:383-438); mlp checkpoints a dense block's
    # MLP, its fused norm and products and activation, not the residual after it (:445-447).
    places, block, marked = _places("hf:examples/hf/llama-3.1-8b.json")
    assert marked(places.module_norm, 1) == []
    assert marked(places.dense_mlp, 1) == ["block1.ff.norm", "block1.ff.gate", "block1.ff.up", "block1.ff.multiply",
                                           "block1.ff.down"]
    places, block, marked = _places("hf:examples/hf/mixtral-8x7b.json")
    assert marked(places.module_norm, 1) == ["block1.ff.norm"] and marked(places.dense_mlp, 1) == []
    places, block, marked = _places("hf:examples/hf/deepseek-v3.json")
    # Its first three blocks are dense (an MLP), the rest experts; attention is multi-latent.
    assert marked(places.module_norm, 1) == ["block1.attn.norm"]
    assert marked(places.dense_mlp, 1) == ["block1.ff.norm", "block1.ff.gate", "block1.ff.up", "block1.ff.multiply",
                                           "block1.ff.down"]
    assert marked(places.module_norm, 61) == ["block61.attn.norm", "block61.ff.norm"]
    assert marked(places.dense_mlp, 61) == []


def test_recipe_words():
    r = parse_recipe("recompute=selective,recompute_modules=layernorm+moe_act")
    assert r.recompute_modules == ("moe_act", "layernorm")  # Megatron's order
    assert "recompute_modules=moe_act+layernorm" in r.text()
    for bad, why in [("recompute=full,recompute_modules=mlp", "applies to recompute=selective"),
                     ("recompute_modules=mlp", "applies to recompute=selective"),
                     ("recompute=selective,recompute_modules=mla_up_proj", "must be core_attn, moe_act, layernorm, mlp"),
                     ("recompute=selective,recompute_modules=mlp+mlp", "names a module twice")]:
        with pytest.raises(ValueError, match=why):
            parse_recipe(bad)
    with pytest.raises(ValueError, match="in that order"):
        TrainingOptions(recompute="selective", recompute_modules=("layernorm", "moe_act"))


QWEN = ["-g", "hf:examples/hf/qwen3-30b-a3b.json", "-p", "16", "-b", "1024", "-m", "4096", "--machine", "h100-sxm"]
LAYOUT = "dp=16,tp=1,ep=16,zero=1,microbatch=1,precision=fp8,scaling="


def test_refusals_in_one_line():
    status, _, err = run(*QWEN, "--engine", "torchtitan", "--recipe",
                         "dp=16,tp=1,zero=1,recompute=selective,recompute_modules=moe_act")
    assert status == 2 and err.count("\n") == 1 and "does not recompute moe_act" in err
    status, _, err = run(*QWEN, "--recipe", LAYOUT + "delayed,recompute=selective,recompute_modules=moe_act")
    assert status == 2 and err.count("\n") == 1 and "FP8 delayed scaling" in err


def test_the_search_tries_nvidias_moe_modules():
    # Qwen3-30B-A3B as NVIDIA runs it on 16 H100 (ep 16): without recomputation it fits only at
    # its modelled peak; the experts' activation and the norm before them, rerun, give 2.9 GB
    # back for 0.9 % of the step, and the search takes that plan.
    status, out, err = run(*QWEN, "--recipe", LAYOUT + "current", "--json")
    assert status == 0, err
    t = json.loads(out)["training"]
    assert "recompute=selective,recompute_modules=moe_act+layernorm" in t["recipe"]
    status, out, err = run(*QWEN, "--recipe", LAYOUT + "current,recompute=none", "--json")
    assert status == 0, err
    bare = json.loads(out)["training"]
    assert bare["peak_memory_bytes"] - t["peak_memory_bytes"] > 2e9
    assert 0 < t["step_seconds"] / bare["step_seconds"] - 1 < 0.02
    # Not under delayed scaling, where Megatron-Core refuses them.
    status, out, err = run(*QWEN, "--recipe", LAYOUT + "delayed", "--json")
    assert status == 0, err
    assert "recompute_modules" not in json.loads(out)["training"]["recipe"]
