"""Helpers the op handlers share: shapes, dimensions and arguments of a traced node."""

from __future__ import annotations

import math

from ..errors import Unmappable
from ..protos import ProtoSoftmax
from ..values import Atom, View, _big, _leaves


def _shape_arg(node, imp) -> tuple:
    shape = imp._meta_shape(node)
    if shape is None:
        raise Unmappable("its output shape is unknown")
    return shape


def _expand_view(view: View, shape) -> View:
    old = list(view.dims)
    lead = len(shape) - len(old)
    if lead < 0:
        raise Unmappable(f"an expand to fewer dimensions {list(shape)}")
    dims = [(Atom(s, broadcast=True),) if s > 1 else () for s in shape[:lead]]
    for dim, size in zip(old, shape[lead:]):
        have = math.prod(a.size for a in dim)
        if have == size:
            dims.append(dim)
        elif have == 1:
            dims.append((Atom(size, broadcast=True),) if size > 1 else ())
        else:
            raise Unmappable(f"an expand of a dimension of {have} to {size}")
    return View(view.base, tuple(dims), view.ops)


def _same_layout(a: View, b: View) -> bool:
    if a.base is not b.base or len(a.dims) != len(b.dims):
        return False
    for da, db in zip(a.dims, b.dims):
        la, lb = _leaves(da), _leaves(db)
        if len(la) != len(lb) or any(x is not y for x, y in zip(la, lb)):
            return False
    return True


def _softmax_view(imp, node, value, dim, causal: bool = False):
    """The softmax of ``value`` over ``dim`` (``causal``: an attention softmax whose scores are
    masked to the keys at or before each query)."""
    view = imp._view(value, node)
    imp._charge(view)
    if not imp._natural(view):
        imp._reorder(view)
    merged = _big(view.dims[dim]) if imp._natural(view) else []
    if len(merged) > 1:
        # A dimension made of several of the layer output's (Swin's 7 x 7 window tokens):
        # one Softmax over them together, rather than a Reshape to merge them.
        axes = merged
    else:
        view, axis = imp._axis_leaf(view, dim, node)
        axes = [axis]
    for axis in axes:
        axis.frozen = True
    proto = imp._record(ProtoSoftmax(imp._name(node, "softmax", leaf=True), view.base, axes, causal))
    return View(proto.output(view.base.atoms), view.dims)
