"""Offload to the host (issue 45 part B): each mechanism against values worked out by hand, the
recipe key and its refusals, machine host sides, the search's fallback and the exports."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pase.costing.training import TrainingCosting, TrainingOptions  # noqa: E402
from pase.costing.training.offload import kept_activation_share  # noqa: E402
from pase.machines.calibrated import CalibratedMachine  # noqa: E402
from pase.machines.host import host_side, preset_hosts, validate_host  # noqa: E402
from pase.model.builder import GraphBuilder  # noqa: E402
from pase.model.layers import FC  # noqa: E402
from pase.planning.mesh import parse_recipe  # noqa: E402

#: test_training's toy machine (4 devices a node, 1 TFLOPS, 1 GB/s memory) with a host side of
#: round numbers: 10 GB/s host-to-device, 20 GB/s device-to-host per GPU, 1000 GB of host memory
#: and 1e9 parameters/s of CPU Adam per node, a 5 GB/s drive of 1000 GB.
TOY = {
    "name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
    "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
    "act_bytes": 2, "grad_bytes": 4,
    "host": {"h2d_gbps": 10, "d2h_gbps": 20, "memory_gb": 1000, "optimizer_params_per_s": 1e9,
             "nvme_gbps": 5, "nvme_gb": 1000},
}


@pytest.fixture(scope="module")
def toy():
    return CalibratedMachine(TOY)


def _fc_costing(machine):
    # FC 8 x 1000 -> 500 (5e5 weights), the batch split 4 ways: per device 2 x 1000 x 500;
    # one micro-batch's compute 6 x 2 x 500 x 1000 / 1e12 = 6e-6 s, its backward 2/3 of it.
    g = GraphBuilder("fc", 1, batch=8)
    x = g.input((8, 1000), "x", letters="bk")
    g.add("fc", FC(x, 500))
    return TrainingCosting(g.build(), [np.array([[4, 1, 1]])], machine)


def test_optimizer_offload_by_hand(toy):
    costing = _fc_costing(toy)
    o = TrainingOptions(zero=1, offload=("optimizer",))
    t = costing.layer_time(0, o)
    # P = 5e5 / 4 = 1.25e5 local elements. Gradients out 4 x 1.25e5 / 20e9 = 2.5e-5 s, of which the
    # backward 4e-6 hides: 2.1e-5; bf16 weights back 2 x 1.25e5 / 10e9 = 2.5e-5: 4.6e-5 s.
    assert t["host_transfers"][0] == pytest.approx(4.6e-5)
    # CPU Adam over the node's 4 x 1.25e5 = 5e5 elements at 1e9/s: 5e-4 s; none on the device.
    assert t["host_optimizer"][0] == pytest.approx(5e-4)
    assert t["optimizer"][0] == 0.0
    # The device keeps weights and gradients, 2 + 2 bytes x 5e5 (ZeRO-1 without offload: 2 + 2 + 12/4).
    assert costing.layer_memory(0, o, 2.0)["model_state"][0] == pytest.approx(4 * 5e5)
    assert costing.layer_memory(0, TrainingOptions(zero=1), 2.0)["model_state"][0] == pytest.approx(7 * 5e5)
    # The host holds the state and an fp32 gradient: (12 + 4) x 1.25e5 = 2e6 bytes per device.
    assert costing.vectors.offload.host_bytes(0, o, 2.0)[0] == pytest.approx(2e6)
    # The step vector the searches add up carries the same host work.
    step = costing.layer_vectors(o, 2.0)["step"][0, 0]
    assert step == pytest.approx(costing.exposed_sync(0, o)[0] + 4.6e-5 + 5e-4)


def test_nvme_offload_by_hand(toy):
    costing = _fc_costing(toy)
    o = TrainingOptions(zero=1, offload=("nvme",))
    t = costing.layer_time(0, o)
    # As optimizer (4.6e-5 s of copies), plus the 12-byte state of the node's 5e5 elements read and
    # written over the 5 GB/s drive: 2 x 12 x 5e5 / 5e9 = 2.4e-3 s.
    assert t["host_transfers"][0] == pytest.approx(4.6e-5 + 2.4e-3)
    assert t["host_optimizer"][0] == pytest.approx(5e-4)
    off = costing.vectors.offload
    assert off.host_bytes(0, o, 2.0)[0] == pytest.approx(4 * 1.25e5)  # the fp32 gradient only
    assert off.drive_bytes(0, o)[0] == pytest.approx(12 * 1.25e5)


def test_params_offload_by_hand(toy):
    costing = _fc_costing(toy)
    o = TrainingOptions(zero=3, microbatches=2, offload=("params",))
    t = costing.layer_time(0, o)
    # Each all-gather's shard in first, forward and backward, per micro-batch: 2 x 2 x 2 bytes x
    # 1.25e5 / 10e9 = 1e-4 s, behind 2 x 6e-6 of compute: 8.8e-5 s exposed; no CPU step.
    assert t["host_transfers"][0] == pytest.approx(8.8e-5)
    assert t["host_optimizer"][0] == 0.0
    # ZeRO-3 keeps (2 + 2 + 12) / 4 per element; without the weight shard (2 + 12) / 4 = 3.5.
    assert costing.layer_memory(0, o, 2.0)["model_state"][0] == pytest.approx(3.5 * 5e5)
    assert costing.vectors.offload.host_bytes(0, o, 2.0)[0] == pytest.approx(2 * 1.25e5)
    both = TrainingOptions(zero=3, offload=("optimizer", "params"))
    t = costing.layer_time(0, both)
    # Gradients out 2.1e-5 exposed (as above); no weights back (the host keeps them); the shards
    # in for one micro-batch 2 x 2 x 1.25e5 / 10e9 = 5e-5 behind 6e-6: 4.4e-5. Total 6.5e-5.
    assert t["host_transfers"][0] == pytest.approx(6.5e-5)
    assert costing.layer_memory(0, both, 2.0)["model_state"][0] == pytest.approx(0.5 * 5e5)  # 2 / 4


def test_activation_offload_by_hand():
    import graphs

    net = graphs.build("gpt2-small", 4)  # 12 repeated blocks
    blocks = sorted({b for b in net.blocks if b is not None})
    assert len(blocks) == 12
    machine = CalibratedMachine(dict(TOY, peak_tflops=1000, hbm_gbps=3000))
    costing = TrainingCosting(net, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers],
                              machine)
    plain, off = TrainingOptions(), TrainingOptions(offload=("activations",))
    # A double buffer of one block's activations: two of the twelve blocks' worth stay.
    assert kept_activation_share(12, True, off) == pytest.approx(2 / 12)
    assert kept_activation_share(12, False, off) == 1.0 and kept_activation_share(12, True, plain) == 1.0
    inside = [v for v, b in enumerate(net.blocks) if b is not None]
    outside = [v for v, b in enumerate(net.blocks) if b is None]
    for v in inside[:20]:
        a = costing.layer_memory(v, plain, 2.0)["activations"][0]
        assert costing.layer_memory(v, off, 2.0)["activations"][0] == pytest.approx(a * 2 / 12)
    for v in outside:
        assert costing.layer_memory(v, off, 2.0)["activations"][0] == costing.layer_memory(v, plain, 2.0)["activations"][0]
    # One block's copies: A = its stored bytes x 10/12 out at 20 GB/s during its forward (a third
    # of its compute C) and back at 10 GB/s during its backward (2C/3): only the excess shows.
    members = [v for v in inside if net.blocks[v] == blocks[0]]
    A = sum(costing.vectors.memory.all_stored_bytes(v, off, 2.0)[0] for v in members) * 10 / 12
    C = sum(costing.compute(v, off)[0] for v in members)
    excess = max(A / 20e9 - C / 3, 0.0) + max(A / 10e9 - 2 * C / 3, 0.0)
    assert excess > 0
    shown = sum(costing.layer_time(v, off)["host_transfers"][0] for v in members)
    assert shown == pytest.approx(excess)


def test_offload_without_a_host_side_is_refused():
    plain = dict(TOY)
    del plain["host"]
    costing = _fc_costing(CalibratedMachine(plain))
    with pytest.raises(ValueError, match="host side"):
        costing.layer_time(0, TrainingOptions(zero=1, offload=("optimizer",)))
    nodrive = dict(TOY, host={k: v for k, v in TOY["host"].items() if not k.startswith("nvme")})
    with pytest.raises(ValueError, match="needs a drive"):
        _fc_costing(CalibratedMachine(nodrive)).layer_time(0, TrainingOptions(zero=1, offload=("nvme",)))


def test_default_options_price_no_host_work(toy):
    costing = _fc_costing(toy)
    t = costing.layer_time(0, TrainingOptions(zero=1))
    assert "host_transfers" not in t and "host_optimizer" not in t


@pytest.mark.parametrize("text, canonical", [
    ("offload=optimizer", "offload=optimizer"),
    ("offload=params+optimizer,zero=3", "zero=3,offload=optimizer+params"),
    ("offload=activations+nvme", "offload=nvme+activations"),
    ("offload=none", "offload=none"),
])
def test_recipe_offload_in_canonical_order(text, canonical):
    assert parse_recipe(text).text() == canonical


@pytest.mark.parametrize("text, words", [
    ("offload=params,zero=2", "needs zero=3"),
    ("offload=disk", "must be none or optimizer"),
    ("offload=optimizer+optimizer", "twice"),
    ("offload=optimizer+nvme", "not both"),
    ("offload=activations,recompute=full", "without recomputation"),
    ("offload=optimizer,pp=2", "without a pipeline"),
])
def test_recipe_offload_refusals(text, words):
    with pytest.raises(ValueError, match=words):
        parse_recipe(text)


def test_options_check_offload():
    with pytest.raises(ValueError, match="offload"):
        TrainingOptions(offload=("params", "optimizer"))  # not in canonical order
    with pytest.raises(ValueError, match="not both"):
        TrainingOptions(offload=("optimizer", "nvme"))


def test_host_sides_of_the_presets():
    from pase.machines.registry import load_machine

    h100 = host_side(load_machine("h100-sxm"))
    assert h100.h2d_bytes_per_s == 35e9 and h100.memory_bytes == 2048e9 and not h100.has_nvme
    gh = host_side(load_machine("gh200"))
    assert gh.h2d_bytes_per_s == 346e9 and gh.memory_bytes == 480e9
    assert gh.optimizer_params_per_s == pytest.approx(1.3 * 1.4e9)  # GraceAdam 1.3x CPU-Adam
    assert host_side(load_machine("paper")) is None
    assert {"h100-sxm", "gh200", "gb200-nvl72", "gb300-nvl72"} <= set(preset_hosts())
    for name, host in preset_hosts().items():
        validate_host(host, name)
        assert set(host["sources"]) >= {"h2d_gbps", "d2h_gbps", "memory_gb", "optimizer_params_per_s"}


@pytest.mark.parametrize("host, words", [
    ({"h2d_gbps": 1}, "host is missing d2h_gbps"),
    (dict(TOY["host"], h2d_gbps=-1), "host.h2d_gbps must be a positive number"),
    (dict(TOY["host"], pcie=5), "host has no field 'pcie'"),
    ({k: v for k, v in TOY["host"].items() if k != "nvme_gb"}, "both nvme_gbps and nvme_gb"),
    ("fast", "host must be an object"),
])
def test_machine_file_host_is_checked(tmp_path, host, words):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(dict(TOY, host=host)))
    status, _, err = run("-g", "gpt2-small", "-p", "4", "-b", "8", "--machine", str(path))
    assert status == 2 and words in err and err.count("\n") == 1


def _plan_json(*argv):
    status, out, err = run(*argv, "--json")
    assert status == 0, err
    return json.loads(out)["training"]


def test_the_70b_plan_offloads_on_h100_and_gh200_is_faster():
    argv = ("-g", "hf:" + os.path.join(ROOT, "examples/hf/llama-3.1-70b.json"), "-p", "8", "-b", "64", "-m", "4096")
    h100 = _plan_json(*argv, "--machine", "h100-sxm")
    assert "offload=" in h100["recipe"] and h100["host_memory_bytes"] > 0
    assert "host_optimizer" in h100["causes"] and "host_transfers" in h100["causes"]
    assert h100["peak_memory_bytes"] <= 79.65 * 2**30
    # 70.55e9 parameters over tp 8 with dp 1: 8.82e9 per device, whose optimizer state the node's
    # CPU steps for its 8 GPUs: 8 x 8.82e9 / 1.4e9 = 50.4 s (plan: offload=optimizer, zero=1).
    if h100["recipe"].endswith("offload=optimizer") and "dp=1,tp=8" in h100["recipe"]:
        assert h100["causes"]["host_optimizer"] == pytest.approx(8 * 70553706496 / 8 / 1.4e9, rel=1e-6)
        assert h100["host_memory_bytes"] == pytest.approx(16 * 70553706496 / 8, rel=1e-6)
    gh = _plan_json(*argv, "--machine", "gh200", "--recipe", h100["recipe"])
    assert gh["recipe"] == h100["recipe"]
    assert gh["step_seconds"] <= 0.8 * h100["step_seconds"]
    _, text, _ = run(*argv, "--machine", "h100-sxm")
    assert "host transfers (offload)" in text and "offload=" in text


def test_offload_none_names_the_offload_that_fits():
    status, _, err = run("-g", "hf:" + os.path.join(ROOT, "examples/hf/llama-3.1-70b.json"), "-p", "8", "-b", "64", "-m", "4096",
                         "--machine", "h100-sxm", "--recipe", "offload=none")
    assert status == 4
    assert "fits with offload=" in err and "of host memory per node" in err


def test_nothing_fits_stays_when_offload_cannot_help():
    # 1 MB per device: not even the activations of a micro-batch fit, offload or not.
    status, _, err = run("-g", "gpt2-small", "-p", "2", "-b", "8", "--machine", "h100-sxm", "--memory", "0.001")
    assert status == 4 and "fits with offload" not in err


def test_exports_write_the_engines_offload_settings():
    from pase.costing.training import TrainingOptions as T
    from pase.outputs.engines import deepspeed_settings, megatron_settings
    from pase.planning.engine_runs import offload_refusal
    from pase.planning.training_plan import plan_training
    import graphs

    build = lambda b: graphs.build("llama3-8b", b, 512)  # noqa: E731
    plan = plan_training(build, 8, 8, "h100-sxm", recipe=parse_recipe("dp=8,tp=1,zero=1,offload=optimizer"),
                         free=False, engine="megatron")
    args = megatron_settings(plan)["arguments"]
    assert args["--optimizer-cpu-offload"] is True and args["--optimizer-offload-fraction"] == 1.0
    assert args["--overlap-cpu-optimizer-d2h-h2d"] is True
    plan = plan_training(build, 8, 8, "h100-sxm", recipe=parse_recipe("dp=8,tp=1,zero=3,offload=optimizer+params"),
                         free=False, engine="deepspeed")
    zero = deepspeed_settings(plan)["config"]["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    # Who runs what (offload.md): Megatron no parameter offload, torchtitan all three together.
    assert offload_refusal("megatron", ("params",)) is not None
    assert offload_refusal("torchtitan", ("optimizer",)) is not None
    assert offload_refusal("torchtitan", ("optimizer", "params")) is None
    assert offload_refusal("deepspeed", ("nvme", "params")) is None
    assert T().offload == ()


def test_exported_offload_settings_are_the_engines_own(monkeypatch):
    # Checked against megatron-core 0.16.1's and DeepSpeed's own configuration classes (as
    # tests/test_engine_exports_committed.py checks the other settings).
    import engine_checks as check
    from pase.outputs.engines import deepspeed_settings, megatron_settings
    from pase.planning.training_plan import plan_training
    import graphs

    pytest.importorskip("megatron.core")
    build = lambda b: graphs.build("llama3-8b", b, 512)  # noqa: E731
    plan = plan_training(build, 8, 8, "h100-sxm", recipe=parse_recipe("dp=8,tp=1,zero=1,offload=optimizer"),
                         free=False, engine="megatron")
    args = megatron_settings(plan)["arguments"]
    assert not check.megatron_flag_problems(args)
    check.megatron_accepts(args, 8)  # the rest of the arguments still build megatron-core's configs
    for flag in ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"):
        assert flag in check.megatron_flag_fields()  # OptimizerConfig's fields, by megatron-core's own names
    plan = plan_training(build, 8, 8, "h100-sxm", recipe=parse_recipe("dp=8,tp=1,zero=3,offload=optimizer+params"),
                         free=False, engine="deepspeed")
    ds = check.deepspeed_accepts(deepspeed_settings(plan)["config"], 8, monkeypatch)
    assert ds.zero_config.offload_optimizer.device == "cpu" and ds.zero_config.offload_param.device == "cpu"
