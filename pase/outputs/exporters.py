"""File exporters by flag: what ``--export-graph`` and ``--export-jax`` write.

An exporter turns a network (``of="network"``, written before the search) or a plan
(``of="plan"``, written once it is found) into the text of one file. A new exporter is one
``Exporter`` entry in ``EXPORTERS``: the CLI adds its flag, checks its path before any work,
refuses it with ``--sweep`` when it writes a plan, and writes the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

__all__ = ["Exporter", "EXPORTERS"]


@dataclass(frozen=True)
class Exporter:
    flag: str  # the command-line flag, "--export-jax"; its value is the file to write
    what: str  # how messages name the file: "cannot write the JAX shardings to ..."
    of: str  # "network" or "plan": what ``text`` takes
    text: Callable[[object], str]  # the file's contents; ValueError if it cannot be written
    help: str
    engine: bool = False  # a plan an engine runs: the search keeps to configurations it can run

    @property
    def dest(self) -> str:
        """The argparse destination of the flag (``export_jax``)."""
        return self.flag.lstrip("-").replace("-", "_")


def _graph_file(network) -> str:
    from pase.sources import graph_json

    return graph_json.dumps(network)


def _jax_shardings(plan) -> str:
    from .jax.export import export_shardings  # pure Python: no JAX needed

    return json.dumps(export_shardings(plan), indent=1) + "\n"


#: In the order of their flags in ``--help``.
EXPORTERS = (
    Exporter("--export-graph", "graph file", "network", _graph_file,
             "also write the graph (built-in or imported) as a JSON graph file that -g FILE.json reads back."),
    Exporter("--export-jax", "JAX shardings", "plan", _jax_shardings,
             "also write the plan's device mesh and the PartitionSpec of every layer's inputs, outputs "
             "and weights as JSON, for JAX (no JAX needed to write it). The search keeps to configurations "
             "a JAX mesh can run (see --exportable).", engine=True),
)
