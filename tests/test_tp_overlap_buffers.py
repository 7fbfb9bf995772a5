"""Transformer Engine's userbuffers under Megatron's --tp-comm-overlap: one buffer per overlapped
GEMM, each the gathered activation of one micro-batch (``sequence x micro-batch / cp`` rows of the
hidden width), outside PyTorch's allocator. Values worked out by hand from the engine's facts:
6 all-gather buffers (1 byte an element under FP8, else 2) and 4 reduce-scatter buffers (2 bytes).
"""

import json

import pytest

from cli_runner import run
from pase.costing.training.allocator import OUTSIDE_ALLOCATOR
from pase.costing.training.options import TrainingOptions
from pase.planning.engine import load_engine

LLAMA2 = "hf:examples/hf/llama-2-7b.json"  # hidden 4096


def _memory(recipe: str, devices: int = 8, sequence: int = 4096, batch: int = 8, engine: str = "megatron") -> dict:
    status, out, err = run("-g", LLAMA2, "-p", devices, "-b", batch, "-m", sequence, "--machine", "h100-sxm",
                           "--engine", engine, "--recipe", recipe, "--json")
    assert status == 0, err
    return json.loads(out)["training"]


def test_megatron_states_its_buffers_and_others_none():
    assert load_engine("megatron").facts["tp_overlap_gather_buffers"] == 6
    assert load_engine("megatron").facts["tp_overlap_scatter_buffers"] == 4
    # A profile that does not state them (nanotron overlaps nothing this way) has none.
    assert load_engine("nanotron").facts["tp_overlap_gather_buffers"] == 0
    # torch's asynchronous TP: one symmetric-memory workspace per group, 2 bytes an element.
    titan = load_engine("torchtitan")
    assert (titan.facts["tp_overlap_gather_buffers"], titan.facts["tp_overlap_scatter_buffers"]) == (0, 1)


def test_bytes_per_element_by_hand():
    fp8 = TrainingOptions(tp_overlap=True, tp_gather_buffers=6, tp_scatter_buffers=4, precision="fp8")
    assert fp8.tp_buffer_bytes() == 6 * 1 + 4 * 2
    assert fp8.but(precision="bf16").tp_buffer_bytes() == 6 * 2 + 4 * 2
    assert fp8.but(tp_overlap=False).tp_buffer_bytes() == 0
    with pytest.raises(ValueError, match="tp_gather_buffers must be a non-negative number"):
        TrainingOptions(tp_gather_buffers=-1)


def test_fp8_buffers_of_one_microbatch_of_two_sequences():
    t = _memory("dp=2,tp=4,tp_overlap=true,zero=1,recompute=none,microbatch=2,precision=fp8")
    # 2 sequences x 4096 tokens x 4096 wide x (6 x 1 + 4 x 2) bytes.
    assert t["memory"]["tp_overlap_buffers"] == 2 * 4096 * 4096 * 14 == 469_762_048
    # Outside PyTorch's allocator: in the device's figure, not in allocated or reserved.
    assert "tp_overlap_buffers" in OUTSIDE_ALLOCATOR
    assert t["peak_memory_bytes"] - t["peak_memory_reserved_bytes"] == pytest.approx(
        t["memory"]["tp_overlap_buffers"] + t["memory"]["comm_buffers"] + t["memory"]["reserve"], rel=1e-12)


def test_bf16_buffers_and_context_parallel_rows():
    bf16 = _memory("dp=2,tp=4,tp_overlap=true,zero=1,recompute=none,microbatch=2")
    assert bf16["memory"]["tp_overlap_buffers"] == 2 * 4096 * 4096 * 20
    # cp 2 halves the rows: 2 x 4096 / 2 tokens.
    cp = _memory("dp=1,tp=4,cp=2,tp_overlap=true,zero=1,recompute=none,microbatch=2,precision=fp8")
    assert cp["memory"]["tp_overlap_buffers"] == 4096 * 4096 * 14


def test_no_buffers_without_overlap_or_tensor_parallelism():
    for recipe in ("dp=2,tp=4,tp_overlap=false,zero=1,recompute=none,microbatch=2",
                   "dp=8,tp=1,zero=1,recompute=none,microbatch=1"):
        assert "tp_overlap_buffers" not in _memory(recipe)["memory"]


def test_the_128k_row_without_context_parallelism():
    # Llama 2 7B at 131,072 tokens, tp 8, one sequence a micro-batch: 131072 x 4096 x 14 = 7.52 GB,
    # where context parallelism 4 x tp 4 keeps a quarter of the rows: 1.88 GB.
    tp8 = _memory("dp=16,tp=8,tp_overlap=true,zero=1,recompute=none,microbatch=1,precision=fp8", 128, 131072, 32)
    cp4 = _memory("dp=8,tp=4,cp=4,tp_overlap=true,zero=1,recompute=none,microbatch=1,precision=fp8", 128, 131072, 32)
    assert tp8["memory"]["tp_overlap_buffers"] == 131072 * 4096 * 14 == 7_516_192_768
    assert cp4["memory"]["tp_overlap_buffers"] == 131072 // 4 * 4096 * 14


def test_torchtitans_one_workspace_under_asynchronous_tp():
    t = _memory("dp=2,tp=4,tp_overlap=true,zero=3,recompute=none,microbatch=2", engine="torchtitan,compile=true")
    # One workspace of the gathered activation: 2 x 4096 tokens x 4096 wide x 2 bytes.
    assert t["memory"]["tp_overlap_buffers"] == 2 * 4096 * 4096 * 2


def test_apex_distributed_adam_keeps_two_bytes_of_master_copy():
    # NeMo 1.x's Apex DistributedFusedAdam: fp32 moments and an int16 remainder of each BF16 weight,
    # 10 bytes of state a weight where Megatron's distributed optimizer keeps 12. Llama 2 7B over
    # dp 8 under ZeRO-1: 6,738,415,616 x (12 - 10) / 8 bytes less.
    recipe = "dp=8,tp=1,zero=1,recompute=none,microbatch=1"
    megatron = _memory(recipe, engine="megatron")["memory"]["model_state"]
    apex = _memory(recipe, engine="megatron,adam=apex")["memory"]["model_state"]
    assert megatron - apex == pytest.approx(6_738_415_616 * 2 / 8, rel=1e-12)
    assert load_engine("megatron,adam=apex").facts["optimizer_master_bytes"] == 2


def test_apex_adam_is_priced_not_exported():
    status, out, err = run("-g", LLAMA2, "-p", 8, "-b", 8, "-m", 4096, "--machine", "h100-sxm", "--engine",
                           "megatron,adam=apex", "--recipe", "dp=8,tp=1,zero=1,recompute=none,microbatch=1",
                           "--export-megatron", "-")
    assert status != 0 and "adam=apex" in err and "Traceback" not in err
