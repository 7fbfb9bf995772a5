"""Machines by name: the registry that ``--machine`` and ``pase.load_machine`` read.

A machine kind is one module implementing ``pase.machines.base.Machine`` and one entry here:
a preset name and the function that builds it. A name that is no preset is read as a machine
description file (a calibrated machine).
"""

from __future__ import annotations

from typing import Callable

from pase.core.checks import ArgumentTypeError, arguments, optional, positive_number, text

from .base import Machine
from .calibrated import PRESETS as CALIBRATED_PRESETS, load_calibrated, load_description
from .paper import Machine as PaperMachine

__all__ = ["PRESETS", "MACHINE_NAMES", "load_machine", "preset_of", "as_machine"]


def _paper(name: str, flops: float | None, bw: float | None) -> PaperMachine:
    return PaperMachine(10.0 if flops is None else flops, 16.0 if bw is None else bw)


def _calibrated(name: str, flops: float | None, bw: float | None) -> Machine:
    if flops is not None or bw is not None:
        raise ValueError(f"--flops and --bw tune the paper machine only; machine {name!r} has its own figures")
    return load_calibrated(name)


#: Preset name -> ``build(name, flops, bw)``; ``flops`` and ``bw`` tune the paper machine only.
PRESETS: dict[str, Callable[[str, float | None, float | None], Machine]] = {
    "paper": _paper,
    **{name: _calibrated for name in CALIBRATED_PRESETS},
}
def _is_paper(recorded: dict) -> bool:
    # Its rates are settings of their own (--flops, --bw); the name says the kind.
    return set(recorded) <= {"name", "flops", "bw", "rho"}


def _is_calibrated_preset(recorded: dict) -> bool:
    # A machine file may reuse a preset's name with other figures: the whole description must match.
    return recorded == load_description(recorded["name"])


#: Preset name -> ``recorded(describe())``: whether a machine a plan recorded is that preset.
RECORDED = {"paper": _is_paper, **{name: _is_calibrated_preset for name in CALIBRATED_PRESETS}}
#: What builds a machine that is not a preset: a machine description file.
FROM_FILE = _calibrated
#: The names ``--machine`` takes, the reference machine first.
MACHINE_NAMES = tuple(PRESETS)


@arguments(spec=text, flops=optional(positive_number), bw=optional(positive_number))
def load_machine(spec: str = "paper", flops: float | None = None, bw: float | None = None) -> Machine:
    """The machine ``spec`` names: ``"paper"`` (the reference model, tuned by ``flops`` and
    ``bw``), a calibrated preset such as ``"h100-sxm"``, or a machine description file.

    Raises ``ValueError`` with one clear line for an unknown name or a bad description.
    """
    return PRESETS.get(spec, FROM_FILE)(spec, flops, bw)


def preset_of(recorded: dict) -> str | None:
    """The preset that a machine recorded in a plan (its ``describe()``) is, or None for a
    machine from a file."""
    name = recorded.get("name")
    return name if name in RECORDED and RECORDED[name](recorded) else None


def as_machine(value, name: str = "machine") -> Machine:
    """A machine argument of a public function: a machine object as it is, a preset name or a
    machine file's path loaded (``load_machine``), ``None`` the paper machine; ``TypeError``
    naming the argument for anything else.

    >>> as_machine("h100-sxm").name, as_machine(None).name
    ('h100-sxm', 'paper')
    """
    if value is None:
        return PaperMachine()
    if isinstance(value, str):
        return load_machine(value)
    if not all(hasattr(value, a) for a in ("check_procs", "cost_unit")):
        raise ArgumentTypeError(f"{name} must be a machine (pase.Machine, pase.CalibratedMachine, a preset name such as "
                        f"{MACHINE_NAMES[-1]!r} or a machine file), got {type(value).__name__}")
    return value
