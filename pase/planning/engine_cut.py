"""An engine's own pipeline cut: nanotron places its pipeline blocks by their compute cost,
DeepSpeed's pipeline engine (Megatron-DeepSpeed) by their count, where the search would choose the
cut (``pipeline_cut`` of the engine profile)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["PIPELINE_CUTS", "balanced_cut", "count_cut", "representable", "engine_cut"]

#: ``search``: the search tries the cuts (Megatron's, torchtitan's uneven first and last stages);
#: ``compute_balanced``: nanotron's rule (:func:`balanced_cut`), the only cut it runs;
#: ``layer_count``: DeepSpeed's ``partition_method='type:transformer'`` (:func:`count_cut`).
PIPELINE_CUTS = ("search", "compute_balanced", "layer_count")


def balanced_cut(block_costs: Sequence[float], tail_cost: float, pp: int) -> tuple:
    """Blocks per rank as nanotron assigns them (src/nanotron/models/base.py:216-235 at main
    2411b022): units in order (the blocks, then the output head of cost ``tail_cost``; the
    embedding, the final norm and the loss cost nothing), each placed on the current rank, which
    moves on once the cumulative cost passes ``total * (rank + 1) / pp``. A rank may be left
    without a block (the last one, when the head passes the last threshold but one: it then runs
    the loss alone).

    >>> balanced_cut([1.0] * 6, 2.0, 2)  # totals 8: thresholds 4 and 8; the 5th block passes 4
    (5, 1)
    """
    cumulative = np.cumsum(np.asarray(list(block_costs) + [float(tail_cost)], dtype=np.float64))
    total = float(cumulative[-1])
    counts = [0] * pp
    rank = 0
    for reached in cumulative[: len(block_costs)]:
        counts[rank] += 1
        if reached > total * ((rank + 1) / pp):
            rank = min(rank + 1, pp - 1)
    return tuple(counts)


def count_cut(blocks: int, pp: int) -> tuple | None:
    """Blocks per stage as DeepSpeed's pipeline engine places them under ``partition_method=
    'type:transformer'`` (Megatron-DeepSpeed's ``GPTModelPipe``): every transformer layer weighs 1
    and every other layer 0, and ``partition_balanced`` (deepspeed/runtime/utils.py:627-667 in
    0.19.8) splits the weights so the stages' loads differ least, which gives the first ``blocks
    mod pp`` stages one block more (the embedding rides on the first stage, the head on the last);
    ``None`` with fewer blocks than stages.

    >>> count_cut(72, 6), count_cut(10, 4), count_cut(126, 16)[-3:], count_cut(3, 4)
    ((12, 12, 12, 12, 12, 12), (3, 3, 2, 2), (8, 7, 7), None)
    """
    if blocks < pp:
        return None
    base, extra = divmod(int(blocks), int(pp))
    return tuple(base + 1 if i < extra else base for i in range(pp))


def representable(counts: Sequence[int]) -> tuple | None:
    """``counts`` with every stage holding a block, as the planner's stages must: each empty stage
    takes one block from the nearest stage before it with two or more (the stages before keep
    nanotron's counts, the first stage's above all: the one whose memory nanotron logs). ``None``
    when there are fewer blocks than stages."""
    counts = list(counts)
    if sum(counts) < len(counts):
        return None
    for i in range(len(counts)):
        if counts[i] == 0:
            donor = next((j for j in range(i - 1, -1, -1) if counts[j] >= 2), None)
            if donor is None:
                donor = next(j for j in range(i + 1, len(counts)) if counts[j] >= 2)
            counts[donor] -= 1
            counts[i] += 1
    return tuple(counts)


def _elements(layer) -> float:
    return float(sum(int(np.prod(shape)) for shape, *_ in layer.parameter_tensors()))


def engine_cut(network, layout, pp: int, rule: str = "compute_balanced") -> tuple | None:
    """The engine's own cut of ``network`` (its :class:`~pase.planning.pipeline.Layout`) over
    ``pp`` stages. ``layer_count``: :func:`count_cut` of its blocks. ``compute_balanced``:
    nanotron's, each block's cost its weights' elements (nanotron's ``get_block_compute_costs``,
    models/llama.py:938-950: the attention's four projections and the MLP's three; it counts a
    grouped-query attention's key and value as full heads, which this does not), the head's the
    weights after the last block (the output projection, ``vocab x hidden``)."""
    if rule == "layer_count":
        return count_cut(len(layout.blocks), pp)
    layers = network.layers
    blocks = [sum(_elements(layers[v]) for v in block) for block in layout.blocks]
    tail = sum(_elements(layers[v]) for v in layout.post)
    return representable(balanced_cut(blocks, tail, pp))
