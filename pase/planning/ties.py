"""Which plan of those that tie is the plan: a configuration whose step band overlaps the
fastest's by more than half is a tie, and of the ties the fastest that fits at its memory band wins.

The bands are the engine profile's (``band_of``: the spread of published over modelled figures,
docs/calibration.md). Without an engine or a memory cap there are no ties: the fastest wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

__all__ = ["Bands", "Choice", "band_overlap", "choose_plan"]


def band_overlap(a, b) -> float:
    """Overlap of two ``[low, high]`` bands as a share of the narrower one (0 to 1).

    >>> band_overlap((1.0, 3.0), (2.0, 6.0))
    0.5
    """
    width = min(a[1] - a[0], b[1] - b[0])
    if width <= 0:
        return 0.0
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0])) / width


@dataclass(frozen=True)
class Bands:
    """An engine's ``(low, high)`` multipliers of a modelled step and of a modelled peak."""

    step: tuple
    memory: tuple

    @classmethod
    def of(cls, engine) -> "Bands | None":
        """The bands of an engine profile (``None`` without one)."""
        if engine is None:
            return None
        from pase.planning.engine import band_of

        return cls(band_of(engine, "step"), band_of(engine, "memory"))

    def step_band(self, step: float) -> tuple:
        return step * self.step[0], step * self.step[1]

    def ties(self, a: float, b: float) -> bool:
        """Whether steps ``a`` and ``b`` tie: their bands overlap by more than half the narrower."""
        return band_overlap(self.step_band(a), self.step_band(b)) > 0.5

    def tie_limit(self, step: float) -> float:
        """The longest step that can tie with ``step``: bands ``[t lo, t hi]`` and ``[u lo, u hi]``
        (``t <= u``) overlap by ``t hi - u lo``, more than half of ``t (hi - lo)`` while ``u < t
        (hi + lo) / (2 lo)``.

        >>> Bands((0.8, 1.2), (0.9, 1.1)).tie_limit(10.0)
        12.5
        """
        low, high = self.step
        return step * (high + low) / (2 * low)

    def fits_at_band(self, peak: float, cap: float) -> bool:
        """Whether the memory band's high end of a plan needing ``peak`` fits ``cap``."""
        return peak * self.memory[1] <= cap


class Choice(NamedTuple):
    """The plan chosen (an entry ``(step, peak, payload)``), the fastest fitting entry, and
    which rule chose it: ``fastest``, ``fits-band`` (the fastest tie that fits at its memory band)
    or ``headroom`` (no tie fits at its band: the one needing least memory)."""

    entry: tuple
    fastest: tuple
    rule: str


def choose_plan(entries: Sequence[tuple], bands: Bands | None, cap: float | None) -> Choice | None:
    """The plan among fitting ``entries`` ``(step, peak, payload)`` in search order: the fastest
    when it fits at its memory band (or there are no bands or no cap); else, of the entries that
    tie with the fastest (:meth:`Bands.ties`), the fastest that fits at its memory band; where none
    does, the one needing least memory. Equal keys keep the first in search order; ``None``
    without entries.

    >>> b = Bands((0.8, 1.2), (0.9, 1.1))
    >>> choose_plan([(10.0, 95.0, "tight"), (11.0, 60.0, "tie"), (13.0, 10.0, "slow")], b, 100.0).entry[2]
    'tie'
    """
    if not entries:
        return None
    fastest = min(entries, key=lambda e: e[0])
    if bands is None or cap is None or bands.fits_at_band(fastest[1], cap):
        return Choice(fastest, fastest, "fastest")
    ties = [e for e in entries if e is fastest or bands.ties(fastest[0], e[0])]
    safe = [e for e in ties if bands.fits_at_band(e[1], cap)]
    if safe:
        return Choice(min(safe, key=lambda e: e[0]), fastest, "fits-band")
    least = min(ties, key=lambda e: (e[1], e[0]))
    return Choice(least, fastest, "fastest" if least is fastest else "headroom")
