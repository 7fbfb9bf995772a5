"""The training options (:class:`TrainingOptions`): one training configuration around the
per-layer splits (ZeRO stage, recomputation policy, micro-batches, overlap, engine constants)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from pase.costing.precision import FP8_SCALINGS, PRECISIONS
from pase.model.layers.moe import EXPERT_ACTIVATIONS

__all__ = ["TrainingOptions", "ZERO_STAGES", "WRAP_UNITS", "RECOMPUTE_POLICIES", "RECOMPUTE_MODULES", "DEFAULT_RESERVE_BYTES", "MOE_DISPATCHERS",
           "EXPERT_GEMMS", "TP_OVERLAP_KINDS", "OFFLOAD_KINDS"]

ZERO_STAGES = (0, 1, 2, 3)
#: What ZeRO-3 gathers at a time: ``layer`` (each vertex's weights: the two largest alive),
#: ``block`` (a repeated block, as FSDP wraps one: the block being computed, the next one
#: prefetched and the unsharded gradient of one before its reduce-scatter), ``prefetch``
#: (DeepSpeed's parameter-wise gathers, priced as ``block``).
WRAP_UNITS = ("layer", "block", "prefetch")
#: Largest in-step compute efficiency: a step's kernels at most a quarter faster than the
#: machine's measured kernels at its stated sustained clock (a cluster fitted on its own runs
#: whose GPUs hold a higher clock through a step than the clock the machine states).
MAX_COMPUTE_EFFICIENCY = 1.25
#: ZeRO-1's gradient collective (``TrainingOptions.zero1_reduce``).
ZERO1_REDUCES = ("reduce_scatter", "all_reduce")
RECOMPUTE_POLICIES = ("none", "selective", "full", "op", "block")
#: What ``recompute=selective`` recomputes (``TrainingOptions.recompute_modules``), Megatron-Core's
#: ``--recompute-modules`` under ``--recompute-granularity selective`` (megatron-core 0.16.1
#: transformer/transformer_config.py:411-423, default ``["core_attn"]``): ``core_attn``
#: attention's scores and softmax; ``layernorm`` the block's norms Megatron runs as modules of
#: their own (not fused into the next linear), their outputs discarded and run again;
#: ``moe_act`` the routed experts' activation, its output discarded and run again from the
#: first products' output; ``mla_up_proj`` multi-latent attention's up projections and rotary
#: embeddings, their outputs (the queries, keys and values) discarded and run again from the
#: latents; ``mlp`` a dense block's MLP whole (its norm, products and activation), ``moe``
#: a mixture of experts whole (router, dispatch, experts, combine) and ``shared_experts`` its
#: shared experts, each checkpointed at its input (``pase.costing.training.recompute``).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
#: How a mixture of experts moves its tokens (``pase.costing.training.experts``): Megatron-Core's
#: ``--moe-token-dispatcher-type alltoall`` (one NCCL all-to-all of every routed copy) or
#: ``allgather`` (the tokens gathered over the expert group, the outputs reduce-scattered), or its
#: ``flex`` dispatcher's fused kernels, ``--moe-flex-dispatcher-backend deepep`` or ``hybridep``
#: (a token crosses to another node once, however many experts there it goes to).
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
#: How the local experts' products run: one kernel for all of them (``grouped``: CUTLASS grouped
#: GEMM, ``torch._grouped_mm``) or one GEMM per expert (``per_expert``: Transformer Engine's
#: ``GroupedLinear``, Megatron-Core's ``TEGroupedMLP``).
EXPERT_GEMMS = ("grouped", "per_expert")
#: How an overlap of the tensor-parallel collectives with their GEMMs runs (``tp_overlap``):
#: Transformer Engine's userbuffers (Megatron's ``--tp-comm-overlap``: the collective split into
#: chunks pipelined with the GEMM's, reduced in the ring) or torch's asynchronous tensor
#: parallelism over symmetric memory (torchtitan's ``enable_async_tensor_parallel``: one step per
#: peer, the reduce-scatter's partials summed after the last copy;
#: :meth:`~.collectives.ActivationCollectives.async_tp_extra`).
TP_OVERLAP_KINDS = ("userbuffers", "symmetric_memory")
#: Memory a device holds that no other kind of the memory model accounts for: the CUDA
#: context (module images, driver state) and the math libraries' workspaces (cuBLAS/cuBLASLt,
#: cuDNN). 1 GB, an estimate (not measured here). It was 2 GB while it also stood for NCCL's
#: buffers and the allocator's rounding, which are now kinds of their own (an engine's
#: ``comm_buffer_bytes`` and ``fragmentation``): counting them twice made every plan 1 GB
#: heavier (docs/calibration.md, "Mechanisms found on the FP8 rows").
DEFAULT_RESERVE_BYTES = 1e9
#: What ``offload`` may move to the host, in the order a recipe writes them: the optimizer
#: state and update (``optimizer``; ``nvme``: the state on the host's drive, the update on its
#: CPU), the ZeRO-3 parameter shards (``params``), the stored activations (``activations``).
OFFLOAD_KINDS = ("optimizer", "nvme", "params", "activations")


@dataclass(frozen=True)
class TrainingOptions:
    """One training configuration around the per-layer splits.

    Attributes
    ----------
    zero : int
        ZeRO stage 0-3 (3 is FSDP): 1 shards the optimizer state over each weight's
        replication group, 2 also the gradients, 3 also the weights.
    recompute : str
        ``none``, ``selective`` (attention's scores and softmax recomputed; Korthikanti et
        al. 2022), ``full`` (each repeated block keeps its input only and runs its
        forward again in the backward pass) or ``op`` (torchtitan's operator-level policy:
        a block keeps its input, the outputs of the weight products :data:`~.recompute.OP_POLICY_KEEPS`
        keeps by role and of fused attention, and recomputes the rest;
        :func:`~.recompute.activation_places`) or ``block`` (Megatron's ``--recompute-method block``:
        in each pipeline chunk the first ``recompute_layers`` repeated blocks priced as under
        ``full``, the others as under ``none``; :meth:`~.recompute.RecomputePolicy.block_recomputed`).
    recompute_layers : int
        With ``block``: the repeated blocks each pipeline chunk recomputes whole (Megatron's
        ``--recompute-num-layers``; a chunk of fewer blocks recomputes all of them); 0 with
        every other policy.
    recompute_modules : tuple
        With ``selective``: what it recomputes, :data:`RECOMPUTE_MODULES` in that order
        (Megatron's ``--recompute-modules``; default ``("core_attn",)``, Megatron's default);
        read under ``selective`` only.
    microbatches : int
        Micro-batches per step (gradient accumulation); the network is built at one
        micro-batch.
    fused_attention : bool
        Price the scores-softmax-context pattern as one fused kernel (FlashAttention).
    overlap : bool
        Weight-gradient reductions hide behind backward compute, ZeRO-3 gathers behind
        forward compute (:meth:`~.sync.WeightSync.exposed_sync`).
    overlap_efficiency : float
        Share of the compute a reduction can hide behind.
    weight_bytes, grad_bytes, optimizer_bytes : float
        Bytes per parameter element of the weight, its gradient and the optimizer state
        (mixed-precision Adam: 2, 2, 12 = fp32 master weight and two moments).
    logit_bytes : float
        Bytes of each logit the loss keeps in fp32, and of its gradient.
    attention_efficiency : float or None
        Fraction of peak of the fused attention kernel (default: the machine's, else
        :data:`~.compute.DEFAULT_ATTENTION_EFFICIENCY`).
    reserve_bytes : float
        Memory no tensor accounts for (:data:`DEFAULT_RESERVE_BYTES`).
    optimizer_step : bool
        Price the optimizer step (memory-bound over the local optimizer state).
    tp_overlap : bool
        Activation collectives hide behind the compute of their layer (Megatron's
        ``--tp-comm-overlap``: tensor-parallel all-gathers and reduce-scatters split into
        chunks pipelined with the adjacent GEMM), at ``overlap_efficiency``
        (:meth:`~.collectives.ActivationCollectives.exposed_activation`).
    eager : bool
        Normalisations run unfused, one aten kernel per operation (PyTorch eager mode, as
        torchtitan runs without ``torch.compile``): :data:`~.compute.EAGER_NORM_BYTES` per element.
    loss_buffers : float
        Logit-sized buffers of ``logit_bytes`` alive at the loss's backward pass: 2 (the
        fp32 logits and their gradient, a fused loss) or 3 (PyTorch's
        ``cross_entropy(logits.float())``: the saved log-softmax, the gradient it receives and
        the gradient it returns).
    bucket_elements : float
        Weight elements per gradient bucket (Megatron-Core's default ``max(4e7, 1e6 dp)``
        parameters); each layer pays its share of a bucket's collective latency. 0: every
        layer's tensors reduce in collectives of their own.
    launch_seconds : float
        Per-kernel launch floor: no layer's step compute is below its kernel count
        (``compute.KERNELS_PER_LAYER``, ``EAGER_NORM_KERNELS``) times this; 0 turns it off.
    engine : str
        The engine profile these options come from (``pase.planning.engine``), for labels.
    grad_reduce_bytes, gather_bytes : float or None
        Element size of the gradient reduction and of the parameter all-gather (None: the
        machine's ``grad_bytes`` and ``act_bytes``, as priced in the layer's parts).
    wrap_unit : str
        What ZeRO-3 gathers at a time (:data:`WRAP_UNITS`).
    optimizer_temp_bytes : float
        Bytes per local optimizer-state element the optimizer step allocates besides the state.
    comm_sm_share : float
        Share of the SMs that overlapped communication kernels take: compute hiding a
        collective runs that much slower for as long as the collective runs.
    comm_buffer_bytes : float
        The communication library's buffers (NCCL channels, engine workspaces).
    tp_gather_buffers, tp_scatter_buffers : float
        The buffers an engine's tensor-parallel overlap registers (``tp_overlap``; Transformer
        Engine's userbuffers): each the size of one micro-batch's gathered activation
        (``sequence x micro-batch / cp`` rows of the hidden width), the ones that all-gather
        in the GEMMs' low-precision format (1 byte under FP8), the ones that reduce-scatter at
        2 bytes (:meth:`tp_buffer_bytes`).
    fragmentation : float
        The caching allocator's reserved-but-unallocated share of the stored activations
        (:func:`~.allocator.stranded_bytes`).
    interleave_fragmentation : float
        The caching allocator's stranded share of the activations of each micro-batch a
        pipeline stage holds beyond the first (:func:`~.allocator.stranded_bytes`).
    retry_seconds : float
        Seconds a step loses for each micro-batch that reaches its peak only by the caching
        allocator giving its cached blocks back (a "tight" plan, :func:`~.allocator.retry_seconds`).
    activation_grads : bool
        Count the activation gradients alive during the backward pass (the gradient of the
        largest layer's output and of its input).
    compute_efficiency : float
        What an in-step kernel reaches of the same kernel measured alone, beyond the clock
        (``clock_ratio`` of the machine): every layer's compute, on a machine that prices in
        seconds, is divided by it (the command line's engines set the fitted
        ``pase.planning.engine.STEP_COMPUTE_EFFICIENCY``; docs/calibration.md).
    attention_shape : bool
        The fused attention kernel's efficiency follows the sequence and head width
        (:func:`~.compute.attention_shape_factor`).
    precision : str
        Number format of the repeated blocks' weight products: ``bf16``, ``fp8``, ``mxfp8`` or
        ``nvfp4`` (:mod:`pase.costing.precision`; the machine must run it).
    fp8_scaling : str
        With ``fp8``: ``delayed``, ``current``, ``rowwise`` or ``blockwise`` scaling.
    fp8_gather : bool
        ZeRO-3 all-gathers the converted weights in the format (torchtitan's Float8 with FSDP2,
        Megatron's ``--fp8-param-gather``).
    moe_dispatcher : str
        How a mixture of experts moves its tokens (:data:`MOE_DISPATCHERS`).
    ep_overlap : bool
        The expert all-to-alls of one micro-batch run while another computes (Megatron-Core's
        ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``;
        :meth:`~.experts.ExpertExchange.exposed`).
    shared_overlap : bool
        The shared experts compute during the forward dispatch and combine
        (``--moe-shared-expert-overlap``).
    expert_gemm : str
        How the local experts' products run (:data:`EXPERT_GEMMS`).
    pipeline_cut : str
        ``search`` (the search chooses the pipeline's cut), ``compute_balanced`` (the engine
        places its blocks by their cost) or ``layer_count`` (by their count):
        ``pase.planning.engine_cut``.
    tp_overlap_kind : str
        How ``tp_overlap`` runs (:data:`TP_OVERLAP_KINDS`).
    p2p_overlap : bool
        With an interleaved pipeline schedule, a chunk's send to the next stage (and its
        gradient's back) runs while the device computes another chunk (Megatron's
        ``--overlap-p2p-communication``): the sends hide behind the stage's compute at
        ``overlap_efficiency`` (``pase.planning.pipeline.exposed_sends``). 1F1B waits for them.
    p2p_split : bool
        A stage's devices each send an equal share of its output to the next stage, which
        gathers it inside the stage (DeepSpeed's pipeline engine, ``pipe_partitioned``): a device
        sends ``1 / stage devices`` of the whole output rather than its own copy, where tensor
        parallelism without sequence parallelism keeps the output whole on every rank
        (``pase.planning.pipeline.sent_elements``).
    zero1_reduce : str
        ZeRO-1's gradient collective: ``reduce_scatter`` (each rank keeps its shard: DeepSpeed,
        Megatron's distributed optimizer) or ``all_reduce`` (nanotron all-reduces its whole fp32
        gradient buffer and then updates its shard, trainer.py:510-519).
    zero1_overlap : bool
        ZeRO-1's reduction overlaps the backward pass (with ``overlap``); false where the engine
        reduces after the last backward pass (nanotron's ZeRO-1, trainer.py:510-519).
    block_overhead_seconds : float
        Host time per repeated block and micro-batch (forward and backward): an eager engine
        issues every kernel from Python, so a micro-batch takes at least its blocks' host time
        however fast the device runs them (the host floor, ``pase.planning.host_floor``).
    moe_block_overhead_seconds : float
        Further host time per repeated block that holds a mixture of experts, per micro-batch
        (forward, backward and recomputation): the engine's token dispatcher stops the host
        every such layer until the device tells it how many tokens each expert receives, so
        the host cannot run ahead and the layer's Python (router, permutation, one product per
        local expert) adds up; part of the host floor.
    expert_activation_sync : str
        The experts' activation (``pase.model.layers.moe.EXPERT_ACTIVATIONS``) whose engine
        implementation stops the host a second time inside every mixture-of-experts block
        (``none``: none does). Its blocks' MoE host time (``moe_block_overhead_seconds``, times
        ``1 + FORWARD_SHARE`` under full recomputation) then adds to the device's time instead
        of hiding behind it: the host no longer runs ahead of the device, so the device waits
        for the host's issue of each block (counted in the MoE layer's compute).
    chunk_overhead_seconds : float
        Fixed time per pipeline chunk and micro-batch, forward and backward: the schedule's work
        to enter a chunk and wait on its batched send and receive, which a chunk's transfer
        overlap does not hide (``pase.planning.pipeline``).
    pipeline_tp_wait_seconds : float
        On a pipeline stage whose receives stop the host (nanotron reads the metadata of every
        tensor it receives on the host, p2p.py:245-274), time per block and micro-batch the
        tensor-parallel ranks wait for the latest of them at the block's collectives, per
        doubling of the group: ``log2(tp)`` times this (the expected latest of ``n`` ranks' host
        delays grows as ``ln n``); 0 without tensor parallelism.
    tp_node_wait_seconds : float
        Time per repeated block and micro-batch a tensor-parallel group spanning several nodes
        loses at its blocking collectives per doubling of those nodes: ranks on different nodes
        reach each of a block's collectives apart, and every collective waits for the latest of
        them, whose expected delay grows as ``ln n`` for ``n`` nodes (a group inside one node
        waits for none of it). Device time, added ``log2(nodes)`` times
        (``pase.planning.host_floor.node_wait_seconds``). No engine states it: ``pase calibrate
        --from-runs`` fits it on a cluster's runs (``fitted``), else 0.
    """

    zero: int = 0
    recompute: str = "none"
    recompute_layers: int = 0
    recompute_modules: tuple = ("core_attn",)
    microbatches: int = 1
    fused_attention: bool = True
    overlap: bool = True
    overlap_efficiency: float = 1.0
    weight_bytes: float = 2.0
    grad_bytes: float = 2.0
    optimizer_bytes: float = 12.0
    logit_bytes: float = 4.0
    attention_efficiency: float | None = None
    reserve_bytes: float = DEFAULT_RESERVE_BYTES
    optimizer_step: bool = True
    tp_overlap: bool = False
    eager: bool = False
    loss_buffers: float = 2.0
    launch_seconds: float = 0.0
    bucket_elements: float = 0.0
    engine: str = ""
    grad_reduce_bytes: float | None = None
    gather_bytes: float | None = None
    wrap_unit: str = "layer"
    optimizer_temp_bytes: float = 0.0
    comm_sm_share: float = 0.0
    comm_buffer_bytes: float = 0.0
    tp_gather_buffers: float = 0.0
    tp_scatter_buffers: float = 0.0
    fragmentation: float = 0.0
    interleave_fragmentation: float = 0.0
    retry_seconds: float = 0.0
    activation_grads: bool = False
    compute_efficiency: float = 1.0
    attention_shape: bool = False
    precision: str = "bf16"
    fp8_scaling: str = "current"
    fp8_gather: bool = False
    p2p_overlap: bool = False
    p2p_split: bool = False
    zero1_reduce: str = "reduce_scatter"
    zero1_overlap: bool = True
    block_overhead_seconds: float = 0.0
    moe_block_overhead_seconds: float = 0.0
    expert_activation_sync: str = "none"
    chunk_overhead_seconds: float = 0.0
    pipeline_tp_wait_seconds: float = 0.0
    tp_node_wait_seconds: float = 0.0
    moe_dispatcher: str = "alltoall"
    ep_overlap: bool = False
    shared_overlap: bool = False
    expert_gemm: str = "grouped"
    tp_overlap_kind: str = "userbuffers"
    pipeline_cut: str = "search"
    #: What lives on the host (:data:`OFFLOAD_KINDS`, in that order; ``()``: nothing), priced by
    #: :mod:`pase.costing.training.offload`.
    offload: tuple = ()

    def __post_init__(self):
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise ValueError(f"zero must be one of 0, 1, 2, 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_POLICIES)}, got {self.recompute!r}")
        layers = self.recompute_layers
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
            raise ValueError(f"recompute_layers must be a non-negative integer, got {layers!r}")
        if self.recompute == "block" and layers < 1:
            raise ValueError("recompute=block needs recompute_layers >= 1 (the blocks each pipeline chunk recomputes)")
        if self.recompute != "block" and layers:
            raise ValueError(f"recompute_layers applies to recompute=block, not recompute={self.recompute}")
        modules = self.recompute_modules
        if (not isinstance(modules, tuple) or not modules or any(m not in RECOMPUTE_MODULES for m in modules)
                or modules != tuple(m for m in RECOMPUTE_MODULES if m in modules)):
            raise ValueError(f"recompute_modules must be some of {', '.join(RECOMPUTE_MODULES)} in that order, "
                             f"got {modules!r}")
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be a positive integer, got {self.microbatches!r}")
        for name in ("overlap_efficiency", "weight_bytes", "grad_bytes", "optimizer_bytes", "logit_bytes",
                     "reserve_bytes", "loss_buffers", "launch_seconds", "bucket_elements", "optimizer_temp_bytes",
                     "comm_sm_share", "comm_buffer_bytes", "tp_gather_buffers", "tp_scatter_buffers", "fragmentation",
                     "interleave_fragmentation", "retry_seconds", "block_overhead_seconds", "chunk_overhead_seconds",
                     "pipeline_tp_wait_seconds", "tp_node_wait_seconds", "moe_block_overhead_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if self.expert_activation_sync not in ("none",) + EXPERT_ACTIVATIONS:
            raise ValueError(f"expert_activation_sync must be one of none, {', '.join(EXPERT_ACTIVATIONS)}, "
                             f"got {self.expert_activation_sync!r:.40}")
        if self.overlap_efficiency > 1:
            raise ValueError(f"overlap_efficiency must be at most 1, got {self.overlap_efficiency!r}")
        for name in ("grad_reduce_bytes", "gather_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        if self.wrap_unit not in WRAP_UNITS:
            raise ValueError(f"wrap_unit must be one of {', '.join(WRAP_UNITS)}, got {self.wrap_unit!r}")
        if not (isinstance(self.compute_efficiency, (int, float)) and 0 < self.compute_efficiency <= MAX_COMPUTE_EFFICIENCY):
            raise ValueError(f"compute_efficiency must be in (0, {MAX_COMPUTE_EFFICIENCY:g}], got {self.compute_efficiency!r}")
        if self.comm_sm_share >= 1 or self.fragmentation >= 1:
            raise ValueError("comm_sm_share and fragmentation must be below 1")
        if self.attention_efficiency is not None and not 0 < self.attention_efficiency <= 1:
            raise ValueError(f"attention_efficiency must be in (0, 1], got {self.attention_efficiency!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_scaling not in FP8_SCALINGS:
            raise ValueError(f"fp8_scaling must be one of {', '.join(FP8_SCALINGS)}, got {self.fp8_scaling!r}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise ValueError(f"moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got {self.moe_dispatcher!r}")
        if self.pipeline_cut not in ("search", "compute_balanced", "layer_count"):
            raise ValueError(f"pipeline_cut must be search, compute_balanced or layer_count, got {self.pipeline_cut!r}")
        if self.tp_overlap_kind not in TP_OVERLAP_KINDS:
            raise ValueError(f"tp_overlap_kind must be one of {', '.join(TP_OVERLAP_KINDS)}, got {self.tp_overlap_kind!r}")
        if self.expert_gemm not in EXPERT_GEMMS:
            raise ValueError(f"expert_gemm must be one of {', '.join(EXPERT_GEMMS)}, got {self.expert_gemm!r}")
        if self.zero1_reduce not in ZERO1_REDUCES:
            raise ValueError(f"zero1_reduce must be one of {', '.join(ZERO1_REDUCES)}, got {self.zero1_reduce!r}")
        if not isinstance(self.offload, tuple) or any(k not in OFFLOAD_KINDS for k in self.offload) \
                or list(self.offload) != sorted(set(self.offload), key=OFFLOAD_KINDS.index):
            raise ValueError(f"offload must be a tuple of {', '.join(OFFLOAD_KINDS)} in that order, "
                             f"got {self.offload!r}")
        if "optimizer" in self.offload and "nvme" in self.offload:
            raise ValueError("offload optimizer and nvme: the optimizer state is on the host or on the drive, not both")
        for name in ("fp8_gather", "p2p_overlap", "p2p_split", "ep_overlap", "shared_overlap", "zero1_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def bytes_per_parameter(self, r):
        """Bytes per parameter element on a device for a replication group of ``r`` devices.

        Stage 0 ``w + g + o``; 1 ``w + g + o/r``; 2 ``w + (g + o)/r``; 3 ``(w + g + o)/r``
        (Rajbhandari et al. 2020; 16, 4 + 12/r, 2 + 14/r and 16/r with the defaults).

        >>> float(TrainingOptions(zero=1).bytes_per_parameter(4))
        7.0
        >>> float(TrainingOptions(zero=3).bytes_per_parameter(8))
        2.0
        """
        w, g, o = self.weight_bytes, self.grad_bytes, self.optimizer_bytes
        if self.offload:  # what the host (or its drive) holds leaves the device (costing.training.offload)
            o = 0.0 if ("optimizer" in self.offload or "nvme" in self.offload) else o
            w = 0.0 if "params" in self.offload and self.zero == 3 else w
        r = np.asarray(r, dtype=np.float64)
        if self.zero == 0:
            return (w + g + o) + 0.0 * r
        if self.zero == 1:
            return w + g + o / r
        if self.zero == 2:
            return w + (g + o) / r
        return (w + g + o) / r

    def tp_buffer_bytes(self) -> float:
        """Bytes the tensor-parallel overlap's buffers take per element of the gathered activation
        (0 without ``tp_overlap``): the gathering ones at 1 byte where the GEMMs run below 16
        bits (Transformer Engine keeps the all-gather buffers in FP8 under an FP8 recipe), else 2;
        the reduce-scattering ones at 2.

        >>> te = TrainingOptions(tp_overlap=True, tp_gather_buffers=6, tp_scatter_buffers=4)
        >>> te.but(precision="fp8").tp_buffer_bytes(), te.tp_buffer_bytes()
        (14.0, 20.0)
        """
        if not self.tp_overlap:
            return 0.0
        gather = 2.0 if self.precision == "bf16" else 1.0
        return float(self.tp_gather_buffers * gather + 2.0 * self.tp_scatter_buffers)

    def but(self, **changes) -> "TrainingOptions":
        """These options with ``changes`` (checked again).

        >>> TrainingOptions(zero=1).but(recompute="full").recompute
        'full'
        """
        return dataclasses.replace(self, **changes)

    def label(self) -> str:
        return f"ZeRO-{self.zero}, recompute {self.recompute_label()}, {self.microbatches} micro-batch" + (
            "es" if self.microbatches != 1 else "") + (f", {self.precision_label()}" if self.precision != "bf16" else "")

    def recompute_label(self) -> str:
        """The policy, with its block count under ``block`` (``block 5``) and its modules under
        ``selective`` where they are not Megatron's default (``selective (moe_act, layernorm)``)."""
        if self.recompute == "block":
            return f"block {self.recompute_layers}"
        if self.recompute == "selective" and self.recompute_modules != ("core_attn",):
            return f"selective ({', '.join(self.recompute_modules)})"
        return self.recompute

    def recomputes(self, module: str) -> bool:
        """Whether ``recompute=selective`` recomputes ``module`` (:data:`RECOMPUTE_MODULES`).

        >>> TrainingOptions(recompute="selective", recompute_modules=("moe_act",)).recomputes("core_attn")
        False
        """
        return self.recompute == "selective" and module in self.recompute_modules

    def as_policy(self, policy: str) -> "TrainingOptions":
        """These options under ``policy`` (``none`` or ``full``: what ``block`` prices a block as).

        >>> TrainingOptions(recompute="block", recompute_layers=2).as_policy("full").recompute_layers
        0
        """
        return dataclasses.replace(self, recompute=policy, recompute_layers=0)

    def precision_label(self) -> str:
        """``bf16``, ``fp8 (current scaling)``, ``mxfp8``, ``nvfp4``."""
        return f"fp8 ({self.fp8_scaling} scaling)" if self.precision == "fp8" else self.precision
