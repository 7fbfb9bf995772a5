"""Modelled vs XLA-inserted communication, per layer type, for the optimum and data parallelism.

Runs ``pase.outputs.jax.verify.verify`` on scaled-down graphs on 8 XLA host devices (needs
``pip install '.[jax]'``), for the optimal strategy of the reference model and for data
parallelism. Every run must reproduce the unsharded loss and gradients (relative error
<= 1e-4); the communication is what XLA's SPMD partitioner inserted into the compiled program,
in bytes per device per training step, next to the cost model's volumes in the same unit.

Writes ``results/jax_comm.md`` (runs, then a table per layer type, then why they differ) and
``results/jax_comm.csv`` (one row per graph, strategy and layer type). About 10 minutes on
2 cores: ``python benchmarks/jax_comm.py``; ``--graphs alexnet,rnnlm`` for a subset.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from common import RESULTS, machine_info, machine_lines, markdown_table, parse_list, write_csv, write_text

import graphs  # noqa: E402  (common puts the repository root on sys.path)
import pase  # noqa: E402
from pase.outputs.jax.verify import VerifyTooLarge, verify  # noqa: E402

#: (graph, batch, model width): the scaled-down cases of the issue, then the two CNNs that
#: bring BatchNorm, Concat, ReduceMean and Elementwise with pw.
CASES = {
    "alexnet": (8, None),
    "transformer": (16, 64),
    "rnnlm": (16, 128),
    "gpt2-small": (2, None),
    "inception3": (4, None),
    "resnet101": (8, None),
}
STRATEGIES = ("optimum", "data parallel")

#: Why XLA's bytes differ from the model's, per layer type, from reading the compiled HLO of
#: these runs (the collectives' op names say which layer and which tensor they serve).
WHY = {
    "Conv": "Data parallelism matches to the byte (one all-reduce of each weight gradient). With the input "
            "channels split (alexnet's optimum), XLA all-gathers the output gradient over the channel group "
            "once more inside the backward convolution: traffic the model (which reduces over n only) lacks.",
    "Pooling": "The model charges a halo only when the image is split; no plan here splits it: 0 on both sides.",
    "FC": "The GEMM's three all-reduces match XLA's; the small excess is alexnet's fc6 -> fc7 -> fc8, whose "
          "equal split counts sit on different mesh axes, so XLA also permutes the saved activations "
          "between layouts.",
    "Einsum": "Matches to the byte: XLA reduces exactly the partial sums the model's GEMM terms name.",
    "Embedding": "Matches: forward, the gather from a vocabulary-split table is all-reduced over the split "
                 "like the model's Einsum; under data parallelism the table's gradient is all-reduced once.",
    "Elementwise": "No layer traffic on either side.",
    "Norm": "The model charges 4 all-reduces of the scale/bias-sized vector over the other splits; XLA needs "
            "2 (one for the scale's gradient, one for the bias's): half.",
    "BatchNorm": "The model prices BatchNorm as a Norm over axis 0, whose statistics are c*h*w values per "
                 "split; the run is a real batch norm, whose statistics and scale/bias gradients are "
                 "c values: XLA moves 0.4 % of the model's bytes.",
    "ReduceMean": "No reduced axis is split in these plans: 0 on both sides.",
    "Softmax": "The softmax axis is never split in these plans: 0 on both sides.",
    "SoftmaxCrossEntropy": "The model charges 2 values per row once; XLA all-reduces the row maximum, the sum "
                           "of exponentials and the target logit forward and one sum backward: 3.5x, on a "
                           "few KB.",
    "LSTM": "Optimum (L split): the model charges nothing (L is a batch dimension of its GEMM), the wavefront "
            "moves each step's hand-over between the layers' devices and broadcasts the top layer's outputs. "
            "Data parallelism: XLA all-reduces the weight gradient inside the backward loop, at every one of "
            "the 257 steps, where the model (and a hand-written loop) reduces it once: 257x.",
    "Concat": "Data movement: no layer traffic; its edges carry the redistribution.",
    "Ravel": "Data movement: no layer traffic; its edges carry the redistribution.",
    "Unravel": "Data movement: no layer traffic; its edges carry the redistribution.",
    "Stack": "Data movement: no layer traffic; its edges carry the redistribution.",
    "Unstack": "Data movement: no layer traffic; its edges carry the redistribution.",
    "(edges)": "The model charges the whole target block whenever the target uses more devices than the "
               "source (its overlap rule), even when the source is replicated and the block is a local "
               "slice: XLA moves nothing there forward and all-gathers the gradient backward (alexnet's "
               "convolutions: 1.5x). Elsewhere XLA moves less than charged (0.77x over all optimum plans). "
               "The model also ignores which devices hold a block: equal split counts on different mesh "
               "axes cost XLA a permute the model calls free.",
}

#: Why the CNNs' numbers can miss 1e-4 in float32 (shown when a run fails).
NUMBERS = (
    "ResNet-101 and InceptionV3, as specified, have no point-wise operation between a convolution and "
    "its batch norm, so they are linear from one batch norm to the next. Backward, each batch norm "
    "removes from its gradient the components the next one removes again; that cancellation amplifies "
    "summation-order differences (a sharded sum adds its partial sums in another order) over about a "
    "hundred layers, worst in the biases of batch norms whose shift the next batch norm removes "
    "(mathematically zero gradients, compared at a thousandth of the model's largest gradient, "
    "`pase.outputs.jax.verify.GRADIENT_FLOOR`). The float64 runs of the same plans agree with their unsharded "
    "run to the figures above: the plans are right, float32 is too coarse for these two graphs. The "
    "communication figures are unaffected."
)


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f}"


def _ratio(x: float, m: float) -> str:
    return "-" if m == 0 else f"{x / m:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    parser.add_argument("--procs", type=int, default=8, help="XLA host devices (default 8)")
    parser.add_argument("--out", default=RESULTS, help="directory for jax_comm.md and jax_comm.csv")
    args = parser.parse_args(argv)
    names = parse_list(args.graphs)
    for name in names:
        if name not in CASES:
            parser.error(f"unknown graph {name!r}; choose from {', '.join(CASES)}")

    runs, refused = [], []
    for name in names:
        batch, model = CASES[name]
        net = graphs.build(name, batch, model)
        found = pase.plan(net, args.procs)
        for strategy, configs in (("optimum", found.configs), ("data parallel", pase.data_parallel(net, args.procs))):
            started = time.perf_counter()
            try:
                result = verify(net, configs, args.procs)
            except VerifyTooLarge as err:
                refused.append((name, batch, model, strategy, err.needed))
                print(f"{name:12} {strategy:14} refused: {err}", file=sys.stderr)
                continue
            seconds = time.perf_counter() - started
            runs.append((name, batch, model, strategy, result, seconds))
            print(f"{name:12} {strategy:14} numbers {'OK' if result.ok else 'FAILED'} "
                  f"(max rel. error {result.max_error:.1e}); modelled {_mb(result.modelled_total)} MB, "
                  f"XLA {_mb(result.xla_total)} MB; {seconds:.0f} s", file=sys.stderr)

    csv_rows = []
    per_op: dict = {}
    for name, _, _, strategy, result, _ in runs:
        ops = result.by_op()
        ops["(edges)"] = {
            "layers": len(result.layers), "modelled_layer": 0.0, "xla_layer": 0.0,
            "modelled_edge": sum(e["modelled_edge"] for e in ops.values()),
            "xla_edge": sum(e["xla_edge"] for e in ops.values()),
        }
        for op, e in ops.items():
            is_edge = op == "(edges)"
            modelled = e["modelled_edge"] if is_edge else e["modelled_layer"]
            xla = e["xla_edge"] if is_edge else e["xla_layer"]
            csv_rows.append([name, strategy, op, e["layers"], modelled, xla, "" if modelled == 0 else xla / modelled])
            acc = per_op.setdefault(op, {s: [0.0, 0.0, set()] for s in STRATEGIES})[strategy]
            acc[0] += modelled
            acc[1] += xla
            acc[2].add(name)
    write_csv(os.path.join(args.out, "jax_comm.csv"),
              ["graph", "strategy", "layer_type", "layers", "modelled_bytes", "xla_bytes", "ratio"], csv_rows)

    lines = [
        "# Modelled vs XLA-inserted communication",
        "",
        "Each plan runs on 8 XLA host devices (`pase.outputs.jax.verify.verify`): a jitted forward and backward "
        "pass in float32 under the plan's shardings, checked against the unsharded run, and the collectives "
        "of the compiled program (all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute) "
        "attributed to layers by their named scopes. Bytes are per device per training step: a ring "
        "all-reduce of n bytes over q devices counts 2(q-1)/q n, an all-gather (q-1)/q of its output, a "
        "reduce-scatter and an all-to-all (q-1)/q of their input, a collective-permute its input. The model's "
        "figures are its communication volumes in elements (reference cost model) times 4 bytes. "
        "*Layer*: a layer's own collectives; *(edges)*: redistribution of tensors between layers. "
        "Regenerate with `python benchmarks/jax_comm.py`.",
        "",
        *machine_lines(machine_info()),
        f"- jax {runs[0][4].jax_version}" if runs else "",
        "",
        "## Runs",
        "",
    ]
    rows = []
    for name, batch, model, strategy, result, seconds in runs:
        setting = f"-b {batch}" + (f" -m {model}" if model else "")
        rows.append([name, setting, strategy, "OK" if result.ok else "FAILED", f"{result.max_error:.1e}",
                     _mb(result.modelled_total), _mb(result.xla_total),
                     _ratio(result.xla_total, result.modelled_total), f"{seconds:.0f}"])
    for name, batch, model, strategy, needed in refused:
        setting = f"-b {batch}" + (f" -m {model}" if model else "")
        rows.append([name, setting, strategy, f"refused: needs ~{needed / 1e9:.0f} GB", "", "", "", "", ""])
    lines += markdown_table(["graph", "setting", "strategy", "numbers", "max rel. error", "modelled MB",
                             "XLA MB", "XLA/model", "seconds"], rows, "lllllrrrr")
    if refused:
        lines += ["", "Refused runs would not fit 90 % of this machine's available memory "
                  "(`pase.outputs.jax.verify.estimated_bytes`: every device's activations, replicas included)."]
    lines += ["", "## Per layer type (all graphs above together)", ""]
    rows = []
    for op in sorted(per_op, key=lambda o: (o == "(edges)", o)):
        cells = [op, ", ".join(sorted(set().union(*(per_op[op][s][2] for s in STRATEGIES))))]
        for s in STRATEGIES:
            m, x, _ = per_op[op][s]
            cells += [_mb(m), _mb(x), _ratio(x, m)]
        rows.append(cells)
    lines += markdown_table(["layer type", "graphs", "optimum: model MB", "XLA MB", "XLA/model",
                             "data parallel: model MB", "XLA MB", "XLA/model"], rows, "llrrrrrr")
    lines += ["", "## Where they differ, and why", ""]
    lines += [f"- **{op}**: {WHY[op]}" for op in sorted(per_op, key=lambda o: (o == "(edges)", o)) if op in WHY]
    if failed := [r for r in runs if not r[4].ok]:
        lines += ["", "## Numbers", ""]
        for name, batch, model, strategy, result, _ in failed:
            # The same plan in float64: does the plan or float32 rounding make the difference?
            net = graphs.build(name, batch, model)
            configs = pase.plan(net, args.procs).configs if strategy == "optimum" else pase.data_parallel(
                net, args.procs)
            try:
                wide = verify(net, configs, args.procs, dtype="float64")
                again = (f"in float64 the same plan is {'within' if wide.ok else 'OVER'} the tolerance "
                         f"(largest relative error {wide.max_error:.1e})")
            except VerifyTooLarge as err:
                again = f"float64 refused (needs ~{err.needed / 1e9:.0f} GB)"
            lines.append(f"- {name}, {strategy}: worst gradient {max(result.gradients, key=lambda g: g[2])[0]}, "
                         f"relative error {result.max_error:.1e} in float32; {again}")
        lines += ["", NUMBERS]
    notes = [(name, strategy, n) for name, _, _, strategy, result, _ in runs for n in result.notes]
    if notes:
        lines += ["", "## What XLA reported", ""]
        lines += [f"- {name}, {strategy}: {n}" for name, strategy, n in notes]
    write_text(os.path.join(args.out, "jax_comm.md"), lines)
    print(f"wrote {os.path.join(args.out, 'jax_comm.md')}; {len(runs) - len(failed)} of {len(runs)} runs "
          "reproduce the unsharded numbers in float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
