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
from pase.search.solver import Search, indexed_cost

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
    start = time.perf_counter()
    if search is None:
        search = Search(G, ordering, blocks=blocks)
    vertices = list(search.ordering.sequence)
    costs = {v: np.asarray(G.nodes[v]["cost"], dtype=np.float64) for v in vertices}
    mem = {}
    for v in vertices:
        mem[v] = np.asarray(memory[v], dtype=np.float64)
        if mem[v].shape != costs[v].shape:
            raise ValueError(f"vertex {v!r}: memory vector of shape {mem[v].shape}, costs {costs[v].shape}")
    work = plain_work = 0
    count = 0
    used_blocks = ()

    def memory_of(choice) -> float:
        return float(sum(mem[v][choice[v]] for v in vertices))

    def finish(status, choice, cost, lower_bound, multiplier, min_memory):
        return CappedSearchResult(status, dict(choice), float(cost), memory_of(choice), min_memory,
                                  float(lower_bound), float(multiplier), count, work,
                                  time.perf_counter() - start, search, plain_work, used_blocks)

    def run(lam: float):
        nonlocal work, plain_work, count, used_blocks
        weighted = {v: costs[v] + lam * mem[v] for v in vertices} if lam else None
        result = search.run(costs=weighted, memory_budget=memory_budget)
        work += result.stats.table_entries
        plain_work += result.stats.plain_table_entries
        used_blocks = used_blocks or result.stats.blocks
        count += 1
        if progress is not None:
            progress(count, max_searches)
        return result

    # 1. The unconstrained optimum, if it fits, is the answer.
    base = run(0.0)
    if memory_of(base.choice) <= cap_bytes:
        return finish(UNCONSTRAINED, base.choice, base.cost, base.cost, 0.0, None)

    # 2. Memory alone has no edge terms, so the least-memory strategy is each layer's
    #    least-memory configuration (ties: the cheaper layer cost, then the lower index).
    least = {v: int(np.lexsort((np.arange(len(mem[v])), costs[v], mem[v]))[0]) for v in vertices}
    min_memory = memory_of(least)
    if min_memory > cap_bytes:
        return finish(NOTHING_FITS, least, indexed_cost(G, least), float("nan"), float("inf"), min_memory)

    # 3. Bisection on lambda over exact dynamic programmes.
    bound = base.cost  # lambda = 0: F* <= any capped optimum
    best_choice, best_cost, best_lam = dict(least), indexed_cost(G, least), float("inf")
    fitting = {_key(least, vertices): least}  # distinct strategies seen, for relinking
    over = {_key(base.choice, vertices): base.choice}

    def consider(lam, result):
        nonlocal bound, best_choice, best_cost, best_lam
        bound = max(bound, result.cost - lam * cap_bytes)
        used = memory_of(result.choice)
        cost = indexed_cost(G, result.choice)
        if trace is not None:
            trace.append((lam, result.cost, used, cost))
        if used > cap_bytes:
            over.setdefault(_key(result.choice, vertices), result.choice)
            return False
        fitting.setdefault(_key(result.choice, vertices), result.choice)
        if cost < best_cost or (cost == best_cost and lam < best_lam):
            best_choice, best_cost, best_lam = result.choice, cost, lam
        return True

    # A first multiplier that makes the excess memory cost about as much as the optimum.
    excess = memory_of(base.choice) - min_memory
    lo, hi = 0.0, max(base.cost, 1.0) / max(excess, 1.0)
    while count < max_searches and not consider(hi, run(hi)):
        lo, hi = hi, 4.0 * hi
    while count < max_searches and best_cost - bound > tolerance * best_cost and hi - lo > lambda_tolerance * hi:
        mid = 0.5 * (lo + hi)
        if consider(mid, run(mid)):
            hi = mid
        else:
            lo = mid

    # The Lagrangian optimum jumps across the cap (a duality gap): mix every strategy seen
    # that did not fit with every one that did, and keep the cheapest mix that fits.
    # Costs are exact; only the choice among mixes is heuristic.
    orders = (vertex_order(G), vertices)  # by vertex id, and in the search's sequence
    for a in fitting.values():
        for b in over.values():
            for order in orders:
                mixed, mixed_cost = _relink(G, mem, a, b, cap_bytes, order)
                if mixed_cost < best_cost:
                    best_choice, best_cost = mixed, mixed_cost
    best_choice, best_cost = _improve(G, mem, best_choice, cap_bytes, vertices)
    return finish(CAPPED, best_choice, best_cost, min(bound, best_cost), best_lam, min_memory)


def _improve(G, mem: dict, choice: dict, cap: float, vertices, passes: int = 50) -> tuple:
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
            local = np.array(G.nodes[v]["cost"], dtype=np.float64)
            for a, _, m in G.in_edges(v, data="cost"):
                local = local + m[choice[a], :]
            for _, b, m in G.out_edges(v, data="cost"):
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
    return choice, indexed_cost(G, choice)


def _key(choice: dict, vertices) -> tuple:
    return tuple(choice[v] for v in vertices)


def _relink(G, mem: dict, fitting: dict, over: dict, cap: float, order) -> tuple:
    """The cheapest fitting strategy among prefix and suffix mixes of two strategies.

    Mix ``k`` takes the first ``k`` differing vertices of ``order`` (and, separately, the
    last ``k``) from ``over`` and the rest from ``fitting``. Each step changes one vertex,
    so cost and memory are updated through its incident edges only.
    """
    differing = [v for v in order if fitting[v] != over[v]]
    incident = {v: list(G.in_edges(v)) + list(G.out_edges(v)) for v in differing}
    start_cost = indexed_cost(G, fitting)
    start_memory = float(sum(mem[v][fitting[v]] for v in mem))
    best_choice, best_cost = fitting, start_cost
    for steps in (differing, differing[::-1]):
        choice = dict(fitting)
        cost, used = start_cost, start_memory
        for v in steps:
            old, new = choice[v], over[v]
            delta = float(G.nodes[v]["cost"][new] - G.nodes[v]["cost"][old])
            for a, b in incident[v]:
                m = G.edges[a, b]["cost"]
                before = m[choice[a], choice[b]]
                choice[v] = new
                delta += float(m[choice[a], choice[b]] - before)
                choice[v] = old
            choice[v] = new
            cost += delta
            used += float(mem[v][new] - mem[v][old])
            if used <= cap and cost < best_cost:
                best_choice, best_cost = dict(choice), cost
    # Re-read the winner's cost from the tables, free of accumulated rounding.
    return best_choice, indexed_cost(G, best_choice)
