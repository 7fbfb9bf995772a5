"""torchtitan's files for a mesh plan: the launch script of its current release (0.3.0, the
default) and the TOML job file of 0.2.2 (``--engine torchtitan,version=0.2``), as priced.

torchtitan 0.3 reads no job files: a run is ``torchrun ... -m torchtitan.train --module llama3
--config llama3_70b`` with ``--section.field value`` overrides and the recomputation as a
subcommand (``activation-checkpoint:selective``), parsed by its ``ConfigManager`` (tyro) over
the config function's ``Trainer.Config``. The model is :mod:`pase.outputs.titan_model`'s.
"""

from __future__ import annotations

import json
import shlex

from pase.outputs.engine_base import EngineRefusal, check_runs, compiled, nodes, setting, torchrun
from pase.outputs.titan_model import MODULE_CONFIG, config_module, flavour_of, module_text, titan_model
from pase.planning.engine_runs import EnginePlan
from pase.planning.pipeline import virtual_order

__all__ = ["torchtitan_settings", "titan_version", "torchtitan_fqns", "toml_text", "launch_arguments",
           "TORCHTITAN_RELEASES", "TORCHTITAN_VERSION", "TITAN_FLOAT8_RECIPES", "TITAN_MX_RECIPE", "TITAN_MIN_DIM",
           "titan_precision_refusal", "TITAN_AC", "LAUNCH_MARK"]

#: The release whose files each ``version`` switch value writes.
TORCHTITAN_RELEASES = {"0.3": "0.3.0", "0.2": "0.2.2"}
#: The release the export writes by default.
TORCHTITAN_VERSION = TORCHTITAN_RELEASES["0.3"]
#: torchtitan 0.2.2's Float8 ``recipe_name`` per FP8 scaling (``quantize.linear.float8``).
TITAN_FLOAT8_RECIPES = {"current": "tensorwise", "rowwise": "rowwise"}
#: torchtitan 0.2.2's MX ``recipe_name`` for MXFP8 (``quantize.linear.mx``, its default).
TITAN_MX_RECIPE = "mxfp8_cublas"
#: torchtitan's converters skip a linear layer with a dimension not a multiple of this
#: (``components/quantization/utils.py``, the FP8 tensor cores' alignment).
TITAN_MIN_DIM = 16
#: The recomputation policy -> torchtitan 0.3's activation-checkpoint subcommand
#: (``distributed/activation_checkpoint.py`` ``ActivationCheckpointingConfig``): ``selective`` is
#: its per-op policy (0.2's ``selective_ac_option = "op"``), ``full`` every block recomputed.
TITAN_AC = {"none": "none", "full": "full", "op": "selective"}
#: The first line of a 0.3 launch script (how ``--recipe-from`` tells one).
LAUNCH_MARK = "# torchtitan 0.3 launch written by pase"


def titan_version(profile) -> str:
    """The release a profile's exports are for: its ``version`` switch, else 0.3."""
    return setting(profile, "version") or "0.3"


def torchtitan_fqns(plan: EnginePlan, output: str = "output") -> list:
    """torchtitan's ``module_fqns_per_model_part``: the modules of every model part (virtual
    stage) in order, its decoders' names (``tok_embeddings``, ``layers.N``, ``norm`` and the
    output layer, ``output`` in 0.2 and ``lm_head`` in 0.3). Part ``j`` runs on pipeline rank
    ``j mod pp`` (its looped schedules), as the plan's chunks; the embedding is on the first
    part, the norm and output on the last.

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
    parts[-1] += ["norm", output]
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


def _parallelism(plan: EnginePlan) -> dict:
    """The degrees, in the field names both releases share (``ParallelismConfig``)."""
    sharded = plan.zero in (2, 3) and plan.replicas > 1
    par = {"data_parallel_replicate_degree": 1 if sharded else plan.dp,
           "data_parallel_shard_degree": plan.dp if sharded else 1, "tensor_parallel_degree": plan.tp,
           "pipeline_parallel_degree": plan.pp, "context_parallel_degree": plan.cp,
           "expert_parallel_degree": plan.ep}
    if sharded:
        # "default" would not reshard with pipelines: say it.
        par["fsdp_reshard_after_forward"] = "always" if plan.zero == 3 else "never"
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.schedule == "interleaved" else "1F1B"
        par["pipeline_parallel_microbatch_size"] = plan.microbatch
    return par


def _training(plan: EnginePlan) -> dict:
    # With a pipeline: the batch of a data-parallel rank, cut into the micro-batches; without,
    # one micro-batch per forward, and torchtitan accumulates global / (local x dp) of them.
    local = plan.batch // plan.dp if plan.pp > 1 else plan.microbatch
    training = {"local_batch_size": local, "global_batch_size": plan.batch}
    if plan.sequence is not None:
        training["seq_len"] = plan.sequence
    return training


# ---------------------------------------------------------------------------------------
# torchtitan 0.2.2: a TOML job file

def _titan02_sections(plan: EnginePlan, flavour: str, compiled_: bool) -> dict:
    parallelism = _parallelism(plan)
    if plan.ep > 1:
        # The experts split tp ways, or etp ways where the plan folds them (MoE parallel folding).
        parallelism["expert_tensor_parallel_degree"] = plan.expert_tp
    if plan.tp_overlap and plan.tp > 1:
        parallelism["enable_async_tensor_parallel"] = True  # with torch.compile (the profile's compile=true)
    if plan.pp > 1:
        parallelism["module_fqns_per_model_part"] = torchtitan_fqns(plan)
    checkpoint = {"mode": {"none": "none", "full": "full", "op": "selective"}[plan.recompute]}
    if plan.recompute == "op":
        checkpoint["selective_ac_option"] = "op"
    training = _training(plan)
    if plan.offload:  # FSDP2's CPUOffloadPolicy: parameters, gradients, optimizer (job_config.py:270-273)
        training["enable_cpu_offload"] = True
    sections = {"job": {"description": f"pase plan {plan.recipe}"}, "model": {"name": "llama3", "flavor": flavour},
                "parallelism": parallelism, "activation_checkpoint": checkpoint, "training": training}
    if compiled_:
        sections["compile"] = {"enable": True}
    for section, values in _titan02_precision(plan, compiled_).items():
        sections.setdefault(section, {}).update(values)
    return sections


def titan_precision_refusal(architecture, precision: str, tp: int, compiled_: bool) -> str | None:
    """Why torchtitan 0.2.2's converters would not convert what a ``precision`` plan prices (the
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
    if precision == "mxfp8" and compiled_ and tp > 1:
        return "torchtitan's MX converter refuses tensor parallelism under torch.compile (\"TP not yet supported " \
               "with torch.compile for mxfp8\")"
    return None


def _titan02_precision(plan: EnginePlan, compiled_: bool) -> dict:
    """torchtitan 0.2.2's converter sections for the plan's format (none for BF16): the blocks'
    linear layers converted, ``output`` kept in BF16 (``filter_fqns``), as priced."""
    if plan.precision == "bf16":
        return {}
    reason = titan_precision_refusal(plan.architecture, plan.precision, plan.tp, compiled_)
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


def _titan02_arguments(sections: dict) -> list:
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


def _titan02_settings(plan: EnginePlan, path: str, per_node: int, compiled_: bool) -> dict:
    _, flavour, _ = titan_model(plan.architecture, "0.2", plan.precision)
    sections = _titan02_sections(plan, flavour, compiled_)
    args = _titan02_arguments(sections)
    launch = f"{torchrun(plan, per_node)} -m torchtitan.train --job.config_file {path}"
    comments = [f"torchtitan {TORCHTITAN_RELEASES['0.2']} job config written by pase: runs the plan {plan.recipe}",
                f"model: torchtitan's llama3 {flavour} (Llama 3.1), the model priced",
                f"launch: {launch}",
                f"command line (the same settings but the stage split): {' '.join(args)}"]
    text = toml_text(sections, comments)
    return {"engine": "torchtitan", "version": TORCHTITAN_RELEASES["0.2"], "sections": sections, "toml": text,
            "text": text, "what": "torchtitan 0.2 job config", "command_line": " ".join(args), "launch": launch,
            "recipe": plan.recipe}


# ---------------------------------------------------------------------------------------
# torchtitan 0.3.0: a launch script

def launch_arguments(plan: EnginePlan, module: str, config: str, compiled_: bool) -> list:
    """The arguments of ``-m torchtitan.train`` that run the plan: ``--module``/``--config``,
    then ``--section.field value`` (a switch alone, ``True``) in ``Trainer.Config``'s field
    names, then the activation-checkpoint subcommand (tyro reads it last)."""
    if plan.precision != "bf16":
        raise EngineRefusal("torchtitan", "torchtitan 0.3's launch script is written for BF16 plans")
    if plan.offload:
        raise EngineRefusal("torchtitan", "torchtitan 0.3's launch script is written without offload: "
                                          "training.enable_cpu_offload is checked against 0.2.2 (--engine "
                                          "torchtitan,version=0.2)")
    args = [("--module", module), ("--config", config)]
    par = _parallelism(plan)
    if plan.tp > 1:
        par["enable_sequence_parallel"] = True  # its default, said: the plan prices it (runs sp "always")
    if plan.pp > 1:
        # A list of lists on tyro's command line: the parts apart, each part's names comma-joined.
        par["module_fqns_per_model_part"] = [",".join(p) for p in torchtitan_fqns(plan, "lm_head")]
    training = dict(_training(plan), disable_cuda_graphs=True)
    compile_ = {"enable": True} if compiled_ else {}
    if plan.tp_overlap and plan.tp > 1:
        compile_["enable_async_tensor_parallel"] = True  # 0.3 moved async TP under compile (CompileConfig)
    for section, values in (("parallelism", par), ("training", training), ("compile", compile_)):
        for key, value in values.items():
            args.append((f"--{section}.{key}", True if value is True else value))
    return args + [(f"activation-checkpoint:{TITAN_AC[plan.recompute]}", None)]


def _script(plan: EnginePlan, args: list, per_node: int, kind: str, name: str, shape: dict) -> str:
    count, per_node = nodes(plan, per_node)
    head = [LAUNCH_MARK + f": runs the plan {plan.recipe}",
            f"# torchtitan {TORCHTITAN_RELEASES['0.3']}: torchrun -m torchtitan.train, parsed by its ConfigManager",
            "# (--module, --config, then Trainer.Config's fields, the activation-checkpoint subcommand last)"]
    size = f"{shape['layers']} layers, width {shape['width']}, {shape['heads']} heads"
    if "experts" in shape:  # a mixture of experts of torchtitan's own (titan_model.TITAN_MOE)
        model = (f"torchtitan's {config_module(name)} {name} ({size}, {shape['experts']} experts of width "
                 f"{shape['expert_width']}, top-{shape['top_k']}), the model priced")
    elif kind == "config":
        model = f"torchtitan's llama3 {flavour_of(shape)} (Llama 3.1: {size}), its config function {name}"
    else:
        model = (f"the decoder priced ({size}), built by the module {name} written below from torchtitan's llama3 "
                 "blocks (no flavour of torchtitan's is this model)")
    head += [f"# model: {model}",
             "# CUDA graphs off (--training.disable_cuda_graphs): the step is priced with eager kernel launches"]
    body = ["set -euo pipefail"]
    if kind == "module":
        body += ['model_dir="$(mktemp -d)"', "trap 'rm -rf \"$model_dir\"' EXIT",
                 f'cat > "$model_dir/{name}.py" <<\'PASE_MODEL\'',
                 module_text(shape, plan.sequence, f"the plan {plan.recipe}").rstrip("\n"),
                 "PASE_MODEL", 'export PYTHONPATH="$model_dir${PYTHONPATH:+:$PYTHONPATH}"']
    rdzv = "" if count == 1 else ' --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:?}:${MASTER_PORT:-29500}"'
    lines = [f"torchrun --nnodes {count} --nproc-per-node {per_node}{rdzv} -m torchtitan.train"]
    words = [flag if value is None or value is True else
             f"{flag} {' '.join(shlex.quote(str(v)) for v in (value if isinstance(value, list) else [value]))}"
             for flag, value in args]
    lines += [" ".join(words[:2])] + words[2:]  # --module M --config C on one line
    body.append(" \\\n  ".join(lines))
    return "#!/usr/bin/env bash\n" + "\n".join(head + body) + "\n"


def _titan03_settings(plan: EnginePlan, per_node: int, compiled_: bool) -> dict:
    kind, name, shape = titan_model(plan.architecture, "0.3", plan.precision)
    module, config = (config_module(name), name) if kind == "config" else (name, MODULE_CONFIG)
    args = launch_arguments(plan, module, config, compiled_)
    argv = [str(a) for flag, value in args
            for a in ([flag] if value is None or value is True else [flag, *(value if isinstance(value, list)
                                                                           else [value])])]
    text = _script(plan, args, per_node, kind, name, shape)
    return {"engine": "torchtitan", "version": TORCHTITAN_RELEASES["0.3"], "text": text,
            "what": "torchtitan 0.3 launch script", "argv": argv, "command_line": shlex.join(argv),
            "launch": f"{torchrun(plan, per_node)} -m torchtitan.train {shlex.join(argv)}", "model": kind,
            "recipe": plan.recipe}


def torchtitan_settings(plan: EnginePlan, path: str = "train.sh", per_node: int = 8, profile=None) -> dict:
    """torchtitan's files for the plan, for the release of the profile's ``version`` switch:
    ``text`` (the file), ``what`` (how messages name it), ``command_line`` and ``launch``; for
    0.3 also ``argv`` (the arguments of ``-m torchtitan.train``), for 0.2 ``sections`` and
    ``toml``.

    Degrees: FSDP over the ``dp`` (and ``cp``) ranks for ZeRO-3 (``fsdp_reshard_after_forward
    = "always"``) and ZeRO-2 (``"never"``), replicated weights for ZeRO-0 with data parallelism
    alone. Batch: ``training.local_batch_size`` is the batch per data-parallel rank; with
    pipelines it is cut into ``local_batch_size / pipeline_parallel_microbatch_size``
    micro-batches, without them torchtitan accumulates ``global / (local x dp)`` micro-batches.
    """
    check_runs("torchtitan", plan, profile)
    if titan_version(profile) == "0.2":
        return _titan02_settings(plan, path, per_node, compiled(profile))
    return _titan03_settings(plan, per_node, compiled(profile))
