"""The vectors the searches read: each layer's step time by cause, every layer's vectors under
options as ``(n, K)`` arrays, and what recomputing each repeated block adds (block deltas)."""

from __future__ import annotations

import numpy as np

from pase.costing.training.collectives import ActivationCollectives
from pase.costing.training.compute import StepCompute
from pase.costing.training.edges import EdgeRows
from pase.costing.training.keeping import LayerKeeping, VectorGroups
from pase.costing.training.memory import MemoryKinds
from pase.costing.training.offload import HostOffload
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import FORWARD_COMM_SHARE, FORWARD_SHARE, PricedLayers
from pase.costing.training.recompute import RecomputePolicy
from pase.costing.training.sync import WeightSync

__all__ = ["LayerVectors", "LAYER_VECTORS"]

#: The arrays of :meth:`LayerVectors.layer_vectors`.
LAYER_VECTORS = ("micro", "step", "state", "activations", "logits", "gathered", "working", "sync", "sync_raw", "grads",
                 "tp_buffers", "copy_state", "copy_grads", "copy_step")


def _per_block(of: np.ndarray, pair: tuple, columns=None) -> np.ndarray:
    """``(blocks, K)``: per block, the sum over the rows whose block ``of`` names of the first
    array of ``pair`` less the second (or of the one array), at ``columns``."""
    blocks = int(of.max()) + 1 if len(of) else 0
    diff = pair[0] if len(pair) == 1 else pair[0] - pair[1]
    if columns is not None:
        diff = diff[:, columns]
    order = np.argsort(of, kind="stable")
    inside = order[of[order] >= 0]
    groups = of[inside]
    out = np.zeros((blocks, diff.shape[1]))
    if len(inside):
        starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        out[groups[starts]] = np.add.reduceat(diff[inside], starts, axis=0)
    out.setflags(write=False)
    return out


class LayerVectors:
    """Every layer's time by cause (:meth:`layer_time`) and its vectors under options, kept by
    the option fields they read (:meth:`layer_vectors`, :meth:`block_deltas`)."""

    def __init__(self, layers: PricedLayers, keeping: LayerKeeping, groups: VectorGroups, compute: StepCompute,
                 collectives: ActivationCollectives, sync: WeightSync, policy: RecomputePolicy, memory: MemoryKinds,
                 edges: EdgeRows):
        self.keeping, self.groups = keeping, groups
        self.configs, self.blocks = layers.configs, layers.structure.blocks
        self.compute, self.collectives, self.sync, self.policy = compute, collectives, sync, policy
        self.memory, self.edges = memory, edges
        self.offload = HostOffload(layers, compute, memory)
        #: The vectors computed: the copies' only where a pipeline's last stage holds one.
        copies = any(any(flags) for flags in layers.structure.copies)
        self.names = LAYER_VECTORS if copies else tuple(n for n in LAYER_VECTORS if not n.startswith("copy_"))

    # -- one layer ----------------------------------------------------------------------

    def microbatch_time(self, v: int, options: TrainingOptions) -> dict:
        """The parts of :meth:`layer_time` spent every micro-batch (all ``m`` of them):
        compute, recomputation (the forward share of the compute and of the activation
        collectives again; under ``moe_act`` the experts' activation pass alone), activation
        collectives."""
        m = options.microbatches
        c = self.compute.compute(v, options)
        a = self.collectives.exposed_activation(v, options)
        again = self.policy.recomputed(v, options)
        rerun = m * (FORWARD_SHARE * c + FORWARD_COMM_SHARE * a) if again else np.zeros(len(c))
        if options.recomputes("moe_act") and not again:  # the experts' activation alone runs again
            rerun = rerun + m * self.compute.expert_activation_seconds(v, options)
        if options.recomputes("shared_experts") and not again:  # the shared experts alone
            rerun = rerun + m * self.compute.shared_expert_seconds(v, options)
        out = {"compute": m * c, "recompute": rerun, "activation_comm": m * a}
        if "activations" in options.offload:  # the copies out and back that compute does not hide
            out["host_transfers"] = m * self.offload.micro_seconds(v, options, self.offload.machine.act_bytes)
        return out

    def layer_time(self, v: int, options: TrainingOptions) -> dict:
        """The parts of ``v``'s step time: compute, recomputation, activation collectives,
        exposed synchronisation, optimizer."""
        out = self.microbatch_time(v, options)
        out["weight_sync"] = self.sync.exposed_sync(v, options)
        out["optimizer"] = self.compute.optimizer_seconds(v, options)
        if options.offload:  # the host's work (costing.training.offload), as causes of their own
            for key, value in self.offload.step_parts(v, options).items():
                out[key] = out.get(key, 0.0) + value
        return out

    def _layer_vector(self, name: str, v: int, options: TrainingOptions, act_bytes: float):
        memory = self.memory
        if name == "micro":
            t = self.microbatch_time(v, options)
            return (t["compute"] + t["recompute"] + t["activation_comm"] + t.get("host_transfers", 0.0)
                    ) / options.microbatches
        if name == "step":
            step = self.sync.exposed_sync(v, options) + self.compute.optimizer_seconds(v, options)
            return step + self.offload.step_seconds(v, options) if options.offload else step
        if name == "state":
            return memory.model_state(v, options)
        if name == "activations":  # as tensors need them: the allocator's stranded share gives way
            return memory.stored_bytes(v, options, act_bytes)  # under pressure (allocator.released_within)
        if name == "logits":
            return memory.logit_bytes(v, options)
        if name == "gathered":
            return memory.gathered_bytes(v, options)
        if name == "working":
            return memory.working_bytes(v, options, act_bytes)
        if name == "sync":
            return self.sync.exposed_sync(v, options)
        if name == "sync_raw":
            return self.sync.sync(v, options)
        if name == "tp_buffers":
            return memory.tp_buffer_bytes(v, options)
        if name == "copy_state":
            return memory.copy_state(v, options)
        if name == "copy_grads":
            return memory.copy_gradient_elements(v, options)
        if name == "copy_step":
            return self.compute.copy_optimizer_seconds(v, options)
        return memory.output_gradient_bytes(v, options, act_bytes)

    # -- every layer ----------------------------------------------------------------------

    def layer_vectors(self, options: TrainingOptions, act_bytes: float) -> dict:
        """Every layer's vectors under ``options`` as ``(n, K)`` arrays: ``micro`` (one
        micro-batch's compute, recomputation and activation collectives), ``step`` (exposed
        synchronisation and optimizer; ``sync`` the synchronisation alone, ``sync_raw`` before
        overlap), ``state``, ``activations``, ``logits``, ``gathered`` and ``working`` bytes,
        ``grads`` (output gradients), ``tp_buffers`` (the tensor-parallel overlap's buffers),
        ``copy_state``, ``copy_grads`` and ``copy_step`` (the model state bytes, gradient
        elements and optimizer step of the copies a pipeline's last stage holds,
        ``MemoryKinds.copy_state``; only where it holds some). Layers equal in parts and place share one computation.
        The arrays are read-only and kept by the option fields they read: option sets equal in
        those fields get the very same array. Under ``block`` (no pipeline: one chunk) each
        layer's vectors are its vectors under ``full`` where the block is recomputed, else
        under ``none``."""
        if options.recompute == "block":
            return self._block_vectors(options, act_bytes)
        return {name: self.keeping.memo.get(("vectors", name, act_bytes), options,
                                            lambda o, name=name: self._vectors(name, o, act_bytes))
                for name in self.names}

    def _vectors(self, name: str, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """One of :meth:`layer_vectors`' arrays (read-only): each group representative's vector
        given to its members."""
        K = len(self.configs[0])
        rows = np.array([np.broadcast_to(self._layer_vector(name, v, options, act_bytes), (K,))
                         for v, _ in self.groups.groups], dtype=np.float64)
        out = rows[self.groups.group_of]
        out.setflags(write=False)
        return out

    def _block_vectors(self, options: TrainingOptions, act_bytes: float) -> dict:
        none = self.layer_vectors(options.as_policy("none"), act_bytes)
        full = self.layer_vectors(options.as_policy("full"), act_bytes)

        def mixed(o, name):
            out = np.where(self.policy.recomputed_mask(o)[:, None], full[name], none[name])
            out.setflags(write=False)
            return out

        return {name: none[name] if none[name] is full[name] else self.keeping.memo.get(
                    ("block vectors", name, act_bytes, id(none[name]), id(full[name])), options,
                    lambda o, name=name: mixed(o, name), hold=(none[name], full[name]))
                for name in self.names}

    # -- per repeated block ---------------------------------------------------------------

    def block_deltas(self, options: TrainingOptions, act_bytes: float, edges=None, targets=(),
                     columns=None) -> dict:
        """What recomputing each repeated block whole adds to keeping everything, per block in
        ``block_order`` and row, as ``(blocks, K)`` arrays: ``micro`` (seconds of one
        micro-batch: its layers' vectors under ``full`` less under ``none``, with the edges
        into them, ``edges`` of ``targets`` as ``edge_rows`` takes them, over ``m``),
        ``activations`` (bytes kept, at most 0), ``working`` (its working set in the
        backward pass, the ``recompute_working_set`` it may be). ``options``: every field but
        the policy. ``columns``: the rows priced (default all). ``block`` prices a chunk as
        ``none`` plus the deltas of the blocks it recomputes, plus the largest of their
        working sets: what :meth:`layer_vectors` and ``transient_rows`` give it.
        """
        memo = self.keeping.memo
        none_o, full_o = options.as_policy("none"), options.as_policy("full")
        none, full = self.layer_vectors(none_o, act_bytes), self.layer_vectors(full_o, act_bytes)
        of = self._block_of()
        out = {}
        for name in ("micro", "activations", "working"):
            # Each distinct pair of arrays once (settings share what they do not change): what
            # is kept reads no option, the arrays are named by identity and held.
            pair = (none[name],) if name == "working" else (full[name], none[name])
            out[name] = memo.get(("block deltas", name) + tuple(map(id, pair)) + (id(columns),), options,
                                 lambda o, pair=pair: _per_block(of, pair, columns), hold=pair + (columns,))
        if edges is not None and len(targets):
            pair = (self.edges.edge_rows(edges, targets, full_o, columns),
                    self.edges.edge_rows(edges, targets, none_o, columns))
            moved = memo.get(("block deltas", "edges") + tuple(map(id, pair)), options,
                             lambda o: _per_block(of[np.asarray(targets, dtype=np.int64)], pair), hold=pair)
            out["micro"] = out["micro"] + moved / options.microbatches
        return out

    def _block_of(self) -> np.ndarray:
        """Per layer, its block's place in ``block_order`` (-1 outside the blocks)."""
        order = {b: k for k, b in enumerate(self.policy.block_order())}
        return np.array([-1 if b is None else order[b] for b in self.blocks], dtype=np.int64)
