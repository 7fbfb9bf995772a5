"""Model sources: ``load(spec)`` gives the ``Network`` of a built-in graph, a graph file
(``graph_json``) or a PyTorch model (``torch``), as the registry in ``registry`` says.

The names below load on first use, so importing one source does not import the others.
"""

from importlib import import_module

__all__ = ["load", "SOURCES", "Source"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'pase.sources' has no attribute {name!r}")
    return getattr(import_module(".registry", __name__), name)
