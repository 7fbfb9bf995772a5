"""Low-precision training (FP8, MXFP8, NVFP4) priced in one place (``docs/precision.md``).

``TrainingOptions.precision`` names the number format of the weight products of the repeated
blocks (the GEMMs Transformer Engine's ``fp8_autocast`` and torchao's Float8/MX converters
convert); everything else stays BF16: attention (its fused kernel), the embedding, the output
layer (Megatron keeps it out of Transformer Engine, torchtitan's converters skip ``output``),
norms and point-wise work. For each such layer :class:`PrecisionPricing` charges, per
micro-batch:

- its GEMMs at the machine's rate for the format (``Machine.gemm(..., dtype=)``, the transfer
  rule of ``pase.machines.specs.GemmTransfer``) in place of their BF16 time;
- the quantisation kernels, memory-bound at the machine's streaming rate: every operand of the
  GEMMs is cast (the input and the output gradient every micro-batch, the weight once per step:
  its low-precision copy is cached across micro-batches, except under ZeRO-3, which gathers and
  casts it again every micro-batch) at :data:`QUANT_BYTES` bytes read and written per element;

and in memory: the input a layer keeps for its weight gradient in the format (a tensor that only
converted layers read is stored at :data:`~pase.machines.specs.DTYPE_BYTES` per element instead
of BF16's), the cached low-precision weights (both orientations, :data:`WEIGHT_CACHE_ORIENTATIONS`;
under ZeRO-3 they are gathered per layer and transient), and with ``fp8_gather`` the ZeRO-3
all-gathers of the converted weights at the format's size (torchtitan's
``enable_fsdp_float8_all_gather``, Megatron's ``--fp8-param-gather``).

Not priced: the per-tensor amax all-reduces (delayed scaling: one small collective per step;
current scaling with tensor parallelism: one per sharded tensor, latency only), NVFP4's random
Hadamard transforms and stochastic rounding, and any loss of accuracy.
"""

from __future__ import annotations

import numpy as np

from pase.machines.measured import ELEMENT_TRAFFIC
from pase.machines.specs import DTYPE_BYTES, DTYPES

__all__ = ["PRECISIONS", "FP8_SCALINGS", "QUANT_BYTES", "WEIGHT_CACHE_ORIENTATIONS", "PrecisionPricing",
           "machine_precisions", "check_precision", "quant_key", "tp_overlap_share", "HIGH_PRECISION_COMM"]

#: Number formats a plan's weight products may run in (``--recipe precision=``).
PRECISIONS = DTYPES
#: FP8 scaling recipes (``--recipe scaling=``, with ``precision=fp8``): per-tensor scales from
#: the amax history (``delayed``: Transformer Engine's ``DelayedScaling``, Megatron
#: ``--fp8-recipe delayed``) or of the tensor itself (``current``: ``Float8CurrentScaling``,
#: torchao's tensorwise), per row (``rowwise``: torchao), per block of 1 x 128 activations and
#: 128 x 128 weights (``blockwise``: DeepSeek-V3's recipe, ``Float8BlockScaling``).
FP8_SCALINGS = ("delayed", "current", "rowwise", "blockwise")

#: Bytes read plus written per element of a tensor to quantise it for the forward and backward
#: products (two orientations: Hopper's FP8 GEMMs take K-major operands, so the transposed
#: copy is written too; Blackwell's block scales run along one axis, so both are written):
#:
#: - ``fp8/delayed``: one fused cast-transpose, read 2 bytes, write 1 + 1: 4 (the amax is taken in
#:   the same pass, for the next step's scale);
#: - ``fp8/current``: an amax pass first (read 2), then the cast-transpose (4): 6;
#: - ``fp8/rowwise``: per orientation its own scales, amax and cast fused per row: (2 + 1) x 2 = 6;
#: - ``fp8/blockwise``: one pass writing both orientations with local scales, 2 + 2 x (1 + 4/128)
#:   (an fp32 scale per 128 elements): 4.0625;
#: - ``mxfp8``: one pass, 2 + 2 x (1 + 1/32) (an 8-bit scale per 32 elements): 4.0625;
#: - ``nvfp4``: a global amax pass (2), then one pass writing both orientations at 4 bits with an
#:   FP8 scale per 16: 2 + 2 + 2 x (0.5 + 1/16) = 5.125.
QUANT_BYTES = {
    ("fp8", "delayed"): 4.0, ("fp8", "current"): 6.0, ("fp8", "rowwise"): 6.0, ("fp8", "blockwise"): 4.0625,
    ("mxfp8", None): 4.0625, ("nvfp4", None): 5.125,
}
#: Low-precision copies of each converted weight kept for the step: row- and column-wise; one
#: for per-tensor FP8 on a device whose FP8 GEMMs take any layout (``fp8_layouts`` ``any``,
#: Blackwell: the transposed copy is neither written nor kept, :func:`orientations`).
WEIGHT_CACHE_ORIENTATIONS = 2.0
#: The FP8 scalings whose one per-tensor scale serves both orientations (``orientations``).
PER_TENSOR_FP8 = ("delayed", "current")


def orientations(options, machine) -> float:
    """Low-precision copies a converted tensor is written in: :data:`WEIGHT_CACHE_ORIENTATIONS`,
    or one for per-tensor FP8 where the machine's FP8 GEMMs take any layout.

    >>> from types import SimpleNamespace as N
    >>> orientations(N(precision="fp8", fp8_scaling="current"), N(fp8_layouts="any"))
    1.0
    >>> orientations(N(precision="mxfp8", fp8_scaling="current"), N(fp8_layouts="any"))
    2.0
    """
    if (options.precision == "fp8" and options.fp8_scaling in PER_TENSOR_FP8
            and machine.fp8_layouts == "any"):
        return 1.0
    return WEIGHT_CACHE_ORIENTATIONS


#: FP8 recipes whose distributed communication stays in high precision: torchao's ``rowwise``
#: (torchtitan ``docs/float8.md``:31; the Float8 all-gathers of FSDP and tensor parallelism run
#: with tensorwise scaling only).
HIGH_PRECISION_COMM = (("fp8", "rowwise"),)


def tp_overlap_share(options) -> float:
    """Share of a layer's tensor-parallel collectives an overlap of them with the GEMMs can hide:
    1, but 0.5 with FP8 ``rowwise`` scaling: torch's asynchronous tensor parallelism fuses the
    matmul-then-reduce-scatter patterns with rowwise scales but not the all-gather-then-matmul
    ones (pytorch/pytorch issue #149990, "[Async TP] all-gather-matmuls not fusing properly when
    rowwise scales are used", March 2025; torchtitan's asyncTP benchmark of June 2025: rowwise
    gains 1.04x from async TP where tensorwise gains 1.16x), and in tensor parallelism each layer
    all-gathers as much as it reduce-scatters (its input forward, its output gradient backward).

    >>> from types import SimpleNamespace as O
    >>> tp_overlap_share(O(precision="fp8", fp8_scaling="rowwise")), tp_overlap_share(O(precision="bf16"))
    (0.5, 1.0)
    """
    return 0.5 if quant_key(options) in HIGH_PRECISION_COMM else 1.0


def quant_key(options) -> tuple:
    """``(format, scaling)`` of ``options`` (the scaling only for FP8)."""
    return (options.precision, options.fp8_scaling if options.precision == "fp8" else None)


def machine_precisions(machine) -> tuple:
    """The formats ``machine`` runs GEMMs in (``("bf16",)`` for a machine that states none)."""
    return tuple(machine.precisions)


def check_precision(machine, precision: str) -> None:
    """``ValueError`` (one line) unless ``machine`` runs GEMMs in ``precision``."""
    have = machine_precisions(machine)
    if precision not in have:
        raise ValueError(f"precision={precision}: machine {machine.name} runs GEMMs in "
                         f"{', '.join(have)} only (pase machines lists each preset's formats)")


class PrecisionPricing:
    """The low-precision parts of a training costing (module doc), from its layers' parts
    (``layers``: a :class:`~pase.costing.training.parts.PricedLayers`). Nothing is computed for
    BF16; each format's GEMM times are taken once per kind of layer, when first asked for."""

    def __init__(self, layers):
        self.layers = layers
        #: Per layer and row, the share of its activation collectives charged: below 1 under
        #: sequence parallelism (the costing's ``activation_scale``, which sets it here).
        self.activation_scale = np.ones((len(layers.configs), 1))
        self._gemms: dict = {}
        self._clocked: dict = {}
        self._eligible = None

    def _layer(self, v: int, dtype: str) -> tuple:
        """``(seconds, elements)`` of ``v``'s GEMMs in ``dtype``, per configuration row."""
        c = self.layers
        key = (c.kinds[v], dtype)
        if key not in self._gemms:
            # The GEMMs of the layer's parts (their shapes), re-priced in the format.
            parts = c.parts[v]
            self._gemms[key] = (parts.gemm_seconds(c.machine, dtype), parts.gemm_elements())
        return self._gemms[key]

    def eligible(self) -> np.ndarray:
        """Per layer: a weight product of a repeated block (it holds parameters, runs GEMMs, is in
        a block and is not attention's core), the layers a format converts."""
        if self._eligible is None:
            c = self.layers
            flags = []
            for v in range(len(c.network.layers)):
                ok = c.structure.blocks[v] is not None and v not in c.structure.cores and bool(c.parts[v].params)
                flags.append(ok and bool((self._layer(v, "bf16")[1] > 0).any()))
            self._eligible = np.array(flags, dtype=bool)
        return self._eligible

    def _weights(self, v: int) -> np.ndarray:
        total = np.zeros(len(self.layers.configs[v]))
        for elements, _ in self.layers.parts[v].params:
            total = total + elements
        return total

    def compute_delta(self, v: int, options) -> np.ndarray | float:
        """Seconds ``v``'s compute of one micro-batch changes by in ``options.precision``: its
        GEMMs in the format less in BF16, plus the casts (the weight's once per step)."""
        dtype = options.precision
        if dtype == "bf16" or not self.eligible()[v]:
            return 0.0
        bf16, elements = self._layer(v, "bf16")
        low, _ = self._layer(v, dtype)
        weights = self._weights(v)
        # The weight's low-precision copy is kept across micro-batches, but ZeRO-3 gathers the
        # weight again for every micro-batch and casts it again.
        per_step = 1.0 if options.zero == 3 else 1.0 / options.microbatches
        cast_elements = np.maximum(elements - weights - self._not_cast(v, options), 0.0) + weights * per_step
        return low - bf16 + self.cast_seconds(cast_elements, options)

    def gemm_seconds(self, v: int, options) -> np.ndarray:
        """Seconds of ``v``'s GEMMs alone, one micro-batch, per configuration row: in the plan's
        format where ``v`` is converted, else in BF16 (the part of its compute the SM clock
        paces; the rest is memory-bound)."""
        key = (v, options.precision)
        found = self._clocked.get(key)
        if found is None:
            converted = options.precision != "bf16" and self.eligible()[v]
            found = self._clocked[key] = self._layer(v, options.precision if converted else "bf16")[0]
        return found

    def _producer(self, v: int):
        """The one layer whose output ``v`` reads (``None`` where it reads several, or none)."""
        producers = {t.producer for t in self.layers.network.layers[v].inputs if t.producer is not None}
        return producers.pop() if len(producers) == 1 else None

    def _not_cast(self, v: int, options=None) -> np.ndarray | float:
        """Elements of ``v``'s activation operands its GEMMs count that no cast of its own
        reads, per configuration row (a weight product, ``Layer.product``, only):

        - its input, when an earlier converted layer reads the same tensor: Transformer Engine
          runs the products of one input as one GEMM with one cast (Megatron-Core's
          ``linear_qkv`` for q, k and v; ``linear_fc1`` of width 2 x ffn for a gated MLP's gate and
          up), so the input is quantised once;
        - under sequence parallelism (the layer's activation collectives halved,
          ``activation_scale`` < 1) the share of an operand the all-gather brings: Transformer
          Engine quantises the local sequence shard and gathers FP8 (its ``gather_along_first_dim``
          with the input's quantizer in the forward pass, the output gradient's in the backward
          pass of a row-parallel layer), so a device casts ``1 / r`` of an operand replicated on
          ``r`` of its devices (``r`` = the devices of the layer over those of the operand's
          layout). Not with FP8 ``rowwise`` scaling (:data:`HIGH_PRECISION_COMM`): torchao's
          rowwise recipe does all distributed communication in high precision (torchtitan
          ``docs/float8.md``: "For float8 with rowwise scaling, all distributed communication is
          done in high precision"; ``torchtitan/models/llama3/infra/parallelize.py``: "For rowwise
          recipes, we use regular TP and all-gather happens in high precision"), so each device
          casts the gathered operand whole."""
        c = self.layers
        layer = c.network.layers[v]
        if not layer.product or not layer.inputs:
            return 0.0
        C = c.configs[v].astype(np.float64)
        used = C.prod(axis=1)
        in_cfg = np.asarray(layer.input_configs(c.configs[v])[0], dtype=np.float64).prod(axis=1)
        out_cfg = np.asarray(layer.output_configs(c.configs[v])[0], dtype=np.float64).prod(axis=1)
        inputs = float(np.prod(layer.inputs[0].shape)) / in_cfg
        outputs = float(np.prod(layer.output_shapes[0])) / out_cfg
        sp = np.asarray(self.activation_scale[v], dtype=np.float64) < 1.0
        u = self._producer(v)
        shared = u is not None and any(w < v and self.eligible()[w] and c.network.layers[w].product
                                       and self._producer(w) == u for w in c.structure.consumers.get(u, []))
        if options is not None and quant_key(options) in HIGH_PRECISION_COMM:
            sp = np.zeros_like(sp)  # gathered in BF16, then cast whole on every device
        gathered_in = np.where(sp, inputs * (1.0 - in_cfg / used), 0.0)
        gathered_out = np.where(sp, outputs * (1.0 - out_cfg / used), 0.0)
        return (inputs if shared else gathered_in) + gathered_out

    def cast_seconds(self, elements, options) -> np.ndarray:
        """Quantisation kernels over ``elements`` elements: :data:`QUANT_BYTES` each, streamed
        at the machine's rate for a copy (its ``memory_bound("copy", ...)``, whose traffic is
        ``ELEMENT_TRAFFIC["copy"]`` elements of ``act_bytes``)."""
        machine = self.layers.machine
        per_copy = ELEMENT_TRAFFIC["copy"] * float(machine.act_bytes or 2.0)
        written = DTYPE_BYTES[options.precision] * (WEIGHT_CACHE_ORIENTATIONS - orientations(options, machine))
        traffic = np.asarray(elements, dtype=np.float64) * (QUANT_BYTES[quant_key(options)] - written)
        return np.asarray(machine.memory_bound("copy", traffic / per_copy), dtype=np.float64)

    def stored_scale(self, v: int, options, act_bytes: float) -> float:
        """Share of ``v``'s stored output kept: ``DTYPE_BYTES[format] / act_bytes`` when every
        reader of it is a converted layer (which keeps its input in the format for the weight
        gradient), else 1. Not for attention's core (its backward reads its BF16 output) nor a
        converted layer's own output (a point-wise function fused into it needs its BF16 input
        for the backward pass)."""
        if options.precision == "bf16":
            return 1.0
        c = self.layers
        readers = c.structure.consumers.get(v, [])
        if (not readers or v in c.structure.cores or self.eligible()[v]
                or not all(self.eligible()[w] for w in readers)):
            return 1.0
        return DTYPE_BYTES[options.precision] / act_bytes

    def cache_bytes(self, v: int, options) -> np.ndarray | float:
        """Bytes of ``v``'s cached low-precision weights (ZeRO 0-2; under ZeRO-3 they are
        gathered per layer, transient)."""
        if options.precision == "bf16" or options.zero == 3 or not self.eligible()[v]:
            return 0.0
        return orientations(options, self.layers.machine) * DTYPE_BYTES[options.precision] * self._weights(v)

    def gather_scale(self, v: int, options) -> float:
        """Share of ``v``'s ZeRO all-gathers kept: the format's bytes over the weight's with
        ``fp8_gather`` on a converted layer, else 1."""
        if not options.fp8_gather or options.precision == "bf16" or not self.eligible()[v]:
            return 1.0
        return DTYPE_BYTES[options.precision] / options.weight_bytes
