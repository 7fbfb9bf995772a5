"""Machines by name: the registry that ``--machine`` and ``pase.load_machine`` read.

A machine kind is one module implementing ``pase.machines.base.Machine`` and one entry here:
a preset name and the function that builds it. A name that is no preset is read as a machine
description file (a calibrated machine).
"""

from __future__ import annotations

from typing import Callable

from .base import Machine
from .calibrated import PRESETS as CALIBRATED_PRESETS, load_calibrated
from .paper import Machine as PaperMachine

__all__ = ["PRESETS", "MACHINE_NAMES", "load_machine"]


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
#: What builds a machine that is not a preset: a machine description file.
FROM_FILE = _calibrated
#: The names ``--machine`` takes, the reference machine first.
MACHINE_NAMES = tuple(PRESETS)


def load_machine(spec: str = "paper", flops: float | None = None, bw: float | None = None) -> Machine:
    """The machine ``spec`` names: ``"paper"`` (the reference model, tuned by ``flops`` and
    ``bw``), a calibrated preset such as ``"h100-sxm"``, or a machine description file.

    Raises ``ValueError`` with one clear line for an unknown name or a bad description.
    """
    return PRESETS.get(spec, FROM_FILE)(spec, flops, bw)
