"""Mixture-of-experts layers as the engines run them: the token dispatcher's collectives, what of
them hides behind compute, and the expert products' kernels (docs/training.md, "Mixture of experts").

Sources: Megatron-Core ``core_v0.16.1`` (``megatron/core/transformer/moe/token_dispatcher.py``,
``shared_experts.py``, ``experts.py``, ``pipeline_parallel/combined_1f1b.py``), DeepEP's README
(deepseek-ai/DeepEP ``2be0d4f``) and HybridEP's notes (branch ``hybrid-ep`` ``3d4a884``); the
research note ``moe.md`` of the project quotes each line used.
"""

from __future__ import annotations

import numpy as np

from pase.costing.training.compute import StepCompute, gemm_seconds
from pase.costing.training.keeping import LayerKeeping, per_layer_kept
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import FORWARD_SHARE, PricedLayers
from pase.machines.base import Group

__all__ = ["ExpertExchange", "remote_domains", "DISPATCH_PASSES"]

#: All-to-alls (or their all-gather / reduce-scatter duals) of one MoE layer in one micro-batch:
#: the dispatch and the combine forward, and their gradients backward (token_dispatcher.py:
#: ``MoEAlltoAllTokenDispatcher`` "token dispatch: A2A(EP) ... token combine: A2A(EP)"; the
#: backward of ``_AllToAll`` is the all-to-all with the splits swapped).
DISPATCH_PASSES = 4


def remote_domains(experts: int, top_k: int, domains, copies=None) -> np.ndarray:
    """Other NVLink domains (nodes) a token's ``top_k`` distinct experts reach, on average, when
    ``experts`` are spread evenly over ``domains`` of them and routing is balanced (NVIDIA's
    benchmarks force it: ``moe_router_force_load_balancing``): ``(n - 1) (1 - C(E - E/n, k) /
    C(E, k))``, the chance that a given other domain holds none of the ``k`` drawn without
    replacement. ``copies``: at most that many devices reached (group-limited routing,
    ``MoE.copies``), of which ``(n - 1) / n`` lie elsewhere on average.

    >>> round(float(remote_domains(128, 8, 2)), 4)  # Qwen3-30B-A3B, ep 16 over two nodes
    0.9969
    >>> float(remote_domains(128, 8, 1))
    0.0
    """
    n = np.maximum(np.asarray(domains, dtype=np.float64), 1.0)
    out = np.zeros_like(n)
    for value in np.unique(n):
        if value <= 1:
            continue
        per = experts / value
        # P(a given domain gets none of the k): C(E - per, k) / C(E, k), as a product (per may
        # be fractional where the experts do not split evenly: the continuous form).
        none = 1.0
        for i in range(top_k):
            none *= max(experts - per - i, 0.0) / (experts - i)
        out = np.where(n == value, (value - 1.0) * (1.0 - none), out)
    if copies is not None:
        out = np.minimum(out, np.asarray(copies, dtype=np.float64) * (n - 1.0) / n)
    return out


class ExpertExchange:
    """The dispatcher's collectives of each mixture-of-experts layer, one micro-batch: as the
    layer's work prices them (:meth:`default`, four NCCL all-to-alls), as the options' dispatcher
    runs them (:meth:`dispatch`), what is left exposed (:meth:`exposed`). (The expert products'
    kernels: :meth:`~.compute.StepCompute.expert_gemm_delta`.)"""

    def __init__(self, layers: PricedLayers, keeping: LayerKeeping, compute: StepCompute):
        self.keeping = keeping
        self.compute = compute.compute
        self.network, self.machine, self.configs = layers.network, layers.machine, layers.configs
        #: The mixtures of experts: the layers that move tokens to experts (``MoE.token_exchange``).
        self.layers = {v: layers.network.layers[v] for v in sorted(layers.structure.experts)}
        blocks = layers.structure.blocks
        #: Each MoE layer's block's layers (the compute an expert-parallel overlap hides behind).
        self.block_members = {v: [w for w, b in enumerate(blocks) if b is not None and b == blocks[v]] or [v]
                         for v in self.layers}
        domain = self.machine.nvlink_domain or self.machine.devices_per_node
        self.domain = int(domain) if domain else None

    # -- the collectives ----------------------------------------------------------------------

    def default(self, v: int) -> np.ndarray | float:
        """The all-to-alls the layer's own work prices (``MoE.work``): four NCCL all-to-alls of
        every routed copy over the expert group."""
        if v not in self.layers:
            return 0.0
        moved, group = self.layers[v].token_exchange(self.configs[v])
        return DISPATCH_PASSES * np.asarray(self.machine.all_to_all(moved, group), dtype=np.float64)

    @per_layer_kept
    def dispatch(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The layer's dispatcher collectives of one micro-batch (forward and backward), before
        any overlap, as ``options.moe_dispatcher`` runs them:

        - ``alltoall``: four all-to-alls of the routed copies (:meth:`default`);
        - ``allgather``: the tokens (not their ``k`` copies) all-gathered over the expert group
          and the outputs reduce-scattered back, forward, and their duals backward
          (token_dispatcher.py:256-340, ``gather_from_sequence_parallel_region`` /
          ``reduce_scatter_to_sequence_parallel_region`` over the TP x EP group);
        - ``deepep`` / ``hybridep``: the flex dispatcher's fused kernels (fused_a2a.py): a token
          crosses to another node once however many of its experts lie there (DeepEP's README:
          "Removes redundant tokens during cross-node communication"), then fans out inside the
          node; each of the four passes takes the longer of its inter-node part (``t D R`` bytes,
          ``R`` the other domains reached, :func:`remote_domains`) and its intra-node part (every
          routed copy not already on its device: ``t D k (q_in - 1) / q_in``), both at the links'
          rates (DeepEP: 153 GB/s intranode on H800's 160 GB/s NVLink, 43-58 GB/s internode on
          50 GB/s NICs; HybridEP: 48-55 GB/s on H100 IB).
        """
        if v not in self.layers:
            return np.zeros(len(self.configs[v]))
        kind = options.moe_dispatcher
        if kind == "alltoall":
            return np.asarray(self.default(v), dtype=np.float64) * np.ones(len(self.configs[v]))
        layer, C = self.layers[v], self.configs[v]
        moved, group = layer.token_exchange(C)
        # Tokens per device as the layer holds them at its input (width D / c_e), before the k copies.
        tokens = moved / (layer.load * layer.copies(C))
        if kind == "allgather":
            gathered = tokens * group.size  # the all-gather's output per device
            one = np.asarray(self.machine.all_gather(gathered, group), dtype=np.float64) + \
                np.asarray(self.machine.reduce_scatter(gathered, group), dtype=np.float64)
            return (DISPATCH_PASSES / 2.0) * one
        return DISPATCH_PASSES * self._fused(layer, C, tokens, group)

    def _fused(self, layer, C, tokens: np.ndarray, group: Group) -> np.ndarray:
        """One pass of a fused dispatch (DeepEP / HybridEP) of ``tokens`` per device."""
        q = np.asarray(group.size, dtype=np.float64)
        if self.domain is None:
            q_in = q
        else:
            q_in = np.minimum(np.asarray(group.members_per_node(self.domain), dtype=np.float64), q)
        domains = q / q_in
        copies = layer.load * layer.copies(C)
        reached = remote_domains(layer.experts, layer.top_k, domains, layer.copies(C)) * layer.load
        intra = tokens * copies * (q_in - 1.0) / np.maximum(q_in, 1.0)
        inter = tokens * reached
        K = len(tokens)
        inside = np.asarray(self.machine.exchange(intra, Group.flat(np.maximum(q_in, 1).astype(np.int64))),
                            dtype=np.float64)
        across_group = Group(np.maximum(domains, 1).astype(np.int64)[:, None],
                             np.full((K, 1), self.domain or 1, dtype=np.int64))
        across = np.asarray(self.machine.exchange(inter, across_group), dtype=np.float64)
        return np.where(q > 1, np.maximum(inside, across), 0.0)

    @per_layer_kept
    def exposed(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The dispatcher's collectives left on the critical path in one micro-batch:

        - ``ep_overlap`` (``--overlap-moe-expert-parallel-comm``, combined_1f1b.py:18-113 and
          model_chunk_schedule_plan.py:190-255): the forward of micro-batch ``i + 1`` and the
          backward of ``i`` run as one step, each one's all-to-alls on a communication stream
          while the other computes; the first forward and the last backward run alone. Of ``m``
          micro-batches the collectives ``a`` of ``m - 1`` hide behind the block's compute ``c``
          at ``overlap_efficiency`` ``e`` (``max(0, a - e c)`` left, ``comm_sm_share`` of what
          hides added), the rest exposed: ``(a + (m - 1) x left) / m``. Megatron-Core runs it
          neither with full recomputation (transformer_config.py:1871-1879) nor with the
          allgather dispatcher (:1866-1869): there it is priced off;
        - ``shared_overlap`` (``--moe-shared-expert-overlap``, shared_experts.py): the shared
          experts' forward (a third of their compute) runs on its own stream during the forward
          dispatch and combine (half of ``a``); the backward is not overlapped;
        - else all of ``a``.
        """
        a = self.dispatch(v, options)
        if v not in self.layers:
            return a
        e = options.overlap_efficiency
        if options.ep_overlap and options.recompute not in ("full", "block") and options.moe_dispatcher != "allgather":
            m = options.microbatches
            c = sum(np.asarray(self.compute(w, options), dtype=np.float64) for w in self.block_members[v])
            hidden = np.minimum(a, e * c)
            left = a - hidden + options.comm_sm_share * hidden
            return (a + (m - 1) * left) / m
        if options.shared_overlap and options.moe_dispatcher == "alltoall":
            shared = FORWARD_SHARE * gemm_seconds(self.machine, self.layers[v].shared_gemms(self.configs[v]), "bf16")
            forward = a / 2.0
            hidden = np.minimum(forward, e * shared)
            return a - hidden + options.comm_sm_share * hidden
        return a