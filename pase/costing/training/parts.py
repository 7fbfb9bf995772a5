"""A layer's cost taken apart (:class:`LayerParts`): compute, activation collectives, weight
reductions, priced once per configuration array; :class:`PricedLayers`, every layer's parts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from pase.costing.memory import activation_elements, parameter_shards
from pase.costing.training.structure import NetworkStructure, model_flops, parameter_elements_unique
from pase.model.layers.work import AllReduce, AllToAll, Exchange, Gemm, LayerWork, Pass

__all__ = ["LayerParts", "layer_parts", "part_pricers", "PricedLayers", "FORWARD_SHARE", "FORWARD_COMM_SHARE",
           "LATENCY_ELEMENTS"]

#: Share of a layer's training-step compute that is its forward pass: one product of the
#: three a GEMM runs per step (forward, gradient of the input, gradient of the weight); the
#: same share is taken for memory-bound work, whose backward moves about twice the bytes.
FORWARD_SHARE = 1.0 / 3.0
#: Share of a layer's activation collectives that belong to the forward pass. In Megatron's
#: tensor parallelism it is exact: a row-parallel product all-reduces its output forward, a
#: column-parallel one its input gradient backward, one each per pair.
FORWARD_COMM_SHARE = 0.5


@dataclass(frozen=True)
class LayerParts:
    """What one layer spends, per configuration row, for one micro-batch.

    ``compute``: its GEMMs and memory-bound work, forward and backward; ``activation``: its
    collectives of activations and activation gradients; ``gradient``: the all-reduce of its
    weight gradients at the gradient's element size, ``gather``: the same collective at the
    weight's element size (a reduce-scatter or all-gather is half an all-reduce in the ring
    model). ``params``: parameter tensors as ``(elements per device, replication group
    size)``; ``activations``: output elements per device; ``latency``: the fixed part of the
    weight-gradient collectives (their time with nothing to move), which bucketing shares;
    ``work``: the layer's work these parts price (``Layer.work``), whose GEMMs
    (:meth:`gemm_seconds`, :meth:`gemm_elements`) another number format re-prices.
    ``reduce_scatter`` and ``all_gather``: the weight-gradient collectives priced as the
    machine prices a reduce-scatter of the gradients and an all-gather of the weights (half of
    ``gradient`` and ``gather`` on a machine that measured neither, its own curves where it
    did); ``activation_rs``: ``activation`` with its all-reduces priced as reduce-scatters (what
    sequence parallelism runs).
    """

    compute: np.ndarray
    activation: np.ndarray
    gradient: np.ndarray
    gather: np.ndarray
    params: tuple
    activations: np.ndarray
    latency: np.ndarray | None = None
    work: LayerWork | None = None
    reduce_scatter: np.ndarray | None = None
    all_gather: np.ndarray | None = None
    activation_rs: np.ndarray | None = None

    def share(self, part: str, whole: str) -> np.ndarray:
        """``part / whole`` per row (``reduce_scatter`` of ``gradient``, ``all_gather`` of
        ``gather``, ``activation_rs`` of ``activation``): exactly 0.5 on a machine that prices
        them as half an all-reduce, and where nothing moves."""
        return self._shares[(part, whole)]

    @cached_property
    def _shares(self) -> dict:
        out = {}
        for part, whole in (("reduce_scatter", "gradient"), ("all_gather", "gather"), ("activation_rs", "activation")):
            a, b = getattr(self, part), getattr(self, whole)
            out[(part, whole)] = (np.full(len(self.compute), 0.5) if a is None
                                  else np.where(b > 0, a / np.where(b > 0, b, 1.0), 0.5))
        return out

    def gemm_seconds(self, machine, dtype: str = "bf16") -> np.ndarray:
        """Its GEMMs alone (the compute part without its memory-bound passes), priced by
        ``machine`` in ``dtype``, per row."""
        rows = len(self.compute)
        seconds = self.work.compute.value(lambda piece: piece.priced(machine, dtype) if isinstance(piece, Gemm)
                                          else _known(piece))
        return np.asarray(0.0 if seconds is None else seconds, dtype=np.float64) * np.ones(rows)

    def gemm_elements(self) -> np.ndarray:
        """Elements of its GEMMs' operands and outputs, ``B (M K + K N + M N)`` summed, per row."""
        elements = 0.0
        for gemm in self.work.gemms():
            elements = elements + gemm.operand_elements()
        return np.asarray(elements, dtype=np.float64) * np.ones(len(self.compute))


#: Elements a weight-gradient all-reduce is priced at for its fixed part (its latency): almost
#: nothing moved.
LATENCY_ELEMENTS = 1e-12


def part_pricers(machine) -> dict:
    """How each part of :class:`LayerParts` prices a piece of a layer's work (``Layer.work``):
    ``compute`` its GEMMs and memory-bound passes, ``activation`` its collectives of activations,
    ``gradient`` and ``gather`` its weight-gradient all-reduces at the gradient's and at the
    weight's element size, ``latency`` those all-reduces with :data:`LATENCY_ELEMENTS` elements.
    A piece of a kind no part knows raises (it would otherwise go uncounted)."""

    def compute(piece):
        if isinstance(piece, (Gemm, Pass)):
            return piece.priced(machine)
        return _known(piece)

    def activation(piece):
        return piece.priced(machine) if _known(piece) is None and piece.activation else None

    def activation_rs(piece):
        if _known(piece) is not None or not piece.activation:
            return None
        if isinstance(piece, AllReduce):
            return machine.reduce_scatter(piece.elements, piece.group)
        return piece.priced(machine)

    def weight(grad: bool, latency: bool = False, collective=None):
        def price(piece):
            if _known(piece) is not None or not piece.weight:
                return None
            elements = piece.elements
            if latency:
                elements = np.asarray(elements, dtype=np.float64) * 0.0 + LATENCY_ELEMENTS
            return (collective or machine.all_reduce)(elements, piece.group, grad=grad)
        return price

    return {"compute": compute, "activation": activation, "gradient": weight(True), "gather": weight(False),
            "latency": weight(True, latency=True), "reduce_scatter": weight(True, collective=machine.reduce_scatter),
            "all_gather": weight(False, collective=machine.all_gather), "activation_rs": activation_rs}


def _known(piece) -> None:
    """``None`` for a piece some part of :class:`LayerParts` prices; ``TypeError`` otherwise."""
    if isinstance(piece, (Gemm, Pass, AllReduce, Exchange, AllToAll)):
        return None
    raise TypeError(f"the training model prices no {type(piece).__name__} (pase.costing.training.parts.part_pricers)")


def layer_parts(layer, C: np.ndarray, machine) -> LayerParts:
    """Take the cost of every configuration of ``layer`` apart (:class:`LayerParts`): its work
    (``Layer.work``, once) priced part by part by ``machine``."""
    C = np.asarray(C, dtype=np.int64)
    work = layer.work(C)
    parts = {}
    for keep, price in part_pricers(machine).items():
        parts[keep] = np.asarray(work.value(price, len(C)), dtype=np.float64) * np.ones(len(C))
    # Elements counted where the paper's memory model counts them (pase.costing.memory).
    params = parameter_shards(layer, C)
    activations = activation_elements(layer, C)
    return LayerParts(parts["compute"], parts["activation"], parts["gradient"], parts["gather"], tuple(params),
                      activations, parts["latency"], work, parts["reduce_scatter"], parts["all_gather"],
                      parts["activation_rs"])


@dataclass(frozen=True, eq=False)
class PricedLayers:
    """A network's layers taken apart for one machine: the record every part of the costing
    reads. ``configs``: each layer's configuration rows; ``parts``: their :class:`LayerParts`;
    ``kinds``: per layer, the index of its distinct parts (layers of repeated blocks equal in
    everything a cost reads share one); ``structure``: :class:`NetworkStructure`."""

    network: object
    machine: object
    configs: list
    kinds: list
    parts: list
    structure: NetworkStructure

    @cached_property
    def model_flops(self) -> float:
        """The network's model FLOPs of one micro-batch (``structure.model_flops``)."""
        return model_flops(self.network)

    @cached_property
    def parameters(self) -> int:
        """The network's parameters, a shared tensor once (``structure.parameter_elements_unique``)."""
        return parameter_elements_unique(self.network)

    @classmethod
    def of(cls, network, configs: Sequence[np.ndarray], machine, structure: NetworkStructure) -> "PricedLayers":
        configs = [np.asarray(C, dtype=np.int64) for C in configs]
        # Layers of repeated blocks are equal in everything a cost reads: take each apart once.
        memo: dict = {}
        kinds, parts = [], []
        for layer, kind, C in zip(network.layers, structure.kinds, configs):
            key = (kind, C.tobytes(), C.shape)
            if key not in memo:
                memo[key] = (len(memo), layer_parts(layer, C, machine))
            index, priced = memo[key]
            kinds.append(index)
            parts.append(priced)
        return cls(network, machine, configs, kinds, parts, structure)
