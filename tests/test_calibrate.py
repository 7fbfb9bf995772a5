"""``pase calibrate`` (``pase/machines/calibration.py``, ``pase/cli/calibrate.py``): grids, the files it writes, its errors.

No GPU here: a fake timer stands in for the measurements; the torch code that builds the
measured steps runs on the CPU when PyTorch is installed (skipped otherwise).
"""

from __future__ import annotations

import io
import json
import os
import sys
import types

import numpy as np
import pytest

from pase.machines.calibration import (
    ATTENTION_BACKWARD_FACTOR,
    TORCH_HINT,
    attention_flops,
    attention_grid,
    attention_step,
    calibrate,
    gemm_grid,
    memory_bound_step,
    gemm_step,
    memory_grid,
)
from pase.cli.calibrate import main
from pase.machines.registry import load_machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "pase", "machines", "data", "h100-sxm-measured.json")


class FakeTimer:
    """A device whose GEMM step costs 2 us plus its FLOPs at 500 TFLOPS, whose
    memory-bound work costs 1 us plus 4 bytes per element at 1 TB/s, and whose causal
    attention step costs 100 us plus its modelled FLOPs at 500 TFLOPS."""

    device_name = "Fake GPU"
    software = "fake timer"
    memory_bytes = 24e9

    def __init__(self):
        self.calls = 0

    def gemm(self, b, m, n, k):
        self.calls += 1
        return 2e-6 + 6.0 * b * m * n * k / 500e12

    def memory_bound(self, op, elements):
        self.calls += 1
        return 1e-6 + 4.0 * elements / 1e12

    def attention(self, b, h, s, d):
        self.calls += 1
        return 1e-4 + 4.0 * b * h * s * s * d / 2 * 3.5 / 500e12


def test_full_grids_are_the_shipped_tables_grids():
    with open(SHIPPED) as f:
        shipped = json.load(f)
    assert sorted(gemm_grid()) == sorted(tuple(r[:4]) for r in shipped["gemm"])
    assert sorted(memory_grid()) == sorted((r[0], r[1]) for r in shipped["memory_bound"])


def test_quick_grid_has_two_values_on_every_axis():
    shapes = np.array(gemm_grid(quick=True))
    for j in range(4):
        assert len(np.unique(shapes[:, j])) >= 2
    assert max(2 * b * max(m * k, k * n, m * n) for b, m, n, k in shapes) <= 4e9  # no tensor over 4 GB


def test_calibrate_writes_a_machine_that_loads_back(tmp_path):
    out = tmp_path / "mygpu.json"
    timer = FakeTimer()
    desc = calibrate(str(out), quick=True, timer=timer)
    assert timer.calls == len(gemm_grid(True)) + len(memory_grid(True)) + len(attention_grid())
    assert json.loads(out.read_text()) == desc
    assert desc["measured"] == "mygpu-measured.json" and (tmp_path / "mygpu-measured.json").is_file()
    assert desc["name"] == "mygpu" and desc["device"] == "Fake GPU"
    assert desc["memory_gb"] == 24.0  # the device's memory: 24e9 bytes
    # The best rates measured: the largest quick GEMM, 16384^3 at B = 1:
    # 6 * 16384^3 / (2e-6 + 6 * 16384^3 / 500e12) FLOP/s, just under 500 TFLOPS.
    flop = 6.0 * 16384 ** 3
    assert desc["peak_tflops"] == round(flop / (2e-6 + flop / 500e12) / 1e12, 1)
    # add at 2^30 elements moves 3 elements of 2 bytes each in 1 us + 4 * 2^30 / 1e12 s.
    e = 1024 * 16 ** 5
    best_add = 3 * 2 * e / (1e-6 + 4.0 * e / 1e12) / 1e9
    best_gelu = 5 * 2 * e / (1e-6 + 4.0 * e / 1e12) / 1e9  # gelu moves 5: the best
    assert desc["hbm_gbps"] == round(max(best_add, best_gelu), 1)
    m = load_machine(str(out))
    assert m.name == "mygpu" and m.cost_unit == "seconds"
    # Grid points give back what the timer said.
    assert float(m.gemm_seconds(16, 512, 8, 64)) == pytest.approx(FakeTimer().gemm(16, 512, 8, 64), rel=1e-12)
    assert float(m.memory_bound("softmax", 1024 * 16)) == pytest.approx(1e-6 + 4.0 * 16384 / 1e12, rel=1e-12)


def test_calibrate_takes_the_fields_it_is_given(tmp_path):
    desc = calibrate(str(tmp_path / "c.json"), quick=True, timer=FakeTimer(), name="lab", devices_per_node=4,
                     memory_gb=40, peak_tflops=312, hbm_gbps=2000, inter_node={"gbps": 25, "latency_us": 5})
    assert (desc["name"], desc["devices_per_node"], desc["memory_gb"]) == ("lab", 4, 40)
    assert (desc["peak_tflops"], desc["hbm_gbps"], desc["inter_node"]) == (312, 2000, {"gbps": 25, "latency_us": 5})
    assert desc["intra_node"] == {"gbps": 450, "latency_us": 3}


def test_attention_grid_and_its_flops():
    from pase.costing.training import FLASH_BACKWARD_FACTOR

    assert ATTENTION_BACKWARD_FACTOR == FLASH_BACKWARD_FACTOR  # priced as it is measured
    assert attention_grid() == [(1, 32, 2048, 128), (1, 32, 4096, 128), (1, 32, 8192, 128),
                                (4, 16, 2048, 128), (4, 16, 4096, 128), (4, 16, 8192, 128)]
    # b=1, h=32, s=4096, d=128: 4 * 32 * 4096^2 * 128 / 2 (causal) * 3.5 = 481,036,337,152 FLOPs
    assert attention_flops(1, 32, 4096, 128) == 481_036_337_152


def test_calibrate_writes_the_median_attention_efficiency(tmp_path):
    desc = calibrate(str(tmp_path / "a.json"), quick=True, timer=FakeTimer(), peak_tflops=1000)
    # Modelled FLOPs of the six shapes, in units of F = 4 * 2^20 * 128 / 2 * 3.5 (s = 2048 at
    # b*h = 1): b*h*(s/2048)^2 = 32, 128, 512 at b*h = 32 and 64, 256, 1024 at b*h = 64.
    # Efficiency F'/(t * 1e15), t = 1e-4 + F'/5e14, rises with F': the median is the mean of
    # the 3rd and 4th, 128 F (1, 32, 4096) and 256 F (4, 16, 4096).
    f = 4 * 2048 ** 2 * 128 / 2 * 3.5
    lo, hi = 128 * f, 256 * f                          # 4.81e11 and 9.62e11 FLOPs
    e_lo = lo / ((1e-4 + lo / 500e12) * 1e15)          # 0.45290...
    e_hi = hi / ((1e-4 + hi / 500e12) * 1e15)          # 0.47529...
    assert desc["attention_efficiency"] == round((e_lo + e_hi) / 2, 3) == 0.464
    table = json.loads((tmp_path / "a-measured.json").read_text())
    assert [tuple(r[:4]) for r in table["attention"]] == attention_grid()
    row = table["attention"][1]
    assert row[4] == pytest.approx(1e-4 + lo / 500e12) and row[5] == round(e_lo, 4)
    assert "scaled_dot_product_attention" in table["attention_note"]
    m = load_machine(str(tmp_path / "a.json"))
    assert m.attention_efficiency == 0.464 and m.describe()["attention_efficiency"] == 0.464


def test_attention_efficiency_is_capped_at_one(tmp_path):
    # At a stated peak of 1 TFLOPS the fake device runs attention far above "peak".
    desc = calibrate(str(tmp_path / "a.json"), quick=True, timer=FakeTimer(), peak_tflops=1)
    assert desc["attention_efficiency"] == 1.0


def test_calibrate_without_attention(tmp_path):
    timer = FakeTimer()
    desc = calibrate(str(tmp_path / "n.json"), quick=True, timer=timer, attention=False)
    assert timer.calls == len(gemm_grid(True)) + len(memory_grid(True))
    assert "attention_efficiency" not in desc
    assert "attention" not in json.loads((tmp_path / "n-measured.json").read_text())
    assert load_machine(str(tmp_path / "n.json")).attention_efficiency is None


def test_main_with_a_timer(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    path = str(tmp_path / "g.json")
    assert main(["--out", path, "--quick", "--devices-per-node", "4"], out, err, timer=FakeTimer()) == 0
    assert out.getvalue().startswith(f"wrote {path} (Fake GPU")
    assert ", fused attention at " in out.getvalue()
    assert load_machine(path).devices_per_node == 4
    assert load_machine(path).attention_efficiency is not None


def test_main_no_attention(tmp_path):
    timer = FakeTimer()
    path = str(tmp_path / "g.json")
    status, out, _ = run(["--out", path, "--quick", "--no-attention"], timer=timer)
    assert status == 0 and "fused attention" not in out
    assert timer.calls == len(gemm_grid(True)) + len(memory_grid(True))
    assert load_machine(path).attention_efficiency is None


def run(argv, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out, err, **kwargs)
    return status, out.getvalue(), err.getvalue()


def test_without_torch_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    status, out, err = run(["--out", str(tmp_path / "x.json")])
    assert status == 1 and out == ""
    assert err == f"pase calibrate: error: {TORCH_HINT}\n"
    assert not (tmp_path / "x.json").exists()


def test_without_a_gpu_one_line(tmp_path, monkeypatch):
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    status, out, err = run(["--out", str(tmp_path / "x.json"), "--quick"])
    assert status == 1
    assert err == "pase calibrate: error: pase calibrate needs a CUDA GPU, and PyTorch sees none on this machine\n"


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --out"),
    (["--out", "x.txt"], "--out must name a .json file"),
    (["--out", "/no/such/dir/x.json"], "--out: no such directory"),
    (["--out", "x.json", "--devices-per-node", "0"], "expected a positive number, got '0'"),
    (["--out", "x.json", "--inter-latency-us", "-1"], "expected a non-negative number"),
])
def test_usage_errors_exit_2(argv, message):
    status, out, err = run(argv, timer=FakeTimer())
    assert status == 2 and out == ""
    assert err.startswith("pase calibrate: error: ") and message in err and err.count("\n") == 1


def test_output_that_is_a_directory(tmp_path):
    (tmp_path / "x.json").mkdir()
    status, _, err = run(["--out", str(tmp_path / "x.json"), "--quick"], timer=FakeTimer())
    assert status == 2 and err == f"pase calibrate: error: --out: {tmp_path / 'x.json'} is a directory\n"


def test_write_errors_are_one_line_and_leave_nothing_behind(tmp_path, monkeypatch):
    import os

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(os, "replace", refuse)  # the last step of every (atomic) write
    status, _, err = run(["--out", str(tmp_path / "x.json"), "--quick"], timer=FakeTimer())
    assert status == 1 and err.startswith("pase calibrate: error: cannot write ") and err.count("\n") == 1
    assert "Permission denied" in err
    assert os.listdir(tmp_path) == []  # no half-written table or temporary file


# -- the measured steps, on the CPU ----------------------------------------------------------


def test_gemm_step_computes_the_three_products():
    torch = pytest.importorskip("torch")
    step = gemm_step(torch, "cpu", 3, 8, 16, 32)
    y, dx, dw = step()
    x, w, dy = (t.float() for t in step.inputs)
    assert (tuple(y.shape), tuple(dx.shape), tuple(dw.shape)) == ((3, 8, 16), (3, 8, 32), (3, 32, 16))
    # bf16 results: compare at bf16 precision
    torch.testing.assert_close(y.float(), x @ w, rtol=2e-2, atol=0.5)
    torch.testing.assert_close(dx.float(), dy @ w.transpose(-1, -2), rtol=2e-2, atol=0.5)
    torch.testing.assert_close(dw.float(), x.transpose(-1, -2) @ dy, rtol=2e-2, atol=0.5)
    assert gemm_step(torch, "cpu", 1, 4, 5, 6)()[0].shape == (4, 5)  # B = 1: a plain GEMM


@pytest.mark.parametrize("op, grads", [("add", 2), ("gelu", 1), ("layer_norm", 3), ("softmax", 1)])
def test_memory_bound_steps_run_forward_and_backward(op, grads):
    torch = pytest.importorskip("torch")
    step = memory_bound_step(torch, "cpu", op, 4096)
    out = step()
    assert len(out) == grads and tuple(out[0].shape) == (4, 1024)
    if op == "add":  # d(x + y)/dx = 1: the incoming gradient itself
        torch.testing.assert_close(out[0], step.inputs[-1])
    with pytest.raises(ValueError, match="multiples of 1024"):
        memory_bound_step(torch, "cpu", op, 1000)


def test_attention_step_runs_forward_and_backward():
    torch = pytest.importorskip("torch")
    step = attention_step(torch, "cpu", 2, 3, 16, 8)
    dq, dk, dv = step()
    assert tuple(dq.shape) == tuple(dk.shape) == tuple(dv.shape) == (2, 3, 16, 8)
    q, k, v, dy = (t.detach().float() for t in step.inputs)
    # The same gradients in float32 (bf16 results: compared at bf16 precision).
    qf, kf, vf = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
    ref = torch.autograd.grad(out, (qf, kf, vf), dy)
    for got, want in zip((dq, dk, dv), ref):
        torch.testing.assert_close(got.float(), want, rtol=5e-2, atol=5e-2)
