"""Convolution and pooling: layers over a spatial (height x width) window."""

from __future__ import annotations

import numpy as np

from pase.model.tensor import Tensor
from .base import Layer, LayerCost, as_float, check_count, check_flag, check_positive, check_padding, check_pair, check_tensor, gemm_cost

__all__ = ["Conv", "Pooling"]



class Conv(Layer):
    """2-D convolution: image ``(b, c, h, w)``, ``n`` filters of ``r x s``.

    Iteration space ``(b, c, ho, wo, r, s, n)``; ``ho`` and ``wo`` are never split.
    Costed as a GEMM with ``M = b ho wo``, ``N = n``, ``K = c r s``. ``bias``: a learnt
    vector of ``n`` (a parameter split like ``n``; its add is not priced).
    """

    op = "Conv"

    def __init__(self, x: Tensor, filters: int, kernel, stride=1, pad=0, pw: int = 0, bias: bool = False):
        x = check_tensor(x, "Conv input")
        if x.rank != 4:
            raise ValueError(f"Conv needs a (b, c, h, w) image, got shape {list(x.shape)}")
        b, c, h, w = x.shape
        n = check_positive(filters, "Conv filter count")
        r, s = check_pair(kernel, "Conv kernel")
        stride_h, stride_w = check_pair(stride, "Conv stride")
        pad_h, pad_w = check_padding(pad, "Conv pad")
        if h - r + 2 * pad_h < 0 or w - s + 2 * pad_w < 0:
            raise ValueError(f"Conv kernel {r}x{s} does not fit the padded {h}x{w} image")
        ho = (h - r + 2 * pad_h) // stride_h + 1
        wo = (w - s + 2 * pad_w) // stride_w + 1
        self.pw = check_count(pw, "Conv pw")
        self.bias = check_flag(bias, "Conv bias")
        super().__init__(
            (x,), (b, c, ho, wo, r, s, n), "bchwrsn", ((b, n, ho, wo),), ("bchw",), batch_dim=0,
            unsplit=(False, False, True, True, False, False, False),
            args={"filters": n, "kernel": [r, s], "stride": [stride_h, stride_w], "pad": [pad_h, pad_w],
                  "pw": self.pw, **({"bias": True} if self.bias else {})},
        )

    def input_configs(self, C):
        return [C[:, [0, 1, 2, 3]]]

    def output_configs(self, C):
        return [C[:, [0, 6, 2, 3]]]

    def costs(self, C, machine):
        b, c, ho, wo, r, s, n = self.domain
        Cf = as_float(C)
        return gemm_cost(
            machine,
            (1.0, b * ho * wo / (Cf[:, 0] * Cf[:, 2] * Cf[:, 3]), n / Cf[:, 6], c * r * s / (Cf[:, 1] * Cf[:, 4] * Cf[:, 5])),
            self._groups(C, (0, 2, 3), (6,), (1, 4, 5)),
            self.pw,
        )

    def parameters(self):
        b, c, ho, wo, r, s, n = self.domain
        return [((n, c, r, s), (6, 1, 4, 5))] + ([((n,), (6,))] if self.bias else [])


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

    def costs(self, C, machine):
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
        return LayerCost(machine.memory_bound("pool", E, E), machine.exchange(halo, hw))
