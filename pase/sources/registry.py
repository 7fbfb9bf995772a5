"""Model sources: ``spec -> Network``. One entry per source, matched by prefix (``torch:``),
by suffix (``.json``) or by name (a built-in graph); the ``-g`` help, its error message and
the checks of source options are generated from these entries.

A new source is one module with a ``load(spec, batch, model, **options)`` function and one
``Source`` entry in ``SOURCES`` below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pase.model.builder import Network

from . import builtin
from .graph_json import load_graph_file
from .hf import load_hf_source
from .torch import load_torch_source

__all__ = ["Source", "SOURCES", "load", "source_of", "is_graph_spec", "graph_help", "unknown_graph_message"]


@dataclass(frozen=True)
class Source:
    """One way of naming a network with ``-g``.

    ``prefix`` (``"torch"`` matches ``torch:REST`` and gets ``REST``) or ``suffix`` (matches
    a spec ending with it, passed whole); with neither, ``names`` lists the specs it takes.
    ``load(spec, batch, model, **options)`` builds the network; ``options`` are the keyword
    options it accepts (CLI flags such as ``--loss``), ``options_of`` how messages name it.
    """

    name: str
    load: Callable[..., Network]
    help: str  # in the -g help: "a graph file FILE.json (see --export-graph)"
    choice: str  # in the error for an unknown spec: "a graph file FILE.json"
    prefix: str | None = None
    suffix: str | None = None
    names: Callable[[], tuple] | None = None
    options: tuple = ()
    options_of: str = ""  # "imported models (torch:...)"
    #: The sizes ``-b``/``-m`` set (``"batch"``, ``"model"``); a plan made from the source
    #: records them, and ``--evaluate`` prices the plan at them. A graph file fixes both.
    sizes: tuple = ("batch", "model")
    model_name: str = "model width"  # how outputs name its -m value

    def matches(self, spec: str) -> bool:
        if self.prefix is not None:
            prefix, sep, _ = spec.partition(":")
            return bool(sep) and prefix == self.prefix
        if self.suffix is not None:
            return spec.endswith(self.suffix)
        return spec in self.names()


#: In the order they are tried: prefixes, then suffixes, then names.
SOURCES = (
    Source("torch", load_torch_source, "a PyTorch model torch:FILE_OR_MODULE:FUNCTION",
           "torch:FILE_OR_MODULE:FUNCTION", prefix="torch", options=("loss",),
           options_of="imported models (torch:...)", sizes=("batch",)),
    Source("hf", load_hf_source, "a Hugging Face config hf:CONFIG.json (-m: sequence length)",
           "hf:CONFIG.json", prefix="hf", model_name="sequence length", options=("mtp",),
           options_of="Hugging Face configs (hf:...)"),
    Source("graph file", load_graph_file, "a graph file FILE.json (see --export-graph)",
           "a graph file FILE.json", suffix=".json", sizes=()),
    Source("built-in", builtin.load, f"a built-in graph ({', '.join(builtin.GRAPHS)})",
           f"one of {', '.join(builtin.GRAPHS)}", names=lambda: tuple(builtin.GRAPHS)),
)
#: The source of a spec no entry matches: a built-in graph's name (it says which exist).
FALLBACK = SOURCES[-1]


def _listed(items: list) -> str:
    return ", ".join(items[:-1] + [f"or {items[-1]}"])


def source_of(spec: str) -> Source | None:
    """The source whose prefix, suffix or names match ``spec``, else None."""
    return next((source for source in SOURCES if source.matches(spec)), None)


def is_graph_spec(spec: str) -> bool:
    return source_of(spec) is not None


def graph_help() -> str:
    """What ``-g`` takes, one phrase per source (built-in graphs first)."""
    return _listed([source.help for source in reversed(SOURCES)])


def unknown_graph_message(spec: str) -> str:
    return f"unknown graph {spec!r}: choose {_listed([source.choice for source in reversed(SOURCES)])}"


def load(spec: str, batch: int | None = None, model: int | None = None, **options) -> Network:
    """The network ``spec`` names: a built-in graph, a graph file or an imported model.

    ``batch`` defaults to the graph's own (128 for the built-in graphs; a graph file fixes
    its own). ``options`` go to the source that takes them (``loss`` for ``torch:``); a
    source that takes none refuses them. Raises ``ValueError`` (or ``pase.core.fileio.InputError``
    for a file) with one clear line.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"a graph must be named, got {spec!r}")
    source = source_of(spec) or FALLBACK
    if options and not set(options) <= set(source.options):
        takers = [s.options_of for s in SOURCES if s.options]
        raise ValueError(f"options {', '.join(sorted(options))} apply only to {', '.join(takers)}, "
                         f"not to {spec!r}")
    if source.prefix is not None:
        spec = spec.partition(":")[2]
    return source.load(spec, batch, model, **options)
