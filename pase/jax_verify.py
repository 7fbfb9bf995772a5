"""Run a plan on XLA host devices: check its numbers and compare its communication with the model.

``verify`` builds the network in JAX from its layers, runs a jitted forward and backward pass
under the plan's shardings (``pase.jax_export``) on ``procs`` XLA CPU devices and checks the
loss and every weight gradient against an unsharded run. It reads the compiled HLO for the
collectives XLA inserted and sets their bytes, layer by layer, next to the bytes the cost
model charges. jax is imported only in a child process (``python -m pase.jax_verify``), since
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
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .builder import Network
from .jax_export import export_shardings, unpack_plan
from .memory import activation_elements, parameter_elements
from .solver import available_memory
from .strategy import check_strategy, evaluate
from .units import format_bytes

__all__ = [
    "verify", "VerifyResult", "LayerTraffic", "TrafficMachine", "JaxMissing", "VerifyTooLarge", "estimated_bytes",
    "DTYPES",
    "modelled_bytes",
    "Collective", "parse_collectives", "collective_bytes", "INSTALL_HINT",
]

#: What to tell a user without jax.
INSTALL_HINT = "jax is not installed: pip install '.[jax]'"

#: Bytes of one float32 element: the numeric run is float32 unless asked for float64.
ELEMENT_BYTES = 4

#: The element types a run may use, and their bytes.
DTYPES = {"float32": 4, "float64": 8}

#: Share of the available memory a run may be estimated to need. The estimate is high: the
#: peaks measured in ``benchmarks/jax_comm.py`` were 0.73 to 0.84 of it.
MEMORY_SHARE = 0.9


class JaxMissing(ImportError):
    """jax is not importable; the message says how to install it."""


class VerifyTooLarge(MemoryError):
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

    It answers the machine protocol (``pase.machine``): every communication term of the cost
    model becomes its volume in elements times ``element_bytes`` (a ring all-reduce of ``w``
    elements over ``q`` devices ``2 (q-1)/q w``, an exchange or a redistribution ``w``);
    computation costs nothing. ``evaluate`` under it gives the modelled bytes.

    Examples
    --------
    >>> from pase.machine import Group
    >>> TrafficMachine().all_reduce(100.0, Group.flat(4)).tolist()   # 2 * 3/4 * 100 elements * 4 bytes
    [600.0]
    >>> TrafficMachine().exchange(10.0, Group.flat(2)).tolist()
    [40.0]
    """

    element_bytes: int = ELEMENT_BYTES

    name = "traffic"
    cost_unit = "bytes"
    memory_bytes = None

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


# ---------------------------------------------------------------------------------------
# Collectives in compiled HLO text

#: HLO opcodes of the collectives counted, by the kind they are reported as.
_COLLECTIVE_KINDS = {
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce",
    "all-gather": "all-gather", "all-gather-start": "all-gather",
    "reduce-scatter": "reduce-scatter",
    "all-to-all": "all-to-all",
    "collective-permute": "collective-permute", "collective-permute-start": "collective-permute",
}

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}

_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z0-9]*)?)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_CALLS = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SCOPE = re.compile(r"(?:^|[/(;:])L(\d+)\.")


@dataclass(frozen=True)
class Collective:
    """One collective of a compiled program.

    Attributes
    ----------
    kind : str
        ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` or
        ``collective-permute``.
    bytes : float
        Bytes per device per execution (see the module docstring).
    count : int
        How many times it runs per step (the trip counts of the loops around it).
    group : int
        Devices per group (``q``).
    layer : int or None
        Vertex id of the layer whose named scope it carries, if any.
    backward : bool
        In the backward pass (its name is under ``transpose(...)``).
    role : str
        ``"in"`` or ``"out"``: it redistributes the layer's input or output ``slot`` (an
        edge); ``"layer"``: the layer's own work (its collectives, its weights).
    slot : int or None
        Which input or output, for ``"in"`` and ``"out"``.
    name : str
        The HLO instruction name.
    """

    kind: str
    bytes: float
    count: int
    group: int
    layer: int | None
    backward: bool
    role: str
    slot: int | None
    name: str

    @property
    def total(self) -> float:
        """Bytes per device over a step: ``bytes * count``."""
        return self.bytes * self.count


def _shape_bytes(type_text: str) -> list:
    """Bytes of every array in an HLO type (a tuple gives several)."""
    sizes = []
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype == "token":
            continue
        width = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else 4)
        sizes.append(width * math.prod(int(d) for d in dims.split(",") if d))
    return sizes


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``text[start]``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for i in range(start, len(text)):
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def _parse_instruction(line: str):
    """``(name, type, opcode, operands, attributes)`` of one HLO instruction line, or None."""
    text = line.strip()
    if text.startswith("ROOT "):
        text = text[5:]
    if " = " not in text or not text.startswith("%") and not re.match(r"[\w.\-]+ = ", text):
        return None
    name, rest = text.split(" = ", 1)
    rest = rest.strip()
    if rest.startswith("("):
        end = _balanced(rest, 0)
        type_text, rest = rest[:end], rest[end:].lstrip()
    else:
        type_text, _, rest = rest.partition(" ")
    match = re.match(r"([a-z][\w\-]*)\(", rest)
    if not match:
        return None
    opcode = match.group(1)
    end = _balanced(rest, match.end() - 1)
    operands = re.findall(r"%([\w.\-]+)", rest[match.end() - 1:end])
    return name.lstrip("%"), type_text, opcode, operands, rest[end:]


def _group_size(attrs: str, procs: int) -> int:
    """Devices per group of a collective, from its ``replica_groups``."""
    match = re.search(r"replica_groups=", attrs)
    if not match:
        return procs
    rest = attrs[match.end():]
    if rest.startswith("{}"):
        return procs
    if rest.startswith("{"):
        groups = rest[: _balanced(rest, 0)]
        first = re.search(r"\{([0-9,\s]*)\}", groups[1:])
        return len([d for d in first.group(1).split(",") if d.strip()]) if first else procs
    if rest.startswith("["):  # iota form: [groups, size]<=[...]
        dims = rest[1: rest.index("]")].split(",")
        return int(dims[-1])
    if rest.startswith("mesh["):  # mesh form: mesh['a'=2,'b'=4]... {'b'} or {'b':(2)2}
        end = _balanced(rest, 4)
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", rest[5: end - 1])}
        after = rest[end:]
        if after.startswith(", device_ids="):
            start = after.index("(")
            after = after[_balanced(after, start):]
        selected = re.match(r"\s*\{([^}]*)\}", after)
        if not selected:
            return procs
        q = 1
        for entry in filter(None, (e.strip() for e in selected.group(1).split(","))):
            sub = re.match(r"'([^']+)'\s*:\s*\(\d+\)(\d+)", entry)
            q *= int(sub.group(2)) if sub else sizes.get(entry.strip("'"), 1)
        return q
    return procs


def _attribution(op_name: str | None) -> tuple:
    """``(layer, backward, role, slot)`` of an HLO op name, from the first layer scope in it.

    ``role`` is ``"in"``/``"out"`` under the layer's ``in<i>``/``out<j>`` sub-scope (slot ``i``
    or ``j``), else ``"layer"``.

    >>> _attribution("jit(f)/transpose(jvp(L12.enc1.ff.up))/out0/sharding_constraint")
    (12, True, 'out', 0)
    >>> _attribution("jit(f)/jvp(L3.fc)/dot_general")
    (3, False, 'layer', None)
    """
    if not op_name:
        return None, False, "layer", None
    match = _SCOPE.search(op_name)
    if not match:
        return None, "transpose(" in op_name, "layer", None
    backward = "transpose(" in op_name[: match.start() + 1]
    sub = re.match(r"[^/()]*\)*/(in|out)(\d+)/", op_name[match.end():])
    if sub:
        return int(match.group(1)), backward, sub.group(1), int(sub.group(2))
    return int(match.group(1)), backward, "layer", None


def parse_collectives(hlo_text: str, procs: int) -> list:
    """Every collective in a compiled HLO module's text, as ``Collective`` records.

    A collective inside a loop body counts ``known_trip_count`` times (1 if unknown); one
    whose result is a tuple (several tensors reduced together) gives one record per tensor,
    attributed by the ``get-tuple-element`` that reads it.

    Examples
    --------
    >>> hlo = '''
    ... ENTRY %main (p: f32[8,16]) -> f32[8,16] {
    ...   %p = f32[8,16]{1,0} parameter(0)
    ...   ROOT %ar = f32[8,16]{1,0} all-reduce(%p), replica_groups=[2,4]<=[8], to_apply=%add, metadata={op_name="jit(f)/jvp(L3.fc)/dot_general"}
    ... }'''
    >>> [(c.kind, c.bytes, c.group, c.layer, c.backward) for c in parse_collectives(hlo, 8)]
    [('all-reduce', 768.0, 4, 3, False)]
    """
    computations: dict = {}
    entry = None
    current = None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line.strip())
        if header and "=" not in line.split("(", 1)[0]:
            current = header.group(1)
            computations[current] = []
            if line.lstrip().startswith("ENTRY"):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is None:
            continue
        parsed = _parse_instruction(line)
        if parsed:
            computations[current].append(parsed)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")

    # Multiplicity of every computation: the product of the trip counts of the loops around it.
    calls: dict = {name: [] for name in computations}
    for name, instructions in computations.items():
        for _, _, opcode, _, attrs in instructions:
            trip = 1
            if opcode == "while":
                found = _TRIP.search(attrs)
                trip = int(found.group(1)) if found else 1
            for key, callee in _CALLS.findall(attrs):
                if callee in computations:
                    calls[name].append((callee, trip if key == "body" else 1))
            for group in _BRANCHES.findall(attrs):
                for callee in re.findall(r"%?([\w.\-]+)", group):
                    if callee in computations:
                        calls[name].append((callee, 1))
    order, seen = [], set()

    def visit(name):  # post-order: callees before callers
        seen.add(name)
        for callee, _ in calls[name]:
            if callee not in seen:
                visit(callee)
        order.append(name)

    visit(entry)
    multiplicity = {name: 0 for name in computations}
    multiplicity[entry] = 1
    for name in reversed(order):  # callers before callees
        for callee, factor in calls[name]:
            multiplicity[callee] += multiplicity[name] * factor

    records = []
    for comp in order:
        instructions = computations[comp]
        types = {name: type_text for name, type_text, *_ in instructions}
        readers: dict = {}
        for name, _, opcode, operands, attrs in instructions:
            if opcode == "get-tuple-element" and operands:
                index = re.search(r"\bindex=(\d+)", attrs)
                op_name = _OP_NAME.search(attrs)
                if index and op_name:
                    readers.setdefault((operands[0], int(index.group(1))), op_name.group(1))
        for name, type_text, opcode, operands, attrs in instructions:
            kind = _COLLECTIVE_KINDS.get(opcode)
            if kind is None or multiplicity[comp] == 0:
                continue
            op_name = _OP_NAME.search(attrs)
            op_name = op_name.group(1) if op_name else None
            q = _group_size(attrs, procs)
            sizes = [b for operand in operands for b in _shape_bytes(types.get(operand, ""))]
            if not sizes:
                sizes = _shape_bytes(type_text)
            if kind == "collective-permute":
                listed = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs)
                pairs = re.findall(r"\{(\d+),(\d+)\}", listed.group(1)) if listed else []
                moves = any(a != b for a, b in pairs) if pairs else True
                per_device = [float(sum(sizes)) if moves else 0.0]
                owners = [op_name]
            elif kind == "all-reduce":
                per_device = [2.0 * (q - 1) / q * n for n in sizes]
                owners = [readers.get((name, i), op_name) for i in range(len(sizes))] if len(sizes) > 1 else [op_name]
            elif kind == "all-gather":
                per_device = [float((q - 1) * sum(sizes))]  # (q-1)/q of the gathered output
                owners = [op_name]
            else:  # reduce-scatter, all-to-all: (q-1)/q of the input
                per_device = [(q - 1) / q * float(sum(sizes))]
                owners = [op_name]
            for i, (nbytes, owner) in enumerate(zip(per_device, owners)):
                layer, backward, role, slot = _attribution(owner)
                records.append(Collective(kind, float(nbytes), int(multiplicity[comp]), int(q), layer, backward,
                                          role, slot, name if len(owners) == 1 else f"{name}#{i}"))
    return records


def collective_bytes(records: Sequence[Collective], network: Network) -> dict:
    """XLA bytes per device per step, by layer: its own work and the edges into it.

    A collective in a layer's ``in<i>`` scope redistributes that input: the edge into the
    layer. One in a layer's ``out<j>`` scope (XLA puts a gradient back into the producer's
    layout there) counts for the edge to the first layer that reads output ``j``. Returns
    arrays over the layers, ``layer_forward``, ``layer_backward``, ``edge_forward``,
    ``edge_backward``, a per-layer ``kinds`` count, and the bytes and kinds of collectives
    that carry no layer scope (``unattributed``, ``unattributed_kinds``).
    """
    n = len(network.layers)
    readers: dict = {}
    for v, layer in enumerate(network.layers):
        for t in layer.inputs:
            if t.producer is not None:
                readers.setdefault((t.producer, t.index), []).append(v)
    sums = {key: np.zeros(n) for key in ("layer_forward", "layer_backward", "edge_forward", "edge_backward")}
    kinds = [dict() for _ in range(n)]
    unattributed, loose = 0.0, {}
    for c in records:
        if c.total == 0:
            continue
        row = c.layer
        if row is not None and 0 <= row < n and c.role == "out":
            row = min(readers.get((row, c.slot), [row]))
        if row is None or not 0 <= row < n:
            unattributed += c.total
            loose[c.kind] = loose.get(c.kind, 0) + c.count
            continue
        part = "layer" if c.role == "layer" else "edge"
        sums[f"{part}_{'backward' if c.backward else 'forward'}"][row] += c.total
        kinds[row][c.kind] = kinds[row].get(c.kind, 0) + c.count
    return dict(sums, kinds=kinds, unattributed=unattributed, unattributed_kinds=loose)


# ---------------------------------------------------------------------------------------
# The result


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
        worst = max(self.gradients, key=lambda g: g[2]) if self.gradients else None
        return {
            "ok": self.ok,
            "procs": self.procs,
            "tolerance": self.tolerance,
            "seed": self.seed,
            "dtype": self.dtype,
            "loss": self.loss,
            "loss_reference": self.loss_reference,
            "loss_error": self.loss_error,
            "max_error": self.max_error,
            "worst_gradient": None if worst is None else {"name": worst[0], "error": worst[2]},
            "gradients": [{"name": n, "shape": list(s), "error": e} for n, s, e in self.gradients],
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
        widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers))]
        right = {0, 3, 4, 5, 6, 7}
        for row in [headers] + rows:
            cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
            lines.append("  ".join(cells).rstrip())
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [root] + [p for p in sys.path if p and os.path.isdir(p) and p != root]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


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
    plan = export_shardings(network, strategy, procs)
    if importlib.util.find_spec("jax") is None:
        raise JaxMissing(INSTALL_HINT)
    budget = MEMORY_SHARE * available_memory() if memory_budget is None else float(memory_budget)
    needed = estimated_bytes(network, strategy, procs, DTYPES[dtype])
    if needed > budget:
        raise VerifyTooLarge(network.name, procs, needed, budget)
    layer_bytes, edge_bytes = modelled_bytes(network, strategy, procs, DTYPES[dtype])
    try:  # the child rebuilds nothing: it gets the network's layers as they are
        payload = pickle.dumps({"network": network, "plan": plan, "seed": int(seed), "dtype": dtype})
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise ValueError(f"the network cannot be sent to the JAX run (its layers must be picklable): {err}") from None
    started = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-m", "pase.jax_verify"], input=payload, capture_output=True,
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
    out["notes"] = _xla_notes(child.stderr.decode(errors="replace"), network)
    out["dtype"] = dtype
    return _result(network, strategy, procs, out, layer_bytes, edge_bytes, seed, tolerance)


def _xla_notes(stderr: str, network: Network) -> list:
    """XLA's warnings worth showing: reshardings it could only do by replicating the tensor."""
    places = []
    for line in stderr.splitlines():
        if "Involuntary full rematerialization" not in line:
            continue
        op_name = _OP_NAME.search(line)
        layer, backward, role, slot = _attribution(op_name.group(1) if op_name else None)
        where = "?" if layer is None or layer >= len(network.layers) else network.names[layer]
        if role != "layer":
            where += f" ({role}put {slot})"
        places.append(f"{where}{' backward' if backward else ''}")
    if not places:
        return []
    unique = list(dict.fromkeys(places))
    return [f"XLA resharded by replicating the whole tensor ({len(places)} times) at: " + ", ".join(unique)]


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


#: A gradient is compared at its own scale, or at this fraction of the largest gradient element
#: of the model if that is larger (see ``_relative_error``).
GRADIENT_FLOOR = 1e-3


def _relative_error(value, reference, floor: float = 0.0) -> float:
    """``max |value - reference| / max(max |reference|, floor)``; the absolute error without a scale.

    A gradient that is mathematically zero (a bias right before a normalisation) holds only
    rounding noise, so its own scale means nothing: weights' gradients are compared at their
    own scale or at ``GRADIENT_FLOOR`` times the model's largest gradient element, whichever
    is larger. A wrong sharding changes a gradient by about its own size, so it is still
    caught in every gradient larger than ``1e-7`` of the largest one (at tolerance ``1e-4``).
    """
    value = np.asarray(value, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    scale = max(float(np.max(np.abs(reference))) if reference.size else 0.0, floor)
    diff = float(np.max(np.abs(value - reference))) if reference.size else 0.0
    return diff / scale if scale > 0 else diff


def _child_main() -> int:
    payload = pickle.loads(sys.stdin.buffer.read())
    from . import jax_program  # imports jax

    out = jax_program.run(payload["network"], payload["plan"], payload["seed"], payload["dtype"])
    out["collectives"] = [c.__dict__ for c in parse_collectives(out.pop("hlo"), payload["plan"]["procs"])]
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
