"""The rows every output is rendered from (one per layer of a plan) and the small text helpers
the formats share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from pase.model.builder import Network
from pase.planning.planner import Plan

__all__ = ["LayerRow", "layer_rows", "batch_of", "edges_of", "split_notation", "shape_text", "format_columns",
           "printable"]


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


def batch_of(network: Network) -> int:
    """The mini-batch size: as recorded by the builder, else the first layer's batch dimension."""
    if network.batch is not None:
        return int(network.batch)
    first = network.layers[0]
    return int(first.domain[first.batch_dim])


def edges_of(network: Network) -> list:
    return sorted((int(u), int(v)) for (u, v) in network.edges)


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


def shape_text(domain: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in domain)


def printable(text: str) -> str:
    """``text`` with control characters (a newline, a tab, an escape sequence) written as
    escapes (``\\n``), so that a name from a file cannot break a table or a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def format_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], aligns: Sequence[str]) -> list:
    """Lines of a table with aligned columns (``aligns``: ``"<"`` or ``">"`` per column); a
    cell's control characters are escaped (``printable``)."""
    rows = [[printable(str(c)) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, aligns, widths)).rstrip()

    return [line(headers)] + [line(r) for r in rows]
