"""The mesh search of training configurations: meshes, ZeRO, recomputation, micro-batches and
pipelines around the per-layer splits, every candidate priced by :class:`TrainingCosting`.

:func:`search_meshes` is exact over every ``dp x tp x cp x pp = p`` (``tp`` inside an NVLink
domain), sequence parallelism on or off, ZeRO 0-3, recomputation none/selective/full, every
micro-batch size dividing the per-rank batch and every pipeline cut and schedule; the fastest
that fits is kept. It runs as a row of stages, each a function handing the next a named record:

0. :func:`search_space`: the recipe read against the graph (:class:`SearchSpace`);
1. :func:`mesh_stage`: the meshes, grouped by the global micro-batch they make, one network
   built per micro-batch (:class:`MeshCandidates`);
2. :func:`costing_stage`: one :class:`TrainingCosting` of every mesh of a network, each group's
   share of it with its edges' seconds (:class:`~pase.planning.mesh_rows.Costed`);
3. :func:`options_stage` and :func:`options_applied`: every ZeRO stage, recomputation policy and
   overlap at the network's micro-batch count, priced row by row (:class:`OptionRows`);
4. :func:`pipeline_stage`: pipelined meshes' cuts and schedules (:mod:`pase.planning.pipeline`);
5. :func:`plan_stage`: in search order, the fastest that fits, the least memory and the
   alternatives (:class:`Chosen`), made candidates (:func:`~pase.planning.mesh_rows.candidate_of`).

Layer parts are computed once per distinct layer and mesh and reused across ZeRO stages and
recomputation policies, which recompute only what they change (``pase.core.memo``). Each stage
says what it searched (:class:`Said`): ``TrainingPlan.optimal_over`` reads their words. The
per-layer search is :mod:`pase.planning.free_search`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from pase.core.checks import (
    ArgumentTypeError, a_bool, a_callable, a_recipe, a_rules, a_training_options, an_engine, arguments, engine_sequence,
    non_negative_int, optional, positive_int, positive_number,
)
from pase.costing.precision import check_precision, machine_precisions
from pase.costing.training import (
    NetworkStructure, TrainingCosting, TrainingOptions, RECOMPUTE_MODULES, RECOMPUTE_POLICIES, ZERO_STAGES,
)
from pase.machines.registry import as_machine
from pase.model.builder import tokens_of
from pase.model.roles import expert_layers, roles_of
from pase.planning.candidate import CAUSES, Candidate, Priced
from pase.planning.engine_runs import check_engine, delayed_refuses, mesh_refusal, policy_refusal
from pase.planning.engine_cut import engine_cut
from pase.planning.free_search import FreeSearch, TrainingGraphs, evaluate_candidate, search_free, training_graph
from pase.planning.mesh import Mesh, MeshMapper, Recipe
from pase.planning.mesh_refusals import fold_refusal, microbatch_refusal, occupancy_refusal, recipe_refusal
from pase.planning.mesh_rows import Costed, Found, PartsMemo, candidate_of, edge_seconds, row_totals
from pase.planning.pipeline import (CUTS_SEARCHED, ENGINE_CUTS, SCHEDULES, Layout, extra_units, extra_word, pipeline_rows_settings,
                                   stage_layout)
from pase.planning.rules import ParallelRules, default_rules
from pase.planning.ties import Bands, choose_plan

__all__ = ["Candidate", "MeshSearch", "Priced", "Said", "StageReuse", "search_meshes", "mesh_candidates",
           "evaluate_candidate", "search_free", "FreeSearch", "TrainingGraphs", "training_graph", "tokens_of", "edge_seconds", "divisors",
           "CAUSES", "EngineRunsNone"]
# CAUSES, Candidate, Priced (pase.planning.candidate), the per-layer search's names
# (pase.planning.free_search), tokens_of and edge_seconds are named here for the callers of old.


def divisors(n: int) -> list:
    """Divisors of ``n`` in increasing order.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class EngineRunsNone(ValueError):
    """None of the configurations searched runs on the engines kept to (``keep_to``)."""


@dataclass(frozen=True)
class Said:
    """What one stage of a search searched, in the words of ``TrainingPlan.optimal_over``: each
    stage's words carry their own punctuation and follow the stages' before them. ``folded``:
    the words instead for a plan on a folded mesh (MoE parallel folding; ``{ep}`` and ``{etp}``
    its degrees)."""

    words: str
    folded: str | None = None

    def of(self, mesh) -> str:
        """The words for a plan on ``mesh`` (``None``: a per-layer plan, or none)."""
        if self.folded is not None and mesh is not None and mesh.folded:
            return self.folded.format(ep=mesh.ep, etp=mesh.expert_tp)
        return self.words


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
    #: What each stage searched (:class:`Said`), in the order ``optimal_over`` reads them.
    said: tuple = ()
    #: The fitting configurations that may tie with the fastest, ``(step, peak, Found)`` in search
    #: order (just the best without an engine's bands), and the rule that chose ``best`` among
    #: them (:func:`~pase.planning.ties.choose_plan`: ``fastest``, ``fits-band``, ``headroom``).
    contenders: list = field(default_factory=list)
    rule: str = "fastest"
    #: The fastest fitting configuration's step (``best``'s unless the rule chose a tie).
    fastest_step: float | None = None
    #: The contender ``best`` was made of (its ``Found``).
    chosen: object = None


#: Largest context-parallel degree searched unless a recipe names one (Megatron and
#: torchtitan runs use 2-16).
MAX_CP = 16


def mesh_candidates(procs: int, machine, recipe: Recipe | None = None) -> list:
    """Every mesh of ``procs`` devices the search tries: ``tp`` within an NVLink domain (a node
    of 8 on HGX machines, 72 GPUs on an NVL72 rack; all devices on a flat machine) unless the
    recipe fixes a larger one (priced over the network), ``cp`` any
    divisor, sequence parallelism both ways when ``tp > 1``."""
    recipe = recipe or Recipe()
    node = machine.nvlink_domain or machine.devices_per_node or procs
    meshes = []
    for tp in divisors(procs):
        # A recipe's tp may cross domains (priced over the network); the search keeps it inside one.
        if (tp > node and recipe.tp != tp) or recipe.tp not in (None, tp):
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
    return sorted({network.layers[v].domain[roles_of(network.layers[v]).index("experts")]
                   for v in expert_layers(network)})


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


def with_precision(base: TrainingOptions, recipe: Recipe, machine) -> TrainingOptions:
    """``base`` with the recipe's number format, FP8 scaling and FP8 gathers; ``ValueError``
    when the machine does not run that format."""
    fields = {"precision": recipe.precision, "fp8_scaling": recipe.scaling, "fp8_gather": recipe.fp8_gather}
    fields = {k: v for k, v in fields.items() if v is not None}
    options = base.but(**fields) if fields else base
    check_precision(machine, options.precision)
    return options


def with_experts(base: TrainingOptions, recipe: Recipe) -> TrainingOptions:
    """``base`` with the recipe's mixture-of-experts dispatcher and overlaps (``dispatcher``,
    ``ep_overlap``, ``shared_overlap``), where it gives them."""
    fields = {"moe_dispatcher": recipe.dispatcher, "ep_overlap": recipe.ep_overlap,
              "shared_overlap": recipe.shared_overlap}
    fields = {k: v for k, v in fields.items() if v is not None}
    return base.but(**fields) if fields else base


def with_recompute_modules(base: TrainingOptions, recipe: Recipe, engine=None) -> TrainingOptions:
    """``base`` with the recipe's ``recompute_modules`` where it gives them; ``ValueError`` when
    the engine does not run them (its ``recompute_modules`` fact: Megatron-Core's
    ``--recompute-modules``; every other engine recomputes attention's core alone under
    ``selective``)."""
    if recipe.recompute_modules is None:
        return base
    if engine is not None:
        runs = engine.facts["recompute_modules"]
        missing = [m for m in recipe.recompute_modules if m not in runs]
        if missing:
            raise ValueError(f"engine {engine.name} does not recompute {'+'.join(missing)} on its own (its "
                             f"recompute_modules: {', '.join(runs)}; Megatron-Core's --recompute-modules does: "
                             f"--engine megatron)")
    options = base.but(recompute_modules=recipe.recompute_modules)
    if delayed_refuses(options.precision, options.fp8_scaling, options.recompute_modules):
        raise ValueError("recompute_modules moe_act and layernorm do not run under FP8 delayed scaling "
                         "(Megatron-Core refuses them, transformer/transformer_config.py:1241-1246): "
                         "use scaling=current or drop them")
    return options


class StageReuse:
    """What the stages take from work done before the search: by default nothing (each search
    builds its networks' structures, edge tables and costings and forgets them when priced).
    A sweep over device counts (:mod:`pase.planning.training_sweep`) gives its searches one that
    shares them across the counts."""

    def built(self, network, rules: ParallelRules) -> "Built":
        """Stage 1's :class:`Built` of a network: its structure and mesh mapper."""
        return Built(network, NetworkStructure.of(network), MeshMapper(network, rules))

    def parts_memo(self, machine, devices: int) -> PartsMemo:
        """The edge tables of meshes of ``devices`` devices (a pipeline stage's)."""
        return PartsMemo(machine, devices)

    def costed(self, space: "SearchSpace", built: "Built", groups: list, machine, memos: dict) -> list:
        """Stage 2 of ``groups`` (every one runs ``built``'s network): :func:`costing_stage`."""
        return costing_stage(built, groups, machine, memos)

    def prefix_sums(self, share: "Costed") -> dict | None:
        """Where stage 4 keeps a group's prefix sums by settings (``None``: not kept)."""
        return None

    def release(self, shares: list) -> None:
        """A network's groups are priced: what its costing kept is forgotten (priced again, if
        asked for, from the shares)."""
        shares[0].costing.forget()


def a_stage_reuse(value, name: str) -> StageReuse:
    if not isinstance(value, StageReuse):
        raise ArgumentTypeError(f"{name} must be a StageReuse, got {type(value).__name__}")
    return value


@arguments(build=a_callable, batch=positive_int, procs=positive_int, machine=as_machine,
           memory_cap=optional(positive_number), act_bytes=positive_number, recipe=optional(a_recipe),
           base=optional(a_training_options), engine=optional(an_engine), keep_best=non_negative_int,
           rules=optional(a_rules), keep_to=engine_sequence, exporting=a_bool, reuse=optional(a_stage_reuse))
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
    reuse: "StageReuse | None" = None,
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
    The stages are the module's (:mod:`pase.planning.training_search`); ``reuse``: what they
    take from work done before (:class:`StageReuse`; a sweep's shares it across device counts).
    """
    rules = rules if rules is not None else default_rules()
    start = time.perf_counter()
    recipe = recipe or Recipe()
    base = base or (engine.base_options(machine) if engine is not None else TrainingOptions())
    recipe.check(procs)
    if recipe.precision == "search":
        return _search_precisions(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, keep_all, rebuild,
                                  engine, keep_best, keep_to, exporting, rules, reuse)
    reuse = reuse if reuse is not None else StageReuse()
    space = search_space(build, batch, procs, machine, recipe, base, engine, keep_to, exporting, rules)
    meshes = mesh_stage(space, build, batch, procs, machine, rebuild, rules, reuse)
    priced = price_stages(space, meshes, batch, procs, machine, act_bytes, memory_cap, reuse)
    bands = Bands.of(engine)
    chosen = plan_stage(space, meshes, priced, memory_cap, keep_all, keep_best, keep_to, exporting, bands)
    if chosen.best is None and chosen.least is None:
        raise _nothing_runs(space, meshes, chosen, batch, procs, machine, keep_to, rules)
    block_counts = space.search_block and any(policy == "block" for _, policy, *_ in space.grid)
    contenders = chosen.contenders or ([(chosen.best.step, chosen.best.peak, chosen.best)] if chosen.best else [])
    choice = choose_plan(contenders, bands, memory_cap)

    def made(found):
        return candidate_of(found, memory_cap, act_bytes, procs)

    return MeshSearch(
        best=made(choice.entry[2]) if choice is not None else None,
        least_memory=made(chosen.least) if chosen.least is not None else None,
        evaluated=chosen.evaluated,
        seconds=time.perf_counter() - start,
        networks=len(meshes.networks),
        space=(f"{meshes.meshes_tried} meshes x {len(space.grid)} ZeRO/recompute settings x micro-batch sizes; "
               f"{chosen.evaluated} configurations"),
        candidates=chosen.kept,
        experts=bool(space.expert_counts),
        fastest=[made(offered.found) for offered in chosen.fastest],
        block_counts=block_counts,
        said=(meshes.said, _options_said(block_counts, tuple(dict.fromkeys(m for *_, m in space.grid if m is not None))),
              _pipelines_said(block_counts))
        + ((_experts_said(),) if space.expert_counts else ()),
        contenders=contenders,
        rule=choice.rule if choice is not None else "fastest",
        fastest_step=choice.fastest[0] if choice is not None else None,
        chosen=choice.entry[2] if choice is not None else None,
    )


# ---------------------------------------------------------------------------------------
# Stage 0: the recipe read against the graph


@dataclass(frozen=True)
class SearchSpace:
    """What the recipe leaves to search on this graph. ``recipe``: the one given with what the
    graph and options decide fixed (``tp=1`` without tensor-parallel roles, ``sp`` where a fixed
    overlap needs it); ``base``: the options in the recipe's number format; ``overlaps``: the
    ``tp_overlap`` values tried; ``probe``: the network at the whole batch; ``blocks``: its
    repeated blocks (``None``: no pipeline layout); ``grid``: the ``(zero, recompute,
    tp_overlap)`` settings; ``search_block``: whether ``recompute=block``'s count is searched."""

    recipe: Recipe
    base: TrainingOptions
    overlaps: tuple
    schedules: tuple
    stage_counts: tuple
    probe: object
    blocks: int | None
    expert_counts: tuple
    grid: tuple
    search_block: bool


def search_space(build, batch: int, procs: int, machine, recipe: Recipe, base: TrainingOptions, engine,
                 keep_to: tuple, exporting: bool, rules: ParallelRules) -> SearchSpace:
    """Stage 0: the recipe checked against the machine, the engines kept to and the graph built
    at the whole batch (``ValueError`` with why where nothing can apply)."""
    base = with_recompute_modules(with_experts(with_precision(base, recipe, machine), recipe), recipe, engine)
    overlaps = overlap_choices(recipe, base, engine)
    if overlaps == (True,) and recipe.sp is None:  # Megatron's overlap needs sequence parallelism
        recipe = Recipe(**{**recipe.fixed(), "sp": True})
    schedules, stage_counts = _pipeline_choices(recipe, procs)
    if recipe.ep_overlap:  # Megatron-Core overlaps the expert all-to-alls on pipelines of virtual stages only
        schedules = [s for s in schedules if s == "interleaved"]
    probe = build(batch)
    schedules = _engines_schedules(probe, recipe, schedules, keep_to, exporting)
    recipe = _tensor_parallel(recipe, probe, rules)
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
    latent = has_latent_attention(probe)
    check_modules_apply(recipe.recompute_modules or (), base, probe, latent)
    modules = module_choices(recipe, base, engine, bool(expert_counts), latent)
    grid = tuple((z, r, o, m) for z, r in options_grid(recipe, engine) for o in overlaps
                 for m in (modules if r == "selective" else (None,))
                 if r != "block" or blocks or not search_block)
    return SearchSpace(recipe, base, overlaps, tuple(schedules), tuple(stage_counts), probe, blocks,
                       tuple(expert_counts), grid, search_block)


#: The recompute modules the search tries beside Megatron's default under selective
#: recomputation, on a network with a mixture of experts: NVIDIA's choice for its MoE runs
#: (Megatron-Bridge perf_recipes/gpt_oss/h100/gpt_oss.py:39, ``["layernorm", "moe_act"]``),
#: which discards the experts' activation and the norm before them for little time.
SEARCHED_MOE_MODULES = ("moe_act", "layernorm")
#: ... and on a network with multi-latent attention: the latents' up projections, in every
#: DeepSeek-V3 and Kimi K2 performance recipe of Megatron-Bridge (perf_recipes/deepseek/b200/
#: deepseek_v3.py:43 ``["mla_up_proj"]``, h100/deepseek_v3.py:43 ``["mla_up_proj", "mlp"]``,
#: common.py:114 ``["layernorm", "mla_up_proj", "moe_act"]``, kimi/b200/kimi_k2.py:47).
SEARCHED_MLA_MODULES = ("mla_up_proj",)


def module_choices(recipe: Recipe, base: TrainingOptions, engine, experts: bool, latent: bool = False) -> tuple:
    """The ``recompute_modules`` tried under ``selective`` (``None``: the base options'): the
    recipe's alone where it fixes them or fixes ``recompute=selective`` (Megatron's default,
    ``core_attn``), else also :data:`SEARCHED_MOE_MODULES` on a mixture of experts where the
    engine recomputes them and its FP8 scaling lets it, and under multi-latent attention
    :data:`SEARCHED_MLA_MODULES`, alone and with those (in Megatron's order).

    >>> from pase.planning.engine import load_engine
    >>> module_choices(Recipe(), TrainingOptions(), load_engine("megatron"), True, True)
    (None, ('moe_act', 'layernorm'), ('mla_up_proj',), ('moe_act', 'layernorm', 'mla_up_proj'))
    """
    if recipe.recompute_modules is not None or recipe.recompute is not None or engine is None:
        return (None,)
    runs = set(engine.facts["recompute_modules"])
    moe = (experts and set(SEARCHED_MOE_MODULES) <= runs
           and not delayed_refuses(base.precision, base.fp8_scaling, SEARCHED_MOE_MODULES))
    sets = [SEARCHED_MOE_MODULES] if moe else []
    if latent and set(SEARCHED_MLA_MODULES) <= runs:
        sets.append(SEARCHED_MLA_MODULES)
        if moe:
            both = set(SEARCHED_MOE_MODULES) | set(SEARCHED_MLA_MODULES)
            sets.append(tuple(m for m in RECOMPUTE_MODULES if m in both))
    return (None, *sets)


def check_modules_apply(modules: tuple, base: TrainingOptions, network, latent: bool) -> None:
    """``ValueError`` where a recipe's ``recompute_modules`` name layers ``network`` lacks (or
    Megatron-Core refuses beside the options): ``mla_up_proj`` without latent attention
    (transformer/transformer_config.py:1218-1222), ``moe_act`` or ``moe`` without a mixture of
    experts, ``shared_experts`` without shared experts or beside their overlap (:1232-1239)."""
    moes = [network.layers[v] for v in expert_layers(network)]
    if "mla_up_proj" in modules and not latent:
        raise ValueError(f"recompute_modules mla_up_proj recomputes multi-latent attention's up projections, and graph "
                         f"{network.name} has none (Megatron-Core refuses it, transformer/transformer_config.py:1218-1222)")
    expert_modules = [m for m in modules if m in ("moe_act", "moe")]
    if expert_modules and not moes:
        plural = "s" if len(expert_modules) > 1 else ""
        raise ValueError(f"recompute_modules {'+'.join(expert_modules)}: a mixture of experts' module{plural}, "
                         f"and graph {network.name} has no mixture of experts")
    if "shared_experts" in modules:
        if not any(layer.args.get("shared") for layer in moes):
            raise ValueError(f"recompute_modules shared_experts: graph {network.name} has no shared experts")
        if base.shared_overlap:
            raise ValueError("recompute_modules shared_experts does not run with shared_overlap=true (Megatron-Core "
                             "refuses it, transformer/transformer_config.py:1232-1239)")


def has_latent_attention(network) -> bool:
    """Whether a layer of ``network`` iterates over a low-rank latent (multi-latent attention's
    down and up projections: the ``latent`` role)."""
    return any("latent" in roles_of(layer) for layer in network.layers)


def _pipeline_choices(recipe: Recipe, procs: int) -> tuple:
    """``(schedules, stage counts)`` the recipe leaves; ``ValueError`` where its schedule or
    ``vpp`` asks for a pipeline it cannot have."""
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
    return schedules, stage_counts


def _engines_schedules(probe, recipe: Recipe, schedules: list, keep_to: tuple, exporting: bool) -> list:
    """The schedules every engine kept to has (``exporting``: its file can say); an engine that
    cannot run the graph, or the recipe's recomputation, refuses first."""
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
    return schedules


def _tensor_parallel(recipe: Recipe, probe, rules: ParallelRules) -> Recipe:
    """The recipe with ``tp=1`` where no layer has a role tensor parallelism splits."""
    # Tensor parallelism maps onto the roles the rules give it (heads, MLP width, vocabulary):
    # a graph whose layers have none gets data, context and pipeline parallelism only.
    if rules.tensor_parallel(probe):
        return recipe
    if recipe.tp not in (None, 1):
        raise ValueError(f"tp={recipe.tp}: tensor parallelism splits the dimension roles "
                         f"{', '.join(rules.tensor_roles())}, which no layer of graph {probe.name} has "
                         "(roles are declared by the graph's source: pase.model.roles)")
    return Recipe(**{**recipe.fixed(), "tp": 1})


# ---------------------------------------------------------------------------------------
# Stage 1: the meshes, grouped by the network they run


class Built(NamedTuple):
    """A network built at one global micro-batch, its structure and its mesh mapper."""

    network: object
    structure: NetworkStructure
    mapper: MeshMapper


class MeshGroup(NamedTuple):
    """The meshes of one pipeline stage count whose per-rank micro-batches make one global
    micro-batch (one network): each ``(mesh, micro-batch)`` in search order, its configuration
    per kind of layer (``MeshMapper.kind_configs``), and the blocks' layout (``pp > 1``)."""

    pp: int
    stage_devices: int
    global_micro: int
    meshes: list
    rows: list
    layout: Layout | None


@dataclass(frozen=True)
class MeshCandidates:
    """Stage 1's outcome: the groups in search order (stage counts, then global micro-batches),
    the networks they run by global micro-batch, and what was met on the way, for the error when
    nothing runs: the meshes and ``dp`` tried, why a recipe's ``ep`` folds onto none, the first
    mesh the mapper refused."""

    groups: tuple
    networks: dict
    meshes_tried: int
    dps_tried: frozenset
    fold_refused: str | None
    first_error: Exception | None
    said: Said


def mesh_stage(space: SearchSpace, build, batch: int, procs: int, machine, rebuild: bool,
               rules: ParallelRules, reuse: "StageReuse | None" = None) -> MeshCandidates:
    """Stage 1: per stage count ``pp``, every mesh of ``procs / pp`` devices
    (:func:`mesh_candidates`) with its expert grids (:func:`expert_grids`), each with every
    per-rank micro-batch dividing its share of the batch (the whole share without ``rebuild``),
    grouped by the global micro-batch they make: one network built for each."""
    reuse = reuse if reuse is not None else StageReuse()
    recipe = space.recipe
    networks, groups, errors = {}, [], []
    tried, dps, fold_refused = 0, set(), None
    for a, pp in enumerate(space.stage_counts):
        candidates = mesh_candidates(procs // pp, machine, recipe)
        dps.update(m.dp for m in candidates)
        meshes = [Mesh(m.dp, m.tp, m.cp, pp, m.sp, ep, etp) for m in candidates
                  if batch % m.dp == 0 for ep, etp in expert_grids(m, space.expert_counts, recipe)]
        if recipe.ep is not None and recipe.ep > 1 and not meshes and fold_refused is None:
            fold_refused = _fold_refused(candidates, batch, space)
        tried += len(meshes)
        by_micro = _by_global_micro(meshes, batch, pp, rebuild, recipe)
        for b, global_micro in enumerate(sorted(by_micro)):
            if global_micro not in networks:
                networks[global_micro] = reuse.built(build(global_micro), rules)
            group = _mesh_group(pp, procs // pp, global_micro, by_micro[global_micro], networks[global_micro],
                                recipe, errors, (a, b))
            if group is not None:
                groups.append(group)
    first_error = min(errors, key=lambda e: e[0])[1] if errors else None
    return MeshCandidates(tuple(groups), networks, tried, frozenset(dps), fold_refused, first_error,
                          _meshes_said(procs, machine, space.base.pipeline_cut))


def _fold_refused(candidates: list, batch: int, space: SearchSpace) -> str | None:
    """Why a recipe's ``ep`` folds onto none of ``candidates`` (MoE parallel folding)."""
    recipe = space.recipe
    return next((why for m in candidates if batch % m.dp == 0 for why in [
        fold_refusal(m, space.expert_counts, recipe.ep,
                     recipe.etp if recipe.etp is not None else m.tp if m.dp % recipe.ep == 0 else 1)]
        if why is not None), None)


def _by_global_micro(meshes: list, batch: int, pp: int, rebuild: bool, recipe: Recipe) -> dict:
    """``(mesh, per-rank micro-batch)`` pairs by the global micro-batch they make: one network each."""
    by_micro: dict = {}
    for mesh in meshes:
        local = batch // mesh.dp
        for micro in divisors(local) if rebuild else [local]:
            if recipe.microbatch not in (None, micro):
                continue
            if pp > 1 and local // micro < 1:
                continue
            by_micro.setdefault(micro * mesh.dp, []).append((mesh, micro))
    return by_micro


def _mesh_group(pp: int, stage_devices: int, global_micro: int, pairs: list, built: Built, recipe: Recipe,
                errors: list, where: tuple) -> MeshGroup | None:
    """The group of ``pairs`` on ``built``'s network: the meshes its mapper lays out (the
    others' errors added to ``errors`` at ``where`` in the search order), with the blocks'
    layout where ``pp > 1``; ``None`` where none is left."""
    rows, valid = [], []
    for mesh, micro in pairs:
        try:
            rows.append(built.mapper.kind_configs(mesh))
        except ValueError as err:
            errors.append((where + (0,), err))
            continue
        valid.append((mesh, micro))
    if not valid:
        return None
    layout = stage_layout(built.structure.blocks) if pp > 1 else None
    if pp > 1 and (layout is None or len(layout.blocks) < pp):
        errors.append((where + (1,), ValueError(f"{pp} pipeline stages need at least {pp} repeated blocks in order")))
        return None
    if recipe.stages is not None and sum(recipe.stages) != len(layout.blocks):
        raise ValueError(f"recipe stages {'/'.join(map(str, recipe.stages))} hold {sum(recipe.stages)} "
                         f"blocks; graph {built.network.name} has {len(layout.blocks)}")
    return MeshGroup(pp, stage_devices, global_micro, valid, rows, layout)


def _meshes_said(procs: int, machine, pipeline_cut: str = "search") -> Said:
    domain = machine.nvlink_domain
    within = "a node" if domain is None or domain == machine.devices_per_node else f"an NVLink domain of {domain}"
    return Said(f"meshes dp x tp x cp x pp = {procs} (tp within {within}, cp up to {MAX_CP}, sequence parallelism "
                f"on or off; {ENGINE_CUTS.get(pipeline_cut, CUTS_SEARCHED)})")


def _experts_said() -> Said:
    return Said("; expert parallelism ep dividing dp and every layer's expert count",
                folded="; expert parallelism the recipe's ep {ep} with etp {etp} (Megatron-Core's MoE parallel "
                       "folding: etp x ep dividing tp x cp x dp, etp dividing tp)")


# ---------------------------------------------------------------------------------------
# Stages 2 to 4: a costing per network, the options applied, the pipelines cut


class OptionRows(NamedTuple):
    """One options set priced on a group's meshes: step and peak per mesh, the pipeline each
    runs (``None`` without one, or where no pipeline applies) and the blocks each recomputes
    under ``recompute=block`` (0 otherwise)."""

    step: np.ndarray
    peak: np.ndarray
    stage_plans: list
    counts: list


class PricedGroup(NamedTuple):
    """A group after stages 2 to 4: its share of the costing, the options applied (one per
    setting of the grid) and each one's rows."""

    costed: Costed
    settings: list
    rows: list


def price_stages(space: SearchSpace, meshes: MeshCandidates, batch: int, procs: int, machine, act_bytes: float,
                 memory_cap, reuse: "StageReuse | None" = None) -> dict:
    """Stages 2 to 4, network by network: one costing of every mesh that runs it (all stage
    counts), the options applied at its micro-batch count, the pipelines cut and scheduled;
    a :class:`PricedGroup` by ``(pp, global micro-batch)``."""
    reuse = reuse if reuse is not None else StageReuse()
    priced = {}
    memos = {procs // pp: reuse.parts_memo(machine, procs // pp) for pp in space.stage_counts}
    for global_micro in sorted({g.global_micro for g in meshes.groups}):
        mine = [g for g in meshes.groups if g.global_micro == global_micro]
        shares = reuse.costed(space, meshes.networks[global_micro], mine, machine, memos)
        settings, searched = options_stage(space, batch // global_micro)
        for group, share in zip(mine, shares):
            if group.pp > 1:
                rows = pipeline_stage(space, group, share, settings, searched, act_bytes, memory_cap,
                                      reuse.prefix_sums(share))
            else:
                rows = options_applied(share, settings, searched, act_bytes, memory_cap,
                                       [mesh.tp for mesh, _ in group.meshes])
            priced[(group.pp, global_micro)] = PricedGroup(share, settings, rows)
        reuse.release(shares)
    return priced


def costing_stage(built: Built, groups: list, machine, memos: dict) -> list:
    """Stage 2: one :class:`TrainingCosting` of every mesh of ``groups`` (all run ``built``'s
    network), a row per mesh; each group's share of it (:class:`Costed`) with its edges'
    seconds (``memos``: a :class:`PartsMemo` per device count of a stage)."""
    network, structure, mapper = built
    rows = [r for g in groups for r in g.rows]
    # One array per kind of layer (MeshMapper), shared by the layers of that kind.
    by_kind = {k: np.array([r[k] for r in rows], dtype=np.int64) for k in rows[0]}
    costing = TrainingCosting(network, [by_kind[k] for k in mapper.index], machine, structure)
    halved = np.array([mapper.sequence_parallel(mesh) for g in groups for mesh, _ in g.meshes]).T
    costing.activation_scale = np.where(halved, 0.5, 1.0)
    tokens = tokens_of(network)
    shares, offset = [], 0
    for g in groups:
        columns = np.arange(offset, offset + len(g.meshes))
        offset += len(g.meshes)
        part = {k: np.ascontiguousarray(c[columns]) for k, c in by_kind.items()}
        edges, targets = memos[g.stage_devices].edge_seconds(network, [part[k] for k in mapper.index], structure.kinds)
        shares.append(Costed(costing, columns, edges, targets, tokens))
    return shares


def options_stage(space: SearchSpace, microbatches: int) -> tuple:
    """Stage 3's options: ``(settings, searched)``, every setting of the grid at ``microbatches``
    micro-batches per step, and whether each searches its block count (``recompute=block``
    without a recipe's count stands as every block until the pricing picks one per mesh)."""
    recipe = space.recipe
    blocks = recipe.recompute_layers or space.blocks or 1
    settings = [space.base.but(zero=zero, recompute=policy, microbatches=microbatches, tp_overlap=overlap,
                               recompute_layers=0 if policy != "block" else blocks,
                               **({} if modules is None else {"recompute_modules": modules}))
                for zero, policy, overlap, modules in space.grid]
    searched = [policy == "block" and space.search_block for _, policy, *_ in space.grid]
    return settings, searched


def options_applied(share: Costed, settings: list, searched: list, act_bytes: float, memory_cap, tp=1) -> list:
    """Stage 3 on meshes without a pipeline: each setting's :class:`OptionRows`
    (:func:`~pase.planning.mesh_rows.row_totals`; settings share the sums of what they do not change;
    ``tp``: each mesh's tensor-parallel degree)."""
    sums: dict = {}
    out = []
    for options, search in zip(settings, searched):
        step, peak, layers = row_totals(share.costing, options, act_bytes, share.edges, share.targets, sums,
                                        share.columns, memory_cap, search, tp=np.asarray(tp, dtype=np.float64))
        out.append(OptionRows(step, peak, [None] * len(share.columns), layers))
    return out


def pipeline_stage(space: SearchSpace, group: MeshGroup, share: Costed, settings: list, searched: list,
                   act_bytes: float, memory_cap, kept: dict | None = None) -> list:
    """Stage 4 on pipelined meshes: every setting's pipelines in one pass over the cuts and
    schedules (:func:`~pase.planning.pipeline.pipeline_rows_settings`), the best per mesh."""
    recipe = space.recipe
    stages = recipe.stages
    if stages is None and recipe.vpp in (None, 1) and settings and settings[0].pipeline_cut != "search":
        # The engine's own cut (nanotron's by cost, DeepSpeed's by count).
        stages = engine_cut(share.costing.network, group.layout, group.pp, settings[0].pipeline_cut)
    # Block recomputation on pipelines where a recipe asks for it: its count search over every
    # cut, schedule and chunk count made the free search of Llama 3.1 70B on 256 GPUs half as
    # long again (benchmarks/results/foundation_speed.md); without stages it is one chunk, and cheap.
    keep = [j for j, o in enumerate(settings) if o.recompute != "block" or recipe.recompute == "block"]
    got = pipeline_rows_settings(share.costing, [settings[j] for j in keep], act_bytes, share.edges, share.targets,
                                 group.pp, group.stage_devices, group.layout, memory_cap, space.schedules,
                                 None if recipe.vpp is None else [recipe.vpp], stages,
                                 columns=share.columns, search_layers=[searched[j] for j in keep],
                                 tp=[mesh.tp for mesh, _ in group.meshes],
                                 extra=extra_units(recipe.pipeline_extra), kept=kept)
    K = len(group.meshes)
    rows = [OptionRows(np.full(K, np.inf), np.full(K, np.inf), [None] * K, [0] * K)] * len(settings)
    for j, (step, peak, plans) in zip(keep, got):
        rows[j] = OptionRows(step, peak, plans, [0 if p is None else p.recompute_layers for p in plans])
    return rows


def _options_said(block_counts: bool, modules: tuple = ()) -> Said:
    words = (f", ZeRO {min(ZERO_STAGES)}-{max(ZERO_STAGES)}, recomputation {'/'.join(SEARCHED_POLICIES)}"
             + (f" (selective also with {' or '.join('+'.join(m) for m in modules)}, Megatron's --recompute-modules)"
                if modules else "") + " and every micro-batch size dividing the per-rank batch")
    if block_counts:
        words += ("; Megatron's block recomputation (the first N blocks of each pipeline chunk recomputed) with every "
                  "N from 1 to a chunk's blocks per mesh, ZeRO stage and micro-batch")
    return Said(words)


def _pipelines_said(block_counts: bool) -> Said:
    return Said("; with pipeline stages where the recipe asks for it, per cut and schedule, and there only where the "
                "plan without recomputation does not fit (N = 1 where it does)" if block_counts else "")


# ---------------------------------------------------------------------------------------
# Stage 5: the plan and its alternatives


class Offered(NamedTuple):
    """One of the fastest distinct fitting configurations kept (``keep_best``)."""

    step: float
    peak: float
    text: str
    found: Found


@dataclass
class Chosen:
    """Stage 5's outcome: the fastest fitting configuration and the least-memory one, the count
    evaluated, every one priced (``keep_all``), the fastest distinct ones (``keep_best``, as
    :class:`Offered`) and the first reason an engine kept to refused one."""

    best: Found | None = None
    least: Found | None = None
    evaluated: int = 0
    kept: list = field(default_factory=list)
    fastest: list = field(default_factory=list)
    engine_refused: str | None = None
    #: Fitting configurations that may tie with the fastest (``(step, peak, Found)`` in search
    #: order, within :meth:`~pase.planning.ties.Bands.tie_limit` of the fastest so far).
    contenders: list = field(default_factory=list)


def plan_stage(space: SearchSpace, meshes: MeshCandidates, priced: dict, memory_cap, keep_all: bool,
               keep_best: int, keep_to: tuple, exporting: bool, bands: Bands | None = None) -> Chosen:
    """Stage 5, in search order (stage counts, global micro-batches, settings, meshes): every
    configuration's step and peak, the fastest that fits kept, those that may tie with it
    (``bands``: the engine's) and the least memory."""
    chosen = Chosen()
    for group in meshes.groups:
        done = priced[(group.pp, group.global_micro)]
        for (zero, policy, overlap, _), setting, rows in zip(space.grid, done.settings, done.rows):
            for i, (mesh, micro) in enumerate(group.meshes):
                options = setting.but(recompute_layers=int(rows.counts[i])) if policy == "block" and rows.counts[i] \
                    else setting
                if keep_to:
                    why = next((f"{p.name}: {r}" for p in keep_to
                                if (r := mesh_refusal(p, mesh, options, export=exporting)) is not None), None)
                    if why is not None:
                        chosen.engine_refused = chosen.engine_refused or why
                        continue
                if group.pp > 1 and rows.stage_plans[i] is None:
                    continue
                if not _overlap_applies(overlap, space.overlaps, mesh):
                    continue
                found = Found(float(rows.step[i]), float(rows.peak[i]), done.costed, options, i, mesh, micro,
                              rows.stage_plans[i], group.stage_devices)
                _consider(chosen, found, zero, policy, memory_cap, keep_all, keep_best, bands)
    return chosen


def _overlap_applies(overlap: bool, overlaps: tuple, mesh: Mesh) -> bool:
    """Overlapping tensor-parallel communication needs tensor parallelism with sequence
    parallelism; searched (not fixed), it is tried only there."""
    if overlap and len(overlaps) > 1 and not (mesh.tp > 1 and mesh.sp):
        return False
    return not (overlap and len(overlaps) == 1 and mesh.tp > 1 and not mesh.sp)


def _consider(chosen: Chosen, found: Found, zero: int, policy: str, memory_cap, keep_all: bool,
              keep_best: int, bands: Bands | None = None) -> None:
    """``found`` counted, kept as the best, a contender or the least memory where it is, and offered."""
    chosen.evaluated += 1
    fits = memory_cap is None or found.peak <= memory_cap
    if fits and (chosen.best is None or found.step < chosen.best.step):
        chosen.best = found
        if bands is not None and memory_cap is not None:  # a faster best: fewer may tie with it
            limit = bands.tie_limit(found.step)
            chosen.contenders = [c for c in chosen.contenders if c[0] <= limit]
    if fits and bands is not None and memory_cap is not None and found.step <= bands.tie_limit(chosen.best.step):
        chosen.contenders.append((found.step, found.peak, found))
    if chosen.least is None or found.peak < chosen.least.peak:
        chosen.least = found
    if keep_all or (keep_best and fits):
        plan = found.stages
        priced = Priced(found.mesh, zero, policy, found.microbatch, None if plan is None else plan.schedule,
                        1 if plan is None else plan.vpp, found.step, found.peak, found.options.recompute_layers,
                        None if plan is None or not sum(plan.extra) else extra_word(plan.extra))
        if keep_all:
            chosen.kept.append(priced)
        if keep_best and fits:
            _offer(chosen.fastest, keep_best, priced, found)


def _nothing_runs(space: SearchSpace, meshes: MeshCandidates, chosen: Chosen, batch: int, procs: int, machine,
                  keep_to: tuple, rules: ParallelRules) -> ValueError:
    """Why no configuration was priced: the engines' refusal, else the first of the graph's."""
    if chosen.engine_refused is not None:
        return EngineRunsNone(f"none of the configurations searched runs on {' and '.join(p.name for p in keep_to)} "
                              f"(for one: {chosen.engine_refused})")
    tokens = tokens_of(space.probe)
    dps = meshes.dps_tried
    reason = (occupancy_refusal(space.probe, batch, procs, machine, space.recipe, space.blocks,
                                tokens // batch if tokens and batch else None, MAX_CP, rules)
              or microbatch_refusal(space.recipe, batch, dps) or meshes.fold_refused or meshes.first_error
              or (f"batch {batch} is not divisible by any dp tried ({', '.join(map(str, sorted(dps)))})"
                  if dps else "no mesh of these degrees"))
    return ValueError(f"no mesh applies to this graph: {reason}")


def _offer(fastest: list, k: int, priced: Priced, found: Found) -> None:
    """Keep ``fastest`` the ``k`` fastest configurations distinct in step (to the nanosecond)
    and peak (to the byte), as :class:`Offered` in order; of two equal in both, the first
    recipe in text order."""
    if len(fastest) >= k and (priced.step_seconds, priced.peak_memory_bytes) > fastest[-1][:2]:
        return
    figures = (round(priced.step_seconds, 9), round(priced.peak_memory_bytes))
    entry = Offered(priced.step_seconds, priced.peak_memory_bytes, priced.recipe().text(), found)
    for j, (t, peak, text, _) in enumerate(fastest):
        if (round(t, 9), round(peak)) == figures:
            if entry[2] < text:
                fastest[j] = entry
                fastest.sort(key=lambda e: e[:3])
            return
    fastest.append(entry)
    fastest.sort(key=lambda e: e[:3])
    del fastest[k:]


# ---------------------------------------------------------------------------------------
# Every number format


def _search_precisions(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, keep_all, rebuild,
                       engine=None, keep_best: int = 0, keep_to: tuple = (), exporting: bool = False, rules=None,
                       reuse=None):
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
                                      exporting=exporting, rules=rules, reuse=reuse))
            formats.append(precision)
        except EngineRunsNone as err:  # a format the engine (or its file) has no setting for: the others
            refused.append(err)
    if not runs:
        raise refused[0]
    contenders = [entry for r in runs for entry in r.contenders]
    choice = choose_plan(contenders, Bands.of(engine), memory_cap)
    least = [r.least_memory for r in runs if r.least_memory is not None]
    return MeshSearch(
        best=candidate_of(choice.entry[2], memory_cap, act_bytes, procs) if choice is not None else None,
        least_memory=min(least, key=lambda c: c.summary.peak_memory_bytes) if least else None,
        evaluated=sum(r.evaluated for r in runs),
        seconds=sum(r.seconds for r in runs),
        networks=max(r.networks for r in runs),
        space=f"{runs[0].space}; in each of {len(runs)} number formats ({', '.join(formats)})",
        candidates=[c for r in runs for c in r.candidates],
        experts=runs[0].experts,
        block_counts=any(r.block_counts for r in runs),
        fastest=sorted((c for r in runs for c in r.fastest), key=_fastest_order)[:keep_best],
        said=runs[0].said,
        contenders=contenders,
        rule=choice.rule if choice is not None else "fastest",
        fastest_step=choice.fastest[0] if choice is not None else None,
        chosen=choice.entry[2] if choice is not None else None,
    )


def _fastest_order(candidate: Candidate) -> tuple:
    """The order of ``MeshSearch.fastest`` (:func:`_offer`'s): step, then peak, then recipe text."""
    return candidate.summary.step_seconds, candidate.summary.peak_memory_bytes, candidate.recipe()
