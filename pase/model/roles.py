"""Dimension roles: what each dimension of a layer's iteration space *is*, said where the layer
is built.

Letters (``Layer.dims``) are for display: ``h`` is a head in one graph and an image's height in
another. A role is the meaning: one of :data:`ROLES`, or ``None`` where nobody said. Whoever
builds a layer attaches its roles (``Layer.roles``, one per dimension, beside ``dims``):

- a layer type whose dimensions mean the same in every graph declares them itself
  (``Embedding``: its width is ``model``, its table's rows ``vocab``; ``MoE``: ``experts``,
  ``expert_width``, ``model``);
- a built-in graph declares a map from its own letters to roles once, for every layer it adds
  (``GraphBuilder(..., roles={"b": "batch", "h": "heads", ...})``, ``graphs/decoder.py``);
- the ``torch:`` importer declares roles in its handlers (attention's heads and sequence, the
  embedding's ids, the loss's classes) and :func:`propagate` carries them along the tensors to
  the layers between;
- a graph file carries them per layer (an optional ``roles`` field).

The parallel rules (``pase.planning.rules``) map roles onto mesh axes; nothing downstream reads
letters or layer names.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ROLES", "TENSOR_PARALLEL_ROLES", "check_roles", "merge_roles", "propagate", "roles_of", "weight_only_dims",
           "output_roles", "input_roles", "expert_layers"]

#: The vocabulary. ``batch``: the samples of a (micro-)batch; ``sequence``: a sequence's tokens
#: (the queries' positions in attention); ``key_sequence``: the keys' positions in attention's
#: two products; ``heads``: attention heads (query heads per key/value group where heads are
#: grouped); ``kv_groups``: key/value heads (groups of query heads); ``head_width``: the width
#: of one head; ``model``: the residual stream's width; ``mlp``: an MLP's inner width (the
#: output features of a column-parallel product, the input features of a row-parallel one);
#: ``vocab``: the vocabulary; ``classes``: a classifier's outputs; ``experts``: the experts of a
#: mixture; ``expert_width``: one expert's inner width; ``channels``, ``spatial``, ``kernel``:
#: a convolution's features, image positions and filter window; ``stack``: a stacked axis (q,
#: k and v of one product); ``latent``: a low-rank projection's compressed width (DeepSeek's
#: latent attention), replicated by tensor parallelism.
ROLES = (
    "batch", "sequence", "key_sequence", "heads", "kv_groups", "head_width", "model", "mlp", "vocab", "classes",
    "experts", "expert_width", "channels", "spatial", "kernel", "stack", "latent",
)

#: Roles a weight product is split over by tensor parallelism in the default rules
#: (``pase/planning/data/parallel_rules.json``); the torch importer names a product's own
#: output features ``mlp`` when nothing else names them.
TENSOR_PARALLEL_ROLES = ("heads", "kv_groups", "mlp", "expert_width", "vocab")


def check_roles(roles, rank: int, what: str) -> tuple:
    """``roles`` as a tuple of ``rank`` entries, each a name of :data:`ROLES` or None;
    ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(roles, (list, tuple)) or len(roles) != rank:
        raise ValueError(f"{what}: roles must give one entry (a role or null) per dimension, {rank} here, "
                         f"got {roles!r}")
    for role in roles:
        if role is not None and role not in ROLES:
            raise ValueError(f"{what}: unknown role {role!r}; known: {', '.join(ROLES)}")
    return tuple(roles)


def merge_roles(first, second) -> tuple | None:
    """Entry by entry, ``first``'s role where it has one, else ``second``'s (either may be None)."""
    if first is None:
        return None if second is None else tuple(second)
    if second is None:
        return tuple(first)
    return tuple(a if a is not None else b for a, b in zip(first, second))


def roles_of(layer) -> tuple:
    """The layer's roles, one per dimension (all None where it has none); the batch dimension
    is ``batch`` whatever was declared, since ``batch_dim`` already says so."""
    roles = list(layer.roles) if layer.roles is not None else [None] * len(layer.domain)
    if roles[layer.batch_dim] is None:
        roles[layer.batch_dim] = "batch"
    return tuple(roles)


def expert_layers(network) -> tuple:
    """The vertices of ``network``'s mixtures of experts: the layers that iterate over the
    ``experts`` role (a ``MoE``'s router, dispatch, experts and combine, one layer)."""
    return tuple(v for v, layer in enumerate(network.layers) if "experts" in roles_of(layer))


def _maps(layer) -> tuple:
    """``(inputs, outputs)``: per input and output tensor, per tensor dimension, the
    iteration-space dimension that splits it (or -1), read off the layer's own
    ``input_configs``/``output_configs`` (each dimension split 2 ways alone). Kept on the layer
    with the iteration space it was read for (a costing asks for every layer's many times)."""
    kept = getattr(layer, "_split_maps", None)
    if kept is not None and kept[0] == layer.domain:
        return kept[1]
    maps = _read_maps(layer)
    layer._split_maps = (layer.domain, maps)
    return maps


def _read_maps(layer) -> tuple:
    rank = len(layer.domain)
    probe = np.ones((rank, rank), dtype=np.int64) + np.eye(rank, dtype=np.int64)
    out = []
    for configs in (layer.input_configs(probe), layer.output_configs(probe)):
        maps = []
        for c in configs:
            c = np.asarray(c)
            split = c > 1  # (rank, tensor rank): which tensor dims each iteration dim splits
            maps.append(tuple(int(np.argmax(split[:, t])) if split[:, t].sum() == 1 else -1
                              for t in range(c.shape[1])))
        out.append(tuple(maps))
    return tuple(out)


def output_roles(layer) -> list:
    """Per output tensor of ``layer``, the roles of its dimensions (None where a dimension
    maps to no single dimension of the iteration space)."""
    roles = roles_of(layer)
    if layer.contiguous:
        return [(None,) * len(shape) for shape in layer.output_shapes]
    _, outs = _maps(layer)
    return [tuple(roles[j] if j >= 0 else None for j in mapping) for mapping in outs]


def input_roles(layer) -> list:
    """Per input tensor of ``layer``, the roles of its dimensions (None where a dimension maps
    to no single dimension of the iteration space)."""
    roles = roles_of(layer)
    if layer.contiguous:
        return [(None,) * len(t.shape) for t in layer.inputs]
    ins, _ = _maps(layer)
    return [tuple(roles[j] if j >= 0 else None for j in mapping) for mapping in ins]


def weight_only_dims(layer) -> tuple:
    """Dimensions a parameter of ``layer`` spans that split none of its activation inputs: a
    product's own output features (its ``N``), which no tensor it reads names."""
    if layer.contiguous:
        return ()
    spanned = {d for _, dims in layer.parameters() for d in dims}
    ins, _ = _maps(layer)
    read = {j for t, mapping in zip(layer.inputs, ins) if not t.is_param for j in mapping if j >= 0}
    return tuple(sorted(spanned - read))


def propagate(layers, seeds=None, fallback=None, fallbacks=()) -> list:
    """Roles of every layer, from what was declared, carried along the tensors.

    ``layers``: the network's layers in vertex order (their inputs name their producers);
    ``seeds``: ``{vertex: roles}`` declared besides each layer's own ``roles``. A dimension
    with no role takes the role of the tensor dimension it reads or writes (a forward pass in
    vertex order, then a backward one; declared roles are never replaced). ``fallback(v,
    layer, roles)`` may then name what is still unnamed (the torch importer names a product's
    own output features ``mlp``), and the passes run again; ``fallbacks``: several, in turn,
    the passes run after each. Contiguous layers (``Ravel``,
    ``Unravel``) merge dimensions and pass nothing. Returns one roles tuple per layer.
    """
    seeds = seeds or {}
    n = len(layers)
    roles = [list(roles_of(layer)) for layer in layers]
    for v, given in seeds.items():
        roles[v] = list(merge_roles(given, roles[v]))
    maps = [None if layer.contiguous else _maps(layer) for layer in layers]
    # Roles of every produced tensor's dimensions: (vertex, output index) -> list.
    tensors = {(v, i): [None] * len(shape) for v, layer in enumerate(layers) for i, shape in
               enumerate(layer.output_shapes)}

    def read(v):
        for position, t in enumerate(layers[v].inputs):
            if t.producer is not None:
                yield position, tensors[(t.producer, t.index)]

    def sweep(order, forward):
        """Each layer in ``order`` takes the roles of the tensors it reads (forward) or of all
        it touches (backward), then gives its roles to those tensors; True if anything changed."""
        changed = False
        for v in order:
            if maps[v] is None:
                continue
            ins, outs = maps[v]
            read_dims = [(ins[p], dims) for p, dims in read(v)]
            written = [(outs[i], tensors[(v, i)]) for i in range(len(outs))]
            for mapping, dims in (read_dims if forward else read_dims + written):
                for t, j in enumerate(mapping):
                    if j >= 0 and roles[v][j] is None and dims[t] is not None:
                        roles[v][j] = dims[t]
                        changed = True
            for mapping, dims in read_dims + written:
                for t, j in enumerate(mapping):
                    if j >= 0 and dims[t] is None and roles[v][j] is not None:
                        dims[t] = roles[v][j]
                        changed = True
        return changed

    steps = list(fallbacks) + ([fallback] if fallback else [])
    for round_ in range(len(steps) + 1):
        for _ in range(4):
            a = sweep(range(n), True)
            b = sweep(range(n - 1, -1, -1), False)
            if not (a or b):
                break
        if round_ < len(steps):
            for v, layer in enumerate(layers):
                roles[v] = list(merge_roles(roles[v], steps[round_](v, layer, tuple(roles[v]))))
    return [tuple(r) for r in roles]
