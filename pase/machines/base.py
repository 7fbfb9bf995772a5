"""What every machine shares: the ``Machine`` protocol that layers price their work with,
the ``Group`` of devices a collective runs over, and the device layout of a configuration.

Layers describe their work (``pase.model.layers.work``: GEMMs, memory-bound passes,
collectives), and each piece of it is priced by one call of this protocol; layer code never
knows which machine it talks to (``docs/machines.md``). A machine kind is one module
implementing the protocol plus one entry in ``pase.machines.registry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Machine", "Group", "layout_strides", "MEMORY_BOUND_KINDS"]

#: The kinds of memory-bound work layers report (``Machine.memory_bound``); a calibrated
#: machine prices each from its measured table or by the bytes it moves.
MEMORY_BOUND_KINDS = ("add", "gelu", "layer_norm", "softmax", "pool", "loss", "copy")


def layout_strides(C: np.ndarray, batch_dim: int) -> np.ndarray:
    """Stride of every iteration-space dimension in the device layout of each configuration.

    A configuration lays its parts on devices ``0, 1, ...`` row-major with the batch dimension
    outermost, then the other dimensions in iteration-space order, the last one innermost
    (``docs/machines.md``, "Placement"). A dimension's stride is the product of the splits placed
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
    #: ``(K,)``: devices each configuration uses, where known (a machine whose NVLink domain
    #: holds several nodes places them on domains by it: ``pase.machines.specs.Domain``).
    devices: np.ndarray | None = None

    @classmethod
    def of(cls, C: np.ndarray, strides: np.ndarray, dims) -> "Group":
        """The group of the dimensions ``dims`` of the configurations ``C``."""
        dims = list(dims)
        C = np.asarray(C, dtype=np.int64)
        return cls(C[:, dims], np.asarray(strides, dtype=np.int64)[:, dims], C.prod(axis=1))

    @classmethod
    def flat(cls, q) -> "Group":
        """``q`` devices (scalar or one per configuration) along one dimension of stride 1."""
        q = np.atleast_1d(np.asarray(q, dtype=np.int64))
        return cls(q[:, None], np.ones_like(q)[:, None], q)

    @property
    def size(self) -> np.ndarray:
        """``q``: devices in the group (1 where nothing is split)."""
        return self.sizes.prod(axis=1)

    def members_per_node(self, devices_per_node: int) -> np.ndarray:
        """``q_in``: members of the group on one node of ``devices_per_node`` devices.

        Per dimension ``min(c, max(1, g // stride))``, multiplied over the dimensions: the
        whole group when it fits in one node, ``max(1, g // s)`` for one dimension that
        spans nodes (``docs/machines.md``).
        """
        per_dim = np.clip(devices_per_node // self.strides, 1, self.sizes)
        return per_dim.prod(axis=1)



@runtime_checkable
class Machine(Protocol):
    """What a machine answers. Costs are arrays with one entry per configuration, in the
    machine's ``cost_unit`` (``"flop-equivalents"`` or ``"seconds"``)."""

    name: str
    cost_unit: str
    #: Device memory in bytes, the default ``--memory`` cap; ``None`` when the machine has none.
    memory_bytes: float | None
    # What the training model (``pase.costing.training``, ``pase.planning``) reads besides the
    # prices; ``None`` where a machine states none (the paper's reference machine).
    #: Peak dense FLOP/s of one device (MFU, fused attention).
    peak_flops: float | None
    #: Device memory bandwidth in bytes/s (the optimizer step).
    hbm_bytes_per_s: float | None
    #: Fraction of the peak a fused attention kernel reaches.
    attention_efficiency: float | None
    #: Bytes of an activation element (the ``--act-bytes`` default).
    act_bytes: float | None
    #: Devices of one node; ``None``: one flat network.
    devices_per_node: int | None
    #: Devices of one NVLink domain (tensor, expert and context parallelism at NVLink speed
    #: inside it; the node on HGX machines, 72 on an NVL72 rack); ``None``: one flat network.
    nvlink_domain: int | None
    #: Bytes of a weight-gradient element as the machine's collectives are priced.
    grad_bytes: float | None
    #: The clock a device sustains through a training step over the clock its measured
    #: kernels ran at (1 where none is stated).
    clock_ratio: float
    #: Number formats the device runs GEMMs in (``pase.machines.specs.DTYPES`` order).
    precisions: tuple
    #: The operand layouts its per-tensor FP8 GEMMs take (``pase.machines.specs``
    #: ``fp8_layouts``: ``tn``, a transposed copy kept beside each operand, or ``any``).
    fp8_layouts: str
    #: Constants fitted on the cluster's own runs (``pase.machines.fitted``), or ``None``.
    fitted: dict | None
    #: Lines the command line says of the machine with an answer (a description it doubts).
    notes: tuple
    #: Dense peak FLOP/s of one device per number format of ``precisions`` (``bf16`` is
    #: ``peak_flops``): the peak a plan's MFU in its own format is against; empty where none is stated.
    dtype_flops: dict

    def check_procs(self, procs: int) -> None:
        """Raise ``ValueError`` for a device count this machine cannot hold."""

    def gemm(self, B, M, N, K):
        """One training step (forward and two backward products) of ``B`` GEMMs ``M x K x N``.

        A machine with per-format peaks (``precisions`` beyond ``("bf16",)``) also takes
        ``dtype=`` one of them (``pase.machines.specs.DTYPES``)."""

    def memory_bound(self, kind: str, elements, flops):
        """Memory-bound work of ``kind`` (one of ``MEMORY_BOUND_KINDS``) over ``elements``."""

    def all_reduce(self, elements, group: Group, grad: bool = False):
        """An all-reduce of ``elements`` per device over ``group``."""

    def all_gather(self, elements, group: Group, grad: bool = False):
        """An all-gather of ``elements`` per device (its output) over ``group``."""

    def reduce_scatter(self, elements, group: Group, grad: bool = False):
        """A reduce-scatter of ``elements`` per device (its input) over ``group``."""

    def exchange(self, elements, group: Group):
        """A point-to-point exchange of ``elements`` with the group."""

    def send_recv(self, elements, group: Group):
        """One send of ``elements`` per device to the other member of a pair (pipeline stages)."""

    def all_to_all(self, elements, group: Group):
        """An all-to-all of ``elements`` per device over ``group`` (each keeps ``1/q`` of them)."""

    def redistribute(self, elements, procs):
        """Redistributing ``elements`` on an edge among ``procs`` devices: the devices the
        exchange spans (``pase.model.builder.exchange_devices``), an int or an array that
        broadcasts against ``elements``."""

    def describe(self) -> dict:
        """The machine as used, for the JSON output."""

    # How outputs show the machine and its costs: pase.outputs asks, never branches on the unit.

    cost_suffix: str  # after the cost columns' headers, " ms" or ""
    sweep_unit: str  # the unit named in the sweep's header

    def header_line(self) -> str:
        """``machine NAME: ...``: the machine in one line, after the devices and batch."""

    def unit_line(self) -> str:
        """The line under the header that says what a cost is."""

    def cost_cell(self, cost: float) -> str:
        """A cost in a table cell."""

    def cost_text(self, cost: float) -> str:
        """A total in the summary lines, in words."""

    def json_keys(self) -> dict:
        """Top-level keys of the JSON output next to ``"machine"`` (the paper machine's rates)."""
