"""Measured NCCL bus bandwidths by collective, group and message size: the ``collectives`` field
of a machine description, checked, and the seconds of a collective read from it.

Bus bandwidth is nccl-tests' (``PERFORMANCE.md`` of NVIDIA/nccl-tests): for ``n`` bytes per
device over ``q`` devices taking ``t`` seconds, ``busbw = f(q) n / t`` with ``f = 2 (q-1)/q`` for an
all-reduce and ``(q-1)/q`` for an all-gather, a reduce-scatter and an all-to-all. It is the rate
each device's link must sustain, comparable across group sizes, so ``t = f(q) n / busbw``.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from pase.core.checks import is_int, is_number

__all__ = ["COLLECTIVE_KINDS", "bus_factor", "validate_collectives", "CollectiveTables", "MAX_FALL_SLOPE",
           "share_floor"]

#: The collectives a table may hold, as nccl-tests names them (``all_reduce_perf``, ...;
#: ``send_recv``: ``sendrecv_perf``, each rank sending to one peer and receiving from another,
#: as a pipeline stage hands its activations on).
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
#: Largest message of a row (bytes) and fastest bus (GB/s): far beyond any machine, finite costs.
MAX_BYTES = 1e15
BUS_GBPS_RANGE = (1e-6, 1e9)
#: Most ranks in a row (the command line's largest device count).
MAX_RANKS = 2**20
#: Beyond the most nodes measured, bus bandwidth keeps falling as it fell over the last measured
#: doubling (a power of the node count), at most as ``1 / nodes`` (this slope, -1: the time
#: grows with the node count, the pace of a ring's latency-bound steps) and never rising.
MAX_FALL_SLOPE = -1.0


def bus_factor(kind: str, q):
    """nccl-tests' bus factor: ``busbw = bus_factor * n / t``; 1 for ``send_recv`` (its bus
    bandwidth is its algorithm bandwidth).

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 4), bus_factor("send_recv", 2)
    (1.75, 0.75, 1.0)
    """
    q = np.asarray(q, dtype=np.float64)
    f = (q - 1.0) / q
    out = 2.0 * f if kind == "all_reduce" else np.ones_like(q) if kind == "send_recv" else f
    return float(out) if out.ndim == 0 else out


def share_floor(kind: str, n, q, q_out, b_out: float) -> np.ndarray:
    """Seconds the bytes a group of ``q`` devices on ``q_out`` nodes sends across nodes take on
    its members' share of the network (``b_out`` bytes/s a GPU, ``inter_node.gbps``): ``q_in =
    q / q_out`` members on a node send over ``q_in`` GPUs' shares while the node's other groups
    send theirs, so a curve measured with more ranks a node (whole nodes, whose ring sends a
    node's bytes over all its shares) does not price a group with fewer beyond that. The links'
    own across-node term without its latency: ``2 (q_out-1)/q_out (n/q_in) / b_out`` for an
    all-reduce, half for an all-gather or a reduce-scatter, ``(q-q_in)/q n / b_out`` for an
    all-to-all, ``n / b_out`` for a send; 0 inside a node.

    >>> round(float(share_floor("all_reduce", 1e9, 24, 24, 25e9)) * 1e3, 3)   # 2 x 23/24 x 1 GB / 25 GB/s
    76.667
    >>> round(float(share_floor("all_gather", 1e9, 32, 4, 25e9)) * 1e3, 3)    # 3/4 x (1 GB / 8) / 25 GB/s
    3.75
    """
    n, q, q_out = (np.asarray(a, dtype=np.float64) for a in (n, q, q_out))
    q_in = q / np.maximum(q_out, 1.0)
    if kind == "send_recv":
        across = n / b_out
    elif kind == "all_to_all":
        across = (q - q_in) / q * n / b_out
    else:
        across = (2.0 if kind == "all_reduce" else 1.0) * (q_out - 1.0) / np.maximum(q_out, 1.0) * (n / q_in) / b_out
    return np.where((q_out > 1) & (n > 0), across, 0.0)


def validate_collectives(data, devices_per_node: int, source: str) -> dict:
    """Check a description's ``collectives`` and return a clean copy, rows sorted.

    ``{"all_reduce": [[ranks, nodes, bytes, bus_gbps], ...], ...}``: each kind of
    :data:`COLLECTIVE_KINDS` optional; a row measured over ``ranks`` devices, ``ranks / nodes``
    on each of ``nodes`` nodes, ``bytes`` per device (nccl-tests' size), ``bus_gbps`` GB/s of bus
    bandwidth. A ``ValueError`` names the bad field in one line.

    >>> validate_collectives({"all_reduce": [[8, 1, 1e6, 0]]}, 8, "machine file m.json")
    Traceback (most recent call last):
    ...
    ValueError: machine file m.json: collectives.all_reduce[0]: bus_gbps must be a positive number, got 0
    """
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{source}: collectives must be a non-empty object of tables "
                         f"({', '.join(COLLECTIVE_KINDS)}), got {data!r:.60}")
    out = {}
    for kind, rows in data.items():
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"{source}: unknown collective {kind!r} (collectives: {', '.join(COLLECTIVE_KINDS)})")
        where = f"{source}: collectives.{kind}"
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"{where} must be a non-empty list of [ranks, nodes, bytes, bus_gbps] rows")
        seen = set()
        clean = []
        for i, row in enumerate(rows):
            clean.append(_checked_row(row, f"{where}[{i}]", devices_per_node, seen))
        out[kind] = sorted(clean, key=lambda r: (r[0], r[1], r[2]))
    return out


def _checked_row(row, at: str, devices_per_node: int, seen: set) -> list:
    """One ``[ranks, nodes, bytes, bus_gbps]`` row, checked (``seen``: the groups and sizes so far)."""
    if not isinstance(row, list) or len(row) != 4:
        raise ValueError(f"{at} must be [ranks, nodes, bytes, bus_gbps], got {row!r:.60}")
    ranks, nodes, size, gbps = row
    if not is_int(ranks) or not 2 <= ranks <= MAX_RANKS:
        raise ValueError(f"{at}: ranks must be an integer from 2 to {MAX_RANKS}, got {ranks!r:.30}")
    if not is_int(nodes) or not 1 <= nodes <= ranks or ranks % nodes:
        raise ValueError(f"{at}: nodes must be a positive integer dividing ranks {ranks}, got {nodes!r:.30}")
    if ranks // nodes > devices_per_node:
        raise ValueError(f"{at}: {ranks} ranks on {nodes} node(s) is more than devices_per_node "
                         f"{devices_per_node} on a node")
    if not is_number(size) or not math.isfinite(size) or not 1 <= size <= MAX_BYTES:
        raise ValueError(f"{at}: bytes must be a number from 1 to {MAX_BYTES:g}, got {size!r:.30}")
    if not is_number(gbps) or not math.isfinite(gbps) or gbps <= 0:
        raise ValueError(f"{at}: bus_gbps must be a positive number, got {gbps!r:.30}")
    if not BUS_GBPS_RANGE[0] <= gbps <= BUS_GBPS_RANGE[1]:
        raise ValueError(f"{at}: bus_gbps must be from {BUS_GBPS_RANGE[0]:g} to {BUS_GBPS_RANGE[1]:g}, "
                         f"got {gbps!r:.30}")
    key = (ranks, nodes, float(size))
    if key in seen:
        raise ValueError(f"{at}: a second row for {ranks} ranks on {nodes} node(s) at {size:g} bytes")
    seen.add(key)
    return [ranks, nodes, size, gbps]


class _Curve:
    """One group's bus bandwidth against message size.

    Inside the measured sizes, ``log busbw`` is linear in ``log n`` between neighbours; above
    them, the largest message's bandwidth; below them, the straight line ``t = alpha + beta n``
    through the two smallest (a latency and a rate, ``beta`` clamped to ``[0, t_0 / s_0]`` so
    that ``alpha >= 0``). One size alone: ``alpha`` is ``latency`` (the links' latency of the
    group, at most ``t_0``) and the line goes through the measured point.
    """

    def __init__(self, factor: float, sizes, gbps, latency: float = 0.0):
        self.factor = factor
        self.log_sizes = np.log(np.asarray(sizes, dtype=np.float64))
        self.log_bus = np.log(np.asarray(gbps, dtype=np.float64) * 1e9)
        s0 = float(sizes[0])
        t0 = factor * s0 / (float(gbps[0]) * 1e9)
        if len(sizes) > 1:
            t1 = factor * float(sizes[1]) / (float(gbps[1]) * 1e9)
            beta = min(max((t1 - t0) / (float(sizes[1]) - s0), 0.0), t0 / s0)
        else:
            beta = (t0 - min(max(latency, 0.0), t0)) / s0
        self.s0, self.alpha, self.beta = s0, t0 - beta * s0, beta

    def seconds(self, n: np.ndarray) -> np.ndarray:
        safe = np.maximum(n, self.s0)
        bus = np.exp(np.interp(np.log(safe), self.log_sizes, self.log_bus))
        return np.where(n < self.s0, self.alpha + self.beta * n, self.factor * safe / bus)

    def log_bus_at(self, n: np.ndarray) -> np.ndarray:
        """``log`` of the bus bandwidth (bytes/s) the curve gives ``n > 0`` bytes."""
        return np.log(self.factor * n) - np.log(self.seconds(n))


class CollectiveTables:
    """A machine's measured collectives (:func:`validate_collectives`): seconds by group.

    A group of ``q`` devices, ``q_in`` on each of ``q_out`` nodes, reads the curves measured on
    the same side (one node, or several). Inside a node, ``log busbw`` is interpolated linearly
    in ``log2 ranks`` between the measured groups (held beyond them). Across nodes, each
    measured node count gives the curve with the nearest ``ranks / nodes`` (ties to the larger),
    and ``log busbw`` is interpolated linearly in ``log2 nodes`` between them; below the fewest
    nodes measured it is held, beyond the most it keeps falling at the slope of the last two
    (clamped to ``[MAX_FALL_SLOPE, 0]``: :data:`MAX_FALL_SLOPE`). A group with no curve on its
    side gets ``NaN``: the caller prices it otherwise. ``latency(kind, ranks, nodes)``: the
    fixed part of a curve measured at one size only (default none).

    >>> t = CollectiveTables({"all_reduce": [[8, 1, 1e9, 350]]})
    >>> round(float(t.seconds("all_reduce", 1e9, 8, 1)), 12)   # 2 * 7/8 * 1e9 B / 350 GB/s
    0.005
    """

    def __init__(self, table: Mapping, latency=None):
        self.kinds = tuple(k for k in COLLECTIVE_KINDS if k in table)
        self._groups = {}
        self._curves = {}
        for kind in self.kinds:
            by_group = {}
            for ranks, nodes, size, gbps in table[kind]:
                by_group.setdefault((ranks, nodes), []).append((size, gbps))
            self._groups[kind] = sorted(by_group)
            for (ranks, nodes), rows in by_group.items():
                rows.sort()
                fixed = float(latency(kind, ranks, nodes)) if latency is not None and len(rows) == 1 else 0.0
                self._curves[kind, ranks, nodes] = _Curve(
                    bus_factor(kind, ranks), [r[0] for r in rows], [r[1] for r in rows], fixed)

    def curves_for(self, kind: str, q: float, q_out: float) -> list:
        """``[(coordinate, (ranks, nodes)), ...]`` of the curves that price a group of ``q``
        devices on ``q_out`` nodes, by their ``log2`` coordinate (ranks in a node, nodes across
        them), or ``[]`` when the table has none on that side.

        >>> t = CollectiveTables({"all_reduce": [[2, 1, 1e6, 1], [8, 1, 1e6, 1], [16, 2, 1e6, 1], [2, 2, 1e6, 1]]})
        >>> t.curves_for("all_reduce", 4, 1), t.curves_for("all_reduce", 64, 8), t.curves_for("all_to_all", 4, 1)
        ([(1.0, (2, 1)), (3.0, (8, 1))], [(1.0, (16, 2))], [])
        """
        if kind not in self._groups:
            return []
        if q_out <= 1:
            return [(math.log2(r), (r, n)) for r, n in self._groups[kind] if n == 1]
        per_node = math.log2(q / q_out)
        best: dict = {}
        for r, n in self._groups[kind]:
            if n > 1:
                key = (abs(math.log2(r / n) - per_node), -r)
                if n not in best or key < best[n][0]:
                    best[n] = (key, (r, n))
        return [(math.log2(n), best[n][1]) for n in sorted(best)]

    def _log_bus(self, kind: str, n: np.ndarray, q: float, q_out: float, found: list) -> np.ndarray | None:
        """``log busbw`` of ``n`` bytes over the group, interpolated between the curves ``found``
        for it (:meth:`curves_for`), or ``None`` where there are none."""
        if not found:
            return None
        x = math.log2(q_out) if q_out > 1 else math.log2(q)
        xs = [c for c, _ in found]
        values = [self._curves[(kind, *group)].log_bus_at(n) for _, group in found]
        if len(found) == 1 or x <= xs[0]:
            return values[0]
        if x >= xs[-1]:
            if q_out <= 1 or x == xs[-1]:
                return values[-1]
            slope = np.clip((values[-1] - values[-2]) / ((xs[-1] - xs[-2]) * math.log(2.0)), MAX_FALL_SLOPE, 0.0)
            return values[-1] + slope * (x - xs[-1]) * math.log(2.0)
        j = next(i for i in range(1, len(xs)) if xs[i] >= x)
        w = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
        return (1.0 - w) * values[j - 1] + w * values[j]

    def seconds(self, kind: str, n, q, q_out, share: float | None = None) -> np.ndarray:
        """Seconds of collective ``kind`` of ``n`` bytes per device over groups of ``q``
        devices on ``q_out`` nodes (broadcasting arrays): ``bus_factor(kind, q) * n / busbw``,
        ``busbw`` interpolated at ``n`` and at the group's span (bus bandwidth does not depend
        on the group's size through the bus factor, so a curve measured on another size keeps
        its bandwidth). ``NaN`` where no curve is on the group's side; 0 where ``q <= 1`` or
        ``n <= 0``. ``share`` (bytes/s, a GPU's share of what a node sends): where every curve
        read was measured with more ranks a node than the group has, never below
        :func:`share_floor`.

        >>> t = CollectiveTables({"all_gather": [[16, 2, 1e8, 200], [64, 8, 1e8, 50]]})
        >>> round(float(t.seconds("all_gather", 1e8, 32, 4)) * 1e6, 1)   # 100 GB/s halfway: 31/32 x 1 ms
        968.8
        >>> round(float(t.seconds("all_gather", 1e8, 128, 16)) * 1e6)   # the fall of 2 -> 8 goes on: 25 GB/s
        3969
        >>> t = CollectiveTables({"all_reduce": [[16, 2, 1e9, 4]]})     # whole nodes: 8 a node
        >>> [round(float(t.seconds("all_reduce", 1e9, g, 2, share=0.5e9)), 4) for g in (16, 2)]   # 1 a node: 2 (1/2) 1e9 / 0.5e9
        [0.4688, 2.0]
        """
        n, q, q_out = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in (n, q, q_out)])
        out = np.zeros(n.shape)
        live = (q > 1) & (n > 0)
        if not live.any():
            return out
        pairs = np.unique(np.stack([q[live], q_out[live]], axis=1), axis=0)
        for gq, gout in pairs:
            at = live & (q == gq) & (q_out == gout)
            found = self.curves_for(kind, float(gq), float(gout))
            log_bus = self._log_bus(kind, n[at], float(gq), float(gout), found)
            if log_bus is None:
                out[at] = np.nan
                continue
            out[at] = bus_factor(kind, gq) * n[at] / np.exp(log_bus)
            if share is not None and gq / gout < min(r / nodes for _, (r, nodes) in found):
                out[at] = np.maximum(out[at], share_floor(kind, n[at], gq, gout, share))
        return out


# ---------------------------------------------------------------------------------------
# Defaults from published figures (the ``h100-sxm-nccl`` preset)

#: All-reduce bus bandwidth of 8 H100 SXM GPUs in one node (NVLink 4 through NVSwitch) at large
#: messages, GB/s: approximately 450-480 as commonly reported for nccl-tests ``all_reduce_perf``
#: on DGX/HGX H100 (the top with NVLink SHARP); the low end, which is also NVLink 4's 450 GB/s
#: per direction per GPU (DGX H100 User Guide: 18 links, 900 GB/s bidirectional).
H100_NVLINK_BUS_GBPS = 450.0
#: All-reduce bus bandwidth across nodes per GPU's own NIC, GB/s: DGX H100 has eight 400 Gb/s
#: ConnectX-7 ports for the compute fabric, one per GPU (DGX H100 User Guide), a 50 GB/s line
#: rate each; NCCL over InfiniBand NDR reaches about 40-48 GB/s of it, approximately, as
#: commonly reported; the low end.
NDR400_BUS_GBPS_PER_GPU = 40.0
#: Message sizes of the default curves (bytes): 1 MB to 1 GB by 4x, as ``pase calibrate``.
DEFAULT_SIZES = tuple(10**6 * 4**i for i in range(6))


def published_all_reduce(devices_per_node: int = 8, intra_latency_us: float = 3.0,
                         inter_latency_us: float = 10.0) -> list:
    """All-reduce rows ``[ranks, nodes, bytes, bus_gbps]`` from the published large-message
    bus bandwidths, falling off at small messages by the links' latencies.

    A group of ``q_in`` GPUs on each of ``q_out`` nodes: NCCL's rings cross the nodes on one NIC
    per GPU of the group, so its large-message bus bandwidth is ``q_in`` times
    :data:`NDR400_BUS_GBPS_PER_GPU`, at most :data:`H100_NVLINK_BUS_GBPS`; inside a node that
    NVLink figure. Time ``t = 2 (q_in-1) a_in + 2 (q_out-1) a_out + 2 (q-1)/q n / busbw``
    (the latencies of ``docs/machines.md``), ``bus_gbps = 2 (q-1)/q n / t``, rounded to 0.01.
    Groups: 2, 4, 8 in a node; 1, 2, 4, 8 per node on 2, 8 and 64 nodes; 1 MB to 1 GB by 4x.

    >>> rows = published_all_reduce()
    >>> rows[0], len(rows)   # 2 ranks, 1 MB: t = 2 * 3 us + 1e6 / 450e9 = 8.222 us
    ([2, 1, 1000000, 121.62], 90)
    """
    groups = [(q, 1) for q in (2, 4, 8)]
    groups += [(q_in * nodes, nodes) for nodes in (2, 8, 64) for q_in in (1, 2, 4, 8)]
    rows = []
    for ranks, nodes in groups:
        q_in = ranks // nodes
        if q_in > devices_per_node:
            continue
        bus = H100_NVLINK_BUS_GBPS if nodes == 1 else min(q_in * NDR400_BUS_GBPS_PER_GPU, H100_NVLINK_BUS_GBPS)
        latency = (2 * (q_in - 1) * intra_latency_us + 2 * (nodes - 1) * inter_latency_us) * 1e-6
        factor = bus_factor("all_reduce", ranks)
        for size in DEFAULT_SIZES:
            seconds = latency + factor * size / (bus * 1e9)
            rows.append([ranks, nodes, size, round(factor * size / seconds / 1e9, 2)])
    return rows
