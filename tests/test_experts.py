"""Expert strategies (paper Section IV): shapes, hand-worked configurations and costs, and
the exactness argument: no expert strategy within the search space beats the optimum."""

import math

import pytest

import graphs
from pase import GraphBuilder, Machine, data_parallel, evaluate, plan
from pase.planning.experts import (
    EXPERTS,
    PAPER_EXPERTS,
    best_mesh,
    expert_strategies,
    gnmt,
    mesh_tensorflow,
    mesh_tensorflow_meshes,
    owt,
)
from pase.model.layers import FC, Conv, Pooling, SoftmaxCrossEntropy

NAMES = ("alexnet", "resnet101", "inception3", "rnnlm", "transformer")


@pytest.fixture(scope="module")
def nets():
    return {name: graphs.build(name, 128) for name in NAMES}


def layer_config(net, configs, name):
    return configs[net.names.index(name)]


# ---------------------------------------------------------------------------------------
# Well-formed: right rank, every split divides its dimension, at most p devices


@pytest.mark.parametrize("procs", [2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("name", NAMES)
def test_expert_configurations_are_well_formed(nets, name, procs):
    net = nets[name]
    strategies = expert_strategies(net, procs)
    assert list(strategies) == list(PAPER_EXPERTS[name])
    for expert, configs in strategies.items():
        assert len(configs) == len(net.layers), expert
        for layer, config in zip(net.layers, configs):
            assert len(config) == len(layer.domain), (expert, layer)
            assert all(isinstance(c, int) and c >= 1 and d % c == 0 for c, d in zip(config, layer.domain)), (expert, layer, config)
            assert math.prod(config) <= procs, (expert, layer, config)


# ---------------------------------------------------------------------------------------
# OWT, hand-checked on AlexNet at p = 8


def test_owt_alexnet_p8_splits_batch_then_output_neurons(nets):
    net = nets["alexnet"]
    configs = owt(net, 8)
    # Convolutions, poolings and the reshape: batch 128 split 8 ways (data parallelism).
    for name in ("conv1", "conv2", "conv3", "conv4", "conv5"):
        assert layer_config(net, configs, name) == (8, 1, 1, 1, 1, 1, 1)  # (b, c, ho, wo, r, s, n)
    for name in ("pool1", "pool2", "pool5", "flatten.ravel"):
        assert layer_config(net, configs, name) == (8, 1, 1, 1)
    assert layer_config(net, configs, "flatten.unravel") == (8, 1)
    # FC space (b, n, k): output neurons 4096, 4096, 1024 all split 8 ways, batch unsplit.
    for name in ("fc6", "fc7", "fc8"):
        assert layer_config(net, configs, name) == (1, 8, 1)
    # The loss keeps the logits where fc8 computed them: class axis split 8 ways.
    assert layer_config(net, configs, "loss") == (1, 8)


def test_owt_alexnet_p8_costs_by_hand(nets):
    net = nets["alexnet"]
    ev = evaluate(net, owt(net, 8), Machine(), 8)
    rho = 5000.0  # 10 TFLOPS / (16 GB/s / 8 bytes)
    v = {name: net.names.index(name) for name in ("flatten.unravel", "fc6", "fc7", "fc8", "loss")}
    # Unravel -> fc6: (128, 9216) held as 8 batch blocks of 16 rows, needed whole:
    # every device lacks (128 - 16) * 9216 words, forward and backward.
    assert ev.edge_costs[(v["flatten.unravel"], v["fc6"])] == pytest.approx(rho * 2 * 112 * 9216, rel=1e-12)
    # fc6 -> fc7: (128, 4096) held as 8 column blocks of 512, needed whole (an all-gather).
    assert ev.edge_costs[(v["fc6"], v["fc7"])] == pytest.approx(rho * 2 * 128 * (4096 - 512), rel=1e-12)
    # fc8 -> loss: same (1, 8) split on both sides, nothing moves.
    assert ev.edge_costs[(v["fc8"], v["loss"])] == 0.0
    # fc7: GEMM M = 128, N = 4096 / 8 = 512, K = 4096, one point-wise op; the input
    # gradient is all-reduced over the 8 n-splits: AR(128 * 4096, 8) = rho * 65536 * 14.
    compute = 3 * 128 * 512 * 4096 + 3 * 1 * 128 * 512
    assert ev.layer_costs[v["fc7"]] == pytest.approx(compute + rho * 65536 * 14, rel=1e-12)
    # Loss (128, 1024) split (1, 8): 4E + 2 bpp + comm(2 bpp), E = 128 * 128, bpp = 128.
    assert ev.layer_costs[v["loss"]] == pytest.approx(4 * 16384 + 2 * 128 + rho * 2 * 128, rel=1e-12)


def test_owt_resnet_leaves_devices_idle_on_1000_classes(nets):
    net = nets["resnet101"]
    configs = owt(net, 64)
    # 1000 = 2^3 5^3: its largest divisor <= 64 is 50.
    assert layer_config(net, configs, "head.fc") == (1, 50, 1)
    assert layer_config(net, configs, "loss") == (1, 50)
    # Data parallelism elsewhere, 64 ways although the cut-off would stop the search at 32.
    assert layer_config(net, configs, "head.mean") == (64, 1, 1, 1)
    assert layer_config(net, configs, "stem.bn") == (64, 1, 1, 1)


def test_owt_equals_data_parallelism_before_the_classifier(nets):
    for name in ("resnet101", "inception3"):
        net = nets[name]
        dp, trick = data_parallel(net, 16), owt(net, 16)
        differ = [net.layers[v].op for v in range(len(net)) if dp[v] != trick[v]]
        assert differ == ["FC", "SoftmaxCrossEntropy"], name


# ---------------------------------------------------------------------------------------
# GNMT on RNNLM


def test_gnmt_rnnlm_p8_by_hand(nets):
    net = nets["rnnlm"]
    configs = gnmt(net, 8)
    # Embedding (b, s, d, v), LSTM (L, s, b, n, k), FC (b, s, n, k), loss (b, s, v).
    assert configs == [(8, 1, 1, 1), (2, 1, 4, 1, 1), (8, 1, 1, 1), (8, 1, 1)]
    ev = evaluate(net, configs, Machine(), 8)
    rho = 5000.0
    # LSTM: one layer per device group (Bp = 2 / 2 = 1); GEMM M = 256 * 128 / 4 = 8192,
    # N = 4 * 2048 = 8192, K = 2 * 2048 = 4096, pw = 3; weight gradient all-reduced among
    # the 4 devices of a group: AR(8192 * 4096, 4) = rho * 8192 * 4096 / 4 * 2 * 3. The
    # cell hand-over (b, n) split (4, 1) -> (4, 1) moves nothing.
    lstm = 3 * 8192 * 8192 * 4096 + 3 * 3 * 8192 * 8192 + rho * 8192 * 4096 / 4 * 6
    assert ev.layer_costs[1] == pytest.approx(lstm, rel=1e-12)
    # Embedding -> LSTM: (128, 256, 2048) in 8 batch blocks of 16, needed in 4 blocks of 32:
    # every device lacks 16 * 256 * 2048 words.
    assert ev.edge_costs[(0, 1)] == pytest.approx(rho * 2 * 16 * 256 * 2048, rel=1e-12)


def test_gnmt_needs_a_device_per_lstm_layer(nets):
    with pytest.raises(ValueError, match="p >= 2"):
        gnmt(nets["rnnlm"], 1)
    assert expert_strategies(nets["rnnlm"], 1) == {}


# ---------------------------------------------------------------------------------------
# Mesh-TensorFlow on the Transformer


def test_mesh_tf_p8_m4_splits_the_documented_dimensions(nets):
    net = nets["transformer"]
    configs = mesh_tensorflow(net, 8, m=4)
    expect = {
        "enc.embedding": (4, 1, 1, 2),        # b l d v: vocabulary
        "enc.position": (4, 1, 1),            # b l e: batch only
        "enc1.attn.qkv": (1, 4, 2, 1, 1, 1),  # s b h l k e: heads
        "enc1.attn.split": (1, 4, 2, 1, 1),   # s b h l k
        "enc1.attn.scores": (4, 2, 1, 1, 1),  # b h l m k
        "enc1.attn.softmax": (4, 2, 1, 1),    # b h l m
        "enc1.attn.context": (4, 2, 1, 1, 1),  # b h l k m
        "enc1.attn.out": (4, 1, 1, 2, 1),     # b l e h k: heads (reduced)
        "enc1.attn.norm": (4, 1, 1),
        "enc1.ff.up": (4, 1, 2, 1),           # b l f e: feed-forward width
        "enc1.ff.down": (4, 1, 1, 2),         # b l e f
        "dec1.cross.stack": (1, 4, 1, 1),     # s b l e: batch only
        "dec1.cross.qkv": (1, 4, 2, 1, 1, 1),
        "head.logits": (4, 1, 2, 1),          # b l v e: vocabulary
        "loss": (4, 1, 2),                    # b l v
    }
    for name, config in expect.items():
        assert layer_config(net, configs, name) == config, name


def test_mesh_tf_picks_the_cheapest_mesh_by_brute_force(nets):
    net = nets["transformer"]
    machine = Machine()
    for procs in (8, 32):
        costs = {}
        for m in range(1, procs + 1):  # every batch side; invalid meshes raise
            try:
                costs[m] = evaluate(net, mesh_tensorflow(net, procs, m=m), machine, procs).total
            except ValueError:
                pass
        # Valid: m | 128 and n = p / m divides heads 8, feed-forward 2048 and vocabulary 50000.
        assert sorted(costs) == sorted(procs // n for n in (1, 2, 4, 8) if procs // n >= 1)
        chosen = evaluate(net, mesh_tensorflow(net, procs, machine), machine, procs).total
        assert chosen == min(costs.values())
        m, n = best_mesh(net, procs, machine)
        assert m * n == procs and costs[m] == chosen


def test_mesh_tf_meshes_fall_back_to_fewer_devices():
    net = graphs.build("transformer", 128)
    assert mesh_tensorflow_meshes(net, 64) == [(64, 1), (32, 2), (16, 4), (8, 8)]
    # 48 = 16 * 3: no mesh of 48 (m must divide 128, n divide 8); 32 is the largest count
    # <= 48 that has one.
    assert mesh_tensorflow_meshes(net, 48) == [(32, 1), (16, 2), (8, 4), (4, 8)]
    with pytest.raises(ValueError, match="not valid"):
        mesh_tensorflow(net, 48, m=16)  # n = 3 does not divide the 8 heads
    with pytest.raises(ValueError, match="divisor of p"):
        mesh_tensorflow(net, 8, m=3)


# ---------------------------------------------------------------------------------------
# Exactness: no expert strategy beats the optimum (all these lie in the search space)


@pytest.mark.parametrize("name, procs", [
    ("alexnet", 4), ("alexnet", 8), ("resnet101", 4), ("inception3", 4),
    ("rnnlm", 4), ("rnnlm", 8), ("rnnlm", 16), ("transformer", 8),
])
def test_expert_costs_at_least_the_optimum(nets, name, procs):
    net = nets[name]
    machine = Machine()
    best = plan(net, procs, machine)
    strategies = expert_strategies(net, procs, machine)
    assert strategies
    for expert, configs in strategies.items():
        cost = evaluate(net, configs, machine, procs).total
        assert cost >= best.total_cost * (1 - 1e-12), (expert, cost, best.total_cost)


# ---------------------------------------------------------------------------------------
# Where experts do not apply


@pytest.mark.parametrize("expert, name", [
    ("owt", "rnnlm"), ("owt", "transformer"),
    ("gnmt", "alexnet"), ("gnmt", "transformer"),
    ("mesh-tf", "alexnet"), ("mesh-tf", "rnnlm"), ("mesh-tf", "inception3"),
])
def test_expert_rejects_a_graph_it_does_not_apply_to(nets, expert, name):
    with pytest.raises(ValueError, match=name):
        EXPERTS[expert](nets[name], 8)


def _tiny_cnn():
    g = GraphBuilder("tiny-cnn", cutoff=1)
    x = g.input((8, 3, 16, 16), "image", letters="bchw")
    x = g.add("conv", Conv(x, 4, 3))
    x = g.add("pool", Pooling(x, 2, stride=2))
    x = g.reshape("flatten", x, (8, 4 * 7 * 7), letters="bk")
    x = g.add("fc", FC(x, 12))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def test_other_networks_get_every_expert_that_fits():
    net = _tiny_cnn()
    strategies = expert_strategies(net, 8)
    assert list(strategies) == ["owt"]
    # 12 classes on 8 devices: largest divisor 6; batch 8 split 8 ways before the FC.
    assert strategies["owt"] == [(8, 1, 1, 1, 1, 1, 1), (8, 1, 1, 1), (8, 1, 1, 1), (8, 1), (1, 6, 1), (1, 6)]

    g = GraphBuilder("mlp", cutoff=1)
    x = g.input((8, 32), "x", letters="bk")
    g.add("loss", SoftmaxCrossEntropy(g.add("fc", FC(x, 16))))
    assert expert_strategies(g.build(), 4) == {}  # no convolution, no LSTM, no 'b'-lettered Einsum mesh


def test_bad_device_counts_are_rejected(nets):
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="positive integer"):
            owt(nets["alexnet"], bad)
        with pytest.raises(ValueError, match="positive integer"):
            expert_strategies(nets["alexnet"], bad)


@pytest.mark.skipif("gpt2-small" not in graphs.GRAPHS, reason="no GPT graphs in this tree")
def test_mesh_tf_fits_a_decoder_only_gpt_by_structure():
    net = graphs.build("gpt2-small", 16)
    strategies = expert_strategies(net, 16)
    # Not a paper graph: every expert that fits. Mesh-TF's letters b/h/f/v fit a GPT block;
    # OWT (no convolution) and GNMT (no LSTM) do not.
    assert list(strategies) == ["mesh-tf"]
    m, n = best_mesh(net, 16)
    assert m * n == 16 and 16 % m == 0
    # 12 heads: a 16-device mesh can only use n in {1, 2, 4}, and 50304 = 2^7 * 3 * 131 with
    # feed-forward 3072 = 2^10 * 3 both allow those.
    assert [mesh[1] for mesh in mesh_tensorflow_meshes(net, 16)] == [1, 2, 4]
