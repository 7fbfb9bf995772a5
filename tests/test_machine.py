"""Tests of ``pase.machines.paper.Machine`` against ``docs/cost-model.md`` ("Machine").

``rho = (F * 1000) / (B / 8)``, ``comm(w) = rho * w`` and the ring all-reduce
``AR(w, q) = rho * (w / q) * 2 * (q - 1)``; every expected value below is worked out by hand.
"""

import math

import numpy as np
import pytest

from pase.machines.paper import WORD_BYTES, Machine
from pase.machines.base import Group


def test_word_is_eight_bytes():
    assert WORD_BYTES == 8


@pytest.mark.parametrize(
    "flops, bw, rho",
    [
        # Defaults: 10 TFLOPS = 10000 GFLOP/s; 16 GB/s = 2 Gword/s; 10000 / 2 = 5000.
        (10.0, 16.0, 5000.0),
        # 1 TFLOPS = 1000 GFLOP/s; 8000 GB/s = 1000 Gword/s: rho = 1.
        (1.0, 8000.0, 1.0),
        # 1000 GFLOP/s over 4000/8 = 500 Gword/s: rho = 2.
        (1.0, 4000.0, 2.0),
        # 2500 GFLOP/s over 20/8 = 2.5 Gword/s: rho = 1000.
        (2.5, 20.0, 1000.0),
        # 14000 GFLOP/s over 12/8 = 1.5 Gword/s: rho = 28000/3.
        (14.0, 12.0, 28000.0 / 3.0),
        # Integers are accepted: 5000 / (40/8 = 5) = 1000.
        (5, 40, 1000.0),
    ],
)
def test_rho_hand_computed(flops, bw, rho):
    assert Machine(flops, bw).rho == pytest.approx(rho, rel=1e-12)


def test_default_machine_is_10_tflops_16_gbs():
    m = Machine()
    assert (m.flops, m.bw) == (10.0, 16.0)
    assert m.rho == 5000.0


def test_rho_scales_with_flops_and_inverse_bandwidth():
    # Doubling F doubles rho; doubling B halves it (rho = 1000 F * 8 / B).
    base = Machine(3.0, 24.0).rho  # 3000 / 3 = 1000
    assert base == pytest.approx(1000.0)
    assert Machine(6.0, 24.0).rho == pytest.approx(2000.0)
    assert Machine(3.0, 48.0).rho == pytest.approx(500.0)


def test_comm_scalar_and_array():
    m = Machine()  # rho = 5000
    assert m.comm(3) == 15000.0
    assert m.comm(0) == 0.0
    np.testing.assert_allclose(m.comm(np.array([1.0, 2.5, 10.0])), [5000.0, 12500.0, 50000.0])
    assert Machine(1.0, 4000.0).comm(7) == 14.0  # rho = 2


@pytest.mark.parametrize(
    "flops, bw, words, q, expected",
    [
        # rho 5000: 5000 * (8/4) * 2 * 3 = 60000.
        (10.0, 16.0, 8.0, 4, 60000.0),
        # rho 1: (12/3) * 2 * 2 = 16.
        (1.0, 8000.0, 12.0, 3, 16.0),
        # rho 1: (10/2) * 2 * 1 = 10.
        (1.0, 8000.0, 10.0, 2, 10.0),
        # rho 2: 2 * (9/3) * 2 * 2 = 24.
        (1.0, 4000.0, 9.0, 3, 24.0),
        # rho 1, q = 8: (16/8) * 2 * 7 = 28.
        (1.0, 8000.0, 16.0, 8, 28.0),
        # q = 1: nothing to reduce.
        (10.0, 16.0, 123.0, 1, 0.0),
        (1.0, 8000.0, 1.0, 1, 0.0),
    ],
)
def test_ring_all_reduce_hand_computed(flops, bw, words, q, expected):
    assert float(Machine(flops, bw).all_reduce(words, Group.flat(q))[0]) == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_all_reduce_single_device_is_exactly_zero():
    m = Machine()
    assert float(m.all_reduce(1e12, Group.flat(1))[0]) == 0.0


def test_all_reduce_broadcasts_over_arrays():
    m = Machine(1.0, 8000.0)  # rho = 1
    words = np.array([10.0, 12.0, 16.0, 5.0])
    q = np.array([2, 3, 8, 1])
    # 10/2*2*1 = 10; 12/3*2*2 = 16; 16/8*2*7 = 28; q = 1 -> 0.
    np.testing.assert_allclose(m.all_reduce(words, Group.flat(q)), [10.0, 16.0, 28.0, 0.0])
    # A scalar word count against several device counts: 6/q * 2 (q-1) for q = 1, 2, 3, 6.
    np.testing.assert_allclose(m.all_reduce(6.0, Group.flat(np.array([1, 2, 3, 6]))), [0.0, 6.0, 8.0, 10.0])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"flops": 0},
        {"flops": -1.0},
        {"flops": float("nan")},
        {"flops": float("inf")},
        {"flops": "10"},
        {"flops": None},
        {"flops": True},
        {"bw": 0},
        {"bw": -16.0},
        {"bw": float("nan")},
        {"bw": float("inf")},
        {"bw": "16"},
        {"bw": False},
    ],
)
def test_invalid_flops_or_bandwidth_rejected(kwargs):
    with pytest.raises(ValueError):
        Machine(**kwargs)


def test_machine_is_immutable_value():
    m = Machine(2.0, 8.0)
    assert m == Machine(2.0, 8.0)
    with pytest.raises(Exception):
        m.flops = 3.0  # frozen dataclass
    # rho = 2000 / 1 = 2000 whatever was attempted above.
    assert m.rho == 2000.0
    assert math.isfinite(m.rho)


def test_every_machine_kind_implements_the_protocol():
    # A machine kind is one module implementing pase.machines.base.Machine and one registry entry.
    from pase.machines.base import Machine as MachineProtocol
    from pase.machines.registry import PRESETS, load_machine

    for name in PRESETS:
        assert isinstance(load_machine(name), MachineProtocol), name
