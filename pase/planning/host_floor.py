"""Fixed times per repeated block and micro-batch: the host floor (a micro-batch takes at least
the time the engine's host needs to issue its blocks' kernels, eager engines, however fast the
device runs them), and the wait of a tensor-parallel group that spans nodes (device time)."""

from __future__ import annotations

import numpy as np

from pase.costing.training.parts import FORWARD_SHARE

__all__ = ["host_seconds", "floored", "block_count", "expert_block_count", "expert_flags", "recomputed_host_seconds",
           "node_wait_seconds", "node_doublings", "domain_of"]


def block_count(blocks) -> int:
    """The repeated blocks of a network (``NetworkStructure.blocks``: each layer's or ``None``).

    >>> block_count([None, "b0", "b0", "b1", None])
    2
    """
    return len({b for b in blocks if b is not None})


def _expert_held(blocks, experts) -> set:
    """The repeated blocks that hold a mixture of experts: ``blocks`` each layer's block
    (``NetworkStructure.blocks``), ``experts`` the mixtures' layers (``NetworkStructure.experts``)."""
    return {blocks[v] for v in experts if blocks[v] is not None}


def expert_block_count(blocks, experts) -> int:
    """How many repeated blocks hold a mixture of experts (arguments as :func:`expert_flags`).

    >>> expert_block_count([None, "b0", "b0", "b1", "b1"], {2})
    1
    """
    return len(_expert_held(blocks, experts))


def expert_flags(blocks, experts, order) -> np.ndarray:
    """Per block of ``order`` (``TrainingCosting.block_order``), 1 where it holds a mixture of
    experts, else 0: ``blocks`` each layer's block, ``experts`` the mixtures' layers.

    >>> expert_flags([None, "b0", "b0", "b1", "b1"], {2}, ["b0", "b1"]).tolist()
    [1.0, 0.0]
    """
    held = _expert_held(blocks, experts)
    return np.array([b in held for b in order], dtype=np.float64)


def recomputed_host_seconds(options, flags) -> np.ndarray:
    """Per block (``flags`` from :func:`expert_flags`), the host time its recomputed forward adds
    to a micro-batch: ``FORWARD_SHARE`` of the block's own host time, ``block_overhead_seconds``
    plus, where it holds a mixture of experts, ``moe_block_overhead_seconds`` (the host issues
    the forward again).

    >>> from pase.costing.training import TrainingOptions
    >>> [round(float(x), 12) for x in recomputed_host_seconds(TrainingOptions(moe_block_overhead_seconds=0.03), [1, 0])]
    [0.01, 0.0]
    """
    return FORWARD_SHARE * (options.block_overhead_seconds
                            + np.asarray(flags, dtype=np.float64) * options.moe_block_overhead_seconds)


def host_seconds(options, blocks, pipelined: bool, tp=1, experts=0):
    """Host time of one micro-batch over ``blocks`` repeated blocks, ``experts`` of them holding a
    mixture of experts (numbers or arrays that broadcast): ``blocks x block_overhead_seconds +
    experts x moe_block_overhead_seconds``, plus on a pipeline stage ``blocks x log2(tp) x
    pipeline_tp_wait_seconds`` (the tensor-parallel ranks' wait for the latest of them once the
    engine's receives stop the host).

    >>> from pase.costing.training import TrainingOptions
    >>> o = TrainingOptions(block_overhead_seconds=0.002, pipeline_tp_wait_seconds=0.001)
    >>> float(host_seconds(o, 4, False, 8)), float(host_seconds(o, 4, True, 8))   # 4 x 2 ms; 4 x (2 + 3 x 1) ms
    (0.008, 0.02)
    >>> float(host_seconds(TrainingOptions(moe_block_overhead_seconds=0.01), 4, False, experts=3))  # 3 x 10 ms
    0.03

    Under ``recompute=full`` the host issues every block's forward a second time: its own times
    (not the tensor-parallel wait) count ``1 + FORWARD_SHARE`` times (a forward is a third of a
    block's work, as on the device).

    >>> round(float(host_seconds(TrainingOptions(recompute="full", moe_block_overhead_seconds=0.009), 1, False,
    ...                          experts=1)), 6)   # 9 ms x 4/3
    0.012
    """
    again = 1.0 + FORWARD_SHARE if options.recompute == "full" else 1.0
    per_block = again * options.block_overhead_seconds + (
        options.pipeline_tp_wait_seconds * np.log2(np.asarray(tp, dtype=np.float64)) if pipelined else 0.0)
    return (np.asarray(blocks, dtype=np.float64) * per_block
            + np.asarray(experts, dtype=np.float64) * again * options.moe_block_overhead_seconds)


def domain_of(machine) -> float:
    """GPUs of one NVLink domain of ``machine`` (its node unless it says more; unbounded for a
    machine without nodes)."""
    return float(machine.nvlink_domain or machine.devices_per_node or np.inf)


def node_doublings(tp, domain: float):
    """``log2`` of the nodes of ``domain`` GPUs a tensor-parallel group of ``tp`` ranks spans
    (numbers or arrays): 0 inside one node.

    >>> [float(node_doublings(tp, 8)) for tp in (4, 8, 16, 64)]
    [0.0, 0.0, 1.0, 3.0]
    """
    return np.log2(np.maximum(np.ceil(np.asarray(tp, dtype=np.float64) / domain), 1.0))


def node_wait_seconds(options, blocks, tp, domain: float):
    """Device time of one micro-batch over ``blocks`` repeated blocks that a tensor-parallel
    group of ``tp`` ranks (numbers or arrays that broadcast) loses waiting across nodes of
    ``domain`` GPUs: ``blocks x log2(ceil(tp / domain)) x tp_node_wait_seconds``, one wait per
    doubling of the nodes the group spans (``TrainingOptions.tp_node_wait_seconds``: the
    expected latest of ``n`` nodes grows as ``ln n``); 0 inside one node.

    >>> from pase.costing.training import TrainingOptions
    >>> o = TrainingOptions(tp_node_wait_seconds=0.001)
    >>> [float(node_wait_seconds(o, 10, tp, 8)) for tp in (8, 16, 32, 64)]   # 10 blocks x 0, 1, 2, 3 doublings x 1 ms
    [0.0, 0.01, 0.02, 0.03]
    """
    return np.asarray(blocks, dtype=np.float64) * node_doublings(tp, domain) * options.tp_node_wait_seconds


def floored(time_rows, step_rows, microbatches: int, host) -> np.ndarray:
    """A step of ``microbatches`` micro-batches whose device time per micro-batch is
    ``(time - step) / m`` (``step``: the synchronisation and optimizer after them) taking at
    least ``host`` per micro-batch: ``max(time, step + m host)``.

    >>> float(floored(np.array(10.0), np.array(2.0), 4, 3.0))   # 2 + 4 x 3 = 14 > 10
    14.0
    """
    return np.maximum(time_rows, step_rows + microbatches * np.asarray(host, dtype=np.float64))
