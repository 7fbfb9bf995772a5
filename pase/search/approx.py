"""Stage 3 beyond the exact reach: a strategy, its cost and a proven lower bound on the optimum.

Where the exact programme's tables would not fit (DenseNet's dense blocks make dependent sets
of 25), ``approximate`` bounds every table it builds: a lower bound by mini-bucket elimination
along the same ordering, a strategy by exact programmes over restricted configuration sets.
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

from pase.search.ordering import get_ordering, vertex_order
from pase.search.tables import edge_matrices, vertex_costs

__all__ = ["approximate", "ApproxResult", "ApproxStats", "ApproxTooLarge", "DEFAULT_TABLE_ENTRIES",
           "MIN_TABLE_ENTRIES"]

#: Largest table (entries) a mini-bucket or a restricted programme may build by default:
#: 2^23 float64 entries, 64 MiB. Larger tables give tighter bounds, and take longer.
DEFAULT_TABLE_ENTRIES = 1 << 23

#: Smallest table bound accepted. A function larger than the bound (an edge matrix) gets a
#: mini-bucket of its own, so ``largest_table`` may exceed a bound below ``max K_u * K_v``.
MIN_TABLE_ENTRIES = 1

#: Most rounds of neighbourhood search after the first plan.
DEFAULT_ROUNDS = 4

#: The bound is the best of mini-bucket passes with tables of ``table_entries`` and of these
#: fractions of it (a larger table does not always give a larger bound).
LADDER = (1 / 64, 1 / 8, 1)

#: Tables of the plan search, as a share of the bound's: a smaller search from several
#: starts finds better plans than a larger one from one start (DenseNet-121, p = 64).
NEIGHBOURHOOD_SHARE = 1 / 16

#: Neighbourhoods of the plan search: windows of this many consecutive vertex ids (layers in
#: network order), overlapping by half.
WINDOW = 32


class ApproxTooLarge(TooLarge):
    """Even the bounded tables of the approximate search would not fit the memory budget."""

    def __init__(self, needed: int, budget: int, table_entries: int):
        self.needed = needed
        self.budget = budget
        super().__init__(
            f"the approximate search with tables of at most {table_entries:,} entries needs about "
            f"{format_bytes(needed)}, over the budget of {format_bytes(budget)}: give it smaller tables"
        )


@dataclass(frozen=True)
class ApproxStats:
    """How the approximate search went.

    Attributes
    ----------
    ordering : str
        The elimination ordering (of the mini-bucket bound).
    table_entries : int
        Table entries filled: the mini-bucket bound's and every restricted programme's.
    largest_table : int
        The largest table built (at most the bound given).
    max_dependent_set : int
        The largest dependent set of the ordering (the exact programme's width).
    peak_bytes : int
        Estimated peak memory of the mini-bucket pass (its tables and messages).
    split_buckets : int
        Eliminations whose functions had to be split into several mini-buckets (0: the bound
        is the exact optimum).
    rounds : int
        Restricted programmes solved after the first plan.
    bound_seconds, plan_seconds : float
        Time of the lower bound and of improving the plan.
    seconds : float
        Both together.
    """

    ordering: str
    table_entries: int
    largest_table: int
    max_dependent_set: int
    peak_bytes: int
    split_buckets: int
    rounds: int
    bound_seconds: float
    plan_seconds: float

    @property
    def seconds(self) -> float:
        return self.bound_seconds + self.plan_seconds


@dataclass(frozen=True)
class ApproxResult:
    """A strategy with a lower bound on the optimum.

    ``choice`` maps every vertex to a configuration index; ``cost`` is its total, so
    ``lower_bound <= optimum <= cost``. ``exact`` says that no elimination was split: the bound
    is then the optimum itself and ``cost`` equals it (up to rounding).
    """

    choice: dict
    cost: float
    lower_bound: float
    exact: bool
    stats: ApproxStats

    @property
    def gap(self) -> float | None:
        """``(cost - lower_bound) / lower_bound``: the plan costs at most this fraction more than
        the optimum (0 when exact; ``None`` when the bound is not positive)."""
        if self.exact:
            return 0.0
        if self.lower_bound <= 0:
            return 0.0 if self.cost <= self.lower_bound else None
        return max(self.cost - self.lower_bound, 0.0) / self.lower_bound

    def indices(self, vertices=None) -> list:
        """Configuration indices in ``vertices`` order (default: sorted vertex ids)."""
        return [self.choice[v] for v in (sorted(self.choice) if vertices is None else vertices)]


class _Problem:
    """A pairwise min-sum problem over vertices ``0..n-1`` (internal).

    ``unary[i]`` has ``K[i]`` entries; ``pairs[i, j]`` (``i < j``) is a ``K[i] x K[j]`` matrix;
    ``constant`` is added to every strategy's cost (the part of fixed vertices).
    """

    def __init__(self, unary: list, pairs: dict, constant: float = 0.0):
        self.unary = unary
        self.K = np.array([u.size for u in unary], dtype=np.int64)
        self.pairs = pairs
        self.constant = float(constant)
        self.neighbours = [[] for _ in unary]  # i -> [(j, matrix indexed [x_i, x_j])]
        for (i, j), m in pairs.items():
            self.neighbours[i].append((j, m))
            self.neighbours[j].append((i, m.T))

    @classmethod
    def from_graph(cls, G) -> tuple:
        """``(problem, vertex list)`` of a costed graph; antiparallel edges are summed."""
        vertices = vertex_order(G)
        index = {v: i for i, v in enumerate(vertices)}
        costs = vertex_costs(G, finite=True)
        sizes = {v: cost.size for v, cost in costs.items()}
        # Oriented (earlier, later) in vertex_order: index order.
        pairs = {(index[u], index[v]): m for (u, v), m in edge_matrices(G, sizes, finite=True).items()}
        return cls([costs[v] for v in vertices], pairs), vertices

    def graph(self) -> nx.Graph:
        G = nx.Graph()
        G.add_nodes_from(range(len(self.unary)))
        G.add_edges_from(self.pairs)
        return G

    def cost(self, x: np.ndarray) -> float:
        total = self.constant + sum(float(u[x[i]]) for i, u in enumerate(self.unary))
        return total + sum(float(m[x[i], x[j]]) for (i, j), m in self.pairs.items())

    def local(self, i: int, x: np.ndarray) -> np.ndarray:
        """The cost terms of vertex ``i`` for each of its configurations, the others at ``x``."""
        vec = self.unary[i].copy()
        for j, m in self.neighbours[i]:
            vec += m[:, x[j]]
        return vec

    def restrict(self, candidates: list) -> tuple:
        """``(problem, free)``: the problem over the vertices with several candidates (``free``,
        their indices here), every other vertex fixed at its one candidate and folded in."""
        free = [i for i, c in enumerate(candidates) if c.size > 1]
        where = {i: f for f, i in enumerate(free)}
        fixed = {i: int(c[0]) for i, c in enumerate(candidates) if c.size == 1}
        constant = self.constant + sum(float(self.unary[i][c]) for i, c in fixed.items())
        unary = [self.unary[i][candidates[i]] for i in free]
        pairs = {}
        for (i, j), m in self.pairs.items():
            if i in fixed and j in fixed:
                constant += float(m[fixed[i], fixed[j]])
            elif i in fixed:
                unary[where[j]] = unary[where[j]] + m[fixed[i], candidates[j]]
            elif j in fixed:
                unary[where[i]] = unary[where[i]] + m[candidates[i], fixed[j]]
            else:
                pairs[where[i], where[j]] = m[np.ix_(candidates[i], candidates[j])]
        return _Problem(unary, pairs, constant), free


class _MiniBuckets:
    """Elimination along an ordering with every table bounded (internal).

    Each vertex ``v``, in sequence order, owns a bucket: its cost vector, its edges to later
    vertices and the messages earlier eliminations sent it. The bucket's functions are split
    into mini-buckets whose joint tables have at most ``bound`` entries (one mini-bucket, the
    exact programme's table, when it fits); each mini-bucket is minimised over ``v`` on its
    own and sends the result, a message over the rest of its scope, to the bucket of the
    first of those vertices in the sequence. The scopes are planned before any table is
    allocated (``entries``, ``largest``, ``peak_bytes``, ``split``).

    Why the constant left at the end is a lower bound of the optimum: write ``F`` for the sum
    of all functions not yet eliminated. Eliminating ``v`` replaces the bucket's functions
    ``f_1 .. f_r`` (grouped into mini-buckets ``g_j = sum of its f``, ``g_j`` over ``U_j``) by
    ``h_j = min over x_v of (g_j + s_j)``, where the shifts ``s_j(x_v)`` sum to zero for every
    ``x_v`` (moment matching: ``s_j = mean_k mu_k - mu_j``, ``mu_j(x_v) = min of g_j over
    U_j - {v}``). For every strategy ``x``:
    ``sum_j g_j(x) = sum_j (g_j + s_j)(x) >= sum_j h_j(x)``, since each term is at least its
    minimum over ``x_v``. So ``F(x) >= F'(x)`` for every ``x``, where ``F'`` no longer involves
    ``v``; hence ``min F >= min F'``. After the last vertex ``F'`` is a constant, at most the
    optimum. With one mini-bucket per bucket every step is an equality: the exact programme.
    """

    def __init__(self, problem: _Problem, sequence: tuple, bound: float):
        self.problem = problem
        self.sequence = sequence
        K = problem.K
        position = np.empty(len(K), dtype=np.int64)
        position[list(sequence)] = np.arange(len(sequence))
        self.position = position
        # Functions: scope (latest first) and source: ("unary", v), ("pair", (i, j)), ("message", id).
        self.scopes: list = []
        bucket_of: dict = {v: [] for v in sequence}

        def add(scope, source):
            scope = tuple(sorted(scope, key=lambda u: -position[u]))
            self.scopes.append((scope, source))
            bucket_of[scope[-1]].append(len(self.scopes) - 1)

        for v in sequence:
            add((v,), ("unary", v))
        for pair in problem.pairs:
            add(pair, ("pair", pair))
        self.buckets: dict = {}  # v -> [union scope latest first, function ids, message id or None]
        entries = largest = split = 0
        alive = peak = 0
        message_bytes: dict = {}
        for v in sequence:
            functions = sorted(bucket_of[v], key=lambda f: (-self._size(self.scopes[f][0]), f))
            groups: list = []  # [set of vertices, entries, function ids]
            for f in functions:
                scope = self.scopes[f][0]
                best = None
                for g, (members, size, _) in enumerate(groups):
                    joined = members.union(scope)
                    joined_size = self._size(joined)
                    if joined_size <= bound and (best is None or joined_size / size < best[0]):
                        best = (joined_size / size, g, joined, joined_size)
                if best is None:
                    groups.append([set(scope), self._size(scope), [f]])
                else:
                    _, g, joined, joined_size = best
                    groups[g][0], groups[g][1] = joined, joined_size
                    groups[g][2].append(f)
            planned = []
            working = 0
            for members, size, fs in groups:
                union = tuple(sorted(members, key=lambda u: -position[u]))
                planned.append([union, fs, None])
                entries += size
                largest = max(largest, size)
                working += 8 * size
            split += len(groups) > 1
            for f in bucket_of[v]:
                if self.scopes[f][1][0] == "message":
                    alive -= message_bytes.pop(f)
            peak = max(peak, alive + working + 8 * max(size for _, size, _ in groups))
            self.buckets[v] = planned
            for group in planned:
                union = group[0]
                if len(union) > 1:
                    add(union[:-1], ("message", None))
                    f = group[2] = len(self.scopes) - 1
                    message_bytes[f] = 8 * self._size(union[:-1])
                    alive += message_bytes[f]
        self.entries, self.largest, self.split, self.peak_bytes = entries, largest, split, peak

    def _size(self, scope) -> int:
        return math.prod(int(self.problem.K[u]) for u in scope)

    def run(self, progress=None) -> tuple:
        """``(lower bound, messages)``; ``messages`` maps function ids to arrays, for ``decode``."""
        problem = self.problem
        K = problem.K
        arrays: dict = {}
        constant = problem.constant
        done = 0
        for v in self.sequence:
            tables = [self._table(union, fs, arrays) for union, fs, _ in self.buckets[v]]
            if len(tables) > 1:
                # Moment matching: shift cost between the mini-buckets so that their minima
                # over everything but v agree; the shifts sum to zero for every x_v.
                mu = np.stack([t.reshape(-1, K[v]).min(axis=0) for t in tables])
                mean = mu.mean(axis=0)
                tables = [t + (mean - m) for t, m in zip(tables, mu)]
            for (_, _, message), table in zip(self.buckets[v], tables):
                reduced = table.min(axis=-1)
                if message is not None:
                    arrays[message] = reduced
                else:
                    constant += float(reduced)
                done += table.size
            if progress is not None:
                progress(done, self.entries)
        return constant, arrays

    def _function(self, f, arrays) -> np.ndarray:
        """Function ``f`` as an array with its axes in its scope's (latest first) order."""
        scope, source = self.scopes[f]
        kind, key = source
        if kind == "unary":
            return self.problem.unary[key]
        if kind == "pair":
            m = self.problem.pairs[key]
            return m if scope == key else m.T
        return arrays[f]

    def _table(self, union, fs, arrays) -> np.ndarray:
        """The sum of functions ``fs``, broadcast over the axes of ``union``."""
        where = {u: a for a, u in enumerate(union)}
        shape = tuple(int(self.problem.K[u]) for u in union)
        parts = []
        for f in fs:
            scope = self.scopes[f][0]
            full = [1] * len(union)
            for u in scope:
                full[where[u]] = shape[where[u]]
            # The scope and the union are both latest first: the axes are already in order.
            parts.append(np.reshape(self._function(f, arrays), full))
        return _sum(parts, shape)

    def decode(self, arrays) -> np.ndarray:
        """A strategy: in reverse sequence order, each vertex at the minimum of its bucket's
        functions, the later vertices already chosen (with exact tables: the optimum)."""
        x = np.zeros(len(self.problem.K), dtype=np.int64)
        for v in reversed(self.sequence):
            vec = np.zeros(int(self.problem.K[v]))
            for _, fs, _ in self.buckets[v]:
                for f in fs:
                    scope = self.scopes[f][0]
                    index = tuple(slice(None) if u == v else x[u] for u in scope)
                    vec += self._function(f, arrays)[index]
            x[v] = int(np.argmin(vec))
        return x


def _sum(parts: list, shape: tuple) -> np.ndarray:
    """The sum of broadcastable ``parts`` as a new array of ``shape``, smallest addends first, so
    that the partial sums grow towards the full table and it is written about once."""
    parts = sorted(parts, key=lambda p: p.size)
    total = parts[0]
    for p in parts[1:-1]:
        total = total + p
    out = np.empty(shape)
    if len(parts) == 1:
        np.copyto(out, total)
    else:
        np.add(total, parts[-1], out=out)
    return out


def _descend(problem: _Problem, x: np.ndarray, passes: int = 50) -> np.ndarray:
    """Coordinate descent: each vertex in turn to the best configuration, the others fixed,
    until a pass changes nothing. Never raises the cost."""
    x = x.copy()
    for _ in range(passes):
        changed = False
        for i in range(len(x)):
            vec = problem.local(i, x)
            best = int(np.argmin(vec))
            if vec[best] < vec[x[i]]:
                x[i] = best
                changed = True
        if not changed:
            break
    return x


def _candidate_counts(problem: _Problem, bound: int, ordering, start: np.ndarray | None = None) -> np.ndarray:
    """How many configurations each vertex may keep so that the restricted programme's tables
    (vertices with one configuration folded away) have at most ``bound`` entries.

    Starts from ``start`` (default: every configuration); while some table is too large, halves
    the count of its vertex with the most configurations (ties: the smallest index)."""
    k = problem.K.copy() if start is None else np.minimum(problem.K, start)
    limit = math.log(bound)
    G = problem.graph()
    while True:
        free = np.nonzero(k > 1)[0]
        found = get_ordering(ordering)(G.subgraph(free.tolist()))
        members = [np.array(found.dependent[v] + (v,), dtype=np.int64) for v in found.sequence]
        while True:
            logk = np.log(k)
            sizes = np.array([logk[m].sum() for m in members]) if members else np.zeros(0)
            if sizes.size == 0 or sizes.max() <= limit + 1e-9:
                return k
            worst = members[int(np.argmax(sizes))]
            u = worst[np.lexsort((worst, -k[worst]))[0]]
            k[u] = (k[u] + 1) // 2 if k[u] > 2 else 1
            if k[u] == 1:
                break  # u leaves the restricted graph: order it again


def _candidates(problem: _Problem, x: np.ndarray, counts: np.ndarray) -> list:
    """Per vertex: its configuration in ``x`` and the ``counts - 1`` others of least local cost."""
    chosen = []
    for i, k in enumerate(counts):
        if k >= problem.K[i]:
            chosen.append(np.arange(problem.K[i]))
            continue
        vec = problem.local(i, x)
        vec[x[i]] = -np.inf  # always kept
        best = np.argsort(vec, kind="stable")[:k]
        chosen.append(np.sort(best))
    return chosen


def _solve_restricted(problem: _Problem, candidates: list, ordering) -> tuple:
    """``(strategy, table entries, largest table)``: the exact optimum over the candidates."""
    sub, free = problem.restrict(candidates)
    x = np.array([int(c[0]) for c in candidates], dtype=np.int64)
    if not free:
        return x, 0, 0
    found = get_ordering(ordering)(sub.graph())
    elimination = _MiniBuckets(sub, found.sequence, math.inf)
    _, arrays = elimination.run()
    y = elimination.decode(arrays)
    for f, i in enumerate(free):
        x[i] = candidates[i][y[f]]
    return x, elimination.entries, elimination.largest


def _improve(problem: _Problem, x: np.ndarray, cost: float, bound: int, ordering, rounds: int) -> tuple:
    """Large neighbourhood search from ``x``: ``(strategy, cost, rounds, table entries, largest)``.

    A round solves, exactly, the programme restricted to every vertex's current configuration
    and those of least cost around it (``_candidate_counts`` keeps the tables within
    ``bound``), then the same over windows of ``WINDOW`` consecutive vertices with every
    configuration (the rest fixed), then descends coordinate-wise. Every restricted problem
    contains the current strategy, so the cost never rises; rounds stop when one does not
    lower it.
    """
    n = len(problem.K)
    entries = largest = 0
    neighbourhoods = [None] + [(s, min(s + WINDOW, n)) for s in range(0, max(n - WINDOW // 2, 1), WINDOW // 2)]
    counts = {}
    done = 0
    while done < rounds:
        done += 1
        before = cost
        for window in neighbourhoods:
            if window not in counts:
                start = None
                if window is not None:
                    start = np.ones(n, dtype=np.int64)
                    start[window[0]:window[1]] = problem.K[window[0]:window[1]]
                counts[window] = _candidate_counts(problem, bound, ordering, start)
            y, e, l = _solve_restricted(problem, _candidates(problem, x, counts[window]), ordering)
            entries += e
            largest = max(largest, l)
            new = problem.cost(y)
            if new < cost:
                x, cost = y, new
        x = _descend(problem, x)
        cost = problem.cost(x)
        if not cost < before:
            break
    return x, cost, done, entries, largest


def approximate(
    G,
    ordering="generateseq",
    table_entries: int = DEFAULT_TABLE_ENTRIES,
    memory_budget: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    progress: Callable[[int, int], None] | None = None,
) -> ApproxResult:
    """A strategy, its cost and a lower bound on the optimum, with every table bounded.

    Lower bound: mini-bucket elimination along ``ordering`` with moment matching, every table
    of at most ``table_entries`` entries (``_MiniBuckets`` proves the bound), the best of
    passes at the ``LADDER`` of table sizes. Where no elimination needs splitting, the pass is
    the exact programme: the result is the optimum (``exact``) and no larger pass runs.

    Strategy: the best decoding of the passes after coordinate descent, then rounds of large
    neighbourhood search (``_improve``), each an exact programme over restricted
    configurations with tables of at most ``table_entries``.

    Parameters
    ----------
    G : networkx.DiGraph
        As for ``pase.search.solver.Search``; costs must be finite. ``G`` is not modified.
    ordering : str or callable
        The elimination ordering (default GenerateSeq).
    table_entries : int
        The most entries of any table built (at least ``MIN_TABLE_ENTRIES``).
    memory_budget : int, optional
        Bytes the tables may use (default: 80 % of the available memory); each mini-bucket
        pass is planned first and refused with ``ApproxTooLarge`` over it.
    rounds : int
        The most neighbourhood rounds (0: the decodings and coordinate descent only).
    progress : callable, optional
        ``progress(done, total)`` with table entries of the lower bound's passes.

    Examples
    --------
    >>> import networkx as nx, numpy as np
    >>> G = nx.DiGraph()
    >>> G.add_node(0, cost=np.array([1.0, 5.0]))
    >>> G.add_node(1, cost=np.array([4.0, 0.0]))
    >>> G.add_edge(0, 1, cost=np.array([[0.0, 9.0], [0.0, 0.0]]))
    >>> r = approximate(G)
    >>> r.cost, r.lower_bound, r.gap, r.indices()
    (5.0, 5.0, 0.0, [0, 0])
    """
    if isinstance(table_entries, bool) or not isinstance(table_entries, (int, np.integer)) \
            or table_entries < MIN_TABLE_ENTRIES:
        raise ValueError(f"table_entries must be an integer of at least {MIN_TABLE_ENTRIES}, got {table_entries!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}")
    problem, vertices = _Problem.from_graph(G)
    bound = int(table_entries)
    budget = default_table_budget() if memory_budget is None else memory_budget
    start = time.perf_counter()
    found = get_ordering(ordering)(problem.graph())
    passes = []
    for size in sorted({max(MIN_TABLE_ENTRIES, int(bound * f)) for f in LADDER}):
        elimination = _MiniBuckets(problem, found.sequence, size)
        if elimination.peak_bytes > budget:
            raise ApproxTooLarge(elimination.peak_bytes, budget, size)
        passes.append(elimination)
        if elimination.split == 0:
            break  # the exact programme: larger tables add nothing
    total = sum(e.entries for e in passes)
    lower, starts, exact = -math.inf, [], False
    done = 0
    for elimination in passes:
        report = None if progress is None else (lambda d, _, base=done: progress(base + d, total))
        value, arrays = elimination.run(report)
        done += elimination.entries
        x = elimination.decode(arrays)
        del arrays
        lower = max(lower, value)
        exact = elimination.split == 0
        starts.append(x if exact else _descend(problem, x))
    bound_seconds = time.perf_counter() - start
    entries, largest = total, max((e.largest for e in passes), default=0)
    start = time.perf_counter()
    rounds_done = 0
    best, cost = starts[-1], problem.cost(starts[-1])
    if not exact and len(vertices):
        # The search is cheap next to the bound, and where it ends depends on where it starts:
        # from every pass's decoding, with tables a NEIGHBOURHOOD_SHARE of the bound's.
        seen = set()
        for x in starts:
            key = x.tobytes()
            if key in seen:
                continue
            seen.add(key)
            y, c, r, e, l = _improve(problem, x, problem.cost(x), max(MIN_TABLE_ENTRIES, int(bound * NEIGHBOURHOOD_SHARE)),
                                     ordering, rounds)
            rounds_done += r
            entries += e
            largest = max(largest, l)
            if c < cost:
                best, cost = y, c
    plan_seconds = time.perf_counter() - start
    if exact:
        lower = cost  # the pass was the exact programme: its decoding attains the optimum
    stats = ApproxStats(found.name, entries, largest, found.max_dependent_set,
                        max((e.peak_bytes for e in passes), default=0),
                        passes[-1].split if passes else 0, rounds_done, bound_seconds, plan_seconds)
    choice = {v: int(best[i]) for i, v in enumerate(vertices)}
    return ApproxResult(choice, float(cost), float(min(lower, cost)), exact, stats)
