"""The per-layer training search: the exact dynamic programme over every layer's own splits under
one training option set (:func:`search_free`), and a given strategy priced (:func:`evaluate_candidate`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pase.core.checks import (
    a_mesh, a_network, a_rules, a_structure, a_training_options, arguments, configurations, one_of, optional,
    positive_int, positive_number,
)
from pase.costing.training import NetworkStructure, TrainingCosting, TrainingOptions
from pase.costing.training.allocator import hold_within
from pase.machines.registry import as_machine
from pase.model.builder import tokens_of
from pase.model.readers import READER_RULES
from pase.planning.candidate import Candidate
from pase.planning.mesh import Mesh, MeshMapper
from pase.planning.mesh_rows import PartsMemo, edge_seconds
from pase.planning.rules import ParallelRules

__all__ = ["evaluate_candidate", "FreeSearch", "TrainingGraphs", "training_graph", "search_free"]


@arguments(network=a_network, configs=configurations, procs=positive_int, machine=as_machine,
           options=a_training_options, act_bytes=positive_number, memory_cap=optional(positive_number),
           mesh=optional(a_mesh), microbatch=optional(positive_int), rules=optional(a_rules),
           structure=optional(a_structure), readers=optional(one_of(READER_RULES)))
def evaluate_candidate(network, configs, procs: int, machine, options: TrainingOptions, act_bytes: float,
                       memory_cap: float | None = None, mesh: Mesh | None = None,
                       microbatch: int | None = None, rules: ParallelRules | None = None,
                       structure: NetworkStructure | None = None, readers: str | None = None) -> Candidate:
    """A given strategy (one configuration per layer of the micro-batch network) priced under
    ``options``: the same numbers the searches compute. ``structure``: the network's, if known.
    ``readers``: the reader rule (``TrainingCosting``); by default the searches' own:
    ``"summed"`` for a mesh's strategy (``mesh`` given), ``"each"`` for a per-layer one."""
    if len(configs) != len(network.layers):
        raise ValueError(f"configs has {len(configs)} configurations, network {network.name!r} has "
                         f"{len(network.layers)} layers")
    readers = readers if readers is not None else "each" if mesh is None else "summed"
    priced = _strategy_costing(network, configs, procs, machine, mesh, rules, structure, readers)
    return _evaluated(priced, configs, procs, options, act_bytes, memory_cap, mesh, microbatch)


def _strategy_costing(network, configs, procs: int, machine, mesh=None, rules=None, structure=None,
                      readers: str = "summed") -> tuple:
    """``(costing, edge seconds, edge targets, network)`` of one strategy (one row per layer),
    for :func:`_evaluated` under any options."""
    rows = [np.asarray([c], dtype=np.int64) for c in configs]
    costing = TrainingCosting(network, rows, machine, structure, readers=readers)
    if mesh is not None:
        halved = MeshMapper(network, rules).sequence_parallel(mesh)
        costing.activation_scale = np.where(np.array(halved)[:, None], 0.5, 1.0)
    edges, targets = PartsMemo(machine, procs).edge_seconds(network, rows)
    return costing, edges, targets, network


def _evaluated(priced: tuple, configs, procs: int, options: TrainingOptions, act_bytes: float, memory_cap,
               mesh, microbatch) -> Candidate:
    """:func:`evaluate_candidate` from the strategy's :func:`_strategy_costing`."""
    costing, edges, targets, network = priced
    moved = float(costing.edge_rows(edges, targets, options).sum()) if len(targets) else 0.0
    tokens = tokens_of(network)
    summary = costing.summarize([0] * len(configs), options, act_bytes, moved, procs,
                                None if tokens is None else tokens * options.microbatches)
    hold_within(summary, memory_cap)
    return Candidate(mesh, options, microbatch, tuple(tuple(int(x) for x in c) for c in configs), summary,
                     memory_cap)


@dataclass(frozen=True)
class FreeSearch:
    """What :func:`search_free` found: the candidate (``None`` when nothing fits), the
    dynamic programme's optimum of the additive objective, and the work done."""

    candidate: Candidate | None
    optimum: float | None
    table_entries: int
    searches: int
    seconds: float
    status: str


class TrainingGraphs:
    """The per-layer search's pieces for one network (built at one micro-batch) on ``procs``
    devices, built once and priced under any :class:`TrainingOptions`: the enumerated
    configurations and graph (``Network.graph``, which also refuses tables over ``budget``),
    the layer parts (:class:`TrainingCosting`) and every distinct edge's redistribution seconds.
    ZeRO, recomputation and micro-batches then change only the vectors and the factors on the
    edges (:meth:`graph`). Rows of different layers are unrelated here, and pairwise tables
    cannot say that three readers share one gather: the per-layer search prices each reader's
    gradient reduction and gather itself (the reader rule ``"each"``, ``docs/training.md``), as
    the strategy it finds is then priced."""

    def __init__(self, network, procs: int, machine, budget=None):
        self.network = network
        self.procs = procs
        self.machine = machine
        #: Costings of the strategies found, by their configurations (``search_free``).
        self.strategies: dict = {}
        self.skeleton = network.with_readers("each").graph(procs, machine, budget=budget)
        self.configs = [self.skeleton.nodes[v]["configs"] for v in range(len(network.layers))]
        self.costing = TrainingCosting(network, self.configs, machine, readers="each")
        self.costing.keep_every_layer()  # priced under every ZeRO stage and recomputation policy
        layers = network.layers
        outputs = [layer.output_configs(C) for layer, C in zip(layers, self.configs)]
        inputs = [layer.input_configs(C) for layer, C in zip(layers, self.configs)]
        #: Per edge, the keys of its tensors' matrices; per key, the matrix (seconds of one
        #: micro-batch's redistribution, forward and backward).
        self.edge_keys: dict = {}
        self.matrices: dict = {}
        for u, v, data in self.skeleton.edges(data=True):
            keys = []
            for t in data["tensors"]:
                src, dst = outputs[u][t.output_index], inputs[v][t.input_index]
                key = (t.shape, src.tobytes(), dst.tobytes())
                if key not in self.matrices:
                    self.matrices[key] = edge_seconds(machine, t.shape, src[:, None, :], dst[None, :, :], procs)
                keys.append(key)
            self.edge_keys[(u, v)] = keys

    def graph(self, options: TrainingOptions, act_bytes: float):
        """``(graph, memory vectors)``: the costed graph whose layer vectors and edge matrices
        are the training configuration's (``options``), for the exact search."""
        costing = self.costing
        H = self.skeleton.copy()
        # Equal vectors are given as one array (the block search then compares copies of a
        # block by identity).
        seen: dict = {}
        for v in H.nodes:
            cost = costing.cost_vector(v, options)
            H.nodes[v]["cost"] = seen.setdefault((cost.shape, cost.tobytes()), cost)
        memo: dict = {}
        for u, v, data in H.edges(data=True):
            factor = costing.edge_factor(v, options)
            matrix = 0.0
            for key in self.edge_keys[(u, v)]:
                if (key, factor) not in memo:
                    scaled = factor * self.matrices[key]
                    scaled.setflags(write=False)
                    memo[(key, factor)] = scaled
                matrix = matrix + memo[(key, factor)]
            if options.tp_overlap:
                # The redistribution into v hides behind what v's own collectives leave of its compute.
                matrix = np.maximum(matrix - options.microbatches * costing.overlap_leftover(v, options)[None, :], 0.0)
            data["cost"] = matrix
        memory = {}
        for v in H.nodes:
            vector = np.asarray(costing.memory_vector(v, options, act_bytes), dtype=np.float64)
            memory[v] = seen.setdefault(("memory", vector.shape, vector.tobytes()), vector)
        return H, memory


def training_graph(network, procs: int, machine, options: TrainingOptions, act_bytes: float, budget=None):
    """``(graph, costing, memory vectors)`` of :class:`TrainingGraphs` under ``options``."""
    pieces = TrainingGraphs(network, procs, machine, budget)
    H, memory = pieces.graph(options, act_bytes)
    return H, pieces.costing, memory


def search_free(network, procs: int, machine, options: TrainingOptions, act_bytes: float,
                memory_cap: float | None = None, ordering: str = "generateseq", budget=None,
                microbatch: int | None = None, pieces: TrainingGraphs | None = None) -> FreeSearch:
    """The exact per-layer search of ``network`` (built at one micro-batch) under ``options``.

    Without a cap the result is the exact optimum of the additive step time (every term of
    :class:`TrainingCosting` is a per-layer vector or a per-edge matrix). With a cap the
    memory-capped search of ``pase.capped`` runs on the additive memory; the parts of the
    peak that do not add up over layers (ZeRO-3's gathered weights, the recomputed block's
    working set, the reserve) are taken off the cap first, and the cap is tightened by any
    excess found afterwards (at most three times). ``pieces``: the network's
    :class:`TrainingGraphs`, built once for several option sets (default: built here).
    """
    from pase.search.capped import NOTHING_FITS, capped_search
    from pase.search.solver import Search

    start = time.perf_counter()
    pieces = pieces if pieces is not None else TrainingGraphs(network, procs, machine, budget)
    H, memory = pieces.graph(options, act_bytes)
    costing = pieces.costing
    search = Search(H, ordering)
    search.check_budget(budget)
    entries = 0
    searches = 0
    if memory_cap is None:
        result = search.run(memory_budget=budget)
        choice, optimum = [int(result.choice[v]) for v in range(len(network.layers))], float(result.cost)
        entries, searches, status = result.stats.table_entries, 1, "unconstrained"
    else:
        target = memory_cap - options.reserve_bytes
        choice = None
        optimum = None
        status = NOTHING_FITS
        for _ in range(4):
            if target <= 0:
                break
            found = capped_search(H, memory, target, ordering, budget, search=search)
            entries += found.table_entries
            searches += found.searches
            if found.status == NOTHING_FITS:
                break
            trial = [int(found.choice[v]) for v in range(len(network.layers))]
            extra = sum(costing.transient_bytes(trial, options, act_bytes).values())
            peak = found.memory + extra + options.reserve_bytes
            if peak <= memory_cap:
                choice, optimum, status = trial, float(found.cost), found.status
                break
            target -= peak - memory_cap
    seconds = time.perf_counter() - start
    if choice is None:
        return FreeSearch(None, None, entries, searches, seconds, status)
    configs = [tuple(int(x) for x in costing.configs[v][i]) for v, i in enumerate(choice)]
    # Option sets that choose the same strategy share its costing (what it computes is kept
    # by the options it reads).
    key = tuple(configs)
    if key not in pieces.strategies:
        pieces.strategies[key] = _strategy_costing(network, configs, procs, machine, structure=costing.structure,
                                                   readers="each")
    candidate = _evaluated(pieces.strategies[key], configs, procs, options, act_bytes, memory_cap, None, microbatch)
    return FreeSearch(candidate, optimum, entries, searches, seconds, status)
