"""Handlers of the operations that only change how a tensor is viewed: identity, reshape,
permute, expand, slice, select, split, unbind."""

from __future__ import annotations

from ..aten import _EXPANDS, _IDENTITY, _PERMUTES, _RESHAPES, _SHAPE_ONLY, _norm_dim
from ..errors import Unmappable
from .common import _expand_view, _shape_arg
from ..values import Replicated, LazySlice, View, _big, _carried, _dependent, _regroup
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
    view = imp._view(x, node)
    shape = _shape_arg(node, imp)
    if view.shape == shape:
        return view
    return _expand_view(view, shape)


@handles({"slice"})
def handle_slice(imp, node, name, x, dim=0, start=None, end=None, step=1):
    view = x if isinstance(x, View) else imp._view(x, node)
    rank = len(view.dims)
    dim = _norm_dim(dim, rank)
    size = view.shape[dim]
    start, stop, step = slice(start, end, step).indices(size)
    if step != 1:
        raise Unmappable("a strided slice")
    if start == 0 and stop == size:
        return view
    return LazySlice(view, dim, start, stop)


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
    out, start = [], 0
    for s in sizes:
        out.append(view if s == size else LazySlice(view, dim, start, start + s))
        start += s
    return out


@handles({"unbind"})
def handle_unbind(imp, node, name, x, dim=0):
    view = imp._view(x, node)
    dim = _norm_dim(dim, len(view.dims))
    return [handle_select(imp, node, "select", view, dim, i) for i in range(view.shape[dim])]
