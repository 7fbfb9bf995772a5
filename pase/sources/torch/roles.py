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
    """Set every layer's ``roles`` of ``network`` (just emitted) from the declared ones.

    In a transformer, first a product reading the model's input (a patch projection) makes
    the residual stream: its own output features are ``model``, carried to every layer the
    stream passes; then every product's own features still unnamed are an MLP's ``mlp``."""

    def own(layer, roles, role):
        if not (transformer and layer.product):
            return None
        mine = set(weight_only_dims(layer))
        return tuple(role if j in mine and r is None else None for j, r in enumerate(roles))

    def stream(v, layer, roles):
        reads_input = any(t.producer is None and not t.is_param for t in layer.inputs)
        return own(layer, roles, "model") if reads_input else None

    def inner_width(v, layer, roles):
        return own(layer, roles, "mlp")

    for layer, roles in zip(network.layers, propagate(network.layers, fallbacks=(stream, inner_width))):
        layer.roles = roles if any(roles) else None
