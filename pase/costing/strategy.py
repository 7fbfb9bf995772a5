"""Strategies: one configuration per layer, and their total cost ``F(G, phi)`` (paper Eq. 1).

``evaluate`` costs any strategy from scratch with the layer and edge formulas, whether or
not its configurations are among the enumerated ones; the search's optimum is checked
against it, and data parallelism and expert strategies are costed by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pase.core.checks import checked_device_count
from pase.model.builder import Network, redistribution_seconds
from pase.model.configs import check_config
from pase.model.readers import shared_reductions
from pase.machines.paper import Machine
from pase.core.checks import a_network, arguments, configurations, optional, positive_int
from pase.machines.registry import as_machine

__all__ = ["Evaluation", "evaluate", "check_strategy"]


@dataclass(frozen=True)
class Evaluation:
    """The cost of one strategy, split into its terms.

    Attributes
    ----------
    configs : list of tuple
        The strategy: one configuration per vertex id.
    compute, communication : numpy.ndarray
        The two parts of every vertex's layer cost (``Layer.costs``); under the reader rule
        ``"summed"`` a reader's communication leaves out the reduction it shares with the
        reader before it (``pase.model.readers``).
    edge_costs : dict
        ``(u, v) -> `` redistribution cost of every edge.
    """

    configs: list
    compute: np.ndarray
    communication: np.ndarray
    edge_costs: dict

    @property
    def layer_costs(self) -> np.ndarray:
        """Layer cost of every vertex: compute plus communication."""
        return self.compute + self.communication

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


@arguments(network=a_network, configs=configurations, machine=as_machine, procs=optional(positive_int))
def evaluate(
    network: Network,
    configs: Sequence[Sequence[int]],
    machine=None,
    procs: int | None = None,
) -> Evaluation:
    """Cost of the strategy ``configs`` (one configuration per vertex id).

    Parameters
    ----------
    network : Network
        The computation graph.
    configs : sequence of sequences of int
        The strategy; configurations need not be among the enumerated ones.
    machine : optional
        Any machine (``pase.machines.paper``); defaults to ``Machine()`` (10 TFLOPS, 16 GB/s).
    procs : int, optional
        The device count. A configuration needing more devices is rejected. Without it, the
        largest configuration's device count is taken (it matters only to machines whose
        edges are priced by where the devices are).

    Examples
    --------
    >>> from graphs import alexnet
    >>> net = alexnet(128)
    >>> serial = [(1,) * len(layer.domain) for layer in net.layers]
    >>> evaluate(net, serial).total > 0
    True
    """
    machine = machine or Machine()
    if procs is not None:
        procs = checked_device_count(procs)
        machine.check_procs(procs)
    strategy = check_strategy(network, configs, procs)
    if procs is None:
        procs = max(int(np.prod(c)) for c in strategy)
    rows = [np.asarray([c], dtype=np.int64) for c in strategy]
    costs = [layer.costs(C, machine) for layer, C in zip(network.layers, rows)]
    compute = np.array([float(c.compute[0]) for c in costs], dtype=np.float64)
    communication = np.array([float(c.communication[0]) for c in costs], dtype=np.float64)
    outputs = [layer.output_configs(C) for layer, C in zip(network.layers, rows)]
    inputs = [layer.input_configs(C) for layer, C in zip(network.layers, rows)]
    edge_costs = {}
    for (u, v), tensors in network.edges.items():
        # One (source, target) pair per tensor, priced by the edge rule of the searches.
        edge_costs[(u, v)] = float(sum(
            redistribution_seconds(machine, t.shape, outputs[u][t.output_index][0], inputs[v][t.input_index][0],
                                   procs) for t in tensors))
    # Under the reader rule "summed", a reader laid out like the one before it shares its
    # gradient's all-reduce (pase.model.readers): its communication is the rest.
    communication = communication - shared_reductions(network, strategy, machine)
    return Evaluation(strategy, compute, communication, edge_costs)
