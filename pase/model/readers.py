"""Several readers of one tensor and the all-reduce of its gradient (issue 23, item 4).

Under the paper's rule (``"each"``, the default) every layer that reads a tensor all-reduces
its own partial gradient of it over the devices splitting its reduction, as its layer cost
says. A framework sums the readers' partial gradients first and reduces once: Megatron-LM
and torchtitan fuse the q, k and v projections (and a gated MLP's gate and up), DTensor
defers the reduction. Under ``"summed"`` readers do the same where they can: two readers of
one tensor whose configurations place every block of it, and every partial block of its
gradient, on the same devices and reduce over the same devices, sum before one all-reduce.

The rule is priced on pairs, so that the exact search keeps its pairwise tables: the
readers of a tensor that can share (one ``reduction_signature``) form a chain in vertex
order, and each reader after the first pays its reduction unless the reader before it is
laid out alike (a :class:`ReaderLink`, an edge of the costed graph). That is exact for two
readers and for three (q, k, v) unless only the first and third agree; in that one case it
charges the reduction the second and third would share where a framework could sum the
first and third, so the charge never falls below what a run pays. ``docs/cost-model.md``,
"Several readers of one tensor".

The training model, whose mesh rows line up across layers, needs no pairs: it takes each
tensor's weight-product readers whole (:func:`reader_groups`) and, per row, the first reader
each is laid out like (:func:`alike_readers`), by the same keys; the readers alike share the
reduction and the gather of the tensor (``docs/training.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pase.machines.base import layout_strides

__all__ = ["READER_RULES", "ReaderLink", "reader_links", "reduction_keys", "same_layout", "link_matrix",
           "shared_reductions", "reader_groups", "alike_readers"]

#: ``each``: every reader reduces its own gradient (the paper); ``summed``: readers laid out
#: alike sum first and reduce once (what a framework runs).
READER_RULES = ("each", "summed")


@dataclass(frozen=True)
class ReaderLink:
    """Two consecutive readers of one tensor (vertex ids and input positions): ``later`` pays
    its gradient's all-reduce only where its layout differs from ``earlier``'s."""

    earlier: int
    earlier_input: int
    later: int
    later_input: int


def reader_links(network) -> tuple:
    """The :class:`ReaderLink` of every pair of consecutive readers that may share a reduction
    (none under the rule ``"each"``), in vertex order."""
    if network.readers == "each":
        return ()
    chains: dict = {}
    for v, layer in enumerate(network.layers):
        for i in layer.reduced_inputs():
            tensor = layer.inputs[i]
            members = chains.setdefault((tensor.key, layer.reduction_signature(i)), [])
            if not members or members[-1][0] != v:  # a layer reading it twice shares with itself
                members.append((v, i))
    links = [ReaderLink(a, i, b, j) for members in chains.values() for (a, i), (b, j) in zip(members, members[1:])]
    return tuple(sorted(links, key=lambda link: (link.later, link.later_input, link.earlier)))


def reduction_keys(layer, C: np.ndarray, i: int) -> np.ndarray:
    """One row of integers per configuration of ``layer`` saying where input ``i``'s blocks and
    its gradient's reduction groups lie: the splits and device strides of the columns that hold
    the input, then the reduction group as ``(split, stride)`` codes of its split dimensions in
    decreasing order (zeros after). Equal rows of two layers of one ``reduction_signature``
    (after the padding ``same_layout`` adds) mean the layouts agree; a group written with other
    dimensions (two of 2 where the other has one of 4 on the same devices) is not recognised,
    so no saving is claimed there, never a false one."""
    C = np.asarray(C, dtype=np.int64)
    strides = layout_strides(C, layer.batch_dim)
    held, group = (list(cols) for cols in layer.reduction_layout(i))
    sizes = C[:, group]
    codes = np.where(sizes > 1, (sizes << 32) | strides[:, group], 0)
    codes = -np.sort(-codes, axis=1)
    return np.concatenate([C[:, held], strides[:, held], codes], axis=1)


def _pad(keys: np.ndarray, width: int) -> np.ndarray:
    return np.pad(keys, ((0, 0), (0, width - keys.shape[1])))


def same_layout(keys_a: np.ndarray, keys_b: np.ndarray) -> np.ndarray:
    """``(K_a, K_b)`` booleans: where two readers' key rows agree."""
    width = max(keys_a.shape[1], keys_b.shape[1])
    rows = np.concatenate([_pad(keys_a, width), _pad(keys_b, width)])
    ids = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
    return ids[: len(keys_a), None] == ids[None, len(keys_a):]


def link_matrix(network, link: ReaderLink, configs, machine, memo: dict | None = None) -> tuple:
    """``(matrix, reduction)``: the ``K_earlier x K_later`` cost the link adds (the later
    reader's reduction where the layouts differ, 0 where they agree) and that reduction, one
    entry per configuration of the later reader, which leaves its layer cost. ``configs[v]``:
    vertex ``v``'s configurations. With ``memo``, equal links (repeated blocks) share one
    read-only matrix."""
    earlier, later = network.layers[link.earlier], network.layers[link.later]
    reduction = np.asarray(later.gradient_reductions(configs[link.later], machine)[link.later_input],
                           dtype=np.float64) * np.ones(len(configs[link.later]))
    keys_a = reduction_keys(earlier, configs[link.earlier], link.earlier_input)
    keys_b = reduction_keys(later, configs[link.later], link.later_input)
    memo = {} if memo is None else memo
    key = (keys_a.shape, keys_a.tobytes(), keys_b.shape, keys_b.tobytes(), reduction.tobytes())
    if key not in memo:
        matrix = np.where(same_layout(keys_a, keys_b), 0.0, reduction[None, :])
        matrix.setflags(write=False)
        memo[key] = matrix
    return memo[key], reduction


def shared_reductions(network, strategy: list, machine) -> np.ndarray:
    """Per vertex, the reductions a strategy (one configuration per vertex) does not pay
    because the reader before it, laid out alike, reduces the summed gradient."""
    saved = np.zeros(len(network.layers))
    for link in reader_links(network):
        (a, i), (b, j) = (link.earlier, link.earlier_input), (link.later, link.later_input)
        rows = {v: np.asarray([strategy[v]], dtype=np.int64) for v in (a, b)}
        later = network.layers[b]
        if same_layout(reduction_keys(network.layers[a], rows[a], i), reduction_keys(later, rows[b], j))[0, 0]:
            saved[b] += float(np.asarray(later.gradient_reductions(rows[b], machine)[j]).reshape(-1)[0])
    return saved


def reader_groups(network) -> tuple:
    """The weight products that read one tensor and may share its gradient's reduction and its
    gather, whatever ``network.readers`` says: per tensor and ``reduction_signature``, the
    ``(vertex, input position)`` of every weight product (a layer with parameters) reading it as
    its one reduced input, in vertex order, where at least two do. A product reading the tensor's
    producer through more than that one tensor is left out (its edge carries others too), and so
    is every layer without weights (a residual sum, attention's products): their gradients and
    gathers are not the same collective. For a costing whose rows line up across layers (the
    training model's meshes and strategies): :func:`alike_readers` says per row which share."""
    groups: dict = {}
    for v, layer in enumerate(network.layers):
        reduced = layer.reduced_inputs()
        if len(reduced) != 1 or not layer.parameter_tensors():
            continue
        i = reduced[0]
        tensor = layer.inputs[i]
        if tensor.producer is not None and len(network.edges[(tensor.producer, v)]) != 1:
            continue
        groups.setdefault((tensor.key, layer.reduction_signature(i)), []).append((v, i))
    return tuple(tuple(members) for members in groups.values() if len(members) > 1)


def alike_readers(network, group, configs) -> np.ndarray:
    """``(len(group), K)`` integers: per reader of :func:`reader_groups`' ``group`` and row of
    ``configs`` (``configs[v]``: vertex ``v``'s ``K`` rows, lined up across layers), the position
    in ``group`` of the first reader laid out like it (its :func:`reduction_keys` row equal: the
    same block of the tensor on the same devices, its gradient reduced over the same devices),
    itself where none before it is. The readers of one position sum their partial gradients and
    reduce once; they need the tensor in one layout, gathered once."""
    keys = [reduction_keys(network.layers[v], configs[v], i) for v, i in group]
    width = max(k.shape[1] for k in keys)
    K = len(keys[0])
    ids = np.unique(np.concatenate([_pad(k, width) for k in keys]), axis=0, return_inverse=True)[1]
    ids = ids.reshape(len(group), K)
    lead = np.tile(np.arange(len(group))[:, None], (1, K))
    for j in range(1, len(group)):
        for earlier in range(j - 1, -1, -1):  # the first alike wins: scan down to it
            lead[j] = np.where(ids[earlier] == ids[j], earlier, lead[j])
    return lead
