"""Hand-worked tests of the per-device memory model (``docs/memory.md``).

For layer ``v`` under configuration ``c``:
``mem(v, c) = param_bytes * P(c) + act_bytes * A(c)`` where

- ``P(c)``: every parameter tensor's element count divided by the product of the splits of
  the iteration-space dimensions it spans (splits of other dimensions replicate it);
- ``A(c)``: every output tensor's element count divided by the product of its tensor
  configuration.

Every expected value below is worked out by hand in a comment: first ``P`` and ``A`` in
elements, then the bytes for the default model (16, 2) and for a second, non-default one.
Shapes are tiny so the arithmetic is obvious.
"""

import math

import numpy as np
import pytest

from pase.model.builder import GraphBuilder
from pase.model.layers import (
    FC,
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
    Softmax,
    SoftmaxCrossEntropy,
    Stack,
    Unravel,
    Unstack,
)
from pase.costing.memory import MemoryModel, activation_elements, parameter_count, parameter_elements

DEFAULT = MemoryModel()  # 16 bytes per parameter, 2 per activation element


def _check(layer, rows, params, acts, default_bytes, other=None, other_bytes=None):
    """Compare element counts and bytes of ``layer`` under ``rows`` with hand values."""
    C = np.array(rows, dtype=np.int64)
    assert parameter_elements(layer, C).tolist() == params
    assert activation_elements(layer, C).tolist() == acts
    assert DEFAULT.layer_memory(layer, C).tolist() == default_bytes
    if other is not None:
        assert other.layer_memory(layer, C).tolist() == other_bytes


def test_default_bytes_are_mixed_precision_adam():
    # docs/memory.md: 2 (fp16 weight) + 2 (fp16 gradient) + 4 + 4 + 4 (fp32 master, Adam m, v) = 16;
    # activations fp16 = 2.
    assert DEFAULT.param_bytes == 16
    assert DEFAULT.act_bytes == 2


# ---------------------------------------------------------------------------------------
# Layers with parameters


def test_fc_weight_n_by_k():
    # x (8, 4) -> FC(2): iteration space (b, n, k) = (8, 2, 4).
    # Weight (n, k) = (2, 4): 8 elements, split c_n * c_k. Output (b, n) = (8, 2): 16, split c_b * c_n.
    #   (1,1,1): P 8,      A 16       -> 16*8 + 2*16 = 160;  (4, 1): 32 + 16 = 48
    #   (2,1,1): P 8 (b split replicates the weight), A 8 -> 128 + 16 = 144;  32 + 8 = 40
    #   (1,2,2): P 8/4 = 2, A 16/2 = 8 -> 32 + 16 = 48;   8 + 8 = 16
    #   (1,1,4): P 8/4 = 2, A 16 (k is reduced, the output is whole) -> 32 + 32 = 64;  8 + 16 = 24
    g = GraphBuilder("t")
    layer = FC(g.input((8, 4), "x", letters="bk"), 2)
    _check(
        layer,
        [(1, 1, 1), (2, 1, 1), (1, 2, 2), (1, 1, 4)],
        [8, 8, 2, 2], [16, 8, 8, 16], [160, 144, 48, 64],
        MemoryModel(4, 1), [48, 40, 16, 24],
    )


def test_fc_on_a_rank_three_input():
    # x (2, 3, 4) -> FC(5): space (b, s, n, k) = (2, 3, 5, 4). Weight (5, 4) = 20; output (2, 3, 5) = 30.
    #   (1,3,1,1): P 20,        A 30/3 = 10     -> 320 + 20 = 340;  (2.5, 0.5): 50 + 5 = 55
    #   (1,1,5,2): P 20/10 = 2, A 30/5 = 6      -> 32 + 12 = 44;    5 + 3 = 8
    #   (2,1,1,2): P 20/2 = 10, A 30/2 = 15     -> 160 + 30 = 190;  25 + 7.5 = 32.5
    g = GraphBuilder("t")
    layer = FC(g.input((2, 3, 4), "x", letters="bsk"), 5)
    _check(
        layer,
        [(1, 3, 1, 1), (1, 1, 5, 2), (2, 1, 1, 2)],
        [20, 2, 10], [10, 6, 15], [340, 44, 190],
        MemoryModel(2.5, 0.5), [55, 8, 32.5],
    )


def test_conv_filter_n_c_r_s():
    # x (2, 4, 5, 5) -> Conv(6 filters, 3x3): ho = wo = 3; space (b, c, ho, wo, r, s, n)
    # = (2, 4, 3, 3, 3, 3, 6). Filter (n, c, r, s) = 6*4*3*3 = 216 elements;
    # output (b, n, ho, wo) = 2*6*3*3 = 108.
    #   all 1:            P 216,               A 108     -> 3456 + 216 = 3672;  (2, 4): 432 + 432 = 864
    #   b split 2:        P 216 (replicated),  A 54      -> 3456 + 108 = 3564;  432 + 216 = 648
    #   c 2, r 3, n 2:    P 216/12 = 18,       A 108/2 = 54 -> 288 + 108 = 396; 36 + 216 = 252
    #   s split 3:        P 216/3 = 72,        A 108     -> 1152 + 216 = 1368;  144 + 432 = 576
    g = GraphBuilder("t")
    layer = Conv(g.input((2, 4, 5, 5), "image"), 6, 3)
    assert layer.domain == (2, 4, 3, 3, 3, 3, 6)
    _check(
        layer,
        [(1,) * 7, (2, 1, 1, 1, 1, 1, 1), (1, 2, 1, 1, 3, 1, 2), (1, 1, 1, 1, 1, 3, 1)],
        [216, 216, 18, 72], [108, 54, 54, 108], [3672, 3564, 396, 1368],
        MemoryModel(2, 4), [864, 648, 252, 576],
    )


def test_conv_with_a_split_height_outside_the_enumeration():
    # The enumeration never splits ho, but any valid configuration can be measured:
    # ho split 3: P 216 (the filter does not span ho), A 108/3 = 36 -> 3456 + 72 = 3528.
    g = GraphBuilder("t")
    layer = Conv(g.input((2, 4, 5, 5), "image"), 6, 3)
    _check(layer, [(1, 1, 3, 1, 1, 1, 1)], [216], [36], [3528])


def test_einsum_with_a_weight_operand():
    # x (b, l, e) = (2, 3, 4) data, W (e, f) = (4, 6) a weight; "ble,ef->blf":
    # space (b, l, f, e) = (2, 3, 6, 4). W spans e and f: 24 elements; output (2, 3, 6) = 36.
    #   (1,1,1,1): P 24,       A 36      -> 384 + 72 = 456;  (4, 1): 96 + 36 = 132
    #   (2,1,1,1): P 24,       A 18      -> 384 + 36 = 420;  96 + 18 = 114
    #   (1,1,2,2): P 24/4 = 6, A 36/2 = 18 -> 96 + 36 = 132; 24 + 18 = 42
    #   (1,3,1,1): P 24,       A 36/3 = 12 -> 384 + 24 = 408; 96 + 12 = 108
    g = GraphBuilder("t")
    x = g.input((2, 3, 4), "x", letters="ble")
    w = g.weight((4, 6), "w", letters="ef")
    layer = Einsum("ble,ef->blf", x, w)
    assert layer.dims == "blfe"
    _check(
        layer,
        [(1, 1, 1, 1), (2, 1, 1, 1), (1, 1, 2, 2), (1, 3, 1, 1)],
        [24, 24, 6, 24], [36, 18, 18, 12], [456, 420, 132, 408],
        MemoryModel(4, 1), [132, 114, 42, 108],
    )


def test_einsum_weight_as_first_operand():
    # W (e, k) = (3, 4) a weight, x (b, l, k) = (2, 5, 4); "ek,blk->ble":
    # space: output dims b, l, e, then the reduction k: (2, 5, 3, 4).
    # W spans e (column 2) and k (column 3): 12 elements; output (2, 5, 3) = 30.
    #   (1,1,3,4): P 12/12 = 1, A 30/3 = 10  -> 16 + 20 = 36;   (8, 8): 8 + 80 = 88
    #   (2,5,1,1): P 12,        A 30/10 = 3  -> 192 + 6 = 198;  96 + 24 = 120
    #   (1,1,1,2): P 12/2 = 6,  A 30         -> 96 + 60 = 156;  48 + 240 = 288
    g = GraphBuilder("t")
    w = g.weight((3, 4), "w", letters="ek")
    x = g.input((2, 5, 4), "x", letters="blk")
    layer = Einsum("ek,blk->ble", w, x)
    assert layer.dims == "blek"
    _check(
        layer,
        [(1, 1, 3, 4), (2, 5, 1, 1), (1, 1, 1, 2)],
        [1, 12, 6], [10, 3, 30], [36, 198, 156],
        MemoryModel(8, 8), [88, 120, 288],
    )


def test_einsum_of_data_inputs_has_no_parameters():
    # The same Einsum with the (4, 6) operand a data input (like a positional encoding or
    # an activation): no parameters, only the output (2, 3, 6) = 36.
    #   (1,1,1,1): A 36 -> 72;  (1,1,2,2): A 18 -> 36. A huge param_bytes changes nothing.
    g = GraphBuilder("t")
    x = g.input((2, 3, 4), "x", letters="ble")
    data = g.input((4, 6), "positional", letters="ef")
    layer = Einsum("ble,ef->blf", x, data)
    assert layer.parameters() == []
    _check(
        layer, [(1, 1, 1, 1), (1, 1, 2, 2)], [0, 0], [36, 18], [72, 36],
        MemoryModel(1e6, 2), [72, 36],
    )


def test_embedding_weight_v_by_d():
    # ids (b, l) = (2, 3), Embedding(V = 10, D = 4): space (b, l, d, v) = (2, 3, 4, 10).
    # Weight (V, D) = 40 elements split c_v * c_d; the ids (and their one-hot) are not
    # parameters. Output (2, 3, 4) = 24 split c_b * c_l * c_d.
    #   (1,1,1,1): P 40,        A 24      -> 640 + 48 = 688;  (4, 1): 160 + 24 = 184
    #   (2,1,1,1): P 40,        A 12      -> 640 + 24 = 664;  160 + 12 = 172
    #   (1,1,2,5): P 40/10 = 4, A 24/2 = 12 -> 64 + 24 = 88;  16 + 12 = 28
    #   (1,1,1,2): P 40/2 = 20, A 24      -> 320 + 48 = 368;  80 + 24 = 104
    g = GraphBuilder("t")
    layer = Embedding(g.input((2, 3), "ids", letters="bl"), 10, 4)
    assert layer.domain == (2, 3, 4, 10)
    _check(
        layer,
        [(1, 1, 1, 1), (2, 1, 1, 1), (1, 1, 2, 5), (1, 1, 1, 2)],
        [40, 40, 4, 20], [24, 12, 12, 24], [688, 664, 88, 368],
        MemoryModel(4, 1), [184, 172, 28, 104],
    )


def test_lstm_weights_l_4n_2k():
    # x (b, s, k) = (2, 3, 4), LSTM(2 layers): space (L, s, b, n, k) = (2, 3, 2, 4, 4).
    # Weights (L, 4n, 2k) = 2 * 16 * 8 = 256 split c_L * c_n * c_k; output (b, s, n) = 24.
    #   all 1:      P 256,        A 24      -> 4096 + 48 = 4144;  (2, 4): 512 + 96 = 608
    #   b split 2:  P 256,        A 12      -> 4096 + 24 = 4120;  512 + 48 = 560
    #   (2,1,1,2,2): P 256/8 = 32, A 24/2 = 12 -> 512 + 24 = 536; 64 + 48 = 112
    #   k split 4:  P 256/4 = 64, A 24 (k is the input width) -> 1024 + 48 = 1072; 128 + 96 = 224
    #   n split 4:  P 64,         A 24/4 = 6 -> 1024 + 12 = 1036; 128 + 24 = 152
    g = GraphBuilder("t")
    layer = LSTM(g.input((2, 3, 4), "x"), 2)
    assert layer.domain == (2, 3, 2, 4, 4)
    _check(
        layer,
        [(1, 1, 1, 1, 1), (1, 1, 2, 1, 1), (2, 1, 1, 2, 2), (1, 1, 1, 1, 4), (1, 1, 1, 4, 1)],
        [256, 256, 32, 64, 64], [24, 12, 12, 24, 6], [4144, 4120, 536, 1072, 1036],
        MemoryModel(2, 4), [608, 560, 112, 224, 152],
    )


def test_norm_scale_and_bias_on_the_last_axis():
    # x (2, 3, 4), Norm(axis -1): scale and bias of length 4 each = 8 split c[2]; output 24.
    #   (1,1,1): P 8,      A 24      -> 128 + 48 = 176;  (4, 1): 32 + 24 = 56
    #   (2,1,1): P 8,      A 12      -> 128 + 24 = 152;  32 + 12 = 44
    #   (1,1,4): P 8/4 = 2, A 6      -> 32 + 12 = 44;    8 + 6 = 14
    #   (1,3,2): P 8/2 = 4, A 24/6 = 4 -> 64 + 8 = 72;   16 + 4 = 20
    g = GraphBuilder("t")
    layer = Norm(g.input((2, 3, 4), "x"), axis=-1)
    _check(
        layer,
        [(1, 1, 1), (2, 1, 1), (1, 1, 4), (1, 3, 2)],
        [8, 8, 2, 4], [24, 12, 6, 4], [176, 152, 44, 72],
        MemoryModel(4, 1), [56, 44, 14, 20],
    )


def test_norm_on_a_middle_axis():
    # x (2, 3, 4), Norm(axis 1): scale and bias of length 3 each = 6 split c[1].
    #   (1,3,1): P 6/3 = 2, A 24/3 = 8 -> 32 + 16 = 48
    #   (1,1,4): P 6 (axis 1 unsplit), A 6 -> 96 + 12 = 108
    g = GraphBuilder("t")
    layer = Norm(g.input((2, 3, 4), "x"), axis=1)
    _check(layer, [(1, 3, 1), (1, 1, 4)], [2, 6], [8, 6], [48, 108])


def test_batchnorm_parameters_are_per_channel():
    # The cost model treats BatchNorm as Norm on axis 0, but its learned scale and bias
    # are per channel: two tensors of length c = dom[1], split c[1] (a batch split
    # replicates them). x (4, 3, 2, 2): P = 2 * 3 = 6, output 48.
    #   (1,1,1,1): P 6,       A 48 -> 96 + 96 = 192;  (4, 1): 24 + 48 = 72
    #   (4,1,1,1): P 6,       A 12 -> 96 + 24 = 120;  24 + 12 = 36
    #   (1,3,1,1): P 6/3 = 2, A 16 -> 32 + 32 = 64;   8 + 16 = 24
    #   (2,1,2,1): P 6,       A 12 -> 96 + 24 = 120;  24 + 12 = 36
    g = GraphBuilder("t")
    layer = BatchNorm(g.input((4, 3, 2, 2), "x"))
    _check(
        layer,
        [(1, 1, 1, 1), (4, 1, 1, 1), (1, 3, 1, 1), (2, 1, 2, 1)],
        [6, 6, 2, 6], [48, 12, 16, 12], [192, 120, 64, 120],
        MemoryModel(4, 1), [72, 36, 24, 36],
    )


def test_resnet_parameter_count_does_not_depend_on_the_batch():
    # Per-channel batch-norm parameters: the count is a property of the model alone.
    import graphs
    from pase.costing.memory import parameter_count
    assert parameter_count(graphs.build("resnet101", 64)) == parameter_count(graphs.build("resnet101", 128))


# ---------------------------------------------------------------------------------------
# Activations only


def test_unstack_counts_every_output():
    # x (3, 2, 4) Unstack(axis 0): space (1, 2, 4); three outputs (2, 4) = 8 each, 24 in all,
    # each split like the space without axis 0.
    #   (1,1,1): A 24     -> 48;  (16, 3): 72
    #   (1,2,1): A 3*4 = 12 -> 24; 36
    #   (1,2,4): A 3*1 = 3  -> 6;  9
    g = GraphBuilder("t")
    layer = Unstack(g.input((3, 2, 4), "x"), axis=0)
    _check(
        layer, [(1, 1, 1), (1, 2, 1), (1, 2, 4)], [0, 0, 0], [24, 12, 3], [48, 24, 6],
        MemoryModel(16, 3), [72, 36, 9],
    )


def test_unstack_on_a_middle_axis():
    # x (2, 3, 4) Unstack(axis 1): space (2, 1, 4); three outputs (2, 4).
    #   (2,1,2): A 3 * 8/4 = 6 -> 12
    g = GraphBuilder("t")
    layer = Unstack(g.input((2, 3, 4), "x"), axis=1)
    _check(layer, [(2, 1, 2)], [0], [6], [12])


def test_concat_output_sums_the_axis():
    # (2, 3, 4) and (2, 5, 4) on axis 1: space (2, 1, 4); output (2, 8, 4) = 64.
    #   (1,1,1): 64 -> 128; (2,1,2): 16 -> 32; (1,1,4): 16 -> 32; (2,1,4): 8 -> 16
    #   (1, 5): 64 + 0 = 64 ... with act_bytes 5: 320, 80, 80, 40
    g = GraphBuilder("t")
    layer = Concat([g.input((2, 3, 4), "a"), g.input((2, 5, 4), "b")], axis=1)
    _check(
        layer, [(1, 1, 1), (2, 1, 2), (1, 1, 4), (2, 1, 4)], [0] * 4, [64, 16, 16, 8],
        [128, 32, 32, 16], MemoryModel(1, 5), [320, 80, 80, 40],
    )


def test_reduce_mean_drops_the_reduced_axes():
    # x (2, 3, 4, 5), mean over axes (2, 3): output (2, 3) = 6 split (c0, c1).
    #   (1,1,1,1): 6 -> 12;   (1,1,4,5): 6 (splitting reduced axes leaves the output whole) -> 12
    #   (2,3,1,1): 1 -> 2;    (2,1,2,1): 3 -> 6
    g = GraphBuilder("t")
    layer = ReduceMean(g.input((2, 3, 4, 5), "x"), (2, 3))
    assert layer.output_shapes == ((2, 3),)
    _check(
        layer, [(1, 1, 1, 1), (1, 1, 4, 5), (2, 3, 1, 1), (2, 1, 2, 1)], [0] * 4, [6, 6, 1, 3],
        [12, 12, 2, 6], MemoryModel(0, 4), [24, 24, 4, 12],
    )


def test_reduce_mean_keepdims_and_all_axes():
    # keepdims: output (2, 3, 1, 1) = 6; (2,1,4,5) -> 6/2 = 3 elements -> 6 bytes.
    g = GraphBuilder("t")
    layer = ReduceMean(g.input((2, 3, 4, 5), "x"), (2, 3), keepdims=True)
    _check(layer, [(2, 1, 4, 5)], [0], [3], [6])
    # Every axis reduced: a single element, whatever the split -> 2 bytes.
    layer = ReduceMean(g.input((2, 3), "y"), (0, 1))
    _check(layer, [(1, 1), (2, 3)], [0, 0], [1, 1], [2, 2])


@pytest.mark.parametrize(
    "make, row, acts",
    [
        # Elementwise (2, 3) split (2, 1): 6/2 = 3.
        (lambda g: Elementwise(g.input((2, 3), "a"), g.input((2, 3), "b")), (2, 1), 3),
        # Softmax (2, 3, 4) split (1, 3, 2): 24/6 = 4.
        (lambda g: Softmax(g.input((2, 3, 4), "x"), axis=2), (1, 3, 2), 4),
        # SoftmaxCrossEntropy (2, 5) split (2, 5): 10/10 = 1.
        (lambda g: SoftmaxCrossEntropy(g.input((2, 5), "x")), (2, 5), 1),
        # Pooling (2, 3, 5, 5), 3x3 stride 2: output (2, 3, 2, 2) = 24, split (2, 3, 2, 1): 2.
        (lambda g: Pooling(g.input((2, 3, 5, 5), "x"), 3, stride=2), (2, 3, 2, 1), 2),
        # Ravel (2, 3, 4) -> (24,), split (2, 3, 1) gives the flat tensor 6 parts: 4.
        (lambda g: Ravel(g.input((2, 3, 4), "x")), (2, 3, 1), 4),
        # Unravel (24,) -> (2, 3, 4) split (2, 3, 1): 4.
        (lambda g: Unravel(g.input((24,), "x"), (2, 3, 4)), (2, 3, 1), 4),
        # Stack two (2, 3) on axis 0: output (2, 2, 3) = 12, split (1, 2, 3): 2.
        (lambda g: Stack([g.input((2, 3), "a"), g.input((2, 3), "b")], axis=0), (1, 2, 3), 2),
    ],
    ids=["elementwise", "softmax", "softmax-xent", "pooling", "ravel", "unravel", "stack"],
)
def test_layers_without_parameters(make, row, acts):
    layer = make(GraphBuilder("t"))
    assert layer.parameters() == []
    # Only act_bytes matters: 2 * acts by default, 3 * acts with (1e6, 3).
    _check(layer, [row], [0], [acts], [2 * acts], MemoryModel(1e6, 3), [3 * acts])


# ---------------------------------------------------------------------------------------
# A strategy of a small network


def _small_network(cutoff=1):
    """x (8, 4) -> fc1 FC(6) -> norm Norm(-1) -> fc2 FC(2) -> loss."""
    g = GraphBuilder("small", cutoff=cutoff)
    x = g.input((8, 4), "x", letters="bk")
    h = g.add("fc1", FC(x, 6))           # space (8, 6, 4)
    h = g.add("norm", Norm(h, axis=-1))  # space (8, 6)
    h = g.add("fc2", FC(h, 2))           # space (8, 2, 6)
    g.add("loss", SoftmaxCrossEntropy(h))  # space (8, 2)
    return g.build()


# fc1 (2,3,1): P 24/3 = 8,          A 48/6 = 8 -> 128 + 16 = 144;  (4, 1): 32 + 8 = 40
# norm (2,3):  P 2*6/3 = 4,         A 48/6 = 8 -> 64 + 16 = 80;    16 + 8 = 24
# fc2 (4,1,2): P 12/2 = 6,          A 16/4 = 4 -> 96 + 8 = 104;    24 + 4 = 28
# loss (8,1):  no parameters,       A 16/8 = 2 -> 4;               2
# total: 144 + 80 + 104 + 4 = 332;  (4, 1): 40 + 24 + 28 + 2 = 94
STRATEGY = [(2, 3, 1), (2, 3), (4, 1, 2), (8, 1)]


def test_strategy_memory_and_per_device():
    net = _small_network()
    assert DEFAULT.strategy_memory(net, STRATEGY, 8).tolist() == [144, 80, 104, 4]
    assert DEFAULT.per_device(net, STRATEGY, 8) == 332
    assert DEFAULT.per_device(net, STRATEGY) == 332  # procs is optional
    assert MemoryModel(4, 1).strategy_memory(net, STRATEGY, 8).tolist() == [40, 24, 28, 2]
    assert MemoryModel(4, 1).per_device(net, STRATEGY, 8) == 94


def test_configurations_outside_the_enumerated_set():
    # With cut-off 4, fc1 (8, 6, 4) may split only b, and only 2 ways (8/2 >= 4, 6/2 < 4,
    # 4/2 < 4): (2, 3, 1) is not enumerated, yet its memory is the same 144.
    net = _small_network(cutoff=4)
    enumerated = [tuple(r) for r in net.configs(8)[0].tolist()]
    assert enumerated == [(1, 1, 1), (2, 1, 1)]
    assert (2, 3, 1) not in enumerated
    assert DEFAULT.per_device(net, STRATEGY, 8) == 332


def test_invalid_strategies_are_rejected():
    net = _small_network()
    with pytest.raises(ValueError):
        DEFAULT.per_device(net, STRATEGY, 4)  # fc1 needs 6 devices
    with pytest.raises(ValueError):
        DEFAULT.per_device(net, [(3, 1, 1)] + STRATEGY[1:], 8)  # 3 does not divide 8
    with pytest.raises(ValueError):
        DEFAULT.per_device(net, STRATEGY[:3], 8)  # one configuration short
    with pytest.raises(ValueError):
        DEFAULT.strategy_memory(net, [(2, 3)] + STRATEGY[1:], 8)  # wrong length for fc1


def test_vectors_over_the_enumerated_configurations():
    # Cut-off 4, p = 8: fc1 has (1,1,1) and (2,1,1).
    #   (1,1,1): P 24, A 48 -> 384 + 96 = 480;  (2,1,1): P 24, A 24 -> 384 + 48 = 432.
    # loss (8, 2): b splits 1, 2 (8/e >= 4), class axis 2 unsplit: A 16 -> 32, A 8 -> 16.
    net = _small_network(cutoff=4)
    vectors = DEFAULT.vectors(net, net.configs(8))
    assert len(vectors) == 4
    assert vectors[0].tolist() == [480, 432]
    assert vectors[3].tolist() == [32, 16]


def test_parameter_count():
    # fc1 weight 6*4 = 24, norm scale + bias 2*6 = 12, fc2 weight 2*6 = 12: 48.
    assert parameter_count(_small_network()) == 48


def test_parameter_count_ignores_data_inputs():
    # Embedding (10, 4) = 40; a positional input (2, 3, 4) added element-wise is data;
    # an Einsum with a weight (4, 5) = 20; an Einsum with a data operand (5, 7) adds nothing.
    g = GraphBuilder("mixed")
    ids = g.input((2, 3), "ids", letters="bl")
    pos = g.input((2, 3, 4), "positional", letters="ble")
    x = g.add("embedding", Embedding(ids, 10, 4))
    x = g.add("position", Elementwise(x, pos))
    x = g.add("proj", Einsum("ble,ef->blf", x, g.weight((4, 5), "w", letters="ef")))
    g.add("mix", Einsum("blf,fg->blg", x, g.input((5, 7), "data", letters="fg")))
    assert parameter_count(g.build()) == 40 + 20


@pytest.mark.parametrize("field", ["param_bytes", "act_bytes"])
@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, True, "16", None])
def test_invalid_byte_sizes_are_rejected(field, bad):
    with pytest.raises(ValueError):
        MemoryModel(**{field: bad})


def test_zero_and_fractional_byte_sizes_are_accepted():
    # param_bytes 0 (e.g. frozen weights counted elsewhere): FC (8,2,4) at (1,1,1): 0*8 + 1.5*16 = 24.
    g = GraphBuilder("t")
    layer = FC(g.input((8, 4), "x", letters="bk"), 2)
    assert MemoryModel(0, 1.5).layer_memory(layer, np.array([[1, 1, 1]])).tolist() == [24]
