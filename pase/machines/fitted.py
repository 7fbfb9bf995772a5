"""The constants ``pase calibrate --from-runs`` fits on a cluster's own runs, as a machine
description's ``fitted`` field: what each stands for, its bounds, and the check of the field.

``collective_scale``: every collective's seconds inside one node (``intra_node``) or across nodes
(``inter_node``) multiplied by it (the machine prices them so); ``compute_efficiency``,
``block_overhead_seconds`` and ``pipeline_tp_wait_seconds``: the in-step compute
efficiency, the host time per block and micro-batch, and on a pipeline stage the
tensor-parallel ranks' wait per block, micro-batch and doubling of their group, of the engine the
runs used (``engine``), which replace that engine's own; ``tp_node_wait_seconds`` (optional,
else 0): the time a tensor-parallel group spanning nodes loses per block, micro-batch and
doubling of those nodes (``TrainingOptions.tp_node_wait_seconds``).
"""

from __future__ import annotations

import math
from typing import Mapping

from pase.core.checks import is_int, is_number

__all__ = ["FITTED_BOUNDS", "validate_fitted", "at_bounds"]

#: Each fitted constant's bounds, inclusive. The collectives' scales: from four times faster than
#: the machine prices them (a description far too pessimistic) to 16 times slower (a congested or
#: oversubscribed network); the compute efficiency: what a kernel in a step reaches of itself
#: alone at the machine's sustained clock, from a fifth to a quarter more (GPUs that hold a
#: higher clock than the machine states); the host times per block and micro-batch: at most
#: 50 ms, far beyond any engine's (a Llama block launches under 200 kernels).
FITTED_BOUNDS = {
    "intra_node": (0.25, 16.0),
    "inter_node": (0.25, 16.0),
    "compute_efficiency": (0.2, 1.25),
    "block_overhead_seconds": (0.0, 0.05),
    "pipeline_tp_wait_seconds": (0.0, 0.05),
    "tp_node_wait_seconds": (0.0, 0.05),
}
_TEXT = ("engine", "source")
_KEYS = ("engine", "compute_efficiency", "block_overhead_seconds", "pipeline_tp_wait_seconds",
         "collective_scale", "tp_node_wait_seconds", "source", "runs", "leave_one_out")


def _bounded(value, name: str, where: str) -> float:
    low, high = FITTED_BOUNDS[name]
    if not is_number(value) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{where}: fitted {name} must be a number from {low:g} to {high:g}, got {value!r:.40}")
    return float(value)


def validate_fitted(data, where: str) -> dict:
    """The ``fitted`` field checked (a ``ValueError`` of one line naming the bad key):
    ``{"engine": NAME, "compute_efficiency": x, "block_overhead_seconds": s,
    "pipeline_tp_wait_seconds": t, "collective_scale":
    {"intra_node": a, "inter_node": b}, "tp_node_wait_seconds": w (optional), "source": TEXT, "runs": N,
    "leave_one_out": {...}}``.

    >>> validate_fitted({"engine": "nanotron", "compute_efficiency": 0.9, "block_overhead_seconds": 0.002,
    ...                  "pipeline_tp_wait_seconds": 0.003,
    ...                  "collective_scale": {"intra_node": 1.0, "inter_node": 40}}, "machine file m.json")
    Traceback (most recent call last):
    ...
    ValueError: machine file m.json: fitted inter_node must be a number from 0.25 to 16, got 40
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: fitted must be an object of fitted constants, got {type(data).__name__}")
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        raise ValueError(f"{where}: unknown fitted key {str(unknown[0])[:40]!r} (keys: {', '.join(_KEYS)})")
    for key in ("engine", "compute_efficiency", "block_overhead_seconds", "pipeline_tp_wait_seconds",
                "collective_scale"):
        if key not in data:
            raise ValueError(f"{where}: fitted {key} is missing")
    out = {}
    for key in _TEXT:
        if key in data:
            if not isinstance(data[key], str) or not data[key].strip() or len(data[key]) > 10_000:
                raise ValueError(f"{where}: fitted {key} must be non-empty text")
            out[key] = data[key]
    out["compute_efficiency"] = _bounded(data["compute_efficiency"], "compute_efficiency", where)
    for key in ("block_overhead_seconds", "pipeline_tp_wait_seconds"):
        out[key] = _bounded(data[key], key, where)
    if "tp_node_wait_seconds" in data:
        out["tp_node_wait_seconds"] = _bounded(data["tp_node_wait_seconds"], "tp_node_wait_seconds", where)
    scale = data["collective_scale"]
    if not isinstance(scale, Mapping) or set(scale) != {"intra_node", "inter_node"}:
        raise ValueError(f"{where}: fitted collective_scale must be {{\"intra_node\": x, \"inter_node\": y}}")
    out["collective_scale"] = {k: _bounded(scale[k], k, where) for k in ("intra_node", "inter_node")}
    if "runs" in data:
        if not is_int(data["runs"]) or data["runs"] < 1:
            raise ValueError(f"{where}: fitted runs must be a positive integer (the runs fitted on)")
        out["runs"] = int(data["runs"])
    if "leave_one_out" in data:
        loo = data["leave_one_out"]
        if not isinstance(loo, Mapping) or not all(isinstance(k, str) and is_number(v) and math.isfinite(v)
                                                   for k, v in loo.items()):
            raise ValueError(f"{where}: fitted leave_one_out must be an object of numbers")
        out["leave_one_out"] = {k: float(v) for k, v in loo.items()}
    return out


def at_bounds(fitted: dict, tolerance: float = 1e-3) -> list:
    """The fitted constants (a description's ``fitted`` field) that ended within ``tolerance`` (of
    their range) of a bound of :data:`FITTED_BOUNDS`, as ``name bound`` texts. A
    host time of 0 is not listed: no host floor is a value the mechanism has, not the end of it.

    >>> at_bounds({"compute_efficiency": 0.8, "block_overhead_seconds": 0.0, "pipeline_tp_wait_seconds": 0.05,
    ...            "collective_scale": {"intra_node": 6.1, "inter_node": 0.25}})
    ['inter_node 0.25', 'pipeline_tp_wait_seconds 0.05']
    """
    values = {"compute_efficiency": fitted["compute_efficiency"],
              "intra_node": fitted["collective_scale"]["intra_node"],
              "inter_node": fitted["collective_scale"]["inter_node"],
              "block_overhead_seconds": fitted["block_overhead_seconds"],
              "pipeline_tp_wait_seconds": fitted["pipeline_tp_wait_seconds"],
              "tp_node_wait_seconds": fitted.get("tp_node_wait_seconds", 0.0)}
    out = []
    for name, value in values.items():
        low, high = FITTED_BOUNDS[name]
        for bound in (low, high):
            if abs(value - bound) <= tolerance * (high - low) and not (name.endswith("_seconds") and bound == 0.0):
                out.append(f"{name} {bound:g}")
    return out
