"""The training configuration around per-layer splits: ZeRO, recomputation, fused attention,
micro-batches and overlap, priced from the same layer formulas (``docs/training.md``).

A layer's cost is taken apart once per configuration array into what it spends on compute,
on activation collectives and on its weight-gradient reduction (:func:`layer_parts`); every
training option then combines those parts with a few scalar rules (:class:`TrainingCosting`),
so one costing serves every ZeRO stage, recomputation policy and overlap setting.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pase.core.memo import OptionsMemo
from pase.costing.precision import FP8_SCALINGS, PRECISIONS, PrecisionPricing
from pase.costing.memory import activation_elements, parameter_shards
from pase.machines.measured import ELEMENT_TRAFFIC
from pase.model.layers.work import AllReduce, AllToAll, Exchange, Gemm, LayerWork, Pass
from pase.model.readers import READER_RULES, alike_readers, reader_groups
from pase.model.roles import input_roles, output_roles, roles_of

ELEMENT_TRAFFIC_COPY = ELEMENT_TRAFFIC["copy"]

__all__ = [
    "TrainingOptions", "LayerParts", "layer_parts", "attention_cores", "TrainingCosting",
    "TrainingSummary", "RECOMPUTE_POLICIES", "ZERO_STAGES", "FORWARD_SHARE", "FORWARD_COMM_SHARE",
    "FLASH_BACKWARD_FACTOR", "DEFAULT_ATTENTION_EFFICIENCY", "OPTIMIZER_STEP_BYTES", "DEFAULT_RESERVE_BYTES",
    "model_flops", "parameter_elements_unique", "EAGER_NORM_BYTES", "KERNELS_PER_LAYER", "EAGER_NORM_KERNELS",
    "EAGER_NORM_SAVED", "OP_POLICY_KEEPS", "ATTENTION_HALF_SEQUENCE", "ATTENTION_HALF_HEAD", "attention_shape_factor",
]

ZERO_STAGES = (0, 1, 2, 3)
#: What ZeRO-3 gathers at a time: ``layer`` (each vertex's weights: the two largest alive),
#: ``block`` (a repeated block, as FSDP wraps one: the block being computed, the next one
#: prefetched and the unsharded gradient of one before its reduce-scatter), ``prefetch``
#: (DeepSpeed's parameter-wise gathers, priced as ``block``).
WRAP_UNITS = ("layer", "block", "prefetch")
RECOMPUTE_POLICIES = ("none", "selective", "full", "op", "block")
#: The operator-level policy (``recompute=op``) by what a weight product is in its block: kept
#: (True) or recomputed (False); a product the table does not name is recomputed. Source:
#: torchtitan's ``_custom_policy`` (``selective_ac_option = 'op'``,
#: torchtitan/parallelisms/parallelize_llama.py ``_apply_ac_to_transformer_block``) saves every
#: ``aten.mm`` of a block but every second one, counted per block; its Llama block runs them as
#: wq, wk, wv, wo, w1 (gate), w3 (up), w2 (down), so it keeps the query, the value, the gate and
#: the down projection and recomputes the key, the attention output and the up projection.
#: Said by role, the choice carries to other blocks: a fused q/k/v product is kept (it makes the
#: query), a plain MLP's one input product is its first (kept) and its output product is kept,
#: a low-rank latent projection (DeepSeek's q_a, kv_a) is kept (the latent is narrow).
#: Roles: ``query``, ``key``, ``value`` (a product feeding attention's scores as the queries or
#: the keys, or its context as the values, through layers without weights), ``attention_output``
#: (a product contracting the heads' width), ``mlp_first_input`` and ``mlp_input`` (the first and
#: the other products writing the ``mlp`` width), ``mlp_output`` (contracting it), ``latent``.
OP_POLICY_KEEPS = {
    "query": True, "key": False, "value": True, "attention_output": False,
    "mlp_first_input": True, "mlp_input": False, "mlp_output": True, "latent": True,
}

#: Share of a layer's training-step compute that is its forward pass: one product of the
#: three a GEMM runs per step (forward, gradient of the input, gradient of the weight); the
#: same share is taken for memory-bound work, whose backward moves about twice the bytes.
FORWARD_SHARE = 1.0 / 3.0
#: Share of a layer's activation collectives that belong to the forward pass. In Megatron's
#: tensor parallelism it is exact: a row-parallel product all-reduces its output forward, a
#: column-parallel one its input gradient backward, one each per pair.
FORWARD_COMM_SHARE = 0.5
#: FlashAttention's backward pass runs 2.5 times the forward's products (it recomputes the
#: scores: five products against two; Dao 2023, FlashAttention-2, section 3.1.2).
FLASH_BACKWARD_FACTOR = 2.5
#: Fraction of the device's peak a fused attention kernel reaches, forward and backward, at
#: long sequences and head width 128, when the machine states none: FlashAttention-2 on an
#: H100 SXM runs its forward at about 330-350 TFLOP/s and its backward (2.5 times the
#: forward's products) at about 270-300 of 989 (Shah et al. 2024, FlashAttention-3, Fig. 5-6):
#: 3.5 / (1/340 + 2.5/285) = about 300 TFLOP/s, 0.3.
DEFAULT_ATTENTION_EFFICIENCY = 0.3
#: Sequence length at which a causal fused attention kernel runs at half its long-sequence
#: efficiency: FlashAttention-2's forward and backward on H100 (Shah et al. 2024,
#: FlashAttention-3, Fig. 5-6, causal, head dimension 128) reach about half their 16k rate at
#: 512 (tiles of the diagonal are half empty and the grid is small); ``s / (s + S)``.
ATTENTION_HALF_SEQUENCE = 512.0
#: Head width at which the kernel runs at half its rate, by the same form ``d / (d + D)``
#: normalised at 128: FlashAttention-2 (Dao 2023, Fig. 4-5) runs head width 64 at about 0.9
#: of 128's rate forward and backward.
ATTENTION_HALF_HEAD = 16.0
#: Bytes an Adam step reads and writes per local parameter element: reads the fp32 master
#: weight and both moments and the bf16 gradient (4 + 4 + 4 + 2), writes the master weight,
#: the moments and the bf16 weight (4 + 4 + 4 + 2).
OPTIMIZER_STEP_BYTES = 28.0
#: Memory a device holds that no other kind of the memory model accounts for: the CUDA
#: context (module images, driver state) and the math libraries' workspaces (cuBLAS/cuBLASLt,
#: cuDNN). 1 GB, an estimate (not measured here). It was 2 GB while it also stood for NCCL's
#: buffers and the allocator's rounding, which are now kinds of their own (an engine's
#: ``comm_buffer_bytes`` and ``fragmentation``): counting them twice made every plan 1 GB
#: heavier (docs/calibration.md, "Mechanisms found on the FP8 rows").
DEFAULT_RESERVE_BYTES = 1e9
#: Bytes an eager (unfused) RMSNorm moves per element, forward and backward, as torchtitan
#: writes it (``x * rsqrt(mean(x.float()**2) + eps)``, cast back, times the weight; its
#: ``models/norms.py``, December 2024), every aten kernel reading and writing its operands:
#: forward float 2+4, pow 4+4, mean 4, mul 4+4, cast 4+2, weight 2+2 = 36; backward (autograd
#: of the same ops) weight 2+2 and its reduction 2+2, cast 2+4, mul 4+4 and 4+4, mean 4, pow
#: 4+4+4, gradient sum 4+4+4, cast 4+2 = 64; 100 in all, against 4 + 6 = 10 for one fused
#: kernel each way.
EAGER_NORM_BYTES = 100.0
#: Activation bytes an eager RMSNorm keeps for its backward pass, in units of its bf16
#: output: autograd saves the fp32 copy of the input (4 bytes, for ``pow`` and the product)
#: and the cast output (2, for the weight's product): 6 bytes, 3 outputs' worth, where a fused
#: kernel keeps its output's worth (the tool's count of every layer).
EAGER_NORM_SAVED = 3.0
#: Kernels an eager RMSNorm launches, forward (7) and backward (about 12), by the same count.
EAGER_NORM_KERNELS = 19
#: Kernels of any other layer in one training step: forward, gradient of the input, gradient
#: of the weight (a layer without weights launches two; three is the floor's count).
KERNELS_PER_LAYER = 3


def attention_shape_factor(sequence, head):
    """A fused attention kernel's efficiency at key length ``sequence`` and head width ``head``
    relative to its long-sequence, width-128 figure: ``s / (s + S)`` times ``(d / (d + D)) /
    (128 / (128 + D))`` (:data:`ATTENTION_HALF_SEQUENCE`, :data:`ATTENTION_HALF_HEAD`).

    >>> round(float(attention_shape_factor(512, 128)), 3), round(float(attention_shape_factor(8192, 64)), 3)
    (0.5, 0.847)
    """
    s = np.asarray(sequence, dtype=np.float64)
    d = np.asarray(head, dtype=np.float64)
    width = (d / (d + ATTENTION_HALF_HEAD)) / (128.0 / (128.0 + ATTENTION_HALF_HEAD))
    return s / (s + ATTENTION_HALF_SEQUENCE) * width


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
        a block keeps its input, the outputs of the weight products :data:`OP_POLICY_KEEPS`
        keeps by role and of fused attention, and recomputes the rest;
        :meth:`TrainingCosting.op_saved`) or ``block`` (Megatron's ``--recompute-method block``:
        in each pipeline chunk the first ``recompute_layers`` repeated blocks priced as under
        ``full``, the others as under ``none``; :meth:`TrainingCosting.block_recomputed`).
    recompute_layers : int
        With ``block``: the repeated blocks each pipeline chunk recomputes whole (Megatron's
        ``--recompute-num-layers``; a chunk of fewer blocks recomputes all of them); 0 with
        every other policy.
    microbatches : int
        Micro-batches per step (gradient accumulation); the network is built at one
        micro-batch.
    fused_attention : bool
        Price the scores-softmax-context pattern as one fused kernel (FlashAttention).
    overlap : bool
        Weight-gradient reductions hide behind backward compute, ZeRO-3 gathers behind
        forward compute (:meth:`TrainingCosting.exposed_sync`).
    overlap_efficiency : float
        Share of the compute a reduction can hide behind.
    weight_bytes, grad_bytes, optimizer_bytes : float
        Bytes per parameter element of the weight, its gradient and the optimizer state
        (mixed-precision Adam: 2, 2, 12 = fp32 master weight and two moments).
    logit_bytes : float
        Bytes of each logit the loss keeps in fp32, and of its gradient.
    attention_efficiency : float or None
        Fraction of peak of the fused attention kernel (default: the machine's, else
        :data:`DEFAULT_ATTENTION_EFFICIENCY`).
    reserve_bytes : float
        Memory no tensor accounts for (:data:`DEFAULT_RESERVE_BYTES`).
    optimizer_step : bool
        Price the optimizer step (memory-bound over the local optimizer state).
    tp_overlap : bool
        Activation collectives hide behind the compute of their layer (Megatron's
        ``--tp-comm-overlap``: tensor-parallel all-gathers and reduce-scatters split into
        chunks pipelined with the adjacent GEMM), at ``overlap_efficiency``
        (:meth:`TrainingCosting.exposed_activation`).
    eager : bool
        Normalisations run unfused, one aten kernel per operation (PyTorch eager mode, as
        torchtitan runs without ``torch.compile``): :data:`EAGER_NORM_BYTES` per element.
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
        (:data:`KERNELS_PER_LAYER`, :data:`EAGER_NORM_KERNELS`) times this; 0 turns it off.
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
    fragmentation : float
        The caching allocator's reserved-but-unallocated share of the memory besides the
        reserve, as the engine reports its peak.
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
        (:func:`attention_shape_factor`).
    precision : str
        Number format of the repeated blocks' weight products: ``bf16``, ``fp8``, ``mxfp8`` or
        ``nvfp4`` (:mod:`pase.costing.precision`; the machine must run it).
    fp8_scaling : str
        With ``fp8``: ``delayed``, ``current``, ``rowwise`` or ``blockwise`` scaling.
    fp8_gather : bool
        ZeRO-3 all-gathers the converted weights in the format (torchtitan's Float8 with FSDP2,
        Megatron's ``--fp8-param-gather``).
    p2p_overlap : bool
        With an interleaved pipeline schedule, a chunk's send to the next stage (and its
        gradient's back) runs while the device computes another chunk (Megatron's
        ``--overlap-p2p-communication``): the sends hide behind the stage's compute at
        ``overlap_efficiency`` (``pase.planning.pipeline.exposed_sends``). 1F1B waits for them.
    """

    zero: int = 0
    recompute: str = "none"
    recompute_layers: int = 0
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
    fragmentation: float = 0.0
    activation_grads: bool = False
    compute_efficiency: float = 1.0
    attention_shape: bool = False
    precision: str = "bf16"
    fp8_scaling: str = "current"
    fp8_gather: bool = False
    p2p_overlap: bool = False

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
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be a positive integer, got {self.microbatches!r}")
        for name in ("overlap_efficiency", "weight_bytes", "grad_bytes", "optimizer_bytes", "logit_bytes",
                     "reserve_bytes", "loss_buffers", "launch_seconds", "bucket_elements", "optimizer_temp_bytes",
                     "comm_sm_share", "comm_buffer_bytes", "fragmentation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if self.overlap_efficiency > 1:
            raise ValueError(f"overlap_efficiency must be at most 1, got {self.overlap_efficiency!r}")
        for name in ("grad_reduce_bytes", "gather_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        if self.wrap_unit not in WRAP_UNITS:
            raise ValueError(f"wrap_unit must be one of {', '.join(WRAP_UNITS)}, got {self.wrap_unit!r}")
        if not (isinstance(self.compute_efficiency, (int, float)) and 0 < self.compute_efficiency <= 1):
            raise ValueError(f"compute_efficiency must be in (0, 1], got {self.compute_efficiency!r}")
        if self.comm_sm_share >= 1 or self.fragmentation >= 1:
            raise ValueError("comm_sm_share and fragmentation must be below 1")
        if self.attention_efficiency is not None and not 0 < self.attention_efficiency <= 1:
            raise ValueError(f"attention_efficiency must be in (0, 1], got {self.attention_efficiency!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_scaling not in FP8_SCALINGS:
            raise ValueError(f"fp8_scaling must be one of {', '.join(FP8_SCALINGS)}, got {self.fp8_scaling!r}")
        for name in ("fp8_gather", "p2p_overlap"):
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
        r = np.asarray(r, dtype=np.float64)
        if self.zero == 0:
            return (w + g + o) + 0.0 * r
        if self.zero == 1:
            return w + g + o / r
        if self.zero == 2:
            return w + (g + o) / r
        return (w + g + o) / r

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
        """The policy, with its block count under ``block`` (``block 5``)."""
        return f"block {self.recompute_layers}" if self.recompute == "block" else self.recompute

    def as_policy(self, policy: str) -> "TrainingOptions":
        """These options under ``policy`` (``none`` or ``full``: what ``block`` prices a block as).

        >>> TrainingOptions(recompute="block", recompute_layers=2).as_policy("full").recompute_layers
        0
        """
        return dataclasses.replace(self, recompute=policy, recompute_layers=0)

    def precision_label(self) -> str:
        """``bf16``, ``fp8 (current scaling)``, ``mxfp8``, ``nvfp4``."""
        return f"fp8 ({self.fp8_scaling} scaling)" if self.precision == "fp8" else self.precision


# ---------------------------------------------------------------------------------------
# Taking a layer's cost apart


@dataclass(frozen=True)
class LayerParts:
    """What one layer spends, per configuration row, for one micro-batch.

    ``compute``: its GEMMs and memory-bound work, forward and backward; ``activation``: its
    collectives of activations and activation gradients; ``gradient``: the all-reduce of its
    weight gradients at the gradient's element size, ``gather``: the same collective at the
    weight's element size (a reduce-scatter or all-gather is half an all-reduce in the ring
    model). ``params``: parameter tensors as ``(elements per device, replication group
    size)``; ``activations``: output elements per device; ``latency``: the fixed part of the
    weight-gradient collectives (their time with nothing to move), which bucketing shares;
    ``work``: the layer's work these parts price (``Layer.work``), whose GEMMs
    (:meth:`gemm_seconds`, :meth:`gemm_elements`) another number format re-prices.
    """

    compute: np.ndarray
    activation: np.ndarray
    gradient: np.ndarray
    gather: np.ndarray
    params: tuple
    activations: np.ndarray
    latency: np.ndarray | None = None
    work: LayerWork | None = None

    def gemm_seconds(self, machine, dtype: str = "bf16") -> np.ndarray:
        """Its GEMMs alone (the compute part without its memory-bound passes), priced by
        ``machine`` in ``dtype``, per row."""
        rows = len(self.compute)
        seconds = self.work.compute.value(lambda piece: piece.priced(machine, dtype) if isinstance(piece, Gemm)
                                          else _known(piece))
        return np.asarray(0.0 if seconds is None else seconds, dtype=np.float64) * np.ones(rows)

    def gemm_elements(self) -> np.ndarray:
        """Elements of its GEMMs' operands and outputs, ``B (M K + K N + M N)`` summed, per row."""
        elements = 0.0
        for gemm in self.work.gemms():
            elements = elements + gemm.operand_elements()
        return np.asarray(elements, dtype=np.float64) * np.ones(len(self.compute))


def _parameter_tensors(layer) -> list:
    """``(shape, dims, identity)`` of every parameter tensor: ``Layer.parameter_tensors``, whose
    identity names a tensor several layers share (a tied embedding), else ``None``."""
    return layer.parameter_tensors()


#: Elements a weight-gradient all-reduce is priced at for its fixed part (its latency): almost
#: nothing moved.
LATENCY_ELEMENTS = 1e-12


def _part_pricers(machine) -> dict:
    """How each part of :class:`LayerParts` prices a piece of a layer's work (``Layer.work``):
    ``compute`` its GEMMs and memory-bound passes, ``activation`` its collectives of activations,
    ``gradient`` and ``gather`` its weight-gradient all-reduces at the gradient's and at the
    weight's element size, ``latency`` those all-reduces with :data:`LATENCY_ELEMENTS` elements.
    A piece of a kind no part knows raises (it would otherwise go uncounted)."""

    def compute(piece):
        if isinstance(piece, (Gemm, Pass)):
            return piece.priced(machine)
        return _known(piece)

    def activation(piece):
        return piece.priced(machine) if _known(piece) is None and piece.activation else None

    def weight(grad: bool, latency: bool = False):
        def price(piece):
            if _known(piece) is not None or not piece.weight:
                return None
            elements = piece.elements
            if latency:
                elements = np.asarray(elements, dtype=np.float64) * 0.0 + LATENCY_ELEMENTS
            return machine.all_reduce(elements, piece.group, grad=grad)
        return price

    return {"compute": compute, "activation": activation, "gradient": weight(True), "gather": weight(False),
            "latency": weight(True, latency=True)}


def _known(piece) -> None:
    """``None`` for a piece some part of :class:`LayerParts` prices; ``TypeError`` otherwise."""
    if isinstance(piece, (Gemm, Pass, AllReduce, Exchange, AllToAll)):
        return None
    raise TypeError(f"the training model prices no {type(piece).__name__} (pase.costing.training._part_pricers)")


def layer_parts(layer, C: np.ndarray, machine) -> LayerParts:
    """Take the cost of every configuration of ``layer`` apart (:class:`LayerParts`): its work
    (``Layer.work``, once) priced part by part by ``machine``."""
    C = np.asarray(C, dtype=np.int64)
    work = layer.work(C)
    parts = {}
    for keep, price in _part_pricers(machine).items():
        parts[keep] = np.asarray(work.value(price, len(C)), dtype=np.float64) * np.ones(len(C))
    # Elements counted where the paper's memory model counts them (pase.costing.memory).
    params = parameter_shards(layer, C)
    activations = activation_elements(layer, C)
    return LayerParts(parts["compute"], parts["activation"], parts["gradient"], parts["gather"], tuple(params),
                      activations, parts["latency"], work)


# ---------------------------------------------------------------------------------------
# The structure training options need: blocks and attention cores

def _output_roles(layer) -> tuple:
    """The roles of the dimensions of ``layer``'s first output (``pase.model.roles``)."""
    return output_roles(layer)[0]


def attention_cores(network) -> dict:
    """``{vertex: role}`` for every attention core, found by dimension roles: a product
    without weights whose output holds both the queries' ``sequence`` and the keys'
    ``key_sequence`` (the scores), the chain of layers that alone read it one after another
    (the softmax, and any mask, bias or ALiBi layer beside it), and the product without weights
    that reads the chain's end and sums over ``key_sequence`` (the context). Roles ``scores``,
    ``softmax`` (every layer of the chain) and ``context``."""
    consumers: dict = {}
    for (u, v) in sorted(network.edges):
        consumers.setdefault(u, []).append(v)
    layers = network.layers
    roles = {}
    for u, layer in enumerate(layers):
        if not layer.product or layer.parameter_tensors():
            continue
        out = _output_roles(layer)
        if "sequence" not in out or "key_sequence" not in out:
            continue
        chain = []
        v = u
        while len(consumers.get(v, ())) == 1:
            w = consumers[v][0]
            reader = layers[w]
            if reader.product:
                if (not reader.parameter_tensors() and chain and "key_sequence" in roles_of(reader)
                        and "key_sequence" not in _output_roles(reader)):
                    roles[u] = "scores"
                    roles.update({x: "softmax" for x in chain})
                    roles[w] = "context"
                break
            chain.append(w)
            v = w
    return roles


def structure_key(layer) -> tuple:
    """Everything a layer's costs and memory read: equal keys, equal parts."""
    return (
        type(layer).__name__, layer.domain, roles_of(layer), layer.batch_dim, layer.output_shapes,
        repr(sorted(layer.args.items())), tuple((t.shape, bool(t.is_param)) for t in layer.inputs),
    )


def _causal(layer) -> bool:
    return bool(getattr(layer, "args", {}).get("causal", False))


def model_flops(network) -> float:
    """Model FLOPs of one step: three times the forward products of every GEMM-like layer
    (``2 x`` its iteration space), embeddings (lookups) excluded, attention counted whole
    (the count of MFU, Narayanan et al. 2021)."""
    return 3.0 * sum(layer.forward_flops() for layer in network.layers)


def parameter_elements_unique(network) -> int:
    """Parameters of the network, a tensor several layers read counted once."""
    seen = set()
    total = 0
    for layer in network.layers:
        for shape, _, ident in _parameter_tensors(layer):
            if ident is not None:
                if ident in seen:
                    continue
                seen.add(ident)
            total += math.prod(shape)
    return total


@dataclass(frozen=True)
class NetworkStructure:
    """What training options read of a network's shape, computed once per network: each
    layer's structure kind, attention roles, repeated blocks, outputs that leave their block,
    which weights each layer is charged for (a shared tensor once), consumers of each layer."""

    kinds: tuple
    cores: dict
    blocks: tuple
    block_outputs: tuple
    charged: tuple
    consumers: dict

    @classmethod
    def of(cls, network) -> "NetworkStructure":
        keys: dict = {}
        kinds = tuple(keys.setdefault(structure_key(layer), len(keys)) for layer in network.layers)
        # The repeated blocks its source declared (``Network.blocks``); two at least.
        blocks = tuple(network.blocks) if network.blocks is not None else (None,) * len(network.layers)
        if len({b for b in blocks if b is not None}) < 2:
            blocks = (None,) * len(network.layers)
        consumers: dict = {}
        for (u, v) in sorted(network.edges):
            consumers.setdefault(u, []).append(v)
        block_outputs = tuple(
            blocks[v] is None or not consumers.get(v) or any(blocks[w] != blocks[v] for w in consumers[v])
            for v in range(len(network.layers))
        )
        seen: set = set()
        charged = []
        for layer in network.layers:
            flags = []
            for _, _, ident in _parameter_tensors(layer):
                flags.append(ident is None or ident not in seen)
                if ident is not None:
                    seen.add(ident)
            charged.append(tuple(flags))
        return cls(kinds, attention_cores(network), blocks, block_outputs, tuple(charged), consumers)


# ---------------------------------------------------------------------------------------
# Combining the parts under a training configuration


@dataclass
class TrainingSummary:
    """A strategy under a training configuration: step time and peak memory, by part."""

    options: TrainingOptions
    step_seconds: float
    time: dict
    memory: dict
    peak_memory_bytes: float
    model_flops_per_step: float
    parameters: int
    tokens_per_step: int | None = None
    procs: int = 1
    peak_flops: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second_per_device(self) -> float | None:
        if self.tokens_per_step is None or not self.step_seconds:
            return None
        return self.tokens_per_step / self.step_seconds / self.procs

    @property
    def mfu(self) -> float | None:
        if self.peak_flops is None or not self.step_seconds:
            return None
        return self.model_flops_per_step / (self.step_seconds * self.procs * self.peak_flops)


def _per_layer_kept(method):
    """A ``TrainingCosting`` method of ``(v, options)`` kept in the costing's
    :class:`~pase.core.memo.OptionsMemo` for the layers that represent a vector group (those
    :meth:`TrainingCosting.layer_vectors` computes): once per layer and values of the option
    fields it reads. The other layers compute it each time (one pass over them is cheaper so)."""
    name = method.__name__

    @functools.wraps(method)
    def kept(self, v, options):
        if not self._kept_layers[v]:
            return method(self, v, options)
        return self._memo.get((name, v), options, lambda o: method(self, v, o))

    return kept


#: The arrays of :meth:`TrainingCosting.layer_vectors`.
LAYER_VECTORS = ("micro", "step", "state", "activations", "logits", "gathered", "working", "sync", "sync_raw", "grads")


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


class TrainingCosting:
    """Cost and memory vectors of every layer of a network under training options.

    Built once per (network at one micro-batch, device count, machine): the layer parts of
    every configuration array given; :meth:`vectors` and :meth:`edge_factor` then apply any
    :class:`TrainingOptions` without touching the layers again.

    Parameters
    ----------
    network : Network
        Built at the micro-batch size.
    configs : list of numpy.ndarray
        Configuration rows of every layer (the enumerated ones, or one row per candidate).
    machine
        Prices the parts.
    readers : str
        How the weight products reading one tensor pay for it (``pase.model.readers``):
        ``"summed"`` (the default), as engines run them, needs rows that line up across layers
        (a mesh's, or one strategy's): readers laid out alike in a row gather the tensor once and
        reduce their summed gradient once (:meth:`reader_pools`); ``"each"``: every reader pays
        its own (the per-layer search, whose rows of different layers are unrelated).
    """

    def __init__(self, network, configs: Sequence[np.ndarray], machine, structure: "NetworkStructure | None" = None,
                 readers: str = "summed"):
        self.network = network
        self.machine = machine
        self.configs = [np.asarray(C, dtype=np.int64) for C in configs]
        if readers not in READER_RULES:
            raise ValueError(f"unknown reader rule {readers!r}; choose one of: {', '.join(READER_RULES)}")
        self.readers = readers
        st = structure if structure is not None else NetworkStructure.of(network)
        self.structure = st
        # Layers of repeated blocks are equal in everything a cost reads: take each apart once.
        memo: dict = {}
        self.kinds = []
        self.parts = []
        for layer, kind, C in zip(network.layers, st.kinds, self.configs):
            key = (kind, C.tobytes(), C.shape)
            if key not in memo:
                memo[key] = (len(memo), layer_parts(layer, C, machine))
            index, parts = memo[key]
            self.kinds.append(index)
            self.parts.append(parts)
        self.cores, self.blocks, self.block_outputs, self.charged = st.cores, st.blocks, st.block_outputs, st.charged
        self._pool_readers()
        self.fused = {v: self._fused_seconds(v) for v, role in self.cores.items() if role == "scores"}
        self.op_saved = self._op_saved()
        self.read_back = self._read_back()
        # The loss keeps its own logit-sized buffers (``loss_buffers``): neither its output
        # nor the logits that only it reads are kept as activations besides.
        loss = {v for v, layer in enumerate(network.layers) if layer.loss}
        self.loss_only = np.array([v in loss or (bool(st.consumers.get(v)) and set(st.consumers[v]) <= loss)
                                   for v in range(len(network.layers))])
        # Layers equal in parts and in place (block, attention role, kept output, charged
        # weights, loss, read by the loss alone, kept by the operator policy) have equal
        # vectors under any options: one representative each.
        groups: dict = {}
        for v, layer in enumerate(network.layers):
            key = (self.kinds[v], self.cores.get(v), self.blocks[v] is None, self.block_outputs[v], self.charged[v],
                   layer.loss, bool(self.loss_only[v]), bool(self.op_saved[v]), bool(self.read_back[v]),
                   self._reader_place.get(v))
            groups.setdefault(key, []).append(v)
        self.vector_groups = [(members[0], np.array(members)) for members in groups.values()]
        #: Per layer, the representative of its group (equal vectors under any options).
        self.representative = np.empty(len(network.layers), dtype=np.int64)
        for rep, members in self.vector_groups:
            self.representative[members] = rep
        #: Per layer, the index of its group in ``vector_groups``.
        self._group_of = np.empty(len(network.layers), dtype=np.int64)
        for g, (_, members) in enumerate(self.vector_groups):
            self._group_of[members] = g
        self._kept_layers = [False] * len(network.layers)
        for rep, _ in self.vector_groups:
            self._kept_layers[rep] = True
        self.recomputable = np.array([self.blocks[v] is not None for v in range(len(network.layers))])
        #: ``block_recomputed``'s masks by block count and chunks.
        self._block_masks: dict = {}
        #: Vectors of every layer under the option sets asked for, kept by the options' fields
        #: they read (:class:`pase.core.memo.OptionsMemo`): a search over ZeRO stages and
        #: recomputation policies computes what one of them does not change once.
        self._memo = OptionsMemo()
        self.activation_scale = np.ones((len(network.layers), 1))
        self.attention_inner = np.array([self.cores.get(v) in ("scores", "softmax")
                                         for v in range(len(network.layers))])
        self.eager_compute = self._eager_norms()
        #: Elements a layer keeps inside itself besides its output (a mixture of experts'
        #: dispatched tokens, expert products and router probabilities), per row.
        self.internal = {v: np.asarray(layer.internal_activations(self.configs[v]), dtype=np.float64)
                         for v, layer in enumerate(network.layers) if hasattr(layer, "internal_activations")}
        #: FP8 / MXFP8 / NVFP4 (``TrainingOptions.precision``), priced in ``pase.costing.precision``.
        self.precision = PrecisionPricing(self)
        self.kernels = np.array([EAGER_NORM_KERNELS if v in self.eager_compute else KERNELS_PER_LAYER
                                 for v in range(len(network.layers))], dtype=np.float64)

    def _pool_readers(self) -> None:
        """Under the reader rule ``"summed"``: per row, the readers of one tensor laid out alike
        (``pase.model.readers.alike_readers``) pool at the first of them, which pays the one
        reduction of their summed input gradient and the one gather of the tensor. Kept: per
        reader, the reduction it no longer pays (``_shared``), the rows where it follows another
        (``_follows``), the later readers pooled at it (``_pooled_with``), the edge pairs
        ``(lead, follower, rows)`` whose follower's edge is not charged (``_edge_pairs``), and
        its place in its group (``_reader_place``: equal places, equal pooled vectors)."""
        self._shared: dict = {}
        self._follows: dict = {}
        self._pooled_with: dict = {}
        self._edge_pairs: list = []
        self._reader_place: dict = {}
        self._edge_arrays = None
        if self.readers == "each":
            return
        K = len(self.configs[0]) if self.configs else 0
        if any(len(C) != K for C in self.configs):
            raise ValueError("the reader rule 'summed' needs configuration rows that line up across layers "
                             "(one per mesh or strategy); per-layer rows are priced under 'each'")
        # Groups of readers equal in parts (repeated blocks) share their rows and reductions.
        leads: dict = {}
        shared: dict = {}
        for group in reader_groups(self.network):
            members = tuple(v for v, _ in group)
            kinds = (tuple(self.kinds[w] for w in members), tuple(i for _, i in group))
            if kinds not in leads:
                leads[kinds] = alike_readers(self.network, group, self.configs)
            lead = leads[kinds]
            for j, (v, i) in enumerate(group):
                self._reader_place[v] = (j, kinds[0], lead.tobytes())
                follows = lead[j] != j
                if not follows.any():
                    continue
                if (kinds, j) not in shared:
                    reduction = self.network.layers[v].gradient_reductions(self.configs[v], self.machine)[i]
                    shared[(kinds, j)] = np.where(follows, np.asarray(reduction, dtype=np.float64), 0.0)
                self._shared[v] = shared[(kinds, j)]
                self._follows[v] = follows
                for earlier in range(j):
                    rows = lead[j] == earlier
                    if rows.any():
                        self._pooled_with.setdefault(members[earlier], []).append((v, rows))
                        if self.network.layers[v].inputs[i].producer is not None:
                            self._edge_pairs.append((members[earlier], v, rows))

    def reader_pools(self) -> dict:
        """``{lead: ((reader, rows), ...)}``: the readers pooled at each lead reader (``rows``: a
        boolean per row, where the reader is laid out like the lead), as
        :meth:`exposed_activation` and :meth:`edge_rows` charge them."""
        return {v: tuple(pooled) for v, pooled in self._pooled_with.items()}

    def keep_every_layer(self) -> None:
        """Keep every layer's per-layer vectors by the options they read (by default only the
        group representatives' are kept): for a costing priced under many option sets layer by
        layer (the per-layer search)."""
        self._kept_layers = [True] * len(self.network.layers)

    @property
    def activation_scale(self) -> np.ndarray:
        """Per layer and row, the share of its activation collectives charged: 1, or 1/2 where
        sequence parallelism turns an all-reduce into a reduce-scatter (the all-gather it
        needs is the redistribution into the next product). Setting it forgets the vectors
        kept."""
        return self._activation_scale

    @activation_scale.setter
    def activation_scale(self, value) -> None:
        self._activation_scale = value
        self.forget()

    def _read_back(self) -> np.ndarray:
        """Per layer, whether a backward pass reads its output (``Layer.backward_reads`` of a
        reader, given which of the reader's inputs need a gradient: a layer's output or a
        weight, not a graph input). A layer no backward pass reads (a projection read only by a
        residual sum, a query read only by its rotary embedding) keeps nothing for it; one
        without readers keeps its output as before."""
        layers = self.network.layers
        read = np.array([not self.structure.consumers.get(v) for v in range(len(layers))])
        for w, layer in enumerate(layers):
            needs = tuple(t.producer is not None or t.is_param for t in layer.inputs)
            for i, t in enumerate(layer.inputs):
                if t.producer is not None and layer.backward_reads(i, needs):
                    read[t.producer] = True
        return read

    def _op_saved(self) -> np.ndarray:
        """Per layer, whether the operator-level policy keeps its output: a weight product (an
        Einsum or FC reading a parameter, attention's scores and context excluded) of a repeated
        block whose role (:meth:`op_roles`) :data:`OP_POLICY_KEEPS` keeps (a Llama block keeps
        q, v, gate and down and recomputes k, out and up, as torchtitan)."""
        saved = np.zeros(len(self.network.layers), dtype=bool)
        for v, roles in self.op_roles().items():
            saved[v] = any(OP_POLICY_KEEPS.get(role, False) for role in roles)
        return saved

    def _weight_product(self, v: int) -> bool:
        layer = self.network.layers[v]
        return self.blocks[v] is not None and layer.product and v not in self.cores and bool(self.parts[v].params)

    def _feeding_products(self, t, block) -> set:
        """The weight products of ``block`` whose outputs reach tensor ``t`` through layers
        without weights (a rotary embedding, a norm, a concatenation, a split)."""
        found, todo, seen = set(), [t], set()
        while todo:
            u = todo.pop().producer
            if u is None or u in seen or self.blocks[u] != block:
                continue
            seen.add(u)
            if self._weight_product(u):
                found.add(u)
            else:
                todo.extend(self.network.layers[u].inputs)
        return found

    def op_roles(self) -> dict:
        """``{vertex: roles}`` of every weight product of a repeated block, as
        :data:`OP_POLICY_KEEPS` names them, read off dimension roles and attention's cores."""
        layers = self.network.layers
        out = {v: set() for v in range(len(layers)) if self._weight_product(v)}
        # Attention's inputs: what feeds the scores' queries and keys and the context's values.
        for v, role in sorted(self.cores.items()):
            layer, block = layers[v], self.blocks[v]
            if role == "scores":
                for t, roles in zip(layer.inputs, input_roles(layer)):
                    for u in self._feeding_products(t, block):
                        out[u].add("key" if "key_sequence" in roles else "query")
            elif role == "context":
                for t in layer.inputs:
                    if t.producer is None or t.producer not in self.cores:
                        for u in self._feeding_products(t, block):
                            out[u].add("value")
        first: set = set()
        for v in sorted(out):
            written = set(_output_roles(layers[v]))
            contracted = set(roles_of(layers[v])) - written
            if "head_width" in contracted:
                out[v].add("attention_output")
            if "mlp" in written:
                out[v].add("mlp_input" if self.blocks[v] in first else "mlp_first_input")
                first.add(self.blocks[v])
            if "mlp" in contracted:
                out[v].add("mlp_output")
            if "latent" in written and "head_width" not in written:
                out[v].add("latent")
        return {v: tuple(sorted(roles)) for v, roles in out.items()}

    def _eager_norms(self) -> dict:
        """``{vertex: seconds}`` of every RMSNorm run unfused (:data:`EAGER_NORM_BYTES` per
        output element, streamed as copies at the machine's rate), in place of its fused time.
        LayerNorm is one native kernel in eager PyTorch and stays as it is."""
        out = {}
        act = float(self.machine.act_bytes or 2.0)  # the reference machine states none: bf16
        copy_bytes = ELEMENT_TRAFFIC_COPY * act
        by_kind: dict = {}  # layers equal in parts (repeated blocks' norms) share one vector
        for v, layer in enumerate(self.network.layers):
            if not layer.eager_unfused:
                continue
            if self.kinds[v] not in by_kind:
                e = self.parts[v].activations
                # flops: what the reference machine counts (the norm's own, fused or not); a
                # calibrated machine ignores it.
                flops = self.parts[v].compute
                fused = np.asarray(self.machine.memory_bound("layer_norm", e, flops), dtype=np.float64)
                eager = np.asarray(self.machine.memory_bound("copy", e * EAGER_NORM_BYTES / copy_bytes, flops),
                                   dtype=np.float64)
                by_kind[self.kinds[v]] = self.parts[v].compute - fused + eager
            out[v] = by_kind[self.kinds[v]]
        return out

    def block_order(self) -> list:
        """The repeated blocks' ids in the order their first layers come."""
        return list(dict.fromkeys(b for b in self.blocks if b is not None))

    def block_recomputed(self, layers: int, chunks=None) -> np.ndarray:
        """Per layer, whether ``recompute=block`` with ``recompute_layers=layers`` recomputes it:
        the layers of the first ``min(layers, c)`` repeated blocks of every chunk of ``c``
        consecutive blocks (Megatron-LM's ``--recompute-method block``, per pipeline stage and
        per model chunk of an interleaved schedule). ``chunks``: blocks per chunk in order
        (default one chunk of every block: no pipeline).

        Example: 4 blocks in chunks ``(2, 2)`` with ``layers=1`` recompute blocks 0 and 2."""
        order = self.block_order()
        chunks = (len(order),) if chunks is None else tuple(int(c) for c in chunks)
        key = (int(layers), chunks)
        masks = self._block_masks  # asked for layer by layer: each mask once
        if key in masks:
            return masks[key]
        if sum(chunks) != len(order):
            raise ValueError(f"chunks {chunks} hold {sum(chunks)} blocks; the network has {len(order)}")
        again, start = set(), 0
        for c in chunks:
            again.update(order[start: start + min(layers, c)])
            start += c
        mask = np.array([b is not None and b in again for b in self.blocks], dtype=bool)
        mask.setflags(write=False)
        masks[key] = mask
        return mask

    def recomputed_mask(self, options: TrainingOptions, chunks=None) -> np.ndarray:
        """Per layer, whether its forward runs again in the backward pass: every layer of a
        repeated block under full recomputation; attention's scores and softmax under selective
        recomputation when attention is not fused (fused, they are never stored); under ``op``
        every layer of a block but its output, the kept products and attention's core; under
        ``block`` :meth:`block_recomputed` (``chunks``: blocks per pipeline chunk)."""
        if options.recompute == "full":
            return self.recomputable
        if options.recompute == "block":
            return self.block_recomputed(options.recompute_layers, chunks)
        if options.recompute == "selective" and not options.fused_attention:
            return self.attention_inner
        if options.recompute == "op":
            # Everything in a block but its output, the kept products and attention's core
            # (fused: one kernel whose output is kept; unfused: scores and softmax again).
            core = np.array([v in self.cores for v in range(len(self.recomputable))], dtype=bool)
            again = self.recomputable & ~self.op_saved & ~core & ~np.array(self.block_outputs, dtype=bool)
            return again | (self.attention_inner if not options.fused_attention else False)
        return np.zeros(len(self.recomputable), dtype=bool)

    def edge_factors(self, targets, options: TrainingOptions) -> np.ndarray:
        """:meth:`edge_factor` of the edges into ``targets``."""
        again = self.recomputed_mask(options)[np.asarray(targets, dtype=np.int64)]
        return options.microbatches * (1.0 + FORWARD_COMM_SHARE * again)

    # -- structure --------------------------------------------------------------------

    def _fused_seconds(self, v: int) -> np.ndarray:
        """Fused attention time of the scores layer ``v``'s configurations (both products,
        forward and backward, at the kernel's efficiency; halved when causal)."""
        layer = self.network.layers[v]
        C = self.configs[v].astype(np.float64)
        per_device = np.asarray(layer.domain, dtype=np.float64) / C
        forward = 2.0 * 2.0 * per_device.prod(axis=1)
        # Causal when a layer of the core's chain (its softmax, a mask) says so.
        chain = []
        w = self.structure.consumers[v][0]
        while self.cores.get(w) == "softmax":
            chain.append(self.network.layers[w])
            w = self.structure.consumers[w][0]
        if layer.banded:  # a sliding window: the kernel visits its band only
            forward = forward * layer.density
        elif any(_causal(link) for link in chain):
            forward = forward / 2.0
        flops = forward * (1.0 + FLASH_BACKWARD_FACTOR)
        peak = self.machine.peak_flops
        if peak is None:  # the reference machine counts multiply-adds once, no efficiency
            return self.machine.gemm(1.0, 1.0, 1.0, flops / 6.0) * np.ones(len(C))
        return flops / (peak * self._attention_efficiency())

    def _attention_shape(self, v: int) -> float:
        """:func:`attention_shape_factor` of the scores layer ``v``: its keys are the last
        dimension of its output, its head width the last of its first input."""
        layer = self.network.layers[v]
        return float(attention_shape_factor(layer.output_shapes[0][-1], layer.inputs[0].shape[-1]))

    def _attention_efficiency(self, options: TrainingOptions | None = None) -> float:
        if options is not None and options.attention_efficiency is not None:
            return options.attention_efficiency
        return self.machine.attention_efficiency or DEFAULT_ATTENTION_EFFICIENCY

    def recomputed(self, v: int, options: TrainingOptions) -> bool:
        """Whether ``v``'s forward runs again in the backward pass (:meth:`recomputed_mask`)."""
        return bool(self.recomputed_mask(options)[v])

    @_per_layer_kept
    def compute(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Compute of one micro-batch, the fused attention kernel in place of its three layers;
        RMSNorm unfused under ``eager``; no layer below its kernels' launch floor."""
        role = self.cores.get(v) if options.fused_attention else None
        if role == "scores":
            seconds = self.fused[v]
            if self.machine.peak_flops is not None and options.attention_efficiency is not None:
                seconds = seconds * self._attention_efficiency() / options.attention_efficiency
            if options.attention_shape and self.machine.peak_flops is not None:
                seconds = seconds / self._attention_shape(v)
            return self._in_step(seconds, options)
        if role in ("softmax", "context"):
            return np.zeros(len(self.configs[v]))
        seconds = self.eager_compute[v] if options.eager and v in self.eager_compute else self.parts[v].compute
        seconds = seconds + self.precision.compute_delta(v, options)
        clocked = (self.precision.gemm_seconds(v, options)
                   if self.machine.peak_flops is not None and float(self.machine.clock_ratio) != 1.0 else None)
        seconds = self._in_step(seconds, options, clocked)
        if options.launch_seconds > 0:
            kernels = self.kernels[v] if options.eager else KERNELS_PER_LAYER
            seconds = np.where(seconds > 0, np.maximum(seconds, kernels * options.launch_seconds), seconds)
        return seconds

    def _in_step(self, seconds: np.ndarray, options: TrainingOptions, clocked=None) -> np.ndarray:
        """Kernels inside a training step: ``seconds / (clock_ratio x compute_efficiency)`` on a
        machine that prices in seconds (``clock_ratio``: the SM clock the machine sustains
        through a step at its power limit over the clock its kernels were measured at, 1 if it
        states none). ``clocked``: the part of ``seconds`` the SM clock paces (GEMMs, attention;
        ``None``: all of it); the rest is memory-bound, paced by the HBM's own clock, which the
        power limit does not lower (NVML reports and caps the graphics and memory clocks
        apart): that part is divided by ``compute_efficiency`` only."""
        if self.machine.peak_flops is None:
            return seconds
        ratio = float(self.machine.clock_ratio)
        if clocked is not None and ratio != 1.0:
            clocked = np.minimum(clocked, seconds)
            return ((seconds - clocked) + clocked / ratio) / options.compute_efficiency
        factor = ratio * options.compute_efficiency
        return seconds if factor == 1.0 else seconds / factor

    def stored_activations(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Activation elements ``v`` keeps for the backward pass, per micro-batch (none for the
        loss and the logits only it reads; an eager RMSNorm :data:`EAGER_NORM_SAVED` times)."""
        role = self.cores.get(v)
        policy = options.recompute
        if policy == "block":  # a recomputed block's layer as under full, any other as under none
            policy = "full" if self.recomputed_mask(options)[v] else "none"
        if self.loss_only[v]:
            return np.zeros(len(self.configs[v]))
        if role in ("scores", "softmax") and (options.fused_attention or policy != "none"):
            return np.zeros(len(self.configs[v]))
        if policy == "full" and not self.block_outputs[v]:
            return np.zeros(len(self.configs[v]))
        if policy == "op" and self.blocks[v] is not None and not (
                self.block_outputs[v] or self.op_saved[v] or role == "context"):
            return np.zeros(len(self.configs[v]))
        # No backward pass reads its output: nothing kept for it (an operator-level policy
        # keeps what it saves, read or not: PyTorch's selective checkpointing caches those
        # operators' outputs for the recomputation).
        if not (self.read_back[v] or self.block_outputs[v] or (policy == "op" and self.op_saved[v])):
            return self._internal(v)
        return self._kept(v, options)

    def _internal(self, v: int) -> np.ndarray:
        """What ``v`` keeps inside itself besides its output (a mixture of experts')."""
        return self.internal[v] * np.ones(len(self.configs[v])) if v in self.internal else np.zeros(len(self.configs[v]))

    def _kept(self, v: int, options: TrainingOptions) -> np.ndarray:
        if options.eager and v in self.eager_compute:
            return EAGER_NORM_SAVED * self.parts[v].activations
        if v in self.internal:
            return self.parts[v].activations + self.internal[v]
        return self.parts[v].activations

    def working_activations(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Activation elements alive while ``v``'s block runs its backward (full recomputation)."""
        role = self.cores.get(v)
        if role in ("scores", "softmax") and options.fused_attention:
            return np.zeros(len(self.configs[v]))
        if not (self.read_back[v] or self.block_outputs[v]):
            return self._internal(v)
        return self._kept(v, options)

    # -- time ----------------------------------------------------------------------------

    @_per_layer_kept
    def sync(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Weight-gradient synchronisation of ``v`` in one step, by ZeRO stage.

        With ``AR`` the all-reduce of the gradients (gradient element size), ``RS`` a
        reduce-scatter (half of it), ``AG`` an all-gather at the weight's size (half the
        all-reduce at that size) and ``m`` micro-batches: stage 0 ``AR``; 1 ``RS + AG``; 2
        ``m RS + AG`` (the gradient shard is reduced every micro-batch); 3 ``m (RS + 2 AG)``
        (the weights gathered for the forward and again for the backward pass). With
        ``bucket_elements`` ``B``, a layer of ``P`` local weight elements pays ``min(1, P/B)`` of
        its collectives' fixed (latency) part.
        """
        p = self.parts[v]
        m = options.microbatches
        gradient, gather = self.wire_parts(v, options)
        bucket = options.bucket_elements
        if options.wrap_unit != "layer":
            # FSDP reduces and gathers a unit's flattened parameters in one collective.
            bucket = self._unit_elements()[v]
        if p.latency is not None and np.any(bucket > 0):
            # Gradients reduce in buckets of ``bucket_elements`` (or the unit): a layer pays
            # its share of one bucket's fixed cost, not a collective of its own.
            local = self._local_elements(v)
            share = np.where(bucket > 0, np.minimum(1.0, local / np.where(bucket > 0, bucket, 1.0)), 1.0)
            spare = p.latency * (1.0 - share)
            gradient, gather = np.maximum(gradient - spare, 0.0), np.maximum(gather - spare, 0.0)
        gather = gather * self.precision.gather_scale(v, options)
        rs, ag = 0.5 * gradient, 0.5 * gather
        if options.zero == 0:
            return gradient
        if options.zero == 1:
            return rs + ag
        if options.zero == 2:
            return m * rs + ag
        return m * (rs + 2.0 * ag)

    def _local_elements(self, v: int) -> np.ndarray:
        """Weight elements ``v`` holds per device (its tensor-parallel shard), per row."""
        return sum((elements for elements, _ in self.parts[v].params), np.zeros(len(self.configs[v])))

    def _unit_elements(self) -> list:
        """Per layer, the weight elements per device of its FSDP unit (:meth:`_units`), per row."""
        if getattr(self, "_unit_cache", None) is None:
            index, count = self._units()
            K = len(self.configs[0])
            if any(len(C) != K for C in self.configs):
                # Per-layer rows (the free search): rows of different layers are unrelated, so a
                # unit's total has no row; each layer counts as its unit times its unit's size.
                sizes = np.bincount(index, minlength=count)
                self._unit_cache = [self._local_elements(v) * sizes[index[v]] for v in range(len(index))]
                return self._unit_cache
            totals = np.zeros((count, K))
            for v in range(len(self.network.layers)):
                totals[index[v]] += self._local_elements(v)
            self._unit_cache = [totals[index[v]] for v in range(len(self.network.layers))]
        return self._unit_cache

    def wire_parts(self, v: int, options: TrainingOptions) -> tuple:
        """``(gradient, gather)`` collectives of ``v`` at the options' element sizes: the parts
        are priced at the machine's ``grad_bytes`` and ``act_bytes``; ``grad_reduce_bytes`` and
        ``gather_bytes`` rescale the part that moves bytes (the fixed latency stays)."""
        p = self.parts[v]
        latency = p.latency if p.latency is not None else 0.0
        out = []
        for seconds, wanted, at in ((p.gradient, options.grad_reduce_bytes, self.machine.grad_bytes),
                                    (p.gather, options.gather_bytes, self.machine.act_bytes)):
            if wanted is None or at is None or wanted == at:
                out.append(seconds)
                continue
            fixed = np.minimum(latency, seconds)
            out.append(fixed + (seconds - fixed) * (wanted / float(at)))
        return tuple(out)

    def hiding(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Compute that ``v``'s synchronisation may hide behind (one layer as one bucket).

        Gradient reductions run during the backward pass of the micro-batch that produces
        them (two thirds of a layer's compute), gathers of updated weights during the next
        forward (one third); stage 2 reduces every micro-batch, stage 3 also gathers every
        forward and backward pass.
        """
        c = self.compute(v, options)
        m = options.microbatches
        share = {0: 1.0 - FORWARD_SHARE, 1: 1.0, 2: m * (1.0 - FORWARD_SHARE) + FORWARD_SHARE, 3: float(m)}
        return share[options.zero] * c

    @_per_layer_kept
    def exposed_sync(self, v: int, options: TrainingOptions) -> np.ndarray:
        """``max(0, sync - efficiency x hiding)`` with overlap, else the whole ``sync``."""
        s = self.sync(v, options)
        if not options.overlap:
            return s
        hidden = np.minimum(s, options.overlap_efficiency * self.hiding(v, options))
        # The compute it hides behind runs on the SMs communication leaves (comm_sm_share).
        return s - hidden + options.comm_sm_share * hidden

    def charged_activation(self, v: int) -> np.ndarray:
        """``v``'s activation collectives of one micro-batch, per row: its parts' less the
        reduction of its input's gradient where a reader before it, laid out alike, reduces
        the summed gradient (:meth:`reader_pools`), times its ``activation_scale``."""
        a = self.parts[v].activation
        if v in self._shared:
            a = a - self._shared[v]
        return a * self.activation_scale[v]

    def _pooled(self, v: int, options: TrainingOptions) -> tuple:
        """``(activation collectives, compute)`` of ``v`` with the readers pooled at it, per
        row; 0 where ``v`` itself is pooled at an earlier reader."""
        a, c = self.charged_activation(v), self.compute(v, options)
        for w, rows in self._pooled_with.get(v, ()):
            a = a + np.where(rows, self.charged_activation(w), 0.0)
            c = c + np.where(rows, self.compute(w, options), 0.0)
        if v in self._follows:
            a, c = np.where(self._follows[v], 0.0, a), np.where(self._follows[v], 0.0, c)
        return a, c

    @_per_layer_kept
    def exposed_activation(self, v: int, options: TrainingOptions) -> np.ndarray:
        """``v``'s activation collectives of one micro-batch left exposed
        (:meth:`charged_activation`): all of them, or with ``tp_overlap`` ``max(0, a - e c)``
        (``a`` the collectives, ``c`` the layer's compute, ``e`` the overlap efficiency;
        Megatron's ``--tp-comm-overlap`` pipelines each tensor-parallel all-gather and
        reduce-scatter with the GEMM beside it). Readers pooled at ``v`` (:meth:`reader_pools`)
        add their collectives and compute to ``a`` and ``c`` (one fused GEMM hides the one
        reduction) and show none of their own there."""
        if not options.tp_overlap:
            return self.charged_activation(v)
        a, c = self._pooled(v, options)
        hidden = np.minimum(a, options.overlap_efficiency * c)
        return a - hidden + options.comm_sm_share * hidden

    def overlap_leftover(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Compute of ``v`` (one micro-batch, times the overlap efficiency) its own activation
        collectives leave free to hide the redistribution into ``v`` (``tp_overlap``; 0 else),
        with the readers pooled at it (:meth:`exposed_activation`)."""
        if not options.tp_overlap:
            return np.zeros(len(self.configs[v]))
        a, c = self._pooled(v, options)
        return np.maximum(options.overlap_efficiency * c - a, 0.0)

    def edge_rows(self, edges: np.ndarray, targets, options: TrainingOptions, columns=None) -> np.ndarray:
        """Exposed seconds of every edge per row ``(E, K)`` from the redistribution seconds of
        one micro-batch forward and backward ``edges``: :meth:`edge_factors` times them, less
        (``tp_overlap``) ``m`` times the target's :meth:`overlap_leftover`, at least 0. Readers
        pooled at a lead (:meth:`reader_pools`) need the tensor as the lead does: their edges
        are charged once, on the lead's, at the largest factor of the pool (one gather, run
        again if any of them recomputes). ``edges``: one row per edge of the network in sorted
        order (``targets`` their consumers); ``columns``: the rows of this costing that
        ``edges`` has (default all)."""
        return self._memo.get(("edge_rows", id(edges), id(targets), id(columns)), options,
                              lambda o: self._edge_rows(edges, targets, o, columns), hold=(edges, targets, columns))

    def _edge_rows(self, edges: np.ndarray, targets, options: TrainingOptions, columns=None) -> np.ndarray:
        rows = self.edge_factors(targets, options)[:, None] * edges
        if self._edge_pairs:
            if len(targets) != len(self.network.edges):
                raise ValueError("edge_rows: edges must have one row per edge of the network, in sorted order")
            leads, followers, pooled, alone, quiet = self._edge_pooling()
            if columns is not None:
                pooled, quiet = pooled[:, columns], quiet[:, columns]
            # The lead's edge at the pool's largest (edges are >= 0; a follower is no lead
            # where it follows, so every value read here is its own), the followers' none.
            np.maximum.at(rows, leads, np.where(pooled, rows[followers], 0.0))
            rows[alone] = np.where(quiet, 0.0, rows[alone])
        if not options.tp_overlap or not len(targets):
            rows.setflags(write=False)
            return rows
        # A layer's leftover is its group representative's where their activation shares agree
        # (layers of one group have equal compute and collectives): one computation each, for
        # the first target of each.
        targets = np.asarray(targets, dtype=np.int64)
        keys = self._leftover_keys(columns)[targets]
        distinct, first, where = np.unique(keys, return_index=True, return_inverse=True)
        left = [self.overlap_leftover(int(targets[i]), options) for i in first]
        left = np.array(left if columns is None else [x[columns] for x in left])
        hide = left[where.reshape(-1)]
        out = np.maximum(rows - options.microbatches * hide, 0.0)
        out.setflags(write=False)
        return out

    def _edge_pooling(self) -> tuple:
        """The edge pairs of :meth:`_pool_readers` as arrays over the network's sorted edges:
        ``(lead edges, follower edges, rows pooled per pair, each follower edge once, the rows
        where it follows)``."""
        if self._edge_arrays is None:
            index = {edge: e for e, edge in enumerate(sorted(self.network.edges))}
            edge_of = lambda v: index[(self._producer_of(v), v)]  # noqa: E731
            leads = np.array([edge_of(a) for a, _, _ in self._edge_pairs], dtype=np.int64)
            followers = np.array([edge_of(b) for _, b, _ in self._edge_pairs], dtype=np.int64)
            pooled = np.array([rows for _, _, rows in self._edge_pairs], dtype=bool)
            alone = sorted({b for _, b, _ in self._edge_pairs})
            quiet = np.array([self._follows[b] for b in alone], dtype=bool)
            self._edge_arrays = (leads, followers, pooled, np.array([edge_of(b) for b in alone], dtype=np.int64), quiet)
        return self._edge_arrays

    def _producer_of(self, v: int) -> int:
        """The producer of the tensor reader ``v`` pools (its one reduced input)."""
        layer = self.network.layers[v]
        return layer.inputs[layer.reduced_inputs()[0]].producer

    def _leftover_keys(self, columns=None) -> np.ndarray:
        """Per layer, a number naming its group representative and its row of activation
        shares (in ``columns``): layers with one number have equal :meth:`overlap_leftover`."""
        key = None if columns is None else columns.tobytes()
        if key not in self._scale_keys:
            scale = self.activation_scale
            if columns is not None and scale.shape[1] > 1:
                scale = scale[:, columns]
            named: dict = {}
            self._scale_keys[key] = np.array([named.setdefault((int(self.representative[v]), scale[v].tobytes()),
                                                               len(named))
                                              for v in range(len(self.network.layers))], dtype=np.int64)
        return self._scale_keys[key]

    def forget(self) -> None:
        """Forget the vectors kept (they are computed again when asked for)."""
        self._memo.clear()
        self._scale_keys = {}

    @_per_layer_kept
    def optimizer_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The optimizer step over the layer's local optimizer state (memory-bound)."""
        hbm = self.machine.hbm_bytes_per_s
        if not options.optimizer_step or hbm is None:
            return np.zeros(len(self.configs[v]))
        total = np.zeros(len(self.configs[v]))
        for (elements, r), charged in zip(self.parts[v].params, self.charged[v]):
            if charged:
                total = total + elements / (r if options.zero >= 1 else 1.0)
        # The optimizer's temporaries are written and read again (``optimizer_temp_bytes``).
        return (OPTIMIZER_STEP_BYTES + 2.0 * options.optimizer_temp_bytes) * total / hbm

    def layer_time(self, v: int, options: TrainingOptions) -> dict:
        """The parts of ``v``'s step time: compute, recomputation, activation collectives,
        exposed synchronisation, optimizer."""
        out = self._microbatch_time(v, options)
        out["weight_sync"] = self.exposed_sync(v, options)
        out["optimizer"] = self.optimizer_seconds(v, options)
        return out

    def _microbatch_time(self, v: int, options: TrainingOptions) -> dict:
        """The parts of :meth:`layer_time` spent every micro-batch (all ``m`` of them):
        compute, recomputation, activation collectives."""
        m = options.microbatches
        c = self.compute(v, options)
        a = self.exposed_activation(v, options)
        again = self.recomputed(v, options)
        return {
            "compute": m * c,
            "recompute": m * (FORWARD_SHARE * c + FORWARD_COMM_SHARE * a) if again else np.zeros(len(c)),
            "activation_comm": m * a,
        }

    def cost_vector(self, v: int, options: TrainingOptions) -> np.ndarray:
        return sum(self.layer_time(v, options).values())

    def edge_factor(self, v: int, options: TrainingOptions) -> float:
        """Edges into ``v`` redistribute every micro-batch, and again when ``v`` recomputes."""
        return float(self.edge_factors([v], options)[0])

    # -- memory --------------------------------------------------------------------------

    def layer_memory(self, v: int, options: TrainingOptions, act_bytes: float) -> dict:
        """Bytes per device that add up over layers: model state by ZeRO stage, stored
        activations, the loss's logit-sized buffers (``loss_buffers`` of ``logit_bytes``)."""
        state = self._model_state(v, options)
        acts = self._stored_bytes(v, options, act_bytes)
        logits = self._logit_bytes(v, options)
        out = {"model_state": state, "activations": acts, "logits": logits}
        if options.fragmentation:
            # Short-lived allocations fragment the caching allocator; the long-lived model
            # state is allocated once.
            out["fragmentation"] = options.fragmentation * (acts + logits)
        return out

    @_per_layer_kept
    def _model_state(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes of ``v``'s weights, gradients and optimizer state by ZeRO stage (its charged
        weights), and its cached low-precision weights."""
        state = np.zeros(len(self.configs[v]))
        for (elements, r), charged in zip(self.parts[v].params, self.charged[v]):
            if charged:
                state = state + elements * options.bytes_per_parameter(r)
        return state + self.precision.cache_bytes(v, options)

    def _stored_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes of the activations ``v`` keeps for the backward pass (:meth:`stored_activations`)."""
        return act_bytes * self.stored_activations(v, options) * self.precision.stored_scale(v, options, act_bytes)

    def _logit_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The loss's logit-sized buffers (``loss_buffers`` of ``logit_bytes``); none elsewhere."""
        if self.network.layers[v].loss:
            return options.loss_buffers * options.logit_bytes * self.parts[v].activations
        return np.zeros(len(self.configs[v]))

    def memory_vector(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        return sum(self.layer_memory(v, options, act_bytes).values())

    def gathered_bytes(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Bytes of ``v``'s weights once ZeRO-3 has gathered them (its tensor-parallel shard), at
        ``gather_bytes`` (else ``weight_bytes``)."""
        total = np.zeros(len(self.configs[v]))
        for elements, _ in self.parts[v].params:
            total = total + elements
        return (options.gather_bytes or options.weight_bytes) * total

    def _units(self) -> tuple:
        """``(unit of every layer, unit count)``: each repeated block one unit (as FSDP wraps a
        decoder block), every layer outside the blocks one root unit (unit 0)."""
        ids: dict = {}
        index = np.array([0 if b is None else ids.setdefault(b, len(ids) + 1) for b in self.blocks], dtype=np.int64)
        return index, len(ids) + 1

    def transient_parts(self, gathered: np.ndarray, working: np.ndarray, grads: np.ndarray,
                        options: TrainingOptions, recomputed=None) -> dict:
        """The non-additive memory of every row from per-layer ``(n, K)`` bytes (the weights
        once gathered, the recomputation working set, the output gradient), as ``(K,)`` arrays:

        - ``gathered_weights`` (ZeRO-3): ``wrap_unit`` ``layer``: the two largest layers'
          weights (the one computed and the next, prefetched); ``block`` / ``prefetch``: the
          two largest units (a block each, the layers outside the blocks one root unit: the
          unit computed and the one prefetched, ``prefetch_units`` of them) at the gather's
          element size, plus ``unsharded_gradients``: the largest unit's full gradient at the
          reduction's element size, alive until its reduce-scatter;
        - ``recompute_working_set`` (full, op, block): the largest working activations of a
          block recomputed (``recomputed``: per layer; default every block);
        - ``activation_gradients``: the gradient a layer's backward reads and the one it
          writes, twice the largest output (``activation_grads``);
        - ``comm_buffers`` and ``reserve``: constants of the engine and the options.
        """
        K = gathered.shape[1]
        out = {}
        if options.zero == 3 and len(gathered):
            if options.wrap_unit == "layer":
                top = np.sort(gathered, axis=0)[-2:]
                out["gathered_weights"] = top.sum(axis=0) if len(top) > 1 else 2.0 * top[0]
            else:
                index, count = self._units()
                units = np.zeros((count, K))
                np.add.at(units, index[: len(gathered)], gathered)
                gather = options.gather_bytes or options.weight_bytes
                top = np.sort(units, axis=0)[::-1]
                out["gathered_weights"] = top[:2].sum(axis=0)  # the unit computed and the one prefetched
                # A block's full gradient, at the reduction's element size, until its
                # reduce-scatter (the root unit's reduces at the end, when the activations are gone).
                reduce = options.grad_reduce_bytes or options.grad_bytes
                blocks = units[1:] if count > 1 else units
                out["unsharded_gradients"] = blocks.max(axis=0) * (reduce / gather)
        if options.recompute in ("full", "op", "block"):
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
        return out

    def transient_rows(self, vectors: dict, options: TrainingOptions, layers=None) -> np.ndarray:
        """The non-additive memory of every row (all layers at that row) from
        :meth:`layer_vectors` (:meth:`transient_parts`) plus the reserve. ``layers`` restricts
        the gathered weights to some layers (default all)."""
        if layers is None:
            arrays = (vectors["gathered"], vectors["working"], vectors["grads"])
            return self._memo.get(("transient_rows",) + tuple(map(id, arrays)), options,
                                  lambda o: self._transient_rows(vectors, o), hold=arrays)
        return self._transient_rows(vectors, options, layers)

    def _transient_rows(self, vectors: dict, options: TrainingOptions, layers=None) -> np.ndarray:
        K = vectors["gathered"].shape[1]
        gathered = vectors["gathered"]
        if layers is not None:
            keep = np.zeros(len(gathered), dtype=bool)
            keep[list(layers)] = True
            gathered = np.where(keep[:, None], gathered, 0.0)
        again = self.recomputed_mask(options) if options.recompute in ("op", "block") else None
        parts = self.transient_parts(gathered, vectors["working"], vectors["grads"], options, again)
        return sum(parts.values(), np.full(K, float(options.reserve_bytes)))

    def transient_bytes(self, choice: Sequence[int], options: TrainingOptions, act_bytes: float,
                        chunks=None) -> dict:
        """Memory alive only part of the time, for one choice of row per layer
        (:meth:`transient_parts`), by part (``chunks``: blocks per pipeline chunk, for ``block``)."""
        pick = lambda f: np.array([[float(f(v)[i])] for v, i in enumerate(choice)]).reshape(len(choice), 1)  # noqa: E731
        gathered = pick(lambda v: self.gathered_bytes(v, options))
        working = pick(lambda v: act_bytes * self.working_activations(v, options))
        grads = pick(lambda v: self.output_gradient_bytes(v, options, act_bytes))
        again = self.recomputed_mask(options, chunks)
        parts = self.transient_parts(gathered, working, grads, options, again)
        out = {"gathered_weights": 0.0, "recompute_working_set": 0.0}
        out.update({k: float(v[0]) for k, v in parts.items()})
        return out

    def output_gradient_bytes(self, v: int, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """Bytes of the gradient of ``v``'s output (none for the loss and the logits only it
        reads: the loss's buffers count those; none inside fused attention)."""
        if self.loss_only[v] or (options.fused_attention and self.attention_inner[v]):
            return np.zeros(len(self.configs[v]))
        return act_bytes * self.parts[v].activations

    def layer_vectors(self, options: TrainingOptions, act_bytes: float) -> dict:
        """Every layer's vectors under ``options`` as ``(n, K)`` arrays: ``micro`` (one
        micro-batch's compute, recomputation and activation collectives), ``step`` (exposed
        synchronisation and optimizer; ``sync`` the synchronisation alone), ``state``,
        ``activations``, ``logits``, ``gathered`` and ``working`` bytes. Layers equal in parts and place share one computation.
        The arrays are read-only and kept by the option fields they read: option sets equal in
        those fields get the very same array. Under ``block`` (no pipeline: one chunk) each
        layer's vectors are its vectors under ``full`` where :meth:`block_recomputed`, else
        under ``none``."""
        if options.recompute == "block":
            return self._block_vectors(options, act_bytes)
        return {name: self._memo.get(("vectors", name, act_bytes), options,
                                     lambda o, name=name: self._vectors(name, o, act_bytes))
                for name in LAYER_VECTORS}

    def _block_vectors(self, options: TrainingOptions, act_bytes: float) -> dict:
        none = self.layer_vectors(options.as_policy("none"), act_bytes)
        full = self.layer_vectors(options.as_policy("full"), act_bytes)

        def mixed(o, name):
            out = np.where(self.recomputed_mask(o)[:, None], full[name], none[name])
            out.setflags(write=False)
            return out

        return {name: none[name] if none[name] is full[name] else self._memo.get(
                    ("block vectors", name, act_bytes, id(none[name]), id(full[name])), options,
                    lambda o, name=name: mixed(o, name), hold=(none[name], full[name]))
                for name in LAYER_VECTORS}

    def block_deltas(self, options: TrainingOptions, act_bytes: float, edges=None, targets=(),
                     columns=None) -> dict:
        """What recomputing each repeated block whole adds to keeping everything, per block in
        :meth:`block_order` and row, as ``(blocks, K)`` arrays: ``micro`` (seconds of one
        micro-batch: its layers' vectors under ``full`` less under ``none``, with the edges
        into them, ``edges`` of ``targets`` as :meth:`edge_rows` takes them, over ``m``),
        ``activations`` (bytes kept, at most 0), ``working`` (its working set in the
        backward pass, the ``recompute_working_set`` it may be). ``options``: every field but
        the policy. ``columns``: the rows priced (default all). ``block`` prices a chunk as
        ``none`` plus the deltas of the blocks it recomputes, plus the largest of their
        working sets: what :meth:`layer_vectors` and :meth:`transient_rows` give it.
        """
        none_o, full_o = options.as_policy("none"), options.as_policy("full")
        none, full = self.layer_vectors(none_o, act_bytes), self.layer_vectors(full_o, act_bytes)
        of = self._block_of()
        out = {}
        for name in ("micro", "activations", "working"):
            # Each distinct pair of arrays once (settings share what they do not change): what
            # is kept reads no option, the arrays are named by identity and held.
            pair = (none[name],) if name == "working" else (full[name], none[name])
            out[name] = self._memo.get(("block deltas", name) + tuple(map(id, pair)) + (id(columns),), options,
                                       lambda o, pair=pair: _per_block(of, pair, columns), hold=pair + (columns,))
        if edges is not None and len(targets):
            pair = (self.edge_rows(edges, targets, full_o, columns), self.edge_rows(edges, targets, none_o, columns))
            moved = self._memo.get(("block deltas", "edges") + tuple(map(id, pair)), options,
                                   lambda o: _per_block(of[np.asarray(targets, dtype=np.int64)], pair), hold=pair)
            out["micro"] = out["micro"] + moved / options.microbatches
        return out

    def _block_of(self) -> np.ndarray:
        """Per layer, its block's place in :meth:`block_order` (-1 outside the blocks)."""
        order = {b: k for k, b in enumerate(self.block_order())}
        return np.array([-1 if b is None else order[b] for b in self.blocks], dtype=np.int64)

    def _vectors(self, name: str, options: TrainingOptions, act_bytes: float) -> np.ndarray:
        """One of :meth:`layer_vectors`' arrays (read-only): each group representative's vector
        given to its members."""
        K = len(self.configs[0])
        rows = np.array([np.broadcast_to(self._layer_vector(name, v, options, act_bytes), (K,))
                         for v, _ in self.vector_groups], dtype=np.float64)
        out = rows[self._group_of]
        out.setflags(write=False)
        return out

    def _layer_vector(self, name: str, v: int, options: TrainingOptions, act_bytes: float):
        if name == "micro":
            t = self._microbatch_time(v, options)
            return (t["compute"] + t["recompute"] + t["activation_comm"]) / options.microbatches
        if name == "step":
            return self.exposed_sync(v, options) + self.optimizer_seconds(v, options)
        if name == "state":
            return self._model_state(v, options)
        if name == "activations":  # grown by the allocator's share of the short-lived allocations
            return (1.0 + options.fragmentation) * self._stored_bytes(v, options, act_bytes)
        if name == "logits":
            return (1.0 + options.fragmentation) * self._logit_bytes(v, options)
        if name == "gathered":
            return self.gathered_bytes(v, options)
        if name == "working":
            return act_bytes * self.working_activations(v, options)
        if name == "sync":
            return self.exposed_sync(v, options)
        if name == "sync_raw":
            return self.sync(v, options)
        return self.output_gradient_bytes(v, options, act_bytes)

    def summarize(self, choice: Sequence[int], options: TrainingOptions, act_bytes: float, edge_seconds: float,
                  procs: int, tokens_per_step: int | None = None) -> TrainingSummary:
        """The step time and peak memory of one choice of row per layer (``edge_seconds``: the
        redistribution of one micro-batch, forward and backward, already summed)."""
        time: dict = {}
        memory: dict = {}
        for v, i in enumerate(choice):
            for key, value in self.layer_time(v, options).items():
                time[key] = time.get(key, 0.0) + float(value[i])
            for key, value in self.layer_memory(v, options, act_bytes).items():
                memory[key] = memory.get(key, 0.0) + float(value[i])
        time["redistribution"] = float(edge_seconds)
        memory.update(self.transient_bytes(choice, options, act_bytes))
        memory["reserve"] = float(options.reserve_bytes)
        step = float(sum(time.values()))
        return TrainingSummary(
            options=options,
            step_seconds=step,
            time=time,
            memory=memory,
            peak_memory_bytes=float(sum(memory.values())),
            model_flops_per_step=model_flops(self.network) * options.microbatches,
            parameters=parameter_elements_unique(self.network),
            tokens_per_step=tokens_per_step,
            procs=procs,
            peak_flops=self.machine.peak_flops,
        )

