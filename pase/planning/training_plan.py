"""``plan_training``: the fastest training configuration that fits, in practitioners' terms.

It runs the mesh search (exact over meshes, ZeRO stages, recomputation policies and
micro-batch sizes) and, where the exact per-layer tables are small enough, the per-layer
search under each ZeRO stage and recomputation policy at the best mesh's micro-batch count;
the faster fitting plan wins. A recipe fixes any of the choices; ``compare`` prices one
recipe's best configuration next to the optimum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, NamedTuple

from pase.planning.mesh import Recipe
from pase.costing.training import TrainingOptions
from pase.planning.free_search import TrainingGraphs, search_free
from pase.planning.training_search import (
    Candidate, MeshSearch, Said, a_stage_reuse, options_grid, search_meshes,
)
from pase.core.checks import (
    a_bool, a_callable, a_memory_cap, a_recipe, a_rules, a_training_options, an_engine, arguments, engine_sequence,
    non_negative_int, optional, positive_int, positive_number,
)
from pase.machines.registry import as_machine

__all__ = ["TrainingPlan", "plan_training", "FREE_SEARCH_ENTRIES", "NO_CAP"]

#: Largest dynamic-programme work (a lower bound in table entries, summed over the ZeRO and
#: recomputation settings) for which the per-layer search runs beside the mesh search by default: about a second of
#: work on one core.
FREE_SEARCH_ENTRIES = 50_000_000

#: ``memory_cap=NO_CAP``: search without any memory cap, even on a machine with a device
#: memory (the plan then says whether it exceeds the device: ``TrainingPlan.exceeds_device``).
NO_CAP = float("inf")


@dataclass
class TrainingPlan:
    """The chosen training configuration and how it was found.

    ``best`` is ``None`` when nothing fits (``least_memory`` then says how little the
    search could do with); ``compare`` is the compared recipe's best configuration.
    """

    network_name: str
    procs: int
    batch: int
    machine: object
    memory_cap: float | None
    best: Candidate | None
    least_memory: Candidate | None
    mesh_search: MeshSearch
    free_searches: int
    free_entries: int
    free_skipped: str | None
    compare: Candidate | None
    compare_recipe: str | None
    seconds: float
    #: Names of the engines the search kept to (``--engine``, the ``--export-ENGINE`` files).
    kept_to: tuple = ()
    #: The engine profile the plan is priced for (``None``: none named).
    engine_profile: object = None
    #: The network the best plan runs (at its micro-batch): what the tables name.
    network: object = None
    #: The device's memory in bytes (``machine.memory_bytes``), ``None`` where the machine has none.
    device_memory_bytes: float | None = None
    #: Every configuration the mesh search priced (``Priced``), when asked for (``keep_priced``).
    priced: list = field(default_factory=list)
    #: The fastest distinct fitting configurations, fastest first (the plan first), when asked for.
    alternatives: list = field(default_factory=list)
    #: What each stage of the searches searched (``Said``): the mesh search's, then the per-layer one's.
    said: tuple = ()

    @property
    def exceeds_device(self) -> bool:
        """Whether the plan needs more memory per device than the device has (possible only
        when the caller raised the cap above the device's memory, or removed it)."""
        return (self.best is not None and self.device_memory_bytes is not None
                and self.best.summary.peak_memory_bytes > self.device_memory_bytes)

    @property
    def margin_bytes(self) -> float | None:
        """Bytes per device the plan leaves free under the cap (the device's memory when
        there is no cap); ``None`` without either."""
        limit = self.memory_cap if self.memory_cap not in (None, NO_CAP) else self.device_memory_bytes
        if self.best is None or limit is None:
            return None
        return limit - self.best.summary.peak_memory_bytes

    @property
    def optimal_over(self) -> str:
        """What the result is optimal over, in one sentence: what each stage of the searches
        searched (``said``), for the plan's mesh."""
        mesh = self.best.mesh if self.best is not None else None
        return "exact over " + "".join(said.of(mesh) for said in self.said)


@arguments(build=a_callable, batch=positive_int, procs=positive_int, machine=as_machine,
           memory_cap=optional(a_memory_cap), act_bytes=positive_number, recipe=optional(a_recipe),
           compare=optional(a_recipe), base=optional(a_training_options), table_budget=optional(positive_number),
           engine=optional(an_engine), alternatives=non_negative_int, keep_priced=a_bool, rules=optional(a_rules),
           keep_to=engine_sequence, exporting=a_bool, reuse=optional(a_stage_reuse))
def plan_training(
    build: Callable[[int], object],
    batch: int,
    procs: int,
    machine,
    memory_cap: float | None = None,
    act_bytes: float = 2.0,
    recipe: Recipe | None = None,
    compare: Recipe | None = None,
    base: TrainingOptions | None = None,
    free: bool | None = None,
    rebuild: bool = True,
    table_budget: int | None = None,
    engine=None,
    keep_to: tuple = (),
    exporting: bool = False,
    alternatives: int = 0,
    keep_priced: bool = False,
    rules=None,
    reuse=None,
) -> TrainingPlan:
    """The fastest training configuration of the network ``build`` makes, on ``procs`` devices.

    Parameters
    ----------
    build : callable
        ``build(sequences)``: the network at a global micro-batch of that many sequences.
    batch : int
        Sequences per step.
    machine : Machine
        What prices the work (``pase.machines.registry.load_machine("h100-sxm")``).
    memory_cap : float, optional
        Bytes per device the peak must fit. Default: the machine's device memory
        (``machine.memory_bytes``), as in the CLI; none on a machine without one.
        :data:`NO_CAP` searches without a cap: the result then says whether the plan
        exceeds the device (``TrainingPlan.exceeds_device``).
    recipe, compare : Recipe, optional
        Fixed choices of the plan, and a recipe to price beside it.
    free : bool, optional
        Run the per-layer search (default: when its tables are at most
        :data:`FREE_SEARCH_ENTRIES`); a recipe that fixes ``dp`` or ``tp`` asks for a mesh.
    rebuild : bool
        Whether ``build`` takes other batch sizes (a graph file does not: one micro-batch).
    engine : EngineProfile, optional
        The engine the plan is priced for (``pase.planning.engine``).
    keep_to : tuple of EngineProfile
        Keep to the configurations every one of these engines runs
        (``pase.planning.engine_runs``): meshes only, no per-layer plan; ``exporting``: and
        that their files can say (``runs.export``).
    alternatives : int
        How many of the fastest distinct fitting configurations to keep, in full
        (``TrainingPlan.alternatives``, fastest first, the plan first).
    keep_priced : bool
        Keep every configuration the mesh search priced (``TrainingPlan.priced``).

    A plan returned never needs more than the cap; with the cap above the device's memory
    (or :data:`NO_CAP`) ``exceeds_device`` says when it needs more than the device has.
    rules : ParallelRules, optional
        Mesh axes to dimension roles (``pase.planning.rules``; default the shipped table).
    reuse : StageReuse, optional
        What the mesh searches take from work done before (``pase.planning.training_search``):
        a sweep's (``pase.planning.training_sweep``) shares networks, costings and edge tables
        across device counts. The plan is the same.
    """
    start = time.perf_counter()
    build = lru_cache(maxsize=None)(build)
    device = machine.memory_bytes
    if memory_cap is None:
        memory_cap = device
    elif memory_cap == NO_CAP:
        memory_cap = None
    recipe = recipe or Recipe()
    base = base or (engine.base_options(machine) if engine is not None else TrainingOptions())
    if recipe.tp_overlap is not None:
        base = base.but(tp_overlap=recipe.tp_overlap)
    found = search_meshes(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, rebuild=rebuild,
                          engine=engine, keep_all=keep_priced, keep_best=alternatives, keep_to=keep_to,
                          exporting=exporting, rules=rules, reuse=reuse)
    base = _in_plan_format(base, found)
    per_layer = per_layer_stage(found, build, batch, procs, machine, memory_cap, act_bytes, recipe, base, free,
                                engine, keep_to, table_budget)
    compared = _compared(compare, build, batch, procs, machine, memory_cap, act_bytes, base, rebuild, engine, rules,
                         keep_to, reuse)
    best = per_layer.best
    priced = found.candidates
    found.candidates = []
    chosen = _alternatives(best, found.fastest, alternatives)
    found.fastest = []
    return TrainingPlan(
        network_name=found_name(build, batch, rebuild),
        procs=procs, batch=batch, machine=machine, memory_cap=memory_cap, best=best,
        least_memory=found.least_memory, mesh_search=found, free_searches=per_layer.searches,
        free_entries=per_layer.entries, free_skipped=per_layer.skipped, compare=compared,
        compare_recipe=None if compare is None else compare.text(),
        seconds=time.perf_counter() - start, kept_to=tuple(p.name for p in keep_to),
        engine_profile=engine,
        network=None if best is None else build(batch // best.options.microbatches),
        device_memory_bytes=device, priced=priced if keep_priced else [], alternatives=chosen,
        said=found.said + (per_layer.said,),
    )


def _in_plan_format(base: TrainingOptions, found: MeshSearch) -> TrainingOptions:
    """``base`` in the number format of the mesh search's plan (its least-memory one where none fits)."""
    chosen = found.best or found.least_memory
    if chosen is None:
        return base
    return base.but(precision=chosen.options.precision, fp8_scaling=chosen.options.fp8_scaling,
                    fp8_gather=chosen.options.fp8_gather)


class PerLayer(NamedTuple):
    """The per-layer stage's outcome: the fastest fitting plan (the mesh search's where no
    per-layer plan beats it), the searches run and table entries filled, or why it was
    skipped, and what it searched (:class:`~pase.planning.training_search.Said`)."""

    best: Candidate | None
    searches: int
    entries: int
    skipped: str | None
    said: Said


def per_layer_stage(found: MeshSearch, build, batch: int, procs: int, machine, memory_cap, act_bytes: float,
                    recipe: Recipe, base: TrainingOptions, free, engine, keep_to: tuple, table_budget) -> PerLayer:
    """The per-layer search (:func:`~pase.planning.free_search.search_free`) at the mesh plan's
    micro-batch count under every ZeRO stage and recomputation policy, where asked for and its
    tables are small enough (:data:`FREE_SEARCH_ENTRIES`): the faster fitting plan wins."""
    best = found.best
    searches = entries = 0
    skipped = _per_layer_skipped(recipe, free, keep_to)
    if skipped is None:
        reference = best or found.least_memory
        m = reference.options.microbatches
        network = build(batch // m)
        # Block recomputation takes a recipe's count here (the mesh search searches it).
        settings = [(zero, policy) for zero, policy in options_grid(recipe, engine)
                    if policy != "block" or recipe.recompute_layers is not None]
        # A lower bound of one dynamic programme's work, known before any cost table: every
        # edge's table is at least its two configuration counts multiplied.
        counts = [len(C) for C in network.configs(procs)]
        work = (sum(counts[u] * counts[v] for (u, v) in network.edges) + sum(counts)) * len(settings)
        if free is None and work > FREE_SEARCH_ENTRIES:
            skipped = f"{work:.2g} table entries over {len(settings)} settings, more than {FREE_SEARCH_ENTRIES:.0e}"
        else:
            # One graph, costing and set of edge matrices for every setting (TrainingGraphs).
            pieces = TrainingGraphs(network, procs, machine, table_budget)
            for zero, policy in settings:
                options = base.but(zero=zero, recompute=policy, microbatches=m, tp_overlap=reference.options.tp_overlap,
                                   recompute_layers=recipe.recompute_layers if policy == "block" else 0)
                result = search_free(network, procs, machine, options, act_bytes, memory_cap, budget=table_budget,
                                     pieces=pieces, microbatch=reference.microbatch)
                searches += result.searches
                entries += result.table_entries
                c = result.candidate
                if c is not None and c.fits and (best is None or c.summary.step_seconds < best.summary.step_seconds):
                    best = c
    return PerLayer(best, searches, entries, skipped, _per_layer_said(searches, skipped, memory_cap))


def _per_layer_skipped(recipe: Recipe, free, keep_to: tuple) -> str | None:
    """Why the per-layer search does not run (``None``: it may)."""
    # Per-layer splits have no mesh and no pipeline: a recipe that fixes either asks for a mesh.
    mesh_fixed = any(getattr(recipe, k) is not None for k in ("dp", "tp", "cp", "sp", "schedule", "vpp")) or \
        (recipe.pp or 1) > 1
    if keep_to:
        return "engines run meshes"
    if free is False:
        return "not asked for"
    if mesh_fixed:
        return "the recipe fixes the mesh"
    return None


def _per_layer_said(searches: int, skipped: str | None, memory_cap) -> Said:
    if searches:
        return Said(f"; per-layer splits searched exactly at the best mesh's micro-batch count under every ZeRO "
                    f"stage and recomputation policy ({searches} searches"
                    + (", memory by the Lagrangian bound" if memory_cap is not None else "") + ")")
    return Said(f"; per-layer search skipped: {skipped}" if skipped else "")


def _compared(compare: Recipe | None, build, batch: int, procs: int, machine, memory_cap, act_bytes: float,
              base: TrainingOptions, rebuild: bool, engine, rules, keep_to: tuple, reuse=None) -> Candidate | None:
    """The compared recipe's fastest fitting configuration; if none fits, its fastest."""
    if compare is None:
        return None
    try:
        compared = search_meshes(build, batch, procs, machine, memory_cap, act_bytes, compare, base,
                                 rebuild=rebuild, engine=engine, rules=rules, keep_to=keep_to, reuse=reuse).best
        if compared is None:
            compared = search_meshes(build, batch, procs, machine, None, act_bytes, compare, base,
                                     rebuild=rebuild, engine=engine, rules=rules, keep_to=keep_to, reuse=reuse).best
        return compared
    except ValueError as err:
        raise ValueError(f"--compare: {err}") from None


def _alternatives(best, fastest: list, k: int) -> list:
    """The ``k`` fastest distinct fitting configurations, fastest first: the plan, then the
    mesh search's fastest (``MeshSearch.fastest``: distinct in step and memory) other than
    it. A configuration equal in step and memory to one already shown (selective
    recomputation where it recomputes nothing) is left out."""
    if best is None or k <= 0:
        return []
    shown = [best]
    seen = {best.recipe()}
    figures = {_figures(best)}
    for candidate in fastest:
        if len(shown) >= k:
            break
        if candidate.recipe() in seen or _figures(candidate) in figures:
            continue
        seen.add(candidate.recipe())
        figures.add(_figures(candidate))
        shown.append(candidate)
    return shown


def _figures(candidate) -> tuple:
    """Step (to the nanosecond) and peak (to the byte): what tells two plans apart."""
    return round(candidate.summary.step_seconds, 9), round(candidate.summary.peak_memory_bytes)


def found_name(build, batch: int, rebuild: bool) -> str:
    return build(batch).name
