"""The GPT graphs of ``docs/graphs.md`` and their memory (``docs/memory.md``).

Structure, names and parameter counts are checked against the spec's table and vertex
list, written out again here; the data-parallel memory of gpt3-6.7b is checked against a
figure derived by hand from the shapes.
"""

import math

import pytest

import graphs
from graphs.gpt import GPT_CONFIGS
from graphs.gpt import parameter_count as gpt_closed_form
from pase.planning.baselines import data_parallel
from pase.search.capped import CAPPED, UNCONSTRAINED
from pase.planning.planner import plan
from pase.costing.memory import MemoryModel, parameter_count

# The spec's table: layers L, width e, heads h, key width k, feed-forward f, sequence s, vocabulary V.
SPEC = {
    "gpt2-small": (12, 768, 12, 64, 3072, 1024, 50304),
    "gpt2-medium": (24, 1024, 16, 64, 4096, 1024, 50304),
    "gpt2-large": (36, 1280, 20, 64, 5120, 1024, 50304),
    "gpt2-xl": (48, 1600, 25, 64, 6400, 1024, 50304),
    "gpt3-2.7b": (32, 2560, 32, 80, 10240, 2048, 50304),
    "gpt3-6.7b": (32, 4096, 32, 128, 16384, 2048, 50304),
    "gpt3-13b": (40, 5120, 40, 128, 20480, 2048, 50304),
    "gpt3-175b": (96, 12288, 96, 128, 49152, 2048, 50304),
}

# One block, in the spec's vertex order: (op, Einsum equation or None).
BLOCK = [
    ("Norm", None),
    ("Einsum", "ble,shek->sbhlk"),
    ("Unstack", None),
    ("Einsum", "bhlk,bhmk->bhlm"),
    ("Softmax", None),
    ("Einsum", "bhlm,bhmk->bhlk"),
    ("Einsum", "bhlk,hek->ble"),
    ("Elementwise", None),
    ("Norm", None),
    ("Einsum", "ble,ef->blf"),
    ("Einsum", "blf,fe->ble"),
    ("Elementwise", None),
]


def closed_form(name):
    """``2 V e + L (12 e^2 + 4 e) + 2 e``: token embedding and output weight (V e each);
    per block Wqkv 3 h e k = 3 e^2, Wo e^2, W1 and W2 4 e^2 each, two norms 2 e each;
    the final norm 2 e."""
    L, e, h, k, f, s, V = SPEC[name]
    return 2 * V * e + L * (12 * e * e + 4 * e) + 2 * e


def test_the_registry_has_exactly_the_spec_models():
    assert set(GPT_CONFIGS) == set(SPEC)
    for name in SPEC:
        assert name in graphs.GRAPHS


@pytest.mark.parametrize("name", list(SPEC))
def test_config_matches_the_spec_table(name):
    L, e, h, k, f, s, V = SPEC[name]
    cfg = GPT_CONFIGS[name]
    assert (cfg.layers, cfg.width, cfg.heads, cfg.key, cfg.hidden, cfg.sequence, cfg.vocab) == (L, e, h, k, f, s, V)
    assert h * k == e  # what makes Wqkv 3 e^2 and Wo e^2 in the closed form


@pytest.mark.parametrize("name", list(SPEC))
def test_graph_structure_and_names(name):
    L, e, h, k, f, s, V = SPEC[name]
    b = 2
    net = graphs.build(name, batch=b)
    assert len(net) == 12 * L + 5
    assert len(set(net.names)) == len(net.names)

    expected = [("Embedding", None), ("Elementwise", None)] + BLOCK * L
    expected += [("Norm", None), ("Einsum", "ble,ev->blv"), ("SoftmaxCrossEntropy", None)]
    got = [(layer.op, getattr(layer, "equation", None) if layer.op == "Einsum" else None) for layer in net.layers]
    assert got == expected

    for i in range(1, L + 1):
        start = 2 + 12 * (i - 1)
        assert all(n.startswith(f"block{i}.") for n in net.names[start:start + 12])
        assert net.names[start + 1] == f"block{i}.attn.qkv"
        assert net.names[start + 9] == f"block{i}.ff.up"
    assert "block7.attn.qkv" in net.names and "block7.ff.up" in net.names

    # Shapes the spec implies.
    at = net.names.index
    assert net.layers[at("block1.attn.qkv")].output_shapes == ((3, b, h, s, k),)
    assert net.layers[at("block1.attn.split")].output_shapes == ((b, h, s, k),) * 3
    assert net.layers[at("block1.attn.scores")].output_shapes == ((b, h, s, s),)
    assert net.layers[at("block1.ff.up")].output_shapes == ((b, s, f),)
    assert net.layers[at("block1.ff.up")].pw == 1
    assert net.layers[-2].output_shapes == ((b, s, V),)
    for layer in net.layers:
        if layer.op == "Norm":
            assert layer.axis == len(layer.domain) - 1
        if layer.op == "Softmax":
            assert layer.axis == 3

    # Residuals: block i's first Elementwise reads the block input (the previous block's
    # last vertex, or the position Elementwise), its second reads the first.
    for i in range(1, L + 1):
        start = 2 + 12 * (i - 1)
        block_input = start - 1
        assert (block_input, start + 7) in net.edges
        assert (start + 7, start + 11) in net.edges


@pytest.mark.parametrize("name", list(SPEC))
def test_parameters(name):
    L, e, h, k, f, s, V = SPEC[name]
    net = graphs.build(name, batch=1)
    shapes = [[shape for shape, _ in layer.parameters()] for layer in net.layers]
    block = [[(e,), (e,)], [(3, h, e, k)], [], [], [], [], [(h, e, k)], [], [(e,), (e,)], [(e, f)], [(f, e)], []]
    assert shapes == [[(V, e)], []] + block * L + [[(e,), (e,)], [(e, V)], []]
    assert parameter_count(net) == closed_form(name)
    assert gpt_closed_form(GPT_CONFIGS[name]) == closed_form(name)


def test_position_embedding_and_ids_are_not_parameters():
    net = graphs.build("gpt2-small", batch=2)
    position = net.layers[net.names.index("position")]
    assert position.op == "Elementwise" and position.parameters() == []
    assert [t.is_param for t in position.inputs] == [False, False]
    embedding = net.layers[0]
    one_hot, weight = embedding.inputs
    assert not one_hot.is_param and weight.is_param
    # A (b, s, e) position embedding counted as a parameter would grow with the batch.
    assert parameter_count(net) == parameter_count(graphs.build("gpt2-small", batch=1))


def test_gpt3_6_7b_has_about_6_85e9_parameters():
    # 2 * 50304 * 4096 = 412,090,368; 32 * (12 * 4096^2 + 4 * 4096) = 32 * 201,342,976
    # = 6,442,975,232; 2 * 4096 = 8192. Sum 6,855,073,792.
    assert closed_form("gpt3-6.7b") == 6_855_073_792
    assert math.isclose(closed_form("gpt3-6.7b"), 6.85e9, rel_tol=0.01)
    # gpt2-small: 77,266,944 + 12 * 7,080,960 + 1536 = 162,240,000 (untied output weight).
    assert closed_form("gpt2-small") == 162_240_000


def test_unknown_model_is_rejected():
    with pytest.raises(ValueError):
        graphs.gpt("gpt4", 1)
    with pytest.raises(ValueError):
        graphs.build("gpt2-small", batch=1, model=0)  # -m is a sequence length (issue 35): positive


# ---------------------------------------------------------------------------------------
# Memory of gpt3-6.7b on 32 devices, mini-batch 16


def activations_per_sample(name):
    """Activation elements of one sample, from the spec's vertex list.

    embedding, position: 2 s e. Per block: attn.norm s e, qkv 3 s e, Unstack 3 outputs of
    h s k = s e, scores and softmax h s^2 each, context s e, out s e, residual s e,
    ff.norm s e, ff.up s f = 4 s e, ff.down s e, residual s e: 17 s e + 2 h s^2.
    Head: final norm s e, logits and loss s V each.
    """
    L, e, h, k, f, s, V = SPEC[name]
    return 2 * s * e + L * (17 * s * e + 2 * h * s * s) + s * e + 2 * s * V


# gpt3-6.7b: s e = 8,388,608; h s^2 = 134,217,728; s V = 103,022,592.
# Per block 17 * 8,388,608 + 2 * 134,217,728 = 411,041,792; 32 blocks 13,153,337,344;
# plus 3 s e = 25,165,824 and 2 s V = 206,045,184: 13,384,548,352 elements per sample,
# 26,769,096,704 bytes at 2 bytes each. Parameters 6,855,073,792 * 16 = 109,681,180,672 bytes.
PARAM_BYTES_6_7B = 109_681_180_672
ACT_BYTES_PER_SAMPLE_6_7B = 26_769_096_704
# Data parallelism, batch 16 on 32 devices: 16 devices each hold one sample and a full
# replica of the parameters: 109.68 GB + 26.77 GB = 136.45 GB.
DATA_PARALLEL_16 = PARAM_BYTES_6_7B + ACT_BYTES_PER_SAMPLE_6_7B


def test_hand_figures_agree_with_the_formulas():
    assert activations_per_sample("gpt3-6.7b") == 13_384_548_352
    assert 2 * activations_per_sample("gpt3-6.7b") == ACT_BYTES_PER_SAMPLE_6_7B
    assert 16 * closed_form("gpt3-6.7b") == PARAM_BYTES_6_7B
    assert math.isclose(DATA_PARALLEL_16, 137e9, rel_tol=0.01)


@pytest.fixture(scope="module")
def gpt3_b16():
    return graphs.build("gpt3-6.7b", batch=16)


def test_data_parallelism_needs_about_137_gb(gpt3_b16):
    dp = data_parallel(gpt3_b16, 32)
    assert all(c[layer.batch_dim] == 16 for c, layer in zip(dp, gpt3_b16.layers))
    figure = MemoryModel().per_device(gpt3_b16, dp, 32)
    assert math.isclose(figure, DATA_PARALLEL_16, rel_tol=0.02)
    assert figure > 80e9


def test_the_best_strategy_fits_80_gb(gpt3_b16):
    cap = 80e9
    result = plan(gpt3_b16, 32, memory_cap=cap)
    assert result.memory.status in (UNCONSTRAINED, CAPPED)
    configs = result.configs
    memory = MemoryModel().per_device(gpt3_b16, configs, 32)
    assert memory <= cap
    assert math.isclose(memory, result.memory.per_device_bytes, rel_tol=1e-9)
    # No strategy on 32 devices can divide any tensor more than 32 ways, so the memory is
    # at least (parameters + all 16 samples' activations) / 32 = (109.68 + 428.31) / 32 GB.
    floor = (PARAM_BYTES_6_7B + 16 * ACT_BYTES_PER_SAMPLE_6_7B) / 32
    assert memory >= floor * (1 - 1e-9)
    # Its cost, re-costed from the layer and edge formulas, is the reported one and no
    # less than the lower bound.
    assert math.isclose(result.evaluation.total, result.total_cost, rel_tol=1e-9)
    assert result.total_cost >= result.memory.lower_bound * (1 - 1e-9)
