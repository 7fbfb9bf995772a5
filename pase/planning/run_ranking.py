"""How modelled steps order a cluster's measured runs: per group of runs that compete (one graph,
device count and sequence), pairs measured far enough apart put in the right order, and the
measured share of the group's best of the run the model ranks first."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

__all__ = ["Ranking", "rank_runs", "PAIR_RATIO", "GOOD_PICK"]

#: Two runs form a pair when one measured at least this many times the other's throughput
#: (closer ones are within a run's own noise: the issue's 25 %).
PAIR_RATIO = 1.25
#: A group's first pick is good when it measured at least this share of the group's best.
GOOD_PICK = 0.90


@dataclass(frozen=True)
class Ranking:
    """``right`` of ``pairs`` ordered right; ``good_picks`` of ``groups`` whose first pick measured
    at least :data:`GOOD_PICK` of their best (groups of one run count for neither)."""

    pairs: int
    right: int
    groups: int
    good_picks: int

    def as_dict(self) -> dict:
        return {"pairs": self.pairs, "right": self.right, "groups": self.groups, "good_picks": self.good_picks}


def rank_runs(groups: Sequence, measured: Sequence[float], modelled: Sequence[float],
              ratio: float = PAIR_RATIO, good: float = GOOD_PICK) -> Ranking:
    """The order ``modelled`` rates give the runs against the ``measured`` ones (both rates: higher
    is faster, e.g. sequences per second per device), within each group of equal ``groups`` key.
    A run the model could not rate (``NaN``) ranks last. The first pick of a tie is the earlier run.

    >>> r = rank_runs(["a", "a", "a"], [3.0, 1.5, 1.0], [3.0, 1.0, 1.5])
    >>> (r.right, r.pairs, r.good_picks, r.groups)
    (2, 3, 1, 1)
    """
    measured = np.asarray(measured, dtype=np.float64)
    modelled = np.nan_to_num(np.asarray(modelled, dtype=np.float64), nan=-np.inf)
    members: dict = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    pairs = right = counted = good_picks = 0
    for idx in members.values():
        if len(idx) < 2:
            continue
        counted += 1
        for a, b in combinations(idx, 2):
            hi, lo = (a, b) if measured[a] >= measured[b] else (b, a)
            if measured[hi] >= ratio * measured[lo]:
                pairs += 1
                right += bool(modelled[hi] > modelled[lo])
        pick = max(idx, key=lambda i: (modelled[i], -i))
        good_picks += bool(measured[pick] >= good * measured[idx].max())
    return Ranking(pairs, right, counted, good_picks)
