"""Issue 42: GPT-OSS's expert activation stops Megatron's host a second time in every MoE block
(megatron-core 0.16.1 fusions/fused_bias_geglu.py:434 builds its offset tensor from a Python
float each call, a blocking copy), so the block's MoE host time adds to the device's instead of
hiding behind it. Worked out by hand on a toy network, declared by the network (the layer's
``activation``), stated by the engine (``expert_activation_sync``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import run
from pase.costing.training import TrainingCosting, TrainingOptions
from pase.machines.calibrated import CalibratedMachine
from pase.model.builder import GraphBuilder
from pase.model.layers import MoE, RMSNorm
from pase.model.tensor import Tensor
from pase.planning.engine import ENGINE_NAMES, load_engine
from pase.planning.mesh_rows import row_totals

#: 1 TFLOPS, 1 GB/s of memory (tests/test_moe_host.py's toy machine).
BASE = {"name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
        "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
        "act_bytes": 2, "grad_bytes": 4}


def _costing(activations):
    """One block per entry of ``activations``: an RMSNorm and a MoE of 16 experts of width 64,
    top 2, on tokens (4, 4) of width 32, with that activation."""
    g = GraphBuilder("sync", 1, batch=4)
    x = g.input((4, 4, 32), "x", letters="ble")
    for i, activation in enumerate(activations):
        with g.block():
            h = g.add(f"block{i}.norm", RMSNorm(x))
            x = g.add(f"block{i}.moe", MoE(h, 16, 2, 64, activation=activation))
    net = g.build()
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    return net, TrainingCosting(net, ones, CalibratedMachine(BASE))


def _step(costing, **options):
    step, _, _ = row_totals(costing, TrainingOptions(microbatches=2, **options), 2.0, np.zeros((0, 1)), [])
    return float(step[0])


def test_the_waiting_blocks_add_their_host_time_to_the_device():
    _, costing = _costing(["quick_geglu", "quick_geglu"])
    # No host time: 2 micro-batches of the device's own work (under a millisecond each), then
    # the optimizer.
    plain = _step(costing)
    host = dict(moe_block_overhead_seconds=1e-2)
    # Hidden behind the device (Qwen3's case): the host floor, 2 blocks x 10 ms a micro-batch,
    # bounds the step: the optimizer plus 2 x 20 ms, the device's work not counted.
    floored = _step(costing, **host)
    # The optimizer after the micro-batches, 28 B a parameter at 1 GB/s: per block its norm 32,
    # router 32 x 16 and 3 x 16 x 32 x 64 expert weights, 98,848 (tests/test_moe_host.py).
    optimizer = 28 * 2 * 98_848 / 1e9
    assert 0 < plain - optimizer < 2e-3
    assert floored == pytest.approx(optimizer + 2 * 2 * 1e-2, rel=1e-9)
    # Serialised (the activation stops the host): the device's work plus 2 x 2 x 10 ms.
    serial = _step(costing, expert_activation_sync="quick_geglu", **host)
    assert serial == pytest.approx(plain + 2 * 2 * 1e-2, rel=1e-9)
    # The engine naming another activation leaves the host hidden.
    assert _step(costing, expert_activation_sync="swiglu", **host) == pytest.approx(floored, rel=1e-12)


def test_a_block_that_does_not_wait_still_floors_the_step():
    _, costing = _costing(["quick_geglu", "quick_geglu", "swiglu"])
    host = dict(moe_block_overhead_seconds=1e-2)
    # Per micro-batch the device's work plus 2 x 10 ms of waits (under 23 ms) against the host's
    # 3 x 10 ms: the host floor still bounds the step, as without the wait.
    assert _step(costing, expert_activation_sync="quick_geglu", **host) == pytest.approx(_step(costing, **host),
                                                                                        rel=1e-12)


def test_the_wait_is_per_layer_and_recomputed_with_the_forward():
    net, costing = _costing(["quick_geglu", "swiglu"])
    moe = [v for v, layer in enumerate(net.layers) if layer.op == "MoE"]
    assert len(moe) == 2
    o = TrainingOptions(moe_block_overhead_seconds=0.01, expert_activation_sync="quick_geglu")
    bare = TrainingOptions(moe_block_overhead_seconds=0.01)
    waits = [float(np.asarray(costing.layer_time(v, o)["compute"])[0] - np.asarray(costing.layer_time(v, bare)["compute"])[0])
             for v in moe]
    assert waits == pytest.approx([0.01, 0.0], abs=1e-15)
    # Full recomputation runs the forward again, its wait with it: a third more (FORWARD_SHARE).
    # Two waiting blocks (a network of one block recomputes none of it): 2 micro-batches x 2
    # blocks x 10 ms x 4/3, the device's time above the host's 2 x 10 ms x 4/3 a micro-batch.
    _, two = _costing(["quick_geglu", "quick_geglu"])
    host = dict(moe_block_overhead_seconds=1e-2, expert_activation_sync="quick_geglu")
    again = _step(two, recompute="full", **host) - _step(two, recompute="full")
    assert again == pytest.approx(2 * 2 * 1e-2 * 4 / 3, rel=1e-9)


def test_the_layer_declares_its_activation():
    x = Tensor((4, 32), "ae")
    assert MoE(x, 4, 2, 8).activation == "swiglu" and "activation" not in MoE(x, 4, 2, 8).args
    assert MoE(x, 4, 2, 8, activation="quick_geglu").args["activation"] == "quick_geglu"
    with pytest.raises(ValueError, match="activation must be one of swiglu, quick_geglu"):
        MoE(x, 4, 2, 8, activation="relu")
    with pytest.raises(ValueError, match="needs gated experts"):
        MoE(x, 4, 2, 8, gated=False, activation="quick_geglu")


def test_megatron_states_the_sync_and_no_other_engine_does():
    assert load_engine("megatron")["expert_activation_sync"] == "quick_geglu"
    assert "fused_bias_geglu.py:434" in load_engine("megatron").sources["expert_activation_sync"]
    for name in ENGINE_NAMES:
        if name != "megatron":
            assert load_engine(name)["expert_activation_sync"] == "none", name
    with pytest.raises(ValueError, match="expert_activation_sync must be one of"):
        TrainingOptions(expert_activation_sync="gelu")


def test_gpt_oss_is_read_with_its_activation_and_the_plan_says_why(tmp_path):
    status, out, err = run("-g", "hf:examples/hf/gpt-oss-120b.json", "-p", "64", "-b", "1280", "-m", "4096",
                           "--machine", "gb300-nvl72", "--engine", "megatron",
                           "--recipe", "dp=64,tp=1,pp=1,zero=1,ep=64,microbatch=4", "--json")
    assert status == 0, err
    step = json.loads(out)["training"]["step_seconds"]
    status, out, err = run("-g", "hf:examples/hf/gpt-oss-120b.json", "-p", "64", "-b", "1280", "-m", "4096",
                           "--machine", "gb300-nvl72", "--engine", "megatron,expert_activation_sync=none",
                           "--recipe", "dp=64,tp=1,pp=1,zero=1,ep=64,microbatch=4", "--json")
    assert status == 0, err
    hidden = json.loads(out)["training"]["step_seconds"]
    # 5 micro-batches (1280 / 64 / 4) x 36 MoE blocks x 9.4 ms = 1.692 s more; the device's own
    # work (about 2.45 s) is above the host's 1.692 s, so nothing of it showed before.
    assert step - hidden == pytest.approx(5 * 36 * 0.0094, rel=1e-6)
    status, out, err = run("-g", "hf:examples/hf/gpt-oss-120b.json", "-p", "64", "-b", "1280", "-m", "4096",
                           "--machine", "gb300-nvl72", "--engine", "megatron",
                           "--recipe", "dp=64,tp=1,pp=1,zero=1,ep=64,microbatch=4")
    assert status == 0, err
    assert "the experts' activation (quick_geglu) stops the host again inside each of the 36" in out
    # Mixtral's SwiGLU experts do not wait: no such line.
    status, out, err = run("-g", "hf:examples/hf/mixtral-8x7b.json", "-p", "16", "-b", "32", "-m", "512",
                           "--machine", "h100-sxm", "--engine", "megatron")
    assert status == 0, err
    assert "stops the host again" not in out


def test_a_fit_adds_the_waited_host_time_to_the_device():
    from pase.planning.calibrate_runs import RunTerms, _steps

    # 10 block slots, none recomputed, 10 ms of fitted host time a block, 50 ms of stated MoE
    # host time of which the device waits 30 ms: device 0.1 + 0.03 = 0.13 s against the host's
    # 10 x 10 ms + 50 ms = 0.15 s; with 1 s of device work, 1.03 s.
    p = np.array([1.0, 1.0, 1.0, 0.01, 0.0, 0.0])
    short = RunTerms(0.1, (0.0, 0.0), (0.0, 0.0), 10.0, 0.0, moe_host=0.05, moe_wait=0.03)
    long = RunTerms(1.0, (0.0, 0.0), (0.0, 0.0), 10.0, 0.0, moe_host=0.05, moe_wait=0.03)
    assert short.step(p) == pytest.approx(0.15)
    assert long.step(p) == pytest.approx(1.03)
    # The vectorised steps the fit minimises agree.
    assert _steps([short, long])(p) == pytest.approx([0.15, 1.03])


def test_a_priced_run_knows_its_waiting_blocks(tmp_path):
    from pase.machines.registry import load_machine
    from pase.planning.calibrate_runs import price_runs, run_terms
    from pase.planning.measured_runs import read_runs

    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [
        {"name": "oss", "graph": "hf:examples/hf/gpt-oss-120b.json", "devices": 64, "batch": 1280, "sequence": 4096,
         "recipe": "dp=64,tp=1,pp=1,zero=1,ep=64,microbatch=4", "step_seconds": 4.27},
        {"name": "qwen", "graph": "hf:examples/hf/qwen3-30b-a3b.json", "devices": 16, "batch": 1024,
         "sequence": 4096, "recipe": "dp=16,tp=1,ep=16,zero=1,microbatch=1", "step_seconds": 29.3}]}))
    runs = read_runs(str(path))
    oss, qwen = price_runs(runs, load_machine("gb300-nvl72"), load_engine("megatron"))
    # Every GPT-OSS block holds quick_geglu experts; Qwen3's hold SwiGLU ones.
    assert (oss.expert_share, oss.waiting_share) == (1.0, 1.0)
    assert (qwen.expert_share, qwen.waiting_share) == (1.0, 0.0)
    # 5 micro-batches x 36 blocks x 9.4 ms, waited for and in the floor alike.
    t = run_terms(oss, load_machine("gb300-nvl72"), 0.0094)
    assert t.moe_wait == pytest.approx(5 * 36 * 0.0094) and t.moe_host == pytest.approx(t.moe_wait)
    assert run_terms(qwen, load_machine("gb300-nvl72"), 0.0094).moe_wait == 0.0


def test_no_export_drops_the_activation():
    # Megatron's writer and torchtitan's launch name no argument for GPT-OSS's quick-GeGLU: both
    # refuse the model by name rather than write SwiGLU experts.
    args = ["-g", "hf:examples/hf/gpt-oss-120b.json", "-p", "64", "-b", "256", "-m", "4096", "--machine", "h100-sxm"]
    status, out, err = run(*args, "--engine", "megatron", "--export-megatron", "never-written.sh")
    assert status == 2 and "moe activation quick_geglu" in err
    status, out, err = run(*args, "--engine", "torchtitan", "--export-torchtitan", "never-written.sh")
    assert status == 2 and "quick_geglu experts" in err
