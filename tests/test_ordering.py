"""Orderings and their dependent sets (paper III-A/III-B, Fig. 3, Theorem 2; spec docs/search.md).

Every expected dependent set here comes either from a hand calculation written out in a
comment or from this module's own implementation of the definition
``D(i) = N(X(i)) ∩ V>i`` (``_dependent_by_definition`` below, written independently of
``pase.search.ordering``). GenerateSeq's choice rule (smallest ``|d|``, ties by smallest vertex id)
is checked against that definition too: the ``d(u)`` GenerateSeq keeps for an unsequenced
``u`` is, by Theorem 2, the dependent set ``u`` would get if it were sequenced next.
"""

from __future__ import annotations

import copy

import networkx as nx
import numpy as np
import pytest

from pase.search.ordering import (
    ORDERINGS,
    Ordering,
    breadth_first,
    dependent_sets_by_definition,
    fixed_order,
    generate_seq,
    get_ordering,
)

SEED = 20210517  # fixed: the random graphs are the same on every run

# --------------------------------------------------------------------------------------
# Independent helpers


def _adjacency(G) -> dict:
    """Undirected adjacency ``v -> set`` of a (di)graph, edge direction ignored (paper N(v))."""
    adj = {v: set() for v in G.nodes}
    for u, v in G.edges():
        adj[u].add(v)
        adj[v].add(u)
    return adj


def _dependent_by_definition(G, sequence) -> dict:
    """``D(i) = N(X(i)) ∩ V>i`` straight from the paper's definitions, by depth-first search.

    ``X(i)``: vertices of ``V<=i`` reachable from ``v(i)`` through ``V<=i`` only.
    """
    adj = _adjacency(G)
    position = {v: i for i, v in enumerate(sequence)}
    result = {}
    for i, v in enumerate(sequence):
        connected, stack = {v}, [v]
        while stack:
            x = stack.pop()
            for y in adj[x]:
                if position[y] <= i and y not in connected:
                    connected.add(y)
                    stack.append(y)
        result[v] = {y for x in connected for y in adj[x] if position[y] > i}
    return result


def _breadth_first_dependent(G, sequence) -> dict:
    """``DB(i) = N(V<=i) ∩ V>i`` (paper III-A)."""
    adj = _adjacency(G)
    position = {v: i for i, v in enumerate(sequence)}
    return {
        v: {y for x in sequence[: i + 1] for y in adj[x] if position[y] > i}
        for i, v in enumerate(sequence)
    }


def _bfs_sequence(G) -> list:
    """Breadth-first from the smallest id, neighbours in id order, restarting at the smallest
    unvisited vertex (the rule documented for ``breadth_first``)."""
    adj = _adjacency(G)
    seen, order = set(), []
    for root in sorted(G.nodes):
        if root in seen:
            continue
        seen.add(root)
        frontier = [root]
        while frontier:
            nxt = []
            for x in frontier:
                order.append(x)
                for y in sorted(adj[x]):
                    if y not in seen:
                        seen.add(y)
                        nxt.append(y)
            frontier = nxt
    return order


def _random_graph(rng, n: int, density: float, antiparallel: float = 0.0, relabel: bool = False) -> nx.DiGraph:
    """A random directed graph on ``n`` vertices; each unordered pair gets an edge with
    probability ``density`` in a random direction, and then the reverse edge too with
    probability ``antiparallel``. With ``relabel`` the ids are a random sample of 0..99
    added in random order (so id order and insertion order differ)."""
    labels = list(range(n))
    if relabel:
        labels = [int(x) for x in rng.choice(100, size=n, replace=False)]
    G = nx.DiGraph()
    for i in rng.permutation(n) if relabel else range(n):
        G.add_node(labels[int(i)])
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < density:
                u, v = (labels[i], labels[j]) if rng.random() < 0.5 else (labels[j], labels[i])
                G.add_edge(u, v)
                if rng.random() < antiparallel:
                    G.add_edge(v, u)
    return G


def _graph_cases(count: int):
    """``count`` random graphs: sparse to complete, 1 to 14 vertices, some relabelled."""
    rng = np.random.default_rng(SEED)
    densities = (0.0, 0.15, 0.3, 0.5, 0.7, 0.9, 1.0)
    cases = []
    for k in range(count):
        n = int(rng.integers(1, 15))
        density = densities[k % len(densities)]
        cases.append(_random_graph(rng, n, density, antiparallel=0.3 if k % 3 == 0 else 0.0, relabel=k % 4 == 1))
    return cases


RANDOM_GRAPHS = _graph_cases(150)


def _as_sets(dependent: dict) -> dict:
    return {v: set(d) for v, d in dependent.items()}


def _snapshot(G):
    return (list(G.nodes(data=True)), list(G.edges(data=True)), dict(G.graph))


# --------------------------------------------------------------------------------------
# Theorem 2 on random graphs, for every ordering


@pytest.mark.parametrize("index", range(len(RANDOM_GRAPHS)))
def test_generateseq_dependent_sets_equal_definition(index):
    G = RANDOM_GRAPHS[index]
    o = generate_seq(G)
    assert sorted(o.sequence) == sorted(G.nodes) and len(o.sequence) == len(G)
    mine = _dependent_by_definition(G, o.sequence)
    assert _as_sets(o.dependent) == mine
    assert _as_sets(dependent_sets_by_definition(G, o.sequence)) == mine
    assert o.max_dependent_set == max((len(d) for d in mine.values()), default=0)


@pytest.mark.parametrize("index", range(len(RANDOM_GRAPHS)))
def test_generateseq_picks_smallest_dependent_set_then_smallest_id(index):
    # Fig. 3 line 5: v(i) = argmin |u.d| over the unsequenced u. By Theorem 2, u.d at step i
    # is the dependent set u would have as v(i), i.e. the definition applied to the
    # sequence so far followed by u. Ties go to the smallest vertex id (spec docs/search.md).
    G = RANDOM_GRAPHS[index]
    sequence = generate_seq(G).sequence
    for i, chosen in enumerate(sequence):
        prefix = list(sequence[:i])
        candidates = []
        for u in G.nodes:
            if u in prefix:
                continue
            rest = [w for w in G.nodes if w not in prefix and w != u]
            would_be = _dependent_by_definition(G, prefix + [u] + rest)[u]
            candidates.append((len(would_be), u))
        assert chosen == min(candidates)[1], f"step {i}: candidates {sorted(candidates)}"


@pytest.mark.parametrize("index", range(0, len(RANDOM_GRAPHS), 2))
def test_breadth_first_sequence_and_dependent_sets(index):
    G = RANDOM_GRAPHS[index]
    o = breadth_first(G)
    assert list(o.sequence) == _bfs_sequence(G)
    mine = _dependent_by_definition(G, o.sequence)
    assert _as_sets(o.dependent) == mine
    assert _as_sets(dependent_sets_by_definition(G, o.sequence)) == mine
    if len(G) and nx.is_connected(G.to_undirected()):
        # On a connected graph X(i) = V<=i for a BFS order, so D(i) = DB(i) (paper III-B).
        assert mine == _breadth_first_dependent(G, o.sequence)


@pytest.mark.parametrize("index", range(1, len(RANDOM_GRAPHS), 2))
def test_fixed_order_dependent_sets_equal_definition(index):
    G = RANDOM_GRAPHS[index]
    rng = np.random.default_rng([SEED, index])
    sequence = [list(G.nodes)[int(i)] for i in rng.permutation(len(G))]
    o = fixed_order(G, sequence)
    assert list(o.sequence) == sequence
    mine = _dependent_by_definition(G, sequence)
    assert _as_sets(o.dependent) == mine
    assert _as_sets(dependent_sets_by_definition(G, sequence)) == mine


@pytest.mark.parametrize("ordering", [generate_seq, breadth_first])
def test_dependent_tuples_are_sorted_latest_first(ordering):
    for G in RANDOM_GRAPHS[:40]:
        o = ordering(G)
        position = {v: i for i, v in enumerate(o.sequence)}
        for v, d in o.dependent.items():
            assert isinstance(d, tuple)
            assert [position[u] for u in d] == sorted((position[u] for u in d), reverse=True)
            assert all(position[u] > position[v] for u in d)


# --------------------------------------------------------------------------------------
# Hand-worked examples


def test_generateseq_diamond_with_tail_needs_the_fill_edge():
    # Edges 0-1, 0-2, 1-3, 2-3, 3-4. Worked by hand with Fig. 3:
    #   d: 0{1,2} 1{0,3} 2{0,3} 3{1,2,4} 4{3}
    #   i=1: min |d| = 1 -> 4, D={3};   d(3) = {1,2,4}∪{3} - {3,4} = {1,2}
    #   i=2: all |d| = 2 -> 0 (smallest id), D={1,2};
    #        d(1) = {0,3}∪{1,2} - {1,0} = {2,3}  <- fill edge 1-2
    #        d(2) = {0,3}∪{1,2} - {2,0} = {1,3}
    #   i=3: 1{2,3} 2{1,3} 3{1,2} -> 1, D={2,3}; d(2)={3}, d(3)={2}
    #   i=4: 2{3} ties 3{2} -> 2, D={3};  i=5: 3, D={}
    # An elimination that forgot the fill edge would give d(1) = {3} after step 2 and
    # D(1) = {3}, but X(3rd) = {0, 1} and N({0,1}) ∩ {2,3} = {2,3}.
    G = nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)])
    o = generate_seq(G)
    assert o.sequence == (4, 0, 1, 2, 3)
    assert _as_sets(o.dependent) == {4: {3}, 0: {1, 2}, 1: {2, 3}, 2: {3}, 3: set()}
    assert o.dependent[1] == (3, 2)  # latest first: 3 is sequenced after 2
    assert o.max_dependent_set == 2


def test_generateseq_cycle_keeps_the_fill_edges():
    # C5: 0-1-2-3-4-0. All degrees 2 -> 0 first, D={1,4}; fill 1-4:
    #   d(1) = {0,2}∪{1,4} - {1,0} = {2,4}; d(4) = {0,3}∪{1,4} - {4,0} = {1,3}
    #   1{2,4} 2{1,3} 3{2,4} 4{1,3} -> 1, D={2,4}; d(2) = {3,4}, d(4) = {2,3}
    #   2{3,4} 3{2,4} 4{2,3} -> 2, D={3,4}; d(3) = {4}, d(4) = {3}
    #   3, D={4}; 4, D={}.
    # Forgetting fill edges would give D(1) = {2} and D(2) = {3}: the cycle would be cut.
    G = nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)])
    o = generate_seq(G)
    assert o.sequence == (0, 1, 2, 3, 4)
    assert _as_sets(o.dependent) == {0: {1, 4}, 1: {2, 4}, 2: {3, 4}, 3: {4}, 4: set()}


def test_generateseq_star():
    # Star with centre 0 and leaves 1, 2, 3: leaves have |d| = 1, the centre 3.
    #   1 first (D={0}); d(0) = {1,2,3}∪{0} - {0,1} = {2,3}
    #   2 (|d|=1) beats 0 (|d|=2): D(2)={0}; d(0) = {3}, d(3) = {0}
    #   0 and 3 tie at |d| = 1 -> 0, D={3}; then 3, D={}.
    # (The docstring example of generate_seq claims (1, 0, 2, 3); Fig. 3 gives this.)
    o = generate_seq(nx.star_graph(3))
    assert o.sequence == (1, 2, 0, 3)
    assert _as_sets(o.dependent) == {1: {0}, 2: {0}, 0: {3}, 3: set()}


def test_generateseq_ties_use_vertex_id_not_insertion_order():
    # A path 7-3-9 inserted as 9, 7, 3: the ends 7 and 9 tie at |d| = 1; 7 has the smaller id.
    # Then 3 (d={9}) ties with 9 (d={3}) -> 3; then 9.
    G = nx.DiGraph()
    G.add_nodes_from([9, 7, 3])
    G.add_edges_from([(9, 3), (3, 7)])
    o = generate_seq(G)
    assert o.sequence == (7, 3, 9)
    assert _as_sets(o.dependent) == {7: {3}, 3: {9}, 9: set()}


def test_isolated_vertices_and_single_vertex():
    # Isolated vertices have |d| = 0 and come first (by id); edges 5-6 form the rest.
    G = nx.DiGraph()
    G.add_nodes_from([6, 2, 5, 0])
    G.add_edge(6, 5)
    o = generate_seq(G)
    assert o.sequence == (0, 2, 5, 6)
    assert _as_sets(o.dependent) == {0: set(), 2: set(), 5: {6}, 6: set()}
    single = nx.DiGraph()
    single.add_node(0)
    for ordering in (generate_seq, breadth_first):
        o = ordering(single)
        assert o.sequence == (0,) and o.dependent == {0: ()} and o.max_dependent_set == 0


def _fig2_like_graph():
    """A graph with the properties the paper states for Fig. 2, ids = positions 1..9.

    With the sequence 1..9: X(5) = {1, 2, 3, 5}, D(5) = {8}, S(5) = {{1, 2}, {3}},
    DB(5) = {7, 8, 9}.
    """
    return nx.DiGraph([(1, 2), (2, 5), (3, 5), (5, 8), (4, 7), (4, 9), (6, 7), (6, 9), (8, 9), (7, 8)])


def test_paper_fig2_dependent_set_versus_breadth_first_set():
    G = _fig2_like_graph()
    sequence = list(range(1, 10))
    o = fixed_order(G, sequence)
    # Hand: X(5) = {1,2,3,5} (4 is not reachable through V<=5); N(X(5)) ∩ {6..9} = {8}.
    assert set(o.dependent[5]) == {8}
    # DB(5) = N({1..5}) ∩ {6..9}: 5->8, 4->7, 4->9.
    assert _breadth_first_dependent(G, sequence)[5] == {7, 8, 9}
    # The rest by hand: D(1)={2}, D(2)={5}, D(3)={5}, D(4)={7,9}, D(6)={7,9} (X={6}: 4 and 6
    # meet only through the later 7 and 9),
    # D(7)={8,9} (X={4,6,7}), D(8)={9}, D(9)={}.
    assert _as_sets(o.dependent) == {
        1: {2}, 2: {5}, 3: {5}, 4: {7, 9}, 5: {8}, 6: {7, 9}, 7: {8, 9}, 8: {9}, 9: set()
    }


def test_breadth_first_hand_example():
    # Diamond with tail (0-1, 0-2, 1-3, 2-3, 3-4): BFS from 0 gives 0, 1, 2, 3, 4.
    # DB: 0 -> {1,2}; 1 -> N({0,1}) ∩ {2,3,4} = {2,3}; 2 -> {3}; 3 -> {4}; 4 -> {}.
    G = nx.DiGraph([(0, 1), (2, 0), (1, 3), (3, 2), (3, 4)])
    o = breadth_first(G)
    assert o.sequence == (0, 1, 2, 3, 4)
    assert _as_sets(o.dependent) == {0: {1, 2}, 1: {2, 3}, 2: {3}, 3: {4}, 4: set()}


def test_breadth_first_restarts_at_smallest_unvisited_vertex():
    # Components {0, 4} and {1, 2, 3} (path 3-1-2); BFS: 0, 4, then from 1: 1, 2, 3.
    G = nx.DiGraph([(4, 0), (3, 1), (1, 2)])
    o = breadth_first(G)
    assert o.sequence == (0, 4, 1, 2, 3)
    assert _as_sets(o.dependent) == {0: {4}, 4: set(), 1: {2, 3}, 2: {3}, 3: set()}


# --------------------------------------------------------------------------------------
# No mutation, errors, registry


@pytest.mark.parametrize("ordering", [generate_seq, breadth_first, lambda G: fixed_order(G, sorted(G.nodes)[::-1])])
def test_orderings_do_not_mutate_the_graph(ordering):
    for G in RANDOM_GRAPHS[:30] + [_fig2_like_graph()]:
        for v in G.nodes:
            G.nodes[v]["tag"] = [v]
        before = copy.deepcopy(_snapshot(G))
        ordering(G)
        assert _snapshot(G) == before
    # An undirected graph is accepted and left alone as well.
    U = nx.cycle_graph(6)
    before = copy.deepcopy(_snapshot(U))
    o = generate_seq(U)
    assert _snapshot(U) == before
    assert _as_sets(o.dependent) == _dependent_by_definition(U, o.sequence)


@pytest.mark.parametrize("ordering", [generate_seq, breadth_first, lambda G: fixed_order(G, [0, 1, 2])])
def test_self_loop_is_rejected(ordering):
    G = nx.DiGraph([(0, 1), (1, 2), (1, 1)])
    with pytest.raises(ValueError, match="itself"):
        ordering(G)


@pytest.mark.parametrize("sequence", [[0, 1], [0, 1, 1], [0, 1, 2, 3], [0, 1, 5]])
def test_fixed_order_rejects_a_sequence_that_is_not_a_permutation(sequence):
    G = nx.DiGraph([(0, 1), (1, 2)])
    with pytest.raises(ValueError, match="exactly once"):
        fixed_order(G, sequence)


def test_get_ordering():
    assert get_ordering("generateseq") is generate_seq
    assert get_ordering("breadth-first") is breadth_first
    assert set(ORDERINGS) == {"generateseq", "breadth-first"}

    def custom(G):
        return fixed_order(G, sorted(G.nodes))

    assert get_ordering(custom) is custom
    with pytest.raises(ValueError, match="unknown ordering"):
        get_ordering("depth-first")
    o = fixed_order(nx.path_graph(3), [2, 1, 0], name="mine")
    assert isinstance(o, Ordering) and o.name == "mine"
    assert generate_seq(nx.path_graph(2)).name == "generateseq"
    assert breadth_first(nx.path_graph(2)).name == "breadth-first"


# --------------------------------------------------------------------------------------
# The heap-based GenerateSeq and its held-back vertices (pase.search.blocks uses them)


def _scan_generate_seq(G):
    """GenerateSeq as Fig. 3 writes it: every round, scan all unsequenced vertices for the
    smallest (|d(v)|, id); then d(u) = (d(u) ∪ d(v)) - {u, v} for u in d(v)."""
    order = sorted(G.nodes)
    d = {v: set() for v in order}
    for u, v in G.edges():
        d[u].add(v)
        d[v].add(u)
    left, sequence, dependent = set(order), [], {}
    while left:
        v = min(left, key=lambda x: (len(d[x]), order.index(x)))
        left.discard(v)
        sequence.append(v)
        dependent[v] = set(d[v])
        for u in d[v]:
            d[u] = (d[u] | d[v]) - {u, v}
    return sequence, dependent


@pytest.mark.parametrize("seed", range(40))
def test_heap_generate_seq_is_the_scan(seed):
    rng = np.random.default_rng([SEED, seed, 11])
    n = int(rng.integers(1, 40))
    G = nx.gnp_random_graph(n, float(rng.uniform(0.02, 0.4)), seed=int(rng.integers(1 << 30)))
    o = generate_seq(G)
    sequence, dependent = _scan_generate_seq(G)
    assert list(o.sequence) == sequence
    assert {v: set(dv) for v, dv in o.dependent.items()} == dependent


def test_held_back_vertices_come_last_in_the_given_order():
    # Path 0-1-2-3-4 with 1 and 3 held back (given as [3, 1]). The others by the rule:
    # |d| is 1 for 0 and 4, 2 for 2 -> 0 (smaller id), D(0) = {1}; then 4 (|d| = 1 < 2),
    # D(4) = {3}; then 2, D(2) = {1, 3}, which leaves d(3) = {1}; then the held ones in the
    # given order: 3 with D(3) = {1}, and 1 with D(1) = {}.
    G = nx.path_graph(5)
    o = generate_seq(G, last=[3, 1])
    assert o.sequence == (0, 4, 2, 3, 1)
    assert {v: set(d) for v, d in o.dependent.items()} == {0: {1}, 4: {3}, 2: {1, 3}, 3: {1}, 1: set()}
    assert _as_sets(o.dependent) == _dependent_by_definition(G, o.sequence)
    with pytest.raises(ValueError, match="distinct vertices"):
        generate_seq(G, last=[1, 1])
    with pytest.raises(ValueError, match="distinct vertices"):
        generate_seq(G, last=[7])
