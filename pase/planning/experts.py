"""Expert-designed strategies (paper Section IV) as configuration choices of the same model.

Each expert strategy is one configuration per layer, in vertex-id order, like
``baselines.data_parallel``; ``strategy.evaluate`` costs it with the very formulas the
search minimises, so an expert strategy can never beat the search's optimum on
configurations the search enumerates. Three experts, one per kind of network:

- ``owt``: "one weird trick" (Krizhevsky 2014, the paper's [5]) for the CNNs;
- ``gnmt``: the data + pipeline parallelism of GNMT (Wu et al. 2016, the paper's [1]) for
  the LSTM language model;
- ``mesh_tensorflow``: the batch x model mesh of Mesh-TensorFlow (Shazeer et al. 2018, the
  paper's [3]) for the Transformer.

``expert_strategies`` returns every one that applies to a network.
"""

from __future__ import annotations

from types import MappingProxyType

from pase.core.checks import checked_device_count, is_positive_int
from pase.planning.baselines import largest_divisor
from pase.model.builder import Network
from pase.machines.paper import Machine
from pase.costing.strategy import evaluate
from pase.core.checks import a_network, arguments, positive_int
from pase.machines.registry import as_machine

__all__ = [
    "owt",
    "gnmt",
    "mesh_tensorflow",
    "mesh_tensorflow_meshes",
    "best_mesh",
    "expert_strategies",
    "EXPERTS",
    "PAPER_EXPERTS",
    "MESH_MODEL_LETTERS",
]

#: Layer types OWT splits along the batch (data parallelism): everything in a CNN but FC
#: layers and a loss that follows an FC.
_OWT_DATA_PARALLEL = frozenset(
    {"Conv", "Pooling", "BatchNorm", "Norm", "Concat", "Elementwise", "ReduceMean", "Ravel", "Unravel"}
)

#: Layer types that may appear around the LSTM in a GNMT-style network (all data parallel).
_GNMT_DATA_PARALLEL = frozenset({"Embedding", "FC", "SoftmaxCrossEntropy", "Elementwise"})

#: Iteration-space letters that Mesh-TensorFlow splits over the model axis of its mesh, in
#: the Transformer's Einsum notation (``docs/graphs.md``): ``v`` vocabulary, ``h`` attention
#: heads, ``f`` feed-forward width.
MESH_MODEL_LETTERS = ("v", "h", "f")

#: Layer types whose model letter (if any) Mesh-TensorFlow splits n ways. Norms,
#: element-wise layers and the Stack of an encoder-decoder attention keep their batch split
#: only: their tensors are ``(b, l, e)`` and Mesh-TF does not split the model width ``e``.
_MESH_MODEL_SPLIT = frozenset({"Einsum", "Embedding", "Softmax", "SoftmaxCrossEntropy", "Unstack"})
_MESH_BATCH_ONLY = frozenset({"Norm", "Elementwise", "Stack"})


def _ops(network: Network) -> set:
    return {layer.op for layer in network.layers}


# ---------------------------------------------------------------------------------------
# One weird trick


def owt(network: Network, procs: int) -> list:
    """"One weird trick" (Krizhevsky 2014): data parallelism, then parameter parallelism for FC.

    The exact choices, per layer type:

    - Conv, Pooling, BatchNorm/Norm, Concat, Elementwise, ReduceMean, Ravel and Unravel (the
      reshape before the classifier): data parallelism, the batch dimension split
      ``largest_divisor(b, p)`` ways (the largest divisor of the batch ``<= p``), nothing else
      split, exactly as ``data_parallel``.
    - FC ``(b, n, k)``: parameter parallelism, the output-neuron dimension ``n`` split by
      its largest divisor ``<= p``; batch and input dimension ``k`` unsplit. Each device
      holds a slice of the weight matrix and needs the whole (gathered) batch of inputs,
      which the model charges as the edge into the FC (an all-gather).
    - SoftmaxCrossEntropy ``(b, classes)`` that reads an FC: its class axis split like that
      FC's ``n`` (so logits stay where they were computed), batch unsplit. A loss reading any
      other layer is data parallel.

    Splits ignore the cut-off (like ``data_parallel``): on 64 devices a CNN's batch of 128 is
    split 64 ways although the search's cut-off of 4 stops at 32. A dimension with no
    divisor close to ``p`` leaves devices idle (ResNet's 1000 classes on 64 devices: 50).

    Parameters
    ----------
    network : Network
        A CNN: only the layer types above, at least one Conv.
    procs : int
        Number of devices ``p``.

    Returns
    -------
    list of tuple
        One configuration per vertex id.

    Raises
    ------
    ValueError
        For a network that is not a CNN of those layer types.

    Examples
    --------
    >>> from graphs import alexnet
    >>> owt(alexnet(128), 8)[-4:]
    [(1, 8, 1), (1, 8, 1), (1, 8, 1), (1, 8)]
    """
    procs = checked_device_count(procs)
    ops = _ops(network)
    allowed = _OWT_DATA_PARALLEL | {"FC", "SoftmaxCrossEntropy"}
    if "Conv" not in ops or not ops <= allowed:
        foreign = sorted(ops - allowed)
        raise ValueError(
            f"one weird trick applies to CNNs (convolutions followed by FC layers); graph "
            f"{network.name!r} " + (f"has {', '.join(foreign)} layers" if foreign else "has no convolution")
        )
    # The loss reads exactly one layer; which one decides whether it follows an FC.
    producer_of = {v: u for (u, v) in network.edges}
    configs: list = []
    for v, layer in enumerate(network.layers):
        config = [1] * len(layer.domain)
        if layer.op == "FC":
            n_dim = len(layer.domain) - 2  # FC space (x1..xj, n, k)
            config[n_dim] = largest_divisor(layer.domain[n_dim], procs)
        elif layer.op == "SoftmaxCrossEntropy" and v in producer_of and network.layers[producer_of[v]].op == "FC":
            fc = configs[producer_of[v]]
            config[-1] = fc[len(fc) - 2]
        else:
            config[layer.batch_dim] = largest_divisor(layer.domain[layer.batch_dim], procs)
        configs.append(tuple(config))
    return configs


# ---------------------------------------------------------------------------------------
# GNMT: LSTM layers on different devices, data parallelism across the rest


def gnmt(network: Network, procs: int) -> list:
    """GNMT-style data + pipeline parallelism (Wu et al. 2016) for an LSTM language model.

    GNMT places the LSTM layers on different devices and replicates that arrangement for
    data parallelism. Here:

    - LSTM ``(L, s, b, n, k)``: the layer dimension ``L`` split ``L`` ways (2 for RNNLM) and
      the batch split ``largest_divisor(b, p // L)`` ways (``p / 2`` for RNNLM); ``s``, ``n``,
      ``k`` unsplit.
    - Embedding, FC, SoftmaxCrossEntropy (and any Elementwise): data parallelism over all
      ``p`` devices, the batch split ``largest_divisor(b, p)`` ways.

    Why splitting ``L`` is "layers on different devices": the LSTM vertex is a GEMM batched
    over its layers (``docs/cost-model.md``). With ``L`` split ``L`` ways each device group holds
    the weights of one layer and computes only that layer (``Bp = L / c_L = 1``), and its
    weight-gradient all-reduce runs among the ``p / L`` devices of its group, which is what
    placing layer ``i`` on device group ``i`` means. The model charges no pipeline bubble
    and no overlap between the layers: it costs the per-device work of one layer.

    Parameters
    ----------
    network : Network
        A network with exactly one LSTM; the other layers Embedding, FC,
        SoftmaxCrossEntropy or Elementwise.
    procs : int
        Number of devices ``p``; at least ``L``.

    Raises
    ------
    ValueError
        For a network without that structure, or fewer devices than LSTM layers.

    Examples
    --------
    >>> from graphs import rnnlm
    >>> gnmt(rnnlm(128), 8)
    [(8, 1, 1, 1), (2, 1, 4, 1, 1), (8, 1, 1, 1), (8, 1, 1)]
    """
    procs = checked_device_count(procs)
    ops = [layer.op for layer in network.layers]
    foreign = sorted(set(ops) - _GNMT_DATA_PARALLEL - {"LSTM"})
    if ops.count("LSTM") != 1 or foreign:
        raise ValueError(
            f"GNMT-style parallelism applies to a network with one (multi-layer) LSTM and "
            f"embedding/FC/loss layers; graph {network.name!r} "
            + (f"has {', '.join(foreign)} layers" if foreign else f"has {ops.count('LSTM')} LSTM layers")
        )
    configs = []
    for layer in network.layers:
        config = [1] * len(layer.domain)
        if layer.op == "LSTM":
            L = layer.domain[0]
            if procs < L:
                raise ValueError(f"GNMT-style parallelism puts the {L} LSTM layers on different devices: it needs p >= {L}, got {procs}")
            config[0] = L
            config[layer.batch_dim] = largest_divisor(layer.domain[layer.batch_dim], procs // L)
        else:
            config[layer.batch_dim] = largest_divisor(layer.domain[layer.batch_dim], procs)
        configs.append(tuple(config))
    return configs


# ---------------------------------------------------------------------------------------
# Mesh-TensorFlow: a batch x model mesh


def _mesh_roles(network: Network) -> list:
    """Per layer: (batch column, model column or None); raises if Mesh-TF does not apply."""
    roles = []
    for v, layer in enumerate(network.layers):
        dims = layer.dims
        if layer.op not in _MESH_MODEL_SPLIT | _MESH_BATCH_ONLY or "b" not in dims:
            raise ValueError(
                f"Mesh-TensorFlow's batch x model mesh applies to Transformer-style graphs of Einsum, "
                f"Embedding, Softmax, Norm, Elementwise, Stack/Unstack layers with a batch dimension 'b'; "
                f"graph {network.name!r} has layer {network.names[v]!r} ({layer.op}, dims {dims!r})"
            )
        model = None
        if layer.op in _MESH_MODEL_SPLIT:
            present = [dims.index(l) for l in MESH_MODEL_LETTERS if l in dims]
            if len(present) != 1:
                raise ValueError(
                    f"Mesh-TensorFlow splits one of the vocabulary 'v', heads 'h' or feed-forward 'f' "
                    f"dimensions; layer {network.names[v]!r} of graph {network.name!r} has dims {dims!r}"
                )
            model = present[0]
        roles.append((dims.index("b"), model))
    return roles


def _mesh_configs(network: Network, roles: list, m: int, n: int) -> list | None:
    """The configurations of mesh ``(m, n)``, or None if a split does not divide its dimension."""
    configs = []
    for layer, (batch, model) in zip(network.layers, roles):
        config = [1] * len(layer.domain)
        config[batch] = m
        if model is not None:
            config[model] = n
        if any(d % c for d, c in zip(layer.domain, config)):
            return None
        configs.append(tuple(config))
    return configs


def mesh_tensorflow_meshes(network: Network, procs: int) -> list:
    """Valid Mesh-TensorFlow meshes ``(m, n)`` for ``procs`` devices, ``m`` decreasing.

    A mesh splits every batch dimension ``m`` ways and the model dimensions of
    ``mesh_tensorflow`` ``n`` ways; it is valid when ``m`` divides the batch and ``n``
    divides every model dimension it splits (heads, feed-forward width, vocabulary). The
    meshes use ``m * n = p'`` devices, ``p'`` the largest count ``<= p`` that has any valid
    mesh (``p' = p`` for the paper's powers of two up to 64).

    Examples
    --------
    >>> from graphs import transformer
    >>> mesh_tensorflow_meshes(transformer(128), 64)
    [(64, 1), (32, 2), (16, 4), (8, 8)]
    """
    procs = checked_device_count(procs)
    roles = _mesh_roles(network)
    for used in range(procs, 0, -1):
        meshes = [(used // n, n) for n in range(1, used + 1)
                  if used % n == 0 and _mesh_configs(network, roles, used // n, n) is not None]
        if meshes:
            return meshes
    raise ValueError(f"graph {network.name!r} has no valid Mesh-TensorFlow mesh")  # pragma: no cover (1 x 1 is valid)


def mesh_tensorflow(network: Network, procs: int, machine: Machine | None = None, m: int | None = None) -> list:
    """Mesh-TensorFlow's Transformer layout (Shazeer et al. 2018): batch ``m`` ways, model ``n`` ways.

    Devices form an ``m x n`` mesh with ``m * n = p``. Every layer's batch dimension ``b`` is
    split ``m`` ways. The model axis ``n`` splits exactly one iteration-space dimension of
    the layers that have one, by its Einsum letter:

    - ``enc/dec.embedding`` (space ``b l d v``): the vocabulary ``v``;
    - ``*.attn.qkv`` / ``*.cross.qkv`` (``s b h l k e``), ``*.split`` (Unstack, ``s b h l k``),
      ``*.scores`` (``b h l m k``), ``*.softmax`` (``b h l m``), ``*.context``
      (``b h l k m``): the heads ``h``;
    - ``*.out`` (``b l e h k``): the heads ``h``, here a reduction dimension (the output
      projection all-reduces over the model axis, as in Mesh-TF);
    - ``*.ff.up`` (``b l f e``) and ``*.ff.down`` (``b l e f``): the feed-forward width ``f``;
    - ``head.logits`` (``b l v e``) and the loss (``b l v``): the vocabulary ``v``;
    - ``*.position``, ``*.residual`` (Elementwise), ``*.norm`` (Norm) and ``*.stack``
      (Stack of ``[x, mem, mem]``): batch only (Mesh-TF does not split the width ``e``).

    Nothing else is split: sequence ``l``/``m``, key width ``k``, width ``e``/``d``.

    Parameters
    ----------
    network : Network
        A Transformer-style network (see ``MESH_MODEL_LETTERS``).
    procs : int
        Number of devices ``p``.
    machine : Machine, optional
        Used to cost the meshes when ``m`` is not given (default ``Machine()``).
    m : int, optional
        The batch side of the mesh. By default every valid mesh
        (``mesh_tensorflow_meshes``) is costed with ``evaluate`` and the cheapest is taken
        (ties: the larger ``m``, the more data-parallel one).

    Raises
    ------
    ValueError
        For a network Mesh-TF does not apply to, or an ``m`` giving no valid mesh.

    Examples
    --------
    >>> from graphs import transformer
    >>> net = transformer(128)
    >>> mesh_tensorflow(net, 8, m=4)[net.names.index("enc1.ff.up")]
    (4, 1, 2, 1)
    """
    procs = checked_device_count(procs)
    roles = _mesh_roles(network)
    if m is not None:
        if not is_positive_int(m) or procs % m:
            raise ValueError(f"the mesh's batch side m must be a positive divisor of p = {procs}, got {m!r}")
        configs = _mesh_configs(network, roles, m, procs // m)
        if configs is None:
            raise ValueError(
                f"mesh {m} x {procs // m} is not valid for graph {network.name!r}: the batch or a "
                f"model dimension is not divisible"
            )
        return configs
    m, n = best_mesh(network, procs, machine)
    return _mesh_configs(network, roles, m, n)


def best_mesh(network: Network, procs: int, machine: Machine | None = None) -> tuple:
    """The cheapest Mesh-TensorFlow mesh ``(m, n)`` under the cost model (ties: larger ``m``)."""
    machine = machine or Machine()
    roles = _mesh_roles(network)
    best = None
    for m, n in mesh_tensorflow_meshes(network, procs):
        cost = evaluate(network, _mesh_configs(network, roles, m, n), machine).total
        if best is None or cost < best[0]:
            best = (cost, m, n)
    return best[1], best[2]


# ---------------------------------------------------------------------------------------
# Registry


#: Every expert strategy by name: ``name -> function(network, procs, machine)``.
EXPERTS = MappingProxyType({
    "owt": lambda network, procs, machine=None: owt(network, procs),
    "gnmt": lambda network, procs, machine=None: gnmt(network, procs),
    "mesh-tf": mesh_tensorflow,
})

#: The expert strategy the paper compares against for each of its graphs (Section IV).
PAPER_EXPERTS = MappingProxyType({
    "alexnet": ("owt",),
    "resnet101": ("owt",),
    "inception3": ("owt",),
    "rnnlm": ("gnmt",),
    "transformer": ("mesh-tf",),
})


@arguments(network=a_network, procs=positive_int, machine=as_machine)
def expert_strategies(network: Network, procs: int, machine: Machine | None = None) -> dict:
    """All expert strategies that apply to ``network`` on ``procs`` devices.

    For the built-in graphs (by ``network.name``) these are the experts of the paper's
    Section IV: OWT for alexnet, resnet101 and inception3, GNMT for rnnlm, Mesh-TensorFlow
    for the transformer. Another network gets every expert whose structure it fits.

    Returns
    -------
    dict
        ``name -> list of configurations`` (vertex-id order); empty if none applies.
        An expert that needs more devices than ``procs`` (GNMT on one device) is left out.

    Examples
    --------
    >>> from graphs import rnnlm
    >>> list(expert_strategies(rnnlm(128), 4))
    ['gnmt']
    """
    procs = checked_device_count(procs)
    names = PAPER_EXPERTS.get(network.name, tuple(EXPERTS))
    strategies = {}
    for name in names:
        try:
            strategies[name] = EXPERTS[name](network, procs, machine)
        except ValueError:
            continue  # does not apply to this network or device count
    return strategies
