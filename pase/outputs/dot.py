"""The computation graph in DOT (``-d``, ``--dot-path``), with each layer"s configuration."""

from __future__ import annotations

import re
from typing import Sequence

from pase.model.builder import Network

from .rows import shape_text, split_notation

__all__ = ["dot_graph"]


def _dot_id(text: str) -> str:
    """A DOT identifier that needs no quoting (pydot versions quote differently)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _dot_label(lines: Sequence[str]) -> str:
    # Escaped newlines: Graphviz centres each line; quotes and backslashes are escaped so
    # the label survives any layer name.
    escaped = [line.replace("\\", "\\\\").replace('"', '\\"') for line in lines]
    return '"' + "\\n".join(escaped) + '"'


#: Fill colours of pipeline stages, in turn (a light palette: labels stay readable).
STAGE_COLOURS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#d9d2e9", "#fce5cd", "#d0e0e3", "#ead1dc")


def dot_graph(network: Network, configs: Sequence[Sequence[int]] | None = None,
              stages: Sequence[int] | None = None):
    """The computation graph as a ``pydot.Dot``: one node per layer, one edge per graph edge.

    Node ``v<i>`` is labelled with the layer name, its type and iteration-space letters,
    the iteration space and, when ``configs`` is given, the chosen configuration. With
    ``stages`` (a pipeline stage per layer), nodes are filled by stage and say which.
    """
    import pydot  # imported here: only --dump-graph needs it

    dot = pydot.Dot(graph_name=_dot_id(network.name) or "G", graph_type="digraph")
    dot.set_node_defaults(shape="box", fontname="Helvetica", fontsize="10")
    for v, (name, layer) in enumerate(zip(network.names, network.layers)):
        lines = [name, f"{layer.op} {layer.dims}", shape_text(layer.domain)]
        if configs is not None:
            config = [int(c) for c in configs[v]]
            lines.append(f"config ({','.join(map(str, config))}): {split_notation(config, layer.dims)}")
        if stages is None:
            dot.add_node(pydot.Node(f"v{v}", label=_dot_label(lines)))
            continue
        lines.append(f"stage {stages[v]}")
        colour = STAGE_COLOURS[stages[v] % len(STAGE_COLOURS)]
        dot.add_node(pydot.Node(f"v{v}", label=_dot_label(lines), style="filled", fillcolor=f'"{colour}"'))
    for u, v in sorted(network.edges):
        dot.add_edge(pydot.Edge(f"v{u}", f"v{v}"))
    return dot
