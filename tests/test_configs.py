"""Tests of configuration enumeration (``docs/cost-model.md``, "Iteration spaces and configurations").

Rule: per dimension ``d``, the divisors ``e`` with ``d / e >= t`` (or only 1 if none);
Cartesian product; keep products ``<= p``. Forced-unsplit dimensions behave as size 1.
Ravel/Unravel keep only contiguous configurations. Counts are worked out by hand in the
comments, and a brute-force enumeration written here independently cross-checks the rest.
"""

import itertools

import numpy as np
import pytest

from graphs import alexnet, rnnlm
from pase.model.builder import GraphBuilder
from pase.model.configs import allowed_splits, check_config, divisors, enumerate_configs, is_contiguous
from pase.model.layers import Conv, Ravel, Unravel


def _brute_force(domain, procs, cutoff, unsplit=None, contiguous=False):
    """Independent enumeration straight from the spec's wording (slow, tiny inputs only)."""
    unsplit = unsplit or [False] * len(domain)
    per_dim = []
    for d, fixed in zip(domain, unsplit):
        size = 1 if fixed else d
        splits = [e for e in range(1, size + 1) if size % e == 0 and size // e >= cutoff]
        per_dim.append(splits or [1])
    out = []
    for c in itertools.product(*per_dim):
        if np.prod(c) > procs:
            continue
        if contiguous:
            # Fully split up to the first dim that is not; after that one, all unsplit.
            i = 0
            while i < len(c) and c[i] == domain[i]:
                i += 1
            if any(x != 1 for x in c[i + 1:]):
                continue
        out.append(tuple(c))
    return sorted(out)


def _rows(a):
    return [tuple(int(x) for x in row) for row in a]


# ----------------------------------------------------------------------------- divisors


def test_divisors():
    assert divisors(1) == [1]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(13) == [1, 13]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]  # perfect square: 6 once
    with pytest.raises(ValueError):
        divisors(0)


@pytest.mark.parametrize(
    "size, procs, cutoff, expected",
    [
        # 96 = 2^5 * 3: divisors 1,2,3,4,6,8,12,16,24,32,48,96; 96/e >= 4 -> e <= 24; e <= 8.
        (96, 8, 4, [1, 2, 3, 4, 6, 8]),
        (96, 32, 4, [1, 2, 3, 4, 6, 8, 12, 16, 24]),
        # 3 / e >= 4 holds for no divisor: unsplit only.
        (3, 8, 4, [1]),
        # 4/1 = 4 >= 4 but 4/2 = 2 < 4.
        (4, 8, 4, [1]),
        # 8/2 = 4 >= 4 but 8/4 = 2.
        (8, 8, 4, [1, 2]),
        # Cut-off 1: every divisor up to p.
        (12, 5, 1, [1, 2, 3, 4]),
        # 128 / 64 = 2 < 4: the cut-off forbids 64 ways (data parallel on 64 devices).
        (128, 64, 4, [1, 2, 4, 8, 16, 32]),
    ],
)
def test_allowed_splits(size, procs, cutoff, expected):
    assert allowed_splits(size, procs, cutoff) == expected


# ----------------------------------------------------------------------------- counts by hand


def test_two_dims_count_by_hand():
    # (4, 6), p = 4, t = 1: dim 0 splits {1, 2, 4}, dim 1 splits {1, 2, 3} (6 > p).
    # Pairs with product <= 4: (1,1) (1,2) (1,3) (2,1) (2,2) (4,1); (2,3)=6, (4,2)=8 ... excluded.
    C = enumerate_configs((4, 6), 4, 1)
    assert _rows(C) == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (4, 1)]
    assert C.dtype == np.int64 and C.shape == (6, 2)


def test_three_dims_count_by_hand():
    # (8, 8, 4), p = 8, t = 2: dims 0 and 1 allow {1, 2, 4} (8/8 = 1 < 2), dim 2 allows {1, 2}.
    # Products a*b of the first two: 1,2,4,2,4,8,4,8,16.
    # With c = 1: all but 16 -> 8 configurations; with c = 2: a*b <= 4 -> 1,2,4,2,4,4 -> 6.
    # Total 14.
    C = enumerate_configs((8, 8, 4), 8, 2)
    assert len(C) == 14
    assert (C.prod(axis=1) <= 8).all()
    assert _rows(C) == _brute_force((8, 8, 4), 8, 2)


def test_cutoff_leaves_small_dimension_unsplit():
    # d = 3 with t = 4: no divisor e has 3/e >= 4, so only (1,).
    assert _rows(enumerate_configs((3,), 8, 4)) == [(1,)]
    assert _rows(enumerate_configs((3,), 64, 4)) == [(1,)]
    # With t = 1 the same dimension splits 1 or 3 ways.
    assert _rows(enumerate_configs((3,), 8, 1)) == [(1,), (3,)]


def test_cutoff_on_96():
    # d = 96, t = 4: e <= 24 among the divisors; on p = 4: 1, 2, 3, 4; on p = 32: nine of them.
    assert _rows(enumerate_configs((96,), 4, 4)) == [(1,), (2,), (3,), (4,)]
    assert _rows(enumerate_configs((96,), 32, 4)) == [(e,) for e in (1, 2, 3, 4, 6, 8, 12, 16, 24)]
    # Without a cut-off, 32 itself also qualifies (96/32 = 3 >= 1).
    assert _rows(enumerate_configs((96,), 32, 1))[-1] == (32,)


def test_powers_of_two_count_by_hand():
    # (128, 256, 512) on p = 8, t = 1 (a Transformer Elementwise): each dim splits 1, 2, 4 or 8;
    # the exponents (a, b, c) >= 0 with a + b + c <= 3 number C(3 + 3, 3) = 20.
    assert len(enumerate_configs((128, 256, 512), 8, 1)) == 20


def test_product_at_most_p_and_idle_devices_allowed():
    C = enumerate_configs((6, 10, 4), 12, 1)
    products = C.prod(axis=1)
    assert (products <= 12).all()
    # Configurations that leave devices idle are valid: (1,1,1) and e.g. (1,5,2) = 10 < 12.
    rows = _rows(C)
    assert (1, 1, 1) in rows and (1, 5, 2) in rows
    # (3, 5, 1) = 15 > 12 is not.
    assert (3, 5, 1) not in rows
    assert rows == _brute_force((6, 10, 4), 12, 1)


def test_lexicographic_order():
    # First dimension slowest, split counts increasing.
    C = _rows(enumerate_configs((12, 8, 6), 16, 1))
    assert C == sorted(C)
    assert len(set(C)) == len(C)
    assert C[0] == (1, 1, 1)


@pytest.mark.parametrize(
    "domain, procs, cutoff",
    [
        ((12, 8, 6), 16, 1),
        ((16, 9, 10), 8, 2),
        ((227, 55, 4), 32, 4),
        ((1, 1, 1), 4, 1),
        ((64, 64), 64, 4),
        ((30, 7, 2, 8), 24, 1),
    ],
)
def test_matches_brute_force(domain, procs, cutoff):
    assert _rows(enumerate_configs(domain, procs, cutoff)) == _brute_force(domain, procs, cutoff)


def test_invalid_enumeration_arguments():
    with pytest.raises(ValueError):
        enumerate_configs((4,), 0)
    with pytest.raises(ValueError):
        enumerate_configs((4,), 4, 0)


# ----------------------------------------------------------------------------- forced unsplit


def test_forced_unsplit_dimensions_by_hand():
    # (8, 4, 6, 6) with dims 2 and 3 forced unsplit, p = 4, t = 1: dim 0 {1,2,4}, dim 1 {1,2,4}:
    # (1,1) (1,2) (1,4) (2,1) (2,2) (4,1), each followed by (1, 1).
    C = enumerate_configs((8, 4, 6, 6), 4, 1, unsplit=(False, False, True, True))
    assert _rows(C) == [(a, b, 1, 1) for a, b in [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1)]]
    # Without the restriction there are more (e.g. (1, 1, 2, 2)).
    assert (1, 1, 2, 2) in _rows(enumerate_configs((8, 4, 6, 6), 4, 1))


def test_conv_never_splits_ho_wo():
    g = GraphBuilder("conv", cutoff=1)
    x = g.input((8, 4, 6, 6), "x")
    conv = Conv(x, 4, 1)  # 1x1 kernel: domain (8, 4, 6, 6, 1, 1, 4)
    g.add("conv", conv)
    net = g.build()
    assert conv.domain == (8, 4, 6, 6, 1, 1, 4)
    assert conv.unsplit == (False, False, True, True, False, False, False)
    C = net.configs(4)[0]
    assert (C[:, 2] == 1).all() and (C[:, 3] == 1).all()
    # b, c, n each split among {1, 2, 4} with product <= 4: exponent triples with sum <= 2
    # number C(2 + 3, 3) = 10; r = s = 1 stay 1.
    assert len(C) == 10


def test_lstm_never_splits_sequence():
    net = rnnlm(128)
    lstm = net.layers[1]
    assert lstm.unsplit == (False, True, False, False, False)
    C = net.configs(8)[1]
    assert (C[:, 1] == 1).all()
    # (L=2, s=256, b=128, n=2048, k=2048), t = 1, p = 8: L in {1, 2}; b, n, k in {1, 2, 4, 8}.
    # Exponent sums: L contributes 0 or 1; the other three sum to <= 3 - l.
    # l = 0: C(3+3, 3) = 20; l = 1: C(2+3, 3) = 10. Total 30 (fixture rnnlm-p8 agrees).
    assert len(C) == 30


# ----------------------------------------------------------------------------- contiguity


def test_is_contiguous_hand_listed():
    domain = (4, 3, 2)
    cases = {
        (1, 1, 1): True,   # nothing split
        (2, 1, 1): True,   # first dim partially split, rest unsplit
        (4, 1, 1): True,   # first fully split
        # dim 0 full, dim 1 partial (2 != 3; contiguity only compares with full/unsplit),
        # dim 2 unsplit -> contiguous.
        (4, 2, 1): True,
        (4, 3, 1): True,   # two fully split, last unsplit
        (4, 3, 2): True,   # everything fully split
        (2, 3, 1): False,  # first partial, a later dim split
        (1, 3, 1): False,  # first unsplit (partial), second split
        (4, 1, 2): False,  # second partial (1 of 3), third split
        (1, 1, 2): False,
    }
    configs = np.array(list(cases))
    assert is_contiguous(configs, domain).tolist() == list(cases.values())


def test_contiguous_enumeration_by_hand():
    # (2, 4, 3), p = 8, t = 1. General rule gives dim 0 {1,2}, dim 1 {1,2,4}, dim 2 {1,3}.
    # Contiguous: c0 = 1 (partial) -> rest 1: (1,1,1).
    #             c0 = 2 (full) -> c1 in {1, 2} (partial) -> c2 = 1: (2,1,1), (2,2,1);
    #                              c1 = 4 (full) -> c2 in {1, 3}: (2,4,1); (2,4,3) = 24 > 8.
    C = _rows(enumerate_configs((2, 4, 3), 8, 1, contiguous=True))
    assert C == [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 4, 1)]
    general = _rows(enumerate_configs((2, 4, 3), 8, 1))
    # The general rule keeps 9 of the 2*3*2 = 12 products ((1,4,3), (2,2,3), (2,4,3) exceed 8);
    # the 5 rejected ones all split a later dim after a partial one:
    assert len(general) == 9
    rejected = sorted(set(general) - set(C))
    assert rejected == [(1, 1, 3), (1, 2, 1), (1, 2, 3), (1, 4, 1), (2, 1, 3)]
    # On p = 32 the fully split (2, 4, 3) joins.
    assert _rows(enumerate_configs((2, 4, 3), 32, 1, contiguous=True))[-1] == (2, 4, 3)
    assert len(enumerate_configs((2, 4, 3), 32, 1, contiguous=True)) == 5


def test_contiguous_with_cutoff_matches_brute_force():
    for domain, p, t in [((128, 256, 6, 6), 32, 4), ((16, 8, 4), 64, 2), ((6, 6), 36, 1)]:
        got = _rows(enumerate_configs(domain, p, t, contiguous=True))
        assert got == _brute_force(domain, p, t, contiguous=True)


def test_ravel_and_unravel_enumerate_contiguous_only():
    g = GraphBuilder("flat", cutoff=1)
    x = g.input((2, 4, 3), "x")
    flat = g.add("ravel", Ravel(x))
    g.add("unravel", Unravel(flat, (2, 4, 3)))
    net = g.build()
    assert net.layers[0].contiguous and net.layers[1].contiguous
    expected = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 4, 1)]  # as in the hand enumeration above
    assert _rows(net.configs(8)[0]) == expected
    assert _rows(net.configs(8)[1]) == expected


def test_alexnet_flatten_contiguous_configs_by_hand():
    # Ravel of (128, 256, 6, 6) on p = 8, t = 4: b splits {1,2,4,8}, c {1,..,8 divisors of 256
    # with 256/e >= 4} = {1,2,4,8}, h = w = 6: 6/e >= 4 only for e = 1.
    # Contiguous needs c = 1 unless b = 128 (never, 128 > 8): so (b, 1, 1, 1), b in {1,2,4,8}.
    net = alexnet(128)
    assert net.names[8] == "flatten.ravel"
    assert _rows(net.configs(8)[8]) == [(b, 1, 1, 1) for b in (1, 2, 4, 8)]


# ----------------------------------------------------------------------------- check_config


def test_check_config_accepts_non_enumerated():
    # Splitting a Conv's ho (forced unsplit in enumeration) or breaking the cut-off is valid.
    check_config((1, 1, 2, 1, 1, 1, 1), (8, 4, 6, 6, 3, 3, 4), 8)
    check_config((8,), (8,), 8)  # 8/8 = 1 < any cut-off > 1, still a valid split
    check_config((2, 3), (4, 6))  # no device limit given
    check_config(np.array([2, 3]), (4, 6), 6)  # numpy integers


@pytest.mark.parametrize(
    "config, domain, procs",
    [
        ((1, 1), (4, 6, 2), None),   # too few entries
        ((1, 1, 1), (4, 6), None),   # too many entries
        ((0, 1), (4, 6), None),      # zero split
        ((-2, 1), (4, 6), None),     # negative split
        ((1.5, 1), (4, 6), None),    # non-integer split
        ((True, 1), (4, 6), None),   # a bool is not a split count
        ((3, 1), (4, 6), None),      # 3 does not divide 4
        ((1, 4), (4, 6), None),      # 4 does not divide 6
        ((4, 3), (4, 6), 8),         # 12 devices > p = 8
    ],
)
def test_check_config_rejections(config, domain, procs):
    with pytest.raises(ValueError):
        check_config(config, domain, procs)


def test_check_config_product_equal_to_p_is_fine():
    check_config((2, 3), (4, 6), 6)
