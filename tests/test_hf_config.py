"""Hugging Face configs (``-g hf:FILE.json``, ``pase/hf_config.py``) and the generic decoder
(``graphs/decoder.py``): parameter counts, the Llama graph exactly, tied weights, errors.

Published and hand-worked totals:

- Llama 3.1 8B: ``2 V e + L (2 e^2 + 2 e g k + 3 e f) + (2 L + 1) e`` = 8,030,261,248
  (``tests/test_llama.py`` works it out); 70B 70,553,706,496; 405B 405,853,388,800 (Meta: 405.8e9).
- Mistral-7B-v0.1 (V 32000, e 4096, 32 layers, g 8, f 14336): 2 x 32000 x 4096 = 262,144,000;
  per layer 218,103,808 + 2 x 4096 (norms) = 218,112,000, x 32 = 6,979,584,000; + 4096 = 7,241,732,096.
- Qwen2-7B (V 152064, e 3584, 28 layers, 28 heads, g 4, f 18944, q/k/v biases): 2 x 152064 x
  3584 = 1,089,994,752; per layer 2 x 3584^2 + 2 x 3584 x 512 + 3 x 3584 x 18944 + (3584 +
  1024) biases + 7168 norms = 233,057,792, x 28 = 6,525,618,176; + 3584 = 7,615,616,512.
- GPT-2 small (tied, biases, learned positions): 50257 x 768 = 38,597,376 (wte) + 1024 x 768 =
  786,432 (wpe) + 12 x 7,087,872 (12 e^2 + 13 e: weights, biases, two layer norms) + 1536 (ln_f)
  = 124,439,808.
- The Megatron-Core GPT shapes (untied, V 131072, 4096 positions): ``2 V e + 4096 e + L (12 e^2
  + 13 e) + 2 e``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

import graphs
from pase.sources.registry import load as load_source
from cli_runner import run
from graphs.decoder import (BiasedEinsum, DecoderConfig, decoder, distinct_parameter_count, parameter_count,
                            shared_parameters)
from graphs.llama import LLAMA_CONFIGS, parameter_count as llama_closed_form
from pase.core.fileio import InputError
from pase.sources.graph_json import dumps, network_from_json
from pase.sources.hf import SUPPORTED, decoder_config_from_hf, load_hf, network_name, read_hf_config
from pase.machines.paper import Machine
from pase.costing.memory import parameter_count as summed_parameter_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "hf")


def example(name: str) -> str:
    return os.path.join(EXAMPLES, f"{name}.json")


def megatron(e: int, L: int) -> int:
    return 2 * 131072 * e + 4096 * e + L * (12 * e * e + 13 * e) + 2 * e


PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    # Mixtral-8x7B: 46.7B (Mistral AI's model card); by hand 2 x 32000 x 4096 + 4096 + 32 x (2 x 4096^2
    # + 2 x 4096 x 1024 + 4096 x 8 + 8 x 3 x 4096 x 14336 + 2 x 4096) = 46,702,792,704.
    "mixtral-8x7b": 46_702_792_704,
    "qwen2-7b": 7_615_616_512,
    "gpt2": 124_439_808,
    "megatron-gpt-1.7b": megatron(2048, 24),
    "megatron-gpt-16b": megatron(6144, 32),
    "megatron-gpt-70b": megatron(8192, 84),
    "megatron-gpt-177b": megatron(12288, 96),
}


def test_every_example_is_checked():
    from test_hf_models import REFERENCE  # today's models: tests/test_hf_models.py

    assert sorted(f[:-5] for f in os.listdir(EXAMPLES) if f.endswith(".json")) == sorted({**PUBLISHED, **REFERENCE})


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count(name):
    config = decoder_config_from_hf(read_hf_config(example(name)), 8, name)
    assert parameter_count(config) == PUBLISHED[name]
    # The graph carries every parameter: each tensor once (a tied table once).
    net = load_hf(example(name), 1, 8)
    assert distinct_parameter_count(net) == PUBLISHED[name]


def test_megatron_sizes_are_their_names():
    for name, size in (("1.7b", 1.7e9), ("16b", 16e9), ("70b", 70e9), ("177b", 177e9)):
        assert math.isclose(PUBLISHED[f"megatron-gpt-{name}"], size, rel_tol=0.05), name


def test_llama3_405b_built_in():
    cfg = LLAMA_CONFIGS["llama3-405b"]
    assert (cfg.layers, cfg.width, cfg.heads, cfg.kv_heads, cfg.hidden, cfg.vocab) == (126, 16384, 128, 8, 53248, 128256)
    # 2 x 128256 x 16384 = 4,202,692,608; per layer 2 x 16384^2 + 2 x 16384 x 1024 + 3 x 16384 x
    # 53248 = 3,187,671,040, x 126 = 401,646,551,040; 253 norms of 16384 = 4,145,152.
    assert llama_closed_form(cfg) == 405_853_388_800
    assert abs(llama_closed_form(cfg) / 405.8e9 - 1) < 0.005  # Meta: 405.8e9 (Llama 3.1 405B)
    entry = graphs.GRAPHS["llama3-405b"]
    assert "126 layers" in entry.description and "2146 vertices" in entry.description
    net = graphs.build("llama3-405b", 1, 16)
    assert len(net) == 17 * 126 + 4 and summed_parameter_count(net) == 405_853_388_800


def test_transformers_counts_agree():
    """``sum(p.numel())`` of the Hugging Face model built from the same config on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name in ("llama-3.1-8b", "mistral-7b", "qwen2-7b", "gpt2", "megatron-gpt-1.7b"):
        data = read_hf_config(example(name))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**data))
        assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name], name


def strip(tensors):
    return [dataclasses.replace(t, owner=0) for t in tensors]


@pytest.mark.parametrize("built_in,file", [("llama3-8b", "llama-3.1-8b"), ("llama3-405b", "llama-3.1-405b")])
def test_llama_config_gives_the_built_in_llama_exactly(built_in, file):
    ours, ref = load_hf(example(file), 2, 64), graphs.build(built_in, 2, 64)
    assert ours.name == f"hf:{file}" and ours.batch == ref.batch and ours.cutoff == ref.cutoff
    assert ours.names == ref.names and ours.edges == ref.edges
    for a, b in zip(ours.layers, ref.layers):
        assert type(a) is type(b)
        assert (a.domain, a.dims, a.args, a.unsplit, a.batch_dim) == (b.domain, b.dims, b.args, b.unsplit, b.batch_dim)
        assert a.output_shapes == b.output_shapes and a.output_letters == b.output_letters
        assert strip(a.inputs) == strip(b.inputs)  # same shapes, names, serial numbers, kinds
        assert a.parameters() == b.parameters()


def test_default_sequence():
    # min(max_position_embeddings, 2048); GPT-2: n_positions; 2048 without a maximum.
    assert decoder_config_from_hf(read_hf_config(example("llama-3.1-8b"))).sequence == 2048
    assert decoder_config_from_hf(read_hf_config(example("gpt2"))).sequence == 1024
    assert decoder_config_from_hf(read_hf_config(example("megatron-gpt-70b"))).sequence == 2048
    data = read_hf_config(example("mistral-7b"))
    del data["max_position_embeddings"]
    assert decoder_config_from_hf(data).sequence == 2048
    assert decoder_config_from_hf(data, 100).sequence == 100
    # Rotary models take any -m; a learned table caps it.
    assert decoder_config_from_hf(read_hf_config(example("llama-3.1-8b")), 200_000).sequence == 200_000


def test_tied_head_reads_the_embedding_table_itself():
    net = load_hf(example("gpt2"), 2, 16)
    at = net.names.index
    embedding, head = net.layers[at("embedding")], net.layers[at("head.logits")]
    assert head.equation == "ble,ve->blv" and head.inputs[1] is embedding.inputs[1]
    assert head.domain == (2, 16, 50257, 768)
    (table, readers), = shared_parameters(net)
    assert table is embedding.inputs[1] and readers == [(at("embedding"), 1), (at("head.logits"), 1)]
    # pase.memory.parameter_count sums every layer's parameters(): the table twice there.
    assert summed_parameter_count(net) == PUBLISHED["gpt2"] + 50257 * 768
    # The training model counts a tensor several layers read once, by identity.
    training = pytest.importorskip("pase.costing.training")
    assert training.parameter_elements_unique(net) == PUBLISHED["gpt2"]
    # Untied: a weight of its own (e, V), no sharing.
    net = load_hf(example("megatron-gpt-1.7b"), 1, 16)
    assert net.layers[net.names.index("head.logits")].equation == "ble,ev->blv" and shared_parameters(net) == []
    assert summed_parameter_count(net) == distinct_parameter_count(net)


def test_gpt2_structure():
    net = load_hf(example("gpt2"), 2, 16)
    L = 12
    assert len(net) == 13 * L + 6
    assert net.names[:4] == ("embedding", "position.embedding", "position", "block1.attn.norm")
    at = net.names.index
    # Learned positions: an Embedding of the position ids, its table a parameter, added like gpt.py.
    pos = net.layers[at("position.embedding")]
    assert pos.op == "Embedding" and pos.parameters() == [((1024, 768), (3, 2))]
    assert net.layers[at("position")].op == "Elementwise"
    assert {(at("embedding"), at("position")), (at("position.embedding"), at("position"))} <= set(net.edges)
    # Plain MLP: up (GELU as one point-wise op), down; layer norms with scale and bias.
    assert net.layers[at("block1.ff.up")].pw == 1 and "block1.ff.gate" not in net.names
    assert net.layers[at("block1.ff.norm")].op == "Norm"
    # Biases: priced as the Einsum, counted as parameters over the output dimensions.
    q = net.layers[at("block1.attn.q")]
    assert isinstance(q, BiasedEinsum) and q.op == "Einsum" and q.args == {"equation": "ble,grek->bgrlk", "pw": 0,
                                                                            "batch": "b"}
    assert q.parameters()[-1] == ((12, 1, 64), (1, 2, 4))
    assert net.layers[at("block1.ff.down")].parameters()[-1] == ((768,), (2,))
    assert not isinstance(net.layers[at("block1.attn.scores")], BiasedEinsum)


def test_qwen2_has_qkv_biases_only():
    net = load_hf(example("qwen2-7b"), 1, 8)
    at = net.names.index
    assert all(isinstance(net.layers[at(f"block1.attn.{x}")], BiasedEinsum) for x in "qkv")
    assert not isinstance(net.layers[at("block1.attn.out")], BiasedEinsum)
    assert not isinstance(net.layers[at("block1.ff.up")], BiasedEinsum)
    assert net.layers[at("block1.attn.k")].parameters()[-1] == ((4, 128), (1, 3))


def test_llama_attention_and_mlp_bias_flags():
    data = read_hf_config(example("llama-3.1-8b"))
    data.update(attention_bias=True, mlp_bias=True)
    cfg = decoder_config_from_hf(data, 8)
    e, f, g, k = 4096, 14336, 8, 128
    assert parameter_count(cfg) == PUBLISHED["llama-3.1-8b"] + 32 * (e + 2 * g * k + e + 2 * f + e)


def test_head_dim_may_differ_from_width_over_heads():
    data = read_hf_config(example("mistral-7b"))
    data.update(head_dim=64, hidden_size=4000)  # 32 heads of 64 on a width of 4000
    cfg = decoder_config_from_hf(data, 8)
    assert (cfg.head_dim, cfg.width) == (64, 4000)
    net = decoder(cfg, 1)
    assert net.layers[net.names.index("block1.attn.q")].domain == (1, 8, 4, 8, 64, 4000)
    assert distinct_parameter_count(net) == parameter_count(cfg)


def test_network_name():
    assert network_name("examples/hf/llama-3.1-8b.json") == "hf:llama-3.1-8b"
    assert network_name("/models/Qwen2-7B/config.json") == "hf:Qwen2-7B"


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 100}

BAD = [
    (LLAMA, {"num_attention_heads": 0}, "num_attention_heads must be a positive integer dividing hidden_size, got 0"),
    (LLAMA, {"num_attention_heads": 3}, r"num_attention_heads must be a positive integer dividing hidden_size \(64\), got 3"),
    (LLAMA, {"num_key_value_heads": 3}, r"num_key_value_heads must be a positive integer dividing num_attention_heads \(4\), got 3"),
    (LLAMA, {"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer dividing num_attention_heads, got 0"),
    (LLAMA, {"hidden_size": None}, "hidden_size must be a positive integer, got null"),
    (LLAMA, {"hidden_size": "4096"}, 'hidden_size must be a positive integer, got "4096"'),
    (LLAMA, {"num_hidden_layers": 2.0}, "num_hidden_layers must be a positive integer, got 2.0"),
    (LLAMA, {"intermediate_size": True}, "intermediate_size must be a positive integer, got true"),
    (LLAMA, {"vocab_size": -1}, "vocab_size must be a positive integer, got -1"),
    (LLAMA, {"head_dim": 0}, "head_dim must be a positive integer, got 0"),
    (LLAMA, {"tie_word_embeddings": "no"}, 'tie_word_embeddings must be true or false, got "no"'),
    (LLAMA, {"attention_bias": 1}, "attention_bias must be true or false, got 1"),
    (LLAMA, {"hidden_act": "swiglu_x"}, 'hidden_act "swiglu_x" is not supported; supported: silu, '),
    (LLAMA, {"rms_norm_eps": -1}, "rms_norm_eps must be a positive number, got -1"),
    (LLAMA, {"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer, got 0"),
    (LLAMA, {"model_type": "bert"}, "model_type \"bert\" is not supported; supported: gpt2, llama, mistral, qwen2"),
    (LLAMA, {"model_type": None}, "model_type null is not supported; supported: gpt2, llama, mistral, qwen2"),
    (GPT2, {"n_head": 5}, r"n_head must be a positive integer dividing n_embd \(64\), got 5"),
    (GPT2, {"n_positions": None}, "n_positions must be a positive integer, got null"),
    (GPT2, {"n_inner": 0}, "n_inner must be a positive integer, got 0"),
    (GPT2, {"activation_function": "gelu_x"}, 'activation_function "gelu_x" is not supported'),
    (GPT2, {"add_cross_attention": True}, "add_cross_attention is not supported"),
    (GPT2, {"layer_norm_epsilon": "1e-5"}, 'layer_norm_epsilon must be a positive number, got "1e-5"'),
]
MISSING = [(LLAMA, key) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                    "vocab_size")] + [(GPT2, key) for key in ("n_embd", "n_layer", "n_head", "n_positions",
                                                                              "vocab_size")]


@pytest.mark.parametrize("base,change,message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_a_bad_field_is_one_line_naming_file_and_field(base, change, message):
    data = dict(base, **change)
    with pytest.raises(ValueError, match=message) as info:
        decoder_config_from_hf(data, 16, "x.json")
    text = str(info.value)
    assert text.startswith("hf config x.json: ") and "\n" not in text


@pytest.mark.parametrize("base,key", MISSING)
def test_a_missing_field_is_named(base, key):
    data = {k: v for k, v in base.items() if k != key}
    with pytest.raises(ValueError, match=f"^hf config x.json: {key} is missing$"):
        decoder_config_from_hf(data, 16, "x.json")


def test_model_type_missing_and_not_an_object():
    with pytest.raises(ValueError, match="^hf config x.json: model_type is missing; supported: gpt2, llama"):
        decoder_config_from_hf({"hidden_size": 8}, 16, "x.json")
    with pytest.raises(ValueError, match="^hf config x.json: expected a JSON object, got list$"):
        decoder_config_from_hf([], 16, "x.json")
    assert SUPPORTED == ("gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "qwen3", "phi3",
                         "nemotron", "gemma2", "gemma3_text", "gpt_oss", "deepseek_v3", "deepseek_v2", "mpt", "kimi_k2")


def test_sequence_limits():
    with pytest.raises(ValueError, match=r"^hf config x.json: -m 64 is longer than its 32 learned positions \(n_positions\)$"):
        decoder_config_from_hf(GPT2, 64, "x.json")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="sequence length"):
            decoder_config_from_hf(LLAMA, bad, "x.json")


def test_defaults_per_model_type():
    # kv heads default to the heads; gpt2 ties by default, the llama family does not.
    cfg = decoder_config_from_hf({k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}, 8)
    assert cfg.kv_heads == 4 and not cfg.tied
    assert decoder_config_from_hf(GPT2, 8).tied and decoder_config_from_hf(GPT2, 8).mlp_width == 256
    assert not decoder_config_from_hf(dict(GPT2, tie_word_embeddings=False), 8).tied
    for model_type in ("mistral", "qwen2"):
        assert not decoder_config_from_hf(dict(LLAMA, model_type=model_type), 8).tied


def write(tmp_path, text, name="m.json"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="key 'hidden_size' appears more than once"):
        read_hf_config(write(tmp_path, '{"model_type": "llama", "hidden_size": 64, "hidden_size": 128}'))
    with pytest.raises(InputError, match="is not valid JSON"):
        read_hf_config(write(tmp_path, "{"))
    with pytest.raises(InputError, match="not a number JSON allows"):
        read_hf_config(write(tmp_path, '{"rms_norm_eps": NaN}'))
    with pytest.raises(InputError, match="cannot read hf config"):
        read_hf_config(str(tmp_path / "nothing.json"))


def test_cli_plans_an_hf_config():
    status, out, err = run("-g", "hf:examples/hf/llama-3.1-8b.json", "-p", 8, "-b", 8, "-m", 512, cwd=ROOT)
    assert status == 0, err
    assert out.startswith("PaSE optimal parallelization strategy: hf:llama-3.1-8b (548 layers")
    assert " block1.attn.scores " in out and "8x8x4x512x512x128" in out


def test_cli_errors(tmp_path):
    bad = write(tmp_path, json.dumps(dict(LLAMA, num_attention_heads=0)))
    status, out, err = run("-g", f"hf:{bad}", "-p", 4)
    assert status == 1 and out == ""  # an invalid file, as for -g FILE.json
    assert err.strip().splitlines() == [
        f"pase: error: hf config {bad}: num_attention_heads must be a positive integer dividing hidden_size, got 0"]
    duplicate = write(tmp_path, '{"a": 1, "a": 2}', "d.json")
    status, _, err = run("-g", f"hf:{duplicate}", "-p", 4)
    assert status == 1 and "appears more than once" in err and len(err.strip().splitlines()) == 1
    status, _, err = run("-g", "hf:examples/hf/gpt2.json", "-p", 4, "-m", 2048, cwd=ROOT)
    assert status == 2 and "-m 2048 is longer than its 1024 learned positions (n_positions)" in err
    status, _, err = run("-g", "hf:examples/hf/gpt2.json", "-p", 4, "--loss", "none", cwd=ROOT)
    assert status == 2 and "--loss applies only to imported models" in err
    with pytest.raises(ValueError, match="apply only to imported models"):
        load_source(f"hf:{example('gpt2')}", 2, 8, loss=None)


def costs_equal(a, b, procs=8):
    machine = Machine(7.0, 24.0)
    G1, G2 = a.graph(procs, machine), b.graph(procs, machine)
    for v in G1.nodes:
        assert np.array_equal(G1.nodes[v]["cost"], G2.nodes[v]["cost"])
    for u, v, m in G1.edges(data="cost"):
        assert np.array_equal(m, G2.edges[u, v]["cost"])


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt2"])
def test_export_graph_round_trips(tmp_path, name):
    path = str(tmp_path / "g.json")
    status, _, err = run("-g", f"hf:examples/hf/{name}.json", "-p", 8, "-b", 4, "-m", 32, "--export-graph", path,
                         cwd=ROOT)
    assert status == 0, err
    net = load_hf(example(name), 4, 32)
    with open(path, encoding="utf-8") as f:
        back = network_from_json(json.load(f))
    assert (back.name, back.names, back.edges, back.batch) == (net.name, net.names, net.edges, net.batch)
    assert [(l.op, l.domain, l.args) for l in back.layers] == [(l.op, l.domain, l.args) for l in net.layers]
    assert dumps(back) == dumps(net)
    costs_equal(net, back)
    if name == "gpt2":
        # What a graph file cannot say: the biases (a plain Einsum there) and the tie (the
        # head reads a graph input named "embedding weight", a tensor of its own).
        biases = 12 * (2304 + 768 + 3072 + 768)
        assert summed_parameter_count(back) == summed_parameter_count(net) - biases
        assert shared_parameters(back) == []
    else:
        assert summed_parameter_count(back) == summed_parameter_count(net) == PUBLISHED[name]


def test_decoder_config_checks_itself():
    good = dict(layers=1, width=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=10, sequence=4)
    DecoderConfig(**good)
    for change, message in (({"kv_heads": 3}, "kv_heads"), ({"norm": "batch"}, "norm"), ({"positions": "sinusoid"}, "positions"),
                            ({"positions": "learned"}, "max_positions"), ({"tied": 1}, "tied"), ({"layers": 0}, "layers"),
                            ({"positions": "learned", "max_positions": 2}, "longer"), ({"window": -1}, "window"),
                            ({"softcap": float("inf")}, "softcap"), ({"window_blocks": [1]}, "window_blocks"),
                            ({"mla": 3}, "mla"), ({"mtp": True}, "mtp"), ({"sinks": 1}, "sinks")):
        with pytest.raises(ValueError, match=message):
            DecoderConfig(**dict(good, **change))
