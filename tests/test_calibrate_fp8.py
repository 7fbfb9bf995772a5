"""``pase calibrate --dtype fp8``: FP8 GEMMs measured into a description's table, which the
machine then prices FP8 GEMMs from (docs/machines.md, "FP8 tables"). No GPU here: fake timers."""

from __future__ import annotations

import io
import json

import pytest

from pase.cli.calibrate import main
from pase.machines.calibration import calibrate, calibrate_dtype, gemm_grid_fp8
from pase.machines.registry import load_machine


class Fp8Timer:
    """A device whose BF16 GEMM step costs 2 us plus its FLOPs at 500 TFLOPS and whose FP8
    step costs 2 us plus its FLOPs at 1000 TFLOPS; memory-bound work 1 us plus 4 bytes an
    element at 1 TB/s."""

    device_name = "Fake FP8 GPU"
    software = "fake timer"
    memory_bytes = 24e9

    def __init__(self, missing=None):
        self.missing = missing
        self.fp8_calls = 0

    def gemm(self, b, m, n, k):
        return 2e-6 + 6.0 * b * m * n * k / 500e12

    def memory_bound(self, op, elements):
        return 1e-6 + 4.0 * elements / 1e12

    def attention(self, b, h, s, d):
        return 1e-4 + 4.0 * b * h * s * s * d / 2 * 3.5 / 500e12

    def fp8_missing(self):
        return self.missing

    def gemm_fp8(self, b, m, n, k):
        self.fp8_calls += 1
        return 2e-6 + 6.0 * b * m * n * k / 1000e12


def test_fp8_grid_takes_multiples_of_16():
    for quick in (False, True):
        shapes = gemm_grid_fp8(quick)
        assert all(m % 16 == 0 and n % 16 == 0 and k % 16 == 0 for _, m, n, k in shapes)
        assert all(b * max(m * k, k * n, m * n) <= 4e9 for b, m, n, k in shapes)  # 1 byte an element
        for axis in range(4):
            assert len({s[axis] for s in shapes}) >= 2  # a table needs two values on every axis
    assert len(gemm_grid_fp8(quick=True)) == 6 ** 3 + 4 ** 3


def _described(tmp_path):
    out = tmp_path / "gpu.json"
    calibrate(str(out), quick=True, timer=Fp8Timer(), attention=False)
    return out


def test_fp8_table_prices_fp8_gemms(tmp_path):
    out = _described(tmp_path)
    timer = Fp8Timer()
    written = calibrate_dtype(str(out), "fp8", quick=True, timer=timer)
    assert timer.fp8_calls == len(gemm_grid_fp8(quick=True))
    table = json.loads((tmp_path / "gpu-measured.json").read_text())
    assert len(table["gemm_fp8"]) == timer.fp8_calls
    # The best FP8 rate measured becomes dtype_tflops.fp8: at 16384^3 (B = 1) the step is
    # 2 us + 6 x 16384^3 / 1e15 = 26.390 ms, 6 x 16384^3 / 0.026390 = 999.9 TFLOPS.
    assert written["dtype_tflops"]["fp8"] == pytest.approx(999.9, abs=0.05)
    machine = load_machine(str(out))
    assert "fp8" in machine.precisions
    # A shape on the grid is priced as measured: B 1, M N K 1024: 2 us + 6 x 1024^3 / 1e15 =
    # 8.4425 us (the transfer rule would give the BF16 time, 2 us + 12.885 us, x peak ratio).
    assert float(machine.gemm(1, 1024, 1024, 1024, dtype="fp8")) == pytest.approx(2e-6 + 6 * 1024 ** 3 / 1e15,
                                                                                    rel=1e-9)
    assert float(machine.gemm(1, 1024, 1024, 1024)) == pytest.approx(2e-6 + 6 * 1024 ** 3 / 500e12, rel=1e-9)


def test_cli_dtype_fp8_one_line(tmp_path):
    out = _described(tmp_path)
    stdout, stderr = io.StringIO(), io.StringIO()
    assert main(["--out", str(out), "--dtype", "fp8", "--quick"], stdout, stderr, timer=Fp8Timer()) == 0
    assert stdout.getvalue().count("\n") == 1 and "wrote the fp8 GEMM table" in stdout.getvalue()


def test_cli_refuses_a_device_without_fp8(tmp_path):
    out = _described(tmp_path)
    before = out.read_text()
    stdout, stderr = io.StringIO(), io.StringIO()
    timer = Fp8Timer(missing="Fake GPU (compute capability 8.0) has no FP8 tensor cores")
    assert main(["--out", str(out), "--dtype", "fp8"], stdout, stderr, timer=timer) == 1
    assert stderr.getvalue() == ("pase calibrate: error: --dtype fp8: Fake GPU (compute capability 8.0) has no "
                                 "FP8 tensor cores\n")
    assert timer.fp8_calls == 0 and out.read_text() == before


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "fp8"], "adds to an existing machine description"),
    (["--dtype", "fp8", "--peak-tflops", "900"], "--peak-tflops sets a description field"),
    (["--dtype", "fp8", "--collectives"], "one at a time"),
    (["--dtype", "fp4"], "invalid choice"),
])
def test_cli_dtype_usage_errors(tmp_path, argv, message):
    stdout, stderr = io.StringIO(), io.StringIO()
    assert main(["--out", str(tmp_path / "none.json")] + argv, stdout, stderr, timer=Fp8Timer()) == 2
    assert message in stderr.getvalue() and stderr.getvalue().count("\n") == 1


def test_fp8_step_computes_the_three_products():
    torch = pytest.importorskip("torch")
    from pase.machines.calibration import gemm_step_fp8

    step = gemm_step_fp8(torch, torch.device("cpu"), 2, 32, 48, 64)
    try:
        out = step()
    except (RuntimeError, NotImplementedError) as e:  # a build whose CPU has no FP8 matmul
        pytest.skip(f"torch._scaled_mm on the CPU: {e}")
    ops = step.inputs
    # Per batch: Y = X W (32 x 48), dX = dY W^T (32 x 64), dW = X^T dY (64 x 48), each the
    # product of the FP8 operands' values, in BF16.
    assert [tuple(o.shape) for o in out] == [(32, 48), (32, 64), (64, 48)] * 2
    for i, result in enumerate(out):
        a, b = ops[2 * i], ops[2 * i + 1]
        assert b.stride()[0] == 1  # the second operand column-major, as _scaled_mm takes it
        want = a.float() @ b.float()
        assert torch.allclose(result.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
