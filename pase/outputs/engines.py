"""Mesh plans as the settings of the engines people run: torchtitan, Megatron-LM, DeepSpeed.

Each writer takes an :class:`~pase.planning.engine_runs.EnginePlan` and returns the engine's
settings that run exactly that plan, or raises :class:`EngineRefusal` with the reason when the
engine cannot (:func:`pase.planning.engine_runs.refusal`, or a model shape it has no argument
for): nothing is substituted. Every result keeps ``recipe`` (the plan in ``--recipe`` words,
with ``stages=`` where the pipeline stages differ), ``command_line`` (the engine's own
arguments) and ``launch`` (the command that runs it).

Field and argument names are the engines' own: torchtitan 0.2.2's job config (the last
release that reads TOML job files; 0.3 moved to Python config registries), Megatron-LM's
``pretrain_gpt.py`` arguments (megatron-core 0.16 configuration classes), DeepSpeed 0.19's
``ds_config.json``.

Low precision (``docs/precision.md``): Megatron-LM's Transformer Engine recipes
(``--fp8-format hybrid --fp8-recipe delayed|tensorwise|blockwise|mxfp8``, ``--fp4-format e2m1
--fp4-recipe nvfp4``, ``--fp8-param-gather``/``--fp4-param-gather`` for ``fp8_gather``);
torchtitan's converters (``quantize.linear.float8`` tensorwise or rowwise, with
``enable_fsdp_float8_all_gather``; ``quantize.linear.mx`` for MXFP8), the output layer kept in
BF16 as priced. What an engine's file cannot say (its profile's ``runs.export``) is refused.
"""

from __future__ import annotations

import json
import shlex

from pase.planning.engine_runs import EnginePlan, refusal
from pase.planning.pipeline import virtual_order

__all__ = ["EngineRefusal", "torchtitan_settings", "megatron_settings", "deepspeed_settings", "WRITERS",
           "toml_text", "torchtitan_fqns", "megatron_layout", "TORCHTITAN_VERSION", "DEVICES_PER_NODE",
           "MEGATRON_PRECISION", "TITAN_FLOAT8_RECIPES", "TITAN_MX_RECIPE", "TITAN_MIN_DIM", "titan_precision_refusal"]

#: The torchtitan release whose job-config field names the export uses.
TORCHTITAN_VERSION = "0.2.2"
#: Devices per node in the launch commands (torchrun's --nproc-per-node): the H100/H200/A100
#: servers of the machine presets have 8.
DEVICES_PER_NODE = 8

#: Megatron-LM's arguments per format (``EnginePlan.precision_word``): Transformer Engine's
#: recipes, FP8 in its ``hybrid`` format (E4M3 forward, E5M2 gradients); then the switch that
#: keeps the converted weights (and so ZeRO's gathers of them) in the format.
MEGATRON_PRECISION = {
    "fp8/delayed": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")), "--fp8-param-gather"),
    "fp8/current": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")), "--fp8-param-gather"),
    "fp8/blockwise": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "blockwise")), "--fp8-param-gather"),
    "mxfp8": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "mxfp8")), "--fp8-param-gather"),
    "nvfp4": ((("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")), "--fp4-param-gather"),
}
#: torchtitan 0.2.2's Float8 ``recipe_name`` per FP8 scaling (``quantize.linear.float8``).
TITAN_FLOAT8_RECIPES = {"current": "tensorwise", "rowwise": "rowwise"}
#: torchtitan 0.2.2's MX ``recipe_name`` for MXFP8 (``quantize.linear.mx``, its default).
TITAN_MX_RECIPE = "mxfp8_cublas"
#: torchtitan's converters skip a linear layer with a dimension not a multiple of this
#: (``components/quantization/utils.py``, the FP8 tensor cores' alignment).
TITAN_MIN_DIM = 16


class EngineRefusal(ValueError):
    """The engine cannot run the plan as priced; the message says why."""

    def __init__(self, engine: str, reason: str):
        self.engine = engine
        self.reason = reason
        super().__init__(f"{_NAMES[engine]} cannot run this plan as priced: {reason}")


_NAMES = {"torchtitan": "torchtitan", "megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}


def _check(engine: str, plan: EnginePlan, profile=None) -> None:
    """Refuse what the engine (``profile``, else its shipped profile) does not run or its file
    cannot say (the profile's ``runs`` and ``runs.export``)."""
    reason = refusal(profile if profile is not None else engine, plan, export=True)
    if reason is not None:
        raise EngineRefusal(engine, reason)


def _setting(profile, key: str):
    """The value a switch of the profile is set to (``None``: not set)."""
    return dict(profile.settings).get(key) if profile is not None else None


def _compiled(profile) -> bool:
    return _setting(profile, "compile") == "true"


def _torchrun(plan: EnginePlan, per_node: int) -> str:
    per_node = min(plan.procs, per_node)
    nodes = -(-plan.procs // per_node)
    return f"torchrun --nnodes {nodes} --nproc-per-node {per_node}"


# ---------------------------------------------------------------------------------------
# torchtitan

def torchtitan_fqns(plan: EnginePlan) -> list:
    """torchtitan's ``module_fqns_per_model_part``: the modules of every model part (virtual
    stage) in order, its decoders' names (``tok_embeddings``, ``layers.N``, ``norm``,
    ``output``). Part ``j`` runs on pipeline rank ``j mod pp`` (its looped schedules), as the
    plan's chunks; the embedding is on the first part, the norm and output on the last.

    >>> from dataclasses import replace
    >>> p = EnginePlan(8, 8, 1, 1, 1, 2, 1, False, 0, "none", 1, 4, "1f1b", 1, (1, 2), False, True, 16, None, "")
    >>> torchtitan_fqns(p)
    [['tok_embeddings', 'layers.0'], ['layers.1', 'layers.2', 'norm', 'output']]
    """
    sizes = virtual_order(plan.counts, plan.vpp)
    parts, start = [], 0
    for size in sizes:
        parts.append([f"layers.{i}" for i in range(start, start + size)])
        start += size
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def toml_text(sections: dict, comments: list = ()) -> str:
    """A TOML document of ``{section: {key: value}}`` (values: bool, int, str, lists)."""
    lines = [f"# {c}" for c in comments]
    for section, values in sections.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def _titan_sections(plan: EnginePlan, compiled: bool = False) -> dict:
    sharded = plan.zero in (2, 3) and plan.replicas > 1
    parallelism = {
        "data_parallel_replicate_degree": 1 if sharded else plan.dp,
        "data_parallel_shard_degree": plan.dp if sharded else 1,
        "tensor_parallel_degree": plan.tp,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
    }
    if sharded:
        # "default" would not reshard with pipelines: say it.
        parallelism["fsdp_reshard_after_forward"] = "always" if plan.zero == 3 else "never"
    if plan.ep > 1:
        # The experts split tp ways, or etp ways where the plan folds them (MoE parallel folding).
        parallelism["expert_tensor_parallel_degree"] = plan.expert_tp
    if plan.tp_overlap and plan.tp > 1:
        parallelism["enable_async_tensor_parallel"] = True  # with torch.compile (the profile's compile=true)
    training = {"global_batch_size": plan.batch}
    if plan.pp > 1:
        # A step's batch per data-parallel rank, cut into the pipeline's micro-batches.
        training["local_batch_size"] = plan.batch // plan.dp
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.schedule == "interleaved" else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = plan.microbatch
        parallelism["module_fqns_per_model_part"] = torchtitan_fqns(plan)
    else:
        # One micro-batch per forward; torchtitan accumulates global / (local x dp) of them.
        training["local_batch_size"] = plan.microbatch
    if plan.sequence is not None:
        training["seq_len"] = plan.sequence
    checkpoint = {"mode": {"none": "none", "full": "full", "op": "selective"}[plan.recompute]}
    if plan.recompute == "op":
        checkpoint["selective_ac_option"] = "op"
    sections = {"job": {"description": f"pase plan {plan.recipe}"}, "parallelism": parallelism,
                "activation_checkpoint": checkpoint, "training": training}
    if compiled:
        sections["compile"] = {"enable": True}
    sections.update(_titan_precision(plan, compiled))
    return sections


def titan_precision_refusal(architecture, precision: str, tp: int, compiled: bool) -> str | None:
    """Why torchtitan's converters would not convert what a ``precision`` plan prices (the
    blocks' linear layers, experts included), or ``None``: the same for the export and for a
    TOML read back."""
    a = architecture or {}
    if a.get("moe"):
        return ("torchtitan converts the experts' grouped GEMMs only with its prototype quantize.grouped_mm "
                "converters (rowwise or MXFP8 scaling, no pipeline or context parallelism): an MoE plan in "
                f"{precision} is not written")
    dims = {"width": a.get("width"), "attention width": (a.get("heads") or 0) * (a.get("head_dim") or 0),
            "key/value width": (a.get("kv_heads") or 0) * (a.get("head_dim") or 0), "mlp width": a.get("mlp_width")}
    odd = [f"{k} {v}" for k, v in dims.items() if v and v % TITAN_MIN_DIM]
    if odd:
        return (f"its converters keep a linear layer in BF16 unless every dimension is a multiple of {TITAN_MIN_DIM}, "
                f"and the plan prices the model's {', '.join(odd)} in {precision}")
    if precision == "mxfp8" and compiled and tp > 1:
        return "torchtitan's MX converter refuses tensor parallelism under torch.compile (\"TP not yet supported " \
               "with torch.compile for mxfp8\")"
    return None


def _titan_precision(plan: EnginePlan, compiled: bool) -> dict:
    """torchtitan's converter sections for the plan's format (none for BF16): the blocks'
    linear layers converted, ``output`` kept in BF16 (``filter_fqns``), as priced."""
    if plan.precision == "bf16":
        return {}
    reason = titan_precision_refusal(plan.architecture, plan.precision, plan.tp, compiled)
    if reason is not None:
        raise EngineRefusal("torchtitan", reason)
    if plan.precision == "mxfp8":
        return {"model": {"converters": ["quantize.linear.mx"]},
                "quantize.linear.mx": {"recipe_name": TITAN_MX_RECIPE, "filter_fqns": ["output"]}}
    float8 = {"filter_fqns": ["output"]}
    if plan.fp8_gather:
        # No recipe_name: torchtitan refuses it with FP8 all-gathers; its default is tensorwise.
        float8["enable_fsdp_float8_all_gather"] = True
    else:
        float8["recipe_name"] = TITAN_FLOAT8_RECIPES[plan.fp8_scaling]
    return {"model": {"converters": ["quantize.linear.float8"]}, "quantize.linear.float8": float8}


def _titan_arguments(sections: dict) -> list:
    args = []
    for section, values in sections.items():
        for key, value in values.items():
            if section == "job" or key == "module_fqns_per_model_part":
                continue  # the description is prose; the stage split is the TOML's (a list of lists)
            if isinstance(value, bool):
                args += [f"--{section}.{key}"] if value else []  # a switch (its default is off)
            elif isinstance(value, list):
                args += [f"--{section}.{key}", ",".join(value)]  # torchtitan's lists: comma-separated
            else:
                args += [f"--{section}.{key}", str(value)]
    return args


def torchtitan_settings(plan: EnginePlan, path: str = "torchtitan.toml", per_node: int = DEVICES_PER_NODE,
                        profile=None) -> dict:
    """torchtitan's job config for the plan: ``toml`` (the file, for ``--job.config_file``),
    ``sections`` (the same as a dict), ``command_line`` (the same settings as torchtitan's
    command-line options, all but the stage split) and ``launch``.

    Degrees: FSDP over the ``dp`` (and ``cp``) ranks for ZeRO-3 (``fsdp_reshard_after_forward
    = "always"``) and ZeRO-2 (``"never"``), DDP for ZeRO-0 with data parallelism alone.
    Batch: ``training.local_batch_size`` is the batch per data-parallel rank; with pipelines it
    is cut into ``local_batch_size / pipeline_parallel_microbatch_size`` micro-batches, without
    them torchtitan accumulates ``global / (local x dp)`` micro-batches.
    """
    _check("torchtitan", plan, profile)
    sections = _titan_sections(plan, _compiled(profile))
    args = _titan_arguments(sections)
    launch = f"{_torchrun(plan, per_node)} -m torchtitan.train --job.config_file {path}"
    comments = [f"torchtitan {TORCHTITAN_VERSION} job config written by pase: runs the plan {plan.recipe}",
                "model: give --model.name and --model.flavor (torchtitan defines its models in code)",
                f"launch: {launch}",
                f"command line (the same settings but the stage split): {' '.join(args)}"]
    return {"engine": "torchtitan", "version": TORCHTITAN_VERSION, "sections": sections,
            "toml": toml_text(sections, comments), "command_line": " ".join(args), "launch": launch,
            "recipe": plan.recipe}


# ---------------------------------------------------------------------------------------
# Megatron-LM

def _model_arguments(plan: EnginePlan) -> list:
    a = plan.architecture
    # What this writer has no Megatron-LM arguments for: refused by name, never dropped.
    plain = {"norm_bias": a["norm"] == "layer", "post_norms": False, "window": 0, "sinks": False, "softcap": 0.0,
             "final_softcap": 0.0, "mla": False, "mtp": 0}
    odd = [k for k, v in a.get("features", {}).items() if v != plain.get(k, v)]
    moe = a.get("moe") or {}
    odd += [f"moe {k}" for k in ("router_bias", "expert_bias") if moe.get(k)] + \
        (["moe groups"] if moe.get("groups", 1) > 1 else [])
    if odd:
        raise EngineRefusal("megatron", f"the model's {', '.join(odd)}: no Megatron-LM argument written for it yet")
    args = [("--num-layers", a["layers"]), ("--hidden-size", a["width"]), ("--num-attention-heads", a["heads"]),
            ("--kv-channels", a["head_dim"])]
    if a["kv_heads"] < a["heads"]:
        args += [("--group-query-attention", None), ("--num-query-groups", a["kv_heads"])]
    args.append(("--ffn-hidden-size", a["mlp_width"]))
    if a["gated"]:
        args.append(("--swiglu", None))
    args.append(("--normalization", "RMSNorm" if a["norm"] == "rms" else "LayerNorm"))
    args.append(("--position-embedding-type", "rope" if a["positions"] == "rotary" else "learned_absolute"))
    args += [("--seq-length", a["sequence"]), ("--max-position-embeddings", a["max_positions"])]
    if not a["tied"]:
        args.append(("--untie-embeddings-and-output-weights", None))
    biases = a["biases"]
    if not any(biases.values()):
        args.append(("--disable-bias-linear", None))
    elif not biases["out"] and not biases["mlp"]:
        args += [("--disable-bias-linear", None), ("--add-qkv-bias", None)]
    elif not all(biases.values()):
        raise EngineRefusal("megatron", "Megatron-LM has biases on every linear layer or on none (or on the query, "
                                        "key and value projections alone): not on " +
                                        ", ".join(k for k, v in biases.items() if v) + " alone")
    if a["qk_norm"]:
        args.append(("--qk-layernorm", None))
    moe = a.get("moe")
    if moe:
        if moe["shared"] and moe.get("shared_gate"):
            raise EngineRefusal("megatron", "a gated shared expert has no Megatron-LM argument")
        # The tokens move between expert-parallel ranks by all-to-all, as priced (the MoE layer's
        # dispatch); megatron-core's default dispatcher (allgather) gathers every token instead.
        args += [("--num-experts", moe["experts"]), ("--moe-router-topk", moe["top_k"]),
                 ("--moe-ffn-hidden-size", moe["width"]), ("--moe-token-dispatcher-type", "alltoall")]
        if moe["shared"]:
            args.append(("--moe-shared-expert-intermediate-size", moe["shared"] * moe["shared_width"]))
        if moe["dense"]:
            dense = set(moe["dense"])
            args.append(("--moe-layer-freq", "[" + ",".join("0" if i in dense else "1"
                                                            for i in range(a["layers"])) + "]"))
        if moe["capacity"] is not None:
            args.append(("--moe-expert-capacity-factor", moe["capacity"]))
    # The vocabulary as priced: Megatron's null tokenizer has vocab-size + 1 entries (its
    # end-of-document token) and no padding beyond a multiple of tp (the plan's tp divides it).
    args += [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", a["vocab"] - 1),
             ("--make-vocab-size-divisible-by", 1), ("--bf16", None)]
    return args


def _precision_arguments(plan: EnginePlan) -> list:
    """Transformer Engine's recipe for the plan's format (:data:`MEGATRON_PRECISION`; none for
    BF16): Megatron keeps the embedding and output layer out of it, as priced."""
    if plan.precision == "bf16":
        return []
    recipe, gather = MEGATRON_PRECISION[plan.precision_word]
    return list(recipe) + ([(gather, None)] if plan.fp8_gather else [])


def _parallel_arguments(plan: EnginePlan) -> list:
    args = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp),
            ("--context-parallel-size", plan.cp)]
    if plan.ep > 1:  # the experts split tp ways as priced, or etp ways under MoE parallel folding
        args += [("--expert-model-parallel-size", plan.ep), ("--expert-tensor-parallel-size", plan.expert_tp)]
    if plan.sp:
        args.append(("--sequence-parallel", None))
    args += [("--micro-batch-size", plan.microbatch), ("--global-batch-size", plan.batch)]
    if plan.zero == 1:
        args.append(("--use-distributed-optimizer", None))
    elif plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        args += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", strategy),
                 ("--use-distributed-optimizer", None), ("--no-gradient-accumulation-fusion", None),
                 ("--ckpt-format", "fsdp_dtensor")]
    if plan.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    elif plan.recompute == "block":  # the first N layers of each stage (each model chunk) recomputed whole
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                 ("--recompute-num-layers", plan.recompute_layers)]
    elif plan.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    if plan.tp_overlap and plan.tp > 1:
        args.append(("--tp-comm-overlap", None))
    if plan.overlap:
        args.append(("--overlap-grad-reduce", None))
        if plan.zero >= 1:
            args.append(("--overlap-param-gather", None))
    if plan.pp > 1:
        if plan.vpp > 1 and len(set(plan.counts)) == 1:
            args.append(("--num-layers-per-virtual-pipeline-stage", plan.counts[0] // plan.vpp))
        elif plan.vpp > 1 or len(set(plan.counts[1:-1])) > 1:
            # Chunks of two sizes, or middle stages of different sizes: Megatron-LM's explicit
            # layout says every model chunk (megatron-core's PipelineParallelLayerLayout).
            args.append(("--pipeline-model-parallel-layout", megatron_layout(plan.counts, plan.vpp)))
        elif len(set(plan.counts)) > 1:
            args.append(("--decoder-first-pipeline-num-layers", plan.counts[0]))
            if plan.pp > 2:
                args.append(("--decoder-last-pipeline-num-layers", plan.counts[-1]))
    return args


def megatron_layout(counts, vpp: int = 1) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` of blocks per pipeline stage (in
    ``vpp`` interleaved chunks each, :func:`pase.planning.pipeline.virtual_order`): model
    chunks in the model's order split by ``|`` (chunk ``j`` on stage ``j mod pp``), ``t*N`` for N
    transformer layers, the embedding ``E`` before the first chunk's layers and the loss (output
    layer) ``L`` after the last chunk's, as priced.

    >>> megatron_layout((7, 8, 10, 7))
    'Et*7|t*8|t*10|t*7L'
    >>> megatron_layout((3, 4), 2)
    'Et*1|t*2|t*2|t*2L'
    """
    return "E" + "|".join(f"t*{c}" for c in virtual_order(counts, vpp)) + "L"


def megatron_settings(plan: EnginePlan, per_node: int = DEVICES_PER_NODE, profile=None) -> dict:
    """Megatron-LM's ``pretrain_gpt.py`` arguments for the plan, the model's own included:
    ``arguments`` (flag -> value, ``True`` for a switch), ``command_line``, ``launch``,
    ``data_parallel_size`` (what Megatron derives: ``p / (tp pp cp)``)."""
    _check("megatron", plan, profile)
    args = _model_arguments(plan) + _precision_arguments(plan) + _parallel_arguments(plan)
    if _setting(profile, "grad_reduce") == "bf16":
        args.append(("--grad-reduce-in-bf16", None))  # the profile's switch, priced
    # Values quoted for the shell: a layout has | and *, a list value [ ] (shell patterns).
    line = " ".join(flag if value is None else f"{flag} {shlex.quote(str(value))}" for flag, value in args)
    return {"engine": "megatron-lm", "arguments": {flag: (True if value is None else value) for flag, value in args},
            "command_line": line, "launch": f"{_torchrun(plan, per_node)} pretrain_gpt.py {line} --data-path DATA",
            "data_parallel_size": plan.dp, "recipe": plan.recipe}


# ---------------------------------------------------------------------------------------
# DeepSpeed

def deepspeed_settings(plan: EnginePlan, path: str = "ds_config.json", per_node: int = DEVICES_PER_NODE,
                       profile=None) -> dict:
    """DeepSpeed's ``ds_config.json`` for the plan (``config``): the ZeRO stage, the batch
    (``train_batch_size = micro-batch x accumulation x dp``), bf16; ZeRO-3 keeps no parameter
    unsharded (``stage3_param_persistence_threshold`` 0), as priced. ``command_line`` is the
    training script's DeepSpeed arguments; ``launch`` runs it."""
    _check("deepspeed", plan, profile)
    zero = {"stage": plan.zero, "overlap_comm": plan.overlap}
    if plan.zero == 3:
        zero["stage3_param_persistence_threshold"] = 0
    config = {"train_batch_size": plan.batch, "train_micro_batch_size_per_gpu": plan.microbatch,
              "gradient_accumulation_steps": plan.microbatches, "zero_optimization": zero,
              "bf16": {"enabled": True}}
    if _setting(profile, "communication_data_type") == "fp32":
        config["communication_data_type"] = "fp32"  # the profile's switch, priced
    line = f"--deepspeed --deepspeed_config {path}"
    per_node = min(plan.procs, per_node)
    launch = (f"deepspeed --num_nodes {-(-plan.procs // per_node)} --num_gpus {per_node} TRAIN_SCRIPT.py {line}")
    return {"engine": "deepspeed", "config": config, "command_line": line, "launch": launch, "recipe": plan.recipe}


#: Engine name -> writer.
WRITERS = {"torchtitan": torchtitan_settings, "megatron": megatron_settings, "deepspeed": deepspeed_settings}
