"""What the walk over a traced graph knows of each tensor: its dimensions as atoms (which
layer output dimension, or piece of one, they are), views of them (transposes, reshapes,
slices), and the values that do not depend on the batch (replicated)."""

from __future__ import annotations

import math
from dataclasses import dataclass



class Atom:
    """A dimension of a layer output, or a piece of one after a refinement.

    ``parts`` is set once the atom has been split; its leaves are then its parts' leaves.
    A ``frozen`` atom belongs to a layer that cannot take it split (a convolution's channels,
    a norm's axis, the operands of an Elementwise). A ``broadcast`` atom exists only in a
    view (``expand``): no layer output has it.
    """

    __slots__ = ("size", "parts", "frozen", "broadcast", "hint", "batch")

    def __init__(self, size: int, hint: str = "", frozen: bool = False, broadcast: bool = False,
                 batch: bool = False):
        self.size = int(size)
        self.parts = None
        self.frozen = frozen
        self.broadcast = broadcast
        self.hint = hint
        self.batch = batch

    def leaves(self) -> list:
        if self.parts is None:
            return [self]
        out = []
        for part in self.parts:
            out.extend(part.leaves())
        return out

    def split(self, head: int) -> tuple:
        """Refine into ``(head, size / head)``; returns the two new atoms."""
        first = Atom(head, self.hint, broadcast=self.broadcast, batch=self.batch)
        rest = Atom(self.size // head, self.hint, broadcast=self.broadcast)
        self.parts = (first, rest)
        return first, rest

    def __repr__(self) -> str:  # for debugging only
        return f"{self.hint or '?'}{self.size}{'*' if self.broadcast else ''}"


def _leaves(atoms) -> list:
    out = []
    for atom in atoms:
        out.extend(atom.leaves())
    return out


def _big(atoms) -> list:
    """The leaves of size > 1: what a view is made of."""
    return [leaf for leaf in _leaves(atoms) if leaf.size > 1]


def _freeze(atoms) -> None:
    for leaf in _leaves(atoms):
        if not leaf.broadcast:
            leaf.frozen = True


class TracedTensor:
    """A layer output (``proto`` set) or a graph input: the tensor the search sees."""

    __slots__ = ("atoms", "proto", "index", "name", "norm_pattern", "consumed", "piece")

    def __init__(self, atoms, proto=None, index: int = 0, name: str = ""):
        self.atoms = list(atoms)
        self.proto = proto
        self.index = index
        self.name = name
        self.norm_pattern = False  # made by the mean/rsqrt pattern of a hand-written norm
        self.consumed = False  # a layer reads it: its layout is fixed
        self.piece = None  # an output of an Unstack with sizes: the atom of its piece

    def leaves(self) -> list:
        return _leaves(self.atoms)

    def shape(self) -> tuple:
        return tuple(a.size for a in self.leaves())


@dataclass(frozen=True, eq=False)
class View:
    """A batch-dependent tensor: ``base`` seen through ``dims`` (atoms per dimension).

    ``ops``: names of the point-wise operations applied since ``base`` was produced, not yet
    charged to its layer (they are charged when a layer reads the view; a set, so that two
    readers of one view charge each operation once).
    """

    base: TracedTensor
    dims: tuple
    ops: frozenset = frozenset()

    @property
    def shape(self) -> tuple:
        return tuple(math.prod(a.size for a in dim) for dim in self.dims)

    def with_ops(self, ops) -> "View":
        return View(self.base, self.dims, self.ops | frozenset(ops))


@dataclass(frozen=True, eq=False)
class LazySlice:
    """``source[..., start:stop, ...]`` along ``dim`` (``squeeze``: an index, the dim dropped).

    Kept lazy: the halves of a rotary ``rotate_half`` are put back together by ``cat`` at no
    cost; anything else turns the slice into one output of an Unstack.
    """

    source: View
    dim: int
    start: int
    stop: int
    squeeze: bool = False
    ops: frozenset = frozenset()
    #: Boundaries of the other slices taken of the same dimension (a split's), so that one
    #: Unstack of unequal pieces serves them all.
    cuts: tuple = ()

    def with_ops(self, ops) -> "LazySlice":
        return LazySlice(self.source, self.dim, self.start, self.stop, self.squeeze, self.ops | frozenset(ops),
                         self.cuts)

    @property
    def shape(self) -> tuple:
        shape = list(self.source.shape)
        if self.squeeze:
            del shape[self.dim]
        else:
            shape[self.dim] = self.stop - self.start
        return tuple(shape)


@dataclass(frozen=True, eq=False)
class LazyStatistic:
    """A statistic (``mean``, ``var``, ...) over ``axes`` of ``source``, kept lazy.

    Combined with its own source (``x * rsqrt(mean(x^2) + eps)``, ``x - mean(x)``,
    ``x / norm(x)``) it is a norm; read by anything else it becomes a ReduceMean. ``expanded``:
    broadcast back to its source's shape (``F.normalize``'s ``expand_as``), as a reader sees it.
    """

    source: View
    axes: tuple
    keepdim: bool
    kind: str
    ops: frozenset = frozenset()
    expanded: bool = False

    @property
    def shape(self) -> tuple:
        if self.expanded:
            return tuple(self.source.shape)
        shape = []
        for i, size in enumerate(self.source.shape):
            if i in self.axes:
                if self.keepdim:
                    shape.append(1)
            else:
                shape.append(size)
        return tuple(shape)


@dataclass(frozen=True, eq=False)
class LazyComplex:
    """``view_as_complex`` of ``view`` (its last dimension the real and imaginary parts).

    A complex rotary (``x * freqs_cis`` then ``view_as_real``) is the real rotary it
    computes: the point-wise operations ride on ``view``, which ``view_as_real`` gives back.
    """

    view: View
    ops: frozenset = frozenset()

    @property
    def shape(self) -> tuple:
        return self.view.shape[:-1]

    def with_ops(self, ops) -> "LazyComplex":
        return LazyComplex(self.view, self.ops | frozenset(ops))


@dataclass(frozen=True, eq=False)
class LazyStrided:
    """``source[..., start::step, ...]`` along ``dim``: every ``step``-th element from ``start``.

    It is the element ``start`` of the inner factor when ``dim`` is refined into
    ``(size / step, step)``. Kept lazy: the pieces of an interleaved rotary (``x[..., ::2]``,
    ``x[..., 1::2]``) stacked back along a new last dimension are ``source`` reordered within
    one dimension (``LazyPairs``); read by a layer it is one output of an Unstack of the
    refined inner factor. ``source`` is a View or a LazySlice.
    """

    source: object
    dim: int
    start: int
    step: int
    ops: frozenset = frozenset()

    def with_ops(self, ops) -> "LazyStrided":
        return LazyStrided(self.source, self.dim, self.start, self.step, self.ops | frozenset(ops))

    @property
    def shape(self) -> tuple:
        shape = list(self.source.shape)
        shape[self.dim] //= self.step
        return tuple(shape)


@dataclass(frozen=True, eq=False)
class LazyPairs:
    """``source`` with dimension ``dim`` seen as ``(size / step, step)``, its elements
    reordered within that dimension (the cost model does not see the order).

    What stacking the strided pieces of an interleaved rotary back gives; flattened back to
    ``source``'s shape it is ``source`` itself. ``source`` is a View or a LazySlice.
    """

    source: object
    dim: int
    step: int
    ops: frozenset = frozenset()

    def with_ops(self, ops) -> "LazyPairs":
        return LazyPairs(self.source, self.dim, self.step, self.ops | frozenset(ops))

    @property
    def shape(self) -> tuple:
        shape = list(self.source.shape)
        size = shape[self.dim]
        shape[self.dim:self.dim + 1] = [size // self.step, self.step]
        return tuple(shape)


@dataclass(frozen=True, eq=False)
class Replicated:
    """A tensor (or other value) that does not depend on the batch: a graph input at most.

    ``param``: it is one of the model's parameters (perhaps reshaped or transposed);
    ``params``: the names of the parameters it is computed from (its own name if ``param``).
    """

    shape: tuple | None
    param: bool = False
    params: frozenset = frozenset()


def _carried(value, shape) -> Replicated:
    """``value`` seen in another shape (a reshape, a transpose): the same parameter, if one."""
    return Replicated(shape, getattr(value, "param", False), getattr(value, "params", frozenset()))


class SideOutput:
    """A batch-dependent side output no layer produces (pooling indices, norm statistics)."""

    def __init__(self, what: str):
        self.what = what


class UnmappedValue:
    """The value of an operation that could not be mapped (already reported)."""


UNMAPPED = UnmappedValue()


_DEPENDENT = (View, LazySlice, LazyStatistic, LazyComplex, LazyStrided, LazyPairs)


def _dependent(value) -> bool:
    return isinstance(value, _DEPENDENT)


def _group(items: list, targets, apply: bool):
    """Group a sequence of leaf atoms into dimensions of sizes ``targets``.

    A boundary that falls inside an atom splits it, unless it is frozen. With ``apply``
    false nothing is changed and only feasibility is computed; the same steps are then taken
    for real, so a failed regrouping leaves every atom as it was. Returns the atom tuples
    per dimension, or ``None``.
    """
    items = [(a.size, a) for a in items]
    out = []
    i = 0
    for t in targets:
        if t == 1:
            out.append(())
            continue
        group = []
        prod = 1
        while prod < t:
            if i >= len(items):
                return None
            size, atom = items[i]
            if t % (prod * size) == 0:
                group.append(atom)
                prod *= size
                i += 1
                continue
            if t % prod or size % (t // prod) or atom.frozen:
                return None
            need = t // prod
            if apply:
                head, rest = atom.split(need)
                group.append(head)
                items[i] = (rest.size, rest)
            else:
                group.append(atom)
                items[i] = (size // need, atom)
            prod *= need
        out.append(tuple(group))
    if i != len(items):
        return None
    return out


def _regroup(atoms: list, targets):
    """``_group`` with a dry run first; ``None`` when impossible (nothing changed then)."""
    if _group(atoms, targets, apply=False) is None:
        return None
    return _group(atoms, targets, apply=True)


def _unify(xs: list, ys: list):
    """Pair two atom sequences of equal product, refining atoms where their sizes differ.

    Returns the list of paired leaves ``(x, y)`` or ``None`` if a frozen atom would have to
    be split or the sizes do not line up.
    """
    def run(apply):
        a = [(x.size, x) for x in xs]
        b = [(y.size, y) for y in ys]
        pairs = []
        i = j = 0
        while i < len(a) and j < len(b):
            (sa, x), (sb, y) = a[i], b[j]
            if sa == sb:
                pairs.append((x, y))
                i += 1
                j += 1
            elif sa > sb:
                if sa % sb or x.frozen:
                    return None
                if apply:
                    x, rest = x.split(sb)
                    a[i] = (rest.size, rest)
                else:
                    a[i] = (sa // sb, x)
                pairs.append((x, y))
                j += 1
            else:
                if sb % sa or y.frozen:
                    return None
                if apply:
                    y, rest = y.split(sa)
                    b[j] = (rest.size, rest)
                else:
                    b[j] = (sb // sa, y)
                pairs.append((x, y))
                i += 1
        if i != len(a) or j != len(b):
            return None
        return pairs

    if run(False) is None:
        return None
    return run(True)
