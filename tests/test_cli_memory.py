"""The memory flags of the command line: --memory, --param-bytes, --act-bytes (docs/memory.md)."""

from __future__ import annotations

import json

import pytest

import graphs
from pase import MemoryModel, data_parallel, evaluate
from pase.cli import ExitStatus
from cli_runner import run
from pase.core.units import format_bytes


def run_json(*argv):
    status, out, err = run(*argv, "--json")
    assert status == 0, err
    return json.loads(out)


def test_gpt3_6_7b_fits_80_gb_where_data_parallelism_does_not():
    # The example: scheduler.py -g gpt3-6.7b -p 32 -b 16 --memory 80.
    data = run_json("-g", "gpt3-6.7b", "-p", 32, "-b", 16, "--memory", 80)
    memory = data["memory"]
    assert memory["cap_bytes"] == 80e9
    assert memory["fits"] is True and memory["per_device_bytes"] <= 80e9
    # Data parallelism: 6.855e9 parameters * 16 bytes = 109.7 GB of weights, gradients and
    # Adam state, plus 16 / 16 = 1 sample's activations per device (about 26.8 GB):
    # about 137 GB (test_gpt.py derives it by hand).
    assert memory["data_parallel_fits"] is False
    assert memory["data_parallel_per_device_bytes"] == pytest.approx(136.5e9, rel=0.01)
    assert memory["status"] == "unconstrained" and memory["gap"] == 0.0
    # The memory the JSON reports is the memory model's figure for the printed strategy.
    network = graphs.build("gpt3-6.7b", 16)
    configs = [layer["config"] for layer in data["layers"]]
    assert memory["per_device_bytes"] == pytest.approx(MemoryModel().per_device(network, configs), rel=1e-12)
    assert sum(layer["memory_bytes"] for layer in data["layers"]) == pytest.approx(memory["per_device_bytes"])


def test_nothing_fits_says_so_with_the_least_memory():
    # gpt3-6.7b at batch 128 on 32 devices: about 3.43 TB of activations and 109.7 GB of
    # parameter state, split at best 32 ways: about 110.5 GB per device > 80 GB.
    status, out, err = run("-g", "gpt3-6.7b", "-p", 32, "-b", 128, "--memory", 80)
    assert status == ExitStatus.NOTHING_FITS == 4
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("pase: error: nothing fits in 80 GB per device")
    assert "needs at least 111 GB per device" in lines[0]
    assert "data parallelism: 217 GB" in lines[0]


def test_capped_strategy_fits_and_is_costed_honestly(tmp_path):
    # rnnlm on 8 devices: the unconstrained optimum needs 3.91 GB per device, the least any
    # strategy needs is 2.63 GB; a 3 GB cap forces the Lagrangian search.
    unconstrained = run_json("-g", "rnnlm", "-p", 8)
    assert unconstrained["memory"]["per_device_bytes"] > 3e9
    data = run_json("-g", "rnnlm", "-p", 8, "--memory", 3)
    memory = data["memory"]
    assert memory["status"] == "capped" and memory["fits"] is True
    assert memory["per_device_bytes"] <= 3e9
    # The bound is below the optimum of the unconstrained problem's cost plus nothing:
    # unconstrained optimum <= lower bound <= returned cost.
    assert unconstrained["total_cost"] <= memory["lower_bound"] * (1 + 1e-12)
    assert memory["lower_bound"] <= data["total_cost"] * (1 + 1e-12)
    assert memory["gap"] == pytest.approx((data["total_cost"] - memory["lower_bound"]) / data["total_cost"])
    assert memory["searches"] >= 2
    # The reported cost is the strategy's cost under the reference model.
    network = graphs.build("rnnlm", 128)
    configs = [layer["config"] for layer in data["layers"]]
    assert evaluate(network, configs, procs=8).total == pytest.approx(data["total_cost"], rel=1e-12)
    # And --evaluate of it gives it back, with the same memory.
    path = tmp_path / "capped.json"
    path.write_text(json.dumps(data))
    again = run_json("--evaluate", path, "--memory", 3)
    assert again["total_cost"] == pytest.approx(data["total_cost"], rel=1e-12)
    assert again["memory"]["per_device_bytes"] == memory["per_device_bytes"]
    assert again["memory"]["fits"] is True


def test_table_shows_memory_per_layer_and_the_cap():
    status, out, err = run("-g", "rnnlm", "-p", 8, "--memory", 3)
    assert status == 0, err
    header = next(line for line in out.splitlines() if line.lstrip().startswith("id"))
    assert header.split()[-1] == "memory"
    assert "best fitting cost" in out
    assert "(fits the 3 GB cap)" in out
    assert "data parallelism    9.3 GB per device (over the 3 GB cap)" in out
    assert "Lagrangian search" in out and "lower bound" in out and "gap" in out
    assert "all activations kept for the backward pass" in out


def test_byte_sizes_change_the_memory_and_not_the_cost():
    default = run_json("-g", "rnnlm", "-p", 8)
    light = run_json("-g", "rnnlm", "-p", 8, "--param-bytes", 4, "--act-bytes", 1)
    assert light["total_cost"] == default["total_cost"]
    network = graphs.build("rnnlm", 128)
    configs = [layer["config"] for layer in light["layers"]]
    assert light["memory"]["per_device_bytes"] == pytest.approx(MemoryModel(4, 1).per_device(network, configs))
    assert light["memory"]["data_parallel_per_device_bytes"] == pytest.approx(
        MemoryModel(4, 1).per_device(network, data_parallel(network, 8))
    )
    assert light["memory"]["param_bytes"] == 4 and light["memory"]["act_bytes"] == 1


def test_sweep_rows_gain_the_memory_figures():
    status, out, err = run("-g", "rnnlm", "--sweep", "4,8", "--memory", 3)
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["4", "8"]
    # p = 4: even the least-memory strategy needs more than 3 GB: "nothing fits", status 4.
    assert rows[0][1:3] == ["nothing", "fits"] and status == ExitStatus.NOTHING_FITS
    assert "nothing fits in 3 GB per device: rnnlm on 4 devices" in err
    # p = 8: a capped strategy, as in a single run.
    single = run_json("-g", "rnnlm", "-p", 8, "--memory", 3)
    assert rows[1][1] == f"{single['total_cost']:.4e}"
    assert " ".join(rows[1][4:6]) == format_bytes(single["memory"]["per_device_bytes"])
    assert rows[1][8] == "capped,"
    lines = run("-g", "rnnlm", "--sweep", "8", "--memory", 3, "--json")[1].splitlines()
    assert json.loads(lines[0])["memory"] == single["memory"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--memory", "0"],
        ["--memory", "-5"],
        ["--memory", "lots"],
        ["--memory", "nan"],
        ["--param-bytes", "-1"],
        ["--act-bytes", "inf"],
        ["--param-bytes", "x"],
        ["--memory", "80", "--measure"],
    ],
)
def test_bad_memory_flags_are_one_line_errors(argv):
    status, out, err = run("-g", "rnnlm", "-p", "8", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("pase: error:")
    assert "Traceback" not in err
