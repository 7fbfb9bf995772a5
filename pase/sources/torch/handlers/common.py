"""Helpers the op handlers share: shapes, dimensions and arguments of a traced node."""

from __future__ import annotations

import math

from ..errors import _Unmappable
from ..protos import _Softmax
from ..values import _Atom, _View, _leaves


def _shape_arg(node, imp) -> tuple:
    shape = imp._meta_shape(node)
    if shape is None:
        raise _Unmappable("its output shape is unknown")
    return shape


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


def _same_layout(a: _View, b: _View) -> bool:
    if a.base is not b.base or len(a.dims) != len(b.dims):
        return False
    for da, db in zip(a.dims, b.dims):
        la, lb = _leaves(da), _leaves(db)
        if len(la) != len(lb) or any(x is not y for x, y in zip(la, lb)):
            return False
    return True


def _softmax_view(imp, node, value, dim):
    view = imp._view(value, node)
    imp._charge(view)
    view, axis = imp._axis_leaf(view, dim, node)
    axis.frozen = True
    proto = imp._record(_Softmax(imp._name(node, "softmax", leaf=True), view.base, axis))
    return _View(proto.output(view.base.atoms), view.dims)
