"""Repeated identical blocks in a costed graph, found on the bare graph (issue 12).

A transformer is the same block ``L`` times; ``find_block_runs`` finds such runs of equal,
equally wired copies so that the search (``pase.search.solver``) can solve one copy and chain it.

What counts as a run
--------------------
Vertices are taken in id order (creation order for built-in and imported graphs, where a
repeated block is a contiguous id range). A *run* is ``copies`` consecutive ranges of
``size`` vertices (the copies, numbered ``0 .. copies - 1``) such that, for every offset
``j`` in a copy, every copy's vertex ``j`` has the same layer-cost vector and every copy
has the same *records*: one per edge incident to the copy, holding the offset ``j`` of its
end inside the copy, its direction, its cost matrix and where its other end ``w`` lies:

- *relative*, ``w``'s id-order position minus the copy's first position, when ``w`` lies in
  this copy, the one before or the one after (``-size <= rel < 2 size``), whether or not that
  neighbouring range belongs to the run: the first copy may read a prefix vertex in the
  place of a previous copy's output (GPT's position embedding), the last copy feeds the
  suffix;
- *absolute*, ``w`` itself, otherwise: a *shared external* vertex that every copy reads
  identically (the Transformer decoder's cross-attention reads the encoder output in all
  six blocks).

Equal records make the copies interchangeable: copy ``c`` touches copy ``c - 1`` only
through the vertices at the *interface* offsets (those wired to the next copy), the first
copy touches the vertices ``previous`` in the same way, and no copy touches anything else
but the shared vertices. Matrices and cost vectors are compared exactly (codes interned by
object identity, then by content with ``numpy.array_equal``), never by hash alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BlockRun", "BlockSummary", "find_block_runs", "is_periodic", "describe_blocks"]


@dataclass(frozen=True)
class BlockSummary:
    """A short description of one run of blocks used by a search.

    Attributes
    ----------
    first : hashable
        Id of the first vertex of the first copy.
    size : int
        Vertices per copy.
    copies : int
        Copies solved by one block table.
    states : int
        Joint configurations of a copy's interface (the chain's state).
    shared : int
        Shared external vertices every copy reads.
    """

    first: object
    size: int
    copies: int
    states: int
    shared: int

    def __str__(self) -> str:
        shared = f", {self.shared} shared" if self.shared else ""
        return f"{self.copies} copies of {self.size} vertices from vertex {self.first!r} ({self.states} states{shared})"


@dataclass(frozen=True)
class BlockRun:
    """``copies`` equal copies of a block of ``size`` vertices, wired the same way.

    Attributes
    ----------
    vertices : tuple
        Vertex ids of the copies, copy after copy (``copies * size`` of them).
    size : int
        Vertices per copy.
    copies : int
        Number of copies (at least 2).
    interface : tuple of int
        Offsets, within a copy, of the vertices wired to the next copy (sorted).
    previous : tuple
        Ids of the vertices the first copy is wired to in the place of a previous copy's
        interface, one per interface offset, in the same order.
    following : tuple
        Ids of the vertices after the run that the last copy's interface is wired to.
    shared : tuple
        Ids of the shared external vertices, in id order.
    states : int
        ``prod(K)`` over the interface: configurations of the state passed between copies.
    """

    vertices: tuple
    size: int
    copies: int
    interface: tuple
    previous: tuple
    following: tuple
    shared: tuple
    states: int

    def copy(self, c: int) -> tuple:
        """Vertex ids of copy ``c`` (``0 <= c < copies``), in offset order."""
        return self.vertices[c * self.size:(c + 1) * self.size]

    def vertex(self, c: int, offset: int):
        """Id of the vertex at ``offset`` in copy ``c``."""
        return self.vertices[c * self.size + offset]

    @property
    def summary(self) -> BlockSummary:
        return BlockSummary(self.vertices[0], self.size, self.copies, self.states, len(self.shared))


def describe_blocks(summaries) -> str:
    """One line for a tuple of ``BlockSummary``: ``"none"`` or ``"2 runs: ...; ..."``."""
    if not summaries:
        return "none"
    runs = "1 run" if len(summaries) == 1 else f"{len(summaries)} runs"
    return f"{runs}: " + "; ".join(str(s) for s in summaries)


class _Codes:
    """Exact interning of arrays: equal content, equal code.

    Objects seen before are recognised by identity (the graph builder shares the matrices
    of repeated edges); new ones by a cheap fingerprint confirmed by ``array_equal``.
    """

    def __init__(self):
        self._by_id: dict = {}
        self._by_print: dict = {}
        self._arrays: list = []
        self._held: list = []  # keeps every object alive, so that ids stay unique

    def __call__(self, array) -> int:
        code = self._by_id.get(id(array))
        if code is not None:
            return code
        self._held.append(array)
        a = np.asarray(array)
        flat = a.reshape(-1)
        sample = flat[:: max(1, flat.size // 64)][:64]
        key = (a.shape, a.dtype.str, sample.tobytes())
        for code in self._by_print.get(key, ()):
            if np.array_equal(self._arrays[code], a):
                break
        else:
            code = len(self._arrays)
            self._arrays.append(a)
            self._by_print.setdefault(key, []).append(code)
        self._by_id[id(array)] = code
        return code


def find_block_runs(order, K: dict, costs: dict, edges, min_copies: int = 2) -> list:
    """Runs of identical, identically wired blocks, in a graph given as plain data.

    Parameters
    ----------
    order : sequence
        The vertex ids in id order.
    K : dict
        ``v -> `` number of configurations.
    costs : dict
        ``v -> `` layer-cost vector.
    edges : iterable
        ``(u, v, matrix)`` for every directed edge.
    min_copies : int
        Shortest run reported.

    Returns
    -------
    list of BlockRun
        Disjoint runs; no run's ``previous``, ``following`` or ``shared`` vertex lies inside
        another run. Deterministic: a function of ids, shapes and values only.

    Notes
    -----
    Candidates come from a period search over the id-ordered sequence of vertex
    signatures (cost vector and the multiset of incoming edge matrices; outgoing ones would
    set the last copy apart, whose outputs feed the suffix): for every period
    ``B`` the maximal stretches where ``sig[i] == sig[i + B]``. The longest are tried
    first; for each, the block boundary (phase) with the fewest interface configurations
    is chosen, and the copies are then checked exactly, record by record.

    Examples
    --------
    A path of five vertices with equal costs and equal matrices: vertices 1 to 4 are copies
    of a one-vertex block, each read by the one before it (vertex 0, which reads nothing, is the
    run's predecessor; the last copy has nothing after it).

    >>> import numpy as np
    >>> m = np.ones((2, 2))
    >>> runs = find_block_runs(range(5), dict.fromkeys(range(5), 2), dict.fromkeys(range(5), np.zeros(2)),
    ...                        [(i, i + 1, m) for i in range(4)])
    >>> [(r.vertices, r.previous, r.following) for r in runs]
    [((1, 2, 3, 4), (0,), ())]
    """
    order = list(order)
    n = len(order)
    if n < 3:
        return []
    position = {v: i for i, v in enumerate(order)}
    sig, incident = _signatures(order, position, costs, edges)
    Kpos = [int(K[v]) for v in order]
    compressed = np.zeros(n, dtype=bool)  # positions inside accepted runs
    referenced = np.zeros(n, dtype=bool)  # previous / following / shared vertices of accepted runs
    runs = []
    for _, B, a, length in _periodic_stretches(sig, min_copies):
        # Clip to the longest stretch not already taken.
        free = np.concatenate(([False], ~compressed[a:a + length], [False]))
        steps = np.diff(free.astype(np.int8))
        starts, ends = np.flatnonzero(steps == 1), np.flatnonzero(steps == -1)
        if starts.size == 0:
            continue
        k = int(np.argmax(ends - starts))
        a, length = a + int(starts[k]), int(ends[k] - starts[k])
        if length < min_copies * B:
            continue
        verified = _verify(a, length, B, incident, Kpos, min_copies)
        if verified is None:
            continue
        start, copies, interface, prev_pos, follow_pos, shared_pos = verified
        inside = slice(start, start + copies * B)
        outside = list(prev_pos) + list(follow_pos) + list(shared_pos)
        if referenced[inside].any() or compressed[outside].any():
            continue
        compressed[inside] = True
        referenced[outside] = True
        runs.append(BlockRun(
            vertices=tuple(order[start:start + copies * B]), size=B, copies=copies, interface=interface,
            previous=tuple(order[p] for p in prev_pos), following=tuple(order[p] for p in follow_pos),
            shared=tuple(order[p] for p in shared_pos),
            states=math.prod(Kpos[start + j] for j in interface),
        ))
    runs.sort(key=lambda r: position[r.vertices[0]])
    return runs


def _signatures(order: list, position: dict, costs: dict, edges) -> tuple:
    """``(sig, incident)``: per position a code of its cost vector and incoming edge matrices,
    and its incident edges ``(other position, 0 out / 1 in, matrix code)``."""
    cost_codes: dict = {}
    cost_code = []
    for v in order:
        c = np.asarray(costs[v])
        cost_code.append(cost_codes.setdefault((c.shape, c.dtype.str, c.tobytes()), len(cost_codes)))
    matrix_code = _Codes()
    incident = [[] for _ in range(len(order))]
    for u, v, m in edges:
        pu, pv, code = position[u], position[v], matrix_code(m)
        incident[pu].append((pv, 0, code))
        incident[pv].append((pu, 1, code))
    signatures: dict = {}
    sig = np.array([
        signatures.setdefault((cost_code[i], tuple(sorted(c for _, d, c in incident[i] if d == 1))), len(signatures))
        for i in range(len(order))
    ])
    return sig, incident


def _periodic_stretches(sig: np.ndarray, min_copies: int) -> list:
    """Candidate runs ``(-covered, period, start, length)``: for every period ``B`` the maximal
    stretches where ``sig[i] == sig[i + B]`` over at least ``min_copies`` copies, longest
    coverage first."""
    n = len(sig)
    candidates = []
    for B in range(1, n // min_copies + 1):
        equal = np.concatenate(([False], sig[B:] == sig[:-B], [False]))
        steps = np.diff(equal.astype(np.int8))
        starts, ends = np.flatnonzero(steps == 1), np.flatnonzero(steps == -1)
        lengths = ends - starts + B
        for a, length in zip(starts[lengths >= min_copies * B], lengths[lengths >= min_copies * B]):
            candidates.append((-(int(length) // B) * B, B, int(a), int(length)))
    candidates.sort()
    return candidates


def _records(base: int, B: int, incident) -> tuple:
    """The records of the copy starting at ``base`` (module docstring), sorted."""
    out = []
    for j in range(B):
        for p, direction, code in incident[base + j]:
            rel = p - base
            if -B <= rel < 2 * B:
                out.append((j, 0, rel, direction, code))
            else:
                out.append((j, 1, p, direction, code))
    out.sort()
    return tuple(out)


def _verify(a: int, length: int, B: int, incident, Kpos, min_copies: int):
    """The longest run of exactly equal copies in a periodic stretch, or ``None``.

    Returns ``(start, copies, interface offsets, previous positions, following positions,
    shared positions)``.
    """
    # Phase: where a copy starts. Prefer the cut with the fewest interface states (the
    # chain's table is states x states), then more copies, then the earliest.
    best = None
    for phase in range(B):
        copies = (length - phase) // B
        if copies < min_copies:
            continue
        base = a + phase + (copies // 2) * B  # a copy in the middle of the stretch
        out = {j for j in range(B) for p, _, _ in incident[base + j] if base + B <= p < base + 2 * B}
        states = math.prod(Kpos[base + j] for j in out) if out else 0
        key = (states == 0, states, -copies, phase)
        if best is None or key < best[0]:
            best = (key, phase, copies)
    if best is None:
        return None
    _, phase, copies = best
    records = [_records(a + phase + k * B, B, incident) for k in range(copies)]
    # Copies are compared without their edges into the next copy's range: those are the
    # previous-copy edges of the next copy (compared there), except for the last copy,
    # whose edges to the vertices after the run become edges of the chain's last link.
    keys = [tuple(r for r in rec if not (r[1] == 0 and r[2] >= B)) for rec in records]
    top = (0, 0)
    k = 0
    while k < copies:
        e = k + 1
        while e < copies and keys[e] == keys[k]:
            e += 1
        if e - k > top[1] - top[0]:  # the longest stretch, the earliest on ties
            top = (k, e)
        k = e
    first, end = top
    n = end - first
    if n < min_copies:
        return None
    start = a + phase + first * B
    rec = records[first]
    interface = tuple(sorted({j for j, kind, rel, _, _ in rec if kind == 0 and rel >= B}))
    previous = sorted({rel for _, kind, rel, _, _ in rec if kind == 0 and rel < 0})
    if not interface or tuple(rel + B for rel in previous) != interface:
        return None  # copies not chained through an interface: not handled
    shared = tuple(sorted({p for _, kind, p, _, _ in rec if kind == 1}))
    if any(start <= p < start + n * B for p in shared):
        return None
    last = records[first + n - 1]
    if any(kind == 0 and rel >= B and j not in interface for j, kind, rel, _, _ in last):
        n -= 1  # the last copy feeds the suffix from outside the interface: leave it out
        if n < min_copies:
            return None
        last = records[first + n - 1]
    base = start + (n - 1) * B
    following = tuple(sorted({base + rel for _, kind, rel, _, _ in last if kind == 0 and rel >= B}))
    return start, n, interface, tuple(start + rel for rel in previous), following, shared


def is_periodic(run: BlockRun, costs: dict) -> bool:
    """Whether ``costs`` gives every copy of ``run`` the same layer-cost vectors."""
    for j in range(run.size):
        ref = np.asarray(costs[run.vertices[j]])
        for c in range(1, run.copies):
            other = costs[run.vertices[c * run.size + j]]
            if other is not ref and not np.array_equal(ref, other):
                return False
    return True
