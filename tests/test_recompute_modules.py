"""Megatron-Core's selective recomputation by module (``--recompute-modules``, issue 42): which
layers each module covers, what it stops keeping and what it runs again, by hand; the recipe
words, the refusals, and the search's own use of NVIDIA's MoE modules."""

import json

import numpy as np
import pytest

from cli_runner import run
from graphs.decoder import DecoderConfig, MLAConfig, decoder
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


def _tiny_mla():
    """One MLA block's costing: 8 tokens of width 16, 2 heads, query rank 8, key-value rank 4,
    heads 4 wide without rotary positions and 2 with them, values 4 wide; one device."""
    cfg = DecoderConfig(layers=2, width=16, heads=2, kv_heads=2, head_dim=6, mlp_width=32, vocab=64, sequence=8,
                        mla=MLAConfig(kv_rank=4, nope=4, rope=2, value=4, q_rank=8))
    net = decoder(cfg, 1)
    costing = TrainingCosting(net, [np.asarray([c], dtype=np.int64) for c in mesh_configs(net, Mesh(dp=1))],
                              CalibratedMachine(PEAK))
    return net, costing


def test_mla_up_proj_by_hand():
    net, costing = _tiny_mla()
    up = TrainingOptions(recompute="selective", recompute_modules=("mla_up_proj",))
    at = {n[len("block1.attn."):]: v for v, n in enumerate(net.names) if n.startswith("block1.attn.")}
    kept = lambda name, o: costing.stored_activations(at[name], o)[0]  # noqa: E731
    # Kept under none, by hand: the latents' norms for the up projections' weight gradients
    # (8 x 8 = 64 and 8 x 4 = 32), the keys' two halves for the concatenation (2 x 8 x 4 = 64
    # and 1 x 8 x 2 = 16: a layer's backward reads its inputs unless it says otherwise,
    # Layer.backward_reads, and Concat does not), the values for the core (2 x 8 x 4 = 64), the rotated queries and
    # the joined keys for the scores (2 x 8 x 6 = 96 each); the query's product is read only by
    # its rotary embedding, which keeps nothing of it. All discarded under mla_up_proj.
    before = {"q_a_norm": 64, "q": 0, "kv_a_norm": 32, "k_nope": 64, "v": 64, "q_rotary": 96, "k_rotary": 16, "k": 96}
    for name, elements in before.items():
        assert (kept(name, NONE), kept(name, up)) == (elements, 0), name
    # The checkpoint's inputs stay: the latents (64 and 32, kept for their norms anyway) and
    # the shared rotary key, 8 x 2 = 16, which no backward pass kept before.
    assert [kept(n, NONE) for n in ("q_a", "kv_a", "k_rope")] == [64, 32, 0]
    assert [kept(n, up) for n in ("q_a", "kv_a", "k_rope")] == [64, 32, 16]
    # Each of the eight runs its forward again (a third of its compute), and holds its output
    # while it does: 64 + 96 + 32 + 64 + 64 + 96 + 16 + 96 = 528 elements.
    recompute = sum(costing.layer_time(at[n], up)["recompute"][0] for n in before)
    assert recompute == pytest.approx(sum(costing.layer_time(at[n], NONE)["compute"][0] for n in before) / 3)
    assert sum(costing.working_activations(at[n], up)[0] for n in before) == 528
    assert not any(costing.recomputed(at[n], up) for n in ("norm", "q_a", "kv_a", "k_rope", "scores", "out"))


def test_moe_module_reruns_the_whole_layer_by_hand():
    net, costing = _moe_costing()
    v, moe = 1, TrainingOptions(recompute="selective", recompute_modules=("moe",))
    # The layer is checkpointed at its input: of its 512 + 8448 elements (above) only its
    # output stays, here the block's output; the norm before it keeps its 512 (the input).
    assert costing.stored_activations(v, moe)[0] == 512
    assert costing.stored_activations(0, moe)[0] == 512
    # Its whole forward again (a third of its compute, half of its activation collectives), and
    # everything it keeps alive while it does: 512 + 8448 = 8960.
    none = costing.layer_time(v, NONE)
    assert costing.layer_time(v, moe)["recompute"][0] == pytest.approx(none["compute"][0] / 3
                                                                       + none["activation_comm"][0] / 2)
    assert costing.working_activations(v, moe)[0] == 8960
    # With moe_act besides it the activation is not run a second time.
    both = TrainingOptions(recompute="selective", recompute_modules=("moe_act", "moe"))
    assert costing.layer_time(v, both)["recompute"][0] == pytest.approx(costing.layer_time(v, moe)["recompute"][0])


def test_shared_experts_by_hand():
    # The two blocks again, each mixture of experts with one shared expert of width 32 (gated).
    g = GraphBuilder("moe", 1, batch=16)
    x = g.input((16, 16, 32), "x", letters="ble")
    for i in (1, 2):
        with g.block():
            h = g.add(f"block{i}.norm", RMSNorm(x))
            x = g.add(f"block{i}.moe", MoE(h, 16, 2, 64, shared=1, shared_hidden=32))
    net = g.build()
    costing = TrainingCosting(net, [np.array([[16, 1, 1]]), np.array([[1, 1, 16, 1, 1]])] * 2,
                              CalibratedMachine(PEAK))
    shared = TrainingOptions(recompute="selective", recompute_modules=("shared_experts",))
    # The shared expert's gate, up and activation outputs, 3 x 32 a token, for 16 tokens: 1,536
    # elements no longer kept (moe_layer.py:284-308 checkpoints it at the layer's input).
    assert costing.stored_activations(1, NONE)[0] - costing.stored_activations(1, shared)[0] == 1536
    assert costing.working_activations(1, shared)[0] == 1536
    # Its forward again: the gate-and-up product 16 x 64 x 32 and the down product 16 x 32 x 32,
    # 3 x 2 x (32,768 + 16,384) = 294,912 FLOP a step at 1000 TFLOPS, and the activation over
    # 16 x 2 x 32 = 1,024 elements (5 accesses of 2 bytes at 2000 GB/s), a third of each.
    expected = 294912 / 1e15 / 3 + 1024 * 5 * 2 / 2e12 / 3
    assert costing.layer_time(1, shared)["recompute"][0] == pytest.approx(expected)
    assert not costing.recomputed(1, shared)


def test_shared_experts_refusals():
    mixtral = ["-g", "mixtral-8x7b", "-p", "16", "-b", "32", "-m", "256", "--machine", "h100-sxm", "--recipe"]
    status, _, err = run(*mixtral, "dp=8,tp=2,ep=4,recompute=selective,recompute_modules=shared_experts")
    assert status == 2 and err.count("\n") == 1 and "has no shared experts" in err
    # Megatron-Core refuses it beside the shared experts' overlap (transformer_config.py:1232-1239).
    status, _, err = run(*DEEPSEEK_B200[:-1], DEEPSEEK_B200[-1] + ",recompute=selective,"
                         "recompute_modules=shared_experts,shared_overlap=true")
    assert status == 2 and err.count("\n") == 1 and "shared_overlap" in err, err


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
    # mla_up_proj (multi_latent_attention.py:714-845): from the latents (q_a, kv_a, before their
    # norms, which Transformer Engine fuses into the up projections) and the shared rotary key
    # (k_rope, a slice of the down projection's output) to attention's core: the norms, both up
    # projections (q, and k_nope and v from the key-value latent), the rotary embeddings and the
    # key's concatenation; not the block's input norm, the down projections or the core.
    up = ["block1.attn.q_a_norm", "block1.attn.q", "block1.attn.kv_a_norm", "block1.attn.k_nope", "block1.attn.v",
          "block1.attn.q_rotary", "block1.attn.k_rotary", "block1.attn.k"]
    assert marked(places.mla_up, 1) == up
    assert marked(places.mla_up, 61) == [n.replace("block1.", "block61.") for n in up]
    assert marked(places.mla_up_input, 1) == ["block1.attn.q_a", "block1.attn.kv_a", "block1.attn.k_rope"]
    places, block, marked = _places("hf:examples/hf/llama-3.1-8b.json")
    assert not places.mla_up.any() and not places.mla_up_input.any()


def test_recipe_words():
    r = parse_recipe("recompute=selective,recompute_modules=layernorm+moe_act")
    assert r.recompute_modules == ("moe_act", "layernorm")  # Megatron's order
    assert "recompute_modules=moe_act+layernorm" in r.text()
    for bad, why in [("recompute=full,recompute_modules=mlp", "applies to recompute=selective"),
                     ("recompute_modules=mlp", "applies to recompute=selective"),
                     ("recompute=selective,recompute_modules=attention",
                      "must be core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts"),
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


#: NVIDIA's DeepSeek-V3 layout on 256 B200: tp 1, pp 16, ep 8, micro-batch 1, global batch 4096
#: (Megatron-Bridge perf_recipes/deepseek/b200/deepseek_v3.py:32-43), its pipeline layout four
#: decoder layers a stage and one on the last, beside the multi-token prediction and the loss
#: (recipes/deepseek/h100/deepseek_v3.py:58, ``(16, 1)``).
DEEPSEEK_B200 = ["-g", "deepseek-v3", "-p", "256", "-b", "4096", "-m", "4096", "--machine", "b200", "--engine",
                 "megatron", "--json", "--recipe", "dp=16,tp=1,pp=16,cp=1,zero=1,schedule=1f1b,ep=8,microbatch=1"]
NVIDIA_CUT = ",stages=" + "/".join(["4"] * 15 + ["1"])


def test_nvidias_deepseek_v3_layout_fits_with_its_modules():
    # NVIDIA runs it with recompute_modules ["mla_up_proj"] (deepseek_v3.py:43): it ran, so it
    # fits. Megatron's default module (core_attn, which fused attention never stores) keeps every
    # up projection's output, about 84,000 elements a token a block (the latents' norms 1,536 +
    # 512, the keys' halves 128 x 128 + 64, the values 128 x 128, the rotated queries and the
    # joined keys 128 x 192 each): 688 MB a block and micro-batch at 4,096 tokens in BF16, and
    # the first stage holds 4 blocks of up to 16 micro-batches in flight: up to 44 GB more, past
    # the 192 GB a B200 has.
    status, out, err = run(*DEEPSEEK_B200[:-1],
                           DEEPSEEK_B200[-1] + NVIDIA_CUT + ",recompute=selective,recompute_modules=mla_up_proj")
    assert status == 0, err
    nvidia = json.loads(out)["training"]
    assert nvidia["recompute_modules"] == ["mla_up_proj"]
    status, _, err = run(*DEEPSEEK_B200[:-1], DEEPSEEK_B200[-1] + NVIDIA_CUT + ",recompute=selective")
    assert status == 4 and "nothing fits" in err
    # The search tries the up projections (alone and with NVIDIA's MoE modules) and takes them
    # over full recomputation, which reruns every layer.
    status, out, err = run(*DEEPSEEK_B200)
    assert status == 0, err
    searched = json.loads(out)["training"]
    assert "mla_up_proj" in searched["recipe"]
    status, out, err = run(*DEEPSEEK_B200[:-1], DEEPSEEK_B200[-1] + ",recompute=full")
    assert status == 0, err
    assert searched["step_seconds"] < json.loads(out)["training"]["step_seconds"]


def test_modules_need_their_layers():
    llama = ["-g", "llama3-8b", "-p", "8", "-b", "32", "-m", "1024", "--machine", "h100-sxm", "--recipe"]
    status, _, err = run(*llama, "dp=8,recompute=selective,recompute_modules=mla_up_proj")
    assert status == 2 and err.count("\n") == 1 and "has none" in err and "multi-latent attention" in err
    for modules in ("moe", "moe_act+layernorm"):
        status, _, err = run(*llama, f"dp=8,recompute=selective,recompute_modules={modules}")
        assert status == 2 and err.count("\n") == 1 and "has no mixture of experts" in err
