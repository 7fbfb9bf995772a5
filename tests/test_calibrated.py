"""Calibrated machines (``pase/calibrated.py``): collectives by hand, placement, compute, descriptions.

Every expected number is worked out by hand from ``docs/machines.md`` and the h100-sxm description:
B_in = 450 GB/s, a_in = 3 us, B_out = 50 GB/s, a_out = 10 us, 2 bytes per activation element,
4 per weight-gradient element, 8 devices per node.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pase.machines.registry import MACHINE_NAMES
from pase.machines.specs import SPEC_FIELDS
from pase.machines.calibrated import (
    PRESET_TABLES,
    PRESETS,
    CalibratedMachine,
    load_calibrated,
    load_description,
    validate_description,
)
from pase.machines.base import Group as _Group
from pase.machines.paper import Machine
from pase.machines.base import layout_strides
from pase.machines.registry import load_machine
from pase.machines.measured import MeasuredTables


def Group(sizes, strides):
    return _Group(np.atleast_2d(np.asarray(sizes, dtype=np.int64)), np.atleast_2d(np.asarray(strides, dtype=np.int64)))


SPEC_EXAMPLE = {  # docs/machines.md, "The description" (its clock_ratio comes from clock_mhz, a spec field)
    "name": "h100-sxm",
    "devices_per_node": 8,
    "memory_gib": 79.65,
    "peak_tflops": 989,
    "hbm_gbps": 3350,
    "intra_node": {"gbps": 450, "latency_us": 3},
    "inter_node": {"gbps": 50, "latency_us": 10},
    "act_bytes": 2,
    "grad_bytes": 4,
    "measured": "h100-sxm-measured.json",
}


@pytest.fixture(scope="module")
def h100():
    return load_machine("h100-sxm")


@pytest.fixture(scope="module")
def bare():
    """The h100-sxm description without its table: compute at peak, memory at HBM speed."""
    return CalibratedMachine({k: v for k, v in SPEC_EXAMPLE.items() if k != "measured"})


# -- placement and groups ------------------------------------------------------------------


def test_placement_strides_of_an_fc_layer():
    # FC (b, n, k) split (2, 4, 2), b outermost: k innermost (1), n inside b (2), b (4 * 2 = 8).
    assert layout_strides(np.array([[2, 4, 2]]), 0).tolist() == [[8, 2, 1]]


def test_placement_strides_with_the_batch_dimension_not_first():
    # LSTM (L, s, b, n, k), batch b = dim 2, split (2, 1, 4, 2, 2). Order b, L, s, n, k:
    # k 1, n 2, s 2 * 2 = 4, L 1 * 2 * 2 = 4, b 2 * 1 * 2 * 2 = 8.
    assert layout_strides(np.array([[2, 1, 4, 2, 2]]), batch_dim=2).tolist() == [[4, 4, 8, 2, 1]]
    # The Transformer's qkv Einsum (s, b, h, l, k, e), batch b = dim 1, split (1, 2, 2, 1, 1, 2):
    # e 1, k 2, l 2, h 2, s 2 * 1 * 1 * 2 = 4, b 1 * 2 * 1 * 1 * 2 = 4.
    assert layout_strides(np.array([[1, 2, 2, 1, 1, 2]]), batch_dim=1).tolist() == [[4, 4, 2, 2, 2, 1]]


def test_placement_strides_are_per_configuration():
    # Attention scores (b, h, l, m, k) split (2, 2, 1, 1, 4) and (8, 1, 1, 1, 1).
    got = layout_strides(np.array([[2, 2, 1, 1, 4], [8, 1, 1, 1, 1]]), 0)
    assert got.tolist() == [[8, 4, 4, 4, 1], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("sizes, strides, g, q_in", [
    ([4], [1], 8, 4),        # stride 1, 4 * 1 <= 8: one node, all 4 in it
    ([4], [2], 8, 4),        # 4 * 2 = 8 <= 8: still one node
    ([4], [4], 8, 2),        # 16 > 8: 8 // 4 = 2 per node, on 2 nodes
    ([4], [8], 8, 1),        # one per node
    ([4], [16], 8, 1),       # max(1, 8 // 16) = 1
    ([2, 2], [2, 1], 8, 4),  # two dims, both inside the node
    ([2, 2], [2, 1], 2, 2),  # node of 2: the stride-2 dim leaves it: 1 * 2
])
def test_members_per_node(sizes, strides, g, q_in):
    assert Group([sizes], [strides]).members_per_node(g).tolist() == [q_in]


# -- collectives by hand ----------------------------------------------------------------------

E = 1e6  # elements per device: 2e6 bytes of activations, 4e6 of weight gradients


def test_all_reduce_inside_one_node(h100):
    # q = 4, stride 1: 2 (3/4) 2e6 / 450e9 + 2 * 3 * 3e-6 = 6.667 us + 18 us
    got = h100.all_reduce(E, Group([4], [1]))
    assert float(got[0]) == pytest.approx(3e6 / 450e9 + 18e-6, rel=1e-12)


def test_all_reduce_across_nodes_one_member_per_node(h100):
    # q = 4, stride 8: q_in = 1, q_out = 4: 2 (3/4) 2e6 / 50e9 + 2 * 3 * 10e-6 = 60 us + 60 us
    got = h100.all_reduce(E, Group([4], [8]))
    assert float(got[0]) == pytest.approx(120e-6, rel=1e-12)


def test_all_reduce_across_nodes_several_members_per_node(h100):
    # q = 4, stride 4: q_in = 2, q_out = 2.
    # inside: 2 (1/2) 2e6 / 450e9 + 2 * 1 * 3 us = 4.444 us + 6 us
    # across: 2 (1/2) (2e6 / 2) / 50e9 + 2 * 1 * 10 us = 20 us + 20 us
    got = h100.all_reduce(E, Group([4], [4]))
    assert float(got[0]) == pytest.approx(2e6 / 450e9 + 6e-6 + 20e-6 + 20e-6, rel=1e-12)
    # q = 16, stride 2: q_in = 4, q_out = 4.
    # inside: 2 (3/4) 2e6 / 450e9 + 2 * 3 * 3 us = 6.667 us + 18 us
    # across: 2 (3/4) (2e6 / 4) / 50e9 + 2 * 3 * 10 us = 15 us + 60 us
    got = h100.all_reduce(E, Group([16], [2]))
    assert float(got[0]) == pytest.approx(3e6 / 450e9 + 18e-6 + 15e-6 + 60e-6, rel=1e-12)


def test_all_reduce_of_weight_gradients_uses_grad_bytes(h100):
    # 4e6 bytes: 2 (3/4) 4e6 / 450e9 + 18 us = 13.333 us + 18 us
    got = h100.all_reduce(E, Group([4], [1]), grad=True)
    assert float(got[0]) == pytest.approx(6e6 / 450e9 + 18e-6, rel=1e-12)


def test_all_reduce_latency_terms_and_zeros(h100):
    # One element over 8 in a node: the latency 2 * 7 * 3 us dominates; plus 2 (7/8) 2 / 450e9.
    got = h100.all_reduce(1, Group([8], [1]))
    assert float(got[0]) == pytest.approx(42e-6 + 3.5 / 450e9, rel=1e-12)
    # A group of one, or nothing to reduce: no collective at all.
    assert float(h100.all_reduce(E, Group([1], [1]))[0]) == 0.0
    assert float(h100.all_reduce(0, Group([4], [1]))[0]) == 0.0


def test_all_reduce_is_vectorised_over_configurations(h100):
    group = Group([[4], [4], [4], [1]], [[1], [8], [4], [1]])
    got = h100.all_reduce(np.array([E, E, E, E]), group)
    expected = [3e6 / 450e9 + 18e-6, 120e-6, 2e6 / 450e9 + 46e-6, 0.0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_one_node_is_the_spec_ring_on_a_group_in_a_node(h100):
    # A group of 8 with stride 1 lies in one node: the one-node ring formula exactly.
    q, n = 8, 2 * 12345.0
    expected = 2 * (q - 1) / q * n / 450e9 + 2 * (q - 1) * 3e-6
    assert float(h100.all_reduce(12345, Group([8], [1]))[0]) == pytest.approx(expected, rel=1e-12)


def test_exchange(h100):
    # 2e6 bytes in a node: 2e6 / 450e9 + 3 us; across nodes: 2e6 / 50e9 + 10 us = 50 us.
    got = h100.exchange(E, Group([[2], [2], [1], [2]], [[1], [8], [1], [1]]))
    np.testing.assert_allclose(got, [2e6 / 450e9 + 3e-6, 50e-6, 0.0, 2e6 / 450e9 + 3e-6], rtol=1e-12)
    assert float(h100.exchange(0, Group([2], [1]))[0]) == 0.0


def test_redistribute(h100):
    # Forward + backward volume of 1e6 elements: 2e6 bytes; one node (p <= 8): at 450 GB/s
    # plus two intra-node latencies; p = 16: at 50 GB/s plus two inter-node latencies.
    assert float(h100.redistribute(E, 8)) == pytest.approx(2e6 / 450e9 + 6e-6, rel=1e-12)
    assert float(h100.redistribute(E, 16)) == pytest.approx(2e6 / 50e9 + 20e-6, rel=1e-12)
    np.testing.assert_array_equal(h100.redistribute(np.array([[0.0, 0.0]]), 16), [[0.0, 0.0]])
    # p may vary per entry too.
    np.testing.assert_allclose(h100.redistribute([E, E, 0], [8, 16, 16]), [2e6 / 450e9 + 6e-6, 2e6 / 50e9 + 20e-6, 0])


# -- compute --------------------------------------------------------------------------------


def test_gemm_from_the_table(h100):
    table = MeasuredTables.load(PRESET_TABLES["h100-sxm"])
    # A grid point: the measured 518.4 us for 4096^3 (well above 6 * 4096^3 / 989e12 = 417 us).
    assert float(h100.gemm_seconds(1, 4096, 4096, 4096)) == pytest.approx(5.184e-4, rel=1e-12)
    q = np.array([[1, 640, 80, 5120], [640, 2048, 2048, 128], [3, 100, 7, 33]], dtype=np.float64)
    np.testing.assert_array_equal(h100.gemm(*q.T), np.maximum(table.gemm_seconds(*q.T), 6 * q.prod(axis=1) / 989e12))


def test_gemm_without_a_table_runs_at_peak(bare):
    # 6 * 2 * 1000 * 1000 * 1000 FLOP at 989e12 FLOP/s.
    assert float(bare.gemm_seconds(2, 1000, 1000, 1000)) == pytest.approx(12e9 / 989e12, rel=1e-12)
    with pytest.raises(ValueError, match="N must be positive"):
        bare.gemm_seconds(1, 1, 0, 1)


def test_memory_bound_per_kind(h100, bare):
    # Measured kinds: the table (gelu at 4096 elements: 3.171 us).
    assert float(h100.memory_bound("gelu", 4096, flops=123.0)) == pytest.approx(3.171e-6, rel=1e-12)
    assert float(h100.memory_bound("layer_norm", 1024)) == pytest.approx(6.81e-6, rel=1e-12)
    # pool, loss, copy: 4 elements of traffic at the best measured rate; at 1024 elements
    # that of add, 1.325 us for 3: 4 * 1.325 / 3 us.
    for kind in ("pool", "loss", "copy"):
        assert float(h100.memory_bound(kind, 1024)) == pytest.approx(4 * 1.325e-6 / 3, rel=1e-12)
    # Without a table: bytes over HBM: gelu 5 elements * 2 bytes per element, at 3350 GB/s.
    assert float(bare.memory_bound("gelu", 1e6)) == pytest.approx(5 * 2e6 / 3350e9, rel=1e-12)
    with pytest.raises(ValueError, match="unknown memory-bound kind 'relu'"):
        h100.memory_bound("relu", 10)


# -- the machine's identity ---------------------------------------------------------------------


def test_h100_preset_is_the_spec_example(h100):
    # The pricing fields are the example; the specification fields (per-dtype peaks, domain,
    # sources) come from pase/machines/data/presets.json (tests/test_presets.py).
    spec = {k: v for k, v in PRESETS["h100-sxm"].items() if k not in SPEC_FIELDS}
    assert spec == SPEC_EXAMPLE
    assert {k: v for k, v in load_description("h100-sxm").items() if k not in SPEC_FIELDS} == SPEC_EXAMPLE
    assert h100.describe() == load_description("h100-sxm")
    json.dumps(h100.describe())  # JSON-able
    assert h100.name == "h100-sxm" and h100.cost_unit == "seconds"
    # 81,559 MiB as the driver reports an H100 80GB HBM3: 79.65 x 2**30 = 85,523,536,281.6 bytes
    assert h100.devices_per_node == 8 and h100.memory_bytes == 79.65 * 1073741824
    assert MACHINE_NAMES[:2] == ("paper", "h100-sxm")


def test_describe_is_a_copy(h100):
    d = h100.describe()
    d["intra_node"]["gbps"] = 1
    assert h100.describe()["intra_node"]["gbps"] == 450


def test_check_procs(h100):
    for p in (1, 4, 8, 16, 64):
        h100.check_procs(p)
    with pytest.raises(ValueError, match=r"^12 devices do not fill whole nodes of 8 .*multiple of 8"):
        h100.check_procs(12)
    with pytest.raises(ValueError, match="positive integer"):
        h100.check_procs(0)


def test_paper_machine_and_tuning():
    assert load_machine("paper") == Machine()
    assert load_machine("paper", flops=20.0, bw=8.0) == Machine(20.0, 8.0)
    with pytest.raises(ValueError, match="paper machine only"):
        load_machine("h100-sxm", flops=20.0)
    assert isinstance(load_machine("h100-sxm"), CalibratedMachine)
    assert load_calibrated("h100-sxm").describe() == load_description("h100-sxm")


# -- descriptions from files and their checks --------------------------------------------------


def write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def test_a_file_with_a_relative_table(tmp_path):
    (tmp_path / "tables").mkdir()
    table = {"gemm": [[b, m, n, k, 1e-5 * b] for b in (1, 2) for m in (1, 2) for n in (1, 2) for k in (1, 2)],
             "memory_bound": [["add", 1024, 1e-6], ["add", 4096, 2e-6]]}
    write(tmp_path / "tables" / "mine.json", table)
    desc = dict(SPEC_EXAMPLE, name="mine", measured="tables/mine.json")
    m = load_machine(write(tmp_path / "mine.json", desc))
    assert m.name == "mine" and m.describe()["measured"] == "tables/mine.json"
    assert float(m.gemm_seconds(2, 1, 1, 1)) == pytest.approx(2e-5)
    assert load_description(str(tmp_path / "mine.json")) == desc


def test_a_file_without_a_table(tmp_path):
    desc = {k: v for k, v in SPEC_EXAMPLE.items() if k != "measured"}
    m = load_machine(write(tmp_path / "m.json", desc))
    assert m.tables is None


@pytest.mark.parametrize("change, message", [
    ({"name": None}, "missing field 'name'"),
    ({"devices_per_node": None}, "missing field 'devices_per_node'"),
    ({"memory_gib": None}, "missing field 'memory_gb' (or 'memory_gib'"),
    ({"memory_gb": 80}, "give memory_gb (1e9 bytes) or memory_gib (2**30 bytes), not both"),
    ({"peak_tflops": None}, "missing field 'peak_tflops'"),
    ({"hbm_gbps": None}, "missing field 'hbm_gbps'"),
    ({"intra_node": None}, "missing field 'intra_node'"),
    ({"inter_node": None}, "missing field 'inter_node'"),
    ({"act_bytes": None}, "missing field 'act_bytes'"),
    ({"grad_bytes": None}, "missing field 'grad_bytes'"),
    ({"inter_node": {"gbps": -5, "latency_us": 10}}, "inter_node.gbps must be a positive number, got -5"),
    ({"intra_node": {"gbps": 0, "latency_us": 3}}, "intra_node.gbps must be a positive number, got 0"),
    ({"intra_node": {"gbps": 450, "latency_us": -1}}, "intra_node.latency_us must be a non-negative number"),
    ({"inter_node": {"gbps": 50}}, "missing field inter_node.latency_us"),
    ({"inter_node": {"gbps": 50, "latency_us": 10, "hops": 2}}, "unknown field inter_node.hops"),
    ({"inter_node": 50}, "inter_node must be an object"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"devices_per_node": 0}, "devices_per_node must be a positive integer, got 0"),
    ({"devices_per_node": 7.5}, "devices_per_node must be a positive integer, got 7.5"),
    ({"devices_per_node": True}, "devices_per_node must be a positive integer"),
    ({"memory_gib": -80}, "memory_gib must be a positive number, got -80"),
    ({"memory_gib": None, "memory_gb": -80}, "memory_gb must be a positive number, got -80"),
    ({"peak_tflops": "989"}, "peak_tflops must be a positive number, got '989'"),
    ({"hbm_gbps": float("inf")}, "hbm_gbps must be a positive number"),
    ({"act_bytes": 0}, "act_bytes must be a positive number"),
    ({"grad_bytes": -4}, "grad_bytes must be a positive number"),
    ({"measured": 7}, "measured must be a non-empty string"),
    ({"attention_efficiency": 0}, "attention_efficiency must be a number in (0, 1]"),
    ({"attention_efficiency": -0.4}, "attention_efficiency must be a number in (0, 1]"),
    ({"attention_efficiency": 1.5}, "attention_efficiency must be a number in (0, 1]"),
    ({"attention_efficiency": "0.4"}, "attention_efficiency must be a number in (0, 1]"),
    ({"attention_efficiency": True}, "attention_efficiency must be a number in (0, 1]"),
    ({"attention_efficiency": float("nan")}, "attention_efficiency must be a number in (0, 1]"),
    ({"gpus": 8}, "unknown field 'gpus'"),
])
def test_every_bad_field_is_named(change, message):
    desc = {k: v for k, v in SPEC_EXAMPLE.items()}
    for key, value in change.items():
        if value is None:
            desc.pop(key)
        else:
            desc[key] = value
    with pytest.raises(ValueError) as info:
        validate_description(desc, "machine file x.json")
    assert str(info.value).startswith(f"machine file x.json: {message}")
    assert "\n" not in str(info.value)


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="No such file"):
        load_machine(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{name: 1}")
    with pytest.raises(ValueError, match=r"^machine file .*bad.json is not valid JSON"):
        load_machine(str(bad))
    bad.write_text("[" * 100000)  # hostile: nesting deep enough to exhaust the parser
    with pytest.raises(ValueError, match=r"^machine file .*bad.json is nested too deeply"):
        load_machine(str(bad))
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_machine(write(tmp_path / "list.json", [1, 2]))
    missing_table = write(tmp_path / "t.json", dict(SPEC_EXAMPLE, measured="gone.json"))
    with pytest.raises(ValueError, match=r"^machine file t.json: measured table 'gone.json' not found"):
        load_machine(missing_table)
    write(tmp_path / "broken.json", {"gemm": [[1, 1, 1, 1, -1]]})
    with pytest.raises(ValueError, match=r"^measured table broken.json: gemm row 0: seconds"):
        load_machine(write(tmp_path / "u.json", dict(SPEC_EXAMPLE, measured="broken.json")))
    with pytest.raises(ValueError, match=r"^unknown machine 'h200': not a preset \(paper, h100-sxm, a100-sxm, "):
        load_machine("h200")


def test_presets_ship_their_tables():
    for name, path in PRESET_TABLES.items():
        assert os.path.isfile(path), name
        assert os.path.basename(path) == PRESETS[name]["measured"]


# -- the fused attention kernel's efficiency -------------------------------------------------


def test_attention_efficiency_is_optional(bare, h100):
    assert bare.attention_efficiency is None and h100.attention_efficiency is None
    assert "attention_efficiency" not in h100.describe()
    m = CalibratedMachine(dict(SPEC_EXAMPLE, attention_efficiency=1))  # 1 is allowed: (0, 1]
    assert m.attention_efficiency == 1.0


def test_attention_efficiency_round_trips(tmp_path):
    desc = {k: v for k, v in SPEC_EXAMPLE.items() if k != "measured"}
    desc["attention_efficiency"] = 0.55
    path = write(tmp_path / "flash.json", desc)
    m = load_machine(path)
    assert m.attention_efficiency == 0.55
    assert m.describe()["attention_efficiency"] == 0.55
    assert load_description(path) == desc
    again = load_machine(write(tmp_path / "again.json", m.describe()))  # describe() loads back
    assert again.describe() == m.describe() and again.attention_efficiency == 0.55


def _attention_net(causal=True):
    """test_training's scores-softmax-context block (one definition of it)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_training import _attention_net as attention_net

    return attention_net(causal)


@pytest.mark.parametrize("efficiency", [None, 0.25, 0.7])
def test_a_machine_file_prices_fused_attention_at_its_efficiency(tmp_path, efficiency):
    from pase.costing.training import DEFAULT_ATTENTION_EFFICIENCY, TrainingCosting, TrainingOptions

    desc = {k: v for k, v in SPEC_EXAMPLE.items() if k != "measured"}
    desc["clock_mhz"] = {"boost": 1980, "base": 1590}  # a machine file's clocks: the same rule as a preset's
    if efficiency is not None:
        desc["attention_efficiency"] = efficiency
    m = load_machine(write(tmp_path / "m.json", desc))
    net = _attention_net(causal=True)
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, m)
    # Scores b h l m k = 2 2 8 8 4: forward 2 products of 2 FLOPs per multiply-add, halved
    # when causal; the backward runs 2.5 times the forward.
    flops = 2 * 2 * (2 * 2 * 8 * 8 * 4) / 2 * (1 + 2.5)
    # The description's clock (base 1590 over boost 1980 MHz = 0.803, a step's sustained clock)
    # slows every kernel of a step.
    expected = efficiency if efficiency is not None else DEFAULT_ATTENTION_EFFICIENCY
    assert costing.compute(0, TrainingOptions())[0] == pytest.approx(flops / (989e12 * expected * 1590 / 1980),
                                                                      rel=1e-12)


@pytest.mark.parametrize("field", ["act_bytes", "grad_bytes"])
def test_element_sizes_below_a_sixteenth_of_a_byte_are_refused(field):
    # 5e-324 bytes once passed, and the gradient's bytes over the machine's (2 / 5e-324) made
    # a time of inf x 0 = NaN with a RuntimeWarning on stderr.
    data = dict(load_description("h100-sxm"), **{field: 5e-324})
    with pytest.raises(ValueError, match=f"{field} must be at least 0.0625"):
        validate_description(data, "box.json")
    assert validate_description(dict(load_description("h100-sxm"), **{field: 0.5}), "box.json")[field] == 0.5
