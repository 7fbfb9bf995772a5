"""Run a plan on XLA host devices: check its numbers and compare its communication with the model.

``verify`` builds the network in JAX from its layers, runs a jitted forward and backward pass
under the plan's shardings (``pase.outputs.jax.export``) on ``procs`` XLA CPU devices and checks the
loss and every weight gradient against an unsharded run. It reads the compiled HLO for the
collectives XLA inserted and sets their bytes, layer by layer, next to the bytes the cost
model charges. jax is imported only in a child process (``python -m pase.outputs.jax.child``), since
XLA's device count is fixed when jax starts; the caller's process and environment are untouched.

Numeric semantics of the layers (float32, or float64 on request; random inputs and weights, ``seed``):
``pw`` is that many ``tanh`` after the layer; GEMM-like layers (Conv, FC, Einsum, LSTM) divide
by the square root of their reduction size; Pooling is average pooling (padding counts as
zeros); Elementwise adds; Embedding gathers random token ids; Norm is a layer norm over its
axis with a scale and a bias; BatchNorm normalises every channel over the other axes; LSTM is
``L`` stacked LSTM layers run as a wavefront (layer ``l`` at step ``t`` processes time
``t - l``, so a split of ``L`` is a pipeline); SoftmaxCrossEntropy is the mean cross-entropy
against random labels over the last axis. The loss is the sum of the cross-entropies plus, for
any other output nobody reads, half its mean square.

Bytes per device of a collective over ``q`` devices (what this module compares):
all-reduce of ``n`` bytes ``2 (q-1)/q n`` (ring); all-gather to ``n_out`` bytes
``(q-1)/q n_out``; reduce-scatter of ``n_in`` bytes ``(q-1)/q n_in``; all-to-all of ``n``
bytes ``(q-1)/q n``; collective-permute of ``n`` bytes ``n`` (0 when every device keeps its
own data). The modelled bytes are the cost model's communication volumes in elements (its
all-reduces ``2 (q-1)/q w``, exchanges and redistribution ``w``) times 4 bytes (8 in float64).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import pase
from pase.core.checks import arguments, configurations, optional, positive_int
from pase.model.builder import Network
from pase.outputs.jax.export import export_shardings, unpack_plan
from pase.outputs.verified import numerics_dict
from pase.costing.memory import activation_elements, parameter_elements
from pase.core.budget import memory_budget as share_of_available_memory
from pase.costing.strategy import check_strategy, evaluate
from pase.core.errors import TooLarge
from pase.core.units import format_bytes

from pase.outputs.rows import format_columns

from .common import INSTALL_HINT, JaxMissing
from .hlo import Collective, collective_bytes, xla_notes

__all__ = [
    "verify", "VerifyResult", "LayerTraffic", "TrafficMachine", "VerifyTooLarge", "estimated_bytes", "DTYPES",
    "modelled_bytes",
]

#: Bytes of one float32 element: the numeric run is float32 unless asked for float64.
ELEMENT_BYTES = 4

#: The element types a run may use, and their bytes.
DTYPES = {"float32": 4, "float64": 8}

#: Share of the available memory a run may be estimated to need. The estimate is high: the
#: peaks measured in ``benchmarks/jax_comm.py`` were 0.73 to 0.84 of it.
MEMORY_SHARE = 0.9


class VerifyTooLarge(TooLarge):
    """The run would need more memory than the budget; raised before anything starts.

    ``needed`` and ``budget`` are bytes.
    """

    def __init__(self, graph: str, procs: int, needed: float, budget: float):
        self.needed = needed
        self.budget = budget
        super().__init__(
            f"the JAX run of {graph} on {procs} devices needs about {format_bytes(needed)} of memory "
            f"(every device's activations, replicas included, and their gradients), over the budget of "
            f"{format_bytes(budget)}; shrink the graph with -b (batch) or -m (width)"
        )


def estimated_bytes(network: Network, configs: Sequence[Sequence[int]], procs: int,
                    element_bytes: int = ELEMENT_BYTES) -> float:
    """A rough peak of the run's memory in bytes, for refusing runs that cannot fit.

    Twice the layer outputs (kept for the backward pass, and their gradients) of the
    larger of the two runs, plus twice the weights (and their gradients) of both runs. The
    sharded run counts every device's copy: a plan that replicates parts over idle devices
    costs that many times more.
    """
    strategy = check_strategy(network, configs, procs)
    sharded = reference = weights = 0.0
    for layer, config in zip(network.layers, strategy):
        C = np.asarray([config])
        sharded += float(activation_elements(layer, C)[0]) * procs
        reference += sum(math.prod(shape) for shape in layer.output_shapes)
        weights += float(parameter_elements(layer, C)[0]) * procs + sum(math.prod(s) for s, _ in layer.parameters())
    return element_bytes * 2.0 * (max(sharded, reference) + weights)


# ---------------------------------------------------------------------------------------
# Modelled bytes


@dataclass(frozen=True)
class TrafficMachine:
    """A machine that prices only communication, in bytes per device.

    It answers the machine protocol (``pase.machines.paper``): every communication term of the cost
    model becomes its volume in elements times ``element_bytes`` (a ring all-reduce of ``w``
    elements over ``q`` devices ``2 (q-1)/q w``, an exchange or a redistribution ``w``);
    computation costs nothing. ``evaluate`` under it gives the modelled bytes.

    Examples
    --------
    >>> from pase.machines.base import Group
    >>> TrafficMachine().all_reduce(100.0, Group.flat(4)).tolist()   # 2 * 3/4 * 100 elements * 4 bytes
    [600.0]
    >>> TrafficMachine().exchange(10.0, Group.flat(2)).tolist()
    [40.0]
    """

    element_bytes: int = ELEMENT_BYTES

    name = "traffic"
    cost_unit = "bytes"
    memory_bytes = None
    fitted = None
    notes = ()

    def check_procs(self, procs: int) -> None:
        """Any device count."""

    def gemm(self, B, M, N, K):
        return np.zeros(np.broadcast(B, M, N, K).shape)

    def memory_bound(self, kind: str, elements, flops):
        return np.zeros(np.shape(elements))

    def all_reduce(self, elements, group, grad: bool = False):
        q = np.asarray(group.size, dtype=np.float64)
        return self.element_bytes * np.asarray(elements, dtype=np.float64) / q * 2.0 * (q - 1.0)

    def exchange(self, elements, group):
        return np.where(np.asarray(group.size) > 1, self.element_bytes * np.asarray(elements, dtype=np.float64), 0.0)

    def all_gather(self, elements, group, grad: bool = False):
        return 0.5 * self.all_reduce(elements, group, grad)

    def reduce_scatter(self, elements, group, grad: bool = False):
        return 0.5 * self.all_reduce(elements, group, grad)

    def send_recv(self, elements, group):
        return self.exchange(elements, group)

    def all_to_all(self, elements, group):
        q = np.asarray(group.size, dtype=np.float64)
        return self.element_bytes * np.asarray(elements, dtype=np.float64) * (q - 1.0) / q

    def redistribute(self, elements, procs: int):
        return self.element_bytes * np.asarray(elements, dtype=np.float64)

    def describe(self) -> dict:
        return {"name": self.name, "element_bytes": self.element_bytes}


def modelled_bytes(network: Network, configs: Sequence[Sequence[int]], procs: int | None = None,
                   element_bytes: int = ELEMENT_BYTES) -> tuple:
    """Bytes per device the cost model moves for the strategy ``configs``.

    Returns ``(layer_bytes, edge_bytes)``, two arrays over the layers: the layer's own
    collectives, and the redistribution on the edges into it (forward and backward). It is
    ``evaluate`` under ``TrafficMachine``: the one place where model volumes become bytes.

    Examples
    --------
    >>> from pase import GraphBuilder, FC
    >>> g = GraphBuilder("t")
    >>> y = g.add("fc", FC(g.input((8, 6), "x"), 4))
    >>> layer, edge = modelled_bytes(g.build(), [(1, 1, 2)])
    >>> float(layer[0])   # forward output (8 x 4) all-reduced over k = 2: 2 * 1/2 * 32 * 4 bytes
    128.0
    """
    evaluation = evaluate(network, configs, TrafficMachine(element_bytes), procs)
    return np.asarray(evaluation.communication, dtype=np.float64), evaluation.incident_edge_costs()


@dataclass(frozen=True)
class LayerTraffic:
    """Modelled and XLA-inserted communication of one layer, bytes per device per step.

    ``*_layer``: the layer's own collectives; ``*_edge``: redistribution of the tensors it
    reads (forward, and their gradients backward).
    """

    id: int
    name: str
    op: str
    config: tuple
    modelled_layer: float
    modelled_edge: float
    xla_layer_forward: float
    xla_layer_backward: float
    xla_edge_forward: float
    xla_edge_backward: float
    collectives: dict

    @property
    def modelled(self) -> float:
        return self.modelled_layer + self.modelled_edge

    @property
    def xla_layer(self) -> float:
        return self.xla_layer_forward + self.xla_layer_backward

    @property
    def xla_edge(self) -> float:
        return self.xla_edge_forward + self.xla_edge_backward

    @property
    def xla(self) -> float:
        return self.xla_layer + self.xla_edge

    @property
    def ratio(self) -> float | None:
        """XLA bytes over modelled bytes, layer and edges together (None when the model charges nothing)."""
        return self.xla / self.modelled if self.modelled > 0 else None


_KIND_SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A",
               "collective-permute": "CP"}


def _ratio(xla: float, modelled: float):
    return xla / modelled if modelled > 0 else None


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify`` found: the numbers check and the communication, layer by layer.

    Attributes
    ----------
    graph : str
    procs : int
    ok : bool
        The loss and every gradient are within ``tolerance`` of the unsharded run.
    tolerance : float
        Largest relative error allowed: ``max |sharded - unsharded| / max |unsharded|`` per
        tensor.
    loss, loss_reference, loss_error : float
        The sharded and unsharded loss and their relative difference.
    gradients : list of (name, shape, relative error)
        One per weight.
    layers : list of LayerTraffic
    unattributed : float
        XLA bytes per device in collectives that carry no layer's scope.
    unattributed_kinds : dict
    seconds : dict
        ``compile``, ``run`` (sharded), ``reference`` (unsharded) and ``total``.
    jax_version : str
    seed : int
    notes : tuple of str
        What XLA said about the plan: where it could only reshard by replicating a tensor.
    dtype : str
        The element type of the run.
    """

    graph: str
    procs: int
    ok: bool
    tolerance: float
    loss: float
    loss_reference: float
    loss_error: float
    gradients: list
    layers: list
    unattributed: float
    unattributed_kinds: dict
    seconds: dict
    jax_version: str
    seed: int
    notes: tuple = ()
    dtype: str = "float32"

    @property
    def max_error(self) -> float:
        """The largest relative error over the loss and every gradient."""
        return max([self.loss_error] + [e for _, _, e in self.gradients])

    @property
    def modelled_total(self) -> float:
        return float(sum(l.modelled for l in self.layers))

    @property
    def xla_total(self) -> float:
        return float(sum(l.xla for l in self.layers) + self.unattributed)

    def by_op(self) -> dict:
        """Bytes summed per layer type: ``{op: {"layers", "modelled_layer", "xla_layer",
        "modelled_edge", "xla_edge"}}``."""
        sums: dict = {}
        for l in self.layers:
            entry = sums.setdefault(l.op, {"layers": 0, "modelled_layer": 0.0, "xla_layer": 0.0,
                                           "modelled_edge": 0.0, "xla_edge": 0.0})
            entry["layers"] += 1
            entry["modelled_layer"] += l.modelled_layer
            entry["xla_layer"] += l.xla_layer
            entry["modelled_edge"] += l.modelled_edge
            entry["xla_edge"] += l.xla_edge
        return sums

    def to_dict(self) -> dict:
        """The JSON ``"verify"`` object (bytes are per device per step)."""
        return {
            **numerics_dict(self),
            "modelled_bytes": self.modelled_total,
            "xla_bytes": self.xla_total,
            "ratio": _ratio(self.xla_total, self.modelled_total),
            "unattributed_xla_bytes": self.unattributed,
            "unattributed_collectives": dict(self.unattributed_kinds),
            "layers": [
                {"id": l.id, "name": l.name, "op": l.op, "config": list(l.config),
                 "modelled_layer_bytes": l.modelled_layer, "modelled_edge_bytes": l.modelled_edge,
                 "xla_layer_bytes": {"forward": l.xla_layer_forward, "backward": l.xla_layer_backward},
                 "xla_edge_bytes": {"forward": l.xla_edge_forward, "backward": l.xla_edge_backward},
                 "ratio": l.ratio, "collectives": dict(l.collectives)}
                for l in self.layers
            ],
            "by_op": {op: dict(e, layer_ratio=_ratio(e["xla_layer"], e["modelled_layer"]))
                      for op, e in self.by_op().items()},
            "seconds": dict(self.seconds),
            "jax_version": self.jax_version,
            "notes": list(self.notes),
        }

    def table(self, all_layers: bool = False) -> str:
        """A plain-text report: the numbers check, then modelled vs XLA bytes per layer.

        Layers where neither moves anything are left out unless ``all_layers``.
        """
        lines = [
            f"JAX verification of {self.graph} on {self.procs} XLA host devices "
            f"({self.dtype}, jax {self.jax_version}, seed {self.seed})",
            f"numbers: {'OK' if self.ok else 'FAILED'}: largest relative error {self.max_error:.2e} "
            f"(tolerance {self.tolerance:.0e}); loss {self.loss:.6g}, unsharded {self.loss_reference:.6g}",
        ]
        if not self.loss_error <= self.tolerance:
            lines.append(f"  loss: relative error {self.loss_error:.2e}")
        bad = [(n, e) for n, _, e in self.gradients if not e <= self.tolerance]
        lines += [f"  gradient of {n}: relative error {e:.2e}" for n, e in bad[:10]]
        if len(bad) > 10:
            lines.append(f"  ... and {len(bad) - 10} more gradients")
        lines.append("communication, bytes per device per step: the layer's own collectives, and redistribution "
                     "on the edges into it")
        headers = ["id", "layer", "type", "model layer", "XLA layer", "model edges", "XLA edges", "XLA/model",
                   "XLA collectives"]
        rows = []
        for l in self.layers:
            if not all_layers and l.modelled == 0 and l.xla == 0:
                continue
            kinds = " ".join(f"{_KIND_SHORT[k]}x{n}" for k, n in sorted(l.collectives.items()))
            rows.append([str(l.id), l.name, l.op, format_bytes(l.modelled_layer), format_bytes(l.xla_layer),
                         format_bytes(l.modelled_edge), format_bytes(l.xla_edge),
                         "-" if l.ratio is None else f"{l.ratio:.2f}", kinds])
        if self.unattributed:
            kinds = " ".join(f"{_KIND_SHORT[k]}x{n}" for k, n in sorted(self.unattributed_kinds.items()))
            rows.append(["", "(no layer scope)", "", "", format_bytes(self.unattributed), "", "", "", kinds])
        layer_m = sum(l.modelled_layer for l in self.layers)
        edge_m = sum(l.modelled_edge for l in self.layers)
        layer_x = sum(l.xla_layer for l in self.layers) + self.unattributed
        edge_x = sum(l.xla_edge for l in self.layers)
        total = _ratio(self.xla_total, self.modelled_total)
        rows.append(["", "total", "", format_bytes(layer_m), format_bytes(layer_x), format_bytes(edge_m),
                     format_bytes(edge_x), "-" if total is None else f"{total:.2f}", ""])
        lines += format_columns(headers, rows, [">", "<", "<", ">", ">", ">", ">", ">", "<"])
        lines += [f"note: {n}" for n in self.notes]
        lines.append(
            f"seconds: compile {self.seconds.get('compile', 0):.1f}, sharded run {self.seconds.get('run', 0):.1f}, "
            f"unsharded run {self.seconds.get('reference', 0):.1f}, total {self.seconds.get('total', 0):.1f}"
        )
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The call


def _child_env(procs: int) -> dict:
    """The child's environment: ``procs`` XLA host devices, CPU only, this package first."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={int(procs)}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(pase.__file__)))
    path = [root] + [p for p in sys.path if p and os.path.isdir(p) and p != root]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@arguments(configs=optional(configurations), procs=optional(positive_int))
def verify(
    network,
    configs: Sequence[Sequence[int]] | None = None,
    procs: int | None = None,
    machine=None,
    seed: int = 0,
    tolerance: float = 1e-4,
    timeout: float | None = None,
    memory_budget: float | None = None,
    dtype: str = "float32",
) -> VerifyResult:
    """Run the plan ``configs`` on ``procs`` XLA host devices and check it.

    Parameters
    ----------
    network : Network or Plan
        The computation graph, or a ``pase.Plan`` (``configs`` and ``procs`` default to its own).
    configs : sequence of sequences of int
        One configuration per layer; each must use a divisor of ``procs`` devices.
    procs : int
        Number of XLA host devices (``--xla_force_host_platform_device_count``).
    machine : optional
        Unused by the comparison (bytes do not depend on the machine); accepted so that a
        caller can pass the plan's machine.
    seed : int
        Seed of the random inputs, weights, token ids and labels.
    tolerance : float
        Largest relative error allowed per tensor, ``max|sharded - unsharded| / max|unsharded|``.
    timeout : float, optional
        Seconds after which the child is stopped (``subprocess.TimeoutExpired``).
    memory_budget : float, optional
        Bytes the run may use (default ``MEMORY_SHARE`` of the memory available); a run whose
        ``estimated_bytes`` exceed it is refused before it starts.
    dtype : {"float32", "float64"}
        Element type of both runs and of the bytes compared. float64 tells a plan's error
        from float32 rounding in ill-conditioned networks, at twice the memory.

    Returns
    -------
    VerifyResult
        ``ok`` is False when a number differs; communication differences are reported,
        never a failure.

    Raises
    ------
    JaxMissing
        jax is not installed.
    VerifyTooLarge
        The run would not fit ``memory_budget``.
    ValueError
        A bad strategy, or a configuration whose device count does not divide ``procs``.
    RuntimeError
        The child failed (its last lines of output in the message).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    network, configs, procs = unpack_plan(network, configs, procs)
    strategy = check_strategy(network, configs, procs)
    shardings = export_shardings(network, strategy, procs)
    if importlib.util.find_spec("jax") is None:
        raise JaxMissing(INSTALL_HINT)
    budget = share_of_available_memory(MEMORY_SHARE) if memory_budget is None else float(memory_budget)
    needed = estimated_bytes(network, strategy, procs, DTYPES[dtype])
    if needed > budget:
        raise VerifyTooLarge(network.name, procs, needed, budget)
    layer_bytes, edge_bytes = modelled_bytes(network, strategy, procs, DTYPES[dtype])
    try:  # the child rebuilds nothing: it gets the network's layers as they are
        payload = pickle.dumps({"network": network, "shardings": shardings, "seed": int(seed), "dtype": dtype})
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise ValueError(f"the network cannot be sent to the JAX run (its layers must be picklable): {err}") from None
    started = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-m", "pase.outputs.jax.child"], input=payload, capture_output=True,
        env=_child_env(procs), timeout=timeout,
    )
    if child.returncode != 0:
        tail = child.stderr.decode(errors="replace").strip().splitlines()[-15:]
        if child.returncode < 0:  # killed: SIGKILL is what the kernel's out-of-memory killer sends
            why = "killed" + (" (out of memory?)" if child.returncode == -9 else f" by signal {-child.returncode}")
            raise RuntimeError(f"the JAX run was {why}; shrink the graph with -b or -m")
        raise RuntimeError("the JAX run failed:\n" + "\n".join(tail))
    out = json.loads(child.stdout.decode())
    out["seconds"]["total"] = time.perf_counter() - started
    out["notes"] = xla_notes(child.stderr.decode(errors="replace"), network)
    out["dtype"] = dtype
    return _result(network, strategy, procs, out, layer_bytes, edge_bytes, seed, tolerance)


def _result(network, strategy, procs, out, layer_bytes, edge_bytes, seed, tolerance) -> VerifyResult:
    """Assemble the result from the child's output and the modelled bytes."""
    records = [Collective(**r) for r in out["collectives"]]
    sums = collective_bytes(records, network)
    layers = [
        LayerTraffic(v, network.names[v], layer.op, tuple(strategy[v]), float(layer_bytes[v]), float(edge_bytes[v]),
                     float(sums["layer_forward"][v]), float(sums["layer_backward"][v]),
                     float(sums["edge_forward"][v]), float(sums["edge_backward"][v]), sums["kinds"][v])
        for v, layer in enumerate(network.layers)
    ]
    errors = [out["loss_error"]] + [e for _, _, e in out["gradients"]]
    return VerifyResult(
        graph=network.name, procs=int(procs), ok=all(e <= tolerance for e in errors), tolerance=float(tolerance),
        loss=out["loss"], loss_reference=out["loss_reference"], loss_error=out["loss_error"],
        gradients=[(n, tuple(s), e) for n, s, e in out["gradients"]], layers=layers,
        unattributed=float(sums["unattributed"]), unattributed_kinds=sums["unattributed_kinds"],
        seconds=dict(out["seconds"]), jax_version=out["jax_version"], seed=int(seed),
        notes=tuple(out.get("notes", ())), dtype=out.get("dtype", "float32"),
    )


# ---------------------------------------------------------------------------------------
# The child: everything below runs with jax imported
