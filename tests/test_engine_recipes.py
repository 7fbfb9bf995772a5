"""--recipe-from: engine files read as recipes, each value worked out by hand."""

from __future__ import annotations

import tomllib
from types import SimpleNamespace

import pytest

from cli_runner import run

from pase.outputs.engine_recipes import (RecipeFileError, recipe_from_deepspeed, recipe_from_file,
                                         recipe_from_megatron, recipe_from_torchtitan)

LLAMA70 = SimpleNamespace(architecture={"layers": 80, "width": 8192, "heads": 64, "head_dim": 128,
                                        "mlp_width": 28672, "sequence": 8192})
LLAMA8 = SimpleNamespace(architecture={"layers": 32, "width": 4096, "heads": 32, "head_dim": 128,
                                       "mlp_width": 14336, "sequence": 1024})


def titan(text: str, procs: int, batch: int, network=LLAMA70):
    return recipe_from_torchtitan(tomllib.loads(text), procs, batch, network)


def test_torchtitan_default_split_by_hand():
    # 80 layers, pp 4, 1F1B, no split given: torchtitan's generate_llm_fqn_per_model_part with
    # the first and last stages one layer lighter: 80 + 1 + 1 = 82 effective layers over 4 parts,
    # 20 each and 2 left over (the first two parts take one more): 21, 21, 20, 20, less the
    # embedding's 1 and the output's 1: 20, 21, 20, 19.
    r = titan("[parallelism]\ndata_parallel_shard_degree = 16\ntensor_parallel_degree = 4\n"
              "pipeline_parallel_degree = 4\n[training]\nlocal_batch_size = 32\nglobal_batch_size = 512\n"
              "seq_len = 8192\n[activation_checkpoint]\nmode = \"full\"\n", 256, 512)
    assert r.stages == (20, 21, 20, 19) and r.pp == 4 and r.schedule == "1f1b"
    # FSDP with pipelines: torchtitan's "default" does not reshard after forward: ZeRO-2.
    assert (r.dp, r.tp, r.zero, r.recompute, r.microbatch) == (16, 4, 2, "full", 1)


def test_torchtitan_layers_per_stage_that_does_not_divide_is_refused():
    # The old export's layers_per_stage 5 on 80 layers: ceil((80 + 1 + 1) / 5) = 17 parts, which
    # pp 4 does not divide; torchtitan refuses it too.
    with pytest.raises(ValueError, match="gives 17 model parts, not a multiple of pipeline_parallel_degree 4"):
        titan("[parallelism]\ndata_parallel_shard_degree = 16\ntensor_parallel_degree = 4\n"
              "pipeline_parallel_degree = 4\npipeline_parallel_layers_per_stage = 5\n"
              "pipeline_parallel_schedule = \"Interleaved1F1B\"\n[training]\nlocal_batch_size = 32\n"
              "global_batch_size = 512\nseq_len = 8192\n[activation_checkpoint]\nmode = \"none\"\n", 256, 512)


def test_torchtitan_interleaved_by_layers_per_stage():
    # 80 layers, 5 per part, no lighter first and last stages: 80 / 5 = 16 parts over pp 4:
    # 4 parts per rank (vpp 4), 20 layers per rank.
    r = titan("[parallelism]\ndata_parallel_shard_degree = 16\ntensor_parallel_degree = 4\n"
              "pipeline_parallel_degree = 4\npipeline_parallel_layers_per_stage = 5\n"
              "pipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n"
              "pipeline_parallel_schedule = \"Interleaved1F1B\"\nfsdp_reshard_after_forward = \"always\"\n"
              "[training]\nlocal_batch_size = 32\nglobal_batch_size = 512\nseq_len = 8192\n"
              "[activation_checkpoint]\nmode = \"none\"\n", 256, 512)
    assert (r.schedule, r.vpp, r.stages, r.zero) == ("interleaved", 4, (20, 20, 20, 20), 3)


def test_torchtitan_batch_without_pipelines_accumulates():
    # dp 8 (shard -1: 8 / (1 x 1 x 1 x 1)), local 2, global 32: 32 / (2 x 8) = 2 accumulation steps
    # of 2-sequence micro-batches.
    r = titan("[training]\nlocal_batch_size = 2\nglobal_batch_size = 32\nseq_len = 1024\n"
              "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n", 8, 32, LLAMA8)
    assert (r.dp, r.zero, r.microbatch, r.recompute) == (8, 3, 2, "op")


@pytest.mark.parametrize("text,field", [
    ("[parallelism]\nfoo = 1\n", "parallelism.foo"),
    ("[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n", "HSDP"),
    ("[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"2\"\n", "selective_ac_option"),
    ("[training]\nenable_cpu_offload = true\n", "training.enable_cpu_offload"),
    ("[model]\nconverters = [\"float8\"]\n", "model.converters"),
    ("[nonsense]\n", "[nonsense]"),
])
def test_torchtitan_what_cannot_be_expressed_names_the_field(text, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        titan(text + "[training]\nlocal_batch_size = 4\nseq_len = 1024\n" if "[training]" not in text else text,
              8, 32, LLAMA8)


def test_megatron_first_and_last_stage_layers_by_hand():
    # 32 layers, pp 4, first 7 and last 7: the 18 left over the 2 middle stages, 9 each.
    r = recipe_from_megatron("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 "
                             "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                             "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7 "
                             "--micro-batch-size 1 --global-batch-size 32 --use-distributed-optimizer "
                             "--overlap-grad-reduce --overlap-param-gather --sequence-parallel", 16, 32, LLAMA8)
    # dp = 16 / (2 x 4 x 1) = 2.
    assert (r.dp, r.tp, r.pp, r.stages, r.zero, r.sp, r.schedule) == (2, 2, 4, (7, 9, 9, 7), 1, True, "1f1b")
    with pytest.raises(ValueError, match="25 layers do not split evenly over the 3 other stages"):
        recipe_from_megatron("--num-layers 32 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 7 "
                             "--global-batch-size 32 --overlap-grad-reduce", 16, 32, LLAMA8)


def test_megatron_interleaving_and_fsdp_by_hand():
    # 32 layers, pp 4, 4 layers per virtual stage: 32 / (4 x 4) = 2 chunks per device.
    r = recipe_from_megatron("--num-layers 32 --pipeline-model-parallel-size 4 "
                             "--num-layers-per-virtual-pipeline-stage 4 --micro-batch-size 1 --global-batch-size 32 "
                             "--overlap-grad-reduce --recompute-granularity selective", 16, 32, LLAMA8)
    assert (r.schedule, r.vpp, r.dp, r.zero, r.recompute) == ("interleaved", 2, 4, 0, "selective")
    r = recipe_from_megatron("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
                             "--use-distributed-optimizer --micro-batch-size 2 --global-batch-size 32 "
                             "--overlap-grad-reduce --overlap-param-gather", 16, 32, LLAMA8)
    assert (r.dp, r.zero, r.microbatch) == (16, 3, 2)


@pytest.mark.parametrize("text,message", [
    ("--frobnicate 1", "cannot express Megatron-LM argument --frobnicate"),
    ("--num-layers 80 --global-batch-size 32", "--num-layers 80 differs from the graph's layers 32"),
    ("--micro-batch-size 1 --micro-batch-size 2", "given twice"),
    ("--global-batch-size 64", "differs from the batch of -b"),
    ("--global-batch-size 32", "without --overlap-grad-reduce"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2 --global-batch-size 32 "
     "--overlap-grad-reduce", "cannot express --recompute-method uniform --recompute-num-layers 2"),
])
def test_megatron_refusals(text, message):
    with pytest.raises(ValueError, match=message):
        recipe_from_megatron(text, 16, 32, LLAMA8)


def test_deepspeed_batch_completion_by_hand():
    # train 32 = micro 1 x accumulation ? x dp 16: accumulation 2.
    r = recipe_from_deepspeed({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 1,
                               "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}, 16, 32)
    assert (r.dp, r.tp, r.pp, r.zero, r.microbatch) == (16, 1, 1, 3, 1)
    for doc, message in [({"train_batch_size": 32, "zero_optimization": {"stage": 3}},
                          "stage3_param_persistence_threshold"),
                         ({"train_batch_size": 32, "zero_optimization": {"stage": 2}}, "overlap_comm must be true"),
                         ({"train_batch_size": 32, "pipeline": {}}, "cannot express pipeline"),
                         ({"train_batch_size": 32, "zero_optimization": {"stage": 1, "overlap_comm": True,
                                                                         "offload_optimizer": {"device": "cpu"}}},
                          "offload_optimizer")]:
        with pytest.raises(ValueError, match=message):
            recipe_from_deepspeed(doc, 16, 32)


def test_files_that_cannot_be_read_are_file_errors(tmp_path):
    for name, body in [("empty", b""), ("list.json", b"[1, 2]"), ("bad.json", b'{"a": '), ("bin", bytes(range(256))),
                       ("bad.toml", b"[parallelism\n")]:
        path = tmp_path / name
        path.write_bytes(body)
        with pytest.raises(RecipeFileError):
            recipe_from_file(str(path), 8, 32, LLAMA8)
    status, out, err = run("-g", "llama3-8b", "-p", "8", "-b", "32", "-m", "1024", "--machine", "h100-sxm",
                           "--recipe-from", tmp_path / "bad.toml")
    assert status == 1 and err.startswith("pase: error: --recipe-from") and err.count("\n") == 1


def test_recipe_from_prices_for_the_files_engine(tmp_path):
    # A DeepSpeed file is priced for DeepSpeed; asked for another engine it is refused.
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 32, "gradient_accumulation_steps": 2, '
                    '"zero_optimization": {"stage": 1, "overlap_comm": true}}')
    base = ["-g", "llama3-8b", "-p", "16", "-b", "32", "-m", "1024", "--machine", "h100-sxm"]
    status, out, err = run(*base, "--recipe-from", path)
    assert status == 0, err
    assert "engine: deepspeed" in out and "plan: dp=16,tp=1,zero=1,recompute=none,microbatch=1" in out
    status, out, err = run(*base, "--recipe-from", path, "--engine", "torchtitan")
    assert status == 2 and "give --engine deepspeed" in err
