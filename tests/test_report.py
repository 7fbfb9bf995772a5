"""Tests of the output formats (``pase.outputs``: table, sweep, plan_json, dot, measure) on a two-layer network costed by hand."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from dataclasses import replace

from pase import GraphBuilder, Machine
from pase.model.layers import FC, SoftmaxCrossEntropy
from pase.planning.planner import Measurement, evaluate_plan
from pase.core.units import format_bytes, format_cost, format_seconds
from pase.outputs.dot import dot_graph
from pase.outputs.measure import format_measurement
from pase.outputs.plan_json import format_json, report_dict
from pase.outputs.rows import layer_rows, split_notation
from pase.outputs.sweep import format_sweep_header, format_sweep_refusal, format_sweep_row
from pase.outputs.table import LAYER_COLUMNS, format_table
from pase.search.solver import SearchStats, WorkEstimate


# pydot's parser uses pyparsing names that newer pyparsing deprecates: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydot.*")

def tiny_network(name="mlp", fc_name="fc"):
    """x (8, 16) -> FC to 4 units (iteration space b=8, n=4, k=16) -> softmax cross-entropy (8, 4)."""
    g = GraphBuilder(name, cutoff=1, batch=8)
    x = g.input((8, 16), "x", letters="bk")
    h = g.add(fc_name, FC(x, 4))
    g.add("loss", SoftmaxCrossEntropy(h))
    return g.build()


# Hand-worked costs on the default machine (rho = 10e3 / (16 / 8) = 5000 FLOP per word):
#   FC split (2, 1, 1): Mp = 8/2 = 4, Np = 4, Kp = 16; compute 3 * 4 * 4 * 16 = 768; the
#     weight gradient (Np Kp = 64 words) is all-reduced over m = 2: 5000 * 64/2 * 2 * 1 = 320000.
#   Loss unsplit (1, 1): per device 8 x 4, E = 32, bpp = 8: 4 * 32 + 2 * 8 = 144.
#   Edge: the (8, 4) output lives as 4 x 4 blocks, the loss needs all 32 elements; each
#     device lacks 32 - 16 = 16 words, moved forward and back: 5000 * 2 * 16 = 160000.
FC_COST = 320768.0
FC_COMPUTE = 768.0
LOSS_COST = 144.0
EDGE_COST = 160000.0
# Data parallelism on 2 devices: FC as above, loss split (2, 1): E = 16, bpp = 4: 4*16 + 2*4 = 72;
# the output already lies as the loss needs it, no edge cost.
DP_COST = FC_COST + 72.0
# Memory (16 bytes per parameter, 2 per activation): the FC's weight (4 x 16 = 64 elements,
# n and k unsplit) 1024 bytes plus its output (8 x 4) / 2 = 16 elements, 32 bytes: 1056;
# the loss has no parameters and keeps its whole (8, 4) output: 64 bytes.
FC_MEMORY = 1056.0
LOSS_MEMORY = 64.0


def tiny_report(**kwargs):
    """A plan of the tiny network as if searched: the hand-worked strategy and made-up statistics."""
    net = tiny_network(**kwargs)
    found = evaluate_plan(net, [(2, 1, 1), (1, 1)], 2, Machine())
    stats = SearchStats(WorkEstimate("generateseq", 1234, 100, 1, 4096), 0.5)
    return net, replace(found, search=stats, config_counts=(6, 3))


def test_report_carries_the_hand_worked_costs():
    _, report = tiny_report()
    rows = layer_rows(report)
    assert [r.cost for r in rows] == [FC_COST, LOSS_COST]
    assert [r.edge_cost for r in rows] == [0.0, EDGE_COST]
    assert [r.memory for r in rows] == [FC_MEMORY, LOSS_MEMORY]
    assert report.total_cost == FC_COST + LOSS_COST + EDGE_COST
    assert report.data_parallel.total == DP_COST
    assert report.speedup == pytest.approx(DP_COST / (FC_COST + LOSS_COST + EDGE_COST))


def test_report_dict_schema():
    _, report = tiny_report()
    data = json.loads(format_json(report_dict(report)))
    assert data == report_dict(report)
    assert data["graph"] == "mlp" and data["procs"] == 2 and data["batch"] == 8
    assert data["flops"] == 10.0 and data["bw"] == 16.0
    assert data["total_cost"] == FC_COST + LOSS_COST + EDGE_COST
    assert data["edges"] == [[0, 1]]
    assert data["layers"][0] == {
        "id": 0, "name": "fc", "op": "FC", "dims": "bnk", "domain": [8, 4, 16], "configs": 6,
        "config": [2, 1, 1], "replicas": 1, "cost": FC_COST, "compute": FC_COMPUTE,
        "communication": FC_COST - FC_COMPUTE, "edge_cost": 0.0, "memory_bytes": FC_MEMORY,
    }
    assert data["cost_unit"] == "flop-equivalents"
    assert data["machine"] == {"name": "paper", "flops": 10.0, "bw": 16.0, "rho": 5000.0}
    assert data["layers"][1]["replicas"] == 2 and data["status"] == "ok"
    assert data["layers"][1]["config"] == [1, 1] and data["layers"][1]["edge_cost"] == EDGE_COST
    assert data["search"] == {"algo": "generateseq", "seconds": 0.5, "max_dependent_set": 1,
                              "table_entries": 1234, "largest_table": 100, "peak_bytes": 4096,
                              "plain_table_entries": 1234, "blocks": []}
    assert data["evaluated"] is False and "measure" not in data


def test_one_line_json_for_sweeps():
    _, report = tiny_report()
    text = format_json(report_dict(report), one_line=True)
    assert text.count("\n") == 1 and json.loads(text)["total_cost"] == report.total_cost


def test_zero_cost_has_no_speedup():
    _, report = tiny_report()
    zero = replace(report, total_cost=0.0)
    assert zero.speedup is None
    assert report_dict(zero)["speedup_over_data_parallel"] is None
    assert "n/a" in format_table(zero)


def test_table_columns_line_up():
    _, report = tiny_report()
    text = format_table(report)
    lines = text.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("id"))
    header, rows = lines[header_at], lines[header_at + 1: header_at + 3]
    assert [c.header for c in LAYER_COLUMNS][:3] == ["id", "layer", "type"]
    # Compute 768 and communication 320000 (the weight-gradient all-reduce).
    assert rows[0].split() == ["0", "fc", "FC", "bnk", "8x4x16", "6", "b2", "7.6800e+02", "3.2000e+05", "0.0000e+00",
                               "1.06", "KB"]
    # The loss uses one device of two: the other holds a replica.
    assert rows[1].split() == ["1", "loss", "SoftmaxCrossEntropy", "bn", "8x4", "3", "unsplit", "(x2", "replicated)",
                               "1.4400e+02", "0.0000e+00", "1.6000e+05", "64", "B"]
    for title in ("compute", "communication", "edge cost"):
        end = header.index(title) + len(title)
        assert all(len(row) >= end and row[end - 1] != " " for row in rows)
    assert "PaSE optimal parallelization strategy: mlp (2 layers, 1 edges)" in lines[0]
    assert "optimal total cost  4.8091e+05 FLOP-equivalents" in text
    assert "search              GenerateSeq ordering, largest dependent set 1, 1,234 table entries" in text


def test_formatting_helpers():
    assert format_cost(480912.0) == "4.8091e+05"
    assert format_seconds(2.5) == "2.5 s" and format_seconds(0.0421) == "42.1 ms"
    assert format_seconds(5e-6) == "5 us"
    assert format_bytes(19.9e9) == "19.9 GB" and format_bytes(999) == "999 B"
    assert split_notation((1, 8, 1, 2), "bnkx") == "n8 x2"
    assert split_notation((1, 1, 1), "bhw") == "unsplit"
    # Letters that do not name the dimensions one to one: the plain tuple.
    assert split_notation((2, 2), "aa") == "(2,2)"
    assert split_notation((2, 2), "abc") == "(2,2)"


def test_sweep_rows_line_up_under_their_headers():
    _, report = tiny_report()
    header = format_sweep_header("mlp", 8, Machine()).splitlines()
    row = format_sweep_row(report).rstrip("\n")
    refused = format_sweep_refusal(64, DP_COST).rstrip("\n")
    assert "FLOP-equivalents" in header[0]
    columns = header[1]
    for title, cell in (("devices", "2"), ("optimal cost", "4.8091e+05"), ("data-parallel cost", "3.2084e+05"),
                        ("search seconds", "0.5000")):
        end = columns.index(title) + len(title)
        assert row[end - len(cell): end] == cell, title
    end = columns.index("optimal cost") + len("optimal cost")
    assert refused[end - len("too large"): end] == "too large"


def test_measurement_summary():
    m = Measurement(2, (1.0, 2.0, 3.0), (2.0, 2.0, 2.0), 1000)
    _, report = tiny_report()
    data = report_dict(report, measure=m)["measure"]
    s = data["search_seconds"]
    assert (s["mean"], s["stdev"], s["min"], s["max"]) == (2.0, 1.0, 1.0, 3.0)
    assert data["wall_seconds"]["stdev"] == 0.0 and (data["warmup"], data["runs"]) == (2, 3)
    text = format_measurement(m)
    assert "2 warm-up, 3 timed searches" in text
    assert "mean 2.0000 s, std dev 1.0000 s" in text
    assert "(2000000.0 ns per entry)" in text  # 2 s over 1000 entries


def _parse_dot(text):
    pydot = pytest.importorskip("pydot")
    (dot,) = pydot.graph_from_dot_data(text)
    return dot


def test_dot_nodes_edges_and_labels():
    net, report = tiny_report()
    dot = dot_graph(net, report.configs)
    parsed = _parse_dot(dot.to_string())
    nodes = {n.get_name(): n.get_label() for n in parsed.get_nodes() if n.get_name().startswith("v")}
    assert sorted(nodes) == ["v0", "v1"]
    assert [(e.get_source(), e.get_destination()) for e in parsed.get_edges()] == [("v0", "v1")]
    assert nodes["v0"] == '"fc\\nFC bnk\\n8x4x16\\nconfig (2,1,1): b2"'
    assert nodes["v1"] == '"loss\\nSoftmaxCrossEntropy bn\\n8x4\\nconfig (1,1): unsplit"'


def test_dot_without_configurations_and_with_awkward_names():
    # Quotes, backslashes and a graph name that is no DOT identifier must not break the file.
    net = tiny_network(name="gpt-2 small", fc_name='fc "odd" \\ name')
    text = dot_graph(net).to_string()
    parsed = _parse_dot(text)
    nodes = {n.get_name(): n.get_label() for n in parsed.get_nodes() if n.get_name().startswith("v")}
    assert nodes["v0"] == '"fc \\"odd\\" \\\\ name\\nFC bnk\\n8x4x16"'
    assert "config" not in nodes["v1"]
    if shutil.which("dot"):
        proc = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        # Graphviz drew the name as written: quotes (as SVG entities) and one backslash.
        assert ">fc &quot;odd&quot; \\ name<" in proc.stdout
