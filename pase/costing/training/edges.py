"""Edges under a training configuration: how often each redistribution runs in a step
(micro-batches, recomputation), pooled readers' edges charged once, and what overlap hides."""

from __future__ import annotations

import numpy as np

from pase.costing.training.collectives import ActivationCollectives
from pase.costing.training.keeping import LayerKeeping, VectorGroups
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import FORWARD_COMM_SHARE, PricedLayers
from pase.costing.training.readers import ReaderPools
from pase.costing.training.recompute import RecomputePolicy

__all__ = ["EdgeRows"]


class EdgeRows:
    """Exposed seconds of every edge per row under options (:meth:`edge_rows`), from the
    redistribution seconds of one micro-batch the costed graph gives."""

    def __init__(self, layers: PricedLayers, pools: ReaderPools, keeping: LayerKeeping, groups: VectorGroups,
                 policy: RecomputePolicy, collectives: ActivationCollectives):
        self.keeping = keeping
        self.network = layers.network
        self.pools = pools
        self.representative = groups.representative
        self.recomputed_mask = policy.recomputed_mask
        self.overlap_leftover = collectives.overlap_leftover
        #: Per layer and row, the share of its activation collectives charged (the costing's
        #: ``activation_scale``, which sets it here and calls :meth:`forget`).
        self.activation_scale = np.ones((len(layers.configs), 1))
        self._scale_keys: dict = {}
        self._edge_arrays = None

    def forget(self) -> None:
        """Forget the leftover keys kept (they read ``activation_scale``)."""
        self._scale_keys = {}

    def edge_factors(self, targets, options: TrainingOptions) -> np.ndarray:
        """Per edge into ``targets``: edges redistribute every micro-batch, and again (their
        forward share) when the target recomputes."""
        again = self.recomputed_mask(options)[np.asarray(targets, dtype=np.int64)]
        return options.microbatches * (1.0 + FORWARD_COMM_SHARE * again)

    def edge_rows(self, edges: np.ndarray, targets, options: TrainingOptions, columns=None) -> np.ndarray:
        """Exposed seconds of every edge per row ``(E, K)`` from the redistribution seconds of
        one micro-batch forward and backward ``edges``: :meth:`edge_factors` times them, less
        (``tp_overlap``) ``m`` times the target's ``overlap_leftover``, at least 0. Readers
        pooled at a lead (``reader_pools``) need the tensor as the lead does: their edges
        are charged once, on the lead's, at the largest factor of the pool (one gather, run
        again if any of them recomputes). ``edges``: one row per edge of the network in sorted
        order (``targets`` their consumers); ``columns``: the rows of this costing that
        ``edges`` has (default all)."""
        return self.keeping.memo.get(("edge_rows", id(edges), id(targets), id(columns)), options,
                                     lambda o: self._edge_rows(edges, targets, o, columns),
                                     hold=(edges, targets, columns))

    def _edge_rows(self, edges: np.ndarray, targets, options: TrainingOptions, columns=None) -> np.ndarray:
        rows = self.edge_factors(targets, options)[:, None] * edges
        if self.pools.edge_pairs:
            if len(targets) != len(self.network.edges):
                raise ValueError("edge_rows: edges must have one row per edge of the network, in sorted order")
            leads, followers, pooled, alone, quiet = self._edge_pooling()
            if columns is not None:
                pooled, quiet = pooled[:, columns], quiet[:, columns]
            # The lead's edge at the pool's largest (edges are >= 0; a follower is no lead
            # where it follows, so every value read here is its own), the followers' none.
            np.maximum.at(rows, leads, np.where(pooled, rows[followers], 0.0))
            rows[alone] = np.where(quiet, 0.0, rows[alone])
        if not options.tp_overlap or not len(targets):
            rows.setflags(write=False)
            return rows
        # A layer's leftover is its group representative's where their activation shares agree
        # (layers of one group have equal compute and collectives): one computation each, for
        # the first target of each.
        targets = np.asarray(targets, dtype=np.int64)
        keys = self._leftover_keys(columns)[targets]
        distinct, first, where = np.unique(keys, return_index=True, return_inverse=True)
        left = [self.overlap_leftover(int(targets[i]), options) for i in first]
        left = np.array(left if columns is None else [x[columns] for x in left])
        hide = left[where.reshape(-1)]
        out = np.maximum(rows - options.microbatches * hide, 0.0)
        out.setflags(write=False)
        return out

    def _edge_pooling(self) -> tuple:
        """The pools' edge pairs as arrays over the network's sorted edges: ``(lead edges,
        follower edges, rows pooled per pair, each follower edge once, the rows where it
        follows)``."""
        if self._edge_arrays is None:
            pairs = self.pools.edge_pairs
            index = {edge: e for e, edge in enumerate(sorted(self.network.edges))}
            edge_of = lambda v: index[(self._producer_of(v), v)]  # noqa: E731
            leads = np.array([edge_of(a) for a, _, _ in pairs], dtype=np.int64)
            followers = np.array([edge_of(b) for _, b, _ in pairs], dtype=np.int64)
            pooled = np.array([rows for _, _, rows in pairs], dtype=bool)
            alone = sorted({b for _, b, _ in pairs})
            quiet = np.array([self.pools.follows[b] for b in alone], dtype=bool)
            self._edge_arrays = (leads, followers, pooled, np.array([edge_of(b) for b in alone], dtype=np.int64), quiet)
        return self._edge_arrays

    def _producer_of(self, v: int) -> int:
        """The producer of the tensor reader ``v`` pools (its one reduced input)."""
        layer = self.network.layers[v]
        return layer.inputs[layer.reduced_inputs()[0]].producer

    def _leftover_keys(self, columns=None) -> np.ndarray:
        """Per layer, a number naming its group representative and its row of activation
        shares (in ``columns``): layers with one number have equal ``overlap_leftover``."""
        key = None if columns is None else columns.tobytes()
        if key not in self._scale_keys:
            scale = self.activation_scale
            if columns is not None and scale.shape[1] > 1:
                scale = scale[:, columns]
            named: dict = {}
            self._scale_keys[key] = np.array([named.setdefault((int(self.representative[v]), scale[v].tobytes()),
                                                               len(named))
                                              for v in range(len(self.network.layers))], dtype=np.int64)
        return self._scale_keys[key]
