"""Stages 1 and 2 per layer type: iteration space, tensor configurations and layer cost.

One class per layer type of ``cost-model.md``. Every cost is a vectorised function of an
``int`` array of configurations (one row each), enumerated or not, so baselines and
user-given strategies are costed by exactly the same code as the search's tables.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from .machine import Machine
from .tensor import Tensor

__all__ = [
    "Layer",
    "Conv",
    "Pooling",
    "FC",
    "Einsum",
    "Embedding",
    "Elementwise",
    "Concat",
    "Norm",
    "BatchNorm",
    "ReduceMean",
    "Softmax",
    "SoftmaxCrossEntropy",
    "LSTM",
    "Ravel",
    "Unravel",
    "Stack",
    "Unstack",
    "gemm_cost",
    "redistribution_volume",
    "LAYER_TYPES",
]


# ---------------------------------------------------------------------------------------
# Shared cost pieces


def gemm_cost(machine: Machine, batch, batch_split, M, m, N, n, K, k, pw: int = 0):
    """Cost of a (batched) GEMM of sizes ``(B.., M, N, K)`` split ``(b.., m, n, k)``.

    ``batch`` and ``batch_split`` are the products over the batch dimensions (1 when there
    are none). Arguments broadcast; the result is one cost per configuration:
    ``Bp * (3 Mp Np Kp + 3 pw Mp Np + AR(Mp Np, k) + AR(Mp Kp, n) + AR(Np Kp, m))``:
    one GEMM forward and two backward, the forward output reduced over ``k``, the input
    gradient over ``n`` and the weight gradient over ``m``.
    """
    Bp = np.asarray(batch, dtype=np.float64) / batch_split
    Mp = np.asarray(M, dtype=np.float64) / m
    Np = np.asarray(N, dtype=np.float64) / n
    Kp = np.asarray(K, dtype=np.float64) / k
    compute = 3.0 * Mp * Np * Kp
    if pw > 0:
        compute = compute + 3.0 * pw * Mp * Np
    comm = (
        machine.all_reduce(Mp * Np, k)
        + machine.all_reduce(Mp * Kp, n)
        + machine.all_reduce(Np * Kp, m)
    )
    return Bp * (compute + comm)


def redistribution_volume(shape, source, target):
    """Words a device lacks when a tensor split ``source`` is needed split ``target``.

    ``max(prod(tgt) - overlap, 0)`` with ``tgt = shape / target``, ``src = shape / source``
    and ``overlap = prod(min(tgt, src))``, or 0 when the target uses more devices than the
    source. ``source`` and ``target`` broadcast against each other (last axis: tensor dims).
    """
    shape = np.asarray(shape, dtype=np.float64)
    source = np.asarray(source)
    target = np.asarray(target)
    src = shape / source
    tgt = shape / target
    tgt_block = tgt.prod(axis=-1)
    overlap = np.minimum(tgt, src).prod(axis=-1)
    overlap = np.where(target.prod(axis=-1) > source.prod(axis=-1), 0.0, overlap)
    return np.maximum(tgt_block - overlap, 0.0)


def _as_float(configs: np.ndarray) -> np.ndarray:
    return np.asarray(configs, dtype=np.float64)


def _check_shape(shape, what: str) -> tuple:
    shape = tuple(shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"{what}: every size must be a positive integer, got {list(shape)}")
    return tuple(int(d) for d in shape)


def _check_positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _check_axis(axis, rank: int, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -rank <= axis < rank:
        raise ValueError(f"{what}: axis {axis!r} is out of range for rank {rank}")
    return int(axis) % rank


def _pair(value, what: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{what} must be one integer or a pair, got {value!r}")
        return tuple(value)
    return (value, value)


def _tensor(x, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a Tensor, got {type(x).__name__}")
    return x


# ---------------------------------------------------------------------------------------
# Base class


class Layer:
    """A vertex of the computation graph.

    Subclasses set, in ``__init__``:

    - ``inputs``: the tensors it reads (graph inputs make no edges);
    - ``domain``: the iteration space, a tuple of sizes, and ``dims``: one letter each;
    - ``output_shapes``: the shape of every output tensor;
    - ``unsplit``: dimensions the enumeration treats as size 1 (default none);
    - ``contiguous``: keep only contiguous configurations (Ravel, Unravel);
    - ``batch_dim``: the iteration-space dimension that data parallelism splits.

    and implement ``input_configs``, ``output_configs`` and ``cost`` for an array of
    configurations ``C`` of shape ``(K, len(domain))``.
    """

    op = "Layer"
    contiguous = False

    inputs: tuple
    domain: tuple
    dims: str
    output_shapes: tuple
    batch_dim: int = 0

    @property
    def unsplit(self) -> tuple:
        return getattr(self, "_unsplit", (False,) * len(self.domain))

    def input_configs(self, C: np.ndarray) -> list:
        """Tensor configuration of every input, one ``(K, rank)`` array each."""
        raise NotImplementedError

    def output_configs(self, C: np.ndarray) -> list:
        """Tensor configuration of every output, one ``(K, rank)`` array each."""
        raise NotImplementedError

    def cost(self, C: np.ndarray, machine: Machine) -> np.ndarray:
        """Layer cost (FLOP-equivalents) of every configuration row of ``C``."""
        raise NotImplementedError

    def parameters(self) -> list:
        """Parameter tensors as ``(shape, spanned iteration-space dims)`` pairs.

        A parameter tensor is split by the product of the splits of the dimensions it
        spans and replicated across the others (``memory.md``).
        """
        return []

    # Helpers for subclasses ------------------------------------------------------------

    def _per_device(self, C: np.ndarray) -> np.ndarray:
        """``dpp = dom / c``: per-device size of every dimension."""
        return np.asarray(self.domain, dtype=np.float64) / _as_float(C)

    def _E(self, C: np.ndarray) -> np.ndarray:
        return self._per_device(C).prod(axis=1)

    def describe(self) -> str:
        return self.op

    def __repr__(self) -> str:
        return f"{self.op}(domain={list(self.domain)})"


# ---------------------------------------------------------------------------------------
# Compute layers


class Conv(Layer):
    """2-D convolution: image ``(b, c, h, w)``, ``n`` filters of ``r x s``.

    Iteration space ``(b, c, ho, wo, r, s, n)``; ``ho`` and ``wo`` are never split.
    Costed as a GEMM with ``M = b ho wo``, ``N = n``, ``K = c r s``.
    """

    op = "Conv"

    def __init__(self, x: Tensor, filters: int, kernel, stride=1, pad=0, pw: int = 0):
        x = _tensor(x, "Conv input")
        if x.rank != 4:
            raise ValueError(f"Conv needs a (b, c, h, w) image, got shape {list(x.shape)}")
        b, c, h, w = x.shape
        n = _check_positive(filters, "Conv filter count")
        r, s = (_check_positive(v, "Conv kernel size") for v in _pair(kernel, "Conv kernel"))
        sh, sw = (_check_positive(v, "Conv stride") for v in _pair(stride, "Conv stride"))
        ph, pwd = _pair(pad, "Conv pad")
        if min(ph, pwd) < 0:
            raise ValueError(f"Conv pad must be non-negative, got {pad!r}")
        ho = (h - r + 2 * ph) // sh + 1
        wo = (w - s + 2 * pwd) // sw + 1
        if h - r + 2 * ph < 0 or w - s + 2 * pwd < 0:
            raise ValueError(f"Conv kernel {r}x{s} does not fit the padded {h}x{w} image")
        # TODO(jax): temporary, until main's Layer.args lands (the JAX verifier reads it).
        self.args = {"filters": n, "kernel": [r, s], "stride": [sh, sw], "pad": [ph, pwd], "pw": int(pw)}
        self.inputs = (x,)
        self.pw = int(pw)
        self.domain = (b, c, ho, wo, r, s, n)
        self.dims = "bchwrsn"
        self._unsplit = (False, False, True, True, False, False, False)
        self.output_shapes = ((b, n, ho, wo),)
        self.output_letters = ("bchw",)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C[:, [0, 1, 2, 3]]]

    def output_configs(self, C):
        return [C[:, [0, 6, 2, 3]]]

    def cost(self, C, machine):
        b, c, ho, wo, r, s, n = self.domain
        C = _as_float(C)
        return gemm_cost(
            machine, 1.0, 1.0,
            b * ho * wo, C[:, 0] * C[:, 2] * C[:, 3],
            n, C[:, 6],
            c * r * s, C[:, 1] * C[:, 4] * C[:, 5],
            self.pw,
        )

    def parameters(self):
        b, c, ho, wo, r, s, n = self.domain
        return [((n, c, r, s), (6, 1, 4, 5))]


class Pooling(Layer):
    """Max/average pooling: image ``(b, c, h, w)``, window ``r x s``.

    Iteration space ``(b, c, ho, wo)``, all splittable. Cost: one operation per output
    element plus the halo exchange when the height or width is split.
    """

    op = "Pooling"

    def __init__(self, x: Tensor, window, stride=1, pad=0):
        x = _tensor(x, "Pooling input")
        if x.rank != 4:
            raise ValueError(f"Pooling needs a (b, c, h, w) image, got shape {list(x.shape)}")
        b, c, h, w = x.shape
        r, s = (_check_positive(v, "Pooling window") for v in _pair(window, "Pooling window"))
        sh, sw = (_check_positive(v, "Pooling stride") for v in _pair(stride, "Pooling stride"))
        ph, pwd = _pair(pad, "Pooling pad")
        if min(ph, pwd) < 0:
            raise ValueError(f"Pooling pad must be non-negative, got {pad!r}")
        if h - r + 2 * ph < 0 or w - s + 2 * pwd < 0:
            raise ValueError(f"Pooling window {r}x{s} does not fit the padded {h}x{w} image")
        ho = (h - r + 2 * ph) // sh + 1
        wo = (w - s + 2 * pwd) // sw + 1
        # TODO(jax): temporary, until main's Layer.args lands (the JAX verifier reads it).
        self.args = {"window": [r, s], "stride": [sh, sw], "pad": [ph, pwd]}
        self.inputs = (x,)
        self.window = (r, s)
        self.image = (h, w)
        self.domain = (b, c, ho, wo)
        self.dims = "bchw"
        self.output_shapes = ((b, c, ho, wo),)
        self.output_letters = ("bchw",)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C]

    def cost(self, C, machine):
        b, c = self.domain[:2]
        h, w = self.image
        r, s = self.window
        C = _as_float(C)
        # Halo of the unpadded input image divided by the output's height/width splits.
        hi = h / C[:, 2]
        wi = w / C[:, 3]
        hg = np.where(C[:, 2] > 1, hi + r, hi)
        wg = np.where(C[:, 3] > 1, wi + s, wi)
        halo = (hg * wg - hi * wi) * (b / C[:, 0]) * (c / C[:, 1])
        return self._E(C) + machine.comm(halo)


class FC(Layer):
    """Fully-connected layer: input ``(x1..xj, k)``, ``n`` units.

    Iteration space ``(x1..xj, n, k)``; a GEMM with ``M = prod(x)``, ``N = n``, ``K = k``.
    """

    op = "FC"

    def __init__(self, x: Tensor, units: int, pw: int = 0, letters: str | None = None):
        x = _tensor(x, "FC input")
        if x.rank < 2:
            raise ValueError(f"FC needs an input of rank >= 2, got shape {list(x.shape)}")
        n = _check_positive(units, "FC unit count")
        j = x.rank - 1
        letters = letters or (_letters_of(x)[:-1] if x.letters else "b" + "stuvw"[: j - 1])
        if len(letters) != j:
            raise ValueError(f"FC letters {letters!r} must name the {j} leading input dims")
        self.inputs = (x,)
        self.pw = int(pw)
        self.domain = tuple(x.shape[:-1]) + (n, x.shape[-1])
        self.dims = letters + "nk"
        self.output_shapes = (tuple(x.shape[:-1]) + (n,),)
        self.output_letters = (letters + "n",)
        self.batch_dim = 0

    def input_configs(self, C):
        j = len(self.domain) - 2
        return [C[:, list(range(j)) + [j + 1]]]

    def output_configs(self, C):
        j = len(self.domain) - 2
        return [C[:, : j + 1]]

    def cost(self, C, machine):
        j = len(self.domain) - 2
        C = _as_float(C)
        return gemm_cost(
            machine, 1.0, 1.0,
            math.prod(self.domain[:j]), C[:, :j].prod(axis=1),
            self.domain[j], C[:, j],
            self.domain[j + 1], C[:, j + 1],
            self.pw,
        )

    def parameters(self):
        j = len(self.domain) - 2
        return [((self.domain[j], self.domain[j + 1]), (j, j + 1))]


_EQUATION = re.compile(r"^([a-z]+),([a-z]+)->([a-z]+)$")


class Einsum(Layer):
    """A two-operand Einsum such as ``ble,ef->blf``, costed as a batched GEMM.

    Iteration space: output dims in output order, then reduction dims in order of first
    appearance in ``A``. Batch dims are in ``A``, ``B`` and the output; ``M`` dims in ``A``
    and the output only; ``N`` dims in ``B`` and the output only; ``K`` dims in ``A`` and
    ``B`` only.
    """

    op = "Einsum"

    def __init__(self, equation: str, a: Tensor, b: Tensor, pw: int = 0, batch: str | None = None):
        a = _tensor(a, "Einsum operand A")
        b = _tensor(b, "Einsum operand B")
        eq = equation.replace(" ", "") if isinstance(equation, str) else equation
        match = _EQUATION.match(eq) if isinstance(eq, str) else None
        if not match:
            raise ValueError(f"bad Einsum equation {equation!r}: expected 'ab,bc->ac' with lower-case letters")
        in_a, in_b, out = match.groups()
        for term in (in_a, in_b, out):
            if len(set(term)) != len(term):
                raise ValueError(f"bad Einsum equation {equation!r}: a letter repeats within {term!r}")
        for term, t, what in ((in_a, a, "A"), (in_b, b, "B")):
            if len(term) != t.rank:
                raise ValueError(
                    f"Einsum {equation!r}: operand {what} has {t.rank} dims, the equation gives {len(term)}"
                )
        sizes: dict = {}
        for term, t in ((in_a, a), (in_b, b)):
            for letter, size in zip(term, t.shape):
                if sizes.setdefault(letter, size) != size:
                    raise ValueError(
                        f"Einsum {equation!r}: dimension {letter!r} is {sizes[letter]} in one operand and {size} in the other"
                    )
        for letter in out:
            if letter not in sizes:
                raise ValueError(f"Einsum {equation!r}: output dimension {letter!r} is in neither operand")
        for letter in sizes:
            if letter not in out and not (letter in in_a and letter in in_b):
                raise ValueError(
                    f"Einsum {equation!r}: dimension {letter!r} is in one operand only and not in the output"
                )
        reduction = [l for l in in_a if l not in out]
        space = list(out) + reduction
        self.batch_letters = [l for l in out if l in in_a and l in in_b]
        self.m_letters = [l for l in out if l in in_a and l not in in_b]
        self.n_letters = [l for l in out if l in in_b and l not in in_a]
        self.k_letters = reduction
        if not self.m_letters or not self.n_letters:
            raise ValueError(
                f"Einsum {equation!r} is not a GEMM: it needs a dimension of A only and one of B only in the output"
            )
        self.equation = eq
        self.terms = (in_a, in_b, out)
        self.inputs = (a, b)
        self.pw = int(pw)
        self.dims = "".join(space)
        self.domain = tuple(sizes[l] for l in space)
        self.output_shapes = (tuple(sizes[l] for l in out),)
        self.output_letters = (out,)
        if batch is None:
            batch = "b" if "b" in space else space[0]
        if batch not in space:
            raise ValueError(f"Einsum {equation!r}: batch dimension {batch!r} is not in its iteration space")
        self.batch_dim = space.index(batch)
        self._cols = {l: i for i, l in enumerate(space)}

    def _columns(self, letters) -> list:
        return [self._cols[l] for l in letters]

    def input_configs(self, C):
        return [C[:, self._columns(self.terms[0])], C[:, self._columns(self.terms[1])]]

    def output_configs(self, C):
        return [C[:, : len(self.terms[2])]]

    def cost(self, C, machine):
        C = _as_float(C)
        dom = np.asarray(self.domain, dtype=np.float64)

        def size_and_split(letters):
            cols = self._columns(letters)
            return dom[cols].prod(), C[:, cols].prod(axis=1)

        B, b = size_and_split(self.batch_letters)
        M, m = size_and_split(self.m_letters)
        N, n = size_and_split(self.n_letters)
        K, k = size_and_split(self.k_letters)
        return gemm_cost(machine, B, b, M, m, N, n, K, k, self.pw)

    def parameters(self):
        return [
            (t.shape, tuple(self._columns(term)))
            for t, term in zip(self.inputs, self.terms[:2])
            if t.is_param
        ]

    def describe(self):
        return f"Einsum {self.equation}"


class Embedding(Einsum):
    """Embedding lookup, modelled as the Einsum of a one-hot ``(x.., V)`` with ``(V, D)``.

    Iteration space ``(x1..xj, D, V)``. The token ids (and so the one-hot) are a graph
    input: they make no edge.
    """

    op = "Embedding"

    def __init__(self, ids: Tensor, vocab: int, width: int, letters: str | None = None):
        ids = _tensor(ids, "Embedding ids")
        if ids.producer is not None:
            raise ValueError("Embedding ids must be a graph input (token ids), not a layer output")
        vocab = _check_positive(vocab, "Embedding vocabulary")
        width = _check_positive(width, "Embedding width")
        j = ids.rank
        letters = letters or (ids.letters if len(ids.letters) == j else "b" + "stuw"[: j - 1])
        if len(letters) != j or "d" in letters or "v" in letters:
            raise ValueError(f"Embedding letters {letters!r} must name the {j} id dims without 'd' or 'v'")
        one_hot = Tensor(tuple(ids.shape) + (vocab,), None, ids.index, False, ids.name, ids.owner)
        weight = Tensor((vocab, width), None, -1, True, "embedding weight", ids.owner)
        super().__init__(f"{letters}v,vd->{letters}d", one_hot, weight, batch=letters[0])
        self.ids = ids
        self.vocab = vocab
        self.width = width

    def describe(self):
        return "Embedding"


# ---------------------------------------------------------------------------------------
# Point-wise and normalisation layers


class Elementwise(Layer):
    """Element-wise combination of two tensors of one shape, ``pw`` fused operations."""

    op = "Elementwise"

    def __init__(self, a: Tensor, b: Tensor, pw: int = 0):
        a = _tensor(a, "Elementwise operand A")
        b = _tensor(b, "Elementwise operand B")
        if a.shape != b.shape:
            raise ValueError(f"Elementwise operands differ in shape: {list(a.shape)} and {list(b.shape)}")
        self.inputs = (a, b)
        self.pw = int(pw)
        self.domain = tuple(a.shape)
        self.dims = _letters_of(a) if a.letters else _letters_of(b)
        self.output_shapes = (tuple(a.shape),)
        self.output_letters = (self.dims,)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C, C]

    def output_configs(self, C):
        return [C]

    def cost(self, C, machine):
        return (1.0 + self.pw) * self._E(C)


class _ShapeOfInput(Layer):
    """A layer on one tensor whose iteration space is that tensor's shape.

    Its input and its output (of the same shape) are split exactly like the iteration space.
    """

    def __init__(self, x: Tensor):
        x = _tensor(x, f"{self.op} input")
        self.inputs = (x,)
        self.domain = tuple(x.shape)
        self.dims = _letters_of(x)
        self.output_shapes = (tuple(x.shape),)
        self.output_letters = (self.dims,)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C]


class Norm(_ShapeOfInput):
    """Normalisation over one axis (layer norm on the last axis, batch norm on axis 0).

    Cost: ``16 E + 4 AR(E / dpp[axis], c[axis]) + 4 AR(dpp[axis], prod(c without axis))``
    (statistics reduced across the axis splits, scale/bias gradients across the others).
    """

    op = "Norm"

    def __init__(self, x: Tensor, axis: int = -1):
        super().__init__(x)
        self.axis = _check_axis(axis, x.rank, self.op)

    def cost(self, C, machine):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        a = self.axis
        split_axis = _as_float(C[:, a])
        split_rest = _as_float(np.delete(C, a, axis=1)).prod(axis=1)
        return (
            16.0 * E
            + 4.0 * machine.all_reduce(E / dpp[:, a], split_axis)
            + 4.0 * machine.all_reduce(dpp[:, a], split_rest)
        )

    def parameters(self):
        # Scale and bias, each of length dom[axis], split c[axis].
        return [((self.domain[self.axis],), (self.axis,))] * 2


class BatchNorm(Norm):
    """Batch normalisation: the reference model's Norm with axis 0.

    Its cost is that of ``Norm(x, axis=0)`` (``cost-model.md``). Its parameters, for the
    memory model, are what batch norm learns: a scale and a bias per channel (axis 1).
    """

    op = "BatchNorm"

    def __init__(self, x: Tensor):
        super().__init__(x, axis=0)
        if x.rank < 2:
            raise ValueError(f"BatchNorm needs a (batch, channel, ...) input, got shape {list(x.shape)}")

    def parameters(self):
        return [((self.domain[1],), (1,))] * 2


class ReduceMean(Layer):
    """Mean over some axes; the output drops them (or keeps them as size 1)."""

    op = "ReduceMean"

    def __init__(self, x: Tensor, axes, keepdims: bool = False):
        x = _tensor(x, "ReduceMean input")
        axes = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
        if not axes:
            raise ValueError("ReduceMean needs at least one axis")
        self.axes = tuple(sorted({_check_axis(a, x.rank, "ReduceMean") for a in axes}))
        if len(self.axes) != len(axes):
            raise ValueError(f"ReduceMean axes {list(axes)} repeat an axis")
        self.keepdims = bool(keepdims)
        self.inputs = (x,)
        self.domain = tuple(x.shape)
        self.dims = _letters_of(x)
        self.batch_dim = 0
        if self.keepdims:
            out = tuple(1 if i in self.axes else d for i, d in enumerate(x.shape))
        else:
            out = tuple(d for i, d in enumerate(x.shape) if i not in self.axes) or (1,)
        self.output_shapes = (out,)
        kept = "".join(l for i, l in enumerate(self.dims) if i not in self.axes)
        self.output_letters = (self.dims if self.keepdims else (kept or "x"),)

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        if self.keepdims:
            out = C.copy()
            out[:, list(self.axes)] = 1
            return [out]
        kept = [i for i in range(C.shape[1]) if i not in self.axes]
        if not kept:
            return [np.ones((C.shape[0], 1), dtype=C.dtype)]
        return [C[:, kept]]

    def cost(self, C, machine):
        return machine.all_reduce(self._E(C), _as_float(C[:, list(self.axes)]).prod(axis=1))


class Softmax(_ShapeOfInput):
    """Softmax along one axis: ``4E + E dom[axis] + AR(e, a) + AR(e dom[axis], a) + AR(e, a)``."""

    op = "Softmax"

    def __init__(self, x: Tensor, axis: int = -1):
        super().__init__(x)
        self.axis = _check_axis(axis, x.rank, self.op)

    def cost(self, C, machine):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        ax = self.axis
        e = E / dpp[:, ax]
        a = _as_float(C[:, ax])
        full = float(self.domain[ax])
        return (
            4.0 * E
            + E * full
            + machine.all_reduce(e, a)
            + machine.all_reduce(e * full, a)
            + machine.all_reduce(e, a)
        )


class SoftmaxCrossEntropy(_ShapeOfInput):
    """Softmax and cross-entropy loss; the class axis is the last.

    Cost ``4E + 2 bpp``, plus ``comm(2 bpp)`` when the class axis is split.
    """

    op = "SoftmaxCrossEntropy"

    def cost(self, C, machine):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        bpp = dpp[:, :-1].prod(axis=1)
        return 4.0 * E + 2.0 * bpp + np.where(C[:, -1] > 1, machine.comm(2.0 * bpp), 0.0)


# ---------------------------------------------------------------------------------------
# Recurrent layer


class LSTM(Layer):
    """A stack of ``L`` LSTM layers over a whole sequence, as one vertex (paper IV-A).

    Input ``(b, s, k)``, ``n = k`` units. Iteration space ``(L, s, b, n, k)``; ``s`` is
    never split. Cost: a batched GEMM (batch ``L``, ``M = s b``, ``N = 4n``, ``K = 2k``,
    ``pw = 3``) plus, at every step of every layer, the hand-over of the cell output
    ``(b, n)`` split ``(c_b, c_n)`` to the next cell input ``(b, k)`` split ``(c_b, c_k)``.
    """

    op = "LSTM"

    def __init__(self, x: Tensor, layers: int):
        x = _tensor(x, "LSTM input")
        if x.rank != 3:
            raise ValueError(f"LSTM needs a (b, s, k) input, got shape {list(x.shape)}")
        L = _check_positive(layers, "LSTM layer count")
        b, s, k = x.shape
        self.inputs = (x,)
        self.domain = (L, s, b, k, k)
        self.dims = "lsbnk"
        self._unsplit = (False, True, False, False, False)
        self.output_shapes = ((b, s, k),)
        self.output_letters = ("bsn",)
        self.batch_dim = 2

    def input_configs(self, C):
        return [C[:, [2, 1, 4]]]

    def output_configs(self, C):
        return [C[:, [2, 1, 3]]]

    def cost(self, C, machine):
        L, s, b, n, k = self.domain
        Cf = _as_float(C)
        gemm = gemm_cost(
            machine, L, Cf[:, 0],
            s * b, Cf[:, 1] * Cf[:, 2],
            4 * n, Cf[:, 3],
            2 * k, Cf[:, 4],
            3,
        )
        handover = redistribution_volume((b, n), C[:, [2, 3]], C[:, [2, 4]])
        return gemm + L * s * machine.comm(handover)

    def parameters(self):
        L, s, b, n, k = self.domain
        return [((L, 4 * n, 2 * k), (0, 3, 4))]


# ---------------------------------------------------------------------------------------
# Data-movement layers (zero layer cost; they shape the edges)


class _DataMovement(Layer):
    """A layer that only moves or reshapes data: no layer cost; it shapes the edges."""

    def cost(self, C, machine):
        return np.zeros(len(C))


class Concat(_DataMovement):
    """Concatenation along ``axis``; the axis is size 1 in the iteration space."""

    op = "Concat"

    def __init__(self, tensors: Sequence[Tensor], axis: int):
        tensors = tuple(_tensor(t, "Concat input") for t in tensors)
        if len(tensors) < 1:
            raise ValueError("Concat needs at least one tensor")
        first = tensors[0]
        self.axis = _check_axis(axis, first.rank, "Concat")
        for t in tensors[1:]:
            if t.rank != first.rank or any(
                d != e for i, (d, e) in enumerate(zip(t.shape, first.shape)) if i != self.axis
            ):
                raise ValueError(
                    f"Concat on axis {self.axis}: shapes {list(first.shape)} and {list(t.shape)} differ off the axis"
                )
        self.inputs = tensors
        self.domain = tuple(1 if i == self.axis else d for i, d in enumerate(first.shape))
        self.dims = _letters_of(first)
        total = sum(t.shape[self.axis] for t in tensors)
        self.output_shapes = (tuple(total if i == self.axis else d for i, d in enumerate(first.shape)),)
        self.output_letters = (self.dims,)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C] * len(self.inputs)

    def output_configs(self, C):
        return [C]


class Ravel(_DataMovement):
    """Flatten a tensor to one dimension; contiguous configurations only."""

    op = "Ravel"
    contiguous = True

    def __init__(self, x: Tensor):
        x = _tensor(x, "Ravel input")
        self.inputs = (x,)
        self.domain = tuple(x.shape)
        self.dims = _letters_of(x)
        self.output_shapes = ((x.size,),)
        self.output_letters = ("x",)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C.prod(axis=1, keepdims=True)]


class Unravel(_DataMovement):
    """Give a flat tensor a shape; contiguous configurations only."""

    op = "Unravel"
    contiguous = True

    def __init__(self, x: Tensor, shape, letters: str | None = None):
        x = _tensor(x, "Unravel input")
        shape = _check_shape(shape, "Unravel shape")
        if x.rank != 1:
            raise ValueError(f"Unravel needs a flat tensor, got shape {list(x.shape)}")
        if math.prod(shape) != x.size:
            raise ValueError(f"cannot unravel {x.size} elements into shape {list(shape)}")
        self.inputs = (x,)
        self.domain = shape
        if letters is not None and len(letters) != len(shape):
            raise ValueError(f"Unravel letters {letters!r} must name the {len(shape)} dims of {list(shape)}")
        self.dims = letters or _generic_letters(len(self.domain))
        self.output_shapes = (shape,)
        self.output_letters = (self.dims,)
        self.batch_dim = 0

    def input_configs(self, C):
        return [C.prod(axis=1, keepdims=True)]

    def output_configs(self, C):
        return [C]


class Stack(_DataMovement):
    """Stack tensors of one shape along a new ``axis`` (size 1 in the iteration space)."""

    op = "Stack"

    def __init__(self, tensors: Sequence[Tensor], axis: int = 0, batch_dim: int | None = None):
        tensors = tuple(_tensor(t, "Stack input") for t in tensors)
        if len(tensors) < 1:
            raise ValueError("Stack needs at least one tensor")
        shape = tensors[0].shape
        for t in tensors[1:]:
            if t.shape != shape:
                raise ValueError(f"Stack inputs differ in shape: {list(shape)} and {list(t.shape)}")
        self.axis = _check_axis(axis, len(shape) + 1, "Stack")
        self.inputs = tensors
        self.domain = shape[: self.axis] + (1,) + shape[self.axis:]
        inner = _letters_of(tensors[0])
        new = next((l for l in "sabcdefghijklmnopqrtuvwxyz" if l not in inner), "?")
        self.dims = inner[: self.axis] + new + inner[self.axis:]
        self.output_shapes = (shape[: self.axis] + (len(tensors),) + shape[self.axis:],)
        self.output_letters = (self.dims,)
        self.batch_dim = (1 if self.axis == 0 else 0) if batch_dim is None else batch_dim

    def input_configs(self, C):
        return [np.delete(C, self.axis, axis=1)] * len(self.inputs)

    def output_configs(self, C):
        return [C]


class Unstack(_DataMovement):
    """Split a tensor along ``axis`` into ``x.shape[axis]`` tensors."""

    op = "Unstack"

    def __init__(self, x: Tensor, axis: int = 0, batch_dim: int | None = None):
        x = _tensor(x, "Unstack input")
        self.axis = _check_axis(axis, x.rank, "Unstack")
        self.inputs = (x,)
        self.domain = tuple(1 if i == self.axis else d for i, d in enumerate(x.shape))
        self.dims = _letters_of(x)
        part = tuple(d for i, d in enumerate(x.shape) if i != self.axis)
        if not part:
            raise ValueError("Unstack needs an input of rank >= 2")
        self.output_shapes = (part,) * x.shape[self.axis]
        self.output_letters = (self.dims[: self.axis] + self.dims[self.axis + 1:],) * len(self.output_shapes)
        self.batch_dim = (1 if self.axis == 0 else 0) if batch_dim is None else batch_dim

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [np.delete(C, self.axis, axis=1)] * len(self.output_shapes)


def _generic_letters(rank: int) -> str:
    return "bcdefghijklmnopqrstuvwxyz"[:rank] if rank <= 25 else "?" * rank


def _letters_of(t: Tensor) -> str:
    """Display letters of a tensor's dimensions: its own, or generic ones."""
    return t.letters if len(t.letters) == t.rank else _generic_letters(t.rank)


#: Every layer type by its ``op`` name, for documentation and the CLI.
LAYER_TYPES = {
    cls.op: cls
    for cls in (
        Conv, Pooling, FC, Einsum, Embedding, Elementwise, Concat, Norm, BatchNorm,
        ReduceMean, Softmax, SoftmaxCrossEntropy, LSTM, Ravel, Unravel, Stack, Unstack,
    )
}
