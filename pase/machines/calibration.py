"""Measure this GPU's GEMM and memory-bound tables with PyTorch; write a machine description.

``calibrate(out_path)`` (the ``pase calibrate`` command, ``docs/machines.md``) writes the same
two tables as the shipped ``h100-sxm`` one, and a description that ``--machine FILE.json`` accepts.

Measured like the shipped table: bf16; one training step of a (batched) GEMM, the forward
``Y[B,M,N] = X[B,M,K] @ W[B,K,N]`` and the two backward products ``dX = dY @ W^T`` and
``dW = X^T @ dY``; forward and backward of ``add``, ``gelu``, ``layer_norm`` and ``softmax``
(rows of 1024); CUDA-graph replay (kernel time without launch overhead), best of 3.
Then an attention grid (:func:`attention_grid`): ``scaled_dot_product_attention`` forward and
backward, causal, whose median efficiency against the peak becomes the description's
``attention_efficiency`` (the fused attention kernel's fraction of peak).
PyTorch is an optional dependency, imported only when measuring.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
from typing import Callable

from pase.machines.calibrated import validate_description
from pase.core.fileio import write_atomic
from pase.core.optional import import_optional
from pase.machines.measured import ELEMENT_TRAFFIC, MeasuredTables

__all__ = ["gemm_grid", "gemm_grid_fp8", "memory_grid", "attention_grid", "attention_flops", "calibrate",
           "calibrate_dtype", "TorchTimer", "gemm_step", "gemm_step_fp8", "memory_bound_step", "attention_step",
           "TORCH_HINT", "CALIBRATED_DTYPES"]

TORCH_HINT = "pase calibrate needs PyTorch: pip install '.[torch]'"

#: No tensor of a measured GEMM exceeds this many bytes (as in the shipped table).
MAX_TENSOR_BYTES = 4e9
#: bf16: bytes per element of every measured tensor.
ELEMENT_BYTES = 2
MEMORY_BOUND_OPS = ("add", "gelu", "layer_norm", "softmax")
#: layer_norm and softmax work on rows of this many elements.
ROW = 1024

#: FlashAttention's backward runs 2.5 times the forward's products (as
#: ``pase.costing.training.FLASH_BACKWARD_FACTOR``, which prices the fused kernel).
ATTENTION_BACKWARD_FACTOR = 2.5
#: Head dimension of every measured attention shape.
ATTENTION_HEAD_DIM = 128

#: Links cannot be measured on one GPU: these defaults (an H100 SXM node, NVLink and
#: 400 Gb/s networking) go into the description unless the command line sets them.
DEFAULT_LINKS = {"intra_node": {"gbps": 450, "latency_us": 3}, "inter_node": {"gbps": 50, "latency_us": 10}}


def gemm_grid(quick: bool = False) -> list:
    """The ``(B, M, N, K)`` shapes to measure.

    Full (the shipped table's grid): M, N, K powers of two from 1 to 16384 at B = 1 and to
    2048 at B = 4, 32, 256, 2048, no tensor over 4 GB: 10,102 shapes. Quick: powers of four
    from 1 to 16384 at B = 1, and 1, 8, 64, 512, 2048 at B = 16 and 256: 762 shapes.

    >>> len(gemm_grid()), len(gemm_grid(quick=True))
    (10102, 762)
    """
    if quick:
        plan = [(1, [4 ** i for i in range(8)]), (16, [1, 8, 64, 512, 2048]), (256, [1, 8, 64, 512, 2048])]
    else:
        plan = [(1, [2 ** i for i in range(15)])] + [(b, [2 ** i for i in range(12)]) for b in (4, 32, 256, 2048)]
    shapes = []
    for b, sizes in plan:
        for m, n, k in itertools.product(sizes, sizes, sizes):
            if ELEMENT_BYTES * b * max(m * k, k * n, m * n) <= MAX_TENSOR_BYTES:
                shapes.append((b, m, n, k))
    return shapes


#: Number formats ``pase calibrate --dtype`` measures GEMMs in beyond BF16.
CALIBRATED_DTYPES = ("fp8",)


def gemm_grid_fp8(quick: bool = False) -> list:
    """The ``(B, M, N, K)`` shapes of the FP8 table: M, N, K multiples of 16 (what FP8 tensor
    cores and ``torch._scaled_mm`` take), no tensor over 4 GB at one byte an element.

    Full: powers of two from 16 to 16384 at B = 1 and to 4096 at B = 8: 1,331 + 729 = 2,060
    shapes. Quick: 16 x 4^i to 16384 at B = 1, 16, 128, 1024 and 4096 at B = 8: 216 + 64 = 280.

    >>> len(gemm_grid_fp8()), len(gemm_grid_fp8(quick=True))
    (2060, 280)
    """
    if quick:
        plan = [(1, [16 * 4 ** i for i in range(6)]), (8, [16, 128, 1024, 4096])]
    else:
        plan = [(1, [2 ** i for i in range(4, 15)]), (8, [2 ** i for i in range(4, 13)])]
    shapes = []
    for b, sizes in plan:
        for m, n, k in itertools.product(sizes, sizes, sizes):
            if b * max(m * k, k * n, m * n) <= MAX_TENSOR_BYTES:
                shapes.append((b, m, n, k))
    return shapes


def memory_grid(quick: bool = False) -> list:
    """The ``(op, elements)`` pairs to measure: 1024 to 2^30 elements by 4x (quick: by 16x).

    >>> len(memory_grid()), len(memory_grid(quick=True)), memory_grid()[:2]
    (44, 24, [('add', 1024), ('gelu', 1024)])
    """
    sizes = [ROW * 16 ** i for i in range(6)] if quick else [ROW * 4 ** i for i in range(11)]
    return [(op, e) for e in sizes for op in MEMORY_BOUND_OPS]


def attention_grid() -> list:
    """The ``(batch, heads, sequence, head_dim)`` attention shapes to measure (quick or not).

    Batch 1 with 32 heads and batch 4 with 16, sequences of 2048, 4096 and 8192, head
    dimension 128: 6 shapes.

    >>> len(attention_grid()), attention_grid()[0]
    (6, (1, 32, 2048, 128))
    """
    return [(b, h, s, ATTENTION_HEAD_DIM) for b, h in ((1, 32), (4, 16)) for s in (2048, 4096, 8192)]


def attention_flops(b: int, h: int, s: int, d: int) -> float:
    """Modelled FLOPs of one causal attention training step, as the costing prices it.

    Forward: the two products ``QK^T`` and ``PV``, ``2 * 2 * b*h*s*s*d``, halved for the
    causal mask; the backward runs 2.5 times that.

    >>> attention_flops(1, 1, 2, 1)   # 4 * 4 / 2 * 3.5
    28.0
    """
    return 4.0 * b * h * s * s * d / 2.0 * (1.0 + ATTENTION_BACKWARD_FACTOR)


# ---------------------------------------------------------------------------------------
# Measuring with torch


class TorchTimer:
    """Times GEMM steps and memory-bound ops on the current CUDA device (bf16, CUDA graphs).

    Raises ``ImportError`` (:data:`TORCH_HINT`) without PyTorch and ``RuntimeError``
    without a CUDA device.
    """

    def __init__(self, repeats: int = 3, target_seconds: float = 2e-3):
        torch = import_optional("torch", missing=lambda: ImportError(TORCH_HINT))
        if not torch.cuda.is_available():
            raise RuntimeError("pase calibrate needs a CUDA GPU, and PyTorch sees none on this machine")
        self.torch = torch
        self.device = torch.device("cuda")
        self.repeats = repeats
        self.target = target_seconds
        props = torch.cuda.get_device_properties(self.device)
        self.device_name = props.name
        self.memory_bytes = props.total_memory
        self.software = f"torch {torch.__version__}, bf16, CUDA-graph replay (kernel time, no launch overhead), best of {repeats}"

    def _time(self, step: Callable[[], None]) -> float:
        """Seconds of one ``step``: captured ``n`` times in a graph, best of ``repeats`` replays."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the graph (cuBLAS workspaces, autograd)
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        torch.cuda.synchronize()
        eager = max(start.elapsed_time(stop) * 1e-3, 1e-7)
        inner = max(1, min(100, math.ceil(self.target / eager)))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                step()
        best = math.inf
        for _ in range(self.repeats):
            start.record()
            graph.replay()
            stop.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(stop) * 1e-3 / inner)
        del graph
        return best

    def gemm(self, b: int, m: int, n: int, k: int) -> float:
        return self._measure(gemm_step(self.torch, self.device, b, m, n, k))

    def fp8_missing(self) -> str | None:
        """Why this GPU and PyTorch cannot measure FP8 GEMMs (``None``: they can)."""
        torch = self.torch
        if not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "float8_e5m2") and hasattr(torch, "_scaled_mm")):
            return f"torch {torch.__version__} has no FP8 matrix multiply (torch._scaled_mm, float8_e4m3fn)"
        major, minor = torch.cuda.get_device_capability(self.device)
        if (major, minor) < (8, 9):
            return (f"{self.device_name} (compute capability {major}.{minor}) has no FP8 tensor cores "
                    "(compute capability 8.9 or later: Ada, Hopper, Blackwell)")
        return None

    def gemm_fp8(self, b: int, m: int, n: int, k: int) -> float:
        return self._measure(gemm_step_fp8(self.torch, self.device, b, m, n, k))

    def memory_bound(self, op: str, elements: int) -> float:
        return self._measure(memory_bound_step(self.torch, self.device, op, elements))

    def _measure(self, step) -> float:
        """The best time of ``step``, its tensors freed afterwards (the next shape needs the memory)."""
        try:
            return self._time(step)
        finally:
            del step
            self.torch.cuda.empty_cache()

    def attention(self, b: int, h: int, s: int, d: int) -> float:
        step = attention_step(self.torch, self.device, b, h, s, d)
        try:
            return self._time(step)
        finally:
            del step
            self.torch.cuda.empty_cache()


def gemm_step(torch, device, b: int, m: int, n: int, k: int) -> Callable[[], tuple]:
    """One training step of ``b`` GEMMs as a closure: ``step() -> (Y, dX, dW)``, bf16.

    Forward ``Y = X @ W`` and the two backward products ``dX = dY @ W^T``, ``dW = X^T @ dY``
    into preallocated outputs (capturable in a CUDA graph). ``b = 1``: plain 2-D GEMMs.
    """
    def shape(*s):
        return s if b > 1 else s[1:]

    opts = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(*shape(b, m, k), **opts)
    w = torch.randn(*shape(b, k, n), **opts)
    dy = torch.randn(*shape(b, m, n), **opts)
    y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)

    def step():
        torch.matmul(x, w, out=y)
        torch.matmul(dy, w.transpose(-1, -2), out=dx)
        torch.matmul(x.transpose(-1, -2), dy, out=dw)
        return y, dx, dw

    step.inputs = (x, w, dy)
    return step


def gemm_step_fp8(torch, device, b: int, m: int, n: int, k: int) -> Callable[[], list]:
    """One training step of ``b`` GEMMs with FP8 operands as Transformer Engine runs them on
    Hopper: forward ``Y = X @ W`` (E4M3 x E4M3), ``dX = dY @ W^T`` (E5M2 x E4M3), ``dW = X^T @ dY``
    (E4M3 x E5M2), BF16 results, per-tensor scales; each operand already cast, in the layout
    ``torch._scaled_mm`` takes (the first row-major, the second column-major): the casts are
    priced apart (``pase.costing.precision``). ``step() -> [results]``."""
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    scale = torch.ones((), device=device, dtype=torch.float32)

    def operand(rows, cols, dtype, column_major):
        if column_major:  # stored as its transpose, read transposed
            return torch.randn(cols, rows, device=device, dtype=torch.bfloat16).to(dtype).t()
        return torch.randn(rows, cols, device=device, dtype=torch.bfloat16).to(dtype)

    pairs = []
    for _ in range(b):
        pairs += [(operand(m, k, e4, False), operand(k, n, e4, True)),    # X @ W
                  (operand(m, n, e5, False), operand(n, k, e4, True)),    # dY @ W^T
                  (operand(k, m, e4, False), operand(m, n, e5, True))]    # X^T @ dY

    def step():
        out = []
        for a, w in pairs:
            r = torch._scaled_mm(a, w, scale, scale, out_dtype=torch.bfloat16)
            out.append(r[0] if isinstance(r, tuple) else r)  # torch < 2.5 also returns the amax
        return out

    step.inputs = tuple(t for pair in pairs for t in pair)
    return step


def memory_bound_step(torch, device, op: str, elements: int) -> Callable[[], tuple]:
    """Forward and backward of ``op`` on ``elements`` bf16 elements: ``step() -> gradients``.

    ``layer_norm`` (with its scale and shift) and ``softmax`` work on rows of 1024;
    ``elements`` must be a multiple of 1024.
    """
    if op not in MEMORY_BOUND_OPS:
        raise ValueError(f"cannot measure memory-bound op {op!r}; one of {', '.join(MEMORY_BOUND_OPS)}")
    if elements % ROW:
        raise ValueError(f"memory-bound sizes must be multiples of {ROW}, got {elements}")
    F = torch.nn.functional
    opts = dict(device=device, dtype=torch.bfloat16)
    rows = (elements // ROW, ROW)
    x = torch.randn(*rows, **opts, requires_grad=True)
    dy = torch.randn(*rows, **opts)
    if op == "add":
        other = torch.randn(*rows, **opts, requires_grad=True)
        inputs, forward = (x, other), (lambda: x + other)
    elif op == "gelu":
        inputs, forward = (x,), (lambda: F.gelu(x))
    elif op == "layer_norm":
        weight = torch.ones(ROW, **opts, requires_grad=True)
        bias = torch.zeros(ROW, **opts, requires_grad=True)
        inputs, forward = (x, weight, bias), (lambda: F.layer_norm(x, (ROW,), weight, bias))
    else:  # softmax
        inputs, forward = (x,), (lambda: F.softmax(x, dim=-1))

    def step():
        return torch.autograd.grad(forward(), inputs, dy)

    step.inputs = inputs + (dy,)
    return step


def attention_step(torch, device, b: int, h: int, s: int, d: int) -> Callable[[], tuple]:
    """Forward and backward of causal ``scaled_dot_product_attention`` on ``[b, h, s, d]``
    bf16 queries, keys and values: ``step() -> (dQ, dK, dV)`` (PyTorch picks the kernel:
    FlashAttention where it can)."""
    F = torch.nn.functional
    opts = dict(device=device, dtype=torch.bfloat16)
    q, k, v = (torch.randn(b, h, s, d, **opts, requires_grad=True) for _ in range(3))
    dy = torch.randn(b, h, s, d, **opts)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(out, (q, k, v), dy)

    step.inputs = (q, k, v, dy)
    return step


# ---------------------------------------------------------------------------------------
# The tables and the description


def _best_rates(gemm_rows: list, memory_rows: list) -> tuple:
    """Peak TFLOPS and HBM GB/s as the best rates measured (defaults for the description)."""
    tflops = max(6.0 * b * m * n * k / s for b, m, n, k, s in gemm_rows) / 1e12
    gbps = max(
        (ELEMENT_TRAFFIC[op] * e * ELEMENT_BYTES / s for op, e, s in memory_rows), default=0.0
    ) / 1e9
    return tflops, gbps


def calibrate(out_path: str, quick: bool = False, *, timer=None, name: str | None = None,
              devices_per_node: int = 8, memory_gb: float | None = None, peak_tflops: float | None = None,
              hbm_gbps: float | None = None, intra_node: dict | None = None, inter_node: dict | None = None,
              progress: Callable[[int, int], None] | None = None, attention: bool = True) -> dict:
    """Measure the tables and write ``out_path`` (the description) and its table file.

    The table goes next to the description as ``<stem>-measured.json``, named relative
    in its ``measured`` field, so the pair can be moved together.

    Parameters
    ----------
    out_path : str
        The machine description to write (``.json``).
    quick : bool
        Measure the small grid (:func:`gemm_grid`) instead of the shipped one.
    timer : object, optional
        Has ``gemm(B, M, N, K)``, ``memory_bound(op, elements)`` and ``attention(b, h, s, d)``
        returning seconds and a ``device_name``; default a :class:`TorchTimer` on the
        current CUDA device.
    name, devices_per_node, memory_gb, peak_tflops, hbm_gbps, intra_node, inter_node
        Description fields. Defaults: the file's stem; 8; the device's memory; the best
        FLOP rate and bandwidth measured; :data:`DEFAULT_LINKS` (not measurable on one GPU).
    progress : callable, optional
        Called as ``progress(done, total)`` after each measurement.
    attention : bool
        Measure the attention grid (:func:`attention_grid`) and write the median efficiency,
        ``attention_flops / (seconds * peak)`` capped at 1, as ``attention_efficiency``
        (rounded to 3 places) and the rows in the table's ``attention``. The peak is the
        description's ``peak_tflops``. False: neither is written (the costing's default).

    Returns
    -------
    dict
        The description written.
    """
    if timer is None:
        timer = TorchTimer()
    out_path = os.fspath(out_path)
    if not out_path.endswith(".json"):
        raise ValueError(f"the description must be a .json file, got {out_path!r}")
    stem = os.path.basename(out_path)[: -len(".json")]
    table_name = f"{stem}-measured.json"
    work = [("gemm", s) for s in gemm_grid(quick)] + [("memory_bound", s) for s in memory_grid(quick)]
    if attention:
        work += [("attention", s) for s in attention_grid()]
    gemm_rows, memory_rows, attention_rows = [], [], []
    for i, (kind, shape) in enumerate(work):
        if kind == "gemm":
            gemm_rows.append([*shape, float(timer.gemm(*shape))])
        elif kind == "memory_bound":
            memory_rows.append([*shape, float(timer.memory_bound(*shape))])
        else:
            attention_rows.append([*shape, float(timer.attention(*shape))])
        if progress is not None:
            progress(i + 1, len(work))
    device = getattr(timer, "device_name", "unknown device")
    table = MeasuredTables(gemm_rows, memory_rows, f"measured table {table_name}").to_dict()
    table = {
        "device": device,
        "software": getattr(timer, "software", "unknown"),
        "gemm_note": "one training step of a (batched) GEMM: forward Y[B,M,N]=X[B,M,K]@W[B,K,N] and the two "
                     "backward products dX=dY@W^T, dW=X^T@dY",
        "memory_bound_note": "forward + backward of an element-wise op on a bf16 tensor of that many elements "
                             "(layer_norm and softmax over rows of 1024)",
        **table,
    }
    best_tflops, best_gbps = _best_rates(gemm_rows, memory_rows)
    if memory_gb is None:
        memory_gb = getattr(timer, "memory_bytes", None)
        memory_gb = round(memory_gb / 1e9, 1) if memory_gb else 80
    peak_tflops = peak_tflops if peak_tflops is not None else round(best_tflops, 1)
    efficiency = None
    if attention_rows:
        efficiencies = [min(1.0, attention_flops(b, h, s, d) / (seconds * peak_tflops * 1e12))
                        for b, h, s, d, seconds in attention_rows]
        efficiency = max(0.001, round(float(statistics.median(efficiencies)), 3))
        table["attention_note"] = (
            "[batch, heads, sequence, head_dim, seconds, efficiency]: forward + backward of causal "
            "scaled_dot_product_attention on bf16 [batch, heads, sequence, head_dim] tensors; efficiency = "
            f"4*b*h*s*s*d/2 * (1 + {ATTENTION_BACKWARD_FACTOR:g}) / (seconds * {peak_tflops:g} TFLOPS)")
        table["attention"] = [row + [round(e, 4)] for row, e in zip(attention_rows, efficiencies)]
    description = {
        "name": name or stem,
        "devices_per_node": devices_per_node,
        "memory_gb": memory_gb,
        "peak_tflops": peak_tflops,
        "hbm_gbps": hbm_gbps if hbm_gbps is not None else round(best_gbps, 1),
        "intra_node": dict(intra_node or DEFAULT_LINKS["intra_node"]),
        "inter_node": dict(inter_node or DEFAULT_LINKS["inter_node"]),
        "act_bytes": ELEMENT_BYTES,
        "grad_bytes": 4,
        **({"attention_efficiency": efficiency} if efficiency is not None else {}),
        "measured": table_name,
        "device": device,
        "notes": ("measured by pase calibrate" + (" --quick" if quick else "")
                  + "; intra_node and inter_node are not measured (set them for your cluster)"),
    }
    description = validate_description(description, f"machine file {os.path.basename(out_path)}")
    folder = os.path.dirname(os.path.abspath(out_path))
    # The table first: the description names it, so it must never point at a missing file.
    write_atomic(os.path.join(folder, table_name), json.dumps(table, separators=(",", ":")) + "\n", "measured table")
    write_atomic(out_path, json.dumps(description, indent=2) + "\n", "machine description")
    return description


def calibrate_dtype(out_path: str, dtype: str = "fp8", quick: bool = False, *, timer=None,
                    progress: Callable[[int, int], None] | None = None) -> dict:
    """Measure ``dtype`` GEMMs into an existing machine description ``out_path`` (written by
    :func:`calibrate`): the rows go into its table as ``gemm_<dtype>`` ([B, M, N, K, seconds], the
    same training step with FP8 operands, :func:`gemm_step_fp8`, over :func:`gemm_grid_fp8`),
    which the machine then prices that format's GEMMs from instead of the transfer rule; the
    description gains ``dtype_tflops.<dtype>`` (the best rate measured) if it states none.

    ``timer``: has ``gemm_fp8(B, M, N, K)`` and ``fp8_missing()`` (the reason it cannot, or
    ``None``); default a :class:`TorchTimer`. A device without the format: ``RuntimeError``
    (one line), nothing written.
    """
    from pase.core.fileio import read_json  # noqa: PLC0415

    if dtype not in CALIBRATED_DTYPES:
        raise ValueError(f"--dtype {dtype}: measures {', '.join(CALIBRATED_DTYPES)} (bf16 is the default table)")
    if timer is None:
        timer = TorchTimer()
    missing = timer.fp8_missing()
    if missing is not None:
        raise RuntimeError(f"--dtype {dtype}: {missing}")
    out_path = os.fspath(out_path)
    label = f"machine file {os.path.basename(out_path)}"
    if not os.path.isfile(out_path):
        raise ValueError(f"{label}: no such machine description {out_path} (pase calibrate --out {out_path} writes "
                         f"one; --dtype {dtype} adds to it)")
    description = validate_description(read_json(out_path, "machine file", stdin=False), label)
    if "measured" not in description:
        raise ValueError(f"--dtype {dtype} adds to the measured table of a description pase calibrate wrote, "
                         f"and {os.path.basename(out_path)} names none")
    folder = os.path.dirname(os.path.abspath(out_path))
    table_path = os.path.join(folder, description["measured"])
    table = read_json(table_path, "measured table")
    shapes = gemm_grid_fp8(quick)
    rows = []
    for i, shape in enumerate(shapes):
        rows.append([*shape, float(timer.gemm_fp8(*shape))])
        if progress is not None:
            progress(i + 1, len(shapes))
    MeasuredTables(rows, (), f"measured table {description['measured']} ({dtype})")  # a valid table
    table[f"gemm_{dtype}"] = rows
    table[f"gemm_{dtype}_note"] = ("the gemm step with FP8 operands as Transformer Engine runs it on Hopper: "
                                   "Y=X@W E4M3 x E4M3, dX=dY@W^T E5M2 x E4M3, dW=X^T@dY E4M3 x E5M2, BF16 "
                                   "results, operands cast beforehand (torch._scaled_mm)")
    written = dict(description)
    best = max(6.0 * b * m * n * k / seconds for b, m, n, k, seconds in rows) / 1e12
    written["dtype_tflops"] = {**description.get("dtype_tflops", {})}
    written["dtype_tflops"].setdefault(dtype, round(best, 1))
    written = validate_description(written, label)
    write_atomic(table_path, json.dumps(table, separators=(",", ":")) + "\n", "measured table")
    write_atomic(out_path, json.dumps(written, indent=2) + "\n", "machine description")
    return written
