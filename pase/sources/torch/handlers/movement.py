"""Handlers of concatenation, stacking, cyclic shifts (roll) and padding."""

from __future__ import annotations

from ..aten import _norm_dim
from ..errors import Unmappable
from .common import _same_layout, _shape_arg
from ..protos import ProtoConcat, ProtoRoll
from ..values import Atom, LazyPairs, LazySlice, LazyStrided, Replicated, View, _dependent, _freeze, _leaves
from .registry import handles


@handles({"cat", "concat", "concatenate"})
def handle_cat(imp, node, name, tensors, dim=0):
    shape = _shape_arg(node, imp)
    rank = len(shape)
    dim = _norm_dim(dim, rank)
    # Empty pieces (the zero-width slice a rotary over the whole head leaves) add nothing.
    tensors = [t for t in tensors if not (isinstance(t, Replicated) and t.shape is not None and 0 in t.shape)]
    if len(tensors) == 1 and _dependent(tensors[0]):
        return tensors[0]
    if tensors and all(isinstance(t, LazySlice) for t in tensors):
        first = tensors[0]
        if all(_same_layout(t.source, first.source) and t.dim == dim and not t.squeeze for t in tensors):
            spans = sorted((t.start, t.stop) for t in tensors)
            if all(a[1] == b[0] for a, b in zip(spans, spans[1:])):
                # Pieces put back together (rotate_half, a partial rotary and the part it
                # leaves): the source, or a slice of it, reordered within one dimension,
                # which the cost model does not see.
                ops = frozenset().union(*(t.ops for t in tensors))
                if spans[0][0] == 0 and spans[-1][1] == first.source.shape[dim]:
                    return View(first.source.base, first.source.dims, ops | first.source.ops)
                cuts = tuple(sorted(set().union(*(t.cuts for t in tensors))))
                return LazySlice(first.source, dim, spans[0][0], spans[-1][1], False, ops, cuts)
    return _concat(imp, node, tensors, dim, stack=False)


@handles({"stack"})
def handle_stack(imp, node, name, tensors, dim=0):
    shape = _shape_arg(node, imp)
    dim = _norm_dim(dim, len(shape))
    tensors = list(tensors)
    if tensors and all(isinstance(t, LazyStrided) for t in tensors):
        first = tensors[0]
        same = all(t.source is first.source or (isinstance(t.source, View) and isinstance(first.source, View)
                                                and _same_layout(t.source, first.source)) for t in tensors)
        if (same and dim == first.dim + 1 and all(t.dim == first.dim and t.step == first.step for t in tensors)
                and sorted(t.start for t in tensors) == list(range(first.step))):
            # The strided pieces of an interleaved rotary stacked back as pairs: the source with
            # its dimension seen as (n / step, step), reordered within it (not seen by the cost model).
            return LazyPairs(first.source, first.dim, first.step, frozenset().union(*(t.ops for t in tensors)))
    return _concat(imp, node, tensors, dim, stack=True)


def _concat(imp, node, tensors, dim, stack):
    items = []
    first = None
    for t in tensors:
        if _dependent(t):
            view = imp._view(t, node)
            imp._charge(view)
            expanded = [any(a.broadcast for a in _leaves(d)) for d in view.dims]
            if any(expanded):
                # An expanded operand (MLA's one rotary key head joined to every head's key):
                # the Concat reads it with size 1 there and broadcasts it.
                if stack:
                    raise Unmappable("a stack of an expanded tensor")
                if any(e and not all(a.broadcast for a in _leaves(d)) for e, d in zip(expanded, view.dims)):
                    raise Unmappable("a concatenation of a tensor expanded within a merged dimension")
                view = View(view.base, tuple(() if e else d for e, d in zip(expanded, view.dims)), view.ops)
                view = imp._exact(view, node)
                if view.base.shape() != view.shape:
                    view = imp._reshape(view, node, view.shape)
            else:
                view = imp._exact(view, node)
                first = first or view
            _freeze(view.base.atoms)
            items.append(view.base)
        else:
            if t.shape is None:
                raise Unmappable("a concatenation with a non-tensor operand")
            items.append(t.shape)
    shape = _shape_arg(node, imp)
    if first is None:
        raise Unmappable("a concatenation of expanded tensors only")
    proto = imp._record(ProtoConcat(imp._name(node, "stack" if stack else "concat"), items, dim, stack))
    leaves = first.base.leaves()
    if stack:
        atoms = leaves[:dim] + [Atom(shape[dim], "s", frozen=True)] + leaves[dim:]
    else:
        atoms = [a if i != dim else Atom(shape[dim], a.hint, frozen=True) for i, a in enumerate(leaves)]
    base = proto.output(atoms)
    return View(base, tuple((a,) if a.size > 1 else () for a in atoms))


@handles({"roll"})
def handle_roll(imp, node, name, x, shifts, dims=()):
    """``torch.roll``: a Roll layer reading its input as laid out (Swin's shifted windows)."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        raise Unmappable("a roll of the flattened tensor (no dimension given)")
    view = imp._view(x, node)
    rank = len(view.dims)
    dims = [_norm_dim(d, rank) for d in dims]
    imp._charge(view)
    view = imp._exact(view, node)
    _freeze(view.base.atoms)
    leaves = view.base.leaves()
    axes, kept = [], []
    for shift, d in zip(shifts, dims):
        atom = leaves[d]
        if atom.batch:
            raise Unmappable("a roll along the batch")
        if atom.size > 1 and shift % atom.size:
            axes.append(atom)
            kept.append(shift)
    if not axes:  # a shift by a multiple of the size: the tensor itself
        return view
    proto = imp._record(ProtoRoll(imp._name(node, "roll"), view.base, kept, axes))
    return View(proto.output(view.base.atoms), view.dims)


def _shift(x, pad):
    """``(source, shift, dim)`` where ``pad`` puts a slice back to its source's size along the
    sliced dimension alone (``F.pad(x[:, 1:], (0, 0, 0, 1))``: the sequence shifted by one,
    zero-filled); else ``None``."""
    if not isinstance(x, LazySlice) or x.squeeze:
        return None
    rank = len(x.source.shape)
    pairs = [(int(pad[i]), int(pad[i + 1]) if i + 1 < len(pad) else 0) for i in range(0, len(pad), 2)]
    padded = {rank - 1 - j: pair for j, pair in enumerate(pairs) if any(pair)}
    if set(padded) != {x.dim}:
        return None
    before, after = padded[x.dim]
    if before < 0 or after < 0 or before + (x.stop - x.start) + after != x.source.shape[x.dim]:
        return None
    return x.source.with_ops(x.ops), before - x.start, x.dim


@handles({"pad", "constant_pad_nd"})
def handle_pad(imp, node, name, x, pad, *rest, **kwargs):
    """Padding by nothing (Swin's to a multiple of the window, when it is one already) is the
    tensor itself; a slice padded back to its source's size (a token shift) is a Roll, the
    elements it fills with a constant priced as the ones a roll would bring round; padding to a
    larger shape otherwise has no layer."""
    if not any(int(p) for p in pad):
        return x
    mode = kwargs.get("mode", rest[0] if name == "pad" and rest else "constant")
    shifted = _shift(x, pad) if mode == "constant" else None
    if shifted is None:
        raise Unmappable(f"a padding by {list(pad)} to a larger shape (no PaSE layer writes one)")
    source, shift, dim = shifted
    return handle_roll(imp, node, "roll", source, shift, dim)
