"""The training configuration around per-layer splits (ZeRO, recomputation, overlap; docs/training.md),
in parts that each own one concern; which module owns what: docs/architecture.md, "The training costing"."""

from __future__ import annotations

from pase.costing.training.compute import (
    ATTENTION_HALF_HEAD, ATTENTION_HALF_SEQUENCE, DEFAULT_ATTENTION_EFFICIENCY, EAGER_NORM_BYTES, EAGER_NORM_KERNELS,
    ELEMENT_TRAFFIC_COPY, FLASH_BACKWARD_FACTOR, KERNELS_PER_LAYER, OPTIMIZER_STEP_BYTES, attention_shape_factor,
)
from pase.costing.training.costing import TrainingCosting
from pase.costing.training.options import (
    DEFAULT_RESERVE_BYTES, RECOMPUTE_MODULES, RECOMPUTE_POLICIES, WRAP_UNITS, ZERO_STAGES, TrainingOptions,
)
from pase.costing.training.parts import FORWARD_COMM_SHARE, FORWARD_SHARE, LATENCY_ELEMENTS, LayerParts, layer_parts
from pase.costing.training.recompute import EAGER_NORM_SAVED, OP_POLICY_KEEPS
from pase.costing.training.structure import (
    NetworkStructure, attention_cores, model_flops, parameter_elements_unique, structure_key,
)
from pase.costing.training.summary import TrainingSummary
from pase.costing.training.vectors import LAYER_VECTORS

__all__ = [
    "TrainingOptions", "LayerParts", "layer_parts", "attention_cores", "TrainingCosting",
    "TrainingSummary", "RECOMPUTE_MODULES", "RECOMPUTE_POLICIES", "ZERO_STAGES", "FORWARD_SHARE", "FORWARD_COMM_SHARE",
    "FLASH_BACKWARD_FACTOR", "DEFAULT_ATTENTION_EFFICIENCY", "OPTIMIZER_STEP_BYTES", "DEFAULT_RESERVE_BYTES",
    "model_flops", "parameter_elements_unique", "EAGER_NORM_BYTES", "KERNELS_PER_LAYER", "EAGER_NORM_KERNELS",
    "EAGER_NORM_SAVED", "OP_POLICY_KEEPS", "ATTENTION_HALF_SEQUENCE", "ATTENTION_HALF_HEAD", "attention_shape_factor",
    "NetworkStructure", "structure_key", "LAYER_VECTORS", "WRAP_UNITS", "LATENCY_ELEMENTS", "ELEMENT_TRAFFIC_COPY",
]
