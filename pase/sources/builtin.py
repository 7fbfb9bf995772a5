"""The built-in networks (the ``graphs`` package) as a model source: ``-g NAME``."""

from __future__ import annotations

from graphs import DEFAULT_BATCH, GRAPHS, GraphEntry, build
from pase.model.builder import Network

__all__ = ["GRAPHS", "DEFAULT_BATCH", "GraphEntry", "load", "entry"]


def load(name: str, batch: int | None, model: int | None) -> Network:
    """The built-in graph ``name`` at ``batch`` (default ``DEFAULT_BATCH``) and width ``model``."""
    return build(name, DEFAULT_BATCH if batch is None else batch, model)


def entry(spec: str) -> GraphEntry | None:
    """The registry entry of a built-in graph's name, else None (a file or an import)."""
    return GRAPHS.get(spec)
