"""Mesh plans as the settings of the engines people run: torchtitan and Megatron-LM.

A training plan that is a mesh (``dp x tp x pp x cp``, a ZeRO stage, a recomputation policy,
micro-batches, a pipeline schedule) is a handful of degrees and flags. These functions
write them in each engine's own names; what an engine cannot express is said in ``notes``.
"""

from __future__ import annotations

__all__ = ["torchtitan_settings", "megatron_settings", "ENGINES"]


def _pipeline(candidate) -> dict:
    return candidate.summary.extra.get("pipeline") or {}


def _common(candidate, batch: int, sequence: int | None) -> tuple:
    mesh = candidate.mesh
    if mesh is None:
        raise ValueError("the plan is not a mesh: export the nearest mesh plan")
    return mesh, candidate.options, _pipeline(candidate)


def torchtitan_settings(candidate, batch: int, sequence: int | None = None) -> dict:
    """torchtitan's ``parallelism``, ``activation_checkpoint`` and ``training`` settings
    (field names of its ``ParallelismConfig`` and job config) and the same as one line of
    its command-line options."""
    mesh, options, pipe = _common(candidate, batch, sequence)
    notes = []
    if options.zero == 3:
        replicate, shard = 1, mesh.dp
    else:
        replicate, shard = mesh.dp, 1
        if options.zero in (1, 2):
            notes.append(f"torchtitan has no ZeRO-{options.zero}: data parallelism is replicated (DDP), "
                         "optimizer state not sharded; FSDP (zero=3) is its sharded mode")
    parallelism = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": mesh.tp,
        "enable_sequence_parallel": bool(mesh.sp and mesh.tp > 1),
        "pipeline_parallel_degree": mesh.pp,
        "context_parallel_degree": mesh.cp,
        "expert_parallel_degree": mesh.ep,
    }
    if mesh.ep > 1 and options.zero != 3:
        notes.append("torchtitan borrows expert parallelism from the sharded data-parallel degree: run it with "
                     "FSDP (zero=3) for ep > 1")
    if mesh.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if pipe.get("schedule") == "interleaved" else "1F1B"
        counts = [st["blocks"] for st in pipe.get("stages", [])]
        vpp = pipe.get("vpp", 1)
        parallelism["pipeline_parallel_layers_per_stage"] = counts[0] // vpp if counts and len(set(counts)) == 1 \
            else None
        if counts and len(set(counts)) > 1:
            parallelism["pipeline_parallel_first_stage_layers"] = counts[0]
            parallelism["pipeline_parallel_last_stage_layers"] = counts[-1]
        parallelism["pipeline_parallel_microbatch_size"] = candidate.microbatch
    mode = {"none": "none", "selective": "selective", "full": "full", "op": "selective"}[options.recompute]
    checkpoint = {"mode": mode}
    if mode == "selective":
        checkpoint["selective_ac_option"] = "op"
        if options.recompute == "selective":
            notes.append("torchtitan's selective checkpointing ('op') saves matmul outputs; the plan priced "
                         "Megatron's selective recomputation of attention (docs/training.md)")
    training = {"global_batch_size": batch, "local_batch_size": candidate.microbatch}
    if sequence is not None:
        training["seq_len"] = sequence
    args = []
    for section, values in (("parallelism", parallelism), ("activation_checkpoint", checkpoint),
                            ("training", training)):
        for key, value in values.items():
            if value is None:
                continue
            if isinstance(value, bool):
                args.append(f"--{section}.{key}" if value else f"--{section}.no-{key}")
            else:
                args.append(f"--{section}.{key} {value}")
    return {
        "engine": "torchtitan",
        "parallelism": {k: v for k, v in parallelism.items() if v is not None},
        "activation_checkpoint": checkpoint,
        "training": training,
        "command_line": " ".join(args),
        "recipe": candidate.recipe(),
        "notes": notes,
    }


def megatron_settings(candidate, batch: int, sequence: int | None = None) -> dict:
    """Megatron-LM's command-line arguments for the plan."""
    mesh, options, pipe = _common(candidate, batch, sequence)
    notes = []
    args = [
        ("--tensor-model-parallel-size", mesh.tp),
        ("--pipeline-model-parallel-size", mesh.pp),
        ("--context-parallel-size", mesh.cp),
        ("--micro-batch-size", candidate.microbatch),
        ("--global-batch-size", batch),
    ]
    if sequence is not None:
        args.append(("--seq-length", sequence))
    if mesh.ep > 1:  # carved out of the data-parallel group, as the plan's mesh (docs/training.md)
        args.append(("--expert-model-parallel-size", mesh.ep))
    if mesh.tp > 1 and mesh.sp:
        args.append(("--sequence-parallel", None))
    if options.zero >= 1:
        args.append(("--use-distributed-optimizer", None))
        if options.zero >= 2:
            notes.append(f"Megatron's distributed optimizer shards the optimizer state (ZeRO-1); ZeRO-{options.zero} "
                         "sharding of gradients" + (" and weights" if options.zero == 3 else "")
                         + " needs its FSDP (--data-parallel-sharding-strategy)")
    if options.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    elif options.recompute in ("selective", "op"):
        args.append(("--recompute-granularity", "selective"))
        if options.recompute == "op":
            notes.append("Megatron has no operator-level policy like torchtitan's 'op': its selective "
                         "recomputation (attention's core) is the nearest")
    if options.tp_overlap and mesh.tp > 1:
        args.append(("--tp-comm-overlap", None))
    if options.overlap:
        args.append(("--overlap-grad-reduce", None))
        if options.zero >= 1:
            args.append(("--overlap-param-gather", None))
    if mesh.pp > 1:
        counts = [st["blocks"] for st in pipe.get("stages", [])]
        if pipe.get("schedule") == "interleaved":
            args.append(("--num-layers-per-virtual-pipeline-stage", counts[0] // pipe["vpp"]))
        if counts and len(set(counts)) > 1:
            args += [("--decoder-first-pipeline-num-layers", counts[0]),
                     ("--decoder-last-pipeline-num-layers", counts[-1])]
    line = " ".join(flag if value is None else f"{flag} {value}" for flag, value in args)
    return {
        "engine": "megatron-lm",
        "arguments": {flag: (True if value is None else value) for flag, value in args},
        "command_line": line,
        "data_parallel_size": mesh.dp,
        "recipe": candidate.recipe(),
        "notes": notes,
    }


#: Flag name -> (engine, writer).
ENGINES = {"torchtitan": torchtitan_settings, "megatron": megatron_settings}
