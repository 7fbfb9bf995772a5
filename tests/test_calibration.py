"""In-step compute (the machine's sustained clock, the fitted step efficiency, attention by
sequence and head width) and the stated band, against values worked out by hand."""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from pase.costing.training import (
    DEFAULT_ATTENTION_EFFICIENCY, FLASH_BACKWARD_FACTOR, TrainingCosting, TrainingOptions, attention_shape_factor,
)
from pase.machines.calibrated import CalibratedMachine, validate_description
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, Einsum, Softmax
from pase.outputs.training import band_overlap, bands, fit_word, is_tie
from pase.planning.engine import BAND_FLOOR, STEP_COMPUTE_EFFICIENCY, band_of, engine_dir, load_engine

from cli_runner import run

TOY = {
    "name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
    "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
    "act_bytes": 2, "grad_bytes": 4,
}


def _fc_net():
    g = GraphBuilder("fc", 1, batch=8)
    x = g.input((8, 1000), "x", letters="bk")
    g.add("fc", FC(x, 500))
    return g.build()


def test_sustained_clock_and_step_efficiency_slow_every_kernel():
    # FC 8 x 1000 -> 500 batch-split 4 ways: 6 x 2 x 500 x 1000 / 1e12 = 6e-6 s at peak. A
    # machine sustaining half its measured clock: 1.2e-5 s; and at a step efficiency of 0.8:
    # 6e-6 / (0.5 x 0.8) = 1.5e-5 s.
    machine = CalibratedMachine(dict(TOY, clock_ratio=0.5))
    costing = TrainingCosting(_fc_net(), [np.array([[4, 1, 1]])], machine)
    assert costing.compute(0, TrainingOptions())[0] == pytest.approx(1.2e-5)
    assert costing.compute(0, TrainingOptions(compute_efficiency=0.8))[0] == pytest.approx(1.5e-5)
    # The machine's own kernels (the per-layer search) keep the measured times.
    assert float(machine.gemm_seconds(2, 500, 1000, 1)) == pytest.approx(6e-6)


def test_clock_ratio_is_checked():
    assert validate_description(dict(TOY, clock_ratio=0.8))["clock_ratio"] == 0.8
    for bad in (0, 1.5, True, "x"):
        with pytest.raises(ValueError, match="clock_ratio must be a number in"):
            validate_description(dict(TOY, clock_ratio=bad))


def test_attention_by_sequence_and_head_width():
    # s / (s + 512) x (d / (d + 16)) / (128 / 144): 512 and 128 -> 0.5; 8192 and 64 ->
    # 8192/8704 x 0.8/0.8889 = 0.9412 x 0.9 = 0.8471; 4096 and 128 -> 4096/4608 = 0.8889.
    assert float(attention_shape_factor(512, 128)) == pytest.approx(0.5)
    assert float(attention_shape_factor(8192, 64)) == pytest.approx(8192 / 8704 * 0.9)
    assert float(attention_shape_factor(4096, 128)) == pytest.approx(4096 / 4608)
    # On a 2 x 2 heads x 8 tokens x width 4 causal core: 2 x 2 x (2 x 2 x 8 x 8 x 4) / 2 x 3.5
    # FLOPs at 0.3 of 1 TFLOPS, over the factor 8/520 x (4/20)/(128/144).
    # Roles as a decoder declares them: the core is found by its heads and sequences.
    g = GraphBuilder("attention", 1, batch=2, roles={"b": "batch", "h": "heads", "l": "sequence",
                                                     "m": "key_sequence", "k": "head_width"})
    q = g.input((2, 2, 8, 4), "q", letters="bhlk")
    k = g.input((2, 2, 8, 4), "k", letters="bhmk")
    v = g.input((2, 2, 8, 4), "v", letters="bhmk")
    scores = g.add("block1.scores", Einsum("bhlk,bhmk->bhlm", q, k))
    weights = g.add("block1.softmax", Softmax(scores, axis=3, causal=True))
    g.add("block1.context", Einsum("bhlm,bhmk->bhlk", weights, v))
    net = g.build()
    costing = TrainingCosting(net, [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers],
                              CalibratedMachine(TOY))
    flops = 2 * 2 * (2 * 2 * 8 * 8 * 4) / 2 * (1 + FLASH_BACKWARD_FACTOR)
    factor = 8 / 520 * (4 / 20) / (128 / 144)
    assert DEFAULT_ATTENTION_EFFICIENCY == 0.3
    shaped = costing.compute(0, TrainingOptions(attention_shape=True))[0]
    assert shaped == pytest.approx(flops / (1e12 * 0.3) / factor)


def _candidate(step, peak, engine, cap=None):
    summary = SimpleNamespace(step_seconds=step, peak_memory_bytes=peak, extra={})
    # No stranded bytes: what tensors need is the peak.
    return SimpleNamespace(summary=summary, options=SimpleNamespace(engine=engine), memory_cap=cap,
                           needed_memory_bytes=lambda: peak)


def test_bands_by_hand(tmp_path):
    with open(os.path.join(engine_dir(), "fsdp.json")) as f:
        data = json.load(f)
    data["name"] = "banded"
    data["band"] = {"step": [0.8, 1.2], "memory": [0.99, 1.01]}
    path = tmp_path / "banded.json"
    path.write_text(json.dumps(data))
    profile = load_engine(str(path))
    # The step band as stated; the memory band widened to the 10 % floor either side.
    assert band_of(profile, "step") == (0.8, 1.2)
    assert band_of(profile, "memory") == (1.0 - BAND_FLOOR["memory"], 1.0 + BAND_FLOOR["memory"]) == (0.9, 1.1)
    c = _candidate(2.0, 50e9, str(path), cap=52e9)
    step, memory = bands(c)
    assert step == pytest.approx([1.6, 2.4]) and memory == pytest.approx([45e9, 55e9])
    # 50 GB fits 52 GB at the modelled peak, not at the band's high end 55 GB: tight.
    assert fit_word(c, 52e9) == "tight" and fit_word(c, 60e9) == "fits" and fit_word(c, 40e9) == "does-not-fit"
    # Overlap as a share of the narrower band: [1, 2] and [1.5, 3]: 0.5 / 1 (not a tie);
    # [1, 2] and [1.4, 2.4]: 0.6 (a tie).
    assert band_overlap([1, 2], [1.5, 3]) == pytest.approx(0.5)
    assert band_overlap([1, 2], [1.4, 2.4]) == pytest.approx(0.6)
    assert not is_tie(_candidate(2.0, 1, str(path)), _candidate(2.5, 1, str(path)))  # [1.6,2.4] v [2,3]: 0.4/0.8
    assert is_tie(_candidate(2.0, 1, str(path)), _candidate(2.2, 1, str(path)))  # [1.6,2.4] v [1.76,2.64]: 0.8


def test_the_shipped_constant_and_bands():
    assert STEP_COMPUTE_EFFICIENCY == 0.84  # benchmarks/fit_constants.py over every visible source
    for name in ("megatron", "torchtitan", "fsdp", "deepspeed"):
        low, high = band_of(load_engine(name), "step")
        assert low < 1.0 < high


def test_cli_prints_the_band():
    status, out, err = run("-g", "gpt2-small", "-p", "4", "-b", "8", "--training", "--machine", "h100-sxm", "--json")
    assert status == 0, err
    t = json.loads(out)["training"]
    low, high = band_of(load_engine("megatron"), "step")
    assert t["step_seconds_band"] == pytest.approx([t["step_seconds"] * low, t["step_seconds"] * high])
    assert t["fit"] in ("fits", "tight")
    status, out, err = run("-g", "gpt2-small", "-p", "4", "-b", "8", "--training", "--machine", "h100-sxm")
    assert ", band " in out
