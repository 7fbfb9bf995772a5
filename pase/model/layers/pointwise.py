"""Point-wise, normalisation, reduction and softmax layers."""

from __future__ import annotations

import numpy as np

from pase.model.tensor import Tensor
from .base import BroadcastOperands, Layer, check_axis, check_count, letters_of, check_tensor
from .masks import band_density
from .work import AllReduce, Exchange, LayerWork, Pass

#: What an :class:`Elementwise` layer computes of its two operands.
COMBINES = ("multiply", "add")

__all__ = ["Elementwise", "Norm", "BatchNorm", "RMSNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy"]


class Elementwise(BroadcastOperands, Layer):
    """Element-wise combination of two tensors, ``pw`` fused operations.

    ``combine`` declares what the combination is, for what the backward pass reads:
    ``multiply`` (the default: the gradient of each operand is the output's gradient times the
    other, so an operand is kept where the other needs a gradient; a rotary embedding times its
    constant table keeps nothing) or ``add`` (a residual connection: the gradient passes
    through, no operand is kept, unless ``pw`` fused operations follow the sum).

    The operands have one shape, or broadcast against each other (same rank, each dimension
    equal or 1 in one of them: a squeeze-excitation gate ``(b, c, 1, 1)`` times ``(b, c, h, w)``,
    ``x / norm(x)``). The iteration space is the broadcast shape; an operand's size-1
    dimensions are size 1 in its configuration, and its gradient is summed over them: an
    all-reduce of the operand's elements per device across the devices splitting them.
    """

    op = "Elementwise"

    def __init__(self, a: Tensor, b: Tensor, pw: int = 0, combine: str = "multiply"):
        a = check_tensor(a, "Elementwise operand A")
        b = check_tensor(b, "Elementwise operand B")
        if combine not in COMBINES:
            raise ValueError(f"Elementwise combine must be one of {', '.join(COMBINES)}, got {combine!r}")
        self.combine = combine
        if a.rank != b.rank or any(x != y and 1 not in (x, y) for x, y in zip(a.shape, b.shape)):
            raise ValueError(f"Elementwise operands differ in shape: {list(a.shape)} and {list(b.shape)}")
        self.pw = check_count(pw, "Elementwise pw")
        shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
        full = a if a.shape == shape else b
        dims = letters_of(full) if full.letters else letters_of(a if a.letters else b)
        #: Per operand, the dimensions it broadcasts along (size 1 where the output is not).
        self.broadcast = tuple(tuple(i for i, (d, e) in enumerate(zip(t.shape, shape)) if d != e) for t in (a, b))
        super().__init__((a, b), shape, dims, (shape,), (dims,), batch_dim=0,
                         args={"pw": self.pw, **({"combine": combine} if combine != "multiply" else {})})

    def backward_reads(self, i: int, needs_grad) -> bool:
        """A sum's backward reads no operand (without fused operations after it); a product's
        reads operand ``i`` where the other operand needs a gradient."""
        if self.pw:
            return True
        return False if self.combine == "add" else bool(needs_grad[1 - i])

    def input_configs(self, C):
        return [self._operand(C, 0), self._operand(C, 1)]

    def output_configs(self, C):
        return [C]

    def work(self, C):
        # (1 + pw) E: the combination, then pw fused point-wise passes.
        E = self._E(C)
        compute = Pass("add", E, E)
        if self.pw:
            compute = compute + self.pw * Pass("gelu", E, E)
        return LayerWork(compute, self.broadcast_gradients(C))


class _ShapeOfInput(Layer):
    """A layer on one tensor whose iteration space is that tensor's shape.

    Its input and its output (of the same shape) are split exactly like the iteration space.
    """

    def __init__(self, x: Tensor, args=None):
        x = check_tensor(x, f"{self.op} input")
        dims = letters_of(x)
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
    ``learnt``: how many of its learnt vectors it has (a norm without bias has 1, one without
    an affine transform 0); only the memory model reads it.
    """

    normalisation = True

    op = "Norm"
    weight_names = ("scale", "bias")
    #: Learnt tensors of length ``dom[axis]`` (scale and bias).
    n_params = 2

    def __init__(self, x: Tensor, axis: int = -1, pw: int = 0, learnt: int | None = None):
        x = check_tensor(x, f"{self.op} input")
        self.axis = check_axis(axis, x.rank, self.op)
        self.pw = check_count(pw, f"{self.op} pw")
        self.learnt = self.n_params if learnt is None else check_count(learnt, f"{self.op} learnt")
        if self.learnt > self.n_params:
            raise ValueError(f"{self.op} learns at most {self.n_params} vectors, got learnt={learnt!r}")
        super().__init__(x, self._args())

    def _args(self) -> dict:
        return {"axis": self.axis, "pw": self.pw, **self._learnt_arg()}

    def _learnt_arg(self) -> dict:
        return {"learnt": self.learnt} if self.learnt != self.n_params else {}

    def work(self, C):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        a = self.axis
        compute = Pass("layer_norm", E, 16.0 * E)
        if self.pw:
            compute = compute + self.pw * Pass("gelu", E, E)
        along, across = self._groups(C, (a,), [d for d in range(len(self.domain)) if d != a])
        communication = 4.0 * AllReduce(E / dpp[:, a], along) + 4.0 * AllReduce(dpp[:, a], across, weight=True)
        return LayerWork(compute, communication)

    def parameters(self):
        # Scale (and bias), each of length dom[axis], split c[axis].
        return [((self.domain[self.axis],), (self.axis,))] * self.learnt


class BatchNorm(Norm):
    """Batch normalisation: the reference model's Norm with axis 0.

    Its cost is that of ``Norm(x, axis=0)`` (``docs/cost-model.md``). Its parameters, for the
    memory model, are what batch norm learns: a scale and a bias per channel (axis 1).
    """

    op = "BatchNorm"

    def __init__(self, x: Tensor, pw: int = 0, learnt: int | None = None):
        x = check_tensor(x, "BatchNorm input")
        if x.rank < 2:
            raise ValueError(f"BatchNorm needs a (batch, channel, ...) input, got shape {list(x.shape)}")
        super().__init__(x, axis=0, pw=pw, learnt=learnt)

    def _args(self) -> dict:
        return {"pw": self.pw, **self._learnt_arg()}

    def parameters(self):
        return [((self.domain[1],), (1,))] * self.learnt


class RMSNorm(Norm):
    """Root-mean-square normalisation over one axis (Llama): Norm's cost, one scale parameter."""

    op = "RMSNorm"
    eager_unfused = True
    n_params = 1


class ReduceMean(Layer):
    """Mean over some axes; the output drops them (or keeps them as size 1)."""

    op = "ReduceMean"

    def __init__(self, x: Tensor, axes, keepdims: bool = False):
        x = check_tensor(x, "ReduceMean input")
        axes = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
        if not axes:
            raise ValueError("ReduceMean needs at least one axis")
        self.axes = tuple(sorted({check_axis(a, x.rank, "ReduceMean") for a in axes}))
        if len(self.axes) != len(axes):
            raise ValueError(f"ReduceMean axes {list(axes)} repeat an axis")
        if not isinstance(keepdims, (bool, np.bool_)):
            raise ValueError(f"ReduceMean keepdims must be true or false, got {keepdims!r}")
        self.keepdims = bool(keepdims)
        dims = letters_of(x)
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

    def work(self, C):
        # The reference counts only the all-reduce of the partial sums; the reading pass is
        # memory-bound work a measured machine sees.
        E = self._E(C)
        (reduced,) = self._groups(C, self.axes)
        return LayerWork(Pass("pool", E, 0.0 * E), AllReduce(E, reduced))


class Softmax(_ShapeOfInput):
    """Softmax along one axis: ``4E + E dom[axis] + AR(e, a) + AR(e dom[axis], a) + AR(e, a)``.

    ``axis`` may be a list of axes: a softmax over their elements together (Swin's attention
    over the 7 x 7 tokens of a window, two dimensions of its scores); ``dom[axis]`` is then
    their product and the all-reduces run over the devices splitting any of them.

    An attention softmax declares what a fused kernel does to the scores before it, so that
    the scores -> softmax -> context pattern stays three layers: ``causal`` (the mask),
    ``window`` (a sliding window of that many keys, causal: the work and the stored
    probabilities of its band only, ``pase.model.layers.masks``), ``alibi`` (a linear bias
    per head added, MPT), ``softcap`` (``c tanh(x / c)``, Gemma 2) and ``sinks`` (the axes
    of the heads: one learnt logit per head joins the normalisation, GPT-OSS; a parameter
    of the layer). ALiBi and soft-capping are one point-wise pass each over the scores.
    """

    op = "Softmax"

    def __init__(self, x: Tensor, axis=-1, causal: bool = False, window: int = 0, alibi: bool = False,
                 softcap: float = 0.0, sinks=None):
        x = check_tensor(x, "Softmax input")
        axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis) if isinstance(axis, (list, tuple)) else None
        if not axes:
            raise ValueError(f"Softmax axis must be an integer or a non-empty list of them, got {axis!r}")
        #: The axes the softmax normalises over, together.
        self.axes = tuple(check_axis(a, x.rank, self.op) for a in axes)
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"Softmax axes {list(axes)} repeat")
        self.axis = self.axes[-1]
        for name, flag in (("causal", causal), ("alibi", alibi)):
            if not isinstance(flag, bool):
                raise ValueError(f"Softmax {name} must be true or false, got {flag!r}")
        self.window = check_count(window, "Softmax window")
        if self.window and (not causal or len(self.axes) != 1):
            raise ValueError("Softmax window needs a causal softmax over one axis")
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap >= 0 \
                or softcap == float("inf"):
            raise ValueError(f"Softmax softcap must be a non-negative number, got {softcap!r}")
        self.softcap = float(softcap)
        self.alibi = alibi
        self.sinks = None if sinks is None else tuple(check_axis(a, x.rank, self.op) for a in sinks)
        if self.sinks is not None and (not self.sinks or set(self.sinks) & set(self.axes)):
            raise ValueError(f"Softmax sinks must be head axes other than the softmax's, got {sinks!r}")
        #: Share of the scores inside the window (1 without a band).
        self.density = band_density(x.shape[self.axis], self.window) if self.window else 1.0
        # ``causal``: a masked attention softmax (half its scores are masked); only the
        # fused attention pricing of a training configuration reads it.
        arg = self.axes[0] if len(self.axes) == 1 else list(self.axes)
        extra = {"causal": True} if causal else {}
        if self.window:
            extra["window"] = self.window
        if alibi:
            extra["alibi"] = True
        if self.softcap:
            extra["softcap"] = self.softcap
        if self.sinks is not None:
            extra["sinks"] = list(self.sinks)
        super().__init__(x, {"axis": arg, **extra})

    @property
    def output_density(self) -> float:
        return self.density

    def work(self, C):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        ax = list(self.axes)
        e = E / dpp[:, ax].prod(axis=1)
        full = float(np.prod([self.domain[a] for a in ax]))
        (group,) = self._groups(C, tuple(ax))
        band = E * self.density
        compute = Pass("softmax", band, 4.0 * band + band * full)
        passes = int(self.alibi) + int(self.softcap > 0)
        if passes:
            compute = compute + passes * Pass("gelu", band, band)
        communication = AllReduce(e, group) + AllReduce(e * full, group) + AllReduce(e, group)
        return LayerWork(compute, communication)

    def parameters(self):
        """One sink logit per head (``sinks``), split like the heads."""
        if self.sinks is None:
            return []
        return [(tuple(self.domain[a] for a in self.sinks), self.sinks)]


class SoftmaxCrossEntropy(_ShapeOfInput):
    """Softmax and cross-entropy loss; the class axis is the last.

    Cost ``4E + 2 bpp``, plus ``comm(2 bpp)`` when the class axis is split.
    """

    op = "SoftmaxCrossEntropy"
    loss = True

    def work(self, C):
        dpp = self._per_device(C)
        E = dpp.prod(axis=1)
        bpp = dpp[:, :-1].prod(axis=1)
        last = len(self.domain) - 1
        return LayerWork(Pass("loss", E, 4.0 * E + 2.0 * bpp), Exchange(2.0 * bpp, self._groups(C, (last,))[0]))
