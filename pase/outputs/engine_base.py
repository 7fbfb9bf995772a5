"""What every engine writer shares: the refusal it raises, the engine's profile switches as set,
the torchrun line, and the check of a plan against the engine's ``runs`` (docs/engines.md)."""

from __future__ import annotations

from pase.planning.engine_runs import EnginePlan, refusal

__all__ = ["EngineRefusal", "DEVICES_PER_NODE", "check_runs", "setting", "compiled", "torchrun", "nodes"]

#: Devices per node in the launch commands (torchrun's --nproc-per-node): the H100/H200/A100
#: servers of the machine presets have 8.
DEVICES_PER_NODE = 8

_NAMES = {"torchtitan": "torchtitan", "megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}


class EngineRefusal(ValueError):
    """The engine cannot run the plan as priced; the message says why."""

    def __init__(self, engine: str, reason: str):
        self.engine = engine
        self.reason = reason
        super().__init__(f"{_NAMES[engine]} cannot run this plan as priced: {reason}")


def check_runs(engine: str, plan: EnginePlan, profile=None) -> None:
    """Refuse what the engine (``profile``, else its shipped profile) does not run or its file
    cannot say (the profile's ``runs`` and ``runs.export``)."""
    reason = refusal(profile if profile is not None else engine, plan, export=True)
    if reason is not None:
        raise EngineRefusal(engine, reason)


def setting(profile, key: str):
    """The value a switch of the profile is set to (``None``: not set)."""
    return dict(profile.settings).get(key) if profile is not None else None


def compiled(profile) -> bool:
    return setting(profile, "compile") == "true"


def nodes(plan: EnginePlan, per_node: int) -> tuple:
    """``(nodes, devices per node)`` of the plan's devices, ``per_node`` to a node."""
    per_node = min(plan.procs, per_node)
    return -(-plan.procs // per_node), per_node


def torchrun(plan: EnginePlan, per_node: int) -> str:
    count, per_node = nodes(plan, per_node)
    return f"torchrun --nnodes {count} --nproc-per-node {per_node}"
