"""Measured tables (``pase/measured.py``): loading, checks, interpolation, holes, extrapolation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pase.machines.base import MEMORY_BOUND_KINDS
from pase.machines.measured import ELEMENT_TRAFFIC, MeasuredTables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "pase", "machines", "data", "h100-sxm-measured.json")


@pytest.fixture(scope="module")
def shipped():
    return MeasuredTables.load(SHIPPED)


@pytest.fixture(scope="module")
def shipped_rows():
    with open(SHIPPED) as f:
        return json.load(f)


def table_of(f, B=(1, 2), M=(1, 2), N=(1, 2), K=(1, 2), drop=()):
    """A GEMM table with seconds ``f(b, m, n, k)`` on a grid, without the shapes in ``drop``."""
    return MeasuredTables([
        [b, m, n, k, f(b, m, n, k)]
        for b in B for m in M for n in N for k in K if (b, m, n, k) not in drop
    ])


# -- the shipped table -------------------------------------------------------------------


def test_shipped_table_is_the_reference_measurement(shipped_rows, shipped):
    assert shipped_rows["device"] == "NVIDIA H100 80GB HBM3"
    assert len(shipped_rows["gemm"]) == 10102  # reference/README.md
    assert shipped.kinds == ("add", "gelu", "layer_norm", "softmax")


def test_grid_points_return_the_measurement(shipped_rows, shipped):
    rows = np.array(shipped_rows["gemm"][::37], dtype=np.float64)
    got = shipped.gemm_seconds(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
    np.testing.assert_allclose(got, rows[:, 4], rtol=1e-12)
    for op, elements, seconds in shipped_rows["memory_bound"]:
        assert shipped.memory_bound_seconds(op, elements) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("axis", [1, 2, 3])
def test_between_two_grid_points_the_time_lies_between_theirs(shipped, axis):
    # Along one axis the interpolation is a convex combination of the two neighbours.
    rng = np.random.default_rng(axis)
    B = rng.choice([1, 4, 32, 256], 200)
    top = np.where(B == 1, 13, 10)
    exps = rng.integers(0, top[:, None] + 1, size=(200, 3))
    shape = np.column_stack([B, 2.0 ** exps]).astype(np.float64)
    lo, hi, mid = shape.copy(), shape.copy(), shape.copy()
    hi[:, axis] *= 2
    mid[:, axis] *= 1.5
    t_lo, t_hi, t_mid = (shipped.gemm_seconds(*s.T) for s in (lo, hi, mid))
    assert np.all(t_mid >= np.minimum(t_lo, t_hi) - 1e-18)
    assert np.all(t_mid <= np.maximum(t_lo, t_hi) + 1e-18)


def test_the_4gb_hole_at_b_2048_lies_between_flat_and_proportional(shipped):
    # (2048, 2048, 2048, 2048) was not measured (tensors over 4 GB). Filled from below along
    # B (and M, N, K) at a rate between 0 and the average rate there: never cheaper than
    # B = 256 and never more than 8x it (efficiency does not drop).
    t256 = shipped.gemm_seconds(256, 2048, 2048, 2048)
    t2048 = shipped.gemm_seconds(2048, 2048, 2048, 2048)
    assert t256 < t2048 <= 8 * t256
    assert t2048 >= 6 * 2048.0 ** 4 / 989e12  # not faster than the device's peak


# -- hand-worked interpolation -------------------------------------------------------------


def test_linear_in_each_size_between_grid_points():
    # T = M microseconds on M in {4, 8} (B, N, K have no effect). M = 5 is a quarter of the
    # way: 4 + (8 - 4) / 4 = 5 us; M = 6: 6 us. (Log-log would give 4 * 1.25 ** 1.32 = 5.34.)
    t = table_of(lambda b, m, n, k: 1e-6 * m, M=(4, 8))
    np.testing.assert_allclose(t.gemm_seconds(1, [5, 6], 1, 1), [5e-6, 6e-6], rtol=1e-12)


def test_multi_affine_times_are_reproduced_exactly_off_the_grid():
    # A launch floor plus work plus traffic is affine in each size separately, so
    # multilinear interpolation is exact anywhere inside the grid.
    def f(b, m, n, k):
        return 5e-6 + 1e-12 * b * m * n * k + 1e-11 * b * (m * k + k * n + m * n)

    t = table_of(f, B=(1, 4), M=(2, 8), N=(2, 8), K=(2, 8))
    q = np.array([[2, 3, 5, 4], [3, 7, 2, 6], [1, 2, 8, 3]], dtype=np.float64)
    np.testing.assert_allclose(t.gemm_seconds(*q.T), [f(*row) for row in q], rtol=1e-12)


def test_arguments_broadcast():
    t = table_of(lambda b, m, n, k: 1e-6 * b * m)
    assert t.gemm_seconds(np.ones((3, 1)), [[1, 2]], 1, 1).shape == (3, 2)
    assert np.shape(t.gemm_seconds(1, 2, 1, 1)) == ()
    # Floats are sizes too (per-device sizes come as float arrays).
    assert float(t.gemm_seconds(1.0, 1.5, 1.0, 1.0)) == pytest.approx(1.5e-6)


# -- beyond the grid ----------------------------------------------------------------------


def test_extrapolation_continues_at_the_marginal_rate():
    # M = 1: 10 us, M = 2: 15 us: 5 us per unit of M, under the average rate 15 / 2 = 7.5.
    # M = 4: 15 + 2 * 5 = 25 us; M = 10: 15 + 8 * 5 = 55 us.
    t = table_of(lambda b, m, n, k: {1: 10e-6, 2: 15e-6}[m])
    np.testing.assert_allclose(t.gemm_seconds(1, [4, 10], 1, 1), [25e-6, 55e-6], rtol=1e-12)


def test_extrapolation_rate_is_capped_at_the_average_rate():
    # M = 1: 10 us, M = 2: 40 us: marginal 30 us per unit, above the average 40 / 2 = 20:
    # capped, M = 4 costs 40 + 2 * 20 = 80 us (constant efficiency beyond the grid).
    t = table_of(lambda b, m, n, k: {1: 10e-6, 2: 40e-6}[m])
    assert float(t.gemm_seconds(1, 4, 1, 1)) == pytest.approx(80e-6, rel=1e-12)


def test_extrapolation_never_gets_cheaper_and_below_the_grid_stays_flat():
    # M = 4: 20 us, M = 8: 10 us (noise): the rate is clipped at 0, M = 64 costs 10 us.
    # Below the smallest size the time stays at its value there: M = 1 costs 20 us.
    t = table_of(lambda b, m, n, k: {4: 20e-6, 8: 10e-6}[m], M=(4, 8))
    np.testing.assert_allclose(t.gemm_seconds(1, [64, 1, 2], 1, 1), [10e-6, 20e-6, 20e-6], rtol=1e-12)


# -- holes --------------------------------------------------------------------------------


def test_an_interior_hole_is_interpolated_not_copied():
    # T = B * M us; (1, 2, 1, 1) missing. Along M its neighbours give 1 + (4 - 1) / 3 = 2 us
    # (the true value); copying the B = 2 neighbour would give 4 us.
    t = table_of(lambda b, m, n, k: 1e-6 * b * m, M=(1, 2, 4), drop={(1, 2, 1, 1)})
    assert float(t.gemm_seconds(1, 2, 1, 1)) == pytest.approx(2e-6, rel=1e-12)


def test_a_hole_at_the_top_is_extrapolated_from_below():
    # T = B * M us; M = 4 missing at B = 2 (like the 4 GB gap): from M = 1, 2 at B = 2
    # (2, 4 us): rate 2 us per unit, cap 4 / 2 = 2: 4 + 2 * 2 = 8 us, the true value.
    drop = {(2, 4, n, k) for n in (1, 2) for k in (1, 2)}
    t = table_of(lambda b, m, n, k: 1e-6 * b * m, M=(1, 2, 4), drop=drop)
    assert float(t.gemm_seconds(2, 4, 1, 1)) == pytest.approx(8e-6, rel=1e-12)


def test_a_hole_next_to_holes_waits_for_them():
    # T = B (M + N) us on M in {1, 2, 4, 8}, N in {1, 2, 4}; holes (M, N) = (2, 2), (4, 1)
    # and (4, 2) at every B, K. (2, 2) and (4, 1) interpolate at once (4 B and 5 B us);
    # (4, 2) has only copies until then, and afterwards interpolates: 6 B us exactly.
    drop = {(b, m, n, k) for b in (1, 2) for k in (1, 2) for m, n in ((2, 2), (4, 1), (4, 2))}
    t = table_of(lambda b, m, n, k: 1e-6 * b * (m + n), M=(1, 2, 4, 8), N=(1, 2, 4), drop=drop)
    np.testing.assert_allclose(t.gemm_seconds(2, [2, 4, 4], [2, 1, 2], 1), [8e-6, 10e-6, 12e-6], rtol=1e-12)


# -- memory-bound work --------------------------------------------------------------------


def test_memory_bound_interpolation_by_hand(shipped):
    # gelu: 1024 -> 3.201 us, 4096 -> 3.171 us; 2560 is half-way: 3.186 us.
    assert float(shipped.memory_bound_seconds("gelu", 2560)) == pytest.approx(3.186e-6, rel=1e-12)
    # Below 1024 the launch floor; zero elements, no kernel.
    np.testing.assert_allclose(shipped.memory_bound_seconds("gelu", [1, 0]), [3.201e-6, 0.0])
    # Past 2^30: 2^28 -> 897.5 us, 2^30 -> 3584 us; rate (3584 - 897.5) us / (2^30 - 2^28),
    # under the average 3584 us / 2^30; at 2^31: 3584 us + 2^30 * rate.
    rate = (3.584e-3 - 8.975e-4) / (2 ** 30 - 2 ** 28)
    assert float(shipped.memory_bound_seconds("gelu", 2 ** 31)) == pytest.approx(3.584e-3 + 2 ** 30 * rate, rel=1e-12)


def test_unmeasured_kinds_stream_at_the_best_measured_rate(shipped):
    # Per element of traffic at 1024 elements: add 1.325/3 = 0.4417 us, gelu 3.201/5,
    # layer_norm 6.81/5, softmax 7.894/5: add is best; copy moves 4: 4 * 1.325 / 3 us.
    assert float(shipped.streaming_seconds(4, 1024)) == pytest.approx(4 * 1.325e-6 / 3, rel=1e-12)
    # At 2^30: add 2237/3 = 745.7 us, gelu 3584/5 = 716.8 us (best), the others slower.
    assert float(shipped.streaming_seconds(4, 2 ** 30)) == pytest.approx(4 * 3.584e-3 / 5, rel=1e-12)
    assert set(ELEMENT_TRAFFIC) == set(MEMORY_BOUND_KINDS)


# -- checks -------------------------------------------------------------------------------

GOOD = [[b, m, 1, k, 1e-5] for b in (1, 2) for m in (1, 2) for k in (1, 2)] + \
       [[b, m, 2, k, 2e-5] for b in (1, 2) for m in (1, 2) for k in (1, 2)]


@pytest.mark.parametrize("data, message", [
    ([], "JSON object"),
    ({}, "missing field 'gemm'"),
    ({"gemm": []}, "non-empty list"),
    ({"gemm": "rows"}, "non-empty list"),
    ({"gemm": [[1, 1, 1, 1]]}, "row 0 must be [B, M, N, K, seconds]"),
    ({"gemm": [[0, 1, 1, 1, 1e-5]]}, "positive integers"),
    ({"gemm": [[1, 1.5, 1, 1, 1e-5]]}, "positive integers"),
    ({"gemm": [[1, True, 1, 1, 1e-5]]}, "positive integers"),
    ({"gemm": [[1, 1, 1, 1, -1e-5]]}, "seconds must be a positive number"),
    ({"gemm": [[1, 1, 1, 1, "fast"]]}, "seconds must be a positive number"),
    ({"gemm": [[1, 1, 1, 1, float("nan")]]}, "seconds must be a positive number"),
    ({"gemm": GOOD + [GOOD[3]]}, "row 16 repeats the shape"),
    ({"gemm": [r for r in GOOD if r[0] == 1]}, "at least two values of B"),
    ({"gemm": GOOD, "memory_bound": [["add", 1024]]}, "memory_bound row 0 must be"),
    ({"gemm": GOOD, "memory_bound": [["", 1024, 1e-6]]}, "op must be a name"),
    ({"gemm": GOOD, "memory_bound": [["add", 0, 1e-6]]}, "elements must be a positive integer"),
    ({"gemm": GOOD, "memory_bound": [["add", 1024, 0]]}, "seconds must be a positive number"),
    ({"gemm": GOOD, "memory_bound": [["add", 1024, 1e-6], ["add", 1024, 2e-6]]}, "repeats 'add'"),
    ({"gemm": GOOD, "memory_bound": [["add", 1024, 1e-6]]}, "'add' needs at least two sizes"),
])
def test_bad_tables_are_refused_with_the_reason(data, message):
    with pytest.raises(ValueError, match="^t.json: .*") as info:
        MeasuredTables.from_dict(data, "t.json")
    assert message in str(info.value)


def test_bad_queries_are_refused(shipped):
    with pytest.raises(ValueError, match="M must be positive"):
        shipped.gemm_seconds(1, [4, 0], 4, 4)
    with pytest.raises(ValueError, match="K must be positive"):
        shipped.gemm_seconds(1, 4, 4, float("nan"))
    with pytest.raises(ValueError, match="no memory_bound rows for 'pool'"):
        shipped.memory_bound_seconds("pool", 1024)
    with pytest.raises(ValueError, match="non-negative"):
        shipped.memory_bound_seconds("add", -1)


def test_file_errors_are_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match="No such file"):
        MeasuredTables.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"gemm": [1, 2,')
    with pytest.raises(ValueError, match=r"^measured table .*bad.json is not valid JSON: .*line 1"):
        MeasuredTables.load(str(bad))
    bad.write_text('{"gemm": [[' + "7" * 5000 + "]]}")  # hostile: an integer too long to convert
    with pytest.raises(ValueError, match=r"^measured table .*bad.json is not valid input JSON"):
        MeasuredTables.load(str(bad))


def test_round_trip_through_the_json_layout(shipped):
    again = MeasuredTables.from_dict(json.loads(json.dumps(shipped.to_dict())))
    q = np.array([[1, 640, 80, 5120], [640, 2048, 2048, 128], [3, 100, 7, 33]], dtype=np.float64)
    np.testing.assert_array_equal(again.gemm_seconds(*q.T), shipped.gemm_seconds(*q.T))


def test_tables_are_read_only(shipped):
    with pytest.raises(ValueError):
        shipped._gemm.values[0, 0, 0, 0] = 1.0
