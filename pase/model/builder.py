"""Building computation graphs: layers in order, tensors wired to edges, cost tables.

``GraphBuilder`` records a network (layers, names, tensors read); ``Network.graph``
enumerates configurations and computes every layer-cost vector and edge-cost matrix for a
device count and machine, giving the networkx graph the search works on.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import networkx as nx
import numpy as np

from pase.core.checks import checked_device_count, is_positive_int
from pase.model.configs import count_configs, enumerate_configs
from pase.model.layers import Layer, Ravel, Unravel, redistribution_volume
from pase.machines.paper import Machine
from pase.model.roles import check_roles, merge_roles
from pase.model.readers import READER_RULES, link_matrix, reader_links
from pase.model.tensor import Tensor
from pase.core.errors import TooLarge
from pase.core.units import format_bytes

__all__ = ["GraphBuilder", "Network", "EdgeTensor", "edge_cost_matrix", "exchange_devices", "redistribution_seconds",
           "CostTablesTooLarge", "tokens_of"]


class CostTablesTooLarge(TooLarge):
    """The layer-cost vectors and edge-cost matrices would not fit the memory budget.

    Raised before they are computed; ``needed`` and ``budget`` are bytes.
    """

    def __init__(self, network: str, procs: int, needed: int, largest: int, budget: int, least: bool = False):
        self.needed = needed
        self.budget = budget
        super().__init__(
            f"the cost tables of {network} on {procs} devices are too large: "
            f"{'at least' if least else 'about'} {format_bytes(needed)} "
            f"(up to {largest} configurations per layer), over the budget of {format_bytes(budget)}"
        )


# Builders hand out tensors tagged with their own serial number, so a tensor of one
# network can never be wired into another. itertools.count is thread-safe and its value
# never affects a result.
_builder_ids = itertools.count(1)


@dataclass(frozen=True)
class EdgeTensor:
    """One tensor carried by an edge: its producer output and first consumer input."""

    shape: tuple
    output_index: int  # which output of the producer
    input_index: int  # first input position of the consumer that reads it


@dataclass(frozen=True)
class Network:
    """A computation graph before costing: layers in vertex-id order and their edges.

    Attributes
    ----------
    name : str
        Graph name (``"alexnet"``).
    cutoff : int
        Configuration cut-off ``t`` (``docs/cost-model.md``).
    layers : tuple of Layer
        Vertex ``i`` is ``layers[i]``.
    names : tuple of str
        Readable, unique layer names.
    edges : dict
        ``(u, v) -> tuple of EdgeTensor``: the distinct tensors ``v`` reads from ``u``.
    batch : int or None
        The mini-batch size it was built for, if any.
    readers : str
        How several readers of one tensor reduce its gradient (``pase.model.readers``):
        ``"each"`` its own (the paper's rule, the default) or ``"summed"`` once where they
        are laid out alike (``--readers summed``).
    architecture : dict or None
        What the builder declares the network to be, for the engines that build the model
        from its shape (Megatron-LM's arguments): a decoder's ``layers``, ``width``, ``heads``,
        ``kv_heads``, ``head_dim``, ``mlp_width``, ``vocab``, ``sequence``, ``max_positions``,
        ``gated``, ``norm`` (``rms``/``layer``), ``positions`` (``rotary``/``learned``),
        ``tied``, ``biases`` (``qkv``, ``out``, ``mlp``: which projections have them),
        ``qk_norm`` and, with experts, ``moe`` (``experts``, ``top_k``, ``width``,
        ``shared``, ``shared_width``, ``dense``, ``capacity``). ``None`` where nothing
        declares it (an imported model, a graph file).
    blocks : tuple or None
        The repeated block (a number, in order) each layer belongs to, or None outside any, as
        its source declared them (``GraphBuilder.block``: a decoder layer, a bottleneck, an
        Inception module; the torch importer: each child of a module list); None when the
        source declared none. Pipelines cut between blocks; full recomputation keeps each
        block's input.
    """

    name: str
    cutoff: int
    layers: tuple
    names: tuple
    edges: dict = field(hash=False)
    batch: int | None = None
    readers: str = "each"
    architecture: dict | None = field(default=None, hash=False, compare=False)
    #: What its source left out of the network, one line each (an ``hf:`` config field not
    #: modelled); the CLI prints them as notes.
    notes: tuple = field(default=(), compare=False)
    blocks: tuple | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.readers not in READER_RULES:
            raise ValueError(f"unknown reader rule {self.readers!r}; choose one of: {', '.join(READER_RULES)}")

    def with_readers(self, readers: str) -> "Network":
        """The same network under another reader rule (``pase.model.readers``)."""
        return self if readers == self.readers else dataclasses.replace(self, readers=readers)

    def __len__(self) -> int:
        return len(self.layers)

    def configs(self, procs: int, divisors: bool = False) -> list:
        """Valid configurations of every layer for ``procs`` devices.

        With ``divisors``, only those an engine can run: the devices a configuration uses
        divide ``procs`` (every part then has the same number of replicas, as a JAX or
        PyTorch device mesh needs). The unsplit configuration always qualifies.
        """
        procs = checked_device_count(procs)
        configs = [
            enumerate_configs(layer.domain, procs, self.cutoff, layer.unsplit, layer.contiguous)
            for layer in self.layers
        ]
        if divisors:
            configs = [C[procs % np.prod(C, axis=1) == 0] for C in configs]
        return configs

    def least_table_bytes(self, procs: int) -> tuple:
        """``(bytes, largest)``: a lower bound on the memory ``graph(procs)`` needs, and the
        most configurations of a layer, counted without enumerating any configuration.

        Bytes: the cost vectors and one edge matrix per distinct (configuration counts,
        tensor shape): equal matrices always share those (repeated blocks share one), so
        this never exceeds what ``graph`` computes, at 8 bytes an entry; Ravel and Unravel,
        which keep few of their configurations, count one each. Or, if more, the
        enumeration of the largest layer before any filter.
        """
        counted: dict = {}
        sizes = []
        enumeration = 0
        for layer in self.layers:
            key = (tuple(layer.domain), tuple(layer.unsplit), bool(layer.contiguous))
            if key not in counted:
                counted[key] = count_configs(layer.domain, procs, self.cutoff, layer.unsplit)
            full = counted[key]
            enumeration = max(enumeration, 8 * full * (len(layer.domain) + 1))
            sizes.append(1 if layer.contiguous else full)
        matrices = {}
        for (u, v), tensors in self.edges.items():
            for t in tensors:
                matrices[(sizes[u], sizes[v], tuple(t.shape))] = sizes[u] * sizes[v]
        tables = 8 * (sum(sizes) + sum(matrices.values()))
        return max(tables, enumeration), max(sizes, default=0)

    def _edge_keys(self, configs: list) -> tuple:
        """The tensor configurations of every edge and a key per distinct edge matrix.

        Returns ``(outputs, inputs, keys)``: per layer its output and input configuration
        arrays, and per edge ``(u, v)`` a tuple of one key per tensor it carries. Repeated
        blocks give equal keys: their matrices are computed (and stored) once.
        """
        outputs = [layer.output_configs(C) for layer, C in zip(self.layers, configs)]
        inputs = [layer.input_configs(C) for layer, C in zip(self.layers, configs)]
        keys = {}
        for (u, v), tensors in sorted(self.edges.items()):
            keys[(u, v)] = tuple(
                (t.shape, np.ascontiguousarray(outputs[u][t.output_index]).tobytes(),
                 np.ascontiguousarray(inputs[v][t.input_index]).tobytes(), len(configs[u]), len(configs[v]))
                for t in tensors
            )
        return outputs, inputs, keys

    def _table_bytes(self, configs: list, keys: dict) -> int:
        """Bytes of the cost vectors, of the distinct edge matrices (and distinct sums) and of
        the reader links' matrices."""
        counts = [len(c) for c in configs]
        distinct = {}
        for (u, v), tensor_keys in keys.items():
            for key in tensor_keys + ((tensor_keys,) if len(tensor_keys) > 1 else ()):
                distinct[key] = counts[u] * counts[v]
        for link in reader_links(self):
            a, b = self.layers[link.earlier], self.layers[link.later]
            key = ("readers", a.op, a.domain, link.earlier_input, b.op, b.domain, link.later_input,
                   configs[link.earlier].tobytes(), configs[link.later].tobytes())
            distinct[key] = counts[link.earlier] * counts[link.later]
            if (link.earlier, link.later) in keys:  # summed into that edge's matrix
                distinct[key + (link.earlier, link.later)] = counts[link.earlier] * counts[link.later]
        return 8 * (sum(distinct.values()) + sum(counts))

    def graph(self, procs: int, machine=None, configs: list | None = None, budget: int | None = None) -> nx.DiGraph:
        """The costed computation graph for ``procs`` devices.

        Vertices are ids ``0..n-1`` in creation order with attributes ``layer``, ``name``,
        ``configs`` (``(K, n_dims)`` int array) and ``cost`` (length ``K``); every edge
        ``(u, v)`` has ``cost``, the ``K_u x K_v`` redistribution-cost matrix, and
        ``tensors``. Graph attributes: ``network``, ``procs``, ``machine``.

        ``configs`` may pass the configurations already enumerated by ``configs(procs)``.
        With ``budget`` (bytes), ``CostTablesTooLarge`` is raised before any table is
        computed if they would need more. Edges of repeated blocks share one read-only matrix.
        Under the reader rule ``"summed"`` the graph also has an edge per reader link
        (``pase.model.readers``) with ``tensors`` empty, or the link's matrix added to the edge
        already joining the two readers.
        """
        procs = checked_device_count(procs)
        machine = machine or Machine()
        machine.check_procs(procs)
        if configs is None:
            if budget is not None:  # refuse before enumerating anything
                least, largest = self.least_table_bytes(procs)
                if least > budget:
                    raise CostTablesTooLarge(self.name, procs, least, largest, budget, least=True)
            configs = self.configs(procs)
        outputs, inputs, keys = self._edge_keys(configs)
        if budget is not None:
            needed = self._table_bytes(configs, keys)
            if needed > budget:
                raise CostTablesTooLarge(self.name, procs, needed, max(len(c) for c in configs), budget)
        G = nx.DiGraph(network=self, procs=procs, machine=machine, name=self.name)
        for v, (layer, name, C) in enumerate(zip(self.layers, self.names, configs)):
            G.add_node(v, layer=layer, name=name, configs=C, cost=np.asarray(layer.cost(C, machine), dtype=np.float64))
        # Each distinct matrix (and each distinct sum, for edges carrying several tensors) is
        # computed once per call; the memo lives only in this call.
        memo: dict = {}

        def matrix_of(key, t: EdgeTensor, u: int, v: int) -> np.ndarray:
            if key not in memo:
                matrix = edge_cost_matrix(t.shape, outputs[u][t.output_index], inputs[v][t.input_index], machine, procs)
                matrix.setflags(write=False)  # shared by the edges of repeated blocks
                memo[key] = matrix
            return memo[key]

        for (u, v), tensors in sorted(self.edges.items()):
            tensor_keys = keys[(u, v)]
            parts = [matrix_of(key, t, u, v) for key, t in zip(tensor_keys, tensors)]
            if len(parts) > 1:
                if tensor_keys not in memo:
                    summed = parts[0]
                    for m in parts[1:]:
                        summed = summed + m
                    summed.setflags(write=False)
                    memo[tensor_keys] = summed
                parts = [memo[tensor_keys]]
            G.add_edge(u, v, cost=parts[0], tensors=tensors)
        self._link_readers(G, configs, machine)
        return G

    def _link_readers(self, G: nx.DiGraph, configs: list, machine) -> None:
        """Under the rule ``"summed"``, each reader link's reduction leaves the later reader's
        cost for an edge that charges it only where the earlier reader is laid out otherwise
        (``pase.model.readers``); an edge already there gets the sum. Equal links (repeated
        blocks) share one matrix."""
        memo: dict = {}
        for link in reader_links(self):
            a, b = link.earlier, link.later
            matrix, reduction = link_matrix(self, link, configs, machine, memo)
            G.nodes[b]["cost"] = G.nodes[b]["cost"] - reduction
            if G.has_edge(a, b):
                G.edges[a, b]["cost"] = G.edges[a, b]["cost"] + matrix
            else:
                G.add_edge(a, b, cost=matrix, tensors=())

    def edge_list(self) -> list:
        """``[producer, consumer]`` pairs in the order the edges were created."""
        return [[u, v] for (u, v) in self.edges]


def tokens_of(network) -> int | None:
    """Tokens in one pass of ``network``: the elements of its first lookup's ids (``None``
    without a lookup table)."""
    for layer in network.layers:
        if layer.lookup_table:
            return int(math.prod(layer.ids.shape))
    return None


def exchange_devices(source: np.ndarray, target: np.ndarray, procs: int) -> np.ndarray:
    """Devices a redistribution from ``source`` to ``target`` splits spans: over the tensor
    dimensions whose splits differ, the product of the coarser split's pieces per finer one
    (``max / min`` where one divides the other: a dimension's finer pieces of one coarse piece
    sit on consecutive devices, as a mesh lays out context parallelism outside the sequence
    shards of sequence parallelism), else of ``max(source, target)``; all ``procs`` when the
    outermost (batch) dimension's split changes, since it is laid out across the others.

    >>> exchange_devices(np.array([[4, 8, 1]]), np.array([[4, 1, 1]]), 256).tolist()
    [8]
    >>> exchange_devices(np.array([[4, 8, 1]]), np.array([[2, 8, 1]]), 256).tolist()
    [256]
    >>> exchange_devices(np.array([[1, 16, 1]]), np.array([[1, 2, 1]]), 16).tolist()  # cp 2 x tp 8 -> cp 2
    [8]
    >>> exchange_devices(np.array([[1, 6, 1]]), np.array([[1, 4, 1]]), 24).tolist()
    [6]
    """
    source, target = np.broadcast_arrays(np.asarray(source), np.asarray(target))
    differ = source != target
    high, low = np.maximum(source, target), np.minimum(source, target)
    per_dim = np.where(high % low == 0, high // low, high)
    span = np.where(differ, per_dim, 1).prod(axis=-1)
    return np.where(differ[..., 0], procs, span)


def redistribution_seconds(machine, shape, source: np.ndarray, target: np.ndarray, procs: int) -> np.ndarray:
    """The edge rule: the redistribution of one tensor, forward and backward, for aligned (or
    broadcasting) ``source`` and ``target`` rows: ``2 x volume`` elements
    (:func:`~pase.model.layers.redistribution_volume`) priced by the machine over the devices
    the exchange spans (:func:`exchange_devices`): on a machine with nodes, inside a node at
    the node's bandwidth, across nodes at the network's; the reference machine charges
    ``rho x 2 volume`` whatever it spans. The per-layer search's edge matrices, the training
    search and ``evaluate`` all price an edge here."""
    volume = redistribution_volume(shape, source, target)
    devices = exchange_devices(source, target, procs)
    return np.asarray(machine.redistribute(2.0 * volume, devices), dtype=np.float64) * np.ones(volume.shape)


def edge_cost_matrix(shape, source: np.ndarray, target: np.ndarray, machine, procs: int) -> np.ndarray:
    """Redistribution cost of one tensor for every (source, target) configuration pair
    (:func:`redistribution_seconds`). Layers often imply the same tensor configuration for
    many of their configurations, so it is priced for the distinct rows only and expanded.
    """
    sources, source_of = np.unique(source, axis=0, return_inverse=True)
    targets, target_of = np.unique(target, axis=0, return_inverse=True)
    cost = redistribution_seconds(machine, shape, sources[:, None, :], targets[None, :, :], procs)
    return cost[np.ix_(source_of.reshape(-1), target_of.reshape(-1))]


class GraphBuilder:
    """Records layers in order and wires the tensors they read into edges.

    Examples
    --------
    >>> from pase.model.layers import FC, SoftmaxCrossEntropy
    >>> g = GraphBuilder("mlp", cutoff=1)
    >>> x = g.input((64, 256), "x", letters="bk")
    >>> h = g.add("fc1", FC(x, 512))
    >>> loss = g.add("loss", SoftmaxCrossEntropy(h))
    >>> net = g.build()
    >>> len(net), net.edge_list()
    (2, [[0, 1]])
    """

    def __init__(self, name: str, cutoff: int = 1, batch: int | None = None, roles: dict | None = None):
        if not is_positive_int(cutoff):
            raise ValueError(f"the cut-off must be a positive integer, got {cutoff!r}")
        if roles is not None:
            for letter, role in roles.items():
                check_roles((role,), 1, f"graph {name}: the role of letter {letter!r}")
        #: The graph's own letters and what they mean (``pase.model.roles``): every layer added
        #: takes the role of each of its dimension letters found here, where neither its type
        #: nor the caller of ``add`` said otherwise.
        self.roles = dict(roles or {})
        self.name = name
        self.cutoff = cutoff
        self.batch = batch
        self._id = next(_builder_ids)
        self._layers: list = []
        self._names: list = []
        self._edges: dict = {}
        self._inputs = 0
        self._blocks: list = []  # per layer: the key of its block, or None
        self._block = None  # the block being built (``block``)
        self._opened = 0

    def input(self, shape: Sequence[int], name: str = "", letters: str = "", param: bool = False) -> Tensor:
        """A graph input (image, token ids, positional encoding, weight): makes no edge."""
        shape = tuple(shape)
        for d in shape:
            if not is_positive_int(d, numpy=True):
                raise ValueError(f"input {name or '?'}: every size must be a positive integer, got {list(shape)}")
        if letters and len(letters) != len(shape):
            raise ValueError(f"input {name or '?'}: letters {letters!r} do not match shape {list(shape)}")
        self._inputs += 1
        return Tensor(tuple(int(d) for d in shape), None, self._inputs, bool(param), name, self._id, letters)

    def weight(self, shape: Sequence[int], name: str = "", letters: str = "") -> Tensor:
        """A trainable parameter: a graph input that the memory model counts."""
        return self.input(shape, name, letters, param=True)

    def block(self):
        """A context in which every layer added belongs to one new repeated block.

        >>> from pase.model.layers import FC
        >>> g = GraphBuilder("two")
        >>> x = g.input((4, 8), "x", letters="bk")
        >>> for i in range(2):
        ...     with g.block():
        ...         x = g.add(f"fc{i}", FC(x, 8))
        >>> g.build().blocks
        (0, 1)
        """
        builder = self

        class _Block:
            def __enter__(self):
                builder._opened += 1
                builder._block = ("block", builder._opened)

            def __exit__(self, *exc):
                builder._block = None
                return False

        return _Block()

    def add(self, name: str, layer: Layer, roles=None, block=None):
        """Add ``layer`` as the next vertex; returns its output tensor (or a tuple of them).

        ``roles``: one role (or None) per dimension of its iteration space, in place of those of
        its type and of the builder's letter map (``pase.model.roles``). ``block``: a key naming
        the repeated block it belongs to (layers of equal keys are one block), in place of the
        one being built by ``block()``.
        """
        if not isinstance(layer, Layer):
            raise TypeError(f"layer {name!r} must be a Layer, got {type(layer).__name__}")
        if not isinstance(name, str) or not name or name in self._names:
            raise ValueError(f"layer names must be unique and non-empty, got {name!r}")
        if roles is not None:
            layer.roles = merge_roles(check_roles(roles, len(layer.domain), f"layer {name!r}"), layer.roles)
        if self.roles and isinstance(layer.dims, str) and len(layer.dims) == len(layer.domain):
            layer.roles = merge_roles(layer.roles, tuple(self.roles.get(d) for d in layer.dims))
        try:
            layer.check()
        except ValueError as err:
            raise ValueError(f"layer {name!r}: {err}") from None
        v = len(self._layers)
        reads: dict = {}
        for position, t in enumerate(layer.inputs):
            if t.owner != self._id:
                raise ValueError(f"layer {name!r} reads {t!r}, which belongs to another graph")
            if t.producer is None:
                continue  # graph inputs make no edges
            if not 0 <= t.producer < v:
                raise ValueError(f"layer {name!r} reads {t!r} that no earlier layer produced")
            # The same tensor read twice counts once, at its first position.
            reads.setdefault(t.producer, {}).setdefault(t.index, position)
        for u, tensors in reads.items():
            shapes = self._layers[u].output_shapes
            self._edges[(u, v)] = tuple(
                EdgeTensor(shapes[index], index, position) for index, position in tensors.items()
            )
        self._layers.append(layer)
        self._names.append(name)
        self._blocks.append(block if block is not None else self._block)
        outputs = tuple(
            Tensor(shape, v, i, False, f"{name}:{i}" if len(layer.output_shapes) > 1 else name, self._id, letters)
            for i, (shape, letters) in enumerate(zip(layer.output_shapes, layer.output_letters))
        )
        return outputs[0] if len(outputs) == 1 else outputs

    def reshape(self, name: str, x: Tensor, shape: Sequence[int], letters: str | None = None) -> Tensor:
        """A Reshape: a Ravel (``name.ravel``) followed by an Unravel (``name.unravel``)."""
        flat = self.add(f"{name}.ravel", Ravel(x))
        return self.add(f"{name}.unravel", Unravel(flat, shape, letters))

    def build(self) -> Network:
        """The network recorded so far."""
        if not self._layers:
            raise ValueError(f"graph {self.name!r} has no layers")
        numbers: dict = {}
        blocks = tuple(None if b is None else numbers.setdefault(b, len(numbers)) for b in self._blocks)
        return Network(self.name, self.cutoff, tuple(self._layers), tuple(self._names), dict(self._edges), self.batch,
                       blocks=blocks if numbers else None)
