"""What each training engine runs, and the one check that reads it (:func:`refusal`).

The configurations an engine runs are data: the ``runs`` section of its profile
(``pase/planning/engines/NAME.json``, docs/engines.md): ``zero`` (the ZeRO stages it has, over
the ``dp x cp`` ranks that hold copies), ``zero_alone`` (stages it runs only with data
parallelism alone), ``zero_pp`` (stages it runs with pipelines), ``tp``, ``sp`` (``always``:
its tensor parallelism is always sequence-parallel; ``never``: it has no sequence parallelism), ``cp``, ``ep``, ``ep_zero``, ``fold`` (MoE
parallel folding: ``ep`` beyond ``dp`` or ``etp`` not ``tp``), ``fold_etp`` (the ``etp`` it
folds with, ``1`` or ``tp``), ``schedules``
(of its pipelines; empty: none), ``architecture`` (it builds the model from the graph's
declared shape), ``why`` (the reason for each refusal, keyed ``KEY`` or ``KEY:VALUE``) and
``source``; with the profile's ``recompute_policies`` and ``tp_comm_overlap`` facts.

A plan an engine cannot run as priced is refused with the reason: the exporters write nothing,
``--engine`` keeps the search to what the engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pase.model.builder import tokens_of
from pase.planning.mesh import ExpertGrid

__all__ = ["EnginePlan", "engine_plan", "refusal", "policy_refusal", "offload_refusal", "OFFLOAD_RUNS", "engines_running",
           "runs_mesh", "mesh_refusal",
           "check_engine"]


@dataclass(frozen=True)
class EnginePlan(ExpertGrid):
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
    #: The number format of the blocks' weight products (``bf16``; ``fp8``, ``mxfp8``, ``nvfp4``).
    precision: str = "bf16"
    #: FP8's scaling recipe (``delayed``, ``current``, ``rowwise``, ``blockwise``; FP8 only).
    fp8_scaling: str = "current"
    #: ZeRO's all-gathers of the converted weights in the format.
    fp8_gather: bool = False
    #: The experts' tensor parallelism under MoE parallel folding (``None``: ``tp``).
    etp: int | None = None
    #: Under ``recompute=block``: the blocks each pipeline chunk recomputes (0 otherwise).
    recompute_layers: int = 0
    #: Under ``recompute=selective``: what it recomputes (Megatron's ``--recompute-modules``).
    recompute_modules: tuple = ("core_attn",)
    #: The embedding and/or the loss counted as pipeline layers (``pipeline_extra``).
    pipeline_extra: str = "none"
    #: The mixture of experts' token dispatcher and overlaps (``pase.costing.training.experts``).
    moe_dispatcher: str = "alltoall"
    ep_overlap: bool = False
    shared_overlap: bool = False
    #: What lives on the host (``offload=``; ``pase.costing.training.offload``).
    offload: tuple = ()

    @property
    def precision_word(self) -> str:
        """The format in ``runs.export.precisions`` words: ``fp8/SCALING`` for FP8, else its name."""
        return f"fp8/{self.fp8_scaling}" if self.precision == "fp8" else self.precision

    @property
    def replicas(self) -> int:
        """Ranks holding a copy of a weight in data and context parallelism (``dp x cp``):
        the group ZeRO shards over, as torchtitan's FSDP and Megatron's optimizer do."""
        return self.dp * self.cp


def _modules_of(options) -> tuple:
    """What ``selective`` recomputes under ``options`` (Megatron's default, ``core_attn``, under
    any other policy)."""
    return tuple(getattr(options, "recompute_modules", ("core_attn",))) if options.recompute == "selective" \
        else ("core_attn",)


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
        tokens = tokens_of(network)
        sequence = tokens // network.batch if tokens and network.batch else None
    recipe = candidate.recipe()
    if counts and len(set(counts)) > 1:
        recipe += ",stages=" + "/".join(str(c) for c in counts)
    return EnginePlan(
        procs=mesh.devices, batch=batch, dp=mesh.dp, tp=mesh.tp, cp=mesh.cp, pp=mesh.pp, ep=mesh.ep,
        sp=bool(mesh.sp and mesh.tp > 1), zero=o.zero, recompute=o.recompute, microbatch=micro,
        microbatches=o.microbatches, schedule=schedule, vpp=vpp, counts=counts, tp_overlap=bool(o.tp_overlap),
        overlap=bool(o.overlap), sequence=sequence, architecture=arch, recipe=recipe,
        precision=getattr(o, "precision", "bf16"), fp8_scaling=getattr(o, "fp8_scaling", "current"),
        fp8_gather=bool(getattr(o, "fp8_gather", False)), etp=mesh.etp, recompute_layers=o.recompute_layers,
        recompute_modules=_modules_of(o),
        pipeline_extra=pipe.get("pipeline_extra", "none") if mesh.pp > 1 else "none",
        moe_dispatcher=getattr(o, "moe_dispatcher", "alltoall"), ep_overlap=bool(getattr(o, "ep_overlap", False)),
        shared_overlap=bool(getattr(o, "shared_overlap", False)), offload=tuple(getattr(o, "offload", ())))


@lru_cache(maxsize=None)
def _shipped(name: str):
    from pase.planning.engine import load_engine

    return load_engine(name)


def _profile(engine):
    """The :class:`~pase.planning.engine.EngineProfile` of ``engine`` (a profile or a shipped name)."""
    return _shipped(engine) if isinstance(engine, str) else engine


#: Fallback reasons, where a profile's ``runs.why`` says nothing more specific.
_GENERIC = {"zero": "{name} has no ZeRO-{value}", "zero_alone": "{name} runs ZeRO-{value} only with data parallelism "
            "alone", "zero_pp": "{name} runs no ZeRO-{value} with pipelines", "tp": "{name} has no tensor parallelism",
            "sp": "{name} has no tensor parallelism without sequence parallelism",
            "sp_never": "{name} has no sequence parallelism", "cp": "{name} has no context "
            "parallelism", "pp": "{name} has no pipeline parallelism", "schedule": "{name} has no {value} pipeline "
            "schedule", "ep": "{name} has no expert parallelism", "ep_zero": "{name} runs expert parallelism with "
            "no ZeRO-{value}", "fold": "{name} has no MoE parallel folding (expert parallelism beyond dp, or etp "
            "not tp)", "fold_etp": "{name} folds the experts with no expert tensor parallelism {value}", "recompute": "{name} has no recomputation policy '{value}'",
            "pipeline_extra": "{name} counts no embedding or loss as a pipeline layer (pipeline_extra={value})",
            "tp_overlap": "{name} does not overlap tensor-parallel communication as priced (tp_overlap=true)",
            "architecture": "{name} builds the model from its shape, which this graph does not declare",
            "export:precision": "{name}'s file cannot say {value} training (bf16 only)",
            "export:fp8_gather": "{name}'s file cannot say ZeRO all-gathers in {value} (fp8_gather=true)",
            "export:fp8_gather_zero": "{name}'s file cannot say fp8_gather=true with ZeRO-{value}",
            "export:file": "{name}'s file cannot say what this profile prices"}


def _why(profile, key: str, value=None) -> str:
    why = profile.runs.get("why", {})
    word = None if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
    text = why.get(f"{key}:{word}") if word is not None else None
    return text or why.get(key) or _GENERIC.get(key, "{name} cannot run it ({key})").format(
        name=profile.name, value=word, key=key)


def refusal(engine, plan: EnginePlan, export: bool = False) -> str | None:
    """Why ``engine`` (a profile or a shipped engine's name) cannot run ``plan`` as priced, or
    ``None`` when it can. The rules are the profile's ``runs`` section (a key it lacks does not
    restrict) with its ``recompute_policies`` and ``tp_comm_overlap`` facts; with ``export``,
    also ``runs.export``: what the engine's file can say (``recompute``, ``schedules``: empty
    for a file that cannot hold a pipeline; ``precisions``: the formats it writes, in
    :attr:`EnginePlan.precision_word` words, bf16 alone where absent; ``fp8_gather``: the formats
    it gathers weights in, ``fp8_gather_zero``: the ZeRO stages it does so with; ``file``: false
    where no file of the engine says what the profile prices, e.g. a switch of another code base)."""
    profile = _profile(engine)
    runs = profile.runs
    if export:
        limits = runs.get("export", {})
        if limits.get("file") is False:
            return _why(profile, "export:file")
        word = plan.precision_word
        if word not in limits.get("precisions", ("bf16",)):
            return _why(profile, "export:precision", word)
        if plan.fp8_gather and plan.precision != "bf16":
            if word not in limits.get("fp8_gather", ()):
                return _why(profile, "export:fp8_gather", word)
            if "fp8_gather_zero" in limits and plan.zero not in limits["fp8_gather_zero"]:
                return _why(profile, "export:fp8_gather_zero", plan.zero)
        if "recompute" in limits and plan.recompute not in limits["recompute"]:
            return _why(profile, "export:recompute")
        if plan.pp > 1 and limits.get("schedules") == []:
            return _why(profile, "export:pp")
    if runs.get("architecture") and not plan.architecture:
        return _why(profile, "architecture")
    zero = plan.zero if plan.replicas > 1 else None  # one copy of every weight: no stage to choose
    if zero is not None and "zero" in runs and zero not in runs["zero"]:
        return _why(profile, "zero", zero)
    alone = plan.tp == plan.pp == plan.cp == plan.ep == 1
    if zero is not None and zero in runs.get("zero_alone", ()) and not alone:
        return _why(profile, "zero_alone", zero)
    if plan.tp > 1 and runs.get("tp") is False:
        return _why(profile, "tp")
    if plan.tp > 1 and runs.get("sp") == "always" and not plan.sp:
        return _why(profile, "sp", False)
    if plan.tp > 1 and runs.get("sp") == "never" and plan.sp:
        return _why(profile, "sp_never")
    if plan.cp > 1 and runs.get("cp") is False:
        return _why(profile, "cp")
    schedules = runs.get("schedules")
    if plan.pp > 1 and schedules is not None and not schedules:
        return _why(profile, "pp")
    if plan.pp > 1 and schedules and plan.schedule not in schedules:
        return _why(profile, "schedule", plan.schedule)
    if plan.pp > 1 and plan.pipeline_extra != "none" and plan.pipeline_extra not in runs.get("pipeline_extra",
                                                                                          ("none",)):
        # A new word: an engine whose profile does not list it counts only its blocks.
        return _why(profile, "pipeline_extra", plan.pipeline_extra)
    if plan.pp > 1 and zero is not None and "zero_pp" in runs and zero not in runs["zero_pp"]:
        return _why(profile, "zero_pp", zero)
    if plan.ep > 1 and runs.get("ep") is False:
        return _why(profile, "ep")
    if plan.ep > 1 and "ep_zero" in runs and plan.zero not in runs["ep_zero"]:
        return _why(profile, "ep_zero", plan.zero)
    if plan.folded and runs.get("fold") is False:
        return _why(profile, "fold")
    if plan.folded and "fold_etp" in runs:
        word = "tp" if plan.expert_tp == plan.tp else str(plan.expert_tp)
        if word not in runs["fold_etp"]:
            return _why(profile, "fold_etp", word)
    why = policy_refusal(profile, plan.recompute) or offload_refusal(profile.name, plan.offload)
    if why is not None:
        return why
    if plan.recompute == "selective" and any(m not in profile.facts["recompute_modules"] for m in plan.recompute_modules):
        return (f"{profile.name} recomputes {', '.join(profile.facts['recompute_modules'])} under selective "
                f"recomputation, not {'+'.join(plan.recompute_modules)} (Megatron-Core's --recompute-modules)")
    if plan.recompute == "selective" and delayed_refuses(plan.precision, plan.fp8_scaling, plan.recompute_modules):
        return ("Megatron-Core refuses moe_act and layernorm recomputation under FP8 delayed scaling "
                "(transformer/transformer_config.py:1241-1246)")
    if plan.tp_overlap and plan.tp > 1 and not profile.facts["tp_comm_overlap"]:
        return _why(profile, "tp_overlap", True)
    return None


#: The offloads each engine runs (``offload=`` words joined by ``+``) and why it runs no other
#: (research notes of issue 45, /work/notes/offload.md): Megatron-Core 0.16.1 offloads its
#: optimizer (--optimizer-cpu-offload, arguments.py:2059-2066) and stored activations
#: (--cpu-offloading-num-layers, no pipeline nor recomputation, transformer_config.py:1137-1152),
#: no parameters to the host from the command line and nothing to a drive; DeepSpeed offloads the
#: optimizer (cpu or nvme) and ZeRO-3's parameters (offload_config.py:21-62), activations only as
#: checkpoints; FSDP2's CPUOffloadPolicy (torchtitan's training.enable_cpu_offload) moves
#: parameters, gradients and optimizer together (_fsdp_api.py:58-83, ZeRO-3 only).
OFFLOAD_RUNS = {
    "megatron": (("optimizer", "activations", "optimizer+activations"),
                 "Megatron-Core offloads the optimizer (--optimizer-cpu-offload) and activations "
                 "(--cpu-offloading-num-layers) only: no parameters to the host, nothing to a drive"),
    "deepspeed": (("optimizer", "nvme", "params", "optimizer+params", "nvme+params"),
                  "DeepSpeed offloads the optimizer (offload_optimizer, cpu or nvme) and ZeRO-3's parameters "
                  "(offload_param); stored activations only as recomputation checkpoints"),
    "torchtitan": (("optimizer+params",), "torchtitan's training.enable_cpu_offload (FSDP2's CPUOffloadPolicy) "
                   "moves parameters, gradients and optimizer together: offload=optimizer+params with zero=3 only"),
    "fsdp": (("optimizer+params",), "FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer "
             "together: offload=optimizer+params with zero=3 only"),
}


def offload_refusal(engine: str, offload: tuple) -> str | None:
    """Why ``engine`` (a profile's name) cannot run the offload ``offload``, or ``None``."""
    if not offload:
        return None
    runs, why = OFFLOAD_RUNS.get(engine, ((), f"{engine} offloads nothing to the host"))
    return None if "+".join(offload) in runs else f"{why} (offload={'+'.join(offload)})"


def policy_refusal(engine, recompute: str) -> str | None:
    """Why ``engine`` has no recomputation policy ``recompute`` (its ``recompute_policies``), or
    ``None`` when it has it."""
    profile = _profile(engine)
    if recompute not in profile.facts["recompute_policies"]:
        return _why(profile, "recompute", recompute)
    return None


def delayed_refuses(precision: str, scaling: str, modules) -> bool:
    """Whether Megatron-Core refuses these recompute modules under this number format: ``moe_act``
    and ``layernorm`` recompute under FP8 delayed scaling (transformer_config.py:1241-1246)."""
    return precision == "fp8" and scaling == "delayed" and bool({"moe_act", "layernorm"} & set(modules))


def runs_said(engine) -> str:
    """What of the search's space ``engine`` (a profile or a shipped engine's name) runs, in a
    few words from its ``runs`` section and recomputation facts, for the search's report:
    ``ZeRO 0-1, sequence parallelism always, no context parallelism, recomputation none/full``.

    >>> runs_said("nanotron")
    'ZeRO 0-1, sequence parallelism always, no context parallelism, no expert parallelism, recomputation none/full'
    """
    profile = _profile(engine)
    runs = profile.runs
    words = []
    zero = sorted(runs.get("zero", (0, 1, 2, 3)))
    contiguous = zero == list(range(zero[0], zero[-1] + 1))
    words.append(f"ZeRO {zero[0]}-{zero[-1]}" if contiguous and len(zero) > 1 else
                 "ZeRO " + ", ".join(map(str, zero)))
    if runs.get("tp") is False:
        words.append("no tensor parallelism")
    elif runs.get("sp") in ("always", "never"):
        words.append(f"sequence parallelism {runs['sp']}")
    for key, name in (("cp", "context"), ("ep", "expert")):
        if runs.get(key) is False:
            words.append(f"no {name} parallelism")
    words.append("recomputation " + "/".join(profile.facts["recompute_policies"]))
    return ", ".join(words)


def engines_running(plan: EnginePlan) -> list:
    """The shipped engines that run ``plan`` as priced."""
    from pase.planning.engine import ENGINE_NAMES

    return [name for name in ENGINE_NAMES if refusal(name, plan) is None]


def runs_mesh(engine, mesh, options, architecture=None, export: bool = False) -> bool:
    """Whether ``engine`` runs a mesh with these options, whatever the pipeline's cut and
    schedule (every engine here that pipelines runs both schedules priced): the search's
    filter under ``--engine``."""
    return mesh_refusal(engine, mesh, options, architecture, export) is None


def mesh_refusal(engine, mesh, options, architecture=None, export: bool = False) -> str | None:
    """:func:`refusal` of a mesh with these options (``None``: the engine runs it)."""
    plan = EnginePlan(procs=mesh.devices, batch=1, dp=mesh.dp, tp=mesh.tp, cp=mesh.cp, pp=mesh.pp, ep=mesh.ep,
                      sp=bool(mesh.sp and mesh.tp > 1), zero=options.zero, recompute=options.recompute, microbatch=1,
                      microbatches=options.microbatches, schedule="1f1b", vpp=1, counts=(), tp_overlap=options.tp_overlap,
                      overlap=options.overlap, sequence=None, architecture=architecture or {"declared": True}, recipe="",
                      precision=getattr(options, "precision", "bf16"),
                      fp8_scaling=getattr(options, "fp8_scaling", "current"),
                      fp8_gather=bool(getattr(options, "fp8_gather", False)), etp=mesh.etp,
                      recompute_modules=_modules_of(options))
    return refusal(engine, plan, export)


def check_engine(engine, network) -> None:
    """``ValueError`` when ``engine`` cannot run ``network`` at all."""
    profile = _profile(engine)
    if profile.runs.get("architecture") and not getattr(network, "architecture", None):
        raise ValueError(_why(profile, "architecture"))
