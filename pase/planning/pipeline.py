"""Pipeline parallelism: stages cut at block boundaries, 1F1B and interleaved schedules.

A pipeline of ``pp`` stages gives each stage ``p / pp`` consecutive devices and a contiguous
run of the network: the layers before the first block (embedding) on the first stage, the
layers after the last block (final norm, head, loss) on the last, the blocks in between cut
into ``pp`` runs. Every stage runs the same mesh (``dp x tp x cp = p / pp``). With ``m``
micro-batches and ``t`` the forward and backward time of one micro-batch on the slowest stage
(its point-to-point sends included), the step is ``(m + pp - 1) t`` for 1F1B (PipeDream-flush)
and ``(m + (pp - 1) / v) t`` interleaved with ``v`` chunks per device (Narayanan et al. 2021),
plus the largest exposed weight synchronisation and optimizer step of a stage, less the
drain: stage ``s`` ends its last backward pass ``s`` backward passes of a chunk (two thirds of
``t / v`` each) before the first stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pase.costing.memory import activation_elements
from pase.costing.training import FORWARD_SHARE
from pase.costing.training.allocator import retry_seconds, stranded_bytes
from pase.planning.host_floor import (domain_of, expert_flags, host_seconds, node_wait_seconds,
                                      recomputed_host_seconds)
from pase.machines.base import Group

__all__ = ["StagePlan", "Layout", "CUTS_SEARCHED", "ENGINE_CUTS", "stage_layout", "cuts", "pipeline_rows", "pipeline_rows_settings",
           "chunk_sync",
           "exposed_sends", "chunk_sizes", "chunks_priced", "stage_chunks", "virtual_order", "interleavings", "SCHEDULES",
           "PIPELINE_EXTRAS", "extra_units", "extra_word", "unit_split"]

SCHEDULES = ("1f1b", "interleaved")
#: How far :func:`cuts` lets the first and last stages' block counts stray from the middle ones'
#: (for two stages, the first's from an even split), and the middle ones' from an even share.
END_STAGE_SLACK = 8
MIDDLE_STAGE_SLACK = 2
#: What :func:`cuts` and :data:`SCHEDULES` search, in the words of a plan's ``optimal_over``.
CUTS_SEARCHED = (f"pipelines cut between the source's repeated blocks: for pp = 2 the first stage within "
                 f"{END_STAGE_SLACK} blocks of an even split, for more stages the middle ones equal and within "
                 f"{MIDDLE_STAGE_SLACK} blocks of an even share, the first and last within {END_STAGE_SLACK} blocks "
                 "of them, or the middle ones one block apart and the first and last within 2 blocks of an even "
                 "share; 1F1B or interleaved")
#: The same where the engine cuts its own pipelines (``pipeline_cut``, :mod:`pase.planning.engine_cut`),
#: by the rule it cuts them with.
ENGINE_CUTS = {"compute_balanced": "pipelines cut as the engine cuts them, its blocks balanced by their weights' "
                                   "cost (a recipe's stages= as given)",
               "layer_count": "pipelines cut as the engine cuts them, an even count of blocks a stage, the first "
                              "stages one more where they do not divide (a recipe's stages= as given)"}


@dataclass(frozen=True)
class Layout:
    """Where the blocks are: layers before the first block, each block's layers, after."""

    pre: tuple
    blocks: tuple  # one tuple of vertex ids per block, in order
    post: tuple
    outputs: tuple  # the vertex whose output leaves each block (sent to the next stage)


def stage_layout(blocks) -> Layout | None:
    """The block structure of a network from each layer's block (``NetworkStructure.blocks``),
    or ``None`` when its layers are not pre-layers, then blocks one after another, then
    post-layers."""
    order: list = []
    members: dict = {}
    for v, b in enumerate(blocks):
        if b is None:
            continue
        if b not in members:
            order.append(b)
            members[b] = []
        members[b].append(v)
    if len(order) < 2:
        return None
    first = members[order[0]][0]
    last = members[order[-1]][-1]
    pre = tuple(range(first))
    post = tuple(range(last + 1, len(blocks)))
    flat = [v for b in order for v in members[b]]
    if flat != list(range(first, last + 1)):
        return None  # blocks interleaved with other layers: no clean cut
    if any(blocks[v] is not None for v in pre + post):
        return None
    outputs = tuple(members[b][-1] for b in order)
    return Layout(pre, tuple(tuple(members[b]) for b in order), post, outputs)


def cuts(blocks: int, pp: int, width: int = END_STAGE_SLACK) -> list:
    """Blocks per stage: the middle stages equal, the first and last within a few blocks of
    an even share (Megatron's and torchtitan's first/last-stage layer counts).

    >>> cuts(8, 2, 1)
    [(4, 4), (3, 5), (5, 3)]
    >>> cuts(6, 3)[:3]
    [(2, 2, 2), (1, 2, 3), (1, 3, 2)]
    """
    if pp == 1:
        return [(blocks,)]
    if pp > blocks:
        return []
    even = blocks // pp
    out = set()
    if pp == 2:
        for first in range(max(1, even - width), min(blocks - 1, even + width) + 1):
            out.add((first, blocks - first))
        return sorted(out, key=lambda c: (abs(c[0] - c[1]), c))
    for middle in range(max(1, even - MIDDLE_STAGE_SLACK), even + MIDDLE_STAGE_SLACK + 1):
        rest = blocks - middle * (pp - 2)
        for first in range(1, rest):
            last = rest - first
            if last >= 1 and abs(first - middle) <= width and abs(last - middle) <= width:
                out.add((first,) + (middle,) * (pp - 2) + (last,))
    out.update(_balanced_cuts(blocks, pp))
    return sorted(out, key=lambda c: (max(c) - min(c), c))


def _balanced_cuts(blocks: int, pp: int) -> set:
    """Cuts whose middle stages differ by one block at most (the larger ones last, where fewer
    micro-batches are in flight), the first and last stages within 2 blocks of an even share
    (fewer where the embedding or the output head is heavy): the stages an engine that balances
    its stages by cost makes (nanotron's cumulative-cost thresholds, models/base.py:216-236),
    which equal middle stages cannot when the blocks do not divide.

    >>> sorted(_balanced_cuts(7, 4))[:3]   # first 1, last 3: the 3 left over two stages, 1 then 2
    [(1, 1, 2, 3), (1, 2, 2, 2), (1, 2, 3, 1)]
    """
    even = blocks // pp
    out = set()
    for first in range(max(1, even - 2), even + 3):
        for last in range(max(1, even - 2), even + 3):
            rest = blocks - first - last
            if rest < pp - 2:
                continue
            q, extra = divmod(rest, pp - 2)
            out.add((first,) + (q,) * (pp - 2 - extra) + (q + 1,) * extra + (last,))
    return out


#: What a pipeline may count as a layer of its split besides the repeated blocks (``--recipe
#: pipeline_extra=``): Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
#: ``--account-for-loss-in-pipeline-split`` (megatron-core 0.16.1 transformer_config.py:96-102;
#: transformer_block.py:143-199 adds one layer for each and builds one decoder layer fewer in the
#: first virtual stage of the first rank, the last of the last).
PIPELINE_EXTRAS = ("none", "embedding", "loss", "embedding+loss")


def extra_units(word) -> tuple:
    """``(first, last)``: the pipeline units the embedding and the loss count for (0 or 1 each)
    under ``pipeline_extra=word`` (``None``: none).

    >>> extra_units("embedding+loss"), extra_units("loss"), extra_units(None)
    ((1, 1), (0, 1), (0, 0))
    """
    if word is None or word == "none":
        return (0, 0)
    if word not in PIPELINE_EXTRAS:
        raise ValueError(f"pipeline_extra must be one of {', '.join(PIPELINE_EXTRAS)}, got {word!r}")
    return (int("embedding" in word), int("loss" in word))


def extra_word(extra) -> str:
    """The ``pipeline_extra`` word of ``(first, last)`` units (:func:`extra_units` reversed)."""
    return {(0, 0): "none", (1, 0): "embedding", (0, 1): "loss", (1, 1): "embedding+loss"}[tuple(extra)]


def _units(counts, extra) -> list:
    """Pipeline units per stage: its blocks, the first stage's embedding and the last's loss
    where they count (``extra``)."""
    units = [int(c) for c in counts]
    units[0] += extra[0]
    units[-1] += extra[1]
    return units


def unit_split(blocks: int, pp: int, extra, vpp: int = 1) -> tuple | None:
    """Blocks per stage of Megatron-LM's even split when the embedding and the loss count as
    layers (``extra``): ``u = (blocks + e_first + e_last) / pp`` units a stage, the first stage's
    blocks ``u - e_first``, the last's ``u - e_last``; ``None`` where ``pp`` (and, interleaved,
    ``vpp``) does not divide them, as Megatron refuses it (transformer_config.py:1436-1478).
    NVIDIA's Llama 3.1 405B on 256 GB200 (pp 16, vpp 8): (126 + 2) / 16 = 8 units a stage.

    >>> unit_split(126, 16, (1, 1), 8)[:2], unit_split(126, 16, (1, 1), 8)[-1], unit_split(126, 16, (0, 0))
    ((7, 8), 7, None)
    """
    total = blocks + extra[0] + extra[1]
    if pp < 1 or total % pp or (total // pp) % max(vpp, 1):
        return None
    u = total // pp
    counts = [u] * pp
    counts[0] -= extra[0]
    counts[-1] -= extra[1]
    return tuple(counts) if min(counts) >= 1 else None


def chunk_sizes(counts, vpp: int, extra=(0, 0)) -> list | None:
    """Blocks per chunk of every stage (a list of ``vpp`` sizes per stage) when stages of
    ``counts`` blocks each run ``vpp`` chunks of an interleaved schedule, or ``None`` when they
    cannot. Chunks are counted in pipeline units: a stage's blocks, plus the embedding on the
    first stage and the loss on the last where ``extra`` counts them (:func:`extra_units`). With
    ``q = max(units) / vpp`` (``vpp`` must divide the largest stage), every chunk holds ``q`` or
    ``q - 1`` units, at least one: a lighter stage's chunks are one unit short, as Megatron's
    ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``
    make the first and last chunk (NeMo's Llama 3.1 405B: 126 layers, pp 8 x vpp 8 = 64 chunks
    of 2, the first and last of 1; pp 16 x vpp 8 = 128 chunks of one unit, the first the
    embedding alone, the last the loss alone) and its ``--pipeline-model-parallel-layout``
    writes any such split. Failing that, where ``vpp`` divides the mean stage ``sum(units) /
    pp``, each stage's units split as evenly as they go, at least one a chunk (a stage a block
    or two off the even split: NVIDIA's Llama 3 70B layout on 64 H100, pp 8 x vpp 5, runs one
    stage of 11 layers in chunks of 2 and 3 and the loss's stage 9 in chunks of 2 and 1,
    Megatron-Bridge perf_recipes/llama/h100/llama3.py:170). The first stage's short chunks come
    first (its embedding shares them, and takes the first chunk's first unit), every other
    stage's last (the last stage's loss takes its last chunk's last unit). Stages are priced by
    their blocks, as for 1F1B; equal stages are split equally.

    >>> chunk_sizes((15, 16, 16, 15), 8)[0], chunk_sizes((15, 16, 16, 15), 8)[3]
    ([1, 2, 2, 2, 2, 2, 2, 2], [2, 2, 2, 2, 2, 2, 2, 1])
    >>> chunk_sizes((8, 8), 4), chunk_sizes((7, 8), 8), chunk_sizes((3, 8), 4)
    ([[2, 2, 2, 2], [2, 2, 2, 2]], None, None)
    >>> chunk_sizes((7, 8, 7), 8, (1, 1))[0][:2], chunk_sizes((7, 8, 7), 8, (1, 1))[2][-2:]
    ([0, 1], [1, 0])
    >>> chunk_sizes((11, 10, 9), 5)
    [[2, 2, 2, 2, 3], [2, 2, 2, 2, 2], [2, 2, 2, 2, 1]]
    """
    if vpp < 2 or not counts:
        return None
    units = _units(counts, extra)
    out = _largest_split(units, vpp)
    if out is None:
        out = _mean_split(units, vpp)
    if out is None:
        return None
    out[0][0] -= extra[0]  # the embedding takes the first chunk's first unit
    out[-1][-1] -= extra[1]  # the loss the last chunk's last
    return out


def _largest_split(units: list, vpp: int) -> list | None:
    """Chunks of ``q = max(units) / vpp`` or ``q - 1`` units (:func:`chunk_sizes`' first rule)."""
    largest = max(units)
    if largest % vpp:
        return None
    q = largest // vpp
    out = []
    for s, count in enumerate(units):
        short = vpp * q - count
        if short > vpp or (short > 0 and q < 2):
            return None
        out.append([q - 1] * short + [q] * (vpp - short) if s == 0 else [q] * (vpp - short) + [q - 1] * short)
    return out


def _mean_split(units: list, vpp: int) -> list | None:
    """Each stage's units as even as they go in ``vpp`` chunks, at least one unit each, where
    ``vpp`` divides the mean stage ``sum(units) / pp`` (:func:`chunk_sizes`' second rule: a
    stage a block or two off the even split, as NVIDIA's layouts move blocks off the stage of
    the loss). The first stage's short chunks come first, every other stage's last."""
    total, pp = sum(units), len(units)
    if total % pp or (total // pp) % vpp:
        return None
    out = []
    for s, count in enumerate(units):
        base, longer = divmod(count, vpp)
        if base < 1:
            return None
        out.append([base] * (vpp - longer) + [base + 1] * longer if s == 0
                   else [base + 1] * longer + [base] * (vpp - longer))
    return out


def chunks_priced(chunks, pp: int, extra=(0, 0)) -> bool:
    """Whether model chunks given in the model's order (chunk ``j`` on stage ``j mod pp``) are
    the chunks :func:`chunk_sizes` prices for their stages, each stage's in any order (a stage is
    priced by its blocks), the embedding's chunk first and the loss's last where ``extra``
    counts them.

    >>> chunks_priced([3, 2, 2, 1], 2), chunks_priced([4, 2, 1, 1], 2)
    (True, False)
    """
    vpp = len(chunks) // pp
    totals = [sum(chunks[s::pp]) for s in range(pp)]
    sizes = chunk_sizes(totals, vpp, extra)
    return sizes is not None and all(sorted(sizes[s]) == sorted(chunks[s::pp]) for s in range(pp)) and \
        (not extra[0] or chunks[0] == sizes[0][0]) and (not extra[1] or chunks[-1] == sizes[-1][-1])


def stage_chunks(counts, vpp: int, extra=(0, 0)) -> list:
    """Each stage's chunks, blocks per chunk in order: one chunk of its blocks for ``vpp`` 1,
    else :func:`chunk_sizes` (``ValueError`` where they do not split).

    >>> stage_chunks((3, 4), 1), stage_chunks((3, 4), 2)
    ([[3], [4]], [[1, 2], [2, 2]])
    """
    if vpp <= 1:
        return [[int(c)] for c in counts]
    sizes = chunk_sizes(counts, vpp, extra)
    if sizes is None:
        raise ValueError(f"stages of {'/'.join(map(str, counts))} blocks do not run {vpp} interleaved chunks each")
    return sizes


def virtual_order(counts, vpp: int, extra=(0, 0)) -> list:
    """Blocks per model chunk in the model's order (chunk ``j`` on stage ``j mod pp``, the
    ``j // pp``-th of that stage: Megatron's and torchtitan's looped placement) for stages of
    ``counts`` blocks in ``vpp`` chunks each (:func:`chunk_sizes`); ``vpp`` 1: ``counts``.

    >>> virtual_order((3, 4), 2)
    [1, 2, 2, 2]
    """
    sizes = stage_chunks(counts, vpp, extra)
    return [sizes[j % len(counts)][j // len(counts)] for j in range(len(counts) * max(vpp, 1))]


def interleavings(counts, extra=(0, 0)) -> list:
    """Chunks per device an interleaved schedule may run with stages of ``counts`` blocks:
    every ``v >= 2`` for which :func:`chunk_sizes` splits them.

    >>> interleavings((4, 4)), interleavings((15, 16, 16, 15)), interleavings((7, 8, 7), (1, 1))
    ([2, 4], [2, 4, 8], [2, 4, 8])
    """
    return [v for v in range(2, max(counts) + 2) if chunk_sizes(counts, v, extra) is not None]


@dataclass(frozen=True)
class StagePlan:
    """A pipeline's outcome for one row: the cut, schedule, per-stage times and memory."""

    pp: int
    schedule: str
    vpp: int
    counts: tuple
    microbatch_seconds: tuple
    memory_bytes: tuple
    p2p_seconds: float
    bubble_fraction: float
    step_seconds: float
    #: Under ``recompute=block``: the blocks each chunk recomputes (the one searched or given).
    recompute_layers: int = 0
    #: The pipeline units the embedding and the loss count for in the split (:func:`extra_units`).
    extra: tuple = (0, 0)


def sent_elements(costing, v: int, stage_devices: int, split: bool) -> np.ndarray:
    """Elements each device of a stage sends the next stage per micro-batch, per configuration
    row: the stage's last layer ``v``'s output on the device, or, where the engine splits its
    sends (``options.p2p_split``, DeepSpeed's ``pipe_partitioned``), never more than an equal
    share of the whole output over the ``stage_devices`` devices (the receiving stage gathers
    it inside its tensor-parallel group over NVLink, not priced)."""
    own = np.broadcast_to(costing.parts[v].activations, (len(costing.configs[0]),)).astype(np.float64)
    if not split:
        return own
    unsplit = np.ones((1, np.asarray(costing.configs[v]).shape[1]))  # the output's whole, on one device
    whole = float(activation_elements(costing.network.layers[v], unsplit)[0])
    return np.minimum(own, whole / float(stage_devices))


def _p2p(machine, elements: np.ndarray, stage_devices: int) -> np.ndarray:
    """One send of ``elements`` per device from a stage to the next (devices ``stage_devices``
    apart), forward and backward: twice the machine's send between the two (its measured
    ``send_recv`` curve where it has one, else its links)."""
    K = len(elements)
    group = Group(np.full((K, 1), 2, dtype=np.int64), np.full((K, 1), stage_devices, dtype=np.int64))
    return 2.0 * np.asarray(machine.send_recv(elements, group), dtype=np.float64)


def tied_seconds(machine, gradient_elements, pp: int, stage_devices: int) -> np.ndarray:
    """Seconds a step spends on the all-reduce of the tied copies' gradients
    (``gradient_elements`` per device of the last stage, per row, at the machine's gradient
    element size: ``MemoryKinds.copy_gradient_elements``) between each device of the first
    stage and its peer on the last, ``(pp - 1) stage_devices`` apart. The engines run it after
    the backward passes, not overlapped (megatron-core 0.16.1
    distributed/finalize_model_grads.py:164-259, ``torch.distributed.all_reduce(grad,
    group=embd_group)``; nanotron trainer.py:521-526, ``sync_tied_weights_gradients``;
    DeepSpeed runtime/pipe/engine.py:278-294). One stage, or nothing tied: zero.

    >>> from pase.machines.registry import load_machine
    >>> m = load_machine("h100-sxm")
    >>> float(tied_seconds(m, np.array([0.0]), 4, 8)[0]), float(tied_seconds(m, np.array([1e9]), 1, 8)[0])
    (0.0, 0.0)
    """
    elements = np.asarray(gradient_elements, dtype=np.float64)
    if pp <= 1 or not np.any(elements > 0):
        return np.zeros(elements.shape)
    K = len(elements)
    group = Group(np.full((K, 1), 2, dtype=np.int64), np.full((K, 1), (pp - 1) * stage_devices, dtype=np.int64))
    seconds = np.asarray(machine.all_reduce(elements, group, grad=True), dtype=np.float64)
    return np.where(elements > 0, seconds, 0.0)


def exposed_sends(compute: np.ndarray, sends: np.ndarray, vpp: int, options) -> np.ndarray:
    """A stage's pipeline sends of one micro-batch (``sends``: all its chunks', forward and
    backward) left on its critical path, per stage and row: all of them, or, with an
    interleaved schedule (``vpp > 1``) and ``options.p2p_overlap``, what the stage's compute of
    the micro-batch (``compute``) cannot hide at ``overlap_efficiency``, plus the slowdown of
    the compute they hide behind (``comm_sm_share`` of the hidden time), as every overlapped
    collective of the model is priced. Megatron's ``--overlap-p2p-communication`` posts a
    chunk's send and receive and computes the next chunk meanwhile; with one chunk (1F1B) the
    next pass needs what it receives, so the sends wait.

    >>> from pase.costing.training import TrainingOptions
    >>> o = TrainingOptions(p2p_overlap=True, comm_sm_share=0.1)
    >>> float(exposed_sends(np.array(1.0), np.array(0.25), 2, o)), float(exposed_sends(np.array(1.0), np.array(0.25), 1, o))
    (0.025, 0.25)
    """
    sends = np.broadcast_to(np.asarray(sends, dtype=np.float64), np.shape(compute))
    if vpp <= 1 or not options.p2p_overlap:
        return np.array(sends)
    hidden = np.minimum(sends, options.overlap_efficiency * np.asarray(compute, dtype=np.float64))
    return sends - hidden + options.comm_sm_share * hidden


def chunk_sync(sync: np.ndarray, t: np.ndarray, pp: int, vpp: int, efficiency: float,
               exposed: np.ndarray | None = None) -> np.ndarray:
    """A stage's exposed weight synchronisation when its ``vpp`` chunks reduce in turn.

    In the interleaved schedule a device runs the backward passes of its chunks in rounds
    of ``pp`` micro-batches, so its chunks finish their last backward pass ``g = pp (2/3)
    t / vpp`` apart (``t``: the stage's forward and backward of one micro-batch, all chunks).
    Megatron reduces a chunk's gradients as soon as its last backward pass ends (its
    ``--overlap-grad-reduce``), one reduction after another; each chunk's share ``S / vpp``
    queued that way ends ``max(S / vpp, S - (vpp - 1) e g)`` after the last backward pass
    (the queue's finish over every starting chunk; ``e`` the overlap efficiency, 0 without
    overlap). One chunk (1F1B) leaves ``S``.

    ``exposed``: the stage's synchronisation left after each layer hid behind its own backward
    pass (``E``; default ``S``). That hiding happens inside the last chunk's own backward
    pass, the other chunks' queue behind the others' passes: ``max(E / vpp, S - (vpp - 1) e g
    - (S - E) / vpp)``; each chunk's own hiding counted once (not ``E`` hidden again).

    >>> float(chunk_sync(np.array(8.0), np.array(3.0), 2, 4, 1.0))  # g = 2 x 2/3 x 3 / 4 = 1
    5.0
    >>> float(chunk_sync(np.array(8.0), np.array(3.0), 2, 4, 1.0, np.array(4.0)))  # 8 - 3 - 1
    4.0
    """
    if exposed is None:
        exposed = sync
    if vpp <= 1:
        return exposed
    g = efficiency * pp * (1.0 - FORWARD_SHARE) * t / vpp
    return np.maximum(exposed / vpp, sync - (vpp - 1) * g - (sync - exposed) / vpp)


def pipeline_rows(costing, options, act_bytes: float, edges: np.ndarray, targets: list, pp: int, stage_devices: int,
                  layout: Layout, memory_cap=None, schedules=SCHEDULES, vpps=None, fixed_counts=None,
                  search_layers: bool = False, extra=(0, 0)) -> tuple:
    """The best pipeline of every row (all layers at the same row): ``(step, peak, plans)``:
    the fastest that fits ``memory_cap``, else the one needing least memory.

    Exact over the cuts of :func:`cuts`, the schedules given and every ``v`` that splits each
    stage's blocks (interleaved needs chunks one block apart, :func:`chunk_sizes`, and ``m`` a
    multiple of ``pp``). Under ``recompute=block`` each chunk (a stage, or one of a stage's
    :func:`chunk_sizes` interleaved) recomputes its first ``recompute_layers`` blocks;
    ``search_layers``: per cut and schedule, where the plan without recomputation does not fit,
    the fastest count from 1 to the largest chunk's blocks that fits (:func:`_block_chunks`), one
    block per chunk where it fits. ``extra``: the embedding and the loss counted as pipeline units
    (:func:`extra_units`): the cut is then Megatron's even split in units (:func:`unit_split`)
    unless ``fixed_counts`` gives one, and the chunks are counted in units (:func:`chunk_sizes`).
    """
    return pipeline_rows_settings(costing, [options], act_bytes, edges, targets, pp, stage_devices, layout,
                                  memory_cap, schedules, vpps, fixed_counts, search_layers=[search_layers],
                                  extra=extra)[0]


def pipeline_rows_settings(costing, settings, act_bytes: float, edges: np.ndarray, targets: list, pp: int,
                           stage_devices: int, layout: Layout, memory_cap=None, schedules=SCHEDULES, vpps=None,
                           fixed_counts=None, columns=None, search_layers=None, extra=(0, 0), tp=None,
                           kept: dict | None = None) -> list:
    """:func:`pipeline_rows` of each options set of ``settings`` (equal in micro-batches and
    overlap; ZeRO stages and recomputation policies differ), the cuts tried once for all: the
    settings' rows side by side, every operation column by column, so each column's result is
    the one :func:`pipeline_rows` gives alone. ``columns``: the costing's rows priced (default
    all; ``edges`` has one column each). ``search_layers``: per setting, whether a ``block``
    setting's block count is searched (:func:`pipeline_rows`; default not). ``extra``: as
    :func:`pipeline_rows`. ``tp``: each column's tensor-parallel degree (the host floor,
    :mod:`pase.planning.host_floor`; default 1). ``kept``: the prefix sums of these rows by
    settings, from and for other stage counts of the same rows (a sweep's)."""
    options = settings[0]
    shared = ("microbatches", "overlap", "overlap_efficiency", "p2p_overlap", "p2p_split", "comm_sm_share", "chunk_overhead_seconds",
              "pipeline_tp_wait_seconds", "tp_node_wait_seconds")
    if any(tuple(getattr(o, f) for f in shared) != tuple(getattr(options, f) for f in shared) for o in settings):
        raise ValueError("pipeline settings priced together must share micro-batches and overlap")
    if columns is None:
        columns = np.arange(len(costing.configs[0]))
    K1 = len(columns)
    m = options.microbatches
    search_layers = [False] * len(settings) if search_layers is None else list(search_layers)
    key = (tuple(settings), tuple(search_layers), act_bytes)
    sums = None if kept is None else kept.get(key)
    if sums is None:  # the sums read the rows and settings alone, not the stage count: kept for any
        sums = _prefix_sums(costing, settings, act_bytes, edges, targets, layout, columns, search_layers)
        if kept is not None:
            kept[key] = sums
    sent = sent_elements(costing, layout.outputs[0], stage_devices, options.p2p_split)[columns]
    p2p = np.tile(_p2p(costing.machine, sent, stage_devices), len(settings))
    tied = (tied_seconds(costing.machine, sums.prefix["copy_grads"][-1], pp, stage_devices)
            if "copy_grads" in sums.prefix else 0.0)
    cap = np.inf if memory_cap is None else memory_cap
    extra = tuple(extra)
    if fixed_counts is not None:
        candidates = [tuple(fixed_counts)]
    elif extra != (0, 0):  # Megatron's split with the embedding and the loss as layers: one cut
        even = [unit_split(len(layout.blocks), pp, extra, v) for v in (vpps or [1])]
        candidates = sorted({c for c in even if c is not None})
    else:
        candidates = cuts(len(layout.blocks), pp)
    tried = _tried(candidates, schedules, m, pp, vpps, extra)
    if not tried:
        return [(np.full(K1, np.inf), np.full(K1, np.inf), [None] * K1) for _ in settings]
    # Layer ranges of the stages of every cut: the first takes the layers before the blocks,
    # the last the layers after them. ``(cuts, pp, K)`` per prefix sum: a stage's total is one
    # difference of two rows.
    bounds = [np.cumsum((0,) + tuple(counts)) for counts in candidates]
    block_starts = [b[0] for b in layout.blocks]
    starts = np.array([[0] + [sums.row_of[block_starts[b]] for b in bound[1:-1]] for bound in bounds])
    ends = np.array([[sums.row_of[block_starts[b]] for b in bound[1:-1]] + [sums.row_of[len(costing.configs)]]
                     for bound in bounds])
    stage_all = {name: P[ends] - P[starts] for name, P in sums.prefix.items()}
    timing = _Timing(pp, m, options, np.array([min(pp - s, m) for s in range(pp)], dtype=np.float64),
                     np.arange(pp, dtype=np.float64)[:, None] * (1.0 - FORWARD_SHARE),
                     options.overlap_efficiency if options.overlap else 0.0,
                     1 if tp is None else np.tile(np.asarray(tp, dtype=np.float64), len(settings)), extra, cap,
                     tied, domain_of(costing.machine), _expert_blocks(costing, layout))
    priced = _price_tried(stage_all, tried, len(candidates), bounds, sums, p2p, timing, cap)
    plans = _best_plans(priced, tried, candidates, cap, pp, m, extra)
    steps, peaks = priced.best_step, priced.best_peak
    return [(steps[j * K1:(j + 1) * K1], peaks[j * K1:(j + 1) * K1], plans[j * K1:(j + 1) * K1])
            for j in range(len(settings))]


class _Sums(NamedTuple):
    """Every setting's prefix sums over the layers, the settings' columns side by side, kept
    where a stage may start or end (``row_of``: the prefix row of a layer that starts one),
    their transient memory, and the ``block`` settings' columns (:class:`_BlockSettings`)."""

    prefix: dict
    transient: np.ndarray
    row_of: dict
    blocked: object


class _BlockSettings(NamedTuple):
    """The ``block`` settings' columns side by side: their deltas
    (:meth:`~pase.costing.training.TrainingCosting.block_deltas`), block counts and whether each
    is searched."""

    columns: np.ndarray
    deltas: dict
    layers: np.ndarray
    searched: np.ndarray


#: Prefix sums of a stage's figures and the layer vectors (``layer_vectors``) each is of.
_SUMMED = {"micro": "micro", "step": "step", "state": "state", "acts": "activations", "logits": "logits",
           "sync": "sync", "sync_raw": "sync_raw", "copy_state": "copy_state", "copy_grads": "copy_grads",
           "copy_step": "copy_step"}


def _prefix_sums(costing, settings, act_bytes: float, edges: np.ndarray, targets: list, layout: Layout,
                 columns: np.ndarray, search_layers: list) -> _Sums:
    """:class:`_Sums` of ``settings``: a stage's total is then one difference of two rows. A
    ``block`` setting is summed as ``none`` per layer; per chunk the deltas of the blocks it
    recomputes are added by cut and chunk (:func:`_block_chunks`)."""
    K1 = len(columns)
    K = K1 * len(settings)
    m = settings[0].microbatches
    n_layers = len(costing.configs)
    # Kept where a stage may start or end (the first layer, each block's but the first's, past the last).
    bounds_at = [0] + [b[0] for b in layout.blocks][1:] + [n_layers]
    kept = np.array(bounds_at[1:]) - 1  # prefix row k is the cumulative sum through layer k - 1
    # The copies' sums only where the costing has copies of tied weights.
    present = costing.vector_names
    prefix = {name: np.zeros((len(bounds_at), K)) for name, key in _SUMMED.items() if key in present}
    transient = np.zeros(K)
    # Settings share the arrays of what they do not change (``layer_vectors`` gives the same
    # array object): each distinct array's prefix sums are taken once and copied.
    summed: dict = {}
    with_edges: dict = {}
    taken: dict = {}  # each layer-vector array's columns, taken once (by array)
    blocked = {}
    for j, o in enumerate(settings):
        vec = {}
        if o.recompute == "block":
            deltas = costing.block_deltas(o, act_bytes, edges, targets, columns)
            blocked[j] = ({**deltas, "host": _recomputed_host(costing, o, deltas["micro"].shape[1])},
                          search_layers[j])
            o = o.as_policy("none")
        for name, array in costing.layer_vectors(o, act_bytes).items():
            if id(array) not in taken:
                # In row order (C-contiguous), as a costing of those rows alone has them.
                taken[id(array)] = (np.ascontiguousarray(array[:, columns]), array)
            vec[name] = taken[id(array)][0]
        into = slice(j * K1, (j + 1) * K1)
        if len(targets):
            moved = costing.edge_rows(edges, targets, o, columns)
            key = (id(vec["micro"]), id(moved))
            if key not in with_edges:
                micro = vec["micro"].copy()
                np.add.at(micro, np.asarray(targets), moved / m)
                with_edges[key] = (micro, vec["micro"], moved)
            vec = {**vec, "micro": with_edges[key][0]}
        for name, key in _SUMMED.items():
            if name not in prefix:
                continue
            first = summed.get(id(vec[key]))
            if first is None:
                summed[id(vec[key])] = (name, into, vec[key])
                prefix[name][1:, into] = np.cumsum(vec[key], axis=0)[kept]
            else:
                prefix[name][1:, into] = prefix[first[0]][1:, first[1]]
        transient[into] = costing.transient_rows(vec, o)
    row_of = {layer: r for r, layer in enumerate(bounds_at)}
    return _Sums(prefix, transient, row_of, _block_settings(blocked, settings, K1) if blocked else None)


def _recomputed_host(costing, options, K: int) -> np.ndarray:
    """Per block in ``block_order`` and column (``(blocks, K)``), the host time its recomputed
    forward adds to a micro-batch under ``block`` (:func:`~pase.planning.host_floor.recomputed_host_seconds`)."""
    st = costing.structure
    per_block = recomputed_host_seconds(options, expert_flags(st.blocks, st.experts, costing.block_order()))
    return np.repeat(per_block[:, None], K, axis=1)


#: What a ``block`` setting's chunks add to a stage's sums per block recomputed: its deltas'
#: names and the stage sums they add to (``host_extra``: the host time of the forwards issued
#: again, which the host floor counts).
_CHUNK_DELTAS = (("micro", "micro"), ("activations", "acts"), ("host", "host_extra"))


def _block_settings(blocked: dict, settings, K1: int) -> _BlockSettings:
    """The ``block`` settings' columns side by side, their deltas and block counts."""
    return _BlockSettings(
        np.concatenate([np.arange(j * K1, (j + 1) * K1) for j in blocked]),
        {name: np.concatenate([blocked[j][0][name] for j in blocked], axis=1)
         for name in ("micro", "activations", "working", "host")},
        np.repeat([settings[j].recompute_layers for j in blocked], K1),
        np.repeat([blocked[j][1] for j in blocked], K1))


def _tried(candidates: list, schedules, m: int, pp: int, vpps, extra=(0, 0)) -> list:
    """Every ``(cut, schedule, chunks)`` tried, in order: 1F1B with one chunk; interleaved (where
    ``pp`` divides the micro-batches) with every chunk count that splits the cut's stages
    (:func:`interleavings`), or those of ``vpps``."""
    tried = []
    for c, counts in enumerate(candidates):
        for schedule in schedules:
            if schedule == "1f1b":
                vs = [1]
            else:
                if m % pp:
                    continue
                vs = interleavings(counts, extra)
                if vpps is not None:
                    vs = [v for v in vs if v in vpps]
            tried += [(c, schedule, vpp) for vpp in vs]
    return tried


def _expert_blocks(costing, layout: Layout) -> np.ndarray | None:
    """The blocks of ``layout`` holding a mixture of experts before each block and in all
    (:attr:`_Timing.expert_blocks`); ``None`` where no block holds one."""
    st = costing.structure
    if not st.experts:
        return None
    held = expert_flags(st.blocks, st.experts, [st.blocks[block[0]] for block in layout.blocks])
    return np.concatenate([[0.0], np.cumsum(held)])


class _Timing(NamedTuple):
    """What prices a pipeline's stages from their sums (:meth:`figures`): the stage count, the
    micro-batches, the options, each stage's micro-batches in flight under 1F1B, its drain (the
    backward passes of a chunk it ends before the first stage, as shares of ``t / v``) and the
    overlap efficiency."""

    pp: int
    m: int
    options: object
    in_flight_1: np.ndarray
    drain_share: np.ndarray
    efficiency: float
    #: Each column's tensor-parallel degree (the host floor's wait), ``(K,)`` or 1.
    tp: np.ndarray | int = 1
    extra: tuple = (0, 0)
    #: The device's memory cap: a stage whose tensors fit it only once the caching allocator
    #: gives its cached blocks back loses ``options.retry_seconds`` a micro-batch.
    cap: float = np.inf
    #: Per column, the all-reduce of the tied copies' gradients between the first and the last
    #: stage once a step (:func:`tied_seconds`).
    tied: np.ndarray | float = 0.0
    #: GPUs of one NVLink domain: a tensor-parallel group beyond it waits across nodes.
    domain: float = np.inf
    #: The blocks holding a mixture of experts before each block, and in all (``blocks + 1``):
    #: a stage's count is the difference at its bounds (the host floor counts them again).
    expert_blocks: np.ndarray | None = None

    def figures(self, stage: dict, p2p, transient, vpp: int, blocks=0.0, tp=None, tied=None, experts=0.0) -> tuple:
        """Per-stage micro-batch time, step, per-stage memory, peak and exposed sends of
        ``(cuts, pp, K)`` sums; ``blocks``: each stage's blocks, ``(cuts, pp)``, ``experts`` those
        of them holding a mixture of experts; ``tp`` and
        ``tied``: the columns' tensor-parallel degrees and tied all-reduces where the columns
        are not all of :attr:`tp`'s and :attr:`tied`'s."""
        pp, m = self.pp, self.m
        o = self.options
        # Each chunk of a stage also pays its fixed time per micro-batch (entering the chunk and
        # waiting on its batched send and receive: chunk_overhead_seconds), which overlap cannot
        # hide; a stage's micro-batch takes at least its blocks' host time (the host floor).
        sends = exposed_sends(stage["micro"], vpp * p2p, vpp, o) + vpp * o.chunk_overhead_seconds
        tp = self.tp if tp is None else tp
        host = host_seconds(o, np.asarray(blocks, dtype=np.float64)[..., None], True, tp,
                            np.asarray(experts, dtype=np.float64)[..., None]) + stage.get("host_extra", 0.0)
        device = stage["micro"]
        if o.tp_node_wait_seconds:  # a tensor-parallel group across nodes waits at its collectives
            device = device + node_wait_seconds(o, np.asarray(blocks, dtype=np.float64)[..., None], tp, self.domain)
        device = device if not np.any(host) else np.maximum(device, host)
        t = device + sends
        slowest = t.max(axis=1)
        fill = (pp - 1) / vpp
        pipe = (m + fill) * slowest
        # The last micro-batch's backward pass runs from the last stage to the first, so stage s
        # finishes s backward passes of a chunk (two thirds of t / v each) before the first
        # stage does: its weight synchronisation may run in that drain.
        drain = self.drain_share * t / vpp
        exposed = chunk_sync(stage["sync_raw"], t, pp, vpp, self.efficiency, stage["sync"])
        own = stage["step"] + stage["copy_step"] if "copy_step" in stage else stage["step"]
        after = np.maximum(exposed + own - stage["sync"] - drain, 0.0)
        tied = self.tied if tied is None else tied
        if np.any(tied):  # the first and the last stage all-reduce their tied copies after it
            after = after + np.isin(np.arange(pp), (0, pp - 1))[:, None] * tied
        step = pipe + after.max(axis=1)
        in_flight = self.in_flight_1 * (1.0 + (pp - 1) / (pp * vpp)) if vpp > 1 else self.in_flight_1
        memory = stage["state"] + in_flight[:, None] * stage["acts"] + stage["logits"] + transient
        if "copy_state" in stage:  # the last stage's copies of tied weights
            memory = memory + stage["copy_state"]
        if o.retry_seconds and o.fragmentation and np.isfinite(self.cap):
            # Every stage stalls with the one whose allocator retries (allocator.retry_seconds).
            stranded = stranded_bytes(stage["acts"], in_flight[:, None], o.fragmentation, o.interleave_fragmentation)
            step = step + retry_seconds(memory, stranded, self.cap, m, o.retry_seconds).max(axis=1)
        return t, step, memory, memory.max(axis=1), sends


class _Tried(NamedTuple):
    """Every ``(cut, schedule, chunks)`` tried, priced: per tried and column the step and peak
    (``(tried, K)``), per-stage times, memory and exposed sends (``(pp, K)`` each) and the
    ``block`` settings' block counts; and per column the best of them (:func:`_best_plans`)."""

    steps: np.ndarray
    peaks: np.ndarray
    times: list
    memories: list
    exposed_p2p: list
    layers_of: np.ndarray
    best_of: np.ndarray
    best_step: np.ndarray
    best_peak: np.ndarray


def _price_tried(stage_all: dict, tried: list, n_cuts: int, bounds: list, sums: _Sums, p2p: np.ndarray,
                 timing: _Timing, cap) -> _Tried:
    """Every tried ``(cut, schedule, chunks)`` priced, those of one chunk count together; the
    ``block`` settings' columns by :func:`_block_chunks`."""
    K = len(sums.transient)
    steps, peaks, times, memories = [None] * len(tried), [None] * len(tried), [None] * len(tried), [None] * len(tried)
    exposed_p2p = [None] * len(tried)
    layers_of = np.zeros((len(tried), K), dtype=np.int64)  # block settings' recompute_layers
    blocked, transient = sums.blocked, sums.transient
    for vpp in sorted({v for _, _, v in tried}):
        which = [j for j, (_, _, v) in enumerate(tried) if v == vpp]
        rows = [tried[j][0] for j in which]
        stage = stage_all if rows == list(range(n_cuts)) else {name: S[rows] for name, S in stage_all.items()}
        blocks = np.array([np.diff(bounds[r]) for r in rows], dtype=np.float64)
        experts = (0.0 if timing.expert_blocks is None else
                   np.array([np.diff(timing.expert_blocks[bounds[r]]) for r in rows], dtype=np.float64))
        t, step, memory, peak, sends = timing.figures(stage, p2p, transient, vpp, blocks, experts=experts)
        if blocked is not None:
            into = blocked.columns
            part = {name: S[:, :, into] for name, S in stage.items()}
            found = _block_chunks(part, blocked.deltas, [bounds[r] for r in rows], vpp, blocked.layers,
                                  blocked.searched, peak[:, into] <= cap, cap, timing.m + (timing.pp - 1) / vpp,
                                  lambda sums_, extra, cols: timing.figures(
                                      sums_, p2p[into][cols], transient[into][cols] + extra, vpp, blocks,
                                      np.broadcast_to(timing.tp, (K,))[into][cols],
                                      np.broadcast_to(timing.tied, (K,))[into][cols], experts),
                                  timing.extra)
            t[:, :, into], step[:, into], memory[:, :, into], peak[:, into] = found[:4]
            layers_of[np.ix_(which, into)] = found[4]
            sends[:, :, into] = found[5]
        for n, j in enumerate(which):
            steps[j], peaks[j], times[j], memories[j] = step[n], peak[n], t[n], memory[n]
            exposed_p2p[j] = sends[n]
    steps, peaks = np.array(steps), np.array(peaks)  # (tried, K)
    # Fitting beats not fitting; among fitting, faster; among not fitting, smaller; of equals,
    # the first tried.
    fits = peaks <= cap
    columns = np.arange(K)
    fitting = np.argmin(np.where(fits, steps, np.inf), axis=0)
    fitting = np.where(fits[fitting, columns], fitting, np.argmax(fits, axis=0))
    smallest = np.argmin(peaks, axis=0)
    any_fits = fits.any(axis=0)
    best_of = np.where(any_fits, fitting, np.where(peaks[smallest, columns] < np.inf, smallest, -1))
    chosen = np.maximum(best_of, 0)
    best_step = np.where(best_of >= 0, steps[chosen, columns], np.inf)
    best_peak = np.where(best_of >= 0, peaks[chosen, columns], np.inf)
    return _Tried(steps, peaks, times, memories, exposed_p2p, layers_of, best_of, best_step, best_peak)


def _best_plans(priced: _Tried, tried: list, candidates: list, cap, pp: int, m: int, extra=(0, 0)) -> list:
    """Each column's :class:`StagePlan`: its best tried cut, schedule and chunks (``None`` where
    no pipeline applies)."""
    plans = []
    for i in range(len(priced.best_of)):
        if priced.best_of[i] < 0:
            plans.append(None)
            continue
        j = priced.best_of[i]
        c, schedule, vpp = tried[j]
        fill = (pp - 1) / vpp
        times = priced.times[j]
        slowest_stage = int(np.argmax(times[:, i]))
        plans.append(StagePlan(pp, schedule, vpp, tuple(int(x) for x in candidates[c]),
                               tuple(times[:, i].tolist()), tuple(priced.memories[j][:, i].tolist()),
                               float(priced.exposed_p2p[j][slowest_stage, i]), fill / (m + fill),
                               float(priced.steps[j, i]), int(priced.layers_of[j, i]), tuple(extra)))
    return plans


class _Chunks(NamedTuple):
    """The chunks of every cut of a ``block`` setting's pipeline (:func:`_block_chunks`): blocks
    per chunk and each chunk's first block (``(cuts, chunks)``), the prefix sums of the blocks'
    micro-batch and activation deltas (a row of zeros first), their working sets (a row of
    zeros last, for chunks past their end), the largest chunk of each cut, the count each
    column is priced at where not searched, the largest working set of the chunks' first blocks
    (``(cuts, K)``) and ``vpp``."""

    sizes: np.ndarray
    starts: np.ndarray
    prefix: dict
    working: np.ndarray
    largest_chunk: np.ndarray
    fixed: np.ndarray
    firsts: np.ndarray
    vpp: int


def _chunks_of(stage: dict, deltas: dict, bounds: list, vpp: int, layers: np.ndarray, searched: np.ndarray,
               plain_fits: np.ndarray, units=(0, 0)) -> _Chunks:
    """:class:`_Chunks` of the cuts of ``bounds`` (each cut's first block per stage; ``units``:
    the embedding and the loss counted in the chunks, :func:`chunk_sizes`)."""
    R, P, K = stage["micro"].shape
    # Each stage's chunks (chunk_sizes: one block apart at most), as its run of blocks in order.
    split = [stage_chunks(tuple(int(bound[s + 1] - bound[s]) for s in range(P)), vpp, units) for bound in bounds]
    sizes = np.array([[c for stage_chunks in chunks for c in stage_chunks] for chunks in split],
                     dtype=np.int64)  # (cuts, chunks)
    starts = np.array([[bound[s] + sum(chunks[s][:k]) for s in range(P) for k in range(vpp)]
                       for bound, chunks in zip(bounds, split)], dtype=np.int64)  # each chunk's first block
    zero = np.zeros((1, K))
    prefix = {name: np.concatenate([zero, np.cumsum(deltas[name], axis=0)]) for name, _ in _CHUNK_DELTAS}
    working = np.concatenate([deltas["working"], zero])  # a row of zeros for chunks past their end
    largest_chunk = sizes.max(axis=1)  # (cuts,)
    # The count each column is priced at: its own (at most the largest chunk), or any where the
    # plan without recomputation does not fit (``searched``), one where it does.
    fixed = np.where(searched[None, :] & plain_fits, 1, np.minimum(layers[None, :], largest_chunk[:, None]))
    # The largest working set of the chunks' first blocks, per cut and column.
    firsts = np.where((sizes >= 1)[:, :, None], working[np.minimum(starts, len(working) - 1)], 0.0).max(axis=1)
    return _Chunks(sizes, starts, prefix, working, largest_chunk, fixed, firsts, vpp)


def _at_counts(stage: dict, chunks: _Chunks, counts: np.ndarray, working: np.ndarray, cols: np.ndarray,
               figures) -> tuple:
    """The block columns ``cols`` priced at ``counts`` blocks recomputed per chunk (``(cuts,
    len(cols))``), ``working`` (``(cuts, K)``) the largest working set of those blocks."""
    R, P, _ = stage["micro"].shape
    taken = np.minimum(counts[:, None, :], chunks.sizes[:, :, None])  # (cuts, chunks, columns)
    which = cols[None, None, :]
    starts = chunks.starts[:, :, None]
    sums = {name: S[:, :, cols] for name, S in stage.items()}
    for name, key in _CHUNK_DELTAS:
        P_ = chunks.prefix[name]
        added = P_[starts + taken, which] - P_[starts, which]
        sums[key] = sums.get(key, 0.0) + added.reshape(R, P, chunks.vpp, len(cols)).sum(axis=2)
    return figures(sums, working[:, None, cols], cols)


def _block_chunks(stage: dict, deltas: dict, bounds: list, vpp: int, layers: np.ndarray, searched: np.ndarray,
                  plain_fits: np.ndarray, cap, slots: float, figures, units=(0, 0)) -> tuple:
    """The ``block`` settings' pipelines: ``stage`` their ``(cuts, pp, K)`` sums priced as
    ``none``, ``deltas`` their :meth:`~pase.costing.training.TrainingCosting.block_deltas`
    (``(blocks, K)``), ``bounds`` each cut's first block per stage (and past the last). Each
    stage's ``vpp`` chunks (:func:`chunk_sizes`) of ``c`` blocks recompute their first
    ``min(n, c)``: their micro-batch and activation deltas added, the largest working set of a
    block recomputed (anywhere) added to the transient memory. ``n`` is ``layers`` (per column,
    at most the largest chunk), or where ``searched`` every count from 1 to the largest chunk's
    blocks (more recompute the same), keeping per cut and column the fastest that fits ``cap``,
    else the least memory, the smallest ``n`` of equals (:func:`_searched_counts`). Returns
    ``(t, step, memory, peak, n, sends)`` as ``figures`` gives them, with the ``n`` of each cut
    and column. ``figures(sums, extra, cols)`` prices the block columns ``cols``. Counts are
    searched only where the plan without recomputation does not fit (``plain_fits`` false, per
    cut and column); where it fits, one block per chunk is priced. ``units``: as :func:`_chunks_of`."""
    R, P, K = stage["micro"].shape
    chunks = _chunks_of(stage, deltas, bounds, vpp, layers, searched, plain_fits, units)
    one = ~(searched[None, :] & ~plain_fits).any(axis=0) & (chunks.fixed == 1).all(axis=0)
    if not one.any():
        return _searched_counts(stage, chunks, searched[None, :] & ~plain_fits, cap, slots, figures)
    # Columns priced at one block per chunk in every cut: at once (the working set of the
    # chunks' first blocks is the recomputed ones'), the others as below.
    counts = np.ones((R, int(one.sum())), dtype=np.int64)
    cols = np.flatnonzero(one)
    priced = _at_counts(stage, chunks, counts, chunks.firsts, cols, figures)
    if one.all():
        t, step, memory, peak, sends = priced
        return t, step, memory, peak, counts, sends
    rest = np.flatnonzero(~one)
    found = _block_chunks({k: v[:, :, rest] for k, v in stage.items()}, {k: v[:, rest] for k, v in deltas.items()},
                          bounds, vpp, layers[rest], searched[rest], plain_fits[:, rest], cap, slots,
                          lambda sums, extra, c: figures(sums, extra, rest[c]), units)
    out = [np.zeros((R, P, K)), np.zeros((R, K)), np.zeros((R, P, K)), np.zeros((R, K)),
           np.zeros((R, K), dtype=np.int64), np.zeros((R, P, K))]
    for i, (whole_value, part_value) in enumerate(zip(priced[:4] + (counts, priced[4]), found)):
        out[i][..., cols] = whole_value
        out[i][..., rest] = part_value
    return tuple(out)


class _BestCounts:
    """Per cut and column the best priced so far (what ``figures`` gives, and its count)."""

    def __init__(self, R: int, P: int, K: int):
        self.best = {"t": np.zeros((R, P, K)), "step": np.full((R, K), np.inf), "memory": np.zeros((R, P, K)),
                     "peak": np.full((R, K), np.inf), "n": np.zeros((R, K), dtype=np.int64),
                     "sends": np.zeros((R, P, K))}

    def keep(self, mask, cols, priced, n) -> None:
        """Where ``mask`` (cuts x ``cols``): ``priced`` (``figures``' five arrays) at count ``n``."""
        best = self.best
        t_, step_, memory_, peak_, sends_ = priced
        for key, value in (("t", t_), ("memory", memory_), ("sends", sends_)):
            best[key][:, :, cols] = np.where(mask[:, None, :], value, best[key][:, :, cols])
        for key, value in (("step", step_), ("peak", peak_), ("n", n)):
            best[key][:, cols] = np.where(mask, value, best[key][:, cols])

    def result(self) -> tuple:
        return tuple(self.best[key] for key in ("t", "step", "memory", "peak", "n", "sends"))


def _searched_counts(stage: dict, chunks: _Chunks, searched: np.ndarray, cap, slots: float, figures) -> tuple:
    """:func:`_block_chunks` where some column's count is searched (``searched``: per cut and
    column). Cuts no count fits are priced once, every block recomputed; where the chunks'
    first blocks hold the largest working set the least count that fits is found by halving;
    the rest count by count from 1. The counts stop where no column can gain: the step is at
    least ``slots`` (``m + (pp - 1) / vpp``) times the slowest stage's micro-batch, which only
    grows with the count."""
    R, P, K = stage["micro"].shape
    best = _BestCounts(R, P, K)
    hopeless, tail, whole = _hopeless_cuts(stage, chunks, searched, cap, slots, figures, best)
    settled = _halved_counts(stage, chunks, searched & ~hopeless & (chunks.firsts == whole[:, 0, :]), tail, cap,
                             slots, figures, best)
    return _counted(stage, chunks, searched, hopeless | settled, tail, cap, slots, figures, best)


def _hopeless_cuts(stage: dict, chunks: _Chunks, searched: np.ndarray, cap, slots: float, figures,
                   best: _BestCounts) -> tuple:
    """``(hopeless, tail, whole)``: the searched cuts and columns no count can fit, kept priced
    with every block recomputed; what the step holds beyond the pipeline with every block
    recomputed (``tail``); the largest working set of any block (``whole``, ``(cuts, 1, K)``)."""
    R, P, K = stage["micro"].shape
    vpp, starts, sizes, prefix = chunks.vpp, chunks.starts, chunks.sizes, chunks.prefix
    # A cut of a searched column no count can fit (``hopeless``) is priced once, every block
    # recomputed: recomputing a block only drops stored activations and the working set of the
    # blocks recomputed only grows with the count, so no count's peak is below the one with every
    # saving and only the chunks' first blocks' working sets (``floor_peak``). Its result is
    # every block recomputed (``full``'s plan, this setting's least memory where the blocks'
    # working sets are alike; the search's least-memory answer takes ``full`` too).
    every = starts + sizes
    saved = {key: stage.get(key, 0.0) + (prefix[name][every] - prefix[name][starts]).reshape(R, P, vpp, K).sum(axis=2)
             for name, key in _CHUNK_DELTAS}
    everything = {**stage, **saved}
    floor_peak = figures(everything, chunks.firsts[:, None, :], np.arange(K))[3]
    hopeless = searched & (floor_peak > cap)  # (cuts, K)
    whole = np.broadcast_to(chunks.working[:-1].max(axis=0)[None, None, :], (R, 1, K))
    priced = figures(everything, whole, np.arange(K))
    # What the step holds beyond the pipeline with every block recomputed: the exposed
    # synchronisation and optimizer after the drain, which only shrink as the stages' times grow,
    # so no count's step holds less beyond its pipeline (a bound for stopping below).
    tail = priced[1] - slots * priced[0].max(axis=1)
    if hopeless.any():
        best.keep(hopeless, np.arange(K), priced, chunks.largest_chunk[:, None])
    return hopeless, tail, whole


def _halved_counts(stage: dict, chunks: _Chunks, alike: np.ndarray, tail: np.ndarray, cap, slots: float, figures,
                   best: _BestCounts) -> np.ndarray:
    """The cuts and columns settled by halving (``alike``: where the chunks' first blocks already
    hold the largest working set, repeated blocks alike, so the peak only falls as the count
    grows): the least count that fits, kept where the step beyond its pipeline is there already
    what it is with every block recomputed (``tail``): the step only grows with the count, so
    that count is the fastest that fits, priced no more."""
    R, _, K = stage["micro"].shape
    columns = np.flatnonzero(alike.any(axis=0))
    settled = np.zeros((R, K), dtype=bool)
    if not len(columns):
        return settled

    def at(counts):  # every block column of ``columns`` priced at its own count per cut
        return _at_counts(stage, chunks, counts, chunks.firsts, columns, figures)

    halving = alike[:, columns]
    l = np.ones((R, len(columns)), dtype=np.int64)
    h = np.broadcast_to(chunks.largest_chunk[:, None], l.shape).copy()
    while (halving & (l < h)).any():
        mid = np.where(halving, (l + h) // 2, 1)
        fits = at(mid)[3] <= cap
        h, l = np.where(halving & fits, mid, h), np.where(halving & ~fits, mid + 1, l)
    least = at(np.where(halving, l, 1))
    tail_ = least[1] - slots * least[0].max(axis=1)
    ok = halving & (least[3] <= cap) & (tail_ <= tail[:, columns] * (1 + 1e-12) + 1e-15)
    settled[:, columns] = ok
    best.keep(ok, columns, least, l)
    return settled


def _counted(stage: dict, chunks: _Chunks, searched: np.ndarray, hopeless: np.ndarray, tail: np.ndarray, cap,
             slots: float, figures, best: _BestCounts) -> tuple:
    """Every count from 1 up, for the columns some cut still needs a count for (a column done in
    every cut is priced no more: no later count changes it, as the test of ``done`` says)."""
    R, P, _ = stage["micro"].shape
    vpp, starts, sizes, prefix, working = chunks.vpp, chunks.starts, chunks.sizes, chunks.prefix, chunks.working
    largest = np.zeros((R, 1, stage["micro"].shape[2]))
    active = np.flatnonzero(~hopeless.all(axis=0))
    for n in range(1, int(sizes.max()) + 1):
        a = active
        ends = starts + np.minimum(n, sizes)  # blocks recomputed per chunk
        sums = {name: S[:, :, a] for name, S in stage.items()}
        for name, key in _CHUNK_DELTAS:
            P_ = prefix[name][:, a]
            sums[key] = sums.get(key, 0.0) + (P_[ends] - P_[starts]).reshape(R, P, vpp, len(a)).sum(axis=2)
        w = working[:, a]
        newest = np.where((sizes >= n)[:, :, None], w[np.minimum(starts + n - 1, len(w) - 1)], 0.0)
        largest[:, :, a] = np.maximum(largest[:, :, a], newest.max(axis=1)[:, None, :])
        priced = figures(sums, largest[:, :, a], a)
        step, peak = priced[1], priced[3]
        held_peak, held_step = best.best["peak"][:, a], best.best["step"][:, a]
        allowed = (searched[:, a] & ~hopeless[:, a]) | (n == chunks.fixed[:, a])
        fits, held = peak <= cap, held_peak <= cap
        better = allowed & np.where(fits, ~held | (step < held_step), ~held & (peak < held_peak))
        best.keep(better, a, priced, n)
        # Done: every fixed column priced; every searched one holds a fitting plan no later
        # count can beat (their steps are at least slots x the slowest stage's, which grows,
        # plus ``tail``).
        floor = slots * priced[0].max(axis=1) + tail[:, a]
        done = np.where(searched[:, a], hopeless[:, a] | ((best.best["peak"][:, a] <= cap)
                                                           & (floor >= best.best["step"][:, a])),
                        n >= chunks.fixed[:, a])
        active = a[~done.all(axis=0)]
        if not len(active):
            break
    return best.result()
