"""The summary of one strategy under a training configuration (:class:`TrainingSummary`): its
step time and peak memory by part, summed over the layers' chosen rows (:func:`summarize`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pase.costing.training.memory import MemoryKinds
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import PricedLayers
from pase.costing.training.vectors import LayerVectors

__all__ = ["TrainingSummary", "summarize"]


@dataclass
class TrainingSummary:
    """A strategy under a training configuration: step time and peak memory, by part."""

    options: TrainingOptions
    step_seconds: float
    time: dict
    memory: dict
    peak_memory_bytes: float
    model_flops_per_step: float
    parameters: int
    tokens_per_step: int | None = None
    procs: int = 1
    peak_flops: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second_per_device(self) -> float | None:
        if self.tokens_per_step is None or not self.step_seconds:
            return None
        return self.tokens_per_step / self.step_seconds / self.procs

    @property
    def mfu(self) -> float | None:
        if self.peak_flops is None or not self.step_seconds:
            return None
        return self.model_flops_per_step / (self.step_seconds * self.procs * self.peak_flops)


def _summed_layers(vectors: LayerVectors, choice: Sequence[int], options: TrainingOptions) -> list:
    """``(layer, row, count)`` to add up: every layer once, or, where every layer takes the same
    row (a mesh) and the policy is not ``block`` (which recomputes some blocks of a kind and not
    others), each group of layers equal under any options once, counted by its members."""
    rows = set(choice)
    if len(rows) != 1 or options.recompute == "block":
        return [(v, i, 1) for v, i in enumerate(choice)]
    i = rows.pop()
    return [(int(rep), i, len(members)) for rep, members in vectors.groups.groups]


def summarize(layers: PricedLayers, vectors: LayerVectors, memory: MemoryKinds, choice: Sequence[int],
              options: TrainingOptions, act_bytes: float, edge_seconds: float, procs: int,
              tokens_per_step: int | None = None) -> TrainingSummary:
    """The step time and peak memory of one choice of row per layer (``edge_seconds``: the
    redistribution of one micro-batch, forward and backward, already summed): each layer's
    time by cause and memory that adds up, then what is alive part of the time and the reserve."""
    time: dict = {}
    kinds: dict = {}
    for v, i, count in _summed_layers(vectors, choice, options):
        for key, value in vectors.layer_time(v, options).items():
            time[key] = time.get(key, 0.0) + count * float(value[i])
        for key, value in memory.layer_memory(v, options, act_bytes).items():
            kinds[key] = kinds.get(key, 0.0) + count * float(value[i])
    time["redistribution"] = float(edge_seconds)
    kinds.update(memory.transient_bytes(choice, options, act_bytes))
    kinds["reserve"] = float(options.reserve_bytes)
    step = float(sum(time.values()))
    extra = host_figures(vectors, choice, options, act_bytes) if options.offload else {}
    return TrainingSummary(
        options=options,
        step_seconds=step,
        time=time,
        memory=kinds,
        peak_memory_bytes=float(sum(kinds.values())),
        model_flops_per_step=layers.model_flops * options.microbatches,
        parameters=layers.parameters,
        tokens_per_step=tokens_per_step,
        procs=procs,
        peak_flops=layers.machine.peak_flops,
        extra=extra,
    )


def host_figures(vectors: LayerVectors, choice: Sequence[int], options: TrainingOptions, act_bytes: float) -> dict:
    """What an offloading configuration keeps off the device, per device: ``host_memory_bytes``
    (host memory) and ``drive_bytes`` (the node's drive, ``nvme``), summed over the layers."""
    offload = vectors.offload
    host = sum(float(offload.host_bytes(v, options, act_bytes)[i]) for v, i in enumerate(choice))
    drive = sum(float(offload.drive_bytes(v, options)[i]) for v, i in enumerate(choice))
    out = {"host_memory_bytes": host}
    if drive:
        out["drive_bytes"] = drive
    return out
