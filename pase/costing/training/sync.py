"""Weight synchronisation: each layer's weight-gradient reductions and weight gathers by ZeRO
stage (element sizes, bucket latency, FSDP units) and what of them overlap leaves exposed."""

from __future__ import annotations

import numpy as np

from pase.costing.precision import PrecisionPricing
from pase.costing.training.compute import StepCompute
from pase.costing.training.keeping import LayerKeeping, per_layer_kept
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import FORWARD_SHARE, PricedLayers
from pase.costing.training.structure import fsdp_units

__all__ = ["WeightSync"]


class WeightSync:
    """Seconds of each layer's weight synchronisation in one step (:meth:`sync`) and the part
    of it left exposed (:meth:`exposed_sync`), hidden behind its compute (:meth:`hiding`)."""

    def __init__(self, layers: PricedLayers, keeping: LayerKeeping, precision: PrecisionPricing,
                 compute: StepCompute):
        self.keeping = keeping
        self.precision = precision
        self.compute = compute.compute
        self.machine, self.configs, self.parts = layers.machine, layers.configs, layers.parts
        self.blocks = layers.structure.blocks
        self._unit_cache = None

    @per_layer_kept
    def sync(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Weight-gradient synchronisation of ``v`` in one step, by ZeRO stage.

        With ``AR`` the all-reduce of the gradients (gradient element size), ``RS`` a
        reduce-scatter (half of it), ``AG`` an all-gather at the weight's size (half the
        all-reduce at that size) and ``m`` micro-batches: stage 0 ``AR``; 1 ``RS + AG``; 2
        ``m RS + AG`` (the gradient shard is reduced every micro-batch); 3 ``m (RS + 2 AG)``
        (the weights gathered for the forward and again for the backward pass). ``RS`` and ``AG``
        keep the machine's share of ``AR`` (``LayerParts.share``: its own measured curves);
        ``zero1_reduce`` ``all_reduce``: stage 1 is ``AR + AG`` (nanotron). With
        ``bucket_elements`` ``B``, a layer of ``P`` local weight elements pays ``min(1, P/B)`` of
        its collectives' fixed (latency) part.
        """
        p = self.parts[v]
        m = options.microbatches
        gradient, gather = self.wire_parts(v, options)
        bucket = options.bucket_elements
        if options.wrap_unit != "layer":
            # FSDP reduces and gathers a unit's flattened parameters in one collective.
            bucket = self._unit_elements()[v]
        if p.latency is not None and np.any(bucket > 0):
            # Gradients reduce in buckets of ``bucket_elements`` (or the unit): a layer pays
            # its share of one bucket's fixed cost, not a collective of its own.
            local = self._local_elements(v)
            share = np.where(bucket > 0, np.minimum(1.0, local / np.where(bucket > 0, bucket, 1.0)), 1.0)
            spare = p.latency * (1.0 - share)
            gradient, gather = np.maximum(gradient - spare, 0.0), np.maximum(gather - spare, 0.0)
        gather = gather * self.precision.gather_scale(v, options)
        # The reduce-scatter and all-gather as the machine prices them against its all-reduce
        # (halves of it, or its measured curves of each), kept through the rescaling above.
        rs, ag = p.share("reduce_scatter", "gradient") * gradient, p.share("all_gather", "gather") * gather
        if options.zero == 0:
            return gradient
        if options.zero == 1:
            # nanotron's ZeRO-1 all-reduces the whole fp32 gradient buffer (zero1_reduce).
            return (gradient if options.zero1_reduce == "all_reduce" else rs) + ag
        if options.zero == 2:
            return m * rs + ag
        return m * (rs + 2.0 * ag)

    def wire_parts(self, v: int, options: TrainingOptions) -> tuple:
        """``(gradient, gather)`` collectives of ``v`` at the options' element sizes: the parts
        are priced at the machine's ``grad_bytes`` and ``act_bytes``; ``grad_reduce_bytes`` and
        ``gather_bytes`` rescale the part that moves bytes (the fixed latency stays)."""
        p = self.parts[v]
        latency = p.latency if p.latency is not None else 0.0
        out = []
        for seconds, wanted, at in ((p.gradient, options.grad_reduce_bytes, self.machine.grad_bytes),
                                    (p.gather, options.gather_bytes, self.machine.act_bytes)):
            if wanted is None or at is None or wanted == at:
                out.append(seconds)
                continue
            fixed = np.minimum(latency, seconds)
            out.append(fixed + (seconds - fixed) * (wanted / float(at)))
        return tuple(out)

    def _local_elements(self, v: int) -> np.ndarray:
        """Weight elements ``v`` holds per device (its tensor-parallel shard), per row."""
        return sum((elements for elements, _ in self.parts[v].params), np.zeros(len(self.configs[v])))

    def _unit_elements(self) -> list:
        """Per layer, the weight elements per device of its FSDP unit (``fsdp_units``), per row."""
        if self._unit_cache is None:
            index, count = fsdp_units(self.blocks)
            K = len(self.configs[0])
            if any(len(C) != K for C in self.configs):
                # Per-layer rows (the free search): rows of different layers are unrelated, so a
                # unit's total has no row; each layer counts as its unit times its unit's size.
                sizes = np.bincount(index, minlength=count)
                self._unit_cache = [self._local_elements(v) * sizes[index[v]] for v in range(len(index))]
                return self._unit_cache
            totals = np.zeros((count, K))
            for v in range(len(self.configs)):
                totals[index[v]] += self._local_elements(v)
            self._unit_cache = [totals[index[v]] for v in range(len(self.configs))]
        return self._unit_cache

    def hiding(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Compute that ``v``'s synchronisation may hide behind (one layer as one bucket).

        Gradient reductions run during the backward pass of the micro-batch that produces
        them (two thirds of a layer's compute), gathers of updated weights during the next
        forward (one third); stage 2 reduces every micro-batch, stage 3 also gathers every
        forward and backward pass.
        """
        c = self.compute(v, options)
        m = options.microbatches
        share = {0: 1.0 - FORWARD_SHARE, 1: 1.0, 2: m * (1.0 - FORWARD_SHARE) + FORWARD_SHARE, 3: float(m)}
        return share[options.zero] * c

    @per_layer_kept
    def exposed_sync(self, v: int, options: TrainingOptions) -> np.ndarray:
        """``max(0, sync - efficiency x hiding)`` with overlap, else the whole ``sync``."""
        s = self.sync(v, options)
        if not options.overlap or (options.zero == 1 and not options.zero1_overlap):
            return s
        hidden = np.minimum(s, options.overlap_efficiency * self.hiding(v, options))
        # The compute it hides behind runs on the SMs communication leaves (comm_sm_share).
        return s - hidden + options.comm_sm_share * hidden
