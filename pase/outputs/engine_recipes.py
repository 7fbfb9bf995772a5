"""Recipes in: the configuration of a torchtitan TOML job config, a Megatron-LM argument file
or command line, or a DeepSpeed JSON config, as a :class:`~pase.planning.mesh.Recipe` that
fixes every choice the file makes (``--recipe-from FILE``).

The reverse of :mod:`pase.outputs.engines`, in the same names. Whatever the file sets that
the tool cannot price is refused in one line naming the field; so is a file whose batch,
sequence or model differs from the command line's (``-b``, ``-m``, ``-g``). Settings that
change nothing priced (data, logging, checkpoints, learning rate) are read past.
"""

from __future__ import annotations

import json
import math
import shlex

from pase.outputs.engines import (MEGATRON_PRECISION, TITAN_FLOAT8_RECIPES, TITAN_MX_RECIPE,
                                  titan_precision_refusal)
from pase.planning.mesh import Recipe
from pase.planning.pipeline import chunk_sizes

__all__ = ["RecipeFileError", "recipe_from_file", "recipe_from_torchtitan", "recipe_from_megatron", "recipe_from_deepspeed",
           "MAX_RECIPE_FILE_BYTES"]

#: The largest engine file read (a torchtitan TOML or a ds_config.json is a few kB).
MAX_RECIPE_FILE_BYTES = 1 << 20


class RecipeFileError(ValueError):
    """The file cannot be read or parsed at all (not: it sets what cannot be priced)."""


def _blocks(network) -> int | None:
    arch = getattr(network, "architecture", None)
    return arch["layers"] if arch else None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECIPE_FILE_BYTES + 1)
    except OSError as err:
        raise RecipeFileError(f"cannot read it ({err.strerror or err})") from None
    if len(data) > MAX_RECIPE_FILE_BYTES:
        raise RecipeFileError(f"larger than {MAX_RECIPE_FILE_BYTES} bytes: not an engine configuration")
    return data


def recipe_from_file(path: str, procs: int, batch: int, network) -> tuple:
    """``(engine, recipe)`` of an engine file, told apart by its contents: a TOML
    (torchtitan), JSON with ``command_line`` and ``arguments`` (a Megatron-LM export), other
    JSON (DeepSpeed), else Megatron-LM arguments (``--flag value`` ..., ``pretrain_gpt.py`` and
    what comes before it skipped). ``ValueError`` (one line) for anything else:
    :class:`RecipeFileError` when the file cannot be read or parsed at all."""
    data = _read(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeFileError("not UTF-8 text: not an engine configuration") from None
    if "\0" in text:
        raise RecipeFileError("has NUL bytes: not an engine configuration")
    if not text.strip():
        raise RecipeFileError("empty: not an engine configuration")
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise RecipeFileError(f"malformed JSON ({getattr(err, 'msg', 'nested too deeply')})") from None
        if not isinstance(doc, dict):
            raise RecipeFileError("the JSON is not an object")
        if "command_line" in doc and "arguments" in doc:
            if not isinstance(doc["command_line"], str):
                raise ValueError("command_line must be a string of Megatron-LM arguments")
            return _megatron_engine(doc["command_line"]), recipe_from_megatron(doc["command_line"], procs, batch,
                                                                               network)
        recipe = recipe_from_deepspeed(doc, procs, batch)
        fp32 = doc.get("communication_data_type") == "fp32"
        return "deepspeed,communication_data_type=fp32" if fp32 else "deepspeed", recipe
    if stripped.startswith("["):
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            pass  # a TOML table
        else:
            raise RecipeFileError("a JSON list, not an engine configuration")
    if stripped.startswith("--") or "pretrain_gpt" in text:
        return _megatron_engine(text), recipe_from_megatron(text, procs, batch, network)
    import tomllib

    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise RecipeFileError(f"neither Megatron-LM arguments, JSON nor TOML (TOML: {err})") from None
    compiled = isinstance(doc.get("compile"), dict) and doc["compile"].get("enable") is True
    return "torchtitan,compile=true" if compiled else "torchtitan", recipe_from_torchtitan(doc, procs, batch, network)


def _megatron_engine(text: str) -> str:
    """The engine profile a Megatron-LM command line runs: its gradient reduction type."""
    return "megatron,grad_reduce=bf16" if "--grad-reduce-in-bf16" in _megatron_tokens(text) else "megatron"


def _int(value, field: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value > 1 << 30:
        raise ValueError(f"{field} must be an integer of at least {least}, got {value!r}")
    return value


def _check_batch(given: int, batch: int, field: str) -> None:
    if given != batch:
        raise ValueError(f"{field} {given} differs from the batch of -b ({batch}): give -b {given}")


def _check_sequence(given: int, network, field: str) -> None:
    arch = getattr(network, "architecture", None)
    if arch and given != arch["sequence"]:
        raise ValueError(f"{field} {given} differs from the graph's sequence length {arch['sequence']} "
                         f"(-m {given} builds it so)")


def _folded_etp(dp: int, tp: int, ep: int, etp: int | None) -> int | None:
    """The recipe's ``etp``: said only where the experts are folded (``etp`` not ``tp``, or
    ``ep`` not dividing ``dp``: Megatron-Core's MoE parallel folding)."""
    if ep <= 1 or etp is None or (etp == tp and dp % ep == 0):
        return None
    return etp


def _recipe(**values) -> Recipe:
    try:
        return Recipe(**{k: v for k, v in values.items() if v is not None})
    except (TypeError, ValueError) as err:
        raise ValueError(str(err)) from None


# ---------------------------------------------------------------------------------------
# torchtitan

#: The torchtitan fields read (their section's), and those that change nothing priced.
_TITAN_READ = {
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
_TITAN_PASSIVE = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "comm",
                  "memory_estimation", "fault_tolerance", "experimental", "validation", "debug"}
#: Values a field may have for the plan to be priced as torchtitan runs it.
_TITAN_DEFAULTS = {
    ("parallelism", "disable_loss_parallel"): False,
    ("parallelism", "pipeline_parallel_schedule_csv"): "",
    ("training", "enable_cpu_offload"): False,
    ("training", "mixed_precision_param"): "bfloat16",
}


def _titan_stage_counts(par: dict, pp: int, vpp_schedule: bool, blocks: int | None) -> tuple:
    """``(counts per physical stage, vpp)`` from ``module_fqns_per_model_part`` or
    ``pipeline_parallel_layers_per_stage`` (torchtitan's even split with the first and last
    stages ``*_less_layers`` lighter)."""
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
        if flat[:1] != ["tok_embeddings"] or flat[-2:] != ["norm", "output"] or \
                len(layers) + 3 != len(flat) or layers != [f"layers.{i}" for i in range(len(layers))]:
            raise ValueError(f"{where}: the plan puts tok_embeddings first, layers.0, layers.1, ... in order, then "
                             "norm and output last")
        if blocks is not None and len(layers) != blocks:
            raise ValueError(f"{where} names {len(layers)} layers; the graph has {blocks} blocks")
        sizes = [sum(n.startswith("layers.") for n in p) for p in parts]
        if min(sizes) < 1:
            raise ValueError(f"{where}: every model part needs a layer")
        if len(parts) > pp:
            return _looped_stages(sizes, pp, where)
        return tuple(sizes), 1
    if blocks is None:
        raise ValueError("a pipeline without parallelism.module_fqns_per_model_part needs the graph's block count "
                         "(a built-in decoder or an hf: config)")
    first = _int(par.get("pipeline_parallel_first_stage_less_layers", 1), "first_stage_less_layers", 0)
    last = _int(par.get("pipeline_parallel_last_stage_less_layers", 1), "last_stage_less_layers", 0)
    per = par.get("pipeline_parallel_layers_per_stage")
    if per is not None:
        per = _int(per, "parallelism.pipeline_parallel_layers_per_stage")
        stages = math.ceil((blocks + first + last) / per)
    else:
        stages = pp * (2 if vpp_schedule else 1)
    if stages % pp:
        raise ValueError(f"parallelism.pipeline_parallel_layers_per_stage {per} gives {stages} model parts, not a "
                         f"multiple of pipeline_parallel_degree {pp} (torchtitan refuses it too)")
    # torchtitan's generate_llm_fqn_per_model_part: effective layers (blocks plus the weights of
    # the first and last stages) shared evenly, the first parts one more each for the remainder.
    effective = blocks + first + last
    even, extra = divmod(effective, stages)
    sizes = [even + (1 if i < extra else 0) for i in range(stages)]
    sizes[0] -= first
    sizes[-1] -= last
    if min(sizes) < 1:
        raise ValueError(f"torchtitan's split of {blocks} layers into {stages} model parts leaves one empty")
    if stages > pp:
        return _looped_stages(sizes, pp, f"torchtitan's split of {blocks} layers into {stages} model parts")
    return tuple(sizes), 1


def _looped_stages(chunks: list, pp: int, where: str) -> tuple:
    """``(blocks per stage, vpp)`` of model chunks given in the model's order (chunk ``j`` on
    stage ``j mod pp``), when they are the chunks the model prices
    (:func:`pase.planning.pipeline.chunk_sizes`: sizes one block apart at most, the largest stage a
    multiple of ``vpp``); equal-sized chunks always are."""
    vpp = len(chunks) // pp
    totals = tuple(sum(chunks[s::pp]) for s in range(pp))
    if chunk_sizes(totals, vpp) is None or max(chunks) - min(chunks) > 1:
        raise ValueError(f"{where}: model parts of {'/'.join(map(str, chunks))} layers; interleaved chunks are "
                         "priced one block apart at most, the largest stage a multiple of the chunks per stage")
    return totals, vpp


def recipe_from_torchtitan(doc: dict, procs: int, batch: int, network=None) -> Recipe:
    """The recipe of a torchtitan 0.2 job config (the TOML as a dict)."""
    for section, values in doc.items():
        if section in _TITAN_READ:
            if not isinstance(values, dict):
                raise ValueError(f"[{section}] must be a table")
            for key in values:
                if key not in _TITAN_READ[section]:
                    raise ValueError(f"unknown torchtitan field {section}.{key}")
        elif section == "model":
            if not isinstance(values, dict):
                raise ValueError("[model] must be a table")
            _titan_converters(values)
        elif section == "compile":
            if not isinstance(values, dict):
                raise ValueError("[compile] must be a table")
        elif section == "quantize":
            continue
        elif section not in _TITAN_PASSIVE:
            raise ValueError(f"unknown torchtitan section [{section}]")
    par = doc.get("parallelism", {})
    train = doc.get("training", {})
    ac = doc.get("activation_checkpoint", {})
    for (section, key), value in _TITAN_DEFAULTS.items():
        given = doc.get(section, {}).get(key, value)
        if given != value:
            raise ValueError(f"cannot express {section}.{key} = {json.dumps(given)} (priced: {json.dumps(value)})")
    replicate = _int(par.get("data_parallel_replicate_degree", 1), "parallelism.data_parallel_replicate_degree")
    tp = _int(par.get("tensor_parallel_degree", 1), "parallelism.tensor_parallel_degree")
    pp = _int(par.get("pipeline_parallel_degree", 1), "parallelism.pipeline_parallel_degree")
    cp = _int(par.get("context_parallel_degree", 1), "parallelism.context_parallel_degree")
    ep = _int(par.get("expert_parallel_degree", 1), "parallelism.expert_parallel_degree")
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        rest, left = divmod(procs, replicate * cp * tp * pp)
        if left or rest < 1:
            raise ValueError(f"parallelism: replicate x cp x tp x pp = {replicate * cp * tp * pp} does not divide the "
                             f"{procs} devices of -p")
        shard = rest
    shard = _int(shard, "parallelism.data_parallel_shard_degree")
    if replicate * shard * cp * tp * pp != procs:
        raise ValueError(f"parallelism degrees multiply to {replicate * shard * cp * tp * pp}, not the {procs} "
                         "devices of -p")
    etp = None
    if ep > 1:
        etp = _int(par.get("expert_tensor_parallel_degree", 1), "parallelism.expert_tensor_parallel_degree")
        if etp not in (1, tp):  # torchtitan's ParallelDims: "Currently we only support ETP=TP or ETP=1"
            raise ValueError(f"cannot express parallelism.expert_tensor_parallel_degree = {etp}: torchtitan folds "
                             f"the experts with 1 or tp = {tp}")
    if replicate > 1 and (shard > 1 or cp > 1):
        raise ValueError("cannot express parallelism.data_parallel_replicate_degree with FSDP (HSDP: weights "
                         "sharded within groups, replicated across them)")
    dp = replicate * shard
    fsdp = shard > 1 or cp > 1
    policy = par.get("fsdp_reshard_after_forward", "default")
    if policy not in ("default", "always", "never"):
        raise ValueError(f"parallelism.fsdp_reshard_after_forward must be default, always or never, got {policy!r}")
    if fsdp:
        reshard = policy == "always" or (policy == "default" and pp == 1)  # torchtitan's default: not with pp
        zero = 3 if reshard else 2
    else:
        zero = 0
        if tp > 1 or pp > 1 or ep > 1:
            if dp > 1:
                raise ValueError("DDP (data_parallel_replicate_degree > 1 without sharding) with other "
                                 "parallelism: torchtitan refuses it (\"DDP has not supported > 1D parallelism\")")
    mode = ac.get("mode", "selective")
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "none":
        recompute = "none"
    elif mode == "full" or (mode == "selective" and option == "1"):
        recompute = "full"  # selective every 1st layer is every layer whole
    elif mode == "selective" and option == "op":
        recompute = "op"
    elif mode == "selective":
        raise ValueError(f"cannot express activation_checkpoint.selective_ac_option = {json.dumps(option)} (every "
                         f"{option}th layer recomputed; priced: none, full, 'op')")
    else:
        raise ValueError(f"cannot express activation_checkpoint.mode = {json.dumps(mode)}")
    local = _int(train.get("local_batch_size", 8), "training.local_batch_size")
    global_batch = train.get("global_batch_size", -1)
    global_batch = local * dp if global_batch == -1 else _int(global_batch, "training.global_batch_size")
    _check_batch(global_batch, batch, "training.global_batch_size")
    if "seq_len" in train or network is not None:
        _check_sequence(_int(train.get("seq_len", 2048), "training.seq_len"), network, "training.seq_len")
    schedule = vpp = stages = None
    if pp > 1:
        micro = _int(par.get("pipeline_parallel_microbatch_size", 1), "parallelism.pipeline_parallel_microbatch_size")
        if local % micro:
            raise ValueError(f"parallelism.pipeline_parallel_microbatch_size {micro} does not divide "
                             f"training.local_batch_size {local}")
        if global_batch != local * dp:
            raise ValueError(f"training.global_batch_size {global_batch} is not local_batch_size x dp = {local * dp}: "
                             "gradient accumulation around a pipeline is not priced")
        name = par.get("pipeline_parallel_schedule", "1F1B")
        schedules = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved"}
        if name not in schedules:
            raise ValueError(f"cannot express parallelism.pipeline_parallel_schedule = {json.dumps(name)} "
                             "(priced: 1F1B, Interleaved1F1B)")
        counts, v = _titan_stage_counts(par, pp, name == "Interleaved1F1B", _blocks(network))
        schedule = schedules[name]
        if (v > 1) != (schedule == "interleaved"):
            raise ValueError(f"parallelism.pipeline_parallel_schedule {name} with {v} model part(s) per rank")
        vpp = v if v > 1 else None
        stages = counts
    else:
        micro = local
        if global_batch % (local * dp):
            raise ValueError(f"training.global_batch_size {global_batch} is not a multiple of local_batch_size x dp "
                             f"= {local * dp}")
    overlap = par.get("enable_async_tensor_parallel", False)
    if not isinstance(overlap, bool):
        raise ValueError("parallelism.enable_async_tensor_parallel must be true or false")
    compiled = isinstance(doc.get("compile"), dict) and doc["compile"].get("enable") is True
    if overlap and not compiled:
        raise ValueError("parallelism.enable_async_tensor_parallel needs compile.enable (torchtitan ignores it "
                         "without)")
    precision = _titan_precision(doc, tp, compiled, network)
    return _recipe(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep if ep > 1 else None, etp=_folded_etp(dp, tp, ep, etp),
                   zero=zero, recompute=recompute,
                   microbatch=micro, schedule=schedule, vpp=vpp, stages=stages, sp=True if tp > 1 else None,
                   tp_overlap=bool(overlap and tp > 1), **precision)


#: torchtitan 0.2.2's converter fields (``quantize.linear.float8``, ``quantize.linear.mx``).
_TITAN_QUANT_READ = {"float8": {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                                "recipe_name", "filter_fqns", "emulate"},
                     "mx": {"recipe_name", "filter_fqns", "mxfp8_dim1_cast_kernel_choice"}}
#: Their ``filter_fqns`` defaults (torchtitan's job config).
_TITAN_QUANT_FILTERS = {"float8": [], "mx": ["output"]}


def _titan_converters(model: dict) -> list:
    """``model.converters``, refused unless none or one linear converter the tool prices."""
    converters = model.get("converters", [])
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        raise ValueError("model.converters must be a list of names")
    if len(converters) > 1 or converters[:1] not in ([], ["quantize.linear.float8"], ["quantize.linear.mx"]):
        raise ValueError(f"cannot express model.converters = {json.dumps(converters)} (priced: "
                         "[\"quantize.linear.float8\"] or [\"quantize.linear.mx\"])")
    return converters


def _titan_precision(doc: dict, tp: int, compiled: bool, network) -> dict:
    """``precision``, ``scaling`` and ``fp8_gather`` of torchtitan's ``model.converters`` (none:
    BF16): ``quantize.linear.float8`` (``recipe_name`` tensorwise or rowwise, or none with
    ``enable_fsdp_float8_all_gather``) or ``quantize.linear.mx`` (MXFP8), ``output`` kept in BF16."""
    converters = _titan_converters(doc.get("model", {}))
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
        if key not in _TITAN_QUANT_READ[kind]:
            raise ValueError(f"unknown torchtitan field {where}.{key}")
    filters = section.get("filter_fqns", _TITAN_QUANT_FILTERS[kind])
    if filters != ["output"]:
        raise ValueError(f"cannot express {where}.filter_fqns = {json.dumps(filters)} (priced: [\"output\"]: every "
                         "linear layer of the blocks converted, the output layer in BF16)")
    precision = "mxfp8" if kind == "mx" else "fp8"
    reason = titan_precision_refusal(getattr(network, "architecture", None), precision, tp, compiled)
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
# Megatron-LM

#: Megatron-LM switches and valued arguments read past: data, logging, checkpoints, the
#: optimizer's numbers, the tokenizer, kernels that change nothing priced.
_MEGATRON_PASSIVE_VALUED = {
    "--data-path", "--split", "--train-iters", "--train-samples", "--lr", "--min-lr", "--lr-decay-style",
    "--lr-warmup-iters", "--lr-warmup-fraction", "--lr-decay-iters", "--weight-decay", "--clip-grad", "--adam-beta1",
    "--adam-beta2", "--adam-eps", "--init-method-std", "--seed", "--save", "--load", "--save-interval",
    "--log-interval", "--eval-interval", "--eval-iters", "--tensorboard-dir", "--tokenizer-model",
    "--tokenizer-type", "--vocab-file", "--merge-file", "--distributed-backend", "--ckpt-format",
    "--transformer-impl", "--attention-backend", "--rotary-base", "--norm-epsilon", "--attention-dropout",
    "--hidden-dropout", "--wandb-project", "--wandb-exp-name", "--exit-interval", "--distributed-timeout-minutes",
    "--make-vocab-size-divisible-by", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--moe-token-drop-policy", "--data-cache-path", "--num-workers",
}
_MEGATRON_PASSIVE_SWITCHES = {
    "--bf16", "--use-mcore-models", "--mock-data", "--no-gradient-accumulation-fusion", "--use-flash-attn",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion",
    "--no-rope-fusion", "--use-rotary-position-embeddings", "--log-throughput", "--moe-grouped-gemm",
    "--no-async-tensor-model-parallel-allreduce", "--use-megatron-fsdp", "--overlap-grad-reduce",
    "--overlap-param-gather", "--no-load-optim", "--no-load-rng", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--group-query-attention", "--sequence-parallel",
    "--use-distributed-optimizer", "--tp-comm-overlap", "--grad-reduce-in-bf16", "--fp8-param-gather",
    "--fp4-param-gather",
}
_MEGATRON_VALUED = {
    "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size", "--global-batch-size",
    "--data-parallel-sharding-strategy", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout", "--num-layers", "--hidden-size",
    "--num-attention-heads", "--kv-channels",
    "--num-query-groups", "--ffn-hidden-size", "--normalization", "--position-embedding-type", "--seq-length",
    "--max-position-embeddings", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--moe-expert-capacity-factor", "--vocab-size",
    "--moe-token-dispatcher-type",
}
#: Model arguments checked against the graph's declared architecture (the key there).
_MEGATRON_MODEL = {"--num-layers": "layers", "--hidden-size": "width", "--num-attention-heads": "heads",
                   "--kv-channels": "head_dim", "--ffn-hidden-size": "mlp_width", "--seq-length": "sequence"}


def _megatron_tokens(text: str) -> list:
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as err:
        raise RecipeFileError(f"cannot split the arguments ({err})") from None
    for i, token in enumerate(tokens):
        if token.endswith("pretrain_gpt.py"):
            return tokens[i + 1:]
    return tokens


def _megatron_arguments(text: str) -> dict:
    tokens = _megatron_tokens(text)
    args: dict = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, eq, inline = token.partition("=")
        if not flag.startswith("--"):
            raise ValueError(f"expected a Megatron-LM argument (--name), got {token!r}")
        if flag in args:
            raise ValueError(f"argument {flag} is given twice")
        if flag in _MEGATRON_VALUED or flag in _MEGATRON_PASSIVE_VALUED:
            if eq:
                args[flag] = inline
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                args[flag] = tokens[i + 1]
                i += 1
            else:
                raise ValueError(f"argument {flag} needs a value")
        elif flag in _MEGATRON_PASSIVE_SWITCHES:
            if eq:
                raise ValueError(f"argument {flag} is a switch: it takes no value")
            args[flag] = True
        else:
            raise ValueError(f"cannot express Megatron-LM argument {flag} (not one the tool prices or reads past)")
        i += 1
    return args


def _megatron_int(args: dict, flag: str, default: int | None = None, least: int = 1) -> int | None:
    if flag not in args:
        return default
    value = args[flag]
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or int(value) < least:
        raise ValueError(f"{flag} must be an integer of at least {least}, got {value!r}")
    return int(value)


def recipe_from_megatron(text: str, procs: int, batch: int, network=None) -> Recipe:
    """The recipe of Megatron-LM ``pretrain_gpt.py`` arguments (a command line or an
    argument file; ``#`` comments and line breaks allowed)."""
    args = _megatron_arguments(text)
    arch = getattr(network, "architecture", None)
    if arch:
        for flag, key in _MEGATRON_MODEL.items():
            value = _megatron_int(args, flag)
            if value is not None and value != arch[key]:
                raise ValueError(f"{flag} {value} differs from the graph's {key} {arch[key]}: a different model")
        experts = _megatron_int(args, "--num-experts")
        if experts is not None and experts != (arch.get("moe") or {}).get("experts"):
            raise ValueError(f"--num-experts {experts} differs from the graph's experts")
    tp = _megatron_int(args, "--tensor-model-parallel-size", 1)
    pp = _megatron_int(args, "--pipeline-model-parallel-size", 1)
    cp = _megatron_int(args, "--context-parallel-size", 1)
    ep = _megatron_int(args, "--expert-model-parallel-size", 1)
    if procs % (tp * pp * cp):
        raise ValueError(f"tp x pp x cp = {tp * pp * cp} does not divide the {procs} devices of -p")
    dp = procs // (tp * pp * cp)
    dispatcher = args.get("--moe-token-dispatcher-type", "allgather")  # megatron-core's default
    if dispatcher not in ("allgather", "alltoall", "flex"):
        raise ValueError(f"--moe-token-dispatcher-type must be allgather, alltoall or flex, got {dispatcher!r}")
    if ep > 1 and dispatcher != "alltoall":
        raise ValueError(f"cannot express --moe-token-dispatcher-type {dispatcher} with expert parallelism (priced: "
                         "alltoall, the tokens traded by all-to-all; allgather is Megatron-LM's default)")
    etp = _megatron_int(args, "--expert-tensor-parallel-size", tp) if ep > 1 else None
    if etp is not None and tp % etp:
        raise ValueError(f"cannot express --expert-tensor-parallel-size {etp}: the experts are priced split by a "
                         f"divisor of tp ({tp}) (MoE parallel folding)")
    micro = _megatron_int(args, "--micro-batch-size", 1)
    global_batch = _megatron_int(args, "--global-batch-size", micro * dp)
    _check_batch(global_batch, batch, "--global-batch-size")
    if global_batch % (micro * dp):
        raise ValueError(f"--global-batch-size {global_batch} is not a multiple of micro-batch x dp = {micro * dp}")
    if "--seq-length" in args and not arch:
        _check_sequence(_megatron_int(args, "--seq-length"), network, "--seq-length")
    if "--use-megatron-fsdp" in args:
        strategy = args.get("--data-parallel-sharding-strategy", "no_shard")
        zeros = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in zeros:
            raise ValueError(f"--data-parallel-sharding-strategy must be one of {', '.join(zeros)}, got {strategy!r}")
        zero = zeros[strategy]
    elif "--data-parallel-sharding-strategy" in args:
        raise ValueError("--data-parallel-sharding-strategy is Megatron FSDP's: give --use-megatron-fsdp")
    else:
        zero = 1 if "--use-distributed-optimizer" in args else 0
    if dp * cp > 1 and "--overlap-grad-reduce" not in args:
        raise ValueError("without --overlap-grad-reduce: the tool prices the gradient reduction overlapped with the "
                         "backward pass")
    if dp * cp > 1 and zero >= 1 and "--overlap-param-gather" not in args:
        raise ValueError("without --overlap-param-gather: the tool prices the weight gathers overlapped")
    granularity = args.get("--recompute-granularity")
    recompute_layers = None
    if granularity is None:
        recompute = "none"
    elif granularity == "selective":
        recompute = "selective"
    elif granularity == "full":
        method = args.get("--recompute-method")
        layers = _megatron_int(args, "--recompute-num-layers", 1)
        if method == "block":  # the first N layers of each stage (model chunk) recomputed, the rest kept
            recompute, recompute_layers = "block", layers
        elif method != "uniform" or layers != 1:
            raise ValueError(f"cannot express --recompute-method {method} --recompute-num-layers {layers} (priced: "
                             "every layer recomputed, uniform 1; or block N)")
        else:
            recompute = "full"
    else:
        raise ValueError(f"--recompute-granularity must be full or selective, got {granularity!r}")
    sp = "--sequence-parallel" in args
    overlap_tp = "--tp-comm-overlap" in args
    if overlap_tp and not sp:
        raise ValueError("--tp-comm-overlap needs --sequence-parallel (Megatron-LM refuses it too)")
    schedule = vpp = stages = None
    if pp > 1:
        blocks = _megatron_int(args, "--num-layers") or _blocks(network)
        per_chunk = _megatron_int(args, "--num-layers-per-virtual-pipeline-stage")
        first = _megatron_int(args, "--decoder-first-pipeline-num-layers")
        last = _megatron_int(args, "--decoder-last-pipeline-num-layers")
        layout = args.get("--pipeline-model-parallel-layout")
        if layout is not None:
            if per_chunk is not None or first is not None or last is not None:
                raise ValueError("--pipeline-model-parallel-layout with --num-layers-per-virtual-pipeline-stage or "
                                 "--decoder-first/last-pipeline-num-layers: Megatron-LM takes one of them")
            chunks = _megatron_layout(layout, pp)
            if blocks is not None and sum(chunks) != blocks:
                raise ValueError(f"--pipeline-model-parallel-layout has {sum(chunks)} transformer layers, the model "
                                 f"{blocks}")
            if len(chunks) == pp:
                stages = tuple(chunks)
            else:
                stages, vpp = _looped_stages(chunks, pp, "--pipeline-model-parallel-layout")
                schedule = "interleaved"
        elif per_chunk is not None:
            if first is not None or last is not None:
                raise ValueError("cannot express --decoder-first/last-pipeline-num-layers with interleaving")
            if blocks is None or blocks % (pp * per_chunk):
                raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the "
                                 f"{blocks} layers into {pp} stages")
            schedule, vpp = "interleaved", blocks // (pp * per_chunk)
            if vpp < 2:
                schedule = vpp = None  # one chunk per stage: 1F1B
        elif first is not None or last is not None:
            if blocks is None:
                raise ValueError("--decoder-first/last-pipeline-num-layers need --num-layers")
            if pp == 2:
                first = first if first is not None else blocks - last
                last = blocks - first
                counts = (first, last)
            else:
                rest = blocks - (first or 0) - (last or 0)
                middle_stages = pp - (first is not None) - (last is not None)
                if rest < middle_stages or rest % middle_stages:
                    raise ValueError(f"{rest} layers do not split evenly over the {middle_stages} other stages")
                each = rest // middle_stages
                counts = ((first if first is not None else each),) + (each,) * (pp - 2) + \
                    ((last if last is not None else each),)
            if min(counts) < 1:
                raise ValueError("--decoder-first/last-pipeline-num-layers leave a stage without layers")
            stages = counts
        elif blocks is not None and blocks % pp:
            raise ValueError(f"{blocks} layers do not split evenly over {pp} stages (Megatron-LM needs "
                             "--decoder-first/last-pipeline-num-layers)")
        else:
            stages = None
        if schedule is None and stages is None and blocks is not None:
            stages = (blocks // pp,) * pp  # Megatron's even split, fixed (not searched)
    return _recipe(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep if ep > 1 else None, etp=_folded_etp(dp, tp, ep, etp),
                   zero=zero, recompute=recompute, recompute_layers=recompute_layers, microbatch=micro,
                   schedule=schedule or ("1f1b" if pp > 1 else None), vpp=vpp, stages=stages,
                   sp=sp if tp > 1 else None, tp_overlap=overlap_tp, **_megatron_precision(args, zero))


#: The longest layout unrolled (layers and separators): far more than any model's layers.
_LAYOUT_MOST = 100_000


def _unroll(text: str, where: str) -> str:
    """A layout with its repeats written out: ``X*N`` (one letter) and ``(...)*N``; ``where``
    names the layout in the messages."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "(":
            end = text.find(")", i)
            if end < 0:
                raise ValueError(f"{where}: a '(' without its ')'")
            unit, i = _unroll(text[i + 1:end], where), end + 1
        elif text[i] in ")*":
            raise ValueError(f"{where}: a {text[i]!r} out of place")
        else:
            unit, i = text[i], i + 1
        if text[i:i + 1] == "*":
            digits = i + 1
            while digits < len(text) and text[digits].isdigit():
                digits += 1
            if digits == i + 1:
                raise ValueError(f"{where}: '*' needs a count")
            times, i = int(text[i + 1:digits]) if digits - i <= 7 else _LAYOUT_MOST + 1, digits
            if len(unit) * times > _LAYOUT_MOST:
                raise ValueError(f"{where}: more than {_LAYOUT_MOST} layers")
            unit *= times
        out.append(unit)
        if sum(map(len, out)) > _LAYOUT_MOST:
            raise ValueError(f"{where}: more than {_LAYOUT_MOST} layers")
    return "".join(out)


def _megatron_layout(text: str, pp: int) -> list:
    """Transformer layers per model chunk of Megatron-LM's ``--pipeline-model-parallel-layout``
    (chunk ``i`` on pipeline rank ``i mod pp``): chunks split by ``|``; ``E`` the embedding,
    ``t`` a transformer layer, ``L`` the loss (output layer); ``X*N`` and ``(...)*N`` repeat;
    commas are only for the eye. The embedding must open the first chunk and the loss close
    the last, as priced; multi-token prediction layers (``m``) are not priced."""
    shown = text if len(text) <= 60 else text[:57] + "..."
    where = f"--pipeline-model-parallel-layout {shown!r}"
    chunks = _unroll(text.replace(",", ""), where).split("|")
    odd = sorted(set("".join(chunks)) - set("EtL"))
    if odd:
        word = "multi-token prediction layers (m) are not priced" if odd == ["m"] else \
            f"unknown layer letters {''.join(odd)} (E, t, L)"
        raise ValueError(f"cannot express {where}: {word}")
    joined = "".join(chunks)
    if joined.count("E") != 1 or joined.count("L") != 1 or not chunks[0].startswith("E") or \
            not chunks[-1].endswith("L"):
        raise ValueError(f"{where}: the embedding E must open the first stage and the loss L close the last, once each")
    if len(chunks) % pp:
        raise ValueError(f"{where} has {len(chunks)} stages, not a multiple of pp {pp}")
    counts = [c.count("t") for c in chunks]
    if min(counts) < 1:
        raise ValueError(f"cannot express {where}: a stage without transformer layers")
    return counts


#: Megatron-LM's FP8 formats priced alike (E4M3 throughout or E5M2 gradients: one byte each).
_MEGATRON_FP8_FORMATS = ("hybrid", "e4m3")


def _megatron_precision(args: dict, zero: int) -> dict:
    """``precision``, ``scaling`` and ``fp8_gather`` of Megatron-LM's ``--fp8-*`` / ``--fp4-*``
    arguments (:data:`~pase.outputs.engines.MEGATRON_PRECISION`; none: BF16)."""
    fp8, fp4 = args.get("--fp8-format"), args.get("--fp4-format")
    if fp8 is not None and fp4 is not None:
        raise ValueError("--fp8-format with --fp4-format: Megatron-LM runs one of them")
    for low, flag in ((fp8, "--fp8-"), (fp4, "--fp4-")):
        if low is None:
            for name in ("recipe", "param-gather"):
                if flag + name in args:
                    raise ValueError(f"{flag}{name} needs {flag}format")
    if fp8 is None and fp4 is None:
        return {}
    if fp8 is not None and fp8 not in _MEGATRON_FP8_FORMATS:
        raise ValueError(f"--fp8-format must be {' or '.join(_MEGATRON_FP8_FORMATS)}, got {fp8!r}")
    if fp4 is not None and fp4 != "e2m1":
        raise ValueError(f"--fp4-format must be e2m1, got {fp4!r}")
    flag = "--fp8-recipe" if fp8 is not None else "--fp4-recipe"
    name = args.get(flag, "delayed" if fp8 is not None else "nvfp4")  # Megatron-LM's defaults
    words = {recipe[1][1]: (word, gather) for word, (recipe, gather) in MEGATRON_PRECISION.items()
             if recipe[1][0] == flag}
    if name not in words:
        raise ValueError(f"cannot express {flag} {name} (priced: {', '.join(words)})")
    word, gather_flag = words[name]
    gather = gather_flag in args
    if gather and zero == 0:
        raise ValueError(f"{gather_flag} without the distributed optimizer or Megatron FSDP: no gathers to run in "
                         "the format")
    precision, _, scaling = word.partition("/")
    return {"precision": precision, "scaling": scaling or None, "fp8_gather": gather or None}


# ---------------------------------------------------------------------------------------
# DeepSpeed

_DS_PASSIVE = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
               "zero_allow_untested_optimizer", "bf16", "fp16", "prescale_gradients",
               "gradient_predivide_factor", "dump_state", "tensorboard", "wandb", "csv_monitor", "flops_profiler",
               "comms_logger", "memory_breakdown", "pase"}
_DS_ZERO_READ = {"stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
                 "reduce_scatter", "allgather_partitions", "stage3_param_persistence_threshold",
                 "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                 "stage3_gather_16bit_weights_on_model_save", "round_robin_gradients", "sub_group_size",
                 "offload_optimizer", "offload_param"}


def recipe_from_deepspeed(doc: dict, procs: int, batch: int) -> Recipe:
    """The recipe of a DeepSpeed ``ds_config.json`` (a dict): data parallelism over every
    device, its ZeRO stage and batch (``train_batch_size = micro x accumulation x dp``)."""
    read = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "zero_optimization", "communication_data_type"}
    if doc.get("communication_data_type", "bf16") not in ("bf16", "fp32"):
        raise ValueError(f"cannot express communication_data_type {doc['communication_data_type']!r} (priced: bf16, "
                         "fp32)")
    for key in doc:
        if key not in read and key not in _DS_PASSIVE:
            if key in ("activation_checkpointing", "pipeline", "sequence_parallel_size", "tensor_parallel"):
                raise ValueError(f"cannot express {key}: set in the model code, not priced from ds_config.json")
            raise ValueError(f"unknown DeepSpeed field {key}")
    for key in ("bf16", "fp16"):
        if key in doc and not isinstance(doc[key], dict):
            raise ValueError(f"{key} must be an object")
    zero_section = doc.get("zero_optimization", {})
    if not isinstance(zero_section, dict):
        raise ValueError("zero_optimization must be an object")
    for key, value in zero_section.items():
        if key not in _DS_ZERO_READ:
            raise ValueError(f"unknown DeepSpeed field zero_optimization.{key}")
        if key in ("offload_optimizer", "offload_param") and isinstance(value, dict) and \
                value.get("device", "none") != "none":
            raise ValueError(f"cannot express zero_optimization.{key} (offloading is not priced)")
    zero = _int(zero_section.get("stage", 0), "zero_optimization.stage", 0)
    if zero > 3:
        raise ValueError(f"zero_optimization.stage must be 0-3, got {zero}")
    if zero == 3 and zero_section.get("stage3_param_persistence_threshold", 100000) != 0:
        raise ValueError("cannot express zero_optimization.stage3_param_persistence_threshold other than 0 (small "
                         "parameters kept whole are not priced)")
    dp = procs
    if dp > 1 and zero == 0:
        raise ValueError("zero_optimization.stage 0: DeepSpeed without ZeRO reduces the gradients after the backward "
                         "pass, and the tool prices them overlapped")
    if dp > 1 and zero in (1, 2) and zero_section.get("overlap_comm") is not True:
        raise ValueError("zero_optimization.overlap_comm must be true: the tool prices the gradient reduction "
                         "overlapped with the backward pass")
    train = doc.get("train_batch_size")
    micro = doc.get("train_micro_batch_size_per_gpu")
    accumulation = doc.get("gradient_accumulation_steps")
    if train is None and (micro is None or accumulation is None):
        raise ValueError("give train_batch_size, or train_micro_batch_size_per_gpu and gradient_accumulation_steps")
    if train is not None:
        train = _int(train, "train_batch_size")
    if micro is not None:
        micro = _int(micro, "train_micro_batch_size_per_gpu")
    if accumulation is not None:
        accumulation = _int(accumulation, "gradient_accumulation_steps")
    # DeepSpeed's own completion of the three (deepspeed/runtime/config.py).
    if train is None:
        train = micro * accumulation * dp
    elif micro is None:
        accumulation = accumulation or 1
        micro = train // (accumulation * dp)
    elif accumulation is None:
        accumulation = train // (micro * dp)
    if micro < 1 or accumulation < 1 or train != micro * accumulation * dp:
        raise ValueError(f"train_batch_size {train} is not train_micro_batch_size_per_gpu x "
                         f"gradient_accumulation_steps x the {dp} data-parallel devices")
    _check_batch(train, batch, "train_batch_size")
    return _recipe(dp=dp, tp=1, pp=1, cp=1, zero=zero, recompute="none", microbatch=micro)
