"""The rows of ``--sweep``: one per device count, refused counts included."""

from __future__ import annotations

from pase.core.units import format_bytes
from pase.costing.memory import MemorySummary
from pase.machines.paper import Machine
from pase.planning.planner import Plan

__all__ = ["SWEEP_COLUMNS", "format_sweep_header", "format_sweep_row", "format_sweep_refusal"]


#: Columns of a sweep: header and alignment.
SWEEP_COLUMNS = (
    ("devices", ">"),
    ("optimal cost", ">"),
    ("data-parallel cost", ">"),
    ("speedup", ">"),
    ("memory", ">"),
    ("DP memory", ">"),
    ("cap", "<"),
    ("search seconds", ">"),
)


_SWEEP_WIDTHS = (7, 12, 18, 8, 9, 9, 16, 14)


def _sweep_line(cells) -> str:
    return "  ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(cells, SWEEP_COLUMNS, _SWEEP_WIDTHS)).rstrip()


def format_sweep_header(graph: str, batch: int, machine, model: int | None = None,
                        model_name: str = "model width", readers: str = "each") -> str:
    """Title and column headers of a sweep table (the reader rule named where it is not the paper's)."""
    model = f", {model_name} {model}" if model is not None else ""
    rule = f", readers {readers}" if readers != "each" else ""
    return (
        f"PaSE sweep: {graph}, batch {batch}{model}{rule}; {machine.header_line()}; costs in {machine.sweep_unit}\n"
        + _sweep_line([h for h, _ in SWEEP_COLUMNS]) + "\n"
    )


def _cap_cell(plan: Plan) -> str:
    m = plan.memory
    a = plan.approximation
    if a is not None:
        return "exact" if a.exact else "gap n/a" if a.gap is None else f"approx, gap {100 * a.gap:.2g}%"
    if m.cap_bytes is None:
        return "-"
    if m.status == "capped":
        return f"capped, gap {100 * plan.gap:.2g}%"
    return "fits" if m.fits else "over"


def format_sweep_row(plan: Plan) -> str:
    """One sweep row: devices, optimum, data-parallel cost, speedup, search seconds, memory."""
    speedup = plan.speedup
    m = plan.memory
    cost = plan.machine.cost_cell
    return _sweep_line([
        str(plan.procs),
        cost(plan.total_cost),
        cost(plan.data_parallel.total),
        f"{speedup:.3f}x" if speedup is not None else "n/a",
        format_bytes(m.per_device_bytes),
        format_bytes(m.data_parallel_per_device_bytes),
        _cap_cell(plan),
        f"{plan.search.seconds:.4f}" if plan.search is not None else "-",
    ]) + "\n"


def format_sweep_refusal(procs: int, data_parallel_cost: float, reason: str = "too large",
                         memory: MemorySummary | None = None, machine=None) -> str:
    """A sweep row for a device count with no answer: its search was too large (the
    paper's "OOM" cells) or nothing fits the memory cap (``reason``)."""
    return _sweep_line([
        str(procs), reason, (machine or Machine()).cost_cell(data_parallel_cost), "-",
        "-" if memory is None or memory.least_bytes is None else format_bytes(memory.least_bytes),
        "-" if memory is None else format_bytes(memory.data_parallel_per_device_bytes),
        "-" if memory is None else "memory: least",
        "-",
    ]) + "\n"
