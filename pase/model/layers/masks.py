"""Sliding-window (banded causal) attention: the share of the query x key pairs a fused kernel
visits, and the keys a device of a sequence split needs from its neighbours (the halo).

Query ``i`` of a window ``w`` sees the keys ``i - w + 1 .. i`` (transformers' sliding mask:
``key > query - w``); the first ``w - 1`` queries see fewer. ``docs/models.md`` works the
numbers at ``s = 8192, w = 128``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["band_pairs", "band_density", "halo_rows"]


def band_pairs(s: int, w: int) -> int:
    """Query x key pairs of a causal window ``w`` over ``s`` tokens: ``sum_i min(i + 1, w)``,
    ``w s - w (w - 1) / 2`` for ``w < s``; ``s (s + 1) / 2`` (plain causal) for ``w >= s``.

    >>> band_pairs(8192, 128), band_pairs(4, 2), band_pairs(4, 4)
    (1040448, 7, 10)
    """
    w = min(w, s)
    return w * s - w * (w - 1) // 2


def band_density(s: int, w: int) -> float:
    """Share of the ``s x s`` scores inside the window: ``band_pairs(s, w) / s^2`` for ``w < s``;
    1 for ``w >= s`` (no band: a full causal layer keeps the convention of its plain pricing).

    >>> round(band_density(8192, 128), 6), band_density(8, 8)
    (0.015504, 1.0)
    """
    if w <= 0 or w >= s:
        return 1.0
    return band_pairs(s, w) / float(s * s)


def halo_rows(s: int, splits, w: int) -> np.ndarray:
    """Key rows the busiest device of a ``splits``-way sequence split lacks: the ``w - 1``
    keys before its first query, at most the ``s - s / c`` it does not hold; 0 unsplit.

    >>> halo_rows(8192, np.array([1, 2, 128]), 128).tolist()
    [0.0, 127.0, 127.0]
    """
    c = np.asarray(splits, dtype=np.float64)
    return np.where(c > 1, np.minimum(float(w - 1), s - s / c), 0.0)
