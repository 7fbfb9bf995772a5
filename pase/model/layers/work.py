"""The work of a layer, described in parts and priced by a machine through its protocol.

A layer says what it does for every configuration row (:meth:`Layer.work`): GEMMs, memory-bound
passes, collectives of activations and all-reduces of weight gradients, each with its sizes and
device group, combined by sums and scalar factors in the order its formula states them. Pricing
is one walk over that expression: :meth:`Work.value` with a function that prices each piece (or
answers ``None``: the piece does not count). The paper's cost (:meth:`LayerWork.cost`) prices
every piece with the machine's own call (:meth:`Piece.priced`); the training model
(``pase.costing.training.layer_parts``) prices the same expression part by part, and the
low-precision model (``pase.costing.precision``) re-prices its GEMMs in another number format.
A piece's price is never guessed from a proxy machine: a machine lacking a call raises.

The expression keeps the formula's order of additions, so a cost priced here is the same number,
bit for bit, as the formula written out with the machine's calls.

>>> from pase.machines.paper import Machine
>>> w = LayerWork(Gemm(1.0, 2.0, 3.0, 4.0) + 2 * Pass("gelu", 6.0, 18.0), Nothing())
>>> c = w.cost(Machine(), rows=1)  # 3 x 2 x 3 x 4 for the GEMM, 2 x 18 for the passes
>>> float(c.compute), c.communication.tolist()
(108.0, [0.0])
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

__all__ = ["Work", "Piece", "Gemm", "Pass", "AllReduce", "Exchange", "AllToAll", "Nothing", "LayerWork",
           "LayerCost"]


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


#: How a piece is priced in one walk: its cost array, or ``None`` where it does not count.
Pricer = Callable[["Piece"], "np.ndarray | None"]


class Work:
    """An expression of work: pieces, their sums and their scalar multiples.

    ``a + b`` and ``k * a`` (``a * k``) build the expression as the formula reads, so
    :meth:`value` adds in the formula's order."""

    #: NumPy scalars and arrays leave ``k * work`` to :meth:`__rmul__`.
    __array_ufunc__ = None

    def value(self, price: Pricer):
        """The expression's cost with every piece priced by ``price`` (``None``: counts nothing;
        the whole is ``None`` when nothing in it counts)."""
        raise NotImplementedError

    def pieces(self):
        """Every piece, in the order the formula states them (left to right)."""
        raise NotImplementedError

    def __add__(self, other: "Work") -> "Work":
        if not isinstance(other, Work):
            return NotImplemented
        return _Sum(self, other)

    def __mul__(self, factor) -> "Work":
        if isinstance(factor, Work):
            return NotImplemented
        return _Scaled(factor, self)

    __rmul__ = __mul__


class _Sum(Work):
    __slots__ = ("left", "right")

    def __init__(self, left: Work, right: Work):
        self.left, self.right = left, right

    def value(self, price):
        a, b = self.left.value(price), self.right.value(price)
        if a is None:
            return b
        return a if b is None else a + b

    def pieces(self):
        yield from self.left.pieces()
        yield from self.right.pieces()


class _Scaled(Work):
    __slots__ = ("factor", "work")

    def __init__(self, factor, work: Work):
        self.factor, self.work = factor, work

    def value(self, price):
        x = self.work.value(price)
        return None if x is None else self.factor * x

    def pieces(self):
        yield from self.work.pieces()


class Nothing(Work):
    """No work at all (a view's cost, a layer without collectives)."""

    def value(self, price):
        return None

    def pieces(self):
        return iter(())


class Piece(Work):
    """One call to the machine. ``activation``: a collective of activations or their gradients
    (the training model's activation part); ``weight``: an all-reduce of weight gradients."""

    activation = False
    weight = False

    def value(self, price):
        return price(self)

    def pieces(self):
        yield self

    def priced(self, machine):
        """The piece's cost on ``machine``: the protocol call it stands for."""
        raise NotImplementedError


class Gemm(Piece):
    """``B`` GEMMs ``M x K`` by ``K x N`` per device, forward and two backward products
    (``Machine.gemm``). Sizes are arrays over the configuration rows (or scalars)."""

    __slots__ = ("B", "M", "N", "K")

    def __init__(self, B, M, N, K):
        self.B, self.M, self.N, self.K = B, M, N, K

    def priced(self, machine, dtype: str = "bf16"):
        """Its time in ``dtype`` (the machine's own GEMMs unless another format is named)."""
        if dtype == "bf16":
            return machine.gemm(self.B, self.M, self.N, self.K)
        return machine.gemm(self.B, self.M, self.N, self.K, dtype=dtype)

    def operand_elements(self) -> np.ndarray:
        """``B (M K + K N + M N)``: elements of its operands and output (or their gradients)."""
        B, M, N, K = np.broadcast_arrays(*[np.asarray(x, dtype=np.float64) for x in (self.B, self.M, self.N, self.K)])
        return B * (M * K + K * N + M * N)


class Pass(Piece):
    """Memory-bound work of ``kind`` over ``elements`` (``Machine.memory_bound``); ``flops``,
    what the reference machine counts, is an array or the work whose price it is (an embedding
    counts the product it stands for)."""

    __slots__ = ("kind", "elements", "flops")

    def __init__(self, kind: str, elements, flops):
        self.kind, self.elements, self.flops = kind, elements, flops

    def priced(self, machine):
        flops = self.flops
        if isinstance(flops, Work):
            flops = flops.value(lambda piece: piece.priced(machine))
        return machine.memory_bound(self.kind, self.elements, flops)


class AllReduce(Piece):
    """An all-reduce of ``elements`` per device over ``group`` (``Machine.all_reduce``);
    ``weight``: of weight gradients (priced at the gradient's element size), else of
    activations or their gradients."""

    __slots__ = ("elements", "group", "weight")

    def __init__(self, elements, group, weight: bool = False):
        self.elements, self.group, self.weight = elements, group, bool(weight)

    @property
    def activation(self) -> bool:
        return not self.weight

    def priced(self, machine):
        if self.weight:
            return machine.all_reduce(self.elements, self.group, grad=True)
        return machine.all_reduce(self.elements, self.group)


class _Transfer(Piece):
    """Activations moved among the devices of ``group``: ``elements`` per device."""

    __slots__ = ("elements", "group")
    activation = True

    def __init__(self, elements, group):
        self.elements, self.group = elements, group


class Exchange(_Transfer):
    """A point-to-point exchange of ``elements`` per device with ``group`` (``Machine.exchange``)."""

    __slots__ = ()

    def priced(self, machine):
        return machine.exchange(self.elements, self.group)


class AllToAll(_Transfer):
    """An all-to-all of ``elements`` per device over ``group`` (``Machine.all_to_all``)."""

    __slots__ = ()

    def priced(self, machine):
        return machine.all_to_all(self.elements, self.group)


class LayerWork(NamedTuple):
    """A layer's work for every configuration row: ``compute`` (GEMMs and memory-bound passes)
    and ``communication`` (its collectives), each an expression of :class:`Work`."""

    compute: Work
    communication: Work

    def value(self, price: Pricer, rows: int):
        """``compute + communication`` priced by ``price``: one part of the cost, ``(rows,)``."""
        a, b = self.compute.value(price), self.communication.value(price)
        total = a if b is None else b if a is None else a + b
        return np.zeros(rows) if total is None else total

    def cost(self, machine, rows: int | None = None) -> LayerCost:
        """The paper's cost: every piece priced by ``machine``'s own call."""

        def price(piece):
            return piece.priced(machine)

        compute, communication = self.compute.value(price), self.communication.value(price)
        if compute is None or communication is None:
            if rows is None:
                raise ValueError("a layer's work without compute or communication needs its row count")
            compute = np.zeros(rows) if compute is None else compute
            communication = np.zeros(rows) if communication is None else communication
        return LayerCost(compute, communication)

    def gemms(self) -> list:
        """Its GEMMs (:class:`Gemm`), in the formula's order."""
        return [p for p in self.compute.pieces() if isinstance(p, Gemm)]

    def pieces(self) -> list:
        """Every piece of compute and communication, in order."""
        return list(self.compute.pieces()) + list(self.communication.pieces())
