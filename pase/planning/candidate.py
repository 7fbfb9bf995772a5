"""What one training configuration costs, as the searches hand it on: a :class:`Candidate` (mesh
or per-layer plan, options, configurations and summary) and a :class:`Priced` row of the mesh search.
"""

from __future__ import annotations

from dataclasses import dataclass

from pase.costing.training import TrainingOptions, TrainingSummary
from pase.costing.training.allocator import MemoryFigures, memory_figures
from pase.planning.mesh import Mesh, Recipe

__all__ = ["CAUSES", "OFFLOAD_CAUSES", "Candidate", "Priced"]

#: The causes a step's time is told by, in the order they are shown: per-device compute,
#: recomputation, exposed activation collectives, redistribution between layers, pipeline
#: sends, the pipeline bubble, the device waiting for the host (``host_floor``; only where an
#: engine states a host time), exposed weight synchronisation, the optimizer step.
CAUSES = ("compute", "recompute", "activation_comm", "redistribution", "p2p", "bubble", "host", "weight_sync",
          "optimizer")
#: An offloading plan's further causes (``pase.costing.training.offload``), shown after those:
#: the host-link copies not hidden behind compute, the CPU optimizer step.
OFFLOAD_CAUSES = ("host_transfers", "host_optimizer")
#: A tight plan's further cause, shown last: the caching allocator's retries
#: (``pase.costing.training.allocator.retry_seconds``).
RETRY_CAUSES = ("allocator_retries",)


@dataclass(frozen=True)
class Candidate:
    """One training configuration and what it costs: a mesh (or ``None`` for a per-layer
    plan), the options, the per-rank micro-batch, the layers' configurations and summary."""

    mesh: Mesh | None
    options: TrainingOptions
    microbatch: int | None
    configs: tuple
    summary: TrainingSummary
    memory_cap: float | None

    @property
    def fits(self) -> bool:
        return self.memory_cap is None or self.summary.peak_memory_bytes <= self.memory_cap

    def recipe(self) -> str:
        """The candidate in ``--recipe`` words."""
        o = self.options
        parts = []
        if self.mesh is not None:
            parts += [f"dp={self.mesh.dp}", f"tp={self.mesh.tp}"]
            if self.mesh.cp > 1:
                parts.append(f"cp={self.mesh.cp}")
            if self.mesh.ep > 1:
                parts.append(f"ep={self.mesh.ep}")
            if self.mesh.folded:
                parts.append(f"etp={self.mesh.expert_tp}")
            if self.mesh.pp > 1:
                pipe = self.summary.extra.get("pipeline", {})
                parts.append(f"pp={self.mesh.pp}")
                if pipe.get("schedule") == "interleaved":
                    parts += ["schedule=interleaved", f"vpp={pipe['vpp']}"]
                if pipe.get("pipeline_extra"):
                    parts.append(f"pipeline_extra={pipe['pipeline_extra']}")
            if self.mesh.tp > 1 and not self.mesh.sp:
                parts.append("sp=false")
        if o.tp_overlap:
            parts.append("tp_overlap=true")
        if self.mesh is not None and self.mesh.ep > 1:  # the experts' dispatcher and overlaps, where not plain
            if o.moe_dispatcher != "alltoall":
                parts.append(f"dispatcher={o.moe_dispatcher}")
            parts += [f"{k}=true" for k in ("ep_overlap", "shared_overlap") if getattr(o, k)]
        parts += [f"zero={o.zero}", f"recompute={o.recompute}"]
        if o.recompute == "block":
            parts.append(f"recompute_layers={o.recompute_layers}")
        if o.recompute == "selective" and o.recompute_modules != ("core_attn",):
            parts.append(f"recompute_modules={'+'.join(o.recompute_modules)}")
        if self.microbatch is not None:
            parts.append(f"microbatch={self.microbatch}")
        if o.precision != "bf16":  # the plan's number format, in the words engines' exports read
            parts.append(f"precision={o.precision}")
            if o.precision == "fp8":
                parts.append(f"scaling={o.fp8_scaling}")
            if o.fp8_gather:
                parts.append("fp8_gather=true")
        if o.offload:
            parts.append("offload=" + "+".join(o.offload))
        return ",".join(parts)

    def causes(self) -> dict:
        """The step time by cause (keys of :data:`CAUSES`, those that apply), summing to the
        step: a pipelined plan's is its slowest stage's work over all micro-batches, the
        bubble and the exposed synchronisation and optimizer step after it."""
        told = self.summary.extra.get("causes")
        if told is not None:
            return dict(told)
        return {k: float(self.summary.time.get(k, 0.0)) for k in CAUSES + OFFLOAD_CAUSES + RETRY_CAUSES
                if k in self.summary.time}

    def memory_kinds(self) -> dict:
        """The peak memory per device by kind (a pipelined plan's: its largest stage's)."""
        return dict(self.summary.extra.get("memory_kinds", self.summary.memory))

    def needed_memory_bytes(self) -> float:
        """The peak less the allocator's stranded bytes: what tensors need (with the context and
        NCCL's buffers), as the search fits and ranks it (``allocator.released_within``)."""
        return self.summary.peak_memory_bytes - self.memory_kinds().get("fragmentation", 0.0)

    def memory_figures(self) -> MemoryFigures:
        """The peak in the three figures (allocated, reserved, what the device needs) of the
        stage that holds it (:func:`~pase.costing.training.allocator.memory_figures`)."""
        return memory_figures(self.memory_kinds(), self.summary.peak_memory_bytes)

    def as_recipe(self) -> Recipe:
        """Every choice of the candidate fixed (a mesh candidate's; ``ValueError`` for a
        per-layer plan, which no recipe describes)."""
        if self.mesh is None:
            raise ValueError("a per-layer plan has no recipe that fixes it")
        pipe = self.summary.extra.get("pipeline", {})
        mesh = self.mesh
        return Recipe(dp=mesh.dp, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, zero=self.options.zero,
                      recompute=self.options.recompute, microbatch=self.microbatch,
                      recompute_layers=self.options.recompute_layers or None,
                      recompute_modules=self.options.recompute_modules if self.options.recompute == "selective"
                      and self.options.recompute_modules != ("core_attn",) else None,
                      schedule=pipe.get("schedule"), vpp=pipe.get("vpp") if pipe.get("schedule") == "interleaved"
                      else None, sp=mesh.sp if mesh.tp > 1 else None, ep=mesh.ep if mesh.ep > 1 else None,
                      etp=mesh.expert_tp if mesh.folded else None, pipeline_extra=pipe.get("pipeline_extra"),
                      offload=self.options.offload or None)


@dataclass(frozen=True)
class Priced:
    """One configuration the mesh search priced: its mesh and options, the per-rank
    micro-batch, the pipeline schedule and chunks (pipelined meshes), step and peak."""

    mesh: Mesh
    zero: int
    recompute: str
    microbatch: int
    schedule: str | None
    vpp: int
    step_seconds: float
    peak_memory_bytes: float
    #: Under ``recompute=block``: the blocks each pipeline chunk recomputes (0 otherwise).
    recompute_layers: int = 0
    #: The embedding and/or the loss counted as pipeline layers (``pipeline_extra``), if any.
    pipeline_extra: str | None = None

    def recipe(self) -> Recipe:
        """The configuration as a recipe fixing every choice."""
        mesh = self.mesh
        return Recipe(dp=mesh.dp, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, zero=self.zero, recompute=self.recompute,
                      recompute_layers=self.recompute_layers or None,
                      microbatch=self.microbatch, schedule=self.schedule,
                      vpp=self.vpp if self.schedule == "interleaved" else None,
                      sp=mesh.sp if mesh.tp > 1 else None, ep=mesh.ep if mesh.ep > 1 else None,
                      etp=mesh.expert_tp if mesh.folded else None, pipeline_extra=self.pipeline_extra)
