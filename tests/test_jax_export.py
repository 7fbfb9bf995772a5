"""Tests of ``pase.outputs.jax.export``: the mesh, the device layout and the sharding of every tensor.

No jax needed: the export is plain data. Expected values are worked out by hand from the
layout rule (batch dimension outermost, then iteration-space order, replicas innermost, each
split taking the leftmost free prime axes) and each layer type's tensor configurations.
"""

import json
import math

import numpy as np
import pytest

import graphs
from pase import (
    FC,
    LSTM,
    BatchNorm,
    Concat,
    Conv,
    Einsum,
    Elementwise,
    Embedding,
    GraphBuilder,
    Norm,
    ReduceMean,
    Softmax,
    SoftmaxCrossEntropy,
    Stack,
    Unstack,
    plan,
)
from pase.planning.baselines import data_parallel
from pase.outputs.jax.export import (
    FORMAT,
    export_shardings,
    layout_axes,
    mesh_axes,
    partition_spec,
    tensor_dims,
)


# ---------------------------------------------------------------------------------------
# Mesh and layout


@pytest.mark.parametrize(
    "procs, sizes",
    [(1, []), (2, [2]), (8, [2, 2, 2]), (12, [2, 2, 3]), (7, [7]), (64, [2] * 6), (18, [2, 3, 3])],
)
def test_mesh_axes_are_prime_factors(procs, sizes):
    names, got = mesh_axes(procs)
    assert got == sizes
    assert names == [f"d{i}" for i in range(len(sizes))]
    assert math.prod(got) == procs


@pytest.mark.parametrize("bad", [0, -4, 2.0, True, "8"])
def test_mesh_axes_reject_bad_device_counts(bad):
    with pytest.raises(ValueError, match="positive integer"):
        mesh_axes(bad)


@pytest.mark.parametrize(
    "config, batch_dim, procs, axes",
    [
        # p = 8, axes (2, 2, 2): batch 2 takes d0, the next dim's 4 takes d1 d2.
        ((2, 4, 1), 0, 8, [[0], [1, 2], []]),
        # Batch dim 1 is laid out first, so it takes d0 although it is the second dim.
        ((2, 2), 1, 8, [[1], [0]]),
        # P = 2 < 8: the batch takes d0, d1 and d2 hold four replicas (innermost).
        ((2, 1, 1), 0, 8, [[0], [], []]),
        # P = 4 on dims 1 and 2 only: d0 to dim 1, d1 to dim 2; d2 replicas.
        ((1, 2, 2), 0, 8, [[], [0], [1]]),
        # p = 12, axes (2, 2, 3): a split of 3 takes the size-3 axis d2, then 4 takes d0 d1.
        ((3, 4), 0, 12, [[2], [0, 1]]),
        # A split of 6 = 2 * 3 takes d0 and d2 (sorted); the other 2 takes d1.
        ((6, 2), 0, 12, [[0, 2], [1]]),
        # Unsplit everywhere: nothing, all replicas.
        ((1, 1, 1), 2, 4, [[], [], []]),
        # One device.
        ((1,), 0, 1, [[]]),
    ],
)
def test_layout_axes_by_hand(config, batch_dim, procs, axes):
    assert layout_axes(config, batch_dim, procs) == axes


def test_layout_axes_refuses_a_device_count_that_does_not_divide():
    # 3 parts cannot be replicated equally over 8 devices.
    with pytest.raises(ValueError, match="uses 3 devices, which does not divide 8"):
        layout_axes((3, 1), 0, 8)


def test_layout_axes_split_products_match_the_configuration():
    # Property: every dimension's axes multiply to its split and no axis is used twice.
    rng = np.random.RandomState(0)
    procs = 24
    _, sizes = mesh_axes(procs)
    for _ in range(200):
        config = [int(rng.choice([1, 2, 3, 4, 6])) for _ in range(4)]
        if procs % math.prod(config):
            continue
        batch_dim = int(rng.randint(4))
        axes = layout_axes(config, batch_dim, procs)
        flat = [a for dim in axes for a in dim]
        assert len(flat) == len(set(flat))
        assert [math.prod(sizes[a] for a in dim) for dim in axes] == config


def test_partition_spec_joins_the_axes_of_spanned_dims():
    assert partition_spec([(0,), (), (1, 2)], [[0], [1], [2]], ["d0", "d1", "d2"]) == [["d0"], None, ["d1", "d2"]]
    # A spanned dimension that is not split contributes nothing.
    assert partition_spec([(0, 1)], [[], [2]], ["d0", "d1", "d2"]) == [["d2"]]


# ---------------------------------------------------------------------------------------
# Which iteration-space dims every tensor dim spans, per layer type (from docs/cost-model.md)


def _layer(build):
    g = GraphBuilder("t")
    build(g)
    return g.build().layers[-1]


def test_tensor_dims_conv():
    layer = _layer(lambda g: g.add("c", Conv(g.input((4, 3, 8, 8), "x"), 6, 3, pad=1)))
    # Space (b, c, ho, wo, r, s, n): input (b, c, h, w) <- 0 1 2 3; output (b, n, ho, wo) <- 0 6 2 3;
    # filter (n, c, r, s) <- 6 1 4 5.
    assert tensor_dims(layer) == {
        "inputs": [[(0,), (1,), (2,), (3,)]],
        "outputs": [[(0,), (6,), (2,), (3,)]],
        "weights": [[(6,), (1,), (4,), (5,)]],
    }


def test_tensor_dims_fc_einsum_embedding():
    fc = _layer(lambda g: g.add("f", FC(g.input((4, 5, 6), "x"), 7)))
    # Space (b, s, n, k): input (b, s, k) <- 0 1 3; output (b, s, n) <- 0 1 2; weight (n, k) <- 2 3.
    assert tensor_dims(fc) == {"inputs": [[(0,), (1,), (3,)]], "outputs": [[(0,), (1,), (2,)]],
                               "weights": [[(2,), (3,)]]}
    ein = _layer(lambda g: g.add("e", Einsum("ble,ef->blf", g.input((2, 3, 4), "x"), g.weight((4, 5), "w"))))
    # Space: output dims b l f, then reduction e: (b, l, f, e). A = ble <- 0 1 3; B = ef <- 3 2.
    assert tensor_dims(ein) == {"inputs": [[(0,), (1,), (3,)], [(3,), (2,)]], "outputs": [[(0,), (1,), (2,)]],
                                "weights": [[(3,), (2,)]]}
    emb = _layer(lambda g: g.add("m", Embedding(g.input((2, 3), "ids"), 10, 4)))
    # Space (b, s, d, v): one-hot (b, s, v) <- 0 1 3; table (v, d) <- 3 2.
    assert tensor_dims(emb)["inputs"] == [[(0,), (1,), (3,)], [(3,), (2,)]]


def test_tensor_dims_lstm():
    layer = _layer(lambda g: g.add("l", LSTM(g.input((4, 5, 6), "x"), 2)))
    # Space (L, s, b, n, k): input (b, s, k) <- 2 1 4; output (b, s, n) <- 2 1 3; weight (L, 4n, 2k) <- 0 3 4.
    assert tensor_dims(layer) == {"inputs": [[(2,), (1,), (4,)]], "outputs": [[(2,), (1,), (3,)]],
                                  "weights": [[(0,), (3,), (4,)]]}


def test_tensor_dims_data_movement():
    def reshape(g):
        x = g.input((2, 3, 4), "x")
        g.reshape("r", x, (6, 4))

    g = GraphBuilder("t")
    reshape(g)
    ravel, unravel = g.build().layers
    # Ravel's flat output spans all three dims; Unravel's flat input spans both of its dims.
    assert tensor_dims(ravel)["outputs"] == [[(0, 1, 2)]]
    assert tensor_dims(unravel)["inputs"] == [[(0, 1)]]
    stack = _layer(lambda g: g.add("s", Stack([g.input((2, 3), "a"), g.input((2, 3), "b")], axis=0)))
    # Space (s, b, c) with s of size 1: inputs drop it, the output keeps it.
    assert tensor_dims(stack) == {"inputs": [[(1,), (2,)], [(1,), (2,)]], "outputs": [[(0,), (1,), (2,)]],
                                  "weights": []}
    unstack = _layer(lambda g: g.add("u", Unstack(g.input((2, 3, 4), "x"), axis=1)))
    assert tensor_dims(unstack)["outputs"] == [[(0,), (2,)]] * 3
    mean = _layer(lambda g: g.add("m", ReduceMean(g.input((2, 3, 4, 5), "x"), (2, 3), keepdims=True)))
    # keepdims: the reduced dims stay with size 1 and are never split.
    assert tensor_dims(mean)["outputs"] == [[(0,), (1,), (), ()]]
    concat = _layer(lambda g: g.add("c", Concat([g.input((2, 3), "a"), g.input((2, 5), "b")], axis=1)))
    assert tensor_dims(concat)["outputs"] == [[(0,), (1,)]]


def test_tensor_dims_norms():
    norm = _layer(lambda g: g.add("n", Norm(g.input((2, 3, 4), "x"), axis=-1)))
    assert tensor_dims(norm)["weights"] == [[(2,)], [(2,)]]  # scale and bias along the axis
    bn = _layer(lambda g: g.add("n", BatchNorm(g.input((2, 3, 4, 4), "x"))))
    assert tensor_dims(bn)["weights"] == [[(1,)], [(1,)]]  # per channel


# ---------------------------------------------------------------------------------------
# The export


def _mlp():
    g = GraphBuilder("mlp")
    x = g.input((8, 16), "x", letters="bk")
    h = g.add("fc", FC(x, 32, pw=1))
    g.add("loss", SoftmaxCrossEntropy(h))
    return g.build()


def test_export_small_network_by_hand():
    plan = export_shardings(_mlp(), [(2, 2, 1), (4, 1)], 4)
    assert plan["format"] == FORMAT
    assert plan["procs"] == 4
    assert plan["mesh"] == {"axis_names": ["d0", "d1"], "axis_sizes": [2, 2]}
    fc, loss = plan["layers"]
    # FC space (b, n, k) split (2, 2, 1): b -> d0, n -> d1.
    assert fc["axes"] == [["d0"], ["d1"], []]
    assert fc["inputs"] == [{"name": "x", "shape": [8, 16], "spec": [["d0"], None], "producer": None}]
    assert fc["weights"] == [{"name": "fc.weight", "shape": [32, 16], "spec": [["d1"], None]}]
    assert fc["outputs"] == [{"name": "fc", "shape": [8, 32], "spec": [["d0"], ["d1"]]}]
    # Loss (b, c) split (4, 1): the batch takes both axes.
    assert loss["inputs"][0]["spec"] == [["d0", "d1"], None]
    assert loss["inputs"][0]["producer"] == "fc"
    assert json.loads(json.dumps(plan)) == plan


def test_export_graph_weights_embedding_and_attention():
    g = GraphBuilder("lm")
    ids = g.input((4, 6), "ids", letters="bl")
    x = g.add("emb", Embedding(ids, 10, 8, letters="bl"))
    w = g.weight((8, 8), "wq", letters="ef")
    q = g.add("proj", Einsum("ble,ef->blf", x, w))
    s = g.add("stack", Stack([q, x], axis=0))
    a, b = g.add("split", Unstack(s, axis=0))
    y = g.add("sum", Elementwise(a, b))
    z = g.add("soft", Softmax(y, axis=2))
    g.add("loss", SoftmaxCrossEntropy(z))
    net = g.build()
    # emb (b, l, d, v) split (1, 1, 1, 2): v -> d0. proj (b, l, f, e) split (2, 1, 1, 1): b -> d0.
    configs = [(1, 1, 1, 2), (2, 1, 1, 1), (1, 2, 1, 1), (1, 2, 1, 1), (2, 1, 1), (2, 1, 1), (2, 1, 1)]
    plan = export_shardings(net, configs, 2)
    emb, proj, stack, split = plan["layers"][:4]
    # The ids are the input (the one-hot is never built), split like the one-hot without v.
    assert emb["inputs"] == [{"name": "ids", "shape": [4, 6], "spec": [None, None], "producer": None}]
    assert emb["weights"] == [{"name": "emb.weight", "shape": [10, 8], "spec": [["d0"], None]}]
    # A graph weight is listed under weights with its own name, not under inputs.
    assert [i["name"] for i in proj["inputs"]] == ["emb"]
    assert proj["weights"] == [{"name": "wq", "shape": [8, 8], "spec": [None, None]}]
    # Stack space (s, b, l, f) split (1, 2, 1, 1); Stack's batch dim is 1 (after the new axis).
    assert stack["outputs"][0]["spec"] == [None, ["d0"], None, None]
    assert [i["spec"] for i in stack["inputs"]] == [[["d0"], None, None]] * 2
    assert [o["name"] for o in split["outputs"]] == ["split:0", "split:1"]


def test_export_rejects_bad_strategies():
    net = _mlp()
    with pytest.raises(ValueError, match="2 layers"):
        export_shardings(net, [(1, 1, 1)], 4)
    # The loss (6, 4) split (3, 1) uses 3 devices: valid for the cost model, not for a mesh of 8.
    with pytest.raises(ValueError, match=r"layer 1 \(loss, SoftmaxCrossEntropy.*does not divide 8"):
        export_shardings(_wide(), [(1, 1, 1), (3, 1)], 8)
    with pytest.raises(ValueError, match="more than p = 4"):
        export_shardings(net, [(1, 1, 1), (8, 1)], 4)


def _wide():
    g = GraphBuilder("wide")
    h = g.add("fc", FC(g.input((6, 4), "x"), 4))
    g.add("loss", SoftmaxCrossEntropy(h))
    return g.build()


@pytest.mark.parametrize("name, batch, model", [("alexnet", 8, None), ("transformer", 16, 64), ("rnnlm", 16, 128)])
def test_exported_specs_split_every_tensor_as_its_configuration(name, batch, model):
    # Independent check: for every tensor, the axes of its spec multiply to the split the
    # layer's own tensor configuration gives, and no mesh axis appears twice in one tensor.
    net = graphs.build(name, batch, model)
    for configs in (plan(net, 8).configs, data_parallel(net, 8)):
        exported = export_shardings(net, configs, 8)
        sizes = dict(zip(exported["mesh"]["axis_names"], exported["mesh"]["axis_sizes"]))
        for layer, entry, config in zip(net.layers, exported["layers"], configs):
            C = np.asarray([config])
            expected = [c[0].tolist() for c in layer.input_configs(C)]
            got_specs = [t["spec"] for t in entry["inputs"]] + [w["spec"] for w in entry["weights"]
                                                                if layer.op in ("Einsum", "Embedding")]
            if layer.op == "Embedding":  # the ids: the one-hot's configuration without v
                expected = [expected[0][:-1], expected[1]]
            for spec in got_specs + [o["spec"] for o in entry["outputs"]]:
                flat = [a for e in spec if e for a in e]
                assert len(flat) == len(set(flat))
            got = [[math.prod(sizes[a] for a in (e or [])) for e in spec] for spec in got_specs]
            assert sorted(map(tuple, got)) == sorted(map(tuple, expected))
            outs = [[math.prod(sizes[a] for a in (e or [])) for e in o["spec"]] for o in entry["outputs"]]
            assert outs == [c[0].tolist() for c in layer.output_configs(C)]


def test_export_is_deterministic():
    net = graphs.build("alexnet", 8)
    configs = plan(net, 8).configs
    assert json.dumps(export_shardings(net, configs, 8)) == json.dumps(export_shardings(net, configs, 8))


def test_export_takes_a_plan():
    net = _mlp()
    found = plan(net, 4)
    assert export_shardings(found) == export_shardings(net, found.configs, 4)
    with pytest.raises(ValueError, match="give the configurations"):
        export_shardings(net)
    with pytest.raises(TypeError, match="expected a pase.Plan or a Network"):
        export_shardings("alexnet", [], 4)


def test_every_layer_type_has_a_jax_function():
    # A new layer type is one class in pase/model/layers plus its function in OPS.
    from pase.model.layers import LAYER_TYPES
    from pase.outputs.jax.program import OPS

    assert sorted(OPS) == sorted(LAYER_TYPES)
