"""One imported model at several batch sizes, imported as few times as it can be.

The training search asks for a network at every micro-batch size it tries (``build(n)``).
Importing a PyTorch model means building it and tracing it with ``torch.export`` each time
(Mixtral-8x7B: about 12 s a size). An imported network's structure does not depend on the
batch: its graph file (``pase.sources.graph_json``) at another batch is the same file with the
batch-carrying inputs' leading dimension changed. ``Rebatcher`` imports the first two sizes
asked for, checks that the second equals the first re-batched through its graph file (layer
by layer: type, iteration space, arguments, parameters, inputs), and from then on re-batches
instead of importing. Where the check fails (a layer argument that holds the batch, such as a
reshape's target shape) or a re-batched file is refused, every size is imported; so is a batch
of one, which the importer maps differently (a size-1 batch is not told from other size-1
dimensions).
"""

from __future__ import annotations

from typing import Callable

from pase.model.builder import Network

from .graph_json import network_from_json, network_to_json

__all__ = ["Rebatcher", "rebatched", "fingerprint"]


def rebatched(network: Network, batch: int) -> Network:
    """``network`` at ``batch``: its graph file with every batch-carrying input's leading
    dimension (an input that is not a parameter, of the network's batch) set to ``batch``.

    Raises ``ValueError`` (``InputError``) when the file so changed is inconsistent, as when a
    layer's arguments hold the batch.
    """
    data = network_to_json(network)
    old = data.get("batch")
    if old is None:
        raise ValueError(f"{network.name} records no batch size to change")
    data["batch"] = int(batch)
    for tensor in data["inputs"]:
        if not tensor.get("param") and tensor["shape"] and tensor["shape"][0] == old:
            tensor["shape"][0] = int(batch)
    return network_from_json(data, where=f"{network.name} at batch {batch}")


def fingerprint(network: Network) -> tuple:
    """What prices a network: per layer its type, iteration space, arguments, parameters and
    input shapes (and whether each is a weight), and the edges."""
    layers = tuple(
        (type(layer).__name__, tuple(layer.domain), repr(sorted(layer.args.items())), repr(layer.parameters()),
         tuple((tuple(t.shape), bool(t.is_param)) for t in layer.inputs))
        for layer in network.layers)
    return network.batch, network.cutoff, layers, tuple(sorted(network.edges))


class Rebatcher:
    """``load(batch)`` memoised, re-batching once re-batching is shown to give what importing does.

    ``load`` imports the model at a batch size (a ``Network`` whose ``batch`` is that size).
    ``imports`` counts the calls to it.
    """

    def __init__(self, load: Callable[[int], Network]):
        self._load = load
        self._networks: dict = {}
        self._base: Network | None = None
        self._trusted: bool | None = None  # None: not checked yet
        self.imports = 0

    def _import(self, batch: int) -> Network:
        self.imports += 1
        return self._load(batch)

    def __call__(self, batch: int) -> Network:
        if batch in self._networks:
            return self._networks[batch]
        if self._base is None:
            network = self._base = self._import(batch)
        elif batch == 1 or self._base.batch == 1:
            # A batch of one is traced apart: its size-1 dimension is not told from the others.
            network = self._import(batch)
        elif self._trusted is None:
            network = self._import(batch)
            try:
                self._trusted = fingerprint(rebatched(self._base, batch)) == fingerprint(network)
            except ValueError:
                self._trusted = False
        elif self._trusted:
            try:
                network = rebatched(self._base, batch)
            except ValueError:
                network = self._import(batch)
        else:
            network = self._import(batch)
        self._networks[batch] = network
        return network
