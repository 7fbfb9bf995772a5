"""Strategy quality, a modelled Fig. 6: speedup over data parallelism per graph and p.

For every graph and device count: the cost (FLOP-equivalents, ``docs/cost-model.md``) of data
parallelism, of PaSE's optimum (``pase.plan``) and of every expert strategy that applies
(``pase.planning.experts``: OWT for the CNNs, GNMT-style for RNNLM, Mesh-TensorFlow for the
Transformer), and each one's modelled speedup ``data-parallel cost / strategy cost``. The
paper's Fig. 6 measures throughput on GPUs; this is the same comparison under the cost model.

The script checks, and fails loudly otherwise, that PaSE's speedup is >= 1 everywhere and
that no expert strategy costs less than the optimum of the same model.

Writes ``results/fig6.md``, ``fig6.csv`` and ``fig6.png`` (batch 128); with ``--batch N``
the files are ``fig6-bN.*``; with ``--paper-batch`` (the paper's batches: 128 for the CNNs,
64 for RNNLM and the Transformer) ``fig6-paper-batch.*``.

    python benchmarks/fig6.py [--batch 128 | --paper-batch] [--graphs ...] [--procs ...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from common import (
    GRAPH_ORDER, PROCS, RESULTS, TITLES, machine_info, machine_lines, markdown_table, parse_list, pyplot,
    write_csv, write_text,
)

import numpy as np  # noqa: E402

import graphs  # noqa: E402  (common puts the repository root on the path)
from pase import Machine, data_parallel, evaluate, plan  # noqa: E402
from pase.planning.experts import best_mesh, expert_strategies, mesh_tensorflow, mesh_tensorflow_meshes  # noqa: E402

#: Batch sizes of the paper's evaluation (Section IV).
PAPER_BATCH = {"alexnet": 128, "inception3": 128, "resnet101": 128, "rnnlm": 64, "transformer": 64}

EXPERT_TITLES = {"owt": "OWT", "gnmt": "GNMT-style", "mesh-tf": "Mesh-TF"}

#: Relative tolerance of the checks (float sums in a different order).
TOLERANCE = 1e-9


def devices_used(configs) -> int:
    """The most devices any one layer of a strategy uses."""
    return max(math.prod(c) for c in configs)


def in_search_space(G, configs) -> bool:
    """Whether every configuration is among those the search enumerated."""
    for v, config in enumerate(configs):
        if not (G.nodes[v]["configs"] == np.asarray(config)).all(axis=1).any():
            return False
    return True


def expert_detail(net, expert: str, configs, procs: int, machine: Machine) -> str:
    """What an expert strategy chose where it has a choice, in words."""
    if expert == "mesh-tf":
        m, n = best_mesh(net, procs, machine)
        return f"mesh {m} x {n}"
    if expert == "owt":
        splits = sorted({configs[v][-2] for v, layer in enumerate(net.layers) if layer.op == "FC"})
        batch = configs[0][net.layers[0].batch_dim]
        return f"batch {batch}-way, FC n {'/'.join(map(str, splits))}-way"
    if expert == "gnmt":
        lstm = next(configs[v] for v, layer in enumerate(net.layers) if layer.op == "LSTM")
        return f"LSTM L {lstm[0]}-way x batch {lstm[2]}-way"
    return ""


def measure(name: str, batch: int, procs: int, machine: Machine) -> dict:
    """Costs and speedups of one (graph, p) cell; ``violations`` lists failed checks."""
    net = graphs.build(name, batch)
    dp_configs = data_parallel(net, procs)
    dp = evaluate(net, dp_configs, machine, procs).total
    best = plan(net, procs, machine)
    cell = {"graph": name, "batch": batch, "procs": procs, "dp": dp, "pase": best.total_cost,
            "pase_devices": devices_used(best.configs), "dp_devices": devices_used(dp_configs),
            "experts": {}, "meshes": [], "violations": []}
    if best.total_cost > dp * (1 + TOLERANCE):
        cell["violations"].append(
            f"{name} p={procs} batch={batch}: PaSE's optimum {best.total_cost:.6g} costs more than data "
            f"parallelism {dp:.6g} (speedup {dp / best.total_cost:.4f} < 1); data parallelism "
            + ("lies in" if in_search_space(best.graph, dp_configs) else "lies OUTSIDE")
            + " the enumerated search space"
        )
    for expert, configs in expert_strategies(net, procs, machine).items():
        cost = evaluate(net, configs, machine, procs).total
        cell["experts"][expert] = {"cost": cost, "detail": expert_detail(net, expert, configs, procs, machine),
                                   "devices": devices_used(configs)}
        if cost < best.total_cost * (1 - TOLERANCE):
            cell["violations"].append(
                f"{name} p={procs} batch={batch}: expert {expert} costs {cost:.10g}, less than the optimum "
                f"{best.total_cost:.10g}; its configurations lie "
                + ("in" if in_search_space(best.graph, configs) else "OUTSIDE")
                + " the enumerated search space"
            )
    if "mesh-tf" in cell["experts"]:
        for m, n in mesh_tensorflow_meshes(net, procs):
            cost = evaluate(net, mesh_tensorflow(net, procs, machine, m=m), machine, procs).total
            cell["meshes"].append({"m": m, "n": n, "cost": cost})
    return cell


# ---------------------------------------------------------------------------------------
# Output


def output_stem(args) -> str:
    if args.paper_batch:
        return "fig6-paper-batch"
    return "fig6" if args.batch == 128 else f"fig6-b{args.batch}"


def write_outputs(cells: list, args, info: dict, machine: Machine, stem: str) -> list:
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for c in cells:
        rows.append([c["graph"], c["batch"], c["procs"], "data-parallel", repr(c["dp"]), "1.0", c["dp_devices"], ""])
        rows.append([c["graph"], c["batch"], c["procs"], "pase", repr(c["pase"]), f"{c['dp'] / c['pase']:.6f}",
                     c["pase_devices"], "optimum of pase.plan"])
        for expert, e in c["experts"].items():
            rows.append([c["graph"], c["batch"], c["procs"], expert, repr(e["cost"]), f"{c['dp'] / e['cost']:.6f}",
                         e["devices"], e["detail"]])
        for mesh in c["meshes"]:
            rows.append([c["graph"], c["batch"], c["procs"], f"mesh-tf[m={mesh['m']},n={mesh['n']}]",
                         repr(mesh["cost"]), f"{c['dp'] / mesh['cost']:.6f}", mesh["m"] * mesh["n"], "every mesh costed"])
    write_csv(os.path.join(args.out, stem + ".csv"),
              ["graph", "batch", "procs", "strategy", "cost", "speedup_over_dp", "devices", "detail"], rows)

    lines = [
        "# Strategy quality: a modelled Fig. 6",
        "",
        f"Generated by `python benchmarks/fig6.py{' --paper-batch' if args.paper_batch else '' if args.batch == 128 else f' --batch {args.batch}'}`"
        "; do not edit by hand.",
        "",
        "## Setting",
        "",
        *machine_lines(info),
        f"- Cost model of `docs/cost-model.md` (FLOP-equivalents), machine {machine.flops:g} TFLOPS, {machine.bw:g} GB/s "
        f"per device (rho = {machine.rho:g} FLOP per word); batch "
        + ("as in the paper: 128 for the CNNs, 64 for RNNLM and the Transformer" if args.paper_batch
           else f"{args.batch} for every graph (the paper used 64 for RNNLM and the Transformer: see "
                "`fig6-paper-batch.md`)") + ".",
        "- *speedup* = data-parallel cost / strategy cost (higher is better; data parallelism is 1). "
        "PaSE: the exact optimum of `pase.plan`. Experts (`pase/experts.py`): OWT for the CNNs "
        "(data parallelism, FC layers split over output neurons), GNMT-style for RNNLM (the two LSTM "
        "layers on different devices, data parallelism over the rest), Mesh-TensorFlow for the Transformer "
        "(batch m ways, heads / feed-forward / vocabulary n ways, m n = p, the cheapest mesh).",
        "- The paper's Fig. 6 *measures* throughput on 1080Ti and 2080Ti GPUs (speedups of PaSE up to 1.85x "
        "and 4x); these are *modelled* speedups of one analytic machine. The model charges data "
        "parallelism the full all-reduce of every weight gradient, so large FC layers (AlexNet) give much "
        "larger modelled speedups than the measured ones. FlexFlow is not modelled.",
        "- Checked by the script: PaSE's speedup >= 1 in every cell, and no expert strategy costs less than "
        "the optimum.",
        "",
    ]
    names = [g for g in GRAPH_ORDER if any(c["graph"] == g for c in cells)]
    for name in names:
        mine = sorted((c for c in cells if c["graph"] == name), key=lambda c: c["procs"])
        experts = list(dict.fromkeys(e for c in mine for e in c["experts"]))
        headers = ["p", "data-parallel cost", "PaSE cost", "PaSE speedup"]
        for e in experts:
            headers += [f"{EXPERT_TITLES.get(e, e)} speedup", f"{EXPERT_TITLES.get(e, e)} detail"]
        table = []
        for c in mine:
            row = [c["procs"], f"{c['dp']:.4g}", f"{c['pase']:.4g}", f"**{c['dp'] / c['pase']:.3f}**"]
            for e in experts:
                if e in c["experts"]:
                    row += [f"{c['dp'] / c['experts'][e]['cost']:.3f}", c["experts"][e]["detail"]]
                else:
                    row += ["—", "does not apply"]
            table.append(row)
        align = "r" * 4 + "rl" * len(experts)
        lines += [f"## {TITLES.get(name, name)} (batch {mine[0]['batch']})", "", *markdown_table(headers, table, align), ""]
        if any(c["meshes"] for c in mine):
            lines += ["Every Mesh-TensorFlow mesh m x n (speedup over data parallelism; the expert column "
                      "above takes the best):", ""]
            mesh_rows = []
            for c in mine:
                mesh_rows.append([c["procs"], ", ".join(
                    f"{m['m']}x{m['n']}: {c['dp'] / m['cost']:.3f}" for m in c["meshes"])])
            lines += [*markdown_table(["p", "m x n: speedup"], mesh_rows, "rl"), ""]
    lines += ["## Summary", ""]
    for name in names:
        mine = {c["procs"]: c for c in cells if c["graph"] == name}
        parts = []
        for p in (32, 64):
            if p in mine:
                c = mine[p]
                experts = ", ".join(f"{EXPERT_TITLES.get(e, e)} {c['dp'] / v['cost']:.2f}x" for e, v in c["experts"].items())
                parts.append(f"p = {p}: PaSE {c['dp'] / c['pase']:.2f}x" + (f", {experts}" if experts else ""))
        if parts:
            lines.append(f"- {TITLES.get(name, name)} (batch {next(iter(mine.values()))['batch']}): " + "; ".join(parts))
    lines.append("")
    write_text(os.path.join(args.out, stem + ".md"), lines)
    return lines


def plot(cells: list, path: str, title: str) -> None:
    plt = pyplot()
    names = [g for g in GRAPH_ORDER if any(c["graph"] == g for c in cells)]
    cols = min(len(names), 3)
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.6 * nrows), squeeze=False)
    expert_colors = {"owt": "C1", "gnmt": "C2", "mesh-tf": "C4"}
    for ax, name in zip(axes.flat, names):
        mine = sorted((c for c in cells if c["graph"] == name), key=lambda c: c["procs"])
        experts = list(dict.fromkeys(e for c in mine for e in c["experts"]))
        series = [(f"expert: {EXPERT_TITLES.get(e, e)}", e, expert_colors.get(e, "C5")) for e in experts]
        series.append(("PaSE (optimum)", "pase", "C0"))
        x = np.arange(len(mine))
        width = 0.8 / len(series)
        for i, (label, key, color) in enumerate(series):
            values = [c["dp"] / c["pase"] if key == "pase"
                      else c["dp"] / c["experts"][key]["cost"] if key in c["experts"] else 0.0 for c in mine]
            bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label,
                          color=color, edgecolor="black", linewidth=0.4)
            for bar, value in zip(bars, values):
                if value:
                    ax.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                                va="bottom", fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="data parallelism (1)")
        ax.set_xticks(x)
        ax.set_xticklabels([str(c["procs"]) for c in mine])
        ax.set_ylim(0, max(c["dp"] / c["pase"] for c in mine) * 1.25)
        ax.set_title(f"{TITLES.get(name, name)} (batch {mine[0]['batch']})", fontsize=10)
        ax.set_xlabel("devices p")
        ax.set_ylabel("speedup over data parallelism")
    handles = {}
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, h)
    spare = list(axes.flat)[len(names):]
    for ax in spare:
        ax.axis("off")
    if spare:
        spare[0].legend(list(handles.values()), list(handles.keys()), loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default=",".join(GRAPH_ORDER), help="comma-separated graph names")
    parser.add_argument("--procs", default=",".join(map(str, PROCS)), help="comma-separated device counts")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--batch", type=int, default=128, help="mini-batch size for every graph (default 128)")
    group.add_argument("--paper-batch", action="store_true",
                       help="the paper's batches: 128 for the CNNs, 64 for RNNLM and the Transformer")
    parser.add_argument("--flops", type=float, default=10.0, help="peak TFLOPS per device (default 10)")
    parser.add_argument("--bw", type=float, default=16.0, help="peak interconnect GB/s (default 16)")
    parser.add_argument("--out", default=RESULTS, help="output directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    names = parse_list(args.graphs)
    procs_list = parse_list(args.procs, int)
    for name in names:
        if name not in graphs.GRAPHS:
            parser.error(f"unknown graph {name!r}")
    if args.batch < 1 or min(procs_list, default=0) < 1 or args.flops <= 0 or args.bw <= 0:
        parser.error("--batch, --procs, --flops and --bw must be positive")

    from tqdm import tqdm

    info = machine_info()
    machine = Machine(args.flops, args.bw)
    cells = []
    todo = [(n, p) for n in names for p in procs_list]
    with tqdm(todo, desc="fig6", unit="cell", file=sys.stderr) as bar:
        for name, procs in bar:
            bar.set_postfix_str(f"{name} p={procs}")
            batch = PAPER_BATCH.get(name, 128) if args.paper_batch else args.batch
            cells.append(measure(name, batch, procs, machine))
    violations = [v for c in cells for v in c["violations"]]
    if violations:
        print("fig6: the optimum was beaten or data parallelism was cheaper than PaSE:", file=sys.stderr)
        for v in violations:
            print("  " + v, file=sys.stderr)
        return 1
    stem = output_stem(args)
    lines = write_outputs(cells, args, info, machine, stem)
    batch_text = "the paper's batches" if args.paper_batch else f"batch {args.batch}"
    plot(cells, os.path.join(args.out, stem + ".png"),
         f"Modelled speedup over data parallelism ({batch_text}; {machine.flops:g} TFLOPS, {machine.bw:g} GB/s)")
    print("\n".join(lines[lines.index("## Summary") + 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
