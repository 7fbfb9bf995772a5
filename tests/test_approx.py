"""The approximate search (``pase.search.approx``, ``--approx``): its lower bound never exceeds
the optimum, its plan is a real strategy of the cost it reports, and where the tables hold
the exact programme it is the optimum with gap 0.

Small graphs are checked against every strategy (``tests/brute.py``), costed from the
graph's own tables, not by the module under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest

import graphs
from pase.planning.planner import plan
from pase.search import approx as approx_module
from pase.search.approx import ApproxTooLarge, approximate
from pase.search.solver import indexed_cost, solve
from brute import brute_force
from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




def random_graph(seed: int, n: int = 7, density: float = 0.7, kmax: int = 4) -> nx.DiGraph:
    """A random DAG, dense enough that small tables force mini-buckets, with random costs."""
    rng = np.random.default_rng(seed)
    G = nx.DiGraph()
    K = rng.integers(1, kmax + 1, size=n)
    for v in range(n):
        G.add_node(v, cost=rng.uniform(0, 10, size=K[v]).round(2))
    for u in range(n):
        for v in range(u + 1, n):
            if rng.random() < density:
                G.add_edge(u, v, cost=rng.uniform(0, 10, size=(K[u], K[v])).round(2))
    return G


CASES = [(seed, entries) for seed in range(40) for entries in (1, 4, 16, 64)]


@pytest.mark.parametrize("seed,entries", CASES)
def test_bound_and_plan_bracket_the_optimum(seed, entries):
    G = random_graph(seed)
    optimum = brute_force(G)
    r = approximate(G, table_entries=entries)
    assert r.lower_bound <= optimum + 1e-9 * abs(optimum)
    assert r.cost >= optimum - 1e-9 * abs(optimum)
    assert r.cost == pytest.approx(indexed_cost(G, r.choice), rel=1e-12)
    assert sorted(r.choice) == sorted(G.nodes)
    assert all(0 <= r.choice[v] < len(G.nodes[v]["cost"]) for v in G.nodes)
    if r.exact:
        assert r.cost == pytest.approx(optimum, rel=1e-12) and r.gap == 0.0


def test_small_tables_do_split_and_the_bound_is_then_below_the_optimum_somewhere():
    """The cases above exercise the split: some bound is strictly below the optimum (else the
    brute-force check would pass for a search that ignored the bound altogether)."""
    strict = 0
    for seed in range(40):
        G = random_graph(seed)
        r = approximate(G, table_entries=4)
        assert not r.exact or r.stats.split_buckets == 0
        strict += r.lower_bound < brute_force(G) - 1e-6
    assert strict > 0


def test_the_mini_bucket_pass_alone_is_below_the_optimum_on_a_complete_graph():
    """One pass with tables of 9 entries on a clique of 8 (the exact table has 3^8 entries)."""
    G = random_graph(3, n=8, density=1.0, kmax=3)
    optimum = brute_force(G)
    problem, _ = approx_module._Problem.from_graph(G)
    sequence = approx_module.get_ordering("generateseq")(problem.graph()).sequence
    elimination = approx_module._MiniBuckets(problem, sequence, 9)
    bound, _ = elimination.run()
    assert elimination.split > 0 and elimination.largest <= 9
    assert bound <= optimum + 1e-9


@pytest.mark.parametrize("seed", range(10))
def test_large_tables_give_the_exact_optimum(seed):
    G = random_graph(seed)
    r = approximate(G, table_entries=10**6)
    assert r.exact and r.gap == 0.0 and r.stats.split_buckets == 0
    assert r.cost == pytest.approx(brute_force(G), rel=1e-12)
    assert r.lower_bound == r.cost


def test_a_tree_is_exact_with_tables_of_its_edges():
    G = nx.DiGraph()
    rng = np.random.default_rng(7)
    for v in range(12):
        G.add_node(v, cost=rng.uniform(0, 5, size=5))
    for v in range(1, 12):
        G.add_edge((v - 1) // 2, v, cost=rng.uniform(0, 5, size=(5, 5)))
    r = approximate(G, table_entries=25)
    assert r.exact
    assert r.cost == pytest.approx(solve(G).cost, rel=1e-12)


def test_empty_and_single_vertex_graphs():
    r = approximate(nx.DiGraph())
    assert (r.choice, r.cost, r.lower_bound, r.gap, r.exact) == ({}, 0.0, 0.0, 0.0, True)
    G = nx.DiGraph()
    G.add_node("only", cost=np.array([3.0, 1.0, 2.0]))
    r = approximate(G)
    assert (r.choice, r.cost, r.lower_bound, r.gap) == ({"only": 1}, 1.0, 1.0, 0.0)


def test_the_graph_is_not_modified_and_results_repeat():
    G = random_graph(11)
    before = {v: G.nodes[v]["cost"].copy() for v in G.nodes}
    a = approximate(G, table_entries=4)
    b = approximate(G, table_entries=4)
    assert (a.choice, a.cost, a.lower_bound) == (b.choice, b.cost, b.lower_bound)
    assert all(np.array_equal(G.nodes[v]["cost"], before[v]) for v in G.nodes)


@pytest.mark.parametrize("bad", [0, -5, 2.5, "many", True])
def test_bad_table_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="table_entries"):
        approximate(random_graph(0), table_entries=bad)


def test_bad_costs_are_refused_with_the_vertex_named():
    G = random_graph(0)
    G.nodes[2]["cost"] = np.array([np.nan] * len(G.nodes[2]["cost"]))
    with pytest.raises(ValueError, match="vertex 2"):
        approximate(G)


def test_a_memory_budget_too_small_is_refused_before_allocating():
    with pytest.raises(ApproxTooLarge, match="budget"):
        approximate(random_graph(0), table_entries=64, memory_budget=16)


def test_the_neighbourhood_search_never_raises_the_cost():
    G = random_graph(5, n=8, density=1.0)
    problem, _ = approx_module._Problem.from_graph(G)
    x = np.zeros(len(problem.K), dtype=np.int64)
    start = problem.cost(x)
    y, cost, _, _, _ = approx_module._improve(problem, x, start, 4, "generateseq", 3)
    assert cost <= start and cost == pytest.approx(problem.cost(y))


# --- on the built-in graphs: the exact optimum, or an honest gap -----------------------------


@pytest.mark.parametrize("name,procs", [("alexnet", 32), ("inception3", 8), ("rnnlm", 16)])
def test_builtin_graphs_give_the_exact_optimum_with_default_tables(name, procs):
    network = graphs.build(name, 128)
    exact = plan(network, procs)
    approximate_plan = plan(network, procs, approx=approx_module.DEFAULT_TABLE_ENTRIES)
    a = approximate_plan.approximation
    assert a.exact and a.gap == 0.0
    assert approximate_plan.total_cost == pytest.approx(exact.total_cost, rel=1e-9)


def test_builtin_graph_with_small_tables_states_its_gap():
    network = graphs.build("inception3", 128)
    exact = plan(network, 16).total_cost
    approximate_plan = plan(network, 16, approx=2 * 10**4)
    a = approximate_plan.approximation
    assert not a.exact and a.stats.split_buckets > 0
    assert a.lower_bound <= exact * (1 + 1e-12) <= approximate_plan.total_cost * (1 + 1e-12)
    assert a.gap == pytest.approx((approximate_plan.total_cost - a.lower_bound) / a.lower_bound)


def test_the_library_refuses_a_cap_with_the_approximate_search():
    with pytest.raises(ValueError, match="memory cap"):
        plan(graphs.build("alexnet", 128), 8, memory_cap=1e9, approx=1 << 20)


# --- the command line ------------------------------------------------------------------------


def test_cli_prints_the_bound_and_gap():
    status, out, err = run("-g", "inception3", "-p", "16", "--approx", "2e4")
    assert status == 0, err
    line = next(line for line in out.splitlines() if line.startswith("approximate "))
    assert "lower bound" in line and "gap" in line and "%" in line
    assert "PaSE approximate parallelization strategy" in out


def test_cli_json_has_the_bound_and_gap():
    status, out, err = run("-g", "inception3", "-p", "16", "--approx", "2e4", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["lower_bound"] <= data["total_cost"]
    assert data["gap"] == pytest.approx((data["total_cost"] - data["lower_bound"]) / data["lower_bound"], rel=1e-9)
    assert data["approximate"]["exact"] is False


def test_cli_exact_when_the_tables_fit_and_unchanged_without_the_flag():
    status, out, _ = run("-g", "alexnet", "-p", "8", "--approx", "--json")
    data = json.loads(out)
    assert status == 0 and data["gap"] == 0.0 and data["approximate"]["exact"] is True
    status, out, _ = run("-g", "alexnet", "-p", "8", "--json")
    plain = json.loads(out)
    assert "lower_bound" not in plain and "approximate" not in plain
    assert plain["total_cost"] == pytest.approx(data["total_cost"], rel=1e-12)


def test_cli_sweep_with_the_approximate_search():
    status, out, err = run("-g", "rnnlm", "--sweep", "4,8", "--approx", "1e4")
    assert status == 0, err
    assert out.count("exact") + out.count("gap") >= 2


@pytest.mark.parametrize("extra,message", [
    (["--memory", "10"], "--memory"),
    (["--measure"], "--measure"),
    (["--no-blocks"], "--no-blocks"),
    (["--training"], "training"),
    (["--approx", "10"], "table entries"),
    (["--approx", "lots"], "table entries"),
    (["--approx", "2**99"], "table entries"),
])
def test_cli_refusals_are_one_line(extra, message):
    argv = ["-g", "alexnet", "-p", "8"] + (extra if extra[0] == "--approx" else ["--approx"] + extra)
    status, out, err = run(*argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_cli_evaluate_refuses_approx(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"configs": [[1] * 7]}), encoding="utf-8")
    status, _, err = run("--evaluate", str(path), "--approx")
    assert status == 2 and "--approx" in err and len(err.strip().splitlines()) == 1


def test_same_result_under_any_hash_seed():
    script = (
        "import graphs; from pase.planning.planner import plan; "
        "p = plan(graphs.build('inception3', 128), 16, approx=20000); "
        "print(repr(p.total_cost), repr(p.approximation.lower_bound), p.indices)"
    )
    outputs = set()
    for seed in ("0", "1234"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=ROOT)
        outputs.add(subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                                   text=True, check=True).stdout)
    assert len(outputs) == 1
