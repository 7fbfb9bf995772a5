"""``plan_training``: the fastest training configuration that fits and an engine runs, in
practitioners' terms; the one call behind both the library and the command line.

It runs the mesh search (exact over meshes, ZeRO stages, recomputation policies and
micro-batch sizes), kept to what the engine priced runs, and, where the exact per-layer tables
are small enough, the per-layer search under each ZeRO stage and recomputation policy at the
best mesh's micro-batch count, shown beside the plan. A recipe fixes any of the choices;
``compare`` prices one recipe's best configuration next to the optimum; where nothing fits,
more devices are priced (:func:`devices_to_fit`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, NamedTuple

from pase.planning.mesh import Recipe
from pase.costing.training import TrainingOptions
from pase.planning.engine import DEFAULT_ENGINE
from pase.planning.free_search import TrainingGraphs, search_free
from pase.planning.mesh_rows import candidate_of
from pase.planning.offload_search import could_fit, offload_recipe, try_offload
from pase.planning.ties import Bands, choose_plan
from pase.planning.training_search import (
    Candidate, EngineRunsNone, MeshSearch, Said, a_stage_reuse, options_grid, search_meshes,
)
from pase.core.checks import (
    a_bool, a_callable, a_memory_cap, a_recipe, a_rules, a_training_options, an_engine, arguments,
    non_negative_int, optional, positive_int, positive_number,
)
from pase.core.errors import TooLarge
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
    #: A per-layer plan faster than the plan, which no engine runs (``None``: none is): shown
    #: beside the plan, never chosen unless asked for (``per_layer=True``).
    per_layer: Candidate | None = None
    #: Where nothing fits: how many devices would (:class:`DeviceCount`, :func:`devices_to_fit`).
    fewest_devices: "DeviceCount | None" = None
    #: Where nothing fits and the recipe says ``offload=none``: the fastest offloading plan
    #: that would fit (``pase.planning.offload_search.try_offload``), else ``None``.
    offload_fit: "TrainingPlan | None" = None

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


def plan_arguments(devices: tuple, own: dict, last: dict) -> dict:
    """The checks of the arguments of :func:`plan_training` and of a sweep of it
    (``pase.planning.training_sweep.sweep_training``), in their order: ``devices`` the device
    count's ``(name, check)``, ``own`` the function's own flags (after ``rules``), ``last`` its
    last ones."""
    name, check = devices
    return {"build": a_callable, "batch": positive_int, name: check, "machine": as_machine,
            "memory_cap": optional(a_memory_cap), "act_bytes": positive_number, "recipe": optional(a_recipe),
            "compare": optional(a_recipe), "base": optional(a_training_options),
            "table_budget": optional(positive_number), "alternatives": non_negative_int, "keep_priced": a_bool,
            "rules": optional(a_rules), **own, "per_layer": a_bool, "fewest_devices": a_bool, **last}


@arguments(**plan_arguments(("procs", positive_int), {"exporting": a_bool}, {"reuse": optional(a_stage_reuse)}))
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
    engine=DEFAULT_ENGINE,
    keep_to: tuple | None = None,
    exporting: bool = False,
    alternatives: int = 0,
    keep_priced: bool = False,
    rules=None,
    per_layer: bool = False,
    fewest_devices: bool = True,
    reuse=None,
) -> TrainingPlan:
    """The fastest training configuration of the network ``build`` makes, on ``procs`` devices,
    that an engine runs: the command line's plan (``pase -g ... --machine ...``), by the same call.

    Parameters
    ----------
    build : callable
        ``build(sequences)``: the network at a global micro-batch of that many sequences.
    batch : int
        Sequences per step.
    machine : Machine or str
        What prices the work (``pase.load_machine("h100-sxm")``, or its name).
    memory_cap : float, optional
        Bytes per device the peak must fit. Default: the machine's device memory, as in the
        CLI; :data:`NO_CAP`: no cap (``TrainingPlan.exceeds_device`` then says if it is over).
    recipe, compare : Recipe, optional
        Fixed choices of the plan, and a recipe to price beside it.
    free : bool, optional
        Run the per-layer search (default: when its tables are at most
        :data:`FREE_SEARCH_ENTRIES`; never when a recipe fixes ``dp`` or ``tp``).
    rebuild : bool
        Whether ``build`` takes other batch sizes (a graph file does not: one micro-batch).
    engine : str or EngineProfile or None
        The engine the plan is priced for: a name as ``--engine`` takes it (``"torchtitan"``,
        ``"torchtitan,compile=true"``, a profile file) or a profile (``pase.load_engine``);
        default the command line's, :data:`~pase.planning.engine.DEFAULT_ENGINE`. ``None``
        prices the bare model, with no engine's kernels, overlaps, allocator or bands.
    keep_to : tuple of str or EngineProfile, optional
        Keep to the configurations every one of these engines runs
        (``pase.planning.engine_runs``; ``exporting``: and that their files can say): meshes
        only, no per-layer search, as ``--engine NAME`` asks. Default (``None``): to what
        ``engine`` runs where it runs the graph and the recipe (a decoder that declares its
        shape), with a faster per-layer plan beside the plan (``TrainingPlan.per_layer``);
        ``()`` keeps to nothing.
    per_layer : bool
        Let per-layer splits, which no engine runs, be the plan where they win (``--training
        --per-layer``; ``keep_to`` then keeps to nothing).
    fewest_devices : bool
        Where nothing fits: offload (:func:`_offloaded`), else how many devices would (:func:`devices_to_fit`).
    alternatives : int
        How many of the fastest distinct fitting configurations to keep, in full
        (``TrainingPlan.alternatives``, the plan first, then the fastest others).
    keep_priced, rules
        Keep every configuration priced (``TrainingPlan.priced``); the mesh axes' roles.
    reuse : StageReuse, optional
        Work the searches share across device counts (a sweep's); the plan is the same.

    The plan is the fastest fitting configuration, unless it is tight (its memory band's high
    end over the cap) and a configuration that ties with it (step bands overlapping by more than
    half, as ``--top`` marks ``=``) fits at its memory band: then the fastest such tie
    (:func:`~pase.planning.ties.choose_plan`). Never over the cap; with the cap above the
    device's memory (or :data:`NO_CAP`) ``exceeds_device`` says when it needs more than it has.
    """
    start = time.perf_counter()
    build = lru_cache(maxsize=None)(build)
    given = dict(recipe=recipe, base=base, rebuild=rebuild, table_budget=table_budget, engine=engine, keep_to=keep_to,
                 exporting=exporting, rules=rules, per_layer=per_layer, act_bytes=act_bytes)
    device = machine.memory_bytes
    memory_cap = device if memory_cap is None else None if memory_cap == NO_CAP else memory_cap
    recipe, engine = recipe or Recipe(), as_engine(engine)
    named = keep_to is not None
    keep_to = _kept_to(keep_to, engine, build, batch, recipe, per_layer)
    base = base or (engine.base_options(machine) if engine is not None else TrainingOptions())
    recipe, base = _recipe_base(recipe, base)

    def meshes(kept: tuple) -> MeshSearch:
        return search_meshes(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, rebuild=rebuild,
                             engine=engine, keep_all=keep_priced, keep_best=alternatives, keep_to=kept,
                             exporting=exporting, rules=rules, reuse=reuse)

    found, keep_to = _searched(meshes, keep_to, named)
    base = _in_plan_format(base, found)
    stage = per_layer_stage(found, build, batch, procs, machine, memory_cap, act_bytes, recipe, base, free,
                            engine, keep_to if named else (), table_budget, beside=bool(keep_to))
    compared = _compared(compare, build, batch, procs, machine, memory_cap, act_bytes, base, rebuild, engine, rules,
                         keep_to if named else (), reuse)
    best = stage.best
    priced, fastest = _taken(found)
    chosen = _alternatives(best, fastest, alternatives)
    offload_fit = _offloaded(best, fewest_devices, recipe, found, memory_cap, machine, keep_to, lambda r: plan_training(
        build, batch, procs, machine, memory_cap, free=False, fewest_devices=False, **dict(given, recipe=r)))
    if offload_fit is not None and recipe.offload is None:
        return dataclasses.replace(offload_fit, seconds=time.perf_counter() - start)
    fewest = devices_to_fit(found.least_memory, procs, memory_cap, machine, lambda n: plan_training(
        build, batch, n, machine, memory_cap, free=False, fewest_devices=False, **given)) \
        if best is None and fewest_devices and memory_cap is not None and found.least_memory is not None else None
    return TrainingPlan(
        network_name=found_name(build, batch, rebuild),
        procs=procs, batch=batch, machine=machine, memory_cap=memory_cap, best=best,
        least_memory=found.least_memory, mesh_search=found, free_searches=stage.searches,
        free_entries=stage.entries, free_skipped=stage.skipped, compare=compared,
        compare_recipe=None if compare is None else compare.text(),
        seconds=time.perf_counter() - start, kept_to=tuple(p.name for p in keep_to), engine_profile=engine,
        network=None if best is None else build(batch // best.options.microbatches),
        device_memory_bytes=device, priced=priced if keep_priced else [], alternatives=chosen,
        said=found.said + (stage.said, _chosen_said(found, best, memory_cap)), per_layer=stage.beside,
        fewest_devices=fewest, offload_fit=offload_fit,
    )


def _recipe_base(recipe: Recipe, base: TrainingOptions) -> tuple:
    """``(recipe, base)`` with what the recipe sets in the options (``tp_overlap``, ``offload``)
    and what an offload implies fixed (:func:`~pase.planning.offload_search.offload_recipe`)."""
    if recipe.tp_overlap is not None:
        base = base.but(tp_overlap=recipe.tp_overlap)
    if recipe.offload:
        recipe, base = offload_recipe(recipe), base.but(offload=recipe.offload)
    return recipe, base


def _offloaded(best, fewest_devices: bool, recipe: Recipe, found: MeshSearch, memory_cap, machine, keep_to,
               plan_at: Callable):
    """Where nothing fits on the devices alone (and the fewest devices are asked for: not for
    the counts :func:`devices_to_fit` prices), the fastest offloading plan that fits
    (:func:`~pase.planning.offload_search.try_offload`, ``plan_at(recipe)`` its searches): the
    plan, unless the recipe says ``offload=none`` (then ``TrainingPlan.offload_fit``, which the
    refusal names); else ``None``."""
    if best is not None or not fewest_devices or recipe.offload not in (None, ()) \
            or not could_fit(found.least_memory, memory_cap):
        return None
    return try_offload(plan_at, recipe, machine, tuple(getattr(p, "name", p) for p in keep_to))


def _taken(found: MeshSearch) -> tuple:
    """``(priced, fastest)`` taken out of the mesh search, with what it kept for choosing (the
    costings its configurations hold) let go."""
    priced, fastest = found.candidates, found.fastest
    found.candidates, found.fastest, found.contenders, found.chosen = [], [], [], None
    return priced, fastest


def _searched(meshes: Callable, keep_to: tuple, named: bool) -> tuple:
    """``(MeshSearch, engines kept to)``: the mesh search kept to ``keep_to``; where the engines
    were not named (the default engine's) and run nothing the recipe allows, kept to none."""
    try:
        return meshes(keep_to), keep_to
    except EngineRunsNone:
        if named or not keep_to:
            raise
        return meshes(()), ()


def as_engine(engine, name: str = "engine"):
    """An engine profile from a name as ``--engine`` takes it (``ValueError`` naming the engines
    where it is none), a profile, or ``None`` (none)."""
    if engine is None:
        return None
    if isinstance(engine, str):
        from pase.planning.engine import load_engine

        return load_engine(engine)
    an_engine(engine, name)
    return engine


def _kept_to(keep_to, engine, build, batch: int, recipe: Recipe, per_layer: bool) -> tuple:
    """The engines the search keeps to: those given (names or profiles), else the engine priced
    where it can build the graph and has the recipe's recomputation (none with ``per_layer``)."""
    if keep_to is not None:
        if isinstance(keep_to, str) or not hasattr(keep_to, "__iter__"):
            raise TypeError(f"keep_to must be a sequence of engine names or profiles, got {keep_to!r}"[:200])
        kept = tuple(as_engine(e, f"keep_to[{i}]") for i, e in enumerate(keep_to))
        if any(e is None for e in kept):
            raise TypeError("keep_to holds engine names or profiles, not None")
        if per_layer and kept:
            raise ValueError("per_layer lets a plan no engine runs win; keep_to keeps to what engines run: give one")
        return kept
    if engine is None or per_layer:
        return ()
    from pase.planning.engine_runs import check_engine, policy_refusal

    try:
        check_engine(engine, build(batch))
    except ValueError:  # an imported model, a graph file, a network of the paper: no engine builds it
        return ()
    if recipe.recompute is not None and policy_refusal(engine, recipe.recompute) is not None:
        return ()
    return (engine,)


def _in_plan_format(base: TrainingOptions, found: MeshSearch) -> TrainingOptions:
    """``base`` in the number format of the mesh search's plan (its least-memory one where none fits)."""
    chosen = found.best or found.least_memory
    if chosen is None:
        return base
    return base.but(precision=chosen.options.precision, fp8_scaling=chosen.options.fp8_scaling,
                    fp8_gather=chosen.options.fp8_gather)


class PerLayer(NamedTuple):
    """The per-layer stage's outcome: the plan (the mesh search's where no per-layer plan may or
    does win), the per-layer plan shown beside it (faster, and no engine runs it; ``None``
    otherwise), the searches run and table entries filled, or why it was skipped, and what it
    searched (:class:`~pase.planning.training_search.Said`)."""

    best: Candidate | None
    beside: Candidate | None
    searches: int
    entries: int
    skipped: str | None
    said: Said


def per_layer_stage(found: MeshSearch, build, batch: int, procs: int, machine, memory_cap, act_bytes: float,
                    recipe: Recipe, base: TrainingOptions, free, engine, keep_to: tuple, table_budget,
                    beside: bool = False) -> PerLayer:
    """The per-layer search (:func:`~pase.planning.free_search.search_free`) at the mesh plan's
    micro-batch count under every ZeRO stage and recomputation policy, where asked for and its
    tables are small enough (:data:`FREE_SEARCH_ENTRIES`). ``beside``: the plan stays the mesh
    search's (an engine runs it) and a faster per-layer plan is shown beside it; else the
    per-layer plan competes with the meshes (:func:`~pase.planning.ties.choose_plan`)."""
    best = found.best
    searches = entries = 0
    fastest = None
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
                if c is not None and c.fits and (fastest is None or c.summary.step_seconds < fastest.summary.step_seconds):
                    fastest = c
    shown = None
    if fastest is not None and beside:
        faster = best is None or fastest.summary.step_seconds < best.summary.step_seconds
        shown = fastest if faster else None
    elif fastest is not None:
        best = _with_per_layer(found, fastest, engine, memory_cap, act_bytes, procs)
    return PerLayer(best, shown, searches, entries, skipped, _per_layer_said(searches, skipped, memory_cap,
                                                                             shown is not None))


def _with_per_layer(found: MeshSearch, per_layer: Candidate, engine, memory_cap, act_bytes: float,
                    procs: int) -> Candidate:
    """The plan of the mesh search's contenders and a per-layer plan, by the rule of ties."""
    entries = list(found.contenders) + [(per_layer.summary.step_seconds, per_layer.summary.peak_memory_bytes,
                                         per_layer)]
    payload = choose_plan(entries, Bands.of(engine), memory_cap).entry[2]
    if payload is per_layer:
        return per_layer
    if payload is found.chosen:
        return found.best
    return candidate_of(payload, memory_cap, act_bytes, procs)


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


def _per_layer_said(searches: int, skipped: str | None, memory_cap, beside: bool = False) -> Said:
    if searches:
        return Said(f"; per-layer splits searched exactly at the best mesh's micro-batch count under every ZeRO "
                    f"stage and recomputation policy ({searches} searches"
                    + (", memory by the Lagrangian bound" if memory_cap is not None else "") + ")"
                    + (", the fastest shown beside the plan: no engine runs it" if beside else ""))
    return Said(f"; per-layer search skipped: {skipped}" if skipped else "")


class DeviceCount(NamedTuple):
    """How many devices would fit what nothing fits on ``procs``: ``estimate``, the count the
    least-memory configuration's per-device memory asks for (:func:`estimated_devices`);
    ``count``, the fewest of the counts priced that fits (``None``: none of them did) and its
    plan (``best``); ``priced``, the counts priced in order; ``fewer``, the count below
    ``count`` that was priced and does not fit (``None``: none was priced); ``least``: no count
    between ``procs`` and ``count`` of those tried (whole nodes, powers of two within one) fits."""

    estimate: int
    count: int | None
    best: Candidate | None
    priced: tuple
    fewer: int | None
    least: bool


def estimated_devices(least: Candidate, procs: int, cap: float) -> int | None:
    """The devices the least-memory configuration on ``procs`` would need to fit ``cap``, its
    memory spread evenly over more of them but for the reserve and the communication buffers
    (the same on every device): ``ceil(procs (peak - fixed) / (cap - fixed))``; ``None`` where the
    fixed part alone is over the cap.

    >>> from types import SimpleNamespace as N
    >>> least = N(summary=N(peak_memory_bytes=922e9), memory_kinds=lambda: {"reserve": 1e9, "comm_buffers": 1e9})
    >>> estimated_devices(least, 8, 85.5e9)   # 8 x 920 / 83.5 = 88.1
    89
    """
    kinds = least.memory_kinds()
    fixed = kinds.get("reserve", 0.0) + kinds.get("comm_buffers", 0.0)
    if cap <= fixed:
        return None
    return max(procs + 1, math.ceil(procs * (least.summary.peak_memory_bytes - fixed) / (cap - fixed)))


#: Counts priced at most by :func:`devices_to_fit` (up from the estimate, then down).
DEVICE_COUNTS_PRICED = 3


def devices_to_fit(least: Candidate, procs: int, cap: float, machine, plan_at: Callable) -> DeviceCount | None:
    """How many devices would fit: from :func:`estimated_devices`, rounded up to whole nodes
    (``machine.devices_per_node``; a power of two within one node), the search run again
    (``plan_at(count)``, a ``TrainingPlan``) up a node at a time (doubling within one) while
    nothing fits, then down while the count below fits, :data:`DEVICE_COUNTS_PRICED` counts at
    most. ``None`` where the reserve alone is over the cap."""
    estimate = estimated_devices(least, procs, cap)
    if estimate is None:
        return None
    node = machine.devices_per_node or 1

    def up(n: int) -> int:
        return n + node if n >= node else min(node, 2 * n)

    def down(n: int) -> int:
        return n - node if n > node else n // 2

    count = node * math.ceil(estimate / node) if estimate > node else min(node, 1 << (estimate - 1).bit_length())
    tried: dict = {}

    def fits(n: int):
        if n not in tried:
            try:
                machine.check_procs(n)
                tried[n] = plan_at(n).best
            except (ValueError, TooLarge):  # the machine cannot hold n, no mesh of n devices applies, too large
                tried[n] = None
        return tried[n]

    while fits(count) is None and len(tried) < DEVICE_COUNTS_PRICED:
        count = up(count)
    if fits(count) is None:
        return DeviceCount(estimate, None, None, tuple(tried), None, False)
    while down(count) > procs and len(tried) < DEVICE_COUNTS_PRICED and fits(down(count)) is not None:
        count = down(count)
    below = down(count)
    fewer = below if below in tried and tried[below] is None else None
    return DeviceCount(estimate, count, tried[count], tuple(tried), fewer, below <= procs or fewer is not None)


def _chosen_said(found: MeshSearch, best: Candidate | None, memory_cap) -> Said:
    """The rule of ties in words, where it chose another plan than the fastest fitting one."""
    if best is None or found.fastest_step is None or best.summary.step_seconds <= found.fastest_step:
        return Said("")
    slower = 100 * (best.summary.step_seconds / found.fastest_step - 1)
    if found.rule == "headroom":
        return Said(f"; the plan needs the least memory of the configurations tying with the fastest ({slower:.1f} % "
                    "slower, step bands overlapping by more than half), none of which fits at its memory band")
    return Said(f"; the plan is the fastest of the configurations tying with the fastest (step bands overlapping by "
                f"more than half) that fits at its memory band's high end: {slower:.1f} % slower than the fastest, "
                "which fits only at its modelled peak")


def _compared(compare: Recipe | None, build, batch: int, procs: int, machine, memory_cap, act_bytes: float,
              base: TrainingOptions, rebuild: bool, engine, rules, keep_to: tuple, reuse=None) -> Candidate | None:
    """The compared recipe's fastest fitting configuration; if none fits, its fastest."""
    if compare is None:
        return None
    try:
        compared = search_meshes(build, batch, procs, machine, memory_cap, act_bytes, compare, base,
                                 rebuild=rebuild, engine=engine, rules=rules, keep_to=keep_to,
                                 reuse=reuse).best
        if compared is None:
            compared = search_meshes(build, batch, procs, machine, None, act_bytes, compare, base,
                                     rebuild=rebuild, engine=engine, rules=rules, keep_to=keep_to,
                                     reuse=reuse).best
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
