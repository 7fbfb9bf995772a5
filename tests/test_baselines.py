"""Data parallelism as a strategy (``pase.planning.baselines``), costed by the reference model.

Data parallelism splits every layer's batch dimension ``largest_divisor(b, p)`` ways (the
largest divisor of ``b`` that is at most ``p``) and nothing else; ``evaluate`` costs those
configurations even when the enumeration (cut-off) would not produce them.
"""

import numpy as np
import pytest

import graphs
from pase.planning.baselines import largest_divisor, data_parallel
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, Einsum, SoftmaxCrossEntropy, Unstack
from pase.machines.paper import Machine
from pase.costing.strategy import evaluate

RHO1 = Machine(1.0, 8000.0)  # rho = 1000 / (8000 / 8) = 1


@pytest.mark.parametrize(
    "size, procs, expected",
    [
        (128, 64, 64),
        (128, 8, 8),
        (128, 200, 128),  # never more than the dimension
        # Divisors of 96 up to 64: ..., 32, 48 -> 48.
        (96, 64, 48),
        # 7 is prime: only 1 fits under 4.
        (7, 4, 1),
        # Divisors of 12 up to 5: 1, 2, 3, 4 -> 4.
        (12, 5, 4),
        # Divisors of 100 up to 32: 1, 2, 4, 5, 10, 20, 25 -> 25.
        (100, 32, 25),
        (1, 8, 1),
        (40, 32, 20),
    ],
)
def test_largest_divisor_by_hand(size, procs, expected):
    assert largest_divisor(size, procs) == expected


# ----------------------------------------------------------------------------- configurations


@pytest.mark.parametrize("procs", [8, 32])
@pytest.mark.parametrize("name", ["alexnet", "resnet101", "inception3", "rnnlm", "transformer"])
def test_only_the_batch_dimension_is_split(name, procs):
    # With batch 40, no other dimension of any built-in graph has size 40 (channels are
    # powers of two or multiples of 16, images 299/227 and their reductions, sequences 256,
    # widths 512/2048, vocabularies 50000/100000), so the batch dimension is the one of size 40.
    net = graphs.build(name, 40)
    strategy = data_parallel(net, procs)
    assert len(strategy) == len(net)
    split = largest_divisor(40, procs)  # 8 on 8 devices; 20 on 32 (divisors of 40: ..., 10, 20, 40)
    assert split == {8: 8, 32: 20}[procs]
    for v, (layer, config) in enumerate(zip(net.layers, strategy)):
        assert len(config) == len(layer.domain)
        batch_dims = [i for i, d in enumerate(layer.domain) if d == 40]
        assert batch_dims == [layer.batch_dim], (name, v, net.names[v], layer.domain)
        expected = [1] * len(layer.domain)
        expected[layer.batch_dim] = split
        assert tuple(config) == tuple(expected), (name, v, net.names[v])


def test_transformer_batch_dims_by_name():
    net = graphs.build("transformer", 128)
    dp = dict(zip(net.names, data_parallel(net, 32)))
    # Embedding (b, l, d, v): b first.
    assert dp["enc.embedding"] == (32, 1, 1, 1)
    # Einsum ble,shek->sbhlk: space (s, b, h, l, k, e): b second.
    assert dp["enc1.attn.qkv"] == (1, 32, 1, 1, 1, 1)
    # Unstack of (s, b, h, l, k) on axis 0: space (1, b, h, l, k): b second.
    assert dp["enc1.attn.split"] == (1, 32, 1, 1, 1)
    # Stack of three (b, l, e) on axis 0: space (1, b, l, e).
    assert dp["dec1.cross.stack"] == (1, 32, 1, 1)
    assert dp["dec1.cross.qkv"] == (1, 32, 1, 1, 1, 1)
    # bhlk,bhmk->bhlm: (b, h, l, m, k); bhlk,hek->ble: (b, l, e, h, k).
    assert dp["enc1.attn.scores"] == (32, 1, 1, 1, 1)
    assert dp["enc1.attn.out"] == (32, 1, 1, 1, 1)
    assert dp["enc1.attn.softmax"] == (32, 1, 1, 1)
    assert dp["loss"] == (32, 1, 1)


def test_rnnlm_lstm_batch_dim():
    # LSTM space (L, s, b, n, k): b is third.
    dp = data_parallel(graphs.build("rnnlm", 128), 32)
    assert dp == [(32, 1, 1, 1), (1, 1, 32, 1, 1), (32, 1, 1, 1), (32, 1, 1)]


# ----------------------------------------------------------------------------- costs


def test_costed_outside_the_enumerated_set_alexnet_p64():
    net = graphs.build("alexnet", 128)
    dp = data_parallel(net, 64)
    assert dp[0] == (64, 1, 1, 1, 1, 1, 1)
    # t = 4: 128 / 64 = 2 < 4, so no enumerated configuration splits the batch 64 ways.
    enumerated = net.configs(64)
    assert all(int(C[:, 0].max()) <= 32 for C in enumerated)
    assert dp[0] not in {tuple(int(x) for x in row) for row in enumerated[0]}
    result = evaluate(net, dp, Machine(), 64)
    # conv1 by hand (rho = 5000): M = 128*55*55 = 387200, m = 64 -> Mp = 6050; N = 96;
    # K = 3*11*11 = 363. Compute 3*6050*96*363 + 3*1*6050*96 = 3*6050*96*364 = 634233600.
    # AR(Np Kp = 34848, 64) = 5000 * 34848/64 * 2 * 63 = 5000 * 68607 = 343035000.
    # Total 977268600.
    assert result.layer_costs[0] == pytest.approx(977268600.0, rel=1e-12)
    # Every tensor is split 64 ways on its batch dimension by producer and consumer alike
    # (the flatten's (64,1,1,1) -> (64,) -> (64,1) too): all edges cost 0.
    assert all(c == 0.0 for c in result.edge_costs.values())
    assert np.isfinite(result.total) and result.total > 0


def test_tiny_graph_data_parallel_cost_by_hand():
    # x (4, 6) -> FC(8) (space (4, 8, 6)) -> SoftmaxCrossEntropy (4, 8); rho = 1.
    g = GraphBuilder("tiny", cutoff=1)
    x = g.input((4, 6), "x", letters="bk")
    h = g.add("fc", FC(x, 8))
    g.add("loss", SoftmaxCrossEntropy(h))
    net = g.build()

    # p = 2: fc (2, 1, 1): Mp = 2, Np = 8, Kp = 6: 3*2*8*6 = 288; AR(Np Kp = 48, 2) = 48 -> 336.
    # loss (2, 1): dpp (2, 8): E = 16, bpp = 2: 4*16 + 2*2 = 68. Edge (2,1) -> (2,1): 0.
    # Total 404.
    assert data_parallel(net, 2) == [(2, 1, 1), (2, 1)]
    result = evaluate(net, data_parallel(net, 2), RHO1, 2)
    np.testing.assert_allclose(result.layer_costs, [336.0, 68.0])
    assert result.edge_costs == {(0, 1): 0.0}
    assert result.total == pytest.approx(404.0)

    # p = 4: fc (4, 1, 1): Mp = 1: 3*1*8*6 = 144; AR(48, 4) = 48/4*2*3 = 72 -> 216.
    # loss (4, 1): E = 8, bpp = 1: 32 + 2 = 34. Total 250.
    assert evaluate(net, data_parallel(net, 4), RHO1, 4).total == pytest.approx(250.0)

    # p = 3: largest_divisor(4, 3) = 2: the same strategy as p = 2 (one device idle): 404.
    assert data_parallel(net, 3) == [(2, 1, 1), (2, 1)]
    assert evaluate(net, data_parallel(net, 3), RHO1, 3).total == pytest.approx(404.0)


def test_data_parallel_can_pay_for_edges():
    # x (3, 4, 2) -> Unstack axis 0 (space (1, 4, 2), batch dim 1) -> q, k, v (4, 2);
    # Einsum bk,ck->bc of (q, k): space (b=4, c=4, k=2), batch dim 0 (b). rho = 1, p = 2.
    g = GraphBuilder("attn", cutoff=1)
    x = g.input((3, 4, 2), "x", letters="sbk")
    q, k, _ = g.add("split", Unstack(x, axis=0))
    g.add("scores", Einsum("bk,ck->bc", q, k))
    net = g.build()
    dp = data_parallel(net, 2)
    assert dp == [(1, 2, 1), (2, 1, 1)]
    result = evaluate(net, dp, RHO1, 2)
    # Unstack: 0. Einsum (2,1,1): M = 4 (b), N = 4 (c), K = 2: Mp = 2: 3*2*4*2 = 48;
    # AR(Np Kp = 8, m=2) = 8 -> 56.
    np.testing.assert_allclose(result.layer_costs, [0.0, 56.0])
    # q leaves split (2, 1) and A needs (c_b, c_k) = (2, 1): 0. k leaves (2, 1) but B needs
    # (c_c, c_k) = (1, 1): src (2, 2), tgt (4, 2): 8 - 4 = 4 words; comm(2 * 4) = 8.
    assert result.edge_costs == {(0, 1): pytest.approx(8.0)}
    assert result.total == pytest.approx(64.0)
