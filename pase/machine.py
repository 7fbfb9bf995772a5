"""Machines price the work of a configuration: the reference (paper) machine and the protocol.

Layers describe their work (a per-device GEMM, memory-bound passes, collectives over a group
of devices, redistribution on edges) and ask the machine what it costs. The reference machine
of ``cost-model.md`` answers in FLOP-equivalents; calibrated machines (``machines.md``) answer in
seconds. Layer code never knows which machine it is talking to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Machine", "Group", "layout_strides", "load_machine", "WORD_BYTES", "MEMORY_BOUND_KINDS"]

#: Bytes per word of communication in the reference cost model.
WORD_BYTES = 8

#: The kinds of memory-bound work layers report (``Machine.memory_bound``); a calibrated
#: machine prices each from its measured table or by the bytes it moves.
MEMORY_BOUND_KINDS = ("add", "gelu", "layer_norm", "softmax", "pool", "loss", "copy")


def layout_strides(C: np.ndarray, batch_dim: int) -> np.ndarray:
    """Stride of every iteration-space dimension in the device layout of each configuration.

    A configuration lays its parts on devices ``0, 1, ...`` row-major with the batch dimension
    outermost, then the other dimensions in iteration-space order, the last one innermost
    (``machines.md``, "Placement"). A dimension's stride is the product of the splits placed
    inside it.

    >>> layout_strides(np.array([[2, 4, 2]]), batch_dim=1).tolist()
    [[2, 4, 1]]
    """
    C = np.asarray(C, dtype=np.int64)
    rank = C.shape[1]
    order = [batch_dim] + [d for d in range(rank) if d != batch_dim]
    strides = np.empty_like(C)
    inside = np.ones(len(C), dtype=np.int64)
    for d in reversed(order):
        strides[:, d] = inside
        inside = inside * C[:, d]
    return strides


@dataclass(frozen=True, eq=False)
class Group:
    """The devices that take part in one collective, for every configuration.

    A collective over iteration-space dimensions ``dims`` involves the devices that differ
    only in their coordinates along those dimensions.

    Attributes
    ----------
    sizes : numpy.ndarray
        ``(K, m)``: the splits of the ``m`` dimensions the collective runs over.
    strides : numpy.ndarray
        ``(K, m)``: each dimension's stride in the layer's device layout.

    Examples
    --------
    >>> g = Group(np.array([[4], [2]]), np.array([[4], [1]]))
    >>> g.size.tolist(), g.members_per_node(8).tolist()
    ([4, 2], [2, 2])
    """

    sizes: np.ndarray
    strides: np.ndarray

    @classmethod
    def of(cls, C: np.ndarray, strides: np.ndarray, dims) -> "Group":
        """The group of the dimensions ``dims`` of the configurations ``C``."""
        dims = list(dims)
        return cls(np.asarray(C, dtype=np.int64)[:, dims], np.asarray(strides, dtype=np.int64)[:, dims])

    @classmethod
    def flat(cls, q) -> "Group":
        """``q`` devices (scalar or one per configuration) along one dimension of stride 1."""
        q = np.atleast_1d(np.asarray(q, dtype=np.int64))
        return cls(q[:, None], np.ones_like(q)[:, None])

    @property
    def size(self) -> np.ndarray:
        """``q``: devices in the group (1 where nothing is split)."""
        return self.sizes.prod(axis=1)

    def members_per_node(self, devices_per_node: int) -> np.ndarray:
        """``q_in``: members of the group on one node of ``devices_per_node`` devices.

        Per dimension ``min(c, max(1, g // stride))``, multiplied over the dimensions: the
        whole group when it fits in one node, ``max(1, g // s)`` for one dimension that
        spans nodes (``machines.md``).
        """
        per_dim = np.clip(devices_per_node // self.strides, 1, self.sizes)
        return per_dim.prod(axis=1)


@dataclass(frozen=True)
class Machine:
    """The reference machine of the PaSE paper: peak FLOPS and bandwidth of one device.

    Costs are FLOP-equivalents: FLOPs plus ``rho`` FLOP per element communicated, with
    ``rho = F * 1000 / (B / 8)`` (``cost-model.md``). Every machine answers the same calls
    (``gemm``, ``memory_bound``, ``all_reduce``, ``exchange``, ``redistribute``); this one
    ignores where the devices of a group are.

    Parameters
    ----------
    flops : float
        Peak compute per device in TFLOPS (CLI ``--flops``).
    bw : float
        Peak interconnect bandwidth per device in GB/s (CLI ``--bw``).

    Examples
    --------
    >>> Machine(10.0, 16.0).rho
    5000.0
    >>> float(Machine(10.0, 16.0).all_reduce(8.0, Group.flat(4))[0])
    60000.0
    """

    flops: float = 10.0
    bw: float = 16.0

    name = "paper"
    cost_unit = "flop-equivalents"
    #: No default memory cap: the reference machine says nothing about device memory.
    memory_bytes = None

    def __post_init__(self):
        for field, value in (("flops", self.flops), ("bw", self.bw)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"machine {field} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"machine {field} must be positive and finite, got {value!r}")

    @property
    def rho(self) -> float:
        """FLOP per word: GFLOP/s divided by Gword/s."""
        return (self.flops * 1000.0) / (self.bw / WORD_BYTES)

    def check_procs(self, procs: int) -> None:
        """Every device count is valid on the flat reference machine."""

    def comm(self, words):
        """Cost in FLOP-equivalents of moving ``words`` words (scalar or array)."""
        return self.rho * words

    # The calls layers make ---------------------------------------------------------------

    def gemm(self, B, M, N, K):
        """One training step (forward and two backward products) of ``B`` GEMMs ``M x K x N``."""
        return B * (3.0 * M * N * K)

    def memory_bound(self, kind: str, elements, flops):
        """Memory-bound work: the reference model counts its FLOPs, ``flops``."""
        return flops

    def all_reduce(self, elements, group: Group, grad: bool = False):
        """Ring all-reduce of ``elements`` per device: ``rho * (w / q) * 2 * (q - 1)``.

        Zero when ``q == 1``; the reference model ignores where the devices are and whether
        the tensor is a weight gradient.
        """
        q = group.size.astype(np.float64)
        return self.rho * (np.asarray(elements, dtype=np.float64) / q) * 2.0 * (q - 1.0)

    def exchange(self, elements, group: Group):
        """Point-to-point exchange with the group (halo, hand-over, loss): ``rho * w``, zero
        when the group is one device."""
        return np.where(group.size > 1, self.comm(np.asarray(elements, dtype=np.float64)), 0.0)

    def redistribute(self, elements, procs: int):
        """Redistribution on an edge: ``rho * w`` (the caller passes forward plus backward)."""
        return self.comm(elements)

    def describe(self) -> dict:
        """The machine as used, for the JSON output."""
        return {"name": self.name, "flops": float(self.flops), "bw": float(self.bw), "rho": self.rho}


def load_machine(spec: str = "paper", flops: float | None = None, bw: float | None = None):
    """The machine ``spec`` names: ``"paper"`` (the reference model, tuned by ``flops`` and
    ``bw``), a calibrated preset such as ``"h100-sxm"``, or a machine description file.

    Raises ``ValueError`` with one clear line for an unknown name or a bad description.
    """
    if spec == "paper":
        return Machine(10.0 if flops is None else flops, 16.0 if bw is None else bw)
    if flops is not None or bw is not None:
        raise ValueError(f"--flops and --bw tune the paper machine only; machine {spec!r} has its own figures")
    from .calibrated import load_calibrated  # calibrated machines read measured tables

    return load_calibrated(spec)
