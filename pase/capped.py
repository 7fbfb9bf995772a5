"""The memory-capped search (``memory.md``): the fastest strategy that fits ``M`` bytes per device.

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

from .builder import Network
from .machine import Machine
from .memory import MemoryModel
from .solver import Search, SearchStats
from .strategy import Strategy, indexed_cost, strategy_from_indices

__all__ = ["CappedStrategy", "find_capped_strategy", "UNCONSTRAINED", "CAPPED", "NOTHING_FITS"]

UNCONSTRAINED = "unconstrained"  # the unconstrained optimum fits
CAPPED = "capped"  # found by the Lagrangian search
NOTHING_FITS = "nothing-fits"  # even the least-memory strategy exceeds the cap


@dataclass(frozen=True)
class CappedStrategy:
    """Result of the capped search.

    Attributes
    ----------
    status : str
        ``"unconstrained"``, ``"capped"`` or ``"nothing-fits"``.
    strategy : Strategy
        The strategy returned: the unconstrained optimum, the cheapest fitting strategy
        found, or (nothing fits) the least-memory strategy.
    memory : float
        Its bytes per device.
    cap : float
        The cap ``M`` in bytes per device.
    min_memory : float or None
        The least memory any strategy needs (computed when the optimum does not fit).
    lower_bound : float
        A lower bound on the cost of any fitting strategy (the optimum itself when
        unconstrained).
    multiplier : float
        The smallest ``lambda`` found whose Lagrangian optimum fits (0 when
        unconstrained, infinite when nothing fits).
    searches : int
        Dynamic programmes run.
    table_entries : int
        Their total table entries (the DP work).
    seconds : float
        Total search time.
    """

    status: str
    strategy: Strategy
    memory: float
    cap: float
    min_memory: float | None
    lower_bound: float
    multiplier: float
    searches: int
    table_entries: int
    seconds: float

    @property
    def fits(self) -> bool:
        return self.memory <= self.cap

    @property
    def cost(self) -> float:
        return self.strategy.total_cost

    @property
    def gap(self) -> float:
        """Relative gap ``(cost - lower_bound) / cost`` between returned cost and bound."""
        if self.status == NOTHING_FITS:
            return float("nan")
        return max(self.cost - self.lower_bound, 0.0) / self.cost if self.cost else 0.0


def find_capped_strategy(
    network: Network,
    procs: int,
    cap_bytes: float,
    machine: Machine | None = None,
    memory: MemoryModel | None = None,
    ordering="generateseq",
    memory_budget: int | None = None,
    graph=None,
    max_searches: int = 40,
    tolerance: float = 1e-4,
    lambda_tolerance: float = 1e-4,
    progress: Callable[[int, int], None] | None = None,
    trace: list | None = None,
) -> CappedStrategy:
    """The cheapest strategy found whose per-device memory is at most ``cap_bytes``.

    Parameters
    ----------
    network, procs, machine, ordering, memory_budget, graph
        As for ``pase.strategy.find_strategy``.
    cap_bytes : float
        Memory cap per device, bytes.
    memory : MemoryModel, optional
        Bytes per parameter and activation element (default 16 and 2).
    max_searches : int
        At most this many dynamic programmes in the bisection.
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
    """
    if not cap_bytes > 0:
        raise ValueError(f"the memory cap must be positive, got {cap_bytes!r}")
    machine = machine or Machine()
    memory = memory or MemoryModel()
    G = graph if graph is not None else network.graph(procs, machine)
    vertices = range(len(network.layers))
    start = time.perf_counter()
    search = Search(G, ordering)
    costs = {v: G.nodes[v]["cost"] for v in vertices}
    mem = {v: m for v, m in zip(vertices, memory.vectors(network, [G.nodes[v]["configs"] for v in vertices]))}
    work = 0
    count = 0

    def memory_of(choice) -> float:
        return float(sum(mem[v][choice[v]] for v in vertices))

    def finish(status, choice, cost, lower_bound, multiplier, min_memory):
        seconds = time.perf_counter() - start
        e = search.estimate
        stats = SearchStats(e.ordering, work, e.largest_table, e.max_dependent_set, e.peak_bytes, seconds)
        strategy = strategy_from_indices(network, G, [choice[v] for v in vertices], cost, stats)
        return CappedStrategy(status, strategy, memory_of(choice), float(cap_bytes), min_memory,
                              float(lower_bound), float(multiplier), count, work, seconds)

    def run(lam: float):
        nonlocal work, count
        weighted = {v: costs[v] + lam * mem[v] for v in vertices} if lam else None
        result = search.run(costs=weighted, memory_budget=memory_budget)
        work += result.stats.table_entries
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
    best_choice, best_cost, best_lam = None, float("inf"), 0.0

    over_choice = None  # the latest Lagrangian optimum that did not fit

    def consider(lam, result):
        nonlocal bound, best_choice, best_cost, best_lam, over_choice
        bound = max(bound, result.cost - lam * cap_bytes)
        fits = memory_of(result.choice) <= cap_bytes
        if not fits:
            over_choice = result.choice
        if trace is not None:
            trace.append((lam, result.cost, memory_of(result.choice), indexed_cost(G, result.choice)))
        if fits:
            cost = indexed_cost(G, result.choice)
            if cost < best_cost:
                best_choice, best_cost, best_lam = result.choice, cost, lam
        return fits

    # A first multiplier that makes the excess memory cost about as much as the optimum.
    excess = memory_of(base.choice) - min_memory
    lo, hi = 0.0, max(base.cost, 1.0) / max(excess, 1.0)
    while not consider(hi, run(hi)):
        lo, hi = hi, 4.0 * hi
        if count >= max_searches:
            # Ever larger multipliers converge on the least-memory strategy, which fits.
            best_choice, best_cost, best_lam = least, indexed_cost(G, least), float("inf")
            break
    while count < max_searches and best_cost - bound > tolerance * best_cost and hi - lo > lambda_tolerance * hi:
        mid = 0.5 * (lo + hi)
        if consider(mid, run(mid)):
            hi = mid
        else:
            lo = mid
    # The Lagrangian optimum jumps across the cap (a duality gap): mix the last strategy
    # that did not fit with the best that did, switching vertices in id order, and keep
    # the cheapest mix that fits. Costs are exact; only the choice is heuristic.
    if over_choice is not None and best_choice is not None:
        mixed, mixed_cost = _relink(G, mem, best_choice, over_choice, cap_bytes)
        if mixed_cost < best_cost:
            best_choice, best_cost = mixed, mixed_cost
    return finish(CAPPED, best_choice, best_cost, min(bound, best_cost), best_lam, min_memory)


def _relink(G, mem: dict, fitting: dict, over: dict, cap: float):
    """The cheapest fitting strategy among prefix/suffix mixes of two strategies.

    Mix ``k`` takes the first ``k`` differing vertices (by id; and, separately, the last
    ``k``) from ``over`` and the rest from ``fitting``. Each step changes one vertex, so
    cost and memory are updated through its incident edges only.
    """
    vertices = sorted(G.nodes)
    differing = [v for v in vertices if fitting[v] != over[v]]
    incident = {v: [(a, b) for a, b in G.in_edges(v)] + [(a, b) for a, b in G.out_edges(v)] for v in differing}
    best_choice, best_cost = dict(fitting), indexed_cost(G, fitting)
    for order in (differing, differing[::-1]):
        choice = dict(fitting)
        cost = best_cost
        used = sum(float(mem[v][choice[v]]) for v in vertices)
        for v in order:
            old, new = choice[v], over[v]
            delta = float(G.nodes[v]["cost"][new] - G.nodes[v]["cost"][old])
            for a, b in incident[v]:
                m = G.edges[a, b]["cost"]
                before = m[choice[a], choice[b]]
                choice[v] = new
                after = m[choice[a], choice[b]]
                choice[v] = old
                delta += float(after - before)
            choice[v] = new
            cost += delta
            used += float(mem[v][new] - mem[v][old])
            if used <= cap and cost < best_cost:
                best_choice, best_cost = dict(choice), cost
    # Re-read the winner's cost from the tables, free of accumulated rounding.
    return best_choice, indexed_cost(G, best_choice)
