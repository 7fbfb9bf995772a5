"""Low-precision training priced by hand (docs/precision.md): an FP8 GEMM layer's time and
memory, a cast kernel, what stays BF16, recipes and the precision search."""

import io
import json
import os

import numpy as np
import pytest

import graphs
from pase.cli.app import main
from pase.costing.precision import QUANT_BYTES
from pase.costing.training import TrainingCosting, TrainingOptions
from pase.machines.calibrated import CalibratedMachine
from pase.planning.mesh import parse_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# No measured table: a GEMM at its format's peak, memory-bound work at HBM speed.
PEAK = {"name": "peak", "devices_per_node": 8, "memory_gb": 80, "peak_tflops": 1000, "dtype_tflops": {"fp8": 2000},
        "hbm_gbps": 2000, "intra_node": {"gbps": 450, "latency_us": 3}, "inter_node": {"gbps": 50, "latency_us": 10},
        "act_bytes": 2, "grad_bytes": 4}


@pytest.fixture(scope="module")
def costing():
    net = graphs.build("gpt2-small", 4)  # 4 sequences of 1024 tokens, width 768, MLP 3072
    configs = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]  # one device
    return TrainingCosting(net, configs, CalibratedMachine(PEAK))


def _index(costing, name):
    return costing.network.names.index(name)


def test_cast_kernel_by_hand(costing):
    # 1e6 elements, FP8 delayed scaling: one cast-transpose reading 2 bytes and writing 1 + 1:
    # 4e6 bytes at 2000 GB/s = 2 us. Current scaling adds an amax pass: 6e6 bytes, 3 us.
    delayed = TrainingOptions(precision="fp8", fp8_scaling="delayed")
    current = TrainingOptions(precision="fp8", fp8_scaling="current")
    assert float(costing.precision.cast_seconds(1e6, delayed)) == pytest.approx(2e-6, rel=1e-12)
    assert float(costing.precision.cast_seconds(1e6, current)) == pytest.approx(3e-6, rel=1e-12)
    # MXFP8: 2 + 2 x (1 + 1/32) = 4.0625 bytes per element.
    assert QUANT_BYTES[("mxfp8", None)] == 2 + 2 * (1 + 1 / 32)


def test_fp8_gemm_layer_time_by_hand(costing):
    up = _index(costing, "block1.ff.up")  # M = 4 x 1024 = 4096 tokens, K = 768, N = 3072
    bf16 = TrainingOptions()
    fp8 = TrainingOptions(precision="fp8", fp8_scaling="current")
    # BF16: 6 x 4096 x 3072 x 768 / 1e15 = 57.98 us; FP8 at 2000 TFLOPS: 28.99 us.
    gemm16 = 6 * 4096 * 3072 * 768 / 1e15
    # Casts: input 4096 x 768 = 3,145,728, output gradient 4096 x 3072 = 12,582,912, weight
    # 768 x 3072 = 2,359,296 (once per step; one micro-batch): 18,087,936 elements x 6 bytes
    # (current scaling) = 108,527,616 bytes at 2000 GB/s = 54.26 us.
    cast = (4096 * 768 + 4096 * 3072 + 768 * 3072) * 6 / 2000e9
    before = float(costing.compute(up, bf16)[0])
    after = float(costing.compute(up, fp8)[0])
    assert after - before == pytest.approx(gemm16 / 2 - gemm16 + cast, rel=1e-9)
    # Four micro-batches: the weight is cast once per step, a quarter of it per micro-batch.
    fp8_m4 = TrainingOptions(precision="fp8", fp8_scaling="current", microbatches=4)
    cast_m4 = (4096 * 768 + 4096 * 3072 + 768 * 3072 / 4) * 6 / 2000e9
    assert float(costing.compute(up, fp8_m4)[0]) - before == pytest.approx(gemm16 / 2 - gemm16 + cast_m4, rel=1e-9)
    # Under ZeRO-3 the weight is gathered, and cast, again for every micro-batch: the whole weight.
    fp8_z3 = TrainingOptions(precision="fp8", fp8_scaling="current", microbatches=4, zero=3)
    assert float(costing.compute(up, fp8_z3)[0]) - before == pytest.approx(gemm16 / 2 - gemm16 + cast, rel=1e-9)


def test_fp8_memory_by_hand(costing):
    norm, up = _index(costing, "block1.ff.norm"), _index(costing, "block1.ff.up")
    bf16 = TrainingOptions()
    fp8 = TrainingOptions(precision="fp8")
    # The norm's output is read by the up projection alone, which keeps it in FP8 for its weight
    # gradient: 4 x 1024 x 768 = 3,145,728 elements at 1 byte instead of 2.
    assert float(costing.layer_memory(norm, bf16, 2.0)["activations"][0]) == 2 * 3145728
    assert float(costing.layer_memory(norm, fp8, 2.0)["activations"][0]) == 1 * 3145728
    # The up projection's weights, 768 x 3072 = 2,359,296, gain an FP8 copy in both orientations:
    # 2 x 1 byte each = 4,718,592 bytes beside the 16 bytes of ZeRO-0 mixed-precision Adam.
    state16 = float(costing.layer_memory(up, bf16, 2.0)["model_state"][0])
    assert state16 == 16 * 2359296
    assert float(costing.layer_memory(up, fp8, 2.0)["model_state"][0]) == state16 + 2 * 2359296
    # The up projection's own output (GELU fused into it) is read by the down projection alone,
    # yet stays BF16: the fused GELU's backward needs it.
    assert float(costing.layer_memory(up, fp8, 2.0)["activations"][0]) == float(
        costing.layer_memory(up, bf16, 2.0)["activations"][0])
    # Under ZeRO-3 the FP8 copy is gathered per layer (transient): nothing is added.
    z3, z3_fp8 = TrainingOptions(zero=3), TrainingOptions(zero=3, precision="fp8")
    assert float(costing.layer_memory(up, z3_fp8, 2.0)["model_state"][0]) == float(
        costing.layer_memory(up, z3, 2.0)["model_state"][0])


def test_blackwell_keeps_one_fp8_orientation_by_hand():
    # A device whose FP8 GEMMs take any operand layout (fp8_layouts any: Blackwell; Transformer
    # Engine's is_non_tn_fp8_gemm_supported) writes and keeps no transposed copy of a per-tensor
    # FP8 tensor (Float8Tensor.update_usage); MXFP8's block scales still need both.
    net = graphs.build("gpt2-small", 4)
    configs = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    any_layout = TrainingCosting(net, configs, CalibratedMachine({**PEAK, "dtype_tflops": {"fp8": 2000, "mxfp8": 2000},
                                                                  "fp8_layouts": "any"}))
    up = net.names.index("block1.ff.up")
    bf16, current = TrainingOptions(), TrainingOptions(precision="fp8", fp8_scaling="current")
    delayed, mx = TrainingOptions(precision="fp8", fp8_scaling="delayed"), TrainingOptions(precision="mxfp8")
    # The up projection's 2,359,296 weights: one FP8 byte each beside the 16 of mixed-precision
    # Adam, where a Hopper keeps two; MXFP8 two copies of 1 + 1/32 bytes.
    state16 = float(any_layout.layer_memory(up, bf16, 2.0)["model_state"][0])
    assert float(any_layout.layer_memory(up, current, 2.0)["model_state"][0]) == state16 + 1 * 2359296
    assert float(any_layout.layer_memory(up, mx, 2.0)["model_state"][0]) == pytest.approx(
        state16 + 2 * (1 + 1 / 32) * 2359296)
    # Casts of 1e6 elements: current scaling reads 2 for the amax, then 2 and writes 1: 5e6 bytes
    # at 2000 GB/s = 2.5 us (3 us on Hopper); delayed reads 2 and writes 1: 1.5 us (2 us).
    assert float(any_layout.precision.cast_seconds(1e6, current)) == pytest.approx(2.5e-6, rel=1e-12)
    assert float(any_layout.precision.cast_seconds(1e6, delayed)) == pytest.approx(1.5e-6, rel=1e-12)
    assert float(any_layout.precision.cast_seconds(1e6, mx)) == pytest.approx(4.0625e6 / 2000e9, rel=1e-12)


def test_what_stays_bf16(costing):
    fp8 = TrainingOptions(precision="fp8")
    eligible = costing.precision.eligible()
    names = costing.network.names
    converted = {names[v] for v in np.flatnonzero(eligible) if names[v].startswith("block1.")}
    assert converted == {"block1.attn.qkv", "block1.attn.out", "block1.ff.up", "block1.ff.down"}
    for name in ("embedding", "block1.attn.scores", "block1.attn.context", "block1.attn.norm", "block1.ff.norm"):
        v = names.index(name)
        assert float(costing.compute(v, fp8)[0]) == float(costing.compute(v, TrainingOptions())[0]), name
    head = [v for v, layer in enumerate(costing.network.layers) if costing.blocks[v] is None and layer.op == "Einsum"]
    assert head and not eligible[head].any()  # the output layer


def test_fp8_gathers_halve_the_converted_weights(costing):
    up = _index(costing, "block1.ff.up")
    plain = TrainingOptions(zero=3, precision="fp8")
    gathered = TrainingOptions(zero=3, precision="fp8", fp8_gather=True)
    assert costing.precision.gather_scale(up, plain) == 1.0
    assert costing.precision.gather_scale(up, gathered) == 0.5  # 1 byte of FP8 over 2 of BF16
    assert costing.precision.gather_scale(_index(costing, "block1.ff.norm"), gathered) == 1.0


def test_options_and_recipes_are_checked():
    with pytest.raises(ValueError, match="precision must be one of bf16, fp8, mxfp8, nvfp4"):
        TrainingOptions(precision="fp16")
    with pytest.raises(ValueError, match="fp8_scaling must be one of"):
        TrainingOptions(fp8_scaling="tensorwise")
    assert parse_recipe("precision=fp8,scaling=blockwise").fixed() == {"precision": "fp8", "scaling": "blockwise"}
    with pytest.raises(ValueError, match="scaling applies to precision=fp8"):
        parse_recipe("precision=mxfp8,scaling=current")
    with pytest.raises(ValueError, match="recipe precision must be"):
        parse_recipe("precision=fp4")


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out, err), out.getvalue(), err.getvalue()


def _training(*argv):
    status, out, err = run(*argv, "--json")
    assert status == 0, err
    return json.loads(out)["training"]


def test_search_precision_is_the_best_of_each_format():
    # Brute force: the search over formats equals the fastest of the searches at each format
    # (ties to the first in the machine's order, bf16 first).
    args = ["-g", "gpt2-small", "-p", "8", "-b", "64", "--machine", "b200", "--recipe"]
    steps = {}
    for precision in ("bf16", "fp8", "mxfp8", "nvfp4"):
        t = _training(*args, f"dp=8,zero=1,microbatch=8,precision={precision}")
        steps[precision] = t["step_seconds"]
        assert t.get("precision", {"format": "bf16"})["format"] == precision
    assert len(set(steps.values())) > 1
    t = _training(*args, "dp=8,zero=1,microbatch=8", "--search-precision")
    best = min(steps, key=steps.get)
    assert t["step_seconds"] == steps[best] and t.get("precision", {"format": "bf16"})["format"] == best
    # bf16 stays the default: no format is searched unless asked.
    t = _training(*args, "dp=8,zero=1,microbatch=8")
    assert t["step_seconds"] == steps["bf16"] and "precision" not in t


def test_a_format_the_machine_lacks_is_one_line():
    status, out, err = run("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", "a100-sxm", "--recipe",
                           "precision=fp8")
    assert status == 2 and out == ""
    assert err == ("pase: error: precision=fp8: machine a100-sxm runs GEMMs in bf16 only (pase machines lists "
                   "each preset's formats)\n")


def test_torchtitan_benchmark_machine_runs_float8():
    # torchtitan publishes Float8 rows on its 500 W H100 (examples/machines/h100-96gb-500w.json):
    # its file states the dense FP8 rate, twice the BF16 one per SM and clock (2 x 887). A large
    # GEMM then takes about half its BF16 time by the transfer rule: the roofline part halves,
    # the overhead above it halves, the launch floor stays (so at most half plus that floor).
    from pase.machines.registry import load_machine
    machine = load_machine(os.path.join(ROOT, "examples", "machines", "h100-96gb-500w.json"))
    assert machine.precisions == ("bf16", "fp8") and machine.dtype_flops["fp8"] == 1774e12
    bf16 = float(machine.gemm_seconds(1, 8192, 8192, 8192))
    fp8 = float(machine.gemm_seconds(1, 8192, 8192, 8192, dtype="fp8"))
    assert 0.5 * bf16 <= fp8 <= 0.5 * bf16 + 20e-6
