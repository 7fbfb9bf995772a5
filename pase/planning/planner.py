"""The one library call behind every path of the tool: ``plan`` a network on ``p`` devices.

``plan`` costs the graph on a machine, searches it exactly (under a memory cap if asked),
and returns a ``Plan``: the strategy and its per-layer costs, data parallelism under the same
model, per-device memory, and how the search went. ``evaluate_plan`` makes the same record
for a given strategy; a plan can be re-priced on another machine and read back from its JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np


from pase.core.checks import checked_device_count, is_int, is_number
from pase.planning.baselines import data_parallel
from pase.model.builder import Network
from pase.search.capped import MAX_SEARCHES, capped_search
from pase.core.fileio import InputError
from pase.machines.base import Machine as MachineProtocol
from pase.machines.paper import Machine
from pase.search.capped import NOTHING_FITS
from pase.costing.memory import MemoryModel, MemorySummary
from pase.search.ordering import ORDERINGS
from pase.search.approx import ApproxResult, approximate
from pase.core.budget import default_table_budget
from pase.search.solver import Search, SearchStats, WorkEstimate, indexed_cost
from pase.costing.strategy import Evaluation, evaluate
from pase.core.checks import (
    a_callable, a_costed_graph, a_memory_model, a_network, arguments, configurations, optional, positive_int,
    positive_number, text,
)
from pase.machines.registry import as_machine

__all__ = ["Plan", "plan", "evaluate_plan", "Measurement", "measure_search", "strategy_from_json"]


@dataclass(frozen=True)
class Plan:
    """A strategy for a network on ``procs`` devices, with everything the tool reports of it.

    Attributes
    ----------
    network : Network
    procs : int
    machine : pase.machines.base.Machine
        The machine that priced it (the paper machine or a calibrated one).
    memory_model : MemoryModel
    configs : list of tuple
        One configuration per vertex id.
    total_cost : float
        The search's optimum (or best fitting cost under a cap), or the evaluated cost.
    evaluation : Evaluation
        The strategy costed from scratch: compute, communication and edge cost of every layer.
    data_parallel : Evaluation
        Data parallelism under the same machine.
    memory : MemorySummary
        Per-device memory of the strategy and of data parallelism; the capped search's
        outcome when there was a cap.
    config_counts : tuple of int
        Valid configurations of every layer.
    search : SearchStats or None
        How the search went (``None`` for an evaluated strategy). Under a cap, the table
        entries and seconds of all its dynamic programmes together.
    indices : list of int or None
        Chosen configuration index of every vertex, into ``graph.nodes[v]["configs"]``.
    graph : networkx.DiGraph or None
        The costed graph the search ran on.
    exportable : bool
        Searched among the configurations an engine can run only (``plan(exportable=True)``).
    approximation : pase.search.approx.ApproxResult or None
        The approximate search's outcome (``plan(approx=...)``): its lower bound on the
        optimum, the gap and whether it is exact; ``None`` for the exact search.
    """

    network: Network
    procs: int
    machine: MachineProtocol
    memory_model: MemoryModel
    configs: list
    total_cost: float
    evaluation: Evaluation
    data_parallel: Evaluation
    memory: MemorySummary
    config_counts: tuple
    search: SearchStats | None = None
    indices: list | None = None
    graph: object = None
    exportable: bool = False  # searched among configurations an engine can run only
    approximation: ApproxResult | None = None  # plan(approx=...): the lower bound and gap

    @property
    def evaluated(self) -> bool:
        """True for a given (not searched) strategy."""
        return self.search is None

    @property
    def speedup(self) -> float | None:
        """Modelled speedup over data parallelism (``None`` if the cost is zero)."""
        return self.data_parallel.total / self.total_cost if self.total_cost > 0 else None

    @property
    def gap(self) -> float | None:
        """``(cost - lower bound) / cost`` of a capped search; 0 when the optimum fits."""
        m = self.memory
        if m.lower_bound is None or m.status == NOTHING_FITS:
            return None
        return max(self.total_cost - m.lower_bound, 0.0) / self.total_cost if self.total_cost else 0.0

    def reprice(self, machine=None, memory_model: MemoryModel | None = None) -> "Plan":
        """The same strategy costed on another machine (and memory model): an evaluated plan."""
        return evaluate_plan(self.network, self.configs, self.procs, machine or self.machine,
                             memory_model or self.memory_model)


def _check_graph(graph, network: Network, procs: int, machine) -> None:
    """A prebuilt costed graph must be the one ``plan`` would build: no silent mismatch."""
    attrs = getattr(graph, "graph", None)
    if not isinstance(attrs, dict):
        raise ValueError("graph must be a costed graph from Network.graph(procs, machine)")
    if attrs.get("network") is not network:
        raise ValueError("the costed graph was built for another network")
    if attrs.get("procs") != procs:
        raise ValueError(f"the costed graph was built for {attrs.get('procs')} devices, not {procs}")
    if attrs.get("machine") != machine:
        raise ValueError("the costed graph was built for another machine")


def _summary(network, procs, memory_model, configs, cap_bytes=None, **capped) -> MemorySummary:
    per_layer = memory_model.strategy_memory(network, configs)
    return MemorySummary(
        per_layer=tuple(float(x) for x in per_layer),
        per_device_bytes=float(per_layer.sum()),
        data_parallel_per_device_bytes=memory_model.per_device(network, data_parallel(network, procs)),
        param_bytes=memory_model.param_bytes,
        act_bytes=memory_model.act_bytes,
        cap_bytes=cap_bytes,
        **capped,
    )


@arguments(network=a_network, procs=positive_int, machine=as_machine, memory_cap=optional(positive_number),
           ordering=text, progress=optional(a_callable), memory_model=optional(a_memory_model),
           table_budget=optional(positive_number), graph=optional(a_costed_graph), notice=optional(a_callable),
           approx=optional(positive_int))
def plan(
    network: Network,
    procs: int,
    machine=None,
    memory_cap: float | None = None,
    ordering: str = "generateseq",
    progress: Callable[[int, int], None] | None = None,
    *,
    memory_model: MemoryModel | None = None,
    table_budget: int | None = None,
    graph=None,
    notice: Callable | None = None,
    blocks: bool = True,
    exportable: bool = False,
    approx: int | None = None,
    **capped_options,
) -> Plan:
    """The cheapest strategy for ``network`` on ``procs`` devices, found exactly.

    Parameters
    ----------
    network : Network
    procs : int
        Number of devices.
    machine : optional
        Prices the work; default the reference machine ``Machine()``.
    memory_cap : float, optional
        Bytes per device the strategy must fit (``docs/memory.md``): the capped search.
    ordering : str
        A name in ``pase.search.ordering.ORDERINGS``.
    progress : callable, optional
        ``progress(done, total)``: table entries of the search, or, under a cap, dynamic
        programmes run out of the most it may run.
    memory_model : MemoryModel, optional
        Bytes per parameter and activation (default 16 and 2).
    table_budget : int, optional
        Bytes the cost tables and the search's tables may use (default: most of the memory
        available); over it, ``CostTablesTooLarge`` or ``SearchTooLarge`` before allocating.
    graph : networkx.DiGraph, optional
        The costed graph ``network.graph(procs, machine)`` when already built (it must be
        exactly that one: ``ValueError`` otherwise).
    notice : callable, optional
        ``notice(estimate, searches)`` before the first dynamic programme: the
        ``WorkEstimate`` of one and how many may run (1, or the capped search's most).
    blocks : bool
        Solve runs of identical blocks once (``pase.search.solver.Search``; default); ``False``
        runs the plain dynamic programme. The optimum is the same.
    exportable : bool
        Search only configurations an engine can run (``Network.configs(procs, divisors=True)``:
        each layer's device count divides ``procs``), so that the JAX export and the
        ``--verify`` runs accept the plan. Ignored when ``graph`` is given.
    approx : int, optional
        Run the approximate search (``pase.search.approx.approximate``) with tables of at most
        this many entries instead of the exact one: a strategy, its cost and a lower bound on
        the optimum (``Plan.approximation``), for graphs whose exact tables would not fit. It
        is the exact optimum where the bounded tables hold the exact programme. Takes no
        ``memory_cap``; ``blocks`` does not apply.
    **capped_options
        ``max_searches``, ``tolerance``, ``lambda_tolerance``, ``trace`` of the capped search
        (only with ``memory_cap``).

    Examples
    --------
    >>> import graphs
    >>> best = plan(graphs.build("alexnet", 128), 32)
    >>> best.total_cost, best.configs[0]
    (53136349552.0, (32, 1, 1, 1, 1, 1, 1))
    """
    procs = checked_device_count(procs)
    machine = machine or Machine()
    memory_model = memory_model or MemoryModel()
    _check_options(ordering, memory_cap, approx, capped_options)
    budget = table_budget if table_budget is not None else default_table_budget()
    restricted = bool(exportable) and graph is None
    if graph is None:
        configs = network.configs(procs, divisors=True) if restricted else None
        graph = network.graph(procs, machine, configs=configs, budget=budget)
    else:
        _check_graph(graph, network, procs, machine)
    memory = _MemoryVectors(network, memory_model, [graph.nodes[v]["configs"] for v in range(len(network.layers))])
    if approx is not None:
        found = _approximate(graph, memory, procs, ordering, approx, budget, progress)
    elif memory_cap is None:
        found = _exact(graph, memory, procs, Search(graph, ordering, blocks=blocks), budget, progress, notice)
    else:
        found = _capped(graph, memory, Search(graph, ordering, blocks=blocks), memory_cap, budget, progress, notice,
                        capped_options)
    return _plan(network, procs, machine, memory_model, graph, memory.configs_of, found, memory_cap, restricted)


def _check_options(ordering: str, memory_cap, approx, capped_options: dict) -> None:
    """``ValueError`` for options ``plan`` cannot take together."""
    if ordering not in ORDERINGS:
        raise ValueError(f"unknown ordering {ordering!r}; choose one of: {', '.join(ORDERINGS)}")
    if memory_cap is None and capped_options:
        raise ValueError(f"{', '.join(sorted(capped_options))} apply only with a memory cap")
    if memory_cap is not None and not memory_cap > 0:
        raise ValueError(f"the memory cap must be positive, got {memory_cap!r}")
    if approx is not None and memory_cap is not None:
        raise ValueError("the approximate search takes no memory cap")


class _MemoryVectors:
    """Per-device bytes of every configuration of every vertex, computed once when first asked."""

    def __init__(self, network: Network, memory_model: MemoryModel, configs_of: list):
        self.network, self.memory_model, self.configs_of = network, memory_model, configs_of
        self._vectors = None

    @property
    def vectors(self) -> dict:
        if self._vectors is None:
            rows = self.memory_model.vectors(self.network, self.configs_of)
            self._vectors = dict(zip(range(len(self.configs_of)), rows))
        return self._vectors


@dataclass(frozen=True)
class _Found:
    """What a search hands to ``_plan``: one configuration index per vertex and its cost."""

    choice: dict
    total: float
    stats: SearchStats
    capped: dict = field(default_factory=dict)  # the capped search's fields of MemorySummary
    approximation: ApproxResult | None = None


def _leanest(graph, choice: dict, total: float, memory: _MemoryVectors, procs: int) -> tuple:
    """``(choice, total)`` with exact ties broken toward less memory (``prefer_lean``)."""
    leaner = prefer_lean(graph, choice, memory.vectors, procs)
    return (choice, total) if leaner == choice else (leaner, indexed_cost(graph, leaner))


def _approximate(graph, memory: _MemoryVectors, procs: int, ordering: str, approx: int, budget: int,
                 progress) -> _Found:
    """The approximate search (``plan(approx=...)``): a strategy, its cost and a lower bound."""
    approximation = approximate(graph, ordering, approx, budget, progress=progress)
    choice, total = _leanest(graph, approximation.choice, approximation.cost, memory, procs)
    a = approximation.stats
    stats = SearchStats(WorkEstimate(a.ordering, a.table_entries, a.largest_table, a.max_dependent_set,
                                     a.peak_bytes), a.seconds)
    return _Found(choice, total, stats, approximation=approximation)


def _exact(graph, memory: _MemoryVectors, procs: int, search: Search, budget: int, progress, notice) -> _Found:
    """The exact search without a memory cap (paper Eq. 4)."""
    search.check_budget(budget)  # refuse before any notice or allocation
    if notice is not None:
        notice(search.estimate, 1)
    result = search.run(memory_budget=budget, progress=progress)
    choice, total = _leanest(graph, result.choice, result.cost, memory, procs)
    return _Found(choice, total, result.stats)


def _capped(graph, memory: _MemoryVectors, search: Search, memory_cap: float, budget: int, progress, notice,
            options: dict) -> _Found:
    """The memory-capped search (``docs/memory.md``)."""
    search.check_budget(budget)  # refuse before any notice or allocation
    vectors = memory.vectors
    # The least memory any strategy needs is a per-layer minimum (memory has no edge terms):
    # when it exceeds the cap, the capped search says so before any programme.
    hopeless = sum(float(np.min(row)) for row in vectors.values()) > memory_cap
    if notice is not None and not hopeless:
        notice(search.estimate, options.get("max_searches", MAX_SEARCHES))
    found = capped_search(graph, vectors, memory_cap, search.ordering.name, budget, progress=progress, search=search,
                          **options)
    e = replace(found.search.estimate, table_entries=found.table_entries,
                plain_table_entries=found.plain_table_entries, blocks=found.blocks)
    capped = {
        "status": found.status,
        "lower_bound": None if found.status == NOTHING_FITS else found.lower_bound,
        "least_bytes": found.min_memory,
        "multiplier": found.multiplier,
        "searches": found.searches,
    }
    return _Found(found.choice, found.cost, SearchStats(e, found.seconds), capped)


def _plan(network, procs, machine, memory_model, graph, configs_of, found: _Found, memory_cap, restricted) -> Plan:
    """The ``Plan`` of a searched strategy: its configurations, costs and memory."""
    vertices = range(len(network.layers))
    indices = [int(found.choice[v]) for v in vertices]
    configs = [tuple(int(c) for c in configs_of[v][i]) for v, i in enumerate(indices)]
    return Plan(
        network=network,
        procs=procs,
        machine=machine,
        memory_model=memory_model,
        configs=configs,
        total_cost=float(found.total),
        evaluation=evaluate(network, configs, machine, procs),
        data_parallel=evaluate(network, data_parallel(network, procs), machine, procs),
        memory=_summary(network, procs, memory_model, configs, memory_cap, **found.capped),
        config_counts=tuple(len(C) for C in configs_of),
        search=found.stats,
        indices=indices,
        graph=graph,
        exportable=restricted,
        approximation=found.approximation,
    )


def prefer_lean(graph, choice: dict, memory: dict, procs: int) -> dict:
    """Among strategies of the same cost, one with less memory, then fewer idle replicas.

    One pass over the vertices: a vertex moves to another configuration only if its own cost
    plus the costs of its edges (the neighbours' configurations fixed) is not higher, and it
    then needs less memory per device, or as much on more devices (fewer replicas): so the
    total cost stays the optimum (no edge terms elsewhere change), and an exact tie, such as
    a zero-cost Ravel that could be replicated or split, goes to the leaner configuration.
    """
    choice = dict(choice)
    for v in graph.nodes:
        local = np.array(graph.nodes[v]["cost"], dtype=np.float64)
        for u, _, m in graph.in_edges(v, data="cost"):
            local = local + m[choice[u], :]
        for _, w, m in graph.out_edges(v, data="cost"):
            local = local + m[:, choice[w]]
        current = choice[v]
        ties = np.nonzero(local <= local[current])[0]
        if len(ties) < 2:
            continue
        mem = np.asarray(memory[v], dtype=np.float64)[ties]
        devices = np.prod(graph.nodes[v]["configs"][ties], axis=1)
        best = ties[np.lexsort((ties, -devices, mem))[0]]
        now = (float(memory[v][current]), -int(np.prod(graph.nodes[v]["configs"][current])))
        if (float(memory[v][best]), -int(devices[list(ties).index(best)])) < now:
            choice[v] = int(best)
    return choice


@arguments(network=a_network, configs=configurations, procs=positive_int, machine=as_machine,
           memory_model=optional(a_memory_model), memory_cap=optional(positive_number))
def evaluate_plan(
    network: Network,
    configs: Sequence[Sequence[int]],
    procs: int,
    machine=None,
    memory_model: MemoryModel | None = None,
    memory_cap: float | None = None,
) -> Plan:
    """A plan for a given strategy: its costs, data parallelism and memory, without a search.

    Configurations need not be among the enumerated ones; each must divide its dimensions
    and use at most ``procs`` devices (``ValueError`` naming the layer otherwise). With
    ``memory_cap`` the memory summary says whether it fits.
    """
    procs = checked_device_count(procs)
    machine = machine or Machine()
    memory_model = memory_model or MemoryModel()
    evaluation = evaluate(network, configs, machine, procs)
    return Plan(
        network=network,
        procs=procs,
        machine=machine,
        memory_model=memory_model,
        configs=evaluation.configs,
        total_cost=evaluation.total,
        evaluation=evaluation,
        data_parallel=evaluate(network, data_parallel(network, procs), machine, procs),
        memory=_summary(network, procs, memory_model, evaluation.configs, memory_cap),
        config_counts=tuple(len(C) for C in network.configs(procs)),
    )


@dataclass(frozen=True)
class Measurement:
    """Timings of repeated searches on one costed graph.

    ``search_seconds`` are the dynamic programme's own times; ``wall_seconds`` add the
    ordering, back-substitution and re-costing of the strategy.
    """

    warmup: int
    search_seconds: tuple
    wall_seconds: tuple
    table_entries: int


def measure_search(found: Plan, warmup: int = 2, runs: int = 5, blocks: bool = True) -> Measurement:
    """Time ``warmup`` untimed and ``runs`` timed searches of the plan's costed graph
    (``blocks`` as for ``plan``)."""
    if found.graph is None:
        raise ValueError("only a searched plan can be timed")
    ordering = found.search.ordering
    search_seconds, wall_seconds = [], []
    entries = 0
    for run in range(warmup + runs):
        start = time.perf_counter()
        again = plan(found.network, found.procs, found.machine, ordering=ordering,
                     memory_model=found.memory_model, graph=found.graph, blocks=blocks)
        wall = time.perf_counter() - start
        entries = again.search.table_entries
        if run >= warmup:
            search_seconds.append(again.search.seconds)
            wall_seconds.append(wall)
    return Measurement(warmup, tuple(search_seconds), tuple(wall_seconds), entries)


def strategy_from_json(data, where: str) -> tuple:
    """``(configs, settings)`` of a strategy file's parsed JSON.

    The file is a previous ``--json`` output (its ``layers[].config`` in ``id`` order, and the
    settings it records: graph, procs, batch, model, machine, memory model) or
    ``{"configs": [[...], ...]}``. ``InputError`` names the problem.
    """
    if not isinstance(data, dict):
        raise InputError(f'{where} must hold a JSON object with "configs" or "layers"')
    if "configs" in data:
        configs = data["configs"]
        if not isinstance(configs, list):
            raise InputError(f'{where}: "configs" must be a list of configurations')
    elif "layers" in data:
        layers = data["layers"]
        if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
            raise InputError(f'{where}: "layers" must be a list of objects')
        missing = [i for i, layer in enumerate(layers) if "config" not in layer]
        if missing:
            raise InputError(f'{where}: layers[{missing[0]}] has no "config"')
        if all("id" in layer for layer in layers):
            ids = [layer["id"] for layer in layers]
            if not all(is_int(i) for i in ids) or sorted(ids) != list(
                range(len(layers))
            ):
                raise InputError(f"{where}: layer ids must be 0..{len(layers) - 1}, each once")
            layers = sorted(layers, key=lambda layer: layer["id"])
        configs = [layer["config"] for layer in layers]
    else:
        raise InputError(f'{where} has neither "configs" nor "layers"')
    checked = []
    for v, config in enumerate(configs):
        if not isinstance(config, list) or not all(
            # abs(c) first: float(10**400) raises OverflowError.
            is_number(c) and abs(c) < 2**62 and float(c).is_integer()
            for c in config
        ):
            raise InputError(f"{where}: configuration {v} must be a list of integers, got {_short(config)}")
        checked.append([int(c) for c in config])
    settings = {key: data[key] for key in _SETTINGS if key in data and data[key] is not None}
    memory = data.get("memory")
    if isinstance(memory, dict):
        settings.update({key: memory[key] for key in _MEMORY_SETTINGS if memory.get(key) is not None})
    return checked, settings


#: Settings a plan file records (a ``--json`` output does) that a later ``--evaluate`` takes,
#: at the top level and inside its ``memory`` object.
_SETTINGS = ("graph", "procs", "batch", "model", "flops", "bw", "machine", "readers")
_MEMORY_SETTINGS = ("param_bytes", "act_bytes", "cap_bytes")


def _short(value, limit: int = 80) -> str:
    import json

    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
