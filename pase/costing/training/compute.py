"""In-step compute: each layer's kernels inside a training step (fused attention, eager norms,
the number format, the launch floor, the step's clock and efficiency) and the optimizer step."""

from __future__ import annotations

import numpy as np

from pase.costing.precision import PrecisionPricing
from pase.costing.training.keeping import LayerKeeping, per_layer_kept
from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import FORWARD_SHARE, PricedLayers
from pase.machines.measured import ELEMENT_TRAFFIC
from pase.model.layers.work import Gemm

__all__ = ["StepCompute", "attention_shape_factor", "FLASH_BACKWARD_FACTOR", "DEFAULT_ATTENTION_EFFICIENCY",
           "ATTENTION_HALF_SEQUENCE", "ATTENTION_HALF_HEAD", "EAGER_NORM_BYTES", "EAGER_NORM_KERNELS",
           "KERNELS_PER_LAYER", "OPTIMIZER_STEP_BYTES", "gemm_seconds", "activation_waits"]

ELEMENT_TRAFFIC_COPY = ELEMENT_TRAFFIC["copy"]

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
#: Bytes an eager (unfused) RMSNorm moves per element, forward and backward, as torchtitan
#: writes it (``x * rsqrt(mean(x.float()**2) + eps)``, cast back, times the weight; its
#: ``models/norms.py``, December 2024), every aten kernel reading and writing its operands:
#: forward float 2+4, pow 4+4, mean 4, mul 4+4, cast 4+2, weight 2+2 = 36; backward (autograd
#: of the same ops) weight 2+2 and its reduction 2+2, cast 2+4, mul 4+4 and 4+4, mean 4, pow
#: 4+4+4, gradient sum 4+4+4, cast 4+2 = 64; 100 in all, against 4 + 6 = 10 for one fused
#: kernel each way.
EAGER_NORM_BYTES = 100.0
#: Kernels an eager RMSNorm launches, forward (7) and backward (about 12), by the same count.
EAGER_NORM_KERNELS = 19
#: Kernels of any other layer in one training step: forward, gradient of the input, gradient
#: of the weight (a layer without weights launches two; three is the floor's count).
KERNELS_PER_LAYER = 3
#: Bytes an Adam step reads and writes per local parameter element: reads the fp32 master
#: weight and both moments and the bf16 gradient (4 + 4 + 4 + 2), writes the master weight,
#: the moments and the bf16 weight (4 + 4 + 4 + 2).
OPTIMIZER_STEP_BYTES = 28.0


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


def gemm_seconds(machine, gemms, dtype: str = "bf16", each: bool = False) -> np.ndarray:
    """Seconds (one training step's three products) of ``gemms`` (``(B, M, N, K)`` each) on
    ``machine`` in ``dtype``; with ``each`` the ``B`` products of one as ``B`` launches of one
    (``tests/test_moe_engines.py`` works both out by hand).
    """
    total = np.zeros(1)
    for B, M, N, K in gemms:
        if each:
            one = np.asarray(Gemm(1.0, M, N, K).priced(machine, dtype), dtype=np.float64)
            total = total + np.asarray(B, dtype=np.float64) * one
        else:
            total = total + np.asarray(Gemm(B, M, N, K).priced(machine, dtype), dtype=np.float64)
    return total


def activation_waits(layer, options: TrainingOptions) -> bool:
    """Whether mixture of experts ``layer``'s activation is the one whose engine implementation
    stops the host inside the block (``options.expert_activation_sync``): its block's MoE host
    time then adds to the device's (:meth:`StepCompute.host_wait_seconds`)."""
    return options.expert_activation_sync != "none" and layer.activation == options.expert_activation_sync


def _causal(layer) -> bool:
    return bool(getattr(layer, "args", {}).get("causal", False))


class StepCompute:
    """Seconds of each layer's kernels in one micro-batch of a training step
    (:meth:`compute`) and of its share of the optimizer step (:meth:`optimizer_seconds`)."""

    def __init__(self, layers: PricedLayers, keeping: LayerKeeping, precision: PrecisionPricing):
        self.keeping = keeping
        self.precision = precision
        self.network, self.machine = layers.network, layers.machine
        self.configs, self.parts, self.kinds = layers.configs, layers.parts, layers.kinds
        st = layers.structure
        self.cores, self.consumers, self.charged = st.cores, st.consumers, st.charged
        self.copies = st.copies
        self.fused = {v: self._fused_seconds(v) for v, role in self.cores.items() if role == "scores"}
        self.eager_compute = self._eager_norms()
        self.kernels = np.array([EAGER_NORM_KERNELS if v in self.eager_compute else KERNELS_PER_LAYER
                                 for v in range(len(self.network.layers))], dtype=np.float64)
        #: The mixtures of experts, whose experts' products an engine may launch one by one.
        self.experts = {v: self.network.layers[v] for v in sorted(st.experts)}

    @per_layer_kept
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
        seconds = seconds + self.precision.compute_delta(v, options) + self.expert_gemm_delta(v, options)
        clocked = (self.precision.gemm_seconds(v, options)
                   if self.machine.peak_flops is not None and float(self.machine.clock_ratio) != 1.0 else None)
        seconds = self._in_step(seconds, options, clocked)
        if options.launch_seconds > 0:
            kernels = self.kernels[v] if options.eager else KERNELS_PER_LAYER
            seconds = np.where(seconds > 0, np.maximum(seconds, kernels * options.launch_seconds), seconds)
        return seconds + self.host_wait_seconds(v, options)

    def host_wait_seconds(self, v: int, options: TrainingOptions) -> float:
        """Seconds a micro-batch's device waits for the host at mixture of experts ``v`` when the
        engine's implementation of its activation stops the host inside the block
        (``options.expert_activation_sync`` names the layer's ``activation``): the block's MoE
        host time, ``moe_block_overhead_seconds``, serialised with the device's work instead of
        hidden behind it (a full recomputation runs the forward, and its wait, again: counted
        with the layer's compute). 0 for every other layer."""
        layer = self.experts.get(v)
        return options.moe_block_overhead_seconds if layer is not None and activation_waits(layer, options) else 0.0

    def expert_activation_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Seconds of the forward of mixture of experts ``v``'s activation, one point-wise pass
        over its experts' first products' output (``matrices - 1`` times the activation's
        ``MoE.activation_elements``), the forward share of its training-step price: what
        ``recompute_modules`` ``moe_act`` runs again in the backward pass. Zeros elsewhere."""
        layer = self.experts.get(v)
        if layer is None:
            return np.zeros(len(self.configs[v]))
        elements = np.asarray(layer.activation_elements(self.configs[v]), dtype=np.float64) * (layer.matrices - 1)
        seconds = FORWARD_SHARE * np.asarray(self.machine.memory_bound("gelu", elements, 3.0 * elements),
                                             dtype=np.float64)
        return self._in_step(seconds, options, np.zeros_like(seconds))

    def shared_expert_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Seconds of the forward of mixture of experts ``v``'s shared experts: their products
        (``MoE.shared_gemms``, in the plan's number format where the layer is converted) and
        their activation's point-wise pass, the forward share of their training-step price:
        what ``recompute_modules`` ``shared_experts`` runs again in the backward pass. Zeros
        elsewhere."""
        layer = self.experts.get(v)
        rows = len(self.configs[v])
        if layer is None or not layer.args.get("shared"):
            return np.zeros(rows)
        dtype = options.precision if options.precision != "bf16" and self.precision.eligible()[v] else "bf16"
        products = gemm_seconds(self.machine, layer.shared_gemms(self.configs[v]), dtype) * np.ones(rows)
        inner = (np.asarray(layer.shared_elements(self.configs[v]), dtype=np.float64)
                 * (layer.matrices - 1) / layer.matrices)  # the first products' output
        act = np.asarray(self.machine.memory_bound("gelu", inner, 3.0 * inner), dtype=np.float64)
        return self._in_step(FORWARD_SHARE * (products + act), options, FORWARD_SHARE * products)

    def expert_gemm_delta(self, v: int, options: TrainingOptions) -> np.ndarray | float:
        """Seconds a mixture of experts' products change by when they run as
        ``options.expert_gemm`` says: ``per_expert`` (Transformer Engine's ``GroupedLinear``,
        which Megatron-Core's ``TEGroupedMLP`` runs under ``--moe-grouped-gemm``: one cuBLAS GEMM
        per local expert, issued in turn on its streams; megatron-core 0.16.1
        transformer/moe/experts.py ``TEGroupedMLP``, extensions/transformer_engine.py
        ``TEGroupedLinear``) prices each local expert's product on its own, ``B gemm(1, M, N, K)
        - gemm(B, M, N, K)``: a small expert's product runs at the rate its own shape reaches
        (the machine's measured table); ``grouped`` (one kernel for all, CUTLASS's grouped GEMM or
        ``torch._grouped_mm``: the layer's own pricing) adds nothing. In the plan's number format
        where the layer is converted."""
        if options.expert_gemm == "grouped" or v not in self.experts:
            return 0.0
        dtype = options.precision if options.precision != "bf16" and self.precision.eligible()[v] else "bf16"
        gemms = self.experts[v].expert_gemms(self.configs[v])
        delta = gemm_seconds(self.machine, gemms, dtype, each=True) - gemm_seconds(self.machine, gemms, dtype)
        return np.maximum(delta, 0.0)

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

    @per_layer_kept
    def optimizer_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The optimizer step over the layer's local optimizer state (memory-bound)."""
        return self._optimizer_over(v, options, self.charged[v])

    @per_layer_kept
    def copy_optimizer_seconds(self, v: int, options: TrainingOptions) -> np.ndarray:
        """The optimizer step over the copies of tied weights ``v`` holds on a pipeline's last
        stage (``NetworkStructure.copies``): that stage steps its copy as its own weights."""
        return self._optimizer_over(v, options, self.copies[v])

    def _optimizer_over(self, v: int, options: TrainingOptions, flags) -> np.ndarray:
        hbm = self.machine.hbm_bytes_per_s
        if not options.optimizer_step or hbm is None or not any(flags):
            return np.zeros(len(self.configs[v]))
        if options.offload and ("optimizer" in options.offload or "nvme" in options.offload):
            return np.zeros(len(self.configs[v]))  # the host's CPU steps it (costing.training.offload)
        total = np.zeros(len(self.configs[v]))
        for (elements, r), stepped in zip(self.parts[v].params, flags):
            if stepped:
                total = total + elements / (r if options.zero >= 1 else 1.0)
        # The optimizer's temporaries are written and read again (``optimizer_temp_bytes``).
        return (OPTIMIZER_STEP_BYTES + 2.0 * options.optimizer_temp_bytes) * total / hbm

    # -- fused attention ----------------------------------------------------------------

    def _fused_seconds(self, v: int) -> np.ndarray:
        """Fused attention time of the scores layer ``v``'s configurations (both products,
        forward and backward, at the kernel's efficiency; halved when causal)."""
        layer = self.network.layers[v]
        C = self.configs[v].astype(np.float64)
        per_device = np.asarray(layer.domain, dtype=np.float64) / C
        forward = 2.0 * 2.0 * per_device.prod(axis=1)
        # Causal when a layer of the core's chain (its softmax, a mask) says so.
        chain = []
        w = self.consumers[v][0]
        while self.cores.get(w) == "softmax":
            chain.append(self.network.layers[w])
            w = self.consumers[w][0]
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

    def _attention_efficiency(self) -> float:
        """The fused kernel's fraction of peak the machine states (else the default)."""
        return self.machine.attention_efficiency or DEFAULT_ATTENTION_EFFICIENCY

    # -- eager norms ----------------------------------------------------------------------

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
