"""The reference machine of the PaSE paper: peak FLOPS and bandwidth per device, costs in
FLOP-equivalents (``docs/cost-model.md``). Calibrated machines (``calibrated.py``) answer the
same calls in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from pase.core.checks import is_number
from pase.core.units import format_cost, format_seconds

from .base import Group

__all__ = ["Machine", "WORD_BYTES"]

#: Bytes per word of communication in the reference cost model.
WORD_BYTES = 8

@dataclass(frozen=True)
class Machine:
    """The reference machine of the PaSE paper: peak FLOPS and bandwidth of one device.

    Costs are FLOP-equivalents: compute with a multiply-add counted once (as in the paper, so a
    GEMM of ``M x N x K`` is ``M N K``, half the usual ``2 M N K`` FLOPs), plus ``rho`` per
    element communicated, with
    ``rho = F * 1000 / (B / 8)`` (``docs/cost-model.md``). Every machine answers the same calls
    (``gemm``, ``memory_bound``, ``all_reduce``, ``exchange``, ``all_to_all``,
    ``redistribute``); this one
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
    #: Nor about peak FLOP/s in the training model's sense, memory bandwidth, attention kernels,
    #: element sizes or nodes (``pase.machines.base.Machine``): every device on one flat network.
    peak_flops = None
    fp8_layouts = "tn"
    hbm_bytes_per_s = None
    attention_efficiency = None
    act_bytes = None
    devices_per_node = None
    nvlink_domain = None
    grad_bytes = None
    clock_ratio = 1.0
    #: The reference machine counts FLOPs alike in every format: it runs only BF16 plans, and
    #: states no peak in the training model's sense.
    precisions = ("bf16",)
    #: Nothing fitted: the reference model is the paper's.
    fitted = None
    notes = ()
    dtype_flops = MappingProxyType({})

    def __post_init__(self):
        for field, value in (("flops", self.flops), ("bw", self.bw)):
            if not is_number(value):
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

    def all_gather(self, elements, group: Group, grad: bool = False):
        """Half the ring all-reduce (a ring all-reduce is a reduce-scatter then an all-gather)."""
        return 0.5 * self.all_reduce(elements, group, grad)

    def reduce_scatter(self, elements, group: Group, grad: bool = False):
        """Half the ring all-reduce, as :meth:`all_gather`."""
        return 0.5 * self.all_reduce(elements, group, grad)

    def send_recv(self, elements, group: Group):
        """A send to a peer: the exchange, ``rho * w``."""
        return self.exchange(elements, group)

    def exchange(self, elements, group: Group):
        """Point-to-point exchange with the group (halo, hand-over, loss): ``rho * w``, zero
        when the group is one device."""
        return np.where(group.size > 1, self.comm(np.asarray(elements, dtype=np.float64)), 0.0)

    def all_to_all(self, elements, group: Group):
        """All-to-all of ``elements`` per device: it sends all but its own ``1/q``,
        ``rho * w * (q - 1) / q``; zero when ``q == 1``."""
        q = group.size.astype(np.float64)
        return self.rho * np.asarray(elements, dtype=np.float64) * (q - 1.0) / q

    def redistribute(self, elements, procs: int):
        """Redistribution on an edge: ``rho * w`` (the caller passes forward plus backward)."""
        return self.comm(elements)

    def describe(self) -> dict:
        """The machine as used, for the JSON output."""
        return {"name": self.name, "flops": float(self.flops), "bw": float(self.bw), "rho": self.rho}

    # How outputs show it (the protocol's presentation part) ------------------------------

    #: Cost columns: scientific notation, no unit suffix; the sweep header's unit.
    cost_suffix = ""
    sweep_unit = "FLOP-equivalents"

    def header_line(self) -> str:
        return (f"machine {self.name}: {self.flops:g} TFLOPS and {self.bw:g} GB/s per device "
                f"(rho = {self.rho:g} FLOP per 8-byte word)")

    def unit_line(self) -> str:
        return ("costs in FLOP-equivalents: compute (a multiply-add counts 1, as in the paper) plus rho x words "
                "communicated, per device and training step")

    def cost_cell(self, cost: float) -> str:
        return format_cost(cost)

    def cost_text(self, cost: float) -> str:
        """A total with the time it takes one device doing ``flops`` T FLOP-equivalents per second
        (multiply-adds, not FLOPs: twice the time at ``flops`` TFLOPS counted the usual way)."""
        seconds = format_seconds(cost / (self.flops * 1e12))
        return f"{format_cost(cost)} FLOP-equivalents ({seconds} at {self.flops:g}e12 FLOP-equivalents/s)"

    def json_keys(self) -> dict:
        """Top-level keys of the JSON output besides ``machine`` (kept from the first format)."""
        return {"flops": float(self.flops), "bw": float(self.bw)}
