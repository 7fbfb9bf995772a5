"""The memory-capped search (``docs/memory.md``, "The capped search") against brute force.

Two levels are tested:

- *table cases*: ``capped_search`` on a bare graph: a random DAG of up to 7 vertices with 1-4
  configurations each, random layer-cost vectors, random edge matrices and random memory
  per configuration.
- *layer cases*: ``pase.plan`` with a memory cap on small random networks of real FC / Norm /
  Elementwise layers (chains and branches) on a random machine with p = 2..4, with
  ``MemoryModel`` at random byte sizes. Cost is re-checked with ``pase.costing.strategy.evaluate``
  and memory with formulas written here.

Every case is checked against exhaustive enumeration of all strategies. All randomness is
seeded; each case is its own test so a failure names its seed.
"""

import math

import networkx as nx
import numpy as np
import pytest

import graphs
from pase.planning.baselines import data_parallel
from pase.model.builder import GraphBuilder
from pase.search.capped import CAPPED, NOTHING_FITS, UNCONSTRAINED, capped_search
from pase.model.layers import FC, Elementwise, Norm
from pase.machines.paper import Machine
from pase.costing.memory import MemoryModel
from pase.planning.planner import plan
from pase.costing.strategy import evaluate

TABLE_CASES = 120
LAYER_CASES = 40
REL = 1e-9

# Shapes whose Elementwise layer has exactly K configurations on 4 devices (cut-off 1):
# (1,): 1; (2,): 1, 2; (4,): 1, 2, 4; (12,): 1, 2, 3, 4.
SHAPE_FOR_K = {1: (1,), 2: (2,), 3: (4,), 4: (12,)}
TABLE_PROCS = 4


class Outcome:
    """What ``check`` reads of a capped result, from either level."""

    def __init__(self, status, chosen, cost, memory, min_memory, lower_bound, multiplier, cap):
        self.status, self.chosen, self.cost, self.memory = status, chosen, cost, memory
        self.min_memory, self.lower_bound, self.multiplier = min_memory, lower_bound, multiplier
        self.fits = memory <= cap
        self.gap = (float("nan") if status == NOTHING_FITS
                    else max(cost - lower_bound, 0.0) / cost if cost else 0.0)


def search_table(G, memory, cap, **options):
    """``capped_search`` on the bare graph, as an ``Outcome``."""
    r = capped_search(G, dict(enumerate(memory)), cap, **options)
    return Outcome(r.status, [r.choice[v] for v in range(len(G))], r.cost, r.memory, r.min_memory, r.lower_bound,
                   r.multiplier, cap)


def plan_capped(net, procs, cap, machine, model):
    """``pase.plan`` with a memory cap, as an ``Outcome``."""
    p = plan(net, procs, machine, memory_cap=cap, memory_model=model)
    m = p.memory
    return Outcome(m.status, p.indices, p.total_cost, m.per_device_bytes, m.least_bytes,
                   m.lower_bound if m.lower_bound is not None else float("nan"), m.multiplier, cap)


def _close(a, b):
    return math.isclose(a, b, rel_tol=REL, abs_tol=REL)


def _leq(a, b):
    """``a <= b`` up to rounding."""
    return a <= b + REL * max(abs(a), abs(b), 1.0)


# ---------------------------------------------------------------------------------------
# Random cases


def table_case(seed):
    """A random DAG with random costs and memory, and a placeholder network to carry it."""
    rng = np.random.default_rng([2021, seed])
    n = int(rng.integers(1, 8))
    K = [int(k) for k in rng.integers(1, 5, n)]
    g = GraphBuilder(f"table{seed}")
    for v, k in enumerate(K):
        g.add(f"v{v}", Elementwise(g.input(SHAPE_FOR_K[k], f"a{v}"), g.input(SHAPE_FOR_K[k], f"b{v}")))
    net = g.build()
    configs = net.configs(TABLE_PROCS)
    assert [len(c) for c in configs] == K
    # A third of the cases draw small integer costs, so equal costs (ties) occur.
    ties = seed % 3 == 0

    def draw(size, high):
        return rng.integers(0, 10, size).astype(np.float64) if ties else rng.uniform(0, high, size)

    machine = Machine()
    G = nx.DiGraph(network=net, procs=TABLE_PROCS, machine=machine, name=net.name)
    for v in range(n):
        G.add_node(v, layer=net.layers[v], name=net.names[v], configs=configs[v], cost=draw(K[v], 100.0))
    density = rng.uniform(0.2, 0.8)
    for u in range(n):
        for v in range(u + 1, n):
            if rng.random() < density:
                G.add_edge(u, v, cost=draw((K[u], K[v]), 50.0))
    # Integer memory (exact in float64), scaled like bytes.
    scale = float(10 ** int(rng.integers(0, 10)))
    memory = [rng.integers(0, 1000, k).astype(np.float64) * scale for k in K]
    return net, G, memory, machine


def layer_case(seed):
    """A small random network of real layers, its costed graph and a random memory model."""
    rng = np.random.default_rng([1996, seed])
    while True:
        procs = int(rng.integers(2, 5))
        machine = Machine(float(rng.uniform(1, 20)), float(rng.uniform(1, 50)))
        g = GraphBuilder(f"layers{seed}", cutoff=1)
        x = g.input((int(rng.choice([2, 4])), int(rng.choice([2, 3, 4]))), "x", letters="bk")
        tensors = [x]
        for i in range(int(rng.integers(2, 6))):
            t = tensors[int(rng.integers(len(tensors)))]
            kind = ("fc", "norm", "add")[int(rng.integers(3))]
            if kind == "fc":
                out = g.add(f"fc{i}", FC(t, int(rng.choice([2, 3, 4, 6]))))
            elif kind == "norm":
                out = g.add(f"norm{i}", Norm(t, axis=int(rng.integers(2))))
            else:
                # Join two branches of one shape when there are, else add a data input.
                partners = [u for u in tensors if u is not t and u.shape == t.shape]
                other = partners[int(rng.integers(len(partners)))] if partners else g.input(t.shape, f"d{i}")
                out = g.add(f"add{i}", Elementwise(t, other))
            tensors.append(out)
        net = g.build()
        if math.prod(len(c) for c in net.configs(procs)) <= 20000:
            break
    param_bytes = float(rng.choice([0.0, 2.0, 4.0, 16.0, rng.uniform(0, 20)]))
    model = MemoryModel(param_bytes, float(rng.uniform(0.5, 4)))
    return net, procs, machine, model


def own_layer_memory(layer, config, model):
    """Bytes of one layer under one configuration, from ``docs/memory.md`` written out again."""
    dom, c = layer.domain, config
    if isinstance(layer, FC):
        # Weight (n, k): the last two dims; output: every dim but k.
        params = dom[-2] * dom[-1] / (c[-2] * c[-1])
        acts = math.prod(dom[:-1]) / math.prod(c[:-1])
    elif isinstance(layer, Norm):
        params = 2 * dom[layer.axis] / c[layer.axis]
        acts = math.prod(dom) / math.prod(c)
    elif isinstance(layer, Elementwise):
        params = 0
        acts = math.prod(dom) / math.prod(c)
    else:
        raise TypeError(layer)
    return model.param_bytes * params + model.act_bytes * acts


def brute_force(G, memory):
    """Cost and memory of every strategy (one column per strategy)."""
    n = G.number_of_nodes()
    K = [len(G.nodes[v]["cost"]) for v in range(n)]
    idx = np.indices(K).reshape(n, -1)
    cost = np.zeros(idx.shape[1])
    for v in range(n):
        cost += G.nodes[v]["cost"][idx[v]]
    for u, v, m in G.edges(data="cost"):
        cost += m[idx[u], idx[v]]
    mem = np.zeros(idx.shape[1])
    for v in range(n):
        mem += memory[v][idx[v]]
    return idx, cost, mem


def caps_for(rng, mem, cost, exact):
    """Random caps between the least and the largest memory, the two ends, the memory of
    the unconstrained optimum, and one below the least (nothing fits)."""
    least, largest = float(mem.min()), float(mem.max())
    optima = cost <= cost.min() + REL * max(abs(cost.min()), 1.0)
    opt_mem = float(mem[optima].max())
    nudge = 1.0 if exact else 1.0 + 1e-7  # float memory: stay clear of rounding at the boundary
    caps = [least * nudge, opt_mem * nudge, largest * nudge]
    caps += [float(rng.uniform(least, largest)) for _ in range(3)]
    caps.append(least * float(rng.uniform(0.5, 0.999)))
    return [c for c in caps if c > 0]


def check(result, cap, idx, cost, mem, own_cost, own_memory, exact):
    """The properties the spec promises, against the brute force ``cost``/``mem`` arrays."""
    least = float(mem.min())
    chosen = result.chosen
    if least > cap:
        assert result.status == NOTHING_FITS
        assert _close(result.min_memory, least)
        assert _close(own_memory(chosen), least)  # it returns a least-memory strategy
        assert not result.fits
        return
    assert result.status in (UNCONSTRAINED, CAPPED)
    used = own_memory(chosen)
    assert (used <= cap) if exact else _leq(used, cap)
    assert result.fits
    assert _close(used, result.memory)
    paid = own_cost(chosen)
    assert _close(paid, result.cost)
    capped_optimum = float(cost[mem <= cap].min())
    assert _leq(capped_optimum, paid)
    assert _leq(result.lower_bound, capped_optimum)
    unconstrained = float(cost.min())
    optima = cost <= unconstrained + REL * max(abs(unconstrained), 1.0)
    if mem[optima].max() <= cap:
        # Every unconstrained optimum fits, so the one the search finds does.
        assert result.status == UNCONSTRAINED
    if mem[optima].min() > cap:
        assert result.status == CAPPED
    if result.status == UNCONSTRAINED:
        assert _close(paid, unconstrained)
        assert result.gap == 0
        assert result.multiplier == 0
    else:
        assert result.min_memory is not None and _close(result.min_memory, least)
        assert result.multiplier >= 0
        assert 0 <= result.gap <= 1


@pytest.mark.parametrize("seed", range(TABLE_CASES))
def test_random_tables_against_brute_force(seed):
    net, G, memory, machine = table_case(seed)
    idx, cost, mem = brute_force(G, memory)

    def own_cost(choice):
        total = sum(float(G.nodes[v]["cost"][choice[v]]) for v in G.nodes)
        return total + sum(float(m[choice[u], choice[v]]) for u, v, m in G.edges(data="cost"))

    def own_memory(choice):
        return sum(float(memory[v][choice[v]]) for v in G.nodes)

    rng = np.random.default_rng([7, seed])
    for cap in caps_for(rng, mem, cost, exact=True):
        trace = []
        result = search_table(G, memory, cap, trace=trace)
        check(result, cap, idx, cost, mem, own_cost, own_memory, exact=True)
        # Every multiplier tried was solved exactly: its Lagrangian optimum is the brute-force
        # minimum of cost + lambda * memory, and the bound is the best of them.
        bound = float(cost.min())
        for lam, lagrangian, used, paid in trace:
            assert lam >= 0
            assert math.isclose(lagrangian, float((cost + lam * mem).min()), rel_tol=REL, abs_tol=REL)
            bound = max(bound, lagrangian - lam * cap)
        if result.status == CAPPED:
            assert math.isclose(result.lower_bound, min(bound, result.cost), rel_tol=REL, abs_tol=REL)


@pytest.mark.parametrize("seed", range(LAYER_CASES))
def test_random_networks_against_brute_force(seed):
    net, procs, machine, model = layer_case(seed)
    G = net.graph(procs, machine)
    configs = [G.nodes[v]["configs"] for v in range(len(net))]
    table = [np.array([own_layer_memory(layer, c, model) for c in C]) for layer, C in zip(net.layers, configs)]
    idx, cost, mem = brute_force(G, table)

    def config_of(choice):
        return [tuple(int(x) for x in configs[v][choice[v]]) for v in range(len(net))]

    def own_cost(choice):
        return evaluate(net, config_of(choice), machine, procs).total

    def own_memory(choice):
        return sum(own_layer_memory(layer, c, model) for layer, c in zip(net.layers, config_of(choice)))

    rng = np.random.default_rng([11, seed])
    for cap in caps_for(rng, mem, cost, exact=False):
        result = plan_capped(net, procs, cap, machine, model)
        check(result, cap, idx, cost, mem, own_cost, own_memory, exact=False)


def test_the_random_cases_cover_every_outcome():
    # The suites above are only meaningful if all three statuses and real duality gaps occur.
    statuses = set()
    gaps = 0
    for seed in range(TABLE_CASES):
        net, G, memory, machine = table_case(seed)
        idx, cost, mem = brute_force(G, memory)
        rng = np.random.default_rng([7, seed])
        for cap in caps_for(rng, mem, cost, exact=True):
            result = search_table(G, memory, cap)
            statuses.add(result.status)
            gaps += result.status == CAPPED and result.lower_bound < float(cost[mem <= cap].min()) - 1e-6
    assert statuses == {UNCONSTRAINED, CAPPED, NOTHING_FITS}
    assert gaps > 0


# ---------------------------------------------------------------------------------------
# Hand-worked cases


def _pair_of_vertices():
    """Two unconnected vertices, each: configuration 0 costs 0 and needs 10 bytes,
    configuration 1 costs 10 and needs 0 bytes."""
    g = GraphBuilder("pair")
    for v in range(2):
        g.add(f"v{v}", Elementwise(g.input((2,), f"a{v}"), g.input((2,), f"b{v}")))
    net = g.build()
    G = nx.DiGraph(network=net, procs=2, machine=Machine())
    for v, C in enumerate(net.configs(2)):
        G.add_node(v, layer=net.layers[v], name=net.names[v], configs=C, cost=np.array([0.0, 10.0]))
    return net, G, [[10.0, 0.0], [10.0, 0.0]]


def test_duality_gap_pair():
    # Strategies: (0,0) cost 0 memory 20; (0,1), (1,0) cost 10 memory 10; (1,1) cost 20 memory 0.
    # Cap 10: the capped optimum is 10. Every Lagrangian optimum is (0,0) for lambda < 1 and
    # (1,1) for lambda > 1: the multipliers alone find only cost 20; mixing the two gives 10.
    # Bound: max over lambda of 2 min(10 lambda, 10) - 10 lambda, which is 10 at lambda = 1,
    # so the bisection's bound approaches 10 from below.
    net, G, memory = _pair_of_vertices()
    result = search_table(G, memory, 10.0)
    assert result.status == CAPPED
    assert result.cost == 10.0
    assert result.memory == 10.0
    assert sorted(result.chosen) == [0, 1]
    assert 9.9 <= result.lower_bound <= 10.0


def test_pair_with_loose_and_impossible_caps():
    net, G, memory = _pair_of_vertices()
    # Cap 20: (0,0) fits; cost 0.
    result = search_table(G, memory, 20.0)
    assert (result.status, result.cost, result.chosen) == (UNCONSTRAINED, 0.0, [0, 0])
    # Cap 5: only (1,1), memory 0, fits; cost 20, and the bound can be no more than 20.
    result = search_table(G, memory, 5.0)
    assert (result.status, result.cost, result.chosen) == (CAPPED, 20.0, [1, 1])
    assert result.lower_bound <= 20.0


@pytest.mark.parametrize("cap", [0, -1.0, math.nan])
def test_non_positive_cap_is_rejected(cap):
    net, G, memory = _pair_of_vertices()
    with pytest.raises(ValueError):
        search_table(G, memory, cap)
    with pytest.raises(ValueError):
        plan(net, 2, memory_cap=cap)


# ---------------------------------------------------------------------------------------
# The command-line case of the issue: gpt3-6.7b, p = 32, batch 128, cap 80 GB.

# From the shapes (docs/graphs.md): one sample's activations are 13,384,548,352 elements,
# 26,769,096,704 bytes in fp16 (see tests/test_gpt.py for the breakdown); 128 samples:
# 3,426,444,378,112 bytes, about 3.4 TB. Parameters: 6,855,073,792 * 16 = 109,681,180,672 bytes.
# Every layer has a configuration dividing both its parameters and its output 32 ways
# (heads, width or feed-forward axis split 32; V = 50304 = 32 * 1572), and nothing can
# divide them more on 32 devices, so the least memory is
# (3,426,444,378,112 + 109,681,180,672) / 32 = 110,503,923,712 bytes, about 110.5 GB.
LEAST_128 = (128 * 26_769_096_704 + 109_681_180_672) / 32
# Data parallelism: 4 samples per device plus a full replica of the parameters:
# 4 * 26.77 + 109.68 = 216.76 GB.
DATA_PARALLEL_128 = 4 * 26_769_096_704 + 109_681_180_672


def test_gpt3_6_7b_batch_128_does_not_fit_80_gb():
    net = graphs.build("gpt3-6.7b", batch=128)
    assert math.isclose(LEAST_128, 110.5e9, rel_tol=0.01)
    assert math.isclose(
        MemoryModel().per_device(net, data_parallel(net, 32), 32), DATA_PARALLEL_128, rel_tol=0.02
    )
    result = plan(net, 32, memory_cap=80e9)
    m = result.memory
    assert m.status == NOTHING_FITS
    assert not m.fits
    assert math.isclose(m.least_bytes, LEAST_128, rel_tol=0.02)
    assert m.least_bytes >= LEAST_128 * (1 - 1e-9)  # the floor: 32-way division of everything
    assert math.isclose(MemoryModel().per_device(net, result.configs, 32), m.least_bytes, rel_tol=1e-9)
