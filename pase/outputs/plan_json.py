"""A plan as the JSON object of ``--json`` (keys may be added, never renamed), and the records
of refused sweep entries. ``pase.planning.planner.strategy_from_json`` reads it back."""

from __future__ import annotations

import dataclasses
import json
import math

from pase.planning.planner import Measurement, Plan

from .measure import summary_stats
from .rows import batch_of, edges_of, layer_rows

__all__ = ["report_dict", "refusal_dict", "memory_dict", "format_json"]


def _finite(x: float | None):
    return None if x is None or not math.isfinite(x) else float(x)


def report_dict(plan: Plan, model: int | None = None, measure: Measurement | None = None) -> dict:
    """The JSON object of ``docs/cli.md`` (keys may be added, never renamed)."""
    out = {
        "graph": plan.network.name,
        "procs": plan.procs,
        "batch": batch_of(plan.network),
        "model": model,
        **_machine_keys(plan.machine),
        "readers": plan.network.readers,
        "status": "ok",
        "total_cost": plan.total_cost,
        "data_parallel_cost": plan.data_parallel.total,
        "speedup_over_data_parallel": _finite(plan.speedup),
        "evaluated": plan.evaluated,
        "layers": [
            {
                "id": r.id,
                "name": r.name,
                "op": r.op,
                "dims": r.dims,
                "domain": list(r.domain),
                "configs": r.configs,
                "config": list(r.config),
                "replicas": r.replicas,
                "cost": r.cost,
                "compute": r.compute,
                "communication": r.communication,
                "edge_cost": r.edge_cost,
                "memory_bytes": r.memory,
            }
            for r in layer_rows(plan)
        ],
        "edges": [list(e) for e in edges_of(plan.network)],
        "search": None,
    }
    if plan.search is not None:
        s = plan.search
        out["search"] = {
            "algo": s.ordering,
            "seconds": s.seconds,
            "max_dependent_set": s.max_dependent_set,
            "table_entries": s.table_entries,
            "largest_table": s.largest_table,
            "peak_bytes": s.peak_bytes,
            "plain_table_entries": s.plain_table_entries,
            "blocks": [dataclasses.asdict(b) for b in s.blocks],
        }
    if plan.approximation is not None:
        a = plan.approximation
        out["lower_bound"] = _finite(a.lower_bound)
        out["gap"] = _finite(a.gap)
        out["approximate"] = {
            "exact": a.exact,
            "lower_bound": _finite(a.lower_bound),
            "gap": _finite(a.gap),
            "largest_table": a.stats.largest_table,
            "split_buckets": a.stats.split_buckets,
            "rounds": a.stats.rounds,
            "bound_seconds": a.stats.bound_seconds,
            "plan_seconds": a.stats.plan_seconds,
        }
    out["memory"] = memory_dict(plan)
    if measure is not None:
        out["measure"] = {
            "warmup": measure.warmup,
            "runs": len(measure.search_seconds),
            "search_seconds": summary_stats(measure.search_seconds),
            "wall_seconds": summary_stats(measure.wall_seconds),
        }
    return out


def _machine_keys(machine) -> dict:
    """The machine keys of the JSON: ``flops``/``bw`` for the reference machine, the unit, the machine."""
    return {**machine.json_keys(), "cost_unit": machine.cost_unit, "machine": machine.describe()}


def refusal_dict(plan: Plan, status: str, model: int | None = None, too_large=None) -> dict:
    """The JSON record of a device count with no answer: ``status`` is ``"too_large"`` (the
    tables would not fit: the estimate and budget are given) or ``"nothing_fits"`` (no
    strategy fits the memory cap: the least memory is given). ``plan`` carries data
    parallelism and, for ``nothing_fits``, the least-memory strategy's summary."""
    out = {
        "graph": plan.network.name, "procs": plan.procs, "batch": batch_of(plan.network), "model": model,
        "status": status, "data_parallel_cost": plan.data_parallel.total,
    }
    if too_large is not None:
        estimate = getattr(too_large, "estimate", None)
        out["budget_bytes"] = too_large.budget
        out["needed_bytes"] = estimate.peak_bytes if estimate is not None else too_large.needed
        if estimate is not None:
            out["table_entries"] = estimate.table_entries
            out["max_dependent_set"] = estimate.max_dependent_set
    else:
        out["least_bytes"] = plan.memory.least_bytes
        out["memory"] = memory_dict(plan)
    return out


def memory_dict(plan: Plan) -> dict:
    """The JSON ``memory`` object (``docs/memory.md``): bytes per device, cap, fits, bound and gap."""
    m = plan.memory
    return {
        "per_device_bytes": m.per_device_bytes,
        "data_parallel_per_device_bytes": m.data_parallel_per_device_bytes,
        "cap_bytes": m.cap_bytes,
        "fits": m.fits,
        "data_parallel_fits": m.data_parallel_fits,
        "lower_bound": _finite(m.lower_bound),
        "gap": _finite(plan.gap),
        "status": m.status,
        "least_bytes": m.least_bytes,
        "searches": m.searches,
        "param_bytes": m.param_bytes,
        "act_bytes": m.act_bytes,
    }


def format_json(data: dict, one_line: bool = False) -> str:
    """A report's JSON object as text: one key per line and one layer per line, or all on one
    line (``one_line``, for sweeps)."""
    if one_line:
        return json.dumps(data, allow_nan=False) + "\n"

    def value(v):
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            return "[\n  " + ",\n  ".join(json.dumps(x, allow_nan=False) for x in v) + "\n ]"
        return json.dumps(v, allow_nan=False)

    body = ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in data.items())
    return "{\n" + body + "\n}\n"
