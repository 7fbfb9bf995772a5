"""Calibrated machines: measured compute and a cluster of nodes, costs in seconds.

A description (a JSON file or a shipped preset, ``docs/machines.md``) gives the device's tables
and its node's links; :class:`CalibratedMachine` prices GEMMs, memory-bound work and
collectives over device groups with it, through the same protocol as the paper machine.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Mapping

import numpy as np

from pase.core.checks import is_int, is_positive_int
from pase.machines.base import MEMORY_BOUND_KINDS
from pase.machines.collectives import CollectiveTables, published_all_reduce, validate_collectives
from pase.machines.fitted import validate_fitted
from pase.core.fileio import read_json
from pase.core.units import format_seconds
from pase.machines.measured import ELEMENT_TRAFFIC, MeasuredTables
from pase.machines.specs import DTYPES, SPEC_FIELDS, Domain, GemmTransfer, clock_ratio_of, validate_spec_fields

__all__ = [
    "CalibratedMachine", "GIB", "MEMORY_FIELDS", "memory_bytes_of", "memory_label", "PRESETS", "PRESET_TABLES", "MACHINE_NAMES", "load_description", "load_calibrated",
    "validate_description",
]

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

#: Shipped descriptions. ``h100-sxm`` is exactly the example of ``docs/machines.md``.
PRESETS = {
    "h100-sxm": {
        "name": "h100-sxm",
        "devices_per_node": 8,
        "memory_gib": 79.65,
        "peak_tflops": 989,
        "hbm_gbps": 3350,
        "intra_node": {"gbps": 450, "latency_us": 3},
        "inter_node": {"gbps": 50, "latency_us": 10},
        "act_bytes": 2,
        "grad_bytes": 4,
        "measured": "h100-sxm-measured.json",
        # Its clock_ratio comes from data/presets.json's clock_mhz by specs.clock_ratio_of: a step
        # at its 700 W limit holds about the base clock, 1590 MHz; the measured table's isolated
        # GEMMs (CUDA-graph replay, best of 3) ran at its maximum boost, 1980 MHz: 1590 / 1980.
    },
}
# The presets from public specifications (``data/presets.json``: every figure with its source;
# ``h100-sxm`` gains its per-dtype peaks, domain and sources there and keeps its measured table).
for _name, _spec in read_json(os.path.join(DATA_DIR, "presets.json"), "machine presets")["presets"].items():
    PRESETS[_name] = {**PRESETS.get(_name, {}), **_spec}
del _name, _spec
#: ``h100-sxm`` with all-reduces priced from published NCCL bus bandwidths (NVLink 4 inside a
#: node, a 400 Gb/s NIC per GPU across nodes; ``collectives.published_all_reduce`` names the
#: figures and their sources) instead of its links. Opt-in: ``h100-sxm`` stays as documented.
PRESETS["h100-sxm-nccl"] = dict(PRESETS["h100-sxm"], name="h100-sxm-nccl",
                                collectives={"all_reduce": published_all_reduce()})

#: Where each preset's measured table is shipped (package data).
PRESET_TABLES = {name: os.path.join(DATA_DIR, d["measured"]) for name, d in PRESETS.items() if "measured" in d}

#: Every name ``--machine`` accepts besides a file: the reference model, then the presets.
MACHINE_NAMES = ("paper",) + tuple(PRESETS)

_LINK_FIELDS = ("gbps", "latency_us")
_REQUIRED = ("name", "devices_per_node", "memory_gb", "peak_tflops", "hbm_gbps", "intra_node", "inter_node",
             "act_bytes", "grad_bytes")
#: The device's memory: ``memory_gb`` in GB of 1e9 bytes, or ``memory_gib`` in GiB of 2**30 bytes,
#: as the driver reports it (``nvidia-smi``'s total, ``torch.cuda.get_device_properties(0).total_memory``):
#: a datasheet's "80 GB" counts HBM stacks sized in GiB (the H100's driver shows 79.65 GiB). A
#: description gives exactly one of the two.
MEMORY_FIELDS = ("memory_gb", "memory_gib")
GIB = float(2**30)
#: Optional fields: the fraction of peak a fused attention kernel reaches (a number; absent:
#: ``pase.costing.training.DEFAULT_ATTENTION_EFFICIENCY``), the measured table (path relative
#: to the file), measured NCCL bus bandwidths (``pase.machines.collectives``), and free text that
#: ``pase calibrate`` writes (the device it measured, how).
_OPTIONAL = ("memory_gib", "attention_efficiency", "clock_ratio", "measured", "collectives", "device", "notes",
             "fitted") + SPEC_FIELDS
#: The optional fields that are text.
_TEXT_FIELDS = ("measured", "device", "notes")


#: Range of every rate and size of a description (GB, TFLOPS, GB/s), and of the latencies
#: (microseconds) and element sizes (bytes): far beyond real hardware either way, yet every
#: cost stays finite in float64 (a rate of 5e-324 GB/s made costs overflow to infinity).
RATE_RANGE = (1e-6, 1e9)
MAX_LATENCY_US = 1e9
MAX_ELEMENT_BYTES = 1e6
#: Smallest element size: a sixteenth of a byte, below any number format (4-bit formats are
#: half a byte); a size near zero made the gradient's bytes over the machine's a division by it.
MIN_ELEMENT_BYTES = 1.0 / 16
#: Most devices per node (the command line's largest device count).
MAX_DEVICES_PER_NODE = 2**20


def _in_range(source: str, field: str, value, low: float | None, high) -> None:
    if low is not None and value < low:
        raise ValueError(f"{source}: {field} must be at least {low:g}, got {value!r}")
    if value > high:
        shown = f"{high:g}" if isinstance(high, float) else str(high)
        raise ValueError(f"{source}: {field} must be at most {shown}, got {_shown(value)}")


def _number(value) -> bool:
    # An int is finite however long (math.isfinite of 10**400 raises OverflowError).
    return is_int(value) or isinstance(value, float) and math.isfinite(value)


def _shown(value) -> str:
    """A value for a message, a long number shortened."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def validate_description(data, source: str = "machine description") -> dict:
    """Check a description and return a clean copy; a ``ValueError`` names the bad field.

    Parameters
    ----------
    data : mapping
        The fields of ``docs/machines.md``: ``name``, ``devices_per_node``, ``memory_gb``,
        ``peak_tflops``, ``hbm_gbps``, ``intra_node`` and ``inter_node`` (each ``gbps``
        and ``latency_us``), ``act_bytes``, ``grad_bytes``; optional ``measured``,
        ``device``, ``notes``, ``attention_efficiency`` (in (0, 1]), ``collectives``
        (:func:`pase.machines.collectives.validate_collectives`).
    source : str
        How messages name the description (``"machine file x.json"``).

    Examples
    --------
    >>> d = dict(PRESETS["h100-sxm"], inter_node={"gbps": -5, "latency_us": 10})
    >>> validate_description(d, "machine file x.json")
    Traceback (most recent call last):
    ...
    ValueError: machine file x.json: inter_node.gbps must be a positive number, got -5
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a JSON object of machine fields, got {type(data).__name__}")
    unknown = [k for k in data if k not in _REQUIRED + _OPTIONAL]
    if unknown:
        raise ValueError(f"{source}: unknown field {unknown[0]!r} (fields: {', '.join(_REQUIRED + _OPTIONAL)})")
    given = [f for f in MEMORY_FIELDS if f in data]
    if len(given) > 1:
        raise ValueError(f"{source}: give memory_gb (1e9 bytes) or memory_gib (2**30 bytes), not both")
    for field in _REQUIRED:
        if field not in data and not (field == "memory_gb" and given):
            raise ValueError(f"{source}: missing field {field!r}"
                             + (" (or 'memory_gib', GiB as the driver reports)" if field == "memory_gb" else ""))
    out = {}
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{source}: name must be a non-empty string, got {name!r}")
    out["name"] = name
    g = data["devices_per_node"]
    if not is_positive_int(g):
        raise ValueError(f"{source}: devices_per_node must be a positive integer, got {g!r}")
    _in_range(source, "devices_per_node", g, None, MAX_DEVICES_PER_NODE)
    out["devices_per_node"] = g
    for field in (given[0] if given else "memory_gb", "peak_tflops", "hbm_gbps"):
        v = data[field]
        if not _number(v) or v <= 0:
            raise ValueError(f"{source}: {field} must be a positive number, got {v!r}")
        _in_range(source, field, v, *RATE_RANGE)
        out[field] = v
    for field in ("intra_node", "inter_node"):
        link = data[field]
        if not isinstance(link, Mapping):
            raise ValueError(f"{source}: {field} must be an object {{\"gbps\": ..., \"latency_us\": ...}}, got {link!r}")
        extra = [k for k in link if k not in _LINK_FIELDS]
        if extra:
            raise ValueError(f"{source}: unknown field {field}.{extra[0]} (fields: gbps, latency_us)")
        for sub in _LINK_FIELDS:
            if sub not in link:
                raise ValueError(f"{source}: missing field {field}.{sub}")
        if not _number(link["gbps"]) or link["gbps"] <= 0:
            raise ValueError(f"{source}: {field}.gbps must be a positive number, got {link['gbps']!r}")
        if not _number(link["latency_us"]) or link["latency_us"] < 0:
            raise ValueError(f"{source}: {field}.latency_us must be a non-negative number, got {link['latency_us']!r}")
        _in_range(source, f"{field}.gbps", link["gbps"], *RATE_RANGE)
        _in_range(source, f"{field}.latency_us", link["latency_us"], None, MAX_LATENCY_US)
        out[field] = {"gbps": link["gbps"], "latency_us": link["latency_us"]}
    for field in ("act_bytes", "grad_bytes"):
        v = data[field]
        if not _number(v) or v <= 0:
            raise ValueError(f"{source}: {field} must be a positive number of bytes per element, got {v!r}")
        _in_range(source, field, v, MIN_ELEMENT_BYTES, MAX_ELEMENT_BYTES)
        out[field] = v
    for field, meaning in (("attention_efficiency", "the fraction of peak_tflops a fused attention kernel reaches"),
                           ("clock_ratio", "the clock sustained through a training step over the clock the measured "
                                           "table ran at")):
        if field in data:
            v = data[field]
            if isinstance(v, bool) or not _number(v) or not 0 < v <= 1:
                raise ValueError(f"{source}: {field} must be a number in (0, 1] ({meaning}), got {_shown(v)}")
            out[field] = v
    if "collectives" in data:
        out["collectives"] = validate_collectives(data["collectives"], g, source)
    if "fitted" in data:
        out["fitted"] = validate_fitted(data["fitted"], source)
    out.update(validate_spec_fields(data, source, set(PRESET_TABLES)))
    if "gemm_reference" in out and "measured" in data:
        raise ValueError(f"{source}: gemm_reference carries another machine's table over; this machine has its own "
                         f"(measured): give one of them")
    for field in _TEXT_FIELDS:
        if field in data:
            v = data[field]
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"{source}: {field} must be a non-empty string, got {v!r}")
            out[field] = v
    return out


def memory_bytes_of(description: Mapping) -> float:
    """The device memory of a validated description in bytes (``memory_gib`` x 2**30 or
    ``memory_gb`` x 1e9).

    >>> memory_bytes_of({"memory_gib": 79.65}), memory_bytes_of({"memory_gb": 80})
    (85523536281.6, 80000000000.0)
    """
    if "memory_gib" in description:
        return float(description["memory_gib"]) * GIB
    return float(description["memory_gb"]) * 1e9


def memory_label(description: Mapping) -> str:
    """The device memory as the description states it: ``79.65 GiB`` or ``80 GB``."""
    if "memory_gib" in description:
        return f"{description['memory_gib']:g} GiB"
    return f"{description['memory_gb']:g} GB"


def _source_of(name_or_path: str) -> tuple:
    """``(kind, label)``: ``("preset", name)`` or ``("file", path)``; ``ValueError`` otherwise."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"machine must be a preset name ({', '.join(MACHINE_NAMES)}) or a JSON file, got {name_or_path!r}")
    if name_or_path in PRESETS:
        return "preset", name_or_path
    if os.path.exists(name_or_path) or name_or_path.endswith(".json") or os.sep in name_or_path:
        return "file", name_or_path
    raise ValueError(f"unknown machine {name_or_path!r}: not a preset ({', '.join(MACHINE_NAMES)}) and not a file")


def _read_file(path: str) -> dict:
    # read_json turns every unreadable, malformed or hostile file into one InputError line (a
    # ValueError, like every invalid description: a bad --machine, exit 2).
    return validate_description(read_json(path, "machine file"), f"machine file {os.path.basename(path)}")


def load_description(name_or_path: str) -> dict:
    """The checked description of a preset or a JSON file (``measured`` as written there).

    >>> load_description("h100-sxm")["inter_node"]
    {'gbps': 50, 'latency_us': 10}
    """
    kind, label = _source_of(name_or_path)
    if kind == "preset":
        return validate_description(PRESETS[label], f"machine {label}")
    return _read_file(label)


def load_calibrated(name_or_path: str) -> "CalibratedMachine":
    """The calibrated machine of a preset name or a description file (``docs/machines.md``).

    ``pase.load_machine`` calls it for every name but ``paper``. A description's
    ``measured`` table is read relative to the file.

    >>> m = load_calibrated("h100-sxm")
    >>> m.cost_unit, m.devices_per_node, m.memory_bytes
    ('seconds', 8, 85523536281.6)
    """
    kind, label = _source_of(name_or_path)
    if kind == "preset":
        tables = MeasuredTables.load(PRESET_TABLES[label]) if label in PRESET_TABLES else None
        return CalibratedMachine(PRESETS[label], tables, f"machine {label}")
    description = _read_file(label)
    tables = None
    if "measured" in description:
        table_path = os.path.join(os.path.dirname(os.path.abspath(label)), description["measured"])
        if not os.path.isfile(table_path):
            raise ValueError(
                f"machine file {os.path.basename(label)}: measured table {description['measured']!r} not found "
                f"(looked for {table_path}; the path is relative to the machine file)"
            )
        tables = MeasuredTables.load(table_path)
    return CalibratedMachine(description, tables, f"machine file {os.path.basename(label)}")


class CalibratedMachine:
    """A device of measured speed in a cluster of nodes; every cost in seconds.

    Implements the machine protocol that layers call (``docs/machines.md``): ``gemm`` /
    ``gemm_seconds``, ``memory_bound``, ``all_reduce`` and ``exchange`` over a device
    group, ``redistribute`` on an edge. Arguments broadcast, one entry per configuration.

    Parameters
    ----------
    description : mapping
        The machine's fields (:func:`validate_description`).
    tables : MeasuredTables, optional
        Measured GEMM and memory-bound times. Without them, a GEMM costs
        ``6 BMNK / peak`` and memory-bound work its bytes over ``hbm_gbps``.
    source : str
        How error messages name the machine.

    Examples
    --------
    >>> m = CalibratedMachine(dict(PRESETS["h100-sxm"], peak_tflops=1000))  # no table
    >>> float(m.gemm_seconds(1, 1000, 1000, 1000))   # 6e9 FLOP at 1e15 FLOP/s
    6e-06
    """

    cost_unit = "seconds"

    def __init__(self, description: Mapping, tables: MeasuredTables | None = None, source: str = "machine description"):
        d = validate_description(description, source)
        self._description = d
        self.tables = tables
        self.source = source
        self.name = d["name"]
        self.devices_per_node = d["devices_per_node"]
        self.memory_bytes = memory_bytes_of(d)
        self.peak_flops = float(d["peak_tflops"]) * 1e12
        self.hbm_bytes_per_s = float(d["hbm_gbps"]) * 1e9
        self.b_in = float(d["intra_node"]["gbps"]) * 1e9
        self.a_in = float(d["intra_node"]["latency_us"]) * 1e-6
        self.b_out = float(d["inter_node"]["gbps"]) * 1e9
        self.a_out = float(d["inter_node"]["latency_us"]) * 1e-6
        self.act_bytes = float(d["act_bytes"])
        self.grad_bytes = float(d["grad_bytes"])
        #: Fraction of peak the fused attention kernel reaches (``None``: the costing's default).
        self.attention_efficiency = (float(d["attention_efficiency"]) if "attention_efficiency" in d else None)
        #: The clock a training step sustains at the power limit over the clock of the measured
        #: table (1: as measured); the training model slows a step's kernels by it
        #: (``pase.costing.training``), kernels measured alone keep the table's times.
        #: Stated, or by the one rule from ``clock_mhz`` (:func:`pase.machines.specs.clock_ratio_of`).
        self.clock_ratio = float(d["clock_ratio"]) if "clock_ratio" in d else (clock_ratio_of(d.get("clock_mhz")) or 1.0)
        #: Measured NCCL bus bandwidths (``None``: every collective from the links).
        self.collectives = (CollectiveTables(d["collectives"], latency=self._ring_latency)
                            if "collectives" in d else None)
        #: What ``pase calibrate --from-runs`` fitted on the cluster's own runs
        #: (``pase.machines.fitted``): collectives scaled by level here, the engine's in-step
        #: compute efficiency and host overhead in its options; ``None`` without a fit.
        self.fitted = d.get("fitted")
        #: What the command line says of the description with an answer (one line each).
        self.notes = ()
        if source.startswith("machine file") and "clock_ratio" not in d and clock_ratio_of(d.get("clock_mhz")) is None:
            self.notes = (f"{source} states no sustained clock (clock_mhz with a base or sustained clock, or "
                          "clock_ratio): its GEMMs are priced at the clock its table was measured at, which a "
                          "training step at the power limit does not hold (docs/machines.md, clock_mhz)",)
        #: Dense peak FLOP/s per number format (``bf16`` is ``peak_tflops``) and the formats
        #: the device runs GEMMs in, in ``DTYPES`` order.
        self.dtype_flops = {"bf16": self.peak_flops,
                            **{k: float(v) * 1e12 for k, v in d.get("dtype_tflops", {}).items()}}
        self.precisions = tuple(k for k in DTYPES if k in self.dtype_flops)
        self.fp8_layouts = d.get("fp8_layouts", "tn")
        #: GPUs of one NVLink domain (the node unless the description says more) and the levels.
        self.nvlink_domain = int(d.get("nvlink_domain", self.devices_per_node))
        self.levels = Domain(self.nvlink_domain, self.devices_per_node)
        #: The rule that prices GEMMs from a measured table at another rate or format
        #: (``specs.GemmTransfer``): the reference preset's table for a machine without one
        #: (``gemm_reference``), the machine's own for its other formats.
        self.reference = None
        self.transfer = None
        if "gemm_reference" in d and tables is None:
            ref = validate_description(PRESETS[d["gemm_reference"]], f"machine {d['gemm_reference']}")
            self.reference = d["gemm_reference"]
            self.transfer = GemmTransfer(MeasuredTables.load(PRESET_TABLES[self.reference]),
                                         float(ref["peak_tflops"]) * 1e12, float(ref["hbm_gbps"]) * 1e9,
                                         ref["sms"], self.dtype_flops, self.hbm_bytes_per_s, d["sms"])
        elif tables is not None:
            self.transfer = GemmTransfer(tables, self.peak_flops, self.hbm_bytes_per_s, 1, self.dtype_flops,
                                         self.hbm_bytes_per_s, 1)

    def with_fitted(self, fitted: dict | None) -> "CalibratedMachine":
        """This machine with ``fitted`` constants (``pase.machines.fitted``; ``None``: none)."""
        d = {k: v for k, v in self._description.items() if k != "fitted"}
        if fitted is not None:
            d["fitted"] = fitted
        return CalibratedMachine(d, self.tables, self.source)

    def __repr__(self) -> str:
        table = "measured" if self.tables is not None else "peak only"
        return f"CalibratedMachine({self.name!r}, {self.devices_per_node} per node, {table})"

    def describe(self) -> dict:
        """The description as used (JSON-able), for the JSON ``"machine"`` key."""
        return copy.deepcopy(self._description)

    # How outputs show it (the protocol's presentation part) ------------------------------

    #: Cost columns: milliseconds; the sweep header's unit.
    cost_suffix = " ms"
    sweep_unit = "seconds per training step (shown in ms)"

    def header_line(self) -> str:
        d = self._description
        if self.nvlink_domain > self.devices_per_node:
            where = (f"{d['devices_per_node']} devices per node, NVLink domains of {self.nvlink_domain}, "
                     f"{memory_label(d)} each; {d['intra_node']['gbps']:g} GB/s inside a domain, "
                     f"{d['inter_node']['gbps']:g} GB/s between domains; ")
        else:
            where = (f"{d['devices_per_node']} devices per node, {memory_label(d)} each; "
                     f"{d['intra_node']['gbps']:g} GB/s inside a node, {d['inter_node']['gbps']:g} GB/s between nodes; ")
        return (
            f"machine {d['name']}: " + where
            + ("measured compute" if d.get("measured") else
               f"GEMMs at {d['peak_tflops']:g} TFLOPS peak, carried over from {self.reference}'s measured table"
               if self.reference else f"compute at {d['peak_tflops']:g} TFLOPS peak")
            + (f"; NCCL bus bandwidths for {', '.join(self.collectives.kinds)}" if self.collectives else "")
        )

    def unit_line(self) -> str:
        compute = ("measured compute" if self._description.get("measured") else
                   f"compute carried over from {self.reference}'s measured table" if self.reference else
                   "compute at peak FLOP/s")
        return f"costs in seconds per training step (shown in ms): {compute}, collectives over the devices' nodes"

    def cost_cell(self, cost: float) -> str:
        return f"{1e3 * cost:.4f}"

    def cost_text(self, cost: float) -> str:
        return f"{format_seconds(cost)} per training step"

    def json_keys(self) -> dict:
        return {}

    def check_procs(self, procs) -> None:
        """``ValueError`` unless ``procs`` fits the nodes: at most one NVLink domain (one node
        where the domain is the node), or whole nodes."""
        g = self.devices_per_node
        if not is_positive_int(procs, numpy=True):
            raise ValueError(f"the device count must be a positive integer, got {procs!r}")
        if procs > self.nvlink_domain and procs % g:
            raise ValueError(
                f"{procs} devices do not fill whole nodes of {g} on machine {self.name}: "
                f"use at most {self.nvlink_domain} or a multiple of {g}"
            )

    # -- compute ------------------------------------------------------------------------

    def gemm_seconds(self, B, M, N, K, dtype: str = "bf16") -> np.ndarray:
        """Seconds of one training step (forward and two backward products) of ``B`` GEMMs.

        Each GEMM multiplies ``M x K`` by ``K x N`` on one device. From the measured table
        where there is one (interpolated, ``pase.machines.measured``), never below the
        ``6 BMNK / peak`` a device cannot beat; that bound alone without a table. ``dtype``
        (one of :attr:`precisions`): the operands' number format; another than ``bf16`` from the
        table's rows measured in that format where it has them (``gemm_fp8``: ``pase calibrate
        --dtype fp8``), else, like every GEMM of a machine with a ``gemm_reference``, by the
        transfer rule (:class:`pase.machines.specs.GemmTransfer`) at that format's peak.
        """
        if dtype not in self.dtype_flops:
            raise ValueError(f"machine {self.name} has no {dtype} GEMMs (it runs {', '.join(self.precisions)})")
        B, M, N, K = np.broadcast_arrays(*[np.asarray(x, dtype=np.float64) for x in (B, M, N, K)])
        peak_time = 6.0 * B * M * N * K / self.dtype_flops[dtype]
        if dtype != "bf16" and self.tables is not None and dtype in self.tables.by_dtype:
            # Measured in the format itself (pase calibrate --dtype): the table, not the rule.
            return np.maximum(self.tables.by_dtype[dtype].gemm_seconds(B, M, N, K), peak_time)
        if self.transfer is not None and (dtype != "bf16" or self.tables is None):
            return np.maximum(self.transfer.gemm_seconds(B, M, N, K, dtype), peak_time)
        if self.tables is None:
            for name, a in zip("BMNK", (B, M, N, K)):
                bad = ~np.isfinite(a) | (a <= 0)
                if bad.any():
                    raise ValueError(f"gemm_seconds: {name} must be positive and finite, got {a[bad].flat[0]!r}")
            return peak_time
        return np.maximum(self.tables.gemm_seconds(B, M, N, K), peak_time)

    gemm = gemm_seconds

    def memory_bound(self, kind: str, elements, flops=None) -> np.ndarray:
        """Seconds of the forward and backward of memory-bound work on ``elements`` elements.

        ``kind`` is one of :data:`pase.machines.paper.MEMORY_BOUND_KINDS`. A kind the table
        measured: its interpolated time. Another kind (``pool``, ``loss``, ``copy`` with
        the shipped table): its traffic (:data:`pase.machines.measured.ELEMENT_TRAFFIC`) at the
        best rate the table reaches at that size; without a table, bytes over
        ``hbm_gbps``. ``flops`` (the reference model's count) is ignored.
        """
        if kind not in MEMORY_BOUND_KINDS:
            raise ValueError(f"unknown memory-bound kind {kind!r}; one of: {', '.join(MEMORY_BOUND_KINDS)}")
        if self.tables is not None and kind in self.tables.kinds:
            return self.tables.memory_bound_seconds(kind, elements)
        if self.tables is not None and self.tables.kinds:
            return self.tables.streaming_seconds(ELEMENT_TRAFFIC[kind], elements)
        if self.reference is not None:  # the reference's measured time at this machine's bandwidth
            ref = self.transfer.tables
            seconds = (ref.memory_bound_seconds(kind, elements) if kind in ref.kinds
                       else ref.streaming_seconds(ELEMENT_TRAFFIC[kind], elements))
            return self.transfer.memory_seconds(seconds)
        e = np.asarray(elements, dtype=np.float64)
        bad = ~np.isfinite(e) | (e < 0)
        if bad.any():
            raise ValueError(f"memory-bound work: elements must be non-negative and finite, got {e[bad].flat[0]!r}")
        return ELEMENT_TRAFFIC[kind] * e * self.act_bytes / self.hbm_bytes_per_s

    # -- communication ------------------------------------------------------------------

    def _split(self, group) -> tuple:
        """``(q, q_in, q_out)`` per configuration: group size, members per node, nodes."""
        q = np.asarray(group.size, dtype=np.float64)
        q_in = np.minimum(np.asarray(self.levels.members(group), dtype=np.float64), q)
        q_in = np.maximum(q_in, 1.0)
        return q, q_in, q / q_in

    def all_reduce(self, elements, group, grad: bool = False) -> np.ndarray:
        """Ring all-reduce of ``elements`` elements per device over ``group`` (seconds).

        ``n = elements * (grad_bytes if grad else act_bytes)`` bytes. Reduce-scatter
        inside each node, all-reduce of the ``n / q_in`` shard across the ``q_out``
        nodes, all-gather inside the node (``docs/machines.md``)::

            2 (q_in-1)/q_in  n / B_in  + 2 (q_in-1) a_in
          + 2 (q_out-1)/q_out (n/q_in) / B_out + 2 (q_out-1) a_out

        which is the one-node ring ``2 (q-1)/q n / B_in + 2 (q-1) a_in`` when the group
        lies in one node (``q_in = q``). Zero where the group size is 1 or nothing is
        reduced. Where the description's ``collectives`` has an ``all_reduce`` curve on the
        group's side (one node or several): ``2 (q-1)/q n / busbw`` with that curve's bus
        bandwidth at ``n`` bytes (:class:`pase.machines.collectives.CollectiveTables`).
        """
        return self._scaled(self._all_reduce(elements, group, grad), group)

    def _all_reduce(self, elements, group, grad: bool) -> np.ndarray:
        q, q_in, q_out = self._split(group)
        n = np.asarray(elements, dtype=np.float64) * (self.grad_bytes if grad else self.act_bytes)
        inside = 2.0 * (q_in - 1.0) / q_in * n / self.b_in + 2.0 * (q_in - 1.0) * self.a_in
        across = 2.0 * (q_out - 1.0) / q_out * (n / q_in) / self.b_out + 2.0 * (q_out - 1.0) * self.a_out
        return self._measured("all_reduce", n, q, q_out, np.where((q > 1) & (n > 0), inside + across, 0.0))

    def _scaled(self, seconds: np.ndarray, group=None, nodes=None) -> np.ndarray:
        """``seconds`` of collectives over ``group`` (or spanning ``nodes``) times the fitted
        scale of their level (``fitted.collective_scale``: ``intra_node`` for a group inside one
        node, ``inter_node`` for one across nodes; ``pase calibrate --from-runs``); as they are
        without a fit."""
        if self.fitted is None:
            return seconds
        if nodes is None:
            nodes = self._split(group)[2]
        scale = self.fitted["collective_scale"]
        return seconds * np.where(np.asarray(nodes) > 1, scale["inter_node"], scale["intra_node"])

    def all_gather(self, elements, group, grad: bool = False) -> np.ndarray:
        """All-gather of ``elements`` elements per device (its output, nccl-tests' size) over
        ``group`` (seconds): half the all-reduce of the same elements (a ring all-reduce is a
        reduce-scatter then an all-gather, :meth:`all_reduce`, measured or not), or, where the
        description's ``collectives`` has an ``all_gather`` curve for the group's side,
        ``(q-1)/q n / busbw`` with its bus bandwidth (``CollectiveTables``)."""
        return self._half("all_gather", elements, group, grad)

    def reduce_scatter(self, elements, group, grad: bool = False) -> np.ndarray:
        """Reduce-scatter of ``elements`` elements per device (its input) over ``group``:
        as :meth:`all_gather`, from a ``reduce_scatter`` curve where there is one."""
        return self._half("reduce_scatter", elements, group, grad)

    def _half(self, kind: str, elements, group, grad: bool) -> np.ndarray:
        half = 0.5 * self._all_reduce(elements, group, grad)
        if self.collectives is None or kind not in self.collectives.kinds:
            return self._scaled(half, group)
        q, _, q_out = self._split(group)
        n = np.asarray(elements, dtype=np.float64) * (self.grad_bytes if grad else self.act_bytes)
        return self._scaled(self._measured(kind, n, q, q_out, half), group)

    def _ring_latency(self, kind: str, ranks: int, nodes: int) -> float:
        """The links' fixed time of one collective over ``ranks`` devices on ``nodes`` nodes (the
        latency a curve measured at one size only is given): a ring's steps, ``2 (q_in-1) a_in +
        2 (q_out-1) a_out`` for an all-reduce, half that for an all-gather or a reduce-scatter;
        one message on each link used for an all-to-all or a send."""
        q_in, q_out = ranks // nodes, nodes
        if kind == "all_reduce":
            return 2.0 * (q_in - 1) * self.a_in + 2.0 * (q_out - 1) * self.a_out
        if kind in ("all_gather", "reduce_scatter"):
            return (q_in - 1) * self.a_in + (q_out - 1) * self.a_out
        return (self.a_in if q_in > 1 else 0.0) + (self.a_out if q_out > 1 else 0.0)

    def _measured(self, kind: str, n, q, q_out, modelled) -> np.ndarray:
        """``modelled`` with the measured bus bandwidth's seconds wherever the machine's
        ``collectives`` has a curve for the group (``CollectiveTables.seconds``); where that
        curve was measured with more ranks a node than the group has, never below what the
        group's own share of its nodes' network carries
        (:func:`pase.machines.collectives.share_floor`)."""
        if self.collectives is None or kind not in self.collectives.kinds:
            return modelled
        measured = self.collectives.seconds(kind, n, q, q_out, share=self.b_out)
        return np.where(np.isnan(measured), modelled, measured)

    def exchange(self, elements, group) -> np.ndarray:
        """Point-to-point exchange of ``elements`` activation elements per device in ``group``.

        Its bytes over ``B_in`` plus one ``a_in`` when the group lies in one node, else
        over ``B_out`` plus one ``a_out``; zero where the group size is 1 or nothing moves.
        """
        return self._scaled(self._exchange(elements, group), group)

    def _exchange(self, elements, group) -> np.ndarray:
        q, q_in, _ = self._split(group)
        n = np.asarray(elements, dtype=np.float64) * self.act_bytes
        one_node = q_in >= q
        seconds = np.where(one_node, n / self.b_in + self.a_in, n / self.b_out + self.a_out)
        return np.where((q > 1) & (n > 0), seconds, 0.0)

    def _gathered(self, e: np.ndarray, procs):
        """An edge's redistribution priced as the all-gather it is (a tensor split over ``procs``
        devices made whole, and its gradient reduce-scattered back) where the machine measured
        all-gathers on the edge's side: ``e`` elements moved per device at the curve's bus
        bandwidth for the group (``procs`` devices on ``procs / devices_per_node`` nodes); ``None``
        where a span has no curve on its side (the links price it)."""
        q = np.broadcast_to(np.asarray(procs, dtype=np.float64), e.shape)
        q_out = np.maximum(1.0, q / float(self.nvlink_domain))
        n = e * self.act_bytes
        # nccl-tests' size of an all-gather is its output: moving ``n`` bytes per device is a
        # gather of n q / (q - 1) bytes.
        size = np.where(q > 1, n * q / np.maximum(q - 1.0, 1.0), 0.0)
        seconds = self.collectives.seconds("all_gather", size, np.maximum(q, 1.0), q_out)
        if np.isnan(seconds).any():
            return None
        return np.where(n > 0, seconds, 0.0)

    def send_recv(self, elements, group) -> np.ndarray:
        """One send of ``elements`` activation elements per device to a peer (a pipeline stage
        handing its activations to the next: ``group`` the pair): :meth:`exchange`, or where the
        description's ``collectives`` has a ``send_recv`` curve for the pair's side (one node or
        two), ``n / busbw`` at its bandwidth."""
        modelled = self._exchange(elements, group)
        if self.collectives is None or "send_recv" not in self.collectives.kinds:
            return self._scaled(modelled, group)
        q, _, q_out = self._split(group)
        n = np.asarray(elements, dtype=np.float64) * self.act_bytes
        return self._scaled(self._measured("send_recv", n, q, q_out, modelled), group)

    def all_to_all(self, elements, group) -> np.ndarray:
        """All-to-all of ``elements`` activation elements per device over ``group`` (seconds).

        A device keeps ``1/q`` of its ``n`` bytes, sends ``(q_in - 1)/q`` of them to the other
        members of its node over NVLink and ``(q - q_in)/q`` to the members on other nodes
        over the network. Both go at once (the collective posts every peer's transfer
        together), so the slower link sets the time, each with its latency when used::

            max( (q_in-1)/q n / B_in + a_in [q_in > 1],  (q-q_in)/q n / B_out + a_out [q_out > 1] )

        Zero where the group size is 1 or nothing moves (``docs/machines.md``). With a measured
        ``all_to_all`` curve for the group's side: ``(q-1)/q n / busbw``.
        """
        q, q_in, q_out = self._split(group)
        n = np.asarray(elements, dtype=np.float64) * self.act_bytes
        inside = (q_in - 1.0) / q * n / self.b_in + np.where(q_in > 1, self.a_in, 0.0)
        across = (q - q_in) / q * n / self.b_out + np.where(q_out > 1, self.a_out, 0.0)
        return self._scaled(self._measured("all_to_all", n, q, q_out,
                                           np.where((q > 1) & (n > 0), np.maximum(inside, across), 0.0)), nodes=q_out)

    def redistribute(self, elements, procs) -> np.ndarray:
        """Edge redistribution of ``elements`` activation elements per device (seconds).

        The caller passes the forward plus backward volume. Its bytes at ``B_in`` when
        ``procs <= devices_per_node`` (one node), else at ``B_out``, plus two latencies
        of that link (one message forward, one backward); zero where nothing moves. Where the
        description measured all-gathers (``collectives``), the measured all-gather of the
        span instead (:meth:`_gathered`).
        """
        e = np.asarray(elements, dtype=np.float64)
        seconds = self._redistribute(e, procs)
        if self.fitted is None:
            return seconds
        return self._scaled(seconds, nodes=np.where(self.levels.holds(procs), 1.0, 2.0))

    def _redistribute(self, e: np.ndarray, procs) -> np.ndarray:
        if self.collectives is not None and "all_gather" in self.collectives.kinds:
            measured = self._gathered(e, procs)
            if measured is not None:
                return measured
        one_node = self.levels.holds(procs)
        if one_node.ndim == 0:  # the usual call: one p for a whole edge matrix, fewer passes
            bw, latency = (self.b_in, self.a_in) if one_node else (self.b_out, self.a_out)
            return np.where(e > 0, e * (self.act_bytes / bw) + 2.0 * latency, 0.0)
        n = e * self.act_bytes
        seconds = np.where(one_node, n / self.b_in + 2.0 * self.a_in, n / self.b_out + 2.0 * self.a_out)
        return np.where(n > 0, seconds, 0.0)
