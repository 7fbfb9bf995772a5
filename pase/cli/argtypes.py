"""The ``type=`` callables of the flags: each turns one argument into a value or raises
``argparse.ArgumentTypeError`` with the reason."""

from __future__ import annotations

import argparse
import math

from pase.sources.registry import is_graph_spec, unknown_graph_message

from .options import MACHINE_RANGE, MAX_DIMENSION, MAX_GIGABYTES, MAX_PROCS, MAX_TABLE_ENTRIES, MIN_TABLE_ENTRIES

__all__ = ["positive_int", "dimension_size", "device_count", "positive_float", "gigabytes", "byte_size", "machine_rate", "device_list",
           "graph_spec", "table_entries"]


def positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _bounded_int(limit: int):
    def parse(text: str) -> int:
        if len(text.strip()) > 30:
            raise argparse.ArgumentTypeError(f"{text[:20]}... is larger than the largest supported value, {limit}")
        value = positive_int(text)
        if value > limit:
            # Enumerating a dimension's splits takes sqrt(size) steps; p bounds every product.
            raise argparse.ArgumentTypeError(f"{text} is larger than the largest supported value, {limit}")
        return value

    return parse

dimension_size = _bounded_int(MAX_DIMENSION)

device_count = _bounded_int(MAX_PROCS)


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _float(text, "a positive finite number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def gigabytes(text: str) -> float:
    """--memory / --table-budget: a positive number of GB (1e9 bytes), at most ``MAX_GIGABYTES``."""
    value = positive_float(text)
    if value > MAX_GIGABYTES:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_GIGABYTES:g} GB (a zettabyte), got {text!r}")
    return value


def byte_size(text: str) -> float:
    """--param-bytes / --act-bytes: a non-negative number of bytes per element."""
    value = _float(text, "a number of bytes between 0 and 1e6")
    if not 0 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"expected a number of bytes between 0 and 1e6, got {text!r}")
    return value


def machine_rate(text: str) -> float:
    """--flops / --bw: a positive number in ``MACHINE_RANGE`` (outside it costs overflow)."""
    value = positive_float(text)
    low, high = MACHINE_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected a number between {low:g} and {high:g}, got {text!r}")
    return value


def device_list(text: str) -> tuple:
    """``"4,8,16"`` -> ``(4, 8, 16)``; every entry a distinct positive integer."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of device counts such as 4,8,16, got {text!r}"
        )
    counts = []
    for item in items:
        try:
            count = device_count(item)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"device count {item!r} in {text!r}: {err}") from None
        if count in counts:
            raise argparse.ArgumentTypeError(f"device count {count} appears twice in {text!r}")
        counts.append(count)
    return tuple(counts)


def graph_spec(text: str) -> str:
    """-g: a spec one of the model sources takes (``pase.sources.registry``)."""
    if is_graph_spec(text):
        return text
    raise argparse.ArgumentTypeError(unknown_graph_message(text))


def table_entries(text: str) -> int:
    """--approx: the most entries of a table, an integer written as ``4194304``, ``4e6`` or ``2**22``."""
    what = f"a number of table entries between {MIN_TABLE_ENTRIES} and {MAX_TABLE_ENTRIES:.0e}, such as 4e6 or 2**22"
    text = text.strip()
    base, power, exponent = text.partition("**")
    try:
        if power:
            base, exponent = int(base, 10), int(exponent, 10)
            value = base ** exponent if 0 <= exponent <= 64 and 0 <= base <= 1 << 34 else math.inf
        else:
            value = float(text)
    except (TypeError, ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(value) and MIN_TABLE_ENTRIES <= value <= MAX_TABLE_ENTRIES):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return int(value)
