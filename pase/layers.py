"""Stages 1 and 2 per layer type: iteration space, tensor configurations and layer cost.

One class per layer type of ``cost-model.md``, registered by its ``op`` name. Every cost is a
vectorised function of an ``int`` array of configurations (one row each), enumerated or not,
split into compute and communication, priced by whatever machine is given.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar, NamedTuple, Sequence

import numpy as np

from .machine import Group, layout_strides
from .tensor import Tensor

__all__ = [
    "Layer",
    "LayerCost",
    "Conv",
    "Pooling",
    "FC",
    "Einsum",
    "Embedding",
    "Elementwise",
    "Concat",
    "Norm",
    "BatchNorm",
    "RMSNorm",
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
    "layer_type",
    "make_layer",
]

#: Every layer type by its ``op`` name. Filled as the classes below are defined (a class with
#: its own ``op`` registers itself); read by the JSON graph format and the documentation.
LAYER_TYPES: dict = {}


class LayerCost(NamedTuple):
    """The cost of every configuration of a layer, split into its two parts.

    ``compute``: the layer's arithmetic and memory-bound work; ``communication``: its
    collectives (all-reduces, halo exchanges, hand-overs). Redistribution on edges is not a
    layer's own cost.
    """

    compute: np.ndarray
    communication: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.compute + self.communication


# ---------------------------------------------------------------------------------------
# Shared cost pieces


def gemm_cost(machine, per_device, groups, pw: int = 0, weight_grads=(False, True)) -> LayerCost:
    """Cost of ``Bp`` per-device GEMMs ``Mp x Kp`` by ``Kp x Np`` with ``pw`` fused point-wise ops.

    Parameters
    ----------
    machine
        Prices the work (``pase.machine``).
    per_device : tuple
        ``(Bp, Mp, Np, Kp)``: per-device sizes, arrays over the configurations.
    groups : tuple of Group
        ``(m, n, k)``: the devices that split ``M``, ``N`` and ``K``.
    pw : int
        Point-wise operations fused after the GEMM (each a memory-bound pass over its output).
    weight_grads : tuple of bool
        Whether operand A's and operand B's gradients are weight gradients.

    Compute: ``gemm(Bp, Mp, Np, Kp)`` (one product forward, two backward) plus ``pw`` passes over
    the ``Bp Mp Np`` outputs (``3 pw Mp Np`` FLOPs each in the reference). Communication: the
    forward output all-reduced over ``k``, operand A's gradient over ``n`` and operand B's (the
    weight's) over ``m``: ``AR(Bp Mp Np, k) + AR(Bp Mp Kp, n) + AR(Bp Np Kp, m)``.
    """
    Bp, Mp, Np, Kp = (np.asarray(x, dtype=np.float64) for x in per_device)
    group_m, group_n, group_k = groups
    compute = machine.gemm(Bp, Mp, Np, Kp)
    if pw > 0:
        outputs = Bp * Mp * Np
        compute = compute + pw * machine.memory_bound("gelu", outputs, 3.0 * outputs)
    communication = (
        machine.all_reduce(Bp * Mp * Np, group_k)
        + machine.all_reduce(Bp * Mp * Kp, group_n, grad=weight_grads[0])
        + machine.all_reduce(Bp * Np * Kp, group_m, grad=weight_grads[1])
    )
    return LayerCost(compute, communication)


def redistribution_volume(shape, source, target):
    """Elements a device lacks when a tensor split ``source`` is needed split ``target``.

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


def _check_count(value, what: str) -> int:
    """A count that may be zero (``pw``)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_axis(axis, rank: int, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -rank <= axis < rank:
        raise ValueError(f"{what}: axis {axis!r} is out of range for rank {rank}")
    return int(axis) % rank


def _check_letters(letters, count: int, what: str) -> str:
    if not isinstance(letters, str) or len(letters) != count:
        raise ValueError(f"{what}: letters {letters!r} must name the {count} dimensions, one letter each")
    return letters


def _pair(value, what: str, check=_check_positive) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{what} must be one integer or a pair, got {value!r}")
        return tuple(check(v, what) for v in value)
    return (check(value, what),) * 2


def _pad(value, what: str) -> tuple:
    def non_negative(v, _):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{what} must be non-negative integers, got {value!r}")
        return int(v)

    return _pair(value, what, non_negative)


def _tensor(x, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a Tensor, got {type(x).__name__}")
    return x


def _generic_letters(rank: int) -> str:
    return "bcdefghijklmnopqrstuvwxyz"[:rank] if rank <= 25 else "?" * rank


def _letters_of(t: Tensor) -> str:
    """Display letters of a tensor's dimensions: its own, or generic ones."""
    return t.letters if len(t.letters) == t.rank else _generic_letters(t.rank)


# ---------------------------------------------------------------------------------------
# Base class and registry


class Layer:
    """A vertex of the computation graph: one layer type is one subclass.

    A subclass sets ``op`` (its registry name) and, in ``__init__``, calls
    ``Layer.__init__`` with everything a layer declares:

    - ``inputs``: the tensors it reads (graph inputs make no edges);
    - ``domain``: the iteration space, and ``dims``: one display letter per dimension;
    - ``output_shapes`` and ``output_letters``: shape and letters of every output tensor;
    - ``batch_dim``: the dimension data parallelism splits (outermost in the device layout);
    - ``unsplit``: dimensions the enumeration treats as size 1 (default none);
    - ``args``: its JSON-able constructor arguments other than the tensors, so that
      ``make_layer(op, operands, args)`` rebuilds it.

    It implements ``input_configs``, ``output_configs`` and ``costs`` for an array of
    configurations ``C`` of shape ``(K, len(domain))``, and ``parameters`` if it has weights.
    ``check()`` validates the declaration; ``GraphBuilder.add`` calls it once.
    """

    op: ClassVar[str | None] = None
    #: Keep only contiguous configurations (Ravel, Unravel).
    contiguous: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        op = cls.__dict__.get("op")
        if op is None:
            return  # an abstract helper class, not a layer type
        if op in LAYER_TYPES and LAYER_TYPES[op] is not cls:
            raise TypeError(f"layer type {op!r} is defined twice ({LAYER_TYPES[op].__qualname__} and {cls.__qualname__})")
        LAYER_TYPES[op] = cls

    def __init__(self, inputs, domain, dims, output_shapes, output_letters=None, batch_dim=0, unsplit=None,
                 args=None):
        self.inputs = tuple(inputs)
        self.domain = tuple(int(d) for d in domain)
        self.dims = dims
        self.output_shapes = tuple(tuple(int(d) for d in shape) for shape in output_shapes)
        self.output_letters = (
            tuple(output_letters) if output_letters is not None
            else tuple(_generic_letters(len(shape)) for shape in self.output_shapes)
        )
        self.batch_dim = int(batch_dim)
        self.unsplit = (False,) * len(self.domain) if unsplit is None else tuple(bool(u) for u in unsplit)
        self.args = dict(args or {})

    def check(self) -> None:
        """Raise ``ValueError`` unless the declared attributes are consistent."""
        name = type(self).__name__
        for attr in ("inputs", "domain", "dims", "output_shapes", "output_letters", "batch_dim", "unsplit", "args"):
            if not hasattr(self, attr):
                raise ValueError(f"{name} does not declare {attr!r} (call Layer.__init__)")
        if not self.op:
            raise ValueError(f"{name} has no op name")
        rank = len(self.domain)
        if rank == 0 or any(d < 1 for d in self.domain):
            raise ValueError(f"{self.op}: the iteration space {list(self.domain)} must have positive sizes")
        if len(self.dims) != rank:
            raise ValueError(f"{self.op}: dims {self.dims!r} must give one letter per dimension of {list(self.domain)}")
        if len(self.unsplit) != rank:
            raise ValueError(f"{self.op}: unsplit must have one flag per dimension")
        if not 0 <= self.batch_dim < rank:
            raise ValueError(f"{self.op}: batch_dim {self.batch_dim} is outside the iteration space")
        if not self.output_shapes or len(self.output_letters) != len(self.output_shapes):
            raise ValueError(f"{self.op}: every output needs a shape and letters")
        for t in self.inputs:
            _tensor(t, f"{self.op} input")
        one = np.ones((1, rank), dtype=np.int64)
        for what, shapes, configs in (("input", [t.shape for t in self.inputs], self.input_configs(one)),
                                      ("output", self.output_shapes, self.output_configs(one))):
            if len(configs) != len(shapes):
                raise ValueError(f"{self.op}: {len(configs)} {what} configurations for {len(shapes)} {what}s")
            for shape, config in zip(shapes, configs):
                if np.asarray(config).shape != (1, len(shape)):
                    raise ValueError(f"{self.op}: an {what} configuration does not match the {what} shape {list(shape)}")

    @classmethod
    def from_args(cls, operands: Sequence[Tensor], args: dict) -> "Layer":
        """Rebuild a layer from its operand tensors and ``args`` (the JSON graph format)."""
        return cls(*operands, **args)

    @property
    def operands(self) -> tuple:
        """The tensors its constructor takes (usually ``inputs``)."""
        return self.inputs

    def input_configs(self, C: np.ndarray) -> list:
        """Tensor configuration of every input, one ``(K, rank)`` array each."""
        raise NotImplementedError

    def output_configs(self, C: np.ndarray) -> list:
        """Tensor configuration of every output, one ``(K, rank)`` array each."""
        raise NotImplementedError

    def costs(self, C: np.ndarray, machine) -> LayerCost:
        """Compute and communication cost of every configuration row of ``C``."""
        raise NotImplementedError

    def cost(self, C: np.ndarray, machine) -> np.ndarray:
        """Layer cost (compute plus communication) of every configuration row of ``C``."""
        return self.costs(C, machine).total

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

    def _groups(self, C: np.ndarray, *dim_lists) -> tuple:
        """The devices a collective over each of ``dim_lists`` involves (``machines.md``)."""
        strides = layout_strides(C, self.batch_dim)
        return tuple(Group.of(C, strides, dims) for dims in dim_lists)

    def __repr__(self) -> str:
        return f"{self.op}(domain={list(self.domain)})"


def layer_type(op: str) -> type:
    """The layer class registered as ``op``; ``ValueError`` naming the known ones otherwise."""
    try:
        return LAYER_TYPES[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown layer type {op!r}; known: {', '.join(sorted(LAYER_TYPES))}") from None


def make_layer(op: str, operands: Sequence[Tensor], args: dict) -> Layer:
    """Build a layer of type ``op`` from its operand tensors and JSON-able ``args``.

    Unknown or missing arguments raise ``ValueError`` naming the layer type.
    """
    cls = layer_type(op)
    if not isinstance(args, dict):
        raise ValueError(f"{op}: args must be an object, got {type(args).__name__}")
    try:
        return cls.from_args(list(operands), dict(args))
    except TypeError as err:
        # A wrong argument name or count: say which, without the Python signature noise.
        message = str(err).split(") ", 1)[-1] if ") " in str(err) else str(err)
        raise ValueError(f"{op}: {message}") from None


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
        r, s = _pair(kernel, "Conv kernel")
        stride_h, stride_w = _pair(stride, "Conv stride")
        pad_h, pad_w = _pad(pad, "Conv pad")
        if h - r + 2 * pad_h < 0 or w - s + 2 * pad_w < 0:
            raise ValueError(f"Conv kernel {r}x{s} does not fit the padded {h}x{w} image")
        ho = (h - r + 2 * pad_h) // stride_h + 1
        wo = (w - s + 2 * pad_w) // stride_w + 1
        self.pw = _check_count(pw, "Conv pw")
        super().__init__(
            (x,), (b, c, ho, wo, r, s, n), "bchwrsn", ((b, n, ho, wo),), ("bchw",), batch_dim=0,
            unsplit=(False, False, True, True, False, False, False),
            args={"filters": n, "kernel": [r, s], "stride": [stride_h, stride_w], "pad": [pad_h, pad_w],
                  "pw": self.pw},
        )

    def input_configs(self, C):
        return [C[:, [0, 1, 2, 3]]]

    def output_configs(self, C):
        return [C[:, [0, 6, 2, 3]]]

    def costs(self, C, machine):
        b, c, ho, wo, r, s, n = self.domain
        Cf = _as_float(C)
        return gemm_cost(
            machine,
            (1.0, b * ho * wo / (Cf[:, 0] * Cf[:, 2] * Cf[:, 3]), n / Cf[:, 6], c * r * s / (Cf[:, 1] * Cf[:, 4] * Cf[:, 5])),
            self._groups(C, (0, 2, 3), (6,), (1, 4, 5)),
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
        r, s = _pair(window, "Pooling window")
        stride_h, stride_w = _pair(stride, "Pooling stride")
        pad_h, pad_w = _pad(pad, "Pooling pad")
        if h - r + 2 * pad_h < 0 or w - s + 2 * pad_w < 0:
            raise ValueError(f"Pooling window {r}x{s} does not fit the padded {h}x{w} image")
        ho = (h - r + 2 * pad_h) // stride_h + 1
        wo = (w - s + 2 * pad_w) // stride_w + 1
        self.window = (r, s)
        self.image = (h, w)
        super().__init__(
            (x,), (b, c, ho, wo), "bchw", ((b, c, ho, wo),), ("bchw",), batch_dim=0,
            args={"window": [r, s], "stride": [stride_h, stride_w], "pad": [pad_h, pad_w]},
        )

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C]

    def costs(self, C, machine):
        b, c = self.domain[:2]
        h, w = self.image
        r, s = self.window
        Cf = _as_float(C)
        # Halo of the unpadded input image divided by the output's height/width splits.
        hi = h / Cf[:, 2]
        wi = w / Cf[:, 3]
        hg = np.where(Cf[:, 2] > 1, hi + r, hi)
        wg = np.where(Cf[:, 3] > 1, wi + s, wi)
        halo = (hg * wg - hi * wi) * (b / Cf[:, 0]) * (c / Cf[:, 1])
        E = self._E(C)
        (hw,) = self._groups(C, (2, 3))
        return LayerCost(machine.memory_bound("pool", E, E), machine.exchange(halo, hw))


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
        if letters is not None and not isinstance(letters, str):  # false or 0 must not mean "the default"
            raise ValueError(f"FC letters must be a string, got {letters!r}")
        letters = letters or (_letters_of(x)[:-1] if x.letters else "b" + "stuvw"[: j - 1])
        if len(letters) != j:
            raise ValueError(f"FC letters {letters!r} must name the {j} leading input dims")
        self.pw = _check_count(pw, "FC pw")
        super().__init__(
            (x,), tuple(x.shape[:-1]) + (n, x.shape[-1]), letters + "nk", (tuple(x.shape[:-1]) + (n,),),
            (letters + "n",), batch_dim=0, args={"units": n, "pw": self.pw, "letters": letters},
        )

    def input_configs(self, C):
        j = len(self.domain) - 2
        return [C[:, list(range(j)) + [j + 1]]]

    def output_configs(self, C):
        j = len(self.domain) - 2
        return [C[:, : j + 1]]

    def costs(self, C, machine):
        j = len(self.domain) - 2
        Cf = _as_float(C)
        return gemm_cost(
            machine,
            (1.0, math.prod(self.domain[:j]) / Cf[:, :j].prod(axis=1), self.domain[j] / Cf[:, j],
             self.domain[j + 1] / Cf[:, j + 1]),
            self._groups(C, range(j), (j,), (j + 1,)),
            self.pw,
        )

    def parameters(self):
        j = len(self.domain) - 2
        return [((self.domain[j], self.domain[j + 1]), (j, j + 1))]


_EQUATION = re.compile(r"^([a-z]+),([a-z]+)->([a-z]+)$")


def _parse_equation(equation: str, a: Tensor, b: Tensor) -> tuple:
    """``(in_a, in_b, out, sizes)`` of a two-operand Einsum, with every check of the spec."""
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
            raise ValueError(f"Einsum {equation!r}: operand {what} has {t.rank} dims, the equation gives {len(term)}")
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
            raise ValueError(f"Einsum {equation!r}: dimension {letter!r} is in one operand only and not in the output")
    return eq, in_a, in_b, out, sizes


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
        eq, in_a, in_b, out, sizes = _parse_equation(equation, a, b)
        reduction = [letter for letter in in_a if letter not in out]
        space = list(out) + reduction
        self.batch_letters = [x for x in out if x in in_a and x in in_b]
        self.m_letters = [x for x in out if x in in_a and x not in in_b]
        self.n_letters = [x for x in out if x in in_b and x not in in_a]
        self.k_letters = reduction
        if not self.m_letters or not self.n_letters:
            raise ValueError(
                f"Einsum {equation!r} is not a GEMM: it needs a dimension of A only and one of B only in the output"
            )
        if batch is None:
            batch = "b" if "b" in space else space[0]
        if batch not in space:
            raise ValueError(f"Einsum {equation!r}: batch dimension {batch!r} is not in its iteration space")
        self.equation = eq
        self.terms = (in_a, in_b, out)
        self.pw = _check_count(pw, "Einsum pw")
        self._cols = {letter: i for i, letter in enumerate(space)}
        super().__init__(
            (a, b), tuple(sizes[x] for x in space), "".join(space), (tuple(sizes[x] for x in out),), (out,),
            batch_dim=space.index(batch), args={"equation": eq, "pw": self.pw, "batch": batch},
        )

    @classmethod
    def from_args(cls, operands, args):
        args = dict(args)
        if "equation" not in args:
            raise ValueError(f"{cls.op}: missing argument 'equation'")
        return cls(args.pop("equation"), *operands, **args)

    def _columns(self, letters) -> list:
        return [self._cols[x] for x in letters]

    def input_configs(self, C):
        return [C[:, self._columns(self.terms[0])], C[:, self._columns(self.terms[1])]]

    def output_configs(self, C):
        return [C[:, : len(self.terms[2])]]

    def costs(self, C, machine):
        Cf = _as_float(C)
        dom = np.asarray(self.domain, dtype=np.float64)

        def per_device(letters):
            cols = self._columns(letters)
            return dom[cols].prod() / Cf[:, cols].prod(axis=1)

        sizes = tuple(per_device(x) for x in (self.batch_letters, self.m_letters, self.n_letters, self.k_letters))
        groups = self._groups(C, *(self._columns(x) for x in (self.m_letters, self.n_letters, self.k_letters)))
        return gemm_cost(machine, sizes, groups, self.pw, (self.inputs[0].is_param, self.inputs[1].is_param))

    def parameters(self):
        return [
            (t.shape, tuple(self._columns(term)))
            for t, term in zip(self.inputs, self.terms[:2])
            if t.is_param
        ]


class Embedding(Einsum):
    """Embedding lookup, modelled as the Einsum of a one-hot ``(x.., V)`` with ``(V, D)``.

    Iteration space ``(x1..xj, D, V)``. The token ids (and so the one-hot) are a graph
    input: they make no edge. The reference prices it as that Einsum; a calibrated machine
    sees a gather and the scatter-add of its gradient, memory-bound work on the output.
    """

    op = "Embedding"

    def __init__(self, ids: Tensor, vocab: int, width: int, letters: str | None = None):
        ids = _tensor(ids, "Embedding ids")
        if ids.producer is not None:
            raise ValueError("Embedding ids must be a graph input (token ids), not a layer output")
        vocab = _check_positive(vocab, "Embedding vocabulary")
        width = _check_positive(width, "Embedding width")
        j = ids.rank
        if letters is not None and not isinstance(letters, str):
            raise ValueError(f"Embedding letters must be a string, got {letters!r}")
        letters = letters or (ids.letters if len(ids.letters) == j else "b" + "stuw"[: j - 1])
        if len(letters) != j or "d" in letters or "v" in letters:
            raise ValueError(f"Embedding letters {letters!r} must name the {j} id dims without 'd' or 'v'")
        one_hot = Tensor(tuple(ids.shape) + (vocab,), None, ids.index, False, ids.name, ids.owner)
        weight = Tensor((vocab, width), None, -1, True, "embedding weight", ids.owner)
        super().__init__(f"{letters}v,vd->{letters}d", one_hot, weight, batch=letters[0])
        self.ids = ids
        self.vocab = vocab
        self.width = width
        self.args = {"vocab": vocab, "width": width, "letters": letters}

    @classmethod
    def from_args(cls, operands, args):
        return cls(*operands, **args)

    @property
    def operands(self) -> tuple:
        return (self.ids,)

    def costs(self, C, machine):
        einsum = super().costs(C, machine)
        # The reference counts the Einsum's FLOPs; a machine that measures sees the gather of
        # the per-device output and the scatter-add of its gradient.
        outputs = self._E(C) / (self.domain[-1] / _as_float(C[:, -1]))
        return LayerCost(machine.memory_bound("copy", outputs, einsum.compute), einsum.communication)


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
        self.pw = _check_count(pw, "Elementwise pw")
        dims = _letters_of(a) if a.letters else _letters_of(b)
        super().__init__((a, b), a.shape, dims, (a.shape,), (dims,), batch_dim=0, args={"pw": self.pw})

    def input_configs(self, C):
        return [C, C]

    def output_configs(self, C):
        return [C]

    def costs(self, C, machine):
        # (1 + pw) E: the combination, then pw fused point-wise passes.
        E = self._E(C)
        compute = machine.memory_bound("add", E, E)
        if self.pw:
            compute = compute + self.pw * machine.memory_bound("gelu", E, E)
        return LayerCost(compute, np.zeros(len(C)))


class _ShapeOfInput(Layer):
    """A layer on one tensor whose iteration space is that tensor's shape.

    Its input and its output (of the same shape) are split exactly like the iteration space.
    """

    def __init__(self, x: Tensor, args=None):
        x = _tensor(x, f"{self.op} input")
        dims = _letters_of(x)
        super().__init__((x,), x.shape, dims, (x.shape,), (dims,), batch_dim=0, args=args)

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C]


class Norm(_ShapeOfInput):
    """Normalisation over one axis (layer norm on the last axis, batch norm on axis 0).

    Cost: ``16 E + 4 AR(E / dpp[axis], c[axis]) + 4 AR(dpp[axis], prod(c without axis))``
    (statistics reduced across the axis splits, scale/bias gradients across the others),
    plus ``pw E`` for ``pw`` fused point-wise operations (0 in the reference graphs).
    """

    op = "Norm"
    #: Learnt tensors of length ``dom[axis]`` (scale and bias).
    n_params = 2

    def __init__(self, x: Tensor, axis: int = -1, pw: int = 0):
        x = _tensor(x, f"{self.op} input")
        self.axis = _check_axis(axis, x.rank, self.op)
        self.pw = _check_count(pw, f"{self.op} pw")
        super().__init__(x, self._args())

    def _args(self) -> dict:
        return {"axis": self.axis, "pw": self.pw}

    def costs(self, C, machine):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        a = self.axis
        compute = machine.memory_bound("layer_norm", E, 16.0 * E)
        if self.pw:
            compute = compute + self.pw * machine.memory_bound("gelu", E, E)
        along, across = self._groups(C, (a,), [d for d in range(len(self.domain)) if d != a])
        communication = (
            4.0 * machine.all_reduce(E / dpp[:, a], along)
            + 4.0 * machine.all_reduce(dpp[:, a], across, grad=True)
        )
        return LayerCost(compute, communication)

    def parameters(self):
        # Scale (and bias), each of length dom[axis], split c[axis].
        return [((self.domain[self.axis],), (self.axis,))] * self.n_params


class BatchNorm(Norm):
    """Batch normalisation: the reference model's Norm with axis 0.

    Its cost is that of ``Norm(x, axis=0)`` (``cost-model.md``). Its parameters, for the
    memory model, are what batch norm learns: a scale and a bias per channel (axis 1).
    """

    op = "BatchNorm"

    def __init__(self, x: Tensor, pw: int = 0):
        x = _tensor(x, "BatchNorm input")
        if x.rank < 2:
            raise ValueError(f"BatchNorm needs a (batch, channel, ...) input, got shape {list(x.shape)}")
        super().__init__(x, axis=0, pw=pw)

    def _args(self) -> dict:
        return {"pw": self.pw}

    def parameters(self):
        return [((self.domain[1],), (1,))] * 2


class RMSNorm(Norm):
    """Root-mean-square normalisation over one axis (Llama): Norm's cost, one scale parameter."""

    op = "RMSNorm"
    n_params = 1


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
        if not isinstance(keepdims, (bool, np.bool_)):
            raise ValueError(f"ReduceMean keepdims must be true or false, got {keepdims!r}")
        self.keepdims = bool(keepdims)
        dims = _letters_of(x)
        if self.keepdims:
            out = tuple(1 if i in self.axes else d for i, d in enumerate(x.shape))
        else:
            out = tuple(d for i, d in enumerate(x.shape) if i not in self.axes) or (1,)
        kept = "".join(x for i, x in enumerate(dims) if i not in self.axes)
        super().__init__(
            (x,), x.shape, dims, (out,), (dims if self.keepdims else (kept or "x"),), batch_dim=0,
            args={"axes": list(self.axes), "keepdims": self.keepdims},
        )

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

    def costs(self, C, machine):
        # The reference counts only the all-reduce of the partial sums; the reading pass is
        # memory-bound work a measured machine sees.
        E = self._E(C)
        (reduced,) = self._groups(C, self.axes)
        return LayerCost(machine.memory_bound("pool", E, 0.0 * E), machine.all_reduce(E, reduced))


class Softmax(_ShapeOfInput):
    """Softmax along one axis: ``4E + E dom[axis] + AR(e, a) + AR(e dom[axis], a) + AR(e, a)``."""

    op = "Softmax"

    def __init__(self, x: Tensor, axis: int = -1, causal: bool = False):
        x = _tensor(x, "Softmax input")
        self.axis = _check_axis(axis, x.rank, self.op)
        if not isinstance(causal, bool):
            raise ValueError(f"Softmax causal must be true or false, got {causal!r}")
        # ``causal``: a masked attention softmax (half its scores are masked); only the
        # fused attention pricing of a training configuration reads it.
        super().__init__(x, {"axis": self.axis, **({"causal": True} if causal else {})})

    def costs(self, C, machine):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        ax = self.axis
        e = E / dpp[:, ax]
        full = float(self.domain[ax])
        (group,) = self._groups(C, (ax,))
        compute = machine.memory_bound("softmax", E, 4.0 * E + E * full)
        communication = (
            machine.all_reduce(e, group) + machine.all_reduce(e * full, group) + machine.all_reduce(e, group)
        )
        return LayerCost(compute, communication)


class SoftmaxCrossEntropy(_ShapeOfInput):
    """Softmax and cross-entropy loss; the class axis is the last.

    Cost ``4E + 2 bpp``, plus ``comm(2 bpp)`` when the class axis is split.
    """

    op = "SoftmaxCrossEntropy"

    def costs(self, C, machine):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        bpp = dpp[:, :-1].prod(axis=1)
        last = len(self.domain) - 1
        return LayerCost(
            machine.memory_bound("loss", E, 4.0 * E + 2.0 * bpp),
            machine.exchange(2.0 * bpp, self._groups(C, (last,))[0]),
        )


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
        super().__init__(
            (x,), (L, s, b, k, k), "lsbnk", ((b, s, k),), ("bsn",), batch_dim=2,
            unsplit=(False, True, False, False, False), args={"layers": L},
        )

    def input_configs(self, C):
        return [C[:, [2, 1, 4]]]

    def output_configs(self, C):
        return [C[:, [2, 1, 3]]]

    def costs(self, C, machine):
        L, s, b, n, k = self.domain
        Cf = _as_float(C)
        gemm = gemm_cost(
            machine,
            (L / Cf[:, 0], s * b / (Cf[:, 1] * Cf[:, 2]), 4 * n / Cf[:, 3], 2 * k / Cf[:, 4]),
            self._groups(C, (1, 2), (3,), (4,)),
            3,
        )
        handover = redistribution_volume((b, n), C[:, [2, 3]], C[:, [2, 4]])
        (model,) = self._groups(C, (3, 4))
        return LayerCost(gemm.compute, gemm.communication + L * s * machine.exchange(handover, model))

    def parameters(self):
        L, s, b, n, k = self.domain
        return [((L, 4 * n, 2 * k), (0, 3, 4))]


# ---------------------------------------------------------------------------------------
# Data-movement layers (no cost in the reference model; they shape the edges)


class _DataMovement(Layer):
    """A layer that only moves or reshapes data: no reference cost; it shapes the edges.

    ``copies`` says whether it writes a new tensor (Concat, Stack): a measured machine
    prices that copy as memory-bound work; views (Ravel, Unravel, Unstack) cost nothing.
    """

    copies: ClassVar[bool] = False

    def costs(self, C, machine):
        zero = np.zeros(len(C))
        if not self.copies:
            return LayerCost(zero, zero)
        elements = math.prod(self.output_shapes[0]) / _as_float(self.output_configs(C)[0]).prod(axis=1)
        return LayerCost(machine.memory_bound("copy", elements, zero), zero)


class Concat(_DataMovement):
    """Concatenation along ``axis``; the axis is size 1 in the iteration space."""

    op = "Concat"
    copies = True

    def __init__(self, tensors: Sequence[Tensor], axis: int):
        if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
            raise ValueError("Concat needs a list of tensors")
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
        dims = _letters_of(first)
        total = sum(t.shape[self.axis] for t in tensors)
        super().__init__(
            tensors, tuple(1 if i == self.axis else d for i, d in enumerate(first.shape)), dims,
            (tuple(total if i == self.axis else d for i, d in enumerate(first.shape)),), (dims,), batch_dim=0,
            args={"axis": self.axis},
        )

    @classmethod
    def from_args(cls, operands, args):
        return cls(list(operands), **args)

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
        super().__init__((x,), x.shape, _letters_of(x), ((x.size,),), ("x",), batch_dim=0)

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
        if letters is not None:
            _check_letters(letters, len(shape), f"Unravel to {list(shape)}")
        dims = letters or _generic_letters(len(shape))
        super().__init__((x,), shape, dims, (shape,), (dims,), batch_dim=0,
                         args={"shape": list(shape), "letters": letters})

    def input_configs(self, C):
        return [C.prod(axis=1, keepdims=True)]

    def output_configs(self, C):
        return [C]


class Stack(_DataMovement):
    """Stack tensors of one shape along a new ``axis`` (size 1 in the iteration space)."""

    op = "Stack"
    copies = True

    def __init__(self, tensors: Sequence[Tensor], axis: int = 0, batch_dim: int | None = None):
        if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
            raise ValueError("Stack needs a list of tensors")
        tensors = tuple(_tensor(t, "Stack input") for t in tensors)
        if len(tensors) < 1:
            raise ValueError("Stack needs at least one tensor")
        shape = tensors[0].shape
        for t in tensors[1:]:
            if t.shape != shape:
                raise ValueError(f"Stack inputs differ in shape: {list(shape)} and {list(t.shape)}")
        self.axis = _check_axis(axis, len(shape) + 1, "Stack")
        inner = _letters_of(tensors[0])
        new = next((x for x in "sabcdefghijklmnopqrtuvwxyz" if x not in inner), "?")
        dims = inner[: self.axis] + new + inner[self.axis:]
        if batch_dim is None:
            batch_dim = 1 if self.axis == 0 else 0
        batch_dim = _check_axis(batch_dim, len(shape) + 1, "Stack batch_dim")
        super().__init__(
            tensors, shape[: self.axis] + (1,) + shape[self.axis:], dims,
            (shape[: self.axis] + (len(tensors),) + shape[self.axis:],), (dims,), batch_dim=batch_dim,
            args={"axis": self.axis, "batch_dim": batch_dim},
        )

    @classmethod
    def from_args(cls, operands, args):
        return cls(list(operands), **args)

    def input_configs(self, C):
        return [np.delete(C, self.axis, axis=1)] * len(self.inputs)

    def output_configs(self, C):
        return [C]


#: Most outputs an Unstack may have (one per slice of its axis).
MAX_UNSTACK = 2**16


class Unstack(_DataMovement):
    """Split a tensor along ``axis`` into ``x.shape[axis]`` tensors."""

    op = "Unstack"

    def __init__(self, x: Tensor, axis: int = 0, batch_dim: int | None = None):
        x = _tensor(x, "Unstack input")
        self.axis = _check_axis(axis, x.rank, "Unstack")
        dims = _letters_of(x)
        part = tuple(d for i, d in enumerate(x.shape) if i != self.axis)
        if not part:
            raise ValueError("Unstack needs an input of rank >= 2")
        if batch_dim is None:
            batch_dim = 1 if self.axis == 0 else 0
        batch_dim = _check_axis(batch_dim, x.rank, "Unstack batch_dim")
        count = x.shape[self.axis]
        if count > MAX_UNSTACK:
            # One tensor per slice: a huge axis would build millions of outputs (or never finish).
            raise ValueError(f"Unstack along axis {self.axis} of size {count}: at most {MAX_UNSTACK} outputs")
        super().__init__(
            (x,), tuple(1 if i == self.axis else d for i, d in enumerate(x.shape)), dims, (part,) * count,
            (dims[: self.axis] + dims[self.axis + 1:],) * count, batch_dim=batch_dim,
            args={"axis": self.axis, "batch_dim": batch_dim},
        )

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [np.delete(C, self.axis, axis=1)] * len(self.output_shapes)
