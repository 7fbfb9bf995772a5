"""Per-device memory of a strategy (``docs/memory.md``): the paper's preset of the memory model.

Parameters count ``param_bytes`` per element (fp16 weight and gradient plus fp32 master
weight and Adam moments by default), activations ``act_bytes`` per element (fp16). Every
activation is alive at the end of the forward pass; nothing is recomputed; communication
buffers and fragmentation are ignored. The reference cost model does not change.

The training model (``pase.costing.training``) counts the same elements, here
(:func:`parameter_shards`, :func:`activation_elements`), and prices them by kind: bytes per
parameter element by ZeRO stage and the engine's dtypes, only the outputs a backward pass reads,
recomputation, and what this preset ignores (buffers, fragmentation, a reserve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pase.core.checks import is_number
from pase.model.builder import Network
from pase.model.layers import Layer
from pase.costing.strategy import check_strategy

__all__ = [
    "MemoryModel", "MemorySummary", "ASSUMPTIONS", "parameter_shards", "parameter_elements", "activation_elements", "parameter_count",
    "charged_parameters",
]

#: What the figure leaves out; printed wherever a memory figure is.
ASSUMPTIONS = (
    "all activations kept for the backward pass, no recomputation; "
    "communication buffers and fragmentation ignored"
)


def parameter_shards(layer: Layer, C: np.ndarray) -> list:
    """Per parameter tensor of ``layer`` (``layer.parameter_tensors()`` order), for each
    configuration row of ``C``: ``(elements per device, replication group size)``. A tensor is
    divided by the splits of the iteration-space dimensions it spans and replicated across the
    others (the devices a configuration uses over its shards). The one place both memory models
    count a layer's parameters: :func:`parameter_elements` here, the training model's
    ``LayerParts.params`` (``pase.costing.training``).

    >>> from pase.model.builder import GraphBuilder
    >>> from pase.model.layers import FC
    >>> layer = FC(GraphBuilder("one", 1).input((8, 4)), 2)    # weight 4 x 2, dims (k, n)
    >>> [(e.tolist(), r.tolist()) for e, r in parameter_shards(layer, np.array([[2, 1, 2]]))]
    [([4.0], [2.0])]
    """
    C = np.asarray(C, dtype=np.float64)
    used = C.prod(axis=1)
    out = []
    for shape, dims, _ in layer.parameter_tensors():
        shards = C[:, list(dims)].prod(axis=1) if dims else np.ones(len(C))
        out.append((math.prod(shape) / shards, used / shards))
    return out


def parameter_elements(layer: Layer, C: np.ndarray, charged=None) -> np.ndarray:
    """Parameter elements per device for each configuration row of ``C`` (the sum of
    :func:`parameter_shards`). ``charged`` (one flag per entry of ``layer.parameter_tensors()``,
    default all) leaves out tensors another layer holds.
    """
    total = np.zeros(len(np.asarray(C)))
    for i, (elements, _) in enumerate(parameter_shards(layer, C)):
        if charged is None or charged[i]:
            total += elements
    return total


def charged_parameters(network: Network) -> tuple:
    """Per layer, one flag per ``parameter_tensors()`` entry: whether this layer holds it.

    A tensor several layers name in ``tied`` (an imported tied embedding, weights shared
    across layers) is one parameter: held by the first of its readers in vertex order, the
    others hold nothing. A built-in graph's weight ``Tensor`` read by two layers keeps the
    paper model's rule (each reader counts it), so the reference figures stay as they were;
    the training model counts it once.
    """
    seen: set = set()
    out = []
    for layer in network.layers:
        flags = []
        for _, _, key in layer.parameter_tensors():
            shared = key is not None and key[0] == "tied"
            flags.append(not shared or key not in seen)
            if shared:
                seen.add(key)
        out.append(tuple(flags))
    return tuple(out)


def activation_elements(layer: Layer, C: np.ndarray) -> np.ndarray:
    """Output-tensor elements per device, per configuration (all of them kept for the backward
    pass in this model; the training model keeps those a backward pass reads). The one place
    both memory models count a layer's output."""
    C = np.asarray(C)
    total = np.zeros(len(C))
    for shape, config in zip(layer.output_shapes, layer.output_configs(C)):
        total += math.prod(shape) / np.asarray(config, dtype=np.float64).prod(axis=1)
    return total * layer.output_density


def parameter_count(network: Network) -> int:
    """Trainable parameters of a network (each parameter tensor counted once, unsplit)."""
    return sum(math.prod(shape) for layer, flags in zip(network.layers, charged_parameters(network))
               for (shape, _, _), charged in zip(layer.parameter_tensors(), flags) if charged)


@dataclass(frozen=True)
class MemoryModel:
    """Bytes per parameter and per activation element.

    Parameters
    ----------
    param_bytes : float
        Per parameter element; 16 = fp16 weight (2) + fp16 gradient (2) + fp32 master
        weight, Adam first and second moments (4 + 4 + 4).
    act_bytes : float
        Per activation element; 2 = fp16.

    Examples
    --------
    >>> from pase.model.builder import GraphBuilder
    >>> from pase.model.layers import FC
    >>> g = GraphBuilder("one", 1)
    >>> layer = FC(g.input((8, 4)), 2)
    >>> MemoryModel().layer_memory(layer, np.array([[1, 1, 1], [1, 2, 1]])).tolist()
    [160.0, 80.0]
    """

    param_bytes: float = 16.0
    act_bytes: float = 2.0

    def __post_init__(self):
        for field in ("param_bytes", "act_bytes"):
            value = getattr(self, field)
            if not is_number(value) or not value >= 0 or not math.isfinite(value):
                raise ValueError(f"{field} must be a non-negative number, got {value!r}")

    def layer_memory(self, layer: Layer, C: np.ndarray, charged=None) -> np.ndarray:
        """``mem(v, c) = param_bytes * parameters + act_bytes * activations`` per row of ``C``.

        ``charged``: see ``parameter_elements`` (a tensor another layer holds is left out).
        """
        return (self.param_bytes * parameter_elements(layer, C, charged)
                + self.act_bytes * activation_elements(layer, C))

    def vectors(self, network: Network, configs: Sequence[np.ndarray]) -> list:
        """Memory vector of every vertex over its configuration array (a shared tensor once)."""
        return [self.layer_memory(layer, C, charged)
                for layer, C, charged in zip(network.layers, configs, charged_parameters(network))]

    def strategy_memory(self, network: Network, strategy: Sequence[Sequence[int]], procs: int | None = None) -> np.ndarray:
        """Per-layer bytes per device of a strategy (any configurations, checked)."""
        strategy = check_strategy(network, strategy, procs)
        return np.array(
            [float(self.layer_memory(layer, np.asarray([c]), charged)[0])
             for layer, c, charged in zip(network.layers, strategy, charged_parameters(network))]
        )

    def per_device(self, network: Network, strategy: Sequence[Sequence[int]], procs: int | None = None) -> float:
        """Total bytes per device of a strategy: the sum over its layers."""
        return float(self.strategy_memory(network, strategy, procs).sum())


@dataclass(frozen=True)
class MemorySummary:
    """Per-device memory of a strategy and of data parallelism, and the capped search's outcome.

    Attributes
    ----------
    per_layer : tuple of float
        Bytes per device of every layer (parameters and outputs), in vertex-id order.
    per_device_bytes, data_parallel_per_device_bytes : float
        Bytes per device of the strategy and of data parallelism.
    param_bytes, act_bytes : float
        Bytes per parameter element and per activation element.
    cap_bytes : float or None
        The memory cap, if any.
    status : str or None
        ``UNCONSTRAINED``, ``CAPPED`` or ``NOTHING_FITS`` after a capped search, else None.
    lower_bound : float or None
        Lagrangian lower bound on the cost of any fitting strategy (capped search).
    least_bytes : float or None
        The least memory any strategy needs (computed when the optimum does not fit).
    multiplier : float or None
        The smallest multiplier found whose Lagrangian optimum fits.
    searches : int or None
        Dynamic programmes the capped search ran.
    """

    per_layer: tuple
    per_device_bytes: float
    data_parallel_per_device_bytes: float
    param_bytes: float
    act_bytes: float
    cap_bytes: float | None = None
    status: str | None = None
    lower_bound: float | None = None
    least_bytes: float | None = None
    multiplier: float | None = None
    searches: int | None = None

    @property
    def fits(self) -> bool | None:
        return None if self.cap_bytes is None else self.per_device_bytes <= self.cap_bytes

    @property
    def data_parallel_fits(self) -> bool | None:
        return None if self.cap_bytes is None else self.data_parallel_per_device_bytes <= self.cap_bytes
