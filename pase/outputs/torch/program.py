"""The network as a PyTorch program on DTensors: one torch function per layer type.

The torch twin of ``pase.outputs.jax.program``: the same layer semantics (``pase.outputs.jax.verify``'s
docstring), the same random inputs and weights. A layer runs under its configuration: its
inputs are redistributed to the placements the plan gives them (the edges), its weights live
in the plan's placements, its torch ops run on DTensors, and its outputs are brought to the
plan's placements (the layer's own reductions). ``Program`` runs it sharded on a
``DeviceMesh`` or, with ``mesh=None``, unsharded on plain tensors in one process.

Imported lazily (torch); used by ``pase.outputs.torch.verify`` and ``pase.to_dtensor``.
"""

from __future__ import annotations

import math
import re

import numpy as np

try:
    import torch
    from torch import nn
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
except ImportError:  # only so that pytest's doctest collection can import the module without torch
    torch = None

    class nn:  # noqa: N801  (stands in for torch.nn: the classes below are never built without torch)
        Module = object

__all__ = ["OPS", "Program", "placements", "PlacementError"]

EPS = 1e-5


class PlacementError(ValueError):
    """A split of the plan that DTensor cannot express; the message names the layer and why."""


def placements(spec, axis_names) -> list:
    """DTensor placements, one per mesh axis, of a tensor whose plan ``spec`` is given.

    ``spec`` has one entry per tensor dimension: ``None`` or the mesh axes (names) it is split
    over, outermost first. DTensor splits a dimension over several mesh axes in mesh order
    (the first mesh axis outermost), so an entry whose axes are out of mesh order cannot be
    expressed: ``PlacementError``. ``[["d0"], None, ["d1", "d2"]]`` on mesh ``d0, d1, d2`` is
    ``[Shard(0), Shard(2), Shard(2)]``.
    """
    index = {name: i for i, name in enumerate(axis_names)}
    result: list = [Replicate() for _ in range(max(1, len(axis_names)))]
    for dim, entry in enumerate(spec):
        if not entry:
            continue
        order = [index[a] for a in entry]
        if order != sorted(order):
            raise PlacementError(
                f"tensor dimension {dim} is split over mesh axes {', '.join(entry)} in that order; DTensor "
                "splits a dimension over mesh axes outermost-first in mesh order only"
            )
        for a in order:
            result[a] = Shard(dim)
    return result


def _pointwise(x, pw: int):
    for _ in range(int(pw or 0)):
        x = torch.tanh(x)
    return x


# ---------------------------------------------------------------------------------------
# Layer types: (layer, args, inputs, weights, extra) -> list of outputs. They take torch
# tensors or DTensors alike; DTensor's sharding propagation runs them on the shards.


def _bias(y, weights, axis: int):
    """Add the layer's learnt bias (its weight after the first), if it has one, along ``axis``."""
    if len(weights) < 2:
        return y
    shape = [1] * y.ndim
    shape[axis % y.ndim] = weights[1].shape[0]
    return y + weights[1].reshape(shape)


def _learnt(x, weights, axis: int) -> tuple:
    """``(scale, bias)`` of a norm that learns ``len(weights)`` of them (ones and none if not)."""
    scale = weights[0] if weights else torch.ones((x.shape[axis],), dtype=x.dtype)
    return scale, (weights[1] if len(weights) > 1 else None)


def _conv(layer, args, inputs, weights, extra):
    (x,), w = inputs, weights[0]
    b, c, ho, wo, r, s, n = layer.domain
    stride, pad = tuple(args["stride"]), tuple(args["pad"])
    if not isinstance(x, DTensor):
        y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    else:
        y = _local_conv(layer, x, w, stride, pad, extra)
    y = extra["reduce"](y)
    return [_pointwise(_bias(y / math.sqrt(c * r * s), weights, 1), args.get("pw", 0))]


def _local_conv(layer, x, w, stride, pad, extra):
    """The convolution on every device's shards, its placements read off the configuration.

    DTensor's convolution takes a batch split only; a channel split is run as the plan says:
    each device convolves its input channels with its block of the filter, leaving partial
    sums over the input-channel split (``local_map``'s model). A split image (no halo
    exchange here) is gathered first, so every device of that group convolves the whole image.
    """
    mesh = x.device_mesh
    axes = extra["axes"]  # mesh-axis indices of every iteration-space dimension
    rank = mesh.ndim
    role = {}
    for dim, name in enumerate("bchwrsn"):
        for a in axes[dim]:
            role[a] = name
    if any(role.get(a) in ("h", "w") for a in range(rank)):
        extra["note"]("a split image is gathered before the convolution (no halo exchange)")

    def place(mapping):
        return [mapping.get(role.get(a), Replicate()) for a in range(rank)]

    x_place = place({"b": Shard(0), "c": Shard(1)})
    w_place = place({"n": Shard(0), "c": Shard(1)})
    x = x.redistribute(mesh, x_place)
    w = w.redistribute(mesh, w_place)
    x_grad = place({"b": Shard(0), "c": Shard(1), "n": Partial()})
    w_grad = place({"n": Shard(0), "c": Shard(1), "b": Partial()})
    local = torch.nn.functional.conv2d(x.to_local(grad_placements=x_grad), w.to_local(grad_placements=w_grad),
                                       stride=stride, padding=pad)
    shape = tuple(layer.output_shapes[0])
    stride_out = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return DTensor.from_local(local, mesh, place({"b": Shard(0), "n": Shard(1), "c": Partial()}), run_check=False,
                              shape=shape, stride=stride_out)


def _pooling(layer, args, inputs, weights, extra):
    (x,) = inputs

    def pool(t):
        return torch.nn.functional.avg_pool2d(t, tuple(args["window"]), tuple(args["stride"]), tuple(args["pad"]),
                                              count_include_pad=True)

    if not isinstance(x, DTensor):
        return [pool(x)]
    # DTensor has no sharding rule for avg_pool2d's backward: run it on every device's block
    # of images and channels (a split image is gathered first).
    mesh, rank = x.device_mesh, x.device_mesh.ndim
    role = {a: name for dim, name in enumerate("bchw") for a in extra["axes"][dim]}
    if any(role.get(a) in ("h", "w") for a in range(rank)):
        extra["note"]("a split image is gathered before the pooling (no halo exchange)")
    place = [{"b": Shard(0), "c": Shard(1)}.get(role.get(a), Replicate()) for a in range(rank)]
    x = x.redistribute(mesh, place)
    local = pool(x.to_local(grad_placements=place))
    shape = tuple(layer.output_shapes[0])
    return [DTensor.from_local(local, mesh, place, run_check=False, shape=shape,
                               stride=tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))]


def _fc(layer, args, inputs, weights, extra):
    (x,), w = inputs, weights[0]
    y = extra["reduce"](extra["local"](lambda a, b: torch.matmul(a, b.t()), [x, w], extra["specs"])) / math.sqrt(
        x.shape[-1])
    return [_pointwise(_bias(y, weights, -1), args.get("pw", 0))]


def _einsum(layer, args, inputs, weights, extra):
    a, b = inputs
    in_a, in_b, out = re.match(r"^(\w+),(\w+)->(\w+)$", args["equation"]).groups()
    sizes = dict(zip(in_a, a.shape))
    reduction = math.prod(sizes[l] for l in in_a if l in in_b and l not in out)
    y = extra["reduce"](extra["local"](lambda p, q: torch.einsum(args["equation"], p, q), [a, b],
                                       extra["specs"])) / math.sqrt(reduction)
    if weights:  # its bias, over the weight's own output dimensions
        weight_term, other = (in_b, in_a) if layer.inputs[1].is_param else (in_a, in_b)
        own = [x for x in out if x in weight_term and x not in other]
        bias = weights[0].reshape([layer.domain[layer.dims.index(x)] if x in own else 1 for x in out])
        y = y + bias
    return [_pointwise(y, args.get("pw", 0))]


def _embedding(layer, args, inputs, weights, extra):
    ids, table = inputs
    vocab_axes = [a for a, p in enumerate(getattr(table, "placements", ())) if p.is_shard(0)]
    if len(vocab_axes) <= 1:
        return [extra["reduce"](torch.nn.functional.embedding(ids, table))]
    # DTensor's embedding keeps a vocabulary split as a masked partial sum on one mesh axis
    # only: over several, take the cost model's view, a one-hot product.
    extra["note"](f"vocabulary split over {len(vocab_axes)} mesh axes, which DTensor's embedding cannot take: "
                  "run as a one-hot product")
    local = torch.nn.functional.one_hot(ids.to_local(), table.shape[0]).to(table.dtype)
    shape = tuple(ids.shape) + (table.shape[0],)
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    one_hot = DTensor.from_local(local, ids.device_mesh, ids.placements, run_check=False, shape=shape, stride=stride)
    place = list(ids.placements)
    for a in vocab_axes:
        place[a] = Shard(one_hot.ndim - 1)
    one_hot = one_hot.redistribute(ids.device_mesh, place)
    ids_spec, table_spec = extra["specs"]
    specs = [list(ids_spec) + [table_spec[0]], table_spec]
    return [extra["reduce"](extra["local"](lambda p, q: torch.einsum("...v,ve->...e", p, q), [one_hot, table], specs))]


def _elementwise(layer, args, inputs, weights, extra):
    a, b = inputs
    return [_pointwise(a + b, args.get("pw", 0))]


def _concat(layer, args, inputs, weights, extra):
    axis = args["axis"]
    shape = layer.output_shapes[0]
    # An operand of size 1 off the axis (a broadcast one) is copied along that dimension first.
    inputs = [x.expand(*(x.shape[i] if i == axis else d for i, d in enumerate(shape))) for x in inputs]
    return [torch.cat(inputs, dim=axis)]


def _normalise(x, axes, scale, bias, param_axis):
    mean = x.mean(dim=axes, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=axes, keepdim=True)
    shape = [1] * x.ndim
    shape[param_axis] = x.shape[param_axis]
    y = centred * torch.rsqrt(var + EPS) * scale.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


def _norm(layer, args, inputs, weights, extra):
    (x,) = inputs
    axis = args["axis"] % x.ndim
    scale, bias = _learnt(x, weights, axis)
    return [_pointwise(_normalise(x, (axis,), scale, bias, axis), args.get("pw", 0))]


def _batch_norm(layer, args, inputs, weights, extra):
    (x,) = inputs
    scale, bias = _learnt(x, weights, 1)
    axes = tuple(a for a in range(x.ndim) if a != 1)
    return [_pointwise(_normalise(x, axes, scale, bias, 1), args.get("pw", 0))]


def _rms_norm(layer, args, inputs, weights, extra):
    (x,) = inputs
    axis = args["axis"] % x.ndim
    scale, _ = _learnt(x, weights, axis)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    y = x * torch.rsqrt((x * x).mean(dim=axis, keepdim=True) + EPS) * scale.reshape(shape)
    return [_pointwise(y, args.get("pw", 0))]


def _reduce_mean(layer, args, inputs, weights, extra):
    (x,) = inputs
    y = x.mean(dim=tuple(args["axes"]), keepdim=bool(args.get("keepdims", False)))
    return [y.reshape(tuple(layer.output_shapes[0]))]


def _softmax(layer, args, inputs, weights, extra):
    (x,) = inputs
    axes = args["axis"] if isinstance(args["axis"], list) else [args["axis"]]
    # Over several axes together: those axes moved last and flattened, then put back.
    moved = x.movedim(axes, list(range(x.ndim - len(axes), x.ndim)))
    y = torch.softmax(moved.flatten(x.ndim - len(axes)), dim=-1).reshape(moved.shape)
    return [y.movedim(list(range(x.ndim - len(axes), x.ndim)), axes)]


def _softmax_cross_entropy(layer, args, inputs, weights, extra):
    (x,) = inputs
    logp = torch.log_softmax(x, dim=-1)
    # One-hot labels placed like the logits: the masked sum partitions like them.
    picked = (logp * extra["labels"]).sum(dim=-1)
    extra["losses"].append(-picked.mean())
    return [torch.exp(logp)]


def _ravel(layer, args, inputs, weights, extra):
    return [inputs[0].reshape(-1)]


def _unravel(layer, args, inputs, weights, extra):
    return [inputs[0].reshape(tuple(args["shape"]))]


def _stack(layer, args, inputs, weights, extra):
    return [torch.stack(list(inputs), dim=args["axis"])]


def _unstack(layer, args, inputs, weights, extra):
    (x,) = inputs
    if args.get("sizes"):  # unequal pieces, each keeping the axis
        return list(torch.split(x, list(args["sizes"]), dim=args["axis"]))
    return list(torch.unbind(x, dim=args["axis"]))


def _roll(layer, args, inputs, weights, extra):
    (x,) = inputs
    return [torch.roll(x, tuple(args["shifts"]), tuple(args["axes"]))]


def _unsupported(layer) -> list:
    """What of a layer the torch program does not run: grouped and 1-D convolutions, and
    element-wise products that broadcast (JAX's program runs them all)."""
    out = []
    if layer.op == "Conv" and layer.args.get("groups", 1) > 1:
        out.append("grouped")
    if layer.op == "Conv" and layer.inputs[0].rank == 3:
        out.append("1-D")
    if layer.op == "Elementwise" and layer.inputs[0].shape != layer.inputs[1].shape:
        out.append("broadcast")
    return out


#: The torch function of every layer type, by ``op`` (LSTM has none: no import produces it).
OPS = {
    "Conv": _conv, "Pooling": _pooling, "FC": _fc, "Einsum": _einsum, "Embedding": _embedding,
    "Elementwise": _elementwise, "Concat": _concat, "Norm": _norm, "BatchNorm": _batch_norm,
    "RMSNorm": _rms_norm, "ReduceMean": _reduce_mean, "Softmax": _softmax,
    "SoftmaxCrossEntropy": _softmax_cross_entropy, "Ravel": _ravel, "Unravel": _unravel,
    "Stack": _stack, "Unstack": _unstack, "Roll": _roll,
}


# ---------------------------------------------------------------------------------------
# The program


class _Step(nn.Module):
    """A named step of a layer, so that ``CommDebugMode`` attributes its collectives to it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class _Layer(nn.Module):
    """One layer: ``in<i>`` redistribute its inputs (edges), ``op`` computes and reduces."""

    def __init__(self, program, v: int):
        super().__init__()
        self.program, self.v = [program], v  # a list: not a registered submodule
        self.roles = [f"in{i}" if key is None or key[0] == "data" else f"w{i}"
                      for i, key in enumerate(program.data_key[v])]
        self.roles += [f"w{i}" for i in range(len(self.roles), len(self.roles) + len(program.implicit_weights(v)))]
        for role in self.roles:
            self.add_module(role, _Step(self._edge))
        self.add_module("op", _Step(self._compute))

    def _edge(self, x, place):
        if tuple(x.placements) == tuple(place):
            return x  # redistribute's backward would also reduce a partial gradient here
        return x.redistribute(self.program[0].mesh, place)

    def _compute(self, *tensors):
        return tuple(self.program[0].compute(self.v, list(tensors)))

    def forward(self, inputs, input_places):
        moved = []
        for role, x, place in zip(self.roles, inputs, input_places):
            moved.append(getattr(self, role)(x, place) if place is not None else x)
        return self.op(*moved)


class Program(nn.Module):
    """The network's forward pass on DTensors placed as ``plan`` says (or unsharded).

    Parameters
    ----------
    network : Network
    plan : dict
        ``pase.outputs.torch.verify.torch_plan``: the JAX export (mesh, per-layer specs) plus, per
        output and weight, the mesh axes over which the plan holds it as partial sums
        (``"partial"``) before the layer reduces it.
    mesh : DeviceMesh or None
        One axis per prime factor of ``procs``, named as the plan's; None runs unsharded.
    seed : int
        Seed of the random inputs, weights, token ids and labels (NumPy; the same values on
        every process and in the unsharded run).
    dtype : str
    """

    def __init__(self, network, plan: dict, mesh=None, seed: int = 0, dtype: str = "float32", weights=None):
        super().__init__()
        self.network = network
        self.plan = plan
        self.mesh = mesh
        self.dtype = np.dtype(dtype)
        self.torch_dtype = getattr(torch, dtype)
        missing = sorted({layer.op for layer in network.layers} - set(OPS))
        missing += sorted({f"{layer.op} ({kind})" for layer in network.layers for kind in _unsupported(layer)})
        if missing:
            raise ValueError(f"layer type {missing[0]!r} has no PyTorch implementation")
        self.axis_names = plan["mesh"]["axis_names"] or ["d0"]
        # Placements of every tensor, checked before anything runs.
        self.places = []
        for v, entry in enumerate(plan["layers"]):
            try:
                self.places.append({
                    "inputs": [placements(t["spec"], self.axis_names) for t in entry["inputs"]],
                    "outputs": [placements(t["spec"], self.axis_names) for t in entry["outputs"]],
                    "weights": [placements(t["spec"], self.axis_names) for t in entry["weights"]],
                })
            except PlacementError as err:
                raise PlacementError(f"layer {v} ({entry['name']}, {entry['op']}): {err}") from None
        self._init_values(seed, weights or {})
        self.steps = nn.Module()
        for v in range(len(network.layers)):
            self.steps.add_module(f"L{v}", _Layer(self, v))
        self.notes: list = []

    # -- values ----------------------------------------------------------------------

    def _init_values(self, seed: int, given: dict) -> None:
        network, plan = self.network, self.plan
        rng = np.random.RandomState(seed)
        self.weight_key, self.data_key = [], []
        self.values: dict = {}  # name -> numpy array (weights and data)
        self.weight_entry: dict = {}  # weight name -> (layer, slot)
        consumed, names_of = set(), {}
        for v, (layer, entry) in enumerate(zip(network.layers, plan["layers"])):
            keys, data_keys = [], []
            weights = iter(enumerate(entry["weights"]))
            for i, t in enumerate(layer.inputs):
                if t.producer is not None:
                    consumed.add((t.producer, t.index))
                    data_keys.append(None)
                elif t.is_param:
                    slot, w = next(weights)
                    if layer.op == "Embedding":
                        key = w["name"]
                    else:
                        key = names_of.setdefault(t.key, t.name if t.name and t.name not in self.values
                                                  else f"{t.name or 'weight'}#{t.index}")
                    if key not in self.values:
                        self.values[key] = self._weight(rng, w["name"], t.shape, given.get(key))
                        self.weight_entry[key] = (v, slot)
                    keys.append(key)
                    data_keys.append(("param", key, slot))
                else:
                    key = f"input{t.index}:{t.name}"
                    if key not in self.values:
                        if layer.op == "Embedding" and i == 0:
                            self.values[key] = rng.randint(0, layer.domain[-1], size=t.shape[:-1]).astype(np.int64)
                        else:
                            self.values[key] = rng.standard_normal(t.shape).astype(self.dtype)
                    data_keys.append(("data", key, None))
            for slot, w in weights:
                self.values[w["name"]] = self._weight(rng, w["name"], w["shape"], given.get(w["name"]))
                self.weight_entry[w["name"]] = (v, slot)
                keys.append(w["name"])
            if layer.op == "SoftmaxCrossEntropy":
                shape = layer.inputs[0].shape
                labels = rng.randint(0, shape[-1], size=shape[:-1])
                one_hot = np.zeros(shape, dtype=self.dtype)
                np.put_along_axis(one_hot, labels[..., None], 1.0, axis=-1)
                self.values[f"labels{v}"] = one_hot
            self.weight_key.append(keys)
            self.data_key.append(data_keys)
        self.weight_names = list(self.weight_entry)
        self.sinks = [
            (v, i) for v, layer in enumerate(network.layers) if layer.op != "SoftmaxCrossEntropy"
            for i in range(len(layer.output_shapes)) if (v, i) not in consumed
        ]

    def _weight(self, rng, name, shape, given):
        if given is not None:
            value = np.asarray(given, dtype=self.dtype)
            if tuple(value.shape) != tuple(shape):
                raise ValueError(f"weight {name}: given shape {list(value.shape)}, the layer needs {list(shape)}")
            rng.standard_normal(tuple(shape))  # keep the stream of the other values unchanged
            return value
        if name.endswith(".scale"):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(self.dtype)
        if name.endswith(".bias"):
            return (0.1 * rng.standard_normal(shape)).astype(self.dtype)
        return rng.standard_normal(tuple(shape)).astype(self.dtype)

    def implicit_weights(self, v: int) -> list:
        """Keys of the weights of layer ``v`` that are its own (not graph inputs)."""
        read = sum(1 for t in self.network.layers[v].inputs if t.is_param)  # graph weights come first
        return self.weight_key[v][read:]

    def _place(self, array, place):
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.mesh is None:
            return tensor
        return distribute_tensor(tensor, self.mesh, place)

    def make_parameters(self) -> dict:
        """Every weight as a leaf tensor that requires its gradient, placed as its first reader's plan says."""
        params = {}
        for key in self.weight_names:
            v, slot = self.weight_entry[key]
            place = self.places[v]["weights"][slot]
            params[key] = self._place(self.values[key], place).requires_grad_()
            if self.mesh is not None:  # the gradient's reduction, before DTensor accumulates it
                partial = self.plan["layers"][v]["weights"][slot].get("partial", ())
                params[key].register_hook(lambda g, v=v, key=key, place=place, partial=partial:
                                          self._reduce_gradient(g, v, key, place, partial))
        return params

    #: Called as ``attribute(layer)`` around a weight gradient's reduction (``pase.outputs.torch.verify``
    #: counts its collectives for the layer), or None.
    attribute = None

    def _reduce_gradient(self, g, v, key, place, partial):
        if self.attribute is not None:
            with self.attribute(v):
                return self.settle(g, place, partial, f"gradient of {key}")
        return self.settle(g, place, partial, f"gradient of {key}")

    def make_data(self) -> dict:
        """Inputs and labels, replicated (each layer redistributes what it reads)."""
        replicated = [Replicate() for _ in self.axis_names]
        return {k: self._place(a, replicated) for k, a in self.values.items() if k not in self.weight_entry}

    # -- running ---------------------------------------------------------------------

    def settle(self, y, place, partial, what: str, trust: bool = True):
        """Bring ``y`` to the plan's placements ``place``.

        ``partial`` are the mesh axes over which the plan holds ``y`` as partial sums (its
        reduction). Where DTensor left ``y`` partial over an axis the plan does not reduce,
        the run trusts the plan (with ``trust``: after a contraction, and for weight gradients)
        and takes every device's part as the whole: a plan that skips a reduction gives wrong
        numbers, and the check fails.
        """
        if self.mesh is None:
            return y
        actual = list(y.placements)
        # Only where the plan holds the tensor whole (replicated): partial sums over an axis the
        # plan splits the tensor over are DTensor's own choice (a weight it gathered forward is
        # reduce-scattered back), not a reduction the plan skips.
        skipped = [a for a, p in enumerate(actual) if trust and p.is_partial() and self.axis_names[a] not in partial
                   and isinstance(place[a], Replicate)]
        if skipped:
            self.notes.append(f"{what}: partial sums over mesh axes "
                              f"{', '.join(self.axis_names[a] for a in skipped)} that the plan does not reduce")
            trusted = [Replicate() if a in skipped else p for a, p in enumerate(actual)]
            y = DTensor.from_local(y.to_local(), self.mesh, trusted, run_check=False, shape=y.shape, stride=y.stride())
        return y.redistribute(self.mesh, place)

    def local_op(self, v: int, fn, operands: list, specs: list):
        """``fn`` (a contraction) on every device's blocks of ``operands``, as the configuration places them.

        Each operand is brought to its ``spec`` (the plan's placement; it is there already), and
        ``fn`` runs on the local blocks; the result is placed as the layer's output spec, partial
        over the axes the plan names (``partial``). Backward, an operand's gradient is partial
        over the layer's mesh axes the operand is not split over. This is ``local_map``'s model,
        and what the configuration means; DTensor's own sharding propagation for a contraction
        searches every strategy over every mesh axis, which takes minutes on a 3-axis mesh.
        """
        if self.mesh is None:
            return fn(*operands)
        entry = self.plan["layers"][v]
        used = {a for dim in entry["axes"] for a in dim}
        local = []
        for x, spec in zip(operands, specs):
            place = placements(spec, self.axis_names)
            if tuple(x.placements) != tuple(place):
                x = x.redistribute(self.mesh, place)
            grad = [Partial() if isinstance(p, Replicate) and self.axis_names[a] in used else p
                    for a, p in enumerate(place)]
            local.append(x.to_local(grad_placements=grad))
        y = fn(*local)
        out = entry["outputs"][0]
        place = [Partial() if self.axis_names[a] in out.get("partial", ()) else p
                 for a, p in enumerate(placements(out["spec"], self.axis_names))]
        shape = tuple(self.network.layers[v].output_shapes[0])
        return DTensor.from_local(y, self.mesh, place, run_check=False, shape=shape,
                                  stride=tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))

    def compute(self, v: int, tensors: list) -> list:
        """Layer ``v`` on its (already placed) inputs and weights; its outputs in the plan's placements."""
        layer, entry = self.network.layers[v], self.plan["layers"][v]
        inputs, implicit = [], []
        keys = iter(tensors)
        for key in self.data_key[v]:
            inputs.append(next(keys))
        implicit = list(keys)  # the layer's own weights (a bias after graph weights)
        specs_in = iter(entry["inputs"])
        specs_w = iter(entry["weights"])
        specs = [next(specs_w)["spec"] if t.is_param else next(specs_in)["spec"] for t in layer.inputs]
        specs += [w["spec"] for w in specs_w] if not any(t.is_param for t in layer.inputs) else []
        out0 = entry["outputs"][0]
        extra = {"losses": self._losses, "labels": self._data.get(f"labels{v}"),
                 "note": lambda text: self.notes.append(f"{entry['name']}: {text}"),
                 "axes": [[self.axis_names.index(a) for a in dim] for dim in entry["axes"]],
                 "specs": specs, "local": lambda fn, operands, specs: self.local_op(v, fn, operands, specs),
                 "reduce": lambda y: self.settle(y, self.places[v]["outputs"][0], out0.get("partial", ()),
                                                 f"{entry['name']} output 0")}
        outputs = OPS[layer.op](layer, dict(layer.args), inputs, implicit, extra)
        settled = []
        for j, (y, out) in enumerate(zip(outputs, entry["outputs"])):
            # The reductions the plan names were made after the contraction (``reduce``); what
            # DTensor keeps partial inside other layers (a norm's statistics) it reduces itself.
            settled.append(self.settle(y, self.places[v]["outputs"][j], out.get("partial", ()),
                                       f"{entry['name']} output {j}", trust=False))
        return settled

    def forward(self, params: dict, data: dict):
        """The loss (a scalar, replicated): cross-entropies plus half the mean square of unread outputs."""
        env: dict = {}
        self._losses, self._data = [], data
        for v, layer in enumerate(self.network.layers):
            tensors, places = [], []
            for i, (t, key) in enumerate(zip(layer.inputs, self.data_key[v])):
                if key is None:
                    tensors.append(env[(t.producer, t.index)])
                elif key[0] == "param":
                    tensors.append(params[key[1]])
                else:
                    tensors.append(data[key[1]])
            inputs_iter = iter(self.places[v]["inputs"])
            weights_iter = iter(self.places[v]["weights"])
            for key in self.data_key[v]:
                if self.mesh is None:
                    places.append(None)
                elif key is not None and key[0] == "param":
                    places.append(next(weights_iter))
                else:
                    places.append(next(inputs_iter))
            if not any(t.is_param for t in layer.inputs):
                for k, place in zip(self.weight_key[v], weights_iter):
                    tensors.append(params[k])
                    places.append(place if self.mesh is not None else None)
            outputs = getattr(self.steps, f"L{v}")(tensors, places)
            for j, y in enumerate(outputs):
                env[(v, j)] = y
        loss = sum(self._losses) if self._losses else None
        for v, i in self.sinks:
            y = env[(v, i)]
            term = 0.5 * (y * y).mean()
            loss = term if loss is None else loss + term
        if loss is None:
            loss = torch.zeros((), dtype=self.torch_dtype)
        if self.mesh is not None and isinstance(loss, DTensor):
            loss = loss.redistribute(self.mesh, [Replicate() for _ in self.axis_names])
        self._losses, self._data = [], {}
        return loss
