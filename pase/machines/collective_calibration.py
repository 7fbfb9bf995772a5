"""Measure NCCL collectives on this node's GPUs (or across nodes under ``torchrun``) and write
their bus bandwidths into a machine description's ``collectives`` (``pase calibrate --collectives``).

The measuring loop (:func:`measure_collectives`) takes any timer, a callable
``timer(kind, ranks, nodes, bytes) -> seconds``, so tests give it a fake one. The torch timer
(:class:`TorchCollectiveTimer`) runs in every rank, one process per GPU: the same loop in the
same order on each, every measurement ended by a world-wide maximum so all ranks agree.
PyTorch is imported only when measuring.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Callable

from pase.core.fileio import read_json, write_atomic
from pase.core.optional import import_optional
from pase.machines.calibrated import validate_description
from pase.machines.collectives import BUS_GBPS_RANGE, COLLECTIVE_KINDS, bus_factor

__all__ = ["collective_groups", "collective_sizes", "group_members", "measure_collectives",
           "calibrate_collectives", "TorchCollectiveTimer", "torchrun_world", "COLLECTIVES_HINT"]

COLLECTIVES_HINT = "pase calibrate --collectives needs PyTorch with torch.distributed: pip install '.[torch]'"
#: bf16: bytes per element of every measured buffer.
ELEMENT_BYTES = 2
#: Untimed and timed iterations of each measurement (nccl-tests' defaults are 5 and 20).
WARMUP, ITERATIONS = 5, 20


def _powers_of_two_to(limit: int, start: int) -> list:
    out, v = [], start
    while v <= limit:
        out.append(v)
        v *= 2
    return out + ([limit] if limit >= start and limit not in out else [])


def collective_groups(local_devices: int, nodes: int = 1) -> list:
    """The ``(ranks, nodes)`` groups to measure on ``nodes`` nodes of ``local_devices`` GPUs.

    Inside a node: 2, 4, 8, ... up to ``local_devices`` (and itself). Across nodes, only when
    ``nodes > 1``: on 2, 4, 8, ... up to ``nodes`` nodes (and itself), 1, 2, 4, ... up to
    ``local_devices`` GPUs on each.

    >>> collective_groups(8)
    [(2, 1), (4, 1), (8, 1)]
    >>> collective_groups(2, nodes=2)
    [(2, 1), (2, 2), (4, 2)]
    """
    groups = [(q, 1) for q in _powers_of_two_to(local_devices, 2)]
    if nodes > 1:
        groups += [(q_in * m, m) for m in _powers_of_two_to(nodes, 2) for q_in in _powers_of_two_to(local_devices, 1)]
    return groups


def collective_sizes(quick: bool = False) -> list:
    """Message sizes in bytes per device: 1 MB to 1 GB by 2x (quick: by 4x).

    >>> collective_sizes()[:3], len(collective_sizes()), collective_sizes(quick=True)[-1]
    ([1000000, 2000000, 4000000], 11, 1024000000)
    """
    return [10**6 * 2**i for i in range(11)] if not quick else [10**6 * 4**i for i in range(6)]


def group_members(ranks: int, nodes: int, local_devices: int) -> list:
    """Global ranks of a group: the first ``ranks / nodes`` GPUs of each of the first ``nodes``
    nodes (global rank ``node * local_devices + local rank``, as torchrun numbers them).

    >>> group_members(4, 2, 8)
    [0, 1, 8, 9]
    """
    per_node = ranks // nodes
    return [node * local_devices + i for node in range(nodes) for i in range(per_node)]


def measure_collectives(timer: Callable, groups, sizes, kinds=COLLECTIVE_KINDS,
                        progress: Callable[[int, int], None] | None = None) -> dict:
    """The ``collectives`` table: ``{kind: [[ranks, nodes, bytes, bus_gbps], ...]}``.

    ``timer(kind, ranks, nodes, bytes)`` returns the seconds of one collective of ``bytes``
    per device (nccl-tests' size: the all-gather's output, the reduce-scatter's input) over
    the group; ``bus_gbps = bus_factor(kind, ranks) * bytes / seconds / 1e9``, to 4 significant
    digits.

    >>> measure_collectives(lambda kind, q, m, n: n / 1e11, [(4, 1)], [10**6], ["all_reduce"])
    {'all_reduce': [[4, 1, 1000000, 150.0]]}
    """
    work = [(kind, ranks, nodes, size) for kind in kinds for ranks, nodes in groups for size in sizes]
    table = {kind: [] for kind in kinds}
    for i, (kind, ranks, nodes, size) in enumerate(work):
        seconds = float(timer(kind, ranks, nodes, size))
        if not seconds > 0:
            raise RuntimeError(f"the {kind} of {size} bytes over {ranks} ranks on {nodes} node(s) "
                               f"took {seconds!r} seconds")
        bus = bus_factor(kind, ranks) * size / seconds / 1e9
        table[kind].append([ranks, nodes, size, max(BUS_GBPS_RANGE[0], float(f"{bus:.4g}"))])
        if progress is not None:
            progress(i + 1, len(work))
    return table


# ---------------------------------------------------------------------------------------
# Measuring with torch.distributed


class TorchCollectiveTimer:
    """Times NCCL collectives in this rank of an initialised default process group.

    Members of the measured group run ``WARMUP`` then ``ITERATIONS`` collectives on bf16
    buffers between two barriers; every rank then takes the world's maximum of the mean
    time (non-members give 0), so every rank returns the same seconds. ``device`` is the
    rank's GPU (``"cpu"`` with the gloo backend, for tests).
    """

    def __init__(self, torch, local_devices: int, device):
        self.torch = torch
        self.dist = torch.distributed
        self.rank = self.dist.get_rank()
        self.local_devices = local_devices
        self.device = device
        self._groups = {}

    def _group(self, members: list):
        # new_group must be called by every rank, in the same order: the loop is the same in each.
        key = tuple(members)
        if key not in self._groups:
            self._groups[key] = self.dist.new_group(list(members))
        return self._groups[key]

    def _sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def _operation(self, kind: str, ranks: int, size: int, group) -> Callable[[], None]:
        torch, dist = self.torch, self.dist
        elements = max(ranks, size // (ELEMENT_BYTES * ranks) * ranks)
        opts = dict(device=self.device, dtype=torch.bfloat16)
        if kind == "all_reduce":
            buffer = torch.ones(elements, **opts)
            return lambda: dist.all_reduce(buffer, group=group)
        if kind == "all_gather":  # size: the gathered output
            shard, full = torch.ones(elements // ranks, **opts), torch.empty(elements, **opts)
            return lambda: dist.all_gather_into_tensor(full, shard, group=group)
        if kind == "reduce_scatter":  # size: the input
            full, shard = torch.ones(elements, **opts), torch.empty(elements // ranks, **opts)
            return lambda: dist.reduce_scatter_tensor(shard, full, group=group)
        source, target = torch.ones(elements, **opts), torch.empty(elements, **opts)
        if kind == "send_recv":  # a pipeline's hand-over: member j with member j + q/2 (the next stage)
            return self._send_recv(group, source, target)
        return lambda: dist.all_to_all_single(target, source, group=group)

    def _send_recv(self, group, source, target) -> Callable[[], None]:
        """Each member sends ``source`` to its partner half the group away and receives ``target``
        from it (stage ``k``'s device ``j`` and stage ``k+1``'s device ``j``), both posted at once."""
        dist = self.dist
        members = dist.get_process_group_ranks(group)
        j = members.index(self.rank)
        partner = members[(j + len(members) // 2) % len(members)]

        def run():
            ops = [dist.P2POp(dist.isend, source, partner, group=group),
                   dist.P2POp(dist.irecv, target, partner, group=group)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        return run

    def __call__(self, kind: str, ranks: int, nodes: int, size: int) -> float:
        torch, dist = self.torch, self.dist
        members = group_members(ranks, nodes, self.local_devices)
        group = self._group(members)
        seconds = 0.0
        if self.rank in members:
            operation = self._operation(kind, ranks, size, group)
            for _ in range(WARMUP):
                operation()
            self._sync()
            dist.barrier(group=group)
            start = time.perf_counter()
            for _ in range(ITERATIONS):
                operation()
            self._sync()
            seconds = (time.perf_counter() - start) / ITERATIONS
            del operation
        slowest = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest.item())


def torchrun_world(environ=None):
    """``(rank, world_size, local_rank, local_world_size)`` when started by ``torchrun``
    (its environment variables set), else ``None``.

    >>> torchrun_world({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8"})
    (9, 16, 1, 8)
    >>> torchrun_world({}) is None
    True
    """
    env = os.environ if environ is None else environ
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if not all(name in env for name in names):
        return None
    try:
        values = tuple(int(env[name]) for name in names)
    except ValueError:
        raise ValueError("torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers") from None
    rank, world, local_rank, local_world = values
    if not (0 <= rank < world and 0 <= local_rank < local_world <= world and world % local_world == 0):
        raise ValueError(f"inconsistent torchrun environment: RANK {rank}, WORLD_SIZE {world}, "
                         f"LOCAL_RANK {local_rank}, LOCAL_WORLD_SIZE {local_world}")
    return values


def _rank_main(rank: int, world: int, local_world: int, backend: str, init_method: str | None, sizes,
               kinds, result_path: str | None):
    """One rank: join the process group, measure, and (rank 0) write the table to ``result_path``."""
    torch = import_optional("torch", missing=lambda: ImportError(COLLECTIVES_HINT))
    dist = torch.distributed
    local_rank = rank % local_world
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = "cpu"
    kwargs = {"init_method": init_method} if init_method else {}
    dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
    try:
        timer = TorchCollectiveTimer(torch, local_world, device)
        table = measure_collectives(timer, collective_groups(local_world, world // local_world),
                                    sizes, kinds)
        if rank == 0 and result_path is not None:
            with open(result_path, "w") as f:
                json.dump(table, f)
        return table
    finally:
        dist.destroy_process_group()


def _spawned(local_rank, world, backend, init_method, sizes, kinds, result_path):
    _rank_main(local_rank, world, world, backend, init_method, sizes, kinds, result_path)


def _measure_with_torch(sizes, kinds, processes: int | None, backend: str = "nccl") -> tuple:
    """``(table, note, writer)``: measured under torchrun, else by spawning one process per local
    GPU (``processes`` of them; CPU processes on gloo when ``backend`` is ``"gloo"``).
    ``writer`` is false on torchrun's ranks other than 0."""
    torch = import_optional("torch", "torch.distributed", missing=lambda: ImportError(COLLECTIVES_HINT))
    launched = torchrun_world()
    if launched is not None:
        rank, world, _, local_world = launched
        table = _rank_main(rank, world, local_world, backend, "env://", sizes, kinds, None)
        nodes = world // local_world
        where = (f"{local_world} GPUs on each of {nodes} nodes (torchrun)" if nodes > 1
                 else f"{local_world} GPUs of one node (torchrun); across nodes not measured")
        return table, where, rank == 0
    if processes is None:
        if backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError("pase calibrate --collectives needs CUDA GPUs, and PyTorch sees none on this machine")
        processes = torch.cuda.device_count()
    if processes < 2:
        raise RuntimeError(f"pase calibrate --collectives needs at least 2 GPUs on this node, found {processes}")
    with tempfile.TemporaryDirectory(prefix="pase-collectives-") as folder:
        result = os.path.join(folder, "table.json")
        rendezvous = "file://" + os.path.join(folder, "rendezvous")
        try:
            torch.multiprocessing.spawn(_spawned, args=(processes, backend, rendezvous, list(sizes), tuple(kinds),
                                                        result), nprocs=processes, join=True)
        except Exception as e:  # a rank failed: its traceback's last line, the error itself
            lines = str(e).strip().splitlines()
            raise RuntimeError(f"measuring the collectives failed: {lines[-1] if lines else type(e).__name__}") from None
        with open(result) as f:
            table = json.load(f)
    where = (f"{processes} GPUs of one node; across nodes not measured "
             "(run under torchrun on several nodes for that)")
    return table, where, True


def calibrate_collectives(path: str, quick: bool = False, *, timer: Callable | None = None, nodes: int = 1,
                          kinds=COLLECTIVE_KINDS, progress: Callable[[int, int], None] | None = None,
                          processes: int | None = None, backend: str = "nccl") -> tuple:
    """Measure the collectives and write them into the machine description ``path``.

    ``path`` must be a description already (``pase calibrate --out``, or written by hand);
    its ``collectives`` is replaced and every other field kept. Returns ``(description,
    where)`` (``where``: which groups were measured, in words), or ``(None, where)`` on a
    torchrun rank other than 0, which writes nothing.

    Parameters
    ----------
    timer : callable, optional
        ``timer(kind, ranks, nodes, bytes) -> seconds`` (tests); it is given the groups of
        :func:`collective_groups` for the description's ``devices_per_node`` on ``nodes``
        nodes. Default: torch.distributed with NCCL on this node's GPUs, or across nodes
        when started by torchrun.
    processes, backend
        The spawned ranks and their backend (default: every local GPU, NCCL).
    """
    path = os.fspath(path)
    label = f"machine file {os.path.basename(path)}"
    launched = torchrun_world() if timer is None else None
    if launched is not None and launched[0] != 0:  # only rank 0 writes: other nodes need no file
        _, where, _ = _measure_with_torch(collective_sizes(quick), kinds, processes, backend)
        return None, where
    if not os.path.isfile(path):
        raise ValueError(f"{label}: no such machine description {path} (pase calibrate --out {path} writes one; "
                         "--collectives adds to it)")
    description = validate_description(read_json(path, "machine file", stdin=False), label)
    g = description["devices_per_node"]
    if timer is not None:
        table = measure_collectives(timer, collective_groups(g, nodes), collective_sizes(quick), kinds, progress)
        where = (f"{g} GPUs on each of {nodes} nodes" if nodes > 1
                 else f"{g} GPUs of one node; across nodes not measured")
        writer = True
    else:
        table, where, writer = _measure_with_torch(collective_sizes(quick), kinds, processes, backend)
    if not writer:
        return None, where
    description = dict(description, collectives=table)
    note = f"collectives measured by pase calibrate --collectives{' --quick' if quick else ''} ({where})"
    kept = [part for part in description.get("notes", "").split("; ")
            if part and not part.startswith("collectives measured by")]  # a new run replaces its note
    description["notes"] = "; ".join(kept + [note])
    description = validate_description(description, label)
    write_atomic(path, json.dumps(description, indent=2) + "\n", "machine description")
    return description, where
