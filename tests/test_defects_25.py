"""Issue 25: defects found trying the tool as a new user would (one test group per item)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "examples", "hf", "gpt2.json")

MLP = '''import torch
def mlp(batch):
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
    return m, (torch.randn(batch, 64),)
'''


def _json(text):
    return json.loads(text)


# Item 1: --evaluate of a plan from torch:/hf: prices it at the plan's recorded batch (and sequence).

def test_evaluate_torch_plan_uses_recorded_batch(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "m.py").write_text(MLP)
    spec = f"torch:{tmp_path / 'm.py'}:mlp"
    status, out, _ = run("-g", spec, "-b", 8, "-p", 8, "--json")
    assert status == 0
    (tmp_path / "p.json").write_text(out)
    planned = _json(out)
    status, out, err = run("--evaluate", tmp_path / "p.json", "-g", spec, "--json")
    assert status == 0, err
    evaluated = _json(out)
    assert evaluated["batch"] == 8
    assert evaluated["total_cost"] == planned["total_cost"]


def test_evaluate_hf_plan_uses_recorded_batch_and_sequence(tmp_path):
    status, out, _ = run("-g", f"hf:{GPT2}", "-b", 4, "-m", 64, "-p", 4, "--json")
    assert status == 0
    planned = _json(out)
    assert planned["model"] == 64
    (tmp_path / "p.json").write_text(out)
    status, out, err = run("--evaluate", tmp_path / "p.json", "-g", f"hf:{GPT2}", "--json")
    assert status == 0, err
    evaluated = _json(out)
    assert (evaluated["batch"], evaluated["model"]) == (4, 64)
    assert evaluated["total_cost"] == planned["total_cost"]


def test_evaluate_builtin_plan_on_graph_file_without_b(tmp_path):
    # Item 7 too: no -b was given, so no "-b 8 cannot change it"; a note says which batch applies.
    status, out, _ = run("-g", "alexnet", "-b", 8, "-p", 4, "--json")
    (tmp_path / "a8.json").write_text(out)
    assert run("-g", "alexnet", "-p", 4, "--export-graph", tmp_path / "alex.json")[0] == 0
    status, out, err = run("--evaluate", tmp_path / "a8.json", "-g", tmp_path / "alex.json")
    assert status == 0, err
    assert "-b 8" not in err
    assert "records batch 8" in err and "priced at batch 128" in err


# Item 6: an output path equal to an input or to another output is refused, nothing written.

def test_output_over_evaluate_input_refused(tmp_path):
    status, out, _ = run("-g", "alexnet", "-p", 4, "--json")
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    (tmp_path / "link.json").symlink_to(plan)
    for flag in ("--dot-path", "--export-jax", "--export-graph"):
        for target in (plan, tmp_path / "link.json"):
            status, out, err = run("--evaluate", plan, flag, target)
            assert status == 2, (flag, err)
            assert err.count("\n") == 1 and flag in err and "--evaluate" in err
            assert plan.read_text().startswith("{") and json.loads(plan.read_text())["graph"] == "alexnet"


def test_two_outputs_on_one_file_refused(tmp_path):
    status, _, err = run("-p", 4, "--export-graph", tmp_path / "x.json", "--dot-path", f"{tmp_path}/./x.json")
    assert status == 2 and err.count("\n") == 1 and "same file" in err
    assert not (tmp_path / "x.json").exists()


def test_output_over_graph_file_refused(tmp_path):
    graph = tmp_path / "g.json"
    assert run("-p", 4, "--export-graph", graph)[0] == 0
    before = graph.read_text()
    status, _, err = run("-g", graph, "-p", 4, "--dot-path", graph)
    assert status == 2 and err.count("\n") == 1 and "-g" in err
    assert graph.read_text() == before


# Item 5: a graph file's batch must agree with its shapes; a key given twice is refused in every file.

def _exported_graph(tmp_path):
    path = tmp_path / "alex.json"
    assert run("-p", 4, "--export-graph", path)[0] == 0
    return path


def test_graph_file_batch_disagreeing_with_shapes_refused(tmp_path):
    path = _exported_graph(tmp_path)
    data = json.loads(path.read_text())
    data["batch"] = 64
    path.write_text(json.dumps(data))
    status, out, err = run("-g", path, "-p", 4)
    assert status != 0 and out == ""
    assert err.count("\n") == 1 and "64" in err and "128" in err


def _duplicated(text: str, key: str, first, second) -> str:
    old = f'"{key}": {json.dumps(first)}'
    assert old in text
    return text.replace(old, f'{old}, "{key}": {json.dumps(second)}', 1)


def test_duplicate_keys_refused_in_graph_files(tmp_path):
    path = _exported_graph(tmp_path)
    path.write_text(_duplicated(json.dumps(json.loads(path.read_text())), "batch", 128, 64))
    status, _, err = run("-g", path, "-p", 4)
    assert status != 0 and err.count("\n") == 1 and "'batch'" in err and "more than once" in err


def test_duplicate_keys_refused_in_strategy_files(tmp_path):
    status, out, _ = run("-g", "alexnet", "-p", 4, "--json")
    path = tmp_path / "plan.json"
    path.write_text(_duplicated(json.dumps(json.loads(out)), "procs", 4, 8))
    status, _, err = run("--evaluate", path)
    assert status != 0 and err.count("\n") == 1 and "'procs'" in err and "more than once" in err


def test_duplicate_keys_refused_in_machine_and_hf_files(tmp_path):
    machine = os.path.join(ROOT, "examples", "machines", "h100-96gb-500w.json")
    data = json.load(open(machine))
    key = next(k for k, v in data.items() if isinstance(v, str))
    path = tmp_path / "m.json"
    path.write_text(_duplicated(json.dumps(data), key, data[key], data[key]))
    status, _, err = run("-p", 4, "--machine", path)
    assert status != 0 and err.count("\n") == 1 and "more than once" in err
    data = json.load(open(GPT2))
    path = tmp_path / "gpt2.json"
    path.write_text(_duplicated(json.dumps(data), "n_layer", data["n_layer"], 2))
    status, _, err = run("-p", 4, "-g", f"hf:{path}")
    assert status != 0 and err.count("\n") == 1 and "'n_layer'" in err and "more than once" in err


# Item 9: pase --help names the other command, pase calibrate.

def test_help_mentions_calibrate():
    status, out, _ = run("--help")
    assert status == 0 and "pase calibrate" in out


# Item 7: confusing output.

def _machine_file(tmp_path, **changes):
    data = json.load(open(os.path.join(ROOT, "examples", "machines", "h100-96gb-500w.json")))
    data.pop("measured")
    data.update(changes)
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(data))
    return path


def test_machine_file_without_table_does_not_say_measured(tmp_path):
    status, out, err = run("-p", 4, "--machine", _machine_file(tmp_path))
    assert status == 0, err
    assert "measured" not in out and "peak" in out


def test_machine_file_act_bytes_sets_the_memory_model(tmp_path):
    machine = _machine_file(tmp_path, act_bytes=4)
    status, out, err = run("-p", 4, "--machine", machine, "--json", "--per-layer")
    assert status == 0, err
    assert json.loads(out)["memory"]["act_bytes"] == 4
    status, out, err = run("-p", 4, "--machine", machine, "--json", "--act-bytes", 1, "--per-layer")
    assert json.loads(out)["memory"]["act_bytes"] == 1


def test_control_characters_in_layer_names_are_escaped(tmp_path):
    path = _exported_graph(tmp_path)
    data = json.loads(path.read_text())
    first = data["layers"][0]["name"]
    data["layers"][0]["name"] = "conv\n1\x1b[2J"
    for layer in data["layers"]:
        layer["inputs"] = ["conv\n1\x1b[2J" if i == first else i for i in layer["inputs"]]
    path.write_text(json.dumps(data))
    status, out, err = run("-g", path, "-p", 4)
    assert status == 0, err
    assert "\x1b" not in out
    rows = out.split("\n\n")[1].splitlines()
    assert len(rows) == 1 + len(data["layers"])
    assert "conv\\n1\\x1b[2J" in rows[1]


# Item 2: the paper machine's words say what its numbers count (a multiply-add once).

def test_paper_machine_labels_say_what_is_counted():
    status, out, _ = run("-p", 4)
    assert status == 0
    assert "FLOPs plus rho" not in out and "at 10 TFLOPS)" not in out
    assert "a multiply-add counts 1" in out and "ms at 10e12 FLOP-equivalents/s)" in out
    assert "1.4822e+11 FLOP-equivalents" in out  # the numbers are the paper's, unchanged
    status, out, _ = run("--help")
    assert "divide by the device's FLOP/s" not in out and "multiply-add" in out


# Item 4: "does it fit?" is answered before any dynamic programme (and before the time notice).

def test_nothing_fits_is_known_before_any_dynamic_programme(monkeypatch):
    import pase
    from pase.search import solver
    from pase.sources.registry import load

    def no_programme(*args, **kwargs):
        raise AssertionError("a dynamic programme ran although nothing can fit")

    monkeypatch.setattr(solver.Search, "run", no_programme)
    notices = []
    planned = pase.plan(load("alexnet"), 8, memory_cap=1e3, notice=lambda *a: notices.append(a))
    assert planned.memory.status == "nothing-fits"
    assert planned.memory.searches == 0 and notices == []
    assert planned.memory.least_bytes > 1e3


def test_nothing_fits_cli_is_one_line_at_once():
    status, out, err = run("-g", "gpt3-175b", "-p", 8, "-b", 8, "--memory", 1)
    assert status == 4 and out == "" and err.count("\n") == 1 and "nothing fits" in err


# Item 8: a search restricted to configurations an engine can run; implied by --export-jax/--verify.

def _devices(report):
    import math
    return [math.prod(layer["config"]) for layer in report["layers"]]


def test_exportable_search_keeps_device_counts_dividing_p():
    status, out, _ = run("-g", "transformer", "-b", 16, "-p", 32, "--json")
    assert any(32 % d for d in _devices(json.loads(out)))  # the free optimum uses 24 of 32 somewhere
    status, out, err = run("-g", "transformer", "-b", 16, "-p", 32, "--exportable", "--json")
    assert status == 0, err
    assert all(32 % d == 0 for d in _devices(json.loads(out)))


def test_export_jax_implies_an_exportable_search(tmp_path):
    status, out, err = run("-g", "transformer", "-b", 16, "-p", 32, "--export-jax", tmp_path / "shard.json")
    assert status == 0, err
    assert (tmp_path / "shard.json").exists()
    assert "only those an engine can run" in out


# Item 3: configurations and cost tables are bounded before anything is enumerated.

def test_huge_graph_file_refused_before_enumeration(tmp_path, monkeypatch):
    from pase.model import builder

    def no_enumeration(*args, **kwargs):
        raise AssertionError("configurations were enumerated although the tables cannot fit")

    monkeypatch.setattr(builder, "enumerate_configs", no_enumeration)
    layers = [{"name": f"fc{i}", "op": "FC", "inputs": ["x" if i == 0 else f"fc{i - 1}"], "args": {"units": 720720}}
              for i in range(100)]
    graph = {"format": "pase-graph", "version": 1, "name": "big", "cutoff": 1, "batch": 720720,
             "inputs": [{"name": "x", "shape": [720720, 720720], "letters": "bk", "param": False}], "layers": layers}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(graph))
    status, out, err = run("-g", path, "-p", 1048576, "--allow-replication")  # 720720 has no factor 2^20
    assert status == 3 and out == "" and err.count("\n") == 1
    assert "at least" in err and "TB" in err


def test_least_table_bytes_is_a_lower_bound():
    from pase.model.builder import Network
    from pase.sources.registry import load

    for graph, procs in (("alexnet", 32), ("transformer", 32), ("gpt3-2.7b", 64), ("inception3", 32)):
        network = load(graph, 64)
        least, _ = network.least_table_bytes(procs)
        configs = network.configs(procs)
        assert least <= network._table_bytes(configs, network._edge_keys(configs)[2])


def test_memory_error_without_text_is_not_empty_parentheses(monkeypatch):
    import pase.cli.search as search

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(search, "plan_with_options", exhausted)
    status, _, err = run("-p", 4)
    assert status == 3 and "()" not in err and "out of memory (" in err


def test_ties_prefer_less_memory_then_fewer_replicas(tmp_path):
    # Item 7: a zero-cost Ravel may be replicated or split; the split needs less memory.
    graph = {"format": "pase-graph", "version": 1, "name": "rav", "cutoff": 1, "batch": 4,
             "inputs": [{"name": "x", "shape": [4, 12], "letters": "bk", "param": False}],
             "layers": [{"name": "r", "op": "Ravel", "inputs": ["x"]}]}
    path = tmp_path / "rav.json"
    path.write_text(json.dumps(graph))
    status, out, err = run("-g", path, "-p", 4, "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["total_cost"] == 0
    assert report["layers"][0]["config"] == [4, 1] and report["layers"][0]["memory_bytes"] == 24


# The last point: fuzzing the inputs of the training-configuration turn (benchmarks/fuzz_inputs.py
# --only hf,recipe,engine) found these.

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}


def _tiny(tmp_path, **changes):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(TINY, **changes)))
    return f"hf:{path}"


def test_fuzz_hf_million_layers_refused_at_once(tmp_path):
    status, out, err = run("-g", _tiny(tmp_path, num_hidden_layers=10 ** 6), "-p", "4")
    assert status == 1 and out == ""
    assert err.strip().splitlines() == [
        f"pase: error: hf config {tmp_path / 'c.json'}: num_hidden_layers must be at most 1024 (the largest "
        "published decoders have about 128), got 1000000"]


def test_fuzz_hf_invalid_field_is_an_invalid_file(tmp_path):
    status, _, err = run("-g", _tiny(tmp_path, vocab_size="x"), "-p", "4")
    assert status == 1 and "vocab_size must be a positive integer" in err


def _plan_line(out: str) -> str:
    """The ``plan:`` line of a training table (after its title and engine lines)."""
    return next(line for line in out.splitlines() if line.startswith("plan:"))


@pytest.mark.parametrize("recipe", ["vpp=2", "schedule=1f1b", "schedule=interleaved"])
def test_fuzz_recipe_schedule_asks_for_a_pipeline(tmp_path, recipe):
    # Two blocks on 4 devices: pp=2 exists (1F1B), so a schedule or vpp gives a pipelined plan
    # or, where no pipeline applies (vpp=2 needs 4 chunks from 2 blocks), an error; never a plan
    # without stages that silently drops the key.
    status, out, err = run("-g", _tiny(tmp_path), "-p", "4", "-b", "8", "--machine", "h100-sxm", "--training",
                           "--recipe", recipe)
    if status == 0:
        assert "pp=2" in _plan_line(out), out
    else:
        assert status == 2 and len(err.strip().splitlines()) == 1


def test_fuzz_recipe_pp_is_never_answered_without_stages(tmp_path):
    status, out, _ = run("-g", _tiny(tmp_path), "-p", "4", "-b", "8", "--machine", "h100-sxm", "--training",
                         "--recipe", "pp=2")
    assert status == 0 and "pp=2" in _plan_line(out) and "not a mesh" not in out


def test_fuzz_recipe_schedule_with_pp_1_refused(tmp_path):
    status, _, err = run("-g", _tiny(tmp_path), "-p", "4", "-b", "8", "--machine", "h100-sxm", "--training",
                         "--recipe", "pp=1,vpp=2")
    assert status == 2 and "describe a pipeline, and the recipe has pp=1" in err


def test_fuzz_recipe_only_ascii_digits():
    from pase.planning.mesh import parse_recipe

    for text in ("dp=\u0664", "dp=\u00b2", "tp=\uff12"):  # Arabic-Indic four, superscript two, fullwidth two
        with pytest.raises(ValueError, match="must be a positive integer"):
            parse_recipe(text)


def test_fuzz_engine_export_write_failure_is_status_1(tmp_path):
    import stat

    full = tmp_path / "full"  # a copy of /dev/full (character device 1, 7): never the system's own
    try:
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except (OSError, AttributeError):
        pytest.skip("cannot make a device node here (not root)")
    status, out, err = run("-g", _tiny(tmp_path), "-p", "4", "-b", "8", "--machine", "h100-sxm", "--training",
                           "--export-megatron", str(full))
    assert status == 1 and f"cannot write the Megatron-LM arguments to {full}" in err
    assert stat.S_ISCHR(os.stat(full).st_mode)  # still the device, not a file put in its place
