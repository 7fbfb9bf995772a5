"""The layer table of a plan, with its header, totals, memory and search lines: what ``pase``
prints by default. A new column is one ``Column`` in ``layer_columns``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from pase.core.units import format_bytes, format_cost
from pase.costing.memory import ASSUMPTIONS
from pase.machines.paper import Machine
from pase.planning.planner import Plan
from pase.search.ordering import ordering_title

from .rows import LayerRow, batch_of, format_columns, layer_rows, printable, shape_text

__all__ = ["Column", "layer_columns", "LAYER_COLUMNS", "format_table", "approximate_line"]


@dataclass(frozen=True)
class Column:
    """One column of the layer table: its header, alignment and how to fill a cell."""

    header: str
    cell: Callable[[LayerRow], str]
    align: str = "<"


def layer_columns(machine=None) -> tuple:
    """The layer table, left to right, for costs on ``machine`` (default the reference one)."""
    machine = machine or Machine()
    cell, suffix = machine.cost_cell, machine.cost_suffix
    return (
        Column("id", lambda r: str(r.id), ">"),
        Column("layer", lambda r: r.name),
        Column("type", lambda r: r.op),
        Column("dims", lambda r: r.dims),
        Column("iteration space", lambda r: shape_text(r.domain)),
        Column("K", lambda r: str(r.configs), ">"),
        Column("configuration", lambda r: r.configuration()),
        Column("compute" + suffix, lambda r: cell(r.compute), ">"),
        Column("communication" + suffix, lambda r: cell(r.communication), ">"),
        Column("edge cost" + suffix, lambda r: cell(r.edge_cost), ">"),
        Column("memory", lambda r: format_bytes(r.memory), ">"),
    )


#: The layer table of the reference machine.
LAYER_COLUMNS = layer_columns()


def _header_lines(plan: Plan, model: int | None, model_name: str) -> list:
    capped = plan.memory.status == "capped"
    approximate = plan.approximation is not None and not plan.approximation.exact
    what = ("cost of a given strategy" if plan.evaluated
            else "best strategy within the memory cap" if capped
            else "approximate parallelization strategy" if approximate else "optimal parallelization strategy")
    width = f", {model_name} {model}" if model is not None else ""
    net = plan.network
    return [
        f"PaSE {what}: {printable(net.name)} ({len(net.layers)} layers, {len(net.edges)} edges){width}",
        f"devices {plan.procs}, batch {batch_of(net)}; {plan.machine.header_line()}",
        plan.machine.unit_line(),
    ]


def _summary_lines(plan: Plan) -> list:
    with_time = plan.machine.cost_text
    capped = plan.memory.status == "capped"
    a = plan.approximation
    label = ("strategy cost" if plan.evaluated else "best fitting cost" if capped
             else "plan cost" if a is not None and not a.exact else "optimal total cost")
    speedup = plan.speedup
    lines = [(label, with_time(plan.total_cost))]
    if a is not None:
        lines.append(("approximate", approximate_line(plan)))
    lines += [
        ("data-parallel cost", with_time(plan.data_parallel.total)),
        ("modelled speedup", f"{speedup:.3f}x over data parallelism" if speedup is not None else "n/a"),
    ]
    if plan.network.readers != "each":
        lines.append(("readers", "a tensor's readers split alike reduce its summed gradient once (--readers "
                                 f"{plan.network.readers})"))
    lines += _memory_lines(plan)
    if plan.search is not None:
        s = plan.search
        lines.append((
            "search",
            f"{ordering_title(s.ordering)} ordering, largest dependent set {s.max_dependent_set}, "
            f"{s.table_entries:,} table entries, {s.seconds:.4f} s ({s.ns_per_entry:.1f} ns per entry)",
        ))
        if a is not None:
            st = a.stats
            lines.append((
                "approximate search",
                f"tables of at most {st.largest_table:,} entries; {st.split_buckets} eliminations split into "
                f"mini-buckets; bound {st.bound_seconds:.2f} s, plan {st.plan_seconds:.2f} s ({st.rounds} rounds)",
            ))
        if plan.exportable:
            lines.append(("configurations", "only those an engine can run (each layer's device count divides "
                                            f"{plan.procs}: --exportable)"))
        if s.blocks:
            lines.append((
                "blocks",
                f"{s.blocks_description}; the plain programme would fill {s.plain_table_entries:,} table entries",
            ))
    width = max(len(k) for k, _ in lines)
    return [f"{k:<{width}}  {v}" for k, v in lines]


def approximate_line(plan: Plan) -> str:
    """``cost X, lower bound Y, gap Z %`` of an approximate plan, in the machine's cost unit."""
    a = plan.approximation
    cost = plan.machine.cost_cell
    if a.exact:
        return (f"cost {cost(plan.total_cost)}, lower bound {cost(a.lower_bound)}, gap 0 % "
                "(exact: the bounded tables held the whole programme)")
    gap = "unbounded (the bound is not positive)" if a.gap is None else f"{100 * a.gap:.3g} %"
    return f"cost {cost(plan.total_cost)}, lower bound {cost(a.lower_bound)}, gap {gap}"


def _fits(fits: bool | None, cap: float | None) -> str:
    if fits is None:
        return ""
    return f" (fits the {format_bytes(cap)} cap)" if fits else f" (over the {format_bytes(cap)} cap)"


def _memory_lines(plan: Plan) -> list:
    """Summary lines of the memory model: the strategy, data parallelism, the capped search."""
    m = plan.memory
    lines = [
        ("memory per device", f"{format_bytes(m.per_device_bytes)}{_fits(m.fits, m.cap_bytes)}"),
        ("data parallelism", f"{format_bytes(m.data_parallel_per_device_bytes)} per device"
                             f"{_fits(m.data_parallel_fits, m.cap_bytes)}"),
        ("memory model", f"{m.param_bytes:g} bytes per parameter, {m.act_bytes:g} per activation; {ASSUMPTIONS}"),
    ]
    if m.status == "unconstrained":
        lines.append(("memory cap", "the unconstrained optimum fits: it is the answer"))
    elif m.status == "capped":
        lines.append((
            "memory cap",
            f"Lagrangian search, {m.searches} dynamic programmes; lower bound {format_cost(m.lower_bound)}, "
            f"gap {100 * plan.gap:.3g}% (the capped optimum lies between the bound and the cost above)",
        ))
    return lines


def format_table(plan: Plan, model: int | None = None, columns: Sequence[Column] | None = None,
                 model_name: str = "model width") -> str:
    """The default output: header, one row per layer, totals and search statistics.

    ``model`` is the graph's ``-m`` value, shown as ``model_name``."""
    columns = columns or layer_columns(plan.machine)
    rows = [[c.cell(r) for c in columns] for r in layer_rows(plan)]
    lines = _header_lines(plan, model, model_name) + [""]
    lines += format_columns([c.header for c in columns], rows, [c.align for c in columns])
    lines += ["", *_summary_lines(plan)]
    lines.append("(K: valid configurations of the layer; compute and communication: the layer's own cost; "
                 "edge cost: redistributing the tensors it reads; memory: per device, parameters and outputs)")
    return "\n".join(lines) + "\n"
