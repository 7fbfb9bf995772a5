"""Handlers of convolution and pooling."""

from __future__ import annotations

from ..aten import _ints
from ..errors import Unmappable
from .common import _shape_arg
from ..protos import ProtoConv, ProtoPooling
from ..values import Atom, SideOutput, LazyStatistic, Replicated, View, _dependent, _freeze
from .registry import handles


def _claim_derived(imp, proto, weight) -> bool:
    """A filter computed from parameters (weight normalisation: ``g * v / ||v||``): the Conv
    holds the one of the filter's shape (``v``) as its filter; the others (``g``) stay
    parameters it reads, held once each."""
    if not isinstance(weight, Replicated) or weight.shape is None:
        return False
    same = [name for name in sorted(weight.params) if imp.parameters.get(name) == tuple(weight.shape)]
    if len(same) != 1:
        return False
    proto.claims.append((0, same[0]))
    return True


@handles({"conv2d", "conv1d", "convolution", "_convolution"})
def handle_conv(imp, node, name, x, weight, bias=None, stride=1, padding=0, dilation=1, *rest):
    """A 2-D convolution, grouped (depthwise) or not; a 1-D one is a Conv of height 1."""
    if name in ("convolution", "_convolution"):
        transposed, _, groups = rest[:3] if len(rest) >= 3 else (False, None, 1)
        if transposed:
            raise Unmappable("a transposed convolution")
    else:
        groups = rest[0] if rest else 1
    if _dependent(weight) or _dependent(bias):
        raise Unmappable("a convolution whose filter depends on the batch")
    flat = len(x.shape) == 3
    if len(x.shape) not in (3, 4) or weight.shape is None or len(weight.shape) != len(x.shape):
        raise Unmappable("a convolution that is neither 1-D nor 2-D")
    spatial = 1 if flat else 2
    n, c_group = weight.shape[:2]
    r, s = (1, weight.shape[2]) if flat else weight.shape[2:]
    dil = _ints(dilation, spatial, "dilation")
    spread = [d * (k - 1) for d, k in zip(dil, (s,) if flat else (r, s))]  # what the kernel spans, less 1
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same" and not any(e % 2 for e in spread):
            padding = [e // 2 for e in spread]
        else:
            raise Unmappable(f"padding={padding!r} with an even kernel")
    stride, pad = _ints(stride, spatial, "stride"), _ints(padding, spatial, "padding")
    if flat:
        stride, pad, dil = (1,) + stride, (0,) + pad, (1,) + dil
    if any(d != 1 for d in dil):
        # A dilated kernel reads r x s inputs spread over d (r - 1) + 1: the products of the
        # undilated kernel, whose output has the same shape with (d - 1)(r - 1) / 2 less padding
        # each side (the Conv never splits the image, so it has no halo to price differently).
        extra = [(d - 1) * (k - 1) for d, k in zip(dil, (r, s))]
        if any(e % 2 for e in extra) or any(p < e // 2 for p, e in zip(pad, extra)):
            raise Unmappable("a dilated convolution padded by less than half the spread of its kernel")
        pad = tuple(p - e // 2 for p, e in zip(pad, extra))
    view = imp._view(x, node)
    imp._charge(view)
    view = imp._exact(view, node)
    b, c = view.shape[:2]
    h, w = (1, view.shape[2]) if flat else view.shape[2:]
    if c_group * groups != c:
        raise Unmappable(f"a convolution of {c} channels with filters of {c_group} in {groups} groups")
    ho, wo = (h - r + 2 * pad[0]) // stride[0] + 1, (w - s + 2 * pad[1]) // stride[1] + 1
    want = (b, n, wo) if flat else (b, n, ho, wo)
    if want != _shape_arg(node, imp):
        raise Unmappable("a convolution whose output shape the layer does not reproduce")
    _freeze(view.base.atoms)
    imp.has_conv = True
    proto = imp._record(ProtoConv(imp._name(node, "conv", leaf=True), view.base, n, (r, s), stride, pad, groups))
    if (imp._claim(proto, 0, weight) or _claim_derived(imp, proto, weight)) and bias is not None:
        proto.bias = imp._claim(proto, 1, bias)
    batch = view.base.leaves()[0]
    atoms = [batch, Atom(n, "c", frozen=True)] + ([] if flat else [Atom(ho, "h", frozen=True)]) + [
        Atom(wo, "w", frozen=True)]
    return View(proto.output(atoms), tuple((a,) if a.size > 1 else () for a in atoms))


def _pool(imp, node, x, window, stride, pad, suffix="pool"):
    view = imp._view(x, node)
    if len(view.shape) != 4:
        raise Unmappable("pooling that is not 2-D")
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
        raise Unmappable("pooling whose output shape the layer does not reproduce")
    _freeze(view.base.atoms)
    proto = imp._record(ProtoPooling(imp._name(node, suffix, leaf=True), view.base, window, stride, pad))
    leaves = view.base.leaves()
    atoms = [leaves[0], leaves[1], Atom(ho, "h", frozen=True), Atom(wo, "w", frozen=True)]
    return View(proto.output(atoms), tuple((a,) if a.size > 1 else () for a in atoms))


@handles({"max_pool2d", "max_pool2d_with_indices"})
def handle_max_pool(imp, node, name, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    window = _ints(kernel_size, 2, "kernel_size")
    stride = _ints(stride, 2, "stride") if stride not in ((), [], None) else window
    if any(d != 1 for d in _ints(dilation, 2, "dilation")):
        raise Unmappable("a dilated pooling window")
    out = _pool(imp, node, x, window, stride, _ints(padding, 2, "padding"))
    return [out, SideOutput("pooling indices")] if name.endswith("with_indices") else out


@handles({"avg_pool2d"})
def handle_avg_pool(imp, node, name, x, kernel_size, stride=(), padding=0, *rest):
    window = _ints(kernel_size, 2, "kernel_size")
    stride = _ints(stride, 2, "stride") if stride not in ((), [], None) else window
    return _pool(imp, node, x, window, stride, _ints(padding, 2, "padding"))


@handles({"adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d"})
def handle_adaptive_pool(imp, node, name, x, output_size):
    view = imp._view(x, node)
    if len(view.shape) != 4:
        raise Unmappable("adaptive pooling that is not 2-D")
    h, w = view.shape[2:]
    oh, ow = _ints(output_size, 2, "output_size")
    oh, ow = oh or h, ow or w
    with_indices = name.startswith("adaptive_max")
    if (oh, ow) == (h, w):
        out = view
    elif (oh, ow) == (1, 1) and not with_indices:
        # The global average of the built-in CNNs: a ReduceMean over height and width.
        out = imp._reduce(LazyStatistic(imp._exact(view, node), (2, 3), True, "mean"), node, leaf=True)
    elif h % oh == 0 and w % ow == 0:
        window = (h // oh, w // ow)
        out = _pool(imp, node, view, window, window, (0, 0))
    else:
        raise Unmappable(f"adaptive pooling from {h}x{w} to {oh}x{ow} (not a whole window)")
    return [out, SideOutput("pooling indices")] if with_indices else out


@handles({"adaptive_avg_pool1d"})
def handle_adaptive_pool1d(imp, node, name, x, output_size):
    """A 1-D adaptive average to one position (Hugging Face Swin's pooler over its tokens):
    a ReduceMean over the last dimension, as the 2-D global average is."""
    view = imp._view(x, node)
    (size,) = _ints(output_size, 1, "output_size")
    length = view.shape[-1]
    if size in (0, length):
        return view
    if size != 1:
        raise Unmappable(f"1-D adaptive pooling from {length} to {size} (only to one position)")
    return imp._reduce(LazyStatistic(view, (len(view.shape) - 1,), True, "mean"), node, leaf=True)
