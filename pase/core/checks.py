"""Argument checks shared by every stage: integers and numbers that are not ``bool``.

``True`` is an ``int`` to Python; a size, a device count or a rate given as ``True`` is
always a mistake, so these refuse it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_int", "is_positive_int", "is_number", "checked_device_count"]


def is_int(value, *, numpy: bool = False) -> bool:
    """An ``int`` (or, with ``numpy``, a NumPy integer), not a ``bool``.

    >>> is_int(3), is_int(True), is_int(np.int64(3)), is_int(np.int64(3), numpy=True)
    (True, False, False, True)
    """
    return isinstance(value, (int, np.integer) if numpy else int) and not isinstance(value, bool)


def is_positive_int(value, *, numpy: bool = False) -> bool:
    """``is_int`` and at least 1.

    >>> is_positive_int(1), is_positive_int(0), is_positive_int(2.0)
    (True, False, False)
    """
    return is_int(value, numpy=numpy) and value >= 1


def is_number(value, *, numpy: bool = False) -> bool:
    """An ``int`` or ``float`` (with ``numpy``, NumPy ones too), not a ``bool``.

    >>> is_number(2.5), is_number(False), is_number("2")
    (True, False, False)
    """
    kinds = (int, float, np.integer, np.floating) if numpy else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def checked_device_count(procs) -> int:
    """``procs`` as an ``int``; ``ValueError`` unless it is a positive integer. (Whether a
    machine can hold that many devices is ``Machine.check_procs``.)"""
    if not is_positive_int(procs, numpy=True):
        raise ValueError(f"the number of devices must be a positive integer, got {procs!r}")
    return int(procs)
