"""Activation collectives: each layer's collectives of activations and their gradients, pooled
readers' shared reductions, and what tensor-parallel overlap (``tp_overlap``) leaves exposed."""

from __future__ import annotations

import numpy as np

from pase.costing.precision import tp_overlap_share
from pase.costing.training.compute import StepCompute
from pase.costing.training.keeping import LayerKeeping, per_layer_kept
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import PricedLayers
from pase.costing.training.readers import ReaderPools
from pase.model.layers.work import AllReduce

__all__ = ["ActivationCollectives"]


class ActivationCollectives:
    """Seconds of each layer's activation collectives in one micro-batch: charged
    (:meth:`charged_activation`), left exposed (:meth:`exposed_activation`), and the compute
    they leave free to hide the redistribution into the layer (:meth:`overlap_leftover`)."""

    def __init__(self, layers: PricedLayers, pools: ReaderPools, keeping: LayerKeeping, compute: StepCompute,
                 experts=None):
        self.keeping = keeping
        #: The mixture-of-experts dispatchers (``pase.costing.training.experts.ExpertExchange``):
        #: their all-to-alls are priced and overlapped there, not as tensor-parallel collectives.
        self.experts = experts
        self.compute = compute.compute
        self.configs, self.parts, self.machine = layers.configs, layers.parts, layers.machine
        self.pools = pools
        #: Per layer and row, the share of its activation collectives charged (the costing's
        #: ``activation_scale``, which sets it here).
        self.activation_scale = np.ones((len(layers.configs), 1))

    def reader_pools(self) -> dict:
        """``{lead: ((reader, rows), ...)}``: the readers pooled at each lead reader (``rows``: a
        boolean per row, where the reader is laid out like the lead), as
        :meth:`exposed_activation` and the edges charge them."""
        return {v: tuple(pooled) for v, pooled in self.pools.pooled_with.items()}

    def charged_activation(self, v: int) -> np.ndarray:
        """``v``'s activation collectives of one micro-batch, per row: its parts' less the
        reduction of its input's gradient where a reader before it, laid out alike, reduces
        the summed gradient (:meth:`reader_pools`), times its ``activation_scale``."""
        p = self.parts[v]
        a = p.activation
        if v in self.pools.shared:
            a = a - self.pools.shared[v]
        scale = self.activation_scale[v]
        # Sequence parallelism's reduce-scatter (scale 1/2): the machine's share of the
        # all-reduce (exactly 1/2 unless it measured reduce-scatters).
        return a * np.where(scale == 0.5, p.share("activation_rs", "activation"), scale)

    def _pooled(self, v: int, options: TrainingOptions) -> tuple:
        """``(activation collectives, compute)`` of ``v`` with the readers pooled at it, per
        row; 0 where ``v`` itself is pooled at an earlier reader."""
        a, c = self.charged_activation(v), self.compute(v, options)
        for w, rows in self.pools.pooled_with.get(v, ()):
            a = a + np.where(rows, self.charged_activation(w), 0.0)
            c = c + np.where(rows, self.compute(w, options), 0.0)
        follows = self.pools.follows
        if v in follows:
            a, c = np.where(follows[v], 0.0, a), np.where(follows[v], 0.0, c)
        return a, c

    @per_layer_kept
    def exposed_activation(self, v: int, options: TrainingOptions) -> np.ndarray:
        """``v``'s activation collectives of one micro-batch left exposed
        (:meth:`charged_activation`): all of them, or with ``tp_overlap`` ``max(0, a - e c)``
        (``a`` the collectives, ``c`` the layer's compute, ``e`` the overlap efficiency;
        Megatron's ``--tp-comm-overlap`` pipelines each tensor-parallel all-gather and
        reduce-scatter with the GEMM beside it). Readers pooled at ``v`` (:meth:`reader_pools`)
        add their collectives and compute to ``a`` and ``c`` (one fused GEMM hides the one
        reduction) and show none of their own there."""
        if not options.tp_overlap:
            return self.charged_activation(v) + self.expert_dispatch_change(v, options)
        a, c = self._pooled(v, options)
        # No tensor-parallel overlap hides the expert all-to-alls: priced apart, below.
        a = np.maximum(a - self.expert_dispatch_default(v), 0.0)
        hidden = np.minimum(a * tp_overlap_share(options), options.overlap_efficiency * c)
        return (a - hidden + options.comm_sm_share * hidden + self.expert_dispatch_exposed(v, options)
                + self.async_tp_extra(v, options))

    def async_tp_extra(self, v: int, options: TrainingOptions) -> np.ndarray | float:
        """What torch's asynchronous tensor parallelism leaves exposed beyond the overlap
        (``tp_overlap_kind`` ``symmetric_memory``; torch 2.14 torch/distributed/_symmetric_memory
        ``_pipelined_multi_all_gather_and_consume`` and ``_pipelined_produce_and_all2all``, dense.md):
        each fused collective over ``q`` devices runs as ``q`` steps, one of which has nothing to
        hide behind (its local chunk's matmul, or the last partial's copy): ``1 / q`` of the
        collective; and the reduce-scatter's ``q`` partials of ``n / q`` rows are summed by a kernel
        of their own after the last copy (``reduce_partials``: ``n`` elements read, ``n / q``
        written, streamed as copies), work NCCL's reduce-scatter does inside the collective. Per
        activation all-reduce of the layer's work (``n`` elements a device; under sequence
        parallelism a reduce-scatter and an all-gather), times its ``activation_scale``."""
        if options.tp_overlap_kind != "symmetric_memory" or not options.tp_overlap:
            return 0.0
        machine = self.machine

        def extra(piece):
            if not isinstance(piece, AllReduce) or piece.weight:
                return None
            q = np.maximum(np.asarray(piece.group.size, dtype=np.float64), 1.0)
            n = np.asarray(piece.elements, dtype=np.float64)
            fill = np.asarray(machine.all_reduce(n, piece.group), dtype=np.float64) / q
            partials = np.asarray(machine.memory_bound("copy", n * (1.0 + 1.0 / q) / 2.0), dtype=np.float64)
            return np.where(q > 1, fill + partials, 0.0)

        found = self.parts[v].work.communication.value(extra)
        return 0.0 if found is None else np.asarray(found, dtype=np.float64) * self.activation_scale[v]

    def expert_dispatch_default(self, v: int) -> np.ndarray | float:
        """The expert all-to-alls the layer's own parts charge (its ``MoE.work``), times its
        ``activation_scale``; 0 for any other layer."""
        if self.experts is None:
            return 0.0
        return self.experts.default(v) * self.activation_scale[v]

    def expert_dispatch_exposed(self, v: int, options: TrainingOptions) -> np.ndarray | float:
        """The expert dispatcher's collectives left exposed (``ExpertExchange.exposed``: the
        options' dispatcher and overlaps), times the layer's ``activation_scale``."""
        if self.experts is None or v not in self.experts.layers:
            return 0.0
        return self.experts.exposed(v, options) * self.activation_scale[v]

    def expert_dispatch_change(self, v: int, options: TrainingOptions) -> np.ndarray | float:
        """What the dispatcher as the options run it changes of the collectives charged:
        :meth:`expert_dispatch_exposed` less :meth:`expert_dispatch_default`."""
        if self.experts is None or v not in self.experts.layers:
            return 0.0
        return self.expert_dispatch_exposed(v, options) - self.expert_dispatch_default(v)

    def overlap_leftover(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Compute of ``v`` (one micro-batch, times the overlap efficiency) its own activation
        collectives leave free to hide the redistribution into ``v`` (``tp_overlap``; 0 else),
        with the readers pooled at it (:meth:`exposed_activation`)."""
        if not options.tp_overlap or tp_overlap_share(options) < 1.0:  # an unfused all-gather hides nothing
            return np.zeros(len(self.configs[v]))
        a, c = self._pooled(v, options)
        return np.maximum(options.overlap_efficiency * c - a, 0.0)
