"""The three memory figures a device shows, from the memory by kind: what PyTorch allocates, what
its caching allocator reserves, and what the device needs (``nvidia-smi``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OUTSIDE_ALLOCATOR", "RESERVED_ONLY", "FIGURE_NAMES", "MemoryFigures", "memory_figures",
           "stranded_bytes"]

#: Kinds of device memory PyTorch's caching allocator never sees: the CUDA context and driver
#: state (``reserve``) and NCCL's buffers (``comm_buffers``, allocated by NCCL through cuMem).
#: PyTorch's own out-of-memory message adds them as "non-PyTorch memory"
#: (c10/cuda/CUDACachingAllocator.cpp, v2.6.0, lines 1020 and 1345-1362).
OUTSIDE_ALLOCATOR = ("reserve", "comm_buffers")
#: Kinds the allocator holds in its segments but no tensor occupies: ``max_memory_reserved``
#: counts them, ``max_memory_allocated`` does not.
RESERVED_ONLY = ("fragmentation",)
#: The figure each name stands for, as the engines' logs and the driver name them.
FIGURE_NAMES = {
    "allocated": "torch.cuda.max_memory_allocated()",
    "reserved": "torch.cuda.max_memory_reserved()",
    "device": "what the device needs (nvidia-smi): reserved, the CUDA context and NCCL's buffers",
}


@dataclass(frozen=True)
class MemoryFigures:
    """One peak in the three figures, bytes per device: ``allocated`` <= ``reserved`` <= ``device``."""

    allocated: float
    reserved: float
    device: float

    def figure(self, name: str) -> float:
        """The figure ``allocated``, ``reserved`` or ``device`` (the names of :data:`FIGURE_NAMES`)."""
        if name not in FIGURE_NAMES:
            raise ValueError(f"a memory figure is one of {', '.join(FIGURE_NAMES)}, got {name!r}")
        return getattr(self, name)


def memory_figures(kinds: dict, device: float | None = None) -> MemoryFigures:
    """The three figures of a peak given by kind (bytes): the device needs every kind, the
    allocator reserves all but :data:`OUTSIDE_ALLOCATOR`, tensors occupy all but those and
    :data:`RESERVED_ONLY`. ``device``: the peak as the search added it up, where it is known
    (the kinds' sum otherwise); the other two figures are taken from it."""
    total = float(sum(kinds.values())) if device is None else float(device)
    outside = float(sum(kinds.get(k, 0.0) for k in OUTSIDE_ALLOCATOR))
    stranded = float(sum(kinds.get(k, 0.0) for k in RESERVED_ONLY))
    reserved = max(total - outside, 0.0)
    return MemoryFigures(allocated=max(reserved - stranded, 0.0), reserved=reserved, device=total)


def stranded_bytes(activations: float, logits: float, in_flight: float, fragmentation: float,
                   interleave: float) -> float:
    """Bytes the caching allocator reserves that no tensor occupies at a stage's peak: a share
    ``fragmentation`` of the short-lived bytes (the activations of the ``in_flight``
    micro-batches the stage holds, ``activations`` each, and the loss's ``logits`` buffers:
    blocks split and freed in another order than they were made), and a share ``interleave`` of
    the activations of each micro-batch in flight beyond the first (a pipeline's 1F1B frees an
    older micro-batch's activations between a newer one's, and the backward pass's gradients are
    cut from the holes they leave, so freed blocks stay reserved)."""
    return fragmentation * (in_flight * activations + logits) + interleave * max(in_flight - 1.0, 0.0) * activations
