"""Stage 3: the exact search, a dynamic programme over dependent sets (paper Eq. 4, Fig. 4).

The solver knows nothing of neural networks. It takes a directed graph whose vertices carry
a layer-cost vector ``cost`` (length ``K_v``) and whose edges ``(u, v)`` carry a ``K_u x K_v``
cost matrix ``cost``, and returns one configuration index per vertex minimising the sum of
the chosen entries. Tables are NumPy min-plus reductions, processed in cache-sized slices.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .ordering import Ordering, get_ordering

__all__ = [
    "Search",
    "SearchResult",
    "SearchStats",
    "WorkEstimate",
    "SearchTooLarge",
    "solve",
    "available_memory",
    "DEFAULT_CHUNK_ENTRIES",
]

#: Table entries per slice: about 1 MiB of float64, so a slice and its temporaries stay in
#: the L2/L3 caches while it is summed, reduced and gathered.
DEFAULT_CHUNK_ENTRIES = 1 << 17

#: Share of the available memory that the default budget allows the search to use.
DEFAULT_MEMORY_SHARE = 0.8


class SearchTooLarge(MemoryError):
    """The search's tables would not fit the memory budget; raised before allocating.

    Attributes carry the estimate: ``estimate`` (a ``WorkEstimate``) and ``budget`` (bytes).
    """

    def __init__(self, estimate: "WorkEstimate", budget: int):
        self.estimate = estimate
        self.budget = budget
        super().__init__(
            f"the {estimate.ordering} search is too large: it needs about {_bytes(estimate.peak_bytes)} "
            f"for {estimate.table_entries:.3g} table entries (largest table {estimate.largest_table:.3g} "
            f"entries, largest dependent set {estimate.max_dependent_set}), over the budget of {_bytes(budget)}"
        )


@dataclass(frozen=True)
class WorkEstimate:
    """What a search will do, known before it allocates anything.

    Attributes
    ----------
    ordering : str
        The ordering heuristic.
    table_entries : int
        ``sum over i of prod(K_u for u in D(i) ∪ {v(i)})``: the search's inherent work.
    largest_table : int
        The largest single table (entries).
    max_dependent_set : int
        The largest ``|D(i)|``.
    peak_bytes : int
        Estimated peak memory of the tables kept and the slice being worked on.
    """

    ordering: str
    table_entries: int
    largest_table: int
    max_dependent_set: int
    peak_bytes: int


@dataclass(frozen=True)
class SearchStats:
    """Statistics of a finished search (the estimate plus the time it took)."""

    ordering: str
    table_entries: int
    largest_table: int
    max_dependent_set: int
    peak_bytes: int
    seconds: float

    @property
    def ns_per_entry(self) -> float:
        return 1e9 * self.seconds / max(self.table_entries, 1)


@dataclass(frozen=True)
class SearchResult:
    """The optimum: one configuration index per vertex and the minimum total cost."""

    choice: dict
    cost: float
    stats: SearchStats
    sequence: tuple

    def indices(self, vertices=None) -> list:
        """Configuration indices in ``vertices`` order (default: sorted vertex ids)."""
        return [self.choice[v] for v in (sorted(self.choice) if vertices is None else vertices)]


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable`` if known)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000.0
    return f"{n:.3g} PB"  # pragma: no cover


def _index_dtype(k: int):
    return np.uint8 if k <= 1 << 8 else np.uint16 if k <= 1 << 16 else np.uint32


class _Term:
    """One addend of a table: an array over a subset of the table's axes."""

    __slots__ = ("array", "axes")

    def __init__(self, array: np.ndarray, axes: tuple):
        self.array = array  # full rank, size 1 on the axes it lacks
        self.axes = axes  # positions of the axes it spans


class Search:
    """A prepared search: the ordering, dependent sets and edge terms of one graph.

    Everything that does not depend on the layer costs is computed once, so the same
    search can be rerun with other vertex costs (the memory-capped search does).

    Parameters
    ----------
    G : networkx.DiGraph
        Vertices with a 1-D ``cost`` array; edges ``(u, v)`` with a ``(K_u, K_v)``
        ``cost`` array. Antiparallel edges are summed. ``G`` is not modified.
    ordering : str or callable
        ``"generateseq"`` (default), ``"breadth-first"``, or a function of the graph
        returning an ``Ordering``.
    chunk_entries : int
        Table entries processed per slice.

    Examples
    --------
    >>> import networkx as nx, numpy as np
    >>> G = nx.DiGraph()
    >>> G.add_node(0, cost=np.array([1.0, 5.0]))
    >>> G.add_node(1, cost=np.array([4.0, 0.0]))
    >>> G.add_edge(0, 1, cost=np.array([[0.0, 9.0], [0.0, 0.0]]))
    >>> r = Search(G).run()
    >>> r.cost, r.indices()
    (5.0, [0, 0])
    """

    def __init__(self, G, ordering="generateseq", chunk_entries: int = DEFAULT_CHUNK_ENTRIES):
        if chunk_entries < 1:
            raise ValueError("chunk_entries must be positive")
        self.chunk_entries = int(chunk_entries)
        self.vertices = list(G.nodes)
        self.K = {}
        self.base_costs = {}
        for v, data in G.nodes(data=True):
            cost = data.get("cost")
            if cost is None:
                raise ValueError(f"vertex {v!r} has no 'cost' vector")
            cost = np.asarray(cost, dtype=np.float64)
            if cost.ndim != 1 or cost.size == 0:
                raise ValueError(f"vertex {v!r}: the cost must be a non-empty 1-D array, got shape {cost.shape}")
            if np.isnan(cost).any():
                raise ValueError(f"vertex {v!r}: the cost vector contains NaN")
            self.K[v] = cost.size
            self.base_costs[v] = cost
        self.ordering: Ordering = get_ordering(ordering)(G)
        seq = self.ordering.sequence
        self.position = {v: i for i, v in enumerate(seq)}
        self.axes = {v: self.ordering.dependent[v] + (v,) for v in seq}

        # Edge matrices, oriented (later vertex, earlier vertex) and summed per pair; each
        # is an addend of the earlier vertex's table (H_V of Eq. 3).
        edge_terms: dict = {}
        for u, v, data in G.edges(data=True):
            if u == v:
                raise ValueError(f"vertex {u!r} has an edge to itself")
            matrix = data.get("cost")
            if matrix is None:
                raise ValueError(f"edge {(u, v)!r} has no 'cost' matrix")
            matrix = np.asarray(matrix, dtype=np.float64)
            if matrix.shape != (self.K[u], self.K[v]):
                raise ValueError(
                    f"edge {(u, v)!r}: the cost matrix has shape {matrix.shape}, expected {(self.K[u], self.K[v])}"
                )
            if np.isnan(matrix).any():
                raise ValueError(f"edge {(u, v)!r}: the cost matrix contains NaN")
            if self.position[u] < self.position[v]:
                u, v, matrix = v, u, matrix.T
            key = (u, v)
            edge_terms[key] = edge_terms[key] + matrix if key in edge_terms else matrix
        self.edge_terms: dict = {v: [] for v in seq}
        for (later, earlier), matrix in sorted(edge_terms.items(), key=lambda kv: (self.position[kv[0][1]], self.position[kv[0][0]])):
            self.edge_terms[earlier].append((later, matrix))

        # Hand-off of tables: T_w goes to the vertex of D(w) that comes first in the
        # sequence (the connected subsets S(i) of Eq. 4); a vertex with empty D(w) closes a
        # connected component and its scalar adds to the optimum.
        self.handed: dict = {v: [] for v in seq}
        for w in seq:
            dw = self.ordering.dependent[w]
            if dw:
                self.handed[dw[-1]].append(w)
        self.estimate = self._estimate()

    # ----------------------------------------------------------------------------------

    def table_size(self, v) -> int:
        """Entries of the table of ``v``: ``prod(K_u for u in D(v) ∪ {v})``."""
        return math.prod(self.K[u] for u in self.axes[v])

    def _estimate(self) -> WorkEstimate:
        entries = largest = 0
        kept = alive = peak = 0
        reduced = {}
        for v in self.ordering.sequence:
            size = self.table_size(v)
            entries += size
            largest = max(largest, size)
            reduced[v] = size // self.K[v]
            # Alive: argmin arrays so far, tables not yet handed on, this table's result,
            # and the slice being summed (buffer, one temporary, the pre-summed addends).
            kept += reduced[v] * np.dtype(_index_dtype(self.K[v])).itemsize
            slice_entries = min(size, max(self.chunk_entries, self.K[v]))
            working = 8 * (3 * slice_entries + 2 * reduced[v]) + 8 * slice_entries // max(self.K[v], 1)
            peak = max(peak, kept + alive + working)
            alive += 8 * reduced[v]
            alive -= sum(8 * reduced[w] for w in self.handed[v])
        return WorkEstimate(self.ordering.name, entries, largest, self.ordering.max_dependent_set, peak)

    def check_budget(self, budget: int | None = None) -> int:
        """Raise ``SearchTooLarge`` unless the estimate fits ``budget`` bytes; returns the budget.

        The default budget is 80 % of the machine's available memory.
        """
        if budget is None:
            budget = int(DEFAULT_MEMORY_SHARE * available_memory())
        if self.estimate.peak_bytes > budget:
            raise SearchTooLarge(self.estimate, budget)
        return budget

    # ----------------------------------------------------------------------------------

    def run(
        self,
        costs: dict | None = None,
        memory_budget: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> SearchResult:
        """Run the dynamic programme; ``costs`` optionally replaces the vertex cost vectors.

        ``progress(done, total)`` is called as table entries are processed. Raises
        ``SearchTooLarge`` before allocating if the estimate exceeds ``memory_budget``.
        """
        self.check_budget(memory_budget)
        if costs is None:
            costs = self.base_costs
        else:
            costs = {v: np.asarray(costs[v], dtype=np.float64) for v in self.vertices}
            for v, c in costs.items():
                if c.shape != (self.K[v],):
                    raise ValueError(f"vertex {v!r}: the cost vector has shape {c.shape}, expected {(self.K[v],)}")
        start = time.perf_counter()
        total_entries = self.estimate.table_entries
        done = 0
        tables: dict = {}
        argmins: dict = {}
        optimum = 0.0
        for v in self.ordering.sequence:
            axes = self.axes[v]
            where = {u: i for i, u in enumerate(axes)}
            shape = tuple(self.K[u] for u in axes)
            rank = len(shape)

            def term(array, over):
                positions = tuple(where[u] for u in over)
                full = [1] * rank
                for p, u in zip(positions, over):
                    full[p] = self.K[u]
                return _Term(array.reshape(full), positions)

            terms = [term(costs[v], (v,))]
            terms += [term(matrix, (later, v)) for later, matrix in self.edge_terms[v]]
            for w in self.handed[v]:
                terms.append(term(tables.pop(w), self.ordering.dependent[w]))
            table, argmin = self._reduce(terms, shape, progress, done, total_entries)
            done += math.prod(shape)
            argmins[v] = argmin
            if rank == 1:
                optimum += float(table)
            else:
                tables[v] = table
        choice = {}
        for v in reversed(self.ordering.sequence):
            index = tuple(choice[u] for u in self.ordering.dependent[v])
            choice[v] = int(argmins[v][index])
        seconds = time.perf_counter() - start
        e = self.estimate
        stats = SearchStats(e.ordering, e.table_entries, e.largest_table, e.max_dependent_set, e.peak_bytes, seconds)
        return SearchResult(choice, optimum, stats, self.ordering.sequence)

    def _reduce(self, terms, shape, progress, done, total_entries):
        """``min`` over the last axis of the sum of ``terms``, slice by slice.

        Returns the reduced table (shape ``shape[:-1]``) and the argmin of the last axis.
        """
        rank = len(shape)
        kv = shape[-1]
        reduced = np.empty(shape[:-1], dtype=np.float64)
        argmin = np.empty(shape[:-1], dtype=_index_dtype(kv))
        # Slice the leading axes so that one slice holds at most chunk_entries entries:
        # axes before `cut` one index at a time, axis `cut` in ranges of `step`.
        tail = 1
        cut = rank
        while cut > 0 and tail * shape[cut - 1] <= self.chunk_entries:
            cut -= 1
            tail *= shape[cut]
        if cut == 0 or rank == 1:  # one slice: the whole table (or one vertex, no D)
            buf = np.empty(shape, dtype=np.float64)
            self._sum_into([t.array for t in terms], buf)
            self._argmin_into(buf, argmin, reduced)
            if progress is not None:
                progress(done + buf.size, total_entries)
            return (reduced if rank > 1 else reduced[()]), argmin
        if cut == rank:  # the last axis alone exceeds a slice: slice it no further
            cut = rank - 1
            tail = shape[-1]
        sliced_axis = cut - 1
        step = max(1, self.chunk_entries // tail)
        # Addends that span no sliced axis are summed once, before the loop.
        fixed = [t.array for t in terms if min(t.axes) >= cut]
        moving = [t for t in terms if min(t.axes) < cut]
        if fixed:
            # Read again for every slice: make it one contiguous array (edge matrices
            # arrive as transposed views).
            fixed = [np.ascontiguousarray(self._sum_tree(fixed))]
        chunk_shape = (1,) * sliced_axis + (min(step, shape[sliced_axis]),) + shape[cut:]
        buf = np.empty(chunk_shape, dtype=np.float64)
        processed = done
        for outer in np.ndindex(*shape[:sliced_axis]):
            for a in range(0, shape[sliced_axis], step):
                b = min(a + step, shape[sliced_axis])
                parts = list(fixed)
                for t in moving:
                    index = tuple(
                        slice(0, 1) if t.array.shape[i] == 1 else slice(outer[i], outer[i] + 1)
                        for i in range(sliced_axis)
                    ) + (slice(0, 1) if t.array.shape[sliced_axis] == 1 else slice(a, b),)
                    parts.append(t.array[index])
                out = buf if b - a == chunk_shape[sliced_axis] else buf[(slice(None),) * sliced_axis + (slice(0, b - a),)]
                self._sum_into(parts, out)
                target = outer + (slice(a, b),)
                self._argmin_into(out, argmin[target], reduced[target])
                if progress is not None:
                    processed += out.size
                    progress(processed, total_entries)
        return reduced, argmin

    @staticmethod
    def _sum_tree(arrays):
        """Sum broadcastable arrays, always adding the pair with the smallest result first."""
        arrays = list(arrays)
        while len(arrays) > 1:
            best = None
            for i in range(len(arrays)):
                for j in range(i + 1, len(arrays)):
                    size = math.prod(np.broadcast_shapes(arrays[i].shape, arrays[j].shape))
                    if best is None or size < best[0]:
                        best = (size, i, j)
            _, i, j = best
            merged = arrays[i] + arrays[j]
            arrays = [a for k, a in enumerate(arrays) if k not in (i, j)] + [merged]
        return arrays[0]

    @classmethod
    def _sum_into(cls, arrays, out):
        """``out[...] = sum(arrays)`` with one full-size pass where possible."""
        if len(arrays) == 1:
            np.copyto(out, arrays[0])
            return
        # Sum all but the largest addend in a tree, then add the largest into ``out``.
        largest = max(range(len(arrays)), key=lambda i: math.prod(arrays[i].shape))
        rest = [a for i, a in enumerate(arrays) if i != largest]
        np.add(arrays[largest], cls._sum_tree(rest), out=out)

    @staticmethod
    def _argmin_into(table, argmin_out, reduced_out):
        """One argmin over the last axis, then gather the minima (no second full pass)."""
        best = np.argmin(table, axis=-1)
        argmin_out[...] = best.reshape(argmin_out.shape)
        gathered = np.take_along_axis(table, best[..., None], axis=-1)
        reduced_out[...] = gathered.reshape(reduced_out.shape)


def solve(
    G,
    ordering="generateseq",
    memory_budget: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
) -> SearchResult:
    """Find the configuration of every vertex minimising the total cost, exactly.

    Shorthand for ``Search(G, ordering, chunk_entries).run(memory_budget=..., progress=...)``.
    """
    return Search(G, ordering, chunk_entries).run(memory_budget=memory_budget, progress=progress)
