"""torchtitan's files read back as recipes (``--recipe-from``): a 0.3 launch script (the
arguments of ``-m torchtitan.train``) and a 0.2 TOML job file, both to the same recipe.

Each is turned into one job in 0.2's field names (``parallelism``, ``training``, the
recomputation, compile, the format), which :func:`titan_recipe` reads: degrees, ZeRO, batch
and pipeline. What the file sets that the tool cannot price is refused in one line.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex

from pase.outputs.recipe_common import (RecipeFileError, blocks_of, check_batch, check_sequence, folded_etp,
                                        looped_stages, make_recipe, whole)
from pase.outputs.titan_export import TITAN_AC, TITAN_FLOAT8_RECIPES, TITAN_MX_RECIPE, titan_precision_refusal
from pase.outputs.titan_model import (MODULE_CONFIG, MODULE_NAME, TITAN03_CONFIGS, TITAN03_MOE_CONFIGS, TITAN_LLAMA,
                                      TITAN_MOE, llama_refusal, model_shape, moe_refusal, moe_shape,
                                      shape_differences)
from pase.planning.mesh import Recipe

__all__ = ["titan_recipe", "recipe_from_torchtitan", "recipe_from_launch", "launch_engine", "toml_engine",
           "TITAN03_DEFAULTS"]


# ---------------------------------------------------------------------------------------
# The job, in 0.2's field names

def _degrees(par: dict, procs: int) -> dict:
    """The parallel degrees; ``shard`` -1 takes the devices left (torchtitan's ParallelDims)."""
    d = {k: whole(par.get(f, 1), f"parallelism.{f}") for k, f in (
        ("replicate", "data_parallel_replicate_degree"), ("tp", "tensor_parallel_degree"),
        ("pp", "pipeline_parallel_degree"), ("cp", "context_parallel_degree"), ("ep", "expert_parallel_degree"))}
    shard = par.get("data_parallel_shard_degree", -1)
    rest = d["replicate"] * d["cp"] * d["tp"] * d["pp"]
    if shard == -1:
        if procs % rest:
            raise ValueError(f"parallelism: replicate x cp x tp x pp = {rest} does not divide the {procs} devices of -p")
        shard = procs // rest
    d["shard"] = whole(shard, "parallelism.data_parallel_shard_degree")
    if rest * d["shard"] != procs:
        raise ValueError(f"parallelism degrees multiply to {rest * d['shard']}, not the {procs} devices of -p")
    d["etp"] = None
    if d["ep"] > 1:
        d["etp"] = whole(par.get("expert_tensor_parallel_degree", 1), "parallelism.expert_tensor_parallel_degree")
        if d["etp"] not in (1, d["tp"]):  # torchtitan's ParallelDims: "Currently we only support ETP=TP or ETP=1"
            raise ValueError(f"cannot express parallelism.expert_tensor_parallel_degree = {d['etp']}: torchtitan "
                             f"folds the experts with 1 or tp = {d['tp']}")
    if d["replicate"] > 1 and (d["shard"] > 1 or d["cp"] > 1):
        raise ValueError("cannot express parallelism.data_parallel_replicate_degree with FSDP (HSDP: weights "
                         "sharded within groups, replicated across them)")
    d["dp"] = d["replicate"] * d["shard"]
    return d


def _zero(par: dict, d: dict, ddp_alone: bool) -> int:
    """ZeRO-3 or 2 for FSDP (resharding after forward or not), 0 for replicated weights."""
    policy = par.get("fsdp_reshard_after_forward", "default")
    if policy not in ("default", "always", "never"):
        raise ValueError(f"parallelism.fsdp_reshard_after_forward must be default, always or never, got {policy!r}")
    if d["shard"] > 1 or d["cp"] > 1:
        reshard = policy == "always" or (policy == "default" and d["pp"] == 1)  # torchtitan's default: not with pp
        return 3 if reshard else 2
    if ddp_alone and d["dp"] > 1 and (d["tp"] > 1 or d["pp"] > 1 or d["ep"] > 1):
        raise ValueError("DDP (data_parallel_replicate_degree > 1 without sharding) with other "
                         "parallelism: torchtitan refuses it (\"DDP has not supported > 1D parallelism\")")
    return 0


def _stage_counts(par: dict, pp: int, vpp_schedule: bool, blocks: int | None, output: str) -> tuple:
    """``(counts per physical stage, vpp)`` from ``module_fqns_per_model_part`` or torchtitan's
    even split (``pipeline_parallel_layers_per_stage``, the first and last stages
    ``*_less_layers`` lighter; its generate_llm_fqn_per_model_part)."""
    parts = par.get("module_fqns_per_model_part")
    where = "parallelism.module_fqns_per_model_part"
    if parts is not None:
        if not isinstance(parts, list) or not parts or not all(
                isinstance(p, list) and all(isinstance(n, str) for n in p) for p in parts):
            raise ValueError(f"{where} must be a list of lists of module names")
        if len(parts) % pp:
            raise ValueError(f"{where} has {len(parts)} model parts, not a multiple of pipeline_parallel_degree {pp}")
        flat = [n for p in parts for n in p]
        layers = [n for n in flat if n.startswith("layers.")]
        if flat[:1] != ["tok_embeddings"] or flat[-2:] != ["norm", output] or \
                len(layers) + 3 != len(flat) or layers != [f"layers.{i}" for i in range(len(layers))]:
            raise ValueError(f"{where}: the plan puts tok_embeddings first, layers.0, layers.1, ... in order, then "
                             f"norm and {output} last")
        if blocks is not None and len(layers) != blocks:
            raise ValueError(f"{where} names {len(layers)} layers; the graph has {blocks} blocks")
        sizes = [sum(n.startswith("layers.") for n in p) for p in parts]
    else:
        sizes = _even_split(par, pp, vpp_schedule, blocks)
        where = f"torchtitan's split of {blocks} layers into {len(sizes)} model parts"
    if min(sizes) < 1:
        raise ValueError(f"{where}: every model part needs a layer")
    return looped_stages(sizes, pp, where) if len(sizes) > pp else (tuple(sizes), 1)


def _even_split(par: dict, pp: int, vpp_schedule: bool, blocks: int | None) -> list:
    if blocks is None:
        raise ValueError("a pipeline without parallelism.module_fqns_per_model_part needs the graph's block count "
                         "(a built-in decoder or an hf: config)")
    first = whole(par.get("pipeline_parallel_first_stage_less_layers", 1), "first_stage_less_layers", 0)
    last = whole(par.get("pipeline_parallel_last_stage_less_layers", 1), "last_stage_less_layers", 0)
    per = par.get("pipeline_parallel_layers_per_stage")
    if per is not None:
        per = whole(per, "parallelism.pipeline_parallel_layers_per_stage")
        stages = math.ceil((blocks + first + last) / per)
    else:
        stages = pp * (2 if vpp_schedule else 1)
    if stages % pp:
        raise ValueError(f"parallelism.pipeline_parallel_layers_per_stage {per} gives {stages} model parts, not a "
                         f"multiple of pipeline_parallel_degree {pp} (torchtitan refuses it too)")
    # Effective layers (blocks plus the weights of the first and last stages) shared evenly,
    # the first parts one more each for the remainder.
    even, extra = divmod(blocks + first + last, stages)
    sizes = [even + (1 if i < extra else 0) for i in range(stages)]
    sizes[0] -= first
    sizes[-1] -= last
    return sizes


def _batch_and_pipeline(job: dict, d: dict, batch: int, network) -> dict:
    """The micro-batch, and with a pipeline its schedule, chunks and stages."""
    par, train = job["parallelism"], job["training"]
    local = whole(train.get("local_batch_size", 8), "training.local_batch_size")
    global_batch = train.get("global_batch_size", -1)
    global_batch = local * d["dp"] if global_batch == -1 else whole(global_batch, "training.global_batch_size")
    check_batch(global_batch, batch, "training.global_batch_size")
    if "seq_len" in train or network is not None:
        check_sequence(whole(train.get("seq_len", 2048), "training.seq_len"), network, "training.seq_len")
    if d["pp"] == 1:
        if global_batch % (local * d["dp"]):
            raise ValueError(f"training.global_batch_size {global_batch} is not a multiple of local_batch_size x dp "
                             f"= {local * d['dp']}")
        return {"microbatch": local}
    micro = whole(par.get("pipeline_parallel_microbatch_size", 1), "parallelism.pipeline_parallel_microbatch_size")
    if local % micro:
        raise ValueError(f"parallelism.pipeline_parallel_microbatch_size {micro} does not divide "
                         f"training.local_batch_size {local}")
    if global_batch != local * d["dp"]:
        raise ValueError(f"training.global_batch_size {global_batch} is not local_batch_size x dp = "
                         f"{local * d['dp']}: gradient accumulation around a pipeline is not priced")
    name = par.get("pipeline_parallel_schedule", "1F1B")
    schedules = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved"}
    if name not in schedules:
        raise ValueError(f"cannot express parallelism.pipeline_parallel_schedule = {json.dumps(name)} "
                         "(priced: 1F1B, Interleaved1F1B)")
    counts, vpp = _stage_counts(par, d["pp"], name == "Interleaved1F1B", blocks_of(network), job["output"])
    if (vpp > 1) != (name == "Interleaved1F1B"):
        raise ValueError(f"parallelism.pipeline_parallel_schedule {name} with {vpp} model part(s) per rank")
    return {"microbatch": micro, "schedule": schedules[name], "vpp": vpp if vpp > 1 else None, "stages": counts}


def titan_recipe(job: dict, procs: int, batch: int, network) -> Recipe:
    """The recipe of a torchtitan job: ``parallelism`` and ``training`` (0.2's field names),
    ``recompute`` (none, full, op; or a function giving it, read after the degrees), ``compiled``,
    ``async_tp``, ``precision`` (the recipe's format fields, or a function of tp giving them),
    ``output`` (the output layer's module name), ``ddp_alone`` (0.2: DDP with data parallelism
    alone)."""
    d = _degrees(job["parallelism"], procs)
    zero = _zero(job["parallelism"], d, job["ddp_alone"])
    recompute = job["recompute"]() if callable(job["recompute"]) else job["recompute"]
    pipeline = _batch_and_pipeline(job, d, batch, network)
    if job["async_tp"] and not job["compiled"]:
        raise ValueError("async tensor parallelism needs compile.enable (torchtitan ignores it without)")
    precision = job["precision"](d["tp"]) if callable(job["precision"]) else job["precision"]
    return make_recipe(dp=d["dp"], tp=d["tp"], pp=d["pp"], cp=d["cp"], ep=d["ep"] if d["ep"] > 1 else None,
                       etp=folded_etp(d["dp"], d["tp"], d["ep"], d["etp"]), zero=zero, recompute=recompute,
                       schedule=pipeline.get("schedule"), vpp=pipeline.get("vpp"), stages=pipeline.get("stages"),
                       microbatch=pipeline["microbatch"], sp=True if d["tp"] > 1 else None,
                       tp_overlap=bool(job["async_tp"] and d["tp"] > 1), **precision)


def _check_model(shape: dict, network, where: str) -> None:
    """Refuse a file whose model is not the graph's (where the graph declares its shape)."""
    arch = getattr(network, "architecture", None)
    if not arch:
        return
    if "experts" in shape:  # one of torchtitan's mixtures of experts (titan_model.TITAN_MOE)
        reason = moe_refusal(arch) if arch.get("moe") else "the graph is a dense decoder"
        if reason is not None:
            raise ValueError(f"{where} builds torchtitan's Qwen3 30B-A3B, and the graph is another model: {reason}")
        differ = [k for k in shape if moe_shape(arch).get(k) != shape[k]]
        if differ:
            raise ValueError(f"{where} builds another model than the graph's: they differ in {', '.join(differ[:4])}")
        return
    reason = llama_refusal(arch, "0.3")
    if reason is not None:
        raise ValueError(f"{where} builds torchtitan's llama3 decoder, and the graph is another model: {reason}")
    differ = shape_differences(model_shape(arch), shape)
    if differ:
        raise ValueError(f"{where} builds another model than the graph's: the graph's {'; '.join(differ[:4])}")


# ---------------------------------------------------------------------------------------
# torchtitan 0.2.2: a TOML job file

#: The torchtitan 0.2 fields read (their section's), and those that change nothing priced.
_TOML_READ = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                    "expert_parallel_degree", "expert_tensor_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "module_fqns_per_model_part",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "context_parallel_load_balancer",
                    "context_parallel_rotate_method", "expert_parallel_comm_backend",
                    "pipeline_parallel_expert_parallel_overlap", "pipeline_parallel_schedule_csv"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "dataset", "dataset_path", "max_norm", "steps",
                 "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug", "dataloader"},
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop", "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
                              "determinism_check", "debug"},
}
#: Sections that change nothing priced (names of torchtitan 0.2's JobConfig).
_TOML_PASSIVE = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "comm",
                 "memory_estimation", "fault_tolerance", "experimental", "validation", "debug"}
#: Values a field may have for the plan to be priced as torchtitan runs it.
_TOML_PRICED = {
    ("parallelism", "disable_loss_parallel"): False,
    ("parallelism", "pipeline_parallel_schedule_csv"): "",
    ("training", "enable_cpu_offload"): False,
    ("training", "mixed_precision_param"): "bfloat16",
}


def _check_toml(doc: dict) -> None:
    for section, values in doc.items():
        if section in _TOML_READ or section in ("model", "compile"):
            if not isinstance(values, dict):
                raise ValueError(f"[{section}] must be a table")
            for key in values if section in _TOML_READ else ():
                if key not in _TOML_READ[section]:
                    raise ValueError(f"unknown torchtitan field {section}.{key}")
            if section == "model":
                _converters(values)
        elif section not in _TOML_PASSIVE and section != "quantize":
            raise ValueError(f"unknown torchtitan section [{section}]")
    for (section, key), value in _TOML_PRICED.items():
        given = doc.get(section, {}).get(key, value)
        if given != value:
            raise ValueError(f"cannot express {section}.{key} = {json.dumps(given)} (priced: {json.dumps(value)})")


def _toml_model(model: dict, network) -> None:
    """``model.name`` and ``model.flavor``, when given, must be the graph's model."""
    name, flavor = model.get("name", "llama3"), model.get("flavor")
    if name != "llama3":
        raise ValueError(f"cannot express model.name = {json.dumps(name)} (priced: torchtitan's llama3 flavours)")
    if flavor is None:
        return
    if flavor not in TITAN_LLAMA:
        raise ValueError(f"cannot express model.flavor = {json.dumps(flavor)} (torchtitan's Llama 3.1 flavours: "
                         f"{', '.join(TITAN_LLAMA)})")
    _check_model(TITAN_LLAMA[flavor], network, f"model.flavor = {json.dumps(flavor)}")


def _toml_recompute(ac: dict) -> str:
    mode = ac.get("mode", "selective")
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "none":
        return "none"
    if mode == "full" or (mode == "selective" and option == "1"):
        return "full"  # selective every 1st layer is every layer whole
    if mode == "selective" and option == "op":
        return "op"
    if mode == "selective":
        raise ValueError(f"cannot express activation_checkpoint.selective_ac_option = {json.dumps(option)} (every "
                         f"{option}th layer recomputed; priced: none, full, 'op')")
    raise ValueError(f"cannot express activation_checkpoint.mode = {json.dumps(mode)}")


def toml_engine(doc: dict) -> str:
    """The engine profile a 0.2 job file runs."""
    return "torchtitan,version=0.2" + (",compile=true" if _compiled(doc) else "")


def _compiled(doc: dict) -> bool:
    return isinstance(doc.get("compile"), dict) and doc["compile"].get("enable") is True


def recipe_from_torchtitan(doc: dict, procs: int, batch: int, network=None) -> Recipe:
    """The recipe of a torchtitan 0.2 job config (the TOML as a dict)."""
    _check_toml(doc)
    _toml_model(doc.get("model", {}), network)
    par = doc.get("parallelism", {})
    overlap = par.get("enable_async_tensor_parallel", False)
    if not isinstance(overlap, bool):
        raise ValueError("parallelism.enable_async_tensor_parallel must be true or false")
    compiled_ = _compiled(doc)
    job = {"parallelism": par, "training": doc.get("training", {}), "compiled": compiled_, "async_tp": overlap,
           "recompute": lambda: _toml_recompute(doc.get("activation_checkpoint", {})), "output": "output",
           "ddp_alone": True, "precision": lambda tp: _toml_precision(doc, tp, compiled_, network)}
    return titan_recipe(job, procs, batch, network)


#: torchtitan 0.2.2's converter fields (``quantize.linear.float8``, ``quantize.linear.mx``).
_QUANT_READ = {"float8": {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                          "recipe_name", "filter_fqns", "emulate"},
               "mx": {"recipe_name", "filter_fqns", "mxfp8_dim1_cast_kernel_choice"}}
#: Their ``filter_fqns`` defaults (torchtitan's job config).
_QUANT_FILTERS = {"float8": [], "mx": ["output"]}


def _converters(model: dict) -> list:
    """``model.converters``, refused unless none or one linear converter the tool prices."""
    converters = model.get("converters", [])
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        raise ValueError("model.converters must be a list of names")
    if len(converters) > 1 or converters[:1] not in ([], ["quantize.linear.float8"], ["quantize.linear.mx"]):
        raise ValueError(f"cannot express model.converters = {json.dumps(converters)} (priced: "
                         "[\"quantize.linear.float8\"] or [\"quantize.linear.mx\"])")
    return converters


def _toml_precision(doc: dict, tp: int, compiled_: bool, network) -> dict:
    """``precision``, ``scaling`` and ``fp8_gather`` of torchtitan's ``model.converters`` (none:
    BF16): ``quantize.linear.float8`` (``recipe_name`` tensorwise or rowwise, or none with
    ``enable_fsdp_float8_all_gather``) or ``quantize.linear.mx`` (MXFP8), ``output`` kept in BF16."""
    converters = _converters(doc.get("model", {}))
    if not converters:
        return {}
    kind = converters[0].rsplit(".", 1)[1]
    where = converters[0]
    section = doc.get("quantize", {})
    for key in ("linear", kind):
        section = section.get(key, {}) if isinstance(section, dict) else None
    if not isinstance(section, dict):
        raise ValueError(f"[{where}] must be a table")
    for key in section:
        if key not in _QUANT_READ[kind]:
            raise ValueError(f"unknown torchtitan field {where}.{key}")
    filters = section.get("filter_fqns", _QUANT_FILTERS[kind])
    if filters != ["output"]:
        raise ValueError(f"cannot express {where}.filter_fqns = {json.dumps(filters)} (priced: [\"output\"]: every "
                         "linear layer of the blocks converted, the output layer in BF16)")
    reason = titan_precision_refusal(getattr(network, "architecture", None), "mxfp8" if kind == "mx" else "fp8", tp,
                                     compiled_)
    if reason is not None:
        raise ValueError(f"{where}: {reason}")
    if kind == "mx":
        name = section.get("recipe_name", TITAN_MX_RECIPE)
        if name != TITAN_MX_RECIPE:
            raise ValueError(f"cannot express {where}.recipe_name = {json.dumps(name)} (priced: {TITAN_MX_RECIPE})")
        return {"precision": "mxfp8"}
    if section.get("emulate", False) is not False:
        raise ValueError(f"cannot express {where}.emulate = {json.dumps(section['emulate'])} (emulated FP8 GEMMs are "
                         "not priced)")
    gather = section.get("enable_fsdp_float8_all_gather", False)
    if not isinstance(gather, bool):
        raise ValueError(f"{where}.enable_fsdp_float8_all_gather must be true or false")
    name = section.get("recipe_name")
    scalings = {v: k for k, v in TITAN_FLOAT8_RECIPES.items()}
    if name is not None and name not in scalings:
        raise ValueError(f"cannot express {where}.recipe_name = {json.dumps(name)} (priced: "
                         f"{', '.join(scalings)})")
    if name is not None and gather:
        raise ValueError(f"{where}.enable_fsdp_float8_all_gather with a recipe_name: torchtitan refuses it")
    return {"precision": "fp8", "scaling": scalings[name] if name else "current", "fp8_gather": gather or None}


# ---------------------------------------------------------------------------------------
# torchtitan 0.3.0: a launch script

#: The fields of torchtitan 0.3.0's Trainer.Config read (config/configs.py), with their types
#: (``int?``/``str?``: or None; ``parts``: a list of comma-joined lists).
_LAUNCH_FIELDS = {
    "parallelism": {"data_parallel_replicate_degree": "int", "data_parallel_shard_degree": "int",
                    "fsdp_reshard_after_forward": "str", "enable_fsdp_symm_mem": "bool",
                    "tensor_parallel_degree": "int", "enable_sequence_parallel": "bool", "spmd_backend": "str",
                    "pipeline_parallel_degree": "int", "module_fqns_per_model_part": "parts",
                    "pipeline_parallel_first_stage_less_layers": "int",
                    "pipeline_parallel_last_stage_less_layers": "int", "pipeline_parallel_layers_per_stage": "int?",
                    "pipeline_parallel_schedule": "str", "pipeline_parallel_schedule_csv": "str?",
                    "pipeline_parallel_microbatch_size": "int", "context_parallel_degree": "int",
                    "context_parallel_load_balancer": "str?", "context_parallel_ptrr_mask_key": "str?",
                    "expert_parallel_degree": "int"},
    "training": {"local_batch_size": "int", "global_batch_size": "int", "seq_len": "int", "max_norm": "str",
                 "steps": "int", "enable_cpu_offload": "bool", "disable_cuda_graphs": "bool", "dtype": "str",
                 "mixed_precision_param": "str", "mixed_precision_reduce": "str", "gc_freq": "int",
                 "gc_debug": "bool"},
    "compile": {"enable": "bool", "enable_async_tensor_parallel": "bool", "components": "str", "backend": "str"},
}
#: Sections of Trainer.Config that change nothing priced, and its top-level options.
_LAUNCH_PASSIVE = {"profiler", "metrics", "tokenizer", "dataloader", "optimizer", "lr_scheduler", "checkpoint",
                   "comm", "validator", "debug", "loss", "activation_checkpoint", "hf_assets_path", "dump_folder"}
#: Values a field must have to run as priced (eager launches, BF16 mixed precision, no offload).
_LAUNCH_PRICED = {("training", "disable_cuda_graphs"): True, ("training", "enable_cpu_offload"): False,
                  ("training", "dtype"): "float32", ("training", "mixed_precision_param"): "bfloat16",
                  ("parallelism", "pipeline_parallel_schedule_csv"): "", ("parallelism", "enable_fsdp_symm_mem"): False,
                  ("parallelism", "enable_sequence_parallel"): True}
_PRICED_WHY = {"disable_cuda_graphs": "without --training.disable_cuda_graphs torchtitan 0.3 replays the step as "
                                      "CUDA graphs, and the step is priced with eager kernel launches",
               "enable_sequence_parallel": "cannot express --parallelism.no-enable-sequence-parallel (priced: "
                                           "sequence-parallel tensor parallelism, torchtitan's default)"}
#: torchtitan 0.3.0's class defaults of the fields read, and what each config function
#: (models/llama3/config_registry.py; the launch's own module is llama3_8b's) sets otherwise.
_CLASS_DEFAULTS = {"parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                                   "fsdp_reshard_after_forward": "default", "tensor_parallel_degree": 1,
                                   "enable_sequence_parallel": True, "enable_fsdp_symm_mem": False,
                                   "pipeline_parallel_degree": 1, "pipeline_parallel_schedule": "1F1B",
                                   "pipeline_parallel_schedule_csv": "", "pipeline_parallel_microbatch_size": 1,
                                   "context_parallel_degree": 1, "context_parallel_load_balancer": "headtail",
                                   "expert_parallel_degree": 1},
                   "training": {"local_batch_size": 8, "global_batch_size": -1, "seq_len": 2048,
                                "enable_cpu_offload": False, "disable_cuda_graphs": False, "dtype": "float32",
                                "mixed_precision_param": "bfloat16"},
                   "compile": {"enable": False, "enable_async_tensor_parallel": False}}
TITAN03_DEFAULTS = {
    "llama3_8b": {"training": {"local_batch_size": 1, "seq_len": 8192}, "ac": "selective"},
    "llama3_70b": {"training": {"local_batch_size": 8, "seq_len": 8192}, "parallelism": {"tensor_parallel_degree": 8},
                   "ac": "full"},
}
TITAN03_DEFAULTS[MODULE_CONFIG] = TITAN03_DEFAULTS["llama3_8b"]
#: models/qwen3/config_registry.py ``qwen3_30b_a3b``: local batch 2 of 4,096 tokens, every block
#: recomputed (FullAC), the degrees the class's own.
TITAN03_DEFAULTS["qwen3_30b_a3b"] = {"training": {"local_batch_size": 2, "seq_len": 4096}, "ac": "full"}
_SUBCOMMAND = re.compile(r"activation[-_]checkpoint:([a-z-]+)$")


def _launch_argv(text: str) -> list:
    """The arguments of ``-m torchtitan.train`` in a launch script (continued lines joined)."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        if "torchtitan.train" in line and not line.lstrip().startswith("#"):
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as err:
                raise RecipeFileError(f"cannot split the launch line ({err})") from None
            if "torchtitan.train" in tokens and tokens.index("torchtitan.train") > 0 and \
                    tokens[tokens.index("torchtitan.train") - 1] == "-m":
                return tokens[tokens.index("torchtitan.train") + 1:]
    raise RecipeFileError("no line runs -m torchtitan.train: not a torchtitan launch")


def _value(kind: str, values: list, flag: str):
    if kind == "parts":
        if not values:
            raise ValueError(f"{flag} needs the model parts (each a comma-separated list of module names)")
        return [v.split(",") for v in values]
    if len(values) != 1:
        raise ValueError(f"{flag} takes one value, got {len(values)}")
    value = values[0]
    if kind.endswith("?") and value == "None":
        return None
    if kind.startswith("int"):
        if not re.fullmatch(r"-?[0-9]{1,10}", value):
            raise ValueError(f"{flag} must be an integer, got {value!r}")
        return int(value)
    return "" if kind == "str?" and value in ("''", '""') else value


def _option(token: str) -> tuple:
    """``(section, field, switched)`` of ``--section.field`` (``switched``: ``True``, ``False``
    for ``--section.no-field``, ``None`` for a valued option)."""
    section, _, field = token[2:].replace("-", "_").partition(".")
    fields = _LAUNCH_FIELDS.get(section, {})
    if field.startswith("no_") and fields.get(field[3:]) == "bool":
        return section, field[3:], False
    return section, field, True if fields.get(field) == "bool" else None


def _launch_options(argv: list) -> dict:
    """``{"module", "config", "ac", SECTION: {field: value}}`` of the arguments."""
    out = {"module": None, "config": None, "ac": None}
    i = 0
    while i < len(argv):
        token, i = argv[i], i + 1
        match = _SUBCOMMAND.match(token)
        if match:
            if out["ac"] is not None:
                raise ValueError("two activation-checkpoint subcommands")
            out["ac"] = match.group(1)
            continue
        if not token.startswith("--"):
            raise ValueError(f"expected a torchtitan option (--section.field), got {token!r}")
        token, eq, inline = token.partition("=")
        values = [inline] if eq else []
        while not eq and i < len(argv) and not argv[i].startswith("--") and not _SUBCOMMAND.match(argv[i]):
            values.append(argv[i])
            i += 1
        _store(out, token, values)
    return out


def _store(out: dict, token: str, values: list) -> None:
    if token in ("--module", "--config"):
        if len(values) != 1:
            raise ValueError(f"{token} takes one value")
        out[token[2:]] = values[0]
        return
    section, field, switched = _option(token)
    if section in _LAUNCH_FIELDS and field in _LAUNCH_FIELDS[section]:
        if switched is not None and values:
            raise ValueError(f"{token} is a switch: it takes no value")
        value = switched if switched is not None else _value(_LAUNCH_FIELDS[section][field], values, token)
        if field in out.setdefault(section, {}):
            raise ValueError(f"{token} is given twice")
        out[section][field] = value
    elif section == "override":
        raise ValueError(f"cannot express {token}: an override swaps torchtitan's components (not priced)")
    elif section not in _LAUNCH_PASSIVE:
        raise ValueError(f"unknown torchtitan 0.3 option {token}")


def _launch_model(text: str, options: dict, network) -> None:
    """The model of ``--module``/``--config``: a flavour's config function or the launch's own
    module (its ``MODEL``), checked against the graph."""
    module, config = options["module"], options["config"]
    if module is None or config is None:
        raise ValueError("a torchtitan 0.3 launch needs --module and --config (its ConfigManager requires both)")
    flavours = {c: f for f, c in TITAN03_CONFIGS.items()}
    experts = {c: (m, f) for f, (m, c) in TITAN03_MOE_CONFIGS.items()}
    if module == "llama3" and config in flavours:
        _check_model(TITAN_LLAMA[flavours[config]], network, f"--config {config}")
    elif config in experts and module == experts[config][0]:
        _check_model(TITAN_MOE[experts[config][1]], network, f"--module {module} --config {config}")
    elif module == MODULE_NAME and config == MODULE_CONFIG:
        found = re.search(r"^MODEL = (\{.*\})$", text, flags=re.M)
        try:
            shape = ast.literal_eval(found.group(1)) if found else None
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            shape = None
        if not isinstance(shape, dict) or not set(TITAN_LLAMA["8B"]) <= set(shape):
            raise ValueError(f"--module {MODULE_NAME}: the launch's module (its MODEL) is not pase's")
        _check_model(shape, network, f"--module {MODULE_NAME}")
    else:
        raise ValueError(f"cannot express --module {module} --config {config} (priced: torchtitan's llama3 with "
                         f"{', '.join(sorted(flavours))}, its qwen3 with {', '.join(sorted(experts))}, or the module "
                         "pase writes)")


def launch_engine(text: str) -> str:
    """The engine profile a 0.3 launch script runs (compiled or not)."""
    options = _launch_options(_launch_argv(text))
    return "torchtitan,compile=true" if options.get("compile", {}).get("enable") else "torchtitan"


def recipe_from_launch(text: str, procs: int, batch: int, network=None) -> Recipe:
    """The recipe of a torchtitan 0.3 launch script (the arguments of ``-m torchtitan.train``)."""
    options = _launch_options(_launch_argv(text))
    _launch_model(text, options, network)
    defaults = TITAN03_DEFAULTS[options["config"]]
    sections = {s: {**_CLASS_DEFAULTS[s], **defaults.get(s, {}), **options.get(s, {})} for s in _CLASS_DEFAULTS}
    for (section, key), value in _LAUNCH_PRICED.items():
        if key == "enable_sequence_parallel" and sections["parallelism"]["tensor_parallel_degree"] == 1:
            continue
        if sections[section].get(key, value) != value:
            raise ValueError(_PRICED_WHY.get(key, f"cannot express --{section}.{key} {sections[section][key]} "
                                                  f"(priced: {value})"))
    if sections["parallelism"]["context_parallel_load_balancer"] is None:
        raise ValueError("cannot express --parallelism.context_parallel_load_balancer None (priced: the sequence "
                         "shared evenly, headtail or ptrr)")
    ac = options["ac"] or defaults["ac"]
    recompute = {v: k for k, v in TITAN_AC.items()}.get(ac)
    if recompute is None:
        raise ValueError(f"cannot express activation-checkpoint:{ac} (priced: none, full, selective)")
    compile_ = sections["compile"]
    job = {"parallelism": sections["parallelism"], "training": sections["training"], "recompute": recompute,
           "compiled": bool(compile_["enable"]), "async_tp": bool(compile_["enable_async_tensor_parallel"]),
           "precision": {}, "output": "lm_head", "ddp_alone": False}
    return titan_recipe(job, procs, batch, network)
