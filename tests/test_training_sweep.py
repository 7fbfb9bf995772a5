"""Issue 43: ``--sweep`` on a real machine gives the training plan at every count, each the plan
``-p N`` gives alone (the searches share their work: ``pase.planning.training_sweep``), and
``--tokens``, ``--device-hour-price`` and ``--days`` give the time and cost to train."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402

from pase.machines.registry import load_machine
from pase.outputs.training_sweep import TrainingBudget, duration_text, time_to_train, within_days
from pase.planning.engine import load_engine
from pase.planning.mesh import Recipe
from pase.planning.training_plan import plan_training
from pase.planning.training_search import StageReuse
from pase.planning.training_sweep import SweepStages, scaling_efficiency, sweep_training
from pase.sources.registry import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = load_machine("h100-sxm")
LLAMA_70B = ("-g", "hf:examples/hf/llama-3.1-70b.json", "-b", "512", "-m", "8192", "--machine", "h100-sxm")


def _llama_8b(batch: int):
    """Llama 3.1 8B at sequences of 1024 tokens (batch 32 on 16 to 64 H100s: tensor parallelism,
    and pipelines of 2 and 4 stages among the counts' plans)."""
    return load("hf:" + os.path.join(ROOT, "examples", "hf", "llama-3.1-8b.json"), batch, 1024)


COUNTS = (16, 32, 64)


def _same_plan(a, b):
    """Two plans found alike: the same recipe, step and peak to the last bit, the same layers."""
    assert (a is None) == (b is None)
    if a is None:
        return
    assert a.recipe() == b.recipe()
    assert a.summary.step_seconds == b.summary.step_seconds
    assert a.summary.peak_memory_bytes == b.summary.peak_memory_bytes
    assert a.configs == b.configs
    assert a.summary.extra.get("pipeline") == b.summary.extra.get("pipeline")


# -- the plans of a sweep are the plans alone --------------------------------------------------


@pytest.mark.parametrize("options, counts", [
    ({}, COUNTS),
    ({"alternatives": 3, "compare": Recipe(dp=16)}, COUNTS),
    ({"engine": load_engine("torchtitan"), "keep_to": (load_engine("torchtitan"),)}, COUNTS),
    ({"recipe": Recipe(precision="search")}, (16, 32)),
], ids=["default", "top-and-compare", "torchtitan-kept-to", "precision-searched"])
def test_each_count_of_a_sweep_is_its_plan_alone(options, counts):
    # Every count searched alone and in the sweep, with the options of --top, --compare,
    # --engine and --search-precision.
    sweep = sweep_training(_llama_8b, 32, counts, H100, **options)
    assert [e.devices for e in sweep.entries] == list(counts)
    for entry in sweep.entries:
        alone = plan_training(_llama_8b, 32, entry.devices, H100, **options)
        _same_plan(entry.best, alone.best)
        _same_plan(entry.plan.compare, alone.compare)
        assert [c.recipe() for c in entry.plan.alternatives] == [c.recipe() for c in alone.alternatives]
        assert entry.plan.mesh_search.evaluated == alone.mesh_search.evaluated


def test_a_mixture_of_experts_sweep_and_a_count_nothing_fits():
    # Mixtral 8x7B, batch 32 of 64 tokens: nothing fits 8 H100s; 16 take expert parallelism.
    def build(batch):
        return load("mixtral-8x7b", batch, 64)

    # offload=none: on the devices alone (with its optimizer on the host 8 fit, issue 45).
    alone = Recipe(offload=())
    sweep = sweep_training(build, 32, (8, 16), H100, recipe=alone)
    assert sweep.entries[0].best is None and sweep.entries[0].plan.least_memory is not None
    for entry in sweep.entries:
        _same_plan(entry.best, plan_training(build, 32, entry.devices, H100, recipe=alone).best)
    # At 64 tokens a sequence Megatron's host time per MoE block (moe_block_overhead_seconds,
    # 9.4 ms) outlasts the device's work in every layout: a GPU holding all 32 blocks waits
    # 32 x 9.4 ms a micro-batch, one of two pipeline stages half that, so 16 GPUs take a pipeline.
    assert sweep.entries[1].best.mesh.pp == 2
    # Without that host time the device's work decides: expert parallelism.
    bare = load_engine("megatron").base_options(H100, moe_block_overhead_seconds=0.0)
    swept = sweep_training(build, 32, (8, 16), H100, recipe=alone, base=bare)
    _same_plan(swept.entries[1].best, plan_training(build, 32, 16, H100, recipe=alone, base=bare).best)
    assert swept.entries[1].best.mesh.ep > 1


def test_a_count_the_recipe_cannot_meet_is_refused_and_the_sweep_goes_on():
    sweep = sweep_training(_llama_8b, 32, (8, 16), H100, recipe=Recipe(dp=16))
    assert sweep.entries[0].plan is None and "does not divide the 8 devices" in sweep.entries[0].refused
    _same_plan(sweep.entries[1].best, plan_training(_llama_8b, 32, 16, H100, recipe=Recipe(dp=16)).best)


def test_the_sweep_shares_one_costing_per_network():
    # Every count's groups of a network are columns of one costing: a costing per network built
    # (and no other), where five searches alone build one per network and count.
    import pase.planning.training_sweep as module

    built = []
    original = module.costing_stage

    def counted(built_network, groups, machine, memos):
        built.append((built_network.network.batch, tuple(g.stage_devices for g in groups)))
        return original(built_network, groups, machine, memos)

    module.costing_stage = counted
    try:
        sweep_training(_llama_8b, 32, COUNTS, H100)
    finally:
        module.costing_stage = original
    networks = [batch for batch, _ in built]
    assert len(networks) == len(set(networks))  # one union per network, never one per count
    # A network's union holds meshes of 16 and 32 devices: a count's whole machine, and the
    # stages of the larger counts' pipelines.
    assert any(set(stages) >= {16, 32} for _, stages in built)


def test_shares_that_do_not_match_are_costed_alone():
    # A search of a count the sweep did not list, or on another machine, prices its own costing.
    stages = SweepStages(_llama_8b, 32, (16,), H100)
    for procs, machine in ((32, H100), (16, load_machine("b200"))):
        shared = plan_training(_llama_8b, 32, procs, machine, reuse=stages)
        _same_plan(shared.best, plan_training(_llama_8b, 32, procs, machine).best)
    assert isinstance(stages, StageReuse)


def test_scaling_efficiency_against_the_first_count():
    sweep = sweep_training(_llama_8b, 32, (16, 32), H100)
    first, second = (e.best.summary.tokens_per_second_per_device for e in sweep.entries)
    assert scaling_efficiency(sweep.entries) == [1.0, second / first]


# -- time and cost to train ------------------------------------------------------------------


def test_time_to_train_worked_by_hand():
    # 1,000 tokens/s per device on 100 devices: 1e5 tokens/s; 3.6e9 tokens take 36,000 s = 10 hours;
    # 10 hours on 100 devices = 1,000 device-hours; at 2 a device-hour, 2,000.
    fields = time_to_train(1000.0, 100, TrainingBudget(3.6e9, 2.0, 0.5))
    assert fields == pytest.approx({"time_to_train_seconds": 36000.0, "device_hours": 1000.0, "cost": 2000.0})
    # 10 hours: within half a day (12 hours), not within 0.4 days (9.6 hours).
    assert within_days(fields, TrainingBudget(3.6e9, 2.0, 0.5)) is True
    assert within_days(fields, TrainingBudget(3.6e9, 2.0, 0.4)) is False
    assert "cost" not in time_to_train(1000.0, 100, TrainingBudget(3.6e9))
    # 36,000 s = 0.417 days (10 hours).
    assert duration_text(36000.0) == "0.417 days (10 hours)"


def test_the_70b_sweep_equals_its_single_runs_and_the_time_to_train_is_its_tokens_per_second():
    budget = ("--tokens", "15e12", "--device-hour-price", "2.5")
    status, out, err = run(*LLAMA_70B, "--sweep", "128,256", *budget, "--json")
    assert status == 0, err
    sweep = json.loads(out)
    assert [e["devices"] for e in sweep["sweep"]] == [128, 256]
    for entry in sweep["sweep"]:
        status, out, err = run(*LLAMA_70B, "-p", str(entry["devices"]), *budget, "--json")
        assert status == 0, err
        alone = json.loads(out)["training"]
        assert entry["training"]["step_seconds"] == pytest.approx(alone["step_seconds"], rel=1e-9)
        assert entry["training"] == alone  # the very object a single run prints
    # At 256: T / (tokens/s per device x devices), x devices / 3600, x 2.5.
    t = sweep["sweep"][1]["training"]
    rate = t["tokens_per_second_per_device"] * 256
    assert t["time_to_train_seconds"] == pytest.approx(15e12 / rate, rel=1e-6)
    assert t["device_hours"] == pytest.approx(15e12 / rate * 256 / 3600, rel=1e-6)
    assert t["cost"] == pytest.approx(2.5 * t["device_hours"], rel=1e-6)
    # The table says the same, in days and hours.
    status, table, err = run(*LLAMA_70B, "-p", "256", *budget)
    assert status == 0, err
    line = next(x for x in table.splitlines() if x.startswith("  time to train"))
    days = t["time_to_train_seconds"] / 86400
    assert f"{days:.3g} days ({t['time_to_train_seconds'] / 3600:,.0f} hours)" in line
    assert f"{t['device_hours']:,.0f} device-hours" in line and f"cost {t['cost']:,.0f} at 2.5" in line


def test_days_mark_the_counts_within_and_name_the_smallest():
    argv = ("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,4", "--tokens", "1e9")
    status, out, err = run(*argv, "--days", "0.01", "--json")
    assert status == 0, err
    data = json.loads(out)
    days = {e["devices"]: e["training"]["time_to_train_seconds"] / 86400 for e in data["sweep"]}
    assert days[2] > 0.01 >= days[4]  # 0.015 and 0.0082 days
    assert [e["within_days"] for e in data["sweep"]] == [False, True]
    assert data["smallest_within_days"] == 4
    status, table, _ = run(*argv, "--days", "0.01")
    rows = {line.split()[0]: line for line in table.splitlines()[2:4]}
    assert " d* " in rows["4"] and " d* " not in rows["2"]
    assert "within 0.01 days (*): 4; the smallest: 4 devices" in table
    status, table, _ = run(*argv, "--days", "0.0001")
    assert "no count trains them within 0.0001 days; the fastest: 4 devices" in table


@pytest.mark.parametrize("argv, message", [
    (("--sweep", "1,2", "--days", "3"), "--days is a deadline for the time to train: give --tokens too"),
    (("-p", "2", "--tokens", "1e9", "--days", "3"), "--days marks the counts of a sweep"),
    (("-p", "2", "--device-hour-price", "2"), "--device-hour-price prices the time to train: give --tokens"),
    (("-p", "2", "--tokens", "1e9", "--per-layer"), "--tokens takes a training plan's tokens/s"),
    (("--sweep", "1,2", "--export-megatron", "m.json"), "--export-megatron is about one plan"),
    (("--sweep", "1,2", "--dot-path", "g.dot"), "-d/--dot-path is about one plan"),
    (("--sweep", "1,2", "--recipe-from", "r.json"), "--recipe-from is about one plan"),
    (("-p", "2", "--tokens", "0"), "expected a number of tokens such as 15e12"),
    (("-p", "2", "--tokens", "nan"), "expected a number of tokens"),
    (("-p", "2", "--tokens", "1e999"), "expected a number of tokens"),
    (("-p", "2", "--tokens", "1e9", "--device-hour-price", "-1"), "expected a price per device-hour"),
    (("--sweep", "1,2", "--tokens", "1e9", "--days", "0"), "expected a number of days such as 60"),
    (("--sweep", "1,2", "--tokens", "1e9", "--days", "x"), "expected a number of days"),
])
def test_bad_time_and_cost_flags_are_one_line_and_status_2(argv, message, tmp_path):
    status, out, err = run("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", *argv, cwd=tmp_path)
    assert status == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_tokens_need_a_machine_in_seconds_and_a_language_model():
    status, out, err = run("-g", "gpt2-small", "-b", "16", "-p", "2", "--training", "--tokens", "1e9")
    assert status == 2 and out == "" and "machine paper prices in flop-equivalents" in err
    status, out, err = run("-g", "alexnet", "-p", "2", "--machine", "h100-sxm", "--tokens", "1e9")
    assert status == 2 and out == "" and "alexnet has no tokens per sequence" in err


def test_a_training_sweep_table_row_per_count_and_the_per_layer_sweep_on_request():
    status, out, err = run("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,8")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("PaSE training sweep: gpt2-small, batch 16")
    assert lines[1].split()[:2] == ["devices", "step"]
    assert [line.split()[0] for line in lines[2:4]] == ["2", "8"]
    status, per_layer, _ = run("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,8", "--per-layer")
    assert status == 0 and per_layer.startswith("PaSE sweep: gpt2-small")


def test_a_training_sweep_on_the_paper_machine_prices_in_its_unit():
    status, out, err = run("-g", "gpt2-small", "-b", "4", "-m", "64", "--training", "--sweep", "1,2")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("devices  step (flop-equivalents)")
    # No tokens/s nor MFU in FLOP-equivalents; scaling is a ratio of throughputs, in any unit.
    assert [line.split()[2:4] for line in lines[2:4]] == [["-", "-"], ["-", "-"]]
    assert lines[2].split()[6:8] == ["100.0", "%"]
