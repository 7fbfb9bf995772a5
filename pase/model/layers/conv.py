"""Convolution and pooling: layers over a spatial (height x width) window."""

from __future__ import annotations

import math

import numpy as np

from pase.model.tensor import Tensor
from .base import Layer, as_float, check_count, check_flag, check_positive, check_padding, check_pair, check_tensor, GemmShaped

from .work import Exchange, LayerWork, Pass

__all__ = ["Conv", "Pooling"]



class Conv(GemmShaped, Layer):
    """2-D convolution: image ``(b, c, h, w)``, ``n`` filters of ``r x s``.

    Iteration space ``(b, c, ho, wo, r, s, n)``; ``ho`` and ``wo`` are never split.
    Costed as a GEMM with ``M = b ho wo``, ``N = n``, ``K = c r s``. ``bias``: a learnt
    vector of ``n`` (a parameter split like ``n``; its add is not priced).

    ``groups`` > 1 (grouped and depthwise convolutions): ``c`` and ``n`` fall into ``g``
    groups, each convolving its ``c / g`` channels into ``n / g`` filters. The iteration
    space is ``(b, g, c/g, ho, wo, r, s, n/g)``: ``g`` splits like a batch (a batched GEMM
    of ``g`` products, no collective of its own). A 1-D input ``(b, c, w)`` (``conv1d``) is a
    convolution of height 1: ``h = r = 1``, the output ``(b, n, wo)``.
    """

    op = "Conv"

    def forward_flops(self) -> float:
        """``2 x`` the iteration space (an implicit GEMM; a grouped one's groups included)."""
        return 2.0 * math.prod(self.domain)

    def __init__(self, x: Tensor, filters: int, kernel, stride=1, pad=0, pw: int = 0, bias: bool = False,
                 groups: int = 1):
        x = check_tensor(x, "Conv input")
        if x.rank not in (3, 4):
            raise ValueError(f"Conv needs a (b, c, h, w) image or a (b, c, w) sequence, got shape {list(x.shape)}")
        self.flat = x.rank == 3
        b, c, h, w = (x.shape[0], x.shape[1], 1, x.shape[2]) if self.flat else x.shape
        n = check_positive(filters, "Conv filter count")
        g = check_positive(groups, "Conv groups")
        if c % g or n % g:
            raise ValueError(f"Conv groups {g} must divide the {c} channels and the {n} filters")
        r, s = check_pair(kernel, "Conv kernel")
        stride_h, stride_w = check_pair(stride, "Conv stride")
        pad_h, pad_w = check_padding(pad, "Conv pad")
        if self.flat and (r, stride_h, pad_h) != (1, 1, 0):
            raise ValueError("a Conv of a (b, c, w) sequence has height 1: kernel, stride and pad (1, .), (1, .), (0, .)")
        if h - r + 2 * pad_h < 0 or w - s + 2 * pad_w < 0:
            raise ValueError(f"Conv kernel {r}x{s} does not fit the padded {h}x{w} image")
        ho = (h - r + 2 * pad_h) // stride_h + 1
        wo = (w - s + 2 * pad_w) // stride_w + 1
        self.pw = check_count(pw, "Conv pw")
        self.bias = check_flag(bias, "Conv bias")
        self.groups = g
        args = {"filters": n, "kernel": [r, s], "stride": [stride_h, stride_w], "pad": [pad_h, pad_w],
                "pw": self.pw, **({"bias": True} if self.bias else {}), **({"groups": g} if g > 1 else {})}
        out = (b, n, wo) if self.flat else (b, n, ho, wo)
        letters = "bcw" if self.flat else "bchw"
        if g == 1:
            super().__init__((x,), (b, c, ho, wo, r, s, n), "bchwrsn", (out,), (letters,), batch_dim=0,
                             unsplit=(False, False, True, True, False, False, False), args=args)
        else:
            super().__init__((x,), (b, g, c // g, ho, wo, r, s, n // g), "bgchwrsn", (out,), (letters,),
                             batch_dim=0, unsplit=(False, False, False, True, True, False, False, False), args=args)

    def _columns(self, C):
        """``(b, c, h, w, r, s, n)`` split factors, the group split folded into ``c`` and ``n``."""
        C = np.asarray(C)
        if self.groups == 1:
            return C
        return np.stack([C[:, 0], C[:, 1] * C[:, 2], C[:, 3], C[:, 4], C[:, 5], C[:, 6], C[:, 1] * C[:, 7]], axis=1)

    def input_configs(self, C):
        cols = self._columns(C)
        return [cols[:, [0, 1, 3]] if self.flat else cols[:, [0, 1, 2, 3]]]

    def output_configs(self, C):
        cols = self._columns(C)
        return [cols[:, [0, 6, 3]] if self.flat else cols[:, [0, 6, 2, 3]]]

    def gemm_dims(self) -> tuple:
        if self.groups == 1:  # (b, c, ho, wo, r, s, n)
            return (), (0, 2, 3), (6,), (1, 4, 5)
        return (1,), (0, 3, 4), (7,), (2, 5, 6)  # (b, g, c/g, ho, wo, r, s, n/g)

    def reduction_signature(self, i: int) -> tuple:
        """Convolutions only compare with convolutions of the same shape but the filter count:
        their operand A is the unfolded image, whose size depends on the kernel, stride and
        padding (the output size) and the grouping."""
        return ("Conv", self.groups) + tuple(self.domain[:-1])

    def parameters(self):
        if self.groups == 1:
            b, c, ho, wo, r, s, n = self.domain
            weight = [((n, c, r, s), (6, 1, 4, 5)), ((n,), (6,))]
        else:  # the filter (n, c/g, r, s) seen as (g, n/g, c/g, r, s)
            b, g, c, ho, wo, r, s, n = self.domain
            weight = [((g, n, c, r, s), (1, 7, 2, 5, 6)), ((g, n), (1, 7))]
        return weight if self.bias else weight[:1]


class Pooling(Layer):
    """Max/average pooling: image ``(b, c, h, w)``, window ``r x s``.

    Iteration space ``(b, c, ho, wo)``, all splittable. Cost: one operation per output
    element plus the halo exchange when the height or width is split.
    """

    op = "Pooling"

    def __init__(self, x: Tensor, window, stride=1, pad=0):
        x = check_tensor(x, "Pooling input")
        if x.rank != 4:
            raise ValueError(f"Pooling needs a (b, c, h, w) image, got shape {list(x.shape)}")
        b, c, h, w = x.shape
        r, s = check_pair(window, "Pooling window")
        stride_h, stride_w = check_pair(stride, "Pooling stride")
        pad_h, pad_w = check_padding(pad, "Pooling pad")
        if h - r + 2 * pad_h < 0 or w - s + 2 * pad_w < 0:
            raise ValueError(f"Pooling window {r}x{s} does not fit the padded {h}x{w} image")
        ho = (h - r + 2 * pad_h) // stride_h + 1
        wo = (w - s + 2 * pad_w) // stride_w + 1
        self.window = (r, s)
        self.image = (h, w)
        super().__init__(
            (x,), (b, c, ho, wo), "bchw", ((b, c, ho, wo),), ("bchw",), batch_dim=0,
            args={"window": [r, s], "stride": [stride_h, stride_w], "pad": [pad_h, pad_w]},
        )

    def input_configs(self, C):
        return [C]

    def output_configs(self, C):
        return [C]

    def work(self, C):
        b, c = self.domain[:2]
        h, w = self.image
        r, s = self.window
        Cf = as_float(C)
        # Halo of the unpadded input image divided by the output's height/width splits.
        hi = h / Cf[:, 2]
        wi = w / Cf[:, 3]
        hg = np.where(Cf[:, 2] > 1, hi + r, hi)
        wg = np.where(Cf[:, 3] > 1, wi + s, wi)
        halo = (hg * wg - hi * wi) * (b / Cf[:, 0]) * (c / Cf[:, 1])
        E = self._E(C)
        (hw,) = self._groups(C, (2, 3))
        return LayerWork(Pass("pool", E, E), Exchange(halo, hw))
