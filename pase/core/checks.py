"""Argument checks shared by every stage: integers and numbers that are not ``bool``, and the
``arguments`` decorator that checks a public function's arguments by name.

``True`` is an ``int`` to Python; a size, a device count or a rate given as ``True`` is
always a mistake, so these refuse it.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "ArgumentTypeError", "is_int", "is_positive_int", "is_number", "checked_device_count", "arguments", "positive_int", "non_negative_int",
    "positive_number", "text", "a_callable", "optional", "int_sequence", "configurations", "instance", "a_sequence",
    "bool_sequence",
    "config_array", "a_mapping", "tensor_sequence", "a_network", "a_costed_graph", "a_memory_model", "a_recipe",
    "a_training_options", "a_mesh", "a_training_plan",
]


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


# ---------------------------------------------------------------------------------------
# The arguments of public functions: each wrong one named in its error (issue 35)

class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type: a ``TypeError``, and a ``ValueError`` as the library
    raised for every bad argument before the checks named them (callers catching either see it)."""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value) -> str:
    return type(value).__name__


def arguments(**checks):
    """Decorator: check (and convert) the named arguments of a public function before its
    body runs. ``checks``: argument name -> ``check(value, name) -> value``, raising
    ``TypeError`` (wrong type) or ``ValueError`` (wrong value) with a message that starts with
    the argument's name (``ArgumentTypeError`` is both). Arguments left at their defaults are
    not checked.

    >>> @arguments(procs=positive_int)
    ... def f(procs=1):
    ...     return procs
    >>> f(procs=0)
    Traceback (most recent call last):
    ...
    ValueError: procs must be a positive integer, got 0
    """
    def wrap(function):
        signature = inspect.signature(function)
        unknown = set(checks) - set(signature.parameters)
        if unknown:
            raise AssertionError(f"{function.__name__} has no argument {', '.join(sorted(unknown))}")

        @functools.wraps(function)
        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)  # missing or unknown arguments: Python names them
            for name, check in checks.items():
                if name in bound.arguments:
                    bound.arguments[name] = check(bound.arguments[name], name)
            return function(*bound.args, **bound.kwargs)

        return call

    return wrap


def _int_at_least(value, name: str, low: int, words: str) -> int:
    if not is_int(value, numpy=True):
        raise ArgumentTypeError(f"{name} must be a {words} integer, got {_kind(value)} {_shown(value)}")
    if value < low:
        raise ValueError(f"{name} must be a {words} integer, got {_shown(value)}")
    return int(value)


def positive_int(value, name: str) -> int:
    """A positive integer (NumPy integers too), never a ``bool``."""
    return _int_at_least(value, name, 1, "positive")


def non_negative_int(value, name: str) -> int:
    """Zero or a positive integer (NumPy integers too), never a ``bool``."""
    return _int_at_least(value, name, 0, "non-negative")


def positive_number(value, name: str) -> float:
    """A finite number above zero."""
    if not is_number(value, numpy=True):
        raise ArgumentTypeError(f"{name} must be a positive number, got {_kind(value)} {_shown(value)}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {_shown(value)}")
    return value


def a_memory_cap(value, name: str) -> float:
    """A finite number above zero, or infinity (``NO_CAP``: no cap at all)."""
    if is_number(value, numpy=True) and value == math.inf:
        return value
    return positive_number(value, name)


def a_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be true or false, got {_kind(value)} {_shown(value)}")
    return bool(value)


def text(value, name: str) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a string, got {_kind(value)} {_shown(value)}")
    return value


def one_of(choices):
    """A string among ``choices``."""
    def checked(value, name: str):
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {_shown(value)}")
        return value

    return checked


def a_callable(value, name: str):
    if not callable(value):
        raise ArgumentTypeError(f"{name} must be callable, got {_kind(value)} {_shown(value)}")
    return value


def optional(check):
    """``check``, letting ``None`` through."""
    def checked(value, name: str):
        return None if value is None else check(value, name)

    return checked


def int_sequence(value, name: str) -> tuple:
    """A non-empty sequence of positive integers (a domain, a shape): a tuple of ``int``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise ArgumentTypeError(f"{name} must be a sequence of positive integers, got {_kind(value)} {_shown(value)}")
    if not len(value) or not all(is_positive_int(x, numpy=True) for x in value):
        raise ValueError(f"{name} must be a non-empty sequence of positive integers, got {_shown(value)}")
    return tuple(int(x) for x in value)


def configurations(value, name: str) -> list:
    """Configurations, one per layer: a sequence of sequences of positive integers (or a
    2-d integer array)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise ArgumentTypeError(f"{name} must be one configuration per layer (sequences of positive integers), got "
                        f"{_kind(value)} {_shown(value)}")
    for i, config in enumerate(value):
        if isinstance(config, (str, bytes)) or not isinstance(config, (Sequence, np.ndarray)) or not all(
                is_positive_int(x, numpy=True) for x in config):
            raise ValueError(f"{name}[{i}] must be a sequence of positive integers, got {_shown(config)}")
    return value


def instance(what: str, *attributes: str):
    """An object with ``attributes`` (duck-typed: ``what`` names the expected kind)."""
    def checked(value, name: str):
        if not all(hasattr(value, a) for a in attributes):
            raise ArgumentTypeError(f"{name} must be {what}, got {_kind(value)} {_shown(value)}")
        return value

    return checked


def a_sequence(value, name: str):
    """A sequence or set of items (not a string)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray, set, frozenset)):
        raise ArgumentTypeError(f"{name} must be a sequence, got {_kind(value)} {_shown(value)}")
    return value


def bool_sequence(value, name: str) -> list:
    """A sequence of ``bool`` (one flag per dimension)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise ArgumentTypeError(f"{name} must be a sequence of booleans, got {_kind(value)} {_shown(value)}")
    if not all(isinstance(x, (bool, np.bool_)) for x in value):
        raise ValueError(f"{name} must be a sequence of booleans, got {_shown(value)}")
    return [bool(x) for x in value]


def config_array(value, name: str) -> np.ndarray:
    """Configurations as a 2-d array of positive integers, one row each."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise ArgumentTypeError(f"{name} must be a 2-d integer array (one configuration per row), got {_kind(value)} "
                        f"{_shown(value)}")
    if array.size and array.min() < 1:
        raise ValueError(f"{name} must hold positive split counts, got {array.min()}")
    return array


def a_mapping(value, name: str):
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"{name} must be a mapping (a dict), got {_kind(value)} {_shown(value)}")
    return value


def tensor_sequence(value, name: str) -> list:
    """A sequence of ``pase.Tensor`` (a layer's operands)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            hasattr(t, "shape") and hasattr(t, "letters") for t in value):
        raise ArgumentTypeError(f"{name} must be a sequence of pase.Tensor, got {_kind(value)} {_shown(value)}")
    return list(value)


#: The kinds of the library's own objects, duck-typed (the checks are below the stages that
#: define them): what each public function takes.
a_network = instance("a pase.Network", "layers", "names", "edges", "graph", "configs")
a_costed_graph = instance("a costed graph (Network.graph(procs))", "nodes", "edges", "graph")
a_memory_model = instance("a pase.MemoryModel", "vectors", "param_bytes", "act_bytes")
a_recipe = instance("a pase.Recipe (pase.parse_recipe('dp=8,...'))", "fixed", "check")
a_training_options = instance("a pase.TrainingOptions", "zero", "recompute", "microbatches")
a_mesh = instance("a pase.Mesh", "dp", "tp", "cp", "pp", "devices")
a_rules = instance("parallel rules (pase.planning.rules.ParallelRules)", "tensor_parallel", "tensor_alternative")
a_structure = instance("a network structure (NetworkStructure.of(network))", "kinds", "cores", "blocks")
an_engine = instance("an engine profile (pase.load_engine('megatron'))", "base_options", "searched")


def engine_sequence(value, name: str) -> tuple:
    """A sequence of engine profiles (the engines a search keeps to)."""
    a_sequence(value, name)
    for i, item in enumerate(value):
        an_engine(item, f"{name}[{i}]")
    return tuple(value)
a_training_plan = instance("a pase.TrainingPlan (pase.plan_training)", "best", "mesh_search", "machine")
