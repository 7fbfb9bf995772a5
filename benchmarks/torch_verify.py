"""`--verify torch` on imported PyTorch models: numbers, times, memory, DTensor's collectives vs the model's.

Runs ``pase.torch_verify.verify_torch`` (the plan on ``p`` gloo CPU processes with DTensor,
checked against the unsharded computation, collectives counted with ``CommDebugMode``) on
three imported models from ``examples/`` (``hf_llama.py:tiny_llama``, ``hf_gpt2.py:gpt2_tiny``,
``torchvision_cnns.py:resnet18_small``) at ``p`` = 4 and 8, for the optimum and for data
parallelism. The optimum is planned for a machine with fast links (``--bw 16000``): on the
default machine these small models are best replicated, which moves nothing.

Writes ``results/torch_verify.md`` and ``results/torch_verify.json`` (the raw results; with
``--from-json`` the report is rewritten from it without running). About 15 minutes on 2 cores:
``python benchmarks/torch_verify.py``; ``--models tiny_llama --procs 4`` for a subset. Needs
``pip install '.[torch]' torchvision transformers``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common import RESULTS, ROOT, machine_info, machine_lines, markdown_table, parse_list, write_text

import pase  # noqa: E402  (common puts the repository root on sys.path)
from pase.sources.torch.factory import load_factory  # noqa: E402
from pase.outputs.torch.verify import TorchVerifyTooLarge, verify_torch  # noqa: E402

#: name -> (factory, batch)
CASES = {
    "tiny_llama": ("examples/hf_llama.py:tiny_llama", 8),
    "gpt2_tiny": ("examples/hf_gpt2.py:gpt2_tiny", 8),
    "resnet18_small": ("examples/torchvision_cnns.py:resnet18_small", 8),
}
STRATEGIES = ("optimum", "data parallel")
#: The optimum's machine: the default compute, links fast enough that splitting layers pays.
MACHINE = pase.Machine(10.0, 16000.0)

#: Why DTensor's bytes differ from the model's, per layer type (from the per-layer records of these runs:
#: which collectives, forward or backward, on which mesh axes).
WHY = {
    "(mesh)": "The mesh has one axis of 2 per prime factor of p, and DTensor reduces a tensor that is partial "
              "over several mesh axes one axis at a time: an all-reduce over each 2-way axis, each moving the "
              "whole tensor (n bytes per axis, log2(p) n in all), where the model charges one flat ring over the "
              "q devices, 2(q-1)/q n. That is 4/3 at p = 4 and 12/7 at p = 8 for every reduction over all of "
              "p: data parallelism's weight-gradient all-reduces are 1.33x and 1.71x the model's in every GEMM "
              "layer (1.54x over the runs together).",
    "Conv": "Data parallelism: the weight gradients' all-reduces, 1.33x / 1.71x as above. Optimum: the model "
            "charges the all-reduce of the input gradient over the output-channel split, also for the first "
            "convolution, whose input is the image: no gradient is needed there and none is computed, so "
            "DTensor moves less (0.87x).",
    "FC": "The three GEMM reductions the model names (output over k, input gradient over n, weight gradient "
          "over the batch) are the collectives DTensor issues, at the per-axis rate above (a split over one "
          "mesh axis matches to the byte: the two-process MLP test checks it). One moves: DTensor keeps an input "
          "gradient partial until something needs it whole, so the input-gradient all-reduce of a GEMM is issued "
          "in the backward of the layer that produced its input (a norm's row), and once for all its readers: "
          "Llama's gate and up projections read one tensor, their two partial gradients are added and "
          "all-reduced once, where the model charges each reader (gate_proj and up_proj at 0.5x, the norm "
          "before them far over its own charge).",
    "Einsum": "As FC: the reductions the model's GEMM terms name, at the per-axis rate, input-gradient "
              "reductions deferred to the producer.",
    "Embedding": "Forward, a vocabulary split leaves the looked-up rows partial and they are all-reduced as the "
                 "model's Einsum charges. Backward, DTensor's embedding computes the gradient of the whole table "
                 "on every device and all-reduces all of it over the batch split before keeping its own rows, "
                 "where the model reduces only the device's rows (tiny_llama, p = 4: 64 KB for the model's 32 "
                 "KB); data parallelism is the per-axis factor alone.",
    "Norm": "Data parallelism: the model charges 4 all-reduces of the scale/bias-sized vector, DTensor issues 2 "
            "(the scale's and the bias's gradients): half, times the per-axis factor (0.77x). Optimum (the "
            "normalised axis split): DTensor's mean over a split dimension leaves a partial statistic that its "
            "broadcast against the split input turns into all-gathers and reduce-scatters of the activation, "
            "forward and backward, where the model all-reduces two values per row (5.7x).",
    "RMSNorm": "As Norm, with one parameter: data parallelism 1 all-reduce where the model charges 4 (0.38x "
               "with the per-axis factor). In the optimum its row also carries the deferred input-gradient "
               "all-reduces of the projections that read it (see FC), and a split normalised axis costs "
               "activation-sized all-gathers (7.7x).",
    "BatchNorm": "The model prices BatchNorm as a Norm over axis 0 (statistics of size c*h*w per split). DTensor "
                 "moves more still: backward, the gradient of the batch mean and variance stays partial over the "
                 "batch split, is broadcast to the activation's shape, and that activation-sized tensor is "
                 "reduce-scattered back to the batch split; a hand-written batch norm all-reduces 2c values. "
                 "(XLA moves 0.4 % of the model's bytes here, `jax_comm.md`.)",
    "SoftmaxCrossEntropy": "With the classes split, DTensor's log_softmax over the split dimension all-gathers "
                           "the logits (activation-sized) where the model charges the reduction of 2 values "
                           "per row (and XLA moves 3.5x the model's few KB).",
    "Elementwise": "No layer traffic on either side; what its inputs need is on its edges.",
    "Softmax": "The softmax axis is never split in these plans: 0 on both sides.",
    "Pooling": "No plan here splits the image: 0 on both sides (a split image would be gathered first: no halo "
               "exchange).",
    "(edges)": "Forward, DTensor redistributes as the model's overlap rule says, except that a Replicate-to-Shard "
               "change is a free local slice; backward, the gradient goes back to the producer's placement: an "
               "all-gather where the model charges the same volume once each way. The larger share (2.2x over "
               "the optimum plans) is the norms' inputs: DTensor's norm ops on a split normalised axis all-gather "
               "the residual stream forward and backward, traffic that lands on the edges into the norms and the "
               "residual adds.",
}


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f}"


def _ratio(x: float, m: float) -> str:
    return "-" if m == 0 else f"{x / m:.2f}"


def run(names, procs_list) -> dict:
    runs, refused = [], []
    for name in names:
        spec, batch = CASES[name]
        path, function = spec.rsplit(":", 1)
        module, args, kwargs = load_factory(f"{os.path.join(ROOT, path)}:{function}", batch)
        net = pase.from_torch(module, args, kwargs=kwargs, name=name)
        for procs in procs_list:
            found = pase.plan(net, procs, MACHINE)
            for strategy, configs in (("optimum", found.configs), ("data parallel", pase.data_parallel(net, procs))):
                started = time.perf_counter()
                try:
                    result = verify_torch(net, configs, procs)
                except TorchVerifyTooLarge as err:
                    refused.append({"model": name, "batch": batch, "procs": procs, "strategy": strategy,
                                    "needed": err.needed})
                    print(f"{name:15} p={procs} {strategy:14} refused: {err}", file=sys.stderr)
                    continue
                seconds = time.perf_counter() - started
                data = result.to_dict()
                del data["gradients"]  # the worst one is kept: the report needs no more
                data.update(model=name, batch=batch, strategy=strategy, wall=seconds, layers_count=len(net.layers))
                runs.append(data)
                print(f"{name:15} p={procs} {strategy:14} numbers {'OK' if result.ok else 'FAILED'} "
                      f"(max rel. error {result.max_error:.1e}); modelled {_mb(result.modelled_total)} MB, "
                      f"DTensor {_mb(result.dtensor_total)} MB; {seconds:.0f} s, peak "
                      f"{result.peak_bytes / 1e9:.2f} GB", file=sys.stderr)
    return {"machine": machine_info(), "runs": runs, "refused": refused}


def report(raw: dict, out: str) -> None:
    runs, refused = raw["runs"], raw["refused"]
    lines = [
        "# `--verify torch`: imported models on gloo CPU processes with DTensor",
        "",
        "Each plan runs on p CPU processes (`pase.torch_verify.verify_torch`, gloo on localhost): every layer "
        "on DTensors placed as the plan says (a mesh with one axis per prime factor of p, as `--export-jax` "
        "lays it out), a forward and backward pass in float32 with random inputs and weights, the loss and "
        "every weight gradient checked against the same computation unsharded in one process (relative error "
        "1e-4). Collectives are counted with `torch.distributed.tensor.debug.CommDebugMode` (its module "
        "tracker says which layer, forward or backward) and their bytes read off each collective: per device "
        "per step, a ring all-reduce of n bytes over q devices 2(q-1)/q n, an all-gather (q-1)/q of its "
        "output, a reduce-scatter (q-1)/q of its input. The model's figures are its communication volumes in "
        "elements times 4 bytes (`pase.jax_verify.modelled_bytes`). *Layer*: a layer's own collectives, "
        "including the reduction of its weight gradients; *(edges)*: redistribution of the tensors a layer "
        "reads. The optimum is planned with `--bw 16000` (fast links); data parallelism splits every batch "
        "dimension. Regenerate with `python benchmarks/torch_verify.py`.",
        "",
        *machine_lines(raw["machine"]),
        f"- torch {runs[0]['torch_version']}" if runs else "",
        "",
        "## Runs",
        "",
        "Seconds: *wall* is the whole call (p processes started, torch imported, the mesh built, both runs); "
        "*sharded* the forward and backward pass on DTensors. Peak: the largest resident memory of one "
        "process of the sharded run (a torch process holds about 0.75 GB before any tensor).",
        "",
    ]
    rows = []
    for r in runs:
        rows.append([r["model"], str(r["procs"]), r["strategy"], "OK" if r["ok"] else "FAILED", f"{r['max_error']:.1e}",
                     _mb(r["modelled_bytes"]), _mb(r["dtensor_bytes"]), _ratio(r["dtensor_bytes"], r["modelled_bytes"]),
                     f"{r['wall']:.0f}", f"{r['seconds'].get('run', 0):.1f}", f"{r['peak_bytes'] / 1e9:.2f}"])
    for r in refused:
        rows.append([r["model"], str(r["procs"]), r["strategy"], f"refused: needs ~{r['needed'] / 1e9:.0f} GB",
                     "", "", "", "", "", "", ""])
    lines += markdown_table(["model", "p", "strategy", "numbers", "max rel. error", "modelled MB", "DTensor MB",
                             "DTensor/model", "wall s", "sharded s", "peak GB"], rows, "lrlllrrrrrr")
    per_op: dict = {}
    for r in runs:
        ops = {op: dict(e) for op, e in r["by_op"].items()}
        ops["(edges)"] = {"modelled_layer": sum(e["modelled_edge"] for e in ops.values()),
                          "dtensor_layer": sum(e["dtensor_edge"] for e in ops.values())}
        ops["(the loss)"] = {"modelled_layer": 0.0, "dtensor_layer": r["unattributed_dtensor_bytes"]}
        for op, e in ops.items():
            acc = per_op.setdefault(op, {s: [0.0, 0.0, set()] for s in STRATEGIES})[r["strategy"]]
            acc[0] += e["modelled_layer"]
            acc[1] += e["dtensor_layer"]
            acc[2].add(r["model"])
    lines += ["", "## Per layer type (all runs above together)", ""]
    rows = []
    order = sorted(per_op, key=lambda o: (o.startswith("("), o))
    for op in order:
        cells = [op, ", ".join(sorted(set().union(*(per_op[op][s][2] for s in STRATEGIES))))]
        for s in STRATEGIES:
            m, x, _ = per_op[op][s]
            cells += [_mb(m), _mb(x), _ratio(x, m)]
        rows.append(cells)
    lines += markdown_table(["layer type", "models", "optimum: model MB", "DTensor MB", "DTensor/model",
                             "data parallel: model MB", "DTensor MB", "DTensor/model"], rows, "llrrrrrr")
    if WHY:
        lines += ["", "## Where they differ, and why", ""]
        lines += [f"- **The mesh**: {WHY['(mesh)']}"]
        lines += [f"- **{op}**: {WHY[op]}" for op in order if op in WHY and op != "(mesh)"]
    notes = sorted({(r["model"], n) for r in runs for n in r["notes"]})
    if notes:
        lines += ["", "## What the runs noted", ""]
        lines += [f"- {model}: {n}" for model, n in notes]
    if failed := [r for r in runs if not r["ok"]]:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {r['model']} p={r['procs']} {r['strategy']}: worst {r['worst_gradient']}" for r in failed]
    write_text(os.path.join(out, "torch_verify.md"), lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    parser.add_argument("--procs", default="4,8", help="process counts (default 4,8)")
    parser.add_argument("--out", default=RESULTS, help="directory for torch_verify.md and torch_verify.json")
    parser.add_argument("--from-json", action="store_true", help="rewrite the report from torch_verify.json")
    args = parser.parse_args(argv)
    path = os.path.join(args.out, "torch_verify.json")
    if args.from_json:
        with open(path) as f:
            raw = json.load(f)
    else:
        names = parse_list(args.models)
        for name in names:
            if name not in CASES:
                parser.error(f"unknown model {name!r}; choose from {', '.join(CASES)}")
        raw = run(names, parse_list(args.procs, int))
        with open(path, "w") as f:
            json.dump(raw, f, separators=(",", ":"))
    report(raw, args.out)
    print(f"wrote {os.path.join(args.out, 'torch_verify.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
