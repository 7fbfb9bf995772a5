"""The Llama 3 graphs (``graphs/llama.py``): structure, shapes and parameter counts.

Parameter counts are checked against Meta's published totals (8.03e9, 70.6e9, 405.8e9) and
against the closed form worked out below from the model cards' shapes.
"""

import math

import pytest

import graphs
from graphs.llama import LLAMA_CONFIGS, parameter_count as closed_form
from pase.costing.memory import parameter_count

# Meta's params.json: layers, width, heads, key/value heads, MLP width; vocabulary 128256.
SPEC = {
    "llama3-8b": (32, 4096, 32, 8, 14336),
    "llama3-70b": (80, 8192, 64, 8, 28672),
    "llama3-405b": (126, 16384, 128, 8, 53248),  # Llama 3.1 405B
}

BLOCK = [
    ("RMSNorm", None), ("Einsum", "ble,grek->bgrlk"), ("Einsum", "ble,gek->bglk"), ("Einsum", "ble,gek->bglk"),
    ("Elementwise", None), ("Elementwise", None), ("Einsum", "bgrlk,bgmk->bgrlm"), ("Softmax", None),
    ("Einsum", "bgrlm,bgmk->bgrlk"), ("Einsum", "bgrlk,grek->ble"), ("Elementwise", None),
    ("RMSNorm", None), ("Einsum", "ble,ef->blf"), ("Einsum", "ble,ef->blf"), ("Elementwise", None),
    ("Einsum", "blf,fe->ble"), ("Elementwise", None),
]


def test_registry_and_configs():
    assert set(LLAMA_CONFIGS) == set(SPEC)
    for name, (L, e, h, g, f) in SPEC.items():
        cfg = LLAMA_CONFIGS[name]
        assert (cfg.layers, cfg.width, cfg.heads, cfg.kv_heads, cfg.hidden, cfg.vocab) == (L, e, h, g, f, 128256)
        assert cfg.key * cfg.heads == e and cfg.key == 128
        entry = graphs.GRAPHS[name]
        assert entry.model_help == "sequence length" and entry.default_model == 2048


@pytest.mark.parametrize("name", list(SPEC))
def test_structure(name):
    L, e, h, g, f = SPEC[name]
    b, s, r = 2, 2048, h // g
    net = graphs.build(name, b)
    assert len(net) == 17 * L + 4
    got = [(layer.op, getattr(layer, "equation", None) if layer.op == "Einsum" else None) for layer in net.layers]
    assert got == [("Embedding", None)] + BLOCK * L + [("RMSNorm", None), ("Einsum", "ble,ev->blv"),
                                                       ("SoftmaxCrossEntropy", None)]
    at = net.names.index
    assert net.names[1:4] == ("block1.attn.norm", "block1.attn.q", "block1.attn.k")
    assert net.layers[at("block2.attn.q")].output_shapes == ((b, g, r, s, 128),)
    assert net.layers[at("block2.attn.k_rotary")].output_shapes == ((b, g, s, 128),)
    assert net.layers[at("block2.attn.scores")].output_shapes == ((b, g, r, s, s),)
    assert net.layers[at("block2.ff.gate")].pw == 1 and net.layers[at("block2.ff.up")].pw == 0
    assert net.layers[at("block2.ff.multiply")].output_shapes == ((b, s, f),)
    # The rotary tables are graph inputs: no edge into the rotary Elementwise but its q / k.
    q_rot = at("block2.attn.q_rotary")
    assert [u for (u, v) in net.edges if v == q_rot] == [at("block2.attn.q")]
    assert not any(t.is_param for t in net.layers[q_rot].inputs)
    # Residuals: the block input (previous block's last vertex) and the attention residual.
    start = at("block2.attn.norm")
    assert (start - 1, at("block2.attn.residual")) in net.edges
    assert (at("block2.attn.residual"), at("block2.ff.residual")) in net.edges


@pytest.mark.parametrize("name,published", [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.8e9)])
def test_parameter_count(name, published):
    # 8B: 2 * 128256 * 4096 = 1,050,673,152 (embedding and untied output weight);
    # per layer 2 * 4096^2 (Wq, Wo) + 2 * 4096 * 8 * 128 (Wk, Wv) + 3 * 4096 * 14336 (gate,
    # up, down) = 33,554,432 + 8,388,608 + 176,160,768 = 218,103,808; times 32 =
    # 6,979,321,856; 65 RMSNorms of 4096 = 266,240. Total 8,030,261,248.
    assert closed_form(LLAMA_CONFIGS["llama3-8b"]) == 8_030_261_248
    net = graphs.build(name, 1)
    L = LLAMA_CONFIGS[name].layers
    assert parameter_count(net) == closed_form(LLAMA_CONFIGS[name])
    assert math.isclose(parameter_count(net), published, rel_tol=1e-3)
    assert (2 * L + 1) == sum(layer.op == "RMSNorm" for layer in net.layers)


def test_sequence_length_is_the_model_option():
    net = graphs.build("llama3-8b", 2, 512)
    assert net.layers[net.names.index("block1.attn.scores")].output_shapes == ((2, 8, 4, 512, 512),)
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError, match="sequence length"):
            graphs.build("llama3-8b", 2, bad)
    with pytest.raises(ValueError, match="unknown Llama model"):
        from graphs.llama import llama

        llama("llama3-1t", 2)
