"""Memory by kind under a training configuration: what adds up over layers (model state, stored
activations, logits) and what is alive only part of the time (gathered weights, working sets)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pase.costing.precision import PrecisionPricing
from pase.costing.training.keeping import LayerKeeping, per_layer_kept
from pase.costing.training.offload import kept_activation_share
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import PricedLayers
from pase.costing.training.recompute import ActivationPlaces, RecomputePolicy
from pase.costing.training.structure import fsdp_units
from pase.model.layers.work import AllReduce

__all__ = ["MemoryKinds"]


class MemoryKinds:
    """Bytes per device by kind: per layer and row, those that add up over layers
    (:meth:`layer_memory`); per row, those alive only part of the step (:meth:`transient_parts`)."""

    def __init__(self, layers: PricedLayers, places: ActivationPlaces, keeping: LayerKeeping,
                 precision: PrecisionPricing, policy: RecomputePolicy):
        self.keeping = keeping
        self.precision = precision
        self.policy = policy
        self.network, self.configs, self.parts = layers.network, layers.configs, layers.parts
        self.blocks, self.charged = layers.structure.blocks, layers.structure.charged
        self.copies = layers.structure.copies
        self.machine_grad_bytes = layers.machine.grad_bytes
        self.loss_only, self.attention_inner = places.loss_only, places.attention_inner
        self.block_count = len({b for b in self.blocks if b is not None})

    # -- what adds up over layers ------------------------------------------------------

    def layer_memory(self, v: int, options: TrainingOptions, act_bytes: float) -> dict:
        """Bytes per device that add up over layers: model state by ZeRO stage, stored
        activations, the loss's logit-sized buffers (``loss_buffers`` of ``logit_bytes``)."""
        state = self.model_state(v, options)
        acts = self.stored_bytes(v, options, act_bytes)
        logits = self.logit_bytes(v, options)
        out = {"model_state": state, "activations": acts, "logits": logits}
        if options.fragmentation:
            # The activations' many mid-sized blocks, made and freed every micro-batch, fragment
            # the caching allocator (allocator.stranded_bytes); the model state is allocated once
            # and the loss's logit-sized buffers are whole segments reused as they are.
            out["fragmentation"] = options.fragmentation * acts
        return out

    @per_layer_kept
    def model_state(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes of ``v``'s weights, gradients and optimizer state by ZeRO stage (its charged
        weights), and its cached low-precision weights."""
        return self._state_over(v, options, self.charged[v]) + self.precision.cache_bytes(v, options)

    @per_layer_kept
    def copy_state(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes of the model state of the copies ``v`` holds on a pipeline's last stage
        (``NetworkStructure.copies``: a tied embedding's table under the output head), by ZeRO
        stage as its own weights; zeros elsewhere. The pipeline adds them to its last stage."""
        return self._state_over(v, options, self.copies[v])

    def _state_over(self, v: int, options: TrainingOptions, flags) -> np.ndarray:
        """Bytes of the weights, gradients and optimizer state of ``v``'s parameter tensors
        that ``flags`` names, by ZeRO stage."""
        state = np.zeros(len(self.configs[v]))
        for (elements, r), held in zip(self.parts[v].params, flags):
            if held:
                state = state + elements * options.bytes_per_parameter(r)
        return state

    def copy_gradient_elements(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Elements of the gradient of ``v``'s copies on a pipeline's last stage, counted at
        the machine's gradient element size (``grad_bytes``) for the size the engine reduces
        gradients in (``grad_reduce_bytes``, else ``grad_bytes``): what the two stages holding
        the tensor all-reduce once a step (``pipeline.tied_seconds``)."""
        total = np.zeros(len(self.configs[v]))
        for (elements, _), copied in zip(self.parts[v].params, self.copies[v]):
            if copied:
                total = total + elements
        size = options.grad_reduce_bytes if options.grad_reduce_bytes is not None else options.grad_bytes
        at = self.machine_grad_bytes
        return total * (size / float(at) if at else 1.0)

    def stored_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes of the activations ``v`` keeps on the device for the backward pass: all it
        stores (:meth:`all_stored_bytes`) but what ``offload=activations`` moves to the host."""
        stored = self.all_stored_bytes(v, options, act_bytes)
        if options.offload:
            stored = stored * kept_activation_share(self.block_count, self.blocks[v] is not None, options)
        return stored

    def all_stored_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes of the activations ``v`` keeps for the backward pass (the policy's
        ``stored_activations``), in the format its readers keep them in."""
        return act_bytes * self.policy.stored_activations(v, options) * self.precision.stored_scale(
            v, options, act_bytes)

    def logit_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The loss's logit-sized buffers (``loss_buffers`` of ``logit_bytes``); none elsewhere."""
        if self.network.layers[v].loss:
            return options.loss_buffers * options.logit_bytes * self.parts[v].activations
        return np.zeros(len(self.configs[v]))

    # -- per layer, what is alive part of the time ----------------------------------------

    def gathered_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes of ``v``'s weights once ZeRO-3 has gathered them (its tensor-parallel shard), at
        ``gather_bytes`` (else ``weight_bytes``)."""
        total = np.zeros(len(self.configs[v]))
        for elements, _ in self.parts[v].params:
            total = total + elements
        return (options.gather_bytes or options.weight_bytes) * total

    def working_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes alive while ``v``'s block runs its backward (the policy's ``working_activations``)."""
        return act_bytes * self.policy.working_activations(v, options)

    def output_gradient_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes of the gradient of ``v``'s output (none for the loss and the logits only it
        reads: the loss's buffers count those; none inside fused attention)."""
        if self.loss_only[v] or (options.fused_attention and self.attention_inner[v]):
            return np.zeros(len(self.configs[v]))
        return act_bytes * self.parts[v].activations

    @per_layer_kept
    def tp_buffer_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes of the tensor-parallel overlap's buffers ``v`` asks for, per row: the largest
        activation all-reduce over more than one device among its parts (the gathered activation
        of one micro-batch, ``elements`` a device) times :meth:`TrainingOptions.tp_buffer_bytes`;
        0 without ``tp_overlap``. The engine allocates them once, for the largest layer
        (:meth:`transient_parts` takes the largest over layers)."""
        per_element = options.tp_buffer_bytes()
        K = len(self.configs[v])
        if not per_element:
            return np.zeros(K)
        largest = np.zeros(K)
        for piece in self.parts[v].work.communication.pieces():
            if isinstance(piece, AllReduce) and not piece.weight:
                over = np.asarray(piece.group.size, dtype=np.float64) > 1
                largest = np.maximum(largest, np.where(over, np.asarray(piece.elements, dtype=np.float64), 0.0))
        return per_element * largest

    # -- per row, what is alive part of the time ------------------------------------------

    def transient_parts(self, gathered: np.ndarray, working: np.ndarray, grads: np.ndarray,
                        options: TrainingOptions, recomputed=None, buffers=None) -> dict:
        """The non-additive memory of every row from per-layer ``(n, K)`` bytes (the weights
        once gathered, the recomputation working set, the output gradient), as ``(K,)`` arrays:

        - ``gathered_weights`` (ZeRO-3): ``wrap_unit`` ``layer``: the two largest layers'
          weights (the one computed and the next, prefetched); ``block`` / ``prefetch``: the
          two largest units (a block each, the layers outside the blocks one root unit: the
          unit computed and the one prefetched, ``prefetch_units`` of them) at the gather's
          element size, plus ``unsharded_gradients``: the largest unit's full gradient at the
          reduction's element size, alive until its reduce-scatter;
        - ``recompute_working_set`` (full, op, block; selective where its modules rerun
          anything but attention: ``RecomputePolicy.working_mask``): the largest working
          activations of a block recomputed (``recomputed``: per layer; default every block);
        - ``activation_gradients``: the gradient a layer's backward reads and the one it
          writes, twice the largest output (``activation_grads``);
        - ``comm_buffers`` and ``reserve``: constants of the engine and the options;
        - ``tp_overlap_buffers``: the tensor-parallel overlap's buffers, the largest of the
          per-layer ``buffers`` (:meth:`tp_buffer_bytes`), where there are any.
        """
        K = gathered.shape[1]
        out = {}
        if options.zero == 3 and len(gathered):
            out.update(self._gathered_weights(gathered, options))
        if options.recompute in ("full", "op", "block") or (
                options.recompute == "selective" and recomputed is not None and np.any(recomputed)):
            members: dict = {}
            for v, b in enumerate(self.blocks[: len(working)]):
                if b is not None and (recomputed is None or recomputed[v]):
                    members.setdefault(b, []).append(v)
            if members:
                out["recompute_working_set"] = np.max(
                    np.array([working[m].sum(axis=0) for m in members.values()]), axis=0)
        if options.activation_grads and len(grads):
            out["activation_gradients"] = 2.0 * grads.max(axis=0)
        if options.comm_buffer_bytes:
            out["comm_buffers"] = np.full(K, float(options.comm_buffer_bytes))
        if buffers is not None and len(buffers) and options.tp_buffer_bytes():
            out["tp_overlap_buffers"] = buffers.max(axis=0)
        return out

    def _gathered_weights(self, gathered: np.ndarray, options: TrainingOptions) -> dict:
        """ZeRO-3's gathered weights (and, by units, the unsharded gradient) of
        :meth:`transient_parts`."""
        if options.wrap_unit == "layer":
            top = np.sort(gathered, axis=0)[-2:]
            return {"gathered_weights": top.sum(axis=0) if len(top) > 1 else 2.0 * top[0]}
        index, count = fsdp_units(self.blocks)
        units = np.zeros((count, gathered.shape[1]))
        np.add.at(units, index[: len(gathered)], gathered)
        gather = options.gather_bytes or options.weight_bytes
        top = np.sort(units, axis=0)[::-1]
        out = {"gathered_weights": top[:2].sum(axis=0)}  # the unit computed and the one prefetched
        # A block's full gradient, at the reduction's element size, until its reduce-scatter
        # (the root unit's reduces at the end, when the activations are gone).
        reduce = options.grad_reduce_bytes or options.grad_bytes
        blocks = units[1:] if count > 1 else units
        out["unsharded_gradients"] = blocks.max(axis=0) * (reduce / gather)
        return out

    def transient_rows(self, vectors: dict, options: TrainingOptions, layers=None) -> np.ndarray:
        """The non-additive memory of every row (all layers at that row) from the per-layer
        vectors ``gathered``, ``working``, ``grads`` and ``tp_buffers`` (:meth:`transient_parts`)
        plus the reserve. ``layers`` restricts the gathered weights to some layers (default all)."""
        if layers is None:
            arrays = (vectors["gathered"], vectors["working"], vectors["grads"], vectors.get("tp_buffers"))
            return self.keeping.memo.get(("transient_rows",) + tuple(map(id, arrays)), options,
                                         lambda o: self._transient_rows(vectors, o), hold=arrays)
        return self._transient_rows(vectors, options, layers)

    def _transient_rows(self, vectors: dict, options: TrainingOptions, layers=None) -> np.ndarray:
        K = vectors["gathered"].shape[1]
        gathered = vectors["gathered"]
        if layers is not None:
            keep = np.zeros(len(gathered), dtype=bool)
            keep[list(layers)] = True
            gathered = np.where(keep[:, None], gathered, 0.0)
        again = self.policy.working_mask(options) if options.recompute in ("op", "block", "selective") else None
        parts = self.transient_parts(gathered, vectors["working"], vectors["grads"], options, again,
                                     vectors.get("tp_buffers"))
        return sum(parts.values(), np.full(K, float(options.reserve_bytes)))

    def transient_bytes(self, choice: Sequence[int], options: TrainingOptions, act_bytes: float,
                        chunks=None) -> dict:
        """Memory alive only part of the time, for one choice of row per layer
        (:meth:`transient_parts`), by part (``chunks``: blocks per pipeline chunk, for ``block``)."""
        pick = lambda f: np.array([[float(f(v)[i])] for v, i in enumerate(choice)]).reshape(len(choice), 1)  # noqa: E731
        gathered = pick(lambda v: self.gathered_bytes(v, options))
        working = pick(lambda v: self.working_bytes(v, options, act_bytes))
        grads = pick(lambda v: self.output_gradient_bytes(v, options, act_bytes))
        buffers = pick(lambda v: self.tp_buffer_bytes(v, options))
        again = self.policy.working_mask(options, chunks)
        parts = self.transient_parts(gathered, working, grads, options, again, buffers)
        out = {"gathered_weights": 0.0, "recompute_working_set": 0.0}
        out.update({k: float(v[0]) for k, v in parts.items()})
        return out
