"""Run a plan on ``torch.distributed`` (gloo, CPU processes) with DTensor, and check it.

``verify_torch`` is ``--verify torch``: it starts ``procs`` CPU processes (``python -m
pase.outputs.torch.verify``, gloo on a free localhost port), builds the network on DTensors placed as
the plan says (``pase.outputs.torch.program``: a device mesh with one axis per prime factor of
``procs``, laid out as ``pase.outputs.jax.export`` lays it out), runs a forward and backward pass with
random inputs and weights, and checks the loss and every weight gradient against the same
computation unsharded in one process (relative error 1e-4, as ``--verify jax``). The
collectives DTensor issued are counted with ``torch.distributed.tensor.debug.CommDebugMode``
(which layer: the module tracker; bytes: read off every collective) and set next to the bytes
the cost model charges, layer by layer.

Layer semantics are ``pase.outputs.jax.verify``'s. Every layer is an ``nn.Module`` with steps
``in<i>`` (redistribute input ``i`` to the plan's placements: the edge into the layer) and
``op`` (the layer's torch ops on DTensors, then its outputs brought to the plan's placements:
the layer's own reductions). Weights live in the plan's placements; after the backward pass
each gradient is brought to its weight's placements (its reduction, counted for the layer).

The plan is trusted where it says a tensor is already reduced: the plan records, per layer
output and per weight, the mesh axes over which it holds partial sums (the splits of the
iteration-space dimensions the tensor lacks); where DTensor holds partial sums over another
axis, the run takes every device's part as the whole, as a program following the plan would.
A plan that skips a reduction the computation needs therefore gives wrong numbers, and fails.

Bytes per device of a collective over ``q`` devices (as ``pase.outputs.jax.verify``): all-reduce of
``n`` bytes ``2 (q-1)/q n``; all-gather ``(q-1)/q`` of its output; reduce-scatter and
all-to-all ``(q-1)/q`` of their input; broadcast ``n``. The modelled bytes are the cost model's
volumes in elements times the element size (``pase.outputs.jax.verify.modelled_bytes``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

from pase.core.checks import arguments, configurations, optional, positive_int
from pase.core.budget import available_memory
from pase.core.units import format_bytes
from pase.costing.strategy import check_strategy
from pase.outputs.jax.common import GRADIENT_FLOOR
from pase.outputs.jax.common import relative_error as _relative_error
from pase.outputs.jax.export import export_shardings, tensor_dims, unpack_plan
from pase.outputs.jax.verify import DTYPES, MEMORY_SHARE, VerifyTooLarge, estimated_bytes, modelled_bytes
from pase.outputs.verified import numerics_dict

__all__ = [
    "verify_torch", "TorchVerifyResult", "TorchLayerTraffic", "TorchMissing", "TorchVerifyTooLarge", "torch_plan",
    "torch_estimated_bytes", "to_dtensor", "INSTALL_HINT", "PROCESS_BYTES",
]

#: What to tell a user without torch.
INSTALL_HINT = "PyTorch is not installed: pip install '.[torch]'"

#: Memory of one torch process before it holds any tensor (imports, gloo): measured 740 MB with a CUDA build of torch 2.15.
PROCESS_BYTES = 800e6


class TorchMissing(ImportError):
    """torch is not importable; the message says how to install it."""


class TorchVerifyTooLarge(VerifyTooLarge):
    """The torch run would need more memory than the budget; raised before anything starts."""

    def __init__(self, graph: str, procs: int, needed: float, budget: float):
        self.needed = needed
        self.budget = budget
        MemoryError.__init__(
            self,
            f"the PyTorch run of {graph} on {procs} processes needs about {format_bytes(needed)} of memory "
            f"(every process's shards and full weights, its activations and gradients, the unsharded run, and "
            f"{format_bytes(PROCESS_BYTES)} per process), over the budget of {format_bytes(budget)}; shrink the "
            f"graph with -b (batch) or -m (width)"
        )


def torch_estimated_bytes(network, configs, procs: int, element_bytes: int = 4) -> float:
    """``pase.outputs.jax.verify.estimated_bytes`` plus every process's own footprint, full weights and one-hot tensors."""
    weights = sum(math.prod(s) for layer in network.layers for s, _ in layer.parameters())
    weights += sum(math.prod(t.shape) for layer in network.layers for t in layer.inputs if t.is_param)
    # Every process also holds the one-hot labels of the losses (the logits' size) and, where an
    # embedding's vocabulary is split over several mesh axes, its one-hot input.
    one_hot = sum(math.prod(layer.inputs[0].shape) for layer in network.layers
                  if layer.op in ("SoftmaxCrossEntropy", "Embedding"))
    return (estimated_bytes(network, configs, procs, element_bytes) + procs * PROCESS_BYTES
            + procs * element_bytes * (weights + 2 * one_hot))


# ---------------------------------------------------------------------------------------
# The plan for torch: the JAX export, plus where the plan holds partial sums


def torch_plan(network, configs=None, procs=None) -> dict:
    """The plan's mesh and placements (``pase.outputs.jax.export.export_shardings``), with reductions.

    Every output and weight entry gets ``"partial"``: the mesh axes of the iteration-space
    dimensions the tensor lacks (a GEMM's reduction dimension for its output, the batch for a
    weight's gradient), over which the layer's computation leaves partial sums that the plan
    reduces. Changing it (dropping an axis) makes a plan that skips that reduction.

    >>> from pase import GraphBuilder, FC
    >>> g = GraphBuilder("t")
    >>> y = g.add("fc", FC(g.input((8, 6), "x"), 4))
    >>> fc = torch_plan(g.build(), [(2, 1, 2)], 4)["layers"][0]
    >>> fc["outputs"][0]["partial"], fc["weights"][0]["partial"]
    (['d1'], ['d0'])
    """
    network, configs, procs = unpack_plan(network, configs, procs)
    plan = export_shardings(network, configs, procs)
    for layer, entry in zip(network.layers, plan["layers"]):
        spanned = tensor_dims(layer)
        rank = len(layer.domain)

        def lacking(dims):
            have = {d for group in dims for d in group}
            return [a for d in range(rank) if d not in have for a in entry["axes"][d]]

        for out, dims in zip(entry["outputs"], spanned["outputs"]):
            out["partial"] = lacking(dims)
        if any(t.is_param for t in layer.inputs):
            weight_dims = [dims for t, dims in zip(layer.inputs, spanned["inputs"]) if t.is_param]
        else:
            weight_dims = spanned["weights"]
        for w, dims in zip(entry["weights"], weight_dims):
            w["partial"] = lacking(dims)
    return plan


# ---------------------------------------------------------------------------------------
# The result


@dataclass(frozen=True)
class TorchLayerTraffic:
    """Modelled and DTensor-issued communication of one layer, bytes per device per step."""

    id: int
    name: str
    op: str
    config: tuple
    modelled_layer: float
    modelled_edge: float
    dtensor_layer_forward: float
    dtensor_layer_backward: float
    dtensor_edge_forward: float
    dtensor_edge_backward: float
    collectives: dict

    @property
    def modelled(self) -> float:
        return self.modelled_layer + self.modelled_edge

    @property
    def dtensor_layer(self) -> float:
        return self.dtensor_layer_forward + self.dtensor_layer_backward

    @property
    def dtensor_edge(self) -> float:
        return self.dtensor_edge_forward + self.dtensor_edge_backward

    @property
    def dtensor(self) -> float:
        return self.dtensor_layer + self.dtensor_edge

    @property
    def ratio(self):
        return self.dtensor / self.modelled if self.modelled > 0 else None


_SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A", "broadcast": "BC"}


def _ratio(a, b):
    return a / b if b > 0 else None


@dataclass(frozen=True)
class TorchVerifyResult:
    """What ``verify_torch`` found: the numbers check, and DTensor's collectives layer by layer.

    The fields are ``pase.outputs.jax.verify.VerifyResult``'s, with DTensor's bytes for XLA's;
    ``peak_bytes`` is the largest resident memory of a process of the sharded run (before the
    unsharded one), ``notes`` what the run said about the plan.
    """

    graph: str
    procs: int
    ok: bool
    tolerance: float
    loss: float
    loss_reference: float
    loss_error: float
    gradients: list
    layers: list
    unattributed: float
    unattributed_kinds: dict
    seconds: dict
    torch_version: str
    seed: int
    peak_bytes: float = 0.0
    notes: tuple = ()
    dtype: str = "float32"

    @property
    def max_error(self) -> float:
        return max([self.loss_error] + [e for _, _, e in self.gradients])

    @property
    def modelled_total(self) -> float:
        return float(sum(l.modelled for l in self.layers))

    @property
    def dtensor_total(self) -> float:
        return float(sum(l.dtensor for l in self.layers) + self.unattributed)

    def by_op(self) -> dict:
        sums: dict = {}
        for l in self.layers:
            e = sums.setdefault(l.op, {"layers": 0, "modelled_layer": 0.0, "dtensor_layer": 0.0,
                                       "modelled_edge": 0.0, "dtensor_edge": 0.0})
            e["layers"] += 1
            e["modelled_layer"] += l.modelled_layer
            e["dtensor_layer"] += l.dtensor_layer
            e["modelled_edge"] += l.modelled_edge
            e["dtensor_edge"] += l.dtensor_edge
        return sums

    def to_dict(self) -> dict:
        """The JSON ``"verify"`` object (bytes per device per step), shaped as ``--verify jax``'s."""
        return {
            "backend": "torch",
            **numerics_dict(self),
            "modelled_bytes": self.modelled_total,
            "dtensor_bytes": self.dtensor_total,
            "ratio": _ratio(self.dtensor_total, self.modelled_total),
            "unattributed_dtensor_bytes": self.unattributed,
            "unattributed_collectives": dict(self.unattributed_kinds),
            "layers": [
                {"id": l.id, "name": l.name, "op": l.op, "config": list(l.config),
                 "modelled_layer_bytes": l.modelled_layer, "modelled_edge_bytes": l.modelled_edge,
                 "dtensor_layer_bytes": {"forward": l.dtensor_layer_forward, "backward": l.dtensor_layer_backward},
                 "dtensor_edge_bytes": {"forward": l.dtensor_edge_forward, "backward": l.dtensor_edge_backward},
                 "ratio": l.ratio, "collectives": dict(l.collectives)}
                for l in self.layers
            ],
            "by_op": {op: dict(e, layer_ratio=_ratio(e["dtensor_layer"], e["modelled_layer"]))
                      for op, e in self.by_op().items()},
            "seconds": dict(self.seconds),
            "peak_bytes": self.peak_bytes,
            "torch_version": self.torch_version,
            "notes": list(self.notes),
        }

    def table(self, all_layers: bool = False) -> str:
        lines = [
            f"PyTorch verification of {self.graph} on {self.procs} gloo CPU processes with DTensor "
            f"({self.dtype}, torch {self.torch_version}, seed {self.seed})",
            f"numbers: {'OK' if self.ok else 'FAILED'}: largest relative error {self.max_error:.2e} "
            f"(tolerance {self.tolerance:.0e}); loss {self.loss:.6g}, unsharded {self.loss_reference:.6g}",
        ]
        if not self.loss_error <= self.tolerance:
            lines.append(f"  loss: relative error {self.loss_error:.2e}")
        bad = [(n, e) for n, _, e in self.gradients if not e <= self.tolerance]
        lines += [f"  gradient of {n}: relative error {e:.2e}" for n, e in bad[:10]]
        if len(bad) > 10:
            lines.append(f"  ... and {len(bad) - 10} more gradients")
        lines.append("communication, bytes per device per step: the layer's own collectives, and redistribution "
                     "on the edges into it (CommDebugMode)")
        headers = ["id", "layer", "type", "model layer", "DTensor layer", "model edges", "DTensor edges",
                   "DTensor/model", "collectives"]
        rows = []
        for l in self.layers:
            if not all_layers and l.modelled == 0 and l.dtensor == 0:
                continue
            kinds = " ".join(f"{_SHORT.get(k, k)}x{n}" for k, n in sorted(l.collectives.items()))
            rows.append([str(l.id), l.name, l.op, format_bytes(l.modelled_layer), format_bytes(l.dtensor_layer),
                         format_bytes(l.modelled_edge), format_bytes(l.dtensor_edge),
                         "-" if l.ratio is None else f"{l.ratio:.2f}", kinds])
        if self.unattributed:
            kinds = " ".join(f"{_SHORT.get(k, k)}x{n}" for k, n in sorted(self.unattributed_kinds.items()))
            rows.append(["", "(the loss)", "", "", format_bytes(self.unattributed), "", "", "", kinds])
        total = _ratio(self.dtensor_total, self.modelled_total)
        rows.append(["", "total", "", format_bytes(sum(l.modelled_layer for l in self.layers)),
                     format_bytes(sum(l.dtensor_layer for l in self.layers) + self.unattributed),
                     format_bytes(sum(l.modelled_edge for l in self.layers)),
                     format_bytes(sum(l.dtensor_edge for l in self.layers)),
                     "-" if total is None else f"{total:.2f}", ""])
        widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers))]
        right = {0, 3, 4, 5, 6, 7}
        for row in [headers] + rows:
            cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
            lines.append("  ".join(cells).rstrip())
        lines += [f"note: {n}" for n in self.notes]
        lines.append(
            f"seconds: start {self.seconds.get('start', 0):.1f}, sharded run {self.seconds.get('run', 0):.1f}, "
            f"unsharded run {self.seconds.get('reference', 0):.1f}, total {self.seconds.get('total', 0):.1f}; "
            f"peak memory per process {format_bytes(self.peak_bytes)}"
        )
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The call


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(procs: int, rank: int, port: int) -> dict:
    env = dict(os.environ)
    # The folder holding the pase package (this file is pase/outputs/torch/verify.py).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = [root] + [p for p in sys.path if p and os.path.isdir(p) and p != root]
    env.update(PYTHONPATH=os.pathsep.join(path), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               RANK=str(rank), WORLD_SIZE=str(procs), OMP_NUM_THREADS="1")
    return env


@arguments(configs=optional(configurations), procs=optional(positive_int))
def verify_torch(
    network,
    configs: Sequence[Sequence[int]] | None = None,
    procs: int | None = None,
    machine=None,
    seed: int = 0,
    tolerance: float = 1e-4,
    timeout: float | None = None,
    memory_budget: float | None = None,
    dtype: str = "float32",
    plan: dict | None = None,
) -> TorchVerifyResult:
    """Run the plan on ``procs`` gloo CPU processes with DTensor and check it.

    The parameters are ``pase.outputs.jax.verify.verify``'s; ``plan`` replaces the plan derived from
    ``configs`` (``torch_plan``), to run a hand-changed one. Raises ``TorchMissing``,
    ``TorchVerifyTooLarge`` (before anything starts), ``ValueError`` (a bad strategy, or a
    split DTensor cannot express: one line naming the layer), ``RuntimeError`` (a process
    failed; its last lines in the message).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    network, configs, procs = unpack_plan(network, configs, procs)
    strategy = check_strategy(network, configs, procs)
    plan = torch_plan(network, strategy, procs) if plan is None else plan
    missing = sorted({layer.op for layer in network.layers} - _OPS_NAMES)
    if missing:
        raise ValueError(f"layer type {missing[0]} has no PyTorch implementation in --verify torch")
    _check_placements(plan)
    if importlib.util.find_spec("torch") is None:
        raise TorchMissing(INSTALL_HINT)
    _check_torch_version()
    budget = MEMORY_SHARE * available_memory() if memory_budget is None else float(memory_budget)
    needed = torch_estimated_bytes(network, strategy, procs, DTYPES[dtype])
    if needed > budget:
        raise TorchVerifyTooLarge(network.name, procs, needed, budget)
    layer_bytes, edge_bytes = modelled_bytes(network, strategy, procs, DTYPES[dtype])
    try:
        payload = pickle.dumps({"network": network, "plan": plan, "seed": int(seed), "dtype": dtype})
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise ValueError(f"the network cannot be sent to the PyTorch run (its layers must be picklable): {err}") from None
    started = time.perf_counter()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="pase-torch-") as tmp:
        source = os.path.join(tmp, "payload.pkl")
        with open(source, "wb") as f:
            f.write(payload)
        children, logs = [], []
        result_path = os.path.join(tmp, "result.json")
        for rank in range(int(procs)):
            log = open(os.path.join(tmp, f"rank{rank}.err"), "w+b")
            logs.append(log)
            children.append(subprocess.Popen(
                [sys.executable, "-m", "pase.outputs.torch.verify", source, result_path], stdout=subprocess.DEVNULL,
                stderr=log, env=_child_env(procs, rank, port)))
        try:
            # Wait for all; one that fails stops the others (they would wait for it in a collective).
            while any(child.poll() is None for child in children):
                if any(child.returncode not in (None, 0) for child in children):
                    break
                if timeout is not None and time.perf_counter() - started > timeout:
                    raise subprocess.TimeoutExpired("pase.outputs.torch.verify", timeout)
                time.sleep(0.05)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
            for child in children:
                child.wait()
        codes = [child.returncode for child in children]
        if any(codes):
            rank = next(r for r, c in enumerate(codes) if c and c > 0) if any(c > 0 for c in codes) else \
                next(r for r, c in enumerate(codes) if c)
            code = codes[rank]
            logs[rank].seek(0)
            tail = logs[rank].read().decode(errors="replace").strip().splitlines()
            if code == -9:
                raise RuntimeError(f"the PyTorch run was killed (out of memory?) (process {rank}); shrink the graph "
                                   "with -b or -m")
            if code < 0:
                raise RuntimeError(f"the PyTorch run was killed by signal {-code} (process {rank}):\n"
                                   + "\n".join(tail[-15:]))
            plain = [line for line in tail if line.startswith("pase-torch-error: ")]
            if plain:
                raise ValueError(plain[-1][len("pase-torch-error: "):])
            raise RuntimeError(f"the PyTorch run failed (process {rank}):\n" + "\n".join(tail[-15:]))
        for log in logs:
            log.close()
        with open(result_path) as f:
            out = json.load(f)
    out["seconds"]["total"] = time.perf_counter() - started
    return _result(network, strategy, procs, out, layer_bytes, edge_bytes, seed, tolerance, dtype)


#: The oldest torch whose public DTensor API (``torch.distributed.tensor``: ``Partial``,
#: ``CommDebugMode``) this module uses.
MIN_TORCH = (2, 5)


def _check_torch_version() -> None:
    import importlib.metadata
    import re

    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a source build without metadata: try it
        return
    found = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if found < MIN_TORCH:
        raise TorchMissing(f"--verify torch needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (DTensor's public API); "
                           f"torch {version} is installed: pip install -U '.[torch]'")


_OPS_NAMES = {"Conv", "Pooling", "FC", "Einsum", "Embedding", "Elementwise", "Concat", "Norm", "BatchNorm",
              "RMSNorm", "ReduceMean", "Softmax", "SoftmaxCrossEntropy", "Ravel", "Unravel", "Stack", "Unstack",
              "Roll"}


def _check_placements(plan: dict) -> None:
    """Raise ``ValueError`` naming the first layer with a split DTensor cannot express (no torch needed)."""
    index = {n: i for i, n in enumerate(plan["mesh"]["axis_names"])}
    for v, entry in enumerate(plan["layers"]):
        for kind in ("inputs", "outputs", "weights"):
            for t in entry[kind]:
                for dim, axes in enumerate(t["spec"]):
                    order = [index[a] for a in axes or ()]
                    if order != sorted(order):
                        raise ValueError(
                            f"layer {v} ({entry['name']}, {entry['op']}): {t['name']} splits its dimension {dim} over "
                            f"mesh axes {', '.join(axes)} in that order; DTensor splits a dimension over mesh axes "
                            "outermost-first in mesh order only"
                        )


def _result(network, strategy, procs, out, layer_bytes, edge_bytes, seed, tolerance, dtype) -> TorchVerifyResult:
    n = len(network.layers)
    readers: dict = {}
    sums = {k: [0.0] * n for k in ("layer_forward", "layer_backward", "edge_forward", "edge_backward")}
    kinds = [dict() for _ in range(n)]
    unattributed, loose = 0.0, {}
    for layer, backward, role, kind, nbytes in out["collectives"]:
        if layer is None or not 0 <= layer < n:
            unattributed += nbytes
            loose[kind] = loose.get(kind, 0) + 1
            continue
        sums[f"{role}_{'backward' if backward else 'forward'}"][layer] += nbytes
        kinds[layer][kind] = kinds[layer].get(kind, 0) + 1
    del readers
    layers = [
        TorchLayerTraffic(v, network.names[v], l.op, tuple(strategy[v]), float(layer_bytes[v]), float(edge_bytes[v]),
                          sums["layer_forward"][v], sums["layer_backward"][v], sums["edge_forward"][v],
                          sums["edge_backward"][v], kinds[v])
        for v, l in enumerate(network.layers)
    ]
    errors = [out["loss_error"]] + [e for _, _, e in out["gradients"]]
    return TorchVerifyResult(
        graph=network.name, procs=int(procs), ok=all(e <= tolerance for e in errors), tolerance=float(tolerance),
        loss=out["loss"], loss_reference=out["loss_reference"], loss_error=out["loss_error"],
        gradients=[(name, tuple(s), e) for name, s, e in out["gradients"]], layers=layers,
        unattributed=unattributed, unattributed_kinds=loose, seconds=dict(out["seconds"]),
        torch_version=out["torch_version"], seed=int(seed), peak_bytes=float(out["peak_bytes"]),
        notes=tuple(out.get("notes", ())), dtype=dtype,
    )


# ---------------------------------------------------------------------------------------
# to_dtensor: the library entry


def to_dtensor(module, args, plan=None, mesh=None, kwargs=None, seed: int = 0, dtype: str = "float32", weights=None,
               **import_args):
    """The imported ``module`` as a program on DTensors, every layer placed as ``plan`` says.

    Parameters
    ----------
    module, args, kwargs
        As ``pase.from_torch``: the model and example inputs. The graph is imported from them.
    plan : pase.Plan, optional
        A plan for that graph (``pase.plan(pase.from_torch(module, args), procs)``); by
        default the optimum on ``mesh.size()`` devices with the default machine.
    mesh : DeviceMesh, optional
        A mesh with one axis per prime factor of the plan's ``procs``, named ``d0, d1, ...``
        (``pase.outputs.jax.export.mesh_axes``); by default one is made over the default process group
        (``torch.distributed`` must be initialised).

    Returns
    -------
    pase.torch_program.Program
        ``program(program.make_parameters(), program.make_data())`` is the loss; ``program.places``
        the placements of every layer's inputs, outputs and weights. The weights are seeded
        random (the import records no map from graph weights to module parameters);
        ``weights={name: array}`` gives some by their graph names (``program.weight_names``).

    Raises ``ValueError`` naming the layer, for a split DTensor cannot express.
    """
    from pase.sources.torch.importer import from_torch
    from pase.outputs.torch import program as torch_program
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    network = from_torch(module, args, kwargs=kwargs, **import_args)
    if plan is None:
        from pase.planning.planner import plan as make_plan

        procs = mesh.size() if mesh is not None else dist.get_world_size()
        plan = make_plan(network, procs)
    if len(plan.network.layers) != len(network.layers) or list(plan.network.names) != list(network.names):
        raise ValueError("the plan is not for this module's graph (its layers differ); plan pase.from_torch(module, args)")
    exported = torch_plan(plan.network, plan.configs, plan.procs)
    _check_placements(exported)
    names, sizes = exported["mesh"]["axis_names"] or ["d0"], exported["mesh"]["axis_sizes"] or [1]
    if mesh is None:
        mesh = init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(names))
    elif list(mesh.shape) != list(sizes):
        raise ValueError(f"the mesh has shape {list(mesh.shape)}; the plan needs {sizes} (one axis per prime factor "
                         f"of {plan.procs})")
    return torch_program.Program(plan.network, exported, mesh, seed, dtype, weights=weights)


# ---------------------------------------------------------------------------------------
# The child: one process of the group (rank from the environment)


def _collective_kinds(torch):
    ops = torch.ops._c10d_functional
    kinds = {
        ops.all_reduce: "all-reduce", ops.all_reduce_coalesced: "all-reduce",
        ops.all_gather_into_tensor: "all-gather", ops.all_gather_into_tensor_coalesced: "all-gather",
        ops.reduce_scatter_tensor: "reduce-scatter", ops.reduce_scatter_tensor_coalesced: "reduce-scatter",
        ops.all_to_all_single: "all-to-all", ops.broadcast: "broadcast",
    }
    legacy = torch.ops.c10d_functional
    for name, kind in (("all_reduce", "all-reduce"), ("all_gather_into_tensor", "all-gather"),
                       ("reduce_scatter_tensor", "reduce-scatter"), ("all_to_all_single", "all-to-all"),
                       ("broadcast", "broadcast")):
        if hasattr(legacy, name):
            kinds[getattr(legacy, name)] = kind
    try:
        kinds[torch.ops._c10d_functional_autograd.all_to_all_single] = "all-to-all"
    except AttributeError:
        pass
    return kinds


def _make_counter(torch, procs: int):
    """A ``CommDebugMode`` that also records every collective's bytes per device and its layer."""
    import re

    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor.debug import CommDebugMode

    kinds = _collective_kinds(torch)
    where_re = re.compile(r"\.L(\d+)\.(in\d+|w\d+|op)\b")

    def group_size(args, kind):
        for a in reversed(args):
            if isinstance(a, str):
                try:
                    return _resolve_process_group(a).size()
                except Exception:  # noqa: BLE001 (an unknown name: the whole group)
                    return procs
        return procs

    def nbytes(x):
        if isinstance(x, (list, tuple)):
            return sum(nbytes(t) for t in x)
        return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0

    class Counter(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.records = []
            self.forced = None  # (layer, backward, role) for work done outside a layer's module

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented:
                return out
            kind = kinds.get(getattr(func, "_overloadpacket", None))
            if kind is None:
                return out
            q = group_size(args, kind)
            n = nbytes(args[0])
            if kind == "all-reduce":
                moved = 2.0 * (q - 1) / q * n
            elif kind == "all-gather":
                moved = float((q - 1) * n)
            elif kind == "broadcast":
                moved = float(n)
            else:
                moved = (q - 1) / q * float(n)
            if self.forced is not None:
                layer, backward, role = self.forced
            else:
                found = where_re.search(self.advanced_module_tracker.name or "")
                layer = int(found.group(1)) if found else None
                role = "edge" if found and found.group(2).startswith("in") else "layer"
                backward = bool(self.advanced_module_tracker.is_bw)
            self.records.append((layer, backward, role, kind, moved))
            return out

    return Counter


def _child_main(path: str, result: str) -> int:
    import resource

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from pase.outputs.torch.program import PlacementError, Program

    with open(path, "rb") as f:
        payload = pickle.load(f)
    network, plan, seed, dtype = payload["network"], payload["plan"], payload["seed"], payload["dtype"]
    torch.set_num_threads(1)
    started = time.perf_counter()
    dist.init_process_group("gloo")
    rank, procs = dist.get_rank(), dist.get_world_size()
    names, sizes = plan["mesh"]["axis_names"] or ["d0"], plan["mesh"]["axis_sizes"] or [1]
    mesh = init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(names))
    try:
        program = Program(network, plan, mesh, seed, dtype)
    except PlacementError as err:
        print(f"pase-torch-error: {err}", file=sys.stderr)
        return 1
    params = program.make_parameters()
    data = program.make_data()
    seconds = {"start": time.perf_counter() - started}
    Counter = _make_counter(torch, procs)
    counter = Counter()
    started = time.perf_counter()
    import contextlib

    @contextlib.contextmanager
    def attribute(v):
        saved, counter.forced = counter.forced, (v, True, "layer")
        try:
            yield
        finally:
            counter.forced = saved

    program.attribute = attribute
    with counter:
        loss = program(params, data)
        loss.backward()
    grads = {key: params[key].grad for key in program.weight_names}
    seconds["run"] = time.perf_counter() - started
    loss_value = float(loss.full_tensor().detach())
    full = {k: g.full_tensor().detach().to(torch.float64).numpy() for k, g in grads.items()}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    peaks = [None] * procs
    dist.all_gather_object(peaks, peak)
    notes = list(dict.fromkeys(program.notes))
    if rank != 0:
        dist.barrier()  # while process 0 runs the unsharded pass: every process leaves together
        dist.destroy_process_group()
        return 0
    started = time.perf_counter()
    reference = Program(network, plan, None, seed, dtype)
    ref_params = reference.make_parameters()
    ref_loss = reference(ref_params, reference.make_data())
    ref_loss.backward()
    seconds["reference"] = time.perf_counter() - started
    ref_grads = {k: p.grad.detach().to(torch.float64).numpy() for k, p in ref_params.items()}
    import numpy as np

    largest = max((float(np.max(np.abs(g))) for g in ref_grads.values() if g.size), default=0.0)
    gradients = [(k, list(ref_grads[k].shape), _relative_error(full[k], ref_grads[k], GRADIENT_FLOOR * largest))
                 for k in program.weight_names]
    out = {
        "loss": loss_value, "loss_reference": float(ref_loss), "loss_error": _relative_error(loss_value, float(ref_loss)),
        "gradients": gradients, "seconds": seconds, "torch_version": torch.__version__,
        "peak_bytes": max(peaks), "notes": notes, "collectives": counter.records,
    }
    with open(result, "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _leave(code: int) -> None:
    """Leave without the interpreter's teardown.

    Everything this process owes is written (the result file is closed, the process group
    destroyed); what remains is C++ teardown of gloo's threads, which now and then aborts with
    "terminate called without an active exception" (signal 6) after the run succeeded.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(_child_main(sys.argv[1], sys.argv[2]))
