"""The recurrent layer: a stacked LSTM."""

from __future__ import annotations

from pase.model.tensor import Tensor
from .base import Layer, as_float, check_positive, check_tensor, gemm_work, redistribution_volume
from .work import Exchange, LayerWork

__all__ = ["LSTM"]


class LSTM(Layer):
    """A stack of ``L`` LSTM layers over a whole sequence, as one vertex (paper IV-A).

    Input ``(b, s, k)``, ``n = k`` units. Iteration space ``(L, s, b, n, k)``; ``s`` is
    never split. Cost: a batched GEMM (batch ``L``, ``M = s b``, ``N = 4n``, ``K = 2k``,
    ``pw = 3``) plus, at every step of every layer, the hand-over of the cell output
    ``(b, n)`` split ``(c_b, c_n)`` to the next cell input ``(b, k)`` split ``(c_b, c_k)``.
    """

    op = "LSTM"

    def __init__(self, x: Tensor, layers: int):
        x = check_tensor(x, "LSTM input")
        if x.rank != 3:
            raise ValueError(f"LSTM needs a (b, s, k) input, got shape {list(x.shape)}")
        L = check_positive(layers, "LSTM layer count")
        b, s, k = x.shape
        super().__init__(
            (x,), (L, s, b, k, k), "lsbnk", ((b, s, k),), ("bsn",), batch_dim=2,
            unsplit=(False, True, False, False, False), args={"layers": L},
        )

    def input_configs(self, C):
        return [C[:, [2, 1, 4]]]

    def output_configs(self, C):
        return [C[:, [2, 1, 3]]]

    def work(self, C):
        L, s, b, n, k = self.domain
        Cf = as_float(C)
        gemm = gemm_work(
            (L / Cf[:, 0], s * b / (Cf[:, 1] * Cf[:, 2]), 4 * n / Cf[:, 3], 2 * k / Cf[:, 4]),
            self._groups(C, (1, 2), (3,), (4,)),
            3,
        )
        handover = redistribution_volume((b, n), C[:, [2, 3]], C[:, [2, 4]])
        (model,) = self._groups(C, (3, 4))
        return LayerWork(gemm.compute, gemm.communication + L * s * Exchange(handover, model))

    def parameters(self):
        L, s, b, n, k = self.domain
        return [((L, 4 * n, 2 * k), (0, 3, 4))]
