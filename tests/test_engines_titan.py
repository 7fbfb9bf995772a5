"""torchtitan's exports (issues 42 and 44): torchtitan 0.3's launch script and 0.2's job file,
each run through that release's own ConfigManager (tests/engine_checks.py ``titan_run``; skipped
where the release is not found), each naming or building the model priced, each read back by
``--recipe-from`` to the same step."""

from __future__ import annotations

import json
import math
import os
import tomllib

import pytest

import engine_checks as check
from cli_runner import run
from titan_check import launch_argv

from pase.outputs.titan_model import TITAN_LLAMA, TITAN_MOE
from pase.outputs.titan_recipes import TITAN03_DEFAULTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hf(name: str) -> str:
    return os.path.join(ROOT, "examples", "hf", f"{name}.json")


def hf_config(name: str) -> dict:
    with open(hf(name)) as f:
        return json.load(f)


LLAMA31 = ["-g", f"hf:{hf('llama-3.1-8b')}", "-p", "16", "-b", "32", "-m", "1024", "--machine", "h100-sxm"]
LLAMA3 = ["-g", "llama3-8b", "-p", "16", "-b", "32", "-m", "1024", "--machine", "h100-sxm"]
MIXTRAL = ["-g", "mixtral-8x7b", "-p", "16", "-b", "32", "-m", "256", "--machine", "h100-sxm"]
V02 = ["--engine", "torchtitan,version=0.2"]

#: (name, graph, recipe): Llama 3.1 8B is torchtitan's 8B (its config llama3_8b); the built-in
#: llama3-8b is Llama 3 (rotary frequencies unscaled), which no flavour is: its launch builds it.
CASES = [
    ("pipeline", LLAMA31, "dp=2,tp=2,pp=4,schedule=1f1b,zero=3,recompute=full,microbatch=1"),
    ("interleaved", LLAMA31, "dp=2,tp=2,pp=4,schedule=interleaved,vpp=2,zero=2,recompute=none,microbatch=2"),
    ("interleaved_uneven", LLAMA31, "dp=2,tp=2,pp=4,schedule=interleaved,vpp=3,stages=7/9/9/7,zero=2,"
                                    "recompute=none,microbatch=1"),
    ("fsdp", LLAMA31, "dp=16,tp=1,zero=3,recompute=op,microbatch=1"),
    ("tp_cp", LLAMA31, "dp=2,tp=4,cp=2,zero=3,recompute=full"),
    ("module_ddp_tied", "TINY", "dp=16,tp=1,zero=0,recompute=full,microbatch=2"),
    ("module_fsdp", LLAMA3, "dp=8,tp=2,zero=3,recompute=op,microbatch=1"),
    ("module_pipeline", LLAMA3, "dp=2,tp=2,pp=4,schedule=interleaved,vpp=2,zero=2,recompute=none,microbatch=2"),
]


#: A small Qwen3-shaped config (tied embeddings, query/key norms, its own rotary base and epsilon):
#: no flavour of torchtitan's, built by the launch's module.
TINY_CONFIG = {"model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1024,
               "max_position_embeddings": 4096, "tie_word_embeddings": True, "rope_theta": 1000000.0,
               "rms_norm_eps": 1e-6}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tiny-qwen3.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return ["-g", f"hf:{path}", "-p", "16", "-b", "32", "-m", "1024", "--machine", "h100-sxm"]


def _export(tmp_path, graph, recipe, name, *more):
    path = tmp_path / name
    status, out, err = run(*graph, "--recipe", recipe, "--export-torchtitan", path, "--json", *more)
    assert status == 0, err
    return path, json.loads(out)


def _round_trip(graph, path, report, *more):
    """--recipe-from the export: the same step seconds and peak memory (1e-9 relative)."""
    status, out, err = run(*graph, "--recipe-from", path, "--json", *more)
    assert status == 0, err
    again, first = json.loads(out)["training"], report["training"]
    assert math.isclose(again["step_seconds"], first["step_seconds"], rel_tol=1e-9)
    assert math.isclose(again["peak_memory_bytes"], first["peak_memory_bytes"], rel_tol=1e-9)
    assert again["mesh"] == first["mesh"] and again.get("pipeline", {}).get("stages") == \
        first.get("pipeline", {}).get("stages")
    return json.loads(out)


def _options(argv: list) -> dict:
    """``--section.field`` -> its value tokens (a switch: ``[]``), the subcommand under ``ac``."""
    out, key = {}, None
    for token in argv:
        if token.startswith("--"):
            key = token
            out[key] = []
        elif token.startswith("activation-checkpoint:"):
            out["ac"] = token.split(":")[1]
        else:
            out[key].append(token)
    return out


@pytest.mark.parametrize("name,graph,recipe", CASES, ids=[c[0] for c in CASES])
def test_launch_runs_the_plan(tmp_path, tiny, name, graph, recipe):
    graph = tiny if graph == "TINY" else graph
    path, report = _export(tmp_path, graph, recipe, f"{name}.sh")
    text = path.read_text()
    o = _options(launch_argv(text))
    t = report["training"]
    mesh, m = t["mesh"], t["microbatches"]
    degree = {k: int(o[f"--parallelism.{k}_degree"][0]) for k in (
        "data_parallel_replicate", "data_parallel_shard", "tensor_parallel", "pipeline_parallel", "context_parallel")}
    assert math.prod(degree.values()) == 16  # the degrees multiply to p
    # ZeRO-3 and ZeRO-2: FSDP over the dp ranks, resharding after forward or not; ZeRO-0 replicated.
    if t["zero"] == 0:
        assert (degree["data_parallel_replicate"], degree["data_parallel_shard"]) == (mesh["dp"], 1)
    else:
        assert (degree["data_parallel_replicate"], degree["data_parallel_shard"]) == (1, mesh["dp"])
        assert o["--parallelism.fsdp_reshard_after_forward"] == [{3: "always", 2: "never"}[t["zero"]]]
    local, micro = int(o["--training.local_batch_size"][0]), t["microbatch_sequences"]
    assert o["--training.global_batch_size"] == ["32"] and o["--training.seq_len"] == ["1024"]
    assert "--parallelism.fsdp_reshard_after_forward" in o or t["zero"] == 0
    if mesh["pp"] > 1:  # the batch of a dp rank, cut into micro-batches of pipeline_parallel_microbatch_size
        assert local == 32 // mesh["dp"] and local // int(o["--parallelism.pipeline_parallel_microbatch_size"][0]) == m
        parts = [p.split(",") for p in o["--parallelism.module_fqns_per_model_part"]]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
        per_rank = [sum(sum(n.startswith("layers.") for n in parts[j]) for j in range(r, len(parts), mesh["pp"]))
                    for r in range(mesh["pp"])]
        assert per_rank == [st["blocks"] for st in t["pipeline"]["stages"]]
    else:  # one micro-batch per forward; torchtitan accumulates global / (local x dp)
        assert local == micro and 32 // (micro * mesh["dp"]) == m
    assert o["ac"] == {"none": "none", "full": "full", "op": "selective"}[t["recompute"]]
    assert "--training.disable_cuda_graphs" in o and "--compile.enable" not in o
    flavour = graph is LLAMA31
    assert (o["--module"], o["--config"]) == (["llama3"], ["llama3_8b"]) if flavour else \
        (["pase_torchtitan_model"], ["pase_model"])
    _round_trip(graph, path, report)


def test_torchtitan_03_accepts_every_launch(tmp_path, tiny):
    # Every case above through torchtitan 0.3's own ConfigManager (the exact arguments of the
    # launch line) and ParallelDims, in one process; the model it builds is the one priced.
    scripts = {name: _export(tmp_path, tiny if graph == "TINY" else graph, recipe, f"{name}.sh")
               for name, graph, recipe in CASES}
    results = check.titan_run([{"kind": "launch", "script": path.read_text(), "world": 16}
                               for path, _ in scripts.values()], "0.3")
    for (name, graph, _), result in zip(CASES, results):
        source = TINY_CONFIG if graph == "TINY" else hf_config("llama-3.1-8b")
        assert result["ok"], (name, result["error"])
        t = scripts[name][1]["training"]
        mesh, dims = t["mesh"], result["dims"]
        assert dims["dp_replicate"] * dims["dp_shard"] == mesh["dp"] and (dims["tp"], dims["pp"], dims["cp"]) == \
            (mesh["tp"], mesh["pp"], mesh["cp"])
        assert result["training"]["global_batch_size"] == 32 and result["training"]["seq_len"] == 1024
        assert result["activation_checkpoint"] == {"none": "NoneType", "full": "FullAC.Config",
                                                   "op": "SelectiveAC.Config"}[t["recompute"]]
        model = result["model"]
        # The model torchtitan builds, against the source: the hf config.json read here, or
        # Meta's Llama 3 8B (params.json: rope_theta 500000 unscaled, norm_eps 1e-5).
        want = {"layers": source["num_hidden_layers"], "width": source["hidden_size"],
                "heads": source["num_attention_heads"], "kv_heads": source["num_key_value_heads"],
                "mlp_width": source["intermediate_size"], "vocab": source["vocab_size"],
                "tied": source["tie_word_embeddings"], "rope_theta": source["rope_theta"],
                "norm_eps": source["rms_norm_eps"]}
        assert {k: model[k] for k in want} == want, name
        if graph == "TINY":  # Qwen3's query/key norms and its own head width
            assert model["qk_norm"] and model["head_dim"] == source["head_dim"] and model["tied"]
            assert model["rope_scaling"] is None and model["flavor"] == "pase"
            continue
        if graph is LLAMA31:
            scaling = source["rope_scaling"]
            assert (model["flavor"], model["rope_scaling"]["factor"], model["rope_scaling"]["low_freq_factor"],
                    model["rope_scaling"]["high_freq_factor"],
                    model["rope_scaling"]["original_max_position_embeddings"]) == \
                ("8B", scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                 scaling["original_max_position_embeddings"])
        else:
            assert model["flavor"] == "pase" and model["rope_scaling"] is None
        assert model["head_dim"] * model["heads"] == model["width"] and not any(model["biases"])
        assert model["attention"] == "FlexAttention.Config"


def test_torchtitan_03_flavours_and_config_defaults_are_pase_s():
    # pase's table of torchtitan's flavours and of what its config functions set (the reader's
    # defaults) against torchtitan 0.3's own code.
    results = check.titan_run([{"kind": "flavours"}] + [{"kind": "config", "argv": ["--module", "llama3", "--config",
                                                                                     c]}
                                                        for c in ("llama3_8b", "llama3_70b")], "0.3")
    flavours = results[0]["flavours"]
    for name, shape in TITAN_LLAMA.items():
        built = flavours[name]
        scaling = dict(built["rope_scaling"], type="llama3")
        got = dict({k: built[k] for k in shape if k not in ("rope_scaling",)}, rope_scaling=scaling)
        assert got == shape, name
    for config, result in zip(("llama3_8b", "llama3_70b"), results[1:]):
        defaults = TITAN03_DEFAULTS[config]
        assert result["training"]["local_batch_size"] == defaults["training"]["local_batch_size"]
        assert result["training"]["seq_len"] == defaults["training"]["seq_len"]
        assert result["parallelism"]["tensor_parallel_degree"] == defaults.get("parallelism", {}).get(
            "tensor_parallel_degree", 1)
        assert result["activation_checkpoint"] == {"selective": "SelectiveAC.Config", "full": "FullAC.Config"}[
            defaults["ac"]]
        assert not result["compile"]["enable"] and result["training"]["disable_cuda_graphs"] is False


def _need_triton(result: dict) -> None:
    """Skip where torchtitan 0.3's mixtures of experts cannot be imported: their expert-parallel
    kernels are written in triton, which a CPU build of PyTorch lacks (.ci/run installs it)."""
    if not result["ok"] and "No module named 'triton'" in result["error"]:
        pytest.skip("torchtitan 0.3's MoE models import triton, which is not installed")


def test_torchtitan_03_mixture_of_experts_is_pase_s():
    # pase's words for torchtitan 0.3's Qwen3-30B-A3B (titan_model.TITAN_MOE) and what its config
    # function sets (the reader's defaults), against torchtitan's own config.
    result = check.titan_run([{"kind": "config", "argv": ["--module", "qwen3", "--config", "qwen3_30b_a3b"]}], "0.3")[0]
    _need_triton(result)
    assert result["ok"], result["error"]
    model, shape = result["model"], TITAN_MOE["30B-A3B"]
    got = {k: model[k] for k in ("layers", "width", "heads", "kv_heads", "head_dim", "vocab", "tied", "qk_norm",
                                 "rope_theta", "rope_scaling", "norm_eps")}
    got.update({k: model["moe"][k] for k in ("experts", "top_k", "expert_width", "shared")})
    assert got == shape and model["moe_layers"] == shape["layers"]
    assert (model["moe"]["score"], model["moe"]["route_norm"]) == ("softmax", True)
    defaults = TITAN03_DEFAULTS["qwen3_30b_a3b"]
    assert (result["training"]["local_batch_size"], result["training"]["seq_len"]) == (
        defaults["training"]["local_batch_size"], defaults["training"]["seq_len"])
    assert result["activation_checkpoint"] == "FullAC.Config" and defaults["ac"] == "full"
    assert result["parallelism"]["tensor_parallel_degree"] == 1 and result["parallelism"]["expert_parallel_degree"] == 1


# ---------------------------------------------------------------------------------------
# torchtitan 0.2: the job file, behind --engine torchtitan,version=0.2

V02_CASES = [
    ("pipeline", "dp=2,tp=2,pp=4,schedule=1f1b,zero=3,recompute=full,microbatch=1"),
    ("interleaved_uneven", "dp=2,tp=2,pp=4,schedule=interleaved,vpp=3,stages=7/9/9/7,zero=2,recompute=none,"
                           "microbatch=1"),
    ("fsdp", "dp=16,tp=1,zero=3,recompute=op,microbatch=1"),
    ("fp8", "dp=16,tp=1,zero=3,recompute=full,microbatch=1,precision=fp8,fp8_gather=true"),
]


@pytest.mark.parametrize("name,recipe", V02_CASES, ids=[c[0] for c in V02_CASES])
def test_job_file_of_torchtitan_02(tmp_path, name, recipe):
    path, report = _export(tmp_path, LLAMA31, recipe, f"{name}.toml", *V02)
    doc = tomllib.loads(path.read_text())
    assert doc["model"]["name"] == "llama3" and doc["model"]["flavor"] == "8B"  # the model priced, named
    assert doc["training"]["global_batch_size"] == 32
    again = _round_trip(LLAMA31, path, report)
    assert again["engine"].startswith("torchtitan,version=0.2")
    line = next(x for x in path.read_text().splitlines() if x.startswith("# command line")).split(": ", 1)[1]
    result = check.titan_accepts(path, line, 16)
    assert result["model"]["flavor"] == "8B"
    if "flavour" in result:  # torchtitan 0.2's model code imports its data packages (.ci/run has them)
        source, flavour = hf_config("llama-3.1-8b"), result["flavour"]
        assert (flavour["width"], flavour["layers"], flavour["heads"], flavour["kv_heads"], flavour["vocab"],
                flavour["rope_theta"], flavour["norm_eps"]) == \
            (source["hidden_size"], source["num_hidden_layers"], source["num_attention_heads"],
             source["num_key_value_heads"], source["vocab_size"], source["rope_theta"], source["rms_norm_eps"])
        # torchtitan 0.2's FFN width: multiple_of x ceil(ffn_dim_multiplier x int(8 dim / 3) / multiple_of).
        hidden = int(flavour["ffn_dim_multiplier"] * int(8 * flavour["width"] / 3))
        assert flavour["multiple_of"] * -(-hidden // flavour["multiple_of"]) == source["intermediate_size"]
        assert flavour["rope_scaling"]["scaling_factor"] == source["rope_scaling"]["factor"]


def test_launch_and_job_file_read_back_to_the_same_recipe(tmp_path):
    # One plan written both ways prices the same step read back from either file.
    recipe = "dp=2,tp=2,pp=4,schedule=interleaved,vpp=2,zero=2,recompute=none,microbatch=2"
    launch, report = _export(tmp_path, LLAMA31, recipe, "p.sh")
    toml, _ = _export(tmp_path, LLAMA31, recipe, "p.toml", *V02)
    a, b = _round_trip(LLAMA31, launch, report), _round_trip(LLAMA31, toml, report)
    assert a["training"]["recipe"] == b["training"]["recipe"] == report["training"]["recipe"]


# ---------------------------------------------------------------------------------------
# Refusals: what a release's file cannot say, one line, exit 2, nothing written

@pytest.mark.parametrize("graph,recipe,more,reason", [
    (MIXTRAL, "dp=4,tp=2,pp=2,ep=8,zero=3,recompute=full,microbatch=1", (),
     "torchtitan 0.3's mixture of experts the launch writes is its Qwen3 30B-A3B, and this model differs"),
    (MIXTRAL, "dp=8,tp=2,ep=4,zero=3,recompute=full", V02,
     "this exporter writes torchtitan 0.2's Llama decoder, not its mixtures of experts"),
    (LLAMA3, "dp=16,tp=1,zero=3,recompute=op", V02, "the nearest, 8B, differs in rotary scaling none"),
    (LLAMA31, "dp=16,tp=1,zero=3,precision=fp8", (), "torchtitan 0.3 sets its low-precision converters"),
    (["-g", "gpt2-small", "-p", "16", "-b", "32", "--machine", "h100-sxm"], "dp=16,tp=1,zero=3", (),
     "is not this model, with its plain (not gated) MLP, layer norm, learned positions"),
    (LLAMA31, "dp=8,tp=2,zero=3", ("--engine", "torchtitan,version=0.3,compile=true"), None),
])
def test_torchtitan_refuses_what_its_file_cannot_say(tmp_path, graph, recipe, more, reason):
    path = tmp_path / "out"
    status, out, err = run(*graph, "--recipe", recipe, "--export-torchtitan", path, *more)
    if reason is None:  # a switch given as the default: accepted
        assert status == 0, err
        return
    assert status == 2 and reason in err and not path.exists(), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("spec", ["torchtitan,version=0.1", "torchtitan,version=", "torchtitan,version=0.2,version=0.3",
                                  "torchtitan,version=03"])
def test_bad_torchtitan_versions(tmp_path, spec):
    status, out, err = run(*LLAMA31, "--engine", spec, "--export-torchtitan", tmp_path / "t")
    assert status == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "t").exists(), err


GOOD = ("#!/usr/bin/env bash\ntorchrun --nnodes 1 --nproc-per-node 8 -m torchtitan.train --module llama3 --config "
        "llama3_8b --parallelism.data_parallel_shard_degree 16 --training.local_batch_size 2 "
        "--training.global_batch_size 32 --training.seq_len 1024 --training.disable_cuda_graphs {more} "
        "activation-checkpoint:full\n")


def test_recipe_from_a_launch_by_hand(tmp_path):
    # llama3_8b with FSDP over 16 ranks: 32 sequences, 2 per rank per micro-batch, so
    # 32 / (2 x 16) = 1 micro-batch; data_parallel_shard_degree 16, "default" resharding
    # without a pipeline: ZeRO-3; activation-checkpoint:full recomputes every block.
    path = tmp_path / "t.sh"
    path.write_text(GOOD.format(more="--profiler.enable_profiling --optimizer.param-groups.0.pattern '.*'"))
    status, out, err = run(*LLAMA31, "--recipe-from", path, "--json")
    assert status == 0, err
    t = json.loads(out)["training"]
    assert (t["mesh"]["dp"], t["zero"], t["recompute"], t["microbatch_sequences"]) == (16, 3, "full", 2)


@pytest.mark.parametrize("more,script,reason", [
    ("--compile.enable --compile.enable_async_tensor_parallel", None, None),
    ("", GOOD.format(more="").replace("--module llama3 ", ""), "needs --module and --config"),
    ("", GOOD.format(more="").replace("llama3_8b", "llama3_405b"), "cannot express --module llama3 --config llama3_405b"),
    ("", GOOD.format(more="").replace("llama3_8b", "llama3_70b"), "builds another model than the graph's"),
    ("", GOOD.format(more="").replace("--module llama3 --config llama3_8b", "--module qwen3 --config qwen3_30b_a3b"),
     "builds torchtitan's Qwen3 30B-A3B, and the graph is another model: the graph is a dense decoder"),
    ("", GOOD.format(more="").replace("--module llama3 --config llama3_8b", "--module llama3 --config qwen3_30b_a3b"),
     "cannot express --module llama3 --config qwen3_30b_a3b"),
    ("", GOOD.format(more="").replace("activation-checkpoint:full", "activation-checkpoint:memory-budget"),
     "cannot express activation-checkpoint:memory-budget"),
    ("", GOOD.format(more="").replace("--training.disable_cuda_graphs", ""), "replays the step as CUDA graphs"),
    ("--override.imports x.y", None, "an override swaps torchtitan's components"),
    ("--parallelism.tensor_parallel_degree two", None, "must be an integer"),
    ("--training.seq_len 2048", None, "--training.seq_len is given twice"),
    ("--parallelism.frobnicate 3", None, "unknown torchtitan 0.3 option --parallelism.frobnicate"),
    ("--parallelism.context_parallel_load_balancer None", None, "context_parallel_load_balancer None"),
    ("--parallelism.tensor_parallel_degree 2 --parallelism.no-enable-sequence-parallel", None,
     "no-enable-sequence-parallel"),
    ("", "#!/bin/sh\ntorchrun -m torchtitan.train --module 'llama3\n", "cannot split the launch line"),
    ("", "#!/bin/sh\necho torchtitan.train\n", "no line runs -m torchtitan.train"),
])
def test_recipe_from_refuses_a_launch_it_cannot_price(tmp_path, more, script, reason):
    path = tmp_path / "t.sh"
    path.write_text(script if script is not None else GOOD.format(more=more))
    status, out, err = run(*LLAMA31, "--recipe-from", path)
    if reason is None:
        assert status == 0, err
        return
    assert status in (1, 2) and reason in err, err
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------
# Must-show 3 of issue 42: the README's 70B plan, an 8B FSDP plan and a Mixtral plan, each
# export accepted by its engine's own code and read back to the same step; the model settings
# against the hf config.json read here.

README_70B = ["-g", f"hf:{hf('llama-3.1-70b')}", "-p", "256", "-b", "512", "-m", "8192", "--machine", "h100-sxm"]
FSDP_8B = ["-g", f"hf:{hf('llama-3.1-8b')}", "-p", "8", "-b", "16", "-m", "8192", "--machine", "h100-sxm"]
MIXTRAL_HF = ["-g", f"hf:{hf('mixtral-8x7b')}", "-p", "64", "-b", "256", "-m", "4096", "--machine", "h100-sxm"]
QWEN3_MOE = ["-g", f"hf:{hf('qwen3-30b-a3b')}", "-p", "16", "-b", "64", "-m", "4096", "--machine", "h100-sxm"]


def test_must_show_torchtitan(tmp_path):
    exports = []
    for name, graph, recipe in (("70b", README_70B, None), ("8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=op,microbatch=1")):
        path = tmp_path / f"{name}.sh"
        fixed = ["--recipe", recipe] if recipe else ["--engine", "torchtitan"]  # the README's: the search's plan
        status, out, err = run(*graph, *fixed, "--export-torchtitan", path, "--json")
        assert status == 0, err
        _round_trip(graph, path, json.loads(out))
        exports.append((name, graph, path, json.loads(out)))
    # torchtitan has no Mixtral (0.3's models: deepseek_v3, gpt_oss, kimi_k2_7, llama3, qwen3, ...): refused,
    # with what sets it apart from the mixture of experts the launch writes.
    status, out, err = run(*MIXTRAL_HF, "--engine", "torchtitan", "--export-torchtitan", tmp_path / "m.sh")
    assert status == 2 and "layers 32 (not 48)" in err
    assert "torchtitan 0.3's mixture of experts the launch writes is its Qwen3 30B-A3B, and this model differs" in err
    results = check.titan_run([{"kind": "launch", "script": p.read_text(), "world": int(g[g.index("-p") + 1])}
                               for _, g, p, _ in exports], "0.3")
    for (name, graph, path, report), result in zip(exports, results):
        assert result["ok"], result["error"]
        source = hf_config(f"llama-3.1-{name}")
        model = result["model"]
        assert (model["name"], model["flavor"]) == ("llama3", name.upper())
        assert (model["layers"], model["width"], model["mlp_width"], model["vocab"], model["rope_theta"],
                model["norm_eps"]) == (source["num_hidden_layers"], source["hidden_size"], source["intermediate_size"],
                                       source["vocab_size"], source["rope_theta"], source["rms_norm_eps"])
        mesh = report["training"]["mesh"]
        assert result["dims"]["dp_shard"] * result["dims"]["dp_replicate"] == mesh["dp"]
        assert result["dims"]["cp"] == mesh["cp"] and result["dims"]["tp"] == mesh["tp"]


def test_must_show_torchtitan_mixture_of_experts(tmp_path):
    # torchtitan 0.3's own Qwen3-30B-A3B: its config function, expert parallelism borrowed from
    # FSDP; accepted by its ConfigManager and ParallelDims, the model it builds the hf config's,
    # read back by --recipe-from to the same step.
    path = tmp_path / "qwen3.sh"
    status, out, err = run(*QWEN3_MOE, "--recipe", "dp=16,ep=8,zero=3,recompute=full,microbatch=1",
                           "--engine", "torchtitan", "--export-torchtitan", path, "--json")
    assert status == 0, err
    _round_trip(QWEN3_MOE, path, json.loads(out))
    qwen3 = check.titan_run([{"kind": "launch", "script": path.read_text(), "world": 16}], "0.3")[0]
    _need_triton(qwen3)
    assert qwen3["ok"], qwen3["error"]
    source, model = hf_config("qwen3-30b-a3b"), qwen3["model"]
    assert (model["name"], model["flavor"], model["layers"], model["moe_layers"], model["width"], model["heads"],
            model["kv_heads"], model["head_dim"], model["vocab"], model["tied"], model["qk_norm"], model["rope_theta"],
            model["norm_eps"]) == ("qwen3", "30B-A3B", source["num_hidden_layers"], source["num_hidden_layers"],
                                   source["hidden_size"], source["num_attention_heads"], source["num_key_value_heads"],
                                   source["head_dim"], source["vocab_size"], source["tie_word_embeddings"], True,
                                   source["rope_theta"], source["rms_norm_eps"])
    assert model["moe"] == {"experts": source["num_experts"], "top_k": source["num_experts_per_tok"],
                            "expert_width": source["moe_intermediate_size"], "score": "softmax",
                            "route_norm": source["norm_topk_prob"], "shared": 0}
    assert (qwen3["dims"]["dp_shard"], qwen3["dims"]["ep"], qwen3["dims"]["tp"]) == (16, 8, 1)
    assert qwen3["activation_checkpoint"] == "FullAC.Config"


def _megatron_model_matches(a: dict, config, source: dict, tp: int) -> None:
    """Megatron-LM's arguments and megatron-core's TransformerConfig against the hf config."""
    assert (a["--num-layers"], a["--hidden-size"], a["--num-attention-heads"], a["--num-query-groups"],
            a["--kv-channels"]) == (source["num_hidden_layers"], source["hidden_size"], source["num_attention_heads"],
                                    source["num_key_value_heads"], source["hidden_size"] // source["num_attention_heads"])
    assert a["--rotary-base"] == source["rope_theta"] and a["--norm-epsilon"] == source["rms_norm_eps"]
    assert config.layernorm_epsilon == source["rms_norm_eps"] and config.num_query_groups == source["num_key_value_heads"]
    assert ("--untie-embeddings-and-output-weights" in a) == (not source.get("tie_word_embeddings", False))
    assert check.megatron_tokenizer_vocabulary(a, tp) == source["vocab_size"]
    scaling = source.get("rope_scaling")
    assert ("--use-rope-scaling" in a) == bool(scaling)
    if scaling:  # megatron-core's scaling is Llama 3.1's with these fixed: low 1, high 4, 8192 positions
        assert (a["--rope-scaling-factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                scaling["original_max_position_embeddings"]) == (scaling["factor"], 1.0, 4.0, 8192)
    experts = source.get("num_local_experts")
    if experts:
        assert (a["--num-experts"], a["--moe-router-topk"], a["--moe-ffn-hidden-size"]) == \
            (experts, source["num_experts_per_tok"], source["intermediate_size"])
        assert config.moe_grouped_gemm and a.get("--moe-grouped-gemm") is True
    else:
        assert a["--ffn-hidden-size"] == source["intermediate_size"]


@pytest.mark.parametrize("name,graph,recipe", [
    ("llama-3.1-70b", README_70B, None),
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1"),
    ("mixtral-8x7b", MIXTRAL_HF, "dp=8,tp=2,pp=2,ep=8,zero=1,recompute=full,microbatch=1"),
])
def test_must_show_megatron(tmp_path, name, graph, recipe):
    path = tmp_path / "m.json"
    fixed = ["--recipe", recipe] if recipe else ["--engine", "megatron"]
    status, out, err = run(*graph, *fixed, "--export-megatron", path, "--json")
    assert status == 0, err
    report = json.loads(out)
    _round_trip(graph, path, report)
    a = json.loads(path.read_text())["arguments"]
    assert not check.megatron_flag_problems(a)
    procs = int(graph[graph.index("-p") + 1])
    config, _, _ = check.megatron_accepts(a, procs)
    _megatron_model_matches(a, config, hf_config(name), report["training"]["mesh"]["tp"])


@pytest.mark.parametrize("name,graph,recipe,change", [
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1", {"rms_norm_eps": 1e-6}),
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1", {"rope_theta": 10000.0}),
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1", {"rope_scaling": None}),
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1", {"num_key_value_heads": 4}),
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1", {"tie_word_embeddings": True}),
    ("llama-3.1-8b", FSDP_8B, "dp=8,tp=1,zero=3,recompute=full,microbatch=1", {"vocab_size": 128000}),
    ("mixtral-8x7b", MIXTRAL_HF, "dp=8,tp=2,pp=2,ep=8,zero=1,recompute=full,microbatch=1", {"num_experts_per_tok": 1}),
    ("mixtral-8x7b", MIXTRAL_HF, "dp=8,tp=2,pp=2,ep=8,zero=1,recompute=full,microbatch=1", {"--moe-grouped-gemm": None}),
])
def test_megatron_model_check_catches_another_model(tmp_path, name, graph, recipe, change):
    # The comparison of the must-show test fails on a config that is not the one exported (or on
    # arguments without one of theirs): it can fail.
    path = tmp_path / "m.json"
    status, out, err = run(*graph, "--recipe", recipe, "--export-megatron", path, "--json")
    assert status == 0, err
    a = json.loads(path.read_text())["arguments"]
    procs, tp = int(graph[graph.index("-p") + 1]), json.loads(out)["training"]["mesh"]["tp"]
    config, _, _ = check.megatron_accepts(a, procs)
    _megatron_model_matches(a, config, hf_config(name), tp)
    source = dict(hf_config(name), **{k: v for k, v in change.items() if not k.startswith("--")})
    args = {k: v for k, v in a.items() if k not in change}
    with pytest.raises(AssertionError):
        _megatron_model_matches(args, config, source, tp)
