"""``plan_training``: the fastest training configuration that fits, in practitioners' terms.

It runs the mesh search (exact over meshes, ZeRO stages, recomputation policies and
micro-batch sizes) and, where the exact per-layer tables are small enough, the per-layer
search under each ZeRO stage and recomputation policy at the best mesh's micro-batch count;
the faster fitting plan wins. A recipe fixes any of the choices; ``compare`` prices one
recipe's best configuration next to the optimum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from pase.planning.mesh import Recipe
from pase.costing.training import TrainingOptions
from pase.planning.training_search import Candidate, MeshSearch, options_grid, search_free, search_meshes

__all__ = ["TrainingPlan", "plan_training", "FREE_SEARCH_ENTRIES"]

#: Largest dynamic-programme work (a lower bound in table entries, summed over the ZeRO and
#: recomputation settings) for which the per-layer search runs beside the mesh search by default: about a second of
#: work on one core.
FREE_SEARCH_ENTRIES = 50_000_000


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

    @property
    def optimal_over(self) -> str:
        """What the result is optimal over, in one sentence."""
        text = (f"exact over meshes dp x tp x cp x pp = {self.procs} (tp within a node, cp up to 16, sequence "
                "parallelism on or off; pipelines cut at block boundaries, first and last stages within 8 blocks of "
                "the others, 1F1B or interleaved), ZeRO 0-3, recomputation none/selective/full and every micro-batch "
                "size dividing the per-rank batch")
        if self.mesh_search.experts:
            text += "; expert parallelism ep dividing dp and every layer's expert count"
        if self.free_searches:
            text += (f"; per-layer splits searched exactly at the best mesh's micro-batch count under every ZeRO "
                     f"stage and recomputation policy ({self.free_searches} searches"
                     + (", memory by the Lagrangian bound" if self.memory_cap is not None else "") + ")")
        elif self.free_skipped:
            text += f"; per-layer search skipped: {self.free_skipped}"
        return text


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
) -> TrainingPlan:
    """The fastest training configuration of the network ``build`` makes, on ``procs`` devices.

    Parameters
    ----------
    build : callable
        ``build(sequences)``: the network at a global micro-batch of that many sequences.
    batch : int
        Sequences per step.
    memory_cap : float, optional
        Bytes per device the peak must fit (a calibrated machine's memory by default in
        the CLI).
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
    """
    start = time.perf_counter()
    recipe = recipe or Recipe()
    base = base or (engine.base_options() if engine is not None else TrainingOptions())
    if recipe.tp_overlap is not None:
        base = TrainingOptions(**{**base.__dict__, "tp_overlap": recipe.tp_overlap})
    found = search_meshes(build, batch, procs, machine, memory_cap, act_bytes, recipe, base, rebuild=rebuild,
                          engine=engine, keep_to=keep_to, exporting=exporting)
    best = found.best
    # Per-layer splits have no mesh and no pipeline: a recipe that fixes either asks for a mesh.
    mesh_fixed = any(getattr(recipe, k) is not None for k in ("dp", "tp", "cp", "sp", "schedule", "vpp")) or \
        (recipe.pp or 1) > 1
    free_searches = free_entries = 0
    skipped = None
    if keep_to:
        skipped = "engines run meshes"
    elif free is False:
        skipped = "not asked for"
    elif mesh_fixed:
        skipped = "the recipe fixes the mesh"
    else:
        reference = best or found.least_memory
        m = reference.options.microbatches
        network = build(batch // m)
        settings = options_grid(recipe, engine)
        # A lower bound of one dynamic programme's work, known before any cost table: every
        # edge's table is at least its two configuration counts multiplied.
        counts = [len(C) for C in network.configs(procs)]
        graph_entries = sum(counts[u] * counts[v] for (u, v) in network.edges) + sum(counts)
        work = graph_entries * len(settings)
        if free is None and work > FREE_SEARCH_ENTRIES:
            skipped = f"{work:.2g} table entries over {len(settings)} settings, more than {FREE_SEARCH_ENTRIES:.0e}"
        else:
            for zero, policy in settings:
                options = TrainingOptions(**{**base.__dict__, "zero": zero, "recompute": policy, "microbatches": m,
                                             "tp_overlap": reference.options.tp_overlap})
                result = search_free(network, procs, machine, options, act_bytes, memory_cap, budget=table_budget,
                                     microbatch=reference.microbatch)
                free_searches += result.searches
                free_entries += result.table_entries
                c = result.candidate
                if c is not None and c.fits and (best is None or c.summary.step_seconds < best.summary.step_seconds):
                    best = c
    compared = None
    if compare is not None:
        try:
            # The recipe's fastest fitting configuration; if none fits, its fastest.
            compared = search_meshes(build, batch, procs, machine, memory_cap, act_bytes, compare, base,
                                     rebuild=rebuild, engine=engine, keep_to=keep_to).best
            if compared is None:
                compared = search_meshes(build, batch, procs, machine, None, act_bytes, compare, base,
                                         rebuild=rebuild, engine=engine, keep_to=keep_to).best
        except ValueError as err:
            raise ValueError(f"--compare: {err}") from None
    return TrainingPlan(
        network_name=found_name(build, batch, rebuild),
        procs=procs, batch=batch, machine=machine, memory_cap=memory_cap, best=best,
        least_memory=found.least_memory, mesh_search=found, free_searches=free_searches, free_entries=free_entries,
        free_skipped=skipped, compare=compared, compare_recipe=None if compare is None else compare.text(),
        seconds=time.perf_counter() - start, kept_to=tuple(p.name for p in keep_to),
        engine_profile=engine,
    )


def found_name(build, batch: int, rebuild: bool) -> str:
    return build(batch).name
