"""Reader pooling (``--readers summed``): the weight products reading one tensor laid out alike
gather it once and reduce their summed gradient once, at the first of them (:class:`ReaderPools`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pase.costing.training.parts import PricedLayers
from pase.model.readers import READER_RULES, alike_readers, reader_groups

__all__ = ["ReaderPools", "pool_readers", "check_reader_rule"]


@dataclass(frozen=True, eq=False)
class ReaderPools:
    """Per row, the readers of one tensor laid out alike (``pase.model.readers.alike_readers``)
    pool at the first of them, which pays the one reduction of their summed input gradient and
    the one gather of the tensor. Per reader: ``shared``, the reduction it no longer pays;
    ``follows``, the rows where it follows another; ``pooled_with`` (per lead), the later
    readers pooled at it and their rows; ``edge_pairs``, ``(lead, follower, rows)`` whose
    follower's edge is not charged; ``place``, its place in its group (equal places, equal
    pooled vectors). Empty under the reader rule ``"each"``."""

    shared: dict = field(default_factory=dict)
    follows: dict = field(default_factory=dict)
    pooled_with: dict = field(default_factory=dict)
    edge_pairs: list = field(default_factory=list)
    place: dict = field(default_factory=dict)


def check_reader_rule(readers: str) -> None:
    """``ValueError`` unless ``readers`` names a reader rule."""
    if readers not in READER_RULES:
        raise ValueError(f"unknown reader rule {readers!r}; choose one of: {', '.join(READER_RULES)}")


def pool_readers(layers: PricedLayers, readers: str) -> ReaderPools:
    """The :class:`ReaderPools` of ``layers`` under the reader rule ``readers``: ``"summed"``
    needs rows that line up across layers (a mesh's, or one strategy's); ``"each"``, every
    reader pays its own (the per-layer search, whose rows of different layers are unrelated)."""
    if readers == "each":
        return ReaderPools()
    network, configs = layers.network, layers.configs
    K = len(configs[0]) if configs else 0
    if any(len(C) != K for C in configs):
        raise ValueError("the reader rule 'summed' needs configuration rows that line up across layers "
                         "(one per mesh or strategy); per-layer rows are priced under 'each'")
    # Groups of readers equal in parts (repeated blocks) share their rows and reductions.
    leads: dict = {}
    reductions: dict = {}
    pools = ReaderPools()  # filled here, read-only from here on
    for group in reader_groups(network):
        members = tuple(v for v, _ in group)
        kinds = (tuple(layers.kinds[w] for w in members), tuple(i for _, i in group))
        if kinds not in leads:
            leads[kinds] = alike_readers(network, group, configs)
        lead = leads[kinds]
        for j, (v, i) in enumerate(group):
            pools.place[v] = (j, kinds[0], lead.tobytes())
            follows = lead[j] != j
            if not follows.any():
                continue
            if (kinds, j) not in reductions:
                reduction = network.layers[v].gradient_reductions(configs[v], layers.machine)[i]
                reductions[(kinds, j)] = np.where(follows, np.asarray(reduction, dtype=np.float64), 0.0)
            pools.shared[v] = reductions[(kinds, j)]
            pools.follows[v] = follows
            for earlier in range(j):
                rows = lead[j] == earlier
                if rows.any():
                    pools.pooled_with.setdefault(members[earlier], []).append((v, rows))
                    if network.layers[v].inputs[i].producer is not None:
                        pools.edge_pairs.append((members[earlier], v, rows))
    return pools
