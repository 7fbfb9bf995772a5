"""The JSON graph format (``pase.sources.graph_json``): exact round trips and clear errors.

A graph written with ``network_to_json`` and read back must give the same layers (types,
iteration spaces, arguments), the same edges and bit-identical cost tables, so every optimum is
the same to the last bit. Malformed files must name the layer and the field.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphs
from pase import GraphBuilder, Machine
from cli_runner import run
from pase.core.fileio import InputError
from pase.sources.graph_json import dumps, network_from_json, network_to_json
from pase.model.layers import FC, Elementwise, SoftmaxCrossEntropy
from pase.planning.planner import plan

# Small batches keep the big GPT graphs quick; the structure does not depend on the batch.
BATCH = {"alexnet": 8, "resnet101": 8, "inception3": 8}


def round_trip(net):
    return network_from_json(json.loads(dumps(net)))


@pytest.mark.parametrize("name", list(graphs.GRAPHS))
def test_every_built_in_graph_round_trips_exactly(name):
    net = graphs.build(name, BATCH.get(name, 4))
    back = round_trip(net)
    assert (back.name, back.cutoff, back.batch, back.names) == (net.name, net.cutoff, net.batch, net.names)
    for a, b in zip(net.layers, back.layers):
        # A decoder's biased projection (gpt-oss-120b) is written as a plain Einsum, its bias left
        # out (graphs.decoder.BiasedEinsum says so): same op, args and costs.
        assert type(a) is type(b) or (type(a).__name__ == "BiasedEinsum" and type(b).__name__ == "Einsum")
        assert (a.domain, a.dims, a.args, a.unsplit, a.batch_dim) == (b.domain, b.dims, b.args, b.unsplit, b.batch_dim)
        assert a.output_shapes == b.output_shapes and a.output_letters == b.output_letters
        # Graph inputs keep shape and kind (their serial numbers may differ); layer outputs
        # keep producer and output index.
        def reads(layer):
            return [(t.shape, t.producer, t.index if t.producer is not None else t.name, t.is_param)
                    for t in layer.inputs]

        assert reads(a) == reads(b)
    assert net.edges == back.edges
    # Bit-identical cost tables on a non-default machine.
    machine = Machine(7.0, 24.0)
    G1, G2 = net.graph(8, machine), back.graph(8, machine)
    for v in G1.nodes:
        assert np.array_equal(G1.nodes[v]["cost"], G2.nodes[v]["cost"])
        assert np.array_equal(G1.nodes[v]["configs"], G2.nodes[v]["configs"])
    for u, v, m in G1.edges(data="cost"):
        assert np.array_equal(m, G2.edges[u, v]["cost"])
    # Writing the read-back graph gives the same file.
    assert dumps(back) == dumps(net)


@pytest.mark.parametrize("name", ["alexnet", "rnnlm", "transformer", "gpt2-small"])
def test_round_trip_gives_the_same_optimum_to_the_last_bit(name):
    net = graphs.build(name, BATCH.get(name, 16))
    a, b = plan(net, 8), plan(round_trip(net), 8)
    assert a.total_cost == b.total_cost
    assert a.configs == b.configs


def small_graph():
    g = GraphBuilder("small", cutoff=1, batch=4)
    x = g.input((4, 6), "x", letters="bk")
    h = g.add("fc", FC(x, 6, pw=1))
    r = g.add("add", Elementwise(h, x))
    g.add("loss", SoftmaxCrossEntropy(r))
    return network_to_json(g.build())


def test_the_format_of_a_small_graph():
    data = small_graph()
    assert data["format"] == "pase-graph" and data["version"] == 1
    assert data["inputs"] == [{"name": "x", "shape": [4, 6], "letters": "bk", "param": False}]
    assert data["layers"] == [
        {"name": "fc", "op": "FC", "inputs": ["x"], "args": {"units": 6, "pw": 1, "letters": "b"}},
        {"name": "add", "op": "Elementwise", "inputs": ["fc", "x"], "args": {"pw": 0}},
        {"name": "loss", "op": "SoftmaxCrossEntropy", "inputs": ["add"], "args": {}},
    ]


def broken(edit):
    data = small_graph()
    edit(data)
    with pytest.raises(InputError) as caught:
        network_from_json(data, "graph file g.json")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("graph file g.json")
    return message


def test_unknown_op_names_the_layer():
    message = broken(lambda d: d["layers"][1].update(op="Frobnicate"))
    assert "layer 'add'" in message and "Frobnicate" in message and "Elementwise" in message  # lists known ops


def test_missing_field_names_the_layer_and_field():
    message = broken(lambda d: d["layers"][0].pop("op"))
    assert "layer 'fc'" in message and "'op'" in message


def test_bad_reference_names_the_layer():
    message = broken(lambda d: d["layers"][2].update(inputs=["nowhere"]))
    assert "layer 'loss'" in message and "nowhere" in message


def test_reference_to_a_later_layer_is_refused():
    message = broken(lambda d: d["layers"][0].update(inputs=["loss"]))
    assert "layer 'fc'" in message and "earlier layer" in message


def test_shape_mismatch_names_the_layer():
    def edit(d):
        d["inputs"].append({"name": "y", "shape": [4, 5], "letters": "bk", "param": False})
        d["layers"][1]["inputs"] = ["fc", "y"]

    message = broken(edit)
    assert "layer 'add'" in message and "differ in shape" in message


def test_bad_argument_names_the_layer_and_argument():
    message = broken(lambda d: d["layers"][0]["args"].update(units=-3))
    assert "layer 'fc'" in message and "unit count" in message
    message = broken(lambda d: d["layers"][0]["args"].update(bogus=1))
    assert "layer 'fc'" in message and "bogus" in message


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.update(version=7), "version"),
    (lambda d: d.update(cutoff=0), "cutoff"),
    (lambda d: d.update(batch="x"), "batch"),
    (lambda d: d.update(layers=[]), "no layers"),
    (lambda d: d["inputs"][0].update(shape=[4, -6]), "inputs[0]"),
    (lambda d: d["inputs"].append(dict(d["inputs"][0])), "unique"),
    (lambda d: d["layers"][2].update(name="fc"), "already used"),
    (lambda d: d["layers"][0].update(args=[1]), "'args'"),
])
def test_malformed_files(edit, field):
    assert field in broken(edit)


def test_cli_export_and_plan_the_file(tmp_path):
    path = tmp_path / "g.json"
    status, searched, _ = run("-g", "rnnlm", "-p", "8", "-m", "256", "-b", "16", "--json", "--export-graph", path)
    assert status == 0
    status, again, _ = run("-g", path, "-p", "8", "--json")
    assert status == 0
    a, b = json.loads(searched), json.loads(again)
    assert a["total_cost"] == b["total_cost"]
    assert [x["config"] for x in a["layers"]] == [x["config"] for x in b["layers"]]
    # The file fixes the batch: asking for another is a usage error.
    status, out, err = run("-g", path, "-p", "8", "-b", "32")
    assert status == 2 and out == "" and "batch 16" in err and err.count("\n") == 1


def test_cli_bad_graph_files(tmp_path):
    missing = tmp_path / "none.json"
    status, out, err = run("-g", missing)
    assert status == 1 and out == "" and err.count("\n") == 1 and "cannot read" in err
    bad = tmp_path / "bad.json"
    data = small_graph()
    data["layers"][1]["op"] = "Nope"
    bad.write_text(json.dumps(data))
    status, out, err = run("-g", bad, "-p", "2")
    assert status == 1 and out == "" and err.count("\n") == 1 and "layer 'add'" in err
    bad.write_text("[" * 100000)
    status, out, err = run("-g", bad, "-p", "2")
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err
