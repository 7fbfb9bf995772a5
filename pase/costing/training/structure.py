"""The network's structure as training options read it (:class:`NetworkStructure`): repeated
blocks, attention cores, weights charged once, FSDP units; and a step's model FLOPs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pase.model.roles import expert_layers, output_roles, roles_of

__all__ = ["NetworkStructure", "pipeline_copies", "block_leads", "attention_cores", "structure_key", "model_flops",
           "parameter_elements_unique", "fsdp_units"]


def _parameter_tensors(layer) -> list:
    """``(shape, dims, identity)`` of every parameter tensor: ``Layer.parameter_tensors``, whose
    identity names a tensor several layers share (a tied embedding), else ``None``."""
    return layer.parameter_tensors()


def _output_roles(layer) -> tuple:
    """The roles of the dimensions of ``layer``'s first output (``pase.model.roles``)."""
    return output_roles(layer)[0]


def attention_cores(network) -> dict:
    """``{vertex: role}`` for every attention core, found by dimension roles: a product
    without weights whose output holds both the queries' ``sequence`` and the keys'
    ``key_sequence`` (the scores), the chain of layers that alone read it one after another
    (the softmax, and any mask, bias or ALiBi layer beside it), and the product without weights
    that reads the chain's end and sums over ``key_sequence`` (the context). Roles ``scores``,
    ``softmax`` (every layer of the chain) and ``context``."""
    consumers: dict = {}
    for (u, v) in sorted(network.edges):
        consumers.setdefault(u, []).append(v)
    layers = network.layers
    roles = {}
    for u, layer in enumerate(layers):
        if not layer.product or layer.parameter_tensors():
            continue
        out = _output_roles(layer)
        if "sequence" not in out or "key_sequence" not in out:
            continue
        chain = []
        v = u
        while len(consumers.get(v, ())) == 1:
            w = consumers[v][0]
            reader = layers[w]
            if reader.product:
                if (not reader.parameter_tensors() and chain and "key_sequence" in roles_of(reader)
                        and "key_sequence" not in _output_roles(reader)):
                    roles[u] = "scores"
                    roles.update({x: "softmax" for x in chain})
                    roles[w] = "context"
                break
            chain.append(w)
            v = w
    return roles


def structure_key(layer) -> tuple:
    """Everything a layer's costs and memory read: equal keys, equal parts."""
    return (
        type(layer).__name__, layer.domain, roles_of(layer), layer.batch_dim, layer.output_shapes,
        repr(sorted(layer.args.items())), tuple((t.shape, bool(t.is_param)) for t in layer.inputs),
    )


def model_flops(network) -> float:
    """Model FLOPs of one step: three times the forward products of every GEMM-like layer
    (``2 x`` its iteration space), embeddings (lookups) excluded, attention counted whole
    (the count of MFU, Narayanan et al. 2021)."""
    return 3.0 * sum(layer.forward_flops() for layer in network.layers)


def parameter_elements_unique(network) -> int:
    """Parameters of the network, a tensor several layers read counted once."""
    seen = set()
    total = 0
    for layer in network.layers:
        for shape, _, ident in _parameter_tensors(layer):
            if ident is not None:
                if ident in seen:
                    continue
                seen.add(ident)
            total += math.prod(shape)
    return total


@dataclass(frozen=True)
class NetworkStructure:
    """What training options read of a network's shape, computed once per network: each
    layer's structure kind, attention roles, repeated blocks, outputs that leave their block,
    which weights each layer is charged for (a shared tensor once), which it holds a copy of on
    a pipeline's last stage (``copies``: :func:`pipeline_copies`), consumers of each layer, and
    the mixtures of experts (the layers that iterate over the ``experts`` role: the router,
    dispatch, experts and combine of a ``MoE``, priced as one layer)."""

    kinds: tuple
    cores: dict
    blocks: tuple
    block_outputs: tuple
    charged: tuple
    consumers: dict
    experts: frozenset
    copies: tuple

    @classmethod
    def of(cls, network) -> "NetworkStructure":
        keys: dict = {}
        kinds = tuple(keys.setdefault(structure_key(layer), len(keys)) for layer in network.layers)
        # The repeated blocks its source declared (``Network.blocks``); two at least.
        blocks = tuple(network.blocks) if network.blocks is not None else (None,) * len(network.layers)
        if len({b for b in blocks if b is not None}) < 2:
            blocks = (None,) * len(network.layers)
        consumers: dict = {}
        for (u, v) in sorted(network.edges):
            consumers.setdefault(u, []).append(v)
        block_outputs = tuple(
            blocks[v] is None or not consumers.get(v) or any(blocks[w] != blocks[v] for w in consumers[v])
            for v in range(len(network.layers))
        )
        # A tensor several layers share is charged to the first of them (its holder).
        charged = tuple(tuple(holder is None or holder == (v, i) for i, holder in enumerate(holders))
                        for v, holders in enumerate(_holders(network)))
        return cls(kinds, attention_cores(network), blocks, block_outputs, charged, consumers,
                   frozenset(expert_layers(network)), pipeline_copies(network, blocks))


def pipeline_copies(network, blocks) -> tuple:
    """Per layer, one flag per parameter tensor: whether a pipeline's last stage holds its own
    copy of it. A tensor several layers share (a tied embedding and output head) is charged to
    its first reader; where that reader comes before the repeated blocks (the first stage's
    layers) and another reads it after them (the last stage's), a pipeline of two stages or
    more keeps the weight on both, as the engines do: Megatron-Core makes "a second copy of
    word_embeddings on the last stage" (megatron-core 0.16.1
    models/common/language_module/language_module.py:187-233), nanotron ties the lm_head on the
    last stage to the first stage's embedding (trainer.py:953-971 at 0e0a27ea), DeepSpeed's
    pipeline holds a ``TiedLayerSpec`` on each stage that builds it (runtime/pipe/module.py).
    No blocks, no pipeline: no copies.

    >>> class L:  # a stand-in layer: its parameter tensors' identities
    ...     def __init__(self, *idents): self.idents = idents
    ...     def parameter_tensors(self): return [((4, 2), "ve", i) for i in self.idents]
    >>> class N: layers = [L("table"), L(None), L(None), L("table")]
    >>> pipeline_copies(N(), (None, 0, 1, None))
    ((False,), (False,), (False,), (True,))
    """
    inside = [v for v, b in enumerate(blocks) if b is not None]
    first, last = (inside[0], inside[-1]) if inside else (-1, len(blocks))
    return tuple(tuple(holder is not None and holder[0] < first and last < v for holder in holders)
                 for v, holders in enumerate(_holders(network)))


def _holders(network) -> list:
    """Per layer, per parameter tensor: where it is first read, ``(layer, entry)``, for a
    tensor layers may share (``Layer.parameter_tensors``' identity), ``None`` for one of its own."""
    first: dict = {}
    return [[None if ident is None else first.setdefault(ident, (v, i))
             for i, (_, _, ident) in enumerate(_parameter_tensors(layer))]
            for v, layer in enumerate(network.layers)]


def fsdp_units(blocks) -> tuple:
    """``(unit of every layer, unit count)``: each repeated block one unit (as FSDP wraps a
    decoder block), every layer outside the blocks one root unit (unit 0)."""
    ids: dict = {}
    index = np.array([0 if b is None else ids.setdefault(b, len(ids) + 1) for b in blocks], dtype=np.int64)
    return index, len(ids) + 1


def block_leads(blocks) -> np.ndarray:
    """Per layer, whether it is the first layer of its repeated block (``blocks``: each layer's
    block or ``None``): the layer a block's per-block costs are charged to.

    >>> block_leads([None, "b0", "b0", "b1", "b1", None]).tolist()
    [False, True, False, True, False, False]
    """
    seen: set = set()
    out = []
    for b in blocks:
        out.append(b is not None and b not in seen)
        if b is not None:
            seen.add(b)
    return np.array(out, dtype=bool)
