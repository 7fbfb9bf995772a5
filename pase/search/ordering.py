"""Vertex orderings for the search and the dependent sets they induce (paper III-B, Fig. 3).

An ordering is a plain function of a graph returning an ``Ordering``: the sequence and,
for every vertex, its dependent set ``D(i) = N(X(i)) ∩ V>i``. All orderings share one
elimination loop and differ only in how the next vertex is chosen.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable

import networkx as nx
from pase.core.checks import a_costed_graph, a_sequence, arguments

__all__ = [
    "Ordering",
    "generate_seq",
    "breadth_first",
    "fixed_order",
    "dependent_sets_by_definition",
    "ORDERINGS",
    "OrderingEntry",
    "ordering_title",
    "get_ordering",
]


@dataclass(frozen=True)
class Ordering:
    """A vertex sequence and the dependent set of each of its vertices.

    Attributes
    ----------
    name : str
        Which heuristic made it (``"generateseq"``, ``"breadth-first"``, ...).
    sequence : tuple
        Vertices in processing order.
    dependent : dict
        ``v -> tuple`` of the vertices of ``D(v)``, sorted by their position in the
        sequence, latest first.
    """

    name: str
    sequence: tuple
    dependent: dict

    @property
    def max_dependent_set(self) -> int:
        """The induced width ``M``: the largest ``|D(i)|``."""
        return max((len(d) for d in self.dependent.values()), default=0)


def vertex_order(G) -> list:
    """Vertices in id order (sorted when comparable, else insertion order)."""
    try:
        return sorted(G.nodes)
    except TypeError:
        return list(G.nodes)


def _neighbour_sets(G, order) -> dict:
    """``d(v)`` before any elimination: the neighbours of ``v`` (edges undirected)."""
    d = {v: set() for v in order}
    for u, v in G.edges():
        if u == v:
            raise ValueError(f"vertex {u!r} has an edge to itself")
        d[u].add(v)
        d[v].add(u)
    return d


def _sequence(v, d, sequence: list, dependent: dict) -> set:
    """Sequence ``v``: its ``d(v)`` is its dependent set; ``d(u) = (d(u) ∪ d(v)) - {u, v}`` for
    every ``u`` in it. Returns ``d(v)``, the vertices whose sets changed."""
    sequence.append(v)
    dv = dependent[v] = d[v]
    for u in dv:
        d[u] |= dv
        d[u].discard(u)
        d[u].discard(v)
    return dv


def _ordering(name: str, sequence: list, dependent: dict) -> Ordering:
    """The ``Ordering``, each dependent set listed latest-sequenced first."""
    position = {v: i for i, v in enumerate(sequence)}
    dependent = {v: tuple(sorted(dv, key=lambda u: -position[u])) for v, dv in dependent.items()}
    return Ordering(name, tuple(sequence), dependent)


def _eliminate(G, name: str, choose: Callable) -> Ordering:
    """The elimination loop of GenerateSeq (Fig. 3) with a pluggable choice of vertex.

    Every vertex keeps ``d(v)``, initially its neighbours (edges undirected). Each round
    ``choose(unsequenced, d, rank)`` picks the next vertex ``v``; then for every ``u`` in
    ``d(v)``: ``d(u) = (d(u) ∪ d(v)) - {u, v}``. At the moment it is picked, ``d(v)`` is
    the dependent set ``D(i)`` (paper Theorem 2). Works on its own copies; ``G`` is never
    modified.
    """
    order = vertex_order(G)
    rank = {v: i for i, v in enumerate(order)}
    d = _neighbour_sets(G, order)
    unsequenced = dict.fromkeys(order)  # insertion-ordered set
    sequence, dependent = [], {}
    while unsequenced:
        v = choose(unsequenced, d, rank)
        del unsequenced[v]
        _sequence(v, d, sequence, dependent)
    return _ordering(name, sequence, dependent)


@arguments(G=a_costed_graph, last=a_sequence)
def generate_seq(G, last=()) -> Ordering:
    """GenerateSeq (paper Fig. 3): repeatedly sequence the vertex with the smallest ``|d(v)|``.

    This is the min-degree elimination ordering; ties break by the smallest vertex id.
    The vertices of ``last`` (none by default) are held back and sequenced after all the
    others, in the order given: the block search eliminates a block's inside and keeps
    its boundary (``pase.search.blocks``).

    The choice rule is ``_eliminate``'s with "smallest ``|d(v)|``, then smallest id"; a heap of
    ``(|d(v)|, id rank)`` keys replaces the scan of every unsequenced vertex per round,
    which made the loop quadratic (a key is stale once ``d(v)`` changed or ``v`` is
    sequenced, and is skipped when popped).

    Examples
    --------
    >>> import networkx as nx
    >>> o = generate_seq(nx.star_graph(3))
    >>> o.sequence, o.dependent[1], o.max_dependent_set
    ((1, 2, 0, 3), (0,), 1)
    >>> generate_seq(nx.path_graph(4), last=[1]).sequence
    (0, 3, 2, 1)
    """
    order = vertex_order(G)
    rank = {v: i for i, v in enumerate(order)}
    last = list(last)
    held = set(last)
    if len(held) != len(last) or not held <= rank.keys():
        raise ValueError("'last' must list distinct vertices of the graph")
    d = _neighbour_sets(G, order)
    heap = [(len(d[v]), rank[v]) for v in order if v not in held]
    heapq.heapify(heap)
    sequenced = set()
    sequence, dependent = [], {}

    def sequence_next(v):
        sequenced.add(v)
        for u in _sequence(v, d, sequence, dependent):
            if u not in held:
                heapq.heappush(heap, (len(d[u]), rank[u]))

    while heap:
        size, r = heapq.heappop(heap)
        v = order[r]
        if v in sequenced or len(d[v]) != size:
            continue  # a stale key
        sequence_next(v)
    for v in last:
        sequence_next(v)
    return _ordering("generateseq", sequence, dependent)


def fixed_order(G, sequence, name: str = "fixed") -> Ordering:
    """Dependent sets of a given sequence (each vertex exactly once)."""
    sequence = list(sequence)
    if len(sequence) != len(G) or set(sequence) != set(G.nodes):
        raise ValueError("the sequence must list every vertex of the graph exactly once")
    queue = iter(sequence)
    return _eliminate(G, name, lambda unsequenced, d, rank: next(queue))


@arguments(G=a_costed_graph)
def breadth_first(G) -> Ordering:
    """Breadth-first ordering from vertex 0 (paper III-A), the paper's baseline.

    Neighbours are visited in id order; a disconnected graph continues from its smallest
    unvisited vertex. On a connected graph the dependent sets are ``N(V<=i) ∩ V>i``.
    """
    order = vertex_order(G)
    rank = {v: i for i, v in enumerate(order)}
    U = G.to_undirected(as_view=True) if G.is_directed() else G
    seen, sequence = set(), []
    for root in order:
        if root in seen:
            continue
        seen.add(root)
        queue = deque([root])
        while queue:
            v = queue.popleft()
            sequence.append(v)
            for u in sorted(U[v], key=rank.__getitem__):
                if u not in seen:
                    seen.add(u)
                    queue.append(u)
    return fixed_order(G, sequence, "breadth-first")


def dependent_sets_by_definition(G, sequence) -> dict:
    """``D(i) = N(X(i)) ∩ V>i`` computed directly from its definition (paper III-B).

    ``X(i)`` is the set of vertices of ``V<=i`` connected to ``v(i)`` through ``V<=i``.
    Quadratic; for tests and cross-checks, not for the search.
    """
    U = nx.Graph(G)
    position = {v: i for i, v in enumerate(sequence)}
    result = {}
    for i, v in enumerate(sequence):
        prefix = U.subgraph(sequence[: i + 1])
        connected = nx.node_connected_component(prefix, v)
        neighbours = set().union(*(U[x] for x in connected)) if connected else set()
        result[v] = {u for u in neighbours if position[u] > i}
    return result


@dataclass(frozen=True)
class OrderingEntry:
    """A registered ordering heuristic: its function and the title outputs show."""

    function: Callable
    title: str


#: Orderings by name, in ``--algo`` order: ``--algo 0`` is GenerateSeq, ``--algo 1``
#: breadth-first (the paper's numbering); a new entry becomes ``--algo 2``.
ORDERINGS = {
    "generateseq": OrderingEntry(generate_seq, "GenerateSeq"),
    "breadth-first": OrderingEntry(breadth_first, "breadth-first"),
}


def ordering_title(name: str) -> str:
    """The display title of a registered ordering (the name itself if unknown)."""
    entry = ORDERINGS.get(name)
    return entry.title if entry is not None else name


def get_ordering(ordering) -> Callable:
    """An ordering function from a name in ``ORDERINGS`` or a callable."""
    if callable(ordering):
        return ordering
    try:
        return ORDERINGS[ordering].function
    except (KeyError, TypeError):
        raise ValueError(f"unknown ordering {ordering!r}; choose one of: {', '.join(ORDERINGS)}") from None
