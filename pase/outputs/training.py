"""Training plans as a table and as JSON, in practitioners' words (the ``training`` object)."""

from __future__ import annotations

from functools import lru_cache

from pase.core.units import format_bytes
from pase.core.checks import a_network, a_training_plan, arguments, optional, text
from pase.planning.ties import band_overlap

__all__ = ["training_dict", "training_report", "format_training", "split_summary", "CAUSE_NAMES", "difference",
           "step_band", "explain_difference", "plan_warnings", "LONG_STEP_SECONDS", "LOW_MFU", "devices_to_fit_text",
           "mfu_parts", "mfu_text"]

#: A step longer than a day is worth a warning: published training steps take seconds (the
#: runs of reference/published: 0.3 s to about a minute), so a day-long step is a typing slip
#: (a batch of 10^9 sequences) rather than a plan anyone would run.
LONG_STEP_SECONDS = 86400.0
#: An MFU under 5 % is worth a warning: the published runs report 14 % (an FP8 run at 32k
#: tokens) to 64 %; under 5 % the devices mostly wait on communication, bubbles and the optimizer,
#: usually because there are far more of them than the batch can keep busy (-p 1024 -b 1).
LOW_MFU = 0.05

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
    "p2p": "pipeline sends",
    "host": "waiting for the host",
    "host_transfers": "host transfers (offload)",
    "host_optimizer": "CPU optimizer step (offload)",
    "allocator_retries": "caching allocator's retries (tight memory)",
}
#: The causes of a step (``Candidate.causes``) in words.
CAUSE_NAMES = {k: _TIME_NAMES[k] for k in
               ("compute", "recompute", "activation_comm", "redistribution", "p2p", "bubble", "host", "weight_sync",
                "optimizer", "host_transfers", "host_optimizer", "allocator_retries")}
#: Recipe keys as the difference between two plans names them, and their values when a
#: recipe leaves them out (a degree of 1, no pipeline schedule).
_RECIPE_DEFAULTS = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": None, "sp": None, "schedule": None, "vpp": None,
                    "zero": None, "recompute": None, "recompute_modules": None, "microbatch": None}
_MEMORY_NAMES = {
    "model_state": "weights, gradients, optimizer",
    "activations": "stored activations",
    "logits": "fp32 logits and gradient",
    "gathered_weights": "gathered weights",
    "recompute_working_set": "recomputed block",
    "fragmentation": "allocator fragmentation",
    "unsharded_gradients": "unsharded gradients before reduce-scatter",
    "activation_gradients": "activation gradients",
    "comm_buffers": "communication buffers",
    "tp_overlap_buffers": "tensor-parallel overlap buffers",
    "reserve": "reserve",
    "largest_stage": "largest stage",
}


@lru_cache(maxsize=None)
def _engine_bands(label: str):
    """``(step, memory)`` band multipliers of the engine ``label`` (None: no engine)."""
    from pase.planning.engine import band_of, load_engine

    try:
        profile = load_engine(label)
    except ValueError:
        return None
    return band_of(profile, "step"), band_of(profile, "memory")


@lru_cache(maxsize=None)
def _memory_reported(label: str):
    """The memory figure the engine ``label``'s logs print (``memory_reported``; None: no engine)."""
    from pase.planning.engine import load_engine

    try:
        return load_engine(label)["memory_reported"]
    except (ValueError, KeyError):
        return None


def figures_line(candidate, indent: str = "  ") -> str:
    """The peak as PyTorch counts it: allocated and reserved (the fit is judged on what the device
    needs, the line above), and which of them the plan's engine logs."""
    f = candidate.memory_figures()
    logged = _memory_reported(candidate.options.engine) if candidate.options.engine else None
    said = f"; {candidate.options.engine}'s logs print {logged}" if logged else ""
    return (f"{indent}  of which PyTorch's allocator: {format_bytes(f.allocated)} allocated, "
            f"{format_bytes(f.reserved)} "
            f"reserved (max_memory_allocated / max_memory_reserved{said})")


def bands(candidate, seconds: bool = True):
    """``(step_seconds_band, peak_memory_bytes_band)`` of a candidate as ``[low, high]`` lists:
    its modelled figures times the spread of published / modelled over the visible published
    runs of its engine (docs/calibration.md); ``(None, None)`` without an engine."""
    label = candidate.options.engine
    found = _engine_bands(label) if label and seconds else None
    if found is None:
        return None, None
    (s_lo, s_hi), (m_lo, m_hi) = found
    s = candidate.summary
    return [s.step_seconds * s_lo, s.step_seconds * s_hi], [s.peak_memory_bytes * m_lo, s.peak_memory_bytes * m_hi]


def fit_word(candidate, memory_cap, seconds: bool = True) -> str | None:
    """``fits`` (the memory band's high end fits), ``tight`` (only the modelled peak fits, or the
    caching allocator must give cached blocks back to fit: retries) or ``does-not-fit``; None
    without a cap. The band is judged on what tensors need, as the search ranks it
    (``Candidate.needed_memory_bytes``)."""
    if memory_cap is None:
        return None
    if candidate.summary.peak_memory_bytes > memory_cap:
        return "does-not-fit"
    if candidate.summary.extra.get("released_bytes"):
        return "tight"
    _, memory = bands(candidate, seconds)
    if memory is None:
        return "fits"
    high = memory[1] / candidate.summary.peak_memory_bytes if candidate.summary.peak_memory_bytes else 1.0
    return "tight" if candidate.needed_memory_bytes() * high > memory_cap else "fits"


def is_tie(a, b, seconds: bool = True, memory_cap=None) -> bool:
    """Two plans whose step bands overlap by more than half: a tie, not a win. A plan that does
    not fit ``memory_cap`` (its modelled peak over it) is never a tie: it cannot run."""
    if memory_cap is not None and max(a.summary.peak_memory_bytes, b.summary.peak_memory_bytes) > memory_cap:
        return False
    band_a, _ = bands(a, seconds)
    band_b, _ = bands(b, seconds)
    return band_a is not None and band_b is not None and band_overlap(band_a, band_b) > 0.5


def split_summary(network, configs, machine=None) -> list:
    """Per-layer splits of the first repeated block (or every layer) in dimension letters,
    such as ``block1.attn.q: b 4, g 2`` — a plan that is not a mesh, in readable terms."""
    names = network.names
    blocks = network.blocks or ()
    declared = [b for b in blocks if b is not None]
    # The source's first repeated block (``Network.blocks``), else every layer.
    first = [i for i, b in enumerate(blocks) if declared and b == declared[0]] or list(range(len(names)))
    lines = []
    for v in first:
        layer = network.layers[v]
        parts = [f"{letter} {c}" for letter, c in zip(layer.dims, configs[v]) if c > 1]
        lines.append(f"{names[v]}: {', '.join(parts) if parts else 'unsplit'}")
    return lines


def plan_warnings(candidate, seconds: bool = True) -> list:
    """What is implausible about a plan, one line each (``training.warnings``): a step over
    ``LONG_STEP_SECONDS`` or an MFU under ``LOW_MFU``. None on a machine that prices in
    FLOP-equivalents (``seconds`` false), whose figures are not times."""
    s = candidate.summary
    if not seconds:
        return []
    warnings = []
    if s.step_seconds > LONG_STEP_SECONDS:
        warnings.append(f"a step of {s.step_seconds:.4g} s ({s.step_seconds / 86400:.3g} days) is over a day: "
                        "is the batch (-b) meant?")
    if s.mfu is not None and s.mfu < LOW_MFU:
        warnings.append(f"MFU {100 * s.mfu:.3g} % is below {100 * LOW_MFU:g} %: the devices mostly wait; "
                        "fewer devices (-p) or a larger batch (-b) use them better")
    return warnings


def mfu_parts(candidate, machine=None) -> dict | None:
    """The plan's MFU against the dense peak of its own number format (``machine.dtype_flops``;
    BF16's where the machine states none for it, or none is given), and its BF16-equivalent,
    against the BF16 peak: ``{"mfu", "format", "peak_flops", "mfu_bf16"}``; ``None`` without a
    peak. An FP8 plan's model FLOPs over the FP8 peak: its MFU is half its BF16-equivalent on
    a device whose FP8 peak is twice its BF16 one."""
    s = candidate.summary
    if s.mfu is None:
        return None
    precision = candidate.options.precision
    peak = machine.dtype_flops.get(precision) if machine is not None else None
    if not peak:
        precision, peak = "bf16", s.peak_flops
    return {"mfu": s.mfu * s.peak_flops / peak, "format": precision, "peak_flops": peak, "mfu_bf16": s.mfu}


def mfu_text(candidate, machine=None) -> str:
    """``MFU 35.5 % of the fp8 peak, 1979 TFLOPS (71.0 % of the bf16 peak)``: the peak named."""
    parts = mfu_parts(candidate, machine)
    if parts is None:
        return "MFU unknown (no peak)"
    text = f"MFU {100 * parts['mfu']:.1f} % of the {parts['format']} peak, {parts['peak_flops'] / 1e12:.4g} TFLOPS"
    if parts["format"] != "bf16":
        text += f" ({100 * parts['mfu_bf16']:.1f} % of the bf16 peak)"
    return text


def training_dict(candidate, network=None, seconds: bool = True, memory_cap=None, machine=None) -> dict:
    """The ``training`` object (these key names are read outside the project: keep them).

    On a machine that prices in FLOP-equivalents (``seconds`` false) the step is
    ``step_cost`` and the figures in seconds are null. ``memory_cap``: the cap ``fit`` is
    judged against (default the candidate's own; a compared recipe searched without one
    takes the plan's). ``machine``: whose peaks the MFU is against (:func:`mfu_parts`:
    ``mfu`` against the plan's own format's peak, ``mfu_bf16`` against BF16's).
    """
    s = candidate.summary
    o = candidate.options
    mfu = mfu_parts(candidate, machine) if seconds else None
    figures = candidate.memory_figures()
    data = {
        "step_seconds": s.step_seconds if seconds else None,
        "step_cost": s.step_seconds,
        "tokens_per_second_per_device": s.tokens_per_second_per_device if seconds else None,
        "model_flops_per_step": s.model_flops_per_step,
        "mfu": None if mfu is None else mfu["mfu"],
        "mfu_format": None if mfu is None else mfu["format"],
        "mfu_peak_flops": None if mfu is None else mfu["peak_flops"],
        "mfu_bf16": None if mfu is None else mfu["mfu_bf16"],
        "peak_memory_bytes": s.peak_memory_bytes,
        "peak_memory_allocated_bytes": figures.allocated,
        "peak_memory_reserved_bytes": figures.reserved,
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
        "causes": candidate.causes(),
    }
    step_band, memory_band = bands(candidate, seconds)
    data["step_seconds_band"] = step_band
    data["peak_memory_bytes_band"] = memory_band
    data["fit"] = fit_word(candidate, candidate.memory_cap if memory_cap is None else memory_cap, seconds)
    data["warnings"] = plan_warnings(candidate, seconds)
    if o.recompute == "block":  # the blocks each pipeline chunk recomputes (Megatron's --recompute-num-layers)
        data["recompute_layers"] = o.recompute_layers
    if o.recompute == "selective":  # what it recomputes (Megatron's --recompute-modules)
        data["recompute_modules"] = list(o.recompute_modules)
    if o.precision != "bf16":  # the number format, for the engines' exports (bf16 when absent)
        data["precision"] = {"format": o.precision, "fp8_scaling": o.fp8_scaling if o.precision == "fp8" else None,
                             "fp8_gather": o.fp8_gather}
    if o.offload:  # what lives on the host (pase.costing.training.offload), per device
        data["offload"] = "+".join(o.offload)
        data["host_memory_bytes"] = s.extra.get("host_memory_bytes", 0.0)
        if "drive_bytes" in s.extra:
            data["drive_bytes"] = s.extra["drive_bytes"]
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
    plan: every engine's reason is that engines run meshes). The engine the plan was priced
    for is judged by its profile as chosen, switches included (``torchtitan,compile=true`` runs
    the asynchronous tensor parallelism the plain profile does not), the others as shipped."""
    from pase.planning.engine import ENGINE_NAMES
    from pase.planning.engine_runs import engine_plan, refusal

    if plan.best is None:
        return {}
    if plan.best.mesh is None:
        return {name: "the plan is not a mesh" for name in ENGINE_NAMES}
    view = engine_plan(plan.best, plan.batch, network)
    chosen = plan.engine_profile
    return {name: refusal(chosen if chosen is not None and chosen.name == name else name, view)
            for name in ENGINE_NAMES}


def _engine_line(plan, network) -> str:
    verdicts = engine_verdicts(plan, network)
    runs = [name for name, why in verdicts.items() if why is None]
    others = [name for name, why in verdicts.items() if why is not None]
    text = "  engines that run this configuration: " + (", ".join(runs) if runs else "none")
    if others:
        text += f" (not {', '.join(others)}: --export-ENGINE says why)"
    if plan.kept_to:
        text += f"; the search kept to what {' and '.join(plan.kept_to)} run{'s' if len(plan.kept_to) == 1 else ''}"
        profile = plan.engine_profile
        if len(plan.kept_to) == 1 and profile is not None and profile.name == plan.kept_to[0]:
            from pase.planning.engine_runs import runs_said

            text += f" ({runs_said(profile)})"
    return text


@arguments(plan=a_training_plan, network=a_network, model_name=text)
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
        "training": training_dict(best, network, seconds, machine=plan.machine) if best is not None else None,
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
    if plan.per_layer is not None:  # faster than the plan, and no engine runs it
        data["per_layer"] = training_dict(plan.per_layer, network, seconds, machine=plan.machine)
    if plan.compare is not None:
        data["compare"] = {"recipe": plan.compare_recipe,
                           "training": training_dict(plan.compare, network, seconds, plan.memory_cap, plan.machine),
                           "tie": bool(best is not None and is_tie(best, plan.compare, seconds, plan.memory_cap))}
        if best is not None:
            data["compare"]["difference"] = [{"cause": k, "seconds": v} for k, v in explain_difference(best, plan.compare)]
    if plan.alternatives:
        data["training"]["alternatives"] = [
            {"recipe": c.recipe(), "step_seconds": c.summary.step_seconds if seconds else None,
             "step_cost": c.summary.step_seconds, "peak_memory_bytes": c.summary.peak_memory_bytes,
             "tie": i > 0 and is_tie(best, c, seconds, plan.memory_cap), "differs": None if i == 0 else difference(best, c),
             "slower_by": None if i == 0 else [{"cause": k, "seconds": v} for k, v in explain_difference(best, c)[:2]],
             "causes": c.causes()}
            for i, c in enumerate(plan.alternatives)]
    return data


def _per_layer_line(plan, seconds: bool) -> str:
    """The faster per-layer plan beside the plan, which no engine runs (``TrainingPlan.per_layer``)."""
    c, best = plan.per_layer, plan.best
    faster = 100 * (best.summary.step_seconds / c.summary.step_seconds - 1)
    unit = " s" if seconds else " flop-equivalents"
    return (f"  a per-layer plan no engine runs is {faster:.1f} % faster: {c.recipe()}, step "
            f"{c.summary.step_seconds:.4g}{unit}, {format_bytes(c.summary.peak_memory_bytes)} "
            "(--training --per-layer makes it the plan; JSON: per_layer)")


def _engine_label(plan) -> str | None:
    """The engine profile the plan was priced under (``--engine``; the default named)."""
    c = plan.best or plan.least_memory
    return (c.options.engine or None) if c is not None else None


def step_band(candidate) -> tuple | None:
    """The plan's step-time band ``(low, high)`` in seconds when the machine gives one
    (``training.step_seconds_band``), else ``None``."""
    if candidate is None:
        return None
    band, _ = bands(candidate)
    return None if band is None else (float(band[0]), float(band[1]))


def _recipe_values(candidate) -> dict:
    if candidate.mesh is None:
        return {}
    values = dict(_RECIPE_DEFAULTS)
    values.update(candidate.as_recipe().fixed())
    if values["tp"] == 1:
        values["sp"] = None
    return values


def difference(best, other) -> str:
    """How ``other`` differs from ``best`` in recipe words: ``tp 8 instead of 4, zero 3
    instead of 1`` (``same recipe`` when the recipes agree)."""
    if best.mesh is None or other.mesh is None:
        return f"{'a mesh' if other.mesh is not None else 'per-layer splits'} instead of " \
               f"{'a mesh' if best.mesh is not None else 'per-layer splits'}"
    a, b = _recipe_values(best), _recipe_values(other)
    words = []
    for key in _RECIPE_DEFAULTS:
        if key == "sp" and 1 in (a["tp"], b["tp"]):  # sequence parallelism needs tp > 1 on both sides
            continue
        if a.get(key) != b.get(key):
            new = "off" if b.get(key) is None else "+".join(b[key]) if isinstance(b[key], tuple) else str(b[key]).lower()
            old = "off" if a.get(key) is None else "+".join(a[key]) if isinstance(a[key], tuple) else str(a[key]).lower()
            words.append(f"{key} {new} instead of {old}")
    return ", ".join(words) or "same recipe"


def explain_difference(best, other) -> list:
    """``[(cause, seconds)]``: how much more (or less) time ``other`` spends on each cause than
    ``best``, the largest change first (causes that do not change left out)."""
    a, b = best.causes(), other.causes()
    deltas = [(k, b.get(k, 0.0) - a.get(k, 0.0)) for k in CAUSE_NAMES]
    # Changes under a thousandth of the plan's step are left out (noise beside the others).
    scale = max(best.summary.step_seconds, other.summary.step_seconds, 1e-300)
    deltas = [(k, d) for k, d in deltas if abs(d) >= 1e-3 * scale]
    return sorted(deltas, key=lambda kd: (-abs(kd[1]), kd[0]))


def _signed(seconds: float, unit: str) -> str:
    return f"{'+' if seconds >= 0 else '-'}{abs(seconds):.3g}{unit}"


def _candidate_lines(candidate, memory_cap, seconds: bool, machine=None, indent: str = "  ") -> list:
    s = candidate.summary
    unit = "s" if seconds else "flop-equivalents"
    step_band, memory_band = bands(candidate, seconds)
    word = fit_word(candidate, memory_cap, seconds)
    if word is None:
        fits = ""
    elif word == "fits":
        fits = (f" (fits, {format_bytes(memory_cap - s.peak_memory_bytes)} to spare"
                + (f", band up to {format_bytes(memory_band[1])}" if memory_band else "") + ")")
    elif word == "tight" and s.extra.get("released_bytes"):
        slowed = ("; its retries slow the step" if candidate.causes().get("allocator_retries")
                  else "; the engine's allocator gives them back without a stalling retry")
        fits = (f" (tight: fits once the caching allocator gives back {format_bytes(s.extra['released_bytes'])} "
                f"of cached blocks{slowed})")
    elif word == "tight":
        fits = (f" (tight: fits at the modelled peak, not at its band's high end {format_bytes(memory_band[1])})")
    else:
        fits = " (does NOT fit)"
    time_parts = ", ".join(f"{CAUSE_NAMES[k]} {v:.4g}" for k, v in candidate.causes().items() if v)
    memory_parts = ", ".join(f"{_MEMORY_NAMES[k]} {format_bytes(v)}" for k, v in candidate.memory_kinds().items() if v)
    band_text = "" if step_band is None else f", band {step_band[0]:.4g}-{step_band[1]:.4g} {unit}"
    lines = [
        f"{indent}step: {s.step_seconds:.4g} {unit}{band_text} ({time_parts})",
        f"{indent}peak memory per device: {format_bytes(s.peak_memory_bytes)}"
        + (f" of {format_bytes(memory_cap)}" if memory_cap is not None else "") + fits + f" ({memory_parts})",
        figures_line(candidate, indent),
    ]
    if candidate.options.offload:  # what lives on the host (pase.costing.training.offload)
        node = int(machine.devices_per_node or 1)
        if candidate.mesh is not None:  # a node holds at most the plan's devices
            node = min(node, candidate.mesh.devices)
        host = s.extra.get("host_memory_bytes", 0.0)
        lines.append(f"{indent}offload={'+'.join(candidate.options.offload)}: host memory {format_bytes(host)} per "
                     f"device, {format_bytes(host * node)} per node of {node}"
                     + (f"; drive {format_bytes(s.extra['drive_bytes'] * node)} per node" if "drive_bytes" in s.extra
                        else ""))
    if seconds and s.tokens_per_second_per_device is not None:
        lines.append(f"{indent}tokens/s per device: {s.tokens_per_second_per_device:,.0f}; "
                     f"model FLOPs per step {s.model_flops_per_step:.3g}; {mfu_text(candidate, machine)}")
    return lines


def _crossing_lines(candidate, machine) -> list:
    """A line where the plan's tensor parallelism spans more than one NVLink domain (a recipe
    fixed it: the search keeps tp inside one)."""
    domain = machine.nvlink_domain or machine.devices_per_node
    mesh = candidate.mesh
    if mesh is None or domain is None or mesh.tp <= domain:
        return []
    wait = candidate.options.tp_node_wait_seconds
    return [f"  tp {mesh.tp} crosses nodes: its collectives are priced over the network "
            f"({mesh.tp // domain} domains of {domain} GPUs)"
            + (f", waiting {1e3 * wait:.3g} ms per block, micro-batch and doubling of the nodes (the fitted "
               "tp_node_wait_seconds)" if wait else "")]


def _expert_host_lines(candidate) -> list:
    """A line where the device waits for the host and the engine states a host time per
    mixture-of-experts block (``moe_block_overhead_seconds``): why the step is what it is."""
    host = candidate.causes().get("host", 0.0)
    per_block = candidate.options.moe_block_overhead_seconds
    if not host or not per_block:
        return []
    return [f"  the host bounds the step: the engine's token dispatcher stops the host at every mixture-of-experts "
            f"block, {1e3 * per_block:.3g} ms a block and micro-batch (moe_block_overhead_seconds), and the device "
            f"waits {host:.4g} s for it; fewer MoE blocks a device (pipeline stages) or more tokens a micro-batch "
            "shorten the wait"]


def _activation_sync_lines(candidate, network) -> list:
    """A line where the engine's implementation of the experts' activation stops the host inside
    each mixture-of-experts block (``expert_activation_sync``): the blocks' MoE host time adds to
    the device's (``StepCompute.host_wait_seconds``)."""
    from pase.costing.training.compute import activation_waits

    o = candidate.options
    if not o.moe_block_overhead_seconds or network is None:
        return []
    count = sum(1 for layer in network.layers if layer.op == "MoE" and activation_waits(layer, o))
    if not count:
        return []
    return [f"  the experts' activation ({o.expert_activation_sync}) stops the host again inside each of the "
            f"{count} mixture-of-experts blocks (expert_activation_sync): their {1e3 * o.moe_block_overhead_seconds:.3g} ms "
            "of host time a block and micro-batch add to the device's, counted in compute"]


@arguments(plan=a_training_plan, network=optional(a_network), model_name=text)
def format_training(plan, network=None, model=None, model_name: str = "sequence length") -> str:
    """The text of a training plan (``plan_training``'s result): the plan, its step by cause and
    memory, its pipeline, the alternatives and the compared recipe. ``network`` is the one
    the plan's layers name (default: ``plan.network``); ``model`` and ``model_name`` only
    label the first line (such as ``sequence length 8192``)."""
    network = network if network is not None else plan.network
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
        lines += _crossing_lines(best, plan.machine)
        lines += _candidate_lines(best, plan.memory_cap, seconds, plan.machine)
        lines += _expert_host_lines(best)
        lines += _activation_sync_lines(best, network)
        lines += [f"  WARNING: {warning}" for warning in plan_warnings(best, seconds)]
        lines.append(f"  parameters: {best.summary.parameters:,}")
        lines.append(_engine_line(plan, network))
        if plan.per_layer is not None:
            lines.append(_per_layer_line(plan, seconds))
        pipe = best.summary.extra.get("pipeline")
        if pipe:
            lines.append(f"  pipeline: {pipe['pp']} stages, {pipe['schedule']}"
                         + (f" with {pipe['vpp']} chunks per device" if pipe["vpp"] > 1 else "")
                         + f", {pipe['microbatches']} micro-batches, bubble {100 * pipe['bubble_fraction']:.1f} %")
            for st in pipe["stages"]:
                lines.append(f"    stage {st['stage']}: {st['blocks']} blocks, devices {st['devices'][0]}-"
                             f"{st['devices'][1]}, {st['microbatch_seconds']:.4g} "
                             f"{'s' if seconds else 'flop-equivalents'} per micro-batch, "
                             f"{format_bytes(st['memory_bytes'])}")
        if plan.exceeds_device:
            lines.append(f"  WARNING: needs more than the device's {format_bytes(plan.device_memory_bytes)}")
        if best.mesh is None and network is not None:
            lines.append("  splits of the first block:")
            lines += ["    " + x for x in split_summary(network, best.configs)]
    if plan.alternatives:
        lines += _alternative_lines(plan, seconds)
    if plan.compare is not None:
        c = plan.compare
        lines.append(f"compare: {plan.compare_recipe}  (best: {c.recipe()})")
        lines += _candidate_lines(c, plan.memory_cap, seconds, plan.machine)
        if best is not None and best.summary.step_seconds > 0:
            ratio = c.summary.step_seconds / best.summary.step_seconds
            unit = " s" if seconds else ""
            tie = "; a tie: their bands overlap by more than half" if is_tie(best, c, seconds, plan.memory_cap) else ""
            lines.append(f"  {ratio:.3f}x the plan's step ({_signed(c.summary.step_seconds - best.summary.step_seconds, unit)}"
                         f"){tie}; {difference(best, c)}")
            why = explain_difference(best, c)
            if why:
                lines.append("  by cause, largest first: " + ", ".join(
                    f"{CAUSE_NAMES[k]} {_signed(v, unit)}" for k, v in why))
    lines.append(f"search: {plan.mesh_search.evaluated} configurations in {plan.seconds:.2f} s; {plan.optimal_over}")
    fused = best is None or best.options.fused_attention
    lines.append(f"model: docs/training.md ({'fused attention' if fused else 'attention without a fused kernel'}, "
                 "ZeRO, recomputation, overlap, reserve)")
    return "\n".join(lines) + "\n"


def _alternative_lines(plan, seconds: bool) -> list:
    """``--top K``: the fastest distinct fitting configurations, how each differs from the plan
    and what makes it slower (its two largest causes of the difference)."""
    best = plan.best
    band = step_band(best)
    unit = " s" if seconds else ""
    lines = [f"top {len(plan.alternatives)}: the fastest distinct configurations that fit (one of each step and "
             "memory); = marks a tie with the plan" + (" within its band" if band is not None else " to the figures shown")]
    width = max(len(c.recipe()) for c in plan.alternatives)
    for i, c in enumerate(plan.alternatives):
        s = c.summary
        mark = "=" if i > 0 and is_tie(best, c, seconds, plan.memory_cap) else " "
        head = f"  {i + 1:>2}{mark} {c.recipe():<{width}}  step {s.step_seconds:.4g}{unit}  {format_bytes(s.peak_memory_bytes)}"
        if i == 0:
            lines.append(head + "  the plan")
            continue
        if s.step_seconds < best.summary.step_seconds:  # a faster tie the plan beat on headroom
            lines.append(f"{head}  {difference(best, c)}: {_why_not_faster(c, plan.memory_cap, seconds)}")
            continue
        why = [(k, v) for k, v in explain_difference(best, c) if v > 0][:2]
        reason = ", ".join(f"{CAUSE_NAMES[k]} {_signed(v, unit)}" for k, v in why)
        lines.append(f"{head}  {difference(best, c)}" + (f": {reason}" if reason else ""))
    return lines


def _why_not_faster(candidate, memory_cap, seconds: bool) -> str:
    """Why a faster configuration is not the plan: it ties with it and fits only at its modelled peak."""
    _, memory = bands(candidate, seconds)
    if memory is None or memory_cap is None:
        return "faster"
    return (f"faster and a tie, but its memory band reaches {format_bytes(memory[1])} of {format_bytes(memory_cap)} "
            "(the plan has more headroom)")


def devices_to_fit_text(plan) -> str | None:
    """How many devices would fit, where nothing fits (``TrainingPlan.fewest_devices``), in words:
    the count priced and its plan, or the estimate where no count priced fits."""
    found = plan.fewest_devices
    if found is None:
        return None
    basis = (f"estimated {found.estimate} from the least-memory configuration's "
             f"{format_bytes(plan.least_memory.summary.peak_memory_bytes)} per device on {plan.procs}")
    if found.count is None:
        return (f"about {found.estimate} devices or more would be needed ({basis}; priced on "
                f"{', '.join(map(str, found.priced))}: nothing fits there either)")
    s = found.best.summary
    fewer = (f"; {found.fewer} do not fit" if found.fewer is not None
             else "" if found.least else "; fewer were not priced")
    return (f"{found.count} devices fit it (priced: {found.best.recipe()}, step {s.step_seconds:.4g} s, "
            f"{format_bytes(s.peak_memory_bytes)}{fewer}; {basis})")


def offload_fit_text(plan) -> str:
    """Where nothing fits and the recipe said ``offload=none``: the offload that would fit
    (``TrainingPlan.offload_fit``) in words, e.g. "fits with offload=optimizer: 41 GB per
    device, 1.1 TB of host memory per node"; else ``""``."""
    fit = getattr(plan, "offload_fit", None)
    if fit is None or fit.best is None:
        return ""
    s = fit.best.summary
    node = min(int(plan.machine.devices_per_node or 1), int(plan.procs))
    return (f"fits with offload={'+'.join(fit.best.options.offload)}: {format_bytes(s.peak_memory_bytes)} per device, "
            f"{format_bytes(s.extra.get('host_memory_bytes', 0.0) * node)} of host memory per node "
            f"({fit.best.recipe()}, step {s.step_seconds:.4g} s)")
