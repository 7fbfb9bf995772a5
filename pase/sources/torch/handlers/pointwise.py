"""Handlers of point-wise operations, statistics, softmax and normalisations."""

from __future__ import annotations

import math
from dataclasses import replace

from ..aten import _BINARY, _DROPOUTS, _NORM_STATS, _POINTWISE, _STATS, _flat, _norm_dim, _op_name
from ..errors import Unmappable
from .common import _expand_view, _same_layout, _shape_arg, _softmax_view
from ..protos import ProtoElementwise, ProtoNorm
from ..values import SideOutput, Replicated, LazyComplex, LazyPairs, LazySlice, LazyStrided, LazyStatistic, View, _dependent, _freeze, _unify
from .registry import handles


def _with_op(value, op: str):
    if isinstance(value, View):
        return value.with_ops({op})
    if isinstance(value, LazySlice):
        return value.with_ops({op})
    if isinstance(value, LazyStatistic):
        return replace(value, ops=value.ops | {op})
    if isinstance(value, (LazyComplex, LazyStrided, LazyPairs)):
        return value.with_ops({op})
    raise AssertionError(value)


def _same_slice(a: LazySlice, b: LazySlice) -> bool:
    return (_same_layout(a.source, b.source) and (a.dim, a.start, a.stop, a.squeeze)
            == (b.dim, b.start, b.stop, b.squeeze))


@handles(_POINTWISE | _DROPOUTS | {"native_dropout"})
def handle_pointwise(imp, node, name, *args, **kwargs):
    if name in _DROPOUTS:
        x = args[0]
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        train = args[2] if len(args) > 2 else kwargs.get("train", True)
        if not train or not p:
            return x
        return _with_op(x, node.name)
    if name == "native_dropout":
        x = args[0]
        return [_with_op(x, node.name), SideOutput("dropout mask")]
    dependent = [v for v in _flat(list(args) + [kwargs]) if _dependent(v)]
    shape = _shape_arg(node, imp)
    if len(dependent) >= 2 and name in _BINARY:
        return _combine(imp, node, name, dependent)
    value = dependent[0]
    if isinstance(value, View) and value.base.norm_pattern and name in ("mul", "add") and not value.ops:
        # The learnt scale (and shift) of a hand-written norm is part of the norm's cost.
        other = next((v for v in args if isinstance(v, Replicated)), None)
        if other is not None and other.param and other.shape == (value.shape[-1],):
            imp._claim(value.base.proto, len(value.base.proto.claims), other)
            return value
    if tuple(value.shape) != shape and not isinstance(value, LazyComplex):
        value = _expand_view(imp._view(value, node), shape)
    return _with_op(value, node.name)


@handles({"view_as_complex"})
def handle_view_as_complex(imp, node, name, x):
    view = imp._view(x, node)
    if not view.shape or view.shape[-1] != 2:
        raise Unmappable("view_as_complex of a tensor whose last dimension is not 2")
    return LazyComplex(view)


@handles({"view_as_real"})
def handle_view_as_real(imp, node, name, z):
    if not isinstance(z, LazyComplex):
        raise Unmappable("view_as_real of a complex tensor the import did not follow")
    return z.view.with_ops(z.ops)


def _combine(imp, node, name, values):
    """A point-wise operation of two (or three) batch-dependent tensors."""
    if len(values) > 2:
        raise Unmappable("a point-wise operation of three batch-dependent tensors")
    a, b = values
    stats = [v for v in (a, b) if isinstance(v, LazyStatistic)]
    if len(stats) == 1 and any(isinstance(v, LazySlice) for v in (a, b)):
        # A norm of a slice (MLA's kv_a_layernorm of 512 of 576 channels): the slice as a view.
        a, b = (imp._view(v, node) if isinstance(v, LazySlice) else v for v in (a, b))
    views = [v for v in (a, b) if isinstance(v, View)]
    if len(stats) == 1 and len(views) == 1:
        norm = _norm_pattern(imp, node, name, views[0], stats[0])
        if norm is not None:
            return norm
    if isinstance(a, LazySlice) and isinstance(b, LazySlice) and _same_slice(a, b):
        return a.with_ops(b.ops | {node.name})
    a, b = imp._view(a, node), imp._view(b, node)
    if _same_layout(a, b):
        return View(a.base, a.dims, a.ops | b.ops | {node.name})
    shape = _shape_arg(node, imp)
    if a.shape != shape or b.shape != shape:
        if len(a.shape) == len(b.shape) == len(shape) and all(
                x == y or 1 in (x, y) for x, y in zip(a.shape, b.shape)):
            return _broadcast(imp, node, a, b)
        raise Unmappable(
            f"broadcasting between two batch-dependent tensors of shapes {list(a.shape)} and {list(b.shape)}")
    return _elementwise(imp, node, a, b)


#: The aten operations whose backward reads neither operand (the gradient passes through).
_SUMS = ("add", "sub", "rsub")


def _combination(imp, node, a: View, b: View) -> ProtoElementwise:
    """The layer of ``a op b``, declaring a sum (a residual connection) as one."""
    name = _op_name(node.target).rstrip("_")
    return ProtoElementwise(imp._name(node, name), a.base, b.base,
                            combine="add" if name in _SUMS else "multiply")


def _broadcast(imp, node, a: View, b: View) -> View:
    """Two batch-dependent tensors that broadcast (a gate ``(b, c, 1, 1)`` times ``(b, c, h, w)``):
    an Elementwise whose operands are their layer outputs, size-1 dimensions included."""
    views = []
    for v in (a, b):
        imp._charge(v)
        v = imp._exact(v, node)
        if v.base.shape() != v.shape:
            v = imp._reshape(v, node, v.shape)
        _freeze(v.base.atoms)
        views.append(v)
    a, b = views
    atoms = [x if x.size >= y.size else y for x, y in zip(a.base.leaves(), b.base.leaves())]
    proto = imp._record(_combination(imp, node, a, b))
    base = proto.output(atoms)
    return View(base, tuple((x,) if x.size > 1 else () for x in atoms))


def _elementwise(imp, node, a: View, b: View) -> View:
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
    proto = imp._record(_combination(imp, node, a, b))
    base = proto.output(a.base.atoms)
    return View(base, a.dims)


def _norm_pattern(imp, node, name, view: View, stat: LazyStatistic):
    """``x * rsqrt(mean(x^2) + eps)`` (RMSNorm), ``x - mean(x)`` (LayerNorm), ``x / norm(x)``
    (``F.normalize``, an RMSNorm up to the constant sqrt of the width): one norm layer."""
    if stat.kind not in _NORM_STATS or not stat.keepdim or name not in ("mul", "div", "sub"):
        return None
    if stat.kind == "norm" and name != "div":
        return None
    rank = len(stat.source.dims)
    if stat.axes != (rank - 1,) or not _same_layout(stat.source, view):
        return None
    if view.base.norm_pattern:  # the second half of a hand-written norm: already counted
        return view
    imp._charge(view)
    view, axis = imp._axis_leaf(view, rank - 1, node)
    axis.frozen = True
    proto = imp._record(ProtoNorm(imp._name(node, "norm", leaf=True), "Norm" if name == "sub" else "RMSNorm", view.base, axis))
    base = proto.output(view.base.atoms)
    base.norm_pattern = True
    return View(base, view.dims)


@handles(set(_STATS))
def handle_stat(imp, node, name, x, dim=None, *args, **kwargs):
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
    return LazyStatistic(view, axes, bool(keepdim), _STATS[name])


@handles({"linalg_vector_norm", "norm"})
def handle_vector_norm(imp, node, name, x, ord=2, dim=None, keepdim=False, *rest, **kwargs):
    """The p-norm over ``dim`` (``torch.linalg.vector_norm``, ``Tensor.norm``): a statistic like
    the mean of the p-th powers, its root a point-wise op."""
    view = imp._view(x, node)
    rank = len(view.dims)
    keepdim = kwargs.get("keepdim", keepdim)
    dim = kwargs.get("dim", dim)
    if dim is None or dim == []:
        axes = tuple(range(rank))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        axes = tuple(sorted({_norm_dim(d, rank) for d in dims}))
    return LazyStatistic(view, axes, bool(keepdim), "norm")


@handles({"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"})
def handle_softmax(imp, node, name, x, dim, *rest, **kwargs):
    view = imp._view(x, node)
    return _softmax_view(imp, node, view, _norm_dim(dim, len(view.dims)))


def _claim_all(imp, proto, values) -> None:
    """The learnt vectors of a norm (scale, bias; either may be absent), in order."""
    for value in values:
        imp._claim(proto, len(proto.claims), value)


def _norm_layer(imp, node, kind, x, dim):
    view = imp._view(x, node)
    imp._charge(view)
    view, axis = imp._axis_leaf(view, dim, node)
    axis.frozen = True
    proto = imp._record(ProtoNorm(imp._name(node, "norm", leaf=True), kind, view.base, axis))
    return View(proto.output(view.base.atoms), view.dims)


@handles({"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"})
def handle_layer_norm(imp, node, name, x, normalized_shape, *rest, **kwargs):
    if len(normalized_shape) != 1:
        raise Unmappable(f"a norm over {len(normalized_shape)} dimensions")
    kind = "RMSNorm" if "rms" in name else "Norm"
    out = _norm_layer(imp, node, kind, x, len(x.shape) - 1)
    _claim_all(imp, out.base.proto, rest[:1] if kind == "RMSNorm" else rest[:2])
    if name in ("native_layer_norm",):
        return [out, SideOutput("norm statistics"), SideOutput("norm statistics")]
    if name == "_fused_rms_norm":
        return [out, SideOutput("norm statistics")]
    return out


@handles({"group_norm"})
def handle_group_norm(imp, node, name, x, groups, weight=None, bias=None, *rest, **kwargs):
    """``F.group_norm`` of ``(b, c, ...)``: statistics over each group of ``c / groups`` channels
    and every position. One group per channel of a sequence (Wav2Vec2's first convolution) is a
    Norm over the length; otherwise a Reshape to ``(b, groups, c / groups * positions)``, a
    Norm over the last axis, and a Reshape back. The per-channel scale and shift are not the
    Norm's (its learnt vectors run along its axis): they are held like a layer scale, by the
    layer whose output they first meet."""
    view = imp._view(x, node)
    shape = tuple(view.shape)
    if len(shape) < 3:
        raise Unmappable("a group norm of a tensor without positions")
    b, c = shape[:2]
    groups = int(groups)
    if groups == c and len(shape) == 3:
        return _norm_layer(imp, node, "Norm", view, 2)
    grouped = imp._reshape(view, node, (b, groups, c // groups * math.prod(shape[2:])))
    out = _norm_layer(imp, node, "Norm", grouped, 2)
    return imp._reshape(out, node, shape)


@handles({"batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
      "_native_batch_norm_legit_functional", "native_batch_norm", "cudnn_batch_norm", "_batch_norm_with_update",
      "_batch_norm_with_update_functional", "_batch_norm_no_update", "miopen_batch_norm"})
def handle_batch_norm(imp, node, name, x, *rest, **kwargs):
    view = imp._view(x, node)
    if len(view.shape) < 2:
        raise Unmappable("a batch norm of a tensor without a channel dimension")
    imp._charge(view)
    view = imp._exact(view, node)
    _freeze(view.base.atoms)
    proto = imp._record(ProtoNorm(imp._name(node, "norm", leaf=True), "BatchNorm", view.base))
    _claim_all(imp, proto, rest[:2])
    out = View(proto.output(view.base.atoms), view.dims)
    count = {"batch_norm": 1, "_native_batch_norm_legit_no_training": 3, "_native_batch_norm_legit": 3,
             "_native_batch_norm_legit_functional": 5, "native_batch_norm": 3, "cudnn_batch_norm": 4,
             "_batch_norm_with_update": 4, "_batch_norm_with_update_functional": 6,
             "_batch_norm_no_update": 4, "miopen_batch_norm": 3}.get(name, 1)
    return out if count == 1 else [out] + [SideOutput("batch-norm statistics")] * (count - 1)
