"""Defects found by fuzzing the file inputs and output paths (``benchmarks/fuzz_inputs.py``).

One test (or a few) per defect, each written to fail on the code before its fix. They go
through the command line in-process, as the fuzz driver does, and check the rules it
checks: the exit status, one ``pase: error:`` line, files left intact.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys

import pytest

from cli_runner import run


def one_error(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("pase: error: ")


def mini_graph(batch: int = 8) -> dict:
    """A graph file of an FC layer (16 -> 4) and its loss."""
    return {
        "format": "pase-graph", "version": 1, "name": "mini", "cutoff": 1, "batch": batch,
        "inputs": [{"name": "x", "shape": [batch, 16], "letters": "bk", "param": False}],
        "layers": [{"name": "fc", "op": "FC", "inputs": ["x"], "args": {"units": 4}},
                   {"name": "loss", "op": "SoftmaxCrossEntropy", "inputs": ["fc"], "args": {}}],
    }


@pytest.fixture
def mini(tmp_path):
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(mini_graph()))
    return path


def device(path, major: int, minor: int):
    """A character device like /dev/full (1, 7) or /dev/null (1, 3), or skip where mknod is refused."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except (OSError, AttributeError) as err:
        pytest.skip(f"cannot create a device node here: {err}")
    return path


# 1. Output paths: symlinks and devices are written through, never replaced -------------------

@pytest.mark.parametrize("flag", ["--dot-path", "--export-graph", "--export-jax"])
def test_an_output_on_a_full_device_fails_and_the_device_stays(tmp_path, mini, flag):
    # Before: the device node was replaced by a regular file holding the output, exit 0.
    full = device(tmp_path / "full", 1, 7)
    status, out, err = run("-g", mini, "-p", "4", flag, full)
    assert status == 1 and out == "" and one_error(err) and "No space left" in err
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_an_output_on_a_null_device_succeeds_and_the_device_stays(tmp_path, mini):
    null = device(tmp_path / "null", 1, 3)
    status, out, err = run("-g", mini, "-p", "4", "--dot-path", null)
    assert status == 0 and err == ""
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_an_output_through_a_symlink_writes_the_file_it_names(tmp_path, mini):
    # Before: the link was replaced by a new file and the file it named kept its old contents.
    real = tmp_path / "real.json"
    real.write_text("old\n")
    (tmp_path / "link.json").symlink_to("real.json")
    status, out, err = run("-g", mini, "-p", "4", "--export-graph", tmp_path / "link.json")
    assert status == 0, err
    assert os.path.islink(tmp_path / "link.json")
    assert json.loads(real.read_text())["name"] == "mini"


def test_an_output_through_a_dangling_symlink_creates_its_target(tmp_path, mini):
    (tmp_path / "link.dot").symlink_to("made.dot")
    status, out, err = run("-g", mini, "-p", "4", "--dot-path", tmp_path / "link.dot")
    assert status == 0, err
    assert os.path.islink(tmp_path / "link.dot") and (tmp_path / "made.dot").read_text().startswith("digraph")


def test_an_output_on_a_symlink_loop_is_refused(tmp_path, mini):
    # Before: the loop was replaced by a regular file, exit 0.
    (tmp_path / "loop.dot").symlink_to("loop.dot")
    status, out, err = run("-g", mini, "-p", "4", "--dot-path", tmp_path / "loop.dot")
    assert status == 1 and one_error(err) and "symbolic links" in err
    assert os.path.islink(tmp_path / "loop.dot")


@pytest.mark.parametrize("flag", ["--dot-path", "--export-graph", "--evaluate", "-g"])
def test_a_path_with_a_nul_byte_is_one_error_line(tmp_path, mini, flag):
    # Before: "internal error: ValueError: embedded null byte" (exit 70) for the outputs and --evaluate.
    argv = ["-g", "x\0.json"] if flag == "-g" else ["-g", mini, "-p", "4", flag, "out\0.json"]
    status, out, err = run(*argv)
    assert status in (1, 2) and one_error(err) and "NUL byte" in err


# 2. Graph files: a field the format does not have is refused, not ignored ----------------------

@pytest.mark.parametrize("where, change", [
    ("top level", lambda g: g.update(comment="hi")),
    ("input", lambda g: g["inputs"][0].update(params=True)),  # 'params' for 'param': the weight was not counted
    ("layer", lambda g: g["layers"][0].update(arg={"units": 8})),  # 'arg' for 'args'
])
def test_an_unknown_graph_file_field_is_refused(tmp_path, where, change):
    # Before: exit 0, the misspelt field silently ignored (a weight counted as an activation,
    # the layer built with default arguments).
    graph = mini_graph()
    change(graph)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph))
    status, out, err = run("-g", path, "-p", "4")
    assert status == 1 and out == "" and one_error(err) and "unknown field" in err


# 3. Huge dimensions in a graph file: refused or handled at once, never a hang or a crash ---------
# Before the fix, the tests marked "hang" did not finish: enumerating the divisors of a
# dimension took sqrt(size) steps (2**31 of them for 2**62).

def graph_file(tmp_path, graph) -> str:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph))
    return str(path)


def test_allowed_splits_of_huge_sizes():  # hang
    from pase.planning.baselines import largest_divisor
    from pase.model.configs import allowed_splits

    # 2**60: its divisors up to 64 are the powers of two; 2**61 - 1 is a (Mersenne) prime.
    assert allowed_splits(2**60, 64, 1) == [1, 2, 4, 8, 16, 32, 64]
    assert allowed_splits(2**61 - 1, 1000, 1) == [1]
    # 3 * 2**60 with cutoff 2**60: e <= 3 * 2**60 // 2**60 = 3, and 1, 2, 3 divide it.
    assert allowed_splits(3 * 2**60, 64, 2**60) == [1, 2, 3]
    # 10**30 = 2**30 5**30: its divisors up to 20 are 1, 2, 4, 5, 8, 10, 16, 20.
    assert allowed_splits(10**30, 20, 1) == [1, 2, 4, 5, 8, 10, 16, 20]
    assert largest_divisor(2**60, 48) == 32  # data parallelism's split of a 2**60 batch on 48 devices


def test_allowed_splits_is_the_divisors_up_to_p_with_the_cutoff():
    from pase.model.configs import allowed_splits

    # Brute force: every e in 1..procs that divides size and leaves at least cutoff per part.
    for size in range(1, 130):
        for procs in (1, 2, 7, 32, 200):
            for cutoff in (1, 3, 16):
                expected = [e for e in range(1, procs + 1) if size % e == 0 and size // e >= cutoff] or [1]
                assert allowed_splits(size, procs, cutoff) == expected, (size, procs, cutoff)


def test_a_batch_dimension_of_2_53_plans(tmp_path):  # hang
    graph = mini_graph()
    graph["batch"] = None
    graph["inputs"][0]["shape"][0] = 2**53
    status, out, err = run("-g", graph_file(tmp_path, graph), "-p", "4", "--json")
    assert status == 0, err
    assert json.loads(out)["layers"][0]["domain"][0] == 2**53


@pytest.mark.parametrize("where, value", [("input", 2**53 + 1), ("input", 10**400), ("units", 2**62),
                                          ("units", 10**30), ("pw", 10**20)])
def test_a_dimension_over_2_53_is_refused(tmp_path, where, value):  # hang (pw: exit 0, costs scaled by 1e20)
    graph = mini_graph()
    graph["batch"] = None
    if where == "input":
        graph["inputs"][0]["shape"][0] = value
    else:
        graph["layers"][0]["args"][where] = value
    status, out, err = run("-g", graph_file(tmp_path, graph), "-p", "4")
    assert status == 1 and out == "" and one_error(err) and "largest supported, 2**53" in err


def test_an_iteration_space_of_more_than_2_200_elements_is_refused(tmp_path):
    # Before: "internal error: OverflowError: int too large to convert to float" (exit 70).
    graph = mini_graph()
    graph["batch"] = None
    graph["inputs"][0].update(shape=[2**40] * 30, letters="")  # 2**1200 elements
    graph["layers"] = [{"name": "sq", "op": "Elementwise", "inputs": ["x", "x"], "args": {}}]
    status, out, err = run("-g", graph_file(tmp_path, graph), "-p", "4")
    assert status == 1 and one_error(err) and "2**200" in err


def test_an_unstack_into_millions_of_outputs_is_refused(tmp_path):
    # Before: 2**40 outputs ran out of memory (exit 3); 10**7 took minutes and gigabytes.
    graph = mini_graph()
    graph["batch"] = None
    graph["inputs"][0]["shape"] = [2**40, 4]
    graph["layers"] = [{"name": "parts", "op": "Unstack", "inputs": ["x"], "args": {"axis": 0, "batch_dim": 1}}]
    status, out, err = run("-g", graph_file(tmp_path, graph), "-p", "4")
    assert status == 1 and one_error(err) and "at most 65536 outputs" in err


# 4. Layer arguments of the wrong type are refused, not read as "the default" ---------------------

@pytest.mark.parametrize("layer, value", [("fc", False), ("fc", 0), ("fc", []), ("emb", False), ("emb", 0)])
def test_letters_that_are_not_a_string_are_refused(tmp_path, layer, value):
    # Before: FC and Embedding took a false-y letters (false, 0, []) as "no letters given", exit 0.
    graph = mini_graph()
    if layer == "emb":
        graph["inputs"] = [{"name": "ids", "shape": [8, 6], "letters": "bl"}]
        graph["layers"] = [{"name": "emb", "op": "Embedding", "inputs": ["ids"],
                            "args": {"vocab": 16, "width": 4, "letters": value}}]
    else:
        graph["layers"][0]["args"]["letters"] = value
    status, out, err = run("-g", graph_file(tmp_path, graph), "-p", "4")
    assert status == 1 and one_error(err) and "letters must be a string" in err


# 5. Machine files: values that make costs overflow are refused ------------------------------------

def machine_description(**changes) -> dict:
    from pase.machines.calibrated import PRESETS

    description = {k: v for k, v in PRESETS["h100-sxm"].items() if k not in ("measured", "memory_gib")}
    description["name"] = "box"
    description["memory_gb"] = 80  # the decimal field, which these cases vary
    for key, value in changes.items():
        if "." in key:
            link, sub = key.split(".")
            description[link] = dict(description[link], **{sub: value})
        else:
            description[key] = value
    return description


@pytest.mark.parametrize("field, value, message", [
    ("memory_gb", 1e300, "memory_gb must be at most 1e+09"),  # 1e300 GB overflowed to inf bytes: --json crashed
    ("peak_tflops", 5e-324, "peak_tflops must be at least 1e-06"),  # GEMM seconds overflowed
    ("hbm_gbps", 1e-300, "hbm_gbps must be at least 1e-06"),
    ("intra_node.gbps", 5e-324, "intra_node.gbps must be at least 1e-06"),
    ("inter_node.latency_us", 1e300, "inter_node.latency_us must be at most 1e+09"),
    ("act_bytes", 1e300, "act_bytes must be at most 1e+06"),
    ("devices_per_node", 10**30, "devices_per_node must be at most 1048576"),  # OverflowError: exit 70
])
def test_machine_values_out_of_range_are_refused(tmp_path, mini, field, value, message):
    from pase.machines.calibrated import validate_description

    description = machine_description(**{field: value})
    with pytest.raises(ValueError, match="^" + re.escape(f"machine file m.json: {message}")):
        validate_description(description, "machine file m.json")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(description))
    status, out, err = run("-g", mini, "-p", "8", "--machine", path, "--json")
    assert status == 2 and out == "" and one_error(err) and message in err


def test_machine_values_at_the_ends_of_the_range_give_finite_costs(tmp_path, mini):
    # The smallest rates, the largest latencies and element sizes: slow, but finite.
    description = machine_description(memory_gb=1e9, peak_tflops=1e-6, hbm_gbps=1e-6, act_bytes=1e6, grad_bytes=1e6,
                                      **{"intra_node.gbps": 1e-6, "inter_node.gbps": 1e-6,
                                         "intra_node.latency_us": 1e9, "inter_node.latency_us": 1e9})
    path = tmp_path / "m.json"
    path.write_text(json.dumps(description))
    status, out, err = run("-g", mini, "-p", "16", "--machine", path, "--json", "--per-layer")
    assert status == 0, err
    report = json.loads(out)
    assert 0 < report["total_cost"] < 1e300 and 0 < report["data_parallel_cost"] < 1e300


# 6. A machine file that cannot be read or is invalid is a bad --machine value: exit 2 (issue 11) --

@pytest.mark.parametrize("what", ["missing", "not JSON", "a missing field", "an unknown field", "a directory",
                                  "a missing table", "a malformed table"])
def test_a_bad_machine_file_is_one_line_and_exit_2(tmp_path, mini, what):
    # Issue 11: a bad machine file is one clear line and exit 2, whatever is wrong with it.
    path = tmp_path / "m.json"
    description = machine_description()
    if what == "not JSON":
        path.write_text("{")
    elif what == "a missing field":
        del description["memory_gb"]
    elif what == "an unknown field":
        description["gpus"] = 8
    elif what == "a directory":
        path.mkdir()
    elif what == "a missing table":
        description["measured"] = "gone.json"
    elif what == "a malformed table":
        description["measured"] = "t.json"
        (tmp_path / "t.json").write_text('{"gemm": [[1, 1, 1, 1, -1]]}')
    if what not in ("missing", "not JSON", "a directory"):
        path.write_text(json.dumps(description))
    status, out, err = run("-g", mini, "-p", "8", "--machine", path)
    assert status == 2 and out == "" and one_error(err) and ("m.json" in err or "t.json" in err)


@pytest.mark.parametrize("argv", [["--machine", "h200"], ["--machine", "h100-sxm", "-p", "12"],
                                  ["--machine", "h100-sxm", "--flops", "5"]])
def test_a_bad_machine_flag_is_still_exit_2(mini, argv):
    status, out, err = run("-g", mini, "-p", "8", *argv)
    assert status == 2 and one_error(err)


# 7. Measured tables: hostile sizes, grids and op names ---------------------------------------------

def small_table() -> dict:
    """A full 2 x 2 x 2 x 2 GEMM grid and two sizes of 'add'."""
    return {"gemm": [[b, m, n, k, 1e-6 * b * (1 + m * n * k / 64)] for b in (1, 8) for m in (1, 64)
                     for n in (1, 64) for k in (1, 64)],
            "memory_bound": [["add", 1024, 2e-6], ["add", 1 << 20, 5e-5]]}


def run_with_table(tmp_path, mini, table):
    (tmp_path / "t.json").write_text(json.dumps(table))
    path = tmp_path / "m.json"
    path.write_text(json.dumps(machine_description(measured="t.json")))
    return run("-g", mini, "-p", "8", "--machine", path)


@pytest.mark.parametrize("change, message", [
    # 10**400 was an OverflowError converting it to float: exit 70.
    (lambda t: t["gemm"].append([2, 1, 1, 10**400, 1e-6]), "B, M, N, K must be positive integers up to 2**53"),
    (lambda t: t["memory_bound"].append(["add", 2**64, 1e-3]), "elements must be a positive integer up to 2**53"),
    # 1e300 seconds: extrapolated past the grid, costs overflowed to infinity.
    (lambda t: t["gemm"].__setitem__(0, t["gemm"][0][:4] + [1e300]), "seconds must be a positive number up to 1e+06"),
    # A misspelt op joined the ops whose best rate prices the unmeasured kinds (exit 0).
    (lambda t: t["memory_bound"].extend([["gelu ", 1024, 1e-9], ["gelu ", 2048, 2e-9]]), "unknown op 'gelu '"),
])
def test_hostile_table_values_are_refused(tmp_path, mini, change, message):
    table = small_table()
    change(table)
    status, out, err = run_with_table(tmp_path, mini, table)
    assert status == 2 and out == "" and one_error(err) and message in err


def test_a_table_spanning_a_huge_sparse_grid_is_refused(tmp_path, mini):
    # 40 rows on the diagonal span a 40**4 = 2,560,000-shape grid whose holes were filled one
    # pass at a time: minutes. Now refused: more than 2**17 shapes, and 64000 per row.
    table = {"gemm": [[i + 1, i + 1, i + 1, i + 1, 1e-6 * (i + 1)] for i in range(40)]}
    status, out, err = run_with_table(tmp_path, mini, table)
    assert status == 2 and one_error(err) and "grid of 2560000 shapes" in err


def test_grids_like_the_calibrated_ones_are_accepted():
    from pase.machines.calibration import gemm_grid
    from pase.machines.measured import MeasuredTables

    # pase calibrate --quick: 762 rows spanning 3 x 11 x 11 x 11 = 3993 shapes (5.2 per row).
    rows = [[b, m, n, k, 1e-6 * b * (1 + m * n * k / 1e6)] for b, m, n, k in gemm_grid(quick=True)]
    assert len(MeasuredTables(rows).to_dict()["gemm"]) == 762
    # A small sparse table stays allowed: 3 rows on a 4 x 4 x 4 x 4 = 256-shape grid.
    sparse = [[1, 1, 1, 1, 1e-6], [2, 2, 2, 2, 2e-6], [4, 8, 8, 8, 9e-6], [3, 1, 2, 4, 3e-6]]
    assert len(MeasuredTables(sparse).to_dict()["gemm"]) == 4


# 8. --evaluate: plans of graph files, and plans priced on machines from files ---------------------

def plan_of(*argv, cwd=None) -> dict:
    status, out, err = run(*argv, "--json", cwd=cwd)
    assert status == 0, err
    return json.loads(out)


def test_the_plan_of_a_graph_file_evaluates_with_that_file(tmp_path, mini):
    # Before: "invalid 'graph': \"mini\"" (exit 1) even with -g naming the graph file.
    found = plan_of("-g", mini, "-p", "4")
    (tmp_path / "plan.json").write_text(json.dumps(found))
    again = plan_of("--evaluate", tmp_path / "plan.json", "-g", mini)
    assert again["total_cost"] == found["total_cost"] and again["evaluated"] is True
    status, out, err = run("--evaluate", tmp_path / "plan.json")
    assert status == 2 and one_error(err) and "records graph 'mini', which is not a built-in graph" in err
    status, out, err = run("--evaluate", tmp_path / "plan.json", "-g", "alexnet")  # a built-in: not its graph
    assert status == 1 and one_error(err) and "invalid 'graph'" in err


def test_a_plan_priced_on_a_machine_file_needs_that_file_again(tmp_path):
    # Before: without --machine, the plan of machine file box.json was priced on the paper
    # machine, and the plan of a file machine named "h100-sxm" (no table) on the h100-sxm
    # preset (its measured table): exit 0, another machine's costs, no word about it.
    for name in ("box", "h100-sxm"):
        (tmp_path / f"{name}.json").write_text(json.dumps(machine_description(name=name)))
        found = plan_of("-g", "alexnet", "-b", "8", "-p", "8", "--machine", f"{name}.json", "--per-layer", cwd=tmp_path)
        (tmp_path / "plan.json").write_text(json.dumps(found))
        status, out, err = run("--evaluate", "plan.json", cwd=tmp_path)
        assert status == 2 and out == "" and one_error(err)
        assert f"priced on machine '{name}' from a machine file" in err
        again = plan_of("--evaluate", "plan.json", "--machine", f"{name}.json", cwd=tmp_path)
        assert again["total_cost"] == pytest.approx(found["total_cost"], rel=1e-12)


def test_a_plan_priced_on_a_preset_still_evaluates_on_it():
    found = plan_of("-g", "alexnet", "-b", "8", "-p", "8", "--machine", "h100-sxm", "--per-layer")
    status, out, err = run("--evaluate", "-", "--json", stdin=json.dumps(found))
    assert status == 0, err
    assert json.loads(out)["total_cost"] == pytest.approx(found["total_cost"], rel=1e-12)


# 9. Model factories: sys.exit() in the user's code does not end the tool ----------------------

@pytest.mark.parametrize("source, spec", [
    ("import sys\ndef build(batch):\n    sys.exit(0)\n", "f.py:build"),  # exit 0, nothing printed
    ("import sys\nsys.exit(3)\n", "f.py:build"),  # at import: exit 3, nothing printed
    ("import sys\ndef build(batch):\n    sys.exit('bye')\n", "f.py:build"),  # 'bye' printed, exit 1
    ("def build(batch):\n    raise GeneratorExit\n", "f.py:build"),
    ("", "sys:exit"),  # sys.exit(batch): exit 8
])
def test_a_factory_that_exits_is_one_error_line(tmp_path, source, spec):
    # Before: SystemExit escaped main(), so the process ended with the factory's status
    # and nothing (or the factory's text) on stderr; in-process, main() raised.
    (tmp_path / "f.py").write_text(source)
    status, out, err = run("-g", f"torch:{spec}", "-b", "8", "-p", "4", cwd=tmp_path)
    assert status == 2 and out == "" and one_error(err)
    assert ("sys.exit" in err) or ("GeneratorExit" in err)


def test_a_factory_that_is_interrupted_still_stops_the_tool(tmp_path):
    (tmp_path / "f.py").write_text("def build(batch):\n    raise KeyboardInterrupt\n")
    status, out, err = run("-g", "torch:f.py:build", "-p", "4", cwd=tmp_path)
    assert status == 130 and err == "pase: interrupted\n"


def test_a_model_whose_forward_exits_is_one_error_line(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "f.py").write_text(
        "import sys\nimport torch\n"
        "class Exits(torch.nn.Module):\n    def forward(self, x):\n        sys.exit(4)\n"
        "def build(batch):\n    return Exits(), (torch.randn(batch, 4),)\n")
    status, out, err = run("-g", "torch:f.py:build", "-b", "8", "-p", "4", cwd=tmp_path)
    assert status == 2 and one_error(err) and "could not trace build: called sys.exit(4)" in err


def test_a_model_torch_cannot_trace_prints_no_traceback(tmp_path, capfd):
    # Before: torch logged "failed while attempting to run meta for aten.mm.default" and a
    # 20-line traceback on stderr, before the tool's own one error line.
    pytest.importorskip("torch")
    (tmp_path / "f.py").write_text(
        "import torch\ndef build(batch):\n    return torch.nn.Linear(4, 4), (torch.randn(batch, 5),)\n")
    status, out, err = run("-g", "torch:f.py:build", "-b", "8", "-p", "4", cwd=tmp_path)
    assert status == 2 and one_error(err) and "could not trace build: RuntimeError" in err
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err and captured.err == "" and captured.out == ""
    import logging

    assert logging.root.manager.disable == logging.NOTSET  # logging is back as it was


@pytest.mark.parametrize("spec", ["torch:pkg:build", "torch:pkg.py:build"])
def test_a_factory_path_that_is_a_directory_says_so(tmp_path, spec):
    # Before: "file pkg does not exist", of a directory that exists.
    (tmp_path / spec.split(":")[1]).mkdir()
    status, out, err = run("-g", spec if "/" in spec else spec.replace("torch:", f"torch:{tmp_path}/"), "-p", "4")
    assert status == 2 and one_error(err) and "is a directory, not a Python file" in err


# 10. --evaluate - with standard input closed ---------------------------------------------------

def test_evaluate_from_a_closed_standard_input_is_one_error_line():
    # Before: "internal error: AttributeError: 'NoneType' object has no attribute 'read'" (exit 70).
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("PASE_TRACEBACK", None)
    proc = subprocess.run([sys.executable, os.path.join(root, "scheduler.py"), "--evaluate", "-"], env=env,
                          capture_output=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.close(0), check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "pase: error: cannot read strategy file on standard input: standard input is closed\n"


@pytest.mark.parametrize("field", ["hbm_gbps", "memory_gb", "intra_node.gbps", "inter_node.latency_us", "act_bytes"])
def test_a_machine_number_of_400_digits_is_refused(tmp_path, mini, field):
    # Before: math.isfinite(10**400) raised OverflowError: "internal error" (exit 70).
    path = tmp_path / "m.json"
    path.write_text(json.dumps(machine_description(**{field: 10**400})))
    status, out, err = run("-g", mini, "-p", "8", "--machine", path)
    assert status == 2 and one_error(err) and f"{field} must be at most" in err and "(401 digits)" in err


# 11. Strategy files: a 400-digit split ------------------------------------------------------------

def test_a_split_of_400_digits_is_refused():
    # Before: float(10**400) raised OverflowError: "internal error" (exit 70).
    configs = [[1, 1]] * 2
    configs[0] = [10**400, 1]
    status, out, err = run("--evaluate", "-", "-g", "alexnet", stdin=json.dumps({"configs": configs}))
    assert status == 1 and one_error(err) and "configuration 0 must be a list of integers" in err


def test_a_recorded_machine_without_a_name_is_invalid(tmp_path):
    # Found after the fix above: a machine record whose name is a list was an internal error
    # (TypeError: unhashable type), before it silently fell back to the paper machine.
    found = plan_of("-g", "alexnet", "-b", "8", "-p", "4")
    for name in ([[1]], None, 5):
        found["machine"] = {"name": name}
        status, out, err = run("--evaluate", "-", stdin=json.dumps(found))
        assert status == 1 and one_error(err) and "invalid 'machine'" in err


@pytest.mark.parametrize("seconds", [10**400, 2 * 10**6])
def test_table_seconds_of_400_digits_are_refused(tmp_path, mini, seconds):
    # Before: math.isfinite(10**400) raised OverflowError: "internal error" (exit 70).
    table = small_table()
    table["gemm"][2] = table["gemm"][2][:4] + [seconds]
    status, out, err = run_with_table(tmp_path, mini, table)
    assert status == 2 and one_error(err) and "seconds must be a positive number up to 1e+06" in err
