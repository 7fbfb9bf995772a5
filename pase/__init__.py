"""PaSE: exact parallelization strategies for DNN training (Elango, IPDPS 2021).

Three stages: what each layer can do (``configs``, ``layers``), what it costs on a machine
(``layers``, ``machine``, ``builder``, ``strategy.evaluate``), which combination is best
(``ordering``, ``solver``, ``capped``). ``plan`` runs them all and returns a ``Plan``.
"""

from .baselines import data_parallel, largest_divisor
from .builder import CostTablesTooLarge, GraphBuilder, Network
from .configs import enumerate_configs, is_contiguous
from .experts import expert_strategies
from .graph_json import network_from_json, network_to_json
from .layers import (
    FC, LAYER_TYPES, LSTM, BatchNorm, Concat, Conv, Einsum, Elementwise, Embedding, Layer, LayerCost, Norm,
    Pooling, Ravel, ReduceMean, RMSNorm, Softmax, SoftmaxCrossEntropy, Stack, Unravel, Unstack, make_layer,
)
from .machine import Group, Machine, load_machine
from .memory import MemoryModel, MemorySummary
from .ordering import ORDERINGS, Ordering, breadth_first, generate_seq
from .plan import Plan, evaluate_plan, plan
from .solver import Search, SearchResult, SearchStats, SearchTooLarge, WorkEstimate, solve
from .strategy import Evaluation, evaluate
from .tensor import Tensor

__version__ = "0.2.0"

__all__ = [
    "plan", "evaluate_plan", "Plan",
    "GraphBuilder", "Network", "Tensor", "Machine", "Group", "load_machine",
    "network_to_json", "network_from_json",
    "enumerate_configs", "is_contiguous",
    "Layer", "LayerCost", "LAYER_TYPES", "make_layer", "Conv", "Pooling", "FC", "Einsum", "Embedding",
    "Elementwise", "Concat", "Norm", "BatchNorm", "RMSNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy",
    "LSTM", "Ravel", "Unravel", "Stack", "Unstack",
    "Ordering", "ORDERINGS", "generate_seq", "breadth_first",
    "Search", "SearchResult", "SearchStats", "SearchTooLarge", "CostTablesTooLarge", "WorkEstimate", "solve",
    "Evaluation", "evaluate",
    "data_parallel", "largest_divisor",
    "MemoryModel", "MemorySummary", "expert_strategies",
]
