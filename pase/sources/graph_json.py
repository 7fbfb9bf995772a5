"""The JSON graph format: any network written to a file and read back exactly.

A graph file lists the graph inputs (images, token ids, weights) and the layers in vertex
order, each with its ``op``, the tensors it reads (by name) and its arguments; reading it
rebuilds every layer through the layer registry, so the costs are identical to the bit.
"""

from __future__ import annotations

import dataclasses
import json

from pase.core.checks import is_int, is_positive_int
from pase.model.builder import GraphBuilder, Network
from pase.core.fileio import InputError, read_json
from pase.model.layers import make_layer
from pase.model.readers import READER_RULES
from pase.core.checks import a_network, arguments, text

from .blocks import structural_blocks

__all__ = ["FORMAT", "VERSION", "network_to_json", "network_from_json", "dumps", "load_graph_file"]

FORMAT = "pase-graph"
VERSION = 1
#: Largest dimension (or integer argument) a graph file may give: every size stays exact in
#: float64 and int64, which the costs and configurations use.
MAX_SIZE = 2**53
#: Largest number of elements of a tensor or an iteration space: about 1.6e60, far beyond any
#: model (GPT-3 175B at the largest -b has about 3e24), yet every cost stays finite in float64.
MAX_ELEMENTS = 2**200


@arguments(network=a_network)
def network_to_json(network: Network) -> dict:
    """The graph file of ``network`` as a JSON-able dict.

    Graph inputs are named by their own names (made unique where two share one); a layer
    output is named by its layer, with ``:i`` for output ``i`` of a layer with several.
    """
    inputs: list = []
    names: dict = {}  # tensor key -> name in the file
    used = set(network.names)
    for layer in network.layers:
        for t in layer.operands:
            if t.producer is not None or t.key in names:
                continue
            name = t.name or f"input{len(inputs)}"
            base, n = name, 2
            while name in used:
                name, n = f"{base}#{n}", n + 1
            used.add(name)
            names[t.key] = name
            inputs.append({"name": name, "shape": list(t.shape), "letters": t.letters, "param": t.is_param})

    def ref(t) -> str:
        if t.producer is None:
            return names[t.key]
        producer = network.names[t.producer]
        return producer if len(network.layers[t.producer].output_shapes) == 1 else f"{producer}:{t.index}"

    layers = [
        {"name": name, "op": layer.op, "inputs": [ref(t) for t in layer.operands], "args": layer.args,
         # What each dimension is (``pase.model.roles``), where it was said: older files have none.
         **({"roles": list(layer.roles)} if layer.roles is not None and any(layer.roles) else {}),
         # The repeated block it belongs to (a number), where the source declared blocks.
         **({"block": block} if block is not None else {})}
        for name, layer, block in zip(network.names, network.layers, network.blocks or [None] * len(network.layers))
    ]
    return {
        "format": FORMAT, "version": VERSION, "name": network.name, "cutoff": network.cutoff,
        "batch": network.batch, **({"readers": network.readers} if network.readers != "each" else {}),
        "inputs": inputs, "layers": layers,
    }


def dumps(network: Network) -> str:
    """The graph file's text: one input or layer per line."""
    data = network_to_json(network)
    head = {k: v for k, v in data.items() if k not in ("inputs", "layers")}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    for key in ("inputs", "layers"):
        items = ",\n  ".join(json.dumps(x) for x in data[key])
        lines.append(f' "{key}": [\n  {items}\n ]' + ("," if key == "inputs" else ""))
    return "\n".join(lines) + "\n}\n"


def _field(obj: dict, key: str, kind, where: str, optional=False, default=None):
    if key not in obj:
        if optional:
            return default
        raise InputError(f"{where}: missing field {key!r}")
    value = obj[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, (int,)))
    if not ok:
        raise InputError(f"{where}: field {key!r} must be {_kind_name(kind)}, got {json.dumps(value)[:60]}")
    return value


#: The fields of a graph file, of each graph input and of each layer. Any other is refused:
#: a misspelt optional field (``"params"``, ``"arg"``) would otherwise be silently ignored.
_TOP_FIELDS = ("format", "version", "name", "cutoff", "batch", "readers", "inputs", "layers")
_INPUT_FIELDS = ("name", "shape", "letters", "param")
_LAYER_FIELDS = ("name", "op", "inputs", "args", "roles", "block")


def _known_fields(obj: dict, fields: tuple, where: str) -> None:
    unknown = [key for key in obj if key not in fields]
    if unknown:
        raise InputError(f"{where}: unknown field {json.dumps(unknown[0])[:60]} (fields: {', '.join(fields)})")


def _kind_name(kind) -> str:
    return {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true or false"}.get(
        kind, "of another type")


def _sizes(shape) -> str:
    """A shape for a message, its long numbers shortened."""
    text = "[" + ", ".join(str(d) if len(str(d)) <= 20 else f"{str(d)[:8]}...({len(str(d))} digits)"
                           for d in shape) + "]"
    return text if len(text) <= 200 else text[:197] + "..."


def _check_size(shape, what: str, dimensions: bool = True) -> None:
    """``ValueError`` for a dimension over ``MAX_SIZE`` or a product over ``MAX_ELEMENTS``."""
    if dimensions and any(d > MAX_SIZE for d in shape):
        raise ValueError(f"{what} {_sizes(shape)} has a dimension larger than the largest supported, 2**53")
    total = 1
    for d in shape:
        total *= d
    if total > MAX_ELEMENTS:
        raise ValueError(f"{what} {_sizes(shape)} has more elements than the largest supported, 2**200")


def _check_arguments(value, what: str) -> None:
    """``ValueError`` for an integer argument over ``MAX_SIZE`` (a count, a size, a kernel)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_arguments(item, f"argument {key!r}")
    elif isinstance(value, list):
        for item in value:
            _check_arguments(item, what)
    elif is_int(value) and abs(value) > MAX_SIZE:
        raise ValueError(f"{what} {_sizes([value])[1:-1]} is larger than the largest supported, 2**53")


@arguments(where=text)
def network_from_json(data, where: str = "graph file") -> Network:
    """Rebuild the network of a graph file's parsed JSON; ``InputError`` names the layer and field."""
    if not isinstance(data, dict):
        raise InputError(f"{where} must hold a JSON object")
    if data.get("format") != FORMAT:
        raise InputError(f"{where}: field 'format' must be {FORMAT!r} (is it a graph file?)")
    _known_fields(data, _TOP_FIELDS, where)
    version = _field(data, "version", int, where)
    if version != VERSION:
        raise InputError(f"{where}: version {version} is not supported (this tool reads version {VERSION})")
    name = _field(data, "name", str, where)
    cutoff = _field(data, "cutoff", int, where)
    batch = data.get("batch")
    if batch is not None and (not is_positive_int(batch)):
        raise InputError(f"{where}: field 'batch' must be a positive integer or null")
    if cutoff < 1:
        raise InputError(f"{where}: field 'cutoff' must be a positive integer")
    readers = _field(data, "readers", str, where, optional=True, default="each")
    if readers not in READER_RULES:
        raise InputError(f"{where}: field 'readers' must be one of {', '.join(READER_RULES)}, got {json.dumps(readers)[:60]}")
    g = GraphBuilder(name or "graph", cutoff=cutoff, batch=batch)
    tensors: dict = {}
    for i, spec in enumerate(_field(data, "inputs", list, where)):
        at = f"{where}: inputs[{i}]"
        if not isinstance(spec, dict):
            raise InputError(f"{at} must be an object")
        _known_fields(spec, _INPUT_FIELDS, at)
        tname = _field(spec, "name", str, at)
        if not tname or tname in tensors:
            raise InputError(f"{at}: input names must be unique and non-empty, got {tname!r}")
        shape = _field(spec, "shape", list, at)
        letters = _field(spec, "letters", str, at, optional=True, default="")
        param = _field(spec, "param", bool, at, optional=True, default=False)
        try:
            if all(isinstance(d, int) for d in shape):
                _check_size(shape, "shape")
            tensors[tname] = g.input(shape, tname, letters=letters, param=param)
        except (ValueError, TypeError) as err:
            raise InputError(f"{at} ({tname}): {err}") from None
    layers = _field(data, "layers", list, where)
    if not layers:
        raise InputError(f"{where}: the graph has no layers")
    for v, spec in enumerate(layers):
        at = f"{where}: layers[{v}]"
        if not isinstance(spec, dict):
            raise InputError(f"{at} must be an object")
        lname = _field(spec, "name", str, at)
        at = f"{where}: layer {lname!r}"
        _known_fields(spec, _LAYER_FIELDS, at)
        op = _field(spec, "op", str, at)
        refs = _field(spec, "inputs", list, at)
        args = _field(spec, "args", dict, at, optional=True, default={})
        roles = _field(spec, "roles", list, at, optional=True, default=None)
        block = _field(spec, "block", int, at, optional=True, default=None)
        operands = []
        for r in refs:
            if not isinstance(r, str) or r not in tensors:
                raise InputError(f"{at} ({op}): field 'inputs' names {json.dumps(r)[:60]}, which is neither a graph "
                                 "input nor the output of an earlier layer")
            operands.append(tensors[r])
        if lname in tensors:
            raise InputError(f"{at}: the name is already used by a graph input or another layer")
        try:
            _check_arguments(args, "argument")
            layer = make_layer(op, operands, args)
            _check_size(layer.domain, "iteration space")
            for shape in layer.output_shapes:
                _check_size(shape, "output shape", dimensions=False)
            out = g.add(lname, layer, roles=roles, block=None if block is None else ("file", block))
        except (ValueError, TypeError) as err:
            raise InputError(f"{at} ({op}): {err}") from None
        if batch is not None and layer.domain[layer.batch_dim] != batch:
            # The label must describe the shapes: a batch the shapes disagree with is refused.
            raise InputError(f"{where}: field 'batch' is {batch}, but the shapes have batch "
                             f"{layer.domain[layer.batch_dim]} (layer {lname[:60]!r}, {op})")
        if isinstance(out, tuple):
            for i, t in enumerate(out):
                tensors[f"{lname}:{i}"] = t
            tensors[lname] = out[0]
        else:
            tensors[lname] = out
    return g.build().with_readers(readers)


def load_graph_file(path: str, batch: int | None, model: int | None) -> Network:
    """The network of the graph file ``path`` (``-g FILE.json``); its shapes are fixed."""
    network = network_from_json(read_json(path, "graph file"), f"graph file {path}")
    if model is not None:
        raise ValueError(f"-m does not apply to a graph file ({path}): its shapes are fixed")
    if batch is not None and batch != network.batch:
        recorded = f"batch {network.batch}" if network.batch is not None else "no batch size"
        raise ValueError(f"graph file {path} records {recorded}; -b {batch} cannot change it")
    if network.blocks is None:
        # A file that declares no blocks (written before they were): its runs of equal layers.
        network = dataclasses.replace(network, blocks=structural_blocks(network))
    return network
