"""Bring your own model: a PyTorch ``nn.Module`` traced by ``torch.export``, as a PaSE network.

The ATen graph is mapped onto the layer types of ``docs/cost-model.md``; views, transposes and
reshapes become Einsum letters rather than vertices. torch is imported only in here, lazily.

How the mapping works
---------------------
Every traced tensor that depends on the mini-batch is a *view* of one layer output (or of a
user input): for each of its dimensions, the list of *atoms* it is made of. An atom is a
dimension of the underlying layer output, or a piece of one: when a reshape splits a
dimension of a projection's output (``(b, l, 3e) -> (b, l, 3, h, k)``), the atom is refined
and the projection is emitted as an Einsum with one letter per piece. A consumer that
contracts (linear, matmul, attention) reads any view, since its letters absorb the
permutation and the merges; a layer that needs its input in its own order (a convolution, a
norm, a concatenation) reads the layer output itself, or, where no view fits, a Reshape pair.

Tensors that do not depend on the batch (weights, masks, position ids, rotary tables) are
*replicated*: they are graph inputs, never vertices, and make no edges. Point-wise operations
ride along: each one adds 1 to the fused point-wise count ``pw`` of the layer that produced
its operand. Unsupported operations are collected and reported together (``UnmappableOpsError``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import math
import operator
import os
import re
import sys
from dataclasses import dataclass

from pase.core.checks import is_positive_int
from pase.model import layers as L
from pase.core.errors import MissingDependency, PaseError
from pase.core.optional import import_optional
from pase.model.builder import GraphBuilder, Network

__all__ = [
    "from_torch",
    "load_factory",
    "load_torch_graph",
    "TorchImportError",
    "TorchNotInstalledError",
    "UnmappableOpsError",
    "FactoryError",
    "LOSSES",
    "INSTALL_HINT",
]

#: How to install the optional dependency (printed in ``TorchNotInstalledError``).
INSTALL_HINT = "pip install '.[torch]'"

#: Values of ``loss``: a softmax cross-entropy over the output's last axis, or none.
LOSSES = ("cross-entropy", None)


# ---------------------------------------------------------------------------------------
# Errors


class TorchImportError(PaseError, ValueError):
    """A model that cannot be imported; the message says why in one line."""


class TorchNotInstalledError(TorchImportError, MissingDependency):
    """PyTorch is missing: the message tells how to install it."""

    def __init__(self):
        super().__init__(f"importing a PyTorch model needs PyTorch, which is not installed: {INSTALL_HINT}")


class UnmappableOpsError(TorchImportError):
    """Operations of the traced graph that no PaSE layer expresses.

    ``ops`` lists ``(op, module_path, reason, count)`` for every distinct operation, in the
    order of their first occurrence; the message names each once, with the module path
    (from ``torch.export``'s module stack) where it first occurs.
    """

    def __init__(self, model: str, ops: list):
        self.ops = list(ops)
        parts = []
        for op, where, reason, count in self.ops:
            more = f"; {count - 1} more" if count > 1 else ""
            parts.append(f"{op} in {where or 'the top-level module'} ({reason}{more})")
        super().__init__(f"cannot map {len(self.ops)} operation(s) of {model} onto PaSE layers: " + "; ".join(parts))


class FactoryError(TorchImportError):
    """A model factory (``FILE.py:FUNCTION`` or ``package.module:FUNCTION``) that cannot be used."""


class _Unmappable(Exception):
    """Raised inside a handler: this operation cannot be mapped (the reason is the message)."""


def _import_torch():
    # torch.export is a separate submodule in some releases.
    return import_optional("torch", "torch.export", missing=TorchNotInstalledError)


# ---------------------------------------------------------------------------------------
# Atoms, layer outputs and the values of traced tensors


class _Atom:
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
        first = _Atom(head, self.hint, broadcast=self.broadcast, batch=self.batch)
        rest = _Atom(self.size // head, self.hint, broadcast=self.broadcast)
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


class _Base:
    """A layer output (``proto`` set) or a graph input: the tensor the search sees."""

    __slots__ = ("atoms", "proto", "index", "name", "norm_pattern", "consumed")

    def __init__(self, atoms, proto=None, index: int = 0, name: str = ""):
        self.atoms = list(atoms)
        self.proto = proto
        self.index = index
        self.name = name
        self.norm_pattern = False  # made by the mean/rsqrt pattern of a hand-written norm
        self.consumed = False  # a layer reads it: its layout is fixed

    def leaves(self) -> list:
        return _leaves(self.atoms)

    def shape(self) -> tuple:
        return tuple(a.size for a in self.leaves())


@dataclass(frozen=True, eq=False)
class _View:
    """A batch-dependent tensor: ``base`` seen through ``dims`` (atoms per dimension).

    ``ops``: names of the point-wise operations applied since ``base`` was produced, not yet
    charged to its layer (they are charged when a layer reads the view; a set, so that two
    readers of one view charge each operation once).
    """

    base: _Base
    dims: tuple
    ops: frozenset = frozenset()

    @property
    def shape(self) -> tuple:
        return tuple(math.prod(a.size for a in dim) for dim in self.dims)

    def with_ops(self, ops) -> "_View":
        return _View(self.base, self.dims, self.ops | frozenset(ops))


@dataclass(frozen=True, eq=False)
class _Slice:
    """``source[..., start:stop, ...]`` along ``dim`` (``squeeze``: an index, the dim dropped).

    Kept lazy: the halves of a rotary ``rotate_half`` are put back together by ``cat`` at no
    cost; anything else turns the slice into one output of an Unstack.
    """

    source: _View
    dim: int
    start: int
    stop: int
    squeeze: bool = False
    ops: frozenset = frozenset()

    @property
    def shape(self) -> tuple:
        shape = list(self.source.shape)
        if self.squeeze:
            del shape[self.dim]
        else:
            shape[self.dim] = self.stop - self.start
        return tuple(shape)


@dataclass(frozen=True, eq=False)
class _Stat:
    """A statistic (``mean``, ``var``, ...) over ``axes`` of ``source``, kept lazy.

    Combined with its own source (``x * rsqrt(mean(x^2) + eps)``, ``x - mean(x)``) it is a
    norm; read by anything else it becomes a ReduceMean.
    """

    source: _View
    axes: tuple
    keepdim: bool
    kind: str
    ops: frozenset = frozenset()

    @property
    def shape(self) -> tuple:
        shape = []
        for i, size in enumerate(self.source.shape):
            if i in self.axes:
                if self.keepdim:
                    shape.append(1)
            else:
                shape.append(size)
        return tuple(shape)


@dataclass(frozen=True, eq=False)
class _Replicated:
    """A tensor (or other value) that does not depend on the batch: a graph input at most."""

    shape: tuple | None
    param: bool = False


class _Aux:
    """A batch-dependent side output no layer produces (pooling indices, norm statistics)."""

    def __init__(self, what: str):
        self.what = what


class _UnknownType:
    """The value of an operation that could not be mapped (already reported)."""


_UNKNOWN = _UnknownType()
_DEPENDENT = (_View, _Slice, _Stat)


def _dependent(value) -> bool:
    return isinstance(value, _DEPENDENT)


# ---------------------------------------------------------------------------------------
# Regrouping atoms (views and reshapes)


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


# ---------------------------------------------------------------------------------------
# Proto-layers: layers recorded during the walk, built once every refinement is known


class _Proto:
    """A layer recorded while walking the graph; ``emit`` builds the PaSE layer at the end."""

    has_pw = False

    def __init__(self, name: str):
        self.name = name
        self.pw_ops: set = set()
        self.outputs: list = []

    def output(self, atoms, index: int = 0) -> _Base:
        base = _Base(atoms, self, index)
        self.outputs.append(base)
        return base

    @property
    def pw(self) -> int:
        return len(self.pw_ops)


class _Emitter:
    """Builds the PaSE layers of the protos, in order, with one GraphBuilder."""

    def __init__(self, builder: GraphBuilder):
        self.g = builder
        self.tensors: dict = {}  # id(_Base) -> pase Tensor

    def tensor(self, base: _Base):
        if id(base) not in self.tensors:
            if base.proto is not None:
                raise AssertionError(f"layer output {base.name!r} read before it was built")
            leaves = base.leaves()
            self.tensors[id(base)] = self.g.input(tuple(a.size for a in leaves), base.name, _letters(leaves))
        return self.tensors[id(base)]

    def constant(self, shape, name: str):
        """A replicated operand of a data-movement layer (a Concat): a graph input."""
        return self.g.input(tuple(shape), name)

    def add(self, proto: _Proto, layer) -> None:
        outs = self.g.add(proto.name, layer)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for base, t in zip(proto.outputs, outs):
            self.tensors[id(base)] = t


_PREFERRED = "bcdefghijklmnopqrstuvwxyza"


def _letters(atoms, avoid: str = "", keys=None) -> str:
    """One display letter per atom, from the atoms' hints, distinct per distinct key.

    ``keys`` (default: the atoms themselves) says which entries are the same dimension.
    """
    keys = [id(a) for a in atoms] if keys is None else list(keys)
    given: dict = {}
    used = set(avoid)
    out = []
    for atom, key in zip(atoms, keys):
        if key not in given:
            letter = atom.hint if atom.hint and atom.hint not in used else next(
                (c for c in _PREFERRED if c not in used), None)
            if letter is None:
                raise _Unmappable("more than 26 distinct dimensions in one layer")
            used.add(letter)
            given[key] = letter
        out.append(given[key])
    return "".join(out)


def _batch_position(leaves) -> int | None:
    return next((i for i, a in enumerate(leaves) if a.batch), None)


def _index_of(leaves, atom) -> int:
    for i, leaf in enumerate(leaves):
        if leaf is atom:
            return i
    raise AssertionError("atom not among the leaves")


class _Gemm(_Proto):
    """linear, matmul, bmm, addmm, einsum, attention's two products: an FC or an Einsum.

    ``operands``: two entries, ``("view", _View)`` (a batch-dependent tensor, read as its
    layer output) or ``("weight", [(atom, side)], param, suffix)`` (a replicated operand: a
    graph input whose dimensions are the atoms, each named as in operand ``side``).

    Letters are *keys* ``(side, atom)``: the same atom read by both operands (q and k are
    two outputs of one Unstack) is two letters unless the product pairs it. ``alias`` maps
    the key of one paired atom to the other's; ``sources`` says, per output atom, the key it
    copies (``("copy", key)``) or that it is a weight's own dimension (``("own", side)``).
    """

    has_pw = True

    def __init__(self, name, operands, alias, sources):
        super().__init__(name)
        self.operands = operands
        self.alias = alias
        self.sources = sources
        self.atoms: dict = {}  # key -> atom, for sizes and hints
        self.hints: dict = {}  # key -> display letter wanted for it

    def _key(self, side, atom):
        key = (side, id(atom))
        self.atoms.setdefault(key, atom)
        key = self.alias.get(key, key)
        return key

    def terms(self) -> tuple:
        """The keys of A, of B and of the output, in each tensor's dimension order."""
        terms = []
        for side, op in enumerate(self.operands):
            if op[0] == "view":
                terms.append([self._key(side, leaf) for leaf in op[1].base.leaves()])
            else:
                terms.append([self._key(src, leaf) for atom, src in op[1] for leaf in atom.leaves()
                              if not leaf.broadcast])
        out = []
        for atom in self.outputs[0].atoms:
            how, what = self.sources[id(atom)]
            if how == "copy":
                out.append(self.alias.get(what, what))
            else:
                out.extend(self._key(what, leaf) for leaf in atom.leaves())
        terms.append(out)
        return tuple(terms)

    def check(self) -> None:
        """Raise ``_Unmappable`` unless the letters make a valid Einsum (spec, Einsum row)."""
        a, b, out = self.terms()
        sa, sb, so = set(a), set(b), set(out)
        if len(so | sa | sb) > 26:
            raise _Unmappable("more than 26 distinct dimensions in one product")
        if len(sa) != len(a) or len(sb) != len(b) or len(so) != len(out):
            raise _Unmappable("a dimension repeats within one operand (a diagonal)")
        if (sa - sb - so) or (sb - sa - so) or (so - sa - sb):
            raise _Unmappable("a dimension that is summed over in one operand only")
        if not (so & sa) - sb or not (so & sb) - sa:
            raise _Unmappable("a matrix-vector product of two batch-dependent tensors")

    def emit(self, em: _Emitter) -> None:
        ta, tb, to = self.terms()
        atom = self.atoms.__getitem__
        if [op[0] for op in self.operands] == ["view", "weight"] and self._is_fc(ta, tb, to):
            x = em.tensor(self.operands[0][1].base)
            em.add(self, L.FC(x, atom(to[-1]).size, pw=self.pw,
                              letters=_letters([self._hinted(k) for k in ta[:-1]], avoid="nk", keys=ta[:-1])))
            return
        order = list(dict.fromkeys(to + ta + tb))
        letters = dict(zip(order, _letters([self._hinted(k) for k in order], keys=order)))
        tensors = []
        for op, term in zip(self.operands, (ta, tb)):
            word = "".join(letters[k] for k in term)
            if op[0] == "view":
                tensors.append(em.tensor(op[1].base))
            else:
                shape = tuple(atom(k).size for k in term)
                name = f"{self.name}.{op[3]}"
                tensors.append(em.g.weight(shape, name, word) if op[2] else em.g.input(shape, name, word))
        words = ["".join(letters[k] for k in term) for term in (ta, tb, to)]
        position = _batch_position([atom(k) for k in to])
        batch = words[2][position] if position is not None else None
        em.add(self, L.Einsum(f"{words[0]},{words[1]}->{words[2]}", tensors[0], tensors[1], pw=self.pw,
                              batch=batch))

    def _hinted(self, key):
        """The atom of ``key``, or a stand-in with the hint the product asked for."""
        atom = self.atoms[key]
        hint = self.hints.get(key)
        return atom if not hint else _Atom(atom.size, hint)

    def _is_fc(self, ta, tb, to) -> bool:
        """An FC reads its input as laid out, contracts its last dim and appends one unit dim."""
        if len(ta) < 2 or len(tb) != 2 or len(to) != len(ta):
            return False
        k, n = ta[-1], to[-1]
        if set(tb) != {k, n} or k == n or ta[:-1] != to[:-1]:
            return False
        return _batch_position([self.atoms[x] for x in ta]) in (0, None)


class _Conv(_Proto):
    has_pw = True

    def __init__(self, name, x, filters, kernel, stride, pad):
        super().__init__(name)
        self.x, self.filters, self.kernel, self.stride, self.pad = x, filters, kernel, stride, pad

    def emit(self, em):
        em.add(self, L.Conv(em.tensor(self.x), self.filters, self.kernel, self.stride, self.pad, pw=self.pw))


class _Pooling(_Proto):
    def __init__(self, name, x, window, stride, pad):
        super().__init__(name)
        self.x, self.window, self.stride, self.pad = x, window, stride, pad

    def emit(self, em):
        em.add(self, L.Pooling(em.tensor(self.x), self.window, self.stride, self.pad))


class _Embedding(_Proto):
    def __init__(self, name, ids, vocab, width):
        super().__init__(name)
        self.ids, self.vocab, self.width = ids, vocab, width

    def emit(self, em):
        ids = em.tensor(self.ids)
        letters = _letters(self.ids.leaves(), avoid="dv")
        em.add(self, L.Embedding(ids, self.vocab, self.width, letters=letters))


class _Elementwise(_Proto):
    has_pw = True

    def __init__(self, name, a, b):
        super().__init__(name)
        self.a, self.b = a, b

    def emit(self, em):
        em.add(self, L.Elementwise(em.tensor(self.a), em.tensor(self.b), pw=self.pw))


class _Norm(_Proto):
    """Norm, RMSNorm (over the atom ``axis``) or BatchNorm (axis 0 by definition)."""

    has_pw = True

    def __init__(self, name, kind, x, axis=None):
        super().__init__(name)
        self.kind, self.x, self.axis = kind, x, axis

    def emit(self, em):
        x = em.tensor(self.x)
        if self.kind == "BatchNorm":
            em.add(self, L.BatchNorm(x, pw=self.pw))
        else:
            cls = L.RMSNorm if self.kind == "RMSNorm" else L.Norm
            em.add(self, cls(x, axis=_index_of(self.x.leaves(), self.axis), pw=self.pw))


class _Softmax(_Proto):
    def __init__(self, name, x, axis):
        super().__init__(name)
        self.x, self.axis = x, axis

    def emit(self, em):
        em.add(self, L.Softmax(em.tensor(self.x), axis=_index_of(self.x.leaves(), self.axis)))


class _ReduceMean(_Proto):
    def __init__(self, name, x, axes):
        super().__init__(name)
        self.x, self.axes = x, axes

    def emit(self, em):
        leaves = self.x.leaves()
        axes = sorted(_index_of(leaves, a) for a in self.axes)
        em.add(self, L.ReduceMean(em.tensor(self.x), axes))


class _Loss(_Proto):
    def __init__(self, name, x):
        super().__init__(name)
        self.x = x

    def emit(self, em):
        em.add(self, L.SoftmaxCrossEntropy(em.tensor(self.x)))


class _Concat(_Proto):
    """Concat (``stack`` false) or Stack of layer outputs and replicated operands."""

    def __init__(self, name, items, axis, stack):
        super().__init__(name)
        self.items, self.axis, self.stack = items, axis, stack

    def emit(self, em):
        tensors = [
            em.tensor(item) if isinstance(item, _Base) else em.constant(item, f"{self.name}.input{i}")
            for i, item in enumerate(self.items)
        ]
        if self.stack:
            leaves = self.outputs[0].leaves()
            position = _batch_position(leaves)
            em.add(self, L.Stack(tensors, self.axis, batch_dim=position))
        else:
            em.add(self, L.Concat(tensors, self.axis))


class _Unstack(_Proto):
    def __init__(self, name, x, atom):
        super().__init__(name)
        self.x, self.atom = x, atom

    def emit(self, em):
        leaves = self.x.leaves()
        position = _batch_position(leaves)
        em.add(self, L.Unstack(em.tensor(self.x), _index_of(leaves, self.atom), batch_dim=position))


class _Reshape(_Proto):
    """A reshape no view can express: a Ravel and an Unravel (two vertices)."""

    def __init__(self, name, x, shape):
        super().__init__(name)
        self.x, self.shape = x, shape

    def emit(self, em):
        out = em.g.reshape(self.name, em.tensor(self.x), self.shape)
        em.tensors[id(self.outputs[0])] = out


# ---------------------------------------------------------------------------------------
# Operation tables

#: Operations that change nothing the cost model sees (copies, casts, aliases, asserts).
_IDENTITY = {
    "clone", "contiguous", "alias", "detach", "_to_copy", "to", "type_as", "lift_fresh_copy",
    "lift_fresh", "resolve_conj", "resolve_neg", "_conj", "positive", "_assert_tensor_metadata",
    "dropout_identity", "_unsafe_index_put_identity", "requires_grad_", "copy",
}
#: Operations with no tensor output, or an output that ignores the batch-dependent input's
#: values (only its shape): the result is replicated.
_SHAPE_ONLY = {
    "new_ones", "new_zeros", "new_empty", "new_full", "zeros_like", "ones_like", "empty_like",
    "full_like", "rand_like", "randn_like", "randint_like", "sym_size", "sym_numel", "sym_stride",
    "size", "dim", "numel", "_assert_async", "_assert_scalar", "sym_constrain_range_for_size",
}
#: Views whose result is the input's elements in order, in the output's shape.
_RESHAPES = {
    "view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as",
    "reshape_as", "view_copy", "_reshape_alias", "squeeze_copy", "unsqueeze_copy", "atleast_1d",
    "atleast_2d", "atleast_3d",
}
_PERMUTES = {"permute", "transpose", "t", "swapaxes", "swapdims", "movedim", "numpy_T", "permute_copy",
             "transpose_copy", "adjoint", "mT"}
_EXPANDS = {"expand", "expand_as", "broadcast_to", "expand_copy"}
#: Point-wise operations on one batch-dependent tensor (other operands replicated or scalars).
_POINTWISE = {
    "relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log1p", "log2",
    "neg", "abs", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "erf", "erfc", "hardtanh", "hardswish",
    "hardsigmoid", "leaky_relu", "elu", "selu", "celu", "softplus", "mish", "clamp", "clamp_min",
    "clamp_max", "square", "sign", "floor", "ceil", "round", "trunc", "frac", "logical_not", "bitwise_not",
    "logit", "nan_to_num", "threshold", "glu_identity", "fill", "add", "sub", "mul", "div", "rsub",
    "true_divide", "floor_divide", "remainder", "fmod", "maximum", "minimum", "pow", "atan2", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "__and__", "__or__", "__xor__", "where", "masked_fill", "lerp", "addcmul", "addcdiv",
    "copysign", "hypot", "xlogy", "heaviside", "isnan", "isinf", "isfinite", "prelu",
}
#: Of those, the ones combining operands: two batch-dependent operands make an Elementwise.
_BINARY = {
    "add", "sub", "mul", "div", "rsub", "true_divide", "floor_divide", "remainder", "fmod", "maximum",
    "minimum", "pow", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__", "where",
    "masked_fill", "lerp", "addcmul", "addcdiv", "copysign", "hypot", "xlogy", "heaviside", "prelu",
}
#: Statistics over axes: lazy until combined with their source (a norm) or read (ReduceMean).
_STATS = {"mean": "mean", "sum": "sum", "var": "var", "std": "std", "amax": "max", "amin": "min", "nansum": "sum",
          "nanmean": "mean", "logsumexp": "max"}
_NORM_STATS = {"mean", "var", "std"}
#: Module classes whose layer takes the module's own path as its name.
_LEAF_MODULE = re.compile(r"(Linear|Conv|Norm|Embedding|Pool|LayerNorm|BatchNorm|Softmax)")

_DROPOUTS = {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}


def _op_name(target) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        name = schema.name
        return name.split("::", 1)[1] if "::" in name else name
    return getattr(target, "__name__", str(target))


def _display_op(target) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        ns, _, name = schema.name.partition("::")
        return f"{ns}.{name}" if name else ns
    return getattr(target, "__name__", str(target))


def _norm_dim(dim: int, rank: int) -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise _Unmappable(f"dimension {dim} is out of range for rank {rank}")
    return dim % max(rank, 1)


def _ints(value, count: int, what: str) -> tuple:
    """``value`` (an int or a list) as ``count`` ints."""
    if isinstance(value, (list, tuple)):
        value = [int(v) for v in value]
        if len(value) == 1:
            value = value * count
        if len(value) != count:
            raise _Unmappable(f"{what} {value} is not {count} integers")
        return tuple(value)
    return (int(value),) * count


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        elif isinstance(v, dict):
            yield from _flat(list(v.values()))
        else:
            yield v


# ---------------------------------------------------------------------------------------
# The walk over the exported graph


class _Importer:
    """Walks an ``ExportedProgram``'s graph once, recording protos; then emits the network."""

    def __init__(self, program, torch, model_name: str):
        self.program = program
        self.torch = torch
        self.model_name = model_name
        self.values: dict = {}
        self.protos: list = []
        self.names: set = set()
        self.problems: dict = {}  # display op -> [module path, reason, count]
        self.unstacks: dict = {}  # (id(base), id(atom)) -> _Unstack
        self.batch: int | None = None
        self.outputs: list = []
        self.has_conv = False

    # -- bookkeeping ----------------------------------------------------------------

    def _where(self, node) -> tuple:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return "", ""
        path, kind = list(stack.values())[-1]
        kind = kind if isinstance(kind, str) else getattr(kind, "__qualname__", str(kind))
        return str(path), kind.rsplit(".", 1)[-1]

    def _name(self, node, suffix: str, leaf: bool = False) -> str:
        """A unique layer name: the module path, for the layer a leaf module (a Linear, a
        Conv2d, a norm) is made of (``leaf``); otherwise the path and what the layer does."""
        path, kind = self._where(node) if node is not None else ("", "")
        if leaf and path and _LEAF_MODULE.search(kind):
            base = path
        elif path:
            base = f"{path}.{suffix or 'layer'}"
        else:
            base = suffix or "layer"
        name, n = base, 2
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        return name

    def _record(self, proto: _Proto) -> _Proto:
        self.protos.append(proto)
        for attr in ("x", "a", "b", "ids"):
            if isinstance(getattr(proto, attr, None), _Base):
                getattr(proto, attr).consumed = True
        for item in getattr(proto, "items", ()):
            if isinstance(item, _Base):
                item.consumed = True
        for op in getattr(proto, "operands", ()):
            if op[0] == "view":
                op[1].base.consumed = True
        return proto

    def _reorder(self, view: _View) -> bool:
        """Lay a product's output out as ``view`` reads it, if no layer has read it yet.

        An Einsum may write its output in any order: a transpose read by a layer that
        needs its input in its own order (a norm, an Elementwise) then costs nothing.
        """
        base = view.base
        proto = base.proto
        if not isinstance(proto, _Gemm) or base.consumed:
            return False
        mine = [a for dim in view.dims for a in _leaves(dim)]
        leaves = base.leaves()
        big = [a for a in leaves if a.size > 1]
        if any(a.broadcast for a in mine) or len(mine) != len(big) or {id(a) for a in mine} != {id(a) for a in big}:
            return False
        for atom in base.atoms:  # the leaves inherit the source of their ancestor
            for leaf in atom.leaves():
                proto.sources.setdefault(id(leaf), proto.sources[id(atom)])
        base.atoms = mine + [a for a in leaves if a.size == 1]
        return True

    def _problem(self, node, reason: str) -> None:
        op = _display_op(node.target)
        path, _ = self._where(node)
        entry = self.problems.setdefault(op, [path, reason, 0])
        entry[2] += 1

    def _meta_shape(self, node, index: int | None = None):
        val = node.meta.get("val")
        if index is not None and isinstance(val, (list, tuple)):
            val = val[index]
        shape = getattr(val, "shape", None)
        return tuple(int(d) for d in shape) if shape is not None else None

    # -- charging point-wise operations ---------------------------------------------

    def _charge(self, view: _View) -> None:
        """A layer reads ``view``: its pending point-wise ops go to the layer that made it."""
        proto = view.base.proto
        if view.ops and proto is not None and proto.has_pw:
            proto.pw_ops |= view.ops

    # -- making views concrete --------------------------------------------------------

    def _view(self, value, node) -> _View:
        """Any batch-dependent value as a view (slices become Unstack outputs, stats means)."""
        if isinstance(value, _View):
            return value
        if isinstance(value, _Slice):
            return self._unstack(value, node)
        if isinstance(value, _Stat):
            return self._reduce(value, node)
        raise AssertionError(f"not a batch-dependent value: {value!r}")

    def _natural(self, view: _View) -> bool:
        """The view lists its layer output's dimensions in order (merges allowed, no expand)."""
        flat = [a for dim in view.dims for a in _leaves(dim)]
        if any(a.broadcast for a in flat):
            return False
        mine = [a for a in flat if a.size > 1]
        theirs = [a for a in view.base.leaves() if a.size > 1]
        return len(mine) == len(theirs) and all(x is y for x, y in zip(mine, theirs))

    def _exact(self, view: _View, node) -> _View:
        """A view that *is* its layer output, dimension for dimension: or a Reshape to one."""
        if not self._natural(view):
            self._reorder(view)
        if self._natural(view) and view.base.shape() == view.shape:
            return view
        return self._reshape(view, node)

    def _axis_leaf(self, view: _View, dim: int, node) -> tuple:
        """``(view, atom)``: a natural view whose ``dim`` is one atom of its layer output."""
        if not self._natural(view):
            self._reorder(view)
        if self._natural(view):
            big = _big(view.dims[dim])
            if len(big) == 1:
                return view, big[0]
        view = self._reshape(view, node)
        big = _leaves(view.dims[dim])
        return view, big[0]

    def _reshape(self, view: _View, node, shape=None) -> _View:
        """A Reshape pair (Ravel, Unravel) of the view's layer output to ``shape``.

        The fallback wherever no view expresses what a layer needs: the pair prices the data
        movement as the built-in AlexNet's flatten does. A permutation is not modelled.
        """
        if any(a.broadcast for dim in view.dims for a in _leaves(dim)):
            raise _Unmappable("a layer reads an expanded (broadcast) tensor")
        self._charge(view)
        _freeze(view.base.atoms)
        shape = tuple(view.shape if shape is None else shape)
        proto = self._record(_Reshape(self._name(node, "reshape"), view.base, shape))
        atoms = [_Atom(s, frozen=True) for s in shape]
        if shape == view.shape:  # dimension for dimension: keep the names and the batch mark
            for atom, dim in zip(atoms, view.dims):
                leaves = _leaves(dim)
                if leaves:
                    atom.hint = leaves[0].hint
                    atom.batch = leaves[0].batch and len(leaves) == 1
        else:
            first = next((a for dim in view.dims for a in _leaves(dim)), None)
            if first is not None and first.batch and atoms and atoms[0].size == first.size:
                atoms[0].batch = True
                atoms[0].hint = first.hint
        base = proto.output(atoms)
        return _View(base, tuple((a,) if a.size > 1 else () for a in atoms))

    def _unstack(self, s: _Slice, node) -> _View:
        """A slice read by a layer: one output of an Unstack of the sliced atom."""
        src = s.source
        size = src.shape[s.dim]
        width = s.stop - s.start
        if width <= 0 or size % width or s.start % width:
            raise _Unmappable(f"a slice [{s.start}:{s.stop}] of a dimension of {size} that is not an equal part")
        count = size // width
        dims = list(src.dims)
        groups = _regroup(_big(dims[s.dim]), (count, width))
        if groups is None or len(groups[0]) != 1:
            raise _Unmappable("a slice across a merged or frozen dimension")
        atom = groups[0][0]
        rest = groups[1]
        if atom.broadcast:  # a slice of an expanded dimension is the tensor itself
            dims[s.dim] = rest
            if s.squeeze:
                del dims[s.dim]
            return _View(src.base, tuple(dims), src.ops | s.ops)
        self._charge(src)
        key = (id(src.base), id(atom))
        if key not in self.unstacks:
            atom.frozen = True
            atom.hint = "s"
            proto = self._record(_Unstack(self._name(node, "split"), src.base, atom))
            remaining = [a for a in src.base.leaves() if a is not atom]
            for i in range(count):
                proto.output(remaining, i)
            self.unstacks[key] = proto
        proto = self.unstacks[key]
        dims[s.dim] = rest
        if s.squeeze:
            if rest:
                raise AssertionError("a squeezed slice must be one wide")
            del dims[s.dim]
        return _View(proto.outputs[s.start // width], tuple(dims), s.ops)

    def _reduce(self, stat: _Stat, node, leaf: bool = False) -> _View:
        """A statistic read by a layer: a ReduceMean of its source."""
        src = stat.source
        if not self._natural(src):
            src = self._reshape(src, node)
        self._charge(src)
        reduced = [a for i in stat.axes for a in _big(src.dims[i])]
        if not reduced:  # a mean over size-1 dimensions is the tensor itself
            dims = [d for i, d in enumerate(src.dims) if i not in stat.axes or stat.keepdim]
            dims = [() if i in stat.axes else d for i, d in enumerate(src.dims)] if stat.keepdim else dims
            return _View(src.base, tuple(dims), stat.ops)
        for a in reduced:
            a.frozen = True
        proto = self._record(_ReduceMean(self._name(node, stat.kind, leaf), src.base, reduced))
        kept = [a for a in src.base.leaves() if all(a is not r for r in reduced)]
        base = proto.output(kept or [_Atom(1)])
        dims = []
        for i, dim in enumerate(src.dims):
            if i in stat.axes:
                if stat.keepdim:
                    dims.append(())
            else:
                dims.append(dim)
        return _View(base, tuple(dims), stat.ops)

    # -- the walk -----------------------------------------------------------------------

    def run(self) -> None:
        torch = self.torch
        graph = self.program.graph
        specs = {spec.arg.name: spec for spec in self.program.graph_signature.input_specs
                 if hasattr(spec.arg, "name")}
        kinds = torch.export.graph_signature.InputKind
        dependent_inputs = self._dependent_inputs(graph, specs, kinds)
        for node in graph.nodes:
            if node.op == "placeholder":
                self.values[node.name] = self._placeholder(node, specs.get(node.name), kinds, dependent_inputs)
            elif node.op == "call_function":
                self.values[node.name] = self._call(node)
            elif node.op == "get_attr":
                self.values[node.name] = _Replicated(None)
            elif node.op == "output":
                results = node.args[0]
                results = results if isinstance(results, (list, tuple)) else (results,)
                out_specs = self.program.graph_signature.output_specs
                user = {spec.arg.name for spec in out_specs
                        if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT
                        and hasattr(spec.arg, "name")}
                for r in results:
                    if hasattr(r, "name") and r.name in user:
                        self.outputs.append(self.values.get(r.name))

    def _dependent_inputs(self, graph, specs, kinds) -> set:
        """User inputs that carry the batch: floating-point ones, and token ids of embeddings.

        Other integer or boolean inputs (attention masks, position ids) are replicated, like
        every tensor computed from weights and constants.
        """
        passthrough = _RESHAPES | _IDENTITY | _PERMUTES
        ids = set()
        for node in graph.nodes:
            if node.op == "call_function" and _op_name(node.target) == "embedding" and len(node.args) > 1:
                walk = node.args[1]
                while getattr(walk, "op", None) == "call_function" and _op_name(walk.target).rstrip("_") in passthrough:
                    walk = walk.args[0]
                if getattr(walk, "op", None) == "placeholder":
                    ids.add(walk.name)
        chosen = set()
        for node in graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            if spec is None or spec.kind != kinds.USER_INPUT:
                continue
            val = node.meta.get("val")
            shape = getattr(val, "shape", None)
            if shape is None or len(shape) == 0:
                continue
            if not (val.dtype.is_floating_point or val.dtype.is_complex or node.name in ids):
                continue
            if self.batch is None:
                self.batch = int(shape[0])
            if int(shape[0]) == self.batch:
                chosen.add(node.name)
        return chosen

    def _placeholder(self, node, spec, kinds, dependent):
        shape = self._meta_shape(node)
        if node.name in dependent:
            hints = "bl" if len(shape) == 2 else ("bchw" if len(shape) == 4 else "b" + "stuvwxyz")
            atoms = [_Atom(s, hints[i] if i < len(hints) else "", batch=(i == 0)) for i, s in enumerate(shape)]
            base = _Base(atoms, name=str(spec.arg.name) if spec is not None else node.name)
            return _View(base, tuple((a,) if a.size > 1 else () for a in atoms))
        param = spec is not None and spec.kind == kinds.PARAMETER
        return _Replicated(shape, param)

    def _call(self, node):
        def value_of(arg):
            return self.values.get(arg.name, _UNKNOWN)

        torch = self.torch
        args = torch.fx.node.map_arg(node.args, value_of)
        kwargs = torch.fx.node.map_arg(node.kwargs, value_of)
        if node.target is operator.getitem:
            seq, index = args
            if isinstance(seq, (list, tuple)):
                return seq[index]
            return seq if isinstance(seq, (_UnknownType, _Replicated)) else _UNKNOWN
        flat = list(_flat(list(args) + [kwargs]))
        if any(v is _UNKNOWN for v in flat):
            return _UNKNOWN
        aux = next((v for v in flat if isinstance(v, _Aux)), None)
        name = _op_name(node.target)
        inplace = name.endswith("_") and not name.endswith("__") and name[:-1] in _HANDLED
        if inplace:
            name = name[:-1]
        if aux is not None:
            self._problem(node, f"it reads the {aux.what}")
            return self._opaque(node)
        if not any(_dependent(v) for v in flat):
            result = self._replicated(node, name, args)
        else:
            handler = _HANDLERS.get(name)
            if handler is None:
                self._problem(node, "no PaSE layer expresses it")
                return self._opaque(node)
            try:
                result = handler(self, node, name, *args, **kwargs)
            except _Unmappable as why:
                self._problem(node, str(why))
                return self._opaque(node)
        if inplace and node.args and hasattr(node.args[0], "name"):
            # The mutated tensor now holds the result: later readers of it see the result.
            self.values[node.args[0].name] = result
        return result

    def _opaque(self, node):
        """The result of an operation that could not be mapped: a stand-in of its shape.

        The walk goes on from it, so that every unmappable operation is found in one pass;
        the import fails at the end anyway.
        """
        val = node.meta.get("val")

        def one(v):
            if not hasattr(v, "shape"):
                return _Replicated(None)
            atoms = [_Atom(int(d), frozen=True) for d in v.shape]
            return _View(_Base(atoms, name="unmapped"), tuple((a,) if a.size > 1 else () for a in atoms))

        return [one(v) for v in val] if isinstance(val, (list, tuple)) else one(val)

    def _replicated(self, node, name, args):
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            return [_Replicated(tuple(v.shape) if hasattr(v, "shape") else None) for v in val]
        shape = tuple(int(d) for d in val.shape) if hasattr(val, "shape") else None
        first = args[0] if args else None
        param = (isinstance(first, _Replicated) and first.param
                 and name in (_RESHAPES | _PERMUTES | _IDENTITY | _EXPANDS))
        return _Replicated(shape, param)

    # -- results ------------------------------------------------------------------------

    def output_view(self):
        """The first batch-dependent output of the model (what the loss reads)."""
        for value in self.outputs:
            if _dependent(value):
                return value
        return None

    def finish_outputs(self) -> None:
        """The model computes its outputs: lazy ones become layers, pending ops are charged."""
        try:
            for i, value in enumerate(self.outputs):
                if _dependent(value):
                    view = self._view(value, None)
                    self._charge(view)
                    self.outputs[i] = view
        except _Unmappable as why:
            raise TorchImportError(f"{self.model_name}: an output of the model cannot be mapped: {why}") from None

    def add_loss(self) -> None:
        value = self.output_view()
        if value is None:
            raise TorchImportError(
                f"{self.model_name}: no output of the model depends on its batch input, so there is nothing to "
                "put a loss on (use loss=None / --loss none)")
        try:
            view = self._view(value, None)
            if not self._natural(view):
                self._reorder(view)
            if view.dims and self._natural(view):
                last = _big(view.dims[-1])
                leaves = view.base.leaves()
                if not (len(last) == 1 and leaves and leaves[-1] is last[0]):
                    view = self._reshape(view, None)
            else:
                view = self._reshape(view, None)
        except _Unmappable as why:
            raise TorchImportError(f"{self.model_name}: the model's output cannot take a loss: {why}") from None
        for a in _leaves(view.dims[-1]) if view.dims else []:
            a.frozen = True
        self._record(_Loss(self._name(None, "loss"), view.base))

    def emit(self, cutoff: int) -> Network:
        g = GraphBuilder(self.model_name, cutoff=cutoff, batch=self.batch)
        em = _Emitter(g)
        for proto in self.protos:
            proto.emit(em)
        return g.build()


# ---------------------------------------------------------------------------------------
# Handlers: one function per ATen operation (or family), receiving the mapped arguments


def _shape_arg(node, imp) -> tuple:
    shape = imp._meta_shape(node)
    if shape is None:
        raise _Unmappable("its output shape is unknown")
    return shape


def _h_identity(imp, node, name, x=None, *args, **kwargs):
    if name == "_assert_tensor_metadata":
        return None
    if name == "copy":  # copy_(dst, src): dst now holds src
        src = args[0] if args else kwargs.get("src")
        return src if _dependent(src) else _Replicated(imp._meta_shape(node))
    if not _dependent(x):
        return _Replicated(imp._meta_shape(node), getattr(x, "param", False))
    return x


def _h_shape_only(imp, node, name, *args, **kwargs):
    return imp._replicated(node, name, args)


def _h_reshape(imp, node, name, x, *args, **kwargs):
    if not _dependent(x):
        return _Replicated(imp._meta_shape(node), getattr(x, "param", False))
    shape = _shape_arg(node, imp)
    if isinstance(x, _Slice) and x.shape == shape:
        return x
    view = imp._view(x, node)
    groups = _regroup(_big([a for d in view.dims for a in d]), shape)
    if groups is None:
        return imp._reshape(view, node, shape)
    return _View(view.base, tuple(groups), view.ops)


def _permutation(name, rank, args) -> list:
    order = list(range(rank))
    if name in ("permute", "permute_copy"):
        dims = args[0] if args else []
        return [_norm_dim(d, rank) for d in dims]
    if name in ("transpose", "swapaxes", "swapdims", "transpose_copy"):
        a, b = (_norm_dim(d, rank) for d in args[:2])
        order[a], order[b] = order[b], order[a]
        return order
    if name in ("t", "numpy_T"):
        return order[::-1] if name == "numpy_T" else (order[::-1] if rank == 2 else order)
    if name in ("adjoint", "mT"):
        order[-1], order[-2] = order[-2], order[-1]
        return order
    if name == "movedim":
        src, dst = args[:2]
        src = [src] if isinstance(src, int) else list(src)
        dst = [dst] if isinstance(dst, int) else list(dst)
        src = [_norm_dim(d, rank) for d in src]
        dst = [_norm_dim(d, rank) for d in dst]
        rest = [d for d in order if d not in src]
        out = [None] * rank
        for s, d in zip(src, dst):
            out[d] = s
        it = iter(rest)
        return [o if o is not None else next(it) for o in out]
    raise _Unmappable("an unknown permutation")


def _h_permute(imp, node, name, x, *args, **kwargs):
    if not _dependent(x):
        return _Replicated(imp._meta_shape(node), getattr(x, "param", False))
    view = imp._view(x, node)
    order = _permutation(name, len(view.dims), list(args) + list(kwargs.values()))
    return _View(view.base, tuple(view.dims[i] for i in order), view.ops)


def _expand_view(view: _View, shape) -> _View:
    old = list(view.dims)
    lead = len(shape) - len(old)
    if lead < 0:
        raise _Unmappable(f"an expand to fewer dimensions {list(shape)}")
    dims = [(_Atom(s, broadcast=True),) if s > 1 else () for s in shape[:lead]]
    for dim, size in zip(old, shape[lead:]):
        have = math.prod(a.size for a in dim)
        if have == size:
            dims.append(dim)
        elif have == 1:
            dims.append((_Atom(size, broadcast=True),) if size > 1 else ())
        else:
            raise _Unmappable(f"an expand of a dimension of {have} to {size}")
    return _View(view.base, tuple(dims), view.ops)


def _h_expand(imp, node, name, x, *args, **kwargs):
    if not _dependent(x):
        return _Replicated(imp._meta_shape(node), getattr(x, "param", False))
    view = imp._view(x, node)
    shape = _shape_arg(node, imp)
    if view.shape == shape:
        return view
    return _expand_view(view, shape)


def _h_slice(imp, node, name, x, dim=0, start=None, end=None, step=1):
    view = x if isinstance(x, _View) else imp._view(x, node)
    rank = len(view.dims)
    dim = _norm_dim(dim, rank)
    size = view.shape[dim]
    start, stop, step = slice(start, end, step).indices(size)
    if step != 1:
        raise _Unmappable("a strided slice")
    if start == 0 and stop == size:
        return view
    return _Slice(view, dim, start, stop)


def _h_narrow(imp, node, name, x, dim, start, length):
    return _h_slice(imp, node, "slice", x, dim, start, start + length)


def _h_select(imp, node, name, x, dim, index):
    view = imp._view(x, node)
    dim = _norm_dim(dim, len(view.dims))
    size = view.shape[dim]
    index = index % size if size else 0
    if size == 1:
        dims = list(view.dims)
        del dims[dim]
        return _View(view.base, tuple(dims), view.ops)
    return _Slice(view, dim, index, index + 1, squeeze=True)


def _h_split(imp, node, name, x, arg, dim=0, *rest):
    view = imp._view(x, node)
    dim = _norm_dim(dim, len(view.dims))
    size = view.shape[dim]
    if name in ("split", "unsafe_split"):
        if isinstance(arg, (list, tuple)):
            sizes = list(arg)
        else:
            sizes = [min(arg, size - i) for i in range(0, size, arg)]
    elif name in ("split_with_sizes", "unsafe_split_with_sizes"):
        sizes = list(arg)
    elif name == "chunk":
        width = -(-size // arg)
        sizes = [min(width, size - i) for i in range(0, size, width)]
    else:
        raise _Unmappable("an unknown split")
    out, start = [], 0
    for s in sizes:
        out.append(view if s == size else _Slice(view, dim, start, start + s))
        start += s
    return out


def _h_unbind(imp, node, name, x, dim=0):
    view = imp._view(x, node)
    dim = _norm_dim(dim, len(view.dims))
    return [_h_select(imp, node, "select", view, dim, i) for i in range(view.shape[dim])]


def _with_op(value, op: str):
    if isinstance(value, _View):
        return value.with_ops({op})
    if isinstance(value, _Slice):
        return _Slice(value.source, value.dim, value.start, value.stop, value.squeeze, value.ops | {op})
    if isinstance(value, _Stat):
        return _Stat(value.source, value.axes, value.keepdim, value.kind, value.ops | {op})
    raise AssertionError(value)


def _same_layout(a: _View, b: _View) -> bool:
    if a.base is not b.base or len(a.dims) != len(b.dims):
        return False
    for da, db in zip(a.dims, b.dims):
        la, lb = _leaves(da), _leaves(db)
        if len(la) != len(lb) or any(x is not y for x, y in zip(la, lb)):
            return False
    return True


def _same_slice(a: _Slice, b: _Slice) -> bool:
    return (_same_layout(a.source, b.source) and (a.dim, a.start, a.stop, a.squeeze)
            == (b.dim, b.start, b.stop, b.squeeze))


def _h_pointwise(imp, node, name, *args, **kwargs):
    if name in _DROPOUTS:
        x = args[0]
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        train = args[2] if len(args) > 2 else kwargs.get("train", True)
        if not train or not p:
            return x
        return _with_op(x, node.name)
    if name == "native_dropout":
        x = args[0]
        return [_with_op(x, node.name), _Aux("dropout mask")]
    dependent = [v for v in _flat(list(args) + [kwargs]) if _dependent(v)]
    shape = _shape_arg(node, imp)
    if len(dependent) >= 2 and name in _BINARY:
        return _combine(imp, node, name, dependent)
    value = dependent[0]
    if isinstance(value, _View) and value.base.norm_pattern and name in ("mul", "add") and not value.ops:
        # The learnt scale (and shift) of a hand-written norm is part of the norm's cost.
        other = next((v for v in args if isinstance(v, _Replicated)), None)
        if other is not None and other.param and other.shape == (value.shape[-1],):
            return value
    if tuple(value.shape) != shape:
        value = _expand_view(imp._view(value, node), shape)
    return _with_op(value, node.name)


def _combine(imp, node, name, values):
    """A point-wise operation of two (or three) batch-dependent tensors."""
    if len(values) > 2:
        raise _Unmappable("a point-wise operation of three batch-dependent tensors")
    a, b = values
    stats = [v for v in (a, b) if isinstance(v, _Stat)]
    views = [v for v in (a, b) if isinstance(v, _View)]
    if len(stats) == 1 and len(views) == 1:
        norm = _norm_pattern(imp, node, name, views[0], stats[0])
        if norm is not None:
            return norm
    if isinstance(a, _Slice) and isinstance(b, _Slice) and _same_slice(a, b):
        return _Slice(a.source, a.dim, a.start, a.stop, a.squeeze, a.ops | b.ops | {node.name})
    a, b = imp._view(a, node), imp._view(b, node)
    if _same_layout(a, b):
        return _View(a.base, a.dims, a.ops | b.ops | {node.name})
    shape = _shape_arg(node, imp)
    if a.shape != shape or b.shape != shape:
        raise _Unmappable(
            f"broadcasting between two batch-dependent tensors of shapes {list(a.shape)} and {list(b.shape)}")
    return _elementwise(imp, node, a, b)


def _elementwise(imp, node, a: _View, b: _View) -> _View:
    imp._charge(a)
    imp._charge(b)
    for v in (a, b):
        if not imp._natural(v):
            imp._reorder(v)
    if imp._natural(a) and imp._natural(b):
        pairs = _unify([x for x in a.base.leaves() if x.size > 1], [y for y in b.base.leaves() if y.size > 1])
        if pairs is None or a.base.shape() != b.base.shape():
            a, b = imp._exact(a, node), imp._exact(b, node)
    else:
        a, b = imp._exact(a, node), imp._exact(b, node)
    if a.base.shape() != b.base.shape():
        a, b = imp._reshape(a, node), imp._reshape(b, node)
    _freeze(a.base.atoms)
    _freeze(b.base.atoms)
    proto = imp._record(_Elementwise(imp._name(node, _op_name(node.target).rstrip("_")), a.base, b.base))
    base = proto.output(a.base.atoms)
    return _View(base, a.dims)


def _norm_pattern(imp, node, name, view: _View, stat: _Stat):
    """``x * rsqrt(mean(x^2) + eps)`` (RMSNorm), ``x - mean(x)`` (LayerNorm): one norm layer."""
    if stat.kind not in _NORM_STATS or not stat.keepdim or name not in ("mul", "div", "sub"):
        return None
    rank = len(stat.source.dims)
    if stat.axes != (rank - 1,) or not _same_layout(stat.source, view):
        return None
    if view.base.norm_pattern:  # the second half of a hand-written norm: already counted
        return view
    imp._charge(view)
    view, axis = imp._axis_leaf(view, rank - 1, node)
    axis.frozen = True
    proto = imp._record(_Norm(imp._name(node, "norm", leaf=True), "Norm" if name == "sub" else "RMSNorm", view.base, axis))
    base = proto.output(view.base.atoms)
    base.norm_pattern = True
    return _View(base, view.dims)


def _h_stat(imp, node, name, x, dim=None, *args, **kwargs):
    view = imp._view(x, node)
    rank = len(view.dims)
    keepdim = kwargs.get("keepdim", False)
    if name in ("var", "std"):
        # var(x, dim, unbiased/correction, keepdim)
        rest = list(args)
        keepdim = kwargs.get("keepdim", rest[-1] if rest and isinstance(rest[-1], bool) else keepdim)
    elif args:
        keepdim = bool(args[0])
    if dim is None or dim == []:
        axes = tuple(range(rank))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        axes = tuple(sorted({_norm_dim(d, rank) for d in dims}))
    return _Stat(view, axes, bool(keepdim), _STATS[name])


def _dim_atoms(view: _View, dim: int) -> list:
    """The atoms of ``view``'s dimension ``dim``, with its size-1 atom when it has one.

    A view that is exactly its layer output knows which size-1 dimension of the output is
    which (a batch of 1, a kept dimension); other views drop them.
    """
    if view.base.shape() == view.shape and all(len(_leaves(d)) <= 1 for d in view.dims):
        leaves = view.base.leaves()
        if all(not d or _leaves(d)[0] is leaves[i] for i, d in enumerate(view.dims)):
            return [leaves[dim]]
    return _big(view.dims[dim])


def _contract(imp, node, suffix, operands, out_letters, pw=0, hints=None):
    """Record the product of two operands given as ``(value, [(letter, dim)])``.

    ``dim`` is a dimension index of the operand or, for a view, an explicit tuple of its
    atoms. Letters name torch-level dimensions: a batch-dependent operand's dimension brings
    its atoms (the same letter in both operands pairs their atoms, refining them where the
    sizes differ); a replicated operand (a weight) takes the other operand's atoms, or fresh
    ones for its own dimensions. The output has fresh atoms. Returns the output view, its
    dimensions in ``out_letters`` order.
    """
    hints = hints or {}
    views = []
    for value, _ in operands:
        if _dependent(value):
            view = imp._view(value, node)
            imp._charge(view)
            views.append(view)
        else:
            if value.shape is None:
                raise _Unmappable("a product with a non-tensor operand")
            views.append(None)
    # Per letter: its size and its atoms as (atom, side) pairs; ``alias`` pairs keys.
    sizes: dict = {}
    atoms_of: dict = {}
    alias: dict = {}
    key_hints: dict = {}
    for side, ((value, spec), view) in enumerate(zip(operands, views)):
        for letter, dim in spec:
            if view is None:
                size = value.shape[dim]
                if letter in sizes and size not in (1, sizes[letter]) and sizes[letter] != 1:
                    raise _Unmappable(f"a dimension is {sizes[letter]} in one operand and {size} in the other")
                sizes[letter] = max(size, sizes.get(letter, 1))
                continue
            atoms = _dim_atoms(view, dim) if isinstance(dim, int) else list(dim)
            size = math.prod(a.size for a in atoms)
            if letter in hints:
                for a in atoms:
                    key_hints[(side, id(a))] = hints[letter]
                    if a.hint in ("", "n"):  # name the producer's letters too (display only)
                        a.hint = hints[letter]
            if letter in sizes and size not in (1, sizes[letter]) and sizes[letter] != 1:
                raise _Unmappable(f"a dimension is {sizes[letter]} in one operand and {size} in the other")
            if size < sizes.get(letter, 1) or (size == 1 and not atoms):
                sizes.setdefault(letter, size)
                continue  # broadcast against the other operand, which names the dimension
            if size > sizes.get(letter, 1):
                atoms_of.pop(letter, None)
            sizes[letter] = size
            if letter not in atoms_of:
                atoms_of[letter] = [(a, side) for a in atoms]
                continue
            mine = [a for a, _ in atoms_of[letter]]
            other_side = atoms_of[letter][0][1] if atoms_of[letter] else side
            if size > 1:
                mine, atoms = [a for a in mine if a.size > 1], [a for a in atoms if a.size > 1]
            pairs = _unify(mine, atoms)
            if pairs is None:
                raise _Unmappable("a dimension is split differently in its two operands")
            chosen = []
            for x, y in pairs:
                kx, ky = (other_side, id(x)), (side, id(y))
                if x.broadcast and not y.broadcast:
                    alias[kx] = ky
                    chosen.append((y, side))
                else:
                    alias[ky] = kx
                    chosen.append((x, other_side))
                for a in (x, y):
                    if not a.broadcast:
                        a.frozen = True
            atoms_of[letter] = chosen
    weight_side = next((i for i, v in enumerate(views) if v is None), None)
    for letter, size in sizes.items():
        if letter not in atoms_of:
            # A weight's own dimension: a fresh atom, refinable (its weight is ours to shape).
            atoms_of[letter] = [(_Atom(size, hints.get(letter, "n")), weight_side)] if size > 1 else []
    specs = []
    for side, ((value, spec), view) in enumerate(zip(operands, views)):
        if view is not None:
            specs.append(["view", view])
        else:
            specs.append(["weight", [pair for letter, _ in spec for pair in atoms_of[letter]],
                          bool(value.param), "weight"])
    # The output: a fresh copy of every operand atom it keeps (frozen, with the original),
    # the weight's own atoms themselves.
    sources: dict = {}
    out_dims = []
    for letter in out_letters:
        dim = []
        for atom, side in atoms_of[letter]:
            if views[side] is None:
                sources[id(atom)] = ("own", side)
                dim.append(atom)
            else:
                atom.frozen = True
                hint = hints.get(letter) or key_hints.get((side, id(atom))) or atom.hint
                copy = _Atom(atom.size, hint, frozen=True, batch=atom.batch)
                sources[id(copy)] = ("copy", (side, id(atom)))
                dim.append(copy)
        out_dims.append(dim)
    proto = _Gemm(None, specs, alias, sources)
    proto.hints = key_hints
    base = proto.output([a for dim in out_dims for a in dim])
    # Size-1 dimensions of the operands that no letter names stay in the output.
    terms = proto.terms()
    for side, view in enumerate(views):
        if view is None:
            continue
        named = set(terms[1 - side]) | set(terms[2])
        for leaf in view.base.leaves():
            key = proto._key(side, leaf)
            if leaf.size == 1 and key not in named:
                copy = _Atom(1, leaf.hint, frozen=True, batch=leaf.batch)
                sources[id(copy)] = ("copy", key)
                base.atoms.append(copy)
                named.add(key)
    # A GEMM needs a dimension of each operand alone in the output (its M and N): a product
    # with a replicated vector gets a size-1 one in the vector and the output.
    if weight_side is not None:
        terms = proto.terms()
        own = set(terms[weight_side]) - set(terms[1 - weight_side])
        if not own & set(terms[2]):
            unit = _Atom(1, "u")
            specs[weight_side][1].append((unit, weight_side))
            sources[id(unit)] = ("own", weight_side)
            base.atoms.append(unit)
    proto.check()
    proto.name = imp._name(node, suffix, leaf=True)
    proto.pw_ops = {f"{node.name}#{i}" for i in range(pw)}
    imp._record(proto)
    return _View(base, tuple(tuple(a for a in dim if a.size > 1) for dim in out_dims))


def _dims_spec(value, letters):
    return [(letter, i) for i, letter in enumerate(letters)]


def _h_linear(imp, node, name, x, weight, bias=None):
    if _dependent(bias):
        raise _Unmappable("a batch-dependent bias")
    rank = len(x.shape)
    lead = [f"x{i}" for i in range(rank - 1)]
    return _contract(imp, node, "linear", [(x, _dims_spec(x, lead + ["K"])), (weight, _dims_spec(weight, ["N", "K"]))],
                     lead + ["N"])


def _matmul_letters(ra: int, rb: int):
    if ra < 1 or rb < 1:
        raise _Unmappable("a product with a scalar")
    batch = max(ra, rb) - 2
    names = [f"B{i}" for i in range(max(batch, 0))]
    if ra == 1:
        a = ["K"]
    else:
        a = names[len(names) - (ra - 2):] + ["M", "K"] if ra >= 2 else []
    if rb == 1:
        b = ["K"]
    else:
        b = names[len(names) - (rb - 2):] + ["K", "N"]
    out = list(names) if ra >= 2 and rb >= 2 else []
    if ra >= 2 and rb >= 2:
        out += ["M", "N"]
    elif ra >= 2:
        out = a[:-1]
    else:
        out = b[:-2] + ["N"]
    return a, b, out


def _h_matmul(imp, node, name, a, b, *rest):
    ra, rb = len(a.shape), len(b.shape)
    la, lb, lo = _matmul_letters(ra, rb)
    return _contract(imp, node, "matmul", [(a, _dims_spec(a, la)), (b, _dims_spec(b, lb))], lo)


def _h_addmm(imp, node, name, bias, a, b, *rest, **kwargs):
    if _dependent(bias):
        raise _Unmappable("a batch-dependent bias")
    return _h_matmul(imp, node, "matmul", a, b)


def _h_einsum(imp, node, name, equation, operands, *rest):
    operands = list(operands)
    if len(operands) != 2:
        raise _Unmappable(f"an einsum of {len(operands)} operands")
    eq = equation.replace(" ", "")
    if "->" not in eq:
        inputs = eq
        counts = {}
        for c in inputs.replace(",", ""):
            counts[c] = counts.get(c, 0) + 1
        eq = inputs + "->" + "".join(sorted(c for c, n in counts.items() if n == 1))
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if "." in eq:
        raise _Unmappable("an einsum with an ellipsis")
    if len(terms) != 2 or any(len(t) != len(v.shape) for t, v in zip(terms, operands)):
        raise _Unmappable(f"an einsum {equation!r} that does not match its operands")
    return _contract(imp, node, "einsum", [(operands[0], _dims_spec(operands[0], list(terms[0]))),
                                            (operands[1], _dims_spec(operands[1], list(terms[1])))], list(out))


def _h_sdpa(imp, node, name, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):
    """Attention: the scores Einsum, a Softmax over the keys, the context Einsum.

    The scale and a mask (or causality) are point-wise operations on the scores; dropout
    acts on the softmax's output and is dropped, as after any softmax.
    """
    if _dependent(attn_mask):
        raise _Unmappable("an attention mask that depends on the batch")
    if not (_dependent(q) and _dependent(k) and _dependent(v)):
        raise _Unmappable("attention with a replicated query, key or value")
    q, k, v = (imp._view(t, node) for t in (q, k, v))
    rank = len(q.dims)
    if rank < 3 or len(k.dims) != rank or len(v.dims) != rank:
        raise _Unmappable("attention operands without a batch dimension, or of different ranks")
    batch = [f"B{i}" for i in range(rank - 3)]
    gqa = False
    q_spec = [(x, i) for i, x in enumerate(batch)]
    k_spec = [(x, i) for i, x in enumerate(batch)]
    v_spec = [(x, i) for i, x in enumerate(batch)]
    out_batch = list(batch)
    if rank >= 3:
        heads_q, heads_k = q.shape[rank - 3], k.shape[rank - 3]
        if heads_q == heads_k:
            q_spec.append(("H", rank - 3))
            k_spec.append(("H", rank - 3))
            v_spec.append(("H", rank - 3))
            out_batch.append("H")
        else:
            if heads_k == 0 or heads_q % heads_k or v.shape[rank - 3] != heads_k:
                raise _Unmappable(f"grouped-query attention with {heads_q} query heads and {heads_k} key heads")
            groups = _regroup(_big(q.dims[rank - 3]), (heads_k, heads_q // heads_k))
            if groups is None:
                raise _Unmappable("grouped-query attention whose query heads cannot be grouped")
            q_spec += [("H", groups[0]), ("R", groups[1])]
            k_spec.append(("H", rank - 3))
            v_spec.append(("H", rank - 3))
            out_batch += ["H", "R"]
            gqa = True
    pw = 1 + (1 if attn_mask is not None or is_causal else 0)
    hints = {"B0": "b", "H": "g" if gqa else "h", "R": "r", "L": "l", "S": "m", "E": "k", "V": "k"}
    scores = _contract(imp, node, "scores", [(q, q_spec + [("L", rank - 2), ("E", rank - 1)]),
                                              (k, k_spec + [("S", rank - 2), ("E", rank - 1)])],
                       out_batch + ["L", "S"], pw=pw, hints=hints)
    weights = _softmax_view(imp, node, scores, len(scores.dims) - 1)
    # The weights' dimensions, in the letters of the scores.
    w_spec = [(x, tuple(weights.dims[i])) for i, x in enumerate(out_batch + ["L", "S"])]
    context = _contract(imp, node, "context", [(weights, w_spec),
                                               (v, v_spec + [("S", rank - 2), ("V", rank - 1)])],
                        out_batch + ["L", "V"], hints=hints)
    if not gqa:
        return context
    # Grouped heads: (..., g, r, l, v) back to the (..., h, l, v) of the torch output.
    dims = list(context.dims)
    merged = dims[len(batch)] + dims[len(batch) + 1]
    return _View(context.base, tuple(dims[: len(batch)] + [merged] + dims[len(batch) + 2:]), context.ops)


def _softmax_view(imp, node, value, dim):
    view = imp._view(value, node)
    imp._charge(view)
    view, axis = imp._axis_leaf(view, dim, node)
    axis.frozen = True
    proto = imp._record(_Softmax(imp._name(node, "softmax", leaf=True), view.base, axis))
    return _View(proto.output(view.base.atoms), view.dims)


def _h_softmax(imp, node, name, x, dim, *rest, **kwargs):
    view = imp._view(x, node)
    return _softmax_view(imp, node, view, _norm_dim(dim, len(view.dims)))


def _h_conv(imp, node, name, x, weight, bias=None, stride=1, padding=0, dilation=1, *rest):
    if name == "convolution":
        transposed, _, groups = rest[:3] if len(rest) >= 3 else (False, None, 1)
        if transposed:
            raise _Unmappable("a transposed convolution")
    else:
        groups = rest[0] if rest else 1
    if _dependent(weight) or _dependent(bias):
        raise _Unmappable("a convolution whose filter depends on the batch")
    if len(x.shape) != 4 or weight.shape is None or len(weight.shape) != 4:
        raise _Unmappable("a convolution that is not 2-D")
    if groups != 1:
        raise _Unmappable(f"a grouped convolution ({groups} groups)")
    if any(d != 1 for d in _ints(dilation, 2, "dilation")):
        raise _Unmappable("a dilated convolution")
    n, c, r, s = weight.shape
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same" and r % 2 and s % 2:
            padding = ((r - 1) // 2, (s - 1) // 2)
        else:
            raise _Unmappable(f"padding={padding!r} with an even kernel")
    stride, pad = _ints(stride, 2, "stride"), _ints(padding, 2, "padding")
    view = imp._view(x, node)
    imp._charge(view)
    view = imp._exact(view, node)
    b, _, h, w = view.shape
    ho, wo = (h - r + 2 * pad[0]) // stride[0] + 1, (w - s + 2 * pad[1]) // stride[1] + 1
    if (b, n, ho, wo) != _shape_arg(node, imp):
        raise _Unmappable("a convolution whose output shape the layer does not reproduce")
    _freeze(view.base.atoms)
    imp.has_conv = True
    proto = imp._record(_Conv(imp._name(node, "conv", leaf=True), view.base, n, (r, s), stride, pad))
    batch = view.base.leaves()[0]
    atoms = [batch, _Atom(n, "c", frozen=True), _Atom(ho, "h", frozen=True), _Atom(wo, "w", frozen=True)]
    return _View(proto.output(atoms), tuple((a,) if a.size > 1 else () for a in atoms))


def _pool(imp, node, x, window, stride, pad, suffix="pool"):
    view = imp._view(x, node)
    if len(view.shape) != 4:
        raise _Unmappable("pooling that is not 2-D")
    imp._charge(view)
    view = imp._exact(view, node)
    b, c, h, w = view.shape
    want = _shape_arg(node, imp)[:4]
    pad = list(pad)
    for axis, size in ((0, h), (1, w)):
        # ceil_mode: the last, partial window is a padded one; the smallest pad giving the
        # output size stands for it (the layer's halo is priced on the unpadded input).
        while (size - window[axis] + 2 * pad[axis]) // stride[axis] + 1 < want[2 + axis] and pad[axis] < window[axis]:
            pad[axis] += 1
    pad = tuple(pad)
    ho, wo = (h - window[0] + 2 * pad[0]) // stride[0] + 1, (w - window[1] + 2 * pad[1]) // stride[1] + 1
    if (b, c, ho, wo) != want:
        raise _Unmappable("pooling whose output shape the layer does not reproduce")
    _freeze(view.base.atoms)
    proto = imp._record(_Pooling(imp._name(node, suffix, leaf=True), view.base, window, stride, pad))
    leaves = view.base.leaves()
    atoms = [leaves[0], leaves[1], _Atom(ho, "h", frozen=True), _Atom(wo, "w", frozen=True)]
    return _View(proto.output(atoms), tuple((a,) if a.size > 1 else () for a in atoms))


def _h_max_pool(imp, node, name, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    window = _ints(kernel_size, 2, "kernel_size")
    stride = _ints(stride, 2, "stride") if stride not in ((), [], None) else window
    if any(d != 1 for d in _ints(dilation, 2, "dilation")):
        raise _Unmappable("a dilated pooling window")
    out = _pool(imp, node, x, window, stride, _ints(padding, 2, "padding"))
    return [out, _Aux("pooling indices")] if name.endswith("with_indices") else out


def _h_avg_pool(imp, node, name, x, kernel_size, stride=(), padding=0, *rest):
    window = _ints(kernel_size, 2, "kernel_size")
    stride = _ints(stride, 2, "stride") if stride not in ((), [], None) else window
    return _pool(imp, node, x, window, stride, _ints(padding, 2, "padding"))


def _h_adaptive_pool(imp, node, name, x, output_size):
    view = imp._view(x, node)
    if len(view.shape) != 4:
        raise _Unmappable("adaptive pooling that is not 2-D")
    h, w = view.shape[2:]
    oh, ow = _ints(output_size, 2, "output_size")
    oh, ow = oh or h, ow or w
    with_indices = name.startswith("adaptive_max")
    if (oh, ow) == (h, w):
        out = view
    elif (oh, ow) == (1, 1) and not with_indices:
        # The global average of the built-in CNNs: a ReduceMean over height and width.
        out = imp._reduce(_Stat(imp._exact(view, node), (2, 3), True, "mean"), node, leaf=True)
    elif h % oh == 0 and w % ow == 0:
        window = (h // oh, w // ow)
        out = _pool(imp, node, view, window, window, (0, 0))
    else:
        raise _Unmappable(f"adaptive pooling from {h}x{w} to {oh}x{ow} (not a whole window)")
    return [out, _Aux("pooling indices")] if with_indices else out


def _norm_layer(imp, node, kind, x, dim):
    view = imp._view(x, node)
    imp._charge(view)
    view, axis = imp._axis_leaf(view, dim, node)
    axis.frozen = True
    proto = imp._record(_Norm(imp._name(node, "norm", leaf=True), kind, view.base, axis))
    return _View(proto.output(view.base.atoms), view.dims)


def _h_layer_norm(imp, node, name, x, normalized_shape, *rest, **kwargs):
    if len(normalized_shape) != 1:
        raise _Unmappable(f"a norm over {len(normalized_shape)} dimensions")
    kind = "RMSNorm" if "rms" in name else "Norm"
    out = _norm_layer(imp, node, kind, x, len(x.shape) - 1)
    if name in ("native_layer_norm",):
        return [out, _Aux("norm statistics"), _Aux("norm statistics")]
    if name == "_fused_rms_norm":
        return [out, _Aux("norm statistics")]
    return out


def _h_batch_norm(imp, node, name, x, *rest, **kwargs):
    view = imp._view(x, node)
    if len(view.shape) < 2:
        raise _Unmappable("a batch norm of a tensor without a channel dimension")
    imp._charge(view)
    view = imp._exact(view, node)
    _freeze(view.base.atoms)
    proto = imp._record(_Norm(imp._name(node, "norm", leaf=True), "BatchNorm", view.base))
    out = _View(proto.output(view.base.atoms), view.dims)
    count = {"batch_norm": 1, "_native_batch_norm_legit_no_training": 3, "_native_batch_norm_legit": 3,
             "_native_batch_norm_legit_functional": 5, "native_batch_norm": 3, "cudnn_batch_norm": 4,
             "_batch_norm_with_update": 4, "_batch_norm_with_update_functional": 6,
             "_batch_norm_no_update": 4, "miopen_batch_norm": 3}.get(name, 1)
    return out if count == 1 else [out] + [_Aux("batch-norm statistics")] * (count - 1)


def _h_embedding(imp, node, name, weight, indices, *rest):
    if _dependent(weight):
        raise _Unmappable("an embedding table that depends on the batch")
    view = imp._view(indices, node)
    if view.base.proto is not None:
        raise _Unmappable("token ids computed by a layer (PaSE's Embedding reads graph inputs)")
    if any(a.broadcast for dim in view.dims for a in _leaves(dim)):
        raise _Unmappable("expanded token ids")
    # The lookup reads the ids as given; a view of them (a flatten, a transpose) is a view
    # of the lookup's output, which is the ids' shape and the embedding width.
    _freeze(view.base.atoms)
    vocab, width = weight.shape
    proto = imp._record(_Embedding(imp._name(node, "embedding", leaf=True), view.base, vocab, width))
    out = proto.output(view.base.leaves() + [_Atom(width, "e", frozen=True)])
    return _View(out, tuple(view.dims) + ((out.atoms[-1],),))


def _h_cat(imp, node, name, tensors, dim=0):
    tensors = list(tensors)
    shape = _shape_arg(node, imp)
    rank = len(shape)
    dim = _norm_dim(dim, rank)
    if tensors and all(isinstance(t, _Slice) for t in tensors):
        first = tensors[0]
        if all(_same_layout(t.source, first.source) and t.dim == dim and not t.squeeze for t in tensors):
            spans = sorted((t.start, t.stop) for t in tensors)
            if spans[0][0] == 0 and spans[-1][1] == first.source.shape[dim] and all(
                    a[1] == b[0] for a, b in zip(spans, spans[1:])):
                # Halves put back together (rotate_half): the source, reordered within one
                # dimension, which the cost model does not see.
                ops = frozenset().union(*(t.ops for t in tensors)) | first.source.ops
                return _View(first.source.base, first.source.dims, ops)
    return _concat(imp, node, tensors, dim, stack=False)


def _h_stack(imp, node, name, tensors, dim=0):
    shape = _shape_arg(node, imp)
    return _concat(imp, node, list(tensors), _norm_dim(dim, len(shape)), stack=True)


def _concat(imp, node, tensors, dim, stack):
    items = []
    first = None
    for t in tensors:
        if _dependent(t):
            view = imp._view(t, node)
            imp._charge(view)
            view = imp._exact(view, node)
            _freeze(view.base.atoms)
            items.append(view.base)
            first = first or view
        else:
            if t.shape is None:
                raise _Unmappable("a concatenation with a non-tensor operand")
            items.append(t.shape)
    shape = _shape_arg(node, imp)
    proto = imp._record(_Concat(imp._name(node, "stack" if stack else "concat"), items, dim, stack))
    leaves = first.base.leaves()
    if stack:
        atoms = leaves[:dim] + [_Atom(shape[dim], "s", frozen=True)] + leaves[dim:]
    else:
        atoms = [a if i != dim else _Atom(shape[dim], a.hint, frozen=True) for i, a in enumerate(leaves)]
    base = proto.output(atoms)
    return _View(base, tuple((a,) if a.size > 1 else () for a in atoms))


_HANDLERS: dict = {}
for _names, _handler in (
    (_IDENTITY, _h_identity),
    (_SHAPE_ONLY, _h_shape_only),
    (_RESHAPES, _h_reshape),
    (_PERMUTES, _h_permute),
    (_EXPANDS, _h_expand),
    (_POINTWISE | _DROPOUTS | {"native_dropout"}, _h_pointwise),
    (set(_STATS), _h_stat),
    ({"slice"}, _h_slice),
    ({"narrow"}, _h_narrow),
    ({"select"}, _h_select),
    ({"split", "unsafe_split", "split_with_sizes", "unsafe_split_with_sizes", "chunk"}, _h_split),
    ({"unbind"}, _h_unbind),
    ({"linear"}, _h_linear),
    ({"matmul", "mm", "bmm"}, _h_matmul),
    ({"addmm", "baddbmm", "addbmm_identity"}, _h_addmm),
    ({"einsum"}, _h_einsum),
    ({"scaled_dot_product_attention"}, _h_sdpa),
    ({"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}, _h_softmax),
    ({"conv2d", "convolution", "_convolution"}, _h_conv),
    ({"max_pool2d", "max_pool2d_with_indices"}, _h_max_pool),
    ({"avg_pool2d"}, _h_avg_pool),
    ({"adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d"}, _h_adaptive_pool),
    ({"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"}, _h_layer_norm),
    ({"batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
      "_native_batch_norm_legit_functional", "native_batch_norm", "cudnn_batch_norm", "_batch_norm_with_update",
      "_batch_norm_with_update_functional", "_batch_norm_no_update", "miopen_batch_norm"}, _h_batch_norm),
    ({"embedding"}, _h_embedding),
    ({"cat", "concat", "concatenate"}, _h_cat),
    ({"stack"}, _h_stack),
):
    for _n in _names:
        _HANDLERS[_n] = _handler
del _names, _handler, _n
_HANDLED = set(_HANDLERS)


# ---------------------------------------------------------------------------------------
# Entry points


def from_torch(module, args, kwargs=None, name: str | None = None, loss: str | None = "cross-entropy",
               cutoff: int | None = None) -> Network:
    """The PaSE network of a PyTorch module, traced with ``torch.export``.

    Parameters
    ----------
    module : torch.nn.Module
        The model, in the mode (train or eval) it should be planned in. Built on the
        ``meta`` device it imports without allocating its weights.
    args : tuple
        Positional example inputs (a single tensor is taken as a one-tuple); their leading
        dimension is the mini-batch. Floating-point inputs, and the integer inputs that
        feed an embedding (token ids), carry the batch; other inputs are replicated.
    kwargs : dict, optional
        Keyword example inputs.
    name : str, optional
        The network's name; defaults to the module's class name.
    loss : {"cross-entropy", None}
        Append a softmax cross-entropy over the last axis of the model's (first
        batch-dependent) output, as the built-in graphs have; ``None`` (or ``"none"``) omits it.
    cutoff : int, optional
        Configuration cut-off; default 4 when the model has convolutions (like the built-in
        CNNs), otherwise 1.

    Returns
    -------
    pase.Network

    Raises
    ------
    TorchNotInstalledError
        torch is not installed (the message says ``pip install '.[torch]'``).
    UnmappableOpsError
        Some operations have no PaSE layer: every one is named once, with its module path.
    TorchImportError
        Bad arguments, a model ``torch.export`` cannot trace, or no batch-dependent input.

    Examples
    --------
    >>> import torch                                                     # doctest: +SKIP
    >>> net = from_torch(torch.nn.Linear(64, 10), (torch.randn(32, 64),))  # doctest: +SKIP
    >>> [layer.op for layer in net.layers]                               # doctest: +SKIP
    ['FC', 'SoftmaxCrossEntropy']
    """
    torch = _import_torch()
    if not isinstance(module, torch.nn.Module):
        raise TorchImportError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise TorchImportError(f"the example inputs must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TorchImportError(f"the keyword inputs must be a dict, got {type(kwargs).__name__}")
    if isinstance(loss, str) and loss.lower() == "none":
        loss = None
    if loss not in LOSSES:
        raise TorchImportError(f"loss must be 'cross-entropy' or None, got {loss!r}")
    if cutoff is not None and (not is_positive_int(cutoff)):
        raise TorchImportError(f"the cut-off must be a positive integer, got {cutoff!r}")
    model_name = name or type(module).__name__
    if not isinstance(model_name, str) or not model_name:
        raise TorchImportError(f"the network name must be a non-empty string, got {name!r}")
    try:
        with _quiet_logging():
            program = torch.export.export(module, tuple(args), kwargs=dict(kwargs or {}), strict=False)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001  torch raises many types, the model's forward anything
        raise TorchImportError(f"torch.export could not trace {model_name}: {_raised(err)}") from err
    importer = _Importer(program, torch, model_name)
    importer.run()
    if importer.batch is None:
        raise TorchImportError(
            f"{model_name}: no input carries a batch (a floating-point tensor or token ids read by an embedding)")
    if importer.problems:
        ops = [(op, where, reason, count) for op, (where, reason, count) in importer.problems.items()]
        raise UnmappableOpsError(model_name, ops)
    importer.finish_outputs()
    if loss is not None:
        importer.add_loss()
    if not importer.protos:
        raise TorchImportError(f"{model_name}: no layer depends on the batch input; there is nothing to plan")
    chosen = cutoff if cutoff is not None else (4 if importer.has_conv else 1)
    try:
        return importer.emit(chosen)
    except _Unmappable as why:
        raise TorchImportError(f"{model_name}: {why}") from None


def load_factory(spec: str, batch: int):
    """Call a model factory ``FILE.py:FUNCTION`` or ``package.module:FUNCTION`` with ``batch``.

    ``FUNCTION(batch)`` must return ``(module, args)`` or ``(module, args, kwargs)``.
    Returns ``(module, args, kwargs)`` (``kwargs`` a dict, possibly empty). Raises
    ``FactoryError`` naming the factory and the problem in one line.

    Examples
    --------
    >>> load_factory("examples/no_such_file.py:build", 8)
    Traceback (most recent call last):
    ...
    pase.sources.torch.importer.FactoryError: factory examples/no_such_file.py:build: file examples/no_such_file.py does not exist
    """
    torch = None
    if not isinstance(spec, str) or ":" not in spec:
        raise FactoryError(f"a model factory is FILE.py:FUNCTION or package.module:FUNCTION, got {spec!r}")
    where, _, func = spec.rpartition(":")
    label = f"factory {spec}"
    if not where or not func or not func.isidentifier():
        raise FactoryError(f"{label}: expected FILE.py:FUNCTION or package.module:FUNCTION")
    if not is_positive_int(batch):
        raise FactoryError(f"{label}: the batch size must be a positive integer, got {batch!r}")
    if where.endswith(".py") or os.sep in where or "/" in where:
        if os.path.isdir(where):
            raise FactoryError(f"{label}: {where} is a directory, not a Python file")
        if not os.path.isfile(where):
            raise FactoryError(f"{label}: file {where} does not exist")
        module_name = "_pase_factory_" + re.sub(r"\W", "_", os.path.abspath(where))
        loader_spec = importlib.util.spec_from_file_location(module_name, where)
        if loader_spec is None or loader_spec.loader is None:
            raise FactoryError(f"{label}: {where} is not a Python file")
        source = importlib.util.module_from_spec(loader_spec)
        directory = os.path.dirname(os.path.abspath(where))
        added = directory not in sys.path
        if added:  # so that the file can import its neighbours
            sys.path.insert(0, directory)
        try:
            loader_spec.loader.exec_module(source)
        except (TorchNotInstalledError, KeyboardInterrupt):
            raise
        except ImportError as err:
            raise _missing(label, err, f"importing {where} failed") from None
        except BaseException as err:  # noqa: BLE001  the user's code: sys.exit() must not end the tool
            raise FactoryError(f"{label}: importing {where} failed: {_raised(err)}") from None
        finally:
            if added:
                sys.path.remove(directory)
    else:
        try:
            source = importlib.import_module(where)
        except KeyboardInterrupt:
            raise
        except ImportError as err:
            raise _missing(label, err, f"cannot import module {where}") from None
        except BaseException as err:  # noqa: BLE001
            raise FactoryError(f"{label}: importing {where} failed: {_raised(err)}") from None
    factory = getattr(source, func, None)
    if factory is None:
        raise FactoryError(f"{label}: {where} has no function {func!r}")
    if not callable(factory):
        raise FactoryError(f"{label}: {func!r} in {where} is not a function")
    try:
        result = factory(batch)
    except (TorchNotInstalledError, KeyboardInterrupt):
        raise
    except ImportError as err:
        raise _missing(label, err, "raised") from None
    except SystemExit as err:
        raise FactoryError(f"{label} {_raised(err)}") from None
    except BaseException as err:  # noqa: BLE001
        raise FactoryError(f"{label} raised {_raised(err)}") from None
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise FactoryError(f"{label} must return (module, args) or (module, args, kwargs), "
                           f"got {type(result).__name__}")
    torch = _import_torch()
    module, args = result[0], result[1]
    kwargs = result[2] if len(result) == 3 else None
    if not isinstance(module, torch.nn.Module):
        raise FactoryError(f"{label} returned {type(module).__name__} where a torch.nn.Module belongs")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise FactoryError(f"{label} returned args of type {type(args).__name__}; expected a tuple of inputs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise FactoryError(f"{label} returned kwargs of type {type(kwargs).__name__}; expected a dict")
    return module, tuple(args), dict(kwargs or {})


def load_torch_graph(spec: str, batch: int, loss: str | None = "cross-entropy", cutoff: int | None = None,
                     name: str | None = None) -> Network:
    """``from_torch`` of the model a factory ``spec`` (without the ``torch:`` prefix) builds.

    The network is named after the factory function unless ``name`` is given.
    """
    module, args, kwargs = load_factory(spec, batch)
    return from_torch(module, args, kwargs, name=name or spec.rpartition(":")[2], loss=loss, cutoff=cutoff)


def _missing(label: str, err: ImportError, what: str) -> TorchImportError:
    """The error for a factory whose imports fail: torch itself, or a package it needs."""
    missing = getattr(err, "name", None)
    if missing == "torch":
        return TorchNotInstalledError()
    hint = f" (pip install {missing})" if missing and "." not in missing and isinstance(err, ModuleNotFoundError) else ""
    return FactoryError(f"{label}: {what}: {type(err).__name__}: {_one_line(err)}{hint}")


@contextlib.contextmanager
def _quiet_logging():
    """No log records while torch traces: on a model it cannot trace, torch logs the failure
    with a traceback on stderr, and the error it raises already says it in one line."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def _raised(err: BaseException) -> str:
    """What the user's code did, in a few words: ``called sys.exit(2)``, ``ValueError: ...``."""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r})"
    return f"{type(err).__name__}: {_one_line(err)}"


def _one_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
