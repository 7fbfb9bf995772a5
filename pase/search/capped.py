"""The memory-capped search (``docs/memory.md``): the fastest strategy that fits ``M`` bytes per device.

Minimise ``F(G, phi)`` subject to ``mem(phi) <= M``. Memory adds to layer costs only, so
for a multiplier ``lambda >= 0`` the Lagrangian ``F + lambda * mem`` is again solved
exactly by the dynamic programme; bisection on ``lambda`` finds the cheapest fitting
strategy it can, and ``max over lambda of (optimum(lambda) - lambda * M)`` bounds the
true capped optimum from below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pase.search.ordering import vertex_order
from pase.search.solver import Search

__all__ = ["CappedSearchResult", "capped_search", "MAX_SEARCHES", "UNCONSTRAINED", "CAPPED", "NOTHING_FITS"]

#: How a capped search ended (``CappedSearchResult.status``, ``MemorySummary.status``).
UNCONSTRAINED = "unconstrained"  # the unconstrained optimum fits
CAPPED = "capped"  # found by the Lagrangian search
NOTHING_FITS = "nothing-fits"  # even the least-memory strategy exceeds the cap

#: The most dynamic programmes one capped search runs by default.
MAX_SEARCHES = 40


@dataclass(frozen=True)
class CappedSearchResult:
    """Outcome of ``capped_search`` on a bare graph (indices, not configurations).

    ``choice`` maps each vertex to a configuration index; ``cost`` is its ``F``; ``memory``
    its bytes per device; ``min_memory`` the least any strategy needs (computed when the
    optimum does not fit); ``lower_bound`` a bound on the cost of any fitting strategy;
    ``multiplier`` the smallest ``lambda`` found whose Lagrangian optimum fits (0 when
    unconstrained, infinite when nothing fits); ``searches`` and ``table_entries`` the
    dynamic programmes run and their work; ``status`` one of ``UNCONSTRAINED``, ``CAPPED``,
    ``NOTHING_FITS``; ``search`` the prepared ``Search`` every dynamic programme reused (its block structure
    included); ``plain_table_entries`` what the same dynamic programmes would have computed
    without blocks; ``blocks`` the runs of blocks used (``pase.search.blocks.BlockSummary``; empty:
    the plain programme).
    """

    status: str
    choice: dict
    cost: float
    memory: float
    min_memory: float | None
    lower_bound: float
    multiplier: float
    searches: int
    table_entries: int
    seconds: float
    search: Search
    plain_table_entries: int = 0
    blocks: tuple = ()


def capped_search(
    G,
    memory: dict,
    cap_bytes: float,
    ordering="generateseq",
    memory_budget: int | None = None,
    max_searches: int = MAX_SEARCHES,
    tolerance: float = 1e-4,
    lambda_tolerance: float = 1e-4,
    progress: Callable[[int, int], None] | None = None,
    trace: list | None = None,
    search: Search | None = None,
    blocks: bool = True,
) -> CappedSearchResult:
    """Minimise the graph's cost subject to ``sum of memory[v][choice[v]] <= cap_bytes``.

    Works on any graph the solver accepts (vertex ``cost`` vectors, edge ``cost``
    matrices); ``memory`` gives one vector per vertex, aligned with its costs.

    Parameters
    ----------
    G : networkx.DiGraph
        The costed graph.
    memory : dict
        ``v -> `` memory of each configuration of ``v`` (bytes per device).
    cap_bytes : float
        The cap ``M``.
    ordering, memory_budget
        As for ``pase.search.solver.Search``.
    max_searches : int
        At most this many dynamic programmes.
    tolerance : float
        Stop once the relative gap between the best fitting cost and the bound is below.
    lambda_tolerance : float
        Stop once the bracket of ``lambda`` is narrower than this, relative to its upper
        end: the smallest fitting ``lambda`` is then known closely enough.
    progress : callable, optional
        ``progress(searches_done, max_searches)`` after every dynamic programme.
    trace : list, optional
        If given, ``(lambda, Lagrangian optimum, memory, cost)`` of every multiplier tried
        in the bisection is appended to it.
    search : Search, optional
        The search of ``G`` already prepared with ``ordering`` (its ordering is reused).
    blocks : bool
        Solve runs of identical blocks once (``Search``'s option; ignored when ``search``
        is given). The search, and so the block structure, is prepared once for all the
        Lagrangian searches: memory is the same for every copy of a block, so
        ``F + lambda * mem`` keeps the copies identical (were it not so, a search would
        fall back to the plain programme).
    """
    if not cap_bytes > 0:
        raise ValueError(f"the memory cap must be positive, got {cap_bytes!r}")
    run = _LagrangianRun(G, memory, cap_bytes, search or Search(G, ordering, blocks=blocks), memory_budget,
                         max_searches, progress, trace)

    # 1. Memory alone has no edge terms, so the least-memory strategy is each layer's
    #    least-memory configuration (ties: the cheaper layer cost, then the lower index):
    #    known before any dynamic programme, so "nothing fits" is said at once.
    least = run.least_memory()
    min_memory = run.memory_of(least)
    if min_memory > cap_bytes:
        return run.finish(NOTHING_FITS, least, run.tables.cost(least), float("nan"), float("inf"), min_memory)

    # 2. The unconstrained optimum, if it fits, is the answer.
    base = run.solve(0.0)
    if run.memory_of(base.choice) <= cap_bytes:
        return run.finish(UNCONSTRAINED, base.choice, base.cost, base.cost, 0.0, None)

    # 3. Bisection on lambda over exact dynamic programmes, then mixes of what it saw.
    run.start_bisection(base, least)
    excess = run.memory_of(base.choice) - min_memory
    run.bisect(hi=max(base.cost, 1.0) / max(excess, 1.0), tolerance=tolerance, lambda_tolerance=lambda_tolerance)
    run.relink_all()
    best_choice, best_cost = _improve(run.tables, run.mem, run.best_choice, cap_bytes, run.vertices)
    return run.finish(CAPPED, best_choice, best_cost, min(run.bound, best_cost), run.best_lam, min_memory)


class _LagrangianRun:
    """The state of one capped search: the prepared search, the work done so far, and during
    the bisection the best fitting strategy, the Lagrangian bound and the strategies seen."""

    def __init__(self, G, memory: dict, cap: float, search: Search, memory_budget, max_searches: int,
                 progress, trace):
        self.G, self.cap, self.search = G, cap, search
        self.memory_budget, self.max_searches = memory_budget, max_searches
        self.progress, self.trace = progress, trace
        self.start = time.perf_counter()
        self.vertices = list(search.ordering.sequence)
        self.costs = {v: np.asarray(G.nodes[v]["cost"], dtype=np.float64) for v in self.vertices}
        self.mem = {}
        for v in self.vertices:
            self.mem[v] = np.asarray(memory[v], dtype=np.float64)
            if self.mem[v].shape != self.costs[v].shape:
                raise ValueError(f"vertex {v!r}: memory vector of shape {self.mem[v].shape}, "
                                 f"costs {self.costs[v].shape}")
        self.work = self.plain_work = self.count = 0
        self.used_blocks = ()
        self.tables = _Tables(G)

    def memory_of(self, choice) -> float:
        return float(sum(self.mem[v][choice[v]] for v in self.vertices))

    def least_memory(self) -> dict:
        costs, mem = self.costs, self.mem
        return {v: int(np.lexsort((np.arange(len(mem[v])), costs[v], mem[v]))[0]) for v in self.vertices}

    def solve(self, lam: float):
        """One exact dynamic programme of ``F + lam * mem``."""
        weighted = None
        if lam:
            # Vertices given the very same cost and memory arrays (copies of a block) get the
            # very same weighted array, which the block search then sees as one at once.
            same: dict = {}
            weighted = {}
            for v in self.vertices:
                key = (id(self.costs[v]), id(self.mem[v]))
                if key not in same:
                    same[key] = self.costs[v] + lam * self.mem[v]
                weighted[v] = same[key]
        result = self.search.run(costs=weighted, memory_budget=self.memory_budget)
        self.work += result.stats.table_entries
        self.plain_work += result.stats.plain_table_entries
        self.used_blocks = self.used_blocks or result.stats.blocks
        self.count += 1
        if self.progress is not None:
            self.progress(self.count, self.max_searches)
        return result

    def finish(self, status, choice, cost, lower_bound, multiplier, min_memory) -> CappedSearchResult:
        return CappedSearchResult(status, dict(choice), float(cost), self.memory_of(choice), min_memory,
                                  float(lower_bound), float(multiplier), self.count, self.work,
                                  time.perf_counter() - self.start, self.search, self.plain_work,
                                  self.used_blocks)

    def start_bisection(self, base, least: dict) -> None:
        self.bound = base.cost  # lambda = 0: F* <= any capped optimum
        self.best_choice, self.best_cost, self.best_lam = dict(least), self.tables.cost(least), float("inf")
        self.fitting = {_key(least, self.vertices): least}  # distinct strategies seen, for relinking
        self.over = {_key(base.choice, self.vertices): base.choice}

    def consider(self, lam: float, result) -> bool:
        """Record the optimum at ``lam``: raise the bound, keep it if it fits and is cheaper."""
        self.bound = max(self.bound, result.cost - lam * self.cap)
        used = self.memory_of(result.choice)
        cost = self.tables.cost(result.choice)
        if self.trace is not None:
            self.trace.append((lam, result.cost, used, cost))
        if used > self.cap:
            self.over.setdefault(_key(result.choice, self.vertices), result.choice)
            return False
        self.fitting.setdefault(_key(result.choice, self.vertices), result.choice)
        if cost < self.best_cost or (cost == self.best_cost and lam < self.best_lam):
            self.best_choice, self.best_cost, self.best_lam = result.choice, cost, lam
        return True

    def bisect(self, hi: float, tolerance: float, lambda_tolerance: float) -> None:
        """Grow ``hi`` (a first multiplier making the excess memory cost about as much as the
        optimum) until its optimum fits, then halve the bracket toward the smallest that fits."""
        lo = 0.0
        while self.count < self.max_searches and not self.consider(hi, self.solve(hi)):
            lo, hi = hi, 4.0 * hi
        while (self.count < self.max_searches and self.best_cost - self.bound > tolerance * self.best_cost
               and hi - lo > lambda_tolerance * hi):
            mid = 0.5 * (lo + hi)
            if self.consider(mid, self.solve(mid)):
                hi = mid
            else:
                lo = mid

    def relink_all(self) -> None:
        """The Lagrangian optimum jumps across the cap (a duality gap): mix every strategy seen
        that did not fit with every one that did, and keep the cheapest mix that fits. Costs
        are exact; only the choice among mixes is heuristic."""
        orders = (vertex_order(self.G), self.vertices)  # by vertex id, and in the search's sequence
        for a in self.fitting.values():
            start = (self.tables.cost(a), float(sum(self.mem[v][a[v]] for v in self.mem)))
            for b in self.over.values():
                for order in orders:
                    mixed, mixed_cost = _relink(self.tables, self.mem, a, b, self.cap, order, start)
                    if mixed_cost < self.best_cost:
                        self.best_choice, self.best_cost = mixed, mixed_cost


def _improve(tables: "_Tables", mem: dict, choice: dict, cap: float, vertices, passes: int = 50) -> tuple:
    """Local search: change one vertex at a time while the cost drops and memory fits.

    For each vertex the cost of every alternative configuration, given its neighbours'
    current ones, is one vector (its layer costs plus a row or column of each incident
    edge matrix); the cheapest alternative that keeps the strategy within the cap wins.
    """
    choice = dict(choice)
    used = float(sum(mem[v][choice[v]] for v in vertices))
    for _ in range(passes):
        improved = False
        for v in vertices:
            local = np.array(tables.nodes[v], dtype=np.float64)
            for a, m in tables.inward[v]:
                local = local + m[choice[a], :]
            for b, m in tables.outward[v]:
                local = local + m[:, choice[b]]
            room = cap - (used - mem[v][choice[v]])
            local = np.where(mem[v] <= room, local, np.inf)
            k = int(np.argmin(local))
            if local[k] < local[choice[v]] - 1e-12 * abs(local[choice[v]]):
                used += float(mem[v][k] - mem[v][choice[v]])
                choice[v] = k
                improved = True
        if not improved:
            break
    return choice, tables.cost(choice)


def _key(choice: dict, vertices) -> tuple:
    return tuple(choice[v] for v in vertices)


class _Tables:
    """A costed graph's tables read without the graph: each vertex's cost vector, its edges in
    and out (neighbour and matrix, in the graph's order), every edge, in the graph's order."""

    def __init__(self, G):
        self.nodes = {v: G.nodes[v]["cost"] for v in G.nodes}
        self.inward = {v: [(a, m) for a, _, m in G.in_edges(v, data="cost")] for v in G.nodes}
        self.outward = {v: [(b, m) for _, b, m in G.out_edges(v, data="cost")] for v in G.nodes}
        self.edges = list(G.edges(data="cost"))

    def cost(self, choice) -> float:
        """``F`` of a choice of configuration indices (``indexed_cost``, summed in its order)."""
        total = sum([float(c[choice[v]]) for v, c in self.nodes.items()])
        total += sum([float(m[choice[u], choice[v]]) for u, v, m in self.edges])
        return total


def _relink(tables: _Tables, mem: dict, fitting: dict, over: dict, cap: float, order, start: tuple) -> tuple:
    """The cheapest fitting strategy among prefix and suffix mixes of two strategies.

    Mix ``k`` takes the first ``k`` differing vertices of ``order`` (and, separately, the
    last ``k``) from ``over`` and the rest from ``fitting``. Each step changes one vertex,
    so cost and memory are updated through its incident edges only. ``start``: the cost and
    memory of ``fitting``.
    """
    differing = [v for v in order if fitting[v] != over[v]]
    start_cost, start_memory = start
    best_cost = start_cost
    best = None  # (steps, how many of them taken)
    for steps in (differing, differing[::-1]):
        choice = dict(fitting)
        cost, used = start_cost, start_memory
        for k, v in enumerate(steps, 1):
            old, new = choice[v], over[v]
            node = tables.nodes[v]
            delta = float(node[new] - node[old])
            # Edges in the graph's order, in-edges first: each term is the matrix entry after
            # the change less the one before.
            for a, m in tables.inward[v]:
                row = choice[a]
                delta += float(m[row, new] - m[row, old])
            for b, m in tables.outward[v]:
                column = choice[b]
                delta += float(m[new, column] - m[old, column])
            choice[v] = new
            cost += delta
            used += float(mem[v][new] - mem[v][old])
            if used <= cap and cost < best_cost:
                best, best_cost = (steps, k), cost
    if best is None:
        best_choice = fitting
    else:
        best_choice = dict(fitting)
        for v in best[0][:best[1]]:
            best_choice[v] = over[v]
    # Re-read the winner's cost from the tables, free of accumulated rounding.
    return best_choice, tables.cost(best_choice)
