"""PaSE: exact parallelization strategies for DNN training (Elango, IPDPS 2021).

Three stages: what each layer can do (``configs``, ``layers``), what it costs on a machine
(``layers``, ``machine``, ``builder``, ``strategy.evaluate``), which combination is best
(``ordering``, ``solver``, ``capped``). ``plan`` runs them all and returns a ``Plan``.

The names below are imported on first use, so ``import pase`` itself is instant and the
command line can report Ctrl-C or a missing dependency cleanly while it loads.
"""

from importlib import import_module

__version__ = "0.2.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "plan": "planner", "evaluate_plan": "planner", "Plan": "planner",
    "GraphBuilder": "builder", "Network": "builder", "CostTablesTooLarge": "builder",
    "Tensor": "tensor",
    "Machine": "machine", "Group": "machine", "load_machine": "machine", "CalibratedMachine": "calibrated",
    "network_to_json": "graph_json", "network_from_json": "graph_json",
    "from_torch": "torch_import",
    "export_shardings": "jax_export", "verify": "jax_verify", "VerifyResult": "jax_verify",
    "to_dtensor": "torch_verify", "verify_torch": "torch_verify",
    "enumerate_configs": "configs", "is_contiguous": "configs",
    "Layer": "layers", "LayerCost": "layers", "LAYER_TYPES": "layers", "make_layer": "layers",
    "Conv": "layers", "Pooling": "layers", "FC": "layers", "Einsum": "layers", "Embedding": "layers",
    "Elementwise": "layers", "Concat": "layers", "Norm": "layers", "BatchNorm": "layers", "RMSNorm": "layers",
    "ReduceMean": "layers", "Softmax": "layers", "SoftmaxCrossEntropy": "layers", "LSTM": "layers",
    "Ravel": "layers", "Unravel": "layers", "Stack": "layers", "Unstack": "layers",
    "Ordering": "ordering", "ORDERINGS": "ordering", "generate_seq": "ordering", "breadth_first": "ordering",
    "Search": "solver", "SearchResult": "solver", "SearchStats": "solver", "SearchTooLarge": "solver",
    "WorkEstimate": "solver", "solve": "solver",
    "Evaluation": "strategy", "evaluate": "strategy",
    "data_parallel": "baselines", "largest_divisor": "baselines",
    "MemoryModel": "memory", "MemorySummary": "memory",
    "expert_strategies": "experts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pase' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
