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
        "dp=16,tp=1,pp=1,cp=1,zero=1,ep=16,microbatch=1,precision=fp8,scaling=current"]


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
    # NeMo runs this layout (its recipe publishes no recomputation); with the reserve counted
    # once the search keeps recompute=none: peak = the kinds' sum, under 79.65 GiB.
    assert "recompute=none" in qwen["recipe"]
    kinds = qwen["memory"]
    assert kinds["reserve"] == 1e9 and kinds["comm_buffers"] == 1e9
    assert sum(kinds.values()) == pytest.approx(qwen["peak_memory_bytes"], rel=1e-12)
    assert qwen["peak_memory_bytes"] < 79.65 * GiB
    # Fragmentation: 5 % of the stored activations and logits, as Megatron's profile says.
    assert kinds["fragmentation"] == pytest.approx(0.05 * (kinds["activations"] + kinds["logits"]), rel=1e-9)
