"""The five built-in graphs against the independent reference fixtures (``docs/graphs.md``).

``tests/data/reference/graphs/<graph>-p<procs>.json`` lists, per vertex id, the iteration
space and the number of valid configurations, and the edge list, at batch 128;
``strategies.json`` and ``alexnet-p32-strategy.json`` give strategies and their costs under
the reference model (match to a relative 1e-9).
"""

import json
import os
import re

import numpy as np
import pytest

import graphs
from pase.machines.paper import Machine
from pase.costing.strategy import evaluate

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference")
NAMES = ["alexnet", "resnet101", "inception3", "rnnlm", "transformer"]
VERTICES = {"alexnet": 14, "resnet101": 245, "inception3": 219, "rnnlm": 4, "transformer": 204}
# The fixtures' type names are informative: BatchNorm is a Norm, Embedding an Einsum.
REFERENCE_OP = {"BatchNorm": "Norm", "Embedding": "Einsum"}


def _load(*parts):
    with open(os.path.join(REFERENCE, *parts)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def networks():
    """Each built-in graph at batch 128, built once for this module."""
    return {name: graphs.build(name, 128) for name in NAMES}


def test_registry_has_the_five_graphs():
    # Other graphs (the GPT family of docs/graphs.md) may be registered too.
    assert set(NAMES) <= set(graphs.GRAPHS)
    for name in NAMES:
        assert graphs.GRAPHS[name].name == name


@pytest.mark.parametrize("name", NAMES)
def test_vertex_counts(networks, name):
    net = networks[name]
    assert len(net) == VERTICES[name] == len(net.layers) == len(net.names)


@pytest.mark.parametrize("procs", [8, 32])
@pytest.mark.parametrize("name", NAMES)
def test_structure_matches_reference(networks, name, procs):
    ref = _load("graphs", f"{name}-p{procs}.json")
    assert (ref["graph"], ref["procs"], ref["batch"]) == (name, procs, 128)
    net = networks[name]
    assert len(net) == len(ref["nodes"])
    configs = net.configs(procs)
    for node, layer, C in zip(ref["nodes"], net.layers, configs):
        v = node["id"]
        assert net.layers[v] is layer
        assert list(layer.domain) == node["domain"], f"{name} vertex {v} ({net.names[v]}) domain"
        assert len(C) == node["configs"], f"{name} p{procs} vertex {v} ({net.names[v]}) config count"
        assert REFERENCE_OP.get(layer.op, layer.op) == node["op"], f"{name} vertex {v} type"
    assert sorted(net.edge_list()) == sorted(ref["edges"])
    assert set(net.edges) == {tuple(e) for e in ref["edges"]}
    assert len(net.edges) == len(ref["edges"])  # no duplicate edges


@pytest.mark.parametrize("name", NAMES)
def test_configs_respect_device_count_and_divide(networks, name):
    net = networks[name]
    for layer, C in zip(net.layers, net.configs(32)):
        assert (C.prod(axis=1) <= 32).all()
        assert (np.asarray(layer.domain)[None, :] % C == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_names_unique_and_readable(networks, name):
    names = networks[name].names
    assert len(set(names)) == len(names)
    # Readable: lower-case words and numbers joined by dots, like "stage1.block1.conv1".
    pattern = re.compile(r"^[a-z][a-z0-9]*(\.[a-z0-9]+)*$")
    for n in names:
        assert pattern.match(n), n
    assert names[-1] == "loss"


def test_names_spot_check(networks):
    assert networks["alexnet"].names[:3] == ("conv1", "pool1", "conv2")
    assert networks["alexnet"].names[8:10] == ("flatten.ravel", "flatten.unravel")
    assert networks["rnnlm"].names == ("embedding", "lstm", "fc", "loss")
    assert networks["transformer"].names[2] == "enc1.attn.qkv"
    assert "stage1.block1.shortcut.conv" in networks["resnet101"].names


def test_cutoffs(networks):
    # t = 4 for the CNNs, 1 for rnnlm and the transformer (docs/cost-model.md).
    assert {n: networks[n].cutoff for n in NAMES} == {
        "alexnet": 4, "resnet101": 4, "inception3": 4, "rnnlm": 1, "transformer": 1,
    }


def test_alexnet_is_a_path(networks):
    assert networks["alexnet"].edge_list() == [[i, i + 1] for i in range(13)]


def test_alexnet_domains_by_hand(networks):
    # conv1: ho = (227 - 11)/4 + 1 = 55; pool1: (55 - 3)/2 + 1 = 27; conv2 pad 2: 27;
    # pool2: (27 - 3)/2 + 1 = 13; conv3..5 pad 1: 13; pool5: (13 - 3)/2 + 1 = 6; 256*6*6 = 9216.
    d = [layer.domain for layer in networks["alexnet"].layers]
    assert d[0] == (128, 3, 55, 55, 11, 11, 96)
    assert d[1] == (128, 96, 27, 27)
    assert d[2] == (128, 96, 27, 27, 5, 5, 256)
    assert d[3] == (128, 256, 13, 13)
    assert d[7] == (128, 256, 6, 6)
    assert d[8] == (128, 256, 6, 6) and d[9] == (128, 9216)
    assert d[10] == (128, 4096, 9216) and d[12] == (128, 1024, 4096) and d[13] == (128, 1024)


def test_alexnet_conv1_config_count_by_hand(networks):
    # (128, 3, 55, 55, 11, 11, 96), p = 8, t = 4, ho/wo unsplit: b in {1,2,4,8}, c = 3 -> 1,
    # r = s = 11 -> 1 (11/11 < 4), n = 96 in {1,2,3,4,6,8}.
    # b=1: 6 n; b=2: n <= 4: 4; b=4: n <= 2: 2; b=8: 1. Total 13.
    assert len(networks["alexnet"].configs(8)[0]) == 13


# ----------------------------------------------------------------------------- strategies


STRATEGY_CASES = _load("strategies.json")["cases"]


@pytest.mark.parametrize("case", STRATEGY_CASES, ids=[c["graph"] for c in STRATEGY_CASES])
def test_reference_strategy_costs(networks, case):
    assert case["batch"] == 128
    net = networks[case["graph"]]
    machine = Machine(case["flops"], case["bw"])
    result = evaluate(net, case["configs"], machine, case["procs"])
    assert result.total == pytest.approx(case["total_cost"], rel=1e-9)
    # The total is its layer and edge terms and nothing else.
    assert result.total == pytest.approx(
        result.layer_costs.sum() + sum(result.edge_costs.values()), rel=1e-12
    )
    assert set(result.edge_costs) == set(net.edges)


@pytest.mark.parametrize("case", STRATEGY_CASES, ids=[c["graph"] for c in STRATEGY_CASES])
def test_reference_strategies_are_enumerated_configs(networks, case):
    # The fixture's strategies pick enumerated configurations: each must be in our tables.
    net = networks[case["graph"]]
    for v, (config, C) in enumerate(zip(case["configs"], net.configs(case["procs"]))):
        assert tuple(config) in {tuple(int(x) for x in row) for row in C}, (case["graph"], v)


def test_alexnet_p32_reference_optimum_costs_its_total(networks):
    ref = _load("alexnet-p32-strategy.json")
    assert (ref["graph"], ref["procs"], ref["batch"]) == ("alexnet", 32, 128)
    configs = [layer["config"] for layer in sorted(ref["layers"], key=lambda l: l["id"])]
    result = evaluate(networks["alexnet"], configs, Machine(ref["flops"], ref["bw"]), 32)
    assert result.total == pytest.approx(ref["total_cost"], rel=1e-9)


# ----------------------------------------------------------------------------- batch and width


@pytest.mark.parametrize("batch", [0, -1, 1.5, "128", True, None])
def test_build_rejects_bad_batch(batch):
    with pytest.raises(ValueError):
        graphs.build("alexnet", batch)


def test_build_rejects_unknown_name():
    with pytest.raises(ValueError, match="unknown graph"):
        graphs.build("vgg16")


@pytest.mark.parametrize("name", ["alexnet", "resnet101", "inception3"])
def test_build_rejects_width_for_cnn(name):
    with pytest.raises(ValueError):
        graphs.build(name, 128, 256)


def test_build_rejects_bad_width():
    with pytest.raises(ValueError):
        graphs.build("transformer", 128, 100)  # not a multiple of the 8 heads
    with pytest.raises(ValueError):
        graphs.build("rnnlm", 128, 0)


def test_other_batch_size():
    net = graphs.build("alexnet", 64)
    assert net.layers[0].domain == (64, 3, 55, 55, 11, 11, 96)
    assert net.layers[9].domain == (64, 9216)
    assert net.batch == 64
    rnn = graphs.build("rnnlm", 32)
    assert rnn.layers[1].domain == (2, 256, 32, 2048, 2048)


def test_transformer_other_width():
    # e = 256: 8 heads of key width 32, feed-forward 4e = 1024; sequence 256, vocabulary 50000.
    net = graphs.build("transformer", 128, 256)
    assert len(net) == 204
    by_name = dict(zip(net.names, net.layers))
    # Embedding bl v, v d -> bl d: space (b, l, d, v).
    assert by_name["enc.embedding"].domain == (128, 256, 256, 50000)
    assert by_name["enc.position"].domain == (128, 256, 256)
    # ble,shek->sbhlk: space (s, b, h, l, k, e).
    assert by_name["enc1.attn.qkv"].domain == (3, 128, 8, 256, 32, 256)
    assert by_name["enc1.attn.split"].domain == (1, 128, 8, 256, 32)
    # bhlk,bhmk->bhlm: (b, h, l, m, k).
    assert by_name["enc1.attn.scores"].domain == (128, 8, 256, 256, 32)
    # bhlk,hek->ble: (b, l, e, h, k).
    assert by_name["enc1.attn.out"].domain == (128, 256, 256, 8, 32)
    # ble,ef->blf: (b, l, f, e); blf,fe->ble: (b, l, e, f).
    assert by_name["enc1.ff.up"].domain == (128, 256, 1024, 256)
    assert by_name["enc1.ff.down"].domain == (128, 256, 256, 1024)
    # sble,shek->sbhlk after the Stack of three (b, l, e) tensors.
    assert by_name["dec1.cross.stack"].domain == (1, 128, 256, 256)
    assert by_name["dec1.cross.qkv"].domain == (3, 128, 8, 256, 32, 256)
    assert by_name["head.logits"].domain == (128, 256, 50000, 256)
    # Explicitly passing the default width gives the default graph.
    default = graphs.build("transformer", 128, 512)
    assert [l.domain for l in default.layers] == [l.domain for l in graphs.build("transformer").layers]


def test_rnnlm_other_width():
    net = graphs.build("rnnlm", 128, 1024)
    assert [l.domain for l in net.layers] == [
        (128, 256, 1024, 100000),   # Embedding: (b, s, d, v)
        (2, 256, 128, 1024, 1024),  # LSTM: (L, s, b, n, k)
        (128, 256, 100000, 1024),   # FC: (b, s, n, k)
        (128, 256, 100000),         # loss
    ]
    assert net.edge_list() == [[0, 1], [1, 2], [2, 3]]


def test_builds_are_independent_and_deterministic():
    a, b = graphs.build("inception3"), graphs.build("inception3")
    assert a.names == b.names
    assert [l.domain for l in a.layers] == [l.domain for l in b.layers]
    assert a.edge_list() == b.edge_list()
    assert a.layers[0] is not b.layers[0]
