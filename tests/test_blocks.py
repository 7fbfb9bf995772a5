"""Repeated blocks solved once (``pase.search.blocks``, ``Search(blocks=True)``; issue 12).

The block search must give the plain dynamic programme's optimum: checked against the
plain programme (``blocks=False``) on random chained graphs (random blocks, wiring between
consecutive copies, shared external vertices, prefix and suffix vertices, a copy that
differs), against exhaustive enumeration on the small ones, and on the built-in graphs at
several device counts. Work counts are checked against a small graph worked by hand.
"""

from __future__ import annotations

import io
import math

import networkx as nx
import numpy as np
import pytest

import graphs
from pase import cli
from pase.search.blocks import BlockSummary, describe_blocks, find_block_runs, is_periodic
from pase.search.capped import capped_search
from pase.costing.memory import MemoryModel
from pase.search.solver import MAX_TABLE_AXES, Search, SearchStats, SearchTooLarge, WorkEstimate
from pase.costing.strategy import evaluate
from brute import brute_force

SEED = 20_240_612
N_RANDOM = 160
REL = 1e-12  # sums are taken in another order: the optima agree to rounding

# --------------------------------------------------------------------------------------
# Helpers, independent of pase.search.solver


def _cost_of(G, choice) -> float:
    total = sum(float(G.nodes[v]["cost"][choice[v]]) for v in G)
    return total + sum(float(m[choice[u], choice[v]]) for u, v, m in G.edges(data="cost"))


def _scale(G) -> float:
    s = sum(float(np.abs(d["cost"]).max()) for _, d in G.nodes(data=True))
    return max(s + sum(float(np.abs(m).max()) for _, _, m in G.edges(data="cost")), 1.0)


def _close(a, b, G) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=REL * _scale(G))




def _values(rng, kind, shape):
    if kind == "ties":  # small integers: many optima, exact sums
        return rng.integers(0, 3, size=shape).astype(np.float64)
    if kind == "wide":  # magnitudes as in real graphs
        return 10.0 ** rng.uniform(0.0, 12.0, size=shape)
    return rng.uniform(0.0, 100.0, size=shape)


KINDS = ("uniform", "ties", "wide")


def _chained_graph(index: int, small: bool = False) -> nx.DiGraph:
    """Prefix vertices, ``L`` copies of a random block, suffix vertices (ids in that order).

    Copy ``c`` is joined to copy ``c + 1`` by edges from one or two *interface* offsets;
    a prefix vertex may be a shared external read by every copy; the first copy reads the
    prefix (sometimes exactly as a previous copy would), the last feeds the suffix; one
    copy may differ (a cost or a matrix), and edge directions vary.
    """
    rng = np.random.default_rng([SEED, index])
    kind = KINDS[index % len(KINDS)]
    B = int(rng.integers(1, 3 if small else 5))
    L = int(rng.integers(3, 5 if small else 8))
    kmax = 3 if small else 5
    K = [int(k) for k in rng.integers(1, kmax + 1, size=B)]
    block_costs = [_values(rng, kind, k) for k in K]
    internal = [(i, j, _values(rng, kind, (K[i], K[j])), rng.random() < 0.8)
                for i in range(B) for j in range(i + 1, B) if j == i + 1 or rng.random() < 0.4]
    interface = sorted(int(i) for i in rng.choice(B, size=1 if B == 1 or rng.random() < 0.7 else 2, replace=False))
    links = []
    for i in interface:
        for j in rng.choice(B, size=int(rng.integers(1, min(B, 2) + 1)), replace=False):
            links.append((i, int(j), _values(rng, kind, (K[i], K[int(j)])), rng.random() < 0.8))
    G = nx.DiGraph()

    def add(cost):
        v = len(G)
        G.add_node(v, cost=cost)
        return v

    def edge(a, b, m, forward):
        G.add_edge(a, b, cost=m) if forward else G.add_edge(b, a, cost=m.T.copy())

    prefix = [add(_values(rng, kind, int(rng.integers(1, kmax + 1)))) for _ in range(int(rng.integers(0 if small else 1, 3)))]
    for a, b in zip(prefix, prefix[1:]):
        edge(a, b, _values(rng, kind, (len(G.nodes[a]["cost"]), len(G.nodes[b]["cost"]))), True)
    shared = []
    if prefix and rng.random() < 0.4:
        x = prefix[0]
        for j in rng.choice(B, size=int(rng.integers(1, min(B, 2) + 1)), replace=False):
            shared.append((x, int(j), _values(rng, kind, (len(G.nodes[x]["cost"]), K[int(j)])), rng.random() < 0.5))
    # The first copy's predecessor: the previous copy's interface, imitated by prefix-like
    # vertices (same K, same matrices) half of the time, else arbitrary prefix wiring.
    imitate = rng.random() < 0.5
    stand_in = {}
    if imitate:
        for i in interface:
            stand_in[i] = add(_values(rng, kind, K[i]))
    odd = int(rng.integers(0, L)) if rng.random() < 0.3 else None
    copies = []
    for c in range(L):
        costs = list(block_costs)
        if c == odd:
            j = int(rng.integers(0, B))
            costs[j] = costs[j] + 1.0
        ids = [add(cost) for cost in costs]
        for i, j, m, forward in internal:
            edge(ids[i], ids[j], m, forward)
        for x, j, m, forward in shared:
            edge(x, ids[j], m, forward)
        if c > 0:
            for i, j, m, forward in links:
                edge(copies[-1][i], ids[j], m, forward)
        elif imitate:
            for i, j, m, forward in links:
                edge(stand_in[i], ids[j], m, forward)
        elif prefix:
            a = prefix[-1]
            j = int(rng.integers(0, B))
            edge(a, ids[j], _values(rng, kind, (len(G.nodes[a]["cost"]), K[j])), True)
        copies.append(ids)
    G.graph["first_copy"] = copies[0][0]
    for _ in range(int(rng.integers(0, 2 if small else 3))):
        s = add(_values(rng, kind, int(rng.integers(1, kmax + 1))))
        j = int(rng.integers(0, B))
        edge(copies[-1][j], s, _values(rng, kind, (K[j], len(G.nodes[s]["cost"]))), True)
    return G


def _check_against_plain(G, blocks=True, **options):
    plain = Search(G, blocks=False, **options).run()
    search = Search(G, blocks=blocks, **options)
    result = search.run()
    assert _close(result.cost, plain.cost, G), (result.cost, plain.cost)
    assert set(result.choice) == set(G.nodes)
    assert all(isinstance(c, int) and 0 <= c < len(G.nodes[v]["cost"]) for v, c in result.choice.items())
    assert _close(_cost_of(G, result.choice), result.cost, G)
    return search, result, plain


# --------------------------------------------------------------------------------------
# A graph worked by hand


def _hand_chain():
    """Vertex 0 (K 2), four copies of (a, b) with K_a = 3, K_b = 2 on the path
    0 -> a0 -> b0 -> a1 -> ... -> b3 -> 9; matrices a->b and b->a the same in every copy,
    0 -> a0 the same as b -> a (so vertex 0 stands in for a previous copy's b)."""
    ca, cb = np.array([4.0, 1.0, 6.0]), np.array([2.0, 5.0])
    m_ab = np.array([[0.0, 3.0], [2.0, 0.0], [1.0, 1.0]])
    m_ba = np.array([[0.0, 5.0, 1.0], [4.0, 0.0, 2.0]])
    G = nx.DiGraph()
    G.add_node(0, cost=np.array([0.0, 3.0]))
    for c in range(4):
        G.add_node(1 + 2 * c, cost=ca)
        G.add_node(2 + 2 * c, cost=cb)
    G.add_node(9, cost=np.array([7.0, 0.0]))
    for v in range(9):
        G.add_edge(v, v + 1, cost=m_ab if v % 2 else m_ba)
    G.edges[8, 9]["cost"] = np.array([[0.0, 9.0], [9.0, 0.0]])
    return G


def test_hand_chain_detection_and_work():
    G = _hand_chain()
    runs = find_block_runs(range(10), {v: len(G.nodes[v]["cost"]) for v in G},
                           {v: G.nodes[v]["cost"] for v in G}, [(u, v, m) for u, v, m in G.edges(data="cost")])
    assert len(runs) == 1
    run = runs[0]
    assert run.vertices == tuple(range(1, 9)) and run.size == 2 and run.copies == 4
    assert run.interface == (1,) and run.previous == (0,) and run.following == (9,) and run.shared == ()
    assert run.states == 2 and run.copy(2) == (5, 6) and run.vertex(3, 0) == 7
    search = Search(G)
    e = search.estimate
    # Plain (GenerateSeq eliminates the path from vertex 0): tables K_v * K_next for
    # 0, a0, b0, ..., a3 (eight tables of 2*3 or 3*2 = 6), b3 with D = {9}: 2*2 = 4, and
    # 9 alone: 2. Total 8*6 + 4 + 2 = 54.
    assert e.plain_table_entries == 54 == Search(G, blocks=False).estimate.table_entries
    # Blocks: the block graph {0, a0, b0} eliminates a0 with D = {0, b0}: 2*2*3 = 12, then
    # the kept table T[0, b0]: 2*2 = 4. The reduced graph is the path 0 - b0 - b1 - b2 -
    # b3 - 9 of K = 2: five tables of 2*2 and the last of 2, 22. Total 12 + 4 + 22 = 38.
    assert e.table_entries == 38
    assert e.largest_table == 12 and e.max_dependent_set == 2
    assert e.blocks == (BlockSummary(1, 2, 4, 2, 0),)
    assert e.blocks_description == "1 run: 4 copies of 2 vertices from vertex 1 (2 states)"
    result = search.run()
    assert result.cost == brute_force(G)
    assert result.stats.blocks == e.blocks and result.stats.plain_table_entries == 54


def test_hand_chain_progress_counts_the_real_work():
    G = _hand_chain()
    calls = []
    Search(G, chunk_entries=3).run(progress=lambda done, total: calls.append((done, total)))
    assert all(total == 38 for _, total in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == 38
    # Block table finished at 12, kept table at 16, then the reduced tables: 20, ..., 36, 38.
    assert {12, 16, 20, 24, 28, 32, 36, 38} <= set(done)


# --------------------------------------------------------------------------------------
# Random chained graphs


def test_random_chains_use_blocks():
    # The property tests below must really exercise the block search, shared externals,
    # stand-in predecessors and runs cut by an odd copy.
    # (blocks="always" uses every run found; by default only those that save work.)
    used = saving = shared = from_first = 0
    for index in range(N_RANDOM):
        G = _chained_graph(index)
        search = Search(G, blocks="always")
        used += bool(search.blocks)
        saving += bool(Search(G).blocks)
        shared += any(run.shared for run in search.blocks)
        from_first += any(run.vertices[0] == G.graph["first_copy"] for run in search.blocks)
    assert used >= 0.75 * N_RANDOM
    assert saving >= 0.25 * N_RANDOM
    assert shared >= 10
    assert from_first >= 10  # the prefix stands in for the first copy's predecessor


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_chain_equals_plain(index):
    G = _chained_graph(index)
    for blocks in (True, "always"):
        search, result, plain = _check_against_plain(G, blocks)
        assert result.stats.table_entries == search.estimate.table_entries
        assert result.stats.plain_table_entries == plain.stats.table_entries
        if search.blocks and blocks is True:
            assert result.stats.table_entries < plain.stats.table_entries
        if index % len(KINDS) == 0:  # continuous random costs: a unique optimum
            assert result.choice == plain.choice


@pytest.mark.parametrize("index", range(0, N_RANDOM, 2))
def test_small_random_chain_equals_brute_force(index):
    G = _chained_graph(index, small=True)
    if math.prod(len(G.nodes[v]["cost"]) for v in G) > 200_000:
        pytest.skip("too many strategies to enumerate")
    best = brute_force(G)
    for chunk in (1 << 17, 2):  # whole tables, and slices narrower than an axis
        result = Search(G, chunk_entries=chunk, blocks="always").run()
        assert _close(result.cost, best, G)
        assert _close(_cost_of(G, result.choice), best, G)


@pytest.mark.parametrize("index", range(0, N_RANDOM, 7))
def test_random_chain_progress(index):
    G = _chained_graph(index)
    search = Search(G, chunk_entries=5, blocks="always")
    calls = []
    search.run(progress=lambda done, total: calls.append((done, total)))
    total = search.estimate.table_entries
    assert calls and all(t == total for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total


def test_ties_resolve_deterministically():
    # Integer costs: many optima. The choice is a function of ids and values only: the
    # same with the vertices inserted in another order, and on every fresh search.
    checked = 0
    for index in range(1, N_RANDOM, 3):
        G = _chained_graph(index)
        first = Search(G, blocks="always")
        if not first.blocks:
            continue
        checked += 1
        reference = first.run().choice
        H = nx.DiGraph()
        for v in reversed(list(G.nodes)):
            H.add_node(v, **G.nodes[v])
        for u, v, d in reversed(list(G.edges(data=True))):
            H.add_edge(u, v, **d)
        assert Search(H, blocks="always").run().choice == reference
        assert Search(G, blocks="always").run().choice == reference
    assert checked >= 10


def test_rerun_with_costs_periodic_and_not():
    # run(costs=...) reuses the structure when the copies stay identical, and runs the
    # plain programme when they do not; both give the optimum of the graph with those costs.
    checked = 0
    for index in range(0, N_RANDOM, 3):
        G = _chained_graph(index)
        search = Search(G, blocks="always")
        if not search.blocks:
            continue
        checked += 1
        rng = np.random.default_rng([SEED, index, 5])
        run = search.blocks[0]
        # Periodic: one random vector per block offset, the same for every copy.
        offset = {v: rng.uniform(0, 10, size=len(G.nodes[v]["cost"])) for v in run.copy(0)}
        periodic = {v: G.nodes[v]["cost"].copy() for v in G}
        for c in range(run.copies):
            for j, v in enumerate(run.copy(c)):
                periodic[v] = periodic[v] + offset[run.vertex(0, j)]
        # Not periodic: one copy's vertex changed.
        broken = dict(periodic)
        v = run.vertex(run.copies - 1, 0)
        broken[v] = broken[v] + 1.0
        for costs, blocks_used in ((periodic, True), (broken, False)):
            H = G.copy()
            for u in H:
                H.nodes[u]["cost"] = costs[u]
            result = search.run(costs=costs)
            assert bool(result.stats.blocks) is blocks_used
            assert _close(result.cost, Search(H, blocks=False).run().cost, H)
            assert _close(_cost_of(H, result.choice), result.cost, H)
    assert checked >= 10


# --------------------------------------------------------------------------------------
# Detection


def _runs(G):
    return find_block_runs(sorted(G), {v: len(G.nodes[v]["cost"]) for v in G},
                           {v: G.nodes[v]["cost"] for v in G}, [(u, v, m) for u, v, m in G.edges(data="cost")])


def test_gpt_run_covers_every_block():
    net = graphs.build("gpt2-small", 8)
    G = net.graph(8)
    (run,) = _runs(G)
    # 12 blocks of 12 vertices from block1.attn.norm (vertex 2); the position Elementwise
    # (vertex 1) stands in for a previous block's residual; the last residual feeds
    # final.norm (vertex 146).
    assert (run.size, run.copies, run.vertices[0], run.vertices[-1]) == (12, 12, 2, 145)
    assert net.names[run.vertex(0, run.interface[0])] == "block1.ff.residual"
    assert run.previous == (1,) and run.following == (146,) and run.shared == ()
    assert run.states == len(G.nodes[13]["cost"])


def test_transformer_decoder_run_shares_the_encoder_output():
    net = graphs.build("transformer", 16)
    G = net.graph(8)
    encoder, decoder = _runs(G)
    memory = net.names.index("enc6.ff.norm")
    assert encoder.size == 12 and encoder.shared == ()
    assert decoder.size == 21 and decoder.shared == (memory,)
    assert all(net.names[v].startswith("dec") for v in decoder.vertices)
    assert all(net.names[v].startswith("enc") for v in encoder.vertices)


def test_an_odd_copy_splits_the_run():
    # The path 0 -> a0 -> b0 -> a1 -> b1 -> ... -> a5 -> b5 (ids 0..12), K_a = 2, K_b = 3,
    # equal costs and matrices except the matrix a2 -> b2 (into vertex 6). A copy is
    # (b_c, a_c+1), not (a_c, b_c): its interface is then a (2 states, not 3). Vertex 6
    # differs, so the runs are the copies (2, 3), (4, 5) before it, reading a0 (vertex 1)
    # as their predecessor, and (8, 9), (10, 11) after it, reading vertex 7.
    G = nx.DiGraph()
    a, b = np.array([1.0, 2.0]), np.array([3.0, 0.0, 1.0])
    m_ab, m_ba = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(3, 2)
    G.add_node(0, cost=np.zeros(3))
    for c in range(6):
        G.add_node(1 + 2 * c, cost=a)
        G.add_node(2 + 2 * c, cost=b)
        G.add_edge(2 * c, 1 + 2 * c, cost=m_ba)
        G.add_edge(1 + 2 * c, 2 + 2 * c, cost=m_ab + (c == 2))
    runs = [(r.vertices, r.previous, r.following, r.interface, r.states) for r in _runs(G)]
    assert runs == [((2, 3, 4, 5), (1,), (6,), (1,), 2), ((8, 9, 10, 11), (7,), (12,), (1,), 2)]
    _check_against_plain(G, "always")


def test_no_runs_without_repetition():
    G = nx.path_graph(6, create_using=nx.DiGraph)
    for v in G:
        G.nodes[v]["cost"] = np.arange(2.0) + v
    for u, v in G.edges:
        G.edges[u, v]["cost"] = np.ones((2, 2))
    assert _runs(G) == []
    assert Search(G).blocks == ()


def test_is_periodic_compares_values():
    G = _hand_chain()
    (run,) = _runs(G)
    costs = {v: G.nodes[v]["cost"].copy() for v in G}
    assert is_periodic(run, costs)
    costs[5] = costs[5] + 0.0  # equal values, another object
    assert is_periodic(run, costs)
    costs[5][1] += 1e-9
    assert not is_periodic(run, costs)


def test_describe_blocks():
    assert describe_blocks(()) == "none"
    two = (BlockSummary(2, 12, 5, 20, 0), BlockSummary(97, 21, 5, 20, 1))
    assert describe_blocks(two) == ("2 runs: 5 copies of 12 vertices from vertex 2 (20 states); "
                                    "5 copies of 21 vertices from vertex 97 (20 states, 1 shared)")


# --------------------------------------------------------------------------------------
# Built-in graphs


CASES = [
    ("gpt2-small", 2), ("gpt2-small", 4), ("gpt2-small", 16), ("gpt2-medium", 8), ("gpt2-large", 4),
    ("gpt2-xl", 4), ("gpt3-2.7b", 8), ("gpt3-6.7b", 4), ("gpt3-13b", 8), ("gpt3-175b", 4),
    ("llama3-8b", 4), ("llama3-70b", 2), ("transformer", 8), ("transformer", 16), ("resnet101", 8),
    ("inception3", 8), ("alexnet", 8), ("rnnlm", 8),
]


@pytest.mark.parametrize("name,procs", CASES)
def test_builtin_graphs_equal_plain(name, procs):
    net = graphs.build(name, 8)
    G = net.graph(procs)
    search, result, plain = _check_against_plain(G)
    configs = [G.nodes[v]["configs"][result.choice[v]] for v in range(len(net))]
    assert math.isclose(evaluate(net, configs, procs=procs).total, result.cost, rel_tol=1e-9)
    if name.startswith(("gpt", "llama", "transformer")):
        assert search.blocks, "the repeated blocks were not found"
        assert result.stats.table_entries < plain.stats.table_entries


def test_blocks_option_off_is_the_plain_programme():
    G = graphs.build("gpt2-small", 8).graph(8)
    off = Search(G, blocks=False)
    assert off.blocks == () and off.estimate.blocks == ()
    assert off.estimate.table_entries == off.estimate.plain_table_entries
    assert Search(G, "breadth-first").blocks == ()  # blocks go with GenerateSeq only


def test_capped_search_with_blocks_equals_without():
    net = graphs.build("gpt2-small", 8)
    G = net.graph(8)
    vertices = range(len(net))
    memory = dict(zip(vertices, MemoryModel().vectors(net, [G.nodes[v]["configs"] for v in vertices])))
    for cap in (2.0e9, 2.5e9, 3.0e9):
        with_blocks = capped_search(G, memory, cap)
        without = capped_search(G, memory, cap, blocks=False)
        assert with_blocks.blocks and not without.blocks
        assert with_blocks.status == without.status
        assert math.isclose(with_blocks.cost, without.cost, rel_tol=1e-9)
        assert math.isclose(with_blocks.lower_bound, without.lower_bound, rel_tol=1e-9)
        assert with_blocks.memory <= cap
        assert with_blocks.table_entries < without.table_entries == with_blocks.plain_table_entries


# --------------------------------------------------------------------------------------
# Statistics


def test_search_stats_carry_the_estimate():
    e = WorkEstimate("generateseq", 2000, 1000, 2, 9000, plain_table_entries=5000)
    stats = SearchStats(e, 4e-6)
    assert stats.estimate is e
    assert (stats.ordering, stats.table_entries, stats.largest_table, stats.max_dependent_set, stats.peak_bytes) == (
        "generateseq", 2000, 1000, 2, 9000)
    assert stats.plain_table_entries == 5000 and stats.blocks == () and stats.blocks_description == "none"
    assert stats.ns_per_entry == 2.0  # 4e-6 s / 2000 entries
    assert WorkEstimate("generateseq", 7, 7, 0, 8).plain_table_entries == 7
    with pytest.raises(AttributeError):
        stats.no_such_field


def test_budget_refusal_uses_the_block_estimate():
    G = graphs.build("gpt2-small", 8).graph(8)
    search = Search(G)
    assert search.estimate.peak_bytes < search.plain_estimate.peak_bytes
    with pytest.raises(SearchTooLarge) as err:
        search.run(memory_budget=search.estimate.peak_bytes - 1)
    assert err.value.estimate == search.estimate
    assert search.run(memory_budget=search.estimate.peak_bytes).cost > 0


# --------------------------------------------------------------------------------------
# Dependent sets of any width (issue 14, item 4)


def test_breadth_first_transformer_on_one_device():
    # p = 1: every vertex has one configuration, and breadth-first dependent sets reach
    # 37 vertices; the tables are single entries (this raised NumPy's 32-axis error).
    G = graphs.build("transformer").graph(1)
    search = Search(G, "breadth-first")
    assert search.estimate.max_dependent_set == 37 and search.estimate.table_axes == 0
    result = search.run()
    # One strategy only: its cost is the sum of every vertex cost and edge entry.
    assert math.isclose(result.cost, _cost_of(G, {v: 0 for v in G}), rel_tol=1e-12)
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["-a", "1", "-g", "transformer", "-p", "1"], stdout=out, stderr=err) == 0, err.getvalue()


def test_wide_dependent_set_of_mostly_single_configurations():
    # A star: centre 0 joined to 40 leaves, three of them with two configurations. Breadth-
    # first from 0 gives D(0) = all 40 leaves, a table with 4 axes of size > 1.
    rng = np.random.default_rng(SEED)
    G = nx.DiGraph()
    G.add_node(0, cost=rng.uniform(0, 10, 2))
    for leaf in range(1, 41):
        k = 2 if leaf in (5, 17, 33) else 1
        G.add_node(leaf, cost=rng.uniform(0, 10, k))
        G.add_edge(0, leaf, cost=rng.uniform(0, 10, (2, k)))
    search = Search(G, "breadth-first")
    assert search.estimate.max_dependent_set == 40 and search.estimate.table_axes == 4
    result = search.run()
    assert math.isclose(result.cost, brute_force(G), rel_tol=1e-12)


def test_more_than_32_wide_axes_refused_clearly():
    # 34 leaves of two configurations: D(0) under breadth-first holds all of them, a
    # table of 35 axes of size 2. Refused before allocating, whatever the budget.
    G = nx.DiGraph()
    G.add_node(0, cost=np.zeros(2))
    for leaf in range(1, 35):
        G.add_node(leaf, cost=np.zeros(2))
        G.add_edge(0, leaf, cost=np.zeros((2, 2)))
    search = Search(G, "breadth-first")
    assert search.estimate.table_axes == 35 > MAX_TABLE_AXES
    with pytest.raises(SearchTooLarge, match=r"35 axes of more than one configuration.*at most 32"):
        search.run(memory_budget=10**30)
    # GenerateSeq eliminates the leaves first: tables of two axes.
    assert Search(G).run().cost == 0.0


def test_graph_read_back_from_a_file_finds_the_same_blocks():
    # Detection needs nothing from the builder: a graph written to the JSON graph format and
    # read back (an "imported" graph) has the same runs and the same optimum.
    import json

    from pase.sources.graph_json import network_from_json, network_to_json

    net = graphs.build("gpt2-small", 8)
    again = network_from_json(json.loads(json.dumps(network_to_json(net))))
    G, H = net.graph(8), again.graph(8)
    a, b = Search(G), Search(H)
    assert [(r.vertices, r.previous, r.interface) for r in a.blocks] == [
        (r.vertices, r.previous, r.interface) for r in b.blocks] != []
    assert math.isclose(a.run().cost, b.run().cost, rel_tol=REL)
