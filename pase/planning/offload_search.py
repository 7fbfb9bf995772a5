"""Offload in the training search: the recipe an offload implies (no pipeline, ZeRO-3 for
``params``, no recomputation for ``activations``) and the offload plans tried where nothing fits."""

from __future__ import annotations

import dataclasses
from typing import Callable

from pase.machines.host import host_side
from pase.planning.engine_runs import offload_refusal
from pase.planning.mesh import Recipe, check_offload

__all__ = ["offload_recipe", "OFFLOAD_TRIES", "host_fits", "try_offload", "could_fit"]

#: What the search tries where nothing fits, in order (the fastest that fits is the plan): the
#: optimizer on the host (DeepSpeed ZeRO-Offload, Megatron's --optimizer-cpu-offload); with it
#: ZeRO-3's parameter shards (FSDP2 CPUOffloadPolicy, DeepSpeed offload_param); the stored
#: activations (Megatron's --cpu-offloading-num-layers); all three.
OFFLOAD_TRIES = (("optimizer",), ("optimizer", "params"), ("activations",), ("optimizer", "params", "activations"))


def offload_recipe(recipe: Recipe) -> Recipe:
    """``recipe`` with what its ``offload`` implies fixed where it leaves it open: ``pp=1``
    (offload is priced without a pipeline), ``zero=3`` with ``params``, ``recompute=none``
    with ``activations`` (Megatron-Core's constraint)."""
    kinds = recipe.offload or ()
    changes: dict = {}
    if kinds and recipe.pp is None:
        changes["pp"] = 1
    if "params" in kinds and recipe.zero is None:
        changes["zero"] = 3
    if "activations" in kinds and recipe.recompute is None:
        changes["recompute"] = "none"
    return dataclasses.replace(recipe, **changes) if changes else recipe


def host_fits(plan, machine) -> bool:
    """Whether an offloading plan's host memory fits its node's (``host_memory_bytes`` per
    device times the devices of a node, at most the host's memory) and its drive's."""
    host = host_side(machine)
    best = plan.best
    if host is None or best is None:
        return False
    node = min(int(machine.devices_per_node or 1), int(plan.procs))
    extra = best.summary.extra
    if extra.get("host_memory_bytes", 0.0) * node > host.memory_bytes:
        return False
    return extra.get("drive_bytes", 0.0) * node <= host.nvme_bytes


def try_offload(plan_at: Callable, recipe: Recipe, machine, engines=()):
    """The fastest plan among :data:`OFFLOAD_TRIES` that fits on the device and on the host
    (``plan_at(recipe)``: the search under a recipe), or ``None``. A try the recipe refuses
    (``params`` with another ZeRO stage, ``activations`` with recomputation, a pipeline) is
    skipped, and so is one an engine of ``engines`` (names) does not run
    (``pase.planning.engine_runs.offload_refusal``); a machine without a host side tries none."""
    if host_side(machine) is None:
        return None
    best = None
    for kinds in OFFLOAD_TRIES:
        if any(offload_refusal(name, kinds) for name in engines):
            continue
        try:
            tried = dataclasses.replace(recipe, offload=kinds)
            check_offload(tried.fixed())
            plan = plan_at(offload_recipe(tried))
        except ValueError:
            continue
        if plan.best is None or not host_fits(plan, machine):
            continue
        if best is None or plan.best.summary.step_seconds < best.best.summary.step_seconds:
            best = plan
    return best


def could_fit(least, memory_cap: float) -> bool:
    """Whether offload could bring the least-memory configuration under ``memory_cap``: its
    peak less all its model state and stored activations (what offload may move; a bound,
    so that "nothing fits" stays instant where offload cannot help)."""
    if least is None or memory_cap is None:
        return False
    s = least.summary
    kinds = s.extra.get("memory_kinds") or s.memory
    movable = sum(kinds.get(k, 0.0) for k in ("model_state", "activations", "fragmentation"))
    return s.peak_memory_bytes - movable <= memory_cap
