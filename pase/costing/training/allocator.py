"""The three memory figures a device shows, from the memory by kind: what PyTorch allocates, what
its caching allocator reserves, and what the device needs (``nvidia-smi``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["OUTSIDE_ALLOCATOR", "RESERVED_ONLY", "FIGURE_NAMES", "ALLOCATOR_RETRY_SECONDS", "MemoryFigures",
           "memory_figures", "stranded_bytes", "released_within", "retry_seconds", "hold_kinds", "hold_within"]

#: Kinds of device memory PyTorch's caching allocator never sees: the CUDA context and driver
#: state (``reserve``), NCCL's buffers (``comm_buffers``, allocated by NCCL through cuMem) and
#: the tensor-parallel overlap's userbuffers (``tp_overlap_buffers``: multicast memory Transformer
#: Engine allocates itself, transformer_engine/pytorch/csrc/comm_gemm_overlap.h).
#: PyTorch's own out-of-memory message adds them as "non-PyTorch memory"
#: (c10/cuda/CUDACachingAllocator.cpp, v2.6.0, lines 1020 and 1345-1362).
OUTSIDE_ALLOCATOR = ("reserve", "comm_buffers", "tp_overlap_buffers")
#: Kinds the allocator holds in its segments but no tensor occupies: ``max_memory_reserved``
#: counts them, ``max_memory_allocated`` does not.
RESERVED_ONLY = ("fragmentation",)
#: Seconds a step loses for each micro-batch whose peak the caching allocator reaches only by
#: giving its cached blocks back: PyTorch's allocator, when ``cudaMalloc`` fails, synchronises
#: the device, frees every cached segment no tensor occupies (``cudaFree``, each one synchronising)
#: and tries again; the blocks it gave back are ``cudaMalloc``-ed afresh as the next micro-batch
#: needs them (c10/cuda/CUDACachingAllocator.cpp, v2.6.0, lines 1208-1245 and 2859:
#: ``release_cached_blocks``; ``torch.cuda.memory_stats()['num_alloc_retries']`` counts them).
#: Fitted by ``benchmarks/fit_retry.py`` on the Ultra-Scale Playbook's visible runs the model calls
#: "tight": the median of (measured - modelled step) / micro-batches over the four of them
#: (1.10-1.45 s each, whether 2.7 or 12.3 GB were given back); a global constant, not a per-run one.
ALLOCATOR_RETRY_SECONDS = 1.26
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


def stranded_bytes(activations, in_flight, fragmentation: float, interleave: float):
    """Bytes the caching allocator reserves that no tensor occupies at a stage's peak: a share
    ``fragmentation`` of the activations of the ``in_flight`` micro-batches the stage holds
    (``activations`` each: many mid-sized blocks made and freed every micro-batch, split and
    freed in another order than they were made), and a share ``interleave`` of those of each
    micro-batch in flight beyond the first (a pipeline's 1F1B frees an older micro-batch between
    newer ones, and the backward pass's gradients are cut from the holes). The model state is
    allocated once, and the loss's logit-sized buffers are whole segments, reused as they are:
    neither strands memory. Elementwise over arrays of activations and micro-batches in flight."""
    return fragmentation * in_flight * activations + interleave * np.maximum(in_flight - 1.0, 0.0) * activations


def released_within(total: float, stranded: float, cap: float | None) -> float:
    """The stranded bytes the allocator still holds at a peak of ``total`` bytes (``stranded``
    of them) on a device of ``cap``: before it fails an allocation, PyTorch's caching allocator
    frees its cached blocks and tries again (c10/cuda/CUDACachingAllocator.cpp, v2.6.0,
    lines 1208-1245 and 2859: ``release_cached_blocks``), so what no tensor occupies gives way
    to what tensors need. The peak the device needs is then at most ``cap`` whenever the rest
    fits (the allocator's retries cost time: such a plan is "tight"); without a cap, all of it.

    >>> released_within(90.0, 30.0, 80.0)  # 60 needed: 20 of the 30 stranded stay
    20.0
    """
    if cap is None:
        return stranded
    return min(stranded, max(float(cap) - (total - stranded), 0.0))


def retry_seconds(needed, stranded, cap, microbatches: int, seconds: float):
    """Seconds a step loses to the caching allocator's retries (:data:`ALLOCATOR_RETRY_SECONDS`
    each): where what tensors need (``needed``) fits a device of ``cap`` but not with the
    ``stranded`` bytes beside it, every one of the ``microbatches`` reaches its peak by giving
    cached blocks back (:func:`released_within`); 0 where it fits with them, where it does not fit
    at all, and without a cap. Elementwise over arrays.

    >>> float(retry_seconds(70.0, 15.0, 80.0, 4, 1.5))  # 85 > 80 >= 70: four retries
    6.0
    >>> float(retry_seconds(60.0, 15.0, 80.0, 4, 1.5))  # 75 fits: none
    0.0
    """
    needed, stranded = np.asarray(needed, dtype=np.float64), np.asarray(stranded, dtype=np.float64)
    if cap is None or not seconds:
        return np.zeros(np.broadcast(needed, stranded).shape)
    tight = (needed + stranded > cap) & (needed <= cap)
    return np.where(tight, microbatches * seconds, 0.0)


def hold_kinds(kinds: dict, total: float, cap: float | None) -> tuple:
    """``(peak, released)`` of a peak of ``total`` bytes given by ``kinds`` on a device of ``cap``:
    its ``fragmentation`` kind set, in place, to what the allocator holds
    (:func:`released_within`), and the bytes it gives back (0 when none)."""
    stranded = kinds.get("fragmentation", 0.0)
    if not stranded:
        return total, 0.0
    kept = released_within(total, stranded, cap)
    kinds["fragmentation"] = kept
    return total - (stranded - kept), stranded - kept


def hold_within(summary, cap: float | None) -> None:
    """A summary's ``fragmentation`` kind and peak as the allocator holds them on a device of
    ``cap`` (:func:`hold_kinds`); what it gives back as ``extra["released_bytes"]``: retries, a
    "tight" plan."""
    summary.peak_memory_bytes, released = hold_kinds(summary.memory, summary.peak_memory_bytes, cap)
    if released:
        summary.extra["released_bytes"] = released
