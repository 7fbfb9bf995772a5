"""The collectives in compiled HLO text (XLA's ``as_text()``): what kind, how many bytes,
over how many devices, and which layer of the network they belong to, for ``--verify``'s
report of the bytes XLA moves next to the modelled ones."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pase.model.builder import Network

__all__ = ["Collective", "parse_collectives", "collective_bytes", "xla_notes"]

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
    computations, entry = _computations(hlo_text)
    order, multiplicity = _multiplicities(computations, entry)
    records = []
    for comp in order:
        instructions = computations[comp]
        types = {name: type_text for name, type_text, *_ in instructions}
        readers = _tuple_readers(instructions)
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
            per_device, owners = _bytes_and_owners(kind, q, sizes, attrs, name, op_name, readers)
            for i, (nbytes, owner) in enumerate(zip(per_device, owners)):
                layer, backward, role, slot = _attribution(owner)
                records.append(Collective(kind, float(nbytes), int(multiplicity[comp]), int(q), layer, backward,
                                          role, slot, name if len(owners) == 1 else f"{name}#{i}"))
    return records


def _computations(hlo_text: str) -> tuple:
    """``({computation: [instruction, ...]}, entry computation)`` of an HLO module's text."""
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
    return computations, entry


def _multiplicities(computations: dict, entry: str) -> tuple:
    """``(order, multiplicity)``: the computations reached from ``entry``, callees before
    callers, and how many times each runs (the product of the trip counts of the loops
    around it)."""
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
    return order, multiplicity


def _tuple_readers(instructions: list) -> dict:
    """``(tuple instruction, index) -> op_name`` of the ``get-tuple-element`` reading each part."""
    readers: dict = {}
    for name, _, opcode, operands, attrs in instructions:
        if opcode == "get-tuple-element" and operands:
            index = re.search(r"\bindex=(\d+)", attrs)
            op_name = _OP_NAME.search(attrs)
            if index and op_name:
                readers.setdefault((operands[0], int(index.group(1))), op_name.group(1))
    return readers


def _bytes_and_owners(kind: str, q: int, sizes: list, attrs: str, name: str, op_name, readers: dict) -> tuple:
    """Bytes each device sends for one collective over ``q`` devices of tensors of ``sizes``
    bytes, and the op name each part is attributed to (a tuple all-reduce: one per tensor)."""
    if kind == "collective-permute":
        listed = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs)
        pairs = re.findall(r"\{(\d+),(\d+)\}", listed.group(1)) if listed else []
        moves = any(a != b for a, b in pairs) if pairs else True
        return [float(sum(sizes)) if moves else 0.0], [op_name]
    if kind == "all-reduce":
        per_device = [2.0 * (q - 1) / q * n for n in sizes]
        owners = [readers.get((name, i), op_name) for i in range(len(sizes))] if len(sizes) > 1 else [op_name]
        return per_device, owners
    if kind == "all-gather":
        return [float((q - 1) * sum(sizes))], [op_name]  # (q-1)/q of the gathered output
    return [(q - 1) / q * float(sum(sizes))], [op_name]  # reduce-scatter, all-to-all: (q-1)/q of the input


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


def xla_notes(stderr: str, network: Network) -> list:
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
