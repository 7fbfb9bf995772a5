"""The network as a JAX program: one function per layer type, run sharded and unsharded.

Run only in the child process of ``pase.outputs.jax.verify``, where XLA has its host devices. Layer
semantics are described in ``pase.outputs.jax.verify``; to support a new layer type, add a function
to ``OPS`` that takes ``(layer, args, inputs, weights, extra)`` and returns its outputs.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np

from .common import GRADIENT_FLOOR, INSTALL_HINT, JaxMissing, relative_error

try:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
except ImportError:  # only so that pytest's doctest collection can import the module without jax
    jax = None

__all__ = ["OPS", "scope_name", "run"]

EPS = 1e-5


def scope_name(v: int, name: str) -> str:
    """The named scope of layer ``v``: ``L<v>.<name>``, with HLO-name separators replaced.

    ``pase.outputs.jax.verify`` finds the layer of an HLO instruction by ``L<v>.`` after one of
    ``/ ( ; :``, so the name must not contain those.
    """
    return f"L{v}." + re.sub(r"[/();:\s\"]", "_", name)


def _pointwise(x, pw: int):
    """``pw`` fused point-wise operations: ``tanh`` each (smooth, so rounding never flips a branch)."""
    for _ in range(int(pw or 0)):
        x = jnp.tanh(x)
    return x


# ---------------------------------------------------------------------------------------
# Layer types. Each gets (layer, args, inputs, weights, extra) and returns a list of outputs;
# ``extra`` holds labels (SoftmaxCrossEntropy), the losses list, and ``constrain``.


def _bias(y, weights, axis: int):
    """Add the layer's learnt bias (its weight after the first), if it has one, along ``axis``."""
    if len(weights) < 2:
        return y
    bias = weights[1]
    shape = [1] * y.ndim
    shape[axis % y.ndim] = bias.shape[0]
    return y + bias.reshape(shape)


def _conv(layer, args, inputs, weights, extra):
    (x,), w = inputs, weights[0]
    groups = int(args.get("groups", 1))
    c, r, s = layer.inputs[0].shape[1] // groups, *args["kernel"]
    w = w.reshape((-1,) + w.shape[-3:])  # a grouped filter (g, n/g, c/g, r, s) as (n, c/g, r, s)
    bias = [weights[1].reshape(-1)] if len(weights) > 1 else []
    ph, pw_ = args["pad"]
    flat = x.ndim == 3
    if flat:  # a 1-D convolution: height 1
        x, w = x[:, :, None, :], w
    y = jax.lax.conv_general_dilated(
        x, w, window_strides=tuple(args["stride"]), padding=[(ph, ph), (pw_, pw_)],
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
    )
    if flat:
        y = y[:, :, 0, :]
    return [_pointwise(_bias(y / math.sqrt(c * r * s), [w] + bias, 1), args.get("pw", 0))]


def _pooling(layer, args, inputs, weights, extra):
    (x,) = inputs
    r, s = args["window"]
    ph, pw_ = args["pad"]
    total = jax.lax.reduce_window(
        x, 0.0, jax.lax.add, (1, 1, r, s), (1, 1) + tuple(args["stride"]), [(0, 0), (0, 0), (ph, ph), (pw_, pw_)]
    )
    return [total / (r * s)]


def _fc(layer, args, inputs, weights, extra):
    (x,), w = inputs, weights[0]
    y = jnp.einsum("...k,nk->...n", x, w) / math.sqrt(x.shape[-1])
    return [_pointwise(_bias(y, weights, -1), args.get("pw", 0))]


def _einsum(layer, args, inputs, weights, extra):
    a, b = inputs
    in_a, in_b, out = re.match(r"^(\w+),(\w+)->(\w+)$", args["equation"]).groups()
    sizes = dict(zip(in_a, a.shape))
    reduction = math.prod(sizes[l] for l in in_a if l in in_b and l not in out)
    y = jnp.einsum(args["equation"], a, b) / math.sqrt(reduction)
    if weights:  # its bias, over the weight's own output dimensions
        weight_term, other = (in_b, in_a) if layer.inputs[1].is_param else (in_a, in_b)
        own = "".join(x for x in out if x in weight_term and x not in other)
        y = y + _over(weights[0], own, out)
    return [_pointwise(y, args.get("pw", 0))]


def _over(t, letters: str, out: str):
    """``t`` (dimensions ``letters``) broadcast against an array of dimensions ``out``."""
    order = [x for x in out if x in letters]
    t = jnp.transpose(t, [letters.index(x) for x in order])
    return t.reshape([t.shape[order.index(x)] if x in letters else 1 for x in out])


def _embedding(layer, args, inputs, weights, extra):
    ids, table = inputs
    return [jnp.take(table, ids, axis=0)]


def _elementwise(layer, args, inputs, weights, extra):
    a, b = inputs
    return [_pointwise(a + b, args.get("pw", 0))]


def _concat(layer, args, inputs, weights, extra):
    axis = args["axis"]
    shape = layer.output_shapes[0]
    # An operand of size 1 off the axis (a broadcast one) is copied along that dimension first.
    inputs = [jnp.broadcast_to(x, tuple(x.shape[i] if i == axis else d for i, d in enumerate(shape)))
              for x in inputs]
    return [jnp.concatenate(inputs, axis=axis)]


def _normalise(x, axes, scale, bias, param_axis):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, axis=axes, keepdims=True)
    shape = [1] * x.ndim
    shape[param_axis] = x.shape[param_axis]
    y = centred * jax.lax.rsqrt(var + EPS) * scale.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


def _learnt(x, weights, axis: int) -> tuple:
    """``(scale, bias)`` of a norm that learns ``len(weights)`` of them (ones and none if not)."""
    scale = weights[0] if weights else jnp.ones((x.shape[axis],), x.dtype)
    return scale, (weights[1] if len(weights) > 1 else None)


def _norm(layer, args, inputs, weights, extra):
    (x,) = inputs
    axis = args["axis"] % x.ndim
    scale, bias = _learnt(x, weights, axis)
    return [_pointwise(_normalise(x, (axis,), scale, bias, axis), args.get("pw", 0))]


def _batch_norm(layer, args, inputs, weights, extra):
    (x,) = inputs
    scale, bias = _learnt(x, weights, 1)
    axes = tuple(a for a in range(x.ndim) if a != 1)  # every channel over batch and space
    return [_pointwise(_normalise(x, axes, scale, bias, 1), args.get("pw", 0))]


def _rms_norm(layer, args, inputs, weights, extra):
    (x,) = inputs
    axis = args["axis"] % x.ndim
    scale, _ = _learnt(x, weights, axis)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=axis, keepdims=True) + EPS) * scale.reshape(shape)
    return [_pointwise(y, args.get("pw", 0))]


def _reduce_mean(layer, args, inputs, weights, extra):
    (x,) = inputs
    y = jnp.mean(x, axis=tuple(args["axes"]), keepdims=bool(args.get("keepdims", False)))
    return [y.reshape(layer.output_shapes[0])]


def _softmax(layer, args, inputs, weights, extra):
    (x,) = inputs
    axis = args["axis"]
    return [jax.nn.softmax(x, axis=tuple(axis) if isinstance(axis, list) else axis)]


def _softmax_cross_entropy(layer, args, inputs, weights, extra):
    (x,) = inputs
    logp = jax.nn.log_softmax(x, axis=-1)
    classes = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    # A masked sum rather than a gather: it partitions like the logits, whatever their split.
    picked = jnp.sum(jnp.where(classes == extra["labels"][..., None], logp, 0.0), axis=-1)
    extra["losses"].append(-jnp.mean(picked))
    return [jnp.exp(logp)]


def _lstm(layer, args, inputs, weights, extra):
    """``L`` stacked LSTM layers as a wavefront over ``s + L - 1`` steps.

    At step ``t`` layer ``l`` processes time ``t - l``: every layer's state is one slice of
    ``(L, b, n)`` arrays, so a split of ``L`` places layers on different devices and the
    hand-over between layers is a shift along ``L`` (a pipeline). The weight ``(L, 4n, 2k)``
    is read unit-major: row ``4 u + g`` is gate ``g`` of unit ``u``, column ``2 j + 0`` the
    input ``j`` and ``2 j + 1`` the recurrent input ``j``, so splits of ``n`` and ``k`` keep
    every gate and both halves of a unit together.
    """
    (x,), (w,) = inputs, weights
    L, s, b, n, k = layer.domain
    constrain = extra["constrain"]
    w = w.reshape(L, n, 4, k, 2)
    wx, wh = w[..., 0], w[..., 1]
    steps = s + L - 1
    xs = jnp.swapaxes(x, 0, 1)  # (s, b, k)
    xs = jnp.concatenate([xs, jnp.zeros((L - 1, b, k), xs.dtype)], axis=0)
    active = (jnp.arange(steps)[:, None] >= jnp.arange(L)[None, :]) & (
        jnp.arange(steps)[:, None] < jnp.arange(L)[None, :] + s
    )  # (steps, L): layer l works at steps l .. l + s - 1
    scale = 1.0 / math.sqrt(2 * k)

    first = (jnp.arange(L) == 0)[:, None, None]

    def step(state, inp):
        h, c = state  # (L, b, n)
        x_t, on = inp
        # Layer l reads layer l-1's output: a shift by one along L (a halo exchange when L is
        # split); layer 0 reads the input at this step instead.
        shifted = jax.lax.pad(h, jnp.zeros((), h.dtype), ((1, -1, 0), (0, 0, 0), (0, 0, 0)))
        below = constrain(jnp.where(first, x_t[None], shifted), (0, 2, 4))
        recurrent = constrain(h, (0, 2, 4))  # the hand-over: cell output (b, n) to input (b, k)
        z = (jnp.einsum("lbk,lngk->lbng", below, wx) + jnp.einsum("lbk,lngk->lbng", recurrent, wh)) * scale
        gate_i, gate_f, gate_o = (jax.nn.sigmoid(z[..., g]) for g in (0, 1, 3))
        c_new = gate_f * c + gate_i * jnp.tanh(z[..., 2])
        h_new = gate_o * jnp.tanh(c_new)
        keep = on[:, None, None]
        h = constrain(jnp.where(keep, h_new, h), (0, 2, 3))
        c = constrain(jnp.where(keep, c_new, c), (0, 2, 3))
        return (h, c), h

    zeros = constrain(jnp.zeros((L, b, n), x.dtype), (0, 2, 3))
    _, states = jax.lax.scan(step, (zeros, zeros), (xs, active))  # (steps, L, b, n)
    # The top layer's outputs, taken after the loop: one transfer rather than one per step.
    return [jnp.swapaxes(states[L - 1:, L - 1], 0, 1)]  # (b, s, n)


def _moe(layer, args, inputs, weights, extra):
    """Dense dispatch: every expert runs on every token, the router's top-k weights (zero for
    the others) combine them; the same function as a sparse dispatch, at E/k times the work."""
    (x,) = inputs
    router, *rest = weights
    E, k, D = args["experts"], args["top_k"], x.shape[-1]
    probs = jax.nn.softmax(jnp.einsum("...d,de->...e", x, router) / math.sqrt(D), axis=-1)
    top, index = jax.lax.top_k(probs, k)
    gates = jnp.sum(jax.nn.one_hot(index, E, dtype=x.dtype) * top[..., None], axis=-2)

    def mlp(x_eq, w, width):
        if args["gated"]:
            gate, up, down = w
            h = _pointwise(jnp.einsum(x_eq[0], x, gate) / math.sqrt(D), 1) * (jnp.einsum(x_eq[0], x, up) / math.sqrt(D))
        else:
            up, down = w
            h = _pointwise(jnp.einsum(x_eq[0], x, up) / math.sqrt(D), 1)
        return jnp.einsum(x_eq[1], h, down) / math.sqrt(width)

    m = 3 if args["gated"] else 2
    experts = mlp(("...d,edh->...eh", "...eh,edh->...ed"), rest[:m], args["hidden"])
    y = jnp.einsum("...e,...ed->...d", gates, experts)
    if args["shared"]:
        shared = mlp(("...d,dh->...h", "...h,dh->...d"), rest[m: 2 * m], args["shared"] * args["shared_hidden"])
        if args["shared_gate"]:
            shared = jax.nn.sigmoid(jnp.einsum("...d,do->...o", x, rest[2 * m]) / math.sqrt(D)) * shared
        y = y + shared
    return [y]


def _ravel(layer, args, inputs, weights, extra):
    return [inputs[0].reshape(-1)]


def _unravel(layer, args, inputs, weights, extra):
    return [inputs[0].reshape(tuple(args["shape"]))]


def _stack(layer, args, inputs, weights, extra):
    return [jnp.stack(inputs, axis=args["axis"])]


def _roll(layer, args, inputs, weights, extra):
    (x,) = inputs
    return [jnp.roll(x, tuple(args["shifts"]), tuple(args["axes"]))]


def _unstack(layer, args, inputs, weights, extra):
    (x,) = inputs
    axis = args["axis"]
    if args.get("sizes"):  # unequal pieces, each keeping the axis
        cuts = np.cumsum(args["sizes"])[:-1].tolist()
        return list(jnp.split(x, cuts, axis=axis))
    return [jax.lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


#: The JAX function of every layer type, by ``op``.
OPS = {
    "Conv": _conv, "Pooling": _pooling, "FC": _fc, "Einsum": _einsum, "Embedding": _embedding,
    "Elementwise": _elementwise, "Concat": _concat, "Norm": _norm, "BatchNorm": _batch_norm,
    "RMSNorm": _rms_norm, "ReduceMean": _reduce_mean, "Softmax": _softmax,
    "SoftmaxCrossEntropy": _softmax_cross_entropy, "LSTM": _lstm, "Ravel": _ravel, "Unravel": _unravel,
    "Stack": _stack, "Unstack": _unstack, "Roll": _roll, "MoE": _moe,
}


# ---------------------------------------------------------------------------------------
# Building and running


def _partition(spec) -> PartitionSpec:
    return PartitionSpec(*(tuple(e) if e else None for e in spec))


class _Program:
    """The network's forward function over named arrays, and its random inputs."""

    def __init__(self, network, shardings, seed: int, dtype: str = "float32"):
        self.network = network
        self.shardings = shardings
        self.dtype = np.dtype(dtype)
        names = shardings["mesh"]["axis_names"] or ["d0"]
        sizes = shardings["mesh"]["axis_sizes"] or [1]
        devices = np.asarray(jax.devices()[: shardings["procs"]], dtype=object).reshape(sizes)
        self.mesh = Mesh(devices, tuple(names))
        for op in sorted({layer.op for layer in network.layers}):
            if op not in OPS:
                raise ValueError(f"layer type {op!r} has no JAX implementation")
        self.args = [dict(layer.args) for layer in network.layers]
        rng = np.random.RandomState(seed)
        # Weights: graph weights (a tensor, shared by its readers) or a layer's own.
        self.weight_key: list = []  # per layer, per weight slot: key into self.params
        self.params: dict = {}
        self.param_spec: dict = {}
        self.data: dict = {}
        self.data_key: list = []  # per layer, per input slot: key into self.data or None
        consumed = set()
        names_of: dict = {}  # graph weight tensor -> its parameter name
        for v, (layer, entry) in enumerate(zip(network.layers, shardings["layers"])):
            keys, data_keys = [], []
            weights = iter(entry["weights"])
            for i, t in enumerate(layer.inputs):
                if t.producer is not None:
                    consumed.add((t.producer, t.index))
                    data_keys.append(None)
                elif t.is_param:
                    w = next(weights)
                    if layer.lookup_table:  # its table is its own, whatever the tensor
                        key = w["name"]
                    else:  # a graph weight, shared by the layers that read it
                        key = names_of.setdefault(t.key, t.name if t.name and t.name not in self.params
                                                  else f"{t.name or 'weight'}#{t.index}")
                    if key not in self.params:
                        self.params[key] = self._weight(rng, w["name"], t.shape)
                        self.param_spec[key] = w["spec"]
                    keys.append(key)
                    data_keys.append(("param", key))
                else:
                    key = f"input{t.index}:{t.name}"
                    if key not in self.data:
                        if layer.lookup_table and i == 0:
                            self.data[key] = rng.randint(0, layer.domain[-1], size=t.shape[:-1]).astype(np.int32)
                        else:
                            self.data[key] = rng.standard_normal(t.shape).astype(self.dtype)
                    data_keys.append(("data", key))
            for w in weights:  # implicit weights
                self.params[w["name"]] = self._weight(rng, w["name"], w["shape"])
                self.param_spec[w["name"]] = w["spec"]
                keys.append(w["name"])
            if layer.op == "SoftmaxCrossEntropy":
                shape = layer.inputs[0].shape
                self.data[f"labels{v}"] = rng.randint(0, shape[-1], size=shape[:-1]).astype(np.int32)
            self.weight_key.append(keys)
            self.data_key.append(data_keys)
        self.sinks = [
            (v, i) for v, layer in enumerate(network.layers) if layer.op != "SoftmaxCrossEntropy"
            for i in range(len(layer.output_shapes)) if (v, i) not in consumed
        ]

    def _weight(self, rng, name: str, shape) -> np.ndarray:
        if name.endswith(".scale"):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(self.dtype)
        if name.endswith(".bias"):
            return (0.1 * rng.standard_normal(shape)).astype(self.dtype)
        return rng.standard_normal(tuple(shape)).astype(self.dtype)

    def sharding(self, spec) -> NamedSharding:
        return NamedSharding(self.mesh, _partition(spec))

    def forward(self, params: dict, data: dict, sharded: bool):
        """The loss; with ``sharded`` every tensor is constrained to the plan's sharding."""
        env: dict = {}
        losses: list = []
        for v, (layer, entry, args) in enumerate(zip(self.network.layers, self.shardings["layers"], self.args)):
            axes = entry["axes"]

            def constrain(x, spec_or_dims, axes=axes):
                if not sharded:
                    return x
                if spec_or_dims and isinstance(spec_or_dims[0], int):  # iteration-space dims
                    spec = [axes[d] or None for d in spec_or_dims]
                else:
                    spec = spec_or_dims
                return jax.lax.with_sharding_constraint(x, self.sharding(spec))

            with jax.named_scope(scope_name(v, entry["name"])):
                # Sub-scopes tell pase.outputs.jax.verify which collectives redistribute a tensor on
                # an edge (in<i>: the layer's input i; out<j>: its output j) and which belong to
                # the layer's own work.
                inputs = []
                specs = iter(entry["inputs"])
                weight_specs = iter(entry["weights"])
                for i, (t, key) in enumerate(zip(layer.inputs, self.data_key[v])):
                    if key is None:
                        x, spec, sub = env[(t.producer, t.index)], next(specs)["spec"], f"in{i}"
                    elif key[0] == "param":
                        x, spec, sub = params[key[1]], next(weight_specs)["spec"], f"w{i}"
                    else:
                        x, spec, sub = data[key[1]], next(specs)["spec"], f"in{i}"
                    with jax.named_scope(sub):
                        inputs.append(constrain(x, spec))
                implicit = []
                read = sum(1 for t in layer.inputs if t.is_param)  # weights read as inputs come first
                for i, (k, w) in enumerate(zip(self.weight_key[v], entry["weights"])):
                    if i >= read:
                        with jax.named_scope(f"w{i}"):
                            implicit.append(constrain(params[k], w["spec"]))
                extra = {"constrain": constrain, "losses": losses, "labels": data.get(f"labels{v}")}
                outputs = OPS[layer.op](layer, args, inputs, implicit, extra)
                for j, (y, out) in enumerate(zip(outputs, entry["outputs"])):
                    with jax.named_scope(f"out{j}"):
                        env[(v, j)] = constrain(y, out["spec"])
        with jax.named_scope("loss"):
            loss = sum(losses) if losses else jnp.zeros((), self.dtype)
            for v, i in self.sinks:
                y = env[(v, i)]
                loss = loss + 0.5 * jnp.mean(y * y)
        return loss


def run(network, shardings: dict, seed: int, dtype: str = "float32") -> dict:
    """Run the plan of ``shardings`` (``export_shardings``) sharded and unsharded in ``dtype``;
    returns numbers, errors, HLO text and timings."""
    if jax is None:
        raise JaxMissing(INSTALL_HINT)
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # this process runs nothing else
    if len(jax.devices()) < shardings["procs"]:
        raise RuntimeError(f"jax has {len(jax.devices())} devices, the plan needs {shardings['procs']}")
    program = _Program(network, shardings, seed, dtype)
    param_shardings = {k: program.sharding(s) for k, s in program.param_spec.items()}
    replicated = program.sharding([])
    data_shardings = {k: replicated for k in program.data}

    def step(sharded):
        return jax.value_and_grad(lambda p, d: program.forward(p, d, sharded))

    sharded_step = jax.jit(step(True), in_shardings=(param_shardings, data_shardings),
                           out_shardings=(replicated, param_shardings))
    seconds = {}
    started = time.perf_counter()
    params = jax.device_put(program.params, param_shardings)
    data = jax.device_put(program.data, data_shardings)
    compiled = sharded_step.lower(params, data).compile()
    seconds["compile"] = time.perf_counter() - started
    hlo = compiled.as_text()
    started = time.perf_counter()
    loss, grads = compiled(params, data)
    loss = float(loss)
    grads = {k: np.asarray(g) for k, g in grads.items()}
    seconds["run"] = time.perf_counter() - started

    started = time.perf_counter()
    device = jax.devices()[0]
    ref_loss, ref_grads = jax.jit(step(False))(jax.device_put(program.params, device),
                                               jax.device_put(program.data, device))
    ref_loss = float(ref_loss)
    ref_grads = {k: np.asarray(g) for k, g in ref_grads.items()}
    seconds["reference"] = time.perf_counter() - started

    largest = max((float(np.max(np.abs(g))) for g in ref_grads.values() if g.size), default=0.0)
    gradients = [(k, list(program.params[k].shape), relative_error(grads[k], ref_grads[k], GRADIENT_FLOOR * largest))
                 for k in program.params]
    return {
        "loss": loss,
        "loss_reference": ref_loss,
        "loss_error": relative_error(loss, ref_loss),
        "gradients": gradients,
        "seconds": seconds,
        "jax_version": jax.__version__,
        "hlo": hlo,
    }
