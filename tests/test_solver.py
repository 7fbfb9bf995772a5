"""The exact search (paper Eq. 4 / Fig. 4, Theorem 1; spec docs/search.md).

Exactness is shown against exhaustive enumeration (``itertools.product`` over every
strategy) on a few hundred seeded random graphs, for GenerateSeq, breadth-first and random
fixed orders, with the default slicing and with tiny slices (so the sliced reduction path
runs too). Every returned strategy is re-costed by the brute-force cost function of this
module. On real costed graphs the optimum is re-costed with ``pase.costing.strategy.evaluate``.
"""

from __future__ import annotations

import copy
import itertools
import math
import tracemalloc

import networkx as nx
import numpy as np
import pytest

import graphs
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, Elementwise, SoftmaxCrossEntropy
from pase.machines.paper import Machine
from pase.search.ordering import fixed_order
from pase.search.solver import DEFAULT_CHUNK_ENTRIES, Search, SearchTooLarge, WorkEstimate, solve
from pase.costing.strategy import evaluate

SEED = 1_000_003  # fixed: the same random graphs on every run
N_RANDOM = 256
MAX_STRATEGIES = 20_000  # cap on prod(K_v) so that enumeration stays cheap

# --------------------------------------------------------------------------------------
# Brute force, written independently of pase.search.solver


def _cost_of(G, choice) -> float:
    """``F``: chosen layer costs plus chosen edge-matrix entries, one term at a time."""
    total = 0.0
    for v, data in G.nodes(data=True):
        total += float(data["cost"][choice[v]])
    for u, v, data in G.edges(data=True):
        total += float(data["cost"][choice[u], choice[v]])
    return total


def _enumerate(G):
    """Every strategy (rows of configuration indices, columns in ``list(G.nodes)`` order)
    from ``itertools.product``, and the cost of each."""
    nodes = list(G.nodes)
    column = {v: i for i, v in enumerate(nodes)}
    ranges = [range(len(G.nodes[v]["cost"])) for v in nodes]
    strategies = np.array(list(itertools.product(*ranges)), dtype=np.intp).reshape(-1, len(nodes))
    totals = np.zeros(len(strategies))
    for v in nodes:
        totals += np.asarray(G.nodes[v]["cost"])[strategies[:, column[v]]]
    for u, v, data in G.edges(data=True):
        totals += np.asarray(data["cost"])[strategies[:, column[u]], strategies[:, column[v]]]
    return nodes, strategies, totals


def _scale(G) -> float:
    """Sum of the largest magnitudes: the size of the numbers being added up."""
    s = sum(float(np.abs(d["cost"]).max()) for _, d in G.nodes(data=True))
    s += sum(float(np.abs(d["cost"]).max()) for _, _, d in G.edges(data=True))
    return max(s, 1.0)


def _close(a, b, G) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12 * _scale(G))


def _dependent_by_definition(G, sequence) -> dict:
    """``D(i) = N(X(i)) ∩ V>i`` by depth-first search (independent of pase.search.ordering)."""
    adj = {v: set() for v in G.nodes}
    for u, v in G.edges():
        adj[u].add(v)
        adj[v].add(u)
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
        result[v] = ({y for x in connected for y in adj[x] if position[y] > i}, connected)
    return result


# --------------------------------------------------------------------------------------
# Random costed graphs

COST_KINDS = ("uniform", "ties", "signed", "wide")


def _costs(rng, kind, shape):
    if kind == "uniform":
        return rng.uniform(0.0, 100.0, size=shape)
    if kind == "ties":  # integers 0..2: many strategies share the optimum
        return rng.integers(0, 3, size=shape).astype(np.float64)
    if kind == "signed":
        return rng.normal(0.0, 1e3, size=shape)
    return 10.0 ** rng.uniform(0.0, 12.0, size=shape)  # "wide": magnitudes like real graphs


def _structure(rng, category: int):
    """Vertex labels (in insertion order) and directed edges for one graph category."""
    if category == 0:  # a single vertex
        return [0], []
    n = int(rng.integers(2, 9))
    labels = list(range(n))
    pairs = list(itertools.combinations(range(n), 2))
    if category == 1:  # only isolated vertices, or a few edges plus isolated ones
        density = 0.0 if rng.random() < 0.5 else 0.15
    elif category == 2:  # two components (plus maybe isolated vertices)
        cut = int(rng.integers(1, n))
        pairs = [(i, j) for i, j in pairs if (i < cut) == (j < cut)]
        density = rng.uniform(0.3, 1.0)
    elif category == 3:
        density = rng.uniform(0.2, 0.45)
    elif category == 4:
        density = rng.uniform(0.75, 1.0)
    else:
        density = rng.uniform(0.2, 1.0)
    if category == 7:  # ids differ from insertion order
        labels = [int(x) for x in rng.choice(100, size=n, replace=False)]
    edges = []
    antiparallel = 0.5 if category in (5, 6) else 0.1
    for i, j in pairs:
        if rng.random() < density:
            u, v = (labels[i], labels[j]) if rng.random() < 0.5 else (labels[j], labels[i])
            edges.append((u, v))
            if rng.random() < antiparallel:
                edges.append((v, u))
    order = [labels[int(i)] for i in rng.permutation(n)] if category == 7 else labels
    return order, edges


def _random_costed_graph(index: int) -> nx.DiGraph:
    rng = np.random.default_rng([SEED, index])
    category = index % 8
    kind = "ties" if category == 6 else COST_KINDS[(index // 8) % len(COST_KINDS)]
    vertices, edges = _structure(rng, category)
    K = {v: int(rng.integers(1, 6)) for v in vertices}
    while math.prod(K.values()) > MAX_STRATEGIES:
        v = vertices[int(rng.integers(len(vertices)))]
        K[v] = max(1, K[v] - 1)
    G = nx.DiGraph()
    for v in vertices:
        G.add_node(v, cost=_costs(rng, kind, K[v]))
    for u, v in edges:
        G.add_edge(u, v, cost=_costs(rng, kind, (K[u], K[v])))
    return G


def _random_order(G, index):
    rng = np.random.default_rng([SEED, index, 7])
    nodes = list(G.nodes)
    sequence = [nodes[int(i)] for i in rng.permutation(len(nodes))]
    return lambda graph: fixed_order(graph, sequence, "random-fixed")


def test_random_graph_mix():
    # The suite really contains the graph shapes it claims to.
    gs = [_random_costed_graph(i) for i in range(N_RANDOM)]
    assert sum(len(G) == 1 for G in gs) >= 20
    assert sum(len(G) > 1 and G.number_of_edges() == 0 for G in gs) >= 10
    assert sum(len(G) > 1 and not nx.is_connected(G.to_undirected()) for G in gs) >= 60
    assert sum(any(G.has_edge(v, u) for u, v in G.edges) for G in gs) >= 40
    assert sum(len(G) == 8 for G in gs) >= 20
    assert sum(G.number_of_edges() >= 20 for G in gs) >= 5
    ties = [G for i, G in enumerate(gs) if i % 8 == 6]
    assert all(np.all(G.nodes[v]["cost"] == np.round(G.nodes[v]["cost"])) for G in ties for v in G)


# --------------------------------------------------------------------------------------
# Exactness (Theorem 1)


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_optimum_equals_exhaustive_enumeration(index):
    G = _random_costed_graph(index)
    nodes, strategies, totals = _enumerate(G)
    best = float(totals.min())
    rng = np.random.default_rng([SEED, index, 1])
    orderings = {"generateseq": "generateseq", "breadth-first": "breadth-first", "fixed": _random_order(G, index)}
    for name, ordering in orderings.items():
        # Slices of 1..11 entries: the sliced reduction runs on most graphs, including
        # slices narrower than one configuration axis (K <= 5).
        for chunk in (DEFAULT_CHUNK_ENTRIES, int(rng.integers(1, 12))):
            result = Search(G, ordering, chunk_entries=chunk).run()
            where = f"{name}, chunk {chunk}"
            assert _close(result.cost, best, G), f"{where}: search {result.cost!r} != enumeration {best!r}"
            assert set(result.choice) == set(G.nodes), where
            for v, c in result.choice.items():
                assert isinstance(c, int) and 0 <= c < len(G.nodes[v]["cost"]), where
            assert _close(_cost_of(G, result.choice), result.cost, G), where
            # The chosen strategy is one of the enumerated optima.
            row = np.array([result.choice[v] for v in nodes])
            at = int(np.flatnonzero((strategies == row).all(axis=1))[0])
            assert _close(float(totals[at]), best, G), where


@pytest.mark.parametrize("index", range(0, N_RANDOM, 5))
def test_rerun_with_other_vertex_costs(index):
    # Search(G).run(costs=...) replaces the layer-cost vectors; it must equal a fresh search
    # (and the enumeration) of the graph carrying those costs.
    G = _random_costed_graph(index)
    rng = np.random.default_rng([SEED, index, 2])
    new = {v: rng.uniform(-5.0, 50.0, size=len(G.nodes[v]["cost"])) for v in G}
    kept = {v: c.copy() for v, c in new.items()}
    search = Search(G)
    first = search.run()
    second = search.run(costs=new)
    H = G.copy()
    for v in H:
        H.nodes[v]["cost"] = new[v]
    _, _, totals = _enumerate(H)
    assert _close(second.cost, float(totals.min()), H)
    assert _close(_cost_of(H, second.choice), second.cost, H)
    assert all(np.array_equal(new[v], kept[v]) for v in G)  # the caller's costs untouched
    assert search.run().cost == first.cost  # the original costs are still the default


def test_solve_is_search_run():
    for index in range(0, 40, 3):
        G = _random_costed_graph(index)
        a, b = solve(G, "breadth-first"), Search(G, "breadth-first").run()
        assert a.cost == b.cost and a.choice == b.choice and a.sequence == b.sequence


@pytest.mark.parametrize("chunk", [1, 2, 3, 4])
def test_slices_smaller_than_one_configuration_axis(chunk):
    # chunk_entries is public and documented as "table entries processed per slice"; any
    # positive value must give the optimum. Hand example: one vertex with costs [3, 1, 2]
    # -> optimum 1 at index 1; a second vertex [0, 5] joined by a zero matrix -> 1 + 0.
    # (This raised IndexError in Search._reduce before commit 26e465b: a table with an
    # empty dependent set, i.e. rank 1, whose K_v exceeds chunk_entries.)
    G = nx.DiGraph()
    G.add_node(0, cost=np.array([3.0, 1.0, 2.0]))
    r = Search(G, chunk_entries=chunk).run()
    assert r.cost == 1.0 and r.choice == {0: 1}
    G.add_node(1, cost=np.array([0.0, 5.0]))
    G.add_edge(1, 0, cost=np.zeros((2, 3)))
    for ordering in ("generateseq", "breadth-first"):
        r = Search(G, ordering, chunk_entries=chunk).run()
        assert r.cost == 1.0 and r.choice == {0: 1, 1: 0}
    for index in range(0, 64, 7):
        H = _random_costed_graph(index)
        _, _, totals = _enumerate(H)
        assert _close(Search(H, chunk_entries=chunk).run().cost, float(totals.min()), H)


def test_docstring_example_worked_by_hand():
    # Costs: vertex 0 [1, 5], vertex 1 [4, 0], edge [[0, 9], [0, 0]]. Strategies:
    # (0,0) 1+4+0=5, (0,1) 1+0+9=10, (1,0) 5+4+0=9, (1,1) 5+0+0=5 -> optimum 5, tie
    # between (0,0) and (1,1).
    G = nx.DiGraph()
    G.add_node(0, cost=np.array([1.0, 5.0]))
    G.add_node(1, cost=np.array([4.0, 0.0]))
    G.add_edge(0, 1, cost=np.array([[0.0, 9.0], [0.0, 0.0]]))
    r = Search(G).run()
    assert r.cost == 5.0 and r.indices() in ([0, 0], [1, 1])


def test_antiparallel_edges_are_both_counted():
    # Edges (0,1) and (1,0) with different matrices; the total for (a, b) is
    # c0[a] + c1[b] + M01[a, b] + M10[b, a].
    #   c0 = [0, 0], c1 = [0, 0], M01 = [[3, 1], [2, 8]], M10 = [[4, 0], [0, 5]]
    #   (0,0): 3+4 = 7; (0,1): 1+0 = 1; (1,0): 2+0 = 2; (1,1): 8+5 = 13 -> (0,1), cost 1.
    G = nx.DiGraph()
    G.add_node(0, cost=np.zeros(2))
    G.add_node(1, cost=np.zeros(2))
    G.add_edge(0, 1, cost=np.array([[3.0, 1.0], [2.0, 8.0]]))
    G.add_edge(1, 0, cost=np.array([[4.0, 0.0], [0.0, 5.0]]))
    for ordering in ("generateseq", "breadth-first", lambda g: fixed_order(g, [1, 0])):
        r = Search(G, ordering).run()
        assert r.cost == 1.0 and r.choice == {0: 0, 1: 1}


def test_disconnected_components_add_up():
    # Two components, each worked by hand: {0}: cost [7, 2] -> 2; {1-2}: c1 = [1, 0],
    # c2 = [0, 3], M12 = [[0, 4], [6, 0]]: (0,0)=1, (0,1)=8, (1,0)=6, (1,1)=3 -> 1.
    # Isolated vertex 3 with cost [5] -> 5. Total 2 + 1 + 5 = 8.
    G = nx.DiGraph()
    G.add_node(0, cost=np.array([7.0, 2.0]))
    G.add_node(1, cost=np.array([1.0, 0.0]))
    G.add_node(2, cost=np.array([0.0, 3.0]))
    G.add_node(3, cost=np.array([5.0]))
    G.add_edge(1, 2, cost=np.array([[0.0, 4.0], [6.0, 0.0]]))
    for ordering in ("generateseq", "breadth-first"):
        r = Search(G, ordering).run()
        assert r.cost == 8.0 and r.choice == {0: 1, 1: 0, 2: 0, 3: 0}


def test_connected_subsets_hand_off():
    # Eq. 4: the tables handed to v(i) are one per connected subset S(i) (components of
    # X(i) - {v(i)}); the table of a component is that of its latest vertex.
    for index in range(N_RANDOM):
        G = _random_costed_graph(index)
        for ordering in ("generateseq", "breadth-first", _random_order(G, index)):
            search = Search(G, ordering)
            sequence = search.ordering.sequence
            position = {v: i for i, v in enumerate(sequence)}
            definition = _dependent_by_definition(G, sequence)
            U = nx.Graph(G)
            for v in sequence:
                rest = definition[v][1] - {v}
                subsets = list(nx.connected_components(U.subgraph(rest)))
                expected = sorted(max(s, key=position.__getitem__) for s in subsets)
                assert sorted(search.handed[v]) == expected


# --------------------------------------------------------------------------------------
# Real costed graphs


def _diamond_network(batch=32):
    """fc1 feeds fc2a and fc2b, which an element-wise add joins: a cycle of four layers."""
    g = GraphBuilder("diamond", cutoff=1, batch=batch)
    x = g.input((batch, 64), "x", letters="bk")
    h = g.add("fc1", FC(x, 64))
    a = g.add("fc2a", FC(h, 64))
    b = g.add("fc2b", FC(h, 48))
    b = g.add("fc3b", FC(b, 64))
    s = g.add("add", Elementwise(a, b))
    g.add("loss", SoftmaxCrossEntropy(s))
    return g.build()


@pytest.mark.parametrize("procs", [2, 4])
def test_hand_built_network_against_enumeration_and_evaluate(procs):
    net = _diamond_network()
    machine = Machine(12.0, 20.0)
    G = net.graph(procs, machine)
    nodes, strategies, totals = _enumerate(G)
    assert len(strategies) > 1000  # a real search space, not a trivial one
    best = float(totals.min())
    for ordering in ("generateseq", "breadth-first"):
        r = Search(G, ordering).run()
        assert math.isclose(r.cost, best, rel_tol=1e-9)
        configs = [G.nodes[v]["configs"][r.choice[v]] for v in range(len(net))]
        assert math.isclose(evaluate(net, configs, machine, procs).total, r.cost, rel_tol=1e-9)
    # The enumerated optimum, costed by the cost model itself, agrees too.
    row = strategies[int(np.argmin(totals))]
    configs = [G.nodes[v]["configs"][row[nodes.index(v)]] for v in range(len(net))]
    assert math.isclose(evaluate(net, configs, machine, procs).total, best, rel_tol=1e-9)


@pytest.mark.parametrize("name,procs", [("alexnet", 4), ("alexnet", 16), ("rnnlm", 8), ("inception3", 8), ("transformer", 8)])
def test_optimum_equals_evaluate_of_returned_configurations(name, procs):
    net = graphs.build(name)
    machine = Machine()
    G = net.graph(procs, machine)
    r = Search(G).run()
    configs = [G.nodes[v]["configs"][r.choice[v]] for v in range(len(net))]
    assert math.isclose(evaluate(net, configs, machine, procs).total, r.cost, rel_tol=1e-9)
    assert math.isclose(_cost_of(G, r.choice), r.cost, rel_tol=1e-9)


# --------------------------------------------------------------------------------------
# No mutation, errors


def _frozen(G):
    # Arrays by content; plain values by value; anything else (layers, networks, the
    # machine) must still be the very same object.
    def freeze(value):
        if isinstance(value, np.ndarray):
            return ("array", value.dtype.str, value.shape, value.tobytes())
        if isinstance(value, (int, float, str, tuple, list)):
            return copy.deepcopy(value)
        return ("object", id(value))

    nodes = [(v, {k: freeze(x) for k, x in d.items()}) for v, d in G.nodes(data=True)]
    edges = [(u, v, {k: freeze(x) for k, x in d.items()}) for u, v, d in G.edges(data=True)]
    return nodes, edges, {k: freeze(x) for k, x in G.graph.items()}


def test_search_does_not_mutate_the_graph():
    cases = [_random_costed_graph(i) for i in range(0, N_RANDOM, 4)]
    cases.append(graphs.build("inception3").graph(8))
    for G in cases:
        before = _frozen(G)
        for ordering in ("generateseq", "breadth-first"):
            search = Search(G, ordering, chunk_entries=3 if len(G) < 20 else DEFAULT_CHUNK_ENTRIES)
            if search.estimate.peak_bytes < 1 << 28:
                search.run()
            assert _frozen(G) == before


def _two_vertex_graph():
    G = nx.DiGraph()
    G.add_node(0, cost=np.array([1.0, 2.0]))
    G.add_node(1, cost=np.array([3.0, 4.0, 5.0]))
    G.add_edge(0, 1, cost=np.zeros((2, 3)))
    return G


def _mutated(change):
    G = _two_vertex_graph()
    change(G)
    return G


@pytest.mark.parametrize(
    "G,message",
    [
        (_mutated(lambda G: G.add_edge(1, 1, cost=np.zeros((3, 3)))), "itself"),
        (_mutated(lambda G: G.nodes[1].pop("cost")), r"vertex 1 has no 'cost'"),
        (_mutated(lambda G: G.add_node(2)), r"vertex 2 has no 'cost'"),
        (_mutated(lambda G: G.edges[0, 1].pop("cost")), r"edge \(0, 1\) has no 'cost'"),
        (_mutated(lambda G: G.edges[0, 1].update(cost=np.zeros((3, 2)))), r"edge \(0, 1\).*shape \(3, 2\).*\(2, 3\)"),
        (_mutated(lambda G: G.edges[0, 1].update(cost=np.zeros(6))), r"edge \(0, 1\).*shape"),
        (_mutated(lambda G: G.nodes[0].update(cost=np.array([1.0, np.nan]))), r"vertex 0.*NaN"),
        (_mutated(lambda G: G.edges[0, 1].update(cost=np.array([[0, 0, 0], [0, np.nan, 0.0]]))), r"edge \(0, 1\).*NaN"),
        (_mutated(lambda G: G.nodes[0].update(cost=np.array([]))), r"vertex 0.*non-empty 1-D"),
        (_mutated(lambda G: G.nodes[0].update(cost=np.ones((2, 1)))), r"vertex 0.*non-empty 1-D"),
    ],
    ids=["self-loop", "no-vertex-cost", "new-vertex-without-cost", "no-edge-cost", "transposed-matrix",
         "flat-matrix", "nan-vertex", "nan-edge", "empty-vector", "2d-vector"],
)
def test_bad_graphs_raise_value_error(G, message):
    with pytest.raises(ValueError, match=message) as err:
        Search(G)
    assert "\n" not in str(err.value)


def test_bad_run_arguments_raise_value_error():
    search = Search(_two_vertex_graph())
    with pytest.raises(ValueError, match=r"vertex 1.*shape \(2,\).*\(3,\)"):
        search.run(costs={0: [1.0, 2.0], 1: [1.0, 2.0]})
    with pytest.raises(ValueError, match="chunk_entries"):
        Search(_two_vertex_graph(), chunk_entries=0)
    with pytest.raises(ValueError, match="unknown ordering"):
        Search(_two_vertex_graph(), "random")


# --------------------------------------------------------------------------------------
# Work estimate and refusal


def _expected_work(G, sequence):
    """Table entries, largest table and M from the definition of D(i) (spec docs/search.md)."""
    definition = _dependent_by_definition(G, sequence)
    K = {v: len(G.nodes[v]["cost"]) for v in G}
    sizes = [math.prod(K[u] for u in definition[v][0] | {v}) for v in sequence]
    return sum(sizes), max(sizes), max(len(definition[v][0]) for v in sequence)


@pytest.mark.parametrize("index", range(0, N_RANDOM, 3))
def test_estimate_table_entries_random(index):
    G = _random_costed_graph(index)
    for ordering in ("generateseq", "breadth-first", _random_order(G, index)):
        search = Search(G, ordering)
        e = search.estimate
        assert isinstance(e, WorkEstimate)
        assert (e.table_entries, e.largest_table, e.max_dependent_set) == _expected_work(G, search.ordering.sequence)
        stats = search.run().stats
        assert (stats.table_entries, stats.largest_table, stats.max_dependent_set) == (
            e.table_entries, e.largest_table, e.max_dependent_set)


@pytest.mark.parametrize("name,ordering", [("inception3", "generateseq"), ("transformer", "generateseq"),
                                           ("inception3", "breadth-first"), ("transformer", "breadth-first"),
                                           ("resnet101", "breadth-first")])
def test_estimate_table_entries_real_graphs(name, ordering):
    # The plain programme's work (with blocks the work is less: tests/test_blocks.py).
    G = graphs.build(name).graph(8)
    search = Search(G, ordering, blocks=False)
    e = search.estimate
    assert (e.table_entries, e.largest_table, e.max_dependent_set) == _expected_work(G, search.ordering.sequence)
    assert e.ordering == ordering


def test_tiny_budget_refused_before_anything_runs():
    G = graphs.build("transformer").graph(8)
    search = Search(G)
    calls = []
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(SearchTooLarge) as err:
            search.run(memory_budget=1, progress=lambda done, total: calls.append(done))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(err.value, MemoryError)
    assert err.value.estimate == search.estimate and err.value.budget == 1
    assert calls == []
    # The search would allocate megabytes of tables; refusing allocated next to nothing.
    assert search.estimate.peak_bytes > 1 << 20 and peak < 1 << 18
    with pytest.raises(SearchTooLarge):
        solve(G, memory_budget=1)


def test_budget_boundary():
    G = graphs.build("inception3").graph(8)
    search = Search(G)
    peak = search.estimate.peak_bytes
    with pytest.raises(SearchTooLarge):
        search.run(memory_budget=peak - 1)
    assert search.run(memory_budget=peak).cost > 0


@pytest.mark.parametrize("name", ["inception3", "transformer"])
def test_breadth_first_refused_on_dense_graphs_with_default_budget(name):
    # Paper Table I / III-C: breadth-first dependent sets blow up on these graphs
    # (|D| of 11 on InceptionV3 and 37 on the Transformer at p = 8); the tables need far
    # more than the machine's 24 GiB, so the default budget refuses the search.
    G = graphs.build(name).graph(8)
    with pytest.raises(SearchTooLarge) as err:
        Search(G, "breadth-first").run()
    e = err.value.estimate
    assert e.ordering == "breadth-first"
    assert e.peak_bytes > 24 << 30 and e.peak_bytes > err.value.budget > 0
    assert e.table_entries > 10**11
    message = str(err.value)
    assert f"{e.table_entries:.3g} table entries" in message
    assert "budget" in message


# --------------------------------------------------------------------------------------
# Progress


def _check_progress(calls, total, G=None, sequence=None):
    assert calls, "progress was never called"
    assert all(t == total for _, t in calls)
    done = [d for d, _ in calls]
    assert all(a <= b for a, b in zip(done, done[1:])), done
    assert done[0] > 0 and done[-1] == total
    if G is not None:
        # "done" counts table entries: when the table of v(i) is finished it is the sum of
        # the sizes of the first i tables, prod(K_u for u in D(j) ∪ {v(j)}).
        definition = _dependent_by_definition(G, sequence)
        K = {v: len(G.nodes[v]["cost"]) for v in G}
        prefix = list(itertools.accumulate(math.prod(K[u] for u in definition[v][0] | {v}) for v in sequence))
        assert set(prefix) <= set(done), (prefix, done)


@pytest.mark.parametrize("index", range(1, N_RANDOM, 7))
def test_progress_monotone_to_total_random(index):
    G = _random_costed_graph(index)
    for chunk in (1, 4, 9, DEFAULT_CHUNK_ENTRIES):
        calls = []
        search = Search(G, "breadth-first", chunk_entries=chunk)
        search.run(progress=lambda done, total: calls.append((done, total)))
        _check_progress(calls, search.estimate.table_entries, G, search.ordering.sequence)


@pytest.mark.parametrize("chunk", [DEFAULT_CHUNK_ENTRIES, 5000])
def test_progress_monotone_to_total_transformer(chunk):
    # The plain programme (progress with blocks: tests/test_blocks.py).
    G = graphs.build("transformer").graph(8)
    search = Search(G, chunk_entries=chunk, blocks=False)
    calls = []
    result = search.run(progress=lambda done, total: calls.append((done, total)))
    _check_progress(calls, search.estimate.table_entries, G, search.ordering.sequence)
    assert len(calls) >= len(G)
    assert math.isclose(result.cost, Search(G).run().cost, rel_tol=1e-12)
