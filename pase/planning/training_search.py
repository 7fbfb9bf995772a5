"""The training-configuration search: meshes, ZeRO, recomputation and micro-batches around
the per-layer splits, every candidate priced by :class:`pase.training.TrainingCosting`.

Two searches, each exact over what it says:

- **Meshes** (:func:`search_meshes`): every ``dp x tp x cp = p`` (``tp`` inside an NVLink domain),
  sequence parallelism on or off, ZeRO 0-3, recomputation none/selective/full and every
  micro-batch size dividing the per-rank batch; each candidate is costed exactly and the
  fastest that fits is kept. Layer parts are computed once per distinct layer and mesh (one
  costing per network, the meshes of every stage count its rows) and reused across ZeRO stages
  and recomputation policies, which recompute only what they change (``pase.core.memo``).
- **Per-layer** (:func:`search_free`): the exact dynamic programme over every layer's own
  splits under one fixed training option set, memory capped by the Lagrangian search.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from pase.model.builder import redistribution_seconds
from pase.planning.engine_runs import check_engine, mesh_refusal, policy_refusal
from pase.planning.mesh import Mesh, MeshMapper, Recipe
from pase.planning.mesh_refusals import fold_refusal, microbatch_refusal, occupancy_refusal, recipe_refusal
from pase.model.roles import roles_of
from pase.planning.rules import ParallelRules, default_rules
from pase.planning.pipeline import SCHEDULES, pipeline_rows_settings, stage_chunks, stage_layout
from pase.costing.precision import check_precision, machine_precisions
from pase.costing.training import (
    NetworkStructure, TrainingCosting, TrainingOptions, TrainingSummary, RECOMPUTE_POLICIES, ZERO_STAGES,
)
from pase.core.checks import (
    a_bool, a_callable, a_mesh, a_network, a_recipe, a_rules, a_structure, a_training_options, an_engine, arguments,
    configurations, engine_sequence, non_negative_int, one_of, optional, positive_int, positive_number,
)
from pase.model.readers import READER_RULES
from pase.machines.registry import as_machine

__all__ = ["Candidate", "MeshSearch", "Priced", "search_meshes", "mesh_candidates", "evaluate_candidate", "tokens_of",
           "divisors", "CAUSES", "EngineRunsNone"]

#: The causes a step's time is told by, in the order they are shown: per-device compute,
#: recomputation, exposed activation collectives, redistribution between layers, pipeline
#: sends, the pipeline bubble, exposed weight synchronisation, the optimizer step.
CAUSES = ("compute", "recompute", "activation_comm", "redistribution", "p2p", "bubble", "weight_sync", "optimizer")


def divisors(n: int) -> list:
    """Divisors of ``n`` in increasing order.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tokens_of(network) -> int | None:
    """Tokens in one pass of ``network``: the elements of its first lookup's ids."""
    for layer in network.layers:
        if layer.lookup_table:
            return int(math.prod(layer.ids.shape))
    return None


class EngineRunsNone(ValueError):
    """None of the configurations searched runs on the engines kept to (``keep_to``)."""


@dataclass(frozen=True)
class Candidate:
    """One training configuration and what it costs: a mesh (or ``None`` for a per-layer
    plan), the options, the per-rank micro-batch, the layers' configurations and summary."""

    mesh: Mesh | None
    options: TrainingOptions
    microbatch: int | None
    configs: tuple
    summary: TrainingSummary
    memory_cap: float | None

    @property
    def fits(self) -> bool:
        return self.memory_cap is None or self.summary.peak_memory_bytes <= self.memory_cap

    def recipe(self) -> str:
        """The candidate in ``--recipe`` words."""
        o = self.options
        parts = []
        if self.mesh is not None:
            parts += [f"dp={self.mesh.dp}", f"tp={self.mesh.tp}"]
            if self.mesh.cp > 1:
                parts.append(f"cp={self.mesh.cp}")
            if self.mesh.ep > 1:
                parts.append(f"ep={self.mesh.ep}")
            if self.mesh.folded:
                parts.append(f"etp={self.mesh.expert_tp}")
            if self.mesh.pp > 1:
                pipe = self.summary.extra.get("pipeline", {})
                parts.append(f"pp={self.mesh.pp}")
                if pipe.get("schedule") == "interleaved":
                    parts += ["schedule=interleaved", f"vpp={pipe['vpp']}"]
            if self.mesh.tp > 1 and not self.mesh.sp:
                parts.append("sp=false")
        if o.tp_overlap:
            parts.append("tp_overlap=true")
        parts += [f"zero={o.zero}", f"recompute={o.recompute}"]
        if o.recompute == "block":
            parts.append(f"recompute_layers={o.recompute_layers}")
        if self.microbatch is not None:
            parts.append(f"microbatch={self.microbatch}")
        if o.precision != "bf16":  # the plan's number format, in the words engines' exports read
            parts.append(f"precision={o.precision}")
            if o.precision == "fp8":
                parts.append(f"scaling={o.fp8_scaling}")
            if o.fp8_gather:
                parts.append("fp8_gather=true")
        return ",".join(parts)

    def causes(self) -> dict:
        """The step time by cause (keys of :data:`CAUSES`, those that apply), summing to the
        step: a pipelined plan's is its slowest stage's work over all micro-batches, the
        bubble and the exposed synchronisation and optimizer step after it."""
        told = self.summary.extra.get("causes")
        if told is not None:
            return dict(told)
        return {k: float(self.summary.time.get(k, 0.0)) for k in CAUSES if k in self.summary.time}

    def memory_kinds(self) -> dict:
        """The peak memory per device by kind (a pipelined plan's: its largest stage's)."""
        return dict(self.summary.extra.get("memory_kinds", self.summary.memory))

    def as_recipe(self) -> Recipe:
        """Every choice of the candidate fixed (a mesh candidate's; ``ValueError`` for a
        per-layer plan, which no recipe describes)."""
        if self.mesh is None:
            raise ValueError("a per-layer plan has no recipe that fixes it")
        pipe = self.summary.extra.get("pipeline", {})
        mesh = self.mesh
        return Recipe(dp=mesh.dp, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, zero=self.options.zero,
                      recompute=self.options.recompute, microbatch=self.microbatch,
                      recompute_layers=self.options.recompute_layers or None,
                      schedule=pipe.get("schedule"), vpp=pipe.get("vpp") if pipe.get("schedule") == "interleaved"
                      else None, sp=mesh.sp if mesh.tp > 1 else None, ep=mesh.ep if mesh.ep > 1 else None,
                      etp=mesh.expert_tp if mesh.folded else None)


@dataclass(frozen=True)
class Priced:
    """One configuration the mesh search priced: its mesh and options, the per-rank
    micro-batch, the pipeline schedule and chunks (pipelined meshes), step and peak."""

    mesh: Mesh
    zero: int
    recompute: str
    microbatch: int
    schedule: str | None
    vpp: int
    step_seconds: float
    peak_memory_bytes: float
    #: Under ``recompute=block``: the blocks each pipeline chunk recomputes (0 otherwise).
    recompute_layers: int = 0

    def recipe(self) -> Recipe:
        """The configuration as a recipe fixing every choice."""
        mesh = self.mesh
        return Recipe(dp=mesh.dp, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, zero=self.zero, recompute=self.recompute,
                      recompute_layers=self.recompute_layers or None,
                      microbatch=self.microbatch, schedule=self.schedule,
                      vpp=self.vpp if self.schedule == "interleaved" else None,
                      sp=mesh.sp if mesh.tp > 1 else None, ep=mesh.ep if mesh.ep > 1 else None,
                      etp=mesh.expert_tp if mesh.folded else None)


@dataclass
class MeshSearch:
    """What :func:`search_meshes` found: the best fitting candidate (``None`` when nothing
    fits), the least-memory one, every candidate's count and the time taken."""

    best: Candidate | None
    least_memory: Candidate | None
    evaluated: int
    seconds: float
    networks: int
    space: str
    candidates: list = field(default_factory=list)
    #: Whether expert-parallel degrees were searched (the network has MoE layers).
    experts: bool = False
    #: With ``keep_best``: the fastest fitting candidates distinct in step and memory.
    fastest: list = field(default_factory=list)
    #: Whether ``recompute=block`` was tried with its block count searched.
    block_counts: bool = False


class _PartsMemo:
    """Layer parts and edge seconds shared by structurally equal layers (repeated blocks)."""

    def __init__(self, machine, procs: int):
        self.machine = machine
        self.procs = procs
        self.edges: dict = {}

    def edge_seconds(self, network, configs: Sequence[np.ndarray], kinds=None) -> np.ndarray:
        """Seconds of every edge's redistribution (forward and backward) per row: ``(E, K)``.
        ``kinds``: each layer's structure kind (``NetworkStructure.kinds``): layers of one kind
        given the very same configuration array share their tensors' configurations."""
        layers = network.layers
        kinds = kinds if kinds is not None else range(len(layers))
        tensors: dict = {}
        for layer, C, kind in zip(layers, configs, kinds):
            if (kind, id(C)) not in tensors:
                tensors[(kind, id(C))] = (layer.output_configs(C), layer.input_configs(C))
        outputs = [tensors[(kind, id(C))][0] for C, kind in zip(configs, kinds)]
        inputs = [tensors[(kind, id(C))][1] for C, kind in zip(configs, kinds)]
        rows = []
        targets = []
        # Edges between the same tensors' configuration arrays (repeated blocks) sum the same
        # seconds: each such edge is added up once.
        summed: dict = {}
        for (u, v), tensors in sorted(network.edges.items()):
            same = tuple((t.shape, id(outputs[u][t.output_index]), id(inputs[v][t.input_index])) for t in tensors)
            if same not in summed:
                total = 0.0
                for t in tensors:
                    src = np.ascontiguousarray(outputs[u][t.output_index])
                    dst = np.ascontiguousarray(inputs[v][t.input_index])
                    key = (t.shape, src.tobytes(), dst.tobytes())
                    if key not in self.edges:
                        self.edges[key] = edge_seconds(self.machine, t.shape, src, dst, self.procs)
                    total = total + self.edges[key]
                summed[same] = total
            rows.append(summed[same])
            targets.append(v)
        return np.array(rows).reshape(len(rows), -1), targets


#: Largest context-parallel degree searched unless a recipe names one (Megatron and
#: torchtitan runs use 2-16).
MAX_CP = 16


#: The one edge rule (``pase.model.builder``): a redistribution priced over the devices it spans.
edge_seconds = redistribution_seconds


def mesh_candidates(procs: int, machine, recipe: Recipe | None = None) -> list:
    """Every mesh of ``procs`` devices the search tries: ``tp`` within an NVLink domain (a node
    of 8 on HGX machines, 72 GPUs on an NVL72 rack; all devices on a flat machine), ``cp`` any
    divisor, sequence parallelism both ways when ``tp > 1``."""
    recipe = recipe or Recipe()
    node = machine.nvlink_domain or machine.devices_per_node or procs
    meshes = []
    for tp in divisors(procs):
        if tp > node or recipe.tp not in (None, tp):
            continue
        for cp in divisors(procs // tp):
            if recipe.cp not in (None, cp) or (recipe.cp is None and cp > MAX_CP):
                continue
            dp = procs // (tp * cp)
            if recipe.dp not in (None, dp):
                continue
            for sp in ((True, False) if tp > 1 else (True,)):
                if recipe.sp not in (None, sp) and tp > 1:
                    continue
                meshes.append(Mesh(dp=dp, tp=tp, cp=cp, sp=sp))
    return meshes


def expert_counts_of(network) -> list:
    """The expert counts of ``network``'s mixture-of-experts layers (empty: none)."""
    return sorted({layer.domain[roles.index("experts")] for layer in network.layers
                   for roles in [roles_of(layer)] if "experts" in roles})


def expert_degrees(dp: int, expert_counts: Sequence[int], recipe: Recipe) -> list:
    """Expert-parallel degrees tried with data parallelism ``dp``: the divisors of ``dp`` that
    divide every layer's expert count (just 1 without experts), or the recipe's ``ep``.

    >>> expert_degrees(16, [8], Recipe()), expert_degrees(16, [], Recipe())
    ([1, 2, 4, 8], [1])
    """
    if not expert_counts:
        return [1]
    return [ep for ep in divisors(dp) if all(n % ep == 0 for n in expert_counts) and recipe.ep in (None, ep)]


def expert_grids(mesh: Mesh, expert_counts: Sequence[int], recipe: Recipe) -> list:
    """``(ep, etp)`` pairs tried on ``mesh`` (``etp`` ``None``: ``tp``). Without a recipe's
    ``ep`` or ``etp``: :func:`expert_degrees` (``ep`` dividing ``dp``, experts split as the
    dense layers' ``tp``). A recipe's ``ep`` (and ``etp``, by default ``tp`` where ``ep``
    divides ``dp``, else 1) is priced under MoE parallel folding where ``ep x etp`` divides
    ``dp x cp x tp``, ``etp`` divides ``tp`` and ``ep`` every expert count; with ``etp < tp``
    only with sequence parallelism.

    >>> expert_grids(Mesh(4, 2), [256], Recipe(ep=8))
    [(8, 1)]
    >>> expert_grids(Mesh(4, 2, sp=False), [256], Recipe(ep=8))
    []
    """
    if recipe.ep is None or recipe.ep == 1 or (recipe.etp is None and mesh.dp % recipe.ep == 0):
        return [(ep, None) for ep in expert_degrees(mesh.dp, expert_counts, recipe)]
    ep = recipe.ep
    etp = recipe.etp if recipe.etp is not None else mesh.tp if mesh.dp % ep == 0 else 1
    if fold_refusal(mesh, expert_counts, ep, etp) is not None:
        return []
    return [(ep, None if etp == mesh.tp else etp)]


#: Recomputation policies searched when a recipe names none and no engine is given: ``op``
#: (torchtitan's operator policy) and ``block`` (Megatron's) are priced when a recipe or an
#: engine that runs them (``recompute_policies``) asks for them.
SEARCHED_POLICIES = tuple(p for p in RECOMPUTE_POLICIES if p not in ("op", "block"))


def options_grid(recipe: Recipe, engine=None) -> list:
    """``(zero, recompute)`` pairs the search tries: the recipe's, else every ZeRO stage and the
    engine's recomputation policies (:data:`SEARCHED_POLICIES` without an engine)."""
    zeros = [recipe.zero] if recipe.zero is not None else list(ZERO_STAGES)
    searched = SEARCHED_POLICIES if engine is None else engine.searched()["recompute"]
    policies = [recipe.recompute] if recipe.recompute is not None else list(searched)
    return [(z, r) for z in zeros for r in policies]


def overlap_choices(recipe: Recipe, base: TrainingOptions, engine=None) -> tuple:
    """``tp_overlap`` values tried: the recipe's, else both where the engine overlaps
    tensor-parallel communication (``searched()``), else the base options'."""
    if recipe.tp_overlap is not None:
        return (recipe.tp_overlap,)
    if engine is not None:
        return tuple(engine.searched()["tp_overlap"])
    return (base.tp_overlap,)


@arguments(build=a_callable, batch=positive_int, procs=positive_int, machine=as_machine,
           memory_cap=optional(positive_number), act_bytes=positive_number, recipe=optional(a_recipe),
           base=optional(a_training_options), engine=optional(an_engine), keep_best=non_negative_int,
           rules=optional(a_rules), keep_to=engine_sequence, exporting=a_bool)
def search_meshes(
    build: Callable[[int], object],
    batch: int,
    procs: int,
    machine,
    memory_cap: float | None,
    act_bytes: float,
    recipe: Recipe | None = None,
    base: TrainingOptions | None = None,
    keep_all: bool = False,
    rebuild: bool = True,
    engine=None,
    keep_best: int = 0,
    keep_to: tuple = (),
    exporting: bool = False,
    rules: ParallelRules | None = None,
) -> MeshSearch:
    """The fastest fitting mesh plan of a network of ``batch`` sequences on ``procs`` devices.

    ``build(micro)`` returns the network at a global micro-batch of ``micro`` sequences
    (with ``rebuild`` false, only ``build(batch)``: one micro-batch per step).
    Exact over: every mesh of :func:`mesh_candidates`, every ZeRO stage and recomputation
    policy, every per-rank micro-batch dividing ``batch / dp``, under the recipe's fixed
    choices, priced for ``engine`` (an engine profile); with ``keep_to`` (engine profiles), only
    the configurations every one of them runs (and, ``exporting``, its file can say:
    :mod:`pase.planning.engine_runs`). ``rules``: the parallel rules mapping a mesh onto each
    layer's roles (default :func:`pase.planning.rules.default_rules`). Raises ``ValueError``
    when no mesh applies (with why, for the first).

    ``keep_all``: every configuration priced in ``candidates`` (``Priced``). ``keep_best``:
    the fastest fitting configurations distinct in step and memory, at most that many, in
    ``fastest`` (fastest first; equal step and memory: the first recipe in text order).
    """
    rules = rules if rules is not None else default_rules()
    start = time.perf_counter()
    recipe = recipe or Recipe()
    base = base or (engine.base_options(machine) if engine is not None else TrainingOptions())
    recipe.check(procs)
    domain = machine.nvlink_domain or machine.devices_per_node
    if recipe.tp is not None and domain is not None and recipe.tp > domain:
        raise ValueError(f"tp={recipe.tp} is more than the {domain} GPUs of one NVLink domain of machine "
                         f"{machine.name}: tensor parallelism stays within a domain")
    if recipe.precision == "search":
        return _search_precisions(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, keep_all, rebuild,
                                  engine, keep_best, keep_to, exporting, rules)
    base = with_precision(base, recipe, machine)
    overlaps = overlap_choices(recipe, base, engine)
    if overlaps == (True,) and recipe.sp is None:  # Megatron's overlap needs sequence parallelism
        recipe = Recipe(**{**recipe.fixed(), "sp": True})
    if recipe.vpp is not None and recipe.schedule == "1f1b":
        raise ValueError("vpp (virtual stages) needs schedule=interleaved")
    schedules = [recipe.schedule] if recipe.schedule else (["interleaved"] if recipe.vpp else list(SCHEDULES))
    # A fixed schedule or interleaving describes a pipeline: it asks for one (pp > 1).
    pipelined = recipe.schedule is not None or recipe.vpp is not None
    if pipelined and recipe.pp == 1:
        raise ValueError("schedule and vpp describe a pipeline, and the recipe has pp=1")
    stage_counts = [pp for pp in divisors(procs) if recipe.pp in (None, pp) and (pp > 1 or not pipelined)]
    if not stage_counts:
        raise ValueError(f"schedule and vpp describe a pipeline, and {procs} device{'s' if procs > 1 else ''} "
                         "cannot hold two stages")
    # Tensor parallelism maps onto the roles the rules give it (heads, MLP width, vocabulary):
    # a graph whose layers have none gets data, context and pipeline parallelism only.
    probe = build(batch)
    for profile in keep_to:
        check_engine(profile, probe)
        why = None if recipe.recompute is None else policy_refusal(profile, recipe.recompute)
        if why is not None:  # the recipe's policy, which no configuration escapes: said first
            raise EngineRunsNone(f"none of the configurations searched runs on {profile.name} (recompute="
                                 f"{recipe.recompute}: {why})")
        kept = profile.runs.get("schedules")
        if exporting and "schedules" in profile.runs.get("export", {}):
            kept = profile.runs["export"]["schedules"]
        if kept is not None:  # the pipeline schedules the engine has (its file can say)
            schedules = [x for x in schedules if x in kept]
    tensor_parallel = rules.tensor_parallel(probe)
    if not tensor_parallel and recipe.tp not in (None, 1):
        raise ValueError(f"tp={recipe.tp}: tensor parallelism splits the dimension roles "
                         f"{', '.join(rules.tensor_roles())}, which no layer of graph {probe.name} has "
                         "(roles are declared by the graph's source: pase.model.roles)")
    if not tensor_parallel:
        recipe = Recipe(**{**recipe.fixed(), "tp": 1})
    probe_layout = stage_layout(NetworkStructure.of(probe).blocks)
    blocks = None if probe_layout is None else len(probe_layout.blocks)
    refusal = recipe_refusal(recipe, batch, blocks)
    if refusal is not None:
        raise ValueError(f"no mesh applies to this graph: {refusal}")
    expert_counts = expert_counts_of(probe)
    if not expert_counts and recipe.ep not in (None, 1):
        raise ValueError(f"ep={recipe.ep}: graph {probe.name} has no mixture-of-experts layer to split")
    # ``block`` without a recipe's count: every count searched per candidate (no blocks: not tried).
    search_block = recipe.recompute_layers is None
    grid = [(z, r, o) for z, r in options_grid(recipe, engine) for o in overlaps
            if r != "block" or blocks or not search_block]
    networks: dict = {}
    best = least = None
    evaluated = 0
    first_error = None
    engine_refused = None
    kept = []
    fastest: list = []
    meshes_tried = 0
    dps_tried: set = set()
    fold_refused = None  # why a recipe's ep folds onto no mesh tried (MoE parallel folding)
    # 1. In search order (stage counts, then global micro-batches): the meshes that apply, the
    #    layout checks and the errors met, as the search meets them.
    entries = []  # (pp, q, global micro-batch, meshes with their micro-batch, their kind configurations)
    errors = []  # (where in the search order, error): the first met is told
    for a, pp in enumerate(stage_counts):
        q = procs // pp
        candidates = mesh_candidates(q, machine, recipe)
        dps_tried.update(m.dp for m in candidates)
        meshes = [Mesh(m.dp, m.tp, m.cp, pp, m.sp, ep, etp) for m in candidates
                  if batch % m.dp == 0 for ep, etp in expert_grids(m, expert_counts, recipe)]
        if recipe.ep is not None and recipe.ep > 1 and not meshes and fold_refused is None:
            fold_refused = next((why for m in candidates if batch % m.dp == 0 for why in [
                fold_refusal(m, expert_counts, recipe.ep,
                             recipe.etp if recipe.etp is not None else m.tp if m.dp % recipe.ep == 0 else 1)]
                if why is not None), None)
        meshes_tried += len(meshes)
        # Group meshes by the global micro-batch their micro-batch sizes give: one network each.
        by_micro: dict = {}
        for mesh in meshes:
            local = batch // mesh.dp
            for micro in divisors(local) if rebuild else [local]:
                if recipe.microbatch not in (None, micro):
                    continue
                if pp > 1 and local // micro < 1:
                    continue
                by_micro.setdefault(micro * mesh.dp, []).append((mesh, micro))
        for b, global_micro in enumerate(sorted(by_micro)):
            if global_micro not in networks:
                net = build(global_micro)
                networks[global_micro] = (net, NetworkStructure.of(net), MeshMapper(net, rules))
            network, structure, mapper = networks[global_micro]
            rows, valid = [], []
            for mesh, micro in by_micro[global_micro]:
                try:
                    rows.append(mapper.kind_configs(mesh))
                except ValueError as err:
                    errors.append(((a, b, 0), err))
                    continue
                valid.append((mesh, micro))
            if not valid:
                continue
            layout = stage_layout(structure.blocks) if pp > 1 else None
            if pp > 1 and (layout is None or len(layout.blocks) < pp):
                errors.append(((a, b, 1), ValueError(
                    f"{pp} pipeline stages need at least {pp} repeated blocks in order")))
                continue
            if recipe.stages is not None and sum(recipe.stages) != len(layout.blocks):
                raise ValueError(f"recipe stages {'/'.join(map(str, recipe.stages))} hold {sum(recipe.stages)} "
                                 f"blocks; graph {network.name} has {len(layout.blocks)}")
            entries.append((pp, q, global_micro, valid, rows, layout))
    first_error = min(errors, key=lambda e: e[0])[1] if errors else None
    # 2. Network by network: one costing of every mesh that runs it (all stage counts), its
    #    rows priced once; each (stage count, micro-batch)'s columns taken from it.
    priced: dict = {}
    memos = {pp: _PartsMemo(machine, procs // pp) for pp in stage_counts}
    for global_micro in sorted({e[2] for e in entries}):
        network, structure, mapper = networks[global_micro]
        mine = [e for e in entries if e[2] == global_micro]
        rows = [r for e in mine for r in e[4]]
        # One array per kind of layer (MeshMapper), shared by the layers of that kind.
        by_kind = {k: np.array([r[k] for r in rows], dtype=np.int64) for k in rows[0]}
        costing = TrainingCosting(network, [by_kind[k] for k in mapper.index], machine, structure)
        halved = np.array([mapper.sequence_parallel(mesh) for e in mine for mesh, _ in e[3]]).T
        costing.activation_scale = np.where(halved, 0.5, 1.0)
        tokens = tokens_of(network)
        m = batch // global_micro
        # A searched block count stands as every block until the pricing picks one per candidate.
        settings = [base.but(zero=zero, recompute=policy, microbatches=m, tp_overlap=overlap,
                             recompute_layers=0 if policy != "block" else recipe.recompute_layers or blocks or 1)
                    for zero, policy, overlap in grid]
        searched_counts = [policy == "block" and search_block for _, policy, _ in grid]
        offset = 0
        for pp, q, _, valid, _, layout in mine:
            columns = np.arange(offset, offset + len(valid))
            offset += len(valid)
            part = {k: np.ascontiguousarray(c[columns]) for k, c in by_kind.items()}
            edges, targets = memos[pp].edge_seconds(network, [part[k] for k in mapper.index], structure.kinds)
            if pp > 1:  # every setting's pipelines in one pass over the cuts
                # Block recomputation on pipelines where a recipe asks for it: its count search over
                # every cut, schedule and chunk count made the free search of Llama 3.1 70B on 256
                # GPUs half as long again (benchmarks/results/foundation_speed.md); without stages
                # it is one chunk, and cheap.
                keep = [j for j, o in enumerate(settings) if o.recompute != "block" or recipe.recompute == "block"]
                got = pipeline_rows_settings(costing, [settings[j] for j in keep], act_bytes, edges, targets, pp, q,
                                             layout, memory_cap, schedules,
                                             None if recipe.vpp is None else [recipe.vpp], recipe.stages,
                                             columns=columns, search_layers=[searched_counts[j] for j in keep])
                results = [(np.full(len(valid), np.inf), np.full(len(valid), np.inf), [None] * len(valid))] * len(settings)
                for j, found in zip(keep, got):
                    results[j] = found
                results = [(step, peak, plans, [0 if p is None else p.recompute_layers for p in plans])
                           for step, peak, plans in results]
            else:
                sums: dict = {}
                results = []
                for options, searched in zip(settings, searched_counts):
                    time_rows, memory_rows, layers = _totals(costing, options, act_bytes, edges, targets, sums, columns,
                                                             memory_cap, searched)
                    results.append((time_rows, memory_rows, [None] * len(valid), layers))
            priced[(pp, global_micro)] = (costing, columns, edges, tokens, settings, results)
        costing.forget()  # what the search kept is priced again, if asked for, from here
    # 3. In search order: every configuration's step and peak, the best kept.
    for pp, q, global_micro, valid, _, _ in entries:
        costing, columns, edges, tokens, settings, results = priced[(pp, global_micro)]
        for (zero, policy, overlap), setting, (time_rows, memory_rows, stage_plans, counts) in zip(grid, settings,
                                                                                                  results):
            for i, (mesh, micro) in enumerate(valid):
                options = setting.but(recompute_layers=int(counts[i])) if policy == "block" and counts[i] else setting
                if keep_to:
                    why = next((f"{p.name}: {r}" for p in keep_to
                                if (r := mesh_refusal(p, mesh, options, export=exporting)) is not None), None)
                    if why is not None:
                        engine_refused = engine_refused or why
                        continue
                if pp > 1 and stage_plans[i] is None:
                    continue
                # Overlapping tensor-parallel communication needs tensor parallelism with
                # sequence parallelism; searched (not fixed), it is tried only there.
                if overlap and len(overlaps) > 1 and not (mesh.tp > 1 and mesh.sp):
                    continue
                if overlap and len(overlaps) == 1 and mesh.tp > 1 and not mesh.sp:
                    continue
                evaluated += 1
                t, peak = float(time_rows[i]), float(memory_rows[i])
                found = (t, peak, costing, options, i, mesh, micro, tokens, edges, stage_plans[i], q, columns)
                if (memory_cap is None or peak <= memory_cap) and (best is None or t < best[0]):
                    best = found
                if least is None or peak < least[1]:
                    least = found
                if keep_all or (keep_best and (memory_cap is None or peak <= memory_cap)):
                    plan = stage_plans[i]
                    priced_one = Priced(mesh, zero, policy, micro, None if plan is None else plan.schedule,
                                        1 if plan is None else plan.vpp, t, peak, options.recompute_layers)
                    if keep_all:
                        kept.append(priced_one)
                    if keep_best and (memory_cap is None or peak <= memory_cap):
                        _offer(fastest, keep_best, priced_one, found)
    if best is None and least is None:
        if engine_refused is not None:
            raise EngineRunsNone(f"none of the configurations searched runs on {' and '.join(p.name for p in keep_to)} "
                             f"(for one: {engine_refused})")
        tokens = tokens_of(probe)
        reason = (occupancy_refusal(probe, batch, procs, machine, recipe, blocks,
                                    tokens // batch if tokens and batch else None, MAX_CP, rules)
                  or microbatch_refusal(recipe, batch, dps_tried) or fold_refused or first_error
                  or (f"batch {batch} is not divisible by any dp tried ({', '.join(map(str, sorted(dps_tried)))})"
                      if dps_tried else "no mesh of these degrees"))
        raise ValueError(f"no mesh applies to this graph: {reason}")
    space = (f"{meshes_tried} meshes x {len(grid)} ZeRO/recompute settings x micro-batch sizes; "
             f"{evaluated} configurations")
    result = MeshSearch(
        best=_materialise(best, memory_cap, act_bytes, procs) if best else None,
        least_memory=_materialise(least, memory_cap, act_bytes, procs) if least else None,
        evaluated=evaluated,
        seconds=time.perf_counter() - start,
        networks=len(networks),
        space=space,
        candidates=kept,
        experts=bool(expert_counts),
        fastest=[_materialise(found, memory_cap, act_bytes, procs) for *_, found in fastest],
        block_counts=search_block and any(policy == "block" for _, policy, _ in grid),
    )
    return result


def _offer(fastest: list, k: int, priced: Priced, found: tuple) -> None:
    """Keep ``fastest`` the ``k`` fastest configurations distinct in step (to the nanosecond)
    and peak (to the byte), as ``(step, peak, recipe text, found)`` in order; of two equal in
    both, the first recipe in text order."""
    if len(fastest) >= k and (priced.step_seconds, priced.peak_memory_bytes) > fastest[-1][:2]:
        return
    figures = (round(priced.step_seconds, 9), round(priced.peak_memory_bytes))
    entry = (priced.step_seconds, priced.peak_memory_bytes, priced.recipe().text(), found)
    for j, (t, peak, text, _) in enumerate(fastest):
        if (round(t, 9), round(peak)) == figures:
            if entry[2] < text:
                fastest[j] = entry
                fastest.sort(key=lambda e: e[:3])
            return
    fastest.append(entry)
    fastest.sort(key=lambda e: e[:3])
    del fastest[k:]


def with_precision(base: TrainingOptions, recipe: Recipe, machine) -> TrainingOptions:
    """``base`` with the recipe's number format, FP8 scaling and FP8 gathers; ``ValueError``
    when the machine does not run that format."""
    fields = {"precision": recipe.precision, "fp8_scaling": recipe.scaling, "fp8_gather": recipe.fp8_gather}
    fields = {k: v for k, v in fields.items() if v is not None}
    options = base.but(**fields) if fields else base
    check_precision(machine, options.precision)
    return options


def _search_precisions(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, keep_all, rebuild,
                       engine=None, keep_best: int = 0, keep_to: tuple = (), exporting: bool = False, rules=None):
    """``precision=search``: :func:`search_meshes` in every format the machine runs (FP8 at the
    recipe's scaling, else the options'), the fastest fitting plan of all."""
    runs, refused, formats = [], [], []
    for precision in machine_precisions(machine):
        fixed = {**recipe.fixed(), "precision": precision}
        if precision != "fp8":
            fixed.pop("scaling", None)
        try:
            runs.append(search_meshes(build, batch, procs, machine, memory_cap, act_bytes, Recipe(**fixed), base,
                                      keep_all, rebuild, engine=engine, keep_best=keep_best, keep_to=keep_to,
                                      exporting=exporting, rules=rules))
            formats.append(precision)
        except EngineRunsNone as err:  # a format the engine (or its file) has no setting for: the others
            refused.append(err)
    if not runs:
        raise refused[0]
    fitting = [r.best for r in runs if r.best is not None]
    least = [r.least_memory for r in runs if r.least_memory is not None]
    return MeshSearch(
        best=min(fitting, key=lambda c: c.summary.step_seconds) if fitting else None,
        least_memory=min(least, key=lambda c: c.summary.peak_memory_bytes) if least else None,
        evaluated=sum(r.evaluated for r in runs),
        seconds=sum(r.seconds for r in runs),
        networks=max(r.networks for r in runs),
        space=f"{runs[0].space}; in each of {len(runs)} number formats ({', '.join(formats)})",
        candidates=[c for r in runs for c in r.candidates],
        experts=runs[0].experts,
        block_counts=any(r.block_counts for r in runs),
        fastest=sorted((e for r in runs for e in r.fastest), key=lambda e: e[:3])[:keep_best],
    )


def _totals(costing: TrainingCosting, options: TrainingOptions, act_bytes: float, edges: np.ndarray,
            targets: list, sums: dict | None = None, columns=None, memory_cap=None,
            search_layers: bool = False) -> tuple:
    """Step seconds, peak bytes and ``recompute_layers`` of every row (all layers at the same
    row) of ``columns`` (the costing's rows that ``edges`` has; default all). ``sums``: the
    columns taken and their sums already, by array (settings share the arrays of what they do
    not change). Under ``block``: :func:`_block_totals`."""
    sums = {} if sums is None else sums
    if options.recompute == "block":
        return _block_totals(costing, options, act_bytes, edges, targets, sums, columns, memory_cap, search_layers)

    def taken(array):
        if ("taken", id(array)) not in sums:
            # In row order (C-contiguous), as a costing of those rows alone has them: sums over
            # the layers then add in the same order.
            sums[("taken", id(array))] = (array if columns is None else np.ascontiguousarray(array[:, columns]), array)
        return sums[("taken", id(array))][0]

    def total(array):
        if id(array) not in sums:
            sums[id(array)] = (array.sum(axis=0), array)
        return sums[id(array)][0]

    vec = {name: taken(array) for name, array in costing.layer_vectors(options, act_bytes).items()}
    time_rows = total(vec["micro"]) * options.microbatches + total(vec["step"])
    if len(targets):
        time_rows = time_rows + total(costing.edge_rows(edges, targets, options, columns))
    memory_rows = (total(vec["state"]) + total(vec["activations"]) + total(vec["logits"])
                   + costing.transient_rows(vec, options))
    return time_rows, memory_rows, np.zeros(len(time_rows), dtype=np.int64)


def _block_totals(costing: TrainingCosting, options: TrainingOptions, act_bytes: float, edges: np.ndarray,
                  targets: list, sums: dict, columns, memory_cap, search_layers: bool) -> tuple:
    """:func:`_totals` under ``recompute=block`` without a pipeline: the network's blocks one
    chunk, its first ``n`` recomputed: the ``none`` totals plus the first ``n`` blocks' deltas
    (``TrainingCosting.block_deltas``: ``m`` times the micro-batch's, the bytes kept) and the
    largest working set among them. ``n`` is ``recompute_layers`` (at most the blocks), or with
    ``search_layers`` every count from 1 to the blocks, keeping per row the fastest that fits
    ``memory_cap``, else the least memory; of equals the smallest ``n``."""
    time0, memory0, _ = _totals(costing, options.as_policy("none"), act_bytes, edges, targets, sums, columns)
    deltas = costing.block_deltas(options, act_bytes, edges, targets, columns)
    blocks = len(deltas["micro"])
    if not blocks:  # nothing to recompute: as none
        return time0, memory0, np.full(len(time0), options.recompute_layers, dtype=np.int64)
    times = time0 + options.microbatches * np.cumsum(deltas["micro"], axis=0)  # (n, K): n = 1, 2, ...
    memories = memory0 + np.cumsum(deltas["activations"], axis=0) + np.maximum.accumulate(deltas["working"], axis=0)
    columns_of = np.arange(len(time0))
    if not search_layers:
        n = np.full(len(time0), min(options.recompute_layers, blocks) - 1)
    else:
        cap = np.inf if memory_cap is None else memory_cap
        fits = memories <= cap
        n = np.where(fits.any(axis=0), np.argmin(np.where(fits, times, np.inf), axis=0), np.argmin(memories, axis=0))
    return times[n, columns_of], memories[n, columns_of], n + 1


def _materialise(found, memory_cap, act_bytes, procs) -> Candidate:
    step, peak, costing, options, i, mesh, micro, tokens, edges, stages, q, columns = found
    n = len(costing.network.layers)
    row = int(columns[i])  # the costing's row; i is the column of edges and of the search's totals
    choice = [row] * n
    targets = [v for (_, v) in sorted(costing.network.edges)]
    # Every row priced, then row i taken: the overlap a row's target layers leave is that row's.
    moved = float(costing.edge_rows(edges, targets, options, columns)[:, i].sum()) if len(targets) else 0.0
    summary = costing.summarize(choice, options, act_bytes, moved, procs,
                                None if tokens is None else tokens * options.microbatches)
    if stages is not None:
        slowest = max(stages.microbatch_seconds)
        fill = (stages.pp - 1) / stages.vpp
        summary.time = {
            "pipeline": options.microbatches * slowest,
            "bubble": fill * slowest,
            "sync_and_optimizer": stages.step_seconds - (options.microbatches + fill) * slowest,
        }
        summary.memory = {"largest_stage": float(peak)}
        summary.step_seconds = float(step)
        summary.peak_memory_bytes = float(peak)
        summary.extra["causes"] = _stage_causes(costing, options, i, edges, stages, float(step), columns)
        summary.extra["memory_kinds"] = _stage_memory(costing, options, row, act_bytes, stages)
        summary.extra["pipeline"] = {
            "pp": stages.pp, "schedule": stages.schedule, "vpp": stages.vpp, "microbatches": options.microbatches,
            "bubble_fraction": stages.bubble_fraction, "p2p_seconds_per_microbatch": stages.p2p_seconds,
            "stages": [{"stage": s, "blocks": c, "devices": [s * q, (s + 1) * q - 1],
                        "microbatch_seconds": t, "memory_bytes": mem}
                       for s, (c, t, mem) in enumerate(zip(stages.counts, stages.microbatch_seconds,
                                                             stages.memory_bytes))],
        }
    configs = tuple(tuple(int(x) for x in costing.configs[v][row]) for v in range(n))
    return Candidate(mesh, options, micro, configs, summary, memory_cap)


def _chunks(stages) -> tuple:
    """Blocks per pipeline chunk in order: each stage's ``vpp`` chunks (``stage_chunks``, as
    ``pipeline_rows`` prices ``recompute=block``)."""
    return tuple(c for chunks in stage_chunks(stages.counts, stages.vpp) for c in chunks)


def _per_layer(costing, options: TrainingOptions, stages) -> list:
    """Each layer's options on a pipeline: under ``block``, ``full`` for the layers of the
    blocks each chunk recomputes and ``none`` for the others; else ``options`` throughout."""
    n = len(costing.network.layers)
    if options.recompute != "block":
        return [options] * n
    again = costing.recomputed_mask(options, _chunks(stages))
    full, none = options.as_policy("full"), options.as_policy("none")
    return [full if again[v] else none for v in range(n)]


def _edge_rows(costing, edges, targets, options: TrainingOptions, columns, stages):
    """``costing.edge_rows`` on a pipeline: under ``block``, each edge's as its target's
    options (:func:`_per_layer`) price it."""
    if options.recompute != "block":
        return costing.edge_rows(edges, targets, options, columns)
    again = costing.recomputed_mask(options, _chunks(stages))[np.asarray(targets, dtype=np.int64)]
    full = costing.edge_rows(edges, targets, options.as_policy("full"), columns)
    none = costing.edge_rows(edges, targets, options.as_policy("none"), columns)
    return np.where(again[:, None], full, none)


def _stage_range(costing, stages, s: int) -> tuple:
    """The layers ``[start, end)`` of pipeline stage ``s`` (as ``pipeline_rows`` cuts them)."""
    layout = stage_layout(costing.blocks)
    bounds = np.cumsum((0,) + tuple(stages.counts))
    block_starts = [b[0] for b in layout.blocks]
    start = 0 if s == 0 else block_starts[bounds[s]]
    end = len(costing.network.layers) if s == stages.pp - 1 else block_starts[bounds[s + 1]]
    return start, end


def _stage_memory(costing, options: TrainingOptions, i: int, act_bytes: float, stages) -> dict:
    """The largest stage's peak by kind (as ``pipeline_rows`` adds it up): its model state,
    its activations times the micro-batches in flight on it, its logits, and the memory alive
    part of the time (ZeRO-3's gathered weights, the recomputed block) and the reserve."""
    s = int(np.argmax(stages.memory_bytes))
    start, end = _stage_range(costing, stages, s)
    pp, m = stages.pp, options.microbatches
    in_flight = min(pp - s, m) * ((1.0 + (pp - 1) / (pp * stages.vpp)) if stages.vpp > 1 else 1.0)
    kinds = dict.fromkeys(("model_state", "activations", "logits"), 0.0)
    per_layer = _per_layer(costing, options, stages)
    for v in range(start, end):
        for key, value in costing.layer_memory(v, per_layer[v], act_bytes).items():
            kinds[key] = kinds.get(key, 0.0) + float(value[i])
    kinds["activations"] *= in_flight
    if "fragmentation" in kinds:  # the allocator's share of the short-lived bytes in flight
        kinds["fragmentation"] = options.fragmentation * (kinds["activations"] + kinds["logits"])
    chunks = _chunks(stages) if options.recompute == "block" else None
    kinds.update(costing.transient_bytes([i] * len(costing.network.layers), options, act_bytes, chunks))
    kinds["reserve"] = float(options.reserve_bytes)
    return kinds


def _stage_causes(costing, options: TrainingOptions, i: int, edges: np.ndarray, stages, step: float,
                  columns=None) -> dict:
    """A pipelined row's step by cause: the slowest stage's compute, recomputation, activation
    collectives, redistribution and sends over the ``m`` micro-batches; the bubble
    ``(pp - 1) / vpp`` slots of it; the rest of the step (the exposed synchronisation and
    optimizer step after the drain), the slowest stage's optimizer step first."""
    m = options.microbatches
    s = int(np.argmax(stages.microbatch_seconds))
    slowest = stages.microbatch_seconds[s]
    start, end = _stage_range(costing, stages, s)
    causes = dict.fromkeys(CAUSES, 0.0)
    optimizer = 0.0
    row = i if columns is None else int(columns[i])  # i: the column of edges; row: the costing's
    per_layer = _per_layer(costing, options, stages)
    for v in range(start, end):
        part = costing.layer_time(v, per_layer[v])
        for key in ("compute", "recompute", "activation_comm"):
            causes[key] += float(part[key][row])
        optimizer += float(part["optimizer"][row])
    targets = [v for (_, v) in sorted(costing.network.edges)]
    if targets:
        rows = _edge_rows(costing, edges, targets, options, columns, stages)[:, i]
        causes["redistribution"] = float(sum(r for r, v in zip(rows, targets) if start <= v < end))
    causes["p2p"] = m * stages.p2p_seconds
    causes["bubble"] = (stages.pp - 1) / stages.vpp * slowest
    rest = max(step - (m + (stages.pp - 1) / stages.vpp) * slowest, 0.0)
    causes["optimizer"] = min(optimizer, rest)
    causes["weight_sync"] = rest - causes["optimizer"]
    return causes


@arguments(network=a_network, configs=configurations, procs=positive_int, machine=as_machine,
           options=a_training_options, act_bytes=positive_number, memory_cap=optional(positive_number),
           mesh=optional(a_mesh), microbatch=optional(positive_int), rules=optional(a_rules),
           structure=optional(a_structure), readers=optional(one_of(READER_RULES)))
def evaluate_candidate(network, configs, procs: int, machine, options: TrainingOptions, act_bytes: float,
                       memory_cap: float | None = None, mesh: Mesh | None = None,
                       microbatch: int | None = None, rules: ParallelRules | None = None,
                       structure: NetworkStructure | None = None, readers: str | None = None) -> Candidate:
    """A given strategy (one configuration per layer of the micro-batch network) priced under
    ``options``: the same numbers the searches compute. ``structure``: the network's, if known.
    ``readers``: the reader rule (``TrainingCosting``); by default the searches' own:
    ``"summed"`` for a mesh's strategy (``mesh`` given), ``"each"`` for a per-layer one."""
    if len(configs) != len(network.layers):
        raise ValueError(f"configs has {len(configs)} configurations, network {network.name!r} has "
                         f"{len(network.layers)} layers")
    readers = readers if readers is not None else "each" if mesh is None else "summed"
    priced = _strategy_costing(network, configs, procs, machine, mesh, rules, structure, readers)
    return _evaluated(priced, configs, procs, options, act_bytes, memory_cap, mesh, microbatch)


def _strategy_costing(network, configs, procs: int, machine, mesh=None, rules=None, structure=None,
                      readers: str = "summed") -> tuple:
    """``(costing, edge seconds, edge targets, network)`` of one strategy (one row per layer),
    for :func:`_evaluated` under any options."""
    rows = [np.asarray([c], dtype=np.int64) for c in configs]
    costing = TrainingCosting(network, rows, machine, structure, readers=readers)
    if mesh is not None:
        halved = MeshMapper(network, rules).sequence_parallel(mesh)
        costing.activation_scale = np.where(np.array(halved)[:, None], 0.5, 1.0)
    edges, targets = _PartsMemo(machine, procs).edge_seconds(network, rows)
    return costing, edges, targets, network


def _evaluated(priced: tuple, configs, procs: int, options: TrainingOptions, act_bytes: float, memory_cap,
               mesh, microbatch) -> Candidate:
    """:func:`evaluate_candidate` from the strategy's :func:`_strategy_costing`."""
    costing, edges, targets, network = priced
    moved = float(costing.edge_rows(edges, targets, options).sum()) if len(targets) else 0.0
    tokens = tokens_of(network)
    summary = costing.summarize([0] * len(configs), options, act_bytes, moved, procs,
                                None if tokens is None else tokens * options.microbatches)
    return Candidate(mesh, options, microbatch, tuple(tuple(int(x) for x in c) for c in configs), summary,
                     memory_cap)


# ---------------------------------------------------------------------------------------
# The per-layer search under one training option set


@dataclass(frozen=True)
class FreeSearch:
    """What :func:`search_free` found: the candidate (``None`` when nothing fits), the
    dynamic programme's optimum of the additive objective, and the work done."""

    candidate: Candidate | None
    optimum: float | None
    table_entries: int
    searches: int
    seconds: float
    status: str


class TrainingGraphs:
    """The per-layer search's pieces for one network (built at one micro-batch) on ``procs``
    devices, built once and priced under any :class:`TrainingOptions`: the enumerated
    configurations and graph (``Network.graph``, which also refuses tables over ``budget``),
    the layer parts (:class:`TrainingCosting`) and every distinct edge's redistribution seconds.
    ZeRO, recomputation and micro-batches then change only the vectors and the factors on the
    edges (:meth:`graph`). Rows of different layers are unrelated here, and pairwise tables
    cannot say that three readers share one gather: the per-layer search prices each reader's
    gradient reduction and gather itself (the reader rule ``"each"``, ``docs/training.md``), as
    the strategy it finds is then priced."""

    def __init__(self, network, procs: int, machine, budget=None):
        self.network = network
        self.procs = procs
        self.machine = machine
        #: Costings of the strategies found, by their configurations (``search_free``).
        self.strategies: dict = {}
        self.skeleton = network.with_readers("each").graph(procs, machine, budget=budget)
        self.configs = [self.skeleton.nodes[v]["configs"] for v in range(len(network.layers))]
        self.costing = TrainingCosting(network, self.configs, machine, readers="each")
        self.costing.keep_every_layer()  # priced under every ZeRO stage and recomputation policy
        layers = network.layers
        outputs = [layer.output_configs(C) for layer, C in zip(layers, self.configs)]
        inputs = [layer.input_configs(C) for layer, C in zip(layers, self.configs)]
        #: Per edge, the keys of its tensors' matrices; per key, the matrix (seconds of one
        #: micro-batch's redistribution, forward and backward).
        self.edge_keys: dict = {}
        self.matrices: dict = {}
        for u, v, data in self.skeleton.edges(data=True):
            keys = []
            for t in data["tensors"]:
                src, dst = outputs[u][t.output_index], inputs[v][t.input_index]
                key = (t.shape, src.tobytes(), dst.tobytes())
                if key not in self.matrices:
                    self.matrices[key] = edge_seconds(machine, t.shape, src[:, None, :], dst[None, :, :], procs)
                keys.append(key)
            self.edge_keys[(u, v)] = keys

    def graph(self, options: TrainingOptions, act_bytes: float):
        """``(graph, memory vectors)``: the costed graph whose layer vectors and edge matrices
        are the training configuration's (``options``), for the exact search."""
        costing = self.costing
        H = self.skeleton.copy()
        # Equal vectors are given as one array (the block search then compares copies of a
        # block by identity).
        seen: dict = {}
        for v in H.nodes:
            cost = costing.cost_vector(v, options)
            H.nodes[v]["cost"] = seen.setdefault((cost.shape, cost.tobytes()), cost)
        memo: dict = {}
        for u, v, data in H.edges(data=True):
            factor = costing.edge_factor(v, options)
            matrix = 0.0
            for key in self.edge_keys[(u, v)]:
                if (key, factor) not in memo:
                    scaled = factor * self.matrices[key]
                    scaled.setflags(write=False)
                    memo[(key, factor)] = scaled
                matrix = matrix + memo[(key, factor)]
            if options.tp_overlap:
                # The redistribution into v hides behind what v's own collectives leave of its compute.
                matrix = np.maximum(matrix - options.microbatches * costing.overlap_leftover(v, options)[None, :], 0.0)
            data["cost"] = matrix
        memory = {}
        for v in H.nodes:
            vector = np.asarray(costing.memory_vector(v, options, act_bytes), dtype=np.float64)
            memory[v] = seen.setdefault(("memory", vector.shape, vector.tobytes()), vector)
        return H, memory


def training_graph(network, procs: int, machine, options: TrainingOptions, act_bytes: float, budget=None):
    """``(graph, costing, memory vectors)`` of :class:`TrainingGraphs` under ``options``."""
    pieces = TrainingGraphs(network, procs, machine, budget)
    H, memory = pieces.graph(options, act_bytes)
    return H, pieces.costing, memory


def search_free(network, procs: int, machine, options: TrainingOptions, act_bytes: float,
                memory_cap: float | None = None, ordering: str = "generateseq", budget=None,
                microbatch: int | None = None, pieces: TrainingGraphs | None = None) -> FreeSearch:
    """The exact per-layer search of ``network`` (built at one micro-batch) under ``options``.

    Without a cap the result is the exact optimum of the additive step time (every term of
    :class:`TrainingCosting` is a per-layer vector or a per-edge matrix). With a cap the
    memory-capped search of ``pase.capped`` runs on the additive memory; the parts of the
    peak that do not add up over layers (ZeRO-3's gathered weights, the recomputed block's
    working set, the reserve) are taken off the cap first, and the cap is tightened by any
    excess found afterwards (at most three times). ``pieces``: the network's
    :class:`TrainingGraphs`, built once for several option sets (default: built here).
    """
    from pase.search.capped import NOTHING_FITS, capped_search
    from pase.search.solver import Search

    start = time.perf_counter()
    pieces = pieces if pieces is not None else TrainingGraphs(network, procs, machine, budget)
    H, memory = pieces.graph(options, act_bytes)
    costing = pieces.costing
    search = Search(H, ordering)
    search.check_budget(budget)
    entries = 0
    searches = 0
    if memory_cap is None:
        result = search.run(memory_budget=budget)
        choice, optimum = [int(result.choice[v]) for v in range(len(network.layers))], float(result.cost)
        entries, searches, status = result.stats.table_entries, 1, "unconstrained"
    else:
        target = memory_cap - options.reserve_bytes
        choice = None
        optimum = None
        status = NOTHING_FITS
        for _ in range(4):
            if target <= 0:
                break
            found = capped_search(H, memory, target, ordering, budget, search=search)
            entries += found.table_entries
            searches += found.searches
            if found.status == NOTHING_FITS:
                break
            trial = [int(found.choice[v]) for v in range(len(network.layers))]
            extra = sum(costing.transient_bytes(trial, options, act_bytes).values())
            peak = found.memory + extra + options.reserve_bytes
            if peak <= memory_cap:
                choice, optimum, status = trial, float(found.cost), found.status
                break
            target -= peak - memory_cap
    seconds = time.perf_counter() - start
    if choice is None:
        return FreeSearch(None, None, entries, searches, seconds, status)
    configs = [tuple(int(x) for x in costing.configs[v][i]) for v, i in enumerate(choice)]
    # Option sets that choose the same strategy share its costing (what it computes is kept
    # by the options it reads).
    key = tuple(configs)
    if key not in pieces.strategies:
        pieces.strategies[key] = _strategy_costing(network, configs, procs, machine, structure=costing.structure,
                                                   readers="each")
    candidate = _evaluated(pieces.strategies[key], configs, procs, options, act_bytes, memory_cap, None, microbatch)
    return FreeSearch(candidate, optimum, entries, searches, seconds, status)
