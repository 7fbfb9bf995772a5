"""Mechanisms found on NeMo's FP8 rows (docs/calibration.md, "Mechanisms found on the FP8
rows"), each against a value worked out by hand: the reserve counted once beside the
engine's communicator buffers and fragmentation, and the memory of NeMo's Qwen3-30B-A3B layout
(16 H100, EP 16, FP8) kind by kind."""

import json

import pytest

from pase.costing.training import DEFAULT_RESERVE_BYTES, TrainingOptions
from pase.planning.engine import load_engine

from cli_runner import run

GiB = 2.0 ** 30


def test_reserve_is_context_and_workspaces_only():
    # The reserve no longer stands for NCCL's buffers and the allocator's rounding: Megatron's
    # profile counts them itself (comm_buffer_bytes 1e9, fragmentation 0.05), so the reserve is
    # the CUDA context and the libraries' workspaces, 1 GB, and an engine's options carry it.
    assert DEFAULT_RESERVE_BYTES == 1e9
    options = load_engine("megatron").base_options()
    assert options.reserve_bytes == 1e9
    assert options.comm_buffer_bytes == 1e9 and options.fragmentation == 0.05
    assert TrainingOptions().reserve_bytes == 1e9


QWEN = ["-g", "hf:examples/hf/qwen3-30b-a3b.json", "-p", "16", "-b", "1024", "-m", "4096", "--machine", "h100-sxm",
        "--engine", "megatron", "--json", "--recipe",
        "dp=16,tp=1,pp=1,cp=1,zero=1,ep=16,microbatch=1,precision=fp8,scaling=current,recompute=none"]


@pytest.fixture(scope="module")
def qwen():
    status, out, err = run(*QWEN)
    assert status == 0, err
    return json.loads(out)["training"]


def test_qwen3_layout_model_state_by_hand(qwen):
    # Qwen3-30B-A3B (examples/hf/qwen3-30b-a3b.json): 48 layers, hidden 2048, 128 experts of
    # 3 x 2048 x 768 = 4,718,592 weights, q 2048 x 4096, k and v 2048 x 512, o 4096 x 2048,
    # router 2048 x 128, vocabulary 151,936 untied.
    # Per device with ep 16: 8 experts a layer, 8 x 4,718,592 x 48 = 1,811,939,328 weights;
    # their data-parallel group is 16 / 16 = 1, so the distributed optimizer does not shard
    # them: 2 (bf16) + 4 (fp32 gradient) + 12 (fp32 master and moments) = 18 bytes each:
    # 32,614,907,904.
    # Dense weights, replicated on all 16: per layer attention 8,388,608 + 2 x 1,048,576 +
    # 8,388,608 = 18,874,368, q/k norms 256, two norms 4,096, router 262,144 = 19,140,864;
    # x 48 = 918,761,472, + embedding and head 2 x 311,164,928 + final norm 2,048 =
    # 1,541,093,376 at 2 + 4 + 12 / 16 = 6.75 bytes: 10,402,380,288.
    # FP8 weight cache (Transformer Engine keeps the FP8 copy, row- and column-wise, 2 bytes a
    # weight) of the converted products: attention 18,874,368 x 48 = 905,969,664, experts
    # 1,811,939,328, router 262,144 x 48 = 12,582,912 (converted as a weight product of a block;
    # Megatron computes its router outside Transformer Engine, 25 MB priced too many):
    # 2 x 2,730,491,904 = 5,460,983,808.
    # Total 32,614,907,904 + 10,402,380,288 + 5,460,983,808 = 48,478,272,000.
    assert qwen["memory"]["model_state"] == pytest.approx(48_478_272_000, rel=1e-9)


def test_qwen3_layout_fits_without_recomputation(qwen):
    # NeMo runs this layout without recomputation (Megatron-Bridge perf_recipes/qwen: recompute
    # granularity None); with the reserve counted once it fits: peak = the kinds' sum, under
    # 79.65 GiB. (Left to itself the search takes moe_act+layernorm recomputation, which ties
    # and fits the memory band too: tests/test_recompute_modules.py.)
    assert "recompute=none" in qwen["recipe"]
    kinds = qwen["memory"]
    assert kinds["reserve"] == 1e9 and kinds["comm_buffers"] == 1e9
    assert sum(kinds.values()) == pytest.approx(qwen["peak_memory_bytes"], rel=1e-12)
    assert qwen["peak_memory_bytes"] < 79.65 * GiB
    # Fragmentation: 5 % of the stored activations, as Megatron's profile says (the loss's
    # logit-sized buffers are whole segments: allocator.stranded_bytes).
    assert kinds["fragmentation"] == pytest.approx(0.05 * kinds["activations"], rel=1e-9)


# -- casts Transformer Engine does not run ---------------------------------------------------

import numpy as np  # noqa: E402

from pase.costing.training import TrainingCosting  # noqa: E402
from pase.machines.calibrated import CalibratedMachine  # noqa: E402
from pase.planning.mesh import Mesh, MeshMapper, mesh_configs  # noqa: E402
from pase.sources.registry import load  # noqa: E402

# No measured table: a GEMM at its format's peak, memory-bound work at HBM speed (2000 GB/s).
PEAK = {"name": "peak", "devices_per_node": 8, "memory_gb": 80, "peak_tflops": 1000, "dtype_tflops": {"fp8": 2000},
        "hbm_gbps": 2000, "intra_node": {"gbps": 450, "latency_us": 3}, "inter_node": {"gbps": 50, "latency_us": 10},
        "act_bytes": 2, "grad_bytes": 4}
FP8 = TrainingOptions(precision="fp8", fp8_scaling="current")  # 6 bytes a cast element


def _llama(mesh):
    net = load("hf:examples/hf/llama-3.1-8b.json", 1, 128)  # one sequence of 128 tokens
    costing = TrainingCosting(net, [np.asarray([c], dtype=np.int64) for c in mesh_configs(net, mesh)],
                              CalibratedMachine(PEAK))
    costing.activation_scale = np.where(np.array(MeshMapper(net).sequence_parallel(mesh))[:, None], 0.5, 1.0)
    return costing


def _delta(costing, v, gemm_flops):
    """FP8 compute minus BF16 compute of layer v, less the GEMM's own change: the casts."""
    after = float(costing.compute(v, FP8)[0]) - float(costing.compute(v, TrainingOptions())[0])
    return after - (gemm_flops / 2000e12 - gemm_flops / 1000e12)


def test_one_cast_for_the_products_of_one_input():
    # Llama 3.1 8B block 1: q (2), k (3), v (4) read the attention norm's output (1): M = 128
    # tokens, K = 4096; q N = 4096, k and v N = 1024. Transformer Engine runs them as one GEMM
    # (linear_qkv) with one cast of the input: q pays the input, k and v do not.
    c = _llama(Mesh(dp=1))
    names = c.network.names
    q, k = 2, 3
    assert names[1:5] == ("block1.attn.norm", "block1.attn.q", "block1.attn.k", "block1.attn.v")
    # q: input 128 x 4096 = 524,288, output gradient 128 x 4096 = 524,288, weight 16,777,216
    # (one micro-batch): 17,825,792 elements x 6 bytes / 2000 GB/s = 53.477 us.
    assert _delta(c, q, 6 * 128 * 4096 * 4096) == pytest.approx(17_825_792 * 6 / 2000e9, rel=1e-9)
    # k: output gradient 128 x 1024 = 131,072 and weight 4,194,304 only: 4,325,376 x 6 / 2000e9.
    assert _delta(c, k, 6 * 128 * 1024 * 4096) == pytest.approx(4_325_376 * 6 / 2000e9, rel=1e-9)


def test_sequence_parallel_casts_the_local_shard():
    # tp 2 with sequence parallelism: q is column-parallel, its input gathered from 2 sequence
    # shards; Transformer Engine casts the shard (128 x 4096 / 2 = 262,144) before the FP8
    # all-gather. q's output gradient: its heads split, 128 x 2048 = 262,144; weight 8,388,608.
    # 8,912,896 elements x 6 / 2000e9.
    sp = _llama(Mesh(dp=1, tp=2, sp=True))
    q, o = 2, 10
    assert sp.network.names[o] == "block1.attn.out"
    assert _delta(sp, q, 6 * 128 * 2048 * 4096) == pytest.approx(8_912_896 * 6 / 2000e9, rel=1e-9)
    # o is row-parallel: its input (heads split) 262,144 is local; its output gradient is
    # gathered from shards in the backward pass: 262,144 cast, not 524,288; weight 8,388,608.
    assert _delta(sp, o, 6 * 128 * 4096 * 2048) == pytest.approx(8_912_896 * 6 / 2000e9, rel=1e-9)
    # Without sequence parallelism every rank holds and casts the whole replicated operand:
    # q 524,288 + 262,144 + 8,388,608 = 9,175,040; o 262,144 + 524,288 + 8,388,608 the same.
    no_sp = _llama(Mesh(dp=1, tp=2, sp=False))
    assert _delta(no_sp, q, 6 * 128 * 2048 * 4096) == pytest.approx(9_175_040 * 6 / 2000e9, rel=1e-9)
    assert _delta(no_sp, o, 6 * 128 * 4096 * 2048) == pytest.approx(9_175_040 * 6 / 2000e9, rel=1e-9)


def test_power_limited_clock_paces_compute_not_memory():
    # A machine whose step holds 0.8 of the SM clock its kernels were measured at. The GEMM of
    # k (M 128, N 1024, K 4096: 6 x 128 x 1024 x 4096 / 1e15 = 3.2212 us at the 1000 TFLOPS
    # peak) runs at 0.8 of it: 4.0265 us, and / 0.85 in a step. The norm before it streams
    # from HBM, whose clock the power limit does not lower: its time / 0.85 only, the same as
    # on a machine holding its full clock.
    net = load("hf:examples/hf/llama-3.1-8b.json", 1, 128)
    configs = [np.asarray([c], dtype=np.int64) for c in mesh_configs(net, Mesh(dp=1))]
    full = TrainingCosting(net, configs, CalibratedMachine(dict(PEAK, clock_ratio=1.0)))
    held = TrainingCosting(net, configs, CalibratedMachine(dict(PEAK, clock_ratio=0.8)))
    step = TrainingOptions(compute_efficiency=0.85, launch_seconds=0.0)
    k, norm = 3, 1
    gemm = 6 * 128 * 1024 * 4096 / 1e15
    assert float(full.compute(k, step)[0]) == pytest.approx(gemm / 0.85, rel=1e-9)
    assert float(held.compute(k, step)[0]) == pytest.approx(gemm / (0.8 * 0.85), rel=1e-9)
    assert float(held.compute(norm, step)[0]) > 0
    assert float(held.compute(norm, step)[0]) == pytest.approx(float(full.compute(norm, step)[0]), rel=1e-12)
    # In FP8 the casts are memory-bound too: k's cast elements (4,325,376 x 6 bytes at 2000
    # GB/s = 12.976 us) / 0.85, its FP8 GEMM (1.6106 us) / (0.8 x 0.85).
    fp8 = TrainingOptions(compute_efficiency=0.85, launch_seconds=0.0, precision="fp8", fp8_scaling="current")
    expected = 4_325_376 * 6 / 2000e9 / 0.85 + gemm / 2 / (0.8 * 0.85)
    assert float(held.compute(k, fp8)[0]) == pytest.approx(expected, rel=1e-9)


# -- attention: the engine's figure or the machine's -----------------------------------------

from pase.planning.engine import _switch  # noqa: E402


def test_a_measured_attention_figure_replaces_an_sdpa_engines_own():
    # pase calibrate times PyTorch's scaled_dot_product_attention and writes its fraction of
    # peak into the machine file (here 0.42). torchtitan, fsdp and deepspeed run that kernel:
    # the measurement on this GPU replaces their literature figure (0.3). Megatron runs
    # Transformer Engine's cuDNN fused attention, which calibrate does not time: its 0.5 stays.
    measured = CalibratedMachine(dict(PEAK, attention_efficiency=0.42))
    bare = CalibratedMachine(PEAK)
    for name in ("torchtitan", "fsdp", "deepspeed"):
        engine = load_engine(name)
        assert engine["attention_kernel"] == "sdpa"
        assert engine.base_options(measured).attention_efficiency == 0.42
        assert engine.base_options(bare).attention_efficiency == 0.3
        assert engine.base_options().attention_efficiency == 0.3
    megatron = load_engine("megatron")
    assert megatron["attention_kernel"] == "cudnn_fused"
    assert megatron.base_options(measured).attention_efficiency == 0.5
    # A figure the user sets on the command line (--engine torchtitan,attention_efficiency=0.35)
    # wins over both.
    chosen = load_engine("torchtitan,attention_efficiency=0.35")
    assert chosen.base_options(measured).attention_efficiency == 0.35


def test_attention_precedence_reaches_the_plan():
    # The fused attention of Llama 3.1 8B at 128 tokens on the measured machine: two products
    # of 2 x 128 x 128 x (32 heads x 128) = 134,217,728 FLOPs each, halved (causal): forward
    # 134,217,728; with the backward (2.5 x) 469,762,048, at 0.42 x 1000 TFLOPS = 1.11848 us,
    # over the shape factor (128 / (128 + 512) = 0.2 at 128 keys; head width 128: 1) = 5.5924 us.
    measured = CalibratedMachine(dict(PEAK, attention_efficiency=0.42))
    net = load("hf:examples/hf/llama-3.1-8b.json", 1, 128)
    c = TrainingCosting(net, [np.asarray([x], dtype=np.int64) for x in mesh_configs(net, Mesh(dp=1))], measured)
    scores = net.names.index("block1.attn.scores")
    options = load_engine("torchtitan").base_options(measured, compute_efficiency=1.0, launch_seconds=0.0)
    assert float(c.compute(scores, options)[0]) == pytest.approx(469_762_048 / (0.42e15 * 0.2), rel=1e-9)
