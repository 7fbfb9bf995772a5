"""``sweep_training``: the training plan at each of several device counts (a scaling study), each
exactly the plan ``plan_training`` gives at that count alone, the searches sharing their work.

What the mesh searches of different counts have in common is shared through one
:class:`SweepStages` (a :class:`~pase.planning.training_search.StageReuse`): the networks built
per global micro-batch, their structures and mesh mappers (each mesh's configurations mapped
once), the edge tables of each pipeline stage's device count, and one costing per network of
the meshes every count runs on it. A mesh of ``s`` devices running a network is the same row
whether it is the whole machine or one of its pipeline stages, so a sweep over ``64, ..., 1024``
prices each such row once; each search takes its groups' columns of that costing, and prices
its options, pipelines and plan on them as it does alone.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

from pase.core.checks import ArgumentTypeError, a_bool, a_callable, arguments, optional, positive_int
from pase.core.errors import TooLarge
from pase.costing.training import NetworkStructure
from pase.planning.engine import DEFAULT_ENGINE
from pase.planning.mesh import MeshMapper, Recipe
from pase.planning.training_plan import TrainingPlan, plan_arguments, plan_training
from pase.planning.training_search import (
    Built, SearchSpace, StageReuse, _pipeline_choices, costing_stage, mesh_stage,
)

__all__ = ["SweepEntry", "TrainingSweep", "SweepStages", "sweep_training", "scaling_efficiency"]


@dataclass(frozen=True)
class SweepEntry:
    """One count of a sweep: its plan (``plan.best`` ``None`` where nothing fits: ``plan``
    then says how little the search could do with), or why no search ran (``refused``)."""

    devices: int
    plan: TrainingPlan | None
    refused: str | None = None

    @property
    def best(self):
        """The count's plan (a ``Candidate``), ``None`` where it has none."""
        return None if self.plan is None else self.plan.best


@dataclass
class TrainingSweep:
    """The plans of a sweep, one :class:`SweepEntry` per count in the order given, and the
    seconds the whole sweep took."""

    network_name: str
    batch: int
    machine: object
    entries: list
    seconds: float
    #: Per count, the seconds its search took in the sweep (the shared work falls to the first).
    count_seconds: list = field(default_factory=list)

    @property
    def planned(self) -> list:
        """The entries that have a plan."""
        return [e for e in self.entries if e.best is not None]


def scaling_efficiency(entries: list) -> list:
    """Per entry, its tokens per second per device over the first planned entry's (1 for that
    one; ``None`` before it, without a plan or without tokens/s): how well the work scales.

    >>> from types import SimpleNamespace as S
    >>> def e(tps): return S(best=S(summary=S(tokens_per_second_per_device=tps)))
    >>> scaling_efficiency([S(best=None), e(1000.0), e(900.0)])
    [None, 1.0, 0.9]
    """
    first = None
    out = []
    for entry in entries:
        tps = None if entry.best is None else entry.best.summary.tokens_per_second_per_device
        if tps is not None and first is None:
            first = tps
        out.append(None if tps is None or not first else tps / first)
    return out


# ---------------------------------------------------------------------------------------
# The shared stages


def _but_stages(mesh) -> tuple:
    """A mesh but for its pipeline stage count: what one stage's configurations read."""
    return mesh.dp, mesh.tp, mesh.cp, mesh.sp, mesh.ep, mesh.etp


class _KeptMapper(MeshMapper):
    """A :class:`MeshMapper` keeping each mesh's configurations: a sweep maps the same meshes
    once for its union of rows and again in the searches."""

    def __init__(self, network, rules):
        super().__init__(network, rules)
        self._kept: dict = {}

    def kind_configs(self, mesh) -> dict:
        key = _but_stages(mesh)  # a layer's configuration reads no pipeline degree
        if key not in self._kept:
            try:
                self._kept[key] = super().kind_configs(mesh)
            except ValueError as err:  # a mesh the layers cannot take: refused again, as it was
                self._kept[key] = err
        found = self._kept[key]
        if isinstance(found, ValueError):
            raise found
        return found


class _Union:
    """One costing of a network's rows at every count (:meth:`SweepStages.costed`): per device
    count of a stage, the group it was built from and that group's share of the costing."""

    def __init__(self, groups: dict, shares: dict):
        self.groups = groups
        self.shares = shares


#: Recipe fields the meshes and their rows do not read (options priced on the rows).
_NOT_MESH = ("zero", "recompute", "recompute_layers", "tp_overlap", "precision", "scaling", "fp8_gather")


def _mesh_key(space: SearchSpace, rules) -> tuple:
    """What stage 1 reads of a search space besides the count (the rows' recipe, experts, rules)."""
    recipe = Recipe(**{k: v for k, v in space.recipe.fixed().items() if k not in _NOT_MESH})
    return recipe, space.expert_counts, rules


def _same_group(a, b) -> bool:
    """Whether two groups of meshes (of any counts) make the same rows: the same meshes but for
    their stage count, the same micro-batches, the same configurations."""
    if (a.stage_devices, a.global_micro, len(a.meshes)) != (b.stage_devices, b.global_micro, len(b.meshes)):
        return False
    for (m, u), (n, v) in zip(a.meshes, b.meshes):
        if u != v or _but_stages(m) != _but_stages(n):
            return False
    return a.rows == b.rows


class SweepStages(StageReuse):
    """The stage work the searches of a sweep share (:class:`StageReuse`): networks' structures
    and mappers, edge tables by a stage's device count, and per network one costing of the rows
    every count of ``counts`` runs on it (their meshes found by the searches' own stage 1).

    A search whose groups are not all rows of that costing (another machine, a network not
    built by ``build``) is costed on its own, as without a sweep: sharing never changes a plan.
    """

    def __init__(self, build: Callable, batch: int, counts, machine, rebuild: bool = True):
        self.build, self.batch, self.counts, self.machine, self.rebuild = build, batch, tuple(counts), machine, rebuild
        self._built: dict = {}
        self._memos: dict = {}
        self._meshes: dict = {}
        self._unions: dict = {}
        self._sums: dict = {}

    def built(self, network, rules) -> Built:
        key = (id(network), rules)
        if key not in self._built:  # the Built holds the network: its id stays its own
            self._built[key] = Built(network, NetworkStructure.of(network), _KeptMapper(network, rules))
        return self._built[key]

    def parts_memo(self, machine, devices: int):
        if machine is not self.machine:
            return super().parts_memo(machine, devices)
        if devices not in self._memos:
            self._memos[devices] = super().parts_memo(machine, devices)
        return self._memos[devices]

    def costed(self, space: SearchSpace, built: Built, groups: list, machine, memos: dict) -> list:
        union = self._union(space, built, groups[0].global_micro, machine) if machine is self.machine else None
        shares = []
        for group in groups:
            mine = None if union is None else union.groups.get(group.stage_devices)
            if mine is None or not _same_group(mine, group):
                return costing_stage(built, groups, machine, memos)
            shares.append(union.shares[group.stage_devices])
        return shares

    def prefix_sums(self, share) -> dict | None:
        # A union's share is priced at several stage counts (a count's whole mesh, another's
        # pipeline stage): its prefix sums by settings serve them all.
        return self._sums.get(id(share))

    def _union(self, space: SearchSpace, built: Built, global_micro: int, machine) -> _Union | None:
        """The costing of ``built``'s network over the groups every count makes with it."""
        key = (_mesh_key(space, built.mapper.rules), global_micro, id(built.network))
        if key not in self._unions:
            found: dict = {}
            for procs in self.counts:
                meshes = self._meshes_of(space, procs, built.mapper.rules, machine)
                if meshes is None or meshes.networks.get(global_micro) is not built:
                    continue
                for group in meshes.groups:
                    if group.global_micro == global_micro:
                        found.setdefault(group.stage_devices, group)
            groups = [found[s] for s in sorted(found)]
            memos = {s: self.parts_memo(machine, s) for s in found}
            shares = costing_stage(built, groups, machine, memos) if groups else []
            self._unions[key] = _Union(found, dict(zip(sorted(found), shares))) if groups else None
            for share in shares:
                self._sums[id(share)] = {}
        return self._unions[key]

    def _meshes_of(self, space: SearchSpace, procs: int, rules, machine):
        """Stage 1 of ``space`` at ``procs`` devices (``None`` where it refuses that count)."""
        key = (_mesh_key(space, rules), procs)
        if key not in self._meshes:
            try:
                _, stage_counts = _pipeline_choices(space.recipe, procs)
                at = dataclasses.replace(space, stage_counts=tuple(stage_counts))
                self._meshes[key] = mesh_stage(at, self.build, self.batch, procs, machine, self.rebuild, rules, self)
            except ValueError:
                self._meshes[key] = None
        return self._meshes[key]


# ---------------------------------------------------------------------------------------
# The sweep


def _device_counts(value, name: str) -> tuple:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(f"{name} must be a sequence of device counts, got {type(value).__name__}")
    counts = tuple(positive_int(v, name) for v in value)
    if not counts:
        raise ValueError(f"{name} must hold at least one device count")
    if len(set(counts)) != len(counts):
        raise ValueError(f"{name} holds a device count twice: {list(counts)}")
    return counts


@arguments(**plan_arguments(("counts", _device_counts), {"rebuild": a_bool}, {"each": optional(a_callable)}))
def sweep_training(
    build: Callable[[int], object],
    batch: int,
    counts,
    machine,
    memory_cap: float | None = None,
    act_bytes: float = 2.0,
    recipe: Recipe | None = None,
    compare: Recipe | None = None,
    base=None,
    free: bool | None = None,
    rebuild: bool = True,
    table_budget: int | None = None,
    engine=DEFAULT_ENGINE,
    keep_to: tuple | None = None,
    alternatives: int = 0,
    keep_priced: bool = False,
    rules=None,
    per_layer: bool = False,
    fewest_devices: bool = True,
    each: Callable | None = None,
) -> TrainingSweep:
    """:func:`~pase.planning.training_plan.plan_training` at each device count of ``counts``:
    each count's plan is the one ``plan_training`` gives at that count alone with the same
    arguments (they are its own), the searches sharing what they have in common
    (:class:`SweepStages`). A count no search applies to (a recipe no mesh of it meets) gets a
    :class:`SweepEntry` saying why, and the sweep goes on. ``each(devices)``: called before
    each count's search (a progress bar)."""
    start = time.perf_counter()
    build = lru_cache(maxsize=None)(build)
    stages = SweepStages(build, batch, counts, machine, rebuild)
    entries, seconds = [], []
    for procs in counts:
        if each is not None:
            each(procs)
        began = time.perf_counter()
        try:
            plan = plan_training(build, batch, procs, machine, memory_cap=memory_cap, act_bytes=act_bytes,
                                 recipe=recipe, compare=compare, base=base, free=free, rebuild=rebuild,
                                 table_budget=table_budget, engine=engine, keep_to=keep_to,
                                 alternatives=alternatives, keep_priced=keep_priced, rules=rules, per_layer=per_layer,
                                 fewest_devices=fewest_devices, reuse=stages)
            entries.append(SweepEntry(procs, plan))
        except (ValueError, TooLarge) as err:  # this count only: a recipe it cannot meet
            entries.append(SweepEntry(procs, None, str(err)))
        seconds.append(time.perf_counter() - began)
    return TrainingSweep(build(batch).name, batch, machine, entries, time.perf_counter() - start, seconds)
