"""Measured NCCL bus bandwidths (``pase/machines/collectives.py``), their measurement
(``pase/machines/collective_calibration.py``, ``pase calibrate --collectives``) and the pricing
that reads them (``CalibratedMachine.all_reduce``, ``all_to_all``).

Every expected number is worked out by hand in the comment beside it. No GPU: a fake timer stands
in for NCCL; one test runs the torch.distributed loop on two CPU processes with gloo.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from pase.cli.calibrate import main
from pase.machines.base import Group as _Group
from pase.machines.calibrated import PRESETS, CalibratedMachine, validate_description
from pase.machines.specs import SPEC_FIELDS
from pase.machines.collective_calibration import (
    _measure_with_torch,
    calibrate_collectives,
    collective_groups,
    collective_sizes,
    group_members,
    measure_collectives,
    torchrun_world,
)
from pase.machines.collectives import COLLECTIVE_KINDS, CollectiveTables, bus_factor, published_all_reduce
from pase.machines.registry import load_machine

BARE = {k: v for k, v in PRESETS["h100-sxm"].items() if k != "measured" and k not in SPEC_FIELDS}  # 450 / 50 GB/s, 3 / 10 us


def Group(sizes, strides):
    return _Group(np.atleast_2d(np.asarray(sizes, dtype=np.int64)), np.atleast_2d(np.asarray(strides, dtype=np.int64)))


# -- the table -------------------------------------------------------------------------------


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == 1.75          # 2 * 7/8
    assert bus_factor("all_reduce", 2) == 1.0
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(kind, 4) == 0.75              # 3/4
    assert bus_factor("send_recv", 2) == 1.0            # sendrecv_perf: busbw = algbw


CURVE = {"all_reduce": [[8, 1, 1e8, 400], [8, 1, 1e6, 100]]}  # rows in any order


def test_log_log_interpolation_between_sizes():
    t = CollectiveTables(CURVE)
    # 1e7 is halfway between 1e6 and 1e8 in log: busbw sqrt(100 * 400) = 200 GB/s;
    # t = 1.75 * 1e7 / 200e9 = 87.5 us.
    assert float(t.seconds("all_reduce", 1e7, 8, 1)) == pytest.approx(87.5e-6, rel=1e-12)
    # At the points: 1.75 * 1e6 / 100e9 = 17.5 us; 1.75 * 1e8 / 400e9 = 437.5 us.
    assert float(t.seconds("all_reduce", 1e6, 8, 1)) == pytest.approx(17.5e-6, rel=1e-12)
    assert float(t.seconds("all_reduce", 1e8, 8, 1)) == pytest.approx(437.5e-6, rel=1e-12)


def test_above_the_largest_message_the_bandwidth_holds():
    # 1e9 bytes at 400 GB/s: 1.75 * 1e9 / 400e9 = 4.375 ms.
    assert float(CollectiveTables(CURVE).seconds("all_reduce", 1e9, 8, 1)) == pytest.approx(4.375e-3, rel=1e-12)


def test_below_the_smallest_message_a_latency_and_a_rate():
    # Through (1e6, 17.5 us) and (1e8, 437.5 us): beta = 420 us / 99e6 B = 4.2424e-12 s/B,
    # alpha = 17.5 us - 4.2424 us = 13.2576 us; at 5e5 B: 13.2576 + 2.1212 = 15.3788 us.
    t = CollectiveTables(CURVE)
    assert float(t.seconds("all_reduce", 5e5, 8, 1)) == pytest.approx(15.378788e-6, rel=1e-6)
    # Nearly nothing moved: the latency alone (what gradient bucketing shares).
    assert float(t.seconds("all_reduce", 1e-9, 8, 1)) == pytest.approx(13.257576e-6, rel=1e-6)
    # One size only: no latency to read off, the bandwidth holds below too (1.75 * 1e3 / 100e9).
    one = CollectiveTables({"all_reduce": [[8, 1, 1e6, 100]]})
    assert float(one.seconds("all_reduce", 1e3, 8, 1)) == pytest.approx(17.5e-9, rel=1e-12)


def test_a_latency_is_never_negative():
    # Bandwidth falling with size: t1 - t0 over s1 - s0 is steeper than t0 / s0, so beta is clamped
    # to t0 / s0 = 1.75 / 400e9 and alpha to 0: below 1e6 the bandwidth of 1e6 holds.
    t = CollectiveTables({"all_reduce": [[8, 1, 1e6, 400], [8, 1, 2e6, 100]]})
    assert float(t.seconds("all_reduce", 5e5, 8, 1)) == pytest.approx(1.75 * 5e5 / 400e9, rel=1e-12)


def test_which_curves_price_a_group_inside_and_across_nodes():
    t = CollectiveTables({"all_reduce": [[2, 1, 1e6, 1], [8, 1, 1e6, 1], [2, 2, 1e6, 1], [16, 2, 1e6, 1],
                                         [64, 8, 1e6, 1]]})
    # Inside a node: every curve measured in one node, by log2 ranks.
    assert t.curves_for("all_reduce", 4, 1) == [(1.0, (2, 1)), (3.0, (8, 1))]
    # Across nodes: per node count the nearest ranks per node: 2 per node is nearer 1 (2 on 2 nodes)
    # than 8 (16 on 2 nodes); 6 per node nearer 8; ties to the larger group.
    assert t.curves_for("all_reduce", 4, 2) == [(1.0, (2, 2)), (3.0, (64, 8))]
    assert t.curves_for("all_reduce", 12, 2) == [(1.0, (16, 2)), (3.0, (64, 8))]
    assert t.curves_for("all_reduce", 32, 4) == [(1.0, (16, 2)), (3.0, (64, 8))]
    assert CollectiveTables({"all_reduce": [[8, 1, 1e6, 1]]}).curves_for("all_reduce", 16, 2) == []


def test_bus_bandwidth_is_interpolated_over_the_span():
    # In a node: 2 ranks at 100 GB/s, 8 at 400: 4 ranks is halfway in log2, sqrt(100 * 400) = 200 GB/s;
    # an all-gather of 1e8 bytes over 4: 3/4 * 1e8 / 200e9 = 375 us. Beyond 8 in a node it holds:
    # 8 ranks' 400 GB/s, 7/8 * 1e8 / 400e9 = 218.75 us for 8 (16 cannot be in one node of 8).
    t = CollectiveTables({"all_gather": [[2, 1, 1e8, 100], [8, 1, 1e8, 400]]})
    assert float(t.seconds("all_gather", 1e8, 4, 1)) == pytest.approx(375e-6, rel=1e-12)
    assert float(t.seconds("all_gather", 1e8, 8, 1)) == pytest.approx(218.75e-6, rel=1e-12)
    # Across nodes: 2 nodes 200 GB/s, 8 nodes 50. 4 nodes halfway: 100 GB/s; 32 ranks:
    # 31/32 * 1e8 / 100e9 = 968.75 us. Below 2 nodes nothing is measured across nodes... 2 is the
    # fewest: held. 16 nodes: the fall from 2 to 8 (a quarter over two doublings, slope -1 in
    # log-log) goes on: 25 GB/s, 127/128 * 1e8 / 25e9 = 3968.75 us.
    t = CollectiveTables({"all_gather": [[16, 2, 1e8, 200], [64, 8, 1e8, 50]]})
    assert float(t.seconds("all_gather", 1e8, 32, 4)) == pytest.approx(968.75e-6, rel=1e-12)
    assert float(t.seconds("all_gather", 1e8, 128, 16)) == pytest.approx(3968.75e-6, rel=1e-12)
    # A steeper fall is clamped to 1 / nodes: 2 nodes 400, 4 nodes 50 (an eighth for one doubling);
    # 8 nodes: 25 GB/s, not 6.25: 63/64 * 1e8 / 25e9 = 3937.5 us.
    steep = CollectiveTables({"all_gather": [[16, 2, 1e8, 400], [32, 4, 1e8, 50]]})
    assert float(steep.seconds("all_gather", 1e8, 64, 8)) == pytest.approx(3937.5e-6, rel=1e-12)
    # A bandwidth that rises with the nodes is held beyond the last (slope clamped to 0): 100 GB/s.
    rising = CollectiveTables({"all_gather": [[16, 2, 1e8, 50], [32, 4, 1e8, 100]]})
    assert float(rising.seconds("all_gather", 1e8, 64, 8)) == pytest.approx(63 / 64 * 1e8 / 100e9, rel=1e-12)


def test_one_size_takes_the_links_latency_below_it():
    # One size, 1e8 bytes over 16 on 2 nodes at 200 GB/s: t0 = 15/16 * 1e8 / 200e9 = 468.75 us. The
    # latency given for the group, 50 us, is the line's intercept: at 1e6 bytes
    # t = 50 + (468.75 - 50) * 1e6 / 1e8 = 54.1875 us.
    t = CollectiveTables({"all_gather": [[16, 2, 1e8, 200]]}, latency=lambda kind, r, n: 50e-6)
    assert float(t.seconds("all_gather", 1e6, 16, 2)) == pytest.approx(54.1875e-6, rel=1e-12)
    assert float(t.seconds("all_gather", 1e8, 16, 2)) == pytest.approx(468.75e-6, rel=1e-12)


def test_a_group_priced_from_another_size_keeps_the_bus_bandwidth():
    # 2 devices read the 8-device curve: busbw 100 GB/s at 1e6, factor 1 instead of 1.75: 10 us.
    t = CollectiveTables(CURVE)
    assert float(t.seconds("all_reduce", 1e6, 2, 1)) == pytest.approx(10e-6, rel=1e-12)
    # Size 1 or nothing moved: zero; no curve on the side: NaN.
    got = t.seconds("all_reduce", np.array([1e6, 0.0, 1e6]), np.array([1, 8, 16]), np.array([1, 1, 2]))
    assert got[0] == 0 and got[1] == 0 and math.isnan(got[2])


@pytest.mark.parametrize("collectives, message", [
    ([], "collectives must be a non-empty object of tables"),
    ({"broadcast": [[2, 1, 1, 1]]}, "unknown collective 'broadcast'"),
    ({"all_reduce": []}, "collectives.all_reduce must be a non-empty list of [ranks, nodes, bytes, bus_gbps] rows"),
    ({"all_reduce": [[2, 1, 1]]}, "collectives.all_reduce[0] must be [ranks, nodes, bytes, bus_gbps]"),
    ({"all_reduce": [[1, 1, 1e6, 1]]}, "collectives.all_reduce[0]: ranks must be an integer from 2"),
    ({"all_reduce": [[True, 1, 1e6, 1]]}, "ranks must be an integer"),
    ({"all_reduce": [[6, 4, 1e6, 1]]}, "nodes must be a positive integer dividing ranks 6, got 4"),
    ({"all_reduce": [[16, 1, 1e6, 1]]}, "16 ranks on 1 node(s) is more than devices_per_node 8"),
    ({"all_reduce": [[2, 1, 0, 1]]}, "bytes must be a number from 1"),
    ({"all_reduce": [[2, 1, 1e6, float("nan")]]}, "bus_gbps must be a positive number, got nan"),
    ({"all_reduce": [[2, 1, 1e6, 1e300]]}, "bus_gbps must be from"),
    ({"all_to_all": [[2, 1, 1e6, 1], [2, 1, 1e6, 2]]}, "collectives.all_to_all[1]: a second row for 2 ranks"),
])
def test_bad_tables_are_one_line(collectives, message):
    with pytest.raises(ValueError) as e:
        validate_description(dict(BARE, collectives=collectives), "machine file m.json")
    text = str(e.value)
    assert text.startswith("machine file m.json: ") and message in text and "\n" not in text


# -- pricing on a machine ----------------------------------------------------------------------


def test_all_reduce_uses_the_table_and_falls_back_to_the_links():
    m = CalibratedMachine(dict(BARE, collectives={"all_reduce": [[8, 1, 1e6, 100], [8, 1, 1e8, 400]]}))
    one_node = Group([[8]], [[1]])
    # 5e6 elements of 2 bytes = 1e7 bytes: 87.5 us (the interpolation test's point).
    assert float(m.all_reduce(5e6, one_node)[0]) == pytest.approx(87.5e-6, rel=1e-12)
    # A weight gradient, 4 bytes per element: 2.5e6 elements = 1e7 bytes, the same.
    assert float(m.all_reduce(2.5e6, one_node, grad=True)[0]) == pytest.approx(87.5e-6, rel=1e-12)
    # 16 devices on 2 nodes: no curve across nodes, the link model of docs/machines.md:
    # n = 1e7: 2 * 7/8 * 1e7 / 450e9 + 2*7*3us + 2 * 1/2 * 1.25e6 / 50e9 + 2*1*10us
    #        = 38.889 + 42 + 25 + 20 = 125.889 us.
    two_nodes = Group([[16]], [[1]])
    assert float(m.all_reduce(5e6, two_nodes)[0]) == pytest.approx(125.8889e-6, rel=1e-6)
    assert float(CalibratedMachine(BARE).all_reduce(5e6, two_nodes)[0]) == pytest.approx(125.8889e-6, rel=1e-6)
    assert float(m.all_reduce(5e6, Group([[1]], [[1]]))[0]) == 0.0
    assert "NCCL bus bandwidths for all_reduce" in m.header_line()
    assert "NCCL" not in CalibratedMachine(BARE).header_line()


def test_all_to_all_uses_its_own_table():
    m = CalibratedMachine(dict(BARE, collectives={"all_to_all": [[16, 2, 1e6, 80]]}))
    # 16 on 2 nodes, 1e6 bytes (5e5 elements): 15/16 * 1e6 / 80e9 = 11.71875 us.
    assert float(m.all_to_all(5e5, Group([[16]], [[1]]))[0]) == pytest.approx(11.71875e-6, rel=1e-12)
    # In a node there is no curve: the link model, 7/8 * 1e6 / 450e9 + 3 us = 4.9444 us.
    assert float(m.all_to_all(5e5, Group([[8]], [[1]]))[0]) == pytest.approx(4.94444e-6, rel=1e-5)
    # All-reduces have no table here: the links.
    assert float(m.all_reduce(5e5, Group([[8]], [[1]]))[0]) == float(CalibratedMachine(BARE).all_reduce(
        5e5, Group([[8]], [[1]]))[0])


def test_all_gather_and_reduce_scatter_read_their_own_curves():
    m = CalibratedMachine(dict(BARE, collectives={"all_gather": [[16, 2, 1e8, 200]],
                                                  "all_reduce": [[8, 1, 1e8, 400]]}))
    across, inside = Group([[16]], [[1]]), Group([[8]], [[1]])
    # 5e7 elements of 2 bytes over 16 on 2 nodes, the curve's own point: 15/16 * 1e8 / 200e9 = 468.75 us.
    assert float(m.all_gather(5e7, across)[0]) == pytest.approx(468.75e-6, rel=1e-12)
    # No reduce-scatter curve: half the all-reduce, which across nodes is the links' hierarchical ring:
    # (2 * 7/8 * 1e8 / 450e9 + 42 us + 2 * 1/2 * 1.25e7 / 50e9 + 20 us) / 2 = 350.4444 us.
    assert float(m.reduce_scatter(5e7, across)[0]) == pytest.approx(
        0.5 * (2 * 7 / 8 * 1e8 / 450e9 + 42e-6 + 1.25e7 / 50e9 + 20e-6), rel=1e-12)
    # In a node the measured all-reduce halves: 1.75 * 1e8 / 400e9 / 2 = 218.75 us, for both.
    assert float(m.all_gather(5e7, inside)[0]) == pytest.approx(218.75e-6, rel=1e-12)
    assert float(m.reduce_scatter(5e7, inside)[0]) == pytest.approx(218.75e-6, rel=1e-12)
    # A weight gradient at 4 bytes: 2.5e7 elements are the same 1e8 bytes.
    assert float(m.all_gather(2.5e7, across, grad=True)[0]) == pytest.approx(468.75e-6, rel=1e-12)
    # The one-size curve's latency is the links' ring: (8-1) 3 us + (2-1) 10 us = 31 us; at 1e6 bytes
    # 31 + (468.75 - 31) * 0.01 = 35.3775 us.
    assert float(m.all_gather(5e5, across)[0]) == pytest.approx(35.3775e-6, rel=1e-12)
    # Without tables both are exactly half the all-reduce, as every plan priced them before.
    bare = CalibratedMachine(BARE)
    for g in (across, inside):
        assert float(bare.all_gather(5e7, g)[0]) == 0.5 * float(bare.all_reduce(5e7, g)[0])
        assert float(bare.reduce_scatter(5e7, g, grad=True)[0]) == 0.5 * float(bare.all_reduce(5e7, g, grad=True)[0])


def test_send_recv_reads_its_curve_else_the_exchange():
    m = CalibratedMachine(dict(BARE, collectives={"send_recv": [[2, 2, 1e8, 20]]}))
    pair_across = Group([[2]], [[8]])   # stages 8 devices apart: two nodes
    pair_inside = Group([[2]], [[1]])
    # 5e7 elements = 1e8 bytes at 20 GB/s: 5 ms (bus factor 1).
    assert float(m.send_recv(5e7, pair_across)[0]) == pytest.approx(5e-3, rel=1e-12)
    # In a node no curve: the exchange, 1e8 / 450e9 + 3 us.
    assert float(m.send_recv(5e7, pair_inside)[0]) == pytest.approx(1e8 / 450e9 + 3e-6, rel=1e-12)
    assert float(CalibratedMachine(BARE).send_recv(5e7, pair_across)[0]) == float(
        CalibratedMachine(BARE).exchange(5e7, pair_across)[0])


def test_published_defaults_and_their_preset():
    rows = published_all_reduce()
    # 2 ranks in a node at 1 MB: t = 2 * 1 * 3 us + 1.0 * 1e6 / 450e9 = 8.2222 us, busbw 121.62 GB/s.
    assert rows[0] == [2, 1, 1000000, 121.62]
    # 16 ranks on 2 nodes at 1.024 GB: busbw 8 * 40 = 320 GB/s, latency 2*7*3 + 2*1*10 = 62 us:
    # t = 62 us + 1.875 * 1.024e9 / 320e9 = 6.062 ms; busbw 1.875 * 1.024e9 / 6.062e-3 = 316.73 GB/s.
    assert [16, 2, 1024000000, 316.73] in rows
    # 2 ranks on 2 nodes (one GPU each) at 1.024 GB: 40 GB/s, 20 us: t = 20 us + 25.6 ms = 25.62 ms;
    # busbw 1.024e9 / 25.62e-3 = 39.97 GB/s.
    assert [2, 2, 1024000000, 39.97] in rows
    m = load_machine("h100-sxm-nccl")
    assert m.collectives is not None and m.collectives.kinds == ("all_reduce",)
    # 16 devices on 2 nodes, 1.024e9 bytes: the row itself, 6.062 ms.
    assert float(m.all_reduce(5.12e8, Group([[16]], [[1]]))[0]) == pytest.approx(6.062e-3, rel=1e-4)
    # h100-sxm itself prices by its links (the docs' example, unchanged): 6.389 ms here
    # (2 * 7/8 * 1.024e9 / 450e9 + 42 us + 1.024e9 / 8 / 50e9 + 20 us).
    assert load_machine("h100-sxm").collectives is None
    assert float(load_machine("h100-sxm").all_reduce(5.12e8, Group([[16]], [[1]]))[0]) == pytest.approx(
        2 * 7 / 8 * 1.024e9 / 450e9 + 42e-6 + 1.024e9 / 8 / 50e9 + 20e-6, rel=1e-12)
    assert {k: v for k, v in m.describe().items() if k not in ("name", "collectives")} == {
        k: v for k, v in PRESETS["h100-sxm"].items() if k != "name"}


# -- measuring ---------------------------------------------------------------------------------


class FakeNccl:
    """NCCL on a fake node: every collective runs at 300 GB/s of bus bandwidth inside a node,
    40 per GPU of the group's node across nodes, plus 10 us."""

    def __init__(self):
        self.calls = []

    def __call__(self, kind, ranks, nodes, size):
        self.calls.append((kind, ranks, nodes, size))
        bus = 300e9 if nodes == 1 else 40e9 * (ranks // nodes)
        return 10e-6 + bus_factor(kind, ranks) * size / bus


def test_groups_sizes_and_members():
    assert collective_groups(8) == [(2, 1), (4, 1), (8, 1)]
    assert collective_groups(6) == [(2, 1), (4, 1), (6, 1)]
    assert collective_groups(8, nodes=3) == [(2, 1), (4, 1), (8, 1)] + [
        (q * m, m) for m in (2, 3) for q in (1, 2, 4, 8)]
    assert collective_sizes() == [10**6 * 2**i for i in range(11)]
    assert collective_sizes(quick=True) == [10**6, 4 * 10**6, 16 * 10**6, 64 * 10**6, 256 * 10**6, 1024 * 10**6]
    assert group_members(8, 1, 8) == list(range(8))
    assert group_members(6, 3, 4) == [0, 1, 4, 5, 8, 9]


def test_the_measuring_loop_by_hand():
    timer = FakeNccl()
    table = measure_collectives(timer, [(8, 1), (16, 2)], [10**6], ["all_reduce", "all_to_all"])
    assert timer.calls == [("all_reduce", 8, 1, 10**6), ("all_reduce", 16, 2, 10**6),
                           ("all_to_all", 8, 1, 10**6), ("all_to_all", 16, 2, 10**6)]
    # all_reduce, 8 in a node: t = 10 us + 1.75e6 / 300e9 = 15.8333 us; busbw 1.75e6 / t = 110.5 GB/s.
    # 16 on 2 nodes: t = 10 us + 1.875e6 / 320e9 = 15.859375 us; busbw 118.2 GB/s (4 digits).
    assert table["all_reduce"] == [[8, 1, 10**6, 110.5], [16, 2, 10**6, 118.2]]
    # all_to_all, 8 in a node: 10 us + 0.875e6 / 300e9 = 12.9167 us; busbw 67.74 GB/s.
    assert table["all_to_all"][0] == [8, 1, 10**6, 67.74]
    with pytest.raises(RuntimeError, match="took 0.0 seconds"):
        measure_collectives(lambda *a: 0.0, [(2, 1)], [10**6], ["all_reduce"])


def _description(tmp_path, **fields):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(dict(BARE, name="m", notes="measured by pase calibrate", **fields)))
    return path


def test_calibrate_collectives_writes_into_the_description(tmp_path):
    path = _description(tmp_path)
    timer = FakeNccl()
    description, where = calibrate_collectives(str(path), quick=True, timer=timer)
    assert len(timer.calls) == 5 * 3 * 6  # kinds x groups (2, 4, 8) x sizes
    assert where == "8 GPUs of one node; across nodes not measured"
    assert json.loads(path.read_text()) == description
    assert {k: v for k, v in description.items() if k not in ("collectives", "notes")} == dict(BARE, name="m")
    assert description["notes"] == ("measured by pase calibrate; collectives measured by pase calibrate "
                                     "--collectives --quick (8 GPUs of one node; across nodes not measured)")
    assert sorted(description["collectives"]) == sorted(COLLECTIVE_KINDS)
    # The largest all-reduce of 8: 10 us + 1.75 * 1.024e9 / 300e9 = 5.983333 ms, busbw 299.5 GB/s.
    assert [8, 1, 1024000000, 299.5] in description["collectives"]["all_reduce"]
    m = load_machine(str(path))
    # Priced back at a measured point: the timer's own seconds (to the 4 digits kept).
    assert float(m.all_reduce(5.12e8, Group([[8]], [[1]]))[0]) == pytest.approx(5.983333e-3, rel=1e-3)
    # Across nodes nothing was measured: the links.
    assert float(m.all_reduce(5.12e8, Group([[16]], [[1]]))[0]) == float(
        CalibratedMachine(BARE).all_reduce(5.12e8, Group([[16]], [[1]]))[0])
    # A second run replaces the table and its note.
    again, _ = calibrate_collectives(str(path), quick=True, timer=FakeNccl(), kinds=("all_reduce",))
    assert sorted(again["collectives"]) == ["all_reduce"] and again["notes"].count("collectives measured") == 1


def test_calibrate_collectives_across_nodes(tmp_path):
    path = _description(tmp_path, devices_per_node=2)
    description, where = calibrate_collectives(str(path), quick=True, timer=FakeNccl(), nodes=2,
                                               kinds=("all_reduce",))
    assert where == "2 GPUs on each of 2 nodes"
    groups = sorted({(r[0], r[1]) for r in description["collectives"]["all_reduce"]})
    assert groups == [(2, 1), (2, 2), (4, 2)]
    m = load_machine(str(path))
    # 4 devices on 2 nodes, 1.024e9 bytes: 10 us + 1.5 * 1.024e9 / 80e9 = 19.21 ms (busbw 79.96 kept).
    assert float(m.all_reduce(5.12e8, Group([[4]], [[1]]))[0]) == pytest.approx(19.21e-3, rel=1e-3)


def test_calibrate_collectives_needs_a_description(tmp_path):
    with pytest.raises(ValueError, match="no such machine description"):
        calibrate_collectives(str(tmp_path / "none.json"), timer=FakeNccl())


def test_torchrun_environment():
    assert torchrun_world({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}) == (0, 8, 0, 8)
    assert torchrun_world({"RANK": "0"}) is None
    with pytest.raises(ValueError, match="inconsistent torchrun environment"):
        torchrun_world({"RANK": "3", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"})


def test_torch_distributed_loop_on_two_cpu_processes(monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    table, where, writer = _measure_with_torch([4096, 65536], COLLECTIVE_KINDS, 2, "gloo")
    assert writer and where.startswith("2 GPUs of one node; across nodes not measured")
    for kind in COLLECTIVE_KINDS:
        assert [row[:3] for row in table[kind]] == [[2, 1, 4096], [2, 1, 65536]]
        assert all(row[3] > 0 for row in table[kind])


# -- the command line --------------------------------------------------------------------------


def run(argv, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out, err, **kwargs)
    return status, out.getvalue(), err.getvalue()


def test_main_collectives(tmp_path):
    path = _description(tmp_path)
    status, out, err = run(["--collectives", "--quick", "--out", str(path)], collective_timer=FakeNccl())
    assert status == 0, err
    assert out == (f"wrote the collectives of {path} (90 rows, 8 GPUs of one node; across nodes not measured; "
                   f"all-reduce up to 299.5 GB/s bus bandwidth in a node); use --machine {path}\n")
    assert load_machine(str(path)).collectives.kinds == COLLECTIVE_KINDS


@pytest.mark.parametrize("extra, message", [
    (["--name", "x"], "--name sets a description field; --collectives measures the collectives only"),
    (["--inter-gbps", "50"], "--inter-gbps sets a description field"),
    (["--no-attention"], "--no-attention sets a description field"),
])
def test_main_collectives_refuses_description_flags(tmp_path, extra, message):
    status, out, err = run(["--collectives", "--out", str(_description(tmp_path))] + extra,
                           collective_timer=FakeNccl())
    assert status == 2 and out == "" and message in err and err.count("\n") == 1


def test_main_collectives_needs_an_existing_description(tmp_path):
    status, _, err = run(["--collectives", "--out", str(tmp_path / "new.json")], collective_timer=FakeNccl())
    assert status == 2 and "--collectives adds to an existing machine description" in err and err.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(BARE, devices_per_node=0)))
    status, _, err = run(["--collectives", "--out", str(bad)], collective_timer=FakeNccl())
    assert status == 1 and "devices_per_node must be a positive integer" in err and err.count("\n") == 1


def test_main_collectives_without_torch_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    status, out, err = run(["--collectives", "--out", str(_description(tmp_path))])
    assert status == 1 and out == "" and err.count("\n") == 1 and "needs PyTorch" in err


def test_a_torchrun_rank_other_than_0_writes_nothing(tmp_path, monkeypatch):
    import pase.machines.collective_calibration as cc

    monkeypatch.setattr(cc, "_measure_with_torch", lambda sizes, kinds, processes, backend: (
        {"all_reduce": [[2, 1, 10**6, 1.0]]}, "2 GPUs on each of 2 nodes (torchrun)", False))
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    # No description on this node: rank 1 measures with the others and writes nothing.
    assert calibrate_collectives(str(tmp_path / "absent.json")) == (None, "2 GPUs on each of 2 nodes (torchrun)")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(cc, "_measure_with_torch", lambda sizes, kinds, processes, backend: (
        {"all_reduce": [[4, 2, 10**6, 80.0]]}, "2 GPUs on each of 2 nodes (torchrun)", True))
    path = _description(tmp_path, devices_per_node=2)
    description, _ = calibrate_collectives(str(path))
    assert description["collectives"] == {"all_reduce": [[4, 2, 10**6, 80.0]]}


def test_main_refuses_an_inconsistent_torchrun_environment(tmp_path, monkeypatch):
    for name, value in (("RANK", "5"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    status, _, err = run(["--collectives", "--out", str(_description(tmp_path))])
    assert status == 2 and "inconsistent torchrun environment: RANK 5, WORLD_SIZE 4" in err and err.count("\n") == 1
