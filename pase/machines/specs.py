"""What a machine's public specification adds to a description: peaks per number format, the
NVLink domain, the device's parallel processors and the rule that carries a measured GEMM
table over to a machine without one (``docs/machines.md``, "Presets from public specifications").

The fields (all optional in a machine file; every preset of ``data/presets.json`` states them,
each with its source):

- ``dtype_tflops``: dense peak TFLOPS per number format beyond BF16 (``peak_tflops``):
  ``fp8``, ``mxfp8``, ``nvfp4``; a format the device lacks is absent.
- ``nvlink_domain``: GPUs that one NVLink (or Infinity Fabric) domain joins at ``intra_node``
  speed: 8 on an HGX board, 72 on an NVL72 rack (18 trays of ``devices_per_node`` 4).
- ``rail_optimized``: the network between domains is rail-optimised (each GPU's NIC on the leaf
  of its rail). Recorded; priced as any network: NCCL routes a cross-rail transfer through
  NVLink first (PXN), so each GPU's NIC bandwidth is the bound either way.
- ``sms``: streaming multiprocessors (compute units on AMD) of the device.
- ``fp8_layouts``: the operand layouts the device's per-tensor FP8 GEMMs take: ``tn`` (Hopper:
  the K-major layout alone, so a transposed FP8 copy of each operand is written and kept too;
  the default) or ``any`` (Blackwell, compute capability 10.x-11.x: Transformer Engine's
  ``is_non_tn_fp8_gemm_supported``, under which ``Float8Tensor.update_usage`` keeps no
  transpose).
- ``clock_mhz``: ``{"boost": MHz or null, "base": MHz or null, "sustained": MHz or null}`` as
  published (null or absent: none published). Priced by one rule (:func:`clock_ratio_of`): where
  the boost clock and a sustained or base clock are both stated, a training step runs at the
  sustained clock (the base clock where no sustained one is published) over the boost clock, at
  which the datasheet's peaks and the measured table's isolated GEMMs run; else at the boost clock.
- ``gemm_reference``: the preset whose measured table prices this machine's GEMMs and
  memory-bound work (:class:`GemmTransfer`).
- ``sources``: ``{field: text}``, where each figure comes from.
- ``host``: the host side offload is priced with (:mod:`pase.machines.host`).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from pase.core.checks import is_int, is_positive_int
from pase.machines.host import validate_host

__all__ = ["SPEC_FIELDS", "FP8_LAYOUTS", "DTYPES", "DTYPE_BYTES", "validate_spec_fields", "Domain", "GemmTransfer",
           "domain_sizes", "clock_ratio_of"]

SPEC_FIELDS = ("dtype_tflops", "nvlink_domain", "rail_optimized", "sms", "fp8_layouts", "clock_mhz", "gemm_reference",
               "sources", "host")
#: ``fp8_layouts``' values (above).
FP8_LAYOUTS = ("tn", "any")
#: Number formats a GEMM may run in; ``bf16`` is ``peak_tflops``.
DTYPES = ("bf16", "fp8", "mxfp8", "nvfp4")
#: Bytes per element of a GEMM's operands in each format, scales included: MXFP8 one 8-bit
#: scale per 32 elements (OCP Microscaling Formats v1.0), NVFP4 4-bit values with one FP8 scale
#: per 16 (NVIDIA Blackwell NVFP4 format).
DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32.0, "nvfp4": 0.5 + 1.0 / 16.0}
_MAX = 1e9


def _positive_number(v) -> bool:
    return not isinstance(v, bool) and (is_int(v) or isinstance(v, float) and math.isfinite(v)) and 0 < v <= _MAX


def validate_spec_fields(data: Mapping, source: str, references) -> dict:
    """The specification fields of a description, checked (a ``ValueError`` naming the field).

    ``references``: the preset names that have a measured table (what ``gemm_reference`` may name).

    >>> validate_spec_fields({"dtype_tflops": {"fp4": 9000}}, "machine file x.json", ["h100-sxm"])
    Traceback (most recent call last):
    ...
    ValueError: machine file x.json: dtype_tflops has no format 'fp4' (formats: fp8, mxfp8, nvfp4)
    """
    out: dict = {}
    if "dtype_tflops" in data:
        v = data["dtype_tflops"]
        if not isinstance(v, Mapping):
            raise ValueError(f"{source}: dtype_tflops must be an object {{format: TFLOPS}}, got {v!r}"[:200])
        for key, rate in v.items():
            if key not in DTYPES[1:]:
                raise ValueError(f"{source}: dtype_tflops has no format {str(key)[:40]!r} (formats: "
                                 f"{', '.join(DTYPES[1:])})")
            if not _positive_number(rate):
                raise ValueError(f"{source}: dtype_tflops.{key} must be a positive number up to {_MAX:g}, "
                                 f"got {rate!r}"[:200])
        out["dtype_tflops"] = dict(v)
    g = data["devices_per_node"]
    if "nvlink_domain" in data:
        v = data["nvlink_domain"]
        if not is_positive_int(v) or v > 2**20:
            raise ValueError(f"{source}: nvlink_domain must be a positive integer (GPUs in one NVLink domain), "
                             f"got {v!r}"[:200])
        if v < g or v % g:
            raise ValueError(f"{source}: nvlink_domain {v} must be a multiple of devices_per_node {g} "
                             f"(a domain holds whole nodes)")
        out["nvlink_domain"] = v
    if "rail_optimized" in data:
        v = data["rail_optimized"]
        if not isinstance(v, bool):
            raise ValueError(f"{source}: rail_optimized must be true or false, got {v!r}"[:200])
        out["rail_optimized"] = v
    if "sms" in data:
        v = data["sms"]
        if not is_positive_int(v) or v > 2**20:
            raise ValueError(f"{source}: sms must be a positive integer (the device's multiprocessors), got {v!r}"[:200])
        out["sms"] = v
    if "fp8_layouts" in data:
        v = data["fp8_layouts"]
        if v not in FP8_LAYOUTS:
            raise ValueError(f"{source}: fp8_layouts must be tn (FP8 GEMMs take K-major operands alone: Hopper) or "
                             f"any (Blackwell), got {v!r}"[:200])
        out["fp8_layouts"] = v
    if "clock_mhz" in data:
        v = data["clock_mhz"]
        if not isinstance(v, Mapping) or set(v) - {"boost", "base", "sustained"}:
            raise ValueError(f"{source}: clock_mhz must be an object {{\"boost\": MHz or null, \"base\": MHz or "
                             f"null, \"sustained\": MHz or null}}, got {v!r}"[:200])
        for key, mhz in v.items():
            if mhz is not None and not _positive_number(mhz):
                raise ValueError(f"{source}: clock_mhz.{key} must be a positive number or null, got {mhz!r}"[:200])
        if clock_ratio_of(v) is not None and clock_ratio_of(v) > 1:
            raise ValueError(f"{source}: clock_mhz: the sustained (or base) clock must not exceed the boost clock, "
                             f"got {dict(v)!r}"[:200])
        out["clock_mhz"] = dict(v)
    if "gemm_reference" in data:
        v = data["gemm_reference"]
        refs = sorted(references)
        if not isinstance(v, str) or v not in refs:
            raise ValueError(f"{source}: gemm_reference must name a preset with a measured table "
                             f"({', '.join(refs)}), got {v!r}"[:200])
        if "sms" not in data:
            raise ValueError(f"{source}: gemm_reference needs sms (the transfer rule scales work per multiprocessor)")
        out["gemm_reference"] = v
    if "sources" in data:
        v = data["sources"]
        if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(t, str) and t.strip()
                                                 for k, t in v.items()):
            raise ValueError(f"{source}: sources must be an object {{field: non-empty text}}, got {v!r}"[:200])
        out["sources"] = dict(v)
    if "host" in data:  # the host side offload is priced with (pase.machines.host)
        out["host"] = validate_host(data["host"], source)
    return out


def domain_sizes(span, domain: int, node: int) -> np.ndarray:
    """GPUs of a job of ``span`` devices in each NVLink domain: all of them when they fit in
    one (``span <= domain``), else the largest divisor of ``span`` that is at most ``domain`` and
    holds whole nodes (a scheduler gives every domain the same number of whole trays: 64 of an
    NVL72's 72 GPUs for 128 or 256, all 72 for 144), at least one node.

    >>> domain_sizes([64, 72, 128, 144, 256, 8], 72, 4).tolist()
    [64, 72, 64, 72, 64, 8]
    """
    span = np.atleast_1d(np.asarray(span, dtype=np.int64))
    d = np.arange(1, domain + 1, dtype=np.int64)
    ok = (span[:, None] % d[None, :] == 0) & (d[None, :] % node == 0)
    best = np.where(ok, d[None, :], node).max(axis=1)
    return np.where(span <= domain, span, best)


def clock_ratio_of(clock_mhz) -> float | None:
    """The clock a training step sustains over the boost clock, from a ``clock_mhz`` object:
    ``sustained / boost`` where both are stated, else ``base / boost`` where both are stated,
    else ``None`` (no rule applies: the caller takes the boost clock, a ratio of 1). One rule for
    every machine: its datasheet peaks, and the measured table a preset carries or is carried
    from, run at the boost clock; a step at the power limit holds about the base clock
    (``docs/machines.md``, "Sustained clock")."""
    if not isinstance(clock_mhz, Mapping) or not clock_mhz.get("boost"):
        return None
    held = clock_mhz.get("sustained") or clock_mhz.get("base")
    return None if not held else float(held) / float(clock_mhz["boost"])


class Domain:
    """Where the members of a device group sit: NVLink domains of ``domain`` GPUs joined by the
    network (``docs/machines.md``, "Levels"). With ``domain`` equal to the node, this is the
    node-level model of every machine before it (the groups' ``members_per_node``)."""

    def __init__(self, domain: int, node: int):
        self.domain = int(domain)
        self.node = int(node)

    def members(self, group) -> np.ndarray:
        """``q_in``: members of ``group`` in one domain, per configuration. A group that says
        how many devices its configuration uses (``Group.devices``) is placed on domains of
        :func:`domain_sizes` of them; otherwise on whole domains."""
        devices = getattr(group, "devices", None)
        if self.domain == self.node or devices is None:
            return group.members_per_node(self.domain)
        per = domain_sizes(devices, self.domain, self.node)
        return np.clip(per[:, None] // group.strides, 1, group.sizes).prod(axis=1)

    def holds(self, procs) -> np.ndarray:
        """Whether ``procs`` devices lie in one domain."""
        return np.asarray(procs) <= self.domain


class GemmTransfer:
    """GEMM and memory-bound times of a machine without a measured table, carried over from a
    reference machine's measured table by one rule (``docs/machines.md``, "The transfer rule").

    A measured time is taken apart into the roofline time of the work (what the device's peak or
    bandwidth allows) and the rest (launches, latencies, tiles and waves, clocks). With
    ``s = sms_ref / sms``, ``F = 6 B M N K`` and ``D(e) = 3 B (M K + K N + M N) e`` bytes at ``e``
    bytes per operand element (one training step's three products)::

        base = t_ref(B, s M, N, K) / s                      (the same work per multiprocessor)
        roof_ref = max(F / peak_ref, D(2) / hbm_ref)
        roof = max(F / peak[dtype], D(e_dtype) / hbm)
        (both x min(1, base / roof_ref): a measurement below the roofline, served from cache)
        rest = base - roof_ref;  fixed = min(rest, floor)
        t = roof + fixed + (rest - fixed) x peak_ref / peak[dtype]

    ``floor`` is the reference table's least time (its kernels' launch floor): it does not move;
    the rest of the overhead moves with the compute rate. A latency-bound shape keeps its time
    (the H200, same die, prices small GEMMs as the H100 measured them), a bandwidth-bound one moves
    with the bandwidth, a compute-bound one with the peak. On the reference itself in BF16 it is
    the table. Memory-bound work: the launch floor of the reference's memory table as measured, the
    rest times ``hbm_ref / hbm``.
    """

    def __init__(self, tables, ref_peak: float, ref_hbm: float, ref_sms: int, peak: dict, hbm: float, sms: int):
        self.tables = tables
        self.ref_peak, self.ref_hbm, self.ref_sms = float(ref_peak), float(ref_hbm), float(ref_sms)
        self.peak = dict(peak)  # dtype -> FLOP/s
        self.hbm = float(hbm)
        self.sms = float(sms)
        self.floor, self.memory_floor = tables.floors

    def gemm_seconds(self, B, M, N, K, dtype: str = "bf16") -> np.ndarray:
        B, M, N, K = np.broadcast_arrays(*[np.asarray(x, dtype=np.float64) for x in (B, M, N, K)])
        s = self.ref_sms / self.sms
        base = self.tables.gemm_seconds(B, s * M, N, K) / s
        flops = 6.0 * B * M * N * K
        traffic = 3.0 * B * (M * K + K * N + M * N)
        roof_ref = np.maximum(flops / self.ref_peak, traffic * DTYPE_BYTES["bf16"] / self.ref_hbm)
        roof = np.maximum(flops / self.peak[dtype], traffic * DTYPE_BYTES[dtype] / self.hbm)
        # A measurement below the roofline (operands served from cache, not HBM): both rooflines
        # shrink by the same factor, so the rule stays the table on the reference.
        k = np.minimum(1.0, base / roof_ref)
        roof_ref, roof = k * roof_ref, k * roof
        rest = base - roof_ref
        fixed = np.minimum(rest, self.floor)
        return roof + fixed + (rest - fixed) * (self.ref_peak / self.peak[dtype])

    def memory_seconds(self, seconds) -> np.ndarray:
        """A memory-bound time measured on the reference, on this machine."""
        seconds = np.asarray(seconds, dtype=np.float64)
        fixed = np.minimum(seconds, self.memory_floor)
        return fixed + (seconds - fixed) * (self.ref_hbm / self.hbm)
