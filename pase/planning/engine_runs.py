"""What each training engine runs: the configurations torchtitan, Megatron-LM and DeepSpeed
can be told to run, as data (:data:`RUNS`), and the one check that reads it (:func:`refusal`).

A plan an engine cannot run as priced is refused with the reason (the exporters write
nothing then; ``--engine`` will keep the search to plans it runs). The facts of each engine
are from its own code: torchtitan 0.2.2 (``torchtitan/config/job_config.py``,
``torchtitan/distributed/parallel_dims.py``, ``torchtitan/models/llama3/infra/parallelize.py``:
"DDP has not supported > 1D parallelism"; FSDP is applied over the data-parallel shard and the
context-parallel ranks together), megatron-core 0.16 (``TransformerConfig``,
``DistributedDataParallelConfig``) and Megatron-LM's arguments, DeepSpeed 0.19
(``deepspeed/runtime/config.py``, ``zero/config.py``).

Engines are keyed by the names ``--engine`` takes; the table is to move into the engine
profile files (``pase/planning/engines/``) once they exist.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EnginePlan", "engine_plan", "RUNS", "ENGINE_NAMES", "refusal", "engines_running", "runs_mesh", "mesh_refusal",
           "check_engine"]


@dataclass(frozen=True)
class EnginePlan:
    """A mesh plan in the terms every engine's settings are written from.

    ``microbatch``: sequences per micro-batch per data-parallel rank; ``microbatches``: micro-
    batches per step (pipeline micro-batches, or gradient accumulation without a pipeline);
    ``counts``: blocks per pipeline stage (``()`` without a pipeline); ``sequence``: tokens
    per sequence (``None`` when the graph has no sequence); ``architecture``: what the graph
    builder declares (``Network.architecture``), ``None`` for an imported model.
    """

    procs: int
    batch: int
    dp: int
    tp: int
    cp: int
    pp: int
    ep: int
    sp: bool
    zero: int
    recompute: str
    microbatch: int
    microbatches: int
    schedule: str
    vpp: int
    counts: tuple
    tp_overlap: bool
    overlap: bool
    sequence: int | None
    architecture: dict | None
    recipe: str

    @property
    def replicas(self) -> int:
        """Ranks holding a copy of a weight in data and context parallelism (``dp x cp``):
        the group ZeRO shards over, as torchtitan's FSDP and Megatron's optimizer do."""
        return self.dp * self.cp


def engine_plan(candidate, batch: int, network) -> EnginePlan:
    """The :class:`EnginePlan` of a mesh candidate (``ValueError`` for a per-layer plan)."""
    mesh, o = candidate.mesh, candidate.options
    if mesh is None:
        raise ValueError("the plan is not a mesh: an engine runs a mesh")
    pipe = candidate.summary.extra.get("pipeline") or {}
    counts = tuple(int(st["blocks"]) for st in pipe.get("stages", ())) if mesh.pp > 1 else ()
    schedule = pipe.get("schedule", "1f1b") if mesh.pp > 1 else "1f1b"
    vpp = int(pipe.get("vpp", 1)) if mesh.pp > 1 else 1
    micro = candidate.microbatch if candidate.microbatch is not None else batch // mesh.dp // o.microbatches
    arch = getattr(network, "architecture", None)
    sequence = arch["sequence"] if arch else None
    if sequence is None:
        from .training_search import tokens_of

        tokens = tokens_of(network)
        sequence = tokens // network.batch if tokens and network.batch else None
    recipe = candidate.recipe()
    if counts and len(set(counts)) > 1:
        recipe += ",stages=" + "/".join(str(c) for c in counts)
    return EnginePlan(
        procs=mesh.devices, batch=batch, dp=mesh.dp, tp=mesh.tp, cp=mesh.cp, pp=mesh.pp, ep=mesh.ep,
        sp=bool(mesh.sp and mesh.tp > 1), zero=o.zero, recompute=o.recompute, microbatch=micro,
        microbatches=o.microbatches, schedule=schedule, vpp=vpp, counts=counts, tp_overlap=bool(o.tp_overlap),
        overlap=bool(o.overlap), sequence=sequence, architecture=arch, recipe=recipe)


#: The configurations each engine runs. ``zero``: the ZeRO stages it has (over the ``dp x
#: cp`` ranks that hold copies); ``zero_alone``: stages it runs only with data parallelism
#: alone (no tp, cp, pp or ep), ``zero_pp``: stages it runs with a pipeline; ``tp`` with
#: ``sp`` (sequence parallelism) always / optional; ``cp``, ``ep``; ``schedules`` of its
#: pipelines (empty: no pipeline); ``recompute`` policies; ``tp_overlap`` (tensor-parallel
#: communication hidden behind GEMMs as priced); ``architecture``: it builds the model from
#: its shape (the graph must declare one).
RUNS = {
    "torchtitan": {
        # DDP (0) only alone; FSDP with reshard_after_forward always (3) or never (2); no ZeRO-1.
        "zero": (0, 2, 3), "zero_alone": (0,), "zero_pp": (0, 2, 3),
        "tp": True, "sp": "always", "cp": True, "ep": True, "ep_zero": (2, 3),
        "schedules": ("1f1b", "interleaved"), "recompute": ("none", "full", "op"),
        "tp_overlap": False, "architecture": False,
    },
    "megatron": {
        # Plain DDP (0), the distributed optimizer (1), Megatron FSDP optim_grads (2) and
        # optim_grads_params (3); Megatron FSDP without pipelines.
        "zero": (0, 1, 2, 3), "zero_alone": (), "zero_pp": (0, 1),
        "tp": True, "sp": "optional", "cp": True, "ep": True, "ep_zero": (0, 1, 2, 3),
        "schedules": ("1f1b", "interleaved"), "recompute": ("none", "selective", "full"),
        "tp_overlap": True, "architecture": True,
    },
    "deepspeed": {
        # ds_config.json holds ZeRO, batch and precision; tensor, context, expert and
        # pipeline parallelism and recomputation are the model code's.
        "zero": (1, 2, 3), "zero_alone": (), "zero_pp": (),
        "tp": False, "sp": "optional", "cp": False, "ep": False, "ep_zero": (),
        "schedules": (), "recompute": ("none",), "tp_overlap": False, "architecture": False,
    },
}

ENGINE_NAMES = tuple(RUNS)

_RECOMPUTE_WORDS = {"none": "no recomputation", "selective": "selective recomputation of attention's core "
                    "(Megatron's)", "full": "full recomputation of every block",
                    "op": "torchtitan's per-operator selective policy ('op')"}

#: Why an engine has no such configuration, where the table's word alone would not say.
_WHY = {
    ("torchtitan", "zero", 1): "torchtitan has no ZeRO-1 (optimizer state sharded, gradients and weights not): its "
                               "data parallelism is DDP, FSDP (ZeRO-3) or FSDP without resharding after forward "
                               "(ZeRO-2)",
    ("torchtitan", "zero_alone", 0): "torchtitan runs DDP (ZeRO-0) with data parallelism alone (\"DDP has not "
                                     "supported > 1D parallelism\"), and shards weights over context-parallel "
                                     "ranks with FSDP: use zero=2 or zero=3",
    ("torchtitan", "sp", False): "torchtitan's tensor parallelism always splits the norms' sequence (sequence "
                                 "parallelism): the plan priced tp without it (sp=false)",
    ("torchtitan", "tp_overlap", True): "torchtitan's async tensor parallelism needs torch.compile, which the plan "
                                        "did not price (tp_overlap=true)",
    ("torchtitan", "ep_zero", 0): "torchtitan's expert parallelism borrows the FSDP shard ranks: use zero=2 or zero=3",
    ("megatron", "zero_pp", 2): "Megatron FSDP (--data-parallel-sharding-strategy optim_grads) runs without "
                                "pipeline parallelism",
    ("megatron", "zero_pp", 3): "Megatron FSDP (--data-parallel-sharding-strategy optim_grads_params) runs "
                                "without pipeline parallelism",
    ("megatron", "architecture", None): "Megatron-LM builds its GPT model from its arguments (--num-layers, "
                                        "--hidden-size, ...): this graph declares no decoder shape (an imported "
                                        "model or a graph file)",
    ("deepspeed", "zero", 0): "DeepSpeed without ZeRO reduces the gradients after the backward pass; the plan "
                              "priced them overlapped with it (use zero=1)",
    ("deepspeed", "tp", True): "ds_config.json has no tensor parallelism: it is the model code's (Megatron-"
                               "DeepSpeed), not DeepSpeed's configuration",
    ("deepspeed", "cp", True): "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not the "
                               "context parallelism priced",
    ("deepspeed", "ep", True): "DeepSpeed-MoE's expert parallelism is set in the model code (deepspeed.moe), not "
                               "ds_config.json",
    ("deepspeed", "pp", True): "DeepSpeed's pipeline engine splits stages in the model code (PipelineModule), not "
                               "ds_config.json",
    ("deepspeed", "recompute", None): "DeepSpeed recomputes what the model code wraps in "
                                      "deepspeed.checkpointing.checkpoint: ds_config.json cannot say it",
}


def refusal(engine: str, plan: EnginePlan) -> str | None:
    """Why ``engine`` cannot run ``plan`` as priced, or ``None`` when it can."""
    runs = RUNS[engine]
    if runs["architecture"] and not plan.architecture:
        return _WHY[(engine, "architecture", None)]
    zero = plan.zero if plan.replicas > 1 else None  # one copy of every weight: no stage to choose
    if zero is not None and zero not in runs["zero"]:
        return _WHY.get((engine, "zero", zero), f"{engine} has no ZeRO-{zero}")
    alone = plan.tp == plan.pp == plan.cp == plan.ep == 1
    if zero in runs["zero_alone"] and not alone:
        return _WHY[(engine, "zero_alone", zero)]
    if plan.tp > 1 and not runs["tp"]:
        return _WHY[(engine, "tp", True)]
    if plan.tp > 1 and runs["sp"] == "always" and not plan.sp:
        return _WHY[(engine, "sp", False)]
    if plan.cp > 1 and not runs["cp"]:
        return _WHY[(engine, "cp", True)]
    if plan.pp > 1 and not runs["schedules"]:
        return _WHY[(engine, "pp", True)]
    if plan.pp > 1 and plan.schedule not in runs["schedules"]:
        return f"{engine} has no {plan.schedule} pipeline schedule"
    if plan.pp > 1 and zero is not None and zero not in runs["zero_pp"]:
        return _WHY.get((engine, "zero_pp", zero), f"{engine} runs no ZeRO-{zero} with pipelines")
    if plan.ep > 1 and not runs["ep"]:
        return _WHY[(engine, "ep", True)]
    if plan.ep > 1 and plan.zero not in runs["ep_zero"]:
        return _WHY[(engine, "ep_zero", plan.zero)]
    if plan.recompute not in runs["recompute"]:
        return _WHY.get((engine, "recompute", None), f"{engine} has no {_RECOMPUTE_WORDS[plan.recompute]}")
    if plan.tp_overlap and plan.tp > 1 and not runs["tp_overlap"]:
        return _WHY[(engine, "tp_overlap", True)]
    return None


def engines_running(plan: EnginePlan) -> list:
    """The engines that run ``plan`` as priced, in :data:`RUNS` order."""
    return [name for name in RUNS if refusal(name, plan) is None]


def runs_mesh(engine: str, mesh, options, architecture=None) -> bool:
    """Whether ``engine`` runs a mesh with these options, whatever the pipeline's cut and
    schedule (every engine here that pipelines runs both schedules priced): the search's
    filter under ``--engine``."""
    return mesh_refusal(engine, mesh, options, architecture) is None


def mesh_refusal(engine: str, mesh, options, architecture=None) -> str | None:
    """:func:`refusal` of a mesh with these options (``None``: the engine runs it)."""
    plan = EnginePlan(procs=mesh.devices, batch=1, dp=mesh.dp, tp=mesh.tp, cp=mesh.cp, pp=mesh.pp, ep=mesh.ep,
                      sp=bool(mesh.sp and mesh.tp > 1), zero=options.zero, recompute=options.recompute, microbatch=1,
                      microbatches=options.microbatches, schedule="1f1b", vpp=1, counts=(), tp_overlap=options.tp_overlap,
                      overlap=options.overlap, sequence=None, architecture=architecture or {"declared": True}, recipe="")
    return refusal(engine, plan)


def check_engine(engine: str, network) -> None:
    """``ValueError`` when ``engine`` is unknown or cannot run ``network`` at all."""
    if engine not in RUNS:
        raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(RUNS)}")
    if RUNS[engine]["architecture"] and not getattr(network, "architecture", None):
        raise ValueError(_WHY[(engine, "architecture", None)])
