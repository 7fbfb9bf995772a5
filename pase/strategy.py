"""Strategies: one configuration per layer, and their total cost ``F(G, phi)`` (paper Eq. 1).

``evaluate`` costs any strategy from scratch with the layer and edge formulas, whether or
not its configurations are among the enumerated ones; the search's optimum is checked
against it, and data parallelism and expert strategies are costed by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .builder import Network, edge_cost_matrix
from .configs import check_config
from .machine import Machine
from .solver import Search, SearchStats

__all__ = [
    "Evaluation", "Strategy", "evaluate", "check_strategy", "find_strategy", "strategy_from_indices",
    "indexed_cost",
]


@dataclass(frozen=True)
class Evaluation:
    """The cost of one strategy, split into its terms.

    Attributes
    ----------
    configs : list of tuple
        The strategy: one configuration per vertex id.
    layer_costs : numpy.ndarray
        Layer cost of every vertex.
    edge_costs : dict
        ``(u, v) -> `` redistribution cost of every edge.
    """

    configs: list
    layer_costs: np.ndarray
    edge_costs: dict

    @property
    def total(self) -> float:
        """``F(G, phi)``: layer costs plus edge costs."""
        return float(self.layer_costs.sum() + sum(self.edge_costs.values()))

    def incident_edge_costs(self) -> np.ndarray:
        """Per vertex, the cost of the edges into it (each edge is counted at its consumer)."""
        costs = np.zeros(len(self.layer_costs))
        for (u, v), c in self.edge_costs.items():
            costs[v] += c
        return costs


def check_strategy(network: Network, configs: Sequence[Sequence[int]], procs: int | None = None) -> list:
    """Validate a strategy for ``network``; returns it as a list of int tuples.

    One configuration per layer, each with one entry per iteration-space dimension, each
    dividing its dimension, with a product of at most ``procs`` devices. Raises
    ``ValueError`` naming the first offending layer.
    """
    if len(configs) != len(network.layers):
        raise ValueError(
            f"the strategy has {len(configs)} configurations, graph {network.name!r} has {len(network.layers)} layers"
        )
    checked = []
    for v, (config, layer) in enumerate(zip(configs, network.layers)):
        try:
            if isinstance(config, (str, bytes)) or not hasattr(config, "__len__"):
                raise ValueError(f"configuration {config!r} is not a list of integers")
            check_config(config, layer.domain, procs)
        except ValueError as err:
            raise ValueError(f"layer {v} ({network.names[v]}, {layer.op} {list(layer.domain)}): {err}") from None
        checked.append(tuple(int(c) for c in config))
    return checked


def evaluate(
    network: Network,
    configs: Sequence[Sequence[int]],
    machine: Machine | None = None,
    procs: int | None = None,
) -> Evaluation:
    """Cost of the strategy ``configs`` (one configuration per vertex id).

    Parameters
    ----------
    network : Network
        The computation graph.
    configs : sequence of sequences of int
        The strategy; configurations need not be among the enumerated ones.
    machine : Machine, optional
        Defaults to ``Machine()`` (10 TFLOPS, 16 GB/s).
    procs : int, optional
        When given, a configuration needing more devices is rejected.

    Examples
    --------
    >>> from graphs import alexnet
    >>> net = alexnet(128)
    >>> serial = [(1,) * len(layer.domain) for layer in net.layers]
    >>> evaluate(net, serial).total > 0
    True
    """
    machine = machine or Machine()
    strategy = check_strategy(network, configs, procs)
    rows = [np.asarray([c], dtype=np.int64) for c in strategy]
    layer_costs = np.array(
        [float(layer.cost(C, machine)[0]) for layer, C in zip(network.layers, rows)], dtype=np.float64
    )
    outputs = [layer.output_configs(C) for layer, C in zip(network.layers, rows)]
    inputs = [layer.input_configs(C) for layer, C in zip(network.layers, rows)]
    edge_costs = {}
    for (u, v), tensors in network.edges.items():
        edge_costs[(u, v)] = float(
            sum(
                edge_cost_matrix(t.shape, outputs[u][t.output_index], inputs[v][t.input_index], machine)[0, 0]
                for t in tensors
            )
        )
    return Evaluation(strategy, layer_costs, edge_costs)


@dataclass(frozen=True)
class Strategy:
    """The best strategy found for a network on ``procs`` devices.

    Attributes
    ----------
    network : Network
    procs : int
    machine : Machine
    graph : networkx.DiGraph
        The costed graph the search ran on (configurations, cost vectors and matrices).
    indices : list of int
        Chosen configuration index of every vertex (into ``graph.nodes[v]["configs"]``).
    configs : list of tuple
        The chosen configurations, in vertex-id order.
    total_cost : float
        The optimum ``min F(G, phi)`` found by the dynamic programme.
    evaluation : Evaluation
        The chosen strategy re-costed from scratch (per-layer and per-edge terms).
    stats : SearchStats
        Ordering, largest dependent set, table entries, seconds.
    """

    network: Network
    procs: int
    machine: Machine
    graph: object
    indices: list
    configs: list
    total_cost: float
    evaluation: Evaluation
    stats: SearchStats


def find_strategy(
    network: Network,
    procs: int,
    machine: Machine | None = None,
    ordering="generateseq",
    memory_budget: int | None = None,
    progress=None,
    graph=None,
    blocks=True,
) -> Strategy:
    """Build the costed graph of ``network`` for ``procs`` devices and search it exactly.

    ``graph`` may pass an already costed graph (``network.graph(procs, machine)``).
    ``blocks`` is ``Search``'s option: solve runs of identical blocks once (default).
    Raises ``SearchTooLarge`` before allocating when the tables would not fit
    ``memory_budget`` bytes (default: most of the available memory).

    Examples
    --------
    >>> from graphs import alexnet
    >>> best = find_strategy(alexnet(128), 32)
    >>> best.total_cost
    53136349552.0
    """
    machine = machine or Machine()
    G = graph if graph is not None else network.graph(procs, machine)
    result = Search(G, ordering, blocks=blocks).run(memory_budget=memory_budget, progress=progress)
    return strategy_from_indices(network, G, result.indices(range(len(network.layers))), result.cost, result.stats)


def strategy_from_indices(network: Network, G, indices, total_cost: float, stats: SearchStats) -> Strategy:
    """A ``Strategy`` from configuration indices into the costed graph ``G``."""
    machine = G.graph["machine"]
    procs = G.graph["procs"]
    indices = [int(i) for i in indices]
    configs = [tuple(int(c) for c in G.nodes[v]["configs"][i]) for v, i in enumerate(indices)]
    return Strategy(
        network, procs, machine, G, indices, configs, float(total_cost),
        evaluate(network, configs, machine, procs), stats,
    )


def indexed_cost(G, choice) -> float:
    """``F`` of a choice of configuration indices, read off the graph's cost tables."""
    total = sum(float(G.nodes[v]["cost"][choice[v]]) for v in G.nodes)
    total += sum(float(m[choice[u], choice[v]]) for u, v, m in G.edges(data="cost"))
    return total
