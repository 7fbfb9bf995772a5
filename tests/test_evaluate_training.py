"""``pase --evaluate plan.json`` reads a training plan's ``--json`` output back: the same step
and peak on the same machine, re-priced on another (docs/roles.md, issue 29)."""

import json
import os

import pytest

from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINE_FILE = os.path.join(ROOT, "examples", "machines", "h100-96gb-500w.json")


@pytest.mark.parametrize("argv", [
    ["-g", "llama3-8b", "-m", "256", "-p", "8", "-b", "16", "--machine", "h100-sxm", "--recipe", "dp=2,tp=4"],
    ["-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", "h100-sxm", "--recipe", "pp=2,dp=4,recompute=full"],
    ["-g", "mixtral-8x7b", "-m", "64", "-p", "8", "-b", "8", "--machine", "h100-sxm", "--recipe", "dp=4,tp=2,ep=4",
     "--memory", "1000"],
])
def test_training_plan_reads_back(argv, tmp_path):
    status, out, err = run(*argv, "--json")
    assert status == 0, err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    first = json.loads(out)["training"]
    status, out, err = run("--evaluate", str(plan), "--json")
    assert status == 0, err
    again = json.loads(out)["training"]
    assert again["recipe"] == first["recipe"]
    assert again["step_seconds"] == pytest.approx(first["step_seconds"], rel=1e-9)
    assert again["peak_memory_bytes"] == pytest.approx(first["peak_memory_bytes"], rel=1e-9)
    # On another machine: the same plan, priced again (another step time).
    status, out, err = run("--evaluate", str(plan), "--machine", MACHINE_FILE, "--json")
    assert status in (0, 4), err
    if status == 0:
        other = json.loads(out)["training"]
        assert other["recipe"] == first["recipe"] and other["step_seconds"] != first["step_seconds"]


def test_per_layer_training_plan_is_refused_in_one_line(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"graph": "gpt2-small", "training": {"recipe": "zero=1,recompute=none"},
                                "layers": []}))
    status, out, err = run("--evaluate", str(plan))
    assert status != 0 and out == "" and "per-layer splits" in err and err.count("\n") == 1
