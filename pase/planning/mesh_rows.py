"""The mesh search's rows priced: every row's step and peak under one options set (all layers at
one row of a costing), and one row made a :class:`~pase.planning.candidate.Candidate` with its figures.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from pase.costing.training import TrainingCosting, TrainingOptions
from pase.costing.training.allocator import hold_kinds, hold_within, memory_figures, retry_seconds, stranded_bytes
from pase.model.builder import redistribution_seconds
from pase.planning.candidate import CAUSES, Candidate
from pase.planning.host_floor import (block_count, domain_of, expert_block_count, expert_flags, floored, host_seconds,
                                      node_wait_seconds, recomputed_host_seconds)
from pase.planning.mesh import Mesh
from pase.planning.pipeline import StagePlan, extra_word, stage_chunks, stage_layout

__all__ = ["PartsMemo", "Costed", "Found", "edge_seconds", "row_totals", "candidate_of"]

#: The one edge rule (``pase.model.builder``): a redistribution priced over the devices it spans.
edge_seconds = redistribution_seconds


class PartsMemo:
    """Layer parts and edge seconds shared by structurally equal layers (repeated blocks)."""

    def __init__(self, machine, procs: int):
        self.machine = machine
        self.procs = procs
        self.edges: dict = {}

    def edge_seconds(self, network, configs: Sequence[np.ndarray], kinds=None) -> np.ndarray:
        """Seconds of every edge's redistribution (forward and backward) per row: ``(E, K)``.
        ``kinds``: each layer's structure kind (``NetworkStructure.kinds``): layers of one kind
        given the very same configuration array share their tensors' configurations."""
        layers = network.layers
        kinds = kinds if kinds is not None else range(len(layers))
        tensors: dict = {}
        for layer, C, kind in zip(layers, configs, kinds):
            if (kind, id(C)) not in tensors:
                tensors[(kind, id(C))] = (layer.output_configs(C), layer.input_configs(C))
        outputs = [tensors[(kind, id(C))][0] for C, kind in zip(configs, kinds)]
        inputs = [tensors[(kind, id(C))][1] for C, kind in zip(configs, kinds)]
        rows = []
        targets = []
        # Edges between the same tensors' configuration arrays (repeated blocks) sum the same
        # seconds: each such edge is added up once.
        summed: dict = {}
        for (u, v), tensors in sorted(network.edges.items()):
            same = tuple((t.shape, id(outputs[u][t.output_index]), id(inputs[v][t.input_index])) for t in tensors)
            if same not in summed:
                total = 0.0
                for t in tensors:
                    src = np.ascontiguousarray(outputs[u][t.output_index])
                    dst = np.ascontiguousarray(inputs[v][t.input_index])
                    key = (t.shape, src.tobytes(), dst.tobytes())
                    if key not in self.edges:
                        self.edges[key] = edge_seconds(self.machine, t.shape, src, dst, self.procs)
                    total = total + self.edges[key]
                summed[same] = total
            rows.append(summed[same])
            targets.append(v)
        return np.array(rows).reshape(len(rows), -1), targets


def row_totals(costing: TrainingCosting, options: TrainingOptions, act_bytes: float, edges: np.ndarray,
               targets: list, sums: dict | None = None, columns=None, memory_cap=None,
               search_layers: bool = False, floor: bool = True, tp=1) -> tuple:
    """Step seconds, peak bytes and ``recompute_layers`` of every row (all layers at the same
    row) of ``columns`` (the costing's rows that ``edges`` has; default all). ``sums``: the
    columns taken and their sums already, by array (settings share the arrays of what they do
    not change). Under ``block``: :func:`_block_totals`. ``floor``: no micro-batch faster than
    the host issues it (:mod:`pase.planning.host_floor`). ``tp``: each column's tensor-parallel
    degree (a group across nodes waits there, :func:`~pase.planning.host_floor.node_wait_seconds`)."""
    sums = {} if sums is None else sums
    if options.recompute == "block":
        return _block_totals(costing, options, act_bytes, edges, targets, sums, columns, memory_cap, search_layers,
                             tp)

    def taken(array):
        if ("taken", id(array)) not in sums:
            # In row order (C-contiguous), as a costing of those rows alone has them: sums over
            # the layers then add in the same order.
            sums[("taken", id(array))] = (array if columns is None else np.ascontiguousarray(array[:, columns]), array)
        return sums[("taken", id(array))][0]

    def total(array):
        if id(array) not in sums:
            sums[id(array)] = (array.sum(axis=0), array)
        return sums[id(array)][0]

    vec = {name: taken(array) for name, array in costing.layer_vectors(options, act_bytes).items()}
    time_rows = total(vec["micro"]) * options.microbatches + total(vec["step"])
    if len(targets):
        time_rows = time_rows + total(costing.edge_rows(edges, targets, options, columns))
    time_rows = time_rows + options.microbatches * _node_wait(costing, options, tp)
    if floor:
        time_rows = _host_floored(costing, options, time_rows, total(vec["step"]))
    memory_rows = (total(vec["state"]) + total(vec["activations"]) + total(vec["logits"])
                   + costing.transient_rows(vec, options))
    time_rows = time_rows + _retries(options, memory_rows, _stranded(options, total(vec["activations"])), memory_cap)
    return time_rows, memory_rows, np.zeros(len(time_rows), dtype=np.int64)


def _stranded(options: TrainingOptions, activations):
    """The allocator's stranded bytes beside one micro-batch's ``activations`` (no pipeline)."""
    return stranded_bytes(activations, 1.0, options.fragmentation, options.interleave_fragmentation)


def _retries(options: TrainingOptions, needed, stranded, memory_cap):
    """What the caching allocator's retries add to rows whose tensors (``needed``) fit
    ``memory_cap`` only once the ``stranded`` bytes are given back
    (:func:`~pase.costing.training.allocator.retry_seconds`: none without a cap)."""
    return retry_seconds(needed, stranded, memory_cap, options.microbatches, options.retry_seconds)


def _block_totals(costing: TrainingCosting, options: TrainingOptions, act_bytes: float, edges: np.ndarray,
                  targets: list, sums: dict, columns, memory_cap, search_layers: bool, tp=1) -> tuple:
    """:func:`row_totals` under ``recompute=block`` without a pipeline: the network's blocks one
    chunk, its first ``n`` recomputed: the ``none`` totals plus the first ``n`` blocks' deltas
    (``TrainingCosting.block_deltas``: ``m`` times the micro-batch's, the bytes kept) and the
    largest working set among them. ``n`` is ``recompute_layers`` (at most the blocks), or with
    ``search_layers`` every count from 1 to the blocks, keeping per row the fastest that fits
    ``memory_cap``, else the least memory; of equals the smallest ``n``."""
    time0, memory0, _ = row_totals(costing, options.as_policy("none"), act_bytes, edges, targets, sums, columns,
                                   floor=False, tp=tp)
    deltas = costing.block_deltas(options, act_bytes, edges, targets, columns)
    blocks = len(deltas["micro"])
    if not blocks:  # nothing to recompute: as none
        return time0, memory0, np.full(len(time0), options.recompute_layers, dtype=np.int64)
    times = time0 + options.microbatches * np.cumsum(deltas["micro"], axis=0)  # (n, K): n = 1, 2, ...
    none = costing.layer_vectors(options.as_policy("none"), act_bytes)
    total = lambda name: (none[name] if columns is None else none[name][:, columns]).sum(axis=0)  # noqa: E731
    host = _block_host(costing, options, blocks)
    if np.any(host):
        times = floored(times, total("step"), options.microbatches, host[:, None])
    memories = memory0 + np.cumsum(deltas["activations"], axis=0) + np.maximum.accumulate(deltas["working"], axis=0)
    if memory_cap is not None and options.retry_seconds:
        kept = total("activations") + np.cumsum(deltas["activations"], axis=0)
        times = times + _retries(options, memories, _stranded(options, kept), memory_cap)
    columns_of = np.arange(len(time0))
    if not search_layers:
        n = np.full(len(time0), min(options.recompute_layers, blocks) - 1)
    else:
        cap = np.inf if memory_cap is None else memory_cap
        fits = memories <= cap
        n = np.where(fits.any(axis=0), np.argmin(np.where(fits, times, np.inf), axis=0), np.argmin(memories, axis=0))
    return times[n, columns_of], memories[n, columns_of], n + 1


def _node_wait(costing: TrainingCosting, options: TrainingOptions, tp):
    """One micro-batch's wait of tensor-parallel groups of ``tp`` across nodes, over the
    network's blocks (:func:`~pase.planning.host_floor.node_wait_seconds`); 0 where none."""
    if not options.tp_node_wait_seconds:
        return 0.0
    return node_wait_seconds(options, block_count(costing.structure.blocks), tp, domain_of(costing.machine))


def _host(costing: TrainingCosting, options: TrainingOptions) -> float:
    """One micro-batch's host time over the network's blocks, those with a mixture of experts
    counted again (:func:`~pase.planning.host_floor.host_seconds`); under ``recompute=block`` with
    the recomputed blocks' forwards (:func:`_block_host`)."""
    st = costing.structure
    blocks = block_count(st.blocks)
    if options.recompute == "block" and blocks:
        return float(_block_host(costing, options, blocks)[min(options.recompute_layers, blocks) - 1])
    return float(host_seconds(options, blocks, False, experts=expert_block_count(st.blocks, st.experts)))


def _block_host(costing: TrainingCosting, options: TrainingOptions, blocks: int) -> np.ndarray:
    """Per count ``n`` = 1 .. ``blocks`` of recomputed blocks (``recompute=block`` without a
    pipeline: the network's first ``n``), one micro-batch's host time: every block's, and the
    recomputed blocks' forwards issued again (``FORWARD_SHARE`` of their own host times, those
    holding a mixture of experts with theirs)."""
    st = costing.structure
    plain = options.as_policy("none")
    flags = expert_flags(st.blocks, st.experts, costing.block_order()[:blocks])
    return _host(costing, plain) + np.cumsum(recomputed_host_seconds(plain, flags))


def _host_floored(costing: TrainingCosting, options: TrainingOptions, time_rows, step_rows):
    """``time_rows`` of a network without a pipeline, no micro-batch faster than its blocks' host
    time (``host_floor``); as they are where the engine states none."""
    host = _host(costing, options)
    if not host:
        return time_rows
    return floored(time_rows, step_rows, options.microbatches, host)


class Costed(NamedTuple):
    """A group of meshes' share of its network's costing: the costing, the rows of it the group
    takes (``columns``), their edges' seconds (one column each) and the tokens of a micro-batch."""

    costing: TrainingCosting
    columns: np.ndarray
    edges: np.ndarray
    targets: list
    tokens: int | None


class Found(NamedTuple):
    """One configuration the mesh search priced, as a plan is made of it: its step and peak,
    its group's :class:`Costed`, options, ``column`` (of the group's edges and totals), mesh,
    per-rank micro-batch, pipeline (``None`` without one) and devices per pipeline stage."""

    step: float
    peak: float
    costed: Costed
    options: TrainingOptions
    column: int
    mesh: Mesh
    microbatch: int
    stages: StagePlan | None
    stage_devices: int


def candidate_of(found: Found, memory_cap, act_bytes: float, procs: int) -> Candidate:
    """The :class:`Candidate` of a configuration the mesh search priced: its row of the costing
    summarised; a pipelined one's step, peak, causes and memory by kind as its stages give them."""
    costing, columns, edges, targets, tokens = found.costed
    options, i, stages = found.options, found.column, found.stages
    n = len(costing.network.layers)
    row = int(columns[i])  # the costing's row; i is the column of edges and of the search's totals
    # Every row priced, then row i taken: the overlap a row's target layers leave is that row's.
    moved = float(costing.edge_rows(edges, targets, options, columns)[:, i].sum()) if len(targets) else 0.0
    summary = costing.summarize([row] * n, options, act_bytes, moved, procs,
                                None if tokens is None else tokens * options.microbatches)
    if stages is not None:
        _pipelined(summary, found, act_bytes, memory_cap)
    else:
        stranded = summary.memory.get("fragmentation", 0.0)
        needed = summary.peak_memory_bytes - stranded
        hold_within(summary, memory_cap)
        _node_wait_cause(summary, costing, options, found.mesh.tp)
        _host_cause(summary, costing, options)
        _retry_cause(summary, float(_retries(options, needed, stranded, memory_cap)))
    configs = tuple(tuple(int(x) for x in costing.configs[v][row]) for v in range(n))
    return Candidate(found.mesh, options, found.microbatch, configs, summary, memory_cap)


def _retry_cause(summary, lost: float) -> None:
    """A configuration without a pipeline that fits only as its allocator retries: the
    ``lost`` seconds as the cause ``allocator_retries`` of its step."""
    if lost > 0:
        summary.time["allocator_retries"] = lost
        summary.step_seconds += lost


def _node_wait_cause(summary, costing, options: TrainingOptions, tp: int) -> None:
    """A configuration without a pipeline whose tensor-parallel group spans nodes: its wait
    there (:func:`_node_wait`), part of its activation collectives' time."""
    wait = options.microbatches * float(_node_wait(costing, options, tp))
    if wait > 0:
        summary.time["activation_comm"] = summary.time.get("activation_comm", 0.0) + wait
        summary.step_seconds += wait


def _host_cause(summary, costing, options: TrainingOptions) -> None:
    """A configuration without a pipeline whose micro-batches wait for the host (``host_floor``):
    the wait as the cause ``host`` of its step."""
    host = _host(costing, options)
    if not host:
        return
    rest = sum(summary.time.get(k, 0.0) for k in ("weight_sync", "optimizer"))
    wait = float(floored(summary.step_seconds, rest, options.microbatches, host)) - summary.step_seconds
    if wait > 0:
        summary.time["host"] = wait
        summary.step_seconds += wait


def _pipelined(summary, found: Found, act_bytes: float, memory_cap=None) -> None:
    """A pipelined configuration's summary: its step as its stages give it, and each stage's
    peak: what its tensors need (the search's) and the allocator's stranded bytes as it holds
    them on a device of ``memory_cap`` (:func:`~pase.costing.training.allocator.released_within`)."""
    costing, columns, edges = found.costed.costing, found.costed.columns, found.costed.edges
    options, i, stages, q = found.options, found.column, found.stages, found.stage_devices
    slowest = max(stages.microbatch_seconds)
    fill = (stages.pp - 1) / stages.vpp
    summary.time = {
        "pipeline": options.microbatches * slowest,
        "bubble": fill * slowest,
        "sync_and_optimizer": stages.step_seconds - (options.microbatches + fill) * slowest,
    }
    kinds, peaks, released, lost = [], [], [], 0.0
    # The memory alive part of the time is the network's, the same on every stage.
    transient = costing.transient_bytes([int(columns[i])] * len(costing.network.layers), options, act_bytes,
                                        _chunks(stages) if options.recompute == "block" else None)
    for s, needed in enumerate(stages.memory_bytes):
        k = _stage_memory(costing, options, int(columns[i]), act_bytes, stages, s, transient)
        lost = max(lost, float(_retries(options, float(needed), k.get("fragmentation", 0.0), memory_cap)))
        peak, gave = hold_kinds(k, float(needed) + k.get("fragmentation", 0.0), memory_cap)
        kinds.append(k)
        peaks.append(peak)
        released.append(gave)
    if lost:  # every stage stalls with the one whose allocator retries: a cause of its own
        summary.time["sync_and_optimizer"] -= lost
        summary.time["allocator_retries"] = lost
    if max(released):  # the allocator gives cached blocks back on some stage: "tight"
        summary.extra["released_bytes"] = max(released)
    top = int(np.argmax(peaks))
    figures = [memory_figures(k, peak) for k, peak in zip(kinds, peaks)]
    summary.memory = {"largest_stage": peaks[top]}
    summary.step_seconds = float(found.step)
    summary.peak_memory_bytes = peaks[top]
    summary.extra["causes"] = _stage_causes(costing, options, i, edges, stages, float(found.step) - lost, columns,
                                            found.mesh.tp)
    if lost:
        summary.extra["causes"]["allocator_retries"] = lost
    summary.extra["memory_kinds"] = kinds[top]
    summary.extra["pipeline"] = {
        "pp": stages.pp, "schedule": stages.schedule, "vpp": stages.vpp, "microbatches": options.microbatches,
        "bubble_fraction": stages.bubble_fraction, "p2p_seconds_per_microbatch": stages.p2p_seconds,
        "stages": [{"stage": s, "blocks": c, "devices": [s * q, (s + 1) * q - 1],
                    "microbatch_seconds": t, "memory_bytes": f.device,
                    "peak_memory_allocated_bytes": f.allocated, "peak_memory_reserved_bytes": f.reserved}
                   for s, (c, t, f) in enumerate(zip(stages.counts, stages.microbatch_seconds, figures))],
    }
    if sum(stages.extra):  # the embedding and/or the loss counted as pipeline layers
        summary.extra["pipeline"]["pipeline_extra"] = extra_word(stages.extra)


def _chunks(stages) -> tuple:
    """Blocks per pipeline chunk in order: each stage's ``vpp`` chunks (``stage_chunks``, as
    ``pipeline_rows`` prices ``recompute=block``)."""
    return tuple(c for chunks in stage_chunks(stages.counts, stages.vpp, stages.extra) for c in chunks)


def _per_layer(costing, options: TrainingOptions, stages) -> list:
    """Each layer's options on a pipeline: under ``block``, ``full`` for the layers of the
    blocks each chunk recomputes and ``none`` for the others; else ``options`` throughout."""
    n = len(costing.network.layers)
    if options.recompute != "block":
        return [options] * n
    again = costing.recomputed_mask(options, _chunks(stages))
    full, none = options.as_policy("full"), options.as_policy("none")
    return [full if again[v] else none for v in range(n)]


def _edge_rows(costing, edges, targets, options: TrainingOptions, columns, stages):
    """``costing.edge_rows`` on a pipeline: under ``block``, each edge's as its target's
    options (:func:`_per_layer`) price it."""
    if options.recompute != "block":
        return costing.edge_rows(edges, targets, options, columns)
    again = costing.recomputed_mask(options, _chunks(stages))[np.asarray(targets, dtype=np.int64)]
    full = costing.edge_rows(edges, targets, options.as_policy("full"), columns)
    none = costing.edge_rows(edges, targets, options.as_policy("none"), columns)
    return np.where(again[:, None], full, none)


def _stage_range(costing, stages, s: int) -> tuple:
    """The layers ``[start, end)`` of pipeline stage ``s`` (as ``pipeline_rows`` cuts them)."""
    layout = stage_layout(costing.blocks)
    bounds = np.cumsum((0,) + tuple(stages.counts))
    block_starts = [b[0] for b in layout.blocks]
    start = 0 if s == 0 else block_starts[bounds[s]]
    end = len(costing.network.layers) if s == stages.pp - 1 else block_starts[bounds[s + 1]]
    return start, end


def _stage_memory(costing, options: TrainingOptions, i: int, act_bytes: float, stages, s: int,
                  transient: dict) -> dict:
    """Stage ``s``'s peak by kind (as ``pipeline_rows`` adds it up): its model state (with the
    last stage's copies of tied weights), its activations times the micro-batches in flight on
    it, its logits, the allocator's stranded bytes
    (:func:`~pase.costing.training.allocator.stranded_bytes`), and the memory alive part of the
    time (ZeRO-3's gathered weights, the recomputed block: ``transient``, the network's, by part)
    and the reserve."""
    start, end = _stage_range(costing, stages, s)
    pp, m = stages.pp, options.microbatches
    in_flight = min(pp - s, m) * ((1.0 + (pp - 1) / (pp * stages.vpp)) if stages.vpp > 1 else 1.0)
    kinds = dict.fromkeys(("model_state", "activations", "logits"), 0.0)
    per_layer = _per_layer(costing, options, stages)
    copies = "copy_state" in costing.vector_names
    for v in range(start, end):
        for key, value in costing.layer_memory(v, per_layer[v], act_bytes).items():
            kinds[key] = kinds.get(key, 0.0) + float(value[i])
        if copies:  # the copies of tied weights the last stage holds (NetworkStructure.copies)
            kinds["model_state"] += float(costing.copy_state(v, per_layer[v])[i])
    if "fragmentation" in kinds:
        kinds["fragmentation"] = stranded_bytes(kinds["activations"], in_flight, options.fragmentation,
                                                options.interleave_fragmentation)
    kinds["activations"] *= in_flight
    kinds.update(transient)
    kinds["reserve"] = float(options.reserve_bytes)
    return kinds


def _stage_causes(costing, options: TrainingOptions, i: int, edges: np.ndarray, stages, step: float,
                  columns=None, tp: int = 1) -> dict:
    """A pipelined row's step by cause: the slowest stage's compute, recomputation, activation
    collectives, redistribution and sends over the ``m`` micro-batches; the bubble
    ``(pp - 1) / vpp`` slots of it; the rest of the step (the exposed synchronisation and
    optimizer step after the drain), the slowest stage's optimizer step first."""
    m = options.microbatches
    s = int(np.argmax(stages.microbatch_seconds))
    slowest = stages.microbatch_seconds[s]
    start, end = _stage_range(costing, stages, s)
    causes = dict.fromkeys(CAUSES, 0.0)
    optimizer = 0.0
    row = i if columns is None else int(columns[i])  # i: the column of edges; row: the costing's
    per_layer = _per_layer(costing, options, stages)
    for v in range(start, end):
        part = costing.layer_time(v, per_layer[v])
        for key in ("compute", "recompute", "activation_comm"):
            causes[key] += float(part[key][row])
        optimizer += float(part["optimizer"][row])
    targets = [v for (_, v) in sorted(costing.network.edges)]
    if targets:
        rows = _edge_rows(costing, edges, targets, options, columns, stages)[:, i]
        causes["redistribution"] = float(sum(r for r, v in zip(rows, targets) if start <= v < end))
    causes["p2p"] = m * stages.p2p_seconds
    if options.tp_node_wait_seconds:  # a tensor-parallel group across nodes waits there (host_floor)
        causes["activation_comm"] += m * float(node_wait_seconds(options, stages.counts[s], tp,
                                                                 domain_of(costing.machine)))
    causes["bubble"] = (stages.pp - 1) / stages.vpp * slowest
    # What the slowest stage's micro-batches wait for the host beyond their work (host_floor):
    # the rest of its micro-batch time.
    device = sum(causes[k] for k in ("compute", "recompute", "activation_comm", "redistribution"))
    wait = m * (slowest - stages.p2p_seconds) - device
    if wait > 1e-12 * max(m * slowest, 1e-300):
        causes["host"] = wait
    else:
        del causes["host"]
    rest = max(step - (m + (stages.pp - 1) / stages.vpp) * slowest, 0.0)
    causes["optimizer"] = min(optimizer, rest)
    causes["weight_sync"] = rest - causes["optimizer"]
    return causes
