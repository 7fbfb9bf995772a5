"""Offload to the host (``offload=``): what leaves device memory, what the host holds, and the
time of the host-link copies and of the CPU optimizer step, overlapped as the engines run them."""

from __future__ import annotations

import numpy as np

from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import FORWARD_SHARE
from pase.machines.host import host_side

# Sources (research notes of issue 45, ``/work/notes/offload.md``): DeepSpeed ZeRO-Offload moves
# fp32 gradients device-to-host during the backward pass and bf16 parameters back after a CPU Adam
# step the GPU waits for (offload.md:15-35, DS ``stage_1_and_2.py:1563-1577``, ``:2314-2315``);
# FSDP2's ``CPUOffloadPolicy`` copies each sharded parameter host-to-device before every all-gather
# (offload.md:180-196); Megatron-Core offloads stored activations while the layers compute
# (offload.md:159-173); Calculon exposes only what a block's compute does not hide (offload.md:247-253).

__all__ = ["HostOffload", "kept_activation_share", "GRAD_HOST_BYTES", "OPTIMIZER_KINDS"]

#: Bytes per parameter element of the gradient the host receives: fp32 (DeepSpeed casts the
#: gradient to the master dtype on the GPU before the copy, offload.md:15-18; Megatron copies its
#: fp32 main gradients, offload.md:142-155).
GRAD_HOST_BYTES = 4.0
#: The offload kinds that move the optimizer state and its update off the device.
OPTIMIZER_KINDS = ("optimizer", "nvme")


def kept_activation_share(blocks: int, in_block: bool, options: TrainingOptions) -> float:
    """The share of a layer's stored activations that stays on the device: under
    ``offload=activations`` a repeated block's layer keeps two blocks' worth of the ``blocks``
    (a double buffer: the block being copied out or in and the one computing), all others keep
    theirs (the embedding, the loss: outside the blocks)."""
    if "activations" not in options.offload or not in_block or blocks <= 2:
        return 1.0
    return 2.0 / blocks


class HostOffload:
    """Per layer and row (``(K,)`` arrays, per device): the step's host work by cause
    (:meth:`step_parts`), each micro-batch's exposed activation copies (:meth:`micro_seconds`),
    the bytes the host holds (:meth:`host_bytes`) and its drive holds (:meth:`drive_bytes`)."""

    def __init__(self, layers, compute, memory):
        self.machine = layers.machine
        self.host = host_side(layers.machine)
        self.parts, self.configs = layers.parts, layers.configs
        self.charged, self.blocks = layers.structure.charged, layers.structure.blocks
        self.block_count = len({b for b in self.blocks if b is not None})
        self.members: dict = {}
        for v, b in enumerate(self.blocks):
            if b is not None:
                self.members.setdefault(b, []).append(v)
        self.compute, self.memory = compute, memory
        self.per_node = float(layers.machine.devices_per_node or 1)

    def _host(self):
        if self.host is None:
            raise ValueError(f"offload needs a machine with a host side (host link, memory, CPU optimizer rate); "
                             f"machine {self.machine.name!r} states none")
        return self.host

    def local_elements(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Parameter elements of ``v`` whose state this device keeps: its shard under ZeRO >= 1."""
        total = np.zeros(len(self.configs[v]))
        for (elements, r), charged in zip(self.parts[v].params, self.charged[v]):
            if charged:
                total = total + elements / (r if options.zero >= 1 else 1.0)
        return total

    def step_parts(self, v: int, options: TrainingOptions) -> dict:
        """Seconds of ``v``'s host work once per step, exposed: ``host_transfers`` and
        ``host_optimizer``.

        With ``P`` the local elements, ``c`` one micro-batch's compute of ``v``, ``m`` the
        micro-batches, ``g`` the GPUs of a node and ``R`` its CPU optimizer rate:

        - ``optimizer`` / ``nvme``: the fp32 gradients out, ``4P / d2h``, during the last
          micro-batch's backward (exposed beyond its ``(1 - 1/3) c``); the CPU Adam step over
          the node's ``gP`` elements, ``gP / R``; the updated weights back, ``w P / h2d``
          (none when ``params`` keeps them on the host): both after the backward pass, exposed
          (DeepSpeed's engine waits for them, offload.md:29-35). ``nvme``: the state (``o`` bytes
          per element) read and written back over the node's drive, ``2 o g P / nvme``.
        - ``params``: each all-gather's shard in first, ``w P / h2d``, twice per micro-batch
          (forward and backward), hidden behind the layer's compute: ``max(0, 2 m w P / h2d - m c)``.
        """
        K = len(self.configs[v])
        transfers, cpu = np.zeros(K), np.zeros(K)
        kinds = options.offload
        if not kinds or not (set(kinds) - {"activations"}):
            return {"host_transfers": transfers, "host_optimizer": cpu}
        host = self._host()
        P = self.local_elements(v, options)
        c = self.compute.compute(v, options)
        # The GPUs whose state one host steps: a node's, or fewer where the layer splits over fewer
        # devices (every device: offload runs without a pipeline).
        node = np.minimum(self.per_node, np.prod(np.asarray(self.configs[v], dtype=np.float64), axis=1))
        w, m = options.weight_bytes, options.microbatches
        if any(k in kinds for k in OPTIMIZER_KINDS):
            out = GRAD_HOST_BYTES * P / host.d2h_bytes_per_s
            transfers = transfers + np.maximum(out - (1.0 - FORWARD_SHARE) * c, 0.0)
            if "params" not in kinds:
                transfers = transfers + w * P / host.h2d_bytes_per_s
            cpu = cpu + node * P / host.optimizer_params_per_s
            if "nvme" in kinds:
                transfers = transfers + 2.0 * options.optimizer_bytes * node * P / self._drive(host)
        if "params" in kinds:
            copies = 2.0 * m * w * P / host.h2d_bytes_per_s
            transfers = transfers + np.maximum(copies - m * c, 0.0)
        return {"host_transfers": transfers, "host_optimizer": cpu}

    def _drive(self, host) -> float:
        if not host.has_nvme:
            raise ValueError(f"offload nvme needs a drive: machine {self.machine.name!r} names "
                             f"none (host nvme_gbps and nvme_gb)")
        return host.nvme_bytes_per_s

    def step_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        parts = self.step_parts(v, options)
        return parts["host_transfers"] + parts["host_optimizer"]

    # -- activations ------------------------------------------------------------------------

    def offloaded_activations(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes of ``v``'s stored activations that go to the host each micro-batch."""
        if "activations" not in options.offload:
            return np.zeros(len(self.configs[v]))
        share = kept_activation_share(self.block_count, self.blocks[v] is not None, options)
        return (1.0 - share) * self.memory.all_stored_bytes(v, options, act_bytes)

    def micro_seconds(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Exposed seconds of ``v``'s activation copies in one micro-batch: per block, its
        offloaded bytes ``A`` out during its forward (``A / d2h`` beyond the forward share of its
        compute ``C / 3``) and back during its backward (``A / h2d`` beyond ``2C / 3``); each
        layer its share ``A_v / A`` of the block's excess (Calculon's rule, offload.md:247-253);
        where the block's layers do not share rows (per-layer splits), ``v`` alone as the block."""
        b = self.blocks[v]
        K = len(self.configs[v])
        if "activations" not in options.offload or b is None:
            return np.zeros(K)
        host = self._host()
        # The block's rows are the same rows of its layers where they share them (a mesh's
        # costing); else (per-layer splits, rows of their own) each layer overlaps its own compute.
        members = self.members[b] if all(len(self.configs[u]) == K for u in self.members[b]) else [v]
        total = np.zeros(K)
        compute = np.zeros(K)
        for u in members:
            total = total + self.offloaded_activations(u, options, act_bytes)
            compute = compute + self.compute.compute(u, options)
        excess = (np.maximum(total / host.d2h_bytes_per_s - FORWARD_SHARE * compute, 0.0)
                  + np.maximum(total / host.h2d_bytes_per_s - (1.0 - FORWARD_SHARE) * compute, 0.0))
        mine = self.offloaded_activations(v, options, act_bytes)
        return np.where(total > 0, excess * mine / np.where(total > 0, total, 1.0), 0.0)

    # -- what the host holds ----------------------------------------------------------------

    def host_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes the host holds for ``v`` per device: ``optimizer``: the state and an fp32
        gradient, ``(o + 4) P``; ``nvme``: the gradient, ``4 P``; ``params``: the weight shard,
        ``w P``; ``activations``: one micro-batch's offloaded activations."""
        kinds = options.offload
        P = self.local_elements(v, options)
        out = np.zeros(len(self.configs[v]))
        if "optimizer" in kinds:
            out = out + (options.optimizer_bytes + GRAD_HOST_BYTES) * P
        if "nvme" in kinds:
            out = out + GRAD_HOST_BYTES * P
        if "params" in kinds:
            out = out + options.weight_bytes * P
        return out + self.offloaded_activations(v, options, act_bytes)

    def drive_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes the node's drive holds for ``v`` per device (``nvme``: the optimizer state)."""
        if "nvme" not in options.offload:
            return np.zeros(len(self.configs[v]))
        return options.optimizer_bytes * self.local_elements(v, options)
