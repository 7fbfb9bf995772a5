"""Optimal totals of the built-in graphs against the independent reference (spec docs/search.md).

``tests/data/reference/totals.json`` holds optima computed independently of this project;
every case must be reproduced to a relative error of 1e-9. GenerateSeq and breadth-first
must agree wherever breadth-first fits in memory, and the reference optimal AlexNet
strategy on 32 devices must cost what the search finds.
"""

from __future__ import annotations

import json
import math
import os

import pytest

import graphs
from pase.machines.paper import Machine
from pase.search.ordering import fixed_order
from pase.search.solver import Search
from pase.planning.planner import plan
from pase.costing.strategy import evaluate

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference")

with open(os.path.join(REFERENCE, "totals.json")) as f:
    CASES = json.load(f)["cases"]


def _case_id(case):
    return f"{case['graph']}-p{case['procs']}-b{case['batch']}-f{case['flops']}-bw{case['bw']}"


def test_reference_file_has_cases():
    assert len(CASES) >= 10
    assert {c["graph"] for c in CASES} >= {"alexnet", "resnet101", "inception3", "rnnlm", "transformer"}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_reference_total(case):
    net = graphs.build(case["graph"], case["batch"])
    machine = Machine(case["flops"], case["bw"])
    best = plan(net, case["procs"], machine)
    assert math.isclose(best.total_cost, case["total_cost"], rel_tol=1e-9), (best.total_cost, case["total_cost"])
    # The returned configurations, re-costed from scratch by the cost model, give the optimum.
    again = evaluate(net, best.configs, machine, case["procs"]).total
    assert math.isclose(again, case["total_cost"], rel_tol=1e-9)


# Breadth-first fits (largest dependent set 1) on the path-like graphs. On ResNet-101 at
# p = 8 it needs about 2e11 table entries and an estimated 23 GB, beyond what a test may
# use, so it is left out; on InceptionV3 and the Transformer it is refused outright
# (test_solver.py::test_breadth_first_refused_on_dense_graphs_with_default_budget).
BREADTH_FIRST_CASES = [c for c in CASES if c["graph"] in ("alexnet", "rnnlm")]


@pytest.mark.parametrize("case", BREADTH_FIRST_CASES, ids=_case_id)
def test_generateseq_and_breadth_first_agree(case):
    net = graphs.build(case["graph"], case["batch"])
    machine = Machine(case["flops"], case["bw"])
    G = net.graph(case["procs"], machine)
    gs = Search(G, "generateseq").run()
    bf = Search(G, "breadth-first").run()
    assert math.isclose(gs.cost, case["total_cost"], rel_tol=1e-9)
    assert math.isclose(bf.cost, case["total_cost"], rel_tol=1e-9)
    # AlexNet and RNNLM are paths, where BFS from vertex 0 and GenerateSeq may coincide;
    # the reversed path and an order that starts in the middle give other tables.
    n = len(G)
    middle = [n // 2] + [v for v in range(n) if v != n // 2]
    for sequence in (list(range(n))[::-1], middle):
        other = Search(G, lambda g, s=sequence: fixed_order(g, s)).run()
        assert math.isclose(other.cost, case["total_cost"], rel_tol=1e-9)


@pytest.mark.parametrize("name", ["resnet101", "inception3"])
def test_generateseq_and_breadth_first_agree_on_branching_graphs(name):
    # On AlexNet and RNNLM (paths) both orderings give the same sequence, so the check
    # above also runs fixed orders. Here the orderings really differ (breadth-first's
    # largest dependent set is 7 on ResNet-101 and 11 on InceptionV3, GenerateSeq's 2) and
    # breadth-first still fits at p = 2 (about 8e5 and 1.2e8 table entries).
    G = graphs.build(name).graph(2)
    gs, bf = Search(G, "generateseq"), Search(G, "breadth-first")
    assert gs.ordering.sequence != bf.ordering.sequence
    assert bf.estimate.max_dependent_set > gs.estimate.max_dependent_set
    a, b = gs.run(), bf.run()
    assert math.isclose(a.cost, b.cost, rel_tol=1e-9)
    net = G.graph["network"]
    for r in (a, b):
        configs = [G.nodes[v]["configs"][r.choice[v]] for v in range(len(net))]
        assert math.isclose(evaluate(net, configs, G.graph["machine"], 2).total, r.cost, rel_tol=1e-9)


def test_alexnet_p32_reference_strategy_costs_the_optimum():
    with open(os.path.join(REFERENCE, "alexnet-p32-strategy.json")) as f:
        ref = json.load(f)
    net = graphs.build(ref["graph"], ref["batch"])
    machine = Machine(ref["flops"], ref["bw"])
    configs = [layer["config"] for layer in sorted(ref["layers"], key=lambda layer: layer["id"])]
    reference_cost = evaluate(net, configs, machine, ref["procs"]).total
    assert math.isclose(reference_cost, ref["total_cost"], rel_tol=1e-9)
    best = plan(net, ref["procs"], machine)
    assert math.isclose(best.total_cost, reference_cost, rel_tol=1e-9)
    # The reference strategy uses only enumerated configurations: it lies in the space the
    # optimum is taken over, so the equal cost above is a tie, not a cheaper strategy missed.
    for v, config in enumerate(configs):
        enumerated = {tuple(int(x) for x in row) for row in best.graph.nodes[v]["configs"]}
        assert tuple(config) in enumerated
