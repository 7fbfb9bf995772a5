"""The placement analysis of ``benchmarks/machine_compare.py``, against layouts worked by hand."""

import importlib
import os
import sys

import numpy as np
import pytest

import graphs
from pase.planning.experts import mesh_tensorflow
from pase.machines.base import Group
from pase.machines.calibrated import load_calibrated

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def mc():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    return importlib.import_module("machine_compare")


@pytest.fixture(scope="module")
def gpt():
    return graphs.build("gpt2-small", 8)


def layer_named(net, name):
    return net.layers[net.names.index(name)]


def test_placements_of_qkv_by_hand(mc, gpt):
    # qkv's space is s b h l k e, batch b. Layout order: b outermost, then s h l k e, e innermost.
    # Config s1 b4 h8 l1 k1 e2: strides e=1, k=2, l=2, h=2, s=16, b=16.
    # b: group 0,16,32,48 -> 8 // 16 = 0 -> one member per node, 4 nodes.
    # h: group 0,2,...,14 -> 8 // 2 = 4 per node, 2 nodes.
    # e: group 0,1 -> 2 * 1 <= 8, one node.
    qkv = layer_named(gpt, "block1.attn.qkv")
    assert qkv.dims == "sbhlke"
    pls = mc.placements(qkv, (1, 4, 8, 1, 1, 2), 8)
    got = [(p["letter"], p["split"], p["stride"], p["members"], p["per_node"], p["nodes"], p["in_node"]) for p in pls]
    assert got == [
        ("b", 4, 16, [0, 16, 32, 48], 1, 4, False),
        ("h", 8, 2, list(range(0, 16, 2)), 4, 2, False),
        ("e", 2, 1, [0, 1], 2, 1, True),
    ]
    assert mc.placement_text(pls[0]) == "4 nodes x 1"
    assert mc.placement_text(pls[2]) == "in one node"
    assert mc.members_text(pls[0]["members"]) == "0,16,32,48"
    assert mc.members_text(pls[1]["members"]) == "0,2,...,14"


def test_unsplit_layer_has_no_placements(mc, gpt):
    assert mc.placements(layer_named(gpt, "embedding"), (1, 1, 1, 1)) == []


def test_megatron_mesh_keeps_heads_in_a_node(mc):
    # Transformer (8 heads) on 64 devices, mesh 8 x 8: qkv is s1 b8 h8 l1 k1 e1, so h has
    # stride 1 (devices 0..7, node 0) and b stride 8 (one device on each of 8 nodes).
    net = graphs.build("transformer", 128)
    configs = mesh_tensorflow(net, 64, m=8)
    v = net.names.index("enc1.attn.qkv")
    pls = {p["letter"]: p for p in mc.placements(net.layers[v], configs[v], 8)}
    assert (pls["h"]["stride"], pls["h"]["in_node"]) == (1, True)
    assert (pls["b"]["stride"], pls["b"]["per_node"], pls["b"]["nodes"]) == (8, 1, 8)


def test_collective_roles_of_ff_up(mc, gpt):
    # ff.up is "ble,ef->blf": space b l f e. b, l are only in A and the output (M: the weight B's
    # gradient is reduced over them); f only in B and the output (N: A's gradient); e is summed (K).
    up = layer_named(gpt, "block1.ff.up")
    assert up.dims == "blfe"
    assert [mc.collective_of(up, j) for j in range(4)] == [
        "AR grad of B (weight)", "AR grad of B (weight)", "AR grad of A", "AR output (partial sums)",
    ]
    scores = layer_named(gpt, "block1.attn.scores")  # b h are batched: no collective
    assert mc.collective_of(scores, scores.dims.index("h")) == "none (batched GEMMs)"
    norm = layer_named(gpt, "block1.attn.norm")
    assert mc.collective_of(norm, 2) == "AR statistics" and mc.collective_of(norm, 0) == "AR scale/bias grads"


def test_flat_machine_prices_every_link_as_nvlink(mc):
    h100 = load_calibrated("h100-sxm")
    flat = mc.flat_machine(h100)
    # 16 devices, stride 1: 8 per node on 2 nodes. 1e6 activation elements = 2e6 bytes.
    # inside: 2 * 7/8 * 2e6 / 450e9 + 2 * 7 * 3e-6 = 7.7778e-6 + 42e-6 = 49.7778e-6
    # h100 across: 2 * 1/2 * (2e6 / 8) / 50e9 + 2 * 1 * 10e-6 = 5e-6 + 20e-6 = 25e-6
    # flat across:  2 * 1/2 * (2e6 / 8) / 450e9 + 2 * 1 * 3e-6 = 0.5556e-6 + 6e-6
    group = Group(np.array([[16]]), np.array([[1]]))
    assert float(h100.all_reduce(1e6, group)[0]) == pytest.approx(74.7778e-6, rel=1e-4)
    assert float(flat.all_reduce(1e6, group)[0]) == pytest.approx(56.3333e-6, rel=1e-4)
    # Edges at p > 8: bytes over NVLink and two of its latencies: 2e6 / 450e9 + 6e-6.
    assert float(flat.redistribute(1e6, 64)) == pytest.approx(10.4444e-6, rel=1e-4)
    # Everything else is the H100's: compute, memory, the node size.
    assert float(flat.gemm_seconds(1, 4096, 4096, 4096)) == float(h100.gemm_seconds(1, 4096, 4096, 4096))
    assert (flat.devices_per_node, flat.memory_bytes) == (8, h100.memory_bytes)


def test_megatron_picks_fastest_mesh_and_fastest_fitting(mc):
    net = graphs.build("transformer", 128)
    h100 = load_calibrated("h100-sxm")
    out = mc.megatron(net, 16, h100)
    totals = {mesh: p.total_cost for mesh, p in out["meshes"].items()}
    assert set(totals) == {(16, 1), (8, 2), (4, 4), (2, 8)}  # n divides the 8 heads
    assert totals[out["mesh"]] == min(totals.values())
    fitting = [mesh for mesh, p in out["meshes"].items() if p.memory.per_device_bytes <= 80e9]
    assert out["fitting"] in fitting
    assert totals[out["fitting"]] == min(totals[m] for m in fitting)
