"""An engine's own pipeline cut: nanotron places its pipeline blocks by their compute cost, where
the search would choose the cut (``pipeline_cut`` of the engine profile)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["PIPELINE_CUTS", "balanced_cut", "engine_cut"]

#: ``search``: the search tries the cuts (Megatron's, torchtitan's uneven first and last stages);
#: ``compute_balanced``: nanotron's rule (:func:`balanced_cut`), the only cut it runs.
PIPELINE_CUTS = ("search", "compute_balanced")


def balanced_cut(block_costs: Sequence[float], tail_cost: float, pp: int) -> tuple | None:
    """Blocks per stage as nanotron assigns them (src/nanotron/models/base.py:216-235 at main
    2411b022): units in order (the blocks, then the output head of cost ``tail_cost``; the
    embedding costs nothing), each placed on the current rank, which moves on once the
    cumulative cost passes ``total * (rank + 1) / pp``. ``None`` when that leaves a stage
    without a block or the head off the last stage (a cut the planner cannot price).

    >>> balanced_cut([1.0] * 6, 2.0, 2)  # totals 8: thresholds 4 and 8; the 5th block passes 4
    (5, 1)
    """
    costs = np.asarray(list(block_costs) + [float(tail_cost)], dtype=np.float64)
    cumulative = np.cumsum(costs)
    total = float(cumulative[-1])
    counts = [0] * pp
    rank = 0
    for j, reached in enumerate(cumulative):
        if rank >= pp:
            return None
        if j < len(block_costs):
            counts[rank] += 1
        elif rank != pp - 1:
            return None  # the head lands before the last stage
        if reached > total * ((rank + 1) / pp):
            rank += 1
    return tuple(counts) if min(counts) >= 1 else None


def _elements(layer) -> float:
    return float(sum(int(np.prod(shape)) for shape, *_ in layer.parameter_tensors()))


def engine_cut(network, layout, pp: int) -> tuple | None:
    """nanotron's cut of ``network`` (its :class:`~pase.planning.pipeline.Layout`) over ``pp``
    stages: each block's cost its weights' elements (nanotron's ``get_block_compute_costs``,
    models/llama.py:938-950: the attention's four projections and the MLP's three; it counts a
    grouped-query attention's key and value as full heads, which this does not), the head's the
    weights after the last block (the output projection, ``vocab x hidden``)."""
    layers = network.layers
    blocks = [sum(_elements(layers[v]) for v in block) for block in layout.blocks]
    tail = sum(_elements(layers[v]) for v in layout.post)
    return balanced_cut(blocks, tail, pp)
