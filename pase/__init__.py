"""PaSE: exact parallelization strategies for DNN training (Elango, IPDPS 2021).

Three stages: what each layer can do (``configs``, ``layers``), what it costs (``layers``,
``builder``, ``strategy.evaluate``), which combination is best (``ordering``, ``solver``).
"""

from .baselines import batch_split, data_parallel
from .builder import GraphBuilder, Network
from .capped import CappedStrategy, find_capped_strategy
from .configs import enumerate_configs, is_contiguous
from .experts import expert_strategies
from .layers import (
    FC, LAYER_TYPES, LSTM, BatchNorm, Concat, Conv, Einsum, Elementwise, Embedding, Layer, Norm,
    Pooling, Ravel, ReduceMean, Softmax, SoftmaxCrossEntropy, Stack, Unravel, Unstack,
)
from .machine import Machine
from .memory import MemoryModel
from .ordering import ORDERINGS, Ordering, breadth_first, generate_seq
from .solver import Search, SearchResult, SearchStats, SearchTooLarge, WorkEstimate, solve
from .strategy import Evaluation, Strategy, evaluate, find_strategy
from .tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "GraphBuilder", "Network", "Tensor", "Machine",
    "enumerate_configs", "is_contiguous",
    "Layer", "LAYER_TYPES", "Conv", "Pooling", "FC", "Einsum", "Embedding", "Elementwise",
    "Concat", "Norm", "BatchNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy", "LSTM",
    "Ravel", "Unravel", "Stack", "Unstack",
    "Ordering", "ORDERINGS", "generate_seq", "breadth_first",
    "Search", "SearchResult", "SearchStats", "SearchTooLarge", "WorkEstimate", "solve",
    "Evaluation", "Strategy", "evaluate", "find_strategy",
    "data_parallel", "batch_split",
    "MemoryModel", "CappedStrategy", "find_capped_strategy", "expert_strategies",
]
