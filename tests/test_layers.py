"""Hand-worked tests of every layer type of ``docs/cost-model.md`` ("Layer types").

Each layer gets a tiny shape and a few configurations whose cost is worked out by hand
in a comment, with its compute, all-reduce and halo/hand-over terms written separately.
The machines are chosen so the arithmetic is easy:

- ``RHO1 = Machine(flops=1, bw=8000)``: rho = 1 * 1000 / (8000 / 8) = 1000 / 1000 = 1;
- ``RHO2 = Machine(flops=1, bw=4000)``: rho = 1000 / (4000 / 8) = 1000 / 500 = 2.

Notation: ``AR(w, q) = rho * (w / q) * 2 * (q - 1)``; GEMM cost
``Bp * (3 Mp Np Kp + 3 pw Mp Np + AR(Mp Np, k) + AR(Mp Kp, n) + AR(Np Kp, m))``.

Tensor configurations (``input_configs`` / ``output_configs``) are checked with a made-up
configuration row of distinct primes, so each column's destination is visible.
"""

import numpy as np
import pytest

from pase.model.builder import GraphBuilder
from pase.model.layers import (
    FC,
    LAYER_TYPES,
    LSTM,
    BatchNorm,
    Concat,
    Conv,
    Einsum,
    Elementwise,
    Embedding,
    Norm,
    Pooling,
    Ravel,
    ReduceMean,
    RMSNorm,
    Roll,
    Softmax,
    SoftmaxCrossEntropy,
    Stack,
    Unravel,
    Unstack,
    gemm_cost,
)
from pase.machines.base import Group
from pase.machines.paper import Machine

RHO1 = Machine(1.0, 8000.0)
RHO2 = Machine(1.0, 4000.0)


def test_easy_machines():
    assert RHO1.rho == 1.0
    assert RHO2.rho == 2.0


def _inputs(*shapes, letters=None):
    """Graph inputs of one fresh builder (layers need tensors of a single graph)."""
    g = GraphBuilder("t")
    letters = letters or [""] * len(shapes)
    return [g.input(s, f"x{i}", letters=l) for i, (s, l) in enumerate(zip(shapes, letters))]


def _cost(layer, configs, machine=RHO1):
    return layer.cost(np.array(configs, dtype=np.int64), machine)


def _tensor_configs(layer, row):
    C = np.array([row], dtype=np.int64)
    ins = [tuple(int(v) for v in a[0]) for a in layer.input_configs(C)]
    outs = [tuple(int(v) for v in a[0]) for a in layer.output_configs(C)]
    return ins, outs


def test_every_layer_type_is_covered_here():
    # The spec's table lists exactly these types; each has a test class below (MoE: tests/test_moe.py).
    assert set(LAYER_TYPES) == {
        "Conv", "Pooling", "FC", "Einsum", "Embedding", "Elementwise", "Concat", "Norm",
        "BatchNorm", "RMSNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy", "LSTM", "Ravel", "Unravel",
        "Stack", "Unstack", "Roll", "MoE",
    }


# ----------------------------------------------------------------------------- GEMM


def test_gemm_cost_by_hand():
    # B=2 (b=1), M=4 (m=2), N=6 (n=3), K=8 (k=2), pw=1, rho=1:
    # Mp=2, Np=2, Kp=4, Bp=2. compute 3*2*2*4 = 48; pw 3*1*2*2 = 12.
    # AR(Mp Np = 4, k=2) = 4/2*2*1 = 4; AR(Mp Kp = 8, n=3) = 8/3*2*2 = 32/3;
    # AR(Np Kp = 8, m=2) = 8/2*2*1 = 8. Sum per batch 48+12+4+32/3+8 = 72 + 32/3 = 248/3.
    # Times Bp = 2: 496/3.
    # Compute 2 * (48 + 12) = 120; communication 2 * (4 + 32/3 + 8) = 136/3.
    groups = (Group.flat(2), Group.flat(3), Group.flat(2))  # m, n, k
    got = gemm_cost(RHO1, (2.0, 2.0, 2.0, 4.0), groups, pw=1)
    assert float(np.ravel(got.compute)[0]) == pytest.approx(120.0, rel=1e-12)
    assert float(np.ravel(got.communication)[0]) == pytest.approx(136.0 / 3.0, rel=1e-12)
    assert float(np.ravel(got.total)[0]) == pytest.approx(496.0 / 3.0, rel=1e-12)
    # Unsplit: 2 * (3*4*6*8) = 1152, no communication.
    one = (Group.flat(1),) * 3
    unsplit = gemm_cost(RHO1, (2.0, 4.0, 6.0, 8.0), one)
    assert float(np.ravel(unsplit.total)[0]) == pytest.approx(1152.0) and float(np.ravel(unsplit.communication)[0]) == 0.0


# ----------------------------------------------------------------------------- Conv


class TestConv:
    # Image (b=2, c=2, h=4, w=4), n=2 filters 3x3, stride 1, pad 1, pw 1.
    # ho = floor((4 - 3 + 2)/1) + 1 = 4, wo = 4. Space (b, c, ho, wo, r, s, n) = (2,2,4,4,3,3,2).
    # GEMM: M = b ho wo = 32, N = n = 2, K = c r s = 18.
    def layer(self):
        (x,) = _inputs((2, 2, 4, 4), letters=["bchw"])
        return Conv(x, 2, 3, stride=1, pad=1, pw=1)

    def test_space(self):
        conv = self.layer()
        assert conv.domain == (2, 2, 4, 4, 3, 3, 2)
        assert conv.dims == "bchwrsn"
        assert conv.batch_dim == 0
        assert conv.unsplit == (False, False, True, True, False, False, False)
        assert conv.output_shapes == ((2, 2, 4, 4),)

    def test_space_with_stride_pad_per_axis(self):
        # (1, 1, 7, 9) image, kernel 3x2, stride (2, 3), pad (1, 0):
        # ho = floor((7 - 3 + 2)/2) + 1 = 4; wo = floor((9 - 2 + 0)/3) + 1 = 3.
        (x,) = _inputs((1, 1, 7, 9))
        conv = Conv(x, 5, (3, 2), stride=(2, 3), pad=(1, 0))
        assert conv.domain == (1, 1, 4, 3, 3, 2, 5)
        assert conv.output_shapes == ((1, 5, 4, 3),)

    def test_costs(self):
        conv = self.layer()
        configs = [
            # All 1: compute 3*32*2*18 = 3456, pw 3*1*32*2 = 192; no AR. Total 3648.
            (1, 1, 1, 1, 1, 1, 1),
            # b split 2: m=2. Mp=16, Np=2, Kp=18: compute 3*16*2*18 = 1728, pw 3*16*2 = 96;
            # AR(Np Kp = 36, m=2) = 36/2*2*1 = 36; others q=1. Total 1860.
            (2, 1, 1, 1, 1, 1, 1),
            # c and n split 2: m=1, n=2, k=2. Mp=32, Np=1, Kp=9: compute 3*32*1*9 = 864,
            # pw 3*32*1 = 96; AR(Mp Np = 32, k=2) = 32; AR(Mp Kp = 288, n=2) = 288;
            # AR(Np Kp = 9, m=1) = 0. Total 960 + 320 = 1280.
            (1, 2, 1, 1, 1, 1, 2),
        ]
        np.testing.assert_allclose(_cost(conv, configs), [3648.0, 1860.0, 1280.0], rtol=1e-12)
        # With rho = 2 only the all-reduce terms double: 3648, 1824 + 72, 960 + 640.
        np.testing.assert_allclose(_cost(conv, configs, RHO2), [3648.0, 1896.0, 1600.0], rtol=1e-12)

    def test_cost_outside_enumerated_set(self):
        conv = self.layer()
        configs = [
            # ho split 2 (never enumerated): m = c_b c_ho c_wo = 2, as the batch split: 1860.
            (1, 1, 2, 1, 1, 1, 1),
            # r split 3: k = 3. Mp=32, Np=2, Kp=6: compute 3*32*2*6 = 1152, pw 192;
            # AR(Mp Np = 64, k=3) = 64/3*2*2 = 256/3. Total 1344 + 256/3 = 4288/3.
            (1, 1, 1, 1, 3, 1, 1),
        ]
        np.testing.assert_allclose(_cost(conv, configs), [1860.0, 4288.0 / 3.0], rtol=1e-12)

    def test_tensor_configs(self):
        # Input (c_b, c_c, c_ho, c_wo); output (b, n, ho, wo) gets (c_b, c_n, c_ho, c_wo).
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5, 7, 11, 13, 17))
        assert ins == [(2, 3, 5, 7)]
        assert outs == [(2, 17, 5, 7)]

    def test_invalid(self):
        (x,) = _inputs((2, 2, 4))
        with pytest.raises(ValueError):
            Conv(x, 2, 3)  # not an image
        (x,) = _inputs((2, 2, 4, 4))
        with pytest.raises(ValueError):
            Conv(x, 0, 3)  # no filters
        with pytest.raises(ValueError):
            Conv(x, 2, 7)  # 7x7 does not fit a 4x4 image without padding


# ----------------------------------------------------------------------------- Pooling


class TestPooling:
    # Image (b=2, c=2, h=4, w=4), window 2x2, stride 2: ho = (4-2)/2 + 1 = 2 = wo.
    # Space (b, c, ho, wo) = (2, 2, 2, 2). Cost E + comm(halo),
    # halo = (hg wg - hi wi) (b/c_b)(c/c_c), hi = h/c_ho, wi = w/c_wo (h = w = 4 unpadded),
    # hg = hi + r if c_ho > 1, wg = wi + s if c_wo > 1.
    def layer(self):
        (x,) = _inputs((2, 2, 4, 4), letters=["bchw"])
        return Pooling(x, 2, stride=2)

    def test_space(self):
        pool = self.layer()
        assert pool.domain == (2, 2, 2, 2)
        assert pool.dims == "bchw"
        assert pool.batch_dim == 0
        assert pool.unsplit == (False,) * 4
        assert pool.output_shapes == ((2, 2, 2, 2),)

    def test_costs(self):
        pool = self.layer()
        configs = [
            # Nothing split: E = 16, halo 0. Total 16.
            (1, 1, 1, 1),
            # ho split 2: E = 2*2*1*2 = 8. hi = 4/2 = 2, wi = 4; hg = 2 + 2 = 4, wg = 4:
            # (16 - 8) * (2/1)(2/1) = 32 words, comm = 32. Total 40.
            (1, 1, 2, 1),
            # b, ho, wo split 2: E = 1*2*1*1 = 2. hi = wi = 2, hg = wg = 4:
            # (16 - 4) * (2/2)(2/1) = 24. Total 26.
            (2, 1, 2, 2),
            # c split 2: E = 8, no halo. Total 8.
            (1, 2, 1, 1),
        ]
        np.testing.assert_allclose(_cost(pool, configs), [16.0, 40.0, 26.0, 8.0], rtol=1e-12)
        # rho = 2 doubles the halo term: 16, 8 + 64, 2 + 48, 8.
        np.testing.assert_allclose(_cost(pool, configs, RHO2), [16.0, 72.0, 50.0, 8.0], rtol=1e-12)

    def test_halo_uses_unpadded_input(self):
        # (1, 1, 4, 4), window 3x3, stride 1, pad 1: ho = (4 - 3 + 2) + 1 = 4 = wo.
        # Config (1,1,2,1): E = 1*1*2*4 = 8. hi = 4/2 = 2 (unpadded h = 4, not 6),
        # wi = 4; hg = 2 + 3 = 5, wg = 4: 20 - 8 = 12 words. Total 20.
        # (Dividing the padded 6x6 image instead, hi = 3, wi = 6: 6*6 - 3*6 = 18 words: 26.)
        (x,) = _inputs((1, 1, 4, 4))
        pool = Pooling(x, 3, stride=1, pad=1)
        assert pool.domain == (1, 1, 4, 4)
        np.testing.assert_allclose(_cost(pool, [(1, 1, 2, 1)]), [20.0], rtol=1e-12)

    def test_tensor_configs(self):
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5, 7))
        assert ins == [(2, 3, 5, 7)] and outs == [(2, 3, 5, 7)]


# ----------------------------------------------------------------------------- FC


class TestFC:
    # Input (4, 6) (k = 6), n = 8 units. Space (x1, n, k) = (4, 8, 6). M = 4, N = 8, K = 6.
    def layer(self, pw=0):
        (x,) = _inputs((4, 6), letters=["bk"])
        return FC(x, 8, pw=pw)

    def test_space(self):
        fc = self.layer()
        assert fc.domain == (4, 8, 6)
        assert fc.dims == "bnk"
        assert fc.batch_dim == 0
        assert fc.output_shapes == ((4, 8),)

    def test_costs(self):
        configs = [
            # 3*4*8*6 = 576.
            (1, 1, 1),
            # m=2: Mp=2, Np=8, Kp=6: compute 288; AR(Np Kp = 48, m=2) = 48. Total 336.
            (2, 1, 1),
            # n=2, k=3: Mp=4, Np=4, Kp=2: compute 3*4*4*2 = 96; AR(Mp Np = 16, k=3) = 16/3*2*2
            # = 64/3; AR(Mp Kp = 8, n=2) = 8; AR(Np Kp, m=1) = 0. Total 104 + 64/3 = 376/3.
            (1, 2, 3),
        ]
        np.testing.assert_allclose(_cost(self.layer(), configs), [576.0, 336.0, 376.0 / 3.0], rtol=1e-12)

    def test_pointwise(self):
        # pw = 1 adds 3*pw*Mp*Np: all 1: + 3*4*8 = 96 -> 672; (2,1,1): + 3*2*8 = 48 -> 384.
        np.testing.assert_allclose(_cost(self.layer(pw=1), [(1, 1, 1), (2, 1, 1)]), [672.0, 384.0])

    def test_rank3_input(self):
        # Input (2, 3, 6), n = 4: space (2, 3, 4, 6); M = 6.
        # Config (2, 3, 1, 1): m = 6: Mp = 1, Np = 4, Kp = 6: compute 72;
        # AR(Np Kp = 24, m=6) = 24/6*2*5 = 40. Total 112.
        (x,) = _inputs((2, 3, 6))
        fc = FC(x, 4)
        assert fc.domain == (2, 3, 4, 6)
        assert fc.output_shapes == ((2, 3, 4),)
        np.testing.assert_allclose(_cost(fc, [(2, 3, 1, 1)]), [112.0])
        # Input: c without the n entry; output: c without the last (k) entry.
        ins, outs = _tensor_configs(fc, (2, 3, 5, 7))
        assert ins == [(2, 3, 7)] and outs == [(2, 3, 5)]

    def test_tensor_configs(self):
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5))
        assert ins == [(2, 5)] and outs == [(2, 3)]

    def test_invalid(self):
        (x,) = _inputs((6,))
        with pytest.raises(ValueError):
            FC(x, 4)  # rank 1
        (x,) = _inputs((4, 6))
        with pytest.raises(ValueError):
            FC(x, 0)


# ----------------------------------------------------------------------------- Einsum


class TestEinsum:
    # bij,bjk->bik with A (2,3,4), B (2,4,5). Space: output dims b,i,k then reduction j:
    # (b=2, i=3, k=5, j=4). Batch b (2), M = i (3), N = k (5), K = j (4).
    def layer(self):
        a, b = _inputs((2, 3, 4), (2, 4, 5))
        return Einsum("bij,bjk->bik", a, b)

    def test_space(self):
        e = self.layer()
        assert e.domain == (2, 3, 5, 4)
        assert e.dims == "bikj"
        assert e.batch_dim == 0
        assert e.output_shapes == ((2, 3, 5),)

    def test_costs(self):
        configs = [
            # Bp = 2, per batch 3*3*5*4 = 180: 360.
            (1, 1, 1, 1),
            # b split 2: Bp = 1: 180 (no AR: m = n = k = 1).
            (2, 1, 1, 1),
            # i split 3, j split 2: Bp = 2, Mp = 1, Np = 5, Kp = 2: compute 30;
            # AR(Mp Np = 5, k=2) = 5; AR(Mp Kp, n=1) = 0; AR(Np Kp = 10, m=3) = 10/3*2*2 = 40/3.
            # Per batch 35 + 40/3 = 145/3; times 2: 290/3.
            (1, 3, 1, 2),
            # k split 5, j split 4 (product 20): Bp = 2, Mp = 3, Np = 1, Kp = 1: compute 9;
            # AR(3, k=4) = 3/4*2*3 = 4.5; AR(Mp Kp = 3, n=5) = 3/5*2*4 = 4.8; AR(., m=1) = 0.
            # Per batch 18.3; times 2: 36.6.
            (1, 1, 5, 4),
        ]
        np.testing.assert_allclose(
            _cost(self.layer(), configs), [360.0, 180.0, 290.0 / 3.0, 36.6], rtol=1e-12
        )

    def test_tensor_configs(self):
        # Each operand / the output gets its own dims in its own order.
        # Config (b=2, i=3, k=5, j=7): A "bij" -> (2,3,7); B "bjk" -> (2,7,5); out "bik" -> (2,3,5).
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5, 7))
        assert ins == [(2, 3, 7), (2, 7, 5)]
        assert outs == [(2, 3, 5)]

    def test_reduction_order_and_no_batch(self):
        # ikj,jkl->il: reductions in order of first appearance in A: k, then j (not
        # alphabetical). Space (i, l, k, j). Sizes i=2, k=4, j=3, l=5: domain (2, 5, 4, 3).
        # No batch dim; M = 2, N = 5, K = 12. All 1: 3*2*5*12 = 360.
        a, b = _inputs((2, 4, 3), (3, 4, 5))
        e = Einsum("ikj,jkl->il", a, b)
        assert e.domain == (2, 5, 4, 3)
        assert e.dims == "ilkj"
        np.testing.assert_allclose(_cost(e, [(1, 1, 1, 1)]), [360.0])
        # Splitting k by 2 and j by 3 is a K-split of 6: Mp=2, Np=5, Kp=2: compute 60;
        # AR(Mp Np = 10, 6) = 10/6*2*5 = 50/3. Total 230/3.
        np.testing.assert_allclose(_cost(e, [(1, 1, 2, 3)]), [230.0 / 3.0], rtol=1e-12)
        ins, outs = _tensor_configs(e, (2, 3, 5, 7))  # i=2, l=3, k=5, j=7
        assert ins == [(2, 5, 7), (7, 5, 3)] and outs == [(2, 3)]

    def test_pointwise_without_batch_dims(self):
        # ble,ef->blf, b=2, l=2, e=3, f=4, pw=2: space (b, l, f, e) = (2, 2, 4, 3); b is not in B,
        # so no batch dims: M = b l = 4, N = 4, K = 3.
        # All 1: 3*4*4*3 = 144, pw 3*2*4*4 = 96 -> 240.
        # (2, 1, 2, 1): m = 2, n = 2: Mp = 2, Np = 2, Kp = 3: 36 + 3*2*2*2 = 24 -> 60;
        # AR(Mp Kp = 6, n=2) = 6; AR(Np Kp = 6, m=2) = 6. Total 72.
        x, w = _inputs((2, 2, 3), (3, 4))
        e = Einsum("ble,ef->blf", x, w, pw=2)
        assert e.domain == (2, 2, 4, 3)
        assert e.batch_dim == 0  # the 'b' dimension
        np.testing.assert_allclose(_cost(e, [(1, 1, 1, 1), (2, 1, 2, 1)]), [240.0, 72.0])

    def test_batch_dim_is_b_wherever_it_is(self):
        x, w = _inputs((2, 4, 6), (3, 2, 6, 3))
        e = Einsum("ble,shek->sbhlk", x, w)
        # Space: s b h l k then e: b at position 1.
        assert e.dims == "sbhlke"
        assert e.domain == (3, 2, 2, 4, 3, 6)
        assert e.batch_dim == 1

    @pytest.mark.parametrize(
        "equation, shapes",
        [
            ("ab,bc", [(2, 3), (3, 4)]),              # no arrow
            ("Ab,bc->Ac", [(2, 3), (3, 4)]),          # upper case
            ("a1,1c->ac", [(2, 3), (3, 4)]),          # digits
            ("ab,bc,cd->ad", [(2, 3), (3, 4)]),       # three operands
            ("aab,bc->ac", [(2, 2, 3), (3, 4)]),      # letter repeated in an operand
            ("ab,bc->aac", [(2, 3), (3, 4)]),         # letter repeated in the output
            ("abc,bc->ac", [(2, 3), (3, 4)]),         # A has 2 dims, the equation 3
            ("ab,bc->ac", [(2, 3), (4, 5)]),          # b is 3 in A and 4 in B
            ("ab,bc->ad", [(2, 3), (3, 4)]),          # d in neither operand
            ("abx,bc->ac", [(2, 3, 5), (3, 4)]),      # x in A only and not in the output
            ("ab,abc->abc", [(2, 3), (2, 3, 4)]),     # empty M
            ("ab,ab->ab", [(2, 3), (2, 3)]),          # empty M and N
            ("", [(2, 3), (3, 4)]),                   # empty
        ],
    )
    def test_bad_equations(self, equation, shapes):
        a, b = _inputs(*shapes)
        with pytest.raises(ValueError):
            Einsum(equation, a, b)

    def test_equation_not_a_string(self):
        a, b = _inputs((2, 3), (3, 4))
        with pytest.raises(ValueError):
            Einsum(123, a, b)


# ----------------------------------------------------------------------------- Embedding


class TestEmbedding:
    # ids (b=2, s=3), V = 5, D = 4: the Einsum bsv,vd->bsd. Space (2, 3, 4, 5) = (b, s, d, v).
    # No batch dims (no letter is in A, B and the output): b, s are M (6), d is N (4), v is K (5).
    def layer(self):
        (ids,) = _inputs((2, 3), letters=["bs"])
        return Embedding(ids, 5, 4)

    def test_space(self):
        emb = self.layer()
        assert emb.domain == (2, 3, 4, 5)
        assert emb.dims == "bsdv"
        assert emb.batch_dim == 0
        assert emb.output_shapes == ((2, 3, 4),)

    def test_costs(self):
        configs = [
            # 3*6*4*5 = 360.
            (1, 1, 1, 1),
            # b split 2: Mp = 3: compute 180; AR(Np Kp = 20, m=2) = 20. Total 200.
            (2, 1, 1, 1),
            # d split 2, v split 5: Mp = 6, Np = 2, Kp = 1: compute 36; AR(Mp Np = 12, k=5)
            # = 12/5*2*4 = 19.2; AR(Mp Kp = 6, n=2) = 6; AR(., m=1) = 0. Total 61.2.
            (1, 1, 2, 5),
        ]
        np.testing.assert_allclose(_cost(self.layer(), configs), [360.0, 200.0, 61.2], rtol=1e-12)

    def test_tensor_configs(self):
        # One-hot (b, s, v) and weight (v, d); output (b, s, d).
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5, 7))
        assert ins == [(2, 3, 7), (7, 5)] and outs == [(2, 3, 5)]

    def test_inputs_make_no_edges(self):
        g = GraphBuilder("emb")
        ids = g.input((2, 3), "ids", letters="bs")
        g.add("emb", Embedding(ids, 5, 4))
        net = g.build()
        assert net.edges == {}
        assert all(t.producer is None for t in net.layers[0].inputs)

    def test_ids_must_be_graph_input(self):
        g = GraphBuilder("emb")
        a, b = g.input((2, 3)), g.input((2, 3))
        s = g.add("sum", Elementwise(a, b))
        with pytest.raises(ValueError):
            Embedding(s, 5, 4)
        with pytest.raises(ValueError):
            Embedding(a, 0, 4)


# ----------------------------------------------------------------------------- Elementwise


class TestElementwise:
    def test_costs_and_space(self):
        # Shape (2, 3, 4), cost (1 + pw) E.
        a, b = _inputs((2, 3, 4), (2, 3, 4))
        e = Elementwise(a, b, pw=1)
        assert e.domain == (2, 3, 4) and e.batch_dim == 0
        assert e.output_shapes == ((2, 3, 4),)
        # All 1: E = 24 -> 48; (2, 3, 1): E = 4 -> 8; (1, 1, 4): E = 6 -> 12.
        np.testing.assert_allclose(_cost(e, [(1, 1, 1), (2, 3, 1), (1, 1, 4)]), [48.0, 8.0, 12.0])
        # pw = 0: E alone; rho plays no part: (1, 1, 4) -> 6 on either machine.
        e0 = Elementwise(a, b)
        np.testing.assert_allclose(_cost(e0, [(1, 1, 4)], RHO2), [6.0])

    def test_tensor_configs(self):
        a, b = _inputs((2, 3, 4), (2, 3, 4))
        ins, outs = _tensor_configs(Elementwise(a, b), (2, 3, 5))
        assert ins == [(2, 3, 5), (2, 3, 5)] and outs == [(2, 3, 5)]

    def test_shape_mismatch(self):
        a, b = _inputs((2, 3, 4), (2, 4, 3))
        with pytest.raises(ValueError):
            Elementwise(a, b)


# ----------------------------------------------------------------------------- Concat


class TestConcat:
    def test_space_cost_configs(self):
        # (2, 3, 4) and (2, 5, 4) on axis 1: space (2, 1, 4); output (2, 8, 4); cost 0.
        a, b = _inputs((2, 3, 4), (2, 5, 4))
        c = Concat([a, b], axis=1)
        assert c.domain == (2, 1, 4)
        assert c.output_shapes == ((2, 8, 4),)
        assert c.batch_dim == 0
        np.testing.assert_array_equal(_cost(c, [(1, 1, 1), (2, 1, 4)], RHO2), [0.0, 0.0])
        ins, outs = _tensor_configs(c, (2, 1, 5))
        assert ins == [(2, 1, 5), (2, 1, 5)] and outs == [(2, 1, 5)]

    def test_mismatch(self):
        a, b = _inputs((2, 3, 4), (3, 3, 4))
        with pytest.raises(ValueError):
            Concat([a, b], axis=1)  # differ off the axis
        a, b = _inputs((2, 3, 4), (2, 3))
        with pytest.raises(ValueError):
            Concat([a, b], axis=1)  # rank differs
        (a,) = _inputs((2, 3, 4))
        with pytest.raises(ValueError):
            Concat([a, a], axis=3)  # axis out of range
        with pytest.raises(ValueError):
            Concat([], axis=0)


class TestConcatBroadcast:
    def test_a_size_one_operand_is_broadcast_and_its_gradient_all_reduced(self):
        # (2, 4, 3) and (2, 1, 2) on axis 2: output (2, 4, 5), space (2, 4, 1); the second
        # operand is broadcast along axis 1. Config (1, 2, 1): the copy is free on the paper
        # machine; the broadcast operand is whole (2*1*2 = 4 elements) on both devices
        # splitting axis 1: AR(4, 2) = 4 (rho 1), 8 (rho 2). Config (2, 1, 1): no AR.
        a, b = _inputs((2, 4, 3), (2, 1, 2))
        c = Concat([a, b], axis=2)
        assert c.domain == (2, 4, 1) and c.output_shapes == ((2, 4, 5),) and c.broadcast == ((), (1,))
        np.testing.assert_array_equal(_cost(c, [(1, 2, 1), (2, 1, 1)]), [4.0, 0.0])
        np.testing.assert_array_equal(_cost(c, [(1, 2, 1)], RHO2), [8.0])
        ins, outs = _tensor_configs(c, (2, 3, 1))
        assert ins == [(2, 3, 1), (2, 1, 1)] and outs == [(2, 3, 1)]


# ----------------------------------------------------------------------------- Roll


class TestRoll:
    def test_space_cost_configs(self):
        # x (2, 8), shift 3 along axis 1: space (2, 8), no compute. Config (1, 2): blocks of
        # 4, 3 of each block's 4 columns land on the other device: 2 * 3 = 6 elements, sent
        # forward and back: exchange(12) = 12 rho. Config (1, 8): blocks of 1, all move:
        # 2 * 2 = 4. Config (2, 1): the rolled axis whole, nothing moves.
        (x,) = _inputs((2, 8))
        r = Roll(x, 3, 1)
        assert r.domain == (2, 8) and r.output_shapes == ((2, 8),) and r.batch_dim == 0
        np.testing.assert_array_equal(_cost(r, [(1, 2), (1, 8), (2, 1)]), [12.0, 4.0, 0.0])
        np.testing.assert_array_equal(_cost(r, [(1, 2)], RHO2), [24.0])
        ins, outs = _tensor_configs(r, (2, 3))
        assert ins == [(2, 3)] and outs == [(2, 3)]

    def test_mismatch(self):
        (x,) = _inputs((2, 8))
        with pytest.raises(ValueError):
            Roll(x, [1, 2], [1])  # a shift per axis
        with pytest.raises(ValueError):
            Roll(x, [1, 1], [1, 1])  # an axis twice
        with pytest.raises(ValueError):
            Roll(x, 1, 2)  # axis out of range


# ----------------------------------------------------------------------------- Norm / BatchNorm


class TestNorm:
    # x (4, 6), axis 1. Cost 16 E + 4 AR(E / dpp[axis], c[axis]) + 4 AR(dpp[axis], prod(c w/o axis)).
    def test_costs(self):
        (x,) = _inputs((4, 6))
        n = Norm(x, axis=-1)
        assert n.axis == 1 and n.domain == (4, 6) and n.batch_dim == 0
        configs = [
            # E = 24: 384; both AR over 1 device. 384.
            (1, 1),
            # dpp (2, 6), E = 12: 192; AR(2, 1) = 0; 4 AR(6, 2) = 4 * 6 = 24. Total 216.
            (2, 1),
            # dpp (4, 2), E = 8: 128; 4 AR(4, 3) = 4 * 4/3*2*2 = 64/3; 4 AR(2, 1) = 0.
            # Total 448/3.
            (1, 3),
            # dpp (2, 2), E = 4: 64; 4 AR(2, 3) = 4 * 8/3 = 32/3; 4 AR(2, 2) = 4 * 2 = 8.
            # Total 72 + 32/3 = 248/3.
            (2, 3),
        ]
        np.testing.assert_allclose(
            _cost(n, configs), [384.0, 216.0, 448.0 / 3.0, 248.0 / 3.0], rtol=1e-12
        )
        # rho = 2 doubles the AR terms only: 384, 192 + 48, 128 + 128/3, 64 + 16 + 64/3.
        np.testing.assert_allclose(
            _cost(n, configs, RHO2), [384.0, 240.0, 128.0 + 128.0 / 3.0, 80.0 + 64.0 / 3.0], rtol=1e-12
        )
        ins, outs = _tensor_configs(n, (2, 3))
        assert ins == [(2, 3)] and outs == [(2, 3)]

    def test_batchnorm_is_norm_on_axis_0(self):
        # x (4, 2, 2, 2), axis 0.
        (x,) = _inputs((4, 2, 2, 2), letters=["bchw"])
        bn = BatchNorm(x)
        assert bn.axis == 0 and bn.domain == (4, 2, 2, 2) and bn.dims == "bchw"
        configs = [
            # dpp (2,2,2,2), E = 16: 256; 4 AR(E/dpp0 = 8, 2) = 4*8 = 32; 4 AR(2, 1) = 0. 288.
            (2, 1, 1, 1),
            # dpp (4,1,2,2), E = 16: 256; 4 AR(4, 1) = 0; 4 AR(dpp0 = 4, 2) = 4*4 = 16. 272.
            (1, 2, 1, 1),
            # dpp (2,1,2,2), E = 8: 128; 4 AR(4, 2) = 16; 4 AR(2, 2) = 8. 152.
            (2, 2, 1, 1),
        ]
        np.testing.assert_allclose(_cost(bn, configs), [288.0, 272.0, 152.0], rtol=1e-12)
        ins, outs = _tensor_configs(bn, (2, 3, 5, 7))
        assert ins == [(2, 3, 5, 7)] and outs == [(2, 3, 5, 7)]

    def test_bad_axis(self):
        (x,) = _inputs((4, 6))
        with pytest.raises(ValueError):
            Norm(x, axis=2)


# ----------------------------------------------------------------------------- ReduceMean


class TestReduceMean:
    # x (4, 2, 3, 3) reduced over (2, 3): cost AR(E, prod(c[axes])).
    def layer(self, keepdims=False):
        (x,) = _inputs((4, 2, 3, 3), letters=["bchw"])
        return ReduceMean(x, (2, 3), keepdims=keepdims)

    def test_costs(self):
        r = self.layer()
        assert r.domain == (4, 2, 3, 3) and r.batch_dim == 0
        assert r.output_shapes == ((4, 2),)
        configs = [
            # Reduced axes unsplit: AR(., 1) = 0.
            (1, 1, 1, 1),
            # E = 2*2*1*3 = 12, q = 3*1: 12/3*2*2 = 16.
            (2, 1, 3, 1),
            # E = 4*1*3*1 = 12, q = 1*3: 16.
            (1, 2, 1, 3),
            # E = 2*1*3*3 = 18, q = 1: 0 (splitting kept axes costs nothing).
            (2, 2, 1, 1),
            # E = 4*2*1*1 = 8, q = 9: 8/9*2*8 = 128/9.
            (1, 1, 3, 3),
        ]
        np.testing.assert_allclose(_cost(r, configs), [0.0, 16.0, 16.0, 0.0, 128.0 / 9.0], rtol=1e-12)
        np.testing.assert_allclose(_cost(r, [(2, 1, 3, 1)], RHO2), [32.0])

    def test_tensor_configs(self):
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5, 7))
        assert ins == [(2, 3, 5, 7)] and outs == [(2, 3)]
        kd = self.layer(keepdims=True)
        assert kd.output_shapes == ((4, 2, 1, 1),)
        ins, outs = _tensor_configs(kd, (2, 3, 5, 7))
        assert outs == [(2, 3, 1, 1)]

    def test_all_axes_reduced(self):
        (x,) = _inputs((4, 6))
        r = ReduceMean(x, (0, 1))
        assert r.output_shapes == ((1,),)
        ins, outs = _tensor_configs(r, (2, 3))
        assert outs == [(1,)]
        # E = 2*2 = 4, q = 6: 4/6*2*5 = 20/3.
        np.testing.assert_allclose(_cost(r, [(2, 3)]), [20.0 / 3.0], rtol=1e-12)

    def test_invalid(self):
        (x,) = _inputs((4, 6))
        with pytest.raises(ValueError):
            ReduceMean(x, ())
        with pytest.raises(ValueError):
            ReduceMean(x, (1, 1))
        with pytest.raises(ValueError):
            ReduceMean(x, (5,))


# ----------------------------------------------------------------------------- Softmax


class TestSoftmax:
    # Cost with e = prod(dpp w/o axis), a = c[axis]:
    # 4E + E dom[axis] + AR(e, a) + AR(e dom[axis], a) + AR(e, a).
    def test_costs_last_axis(self):
        # x (2, 4), axis 1, dom[axis] = 4.
        (x,) = _inputs((2, 4))
        s = Softmax(x, axis=1)
        assert s.domain == (2, 4) and s.batch_dim == 0
        configs = [
            # E = 8: 32 + 32 = 64. No AR.
            (1, 1),
            # Axis split 2: dpp (2, 2), E = 4: 16 + 16 = 32; e = 2: AR(2,2) = 2, AR(8,2) = 8,
            # AR(2,2) = 2 -> 12. Total 44.
            (1, 2),
            # dpp (1, 4), E = 4: 16 + 16 = 32; a = 1: no AR. Total 32.
            (2, 1),
            # dpp (1, 2), E = 2: 8 + 8 = 16; e = 1: AR(1,2) = 1, AR(4,2) = 4, AR(1,2) = 1. 22.
            (2, 2),
        ]
        np.testing.assert_allclose(_cost(s, configs), [64.0, 44.0, 32.0, 22.0], rtol=1e-12)
        # rho = 2: the AR terms double: 64, 32 + 24, 32, 16 + 12.
        np.testing.assert_allclose(_cost(s, configs, RHO2), [64.0, 56.0, 32.0, 28.0], rtol=1e-12)
        ins, outs = _tensor_configs(s, (2, 3))
        assert ins == [(2, 3)] and outs == [(2, 3)]

    def test_costs_two_axes_together(self):
        # x (2, 2, 3), axes (1, 2): dom = 6. Config (1, 2, 1): dpp (2, 1, 3), E = 6:
        # 24 + 36 = 60; e = 6 / 3 = 2, a = 2: AR(2,2) = 2, AR(12,2) = 12, AR(2,2) = 2 -> 16. 76.
        # Config (2, 1, 1): dpp (1, 2, 3), E = 6: 24 + 36 = 60, the axes whole: no AR.
        (x,) = _inputs((2, 2, 3))
        s = Softmax(x, axis=[1, 2])
        assert s.axes == (1, 2) and s.args["axis"] == [1, 2]
        np.testing.assert_allclose(_cost(s, [(1, 2, 1), (2, 1, 1)]), [76.0, 60.0], rtol=1e-12)

    def test_costs_first_axis(self):
        # x (2, 4), axis 0, dom[axis] = 2. Config (2, 1): dpp (1, 4), E = 4: 16 + 4*2 = 24;
        # e = 4, a = 2: AR(4,2) = 4, AR(8,2) = 8, AR(4,2) = 4 -> 16. Total 40.
        (x,) = _inputs((2, 4))
        s = Softmax(x, axis=0)
        np.testing.assert_allclose(_cost(s, [(2, 1)]), [40.0], rtol=1e-12)
        # Config (1, 2): axis unsplit: E = 4: 16 + 8 = 24, no AR.
        np.testing.assert_allclose(_cost(s, [(1, 2)]), [24.0], rtol=1e-12)


# ----------------------------------------------------------------------------- SoftmaxCrossEntropy


class TestSoftmaxCrossEntropy:
    # 4E + 2 bpp, plus comm(2 bpp) when the last (class) axis is split.
    def test_costs(self):
        (x,) = _inputs((4, 6))
        s = SoftmaxCrossEntropy(x)
        assert s.domain == (4, 6) and s.batch_dim == 0
        configs = [
            # E = 24, bpp = 4: 96 + 8 = 104.
            (1, 1),
            # dpp (2, 6): E = 12, bpp = 2: 48 + 4 = 52; class axis unsplit.
            (2, 1),
            # Class axis split 3: dpp (4, 2): E = 8, bpp = 4: 32 + 8 = 40; comm(8) = 8. 48.
            (1, 3),
            # dpp (2, 2): E = 4, bpp = 2: 16 + 4 = 20; comm(4) = 4. 24.
            (2, 3),
        ]
        np.testing.assert_allclose(_cost(s, configs), [104.0, 52.0, 48.0, 24.0], rtol=1e-12)
        # rho = 2 doubles comm only: 104, 52, 40 + 16, 20 + 8.
        np.testing.assert_allclose(_cost(s, configs, RHO2), [104.0, 52.0, 56.0, 28.0], rtol=1e-12)
        ins, outs = _tensor_configs(s, (2, 3))
        assert ins == [(2, 3)] and outs == [(2, 3)]

    def test_rank3(self):
        # x (2, 3, 4), config (1, 3, 2): dpp (2, 1, 2): E = 4, bpp = 2: 16 + 4 = 20; comm(4) = 4.
        (x,) = _inputs((2, 3, 4))
        np.testing.assert_allclose(_cost(SoftmaxCrossEntropy(x), [(1, 3, 2)]), [24.0])


# ----------------------------------------------------------------------------- LSTM


class TestLSTM:
    # x (b=2, s=3, k=4), L = 2: space (L, s, b, n, k) = (2, 3, 2, 4, 4).
    # GEMM: batch L, M = s b = 6, N = 4n = 16, K = 2k = 8, pw = 3, split (c_L, c_s c_b, c_n, c_k).
    # Hand-over: L * s * comm(w), w the edge volume of (b, n) = (2, 4) split (c_b, c_n)
    # to (b, k) = (2, 4) split (c_b, c_k).
    def layer(self):
        (x,) = _inputs((2, 3, 4), letters=["bsk"])
        return LSTM(x, 2)

    def test_space(self):
        lstm = self.layer()
        assert lstm.domain == (2, 3, 2, 4, 4)
        assert lstm.dims == "lsbnk"
        assert lstm.batch_dim == 2
        assert lstm.unsplit == (False, True, False, False, False)
        assert lstm.output_shapes == ((2, 3, 4),)

    def test_costs(self):
        configs = [
            # Per layer: 3*6*16*8 = 2304, pw 3*3*6*16 = 864 -> 3168; L = 2: 6336. Hand-over 0.
            (1, 1, 1, 1, 1),
            # b split 2: Mp = 3: 3*3*16*8 = 1152, pw 3*3*3*16 = 432, AR(Np Kp = 128, m=2) = 128
            # -> 1712; times 2: 3424. Hand-over (1,1)->(1,1) blocks equal: 0. Total 3424.
            (1, 1, 2, 1, 1),
            # n split 2: Np = 8: 3*6*8*8 = 1152, pw 3*3*6*8 = 432, AR(Mp Kp = 48, n=2) = 48
            # -> 1632; times 2: 3264. Hand-over: source (1, 2): src (2, 2), Ps = 2; target (1, 1):
            # tgt (2, 4), Pg = 1 <= 2: overlap min(2,2)*min(4,2) = 4, w = 8 - 4 = 4;
            # L s comm(4) = 2*3*4 = 24. Total 3288.
            (1, 1, 1, 2, 1),
            # k split 2: Kp = 4: 3*6*16*4 = 1152, pw 864, AR(Mp Np = 96, k=2) = 96 -> 2112;
            # times 2: 4224. Hand-over: source (1,1), Ps = 1; target (1,2), Pg = 2 > 1: overlap 0,
            # w = prod(2, 2) = 4: 24. Total 4248.
            (1, 1, 1, 1, 2),
            # L split 2, n and k split 2: Bp = 1; Np = 8, Kp = 4: 3*6*8*4 = 576, pw 3*3*6*8 = 432,
            # AR(Mp Np = 48, k=2) = 48, AR(Mp Kp = 24, n=2) = 24 -> 1080. Hand-over (1,2)->(1,2): 0.
            (2, 1, 1, 2, 2),
            # L split 2, n split 2: Bp = 1; Np = 8: 1152 + 432 + AR(Mp Kp = 48, n=2) = 48 -> 1632.
            # Hand-over (1,2) -> (1,1): 4 words as above, with the FULL L and s (not L / c_L):
            # 2*3*4 = 24. Total 1656.
            (2, 1, 1, 2, 1),
            # n split 4: Np = 4: 3*6*4*8 = 576, pw 3*3*6*4 = 216, AR(Mp Kp = 48, n=4) = 48/4*2*3 = 72
            # -> 864; times 2: 1728. Hand-over from (b, n) split (1, 4): src (2, 1), Ps = 4, to
            # (b, k) split (1, 1): tgt (2, 4): overlap 2*1 = 2, w = 8 - 2 = 6 (the reverse
            # direction would give 2): 2*3*6 = 36. Total 1764.
            (1, 1, 1, 4, 1),
        ]
        np.testing.assert_allclose(
            _cost(self.layer(), configs),
            [6336.0, 3424.0, 3288.0, 4248.0, 1080.0, 1656.0, 1764.0],
            rtol=1e-12,
        )
        # rho = 2: the AR and hand-over terms double.
        # (1,1,1,2,1): 2*(1584 + 96) + 48 = 3408; (1,1,1,1,2): 2*(2016 + 192) + 48 = 4464.
        np.testing.assert_allclose(
            _cost(self.layer(), [(1, 1, 1, 2, 1), (1, 1, 1, 1, 2)], RHO2), [3408.0, 4464.0], rtol=1e-12
        )

    def test_cost_with_sequence_split(self):
        # s split 3 (never enumerated): m = c_s c_b = 3: Mp = 2: 3*2*16*8 = 768, pw 3*3*2*16 = 288,
        # AR(Np Kp = 128, 3) = 128/3*2*2 = 512/3 -> 1056 + 512/3 = 3680/3; times L = 2: 7360/3.
        # Hand-over (1,1)->(1,1): 0.
        np.testing.assert_allclose(_cost(self.layer(), [(1, 3, 1, 1, 1)]), [7360.0 / 3.0], rtol=1e-12)

    def test_tensor_configs(self):
        # Input (b, s, k): (c_b, c_s, c_k); output (b, s, n): (c_b, c_s, c_n).
        ins, outs = _tensor_configs(self.layer(), (2, 3, 5, 7, 11))
        assert ins == [(5, 3, 11)] and outs == [(5, 3, 7)]

    def test_invalid(self):
        (x,) = _inputs((2, 3))
        with pytest.raises(ValueError):
            LSTM(x, 2)
        (x,) = _inputs((2, 3, 4))
        with pytest.raises(ValueError):
            LSTM(x, 0)


# ----------------------------------------------------------------------------- Ravel / Unravel


class TestRavelUnravel:
    def test_ravel(self):
        (x,) = _inputs((2, 3, 4))
        r = Ravel(x)
        assert r.domain == (2, 3, 4) and r.contiguous and r.batch_dim == 0
        assert r.output_shapes == ((24,),)
        np.testing.assert_array_equal(_cost(r, [(1, 1, 1), (2, 3, 1)], RHO2), [0.0, 0.0])
        # Input c; output (prod c,): (2, 3, 1) -> (6,).
        ins, outs = _tensor_configs(r, (2, 3, 1))
        assert ins == [(2, 3, 1)] and outs == [(6,)]

    def test_unravel(self):
        (flat,) = _inputs((24,))
        u = Unravel(flat, (2, 3, 4))
        assert u.domain == (2, 3, 4) and u.contiguous and u.batch_dim == 0
        assert u.output_shapes == ((2, 3, 4),)
        np.testing.assert_array_equal(_cost(u, [(2, 1, 1)]), [0.0])
        ins, outs = _tensor_configs(u, (2, 3, 2))
        assert ins == [(12,)] and outs == [(2, 3, 2)]

    def test_unravel_invalid(self):
        (flat,) = _inputs((24,))
        with pytest.raises(ValueError):
            Unravel(flat, (5, 5))  # 25 != 24
        with pytest.raises(ValueError):
            Unravel(flat, (24, 0))
        (x,) = _inputs((4, 6))
        with pytest.raises(ValueError):
            Unravel(x, (24,))  # input not flat


# ----------------------------------------------------------------------------- Stack / Unstack


class TestStackUnstack:
    def test_stack_axis0(self):
        # Three (2, 3) tensors on axis 0: space (1, 2, 3); output (3, 2, 3); batch dim 1.
        a, b, c = _inputs((2, 3), (2, 3), (2, 3))
        s = Stack([a, b, c], axis=0)
        assert s.domain == (1, 2, 3)
        assert s.output_shapes == ((3, 2, 3),)
        assert s.batch_dim == 1
        np.testing.assert_array_equal(_cost(s, [(1, 2, 3)]), [0.0])
        # Each input: c without the axis entry; output: c.
        ins, outs = _tensor_configs(s, (1, 2, 3))
        assert ins == [(2, 3)] * 3 and outs == [(1, 2, 3)]

    def test_stack_axis1(self):
        a, b = _inputs((2, 3), (2, 3))
        s = Stack([a, b], axis=1)
        assert s.domain == (2, 1, 3) and s.output_shapes == ((2, 2, 3),)
        assert s.batch_dim == 0
        ins, outs = _tensor_configs(s, (2, 1, 3))
        assert ins == [(2, 3), (2, 3)]

    def test_stack_mismatch(self):
        a, b = _inputs((2, 3), (3, 2))
        with pytest.raises(ValueError):
            Stack([a, b])

    def test_unstack_axis0(self):
        # x (3, 2, 4) on axis 0: space (1, 2, 4); three outputs (2, 4); batch dim 1.
        (x,) = _inputs((3, 2, 4))
        u = Unstack(x, axis=0)
        assert u.domain == (1, 2, 4)
        assert u.output_shapes == ((2, 4),) * 3
        assert u.batch_dim == 1
        np.testing.assert_array_equal(_cost(u, [(1, 2, 4)], RHO2), [0.0])
        ins, outs = _tensor_configs(u, (1, 2, 3))
        assert ins == [(1, 2, 3)] and outs == [(2, 3)] * 3

    def test_unstack_axis1(self):
        (x,) = _inputs((2, 3, 4))
        u = Unstack(x, axis=1)
        assert u.domain == (2, 1, 4) and u.output_shapes == ((2, 4),) * 3 and u.batch_dim == 0
        ins, outs = _tensor_configs(u, (2, 1, 5))
        assert outs == [(2, 5)] * 3

    def test_unstack_rank1_rejected(self):
        (x,) = _inputs((3,))
        with pytest.raises(ValueError):
            Unstack(x)


# ----------------------------------------------------------------------------- the interface


def test_layer_declaration_is_checked_once_when_added():
    from pase.model.layers import Layer

    class Forgetful(Layer):  # no op, so it is not registered; forgets Layer.__init__
        def __init__(self, x):
            self.inputs = (x,)

    g = GraphBuilder("t")
    x = g.input((4,), "x")
    with pytest.raises(ValueError, match="does not declare 'domain'"):
        g.add("bad", Forgetful(x))

    class Mismatched(Layer):  # declares an output configuration of the wrong rank
        op = None

        def __init__(self, x):
            super().__init__((x,), (4,), "b", ((4, 2),))

        def input_configs(self, C):
            return [C]

        def output_configs(self, C):
            return [C]

    with pytest.raises(ValueError, match="has no op name"):
        g.add("bad", Mismatched(x))
    odd = Mismatched(x)
    odd.op = "Mismatched"  # on the instance: the registry stays untouched
    with pytest.raises(ValueError, match="does not match the output shape"):
        g.add("bad", odd)


def test_a_second_class_for_one_op_is_refused():
    from pase.model.layers import Layer

    with pytest.raises(TypeError, match="defined twice"):
        class AnotherFC(Layer):
            op = "FC"


def test_make_layer_rebuilds_from_args_and_names_problems():
    from pase.model.layers import make_layer

    (x,) = _inputs((2, 2, 8, 8), letters=["bchw"])
    conv = Conv(x, 4, 3, stride=2, pad=1, pw=1)
    assert conv.args == {"filters": 4, "kernel": [3, 3], "stride": [2, 2], "pad": [1, 1], "pw": 1}
    again = make_layer("Conv", [x], conv.args)
    assert again.domain == conv.domain and again.args == conv.args
    with pytest.raises(ValueError, match="unknown layer type 'Nope'.*Conv"):
        make_layer("Nope", [x], {})
    with pytest.raises(ValueError, match="Conv: .*'width'"):
        make_layer("Conv", [x], {"filters": 4, "kernel": 3, "width": 2})
    with pytest.raises(ValueError, match="Einsum: missing argument 'equation'"):
        make_layer("Einsum", [x, x], {})


def test_rmsnorm_costs_like_norm_with_one_scale():
    (x,) = _inputs((4, 6), letters=["bk"])
    rms, norm = RMSNorm(x, axis=-1), Norm(x, axis=-1)
    C = np.array([[1, 1], [2, 3], [4, 1]])
    np.testing.assert_array_equal(rms.cost(C, RHO2), norm.cost(C, RHO2))
    assert rms.parameters() == [((6,), (1,))]
    assert len(norm.parameters()) == 2


def test_cost_splits_into_compute_and_communication():
    # FC (b=8, n=4, k=16) split (2, 1, 1) on rho = 1: compute 3 * 4 * 4 * 16 = 768; the weight
    # gradient (4 * 16 = 64 elements) all-reduced over 2: 64 / 2 * 2 * 1 = 64.
    (x,) = _inputs((8, 16), letters=["bk"])
    costs = FC(x, 4).costs(np.array([[2, 1, 1]]), RHO1)
    assert float(costs.compute[0]) == 768.0 and float(costs.communication[0]) == 64.0
    assert float(costs.total[0]) == 832.0
