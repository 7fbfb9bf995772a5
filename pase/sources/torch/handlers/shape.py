"""Handlers of the operations that only change how a tensor is viewed: identity, reshape,
permute, expand, slice, select, split, unbind."""

from __future__ import annotations

from dataclasses import replace

from ..aten import _EXPANDS, _IDENTITY, _PERMUTES, _RESHAPES, _SHAPE_ONLY, _norm_dim
from ..errors import Unmappable
from .common import _expand_view, _shape_arg
from ..values import Replicated, LazyPairs, LazySlice, LazyStatistic, LazyStrided, View, _big, _carried, _dependent, _regroup
from .registry import handles


@handles(_IDENTITY)
def handle_identity(imp, node, name, x=None, *args, **kwargs):
    if name == "_assert_tensor_metadata":
        return None
    if name == "copy":  # copy_(dst, src): dst now holds src
        src = args[0] if args else kwargs.get("src")
        return src if _dependent(src) else Replicated(imp._meta_shape(node))
    if not _dependent(x):
        return _carried(x, imp._meta_shape(node))
    return x


@handles(_SHAPE_ONLY)
def handle_shape_only(imp, node, name, *args, **kwargs):
    return imp._replicated(node, name, args)


@handles(_RESHAPES)
def handle_reshape(imp, node, name, x, *args, **kwargs):
    if not _dependent(x):
        return _carried(x, imp._meta_shape(node))
    shape = _shape_arg(node, imp)
    if isinstance(x, LazySlice) and x.shape == shape:
        return x
    if isinstance(x, LazyPairs) and x.source.shape == shape:
        # An interleaved rotary's pairs flattened back: the source, reordered within a dimension.
        return x.source.with_ops(x.ops)
    view = imp._view(x, node)
    groups = _regroup(_big([a for d in view.dims for a in d]), shape)
    if groups is None:
        return imp._reshape(view, node, shape)
    return View(view.base, tuple(groups), view.ops)


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
    raise Unmappable("an unknown permutation")


@handles(_PERMUTES)
def handle_permute(imp, node, name, x, *args, **kwargs):
    if not _dependent(x):
        return _carried(x, imp._meta_shape(node))
    view = imp._view(x, node)
    order = _permutation(name, len(view.dims), list(args) + list(kwargs.values()))
    return View(view.base, tuple(view.dims[i] for i in order), view.ops)


@handles(_EXPANDS)
def handle_expand(imp, node, name, x, *args, **kwargs):
    if not _dependent(x):
        return _carried(x, imp._meta_shape(node))
    if isinstance(x, LazyStatistic) and x.keepdim and _shape_arg(node, imp) == tuple(x.source.shape):
        # A statistic broadcast back over the axes it reduced (``F.normalize``'s
        # ``expand_as``): still lazy, so that dividing its source by it is a norm.
        return replace(x, expanded=True)
    view = imp._view(x, node)
    shape = _shape_arg(node, imp)
    if view.shape == shape:
        return view
    return _expand_view(view, shape)


_SLICES = {"slice", "narrow", "select", "index"}


def _sibling_spans(node, dim: int, size: int) -> list:
    """``(start, stop)`` of every slice or select of ``node``'s source along ``dim``, in graph
    order; an index list whose positions the trace does not keep gives ``(None, length)``."""
    source = node.args[0] if node.args else None
    spans = []
    for user in getattr(source, "users", ()):
        name = getattr(getattr(user, "target", None), "_schema", None)
        name = name.name.split("::")[-1] if name is not None else ""
        if name not in _SLICES or user.args[0] is not source:
            continue
        rank = len(user.args[0].meta["val"].shape) if "val" in user.args[0].meta else None
        if rank is None:
            continue
        if name == "index":
            indices = list(user.args[1])
            positions = [i for i, t in enumerate(indices) if t is not None]
            if positions != [dim] or "val" not in user.meta:
                continue
            spans.append((None, int(user.meta["val"].shape[dim])))
            continue
        axis = user.args[1] if len(user.args) > 1 else 0
        if _norm_dim(axis, rank) != dim:
            continue
        if name == "select":
            index = int(user.args[2]) % size
            spans.append((index, index + 1))
        elif name == "narrow":
            start = int(user.args[2]) % size
            spans.append((start, start + int(user.args[3])))
        else:
            start, stop, step = slice(*(list(user.args[2:4]) + [None] * (2 - len(user.args[2:4])))).indices(size)
            spans.append((start, max(start, stop)))
    return spans


def _cuts(spans, size: int) -> tuple:
    """The boundaries of the known spans, and positions for the index lists in the gaps left."""
    known = [(a, b) for a, b in spans if a is not None]
    covered = sorted(known)
    free, at = [], 0
    for a, b in covered:
        if a > at:
            free.append((at, a))
        at = max(at, b)
    if at < size:
        free.append((at, size))
    placed, cursor = [], [list(f) for f in free]
    for a, length in spans:
        if a is not None:
            continue
        slot = next((f for f in cursor if f[1] - f[0] >= length), None)
        if slot is None:
            return tuple(sorted({c for span in known for c in span})), []
        placed.append((slot[0], slot[0] + length))
        slot[0] += length
    cuts = {c for span in known + placed for c in span}
    return tuple(sorted(cuts)), placed


def _lazy(imp, node, value, dim, start, stop, squeeze=False):
    """``value[..., start:stop, ...]`` along ``dim``: a LazySlice of the underlying view."""
    view = value if isinstance(value, View) else None
    if isinstance(value, LazySlice) and value.dim == dim and not value.squeeze:
        # A slice of a slice is a slice of the source (rotate_half of a partial rotary).
        return LazySlice(value.source, dim, value.start + start, value.start + stop, squeeze, value.ops,
                         value.cuts)
    if view is None:
        view = imp._view(value, node)
    size = view.shape[dim]
    cuts, _ = _cuts(_sibling_spans(node, dim, size), size)
    return LazySlice(view, dim, start, stop, squeeze, frozenset(), cuts)


@handles({"slice"})
def handle_slice(imp, node, name, x, dim=0, start=None, end=None, step=1):
    rank = len(x.shape)
    dim = _norm_dim(dim, rank)
    size = x.shape[dim]
    start, stop, step = slice(start, end, step).indices(size)
    if step != 1:
        if start >= step or size % step or len(range(start, stop, step)) != size // step:
            raise Unmappable(f"a strided slice [{start}:{stop}:{step}] of {size} that is not every {step}-th "
                             "element of the whole dimension")
        source = x if isinstance(x, (View, LazySlice)) else imp._view(x, node)
        return LazyStrided(source, dim, start, step)
    if stop <= start:
        # A zero-width slice (what a rotary over the whole head leaves): an empty tensor,
        # which a concatenation drops.
        return Replicated(tuple(0 if i == dim else d for i, d in enumerate(x.shape)))
    if start == 0 and stop == size:
        return x
    return _lazy(imp, node, x, dim, start, stop)


@handles({"narrow"})
def handle_narrow(imp, node, name, x, dim, start, length):
    return handle_slice(imp, node, "slice", x, dim, start, start + length)


@handles({"select"})
def handle_select(imp, node, name, x, dim, index):
    view = imp._view(x, node)
    dim = _norm_dim(dim, len(view.dims))
    size = view.shape[dim]
    index = index % size if size else 0
    if size == 1:
        dims = list(view.dims)
        del dims[dim]
        return View(view.base, tuple(dims), view.ops)
    return LazySlice(view, dim, index, index + 1, squeeze=True)


@handles({"index"})
def handle_index(imp, node, name, x, indices):
    """``x[..., [i, i+1, ...], ...]``: an index list of consecutive positions is a slice.

    A list whose positions the trace does not keep (a constant on the meta device) takes
    the positions the other slices of the same dimension leave, in graph order: the cost
    model sees only the pieces' sizes. Indices computed from the input are data-dependent.
    """
    indices = list(indices)
    given = [i for i, t in enumerate(indices) if t is not None]
    if len(given) != 1:
        raise Unmappable("advanced indexing along several dimensions")
    dim = given[0]
    index = indices[dim]
    if _dependent(index):
        raise Unmappable("positions computed from the input (data-dependent indexing)")
    view = imp._view(x, node)
    size = view.shape[dim]
    values = getattr(index, "values", None)
    if values is not None:
        values = [v % size for v in values]
        if values != list(range(values[0], values[0] + len(values))):
            raise Unmappable(f"an index list {values[:8]} that is not a run of consecutive positions")
        start, stop = values[0], values[0] + len(values)
    else:
        spans = _sibling_spans(node, dim, size)
        _, placed = _cuts(spans, size)
        mine = [i for i, user in enumerate(_sibling_users(node, dim)) if user is node]
        lists = [i for i, (a, _) in enumerate(spans) if a is None]
        if not mine or len(placed) != len(lists):
            raise Unmappable("an index list whose positions the trace does not keep and no other slice bounds")
        start, stop = placed[lists.index(mine[0])]
    if start == 0 and stop == size:
        return view
    return _lazy(imp, node, view, dim, start, stop)


def _sibling_users(node, dim):
    """The users of ``node``'s source in the order ``_sibling_spans`` lists them."""
    source = node.args[0]
    out = []
    for user in source.users:
        schema = getattr(getattr(user, "target", None), "_schema", None)
        name = schema.name.split("::")[-1] if schema is not None else ""
        if name not in _SLICES or user.args[0] is not source:
            continue
        if name == "index":
            positions = [i for i, t in enumerate(user.args[1]) if t is not None]
            if positions != [dim] or "val" not in user.meta:
                continue
        else:
            rank = len(source.meta["val"].shape)
            axis = user.args[1] if len(user.args) > 1 else 0
            if _norm_dim(axis, rank) != dim:
                continue
        out.append(user)
    return out


@handles({"split", "unsafe_split", "split_with_sizes", "unsafe_split_with_sizes", "chunk"})
def handle_split(imp, node, name, x, arg, dim=0, *rest):
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
        raise Unmappable("an unknown split")
    cuts = tuple(sum(sizes[:i]) for i in range(len(sizes) + 1))
    out, start = [], 0
    for s in sizes:
        if s == size:
            out.append(view)
        elif s == 0:
            out.append(Replicated(tuple(0 if i == dim else d for i, d in enumerate(view.shape))))
        else:
            out.append(LazySlice(view, dim, start, start + s, cuts=cuts))
        start += s
    return out


@handles({"unbind"})
def handle_unbind(imp, node, name, x, dim=0):
    view = imp._view(x, node)
    dim = _norm_dim(dim, len(view.dims))
    return [handle_select(imp, node, "select", view, dim, i) for i in range(view.shape[dim])]
