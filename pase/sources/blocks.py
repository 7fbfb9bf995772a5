"""Repeated blocks found from structure, for a source that declares none (an older graph file).

The runs of equal, equally wired layers that the search solves once (``pase.search.blocks``)
are the repeated blocks: each copy of a run is one block. Layers compare by type, iteration
space, arguments and the shapes they read; edges by the tensors they carry.
"""

from __future__ import annotations

import numpy as np

from pase.search.blocks import find_block_runs

__all__ = ["structural_blocks"]


def structural_blocks(network) -> tuple | None:
    """One block number (or None) per layer of ``network``, or None where no run repeats."""
    codes: dict = {}

    def code(key) -> np.ndarray:
        return np.array([float(codes.setdefault(key, len(codes)))])

    order = list(range(len(network.layers)))
    costs = {v: code((type(layer).__name__, layer.domain, repr(sorted(layer.args.items())),
                      tuple((t.shape, bool(t.is_param)) for t in layer.inputs)))
             for v, layer in enumerate(network.layers)}
    edges = [(u, v, code(("edge", tensors)).reshape(1, 1)) for (u, v), tensors in sorted(network.edges.items())]
    runs = find_block_runs(order, {v: 1 for v in order}, costs, edges)
    blocks = [None] * len(order)
    number = 0
    for run in sorted(runs, key=lambda r: r.vertices[0]):
        for c in range(run.copies):
            for v in run.copy(c):
                blocks[v] = number
            number += 1
    return tuple(blocks) if number >= 2 else None
