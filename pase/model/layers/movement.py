"""Data-movement layers: no cost in the reference model; they shape the edges."""

from __future__ import annotations

import math
from typing import ClassVar, Sequence

import numpy as np

from pase.model.tensor import Tensor
from .base import BroadcastOperands, Layer, as_float, check_axis, check_letters, check_shape, generic_letters, letters_of, check_tensor

from .work import Exchange, LayerWork, Nothing, Pass

__all__ = ["Concat", "Ravel", "Unravel", "Stack", "Unstack", "Roll"]


class _DataMovement(Layer):
    """A layer that only moves or reshapes data: no reference cost; it shapes the edges.

    ``copies`` says whether it writes a new tensor (Concat, Stack): a measured machine
    prices that copy as memory-bound work; views (Ravel, Unravel, Unstack) cost nothing.
    """

    copies: ClassVar[bool] = False

    def work(self, C):
        if not self.copies:
            return LayerWork(Nothing(), Nothing())
        elements = math.prod(self.output_shapes[0]) / as_float(self.output_configs(C)[0]).prod(axis=1)
        return LayerWork(Pass("copy", elements, np.zeros(len(C))), Nothing())


class Concat(BroadcastOperands, _DataMovement):
    """Concatenation along ``axis``; the axis is size 1 in the iteration space.

    An operand may be size 1 off the axis where the others are not: it is broadcast (copied)
    along that dimension (MLA's shared rotary key, one head, joined to every head's key).
    Its configuration is 1 there, and its gradient is summed over the dimension: an
    all-reduce of its elements per device across the devices splitting it, as for a
    broadcast Elementwise operand.
    """

    op = "Concat"
    copies = True

    def __init__(self, tensors: Sequence[Tensor], axis: int):
        if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
            raise ValueError("Concat needs a list of tensors")
        tensors = tuple(check_tensor(t, "Concat input") for t in tensors)
        if len(tensors) < 1:
            raise ValueError("Concat needs at least one tensor")
        first = tensors[0]
        self.axis = check_axis(axis, first.rank, "Concat")
        for t in tensors[1:]:
            if t.rank != first.rank:
                raise ValueError(f"Concat on axis {self.axis}: shapes {list(first.shape)} and {list(t.shape)} "
                                 "differ in rank")
        shape = tuple(max(t.shape[i] for t in tensors) for i in range(first.rank))
        for t in tensors:
            if any(d not in (e, 1) for i, (d, e) in enumerate(zip(t.shape, shape)) if i != self.axis):
                raise ValueError(
                    f"Concat on axis {self.axis}: shapes {list(first.shape)} and {list(t.shape)} differ off the axis"
                )
        #: Per operand, the dimensions it is broadcast along (size 1 where the output is not).
        self.broadcast = tuple(tuple(i for i, (d, e) in enumerate(zip(t.shape, shape)) if i != self.axis and d != e)
                               for t in tensors)
        full = next(t for t, b in zip(tensors, self.broadcast) if not b) if any(
            not b for b in self.broadcast) else first
        dims = letters_of(full)
        total = sum(t.shape[self.axis] for t in tensors)
        super().__init__(
            tensors, tuple(1 if i == self.axis else d for i, d in enumerate(shape)), dims,
            (tuple(total if i == self.axis else d for i, d in enumerate(shape)),), (dims,), batch_dim=0,
            args={"axis": self.axis},
        )

    @classmethod
    def from_args(cls, operands, args):
        return cls(list(operands), **args)

    def input_configs(self, C):
        return [self._operand(C, i) for i in range(len(self.inputs))]

    def output_configs(self, C):
        return [C]

    def work(self, C):
        work = super().work(C)
        if not any(self.broadcast):
            return work
        return LayerWork(work.compute, work.communication + self.broadcast_gradients(C))


class Ravel(_DataMovement):
    """Flatten a tensor to one dimension; contiguous configurations only."""

    op = "Ravel"
    contiguous = True

    def __init__(self, x: Tensor):
        x = check_tensor(x, "Ravel input")
        super().__init__((x,), x.shape, letters_of(x), ((x.size,),), ("x",), batch_dim=0)

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C.prod(axis=1, keepdims=True)]


class Unravel(_DataMovement):
    """Give a flat tensor a shape; contiguous configurations only."""

    op = "Unravel"
    contiguous = True

    def __init__(self, x: Tensor, shape, letters: str | None = None):
        x = check_tensor(x, "Unravel input")
        shape = check_shape(shape, "Unravel shape")
        if x.rank != 1:
            raise ValueError(f"Unravel needs a flat tensor, got shape {list(x.shape)}")
        if math.prod(shape) != x.size:
            raise ValueError(f"cannot unravel {x.size} elements into shape {list(shape)}")
        if letters is not None:
            check_letters(letters, len(shape), f"Unravel to {list(shape)}")
        dims = letters or generic_letters(len(shape))
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
        tensors = tuple(check_tensor(t, "Stack input") for t in tensors)
        if len(tensors) < 1:
            raise ValueError("Stack needs at least one tensor")
        shape = tensors[0].shape
        for t in tensors[1:]:
            if t.shape != shape:
                raise ValueError(f"Stack inputs differ in shape: {list(shape)} and {list(t.shape)}")
        self.axis = check_axis(axis, len(shape) + 1, "Stack")
        inner = letters_of(tensors[0])
        new = next((x for x in "sabcdefghijklmnopqrtuvwxyz" if x not in inner), "?")
        dims = inner[: self.axis] + new + inner[self.axis:]
        if batch_dim is None:
            batch_dim = 1 if self.axis == 0 else 0
        batch_dim = check_axis(batch_dim, len(shape) + 1, "Stack batch_dim")
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
    """Split a tensor along ``axis`` into ``x.shape[axis]`` tensors, or into pieces of ``sizes``.

    With ``sizes`` (positive, summing to the axis) each output keeps the axis, as long as its
    piece: a fused projection's unequal parts (71 + 1 + 1 heads, 512 + 64 channels). The axis
    is size 1 in the iteration space either way: it is never split.
    """

    op = "Unstack"

    def __init__(self, x: Tensor, axis: int = 0, batch_dim: int | None = None, sizes=None):
        x = check_tensor(x, "Unstack input")
        self.axis = check_axis(axis, x.rank, "Unstack")
        dims = letters_of(x)
        part = tuple(d for i, d in enumerate(x.shape) if i != self.axis)
        if batch_dim is None:
            batch_dim = 1 if self.axis == 0 else 0
        batch_dim = check_axis(batch_dim, x.rank, "Unstack batch_dim")
        args = {"axis": self.axis, "batch_dim": batch_dim}
        if sizes is not None:
            if not isinstance(sizes, (list, tuple)) or not sizes:
                raise ValueError(f"Unstack sizes must be a list of positive integers, got {sizes!r}")
            self.sizes = check_shape(sizes, "Unstack sizes")
            if sum(self.sizes) != x.shape[self.axis]:
                raise ValueError(f"Unstack sizes {list(self.sizes)} do not add up to axis {self.axis}"
                                 f" of {x.shape[self.axis]}")
            shapes = tuple(tuple(n if i == self.axis else d for i, d in enumerate(x.shape)) for n in self.sizes)
            letters = (dims,) * len(self.sizes)
            args["sizes"] = list(self.sizes)
        else:
            self.sizes = None
            if not part:
                raise ValueError("Unstack needs an input of rank >= 2")
            count = x.shape[self.axis]
            if count > MAX_UNSTACK:
                # One tensor per slice: a huge axis would build millions of outputs (or never finish).
                raise ValueError(f"Unstack along axis {self.axis} of size {count}: at most {MAX_UNSTACK} outputs")
            shapes = (part,) * count
            letters = (dims[: self.axis] + dims[self.axis + 1:],) * count
        super().__init__(
            (x,), tuple(1 if i == self.axis else d for i, d in enumerate(x.shape)), dims, shapes, letters,
            batch_dim=batch_dim, args=args,
        )
        if self.sizes is None:  # one tensor per slice: the axis stacks them (q, k and v)
            self.roles = tuple("stack" if i == self.axis else None for i in range(x.rank))

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        if self.sizes is not None:
            return [C] * len(self.output_shapes)
        return [np.delete(C, self.axis, axis=1)] * len(self.output_shapes)


class Roll(_DataMovement):
    """A cyclic shift of ``x`` by ``shifts[i]`` along ``axes[i]`` (``torch.roll``; Swin's shifted
    windows). Iteration space: ``x``'s shape, every dimension splittable.

    It computes nothing (a permutation; a measured machine prices the copy it writes). Split
    ``c`` ways along a rolled axis of ``n`` (blocks of ``m = n / c``), a shift ``s`` sends each
    device's block to block ``j + s // m`` (its first ``m - s % m`` elements) and ``j + s // m + 1``
    (the rest): the elements landing on another device leave it. Over several rolled axes an
    element stays only if it stays along each. Those elements are exchanged with neighbours
    twice: the forward's shift and the backward's shift back (``machine.exchange``).
    """

    op = "Roll"
    copies = True

    def __init__(self, x: Tensor, shifts, axes, batch_dim: int = 0):
        x = check_tensor(x, "Roll input")
        shifts = [shifts] if isinstance(shifts, int) else list(shifts)
        axes = [axes] if isinstance(axes, int) else list(axes)
        if not axes or len(shifts) != len(axes) or not all(isinstance(s, int) for s in shifts):
            raise ValueError(f"Roll needs one integer shift per axis, got shifts {shifts} and axes {axes}")
        self.axes = tuple(check_axis(a, x.rank, "Roll") for a in axes)
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"Roll axes {list(axes)} repeat")
        #: Each shift as a non-negative one (``s mod n``).
        self.shifts = tuple(int(s) % x.shape[a] for s, a in zip(shifts, self.axes))
        batch_dim = check_axis(batch_dim, x.rank, "Roll batch_dim")
        dims = letters_of(x)
        super().__init__((x,), x.shape, dims, (x.shape,), (dims,), batch_dim=batch_dim,
                         args={"shifts": list(self.shifts), "axes": list(self.axes), "batch_dim": batch_dim})

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C]

    def moved(self, C) -> np.ndarray:
        """Elements per device that a shift sends to another device, one entry per configuration."""
        Cf = as_float(C)
        stays = np.ones(len(C))
        for s, a in zip(self.shifts, self.axes):
            c = Cf[:, a]
            m = self.domain[a] / c
            whole, part = np.floor_divide(s, m), np.mod(s, m)
            # Elements whose block moves by a whole number of blocks that is not a multiple of c leave.
            first = np.where(np.mod(whole, c) != 0, m - part, 0.0)
            second = np.where(np.mod(whole + 1, c) != 0, part, 0.0)
            stays = stays * (1.0 - (first + second) / m)
        return self._E(C) * (1.0 - stays)

    def work(self, C):
        work = super().work(C)
        (group,) = self._groups(C, self.axes)
        return LayerWork(work.compute, Exchange(2.0 * self.moved(C), group))
