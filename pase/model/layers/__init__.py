"""Stages 1 and 2 per layer type: iteration space, tensor configurations and layer cost.

One class per layer type, registered by its ``op`` name in ``LAYER_TYPES``, one module per
family. Every cost is a vectorised function of an ``int`` array of configurations (one row
each), enumerated or not: a layer describes its work in parts (``work.py``: GEMMs, memory-bound
passes, collectives), which whatever machine is given prices (``docs/cost-model.md``). A new
layer type is one class in a family module (or a new module imported below) plus its JAX
function in ``pase/outputs/jax/program.py``.
"""

from .base import LAYER_TYPES, Layer, LayerCost, gemm_cost, gemm_work, layer_type, make_layer, redistribution_volume
from .work import LayerWork
# The families, in the order their types register (the order of LAYER_TYPES).
from .conv import Conv, Pooling
from .gemm import FC, Einsum, Embedding
from .pointwise import BatchNorm, Elementwise, Norm, ReduceMean, RMSNorm, Softmax, SoftmaxCrossEntropy
from .recurrent import LSTM
from .movement import Concat, Ravel, Roll, Stack, Unravel, Unstack
from .moe import MoE

__all__ = [
    "Layer", "LayerCost", "Conv", "Pooling", "FC", "Einsum", "Embedding", "Elementwise", "Concat", "Norm",
    "BatchNorm", "RMSNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy", "LSTM", "Ravel", "Unravel",
    "Stack", "Unstack", "Roll", "MoE", "gemm_cost", "gemm_work", "LayerWork", "redistribution_volume", "LAYER_TYPES", "layer_type", "make_layer",
]
