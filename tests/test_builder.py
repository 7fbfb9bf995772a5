"""Edge (redistribution) costs and the graph builder (``docs/cost-model.md``, "Edge cost").

For a tensor of shape ``t`` left split ``s`` and needed split ``g``: ``src = t/s``,
``tgt = t/g``; ``overlap = 0`` if ``prod(g) > prod(s)`` else ``prod(min(tgt, src))``;
``volume = max(prod(tgt) - overlap, 0)``; edge cost ``comm(2 volume)``. Several tensors
between one pair of layers sum; a tensor read twice counts once. Expected matrices are
worked out by hand with ``rho = 1`` (``Machine(1, 8000)``).
"""

import networkx as nx
import numpy as np
import pytest

from pase.model.builder import EdgeTensor, GraphBuilder, Network, edge_cost_matrix
from pase.model.configs import enumerate_configs
from pase.model.layers import (
    FC,
    Concat,
    Conv,
    Einsum,
    Elementwise,
    Pooling,
    Softmax,
    SoftmaxCrossEntropy,
    Stack,
    Unravel,
    Unstack,
    redistribution_volume,
)
from pase.machines.paper import Machine

RHO1 = Machine(1.0, 8000.0)  # rho = 1000 / 1000 = 1


def _rows(a):
    return [tuple(int(x) for x in row) for row in a]


# ----------------------------------------------------------------------------- volume


@pytest.mark.parametrize(
    "shape, source, target, volume",
    [
        # Equal configurations: every device already holds its block.
        ((4, 6), (2, 3), (2, 3), 0.0),
        ((4, 6), (1, 1), (1, 1), 0.0),
        # src (2, 6), tgt (4, 3); Pg = 2 <= Ps = 2: overlap min(4,2)*min(3,6) = 6; 12 - 6 = 6.
        ((4, 6), (2, 1), (1, 2), 6.0),
        # Target uses more devices (2 > 1): overlap 0, volume = prod(tgt) = 2*6 = 12.
        ((4, 6), (1, 1), (2, 1), 12.0),
        # src (1, 6), tgt (4, 6): overlap 1*6 = 6: 24 - 6 = 18.
        ((4, 6), (4, 1), (1, 1), 18.0),
        # Ps = Pg = 4: src (2, 3), tgt (1, 6): overlap min(1,2)*min(6,3) = 3: 6 - 3 = 3.
        ((4, 6), (2, 2), (4, 1), 3.0),
        # 3-D, Pg = 8 > Ps = 4: overlap 0; tgt (1, 2, 3) -> 6.
        ((2, 4, 6), (2, 2, 1), (2, 2, 2), 6.0),
        # 3-D, Ps = 8 > Pg = 2: src (1, 2, 3), tgt (1, 4, 6): overlap 1*2*3 = 6; 24 - 6 = 18.
        ((2, 4, 6), (2, 2, 2), (2, 1, 1), 18.0),
    ],
)
def test_redistribution_volume_by_hand(shape, source, target, volume):
    assert float(redistribution_volume(shape, source, target)) == pytest.approx(volume, abs=1e-12)


def test_redistribution_volume_broadcasts():
    # Rows of sources against rows of targets, as the edge matrices use it.
    shape = (4, 6)
    src = np.array([[1, 1], [2, 1]])
    tgt = np.array([[1, 1], [2, 1], [1, 2]])
    vol = redistribution_volume(shape, src[:, None, :], tgt[None, :, :])
    # s=(1,1): (1,1) 0; (2,1) Pg>Ps -> 12; (1,2) Pg>Ps -> 12.
    # s=(2,1) src (2,6): (1,1) 24 - 12 = 12; (2,1) 0; (1,2) tgt (4,3), overlap 2*3 = 6 -> 6.
    np.testing.assert_allclose(vol, [[0, 12, 12], [12, 0, 6]])


def test_edge_cost_matrix_is_comm_of_twice_the_volume():
    src = np.array([[2, 1]])
    tgt = np.array([[1, 2]])
    # Volume 6 (above); forward and backward: 2 * 6 = 12 words; rho = 5000 -> 60000.
    np.testing.assert_allclose(edge_cost_matrix((4, 6), src, tgt, Machine(), 4), [[60000.0]])
    np.testing.assert_allclose(edge_cost_matrix((4, 6), src, tgt, RHO1, 4), [[12.0]])


# ----------------------------------------------------------------------------- graph matrices


def _fc_loss():
    """x (4, 6) -> FC(8) -> SoftmaxCrossEntropy; the input x makes no edge."""
    g = GraphBuilder("fc-loss", cutoff=1)
    x = g.input((4, 6), "x", letters="bk")
    h = g.add("fc", FC(x, 8))
    g.add("loss", SoftmaxCrossEntropy(h))
    return g.build()


def test_two_layer_graph_edge_matrix_by_hand():
    net = _fc_loss()
    G = net.graph(2, RHO1)
    assert isinstance(G, nx.DiGraph)
    assert list(G.nodes) == [0, 1]
    assert list(G.edges) == [(0, 1)]  # the graph input x makes no edge
    # FC (4, 8, 6) on p = 2: (1,1,1), (1,1,2), (1,2,1), (2,1,1); its output (4, 8) is split
    # (c_b, c_n): (1,1), (1,1), (1,2), (2,1).
    assert _rows(G.nodes[0]["configs"]) == [(1, 1, 1), (1, 1, 2), (1, 2, 1), (2, 1, 1)]
    # Loss (4, 8): (1,1), (1,2), (2,1).
    assert _rows(G.nodes[1]["configs"]) == [(1, 1), (1, 2), (2, 1)]
    # Volumes of (4, 8):
    # s=(1,1): g=(1,1) 0; g=(1,2) Pg>Ps -> prod(4,4) = 16; g=(2,1) -> prod(2,8) = 16.
    # s=(1,2) src (4,4): g=(1,1) 32 - 16 = 16; g=(1,2) 0; g=(2,1) tgt (2,8), overlap 2*4 = 8 -> 8.
    # s=(2,1) src (2,8): g=(1,1) 32 - 16 = 16; g=(1,2) tgt (4,4), overlap 2*4 = 8 -> 8; g=(2,1) 0.
    # Cost = 2 * rho * volume.
    expected = 2.0 * np.array([[0, 16, 16], [0, 16, 16], [16, 0, 8], [16, 8, 0]], dtype=float)
    assert G.edges[0, 1]["cost"].shape == (4, 3)
    np.testing.assert_allclose(G.edges[0, 1]["cost"], expected)
    # Node cost vectors: the FC costs by hand (M=4, N=8, K=6, rho 1):
    # (1,1,1) 576; (1,1,2): Kp=3: 288 + AR(32, 2) = 32 -> 320; (1,2,1): Np=4: 288 + AR(24, 2) = 24
    # -> 312; (2,1,1): Mp=2: 288 + AR(48, 2) = 48 -> 336.
    np.testing.assert_allclose(G.nodes[0]["cost"], [576.0, 320.0, 312.0, 336.0])
    # Loss (4, 8): (1,1) 4*32 + 2*4 = 136; (1,2): 4*16 + 8 + comm(8) = 80; (2,1): 64 + 4 = 68.
    np.testing.assert_allclose(G.nodes[1]["cost"], [136.0, 80.0, 68.0])
    assert G.nodes[0]["name"] == "fc" and G.nodes[1]["name"] == "loss"
    assert G.graph["procs"] == 2 and G.graph["machine"] == RHO1


def test_graph_default_machine_and_bad_procs():
    net = _fc_loss()
    G = net.graph(2)
    # Default rho = 5000: the (1,2) -> (1,1) entry is 2 * 16 * 5000.
    assert G.edges[0, 1]["cost"][2, 0] == pytest.approx(160000.0)
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(ValueError):
            net.graph(bad)


def test_configs_attribute_matches_enumeration():
    net = _fc_loss()
    G = net.graph(4, RHO1)
    for v, layer in enumerate(net.layers):
        expected = enumerate_configs(layer.domain, 4, net.cutoff, layer.unsplit, layer.contiguous)
        np.testing.assert_array_equal(G.nodes[v]["configs"], expected)
        assert G.nodes[v]["cost"].shape == (len(expected),)


def test_unstack_feeding_einsum_q_and_k_sums_both_tensors():
    # x (2, 2, 3) graph input -> Unstack axis 0 -> q, k (2, 3) -> Einsum bk,ck->bc (2, 2).
    g = GraphBuilder("qk", cutoff=1)
    x = g.input((2, 2, 3), "x", letters="sbk")
    q, k = g.add("split", Unstack(x, axis=0))
    g.add("scores", Einsum("bk,ck->bc", q, k))
    net = g.build()
    tensors = net.edges[(0, 1)]
    assert [(t.output_index, t.input_index) for t in tensors] == [(0, 0), (1, 1)]
    G = net.graph(2, RHO1)
    # Unstack space (1, 2, 3) on p = 2: dim 2 splits {1, 3} but 3 > 2: (1,1,1), (1,2,1).
    # Both outputs split (1,1) or (2,1).
    assert _rows(G.nodes[0]["configs"]) == [(1, 1, 1), (1, 2, 1)]
    # Einsum space (b=2, c=2, k=3): (1,1,1), (1,2,1), (2,1,1).
    # Targets: A = (c_b, c_k): (1,1), (1,1), (2,1); B = (c_c, c_k): (1,1), (2,1), (1,1).
    assert _rows(G.nodes[1]["configs"]) == [(1, 1, 1), (1, 2, 1), (2, 1, 1)]
    # Volumes of a (2, 3) tensor: (1,1)->(2,1): Pg>Ps -> 3; (2,1)->(1,1): 6 - 3 = 3; equal: 0.
    # q: s=(1,1): [0, 0, 3]; s=(2,1): [3, 3, 0].
    # k: s=(1,1): [0, 3, 0]; s=(2,1): [3, 0, 3].
    # Sum: [[0, 3, 3], [6, 3, 3]]; cost 2 * rho * that.
    np.testing.assert_allclose(G.edges[0, 1]["cost"], [[0, 6, 6], [12, 6, 6]])


def test_stack_of_a_e_e_counts_e_once():
    # a = Elementwise, e = Elementwise (vertices 0, 1), Stack((a, e, e)) (vertex 2).
    g = GraphBuilder("stack", cutoff=1)
    x1, y1, x2, y2 = (g.input((2, 4), n) for n in ("x1", "y1", "x2", "y2"))
    a = g.add("a", Elementwise(x1, y1))
    e = g.add("e", Elementwise(x2, y2))
    g.add("stack", Stack([a, e, e], axis=0))
    net = g.build()
    assert net.edge_list() == [[0, 2], [1, 2]]
    assert net.edges[(0, 2)] == (EdgeTensor((2, 4), 0, 0),)
    assert net.edges[(1, 2)] == (EdgeTensor((2, 4), 0, 1),)  # first position only
    G = net.graph(2, RHO1)
    # Elementwise (2, 4): (1,1), (1,2), (2,1). Stack (1, 2, 4): (1,1,1), (1,1,2), (1,2,1);
    # each input needs (1,1), (1,2), (2,1).
    # Volumes of (2, 4): s=(1,1): [0, 4 (Pg>Ps, tgt 2x2), 4 (tgt 1x4)];
    # s=(1,2) src (2,2): [8-4 = 4, 0, tgt (1,4) overlap 1*2 = 2 -> 2];
    # s=(2,1) src (1,4): [8-4 = 4, tgt (2,2) overlap 1*2 = 2 -> 2, 0].
    # Cost 2 * volume, counted once although e is read twice.
    expected = 2.0 * np.array([[0, 4, 4], [4, 0, 2], [4, 2, 0]], dtype=float)
    np.testing.assert_allclose(G.edges[1, 2]["cost"], expected)
    np.testing.assert_allclose(G.edges[0, 2]["cost"], expected)


def test_tensor_read_twice_uses_first_position_target():
    # Einsum bk,ck->bc of (q, q): A needs (c_b, c_k), B needs (c_c, c_k); the tensor counts
    # once with the target of its first position (A).
    g = GraphBuilder("qq", cutoff=1)
    x = g.input((2, 2, 3), "x")
    q, _ = g.add("split", Unstack(x, axis=0))
    g.add("gram", Einsum("bk,ck->bc", q, q))
    net = g.build()
    assert net.edges[(0, 1)] == (EdgeTensor((2, 3), 0, 0),)
    G = net.graph(2, RHO1)
    # Targets of A over Einsum configs (1,1,1), (1,2,1), (2,1,1): (1,1), (1,1), (2,1).
    # s=(1,1): [0, 0, 3]; s=(2,1): [3, 3, 0]; times 2.
    np.testing.assert_allclose(G.edges[0, 1]["cost"], [[0, 0, 6], [6, 6, 0]])


def test_three_layer_chain_with_target_using_more_devices():
    # x (4, 4) -> a = Elementwise (vertex 0) -> Softmax (vertex 1) -> Elementwise(a, sm) (vertex 2).
    g = GraphBuilder("chain", cutoff=1)
    x, y = g.input((4, 4), "x"), g.input((4, 4), "y")
    a = g.add("a", Elementwise(x, y))
    sm = g.add("sm", Softmax(a, axis=1))
    g.add("out", Elementwise(a, sm))
    net = g.build()
    assert net.edge_list() == [[0, 1], [0, 2], [1, 2]]
    G = net.graph(4, RHO1)
    C = _rows(G.nodes[0]["configs"])
    assert C == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1)]
    M = G.edges[0, 1]["cost"]
    i = {c: n for n, c in enumerate(C)}
    # Equal configurations cost 0 (the diagonal).
    assert np.all(np.diag(M) == 0.0)
    # (1,2) -> (2,2): Pg = 4 > Ps = 2: overlap 0, volume prod(2, 2) = 4; cost 8.
    assert M[i[(1, 2)], i[(2, 2)]] == pytest.approx(8.0)
    # (1,1) -> (4,1): Pg = 4 > 1: volume prod(1, 4) = 4; cost 8.
    assert M[i[(1, 1)], i[(4, 1)]] == pytest.approx(8.0)
    # (2,2) -> (1,4): Ps = Pg = 4: src (2,2), tgt (4,1): overlap 2*1 = 2; 4 - 2 = 2; cost 4.
    assert M[i[(2, 2)], i[(1, 4)]] == pytest.approx(4.0)
    # (4,1) -> (1,1): src (1,4), tgt (4,4): 16 - 4 = 12; cost 24.
    assert M[i[(4, 1)], i[(1, 1)]] == pytest.approx(24.0)


def test_graph_inputs_make_no_edges():
    g = GraphBuilder("inputs", cutoff=1)
    x = g.input((2, 4), "x")
    w = g.weight((4, 3), "w")
    h = g.add("mm", Einsum("bk,kn->bn", x, w))
    g.add("sum", Elementwise(h, g.input((2, 3), "bias")))
    net = g.build()
    assert net.edge_list() == [[0, 1]]
    assert w.is_param and not x.is_param
    assert w.producer is None and x.producer is None


# ----------------------------------------------------------------------------- builder


def test_vertex_ids_in_creation_order():
    g = GraphBuilder("order", cutoff=1)
    x = g.input((4, 8, 8, 8), "x", letters="bchw")
    layers = [Pooling(x, 2, stride=2)]
    p = g.add("pool", layers[0])
    layers.append(Conv(p, 4, 1))
    c = g.add("conv", layers[1])
    flat = g.reshape("flat", c, (4, 64))
    layers.append(FC(flat, 2))
    g.add("fc", layers[-1])
    net = g.build()
    assert isinstance(net, Network)
    assert net.names == ("pool", "conv", "flat.ravel", "flat.unravel", "fc")
    assert net.layers[0] is layers[0] and net.layers[1] is layers[1] and net.layers[4] is layers[2]
    assert [l.op for l in net.layers] == ["Pooling", "Conv", "Ravel", "Unravel", "FC"]
    assert len(net) == 5
    assert net.edge_list() == [[0, 1], [1, 2], [2, 3], [3, 4]]
    # Outputs name their producer vertex.
    assert (p.producer, c.producer, flat.producer) == (0, 1, 3)
    assert net.cutoff == 1 and net.name == "order"


def test_names_unique_and_non_empty():
    g = GraphBuilder("names")
    x = g.input((2, 3), "x")
    g.add("a", Softmax(x))
    with pytest.raises(ValueError):
        g.add("a", Softmax(x))
    with pytest.raises(ValueError):
        g.add("", Softmax(x))
    # The failed adds left nothing behind.
    assert len(g.build()) == 1


def test_builders_do_not_share_state():
    g1, g2 = GraphBuilder("one"), GraphBuilder("two")
    x1 = g1.input((2, 3), "x")
    x2 = g2.input((2, 3), "x")
    y1 = g1.add("sm", Softmax(x1))
    # A tensor (layer output or graph input) of one builder is rejected by the other.
    with pytest.raises(ValueError):
        g2.add("sm", Softmax(y1))
    with pytest.raises(ValueError):
        g2.add("sum", Elementwise(x2, x1))
    # The same names are fine in separate builders; neither sees the other's layers.
    g2.add("sm", Softmax(x2))
    g2.add("sm2", Softmax(g2.add("sm1", Softmax(x2))))
    n1, n2 = g1.build(), g2.build()
    assert n1.names == ("sm",) and n2.names == ("sm", "sm1", "sm2")
    assert n1.edges == {} and n2.edge_list() == [[1, 2]]


def test_builder_rejections():
    with pytest.raises(ValueError):
        GraphBuilder("bad", cutoff=0)
    with pytest.raises(ValueError):
        GraphBuilder("bad", cutoff=1.5)
    g = GraphBuilder("empty")
    with pytest.raises(ValueError):
        g.build()  # no layers
    for shape in [(0, 3), (2, -1), (2, 2.5), (True, 2)]:
        with pytest.raises(ValueError):
            g.input(shape, "x")
    with pytest.raises(ValueError):
        g.input((2, 3), "x", letters="abc")  # three letters for two dims
    with pytest.raises(TypeError):
        g.add("not-a-layer", object())


def test_invalid_construction_raises_clear_exceptions():
    g = GraphBuilder("bad")
    a, b = g.input((2, 3), "a"), g.input((3, 2), "b")
    with pytest.raises(ValueError, match="shape"):
        Elementwise(a, b)
    with pytest.raises(ValueError):
        Einsum("bk,ck->bc", a, b)  # k is 3 in A and 2 in B
    with pytest.raises(ValueError):
        Concat([g.input((2, 3, 4)), g.input((2, 3, 5))], axis=1)  # differ off the axis
    flat = g.input((12,), "flat")
    with pytest.raises(ValueError):
        Unravel(flat, (5, 3))  # 15 != 12
    with pytest.raises(TypeError):
        Softmax((2, 3))  # not a Tensor


def test_reshape_is_ravel_then_unravel():
    g = GraphBuilder("reshape", cutoff=1)
    x = g.input((2, 3, 4), "x")
    y = g.add("sm", Softmax(x))
    z = g.reshape("r", y, (6, 4), letters="bk")
    assert z.shape == (6, 4) and z.letters == "bk"
    net = g.build()
    assert net.names == ("sm", "r.ravel", "r.unravel")
    assert net.layers[1].output_shapes == ((24,),)
    assert net.edge_list() == [[0, 1], [1, 2]]
    with pytest.raises(ValueError):
        g.reshape("r2", y, (5, 5))


def test_multi_output_tensor_names():
    g = GraphBuilder("multi")
    x = g.input((3, 2, 4), "x")
    outs = g.add("split", Unstack(x))
    assert [t.name for t in outs] == ["split:0", "split:1", "split:2"]
    assert [t.index for t in outs] == [0, 1, 2]
    assert all(t.shape == (2, 4) for t in outs)


def test_one_edge_rule_prices_a_redistribution_over_the_devices_it_spans():
    # h100-sxm: 450 GB/s and 3 us inside a node of 8, 50 GB/s and 10 us across nodes, 2-byte
    # activations. A (16, 1024) tensor split [2, 8] needed split [2, 1] on 16 devices: only the
    # second dimension's split changes, so the exchange spans its 8 devices, one node. Volume:
    # the target block 8 x 1024 = 8192 elements less the overlap with the source block 8 x 128
    # (1024): 7168; forward and backward 14336 elements = 28,672 bytes.
    from pase.machines.registry import load_machine
    from pase.model.builder import edge_cost_matrix, exchange_devices, redistribution_seconds
    from pase.planning.training_search import edge_seconds

    h100 = load_machine("h100-sxm")
    source, target = np.array([[2, 8]]), np.array([[2, 1], [1, 8]])
    assert exchange_devices(source, target, 16).tolist() == [8, 16]
    inside = 28672 / 450e9 + 2 * 3e-6
    # [1, 8] from [2, 8]: the batch split changes (all 16 devices, across nodes); volume: the
    # target block 16 x 128 = 2048 less the overlap 8 x 128 = 1024, twice: 2048 elements, 4096 B.
    across = 4096 / 50e9 + 2 * 10e-6
    matrix = edge_cost_matrix((16, 1024), source, target, h100, 16)
    np.testing.assert_allclose(matrix, [[inside, across]], rtol=1e-12)
    # The training search and evaluate price an edge by the same rule.
    np.testing.assert_allclose(edge_seconds(h100, (16, 1024), source, target, 16), [inside, across], rtol=1e-12)
    assert edge_seconds is redistribution_seconds
    # Context parallelism 2 around sequence parallelism 8 on 16 devices: a (1, 8192, 4096)
    # activation split [1, 16, 1] (each device a sixteenth of the sequence) gathered to
    # [1, 2, 1] (each context half whole): the 8 sixteenths of one half sit on 8 consecutive
    # devices (the mesh puts cp outside tp), so the gather spans one node, not 16 devices. Volume:
    # the target half 4096 x 4096 = 16,777,216 elements less the overlap 512 x 4096 = 2,097,152:
    # 14,680,064; twice: 29,360,128 elements = 58,720,256 bytes at 450 GB/s plus 2 x 3 us.
    cp = redistribution_seconds(h100, (1, 8192, 4096), np.array([[1, 16, 1]]), np.array([[1, 2, 1]]), 16)
    np.testing.assert_allclose(cp, [58_720_256 / 450e9 + 2 * 3e-6], rtol=1e-12)
    # The reference machine charges rho x 2 volume whatever the exchange spans.
    paper = load_machine("paper")
    ref = edge_cost_matrix((16, 1024), source, target, paper, 16)
    np.testing.assert_allclose(ref, [[paper.comm(14336.0), paper.comm(2048.0)]], rtol=1e-12)
