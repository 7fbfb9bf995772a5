"""Today's models from their ``config.json`` (``-g hf:``): DeepSeek-V3, Qwen3, GPT-OSS,
Nemotron, MPT, Gemma 2/3, Phi-3, Mistral's window; sliding-window attention priced over its
band; the built-in flagship names.

Parameter counts: the table of ``/work/shared/reference/hf-configs/README.md`` (transformers
5.24 on the meta device, ``sum(p.numel())``), copied below as facts; with transformers
installed, each file is built there and compared to the unit.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

import graphs
from cli_runner import run
from graphs.decoder import DecoderConfig, MLAConfig, MoEConfig, decoder, distinct_parameter_count, parameter_count
from pase.costing.training import TrainingCosting, TrainingOptions, layer_parts
from pase.machines.paper import Machine
from pase.machines.registry import load_machine
from pase.model.builder import GraphBuilder
from pase.model.layers import Einsum, MoE, Softmax
from pase.model.layers.masks import band_density, band_pairs, halo_rows
from pase.sources.hf import load_hf, read_decoder_config, read_hf_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "hf")

#: transformers' counts (the reference README's table; MTP modules not included).
REFERENCE = {
    "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
    "qwen3-8b": 8_190_735_360, "qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560,
    "deepseek-v3": 671_026_404_352, "gpt-oss-120b": 116_829_156_672, "nemotron-4-340b": 341_029_195_776,
    "mpt-7b": 6_649_286_656, "gemma-3-27b": 27_009_346_304, "phi-3-mini": 3_821_079_552,
}


def example(name: str) -> str:
    return os.path.join(EXAMPLES, f"{name}.json")


def config(name: str, sequence: int = 64, **kw):
    return read_decoder_config(read_hf_config(example(name)), sequence, name, **kw)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_parameter_count_is_transformers(name):
    cfg, _ = config(name)
    assert parameter_count(cfg) == REFERENCE[name]
    assert distinct_parameter_count(load_hf(example(name), 1, 64)) == REFERENCE[name]


@pytest.mark.parametrize("name", sorted(f[:-5] for f in os.listdir(EXAMPLES) if f.endswith(".json")))
def test_every_example_counts_as_transformers_builds_it(name):
    """Every config of examples/hf built by transformers on the meta device (CI installs it)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = read_hf_config(example(name))
    fields = {k: v for k, v in data.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(data["model_type"],
                                                                                               **fields))
    expected = sum(p.numel() for p in model.parameters())
    assert distinct_parameter_count(load_hf(example(name), 1, 64)) == expected
    if name in REFERENCE:
        assert expected == REFERENCE[name]


def test_deepseek_v3_shape():
    cfg, notes = config("deepseek-v3")
    assert cfg.mla == MLAConfig(kv_rank=512, nope=128, rope=64, value=128, q_rank=1536)
    assert cfg.moe.dense == (0, 1, 2) and cfg.moe.groups == 8 and cfg.moe.group_top == 4
    assert cfg.moe.shared == 1 and cfg.moe.shared_width == 2048 and cfg.mtp == 0
    assert notes == ("num_nextn_predict_layers 1: the multi-token-prediction module is left out (--mtp adds it)",)
    # MLA per block (hand): q 7168 x 1536 + 1536 + 1536 x 128 x 192 = 48,760,320; kv 7168 x 576 + 512 +
    # 512 x 128 x 256 = 20,906,496; out 128 x 128 x 7168 = 117,440,512; sum 187,107,328.
    assert cfg.mla.parameters(7168, 128) == 187_107_328
    net = load_hf(example("deepseek-v3"), 1, 64)
    names = set(net.names)
    assert {"block1.ff.down", "block3.ff.down", "block4.ff.moe", "block1.attn.kv_a_norm", "block1.attn.k"} <= names
    assert "block4.ff.down" not in names and not any(n.startswith("mtp") for n in names)


def test_kimi_k2_reads_as_the_deepseek_v3_architecture_it_names(tmp_path):
    # Kimi K2's config.json says model_type "kimi_k2" and architectures ["DeepseekV3ForCausalLM"]:
    # DeepSeek-V3's fields, with 384 routed experts, 64 heads, one dense block, no MTP module and
    # a 163,840-token vocabulary (moonshotai/Kimi-K2-Instruct config.json).
    data = read_hf_config(example("deepseek-v3"))
    data.update({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 384,
                 "num_attention_heads": 64, "num_key_value_heads": 64, "first_k_dense_replace": 1, "n_group": 1,
                 "topk_group": 1, "num_nextn_predict_layers": 0, "vocab_size": 163840})
    kimi, _ = read_decoder_config(data, 64, "kimi.json")
    same, _ = read_decoder_config({**data, "model_type": "deepseek_v3"}, 64, "same.json")
    assert kimi == same and kimi.moe.experts == 384 and kimi.moe.dense == (0,) and kimi.heads == 64
    # Its parameters by hand: per MoE block 384 experts x 3 x 7168 x 2048 = 16,911,433,728; 60 of
    # them 1,014,686,023,680, about 99 % of Kimi K2's published 1.04T; the rest is attention,
    # the shared experts, the dense block and the two embeddings (163,840 x 7168 each).
    total = parameter_count(kimi)
    assert 1_014_686_023_680 < total < 1_040_000_000_000


def test_deepseek_v3_mtp_module():
    cfg, notes = config("deepseek-v3", mtp=True)
    assert cfg.mtp == 1 and notes == ()
    # The module (hand): norms 2 x 7168 + 7168, projection 2 x 7168^2 = 102,760,448, one MoE block:
    # MLA 187,107,328 + norms 14,336 + router 7168 x 256 = 1,835,008 + experts 256 x 3 x 7168 x 2048 =
    # 11,274,289,152 + shared 3 x 7168 x 2048 = 44,040,192: 11,610,067,968 in all with the 21,504 norms.
    assert parameter_count(cfg) - REFERENCE["deepseek-v3"] == 11_610_067_968
    net = load_hf(example("deepseek-v3"), 1, 64, mtp=True)
    assert distinct_parameter_count(net) == parameter_count(cfg)
    head, mtp_head = (net.layers[net.names.index(n)] for n in ("head.logits", "mtp1.logits"))
    assert head.inputs[1] is mtp_head.inputs[1]  # the shared output head
    assert [n for n in net.names if n.endswith("loss")] == ["loss", "mtp1.loss"]


def test_qwen3_gemma_mpt_nemotron_gpt_oss_shapes():
    q3, _ = config("qwen3-8b")
    assert q3.qk_norm and not q3.tied and q3.window == 0
    gemma, _ = config("gemma-3-27b")
    # Gemma 3: every sixth block full, the others a 1024 window; four norms per block; tied.
    assert gemma.tied and gemma.post_norms and gemma.qk_norm and gemma.window == 1024
    assert gemma.window_blocks == tuple(i for i in range(62) if (i + 1) % 6)
    mpt, _ = config("mpt-7b")
    assert (mpt.positions, mpt.norm_bias, mpt.tied, mpt.gated, mpt.mlp_width) == ("alibi", False, True, False, 16384)
    net = load_hf(example("mpt-7b"), 1, 64)
    assert net.layers[net.names.index("block1.attn.softmax")].args["alibi"] is True
    assert "rotary table (queries)" not in str([t.name for layer in net.layers for t in layer.inputs])
    nemo, _ = config("nemotron-4-340b")
    assert (nemo.norm, nemo.norm_bias, nemo.gated) == ("layer", True, False)
    oss, _ = config("gpt-oss-120b")
    assert oss.sinks and oss.window == 128 and oss.window_blocks == tuple(range(0, 36, 2))
    assert oss.moe.router_bias and oss.moe.expert_bias
    net = load_hf(example("gpt-oss-120b"), 1, 512)
    softmax = [net.layers[net.names.index(f"block{i}.attn.softmax")] for i in (1, 2)]
    assert softmax[0].args.get("window") == 128 and "window" not in softmax[1].args
    assert softmax[0].parameters() == [((8, 8), (1, 2))]  # 64 sinks, split like the heads
    phi, _ = config("phi-3-mini", 4096)
    assert phi.window == 2047 and phi.window_blocks is None


def test_gemma2_defaults():
    data = {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}
    cfg = read_decoder_config(data, 16, "g.json")[0]
    # transformers: head_dim 256, window 4096 on even blocks, soft-capping 50 (scores) and 30 (logits).
    assert (cfg.head_dim, cfg.window, cfg.window_blocks, cfg.softcap, cfg.final_softcap) == (256, 4096, (0, 2), 50.0, 30.0)
    net = decoder(cfg, 1)
    assert net.layers[net.names.index("block1.attn.softmax")].args["softcap"] == 50.0
    assert net.layers[net.names.index("head.logits")].args["pw"] == 1


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b"])
def test_built_in_flagship_is_its_config(name):
    ours, ref = graphs.build(name, 2, 256), load_hf(example(name), 2, 256)
    assert ours.names == ref.names and ours.edges == ref.edges
    for a, b in zip(ours.layers, ref.layers):
        assert type(a) is type(b) and (a.domain, a.dims, a.args) == (b.domain, b.dims, b.args)
        assert a.parameters() == b.parameters()
    assert distinct_parameter_count(ours) == REFERENCE[name]


# ---------------------------------------------------------------------------------------
# Sliding-window attention


def windowed_attention(s: int, w: int, heads: int = 1, k: int = 128):
    g = GraphBuilder("swa", batch=1, roles={"b": "batch", "g": "kv_groups", "r": "heads", "l": "sequence",
                                            "m": "key_sequence", "k": "head_width"})
    q = g.input((1, heads, 1, s, k), "q", letters="bgrlk")
    key = g.input((1, heads, s, k), "k", letters="bglk")
    value = g.input((1, heads, s, k), "v", letters="bglk")
    banded = {"window": w, "band": "lm"}
    scores = g.add("scores", Einsum("bgrlk,bgmk->bgrlm", q, key, **banded))
    weights = g.add("softmax", Softmax(scores, axis=-1, causal=True, window=w))
    g.add("context", Einsum("bgrlm,bgmk->bgrlk", weights, value, **banded))
    return g.build()


def test_band_by_hand():
    # s = 8192, w = 128: query i sees min(i + 1, 128) keys: 128 x 8192 - 128 x 127 / 2 = 1,048,576 -
    # 8,128 = 1,040,448 pairs of the 67,108,864 (1.5504 %, about 1/64.5).
    assert band_pairs(8192, 128) == 1_040_448
    assert band_density(8192, 128) == 1_040_448 / 67_108_864
    assert band_pairs(4, 2) == 7  # 1 + 2 + 2 + 2
    assert band_density(8192, 8192) == band_density(8192, 0) == 1.0


def test_windowed_layer_flops_time_and_stored_bytes_by_hand():
    net = windowed_attention(8192, 128)
    scores, softmax, context = net.layers
    unsplit = np.ones((1, 6), dtype=np.int64)
    # FLOPs: 2 x 1,040,448 pairs x 128 (head width) = 266,354,688 per product (the full square:
    # 2 x 8192^2 x 128 = 17,179,869,184, 64.5 times as much).
    assert scores.forward_flops() == context.forward_flops() == 266_354_688
    # Time on the paper machine (a multiply-add counts 1; forward and two backward products):
    # 3 x 1,040,448 x 128 = 399,532,032 FLOP-equivalents per product.
    assert scores.costs(unsplit, Machine()).compute[0] == pytest.approx(399_532_032)
    # Stored: the scores' and probabilities' band, 1,040,448 elements each = 2,080,896 bytes at 2 bytes.
    h100 = load_machine("h100-sxm")
    assert layer_parts(scores, unsplit, h100).activations[0] == 1_040_448
    assert layer_parts(softmax, np.ones((1, 5), dtype=np.int64), h100).activations[0] * 2 == 2_080_896
    assert layer_parts(context, unsplit, h100).activations[0] == 8192 * 128  # the context is not banded
    # Fused (--training): 2 products x 2 FLOPs x 1,040,448 x 128 = 532,709,376 forward, x 3.5 with
    # the backward = 1,864,482,816 FLOPs at 30 % of 989 TFLOP/s (the default fused-attention
    # efficiency) at h100-sxm's sustained clock, 1590 of 1980 MHz: 7.8257e-6 s.
    costing = TrainingCosting(net, [unsplit, np.ones((1, 5), dtype=np.int64), unsplit], h100)
    seconds = costing.compute(0, TrainingOptions(fused_attention=True))[0]
    assert seconds == pytest.approx(1_864_482_816 / (0.3 * 989e12 * (1590 / 1980)), rel=1e-3)


def test_sequence_split_exchanges_only_the_window():
    net = windowed_attention(8192, 128, heads=2)
    scores = net.layers[0]
    C = np.array([[1, 1, 1, 4, 1, 1]])  # the queries (l) split 4 ways
    # The keys are taken split like the queries: no gather of the whole sequence.
    assert scores.input_configs(C)[1].tolist() == [[1, 1, 4, 1]]
    # The halo: 127 keys x 2 heads x 128 wide = 32,512 elements, forward and backward: 65,024
    # words x rho (5000 on the paper machine) = 325,120,000.
    cost = scores.costs(C, Machine())
    assert cost.communication[0] == pytest.approx(2 * 127 * 2 * 128 * 5000)
    assert halo_rows(8192, np.array([1, 4, 8192]), 128).tolist() == [0.0, 127.0, 127.0]
    assert halo_rows(256, np.array([2]), 200).tolist() == [128.0]  # at most what the device does not hold


def test_mistral_window_at_32k():
    with_window = load_hf(example("mistral-7b"), 1, 32768)
    data = dict(read_hf_config(example("mistral-7b")), sliding_window=None)
    cfg = read_decoder_config(data, 32768, "m.json")[0]
    without = decoder(cfg, 1)
    flops = [sum(layer.forward_flops() for layer in net.layers) for net in (with_window, without)]
    scores = with_window.layers[with_window.names.index("block1.attn.scores")]
    assert scores.density == band_density(32768, 4096) and flops[0] < flops[1]


# ---------------------------------------------------------------------------------------
# Group-limited routing


def test_group_limited_dispatch_by_hand():
    g = GraphBuilder("moe", batch=8)
    x = g.input((8, 16, 32), "x", letters="ble")
    limited = MoE(x, 64, 8, 16, groups=8, group_top=4)
    free = MoE(x, 64, 8, 16)
    C = np.array([[1, 1, 1, 1, 1], [1, 1, 4, 1, 1], [1, 1, 16, 1, 1], [1, 1, 64, 1, 1]])
    # min(k = 8, c_x, 4 max(1, c_x / 8)): 1 device: 1; 4: 4; 16: min(8, 16, 8) = 8; 64: 8.
    assert limited.copies(C).tolist() == [1.0, 4.0, 8.0, 8.0]
    assert free.copies(C).tolist() == [8.0] * 4
    assert limited.parameters() == free.parameters()


# ---------------------------------------------------------------------------------------
# The command line


def test_cli_notes_and_mtp(tmp_path):
    path = example("deepseek-v3")
    status, out, err = run("-g", f"hf:{path}", "-p", "4", "-b", "4", "-m", "64")
    assert status == 0 and err.count("num_nextn_predict_layers 1") == 1 and err.startswith("pase: note: hf config ")
    status, out, err = run("-g", f"hf:{path}", "-p", "4", "-b", "4", "-m", "64", "--mtp")
    assert status == 0 and "num_nextn_predict_layers" not in err and "mtp1.loss" in out
    status, out, err = run("-g", "alexnet", "--mtp")
    assert status == 2 and err == "pase: error: --mtp applies only to Hugging Face configs (-g hf:...), not to 'alexnet'\n"


def test_library_returns_notes_never_prints(capsys):
    net = load_hf(example("deepseek-v3"), 1, 64)
    assert len(net.notes) == 1 and "num_nextn_predict_layers" in net.notes[0]
    assert capsys.readouterr() == ("", "")


BASES = {
    "qwen3": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
              "vocab_size": 100},
    "deepseek_v3": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                    "vocab_size": 100, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                    "v_head_dim": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "gpt_oss": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                "vocab_size": 100, "num_local_experts": 4, "num_experts_per_tok": 2},
    "mpt": {"d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 100, "attn_config": {"alibi": True}},
    "gemma3_text": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                    "vocab_size": 100},
}
BAD = [
    ("deepseek_v3", {"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer, got 0"),
    ("deepseek_v3", {"n_group": 3}, r"n_group must be a positive integer dividing n_routed_experts \(8\), got 3"),
    ("deepseek_v3", {"n_group": 2, "topk_group": 3}, r"topk_group must be a positive integer at most n_group \(2\), got 3"),
    ("deepseek_v3", {"first_k_dense_replace": 9}, "first_k_dense_replace must be an integer from 0"),
    ("deepseek_v3", {"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) is more than the 8 experts"),
    ("deepseek_v3", {"num_nextn_predict_layers": -1}, "num_nextn_predict_layers must be a non-negative integer"),
    ("gpt_oss", {"layer_types": ["sliding_attention"]}, "layer_types must be a list of 2 entries"),
    ("gpt_oss", {"sliding_window": 0}, "sliding_window must be a positive integer, got 0"),
    ("mpt", {"attn_config": {"alibi": False}}, "attn_config.alibi must be true"),
    ("mpt", {"expansion_ratio": "4"}, 'expansion_ratio must be a positive number, got \'4\''),
    ("mpt", {"n_heads": 5}, r"n_heads must be a positive integer dividing d_model \(64\), got 5"),
    ("gemma3_text", {"final_logit_softcapping": -1}, "final_logit_softcapping must be a positive number or null"),
    ("qwen3", {"attention_bias": "yes"}, 'attention_bias must be true or false, got "yes"'),
]
MISSING = [("deepseek_v3", "kv_lora_rank"), ("deepseek_v3", "v_head_dim"), ("deepseek_v3", "n_routed_experts"),
           ("gpt_oss", "num_local_experts"), ("mpt", "d_model"), ("mpt", "n_layers"), ("qwen3", "hidden_size")]


@pytest.mark.parametrize("model_type,change,message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_a_bad_field_is_one_line(model_type, change, message):
    data = dict(BASES[model_type], model_type=model_type, **change)
    with pytest.raises(ValueError, match=message) as info:
        read_decoder_config(data, 16, "x.json")
    assert str(info.value).startswith("hf config x.json: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("model_type,key", MISSING)
def test_a_missing_field_is_named(model_type, key):
    data = {k: v for k, v in dict(BASES[model_type], model_type=model_type).items() if k != key}
    with pytest.raises(ValueError, match=f"^hf config x.json: {key} is missing$"):
        read_decoder_config(data, 16, "x.json")


@pytest.mark.parametrize("model_type", list(BASES))
def test_small_configs_build(model_type):
    cfg = read_decoder_config(dict(BASES[model_type], model_type=model_type), 16, "x.json")[0]
    assert distinct_parameter_count(decoder(cfg, 2)) == parameter_count(cfg)


# ---------------------------------------------------------------------------------------
# Any other model type: through transformers and the torch: importer

OLMO2 = {"model_type": "olmo2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256}


def test_other_model_type_through_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "olmo.json"
    path.write_text(json.dumps(OLMO2))
    net = load_hf(str(path), 2, 32)
    assert net.name == "hf:olmo" and net.batch == 2
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model("olmo2", **{k: v for k, v in OLMO2.items() if k != "model_type"}))
    from pase.costing.training import parameter_elements_unique

    assert parameter_elements_unique(net) == sum(p.numel() for p in model.parameters())


def test_other_model_type_without_torch_is_one_line(tmp_path, monkeypatch):
    import pase.sources.torch.hf as via_torch
    from pase.sources.torch.errors import TorchNotInstalledError

    def missing():
        raise TorchNotInstalledError()

    monkeypatch.setattr(via_torch, "_import_torch", missing)
    path = tmp_path / "olmo.json"
    path.write_text(json.dumps(OLMO2))
    status, out, err = run("-g", f"hf:{path}", "-p", "2")
    assert status != 0 and err.count("\n") == 1
    assert "model_type 'olmo2' is built by transformers" in err and "pip install '.[hf]'" in err


def test_other_model_type_transformers_does_not_know(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"model_type": "no_such_model", "hidden_size": 8}))
    status, out, err = run("-g", f"hf:{path}", "-p", "2")
    assert status != 0 and err.count("\n") == 1 and "transformers cannot build model_type 'no_such_model'" in err


@pytest.mark.parametrize("model_type,key", [("gpt_oss", "num_hidden_layers"), ("deepseek_v3", "num_hidden_layers"),
                                            ("mpt", "n_layers")])
def test_a_huge_layer_count_is_refused_before_reading_per_block_fields(model_type, key):
    # Found by benchmarks/fuzz_inputs.py: 2^63 blocks hung building the per-block window list.
    data = dict(BASES[model_type], model_type=model_type, **{key: 2 ** 63})
    with pytest.raises(ValueError, match=f"^hf config x.json: {key} must be at most 1024"):
        read_decoder_config(data, 16, "x.json")


@pytest.mark.parametrize("model_type", ["gpt_oss", "deepseek_v3", "mpt", "gemma3_text"])
def test_graph_file_round_trips_windows_sinks_and_latent_attention(model_type):
    from pase.sources.graph_json import dumps, network_from_json

    data = dict(BASES[model_type], model_type=model_type)
    if model_type in ("gpt_oss", "gemma3_text"):
        data["sliding_window"] = 4  # a band at 16 tokens
    net = decoder(read_decoder_config(data, 16, "x.json")[0], 2)
    back = network_from_json(json.loads(dumps(net)))
    assert [(l.op, l.domain, l.args) for l in back.layers] == [(l.op, l.domain, l.args) for l in net.layers]
    machine = Machine()
    G1, G2 = net.graph(4, machine), back.graph(4, machine)
    for v in G1.nodes:
        assert np.array_equal(G1.nodes[v]["cost"], G2.nodes[v]["cost"])
    for u, v, m in G1.edges(data="cost"):
        assert np.array_equal(m, G2.edges[u, v]["cost"])


def test_training_plans_a_windowed_moe_with_sinks():
    status, out, err = run("-g", "gpt-oss-120b", "-m", "256", "-b", "8", "-p", "8", "--machine", "h100-sxm",
                           "--training", "--recipe", "dp=8,ep=8", "--memory", "1000")
    assert status == 0, err
    assert "parameters: 116,829,156,672" in out


#: A small DeepSeek-V2 (no query compression, two shared experts, one dense block).
DEEPSEEK_V2 = {"model_type": "deepseek_v2", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
               "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": None,
               "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
               "n_routed_experts": 16, "n_shared_experts": 2, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
               "first_k_dense_replace": 1, "moe_layer_freq": 1, "vocab_size": 1000, "max_position_embeddings": 512}


def test_deepseek_v2_reads_as_v3():
    cfg = read_decoder_config(DEEPSEEK_V2, 64, "ds2.json")[0]
    assert cfg.mla.q_rank == 0 and cfg.moe.shared_width == 128 and cfg.moe.dense == (0,)
    # By hand: embedding and head 2 x 1000 x 256 = 512,000; final norm 256; per block MLA 256 x 8 x 48
    # (q) + 256 x 80 + 64 + 64 x 8 x 64 + 8 x 32 x 256 = 98,304 + 20,480 + 64 + 32,768 + 65,536 = 217,152 and
    # norms 512; block 1 dense 3 x 256 x 512 = 393,216; blocks 2-4 router 4,096 + experts 16 x 3 x 256 x
    # 64 = 786,432 + shared 3 x 256 x 128 = 98,304: 888,832. 512,256 + 4 x 217,664 + 393,216 + 3 x
    # 888,832 = 4,442,624 (transformers 5.24 on the meta device: the same).
    assert parameter_count(cfg) == 4_442_624
    assert distinct_parameter_count(decoder(cfg, 1)) == 4_442_624
