"""Several readers of one tensor: the reader rules "each" (the paper) and "summed" (issue 23, item 4).

Hand values use the reference machine: an all-reduce of ``w`` words over ``q`` devices costs
``rho * 2 (q - 1) / q * w`` with ``rho = 5000``.
"""

import json

import numpy as np
import pytest

import graphs
from pase.cli import main
from pase.costing.strategy import evaluate
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, Einsum, Elementwise, SoftmaxCrossEntropy
from pase.model.readers import reader_links
from pase.planning.planner import plan
from pase.search.solver import indexed_cost
from pase.sources.graph_json import network_from_json, network_to_json
from brute import brute_force

RHO = 5000.0


def all_reduce(words, q):
    return RHO * 2 * (q - 1) / q * words


def three_readers(readers="summed", b=8, k=16):
    """``h = FC(x)`` read by three FC projections ``q``, ``k`` and ``v`` whose outputs are summed."""
    g = GraphBuilder("three", cutoff=1)
    x = g.input((b, k), "x", letters="bk")
    h = g.add("h", FC(x, k))
    q = g.add("q", FC(h, k))
    kk = g.add("k", FC(h, k))
    v = g.add("v", FC(h, k))
    s = g.add("s", Elementwise(q, kk))
    t = g.add("t", Elementwise(s, v))
    g.add("loss", SoftmaxCrossEntropy(t))
    return g.build().with_readers(readers)


def strategy(q, k, v, rest=(1, 1, 1)):
    """Configurations of ``three_readers``: FC configs are ``(b, n, k)`` splits."""
    return [rest, q, k, v, (1, 1), (1, 1), (1, 1)]


def test_the_paper_rule_is_the_default_and_has_no_links():
    net = three_readers().with_readers("each")
    assert graphs.build("alexnet", 32).readers == "each"
    assert reader_links(net) == ()
    links = reader_links(three_readers())
    assert [(link.earlier, link.later) for link in links] == [(1, 2), (2, 3)]


def test_two_readers_split_alike_reduce_once_by_hand():
    # q, k and v split n in 2: each reader's gradient of h is 8 x 16 words, all-reduced over 2.
    alike = strategy((1, 2, 1), (1, 2, 1), (1, 2, 1))
    each = evaluate(three_readers("each"), alike, procs=2)
    summed = evaluate(three_readers("summed"), alike, procs=2)
    one = all_reduce(8 * 16, 2)
    assert one == 640000.0
    assert each.total - summed.total == pytest.approx(2 * one, rel=1e-12)
    # The first reader pays; the others' communication loses exactly their reduction.
    assert summed.communication[1] == each.communication[1]
    assert each.communication[2] - summed.communication[2] == pytest.approx(one, rel=1e-12)
    assert each.communication[3] - summed.communication[3] == pytest.approx(one, rel=1e-12)


def test_readers_split_otherwise_each_pay():
    # q splits n in 2, k in 4: different groups, no sum; v like k shares k's reduction.
    mixed = strategy((1, 2, 1), (1, 4, 1), (1, 4, 1))
    each = evaluate(three_readers("each"), mixed, procs=4)
    summed = evaluate(three_readers("summed"), mixed, procs=4)
    assert each.total - summed.total == pytest.approx(all_reduce(8 * 16, 4), rel=1e-12)
    # Same splits but laid out on other devices (k split by the input dim too): no sharing.
    other = strategy((2, 2, 1), (1, 2, 2), (2, 2, 1))
    assert evaluate(three_readers("each"), other, procs=4).total == evaluate(three_readers("summed"), other,
                                                                              procs=4).total


def test_the_chain_charges_a_first_and_third_that_agree_around_a_second():
    # The documented limit of the pairwise rule: q and v alike, k not: both reductions paid.
    apart = strategy((1, 2, 1), (1, 1, 2), (1, 2, 1))
    assert evaluate(three_readers("each"), apart, procs=2).total == evaluate(three_readers("summed"), apart,
                                                                              procs=2).total


def test_an_fc_and_an_einsum_reading_one_tensor_share():
    # The built-in decoders write q as an Einsum over heads and k as another: same input
    # layout and the same devices splitting the heads -> one reduction.
    g = GraphBuilder("mixed", cutoff=1)
    x = g.input((4, 8), "x", letters="be")
    h = g.add("h", FC(x, 8))
    w = g.input((8, 2, 4), "w", letters="ehk", param=True)
    a = g.add("a", Einsum("be,ehk->bhk", h, w))
    c = g.add("c", FC(h, 8))
    g.add("loss", SoftmaxCrossEntropy(c))
    g.add("loss2", SoftmaxCrossEntropy(a))
    net = g.build()
    # Einsum space (b, h, k, e); FC space (b, n, k): split the heads / units in 2, e unsplit.
    configs = [(1, 1, 1), (1, 2, 1, 1), (1, 2, 1), (1, 1), (1, 1, 1)]
    each = evaluate(net, configs, procs=2)
    summed = evaluate(net.with_readers("summed"), configs, procs=2)
    assert each.total - summed.total == pytest.approx(all_reduce(4 * 8, 2), rel=1e-12)




@pytest.mark.parametrize("readers", ["each", "summed"])
def test_the_search_equals_brute_force(readers):
    net = three_readers(readers, b=4, k=8)
    G = net.graph(2)
    best = plan(net, 2)
    assert best.total_cost == pytest.approx(brute_force(G), rel=1e-12)
    assert best.evaluation.total == pytest.approx(best.total_cost, rel=1e-12)


def test_the_tables_price_every_strategy_as_evaluate_does():
    net = three_readers("summed", b=8, k=8)
    G = net.graph(4)
    configs = [G.nodes[v]["configs"] for v in sorted(G.nodes)]
    rng = np.random.default_rng(23)
    for _ in range(40):
        choice = {v: int(rng.integers(len(configs[v]))) for v in G.nodes}
        chosen = [tuple(int(c) for c in configs[v][choice[v]]) for v in sorted(G.nodes)]
        assert indexed_cost(G, choice) == pytest.approx(evaluate(net, chosen, procs=4).total, rel=1e-12)
    # Every joint choice of the three readers alike included.
    q = list(map(tuple, configs[1]))
    for c in q[:6]:
        chosen = [tuple(configs[0][0]), c, c, c] + [tuple(configs[v][0]) for v in (4, 5, 6)]
        choice = {0: 0, 1: q.index(c), 2: q.index(c), 3: q.index(c), 4: 0, 5: 0, 6: 0}
        assert indexed_cost(G, choice) == pytest.approx(evaluate(net, chosen, procs=4).total, rel=1e-12)


def test_summed_never_costs_more_and_saves_on_a_gated_decoder():
    net = graphs.build("llama3-8b", 8)
    each = plan(net, 8)
    summed = plan(net.with_readers("summed"), 8)
    assert summed.total_cost <= each.total_cost
    assert summed.total_cost < 0.99 * each.total_cost


def test_a_graph_file_records_the_rule():
    net = three_readers("summed")
    data = network_to_json(net)
    assert data["readers"] == "summed"
    assert network_from_json(json.loads(json.dumps(data)), "x").readers == "summed"
    assert "readers" not in network_to_json(net.with_readers("each"))
    data["readers"] = "sometimes"
    with pytest.raises(ValueError, match="field 'readers' must be one of each, summed"):
        network_from_json(data, "graph file g.json")


def test_the_cli_flag_the_json_and_evaluate(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["-g", "llama3-8b", "-b", "8", "-p", "8", "--readers", "summed", "--json"]) == 0
    summed = json.loads(capsys.readouterr().out)
    assert summed["readers"] == "summed"
    assert main(["-g", "llama3-8b", "-b", "8", "-p", "8", "--json"]) == 0
    each = json.loads(capsys.readouterr().out)
    assert each["readers"] == "each"
    assert summed["total_cost"] < each["total_cost"]
    out.write_text(json.dumps(summed))
    assert main(["--evaluate", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["readers"] == "summed" and again["total_cost"] == pytest.approx(summed["total_cost"], rel=1e-12)
    assert main(["-g", "llama3-8b", "-b", "8", "-p", "8", "--readers", "summed"]) == 0
    assert "readers" in capsys.readouterr().out
    assert main(["-g", "alexnet", "--readers", "some"]) != 0
    assert "invalid choice" in capsys.readouterr().err


def test_the_training_model_refuses_the_summed_rule(capsys):
    assert main(["-g", "llama3-8b", "-b", "8", "-p", "8", "--training", "--readers", "summed"]) == 2
    err = capsys.readouterr().err
    assert "--readers summed applies to the per-layer search" in err and "Traceback" not in err


def test_a_conv_compares_only_with_a_conv_of_the_same_shape():
    from pase.model.layers import Conv

    g = GraphBuilder("branches", cutoff=1)
    x = g.input((4, 8, 6, 6), "x", letters="bchw")
    h = g.add("h", Conv(x, 8, 1))
    g.add("a", Conv(h, 8, 1))
    g.add("b", Conv(h, 16, 1))
    g.add("c", Conv(h, 8, 3, pad=1))
    net = g.build().with_readers("summed")
    links = reader_links(net)
    # a and b (1x1 kernels, other filter counts) share; c (3x3) reads an unfolded image of its own.
    assert [(net.names[link.earlier], net.names[link.later]) for link in links] == [("a", "b")]
    # Conv space (b, c, ho, wo, r, s, n): a and b split n in 2 -> one reduction of 4*8*6*6 words.
    configs = [(1,) * 7, (1, 1, 1, 1, 1, 1, 2), (1, 1, 1, 1, 1, 1, 2), (1,) * 7]
    saved = evaluate(net.with_readers("each"), configs, procs=2).total - evaluate(net, configs, procs=2).total
    assert saved == pytest.approx(all_reduce(4 * 8 * 6 * 6, 2), rel=1e-12)
