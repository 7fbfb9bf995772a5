"""Stage 3: the exact search, a dynamic programme over dependent sets (paper Eq. 4, Fig. 4).

The solver knows nothing of neural networks. It takes a directed graph whose vertices carry
a layer-cost vector ``cost`` (length ``K_v``) and whose edges ``(u, v)`` carry a ``K_u x K_v``
cost matrix ``cost``, and returns one configuration index per vertex minimising the sum of
the chosen entries. Tables are NumPy min-plus reductions, processed in cache-sized slices.

Repeated blocks (issue 12): where the graph holds runs of identical, identically wired
blocks (``pase.search.blocks``), the search eliminates the inside of one copy once, leaving a table
over its boundary (the previous copy's interface, shared vertices, its own interface), and
then solves a reduced graph in which every copy is one chain link carrying that table.
The optimum is the plain programme's; ``blocks=False`` runs the plain programme alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import networkx as nx
import numpy as np

from pase.core.budget import default_table_budget
from pase.core.errors import TooLarge
from pase.core.units import format_bytes

from pase.search.blocks import describe_blocks, find_block_runs, is_periodic
from pase.search.ordering import Ordering, vertex_order, generate_seq, get_ordering
from pase.search.tables import edge_matrices, vertex_costs
from pase.core.checks import a_callable, a_costed_graph, arguments, optional, positive_int, positive_number

__all__ = [
    "Search",
    "SearchResult",
    "SearchStats",
    "WorkEstimate",
    "SearchTooLarge",
    "solve",
    "indexed_cost",
    "DEFAULT_CHUNK_ENTRIES",
    "MAX_TABLE_AXES",
]

#: Table entries per slice: about 1 MiB of float64, so a slice and its temporaries stay in
#: the L2/L3 caches while it is summed, reduced and gathered.
DEFAULT_CHUNK_ENTRIES = 1 << 17

#: Most axes of size > 1 a table may have: NumPy's broadcasting and iterators stop at 32.
#: Axes of size one (vertices with a single configuration) are dropped from every table.
MAX_TABLE_AXES = 32


class SearchTooLarge(TooLarge):
    """The search's tables would not fit the memory budget (or NumPy); raised before allocating.

    Attributes carry the estimate: ``estimate`` (a ``WorkEstimate``) and ``budget`` (bytes).
    """

    def __init__(self, estimate: "WorkEstimate", budget: int, reason: str | None = None):
        self.estimate = estimate
        self.budget = budget
        if reason is None:
            reason = (
                f"it needs about {format_bytes(estimate.peak_bytes)} for {estimate.table_entries:.3g} table entries "
                f"(largest table {estimate.largest_table:.3g} entries, largest dependent set "
                f"{estimate.max_dependent_set}), over the budget of {format_bytes(budget)}"
            )
        super().__init__(f"the {estimate.ordering} search is too large: {reason}")


@dataclass(frozen=True)
class WorkEstimate:
    """What a search will do, known before it allocates anything.

    Attributes
    ----------
    ordering : str
        The ordering heuristic.
    table_entries : int
        Table entries the search computes. For the plain programme
        ``sum over i of prod(K_u for u in D(i) ∪ {v(i)})``, its inherent work; with blocks,
        the block tables (once per run) plus the reduced graph's tables (the chain).
    largest_table : int
        The largest single table (entries).
    max_dependent_set : int
        The largest ``|D(i)|``.
    peak_bytes : int
        Estimated peak memory of the tables kept and the slice being worked on.
    plain_table_entries : int
        Table entries of the plain programme on the whole graph (equal to
        ``table_entries`` when no blocks are used).
    blocks : tuple of pase.search.blocks.BlockSummary
        The runs of identical blocks solved once (empty: the plain programme).
    table_axes : int
        The most axes of size > 1 of any table (NumPy handles ``MAX_TABLE_AXES``).
    """

    ordering: str
    table_entries: int
    largest_table: int
    max_dependent_set: int
    peak_bytes: int
    plain_table_entries: int | None = None
    blocks: tuple = ()
    table_axes: int = 0

    def __post_init__(self):
        if self.plain_table_entries is None:
            object.__setattr__(self, "plain_table_entries", self.table_entries)

    @property
    def blocks_description(self) -> str:
        """``"none"``, or the runs used, e.g. ``"1 run: 39 copies of 12 vertices from vertex 2 (100 states)"``."""
        return describe_blocks(self.blocks)


@dataclass(frozen=True)
class SearchStats:
    """Statistics of a finished search: its work estimate and the time it took.

    Every attribute of the estimate reads through: ``stats.ordering``, ``.table_entries``,
    ``.largest_table``, ``.max_dependent_set``, ``.peak_bytes``, ``.plain_table_entries``,
    ``.blocks``, ``.blocks_description``, ``.table_axes``.

    >>> SearchStats(WorkEstimate("generateseq", 2000, 1000, 1, 9000), 1e-6).ns_per_entry
    0.5
    """

    estimate: WorkEstimate
    seconds: float

    def __getattr__(self, name):
        # Called only for names the dataclass itself lacks: the estimate's.
        if name.startswith("__") or name == "estimate":
            raise AttributeError(name)
        return getattr(self.estimate, name)

    @property
    def ns_per_entry(self) -> float:
        return 1e9 * self.seconds / max(self.table_entries, 1)


@dataclass(frozen=True)
class SearchResult:
    """The optimum: one configuration index per vertex and the minimum total cost.

    ``sequence`` is the ordering's sequence of the whole graph (with blocks, the dynamic
    programme ran on the block and reduced graphs instead; ``stats.blocks`` says which).
    """

    choice: dict
    cost: float
    stats: SearchStats
    sequence: tuple

    def indices(self, vertices=None) -> list:
        """Configuration indices in ``vertices`` order (default: sorted vertex ids)."""
        return [self.choice[v] for v in (sorted(self.choice) if vertices is None else vertices)]


def _index_dtype(k: int):
    return np.uint8 if k <= 1 << 8 else np.uint16 if k <= 1 << 16 else np.uint32


class _Term:
    """One addend of a table: an array over a subset of the table's axes."""

    __slots__ = ("array", "axes")

    def __init__(self, array: np.ndarray, axes: tuple):
        self.array = array  # full rank, size 1 on the axes it lacks
        self.axes = axes  # positions of the axes it spans


@dataclass(frozen=True)
class _Work:
    """The estimate of one elimination (internal)."""

    entries: int
    largest: int
    max_dependent: int
    peak: int  # bytes at the busiest moment
    retained: int  # bytes still held when it is done (argmins and the kept table)
    axes: int  # most axes of size > 1 of any table


class _Elimination:
    """The dynamic programme along one sequence, over factors of any arity (internal).

    Variables ``v`` have ``K[v]`` configurations. Factors are arrays over a *scope* (a tuple
    of variables, the array's axes in that order): the edge matrices, and in the block
    search the block tables. Unary costs are given to ``run``. Every variable of the
    ordering's sequence is eliminated except ``keep``, which the sequence must end with,
    in reverse (so that ``keep[0]`` comes last): the result is then a table over ``keep``
    (axes in ``keep`` order) besides the constant of the parts that touch none of them.

    Tables keep their axes "latest first" (the ordering's convention for ``D(v)``) and
    drop the axes of variables with one configuration, so a dependent set of any width
    whose other members have ``K = 1`` still makes a small table.
    """

    def __init__(self, K: dict, ordering: Ordering, scopes: list, arrays: list, keep: tuple = (),
                 chunk_entries: int = DEFAULT_CHUNK_ENTRIES):
        self.K = K
        self.ordering = ordering
        self.chunk_entries = chunk_entries
        self.keep = tuple(keep)
        full = ordering.sequence
        eliminated = len(full) - len(self.keep)
        if tuple(reversed(full[eliminated:])) != self.keep:
            raise ValueError("the sequence must end with the kept variables, in reverse")  # pragma: no cover
        self.sequence = full[:eliminated]
        self.position = {v: i for i, v in enumerate(full)}
        kept = set(self.keep)
        self.dependent = {v: ordering.dependent[v] for v in self.sequence}
        # Axes of v's table: D(v) without single-configuration variables, then v.
        self.axes = {v: tuple(u for u in self.dependent[v] if K[u] > 1) + (v,) for v in self.sequence}
        # Factors go to their earliest variable (all others are in its D: the scope is a
        # clique of the graph the ordering eliminated), pre-permuted to latest-first axes.
        self.scopes = scopes
        self.fixed = {}
        self.permutation = {}
        self.owned = {v: [] for v in self.sequence}
        self.kept_factors = []
        for f, scope in enumerate(scopes):
            perm = tuple(sorted(range(len(scope)), key=lambda i: -self.position[scope[i]]))
            latest_first = tuple(scope[i] for i in perm)
            self.permutation[f] = perm
            if arrays[f] is not None:
                self.fixed[f] = np.transpose(arrays[f], perm)
            owner = latest_first[-1]
            target = self.kept_factors if owner in kept else self.owned[owner]
            target.append((tuple(self.position[u] for u in latest_first), f, latest_first))
        for factors in [self.kept_factors, *self.owned.values()]:
            factors.sort()
        # Hand-off of tables: T_w goes to the vertex of D(w) that comes first in the
        # sequence (the connected subsets S(i) of Eq. 4); a vertex with empty D(w) closes a
        # connected component and its scalar adds to the constant.
        self.handed = {v: [] for v in self.sequence}
        self.kept_handed = []
        for w in self.sequence:
            dw = self.dependent[w]
            if dw:
                (self.kept_handed if dw[-1] in kept else self.handed[dw[-1]]).append(w)
        self.work = self._estimate()

    def table_size(self, v) -> int:
        return math.prod(self.K[u] for u in self.axes[v])

    def _estimate(self) -> _Work:
        entries = largest = 0
        kept = alive = peak = 0
        reduced = {}
        axes = 0
        for v in self.sequence:
            size = self.table_size(v)
            entries += size
            largest = max(largest, size)
            axes = max(axes, sum(self.K[u] > 1 for u in self.axes[v]))
            reduced[v] = size // self.K[v]
            # Alive: argmin arrays so far, tables not yet handed on, this table's result,
            # and the slice being summed (buffer, one temporary, the pre-summed addends).
            kept += reduced[v] * np.dtype(_index_dtype(self.K[v])).itemsize
            slice_entries = min(size, max(self.chunk_entries, self.K[v]))
            working = 8 * (3 * slice_entries + 2 * reduced[v]) + 8 * slice_entries // max(self.K[v], 1)
            working += self._sliced_copies(v)
            peak = max(peak, kept + alive + working)
            alive += 8 * reduced[v]
            alive -= sum(8 * reduced[w] for w in self.handed[v])
        if self.keep:
            size = math.prod(self.K[u] for u in self.keep)
            entries += size
            largest = max(largest, size)
            axes = max(axes, sum(self.K[u] > 1 for u in self.keep))
            peak = max(peak, kept + alive + 16 * size)
            kept += 8 * size
        max_dependent = max((len(d) for d in self.dependent.values()), default=0)
        return _Work(entries, largest, max_dependent, peak, kept, axes)

    def _sliced_copies(self, v) -> int:
        """Bytes of the copies ``_reduce`` makes of the addends it slices (at most)."""
        axes = self.axes[v]
        shape = [self.K[u] for u in axes]
        tail, cut = 1, len(shape)
        while cut > 0 and tail * shape[cut - 1] <= self.chunk_entries:
            cut -= 1
            tail *= shape[cut]
        if cut == 0 or len(shape) == 1:
            return 0  # one slice: nothing is copied
        cut = min(cut, len(shape) - 1)
        where = {u: i for i, u in enumerate(axes)}
        groups: dict = {}
        for _, _, over in self.owned[v]:
            spans = tuple(where[u] for u in over if u in where)
            groups.setdefault(spans, []).append(True)  # a factor: maybe a transposed view
        for w in self.handed[v]:
            spans = tuple(where[u] for u in self.axes[w][:-1])
            groups.setdefault(spans, []).append(False)  # a table: already in table order
        copied = 0
        for spans, factors in groups.items():
            if spans and min(spans) < cut and (len(factors) > 1 or factors[0]):
                copied += 8 * math.prod(shape[i] for i in spans)
        return copied

    def run(self, unary: dict, dynamic: dict, progress, done: int, total: int):
        """Eliminate the sequence; returns ``(constant, kept table or None, argmins, done)``.

        ``unary`` maps variables to cost vectors (absent: no cost); ``dynamic`` maps the
        indices of factors given without an array to their arrays (scope order).
        """
        K = self.K
        tables: dict = {}
        argmins: dict = {}
        constant = 0.0

        def term(array, over, where, rank):
            full = [1] * rank
            positions = []
            for u in over:
                i = where.get(u)
                if i is not None:
                    full[i] = K[u]
                    positions.append(i)
            return _Term(np.reshape(array, full), tuple(positions))

        def factor(f):
            return self.fixed[f] if f in self.fixed else np.transpose(dynamic[f], self.permutation[f])

        for v in self.sequence:
            axes = self.axes[v]
            where = {u: i for i, u in enumerate(axes)}
            shape = tuple(K[u] for u in axes)
            rank = len(shape)
            terms = [term(unary[v], (v,), where, rank)] if v in unary else []
            terms += [term(factor(f), over, where, rank) for _, f, over in self.owned[v]]
            for w in self.handed[v]:
                terms.append(term(tables.pop(w), self.axes[w][:-1], where, rank))
            if not terms:
                terms.append(term(np.zeros(K[v]), (v,), where, rank))
            table, argmin = self._reduce(terms, shape, progress, done, total)
            done += math.prod(shape)
            argmins[v] = argmin
            if self.dependent[v]:
                tables[v] = table
            else:
                constant += float(table)
        kept_table = None
        if self.keep:
            where = {u: i for i, u in enumerate(self.keep)}
            shape = tuple(K[u] for u in self.keep)
            rank = len(shape)
            kept_table = np.zeros(shape)
            addends = [term(unary[u], (u,), where, rank) for u in self.keep if u in unary]
            addends += [term(factor(f), over, where, rank) for _, f, over in self.kept_factors]
            addends += [term(tables.pop(w), self.axes[w][:-1], where, rank) for w in self.kept_handed]
            for t in addends:
                kept_table += t.array
            done += kept_table.size
            if progress is not None:
                progress(done, total)
        return constant, kept_table, argmins, done

    def back_substitute(self, argmins: dict, known: dict) -> dict:
        """Configurations of the eliminated variables, latest first, given the kept ones.

        Known values may be integers or integer arrays of one shape (many copies at once).
        """
        choice = dict(known)
        for v in reversed(self.sequence):
            choice[v] = argmins[v][tuple(choice[u] for u in self.axes[v][:-1])]
        return choice

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
            _sum_into([t.array for t in terms], buf)
            _argmin_into(buf, argmin, reduced)
            if progress is not None:
                progress(done + buf.size, total_entries)
            return reduced, argmin
        if cut == rank:  # the last axis alone exceeds a slice: slice it no further
            cut = rank - 1
            tail = shape[-1]
        sliced_axis = cut - 1
        step = max(1, self.chunk_entries // tail)
        # Addends that span no sliced axis are summed once, before the loop.
        fixed = [t.array for t in terms if min(t.axes, default=rank) >= cut]
        # Addends sliced for every chunk are read row by row: a transposed edge matrix
        # would be read across its rows, so copy it once into the table's axis order.
        # Addends over the same axes are summed first (each is a fraction of the table).
        same: dict = {}
        for t in terms:
            if min(t.axes, default=rank) < cut:
                same.setdefault(t.array.shape, []).append(t)
        moving = []
        for group in same.values():
            array = group[0].array if len(group) == 1 else _sum_tree([t.array for t in group])
            moving.append(_Term(np.ascontiguousarray(array), group[0].axes))
        if fixed:
            # Read again for every slice: make it one contiguous array (edge matrices
            # arrive as transposed views).
            fixed = [np.ascontiguousarray(_sum_tree(fixed))]
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
                _sum_into(parts, out)
                target = outer + (slice(a, b),)
                _argmin_into(out, argmin[target], reduced[target])
                if progress is not None:
                    processed += out.size
                    progress(processed, total_entries)
        return reduced, argmin


def _sum_tree(arrays):
    """Sum broadcastable arrays, always adding the pair with the smallest result first."""
    arrays = list(arrays)
    while len(arrays) > 1:
        best = None
        for i in range(len(arrays)):
            for j in range(i + 1, len(arrays)):
                size = math.prod(max(x, y) for x, y in zip(arrays[i].shape, arrays[j].shape))
                if best is None or size < best[0]:
                    best = (size, i, j)
        _, i, j = best
        merged = arrays[i] + arrays[j]
        arrays = [a for k, a in enumerate(arrays) if k not in (i, j)] + [merged]
    return arrays[0]


def _sum_into(arrays, out):
    """``out[...] = sum(arrays)`` with one full-size pass where possible."""
    if len(arrays) == 1:
        np.copyto(out, arrays[0])
        return
    # Sum all but the largest addend in a tree, then add the largest into ``out``.
    largest = max(range(len(arrays)), key=lambda i: math.prod(arrays[i].shape))
    rest = [a for i, a in enumerate(arrays) if i != largest]
    np.add(arrays[largest], _sum_tree(rest), out=out)


def _argmin_into(table, argmin_out, reduced_out):
    """One argmin over the last axis, then gather the minima (no second full pass)."""
    best = np.argmin(table, axis=-1)
    argmin_out[...] = best.reshape(argmin_out.shape)
    gathered = np.take_along_axis(table, best[..., None], axis=-1)
    reduced_out[...] = gathered.reshape(reduced_out.shape)


class Search:
    """A prepared search: the ordering, dependent sets and edge terms of one graph.

    Everything that does not depend on the layer costs is computed once, so the same
    search can be rerun with other vertex costs (the memory-capped search does); that
    includes the runs of repeated blocks and the block and reduced graphs' orderings.

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
    blocks : bool or "always"
        Solve runs of identical blocks once (``pase.search.blocks``; default). Used with the
        GenerateSeq ordering, and only where it computes fewer table entries than the
        plain programme; ``False`` always runs the plain programme; ``"always"`` uses
        every run found, saving or not (for tests of the block search).

    Notes
    -----
    With blocks, the optimum is the plain programme's up to rounding (sums are taken in
    another order; relative differences of order 1e-15), and the returned configurations
    re-evaluate to it. Among tied optima another may be returned, chosen deterministically.
    If ``run`` is given vertex costs that differ between the copies of a run, the plain
    programme runs instead.

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

    def __init__(self, G, ordering="generateseq", chunk_entries: int = DEFAULT_CHUNK_ENTRIES, blocks=True):
        if chunk_entries < 1:
            raise ValueError("chunk_entries must be positive")
        if blocks not in (True, False, "always"):
            raise ValueError(f"blocks must be True, False or 'always', got {blocks!r}")
        self.chunk_entries = int(chunk_entries)
        self.vertices = list(G.nodes)
        self.base_costs = vertex_costs(G)
        self.K = {v: cost.size for v, cost in self.base_costs.items()}
        self.ordering: Ordering = get_ordering(ordering)(G)
        seq = self.ordering.sequence
        self.position = {v: i for i, v in enumerate(seq)}
        self.axes = {v: self.ordering.dependent[v] + (v,) for v in seq}

        # Edge matrices summed per vertex pair, oriented (earlier, later) in id order.
        id_order = vertex_order(G)
        pairs = edge_matrices(G, self.K)
        self._pairs = pairs
        self._id_order = id_order
        self._plain = _Elimination(self.K, self.ordering, list(pairs), list(pairs.values()), (), self.chunk_entries)
        self.handed = self._plain.handed
        w = self._plain.work
        self.plain_estimate = WorkEstimate(self.ordering.name, w.entries, w.largest, self.ordering.max_dependent_set,
                                           w.peak, table_axes=w.axes)
        self._blocked = None
        if blocks and self.ordering.name == "generateseq":
            self._blocked = _BlockedProgramme.build(self, saving=blocks is True)
        self.estimate = self._blocked.estimate if self._blocked is not None else self.plain_estimate

    # ----------------------------------------------------------------------------------

    def table_size(self, v) -> int:
        """Entries of the plain table of ``v``: ``prod(K_u for u in D(v) ∪ {v})``."""
        return math.prod(self.K[u] for u in self.axes[v])

    @property
    def blocks(self) -> tuple:
        """The runs of identical blocks the search solves once (``pase.search.blocks.BlockRun``)."""
        return self._blocked.runs if self._blocked is not None else ()

    def check_budget(self, budget: int | None = None, estimate: WorkEstimate | None = None) -> int:
        """Raise ``SearchTooLarge`` unless the estimate fits ``budget`` bytes; returns the budget.

        The default budget is 80 % of the machine's available memory. A table with more
        than ``MAX_TABLE_AXES`` axes of size > 1 is refused too, whatever the budget.
        """
        estimate = estimate or self.estimate
        if budget is None:
            budget = default_table_budget()
        if estimate.peak_bytes > budget:
            raise SearchTooLarge(estimate, budget)
        if estimate.table_axes > MAX_TABLE_AXES:
            raise SearchTooLarge(estimate, budget, (
                f"one of its tables needs {estimate.table_axes} axes of more than one configuration "
                f"(largest dependent set {estimate.max_dependent_set}), and NumPy arrays have at most "
                f"{MAX_TABLE_AXES}"
            ))
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
        if costs is None:
            costs = self.base_costs
        else:
            costs = {v: np.asarray(costs[v], dtype=np.float64) for v in self.vertices}
            for v, c in costs.items():
                if c.shape != (self.K[v],):
                    raise ValueError(f"vertex {v!r}: the cost vector has shape {c.shape}, expected {(self.K[v],)}")
        blocked = self._blocked
        if blocked is not None and not blocked.periodic(costs):
            blocked = None  # the copies differ under these costs: the plain programme
        estimate = blocked.estimate if blocked is not None else self.plain_estimate
        self.check_budget(memory_budget, estimate)
        start = time.perf_counter()
        if blocked is not None:
            choice, optimum = blocked.run(costs, progress)
        else:
            constant, _, argmins, _ = self._plain.run(costs, {}, progress, 0, estimate.table_entries)
            choice = {v: int(c) for v, c in self._plain.back_substitute(argmins, {}).items()}
            optimum = constant
        return SearchResult(choice, optimum, SearchStats(estimate, time.perf_counter() - start), self.ordering.sequence)


class _BlockedProgramme:
    """The search with runs of identical blocks solved once (internal; see the module doc).

    For a run of ``n`` copies with interface ``I``, previous vertices ``P`` and shared
    vertices ``X``: the block graph is copy 0 with ``P`` and ``X``; eliminating all of copy 0
    but its interface leaves ``T[P, X, I]``, the cheapest inside of a copy for every
    boundary. The reduced graph keeps every vertex outside the runs and gives each copy
    ``c`` one variable ``Z_c`` (the joint configuration of its interface, named after the
    copy's first interface vertex) joined by ``T[Z_{c-1}, X, Z_c]`` (``T[P, X, Z_0]`` for the
    first copy); the last copy's edges to the vertices after the run are kept as edges of
    ``Z_{n-1}``. Solving the reduced graph fixes every ``Z_c``; the block's argmins then give
    the inside of all copies at once.
    """

    def __init__(self, search: Search, runs: list, block_engines: list):
        self.runs = tuple(runs)
        self.block_engines = block_engines
        self.K = K = search.K
        pairs = search._pairs
        compressed = {v for run in runs for v in run.vertices}
        self.real = [v for v in search._id_order if v not in compressed]
        Kr = {v: K[v] for v in self.real}
        scopes, arrays = [], []
        for (a, b), m in pairs.items():
            if a not in compressed and b not in compressed:
                scopes.append((a, b))
                arrays.append(m)
        self.links = []  # per run: the reduced-graph variables Z_c and their factor indices
        for run in runs:
            z = tuple(run.vertex(c, run.interface[0]) for c in range(run.copies))
            factors = []
            for c in range(run.copies):
                Kr[z[c]] = run.states
                scopes.append((run.previous if c == 0 else (z[c - 1],)) + run.shared + (z[c],))
                arrays.append(None)  # the block table, known once the block is solved
                factors.append(len(scopes) - 1)
            self.links.append((z, factors))
            # Edges from the last copy's interface to the vertices after the run.
            last = run.copy(run.copies - 1)
            ks = [K[last[j]] for j in run.interface]
            for i, j in enumerate(run.interface):
                v = last[j]
                for w in run.following:
                    for key in ((v, w), (w, v)):
                        if key in pairs:
                            m = pairs[key] if key[0] == v else pairs[key].T
                            if len(ks) > 1:  # spread over the joint interface index
                                shape = [1] * len(ks) + [K[w]]
                                shape[i] = ks[i]
                                m = np.broadcast_to(m.reshape(shape), ks + [K[w]]).reshape(run.states, K[w])
                            scopes.append((z[-1], w))
                            arrays.append(m)
        interaction = nx.Graph()
        interaction.add_nodes_from(Kr)
        interaction.add_edges_from((s[i], s[j]) for s in scopes for i in range(len(s)) for j in range(i + 1, len(s)))
        self.reduced = _Elimination(Kr, generate_seq(interaction), scopes, arrays, (), search.chunk_entries)

        works = [e.work for e in block_engines] + [self.reduced.work]
        retained = peak = 0
        for w in works:
            peak = max(peak, retained + w.peak)
            retained += w.retained
        self.estimate = WorkEstimate(
            search.ordering.name, sum(w.entries for w in works), max(w.largest for w in works),
            max(w.max_dependent for w in works), peak, plain_table_entries=search.plain_estimate.table_entries,
            blocks=tuple(run.summary for run in runs), table_axes=max(w.axes for w in works),
        )

    @classmethod
    def build(cls, search: Search, saving: bool = True):
        """The blocked programme, or ``None`` where it would not compute fewer entries.

        With ``saving`` false, every run found is used whatever the work.
        """
        K = search.K
        edges = [(a, b, m) for (a, b), m in search._pairs.items()]
        runs = find_block_runs(search._id_order, K, search.base_costs, edges)
        if not runs:
            return None
        neighbours = {}
        for a, b in search._pairs:
            neighbours.setdefault(a, []).append((b, (a, b)))
            neighbours.setdefault(b, []).append((a, (a, b)))
        accepted, engines = [], []
        for run in runs:
            engine = cls._block_engine(run, K, search._pairs, neighbours, search.chunk_entries)
            shared = math.prod(K[x] for x in run.shared)
            chained = engine.work.entries + run.copies * run.states * run.states * shared
            plain = sum(search._plain.table_size(v) for v in run.vertices)
            if chained < plain or not saving:
                accepted.append(run)
                engines.append(engine)
        if not accepted:
            return None
        programme = cls(search, accepted, engines)
        if saving and programme.estimate.table_entries >= search.plain_estimate.table_entries:
            return None
        return programme

    @staticmethod
    def _block_engine(run, K, pairs, neighbours, chunk_entries) -> _Elimination:
        """Copy 0 with its previous and shared vertices, eliminated down to ``T[P, X, I]``."""
        copy0 = run.copy(0)
        after = set(run.copy(1))
        keep = run.previous + run.shared + tuple(copy0[j] for j in run.interface)
        allowed = set(copy0) | set(run.previous) | set(run.shared)
        scopes, seen = [], set()
        for v in copy0:
            for w, key in neighbours.get(v, ()):
                if w in after or key in seen:
                    continue  # the next copy's edges belong to its own table
                if w not in allowed:  # pragma: no cover - excluded by find_block_runs
                    raise AssertionError(f"block run wired to vertex {w!r} outside its boundary")
                seen.add(key)
                scopes.append(key)
        graph = nx.Graph()
        graph.add_nodes_from(copy0 + run.previous + run.shared)  # a fixed order, for any vertex ids
        graph.add_edges_from(scopes)
        ordering = generate_seq(graph, last=tuple(reversed(keep)))
        Kb = {v: K[v] for v in graph}
        return _Elimination(Kb, ordering, scopes, [pairs[s] for s in scopes], keep, chunk_entries)

    def periodic(self, costs: dict) -> bool:
        return all(is_periodic(run, costs) for run in self.runs)

    def run(self, costs: dict, progress):
        K = self.K
        total = self.estimate.table_entries
        done = 0
        solved = []
        for run, engine in zip(self.runs, self.block_engines):
            constant, table, argmins, done = engine.run({v: costs[v] for v in run.copy(0)}, {}, progress, done, total)
            solved.append((table + constant, argmins))
        dynamic = {}
        for run, (z, factors), (table, _) in zip(self.runs, self.links, solved):
            shared = tuple(K[x] for x in run.shared)
            first = table.reshape(tuple(K[p] for p in run.previous) + shared + (run.states,))
            chain = table.reshape((run.states,) + shared + (run.states,))
            for c, f in enumerate(factors):
                dynamic[f] = first if c == 0 else chain
        optimum, _, argmins, done = self.reduced.run({v: costs[v] for v in self.real}, dynamic, progress, done, total)
        choice = {v: int(c) for v, c in self.reduced.back_substitute(argmins, {}).items()}
        for run, (z, _), engine, (_, block_argmins) in zip(self.runs, self.links, self.block_engines, solved):
            copy0 = run.copy(0)
            ks = [K[copy0[j]] for j in run.interface]
            joint = np.array([choice[v] for v in z])
            parts = np.unravel_index(joint, ks)
            known = {x: choice[x] for x in run.shared}
            for i, j in enumerate(run.interface):
                known[copy0[j]] = parts[i]
                known[run.previous[i]] = np.concatenate(([choice[run.previous[i]]], parts[i][:-1]))
            inside = engine.back_substitute(block_argmins, known)
            for j, v in enumerate(copy0):
                values = np.broadcast_to(np.asarray(inside[v]), (run.copies,))
                for c in range(run.copies):
                    choice[run.vertex(c, j)] = int(values[c])
        return choice, optimum


@arguments(G=a_costed_graph, memory_budget=optional(positive_number), progress=optional(a_callable),
           chunk_entries=positive_int)
def solve(
    G,
    ordering="generateseq",
    memory_budget: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
    blocks: bool = True,
) -> SearchResult:
    """Find the configuration of every vertex minimising the total cost, exactly.

    Shorthand for ``Search(G, ordering, chunk_entries, blocks).run(memory_budget=..., progress=...)``.
    """
    return Search(G, ordering, chunk_entries, blocks).run(memory_budget=memory_budget, progress=progress)


def indexed_cost(G, choice) -> float:
    """``F`` of a choice of configuration indices, read off the graph's cost tables."""
    total = sum(float(G.nodes[v]["cost"][choice[v]]) for v in G.nodes)
    total += sum(float(m[choice[u], choice[v]]) for u, v, m in G.edges(data="cost"))
    return total
