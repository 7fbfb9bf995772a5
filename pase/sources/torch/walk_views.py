"""Views made concrete for the layers that read them: a product's output reordered, a Reshape
pair where no view expresses the layout, slices as Unstack outputs, statistics as ReduceMean.
"""

from __future__ import annotations

from .errors import Unmappable
from .handlers.common import _expand_view
from .protos import ProtoGemm, ProtoReduceMean, ProtoReshape, ProtoUnstack
from .values import (
    Atom, LazyComplex, LazyPairs, LazySlice, LazyStatistic, LazyStrided, View, _big, _freeze, _leaves, _regroup,
)


class ConcreteViews:
    """The layers a view needs before a layer reads it (``_view``, ``_exact``, ``_axis_leaf``,
    ``_reshape``, ``_reduce``), and the point-wise operations it carries charged to the layer that
    made it (``_charge``): a part of :class:`~pase.sources.torch.walk.GraphWalk`, whose
    ``_record`` and ``_name`` record and name the layers made here."""

    def __init__(self):
        self.unstacks: dict = {}  # (id(base), id(atom)) -> ProtoUnstack

    def _charge(self, view: View) -> None:
        """A layer reads ``view``: its pending point-wise ops go to the layer that made it."""
        proto = view.base.proto
        if view.ops and proto is not None and proto.has_pw:
            proto.pw_ops |= view.ops

    def _reorder(self, view: View) -> bool:
        """Lay a product's output out as ``view`` reads it, if no layer has read it yet.

        An Einsum may write its output in any order: a transpose read by a layer that
        needs its input in its own order (a norm, an Elementwise) then costs nothing.
        """
        base = view.base
        proto = base.proto
        if not isinstance(proto, ProtoGemm) or base.consumed:
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

    def _view(self, value, node) -> View:
        """Any batch-dependent value as a view (slices become Unstack outputs, stats means)."""
        if isinstance(value, View):
            return value
        if isinstance(value, LazySlice):
            return self._unstack(value, node)
        if isinstance(value, LazyStatistic):
            reduced = self._reduce(value, node)
            return _expand_view(reduced, value.source.shape) if value.expanded else reduced
        if isinstance(value, LazyStrided):
            # Every step-th element: the element ``start`` of the refined dimension's inner factor.
            refined = self._refined(value.source, value.dim, value.step, node)
            return self._unstack(LazySlice(refined, value.dim + 1, value.start, value.start + 1, True, value.ops),
                                 node)
        if isinstance(value, LazyPairs):
            return self._refined(value.source, value.dim, value.step, node).with_ops(value.ops)
        if isinstance(value, LazyComplex):
            raise Unmappable("a layer reads a complex tensor (only point-wise operations and view_as_real do)")
        raise AssertionError(f"not a batch-dependent value: {value!r}")

    def _refined(self, value, dim: int, step: int, node) -> View:
        """``value`` with dimension ``dim`` seen as ``(size / step, step)``: its atoms refined,
        or, where an atom is frozen, a Reshape to that shape."""
        view = self._view(value, node)
        size = view.shape[dim]
        groups = _regroup(_big(view.dims[dim]), (size // step, step))
        if groups is None:
            shape = view.shape[:dim] + (size // step, step) + view.shape[dim + 1:]
            return self._reshape(view, node, shape)
        dims = list(view.dims)
        dims[dim:dim + 1] = groups
        return View(view.base, tuple(dims), view.ops)

    def _natural(self, view: View) -> bool:
        """The view lists its layer output's dimensions in order (merges allowed, no expand)."""
        flat = [a for dim in view.dims for a in _leaves(dim)]
        if any(a.broadcast for a in flat):
            return False
        mine = [a for a in flat if a.size > 1]
        theirs = [a for a in view.base.leaves() if a.size > 1]
        return len(mine) == len(theirs) and all(x is y for x, y in zip(mine, theirs))

    def _exact(self, view: View, node) -> View:
        """A view that *is* its layer output, dimension for dimension: or a Reshape to one."""
        if not self._natural(view):
            self._reorder(view)
        if self._natural(view) and view.base.shape() == view.shape:
            return view
        return self._reshape(view, node)

    def _axis_leaf(self, view: View, dim: int, node) -> tuple:
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

    def _reshape(self, view: View, node, shape=None) -> View:
        """A Reshape pair (Ravel, Unravel) of the view's layer output to ``shape``.

        The fallback wherever no view expresses what a layer needs: the pair prices the data
        movement as the built-in AlexNet's flatten does. A permutation is not modelled.
        """
        if any(a.broadcast for dim in view.dims for a in _leaves(dim)):
            raise Unmappable("a layer reads an expanded (broadcast) tensor")
        self._charge(view)
        _freeze(view.base.atoms)
        shape = tuple(view.shape if shape is None else shape)
        proto = self._record(ProtoReshape(self._name(node, "reshape"), view.base, shape))
        atoms = [Atom(s, frozen=True) for s in shape]
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
        return View(base, tuple((a,) if a.size > 1 else () for a in atoms))

    def _unstack(self, s: LazySlice, node) -> View:
        """A slice read by a layer: one output of an Unstack of the sliced atom."""
        src = s.source
        size = src.shape[s.dim]
        width = s.stop - s.start
        if width <= 0:
            raise Unmappable(f"an empty slice [{s.start}:{s.stop}] read by a layer")
        bounds = sorted({0, size, s.start, s.stop} | {c for c in s.cuts if 0 < c < size})
        unequal = any(b - a != width for a, b in zip(bounds, bounds[1:])) if s.cuts else s.start % width
        if size % width or unequal:
            # Pieces of different sizes (q, k and v of a multi-query fusion): one Unstack with sizes.
            return self._split(s, node)
        count = size // width
        dims = list(src.dims)
        groups = _regroup(_big(dims[s.dim]), (count, width))
        if groups is None or len(groups[0]) != 1:
            return self._split(s, node)
        atom = groups[0][0]
        rest = groups[1]
        if atom.broadcast:  # a slice of an expanded dimension is the tensor itself
            dims[s.dim] = rest
            if s.squeeze:
                del dims[s.dim]
            return View(src.base, tuple(dims), src.ops | s.ops)
        self._charge(src)
        key = (id(src.base), id(atom))
        if key not in self.unstacks:
            atom.frozen = True
            atom.hint = "s"
            proto = self._record(ProtoUnstack(self._name(node, "split"), src.base, atom))
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
        return View(proto.outputs[s.start // width], tuple(dims), s.ops)

    def _split(self, s: LazySlice, node) -> View:
        """A slice of unequal pieces read by a layer: one output of an Unstack with sizes.

        The pieces are those of every slice taken of the same dimension (``s.cuts``: q, k
        and v of a fused projection, 71 + 1 + 1 heads), so one Unstack serves them all.
        """
        src = s.source
        big = _big(src.dims[s.dim])
        if len(big) != 1 or big[0].broadcast:
            src = self._reshape(src, node)
            big = _big(src.dims[s.dim])
        atom = big[0]
        if atom.batch:
            raise Unmappable("a slice of the batch")
        size = atom.size
        cuts = tuple(sorted({0, size, s.start, s.stop} | {c for c in s.cuts if 0 < c < size}))
        key = (id(src.base), id(atom), cuts)
        if key not in self.unstacks:
            self._charge(src)
            atom.frozen = True
            sizes = [b - a for a, b in zip(cuts, cuts[1:])]
            proto = self._record(ProtoUnstack(self._name(node, "split"), src.base, atom, sizes))
            leaves = src.base.leaves()
            for i, n in enumerate(sizes):
                piece = Atom(n, atom.hint, frozen=True)
                proto.output([piece if a is atom else a for a in leaves], i)
                proto.outputs[i].piece = piece
            self.unstacks[key] = proto
        proto = self.unstacks[key]
        i = cuts.index(s.start)
        if cuts[i + 1] != s.stop:
            raise AssertionError("a slice across two pieces")
        out = proto.outputs[i]
        dims = list(src.dims)
        dims[s.dim] = (out.piece,) if out.piece.size > 1 else ()
        if s.squeeze:
            del dims[s.dim]
        return View(out, tuple(dims), s.ops)

    def _reduce(self, stat: LazyStatistic, node, leaf: bool = False) -> View:
        """A statistic read by a layer: a ReduceMean of its source."""
        src = stat.source
        if not self._natural(src):
            src = self._reshape(src, node)
        self._charge(src)
        reduced = [a for i in stat.axes for a in _big(src.dims[i])]
        if not reduced:  # a mean over size-1 dimensions is the tensor itself
            dims = [d for i, d in enumerate(src.dims) if i not in stat.axes or stat.keepdim]
            dims = [() if i in stat.axes else d for i, d in enumerate(src.dims)] if stat.keepdim else dims
            return View(src.base, tuple(dims), stat.ops)
        for a in reduced:
            a.frozen = True
        proto = self._record(ProtoReduceMean(self._name(node, stat.kind, leaf), src.base, reduced))
        kept = [a for a in src.base.leaves() if all(a is not r for r in reduced)]
        base = proto.output(kept or [Atom(1)])
        dims = []
        for i, dim in enumerate(src.dims):
            if i in stat.axes:
                if stat.keepdim:
                    dims.append(())
            else:
                dims.append(dim)
        return View(base, tuple(dims), stat.ops)
