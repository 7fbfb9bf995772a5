"""What the CLI shows: the layer table, the JSON object, sweep rows, timings and the DOT graph.

Every function here returns text (or a ``pydot.Dot``) rendered from a ``pase.planning.planner.Plan``;
nothing prints. A new output column is one ``Column`` in ``LAYER_COLUMNS``; a new JSON key is
one line in ``report_dict``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import pstats
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from pase.model.builder import Network
from pase.costing.memory import ASSUMPTIONS, MemorySummary
from pase.search.ordering import ordering_title
from pase.planning.planner import Measurement, Plan
from pase.core.units import format_bytes, format_cost, format_seconds
from pase.machines.paper import Machine

__all__ = [
    "LayerRow", "layer_rows", "Column", "LAYER_COLUMNS", "layer_columns", "SWEEP_COLUMNS",
    "format_cost", "format_seconds", "format_bytes", "split_notation", "format_columns",
    "format_table", "report_dict", "refusal_dict", "memory_dict", "format_json",
    "format_sweep_header", "format_sweep_row", "format_sweep_refusal",
    "format_measurement", "format_profile", "dot_graph",
]

# ---------------------------------------------------------------------------------------
# The rows every output format is rendered from


@dataclass(frozen=True)
class LayerRow:
    """One vertex of the graph with its configuration and costs.

    Attributes
    ----------
    id : int
        Vertex id (creation order, ``docs/graphs.md``).
    name, op, dims : str
        Layer name, layer type and one letter per iteration-space dimension.
    domain : tuple of int
        The iteration space.
    configs : int
        Number of valid (enumerated) configurations on ``procs`` devices.
    config : tuple of int
        The configuration of the strategy shown.
    compute, communication : float
        The two parts of the layer cost of ``config``.
    edge_cost : float
        Cost of redistributing the tensors this layer reads (edges into it).
    memory : float
        Bytes per device of this layer under the memory model (parameters and outputs).
    procs : int
        Devices of the plan; those beyond the configuration's own hold replicas.
    """

    id: int
    name: str
    op: str
    dims: str
    domain: tuple
    configs: int
    config: tuple
    compute: float
    communication: float
    edge_cost: float
    memory: float
    procs: int

    @property
    def cost(self) -> float:
        """The layer cost: compute plus communication."""
        return self.compute + self.communication

    @property
    def replicas(self) -> int:
        """Copies of every part: the configuration uses ``prod(config)`` devices of ``procs``."""
        return self.procs // math.prod(self.config)

    @property
    def idle(self) -> int:
        """Devices left without a part or a whole copy (when ``prod(config)`` does not divide ``p``)."""
        return self.procs % math.prod(self.config)

    def configuration(self) -> str:
        """The configuration as the dimensions it splits, and the replicas it leaves."""
        text = split_notation(self.config, self.dims)
        notes = [f"x{self.replicas} replicated"] if self.replicas > 1 else []
        notes += [f"{self.idle} idle"] if self.idle else []
        return f"{text} ({', '.join(notes)})" if notes else text


def layer_rows(plan: Plan) -> tuple:
    """One ``LayerRow`` per vertex of the plan, in vertex-id order."""
    ev = plan.evaluation
    edge_in = ev.incident_edge_costs()
    net = plan.network
    return tuple(
        LayerRow(
            id=v, name=net.names[v], op=layer.op, dims=layer.dims, domain=tuple(int(d) for d in layer.domain),
            configs=int(plan.config_counts[v]), config=tuple(int(c) for c in plan.configs[v]),
            compute=float(ev.compute[v]), communication=float(ev.communication[v]), edge_cost=float(edge_in[v]),
            memory=float(plan.memory.per_layer[v]), procs=plan.procs,
        )
        for v, layer in enumerate(net.layers)
    )


def _batch_of(network: Network) -> int:
    """The mini-batch size: as recorded by the builder, else the first layer's batch dimension."""
    if network.batch is not None:
        return int(network.batch)
    first = network.layers[0]
    return int(first.domain[first.batch_dim])


def _edges(network: Network) -> list:
    return sorted((int(u), int(v)) for (u, v) in network.edges)


# ---------------------------------------------------------------------------------------
# Small formatting helpers


def split_notation(config: Sequence[int], dims: str) -> str:
    """A configuration as the dimensions it splits: ``(32, 1, 2)`` over ``"bcn"`` is ``"b32 n2"``.

    A configuration that splits nothing is ``"unsplit"``. Falls back to the plain tuple when
    the letters do not name the dimensions one to one.

    >>> split_notation((32, 1, 2), "bcn"), split_notation((1, 1), "bk")
    ('b32 n2', 'unsplit')
    """
    config = [int(c) for c in config]
    if len(dims) != len(config) or len(set(dims)) != len(dims):
        return "(" + ",".join(str(c) for c in config) + ")"
    parts = [f"{letter}{c}" for letter, c in zip(dims, config) if c != 1]
    return " ".join(parts) if parts else "unsplit"


def _shape(domain: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in domain)


def format_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], aligns: Sequence[str]) -> list:
    """Lines of a table with aligned columns (``aligns``: ``"<"`` or ``">"`` per column)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, aligns, widths)).rstrip()

    return [line(headers)] + [line(r) for r in rows]


# ---------------------------------------------------------------------------------------
# The default table


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
        Column("iteration space", lambda r: _shape(r.domain)),
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
    what = ("cost of a given strategy" if plan.evaluated
            else "best strategy within the memory cap" if capped else "optimal parallelization strategy")
    width = f", {model_name} {model}" if model is not None else ""
    net = plan.network
    return [
        f"PaSE {what}: {net.name} ({len(net.layers)} layers, {len(net.edges)} edges){width}",
        f"devices {plan.procs}, batch {_batch_of(net)}; {plan.machine.header_line()}",
        plan.machine.unit_line(),
    ]


def _summary_lines(plan: Plan) -> list:
    with_time = plan.machine.cost_text
    capped = plan.memory.status == "capped"
    label = "strategy cost" if plan.evaluated else "best fitting cost" if capped else "optimal total cost"
    speedup = plan.speedup
    lines = [
        (label, with_time(plan.total_cost)),
        ("data-parallel cost", with_time(plan.data_parallel.total)),
        ("modelled speedup", f"{speedup:.3f}x over data parallelism" if speedup is not None else "n/a"),
    ]
    lines += _memory_lines(plan)
    if plan.search is not None:
        s = plan.search
        lines.append((
            "search",
            f"{ordering_title(s.ordering)} ordering, largest dependent set {s.max_dependent_set}, "
            f"{s.table_entries:,} table entries, {s.seconds:.4f} s ({s.ns_per_entry:.1f} ns per entry)",
        ))
        if s.blocks:
            lines.append((
                "blocks",
                f"{s.blocks_description}; the plain programme would fill {s.plain_table_entries:,} table entries",
            ))
    width = max(len(k) for k, _ in lines)
    return [f"{k:<{width}}  {v}" for k, v in lines]


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


# ---------------------------------------------------------------------------------------
# JSON


def _finite(x: float | None):
    return None if x is None or not math.isfinite(x) else float(x)


def report_dict(plan: Plan, model: int | None = None, measure: Measurement | None = None) -> dict:
    """The JSON object of ``docs/cli.md`` (keys may be added, never renamed)."""
    out = {
        "graph": plan.network.name,
        "procs": plan.procs,
        "batch": _batch_of(plan.network),
        "model": model,
        **_machine_keys(plan.machine),
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
        "edges": [list(e) for e in _edges(plan.network)],
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
    out["memory"] = memory_dict(plan)
    if measure is not None:
        out["measure"] = {
            "warmup": measure.warmup,
            "runs": len(measure.search_seconds),
            "search_seconds": _stats(measure.search_seconds),
            "wall_seconds": _stats(measure.wall_seconds),
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
        "graph": plan.network.name, "procs": plan.procs, "batch": _batch_of(plan.network), "model": model,
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


# ---------------------------------------------------------------------------------------
# Sweeps over the device count

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
                        model_name: str = "model width") -> str:
    """Title and column headers of a sweep table."""
    model = f", {model_name} {model}" if model is not None else ""
    return (
        f"PaSE sweep: {graph}, batch {batch}{model}; {machine.header_line()}; costs in {machine.sweep_unit}\n"
        + _sweep_line([h for h, _ in SWEEP_COLUMNS]) + "\n"
    )


def _cap_cell(plan: Plan) -> str:
    m = plan.memory
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


# ---------------------------------------------------------------------------------------
# --measure and --profile


def _stats(values) -> dict:
    values = list(values)
    return {
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def format_measurement(m: Measurement) -> str:
    """The ``--measure`` section: mean, spread and range of the timed searches."""
    s, w = _stats(m.search_seconds), _stats(m.wall_seconds)
    runs = len(m.search_seconds)
    ns = 1e9 * s["mean"] / max(m.table_entries, 1)
    return (
        f"measurement ({m.warmup} warm-up, {runs} timed searches):\n"
        f"  dynamic programme  mean {s['mean']:.4f} s, std dev {s['stdev']:.4f} s, "
        f"min {s['min']:.4f} s, max {s['max']:.4f} s ({ns:.1f} ns per entry)\n"
        f"  whole search       mean {w['mean']:.4f} s, std dev {w['stdev']:.4f} s, "
        f"min {w['min']:.4f} s, max {w['max']:.4f} s (ordering, tables, back-substitution, re-costing)\n"
    )


def format_profile(profiler, limit: int = 20) -> str:
    """The hottest functions of a ``cProfile.Profile`` run, by time spent in the function itself."""
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.sort_stats("tottime", "cumulative").print_stats(limit)
    text = buffer.getvalue().strip("\n")
    return f"profile (the {limit} functions with the most own time):\n{text}\n"


# ---------------------------------------------------------------------------------------
# DOT


def _dot_id(text: str) -> str:
    """A DOT identifier that needs no quoting (pydot versions quote differently)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _dot_label(lines: Sequence[str]) -> str:
    # Escaped newlines: Graphviz centres each line; quotes and backslashes are escaped so
    # the label survives any layer name.
    escaped = [line.replace("\\", "\\\\").replace('"', '\\"') for line in lines]
    return '"' + "\\n".join(escaped) + '"'


def dot_graph(network: Network, configs: Sequence[Sequence[int]] | None = None):
    """The computation graph as a ``pydot.Dot``: one node per layer, one edge per graph edge.

    Node ``v<i>`` is labelled with the layer name, its type and iteration-space letters,
    the iteration space and, when ``configs`` is given, the chosen configuration.
    """
    import pydot  # imported here: only --dump-graph needs it

    dot = pydot.Dot(graph_name=_dot_id(network.name) or "G", graph_type="digraph")
    dot.set_node_defaults(shape="box", fontname="Helvetica", fontsize="10")
    for v, (name, layer) in enumerate(zip(network.names, network.layers)):
        lines = [name, f"{layer.op} {layer.dims}", _shape(layer.domain)]
        if configs is not None:
            config = [int(c) for c in configs[v]]
            lines.append(f"config ({','.join(map(str, config))}): {split_notation(config, layer.dims)}")
        dot.add_node(pydot.Node(f"v{v}", label=_dot_label(lines)))
    for u, v in sorted(network.edges):
        dot.add_edge(pydot.Edge(f"v{u}", f"v{v}"))
    return dot
