"""The machine of the cost model: peak FLOPS and bandwidth per device.

Everything is measured in FLOP-equivalents; communication volumes in 8-byte words are
converted with the FLOP-per-word ratio ``rho`` (paper Eq. 1, ``cost-model.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Machine", "WORD_BYTES"]

#: Bytes per word of communication in the reference cost model.
WORD_BYTES = 8


@dataclass(frozen=True)
class Machine:
    """Peak compute and interconnect bandwidth of one device.

    Parameters
    ----------
    flops : float
        Peak compute per device in TFLOPS (CLI ``--flops``).
    bw : float
        Peak interconnect bandwidth per device in GB/s (CLI ``--bw``).

    Examples
    --------
    >>> Machine(10.0, 16.0).rho
    5000.0
    >>> float(Machine(10.0, 16.0).all_reduce(8.0, 4))
    60000.0
    """

    flops: float = 10.0
    bw: float = 16.0

    def __post_init__(self):
        for field, value in (("flops", self.flops), ("bw", self.bw)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"machine {field} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"machine {field} must be positive and finite, got {value!r}")

    @property
    def rho(self) -> float:
        """FLOP per word: GFLOP/s divided by Gword/s."""
        return (self.flops * 1000.0) / (self.bw / WORD_BYTES)

    def comm(self, words):
        """Cost in FLOP-equivalents of moving ``words`` words (scalar or array)."""
        return self.rho * words

    def all_reduce(self, words, devices):
        """Ring all-reduce of ``words`` words per device among ``devices`` devices.

        ``rho * (w / q) * 2 * (q - 1)``, which is zero when ``q == 1``. Both arguments
        may be arrays; they broadcast.
        """
        q = np.asarray(devices, dtype=np.float64)
        return self.rho * (np.asarray(words, dtype=np.float64) / q) * 2.0 * (q - 1.0)

    def describe(self) -> str:
        return f"{self.flops:g} TFLOPS, {self.bw:g} GB/s (rho = {self.rho:g} FLOP/word)"
