"""A plan as JAX shardings: one device mesh and a ``PartitionSpec`` per tensor of every layer.

Pure Python and NumPy (no jax import): ``export_shardings`` writes the JSON-able description
that ``--export-jax`` saves and that ``pase.outputs.jax.verify`` runs under XLA's SPMD partitioner.

The format (``"format": "pase-jax-shardings/1"``)
--------------------------------------------------
``mesh``
    ``{"axis_names": ["d0", "d1", ...], "axis_sizes": [2, 2, ...]}``: the ``procs`` devices
    (``jax.devices()[:procs]``, in order) reshaped row-major to the prime factors of
    ``procs`` in increasing order. Every split of a plan is a product of some of these axes.
``layers``
    One object per layer in vertex-id order: ``id``, ``name``, ``op``, ``dims`` (one letter
    per iteration-space dimension), ``domain``, ``config`` (the chosen splits), ``axes``
    (the mesh axes of every iteration-space dimension, ``[]`` when unsplit), and
    ``inputs``, ``outputs``, ``weights``: lists of tensors
    ``{"name", "shape", "spec"[, "producer"]}``. ``spec`` has one entry per tensor
    dimension: ``null`` (not split) or a list of mesh-axis names (split over their product,
    the first axis outermost), so ``PartitionSpec(*(tuple(e) if e else None for e in spec))``
    is the JAX sharding. ``producer`` names the layer that outputs an input tensor
    (``null`` for a graph input). Embedding lists its token ids as its input (the one-hot
    of the cost model is never built).

Layout: a configuration lays its parts on the mesh row-major with the batch dimension
outermost, then the other dimensions in iteration-space order (``docs/machines.md``,
"Placement"); when it uses ``P < procs`` devices the remaining mesh axes, innermost, hold
``procs / P`` replicas of every part. A tensor dimension takes the mesh axes of the
iteration-space dimensions it spans; the splits of dimensions a tensor does not have (a
GEMM's reduction dimension for its output) are left to XLA.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pase.core.checks import arguments, configurations, is_positive_int, optional, positive_int
from pase.model.builder import Network
from pase.model.layers import Layer
from pase.costing.strategy import check_strategy

__all__ = ["FORMAT", "export_shardings", "mesh_axes", "layout_axes", "tensor_dims", "partition_spec", "unpack_plan"]

#: Name and version of the export format.
FORMAT = "pase-jax-shardings/1"


def _prime_factors(n: int) -> list:
    """Prime factors of ``n`` in increasing order, with multiplicity: ``12 -> [2, 2, 3]``."""
    factors, d = [], 2
    while d * d <= n:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1
    if n > 1:
        factors.append(n)
    return factors


def mesh_axes(procs: int) -> tuple:
    """``(names, sizes)`` of the mesh for ``procs`` devices: one axis per prime factor.

    >>> mesh_axes(8)
    (['d0', 'd1', 'd2'], [2, 2, 2])
    >>> mesh_axes(12)
    (['d0', 'd1', 'd2'], [2, 2, 3])
    >>> mesh_axes(1)
    ([], [])
    """
    if not is_positive_int(procs, numpy=True):
        raise ValueError(f"the number of devices must be a positive integer, got {procs!r}")
    sizes = _prime_factors(int(procs))
    return [f"d{i}" for i in range(len(sizes))], sizes


def layout_axes(config: Sequence[int], batch_dim: int, procs: int) -> list:
    """Mesh-axis indices of every iteration-space dimension of ``config``.

    Dimensions take mesh axes in layout order (the batch dimension first, then the others in
    order), each the leftmost free axes whose sizes multiply to its split; the axes left
    over, innermost, are the replicas. Raises ``ValueError`` when the configuration's
    device count does not divide ``procs`` (a JAX sharding replicates every part equally).

    >>> layout_axes((2, 4, 1), batch_dim=0, procs=8)
    [[0], [1, 2], []]
    >>> layout_axes((2, 2), batch_dim=1, procs=8)   # the batch dimension (1) is outermost
    [[1], [0]]
    >>> layout_axes((3, 4), batch_dim=0, procs=12)  # axes are 2, 2, 3
    [[2], [0, 1]]
    """
    config = [int(c) for c in config]
    used = math.prod(config)
    if procs % used:
        raise ValueError(
            f"configuration {config} uses {used} devices, which does not divide {procs}: "
            "a JAX mesh needs an equal number of replicas of every part"
        )
    _, sizes = mesh_axes(procs)
    free = list(range(len(sizes)))
    order = [batch_dim] + [d for d in range(len(config)) if d != batch_dim]
    axes = [[] for _ in config]
    for d in order:
        for prime in _prime_factors(config[d]):
            pick = next(a for a in free if sizes[a] == prime)  # exists: used divides procs
            free.remove(pick)
            axes[d].append(pick)
        axes[d].sort()
    return axes


# Probe values: distinct primes, one per iteration-space dimension (enough for rank 16).
_PROBES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)


def tensor_dims(layer: Layer) -> dict:
    """Which iteration-space dimensions every tensor dimension of ``layer`` spans.

    Returns ``{"inputs": [...], "outputs": [...], "weights": [...]}``, one list per tensor
    with, per tensor dimension, a tuple of iteration-space dimensions (empty: never split).
    Read off the layer's own ``input_configs`` / ``output_configs`` by giving every
    dimension a distinct prime split, so it holds for any layer type: a tensor dimension
    split by ``2 * 5`` spans iteration-space dimensions 0 and 2 (a Ravel's flat output).
    Weights come from ``parameters()``.

    >>> from pase import GraphBuilder, FC
    >>> g = GraphBuilder("t")
    >>> y = g.add("fc", FC(g.input((8, 6), "x"), 4))
    >>> tensor_dims(g.build().layers[0])
    {'inputs': [[(0,), (2,)]], 'outputs': [[(0,), (1,)]], 'weights': [[(1,), (2,)]]}
    """
    rank = len(layer.domain)
    if rank > len(_PROBES):
        raise ValueError(f"{layer.op}: iteration spaces of more than {len(_PROBES)} dimensions are not supported")
    probe = np.asarray([_PROBES[:rank]], dtype=np.int64)

    def decode(configs, shapes, what):
        result = []
        for config, shape in zip(configs, shapes):
            row = np.asarray(config).reshape(-1)
            if len(row) != len(shape):
                raise ValueError(f"{layer.op}: an {what} configuration does not match the {what} shape {list(shape)}")
            dims = []
            for value in row.tolist():
                spanned = tuple(d for d in range(rank) if value % _PROBES[d] == 0)
                if math.prod(_PROBES[d] for d in spanned) != value:
                    raise ValueError(f"{layer.op}: cannot tell which dimensions an {what} tensor dimension spans")
                dims.append(spanned)
            result.append(dims)
        return result

    return {
        "inputs": decode(layer.input_configs(probe), [t.shape for t in layer.inputs], "input"),
        "outputs": decode(layer.output_configs(probe), layer.output_shapes, "output"),
        "weights": [[(d,) for d in spanned] for _, spanned in layer.parameters()],
    }


def partition_spec(dims: Sequence[tuple], axes: Sequence[list], names: Sequence[str]) -> list:
    """The spec of a tensor: per tensor dimension, the mesh axes of the dimensions it spans.

    >>> partition_spec([(0,), (), (1, 2)], [[0], [1], [2]], ["d0", "d1", "d2"])
    [['d0'], None, ['d1', 'd2']]
    """
    spec = []
    for spanned in dims:
        entry = [names[a] for d in spanned for a in axes[d]]
        spec.append(entry or None)
    return spec


def _weight_names(layer: Layer, name: str) -> list:
    """Names of the implicit weights of a layer, in ``parameters()`` order."""
    count = len(layer.parameters())
    if layer.weight_names is not None:
        return [f"{name}.{w}" for w in layer.weight_names][:count]
    if count == 1:
        return [f"{name}.weight"]
    return [f"{name}.weight{i}" for i in range(count)]


def unpack_plan(network, configs=None, procs=None) -> tuple:
    """``(network, configs, procs)`` from a ``pase.Plan`` or from the three given apart."""
    if isinstance(network, Network):
        if configs is None or procs is None:
            raise ValueError("give the configurations and the device count with a network (or pass a Plan)")
        return network, configs, procs
    if all(hasattr(network, a) for a in ("network", "configs", "procs")):
        return network.network, network.configs if configs is None else configs, network.procs if procs is None else procs
    raise TypeError(f"network must be a pase.Plan or a Network: expected a pase.Plan or a Network, got "
                    f"{type(network).__name__}")


@arguments(configs=optional(configurations), procs=optional(positive_int))
def export_shardings(network, configs: Sequence[Sequence[int]] | None = None, procs: int | None = None) -> dict:
    """The plan ``configs`` for ``network`` on ``procs`` devices as a JAX mesh and shardings.

    Parameters
    ----------
    network : Network or Plan
        The computation graph, or a ``pase.Plan`` (then ``configs`` and ``procs`` default to
        its own).
    configs : sequence of sequences of int
        One configuration per layer, in vertex-id order (a strategy's ``configs``).
    procs : int
        Number of devices. Every configuration must use a divisor of ``procs`` devices.

    Returns
    -------
    dict
        JSON-able; the format is described in this module's docstring.

    Examples
    --------
    >>> from pase import GraphBuilder, FC, SoftmaxCrossEntropy
    >>> g = GraphBuilder("mlp")
    >>> h = g.add("fc", FC(g.input((8, 16), "x", letters="bk"), 32))
    >>> loss = g.add("loss", SoftmaxCrossEntropy(h))
    >>> shardings = export_shardings(g.build(), [(2, 2, 1), (4, 1)], 4)
    >>> shardings["mesh"]
    {'axis_names': ['d0', 'd1'], 'axis_sizes': [2, 2]}
    >>> fc = shardings["layers"][0]
    >>> fc["inputs"][0]["spec"], fc["weights"][0]["spec"], fc["outputs"][0]["spec"]
    ([['d0'], None], [['d1'], None], [['d0'], ['d1']])
    """
    network, configs, procs = unpack_plan(network, configs, procs)
    strategy = check_strategy(network, configs, procs)
    names, sizes = mesh_axes(procs)
    layers = []
    for v, (layer, name, config) in enumerate(zip(network.layers, network.names, strategy)):
        try:
            axes = layout_axes(config, layer.batch_dim, int(procs))
            spanned = tensor_dims(layer)
        except ValueError as err:
            raise ValueError(f"layer {v} ({name}, {layer.op}): {err}") from None
        inputs, weights = [], []
        for t, dims in zip(layer.inputs, spanned["inputs"]):
            entry = {"name": t.name, "shape": list(t.shape), "spec": partition_spec(dims, axes, names)}
            if t.is_param:  # a weight that is a graph input (Einsum, Embedding)
                if layer.lookup_table:
                    entry["name"] = f"{name}.weight"  # its tensor name is generic
                weights.append(entry)
            else:
                entry["producer"] = None if t.producer is None else network.names[t.producer]
                inputs.append(entry)
        if layer.lookup_table:
            # The cost model's one-hot (ids..., V) is never built: the input is the ids.
            one_hot = inputs[0]
            inputs[0] = dict(one_hot, shape=one_hot["shape"][:-1], spec=one_hot["spec"][:-1])
        if not weights:  # implicit weights (Conv, FC, LSTM, norms)
            weights = [
                {"name": w_name, "shape": list(shape), "spec": partition_spec(dims, axes, names)}
                for w_name, (shape, _), dims in zip(_weight_names(layer, name), layer.parameters(),
                                                    spanned["weights"])
            ]
        outputs = [
            {"name": name if len(layer.output_shapes) == 1 else f"{name}:{i}", "shape": list(shape),
             "spec": partition_spec(dims, axes, names)}
            for i, (shape, dims) in enumerate(zip(layer.output_shapes, spanned["outputs"]))
        ]
        layers.append({
            "id": v, "name": name, "op": layer.op, "dims": layer.dims, "domain": list(layer.domain),
            "config": list(config), "axes": [[names[a] for a in dim] for dim in axes],
            "inputs": inputs, "outputs": outputs, "weights": weights,
        })
    return {
        "format": FORMAT,
        "graph": network.name,
        "procs": int(procs),
        "mesh": {"axis_names": names, "axis_sizes": sizes},
        "layout": "row-major, batch dimension outermost, then the iteration-space order; replicas innermost",
        "layers": layers,
    }
