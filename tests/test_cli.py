"""End-to-end tests of the command line (``docs/cli.md``), in-process through ``main(argv)``.

Expected figures come from the independent fixtures in ``tests/data/reference`` (optimal
totals, per-vertex structure, costs of given strategies) or from the library called
directly, so the tests check that the CLI wires the stages together and says what they found.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import graphs
import pase.model.layers
from pase import Machine, data_parallel, evaluate
from pase import cli
from pase.cli import ExitStatus, common, main, progress
from cli_runner import run as run_cli
from pase.core.units import format_bytes

# pydot's parser uses pyparsing names that newer pyparsing deprecates: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydot.*")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "data", "reference")


def load_reference(name):
    with open(os.path.join(REFERENCE, name), encoding="utf-8") as f:
        return json.load(f)


def reference_total(graph, procs, batch=128, flops=10, bw=16):
    for case in load_reference("totals.json")["cases"]:
        if (case["graph"], case["procs"], case["batch"], case["flops"], case["bw"]) == (graph, procs, batch, flops, bw):
            return case["total_cost"]
    raise KeyError((graph, procs, batch, flops, bw))


def run(*argv, stderr_tty=False):
    """``main(argv)`` with captured streams: ``(status, stdout, stderr)``."""
    return run_cli(*argv, stderr=_TTY() if stderr_tty else None)


class _TTY(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self):
        return True


def run_json(*argv):
    status, out, err = run(*argv, "--json")
    assert status == 0, err
    return json.loads(out)


def write_json(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------
# The default table


def table_rows(text):
    """The layer rows of the default table: lines between the column header and the totals."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["id", "layer"]) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line)
    return lines[start - 1], rows


def test_default_run_is_alexnet_on_32_devices():
    status, out, err = run()
    assert status == 0 and err == ""
    header = out.splitlines()[:3]
    assert "alexnet" in header[0]
    assert "devices 32" in header[1] and "batch 128" in header[1]
    assert "10 TFLOPS" in header[1] and "16 GB/s" in header[1] and "rho = 5000" in header[1]
    assert "FLOP-equivalents" in header[2]
    # Reference optimum 53136349552.0 (tests/data/reference/totals.json), to 5 digits.
    assert re.search(r"optimal total cost\s+5\.3136e\+10 FLOP-equivalents", out)


def test_table_has_one_aligned_row_per_layer_with_its_configuration():
    status, out, _ = run("-g", "alexnet", "-p", "32")
    assert status == 0
    header, rows = table_rows(out)
    net = graphs.build("alexnet")
    assert len(rows) == len(net.layers) == 14
    for v, row in enumerate(rows):
        cells = row.split()
        assert cells[0] == str(v)
        assert cells[1] == net.names[v]
        assert cells[2] == net.layers[v].op
        assert cells[3] == net.layers[v].dims
        assert cells[4] == "x".join(map(str, net.layers[v].domain))
    # Aligned: every column header starts where its cells start (left-aligned text columns).
    for column in ("layer", "type", "dims", "iteration space", "configuration"):
        at = header.index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows), column
    for title in ("K", "compute", "communication", "edge cost"):  # right-aligned: cells end under the header
        end = header.index(title) + len(title)
        assert all(row[end - 1] != " " and (len(row) == end or row[end] == " ") for row in rows), title


def test_table_configurations_name_the_split_dimensions():
    data = run_json("-g", "alexnet", "-p", "32")
    _, out, _ = run("-g", "alexnet", "-p", "32")
    _, rows = table_rows(out)
    for layer, row in zip(data["layers"], rows):
        split = [f"{d}{c}" for d, c in zip(layer["dims"], layer["config"]) if c != 1]
        assert (" ".join(split) or "unsplit") in row


def test_table_reports_data_parallel_cost_speedup_and_search_statistics():
    status, out, _ = run("-g", "rnnlm", "-p", "8")
    assert status == 0
    net = graphs.build("rnnlm")
    dp = evaluate(net, data_parallel(net, 8), Machine(), 8).total
    best = reference_total("rnnlm", 8)
    assert f"data-parallel cost  {dp:.4e}" in out
    assert f"{dp / best:.3f}x over data parallelism" in out
    search = next(line for line in out.splitlines() if line.startswith("search"))
    assert "GenerateSeq ordering" in search and "largest dependent set 1" in search
    assert re.search(r"[\d,]+ table entries, \d+\.\d+ s \(\d+\.\d ns per entry\)", search)


def test_flops_and_bw_change_the_machine():
    # Reference case: alexnet, p = 24, batch 96, 14 TFLOPS, 12 GB/s.
    data = run_json("-g", "alexnet", "-p", "24", "-b", "96", "--flops", "14", "--bw", "12")
    assert data["flops"] == 14.0 and data["bw"] == 12.0 and data["batch"] == 96
    assert data["total_cost"] == pytest.approx(reference_total("alexnet", 24, 96, 14, 12), rel=1e-9)
    status, out, _ = run("-g", "alexnet", "-p", "24", "-b", "96", "--flops", "14", "--bw", "12")
    # rho = 14e3 GFLOP/s / (12 / 8 Gword/s) = 9333.33 FLOP per word.
    assert status == 0 and "rho = 9333.33" in out


# ---------------------------------------------------------------------------------------
# JSON


def test_json_schema_keys_and_types():
    status, out, err = run("-g", "alexnet", "-p", "32", "--json")
    assert status == 0 and err == ""
    data = json.loads(out)  # exactly one JSON object and nothing else on stdout
    types = {
        "graph": str, "procs": int, "batch": int, "flops": float, "bw": float, "total_cost": float,
        "data_parallel_cost": float, "speedup_over_data_parallel": float, "layers": list, "edges": list,
        "search": dict, "evaluated": bool,
    }
    for key, kind in types.items():
        assert isinstance(data[key], kind), key
    assert data["evaluated"] is False
    assert (data["graph"], data["procs"], data["batch"], data["flops"], data["bw"]) == ("alexnet", 32, 128, 10.0, 16.0)
    layer_types = {"id": int, "name": str, "op": str, "dims": str, "domain": list, "configs": int,
                   "config": list, "cost": float, "edge_cost": float}
    for v, layer in enumerate(data["layers"]):
        for key, kind in layer_types.items():
            assert isinstance(layer[key], kind), (v, key)
        assert layer["id"] == v
        assert len(layer["domain"]) == len(layer["config"]) == len(layer["dims"])
        assert all(isinstance(c, int) for c in layer["config"] + layer["domain"])
    assert all(isinstance(e, list) and len(e) == 2 and all(isinstance(x, int) for x in e) for e in data["edges"])
    assert data["edges"] == sorted(data["edges"])
    search = data["search"]
    assert search["algo"] == "generateseq"
    assert isinstance(search["seconds"], float) and search["seconds"] >= 0
    assert isinstance(search["max_dependent_set"], int) and isinstance(search["table_entries"], int)


@pytest.mark.parametrize("graph,procs", [("alexnet", 32), ("rnnlm", 8), ("inception3", 8)])
def test_json_matches_reference_structure_and_optimum(graph, procs):
    data = run_json("-g", graph, "-p", procs)
    ref = load_reference(os.path.join("graphs", f"{graph}-p{procs}.json"))
    assert [(l["domain"], l["configs"]) for l in data["layers"]] == [(n["domain"], n["configs"]) for n in ref["nodes"]]
    # The fixture names the layer types of docs/cost-model.md; the JSON may name a subtype
    # (Embedding is an Einsum, BatchNorm a Norm).
    for layer, node in zip(data["layers"], ref["nodes"]):
        assert issubclass(getattr(pase.model.layers, layer["op"]), getattr(pase.model.layers, node["op"])), (layer, node)
    assert data["edges"] == sorted(ref["edges"])
    assert data["total_cost"] == pytest.approx(reference_total(graph, procs), rel=1e-9)
    # The per-layer terms add up to the total (each edge counted once, at its consumer).
    terms = sum(l["cost"] + l["edge_cost"] for l in data["layers"])
    assert terms == pytest.approx(data["total_cost"], rel=1e-12)
    assert data["speedup_over_data_parallel"] == pytest.approx(data["data_parallel_cost"] / data["total_cost"])
    assert data["search"]["max_dependent_set"] == (1 if graph in ("alexnet", "rnnlm") else 2)


def test_algo_1_is_breadth_first_with_the_same_optimum():
    data = run_json("-g", "alexnet", "-p", "16", "-a", "1")
    assert data["search"]["algo"] == "breadth-first"
    assert data["total_cost"] == pytest.approx(reference_total("alexnet", 16), rel=1e-9)
    assert run_json("-g", "alexnet", "-p", "16", "--algo", "1")["total_cost"] == data["total_cost"]


def test_model_width_changes_the_rnnlm_and_transformer():
    default = run_json("-g", "rnnlm", "-p", "8")
    narrow = run_json("-g", "rnnlm", "-p", "8", "-m", "1024")
    assert default["model"] == 2048 and narrow["model"] == 1024
    assert narrow["layers"][0]["domain"] == [128, 256, 1024, 100000]  # Embedding bsdv
    assert narrow["total_cost"] < default["total_cost"]
    wide = run_json("-g", "transformer", "-p", "8", "-m", "1024")
    assert wide["model"] == 1024
    assert wide["total_cost"] > reference_total("transformer", 8)
    # The width is in the header of the table as well.
    status, out, _ = run("-g", "transformer", "-p", "4", "-m", "256")
    assert status == 0 and "model width 256" in out.splitlines()[0]


def test_same_json_under_different_hash_seeds():
    def strip_seconds(value):
        if isinstance(value, dict):
            return {k: strip_seconds(v) for k, v in value.items() if "seconds" not in k}
        if isinstance(value, list):
            return [strip_seconds(v) for v in value]
        return value

    outputs = []
    for seed in ("0", "1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "scheduler.py", "-g", "inception3", "-p", "8", "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(strip_seconds(json.loads(proc.stdout)))
    assert outputs[0] == outputs[1] == outputs[2]


# ---------------------------------------------------------------------------------------
# --evaluate


@pytest.mark.parametrize("graph,procs", [("alexnet", 32), ("rnnlm", 8), ("transformer", 4)])
def test_evaluating_the_printed_strategy_gives_back_its_total(tmp_path, graph, procs):
    status, out, _ = run("-g", graph, "-p", procs, "--json")
    assert status == 0
    searched = json.loads(out)
    path = tmp_path / "strategy.json"
    path.write_text(out, encoding="utf-8")
    evaluated = run_json("--evaluate", path, "-g", graph, "-p", procs)
    assert evaluated["evaluated"] is True and evaluated["search"] is None
    assert evaluated["total_cost"] == searched["total_cost"]
    assert [l["config"] for l in evaluated["layers"]] == [l["config"] for l in searched["layers"]]
    assert evaluated["data_parallel_cost"] == searched["data_parallel_cost"]
    # Flags left out are taken from the file, which records graph, procs, batch and machine.
    assert run_json("--evaluate", path)["total_cost"] == searched["total_cost"]


@pytest.mark.parametrize("case", load_reference("strategies.json")["cases"], ids=lambda c: c["graph"])
def test_reference_strategies_evaluate_to_their_total(tmp_path, case):
    path = write_json(tmp_path / "s.json", {"configs": case["configs"]})
    data = run_json("--evaluate", path, "-g", case["graph"], "-p", case["procs"], "-b", case["batch"],
                    "--flops", case["flops"], "--bw", case["bw"])
    assert data["total_cost"] == pytest.approx(case["total_cost"], rel=1e-9)
    assert [l["config"] for l in data["layers"]] == case["configs"]


def test_evaluate_costs_a_strategy_outside_the_enumerated_set(tmp_path):
    net = graphs.build("alexnet")
    strategy = data_parallel(net, 64)
    # The batch split 64 leaves 2 samples per device, under the cut-off of 4: not enumerated.
    enumerated = {tuple(row) for row in net.configs(64)[0].tolist()}
    assert strategy[0] == (64, 1, 1, 1, 1, 1, 1) and strategy[0] not in enumerated
    path = write_json(tmp_path / "dp.json", {"configs": [list(c) for c in strategy]})
    data = run_json("--evaluate", path, "-g", "alexnet", "-p", "64")
    expected = evaluate(net, strategy, Machine(), 64).total
    assert data["total_cost"] == expected
    assert data["data_parallel_cost"] == expected and data["speedup_over_data_parallel"] == 1.0
    # ... and it is more expensive than the optimum on 64 devices.
    assert data["total_cost"] > reference_total("alexnet", 64)


def test_evaluate_reads_layers_in_id_order(tmp_path):
    searched = run_json("-g", "rnnlm", "-p", "8")
    shuffled = dict(searched, layers=list(reversed(searched["layers"])))
    path = write_json(tmp_path / "shuffled.json", shuffled)
    assert run_json("--evaluate", path)["total_cost"] == searched["total_cost"]


def test_evaluate_table_shows_per_layer_costs_and_the_total(tmp_path):
    case = next(c for c in load_reference("strategies.json")["cases"] if c["graph"] == "rnnlm")
    path = write_json(tmp_path / "s.json", {"configs": case["configs"]})
    status, out, err = run("--evaluate", path, "-g", "rnnlm", "-p", case["procs"])
    assert status == 0 and err == ""
    assert "cost of a given strategy" in out.splitlines()[0]
    _, rows = table_rows(out)
    assert len(rows) == 4
    assert f"strategy cost       {case['total_cost']:.4e} FLOP-equivalents" in out


# ---------------------------------------------------------------------------------------
# --sweep


def test_sweep_json_lines_equal_single_runs():
    status, out, err = run("-g", "alexnet", "--sweep", "4,8,16", "--json")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == 3
    for line, procs in zip(lines, (4, 8, 16)):
        data = json.loads(line)
        single = run_json("-g", "alexnet", "-p", procs)
        assert data["procs"] == procs
        assert data["total_cost"] == single["total_cost"] == pytest.approx(reference_total("alexnet", procs), rel=1e-9)
        assert data["data_parallel_cost"] == single["data_parallel_cost"]


def test_sweep_table_has_one_row_per_device_count():
    status, out, _ = run("-g", "rnnlm", "--sweep", "8,4")
    assert status == 0
    lines = out.splitlines()
    assert "rnnlm" in lines[0] and "FLOP-equivalents" in lines[0]
    assert lines[1].split() == ["devices", "optimal", "cost", "data-parallel", "cost", "speedup", "memory", "DP",
                                "memory", "cap", "search", "seconds"]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["8", "4"]
    for row in rows:
        procs = int(row[0])
        single = run_json("-g", "rnnlm", "-p", procs)
        assert row[1] == f"{single['total_cost']:.4e}"
        assert row[2] == f"{single['data_parallel_cost']:.4e}"
        assert row[3] == f"{single['speedup_over_data_parallel']:.3f}x"
        assert " ".join(row[4:6]) == format_bytes(single["memory"]["per_device_bytes"])
        assert " ".join(row[6:8]) == format_bytes(single["memory"]["data_parallel_per_device_bytes"])
        assert row[8] == "-"  # no --memory cap
        float(row[9])


def test_sweep_marks_device_counts_whose_search_is_too_large():
    # 1 KB is enough for the tables of nothing but the smallest search.
    status, out, err = run("-g", "alexnet", "--sweep", "1,64", "--table-budget", "0.000001")
    assert status == ExitStatus.TOO_LARGE
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "64"]
    assert rows[1][1:3] == ["too", "large"]
    assert err.count("\n") == 1 and "p=64" in err and "Traceback" not in err


def test_sweep_shows_a_progress_bar_on_a_terminal():
    status, _, err = run("-g", "alexnet", "--sweep", "4,8", stderr_tty=True)
    assert status == 0 and "alexnet sweep" in err and "/2" in err


# ---------------------------------------------------------------------------------------
# DOT


def parse_dot(path):
    pydot = pytest.importorskip("pydot")
    (dot,) = pydot.graph_from_dot_file(str(path))
    nodes = {n.get_name(): n.get_label().strip('"') for n in dot.get_nodes() if n.get_name().startswith("v")}
    edges = [(e.get_source(), e.get_destination()) for e in dot.get_edges()]
    return nodes, edges


def test_dump_graph_writes_graph_dot_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = run("-g", "alexnet", "-p", "32", "-d")
    assert status == 0 and "graph.dot" in out
    data = run_json("-g", "alexnet", "-p", "32")
    nodes, edges = parse_dot(tmp_path / "graph.dot")
    net = graphs.build("alexnet")
    assert sorted(nodes) == sorted(f"v{v}" for v in range(len(net.layers)))
    assert sorted(edges) == sorted((f"v{u}", f"v{v}") for u, v in net.edges)
    for layer in data["layers"]:
        label = nodes[f"v{layer['id']}"]
        assert layer["name"] in label and layer["op"] in label
        assert "x".join(map(str, layer["domain"])) in label
        assert "(" + ",".join(map(str, layer["config"])) + ")" in label


def test_dot_path_and_json_keep_stdout_clean(tmp_path):
    target = tmp_path / "sub.dot"
    status, out, err = run("-g", "inception3", "-p", "8", "--dot-path", target, "--json")
    assert status == 0 and err == ""
    data = json.loads(out)
    nodes, edges = parse_dot(target)
    assert len(nodes) == len(data["layers"]) == 219
    assert sorted(edges) == sorted((f"v{u}", f"v{v}") for u, v in data["edges"])
    for layer in data["layers"]:
        assert layer["name"] in nodes[f"v{layer['id']}"]


def test_dot_renders_with_graphviz(tmp_path):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz dot is not installed")
    target = tmp_path / "g.dot"
    assert run("-g", "transformer", "-p", "4", "--dot-path", target)[0] == 0
    proc = subprocess.run(["dot", "-Tsvg", str(target)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in proc.stdout and "enc1.attn.qkv" in proc.stdout


def test_dot_of_an_evaluated_strategy_shows_its_configurations(tmp_path):
    case = next(c for c in load_reference("strategies.json")["cases"] if c["graph"] == "alexnet")
    path = write_json(tmp_path / "s.json", {"configs": case["configs"]})
    target = tmp_path / "e.dot"
    assert run("--evaluate", path, "-p", case["procs"], "--dot-path", target)[0] == 0
    nodes, _ = parse_dot(target)
    for v, config in enumerate(case["configs"]):
        assert "(" + ",".join(map(str, config)) + ")" in nodes[f"v{v}"]


# ---------------------------------------------------------------------------------------
# --profile, --measure, progress, --table-budget


def test_profile_prints_the_hottest_functions_after_the_result():
    status, out, err = run("-g", "rnnlm", "-p", "8", "--profile")
    assert status == 0 and err == ""
    result_end = out.index("optimal total cost")
    profile_at = out.index("profile")
    assert profile_at > result_end
    assert "tottime" in out[profile_at:] and "pase/" in out[profile_at:]


def test_profile_goes_to_stderr_with_json():
    status, out, err = run("-g", "rnnlm", "-p", "8", "--profile", "--json")
    assert status == 0
    json.loads(out)
    assert "tottime" in err


def test_measure_reports_mean_and_spread_of_five_timed_searches():
    status, out, _ = run("-g", "rnnlm", "-p", "8", "--measure")
    assert status == 0
    section = out[out.index("measurement"):]
    assert "2 warm-up, 5 timed searches" in section
    assert re.search(r"mean \d+\.\d+ s, std dev \d+\.\d+ s, min \d+\.\d+ s, max \d+\.\d+ s", section)
    data = run_json("-g", "rnnlm", "-p", "8", "--measure")
    m = data["measure"]
    assert m["warmup"] == 2 and m["runs"] == 5
    for key in ("search_seconds", "wall_seconds"):
        s = m[key]
        assert 0 <= s["min"] <= s["mean"] <= s["max"] and s["stdev"] >= 0


def test_progress_bar_only_on_a_terminal_or_when_asked(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_DELAY", 0)  # show the bar even for a short search
    assert run("-g", "resnet101", "-p", "8")[2] == ""  # not a terminal: quiet
    err = run("-g", "resnet101", "-p", "8", "--progress")[2]
    assert "resnet101 p=8" in err and "entry" in err
    err = run("-g", "resnet101", "-p", "8", stderr_tty=True)[2]
    assert "resnet101 p=8" in err
    assert run("-g", "resnet101", "-p", "8", "--no-progress", stderr_tty=True)[2] == ""


def test_table_budget_is_passed_to_the_search():
    # 1 GB is plenty for InceptionV3 on 8 devices (a few MB of tables) ...
    assert run_json("-g", "inception3", "-p", "8", "--table-budget", "1")["total_cost"] == pytest.approx(
        reference_total("inception3", 8), rel=1e-9)
    # ... and 1 GB is far from the ~23 GB of breadth-first tables of ResNet-101 on 8 devices
    # (dependent sets of up to 7 vertices), while its cost tables take under 1 MB.
    status, out, err = run("-g", "resnet101", "-p", "8", "--algo", "1", "--table-budget", "1")
    assert status == ExitStatus.TOO_LARGE and out == ""
    assert err.count("\n") == 1 and "search is too large" in err and "table entries" in err
    assert "budget of 1 GB" in err


def test_breadth_first_inception_is_refused_with_the_estimate():
    status, out, err = run("--algo", "1", "-g", "inception3")
    assert status == ExitStatus.TOO_LARGE and out == ""
    assert err.startswith("pase: error: the breadth-first search is too large")
    assert "largest dependent set" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------
# Bad input: one line on stderr, non-zero exit, no traceback


BAD_COMMAND_LINES = [
    ["-g", "vgg16"],
    ["-p", "0"],
    ["-p", "-4"],
    ["-p", "2.5"],
    ["-p", "many"],
    ["-b", "0"],
    ["-b", "1e3"],
    ["-b", "99999999999999999999"],
    ["--flops", "0"],
    ["--flops", "-1"],
    ["--bw", "0"],
    ["--bw", "inf"],
    ["--bw", "fast"],
    ["--bw", "1e-300"],  # rho would overflow
    ["--flops", "1e300"],
    ["-g", "alexnet", "-m", "512"],
    ["-g", "resnet101", "-m", "64"],
    ["-g", "transformer", "-m", "100"],  # not a multiple of the 8 heads
    ["-g", "rnnlm", "-m", "0"],
    ["--algo", "2"],
    ["--sweep", ""],
    ["--sweep", "4,,8"],
    ["--sweep", "4;8"],
    ["--sweep", "4,eight"],
    ["--sweep", "0,4"],
    ["--sweep", "4,8,4"],
    ["--sweep", "4,8", "-p", "16"],
    ["--sweep", "4,8", "--measure"],
    ["--table-budget", "0"],
    ["--table-budget", "-3"],
    ["--no-such-flag"],
    ["-p"],
    ["--dot-path", ""],
]


@pytest.mark.parametrize("argv", BAD_COMMAND_LINES, ids=" ".join)
def test_bad_command_lines_are_one_line_usage_errors(argv):
    status, out, err = run(*argv)
    assert status == ExitStatus.USAGE
    assert out == ""
    assert err.startswith("pase: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_graph_error_lists_the_graphs():
    err = run("-g", "vgg16")[2]
    assert all(name in err for name in graphs.GRAPHS)


@pytest.mark.parametrize("where", ["missing-dir", "directory"])
def test_unwritable_dot_path_is_refused_before_the_search(tmp_path, where):
    target = tmp_path / "no" / "such" / "g.dot" if where == "missing-dir" else tmp_path
    status, out, err = run("-g", "alexnet", "--dot-path", target)
    assert status == ExitStatus.INPUT and out == ""
    assert err.startswith("pase: error: cannot write the DOT graph") and err.count("\n") == 1


def _reference_alexnet_configs():
    case = next(c for c in load_reference("strategies.json")["cases"] if c["graph"] == "alexnet")
    return case["configs"], case["procs"]


def _bad_strategy_files():
    configs, _ = _reference_alexnet_configs()
    wrong_rank = [list(c) for c in configs]
    wrong_rank[3] = wrong_rank[3] + [1]
    not_dividing = [list(c) for c in configs]
    not_dividing[0] = [3, 1, 1, 1, 1, 1, 1]  # 3 does not divide the batch 128
    too_many = [list(c) for c in configs]
    too_many[0] = [32, 1, 1, 1, 1, 1, 1]  # 32 devices with -p 16
    not_ints = [list(c) for c in configs]
    not_ints[2] = ["2", 1, 1, 1, 1, 1, 1]
    layers = [{"id": v, "config": c} for v, c in enumerate(configs)]
    return {
        "invalid-json": "{\"configs\": [[1, 2]",
        "not-an-object": "[[1, 1]]",
        "no-keys": json.dumps({"strategy": configs}),
        "configs-not-list": json.dumps({"configs": 7}),
        "wrong-length": json.dumps({"configs": configs[:-1]}),
        "wrong-rank": json.dumps({"configs": wrong_rank}),
        "not-dividing": json.dumps({"configs": not_dividing}),
        "exceeds-p": json.dumps({"configs": too_many}),
        "not-integers": json.dumps({"configs": not_ints}),
        "config-not-list": json.dumps({"configs": [5] + configs[1:]}),
        "layer-without-config": json.dumps({"layers": [{"id": 0}] + layers[1:]}),
        "duplicate-ids": json.dumps({"layers": [dict(l, id=0) for l in layers]}),
        "unknown-graph": json.dumps({"graph": "vgg16", "configs": configs}),
        "bad-procs": json.dumps({"procs": 0, "configs": configs}),
        "empty": "",
        "binary": b"\xff\xfe\x00garbage",
    }


@pytest.mark.parametrize("name", sorted(_bad_strategy_files()))
def test_bad_strategy_files_are_rejected_clearly(tmp_path, name):
    content = _bad_strategy_files()[name]
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    status, out, err = run("--evaluate", path, "-g", "alexnet", "-p", "16")
    assert status == ExitStatus.INPUT
    assert out == ""
    assert err.startswith("pase: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err


def test_bad_strategy_messages_say_what_is_wrong(tmp_path):
    files = _bad_strategy_files()

    def message(name):
        path = tmp_path / f"{name}.json"
        path.write_text(files[name], encoding="utf-8")
        return run("--evaluate", path, "-g", "alexnet", "-p", "16")[2]

    assert "14 layers" in message("wrong-length")
    assert "layer 3 (pool2" in message("wrong-rank")
    assert "does not divide" in message("not-dividing")
    assert "needs 32 devices, more than p = 16" in message("exceeds-p")
    assert "not valid JSON" in message("invalid-json")
    assert 'neither "configs" nor "layers"' in message("no-keys")


def test_missing_strategy_file(tmp_path):
    status, out, err = run("--evaluate", tmp_path / "nope.json")
    assert status == ExitStatus.INPUT and out == ""
    assert "cannot read strategy file" in err and err.count("\n") == 1


def test_evaluate_with_sweep_or_measure_is_a_usage_error(tmp_path):
    configs, _ = _reference_alexnet_configs()
    path = write_json(tmp_path / "s.json", {"configs": configs})
    for extra in (["--sweep", "4,8"], ["--measure"]):
        status, _, err = run("--evaluate", path, *extra)
        assert status == ExitStatus.USAGE and err.count("\n") == 1


def test_the_cost_tables_of_a_huge_device_count_are_refused_before_allocating():
    # 1e6 devices: up to 27545 configurations per Transformer layer, so the edge matrices
    # alone would need tens of GB (K_u x K_v float64 entries per edge).
    # (No layer uses all 10^6 devices: --allow-replication reaches the tables' refusal.)
    status, out, err = run("-g", "transformer", "-p", "1000000", "--table-budget", "1", "--allow-replication")
    assert status == ExitStatus.TOO_LARGE and out == ""
    assert "cost tables of transformer on 1000000 devices are too large" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------
# Help, entry points


def test_help_lists_every_flag_graph_and_exit_status():
    status, out, err = run("--help")
    assert status == 0 and err == ""
    for flag in ("-p", "--procs", "-b", "--batch", "-m", "--model", "-g", "--graph", "--flops", "--bw",
                 "--profile", "--measure", "-d", "--dump-graph", "-a", "--algo", "--json", "--sweep",
                 "--evaluate", "--dot-path", "--table-budget", "--progress"):
        assert re.search(rf"(^|[\s\[,]){re.escape(flag)}\b", out), flag
    for name in graphs.GRAPHS:
        assert name in out
    assert "exit status" in out and "FLOP-equivalents" in out
    # -m says what it sets for each graph that has a width.
    text = " ".join(out.split())
    assert "rnnlm: embedding width" in text and "transformer: model width" in text


def test_version():
    status, out, _ = run("--version")
    assert status == 0 and out.startswith("pase ")


def test_main_returns_instead_of_exiting():
    # --help and errors both come back as statuses: no SystemExit escapes.
    assert main(["--help"], stdout=io.StringIO(), stderr=io.StringIO()) == 0
    assert main(["-p", "0"], stdout=io.StringIO(), stderr=io.StringIO()) == 2


def test_main_writes_to_sys_streams_at_call_time(capsys):
    assert main(["-g", "rnnlm", "-p", "4", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["graph"] == "rnnlm" and captured.err == ""


def test_scheduler_py_runs_as_a_script():
    proc = subprocess.run(
        [sys.executable, "scheduler.py", "-g", "rnnlm", "-p", "8"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "rnnlm" in proc.stdout.splitlines()[0]
    assert f"optimal total cost  {reference_total('rnnlm', 8):.4e}" in proc.stdout


def test_scheduler_py_error_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "scheduler.py", "-g", "rnnlm", "-p", "0"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_internal_errors_are_one_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(common, "plan", broken)
    monkeypatch.delenv("PASE_TRACEBACK", raising=False)
    status, out, err = run("-g", "alexnet")
    assert status == ExitStatus.INTERNAL and out == ""
    assert err.count("\n") == 1 and "simulated bug" in err and "Traceback" not in err
