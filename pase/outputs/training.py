"""Training plans as a table and as JSON, in practitioners' words (the ``training`` object)."""

from __future__ import annotations

from pase.core.units import format_bytes

__all__ = ["training_dict", "training_report", "format_training", "split_summary"]

_TIME_NAMES = {
    "compute": "compute",
    "recompute": "recomputation",
    "activation_comm": "activation collectives",
    "weight_sync": "exposed weight sync",
    "optimizer": "optimizer step",
    "redistribution": "redistribution",
    "pipeline": "micro-batches on the slowest stage",
    "bubble": "pipeline bubble",
    "sync_and_optimizer": "slowest stage's exposed sync and optimizer",
}
_MEMORY_NAMES = {
    "model_state": "weights, gradients, optimizer",
    "activations": "stored activations",
    "logits": "fp32 logits and gradient",
    "gathered_weights": "gathered weights",
    "recompute_working_set": "recomputed block",
    "reserve": "reserve",
    "largest_stage": "largest stage",
}


def split_summary(network, configs, machine=None) -> list:
    """Per-layer splits of the first repeated block (or every layer) in dimension letters,
    such as ``block1.attn.q: b 4, g 2`` — a plan that is not a mesh, in readable terms."""
    names = network.names
    first = [i for i, n in enumerate(names) if n.startswith("block1.")] or list(range(len(names)))
    lines = []
    for v in first:
        layer = network.layers[v]
        parts = [f"{letter} {c}" for letter, c in zip(layer.dims, configs[v]) if c > 1]
        lines.append(f"{names[v]}: {', '.join(parts) if parts else 'unsplit'}")
    return lines


def training_dict(candidate, network=None, seconds: bool = True) -> dict:
    """The ``training`` object (these key names are read outside the project: keep them).

    On a machine that prices in FLOP-equivalents (``seconds`` false) the step is
    ``step_cost`` and the figures in seconds are null.
    """
    s = candidate.summary
    o = candidate.options
    data = {
        "step_seconds": s.step_seconds if seconds else None,
        "step_cost": s.step_seconds,
        "tokens_per_second_per_device": s.tokens_per_second_per_device if seconds else None,
        "model_flops_per_step": s.model_flops_per_step,
        "mfu": s.mfu if seconds else None,
        "peak_memory_bytes": s.peak_memory_bytes,
        "parameters": s.parameters,
        "engine": o.engine or None,
        "zero": o.zero,
        "recompute": o.recompute,
        "microbatches": o.microbatches,
        "microbatch_sequences": candidate.microbatch,
        "fused_attention": o.fused_attention,
        "overlap": o.overlap,
        "time": dict(s.time),
        "memory": dict(s.memory),
        "recipe": candidate.recipe(),
    }
    if "pipeline" in s.extra:
        data["pipeline"] = s.extra["pipeline"]
        data["stage_memory_bytes"] = [st["memory_bytes"] for st in s.extra["pipeline"]["stages"]]
    if candidate.mesh is not None:
        data["mesh"] = candidate.mesh.as_dict()
        data["sequence_parallel"] = candidate.mesh.sp if candidate.mesh.tp > 1 else False
    elif network is not None:
        data["splits"] = split_summary(network, candidate.configs)
    return data


def engine_verdicts(plan, network) -> dict:
    """Engine name -> ``None`` where it runs the plan as priced, else why not (a per-layer
    plan: every engine's reason is that engines run meshes)."""
    from pase.planning.engine import ENGINE_NAMES
    from pase.planning.engine_runs import engine_plan, refusal

    if plan.best is None:
        return {}
    if plan.best.mesh is None:
        return {name: "the plan is not a mesh" for name in ENGINE_NAMES}
    view = engine_plan(plan.best, plan.batch, network)
    return {name: refusal(name, view) for name in ENGINE_NAMES}


def _engine_line(plan, network) -> str:
    verdicts = engine_verdicts(plan, network)
    runs = [name for name, why in verdicts.items() if why is None]
    others = [name for name, why in verdicts.items() if why is not None]
    text = "  engines that run this configuration: " + (", ".join(runs) if runs else "none")
    if others:
        text += f" (not {', '.join(others)}: --export-ENGINE says why)"
    if plan.kept_to:
        text += f"; the search kept to what {' and '.join(plan.kept_to)} run{'s' if len(plan.kept_to) == 1 else ''}"
    return text


def training_report(plan, network, model=None, model_name="sequence length") -> dict:
    """The whole JSON object of a training plan."""
    best = plan.best
    seconds = plan.machine.cost_unit == "seconds"
    data = {
        "graph": plan.network_name,
        "procs": plan.procs,
        "batch": plan.batch,
        "model": model,
        "machine": plan.machine.describe(),
        "cost_unit": plan.machine.cost_unit,
        "memory_cap_bytes": plan.memory_cap,
        "status": "fits" if best is not None else "nothing-fits",
        "engine": _engine_label(plan),
        "training": training_dict(best, network, seconds) if best is not None else None,
        "search": {
            "configurations": plan.mesh_search.evaluated,
            "per_layer_searches": plan.free_searches,
            "per_layer_table_entries": plan.free_entries,
            "seconds": plan.seconds,
            "optimal_over": plan.optimal_over,
        },
        "layers": ([{"id": v, "name": n, "op": network.layers[v].op, "config": list(best.configs[v])}
                    for v, n in enumerate(network.names)] if best is not None else []),
    }
    if best is not None:
        data["engines"] = engine_verdicts(plan, network)
        data["engines_kept_to"] = list(plan.kept_to)
    if plan.compare is not None:
        data["compare"] = {"recipe": plan.compare_recipe, "training": training_dict(plan.compare, network, seconds)}
    return data


def _engine_label(plan) -> str | None:
    """The engine profile the plan was priced under (``--engine``; the default named)."""
    c = plan.best or plan.least_memory
    return (c.options.engine or None) if c is not None else None


def _candidate_lines(candidate, memory_cap, seconds: bool, indent: str = "  ") -> list:
    s = candidate.summary
    unit = "s" if seconds else "flop-equivalents"
    fits = "" if memory_cap is None else (" (fits)" if s.peak_memory_bytes <= memory_cap else " (does NOT fit)")
    time_parts = ", ".join(f"{_TIME_NAMES[k]} {v:.4g}" for k, v in s.time.items() if v)
    memory_parts = ", ".join(f"{_MEMORY_NAMES[k]} {format_bytes(v)}" for k, v in s.memory.items() if v)
    lines = [
        f"{indent}step: {s.step_seconds:.4g} {unit} ({time_parts})",
        f"{indent}peak memory per device: {format_bytes(s.peak_memory_bytes)}"
        + (f" of {format_bytes(memory_cap)}" if memory_cap is not None else "") + fits + f" ({memory_parts})",
    ]
    if seconds and s.tokens_per_second_per_device is not None:
        lines.append(f"{indent}tokens/s per device: {s.tokens_per_second_per_device:,.0f}; "
                     f"model FLOPs per step {s.model_flops_per_step:.3g}; MFU {100 * s.mfu:.1f} %")
    return lines


def format_training(plan, network, model=None, model_name: str = "sequence length") -> str:
    """The table of a training plan."""
    seconds = plan.machine.cost_unit == "seconds"
    size = f", {model_name} {model}" if model is not None else ""
    lines = [f"{plan.network_name} on {plan.procs} devices of {plan.machine.name}, batch {plan.batch}{size}: "
             "training configuration"]
    engine = _engine_label(plan)
    if engine:
        lines.append(f"engine: {engine} (--engine; its kernels, dtypes, overlaps and allocator: docs/engines.md)")
    best = plan.best
    if best is not None:
        where = f"mesh {best.mesh.label()}" if best.mesh is not None else "per-layer splits (not a mesh)"
        lines.append(f"plan: {best.recipe()}  [{where}]")
        lines += _candidate_lines(best, plan.memory_cap, seconds)
        lines.append(f"  parameters: {best.summary.parameters:,}")
        lines.append(_engine_line(plan, network))
        pipe = best.summary.extra.get("pipeline")
        if pipe:
            lines.append(f"  pipeline: {pipe['pp']} stages, {pipe['schedule']}"
                         + (f" with {pipe['vpp']} chunks per device" if pipe["vpp"] > 1 else "")
                         + f", {pipe['microbatches']} micro-batches, bubble {100 * pipe['bubble_fraction']:.1f} %")
            for st in pipe["stages"]:
                lines.append(f"    stage {st['stage']}: {st['blocks']} blocks, devices {st['devices'][0]}-"
                             f"{st['devices'][1]}, {st['microbatch_seconds']:.4g} s per micro-batch, "
                             f"{format_bytes(st['memory_bytes'])}")
        if best.mesh is None:
            lines.append("  splits of the first block:")
            lines += ["    " + x for x in split_summary(network, best.configs)]
    if plan.compare is not None:
        c = plan.compare
        lines.append(f"compare: {plan.compare_recipe}  (best: {c.recipe()})")
        lines += _candidate_lines(c, plan.memory_cap, seconds)
        if best is not None and best.summary.step_seconds > 0:
            ratio = c.summary.step_seconds / best.summary.step_seconds
            lines.append(f"  {ratio:.3f}x the plan's step")
    lines.append(f"search: {plan.mesh_search.evaluated} configurations in {plan.seconds:.2f} s; {plan.optimal_over}")
    lines.append("model: docs/training.md (fused attention, ZeRO, recomputation, overlap, reserve)")
    return "\n".join(lines) + "\n"
