"""Tests of ``pase.torch_verify`` (``--verify torch``): the plan's reductions, refusals, the result,
and runs on two gloo CPU processes with DTensor (skipped without torch).

The runs are the smallest that exercise a split: an MLP on 2 processes (a few seconds each, most
of it starting the processes), and tiny_llama on 2 processes where transformers is installed.
"""

import importlib.util
import json
import os
import sys

import pytest

import pase
from pase import FC, GraphBuilder, SoftmaxCrossEntropy
from pase.planning.baselines import data_parallel
from pase.outputs.torch.verify import (
    INSTALL_HINT, TorchMissing, TorchVerifyTooLarge, _check_placements, _result, torch_plan, verify_torch,
)
from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch (pip install '.[torch]')")


def _mlp():
    g = GraphBuilder("mlp")
    x = g.input((8, 16), "x", letters="bk")
    h = g.add("fc", FC(x, 32, pw=1))
    h2 = g.add("fc2", FC(h, 12))
    g.add("loss", SoftmaxCrossEntropy(h2))
    return g.build()


# ---------------------------------------------------------------------------------------
# No torch needed


def test_the_plan_names_every_reduction():
    net = _mlp()
    # p = 4, mesh (d0, d1). fc (2, 1, 2): b on d0, k on d1. Its output lacks k: partial over d1;
    # its weight (n, k) lacks b: its gradient is partial over d0.
    plan = torch_plan(net, [(2, 1, 2), (4, 1, 1), (4, 1)], 4)
    fc, fc2 = plan["layers"][0], plan["layers"][1]
    assert fc["outputs"][0]["partial"] == ["d1"] and fc["weights"][0]["partial"] == ["d0"]
    assert fc2["outputs"][0]["partial"] == [] and fc2["weights"][0]["partial"] == ["d0", "d1"]
    # Everything else is the JAX export's.
    assert fc["weights"][0]["spec"] == [None, ["d1"]]


def test_a_split_dtensor_cannot_express_is_one_line_naming_the_layer():
    plan = torch_plan(_mlp(), [(2, 1, 2), (4, 1, 1), (4, 1)], 4)
    plan["layers"][1]["inputs"][0]["spec"] = [["d1", "d0"], None]
    with pytest.raises(ValueError, match=r"^layer 1 \(fc2, FC\): fc splits its dimension 0 over mesh axes d1, d0 "
                                         r"in that order; DTensor"):
        _check_placements(plan)


def test_without_torch_it_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(TorchMissing, match=r"pip install '\.\[torch\]'"):
        verify_torch(_mlp(), [(2, 1, 1), (2, 1, 1), (2, 1)], 2)
    assert "pip install" in INSTALL_HINT


def test_a_run_over_the_memory_budget_is_refused_with_the_estimate(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torch" else real(name, *a))
    with pytest.raises(TorchVerifyTooLarge, match=r"PyTorch run of mlp on 2 processes needs about [\d.]+ GB") as err:
        verify_torch(_mlp(), [(2, 1, 1), (2, 1, 1), (2, 1)], 2, memory_budget=1e6)
    assert err.value.needed > 1.6e9  # two processes' own footprint at least


def test_the_result_is_the_jax_verify_object_with_torch_bytes():
    net = _mlp()
    out = {
        "loss": 2.0, "loss_reference": 2.0, "loss_error": 0.0,
        "gradients": [["fc.weight", [32, 16], 1e-7], ["fc2.weight", [12, 32], 2e-4]],
        "seconds": {"start": 1.0, "run": 0.1, "reference": 0.0, "total": 5.0}, "torch_version": "x",
        "peak_bytes": 7e8, "notes": [],
        "collectives": [[0, True, "layer", "all-reduce", 2048.0], [2, False, "edge", "all-gather", 96.0],
                        [None, False, "layer", "all-reduce", 4.0]],
    }
    layer, edge = [2048.0, 0.0, 0.0], [0.0, 0.0, 192.0]
    result = _result(net, [(2, 1, 1), (2, 1, 1), (2, 1)], 2, out, layer, edge, 0, 1e-4, "float32")
    assert not result.ok  # fc2.weight is over the tolerance
    data = result.to_dict()
    assert data["backend"] == "torch" and data["max_error"] == 2e-4
    assert data["layers"][0]["dtensor_layer_bytes"] == {"forward": 0.0, "backward": 2048.0}
    assert data["layers"][2]["dtensor_edge_bytes"] == {"forward": 96.0, "backward": 0.0}
    assert data["modelled_bytes"] == 2240.0 and data["dtensor_bytes"] == 2148.0
    assert data["unattributed_collectives"] == {"all-reduce": 1}
    json.dumps(data)
    table = result.table()
    assert "numbers: FAILED" in table and "gradient of fc2.weight" in table and "(the loss)" in table


# ---------------------------------------------------------------------------------------
# Runs (two gloo processes each)


@needs_torch
def test_data_parallel_runs_and_its_weight_reductions_match_the_model():
    net = _mlp()
    result = verify_torch(net, data_parallel(net, 2), 2)
    assert result.ok, result.table()
    for l in result.layers[:2]:  # one all-reduce of each weight gradient, as modelled, backward
        assert l.dtensor_layer_backward == l.modelled_layer > 0
        assert l.collectives == {"all-reduce": 1}
    assert result.peak_bytes > 0 and result.seconds["total"] > 0


@needs_torch
@pytest.mark.parametrize("where", ["weight", "output"])
def test_a_plan_that_skips_a_reduction_fails(where):
    net = _mlp()
    if where == "weight":  # data parallelism whose first weight gradient is claimed whole: no all-reduce
        configs = data_parallel(net, 2)
        plan = torch_plan(net, configs, 2)
        plan["layers"][0]["weights"][0]["partial"] = []
    else:  # fc2 splits its reduction dimension k, and its output is claimed reduced
        configs = [(1, 2, 1), (1, 1, 2), (1, 1)]
        plan = torch_plan(net, configs, 2)
        plan["layers"][1]["outputs"][0]["partial"] = []
    result = verify_torch(net, configs, 2, plan=plan)
    assert not result.ok
    assert result.max_error > 1e-2
    if where == "weight":  # DTensor's gradient is partial where the plan says whole: said in a note
        assert any("gradient of fc.weight: partial sums over mesh axes d0 that the plan does not reduce" in n
                   for n in result.notes)


@needs_torch
def test_cli_verify_torch_passes_and_reports_json(tmp_path):
    graph = tmp_path / "mlp.json"
    graph.write_text(json.dumps(pase.network_to_json(_mlp())))
    # Fast links: the optimum splits fc's units and fc2's reduction (an all-reduce forward).
    status, out, err = run("-g", graph, "-p", "2", "--bw", "16000", "--json", "--verify", "torch")
    assert status == 0, err
    verified = json.loads(out)["verify"]
    assert verified["backend"] == "torch" and verified["ok"] and verified["procs"] == 2
    fc2 = verified["layers"][1]
    assert fc2["config"] == [1, 1, 2] and fc2["dtensor_layer_bytes"]["forward"] == fc2["modelled_layer_bytes"] > 0


@needs_torch
def test_cli_exits_5_when_the_plan_skips_a_reduction(tmp_path, monkeypatch):
    import pase.outputs.torch.verify as tv

    real = tv.torch_plan

    def skipping(*args, **kwargs):
        plan = real(*args, **kwargs)
        for layer in plan["layers"]:
            for t in layer["outputs"]:
                t["partial"] = []
        return plan

    monkeypatch.setattr(tv, "torch_plan", skipping)
    graph = tmp_path / "mlp.json"
    graph.write_text(json.dumps(pase.network_to_json(_mlp())))
    status, out, err = run("-g", graph, "-p", "2", "--bw", "16000", "--verify", "torch")
    assert status == 5, err
    assert "numbers: FAILED" in out


@needs_torch
def test_readers_split_alike_reduce_once_as_dtensor_does():
    # Gate and up read h and split their units over both processes: each gradient of h is
    # partial. DTensor adds the two partials and all-reduces the sum once (in h's backward);
    # the reader rule "summed" charges that one all-reduce, "each" two.
    from pase import Elementwise
    from pase.costing.strategy import evaluate
    from pase.outputs.jax.verify import TrafficMachine

    g = GraphBuilder("gated")
    x = g.input((8, 16), "x", letters="bk")
    h = g.add("h", FC(x, 16))
    gate = g.add("gate", FC(h, 32))
    up = g.add("up", FC(h, 32))
    m = g.add("m", Elementwise(gate, up))
    g.add("loss", SoftmaxCrossEntropy(g.add("down", FC(m, 12))))
    net = g.build().with_readers("summed")
    configs = [(1, 1, 1), (1, 2, 1), (1, 2, 1), (1, 2), (1, 1, 2), (1, 1)]
    result = verify_torch(net, configs, 2)
    assert result.ok, result.table()
    by_name = {l.name: l for l in result.layers}
    # h's gradient: 8 x 16 float32 = 512 bytes, all-reduced over 2 (2 x 1/2 x 512), once.
    assert by_name["h"].collectives == {"all-reduce": 1} and by_name["h"].dtensor_layer_backward == 512.0
    assert by_name["gate"].modelled_layer == 512.0 and by_name["up"].modelled_layer == 0.0
    assert result.modelled_total == result.dtensor_total == 896.0  # and down's output, 8 x 12 x 4
    each = evaluate(net.with_readers("each"), configs, TrafficMachine(4.0), 2)
    assert each.total == 1408.0


@needs_torch
def test_tiny_llama_runs_on_two_processes():
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import hf_llama
    finally:
        sys.path.pop(0)
    net = pase.from_torch(*hf_llama.tiny_llama(2), name="tiny_llama")
    found = pase.plan(net, 2, pase.Machine(10.0, 16000.0))
    result = verify_torch(found)
    assert result.ok, result.table()
    assert result.dtensor_total > 0


@needs_torch
def test_placements_of_a_spec():
    from torch.distributed.tensor import Replicate, Shard

    from pase.outputs.torch.program import PlacementError, placements

    assert placements([["d0"], None, ["d1", "d2"]], ["d0", "d1", "d2"]) == [Shard(0), Shard(2), Shard(2)]
    assert placements([None, None], ["d0", "d1"]) == [Replicate(), Replicate()]
    assert placements([None], []) == [Replicate()]  # p = 1: a mesh of one axis of 1
    with pytest.raises(PlacementError, match="mesh axes d1, d0 in that order"):
        placements([["d1", "d0"]], ["d0", "d1"])


TO_DTENSOR_SCRIPT = '''
import json, sys
import torch, torch.distributed as dist
import pase
from pase.outputs.torch.program import Program

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))

dist.init_process_group("gloo")
model, args = MLP(), (torch.randn(8, 16),)
plan = pase.plan(pase.from_torch(model, args), dist.get_world_size(), pase.Machine(10.0, 16000.0))
program = pase.to_dtensor(model, args, plan)
loss = program(program.make_parameters(), program.make_data())
loss.backward()
value = float(loss.full_tensor())
if dist.get_rank() == 0:
    reference = Program(program.network, program.plan, None)
    expected = float(reference(reference.make_parameters(), reference.make_data()))
    print(json.dumps({"loss": value, "expected": expected, "configs": [list(c) for c in plan.configs],
                      "places": [str(p) for p in program.places[0]["weights"]], "mesh": list(program.mesh.shape)}))
dist.destroy_process_group()
'''


@needs_torch
def test_to_dtensor_runs_an_imported_module_in_a_process_group(tmp_path):
    import subprocess

    script = tmp_path / "run.py"
    script.write_text(TO_DTENSOR_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert out["mesh"] == [2]
    assert any(max(c) > 1 for c in out["configs"])  # some layer is split
    assert abs(out["loss"] - out["expected"]) <= 1e-5 * abs(out["expected"])
