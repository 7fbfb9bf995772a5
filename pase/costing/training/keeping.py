"""What the costing keeps across option sets: the layers equal in vectors under any options
(:class:`VectorGroups`) and the one :class:`~pase.core.memo.OptionsMemo` the parts keep results in."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from pase.core.memo import OptionsMemo
from pase.costing.training.parts import PricedLayers
from pase.costing.training.recompute import ActivationPlaces

__all__ = ["VectorGroups", "LayerKeeping", "per_layer_kept"]


@dataclass(frozen=True, eq=False)
class VectorGroups:
    """Layers equal in parts and in place (block, attention role, kept output, charged weights,
    copies held on a pipeline's last stage, loss, read by the loss alone, kept by the operator
    policy, a module of Megatron's selective recomputation, place among pooled readers) have
    equal vectors under any options: one representative each. ``groups``: ``(representative,
    members)`` in the order of their first layers; ``representative`` and ``group_of``: per
    layer, its group's representative and index in ``groups``."""

    groups: list
    representative: np.ndarray
    group_of: np.ndarray

    @classmethod
    def of(cls, layers: PricedLayers, places: ActivationPlaces, reader_place: dict) -> "VectorGroups":
        st = layers.structure
        found: dict = {}
        for v, layer in enumerate(layers.network.layers):
            key = (layers.kinds[v], st.cores.get(v), st.blocks[v] is None, st.block_outputs[v], st.charged[v],
                   st.copies[v], layer.loss, bool(places.loss_only[v]), bool(places.op_saved[v]),
                   bool(places.read_back[v]),
                   bool(places.module_norm[v]), bool(places.dense_mlp[v]), bool(places.mla_up[v]),
                   bool(places.mla_up_input[v]), reader_place.get(v))
            found.setdefault(key, []).append(v)
        groups = [(members[0], np.array(members)) for members in found.values()]
        n = len(layers.network.layers)
        representative = np.empty(n, dtype=np.int64)
        group_of = np.empty(n, dtype=np.int64)
        for g, (rep, members) in enumerate(groups):
            representative[members] = rep
            group_of[members] = g
        return cls(groups, representative, group_of)


class LayerKeeping:
    """The memo every part keeps its per-layer results in, and the layers kept there: by
    default the group representatives (those :meth:`~.vectors.LayerVectors.layer_vectors`
    computes); :meth:`keep_every_layer` for a costing priced layer by layer under many options.
    Kept by the options' fields they read (:class:`pase.core.memo.OptionsMemo`): a search over
    ZeRO stages and recomputation policies computes what one of them does not change once."""

    def __init__(self, groups: VectorGroups):
        self.memo = OptionsMemo()
        self.layers = [False] * len(groups.representative)
        for rep, _ in groups.groups:
            self.layers[rep] = True

    def keep_every_layer(self) -> None:
        self.layers[:] = [True] * len(self.layers)


def per_layer_kept(method):
    """A part's method of ``(v, options)`` kept in its :class:`LayerKeeping` (``self.keeping``)
    for the layers kept there: once per layer and values of the option fields it reads. The
    other layers compute it each time (one pass over them is cheaper so). The method's name keys
    the memo: it is unique among the parts."""
    name = method.__name__

    @functools.wraps(method)
    def kept(self, v, options):
        keeping = self.keeping
        if not keeping.layers[v]:
            return method(self, v, options)
        return keeping.memo.get((name, v), options, lambda o: method(self, v, o))

    return kept
