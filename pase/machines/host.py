"""A machine's host side (``host`` of a description, else its preset's in ``data/hosts.json``):
the host link per GPU, host memory and CPU optimizer rate per node, an optional NVMe drive."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Mapping

__all__ = ["HostSide", "HOST_FIELDS", "validate_host", "host_side", "preset_hosts"]

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hosts.json")
#: Required and optional fields of a ``host`` object: ``h2d_gbps`` and ``d2h_gbps`` (GB/s per GPU,
#: one direction each), ``memory_gb`` (host memory per node), ``optimizer_params_per_s`` (the CPU
#: optimizer's Adam rate per node), optional ``nvme_gbps`` and ``nvme_gb`` (the node's drive).
HOST_FIELDS = ("h2d_gbps", "d2h_gbps", "memory_gb", "optimizer_params_per_s")
HOST_OPTIONAL = ("nvme_gbps", "nvme_gb", "sources")


@dataclass(frozen=True)
class HostSide:
    """A node's host, in bytes and seconds: link bytes/s per GPU each way, host memory bytes per
    node, CPU optimizer parameters/s per node, NVMe bytes/s and bytes per node (0: no drive)."""

    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    memory_bytes: float
    optimizer_params_per_s: float
    nvme_bytes_per_s: float = 0.0
    nvme_bytes: float = 0.0

    @property
    def has_nvme(self) -> bool:
        return self.nvme_bytes_per_s > 0 and self.nvme_bytes > 0


def _positive(v) -> bool:
    return (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= 1e15)


def validate_host(value, source: str) -> dict:
    """A description's ``host`` object checked (``ValueError``, one line, naming the field).

    >>> validate_host({"h2d_gbps": 50}, "machine file x.json")
    Traceback (most recent call last):
    ...
    ValueError: machine file x.json: host is missing d2h_gbps (host fields: h2d_gbps, d2h_gbps, memory_gb, optimizer_params_per_s, optional nvme_gbps, nvme_gb, sources)
    """
    fields = ", ".join(HOST_FIELDS) + ", optional " + ", ".join(HOST_OPTIONAL)
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: host must be an object ({fields}), got {value!r}"[:200])
    for key in value:
        if key not in HOST_FIELDS + HOST_OPTIONAL:
            raise ValueError(f"{source}: host has no field {str(key)[:40]!r} (host fields: {fields})")
    for key in HOST_FIELDS:
        if key not in value:
            raise ValueError(f"{source}: host is missing {key} (host fields: {fields})")
    for key in HOST_FIELDS + HOST_OPTIONAL[:2]:
        if key in value and not _positive(value[key]):
            raise ValueError(f"{source}: host.{key} must be a positive number, got {value[key]!r}"[:200])
    if ("nvme_gbps" in value) != ("nvme_gb" in value):
        raise ValueError(f"{source}: host needs both nvme_gbps and nvme_gb for a drive, or neither")
    if "sources" in value and not (isinstance(value["sources"], Mapping) and all(
            isinstance(k, str) and isinstance(t, str) and t.strip() for k, t in value["sources"].items())):
        raise ValueError(f"{source}: host.sources must be an object {{field: non-empty text}}")
    return dict(value)


def _side(d: Mapping) -> HostSide:
    return HostSide(float(d["h2d_gbps"]) * 1e9, float(d["d2h_gbps"]) * 1e9, float(d["memory_gb"]) * 1e9,
                    float(d["optimizer_params_per_s"]), float(d.get("nvme_gbps", 0.0)) * 1e9,
                    float(d.get("nvme_gb", 0.0)) * 1e9)


def preset_hosts() -> dict:
    """``{preset name: host object}`` of ``data/hosts.json`` (read each call: no global state)."""
    with open(_DATA, encoding="utf-8") as f:
        return {k: v for k, v in json.load(f)["hosts"].items()}


def host_side(machine) -> HostSide | None:
    """The host side of ``machine``: its description's ``host``, else its preset's
    (``data/hosts.json``), else ``None`` (the paper machine, a file without one)."""
    describe = getattr(machine, "describe", None)
    if describe is None:
        return None
    d = describe()
    if not isinstance(d, Mapping):
        return None
    if "host" in d:
        return _side(d["host"])
    found = preset_hosts().get(d.get("name"))
    return None if found is None else _side(found)
