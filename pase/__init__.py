"""PaSE: exact parallelization strategies for DNN training (Elango, IPDPS 2021).

One sub-package per stage, imports pointing down: ``sources`` (a spec -> a ``Network`` of
``model`` layers), ``costing`` (what each configuration costs on one of the ``machines``),
``search`` (which combination is best), ``planning`` (``plan`` runs them all and returns a
``Plan``), ``outputs`` (tables, JSON, DOT, JAX) and ``cli``; ``core`` under all of them.

The names below are imported on first use, so ``import pase`` itself is instant and the
command line can report Ctrl-C or a missing dependency cleanly while it loads.
"""

from importlib import import_module

__version__ = "0.2.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "plan": "planning.planner", "evaluate_plan": "planning.planner", "Plan": "planning.planner",
    "GraphBuilder": "model.builder", "Network": "model.builder", "CostTablesTooLarge": "model.builder",
    "Tensor": "model.tensor",
    "Machine": "machines.paper", "Group": "machines.base", "load_machine": "machines.registry",
    "CalibratedMachine": "machines.calibrated",
    "network_to_json": "sources.graph_json", "network_from_json": "sources.graph_json",
    "from_torch": "sources.torch.importer",
    "export_shardings": "outputs.jax.export", "verify": "outputs.jax.verify", "VerifyResult": "outputs.jax.verify",
    "to_dtensor": "outputs.torch.verify", "verify_torch": "outputs.torch.verify",
    "enumerate_configs": "model.configs", "is_contiguous": "model.configs",
    **{name: "model.layers" for name in (
        "Layer", "LayerCost", "LAYER_TYPES", "make_layer", "Conv", "Pooling", "FC", "Einsum", "Embedding",
        "Elementwise", "Concat", "Norm", "BatchNorm", "RMSNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy",
        "LSTM", "Ravel", "Unravel", "Stack", "Unstack", "Roll", "MoE",
    )},
    "Ordering": "search.ordering", "ORDERINGS": "search.ordering", "generate_seq": "search.ordering",
    "breadth_first": "search.ordering",
    "Search": "search.solver", "SearchResult": "search.solver", "SearchStats": "search.solver",
    "SearchTooLarge": "search.solver", "WorkEstimate": "search.solver", "solve": "search.solver",
    "Evaluation": "costing.strategy", "evaluate": "costing.strategy",
    "data_parallel": "planning.baselines", "largest_divisor": "planning.baselines",
    "MemoryModel": "costing.memory", "MemorySummary": "costing.memory",
    "expert_strategies": "planning.experts",
    "plan_training": "planning.training_plan", "TrainingPlan": "planning.training_plan",
    "NO_CAP": "planning.training_plan", "load_engine": "planning.engine",
    "sweep_training": "planning.training_sweep", "TrainingSweep": "planning.training_sweep",
    "TrainingOptions": "costing.training", "TrainingCosting": "costing.training",
    "Mesh": "planning.mesh", "Recipe": "planning.mesh", "parse_recipe": "planning.mesh",
    "search_meshes": "planning.training_search", "evaluate_candidate": "planning.training_search",
    "training_report": "outputs.training", "format_training": "outputs.training",
    "html_report": "outputs.report",
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
