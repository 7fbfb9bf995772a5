"""Results of functions of an options object, kept by the fields they read.

A training search prices one network under many option sets that differ in a few fields (the
ZeRO stage, the recomputation policy, ...), and most of what it computes reads only some of
them: a layer's model state does not read the recomputation policy. :class:`OptionsMemo`
runs a function once on a view of the options that records every field read (and what the
options' own methods read), keeps the result under the values of those fields, and hands the
same result to any later option set equal in them. Exact by construction: a deterministic
function given equal values of everything it reads computes the same result.
"""

from __future__ import annotations

import dataclasses
import inspect
from operator import attrgetter
from types import FunctionType
from typing import Callable

__all__ = ["OptionsMemo", "recording"]


class _Reads:
    """``options`` seen through: each field read is appended to ``names``; a method runs on the
    view, so the fields it reads are recorded too. A private or special name records every
    field (``options.__dict__``)."""

    __slots__ = ("_target", "_names", "_kinds")

    def __init__(self, target, names: list, kinds: dict):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_kinds", kinds)

    def __getattr__(self, name: str):
        target = self._target
        kind = self._kinds.get((type(target), name))
        if kind is None:
            kind = self._kinds[(type(target), name)] = _kind(type(target), name)
        if kind is _FIELD:
            self._names.append(name)
            return getattr(target, name)
        if kind is _ALL:
            self._names.extend(f.name for f in dataclasses.fields(target))
            return getattr(target, name)
        if kind is _FIXED:
            return getattr(target, name)  # reads no field
        return kind.__get__(self)  # a method or property: what it reads goes through the view

    def __setattr__(self, name, value):
        raise AttributeError("options are read-only")


_FIELD, _ALL, _FIXED = "field", "all", "fixed"


def _kind(cls, name: str):
    """How a view reads ``name`` of ``cls``: a field (recorded), every field (a private or special
    name: ``__dict__``), nothing (a static or class method), else the method or property itself,
    run on the view."""
    if name.startswith("_"):
        return _ALL
    member = inspect.getattr_static(cls, name, None)
    if isinstance(member, (FunctionType, property)):
        return member
    if isinstance(member, (staticmethod, classmethod)):
        return _FIXED
    return _FIELD


def recording(options) -> bool:
    """Whether ``options`` is a recording view (an :class:`OptionsMemo` computation in progress)."""
    return isinstance(options, _Reads)


class OptionsMemo:
    """Results of ``fn(options)`` per key, each kept under the values of the fields ``fn`` read.

    ``get(key, options, fn)``: the result an earlier call with this ``key`` computed for
    options equal in every field that call read, else ``fn(view)`` run on a recording view
    and kept. ``key`` names the function and whatever else it depends on (other arguments; an
    object given by identity must be kept alive by the caller or put in ``hold``). Asked
    inside a computation (``options`` itself a view), the result is kept too and the fields
    it depends on are added to the caller's record.
    """

    def __init__(self):
        self._tables: dict = {}
        self._kinds: dict = {}

    def get(self, key, options, fn: Callable, hold=None):
        if isinstance(options, _Reads):
            # Asked inside another computation: the result is kept all the same, and the
            # fields it depends on are read on the caller's record.
            result, fields = self._get(key, options._target, fn, hold)
            options._names.extend(fields)
            return result
        return self._get(key, options, fn, hold)[0]

    def _get(self, key, options, fn: Callable, hold) -> tuple:
        entries = self._tables.get(key)
        if entries is None:
            entries = self._tables[key] = []
        for fields, getter, table in entries:
            found = table.get(getter(options))
            if found is not None:
                return found[0], fields
        names: list = []
        result = fn(_Reads(options, names, self._kinds))
        fields = tuple(dict.fromkeys(names))
        for known, getter, table in entries:
            if known == fields:
                break
        else:
            getter = attrgetter(*fields) if fields else _nothing
            table = {}
            entries.append((fields, getter, table))
        table[getter(options)] = (result, hold)
        return result, fields

    def clear(self) -> None:
        self._tables.clear()


def _nothing(options) -> tuple:
    return ()
