"""The training costing (:class:`TrainingCosting`): a network's layer parts priced once, composed
with the parts that each own one concern; the searches, plans and reports call it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pase.costing.precision import PrecisionPricing
from pase.costing.training.collectives import ActivationCollectives
from pase.costing.training.compute import StepCompute
from pase.costing.training.edges import EdgeRows
from pase.costing.training.experts import ExpertExchange
from pase.costing.training.keeping import LayerKeeping, VectorGroups
from pase.costing.training.memory import MemoryKinds
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import PricedLayers
from pase.costing.training.readers import check_reader_rule, pool_readers
from pase.costing.training.recompute import RecomputePolicy, activation_places, op_roles
from pase.costing.training.structure import NetworkStructure
from pase.costing.training.summary import TrainingSummary, summarize
from pase.costing.training.sync import WeightSync
from pase.costing.training.vectors import LayerVectors

__all__ = ["TrainingCosting"]


class TrainingCosting:
    """Cost and memory vectors of every layer of a network under training options.

    Built once per (network at one micro-batch, device count, machine): the layer parts of
    every configuration array given; :meth:`layer_vectors` and :meth:`edge_rows` then apply any
    :class:`TrainingOptions` without touching the layers again. Each answer comes from the
    part that owns its concern (the package's map, ``pase.costing.training``).

    Parameters
    ----------
    network : Network
        Built at the micro-batch size.
    configs : list of numpy.ndarray
        Configuration rows of every layer (the enumerated ones, or one row per candidate).
    machine
        Prices the parts.
    structure : NetworkStructure, optional
        The network's, when the caller has it already.
    readers : str
        How the weight products reading one tensor pay for it (``pase.model.readers``):
        ``"summed"`` (the default), as engines run them, needs rows that line up across layers
        (a mesh's, or one strategy's): readers laid out alike in a row gather the tensor once and
        reduce their summed gradient once (:meth:`reader_pools`); ``"each"``: every reader pays
        its own (the per-layer search, whose rows of different layers are unrelated).
    """

    def __init__(self, network, configs: Sequence[np.ndarray], machine, structure: NetworkStructure | None = None,
                 readers: str = "summed"):
        check_reader_rule(readers)
        st = structure if structure is not None else NetworkStructure.of(network)
        layers = self.layers = PricedLayers.of(network, configs, machine, st)
        pools = pool_readers(layers, readers)
        places = activation_places(layers)
        groups = VectorGroups.of(layers, places, pools.place)
        self.keeping = LayerKeeping(groups)
        # The parts, each given the records and the other parts it reads.
        #: FP8 / MXFP8 / NVFP4 (``TrainingOptions.precision``), priced in ``pase.costing.precision``.
        self.precision = PrecisionPricing(layers)
        self.recomputation = RecomputePolicy(layers, places)
        self.step_compute = StepCompute(layers, self.keeping, self.precision)
        self.experts = ExpertExchange(layers, self.keeping, self.step_compute)
        self.collectives = ActivationCollectives(layers, pools, self.keeping, self.step_compute, self.experts)
        self.weight_sync = WeightSync(layers, self.keeping, self.precision, self.step_compute)
        self.memory_kinds = MemoryKinds(layers, places, self.keeping, self.precision, self.recomputation)
        self.edge_costs = EdgeRows(layers, pools, self.keeping, groups, self.recomputation, self.collectives)
        self.vectors = LayerVectors(layers, self.keeping, groups, self.step_compute, self.collectives,
                                    self.weight_sync, self.recomputation, self.memory_kinds, self.edge_costs)
        # What the searches, the plans and the tests read of the costing.
        self.network, self.machine, self.readers, self.structure = network, machine, readers, st
        self.configs, self.kinds, self.parts = layers.configs, layers.kinds, layers.parts
        self.blocks, self.cores, self.block_outputs, self.charged = st.blocks, st.cores, st.block_outputs, st.charged
        self.op_saved, self.read_back = places.op_saved, places.read_back
        self.vector_groups, self.representative = groups.groups, groups.representative
        self._memo = self.keeping.memo
        self.activation_scale = np.ones((len(network.layers), 1))

    @property
    def activation_scale(self) -> np.ndarray:
        """Per layer and row, the share of its activation collectives charged: 1, or 1/2 where
        sequence parallelism turns an all-reduce into a reduce-scatter (the all-gather it
        needs is the redistribution into the next product). Setting it forgets the vectors
        kept."""
        return self.collectives.activation_scale

    @activation_scale.setter
    def activation_scale(self, value) -> None:
        for part in (self.collectives, self.edge_costs, self.precision):
            part.activation_scale = value
        self.forget()

    def forget(self) -> None:
        """Forget the vectors kept (they are computed again when asked for)."""
        self.keeping.memo.clear()
        self.edge_costs.forget()

    def keep_every_layer(self) -> None:
        """Keep every layer's per-layer vectors by the options they read (by default only the
        group representatives' are kept): for a costing priced under many option sets layer by
        layer (the per-layer search)."""
        self.keeping.keep_every_layer()

    # -- the recomputation policy (recompute.py) --------------------------------------------

    def op_roles(self) -> dict:
        return op_roles(self.layers)

    def block_order(self) -> list:
        return self.recomputation.block_order()

    def block_recomputed(self, layers: int, chunks=None) -> np.ndarray:
        return self.recomputation.block_recomputed(layers, chunks)

    def recomputed_mask(self, options: TrainingOptions, chunks=None) -> np.ndarray:
        return self.recomputation.recomputed_mask(options, chunks)

    def recomputed(self, v: int, options: TrainingOptions) -> bool:
        return self.recomputation.recomputed(v, options)

    def stored_activations(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.recomputation.stored_activations(v, options)

    def working_activations(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.recomputation.working_activations(v, options)

    # -- in-step compute (compute.py) ---------------------------------------------------------

    def compute(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.step_compute.compute(v, options)

    def optimizer_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.step_compute.optimizer_seconds(v, options)

    # -- communication (sync.py, collectives.py, edges.py) ------------------------------------

    def sync(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.weight_sync.sync(v, options)

    def wire_parts(self, v: int, options: TrainingOptions) -> tuple:
        return self.weight_sync.wire_parts(v, options)

    def hiding(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.weight_sync.hiding(v, options)

    def exposed_sync(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.weight_sync.exposed_sync(v, options)

    def reader_pools(self) -> dict:
        return self.collectives.reader_pools()

    def charged_activation(self, v: int) -> np.ndarray:
        return self.collectives.charged_activation(v)

    def exposed_activation(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.collectives.exposed_activation(v, options)

    def overlap_leftover(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.collectives.overlap_leftover(v, options)

    def edge_factors(self, targets, options: TrainingOptions) -> np.ndarray:
        return self.edge_costs.edge_factors(targets, options)

    def edge_factor(self, v: int, options: TrainingOptions) -> float:
        """Edges into ``v`` redistribute every micro-batch, and again when ``v`` recomputes."""
        return float(self.edge_costs.edge_factors([v], options)[0])

    def edge_rows(self, edges: np.ndarray, targets, options: TrainingOptions, columns=None) -> np.ndarray:
        return self.edge_costs.edge_rows(edges, targets, options, columns)

    # -- memory by kind (memory.py) -----------------------------------------------------------

    def layer_memory(self, v: int, options: TrainingOptions, act_bytes: float) -> dict:
        return self.memory_kinds.layer_memory(v, options, act_bytes)

    def memory_vector(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        return sum(self.memory_kinds.layer_memory(v, options, act_bytes).values())

    def gathered_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.memory_kinds.gathered_bytes(v, options)

    def copy_state(self, v: int, options: TrainingOptions) -> np.ndarray:
        return self.memory_kinds.copy_state(v, options)

    def output_gradient_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        return self.memory_kinds.output_gradient_bytes(v, options, act_bytes)

    def transient_parts(self, gathered: np.ndarray, working: np.ndarray, grads: np.ndarray,
                        options: TrainingOptions, recomputed=None, buffers=None) -> dict:
        return self.memory_kinds.transient_parts(gathered, working, grads, options, recomputed, buffers)

    def transient_rows(self, vectors: dict, options: TrainingOptions, layers=None) -> np.ndarray:
        return self.memory_kinds.transient_rows(vectors, options, layers)

    def transient_bytes(self, choice: Sequence[int], options: TrainingOptions, act_bytes: float,
                        chunks=None) -> dict:
        return self.memory_kinds.transient_bytes(choice, options, act_bytes, chunks)

    # -- the vectors the searches read and the summary (vectors.py, summary.py) ---------------

    def layer_time(self, v: int, options: TrainingOptions) -> dict:
        return self.vectors.layer_time(v, options)

    def cost_vector(self, v: int, options: TrainingOptions) -> np.ndarray:
        return sum(self.vectors.layer_time(v, options).values())

    def layer_vectors(self, options: TrainingOptions, act_bytes: float) -> dict:
        return self.vectors.layer_vectors(options, act_bytes)

    @property
    def vector_names(self) -> tuple:
        """The names :meth:`layer_vectors` gives (the copies' only where a pipeline's last stage
        holds copies of tied weights)."""
        return self.vectors.names

    def block_deltas(self, options: TrainingOptions, act_bytes: float, edges=None, targets=(),
                     columns=None) -> dict:
        return self.vectors.block_deltas(options, act_bytes, edges, targets, columns)

    def summarize(self, choice: Sequence[int], options: TrainingOptions, act_bytes: float, edge_seconds: float,
                  procs: int, tokens_per_step: int | None = None) -> TrainingSummary:
        return summarize(self.layers, self.vectors, self.memory_kinds, choice, options, act_bytes, edge_seconds,
                         procs, tokens_per_step)
