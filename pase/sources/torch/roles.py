"""The dimension roles of an imported model (``pase.model.roles``).

The handlers declare what they know: attention (``handle_sdpa``) its heads, key/value groups,
sequence and head width; the embedding its token ids' batch and sequence; the loss its classes
(the vocabulary of a model that reads token ids). :func:`name_roles` carries them along the
tensors to every layer between (a projection into heads takes the heads of the attention that
reads it, a residual add the width of the stream it adds to), and, in a transformer (a model
reading token ids, or with attention), names what is still unnamed of a product's own output
features ``mlp``: the inner width of an MLP, split by tensor parallelism as Megatron-LM splits it
(column-parallel into it, row-parallel out).
"""

from __future__ import annotations

from pase.model.roles import propagate, weight_only_dims

__all__ = ["name_roles"]


def name_roles(network, transformer: bool) -> None:
    """Set every layer's ``roles`` of ``network`` (just emitted) from the declared ones."""

    def inner_width(v, layer, roles):
        if not (transformer and layer.product):
            return None
        own = set(weight_only_dims(layer))
        return tuple("mlp" if j in own and r is None else None for j, r in enumerate(roles))

    for layer, roles in zip(network.layers, propagate(network.layers, fallback=inner_width)):
        layer.roles = roles if any(roles) else None
