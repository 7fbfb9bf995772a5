"""Pipeline layouts as Megatron runs them (issue 42, item 2): the embedding and the loss counted as
pipeline layers (``pipeline_extra``, Megatron's ``--account-for-*-in-pipeline-split``), its
``--pipeline-model-parallel-layout`` strings read and written, NVIDIA's pp x vp degrees priced."""

import json

import pytest

import engine_checks as check
from cli_runner import run
from pase.planning.mesh import parse_recipe
from pase.planning.mesh_refusals import recipe_refusal
from pase.planning.pipeline import (chunk_sizes, extra_units, interleavings, pipeline_rows, stage_layout, unit_split,
                                    virtual_order)

from test_pipeline import P2P, _by_hand, _setup

LLAMA = ["-g", "llama3-8b", "-p", "16", "-b", "32", "-m", "1024", "--machine", "h100-sxm"]


def test_unit_split_is_megatrons_even_split_with_the_embedding_and_loss_counted():
    # NVIDIA's Llama 3.1 405B on 256 GB200, pp 16 x vp 8 (moe.md section 7): (126 + 1 + 1) / 16 = 8
    # units a rank, 1 a virtual stage; ranks 0 and 15 hold 7 decoder layers, the others 8.
    assert unit_split(126, 16, (1, 1), 8) == (7,) + (8,) * 14 + (7,)
    # pp 8 x vp 8: 16 units a rank, 2 a virtual stage.
    assert unit_split(126, 8, (1, 1), 8) == (15,) + (16,) * 6 + (15,)
    # 126 + 2 = 128 does not split 3 ways; 126 + 1 = 127 not 16 ways; 128 / 16 = 8 not 3 chunks.
    assert unit_split(126, 3, (1, 1)) is None and unit_split(126, 16, (1, 0)) is None
    assert unit_split(126, 16, (1, 1), 3) is None
    # The loss alone: (31 + 1) / 4 = 8, the last stage 7 layers.
    assert unit_split(31, 4, (0, 1)) == (8, 8, 8, 7)


def test_chunk_sizes_count_the_embedding_and_loss_as_units():
    # 405B, pp 16 x vp 8: every chunk one unit; the first chunk of rank 0 the embedding alone, the
    # last chunk of rank 15 the loss alone: 128 chunks for 126 blocks.
    sizes = chunk_sizes(unit_split(126, 16, (1, 1), 8), 8, (1, 1))
    assert sizes[0] == [0] + [1] * 7 and sizes[15] == [1] * 7 + [0]
    assert all(s == [1] * 8 for s in sizes[1:15])
    order = virtual_order(unit_split(126, 16, (1, 1), 8), 8, (1, 1))
    assert len(order) == 128 and sum(order) == 126 and order[0] == 0 and order[-1] == 0
    # Without them the same degrees cannot be cut: 126 blocks are not 128 chunks.
    assert chunk_sizes((7,) + (8,) * 14 + (7,), 8) is None
    # pp 8 x vp 8: chunks of 2 units; rank 0's first holds E + 1 layer, rank 7's last 1 layer + L.
    sizes = chunk_sizes(unit_split(126, 8, (1, 1), 8), 8, (1, 1))
    assert sizes[0] == [1] + [2] * 7 and sizes[7] == [2] * 7 + [1]
    # Only the embedding: stages of 3 and 4 blocks in 2 chunks of 2 units: [E+1, 2] and [2, 2].
    assert chunk_sizes((3, 4), 2, (1, 0)) == [[1, 2], [2, 2]]
    assert interleavings((3, 4), (1, 0)) == [2, 4]  # 4 units a stage: 2 or 4 chunks


def test_recipe_key_and_refusals():
    assert parse_recipe("pp=16,vpp=8,pipeline_extra=embedding+loss").pipeline_extra == "embedding+loss"
    assert extra_units("embedding") == (1, 0)
    with pytest.raises(ValueError, match="pipeline_extra must be none, embedding, loss or embedding\\+loss"):
        parse_recipe("pipeline_extra=both")
    assert recipe_refusal(parse_recipe("pp=16,vpp=8"), 1536, 126) == "pp 16 x vpp 8 = 128 chunks > 126 blocks"
    assert recipe_refusal(parse_recipe("pp=16,vpp=8,pipeline_extra=embedding+loss"), 1536, 126) is None
    assert "do not split evenly into pp 3" in recipe_refusal(parse_recipe("pp=3,pipeline_extra=embedding+loss"),
                                                              1536, 126)


def test_extras_priced_by_hand():
    """4 blocks, pp 2 x vpp 3 with the embedding and loss counted: 6 units, 3 a stage, each
    stage 2 blocks; chunks [E, b1, b2 | b3, b4, L]. The stages are priced by their layers as
    for 1F1B (stage 0: embed and blocks 1-2, stage 1: blocks 3-4, head and loss), each crossing
    3 boundaries per micro-batch each way; the step (m + (pp - 1) / v) x the slowest."""
    machine, net, costing, options, edges, targets = _setup()
    layout = stage_layout(costing.blocks)
    # Without the extras, 4 blocks make no 6 chunks.
    _, _, none = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=["interleaved"],
                               vpps=[3])
    assert none[0] is None
    step, peak, plans = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=["interleaved"],
                                      vpps=[3], extra=(1, 1))
    plan = plans[0]
    assert plan.counts == (2, 2) and plan.vpp == 3 and plan.extra == (1, 1)
    stages = _by_hand(costing, options, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    v, m, pp = 3, 4, 2
    t = [s[0] + v * P2P for s in stages]
    assert plan.microbatch_seconds == pytest.approx(t)
    # Stage i ends i chunk backward passes (2/3 of t / v each) before stage 0.
    exposed = [max(0.0, s[1] - i * 2 / 3 * t[i] / v) for i, s in enumerate(stages)]
    assert step[0] == pytest.approx((m + (pp - 1) / v) * max(t) + max(exposed))
    # Memory: 1F1B's in-flight micro-batches times 1 + (pp - 1) / (pp v) (Korthikanti et al. 2022).
    factor = 1 + (pp - 1) / (pp * v)
    assert plan.memory_bytes[0] == pytest.approx(stages[0][2] + 2 * factor * stages[0][3] + stages[0][4])
    # The loss alone: 4 + 1 = 5 units do not split over 2 stages (Megatron refuses it).
    _, _, loss_only = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout,
                                    schedules=["interleaved"], vpps=[3], extra=(0, 1))
    assert loss_only[0] is None


def test_nvidias_405b_layout_is_priced_from_its_published_degrees():
    """Llama 3.1 405B on 256 GB200, tp 4 pp 16 vp 8, MXFP8 (NVIDIA's
    LLAMA31_405B_PRETRAIN_CONFIG_GB200_*_V2, the account-for flags on): priced, not refused; its
    stages are Megatron's (7, 8 x 14, 7); refused without the extras, as Megatron does."""
    graph = ["-g", "hf:examples/hf/llama-3.1-405b.json", "-p", "256", "-b", "1536", "-m", "8192",
             "--machine", "gb200-nvl72", "--engine", "megatron"]
    recipe = "dp=4,tp=4,pp=16,cp=1,zero=1,schedule=interleaved,vpp=8,microbatch=1,precision=mxfp8"
    status, out, err = run(*graph, "--recipe", recipe + ",pipeline_extra=embedding+loss", "--json")
    assert status == 0, err
    training = json.loads(out)["training"]
    assert "pipeline_extra=embedding+loss" in training["recipe"]
    status, _, err = run(*graph, "--recipe", recipe)
    assert status == 2 and "128 chunks > 126 blocks" in err


def _megatron_args(tmp_path, more: str):
    path = tmp_path / "args.txt"
    path.write_text("--micro-batch-size 1 --global-batch-size 32 --tensor-model-parallel-size 2 "
                    "--pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
                    "--overlap-grad-reduce --overlap-param-gather " + more + "\n")
    return path


def test_megatron_account_flags_and_layouts_read(tmp_path):
    """Llama 3 8B's 32 layers on pp 2: the account-for flags with 1 unit a virtual stage make
    (32 + 2) / 2 = 17 chunks a rank, 16 layers each, the embedding and loss alone in a chunk; the
    same layout written out reads to the same plan."""
    flags = ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
             "--num-layers-per-virtual-pipeline-stage 1")
    status, out, err = run(*LLAMA, "--recipe-from", _megatron_args(tmp_path, flags), "--json")
    assert status == 0, err
    first = json.loads(out)["training"]
    assert "vpp=17" in first["recipe"] and "pipeline_extra=embedding+loss" in first["recipe"]
    layout = "E|" + "t|" * 32 + "L"  # 34 chunks of one unit: 17 per rank
    status, out, err = run(*LLAMA, "--recipe-from",
                           _megatron_args(tmp_path, f"--pipeline-model-parallel-layout '{layout}'"), "--json")
    assert status == 0, err
    again = json.loads(out)["training"]
    assert again["step_seconds"] == pytest.approx(first["step_seconds"], rel=1e-9)
    # 33 units do not split 2 ways: Megatron refuses it too.
    status, _, err = run(*LLAMA, "--recipe-from",
                         _megatron_args(tmp_path, "--account-for-loss-in-pipeline-split"))
    assert status == 2 and "do not split evenly into 2 stages" in err


def test_megatron_export_says_the_extras_and_reads_back(tmp_path):
    recipe = "dp=4,tp=2,pp=2,schedule=interleaved,vpp=17,pipeline_extra=embedding+loss,zero=1,microbatch=1"
    path = tmp_path / "m.json"
    status, out, err = run(*LLAMA, "--engine", "megatron", "--recipe", recipe, "--export-megatron", path, "--json")
    assert status == 0, err
    args = json.loads(path.read_text())["arguments"]
    assert args["--account-for-embedding-in-pipeline-split"] is True
    assert args["--account-for-loss-in-pipeline-split"] is True
    assert args["--num-layers-per-virtual-pipeline-stage"] == 1  # (32 + 2) / (2 x 17)
    status, again, err = run(*LLAMA, "--recipe-from", path, "--json")
    assert status == 0, err
    assert json.loads(again)["training"]["step_seconds"] == pytest.approx(
        json.loads(out)["training"]["step_seconds"], rel=1e-9)
    # Stages other than the even split: the layout names every chunk, E and L alone where they are.
    uneven = "dp=4,tp=2,pp=2,schedule=interleaved,vpp=2,pipeline_extra=embedding+loss,stages=15/17,zero=1"
    status, out, err = run(*LLAMA, "--engine", "megatron", "--recipe", uneven, "--export-megatron", path)
    assert status == 0, err
    layout = json.loads(path.read_text())["arguments"]["--pipeline-model-parallel-layout"]
    # 16 units on stage 0 (E + 15), 18 on stage 1 (17 + L): chunks of 9 units, stage 0 one short twice.
    assert layout == "Et*7|t*9|t*8|t*8L"


def test_megatron_core_accepts_the_extras(tmp_path):
    """megatron-core 0.16's TransformerConfig validates the split (transformer_config.py:1436-1478):
    (32 + 2) layers over pp 2 and 17 virtual stages."""
    path = tmp_path / "m.json"
    recipe = "dp=4,tp=2,pp=2,schedule=interleaved,vpp=17,pipeline_extra=embedding+loss,zero=1,microbatch=1"
    status, _, err = run(*LLAMA, "--engine", "megatron", "--recipe", recipe, "--export-megatron", path)
    assert status == 0, err
    config = check.megatron_accepts(json.loads(path.read_text())["arguments"], 16)[0]
    assert config.virtual_pipeline_model_parallel_size == 17
    assert config.account_for_embedding_in_pipeline_split and config.account_for_loss_in_pipeline_split
