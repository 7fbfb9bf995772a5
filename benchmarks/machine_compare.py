"""The h100-sxm machine against the paper machine: the strategy each finds, priced on the H100.

For gpt3-2.7b and gpt3-13b (batch 16) and the Transformer (batch 128) at p = 8..64: the
optimum found on ``h100-sxm`` (under its default 80 GB cap) and the paper machine's optimum
re-priced on ``h100-sxm`` (what ``--evaluate`` does), each split into compute, communication
and edge seconds, data parallelism on ``h100-sxm``, per-device memory and search time; then,
for gpt3-13b at p = 64, the configurations each machine picks for one block. Writes
``benchmarks/results/machine_compare.md``.

    python benchmarks/machine_compare.py
    python benchmarks/machine_compare.py --cases transformer:128 --procs 8,64
"""

from __future__ import annotations

import argparse
import os
import time

from common import RESULTS, machine_info, machine_lines, markdown_table, parse_list  # puts the checkout on sys.path

import graphs  # noqa: E402
from pase.machine import load_machine  # noqa: E402
from pase.planner import evaluate_plan, plan  # noqa: E402

CASES = ("gpt3-2.7b:16", "gpt3-13b:16", "transformer:128")
PROCS = (8, 16, 32, 64)


def split_ms(evaluation) -> tuple:
    """Milliseconds of compute, communication and edges, and the total."""
    compute = float(evaluation.compute.sum()) * 1e3
    comm = float(evaluation.communication.sum()) * 1e3
    edges = float(sum(evaluation.edge_costs.values())) * 1e3
    return compute, comm, edges, compute + comm + edges


def run_case(name: str, batch: int, procs: int, paper, h100) -> dict:
    network = graphs.build(name, batch)
    t0 = time.perf_counter()
    on_paper = plan(network, procs, paper)
    paper_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    on_h100 = plan(network, procs, h100, memory_cap=h100.memory_bytes)
    h100_seconds = time.perf_counter() - t0
    paper_on_h100 = evaluate_plan(network, on_paper.configs, procs, h100, memory_cap=h100.memory_bytes)
    return {
        "name": name, "batch": batch, "procs": procs, "network": network,
        "h100": on_h100, "paper": on_paper, "paper_on_h100": paper_on_h100,
        "paper_seconds": paper_seconds, "h100_seconds": h100_seconds,
    }


def summary_row(r: dict) -> list:
    h = split_ms(r["h100"].evaluation)
    p = split_ms(r["paper_on_h100"].evaluation)
    dp = split_ms(r["h100"].data_parallel)[3]
    mem = r["h100"].memory
    pmem = r["paper_on_h100"].memory
    cap = mem.cap_bytes
    paper_fits = pmem.per_device_bytes <= cap
    # A gain over a strategy that does not fit the device is no gain: say so instead.
    gain = f"{p[3] / h[3]:.2f}x" if paper_fits and mem.per_device_bytes <= cap else "-"
    return [
        r["name"], r["procs"],
        f"{h[3]:.2f}", f"{h[0]:.2f} / {h[1]:.2f} / {h[2]:.2f}",
        f"{p[3]:.2f}", f"{p[0]:.2f} / {p[1]:.2f} / {p[2]:.2f}",
        gain, f"{dp:.2f}", f"{dp / h[3]:.2f}x",
        f"{mem.per_device_bytes / 1e9:.1f}", f"{pmem.per_device_bytes / 1e9:.1f}" + ("" if paper_fits else " (over)"),
        mem.status or "-", f"{r['paper_seconds']:.1f}", f"{r['h100_seconds']:.1f}",
    ]


def block_rows(r: dict, block: str = "block1.") -> list:
    """Configurations of one block's layers under both machines, with the H100 split."""
    net = r["network"]
    rows = []
    for v, (layer, lname) in enumerate(zip(net.layers, net.names)):
        if not lname.startswith(block):
            continue
        h, p = r["h100"].evaluation, r["paper_on_h100"].evaluation
        rows.append([
            lname, layer.dims if hasattr(layer, "dims") else "",
            "x".join(map(str, r["paper"].configs[v])), "x".join(map(str, r["h100"].configs[v])),
            f"{(p.compute[v] + p.communication[v]) * 1e3:.3f}",
            f"{h.compute[v] * 1e3:.3f} / {h.communication[v] * 1e3:.3f}",
        ])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="graph:batch list (default %(default)s)")
    parser.add_argument("--procs", default=",".join(map(str, PROCS)), help="device counts (default %(default)s)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "machine_compare.md"))
    args = parser.parse_args(argv)
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in parse_list(args.cases)]
    procs = parse_list(args.procs, int)
    paper, h100 = load_machine("paper"), load_machine("h100-sxm")

    results = []
    for name, batch in cases:
        for p in procs:
            results.append(run_case(name, batch, p, paper, h100))
            print(f"{name} p={p}: done", flush=True)

    info = machine_info()
    lines = [
        "# h100-sxm against the paper machine",
        "",
        "Regenerate with `python benchmarks/machine_compare.py`. Step times are the calibrated",
        "model's (seconds of one training step on the modelled H100 cluster, shown in ms); search",
        "seconds are CPU time on a shared 2-core machine (noisy).",
        "",
        *machine_lines(info),
        "",
        "`h100 optimum`: the strategy found on `h100-sxm` under its default cap (80 GB per device);",
        "`paper optimum on h100`: the paper machine's optimum (10 TFLOPS, 16 GB/s, no cap), priced",
        "on `h100-sxm` as `--evaluate` does. Splits are compute / communication / edges (ms).",
        "`gain`: how much faster the h100 optimum is than the paper one on the H100 (`-` where either",
        "needs more than 80 GB per device). `DP`: data parallelism on `h100-sxm`, whether it fits or",
        "not. Memory: GB per device (parameters with mixed-precision Adam and all activations,",
        "`memory.md`); `(over)`: more than the 80 GB cap. `status`: the capped search's outcome",
        "(`capped`: the unconstrained optimum did not fit and a fitting strategy was found;",
        "`nothing-fits`: no strategy fits, the least-memory one is shown).",
        "",
        *markdown_table(
            ["graph", "p", "h100 optimum ms", "split", "paper optimum on h100 ms", "split", "gain",
             "DP ms", "over DP", "h100 opt GB", "paper opt GB", "status", "paper search s", "h100 search s"],
            [summary_row(r) for r in results], "ll" + "r" * 12,
        ),
    ]
    focus = [r for r in results if r["name"] == "gpt3-13b" and r["procs"] == 64]
    if focus:
        r = focus[0]
        lines += [
            "",
            "## gpt3-13b, p = 64, batch 16: one block",
            "",
            "Configurations in iteration-space order (`dims`), the paper optimum's and the h100",
            "optimum's, and each layer's cost on `h100-sxm` (ms; the h100 optimum split into compute",
            "/ communication).",
            "",
            *markdown_table(["layer", "dims", "paper", "h100", "paper's on h100 ms", "h100's compute / comm ms"],
                            block_rows(r), "llllrr"),
        ]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
