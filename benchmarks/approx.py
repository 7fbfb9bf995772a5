"""The approximate search (``--approx``, issue 23): plans with a lower bound beyond the exact reach.

Writes ``benchmarks/results/approx.md`` (and prints it):

1. DenseNet-121 (torchvision, built on ``meta``) at p = 8 and 64, where the exact search is
   refused: the command line in a fresh process (import, costing and search, end to end), its
   plan's cost, lower bound, gap and seconds;
2. the built-in graphs the exact search solves: the exact optimum and its time against the
   approximate search with the default tables (the exact optimum, gap 0, where they hold the
   whole programme) and with small tables (``--small`` entries), where the bound is at work.

    python benchmarks/approx.py            # about 3 minutes on 2 cores
    python benchmarks/approx.py --quick    # p = 8 only for the built-in graphs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import ROOT, RESULTS, machine_info, machine_lines, markdown_table, write_text  # sets sys.path

import graphs  # noqa: E402
from pase.planning.planner import plan  # noqa: E402
from pase.search.approx import DEFAULT_TABLE_ENTRIES  # noqa: E402

DENSENET = "torch:examples/torchvision_cnns.py:densenet121"
BUILTIN = ("alexnet", "inception3", "rnnlm", "transformer", "resnet101")


def densenet_row(procs: int, entries: int | None) -> list:
    argv = [sys.executable, "scheduler.py", "-g", DENSENET, "-p", str(procs), "--json", "--approx"]
    if entries is not None:
        argv.append(str(entries))
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return [procs, entries or DEFAULT_TABLE_ENTRIES, f"failed: {done.stderr.strip()}", "", "", "", "", "", ""]
    d = json.loads(done.stdout)
    a = d["approximate"]
    return [procs, f"{entries or DEFAULT_TABLE_ENTRIES:,}", f"{d['total_cost']:.5g}", f"{d['lower_bound']:.5g}",
            f"{100 * d['gap']:.2f} %", f"{d['data_parallel_cost']:.5g}", f"{a['bound_seconds']:.1f}",
            f"{a['plan_seconds']:.1f}", f"{wall:.1f}"]


def builtin_rows(procs_list, small: int) -> list:
    rows = []
    for name in BUILTIN:
        network = graphs.build(name, 128)
        for procs in procs_list:
            start = time.perf_counter()
            exact = plan(network, procs)
            exact_seconds = time.perf_counter() - start
            graph = exact.graph
            row = [name, procs, f"{exact.total_cost:.6g}", f"{exact_seconds:.2f}"]
            for entries in (DEFAULT_TABLE_ENTRIES, small):
                start = time.perf_counter()
                found = plan(network, procs, graph=graph, approx=entries)
                seconds = time.perf_counter() - start
                a = found.approximation
                excess = (found.total_cost - exact.total_cost) / exact.total_cost
                row += [f"{found.total_cost:.6g}" + ("" if abs(excess) < 1e-9 else f" (+{100 * excess:.2g} %)"),
                        f"{a.lower_bound:.6g}", "0 (exact)" if a.exact else f"{100 * a.gap:.3g} %", f"{seconds:.2f}"]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p = 8 only for the built-in graphs")
    parser.add_argument("--small", type=int, default=1 << 14, help="small tables for the built-in graphs (entries)")
    args = parser.parse_args(argv)
    lines = ["# The approximate search: plans with a lower bound beyond the exact reach", "",
             "Written by `python benchmarks/approx.py`. Costs in FLOP-equivalents (paper machine, 10 TFLOPS, "
             "16 GB/s), batch 128. gap = (cost - lower bound) / lower bound: the plan costs at most that much "
             "more than the optimum.", "", *machine_lines(machine_info()), "",
             "## DenseNet-121 (torchvision, on meta): the exact search is refused at every p >= 2", "",
             "`pase -g torch:examples/torchvision_cnns.py:densenet121 -p P --approx [ENTRIES] --json` in a fresh "
             "process; *end to end* includes importing the model with torch.export and costing it (about 10 s).",
             ""]
    rows = [densenet_row(p, e) for p in (8, 64) for e in (None, 1 << 24)]
    lines += markdown_table(["p", "tables (entries)", "plan cost", "lower bound", "gap", "data-parallel cost",
                             "bound s", "plan s", "end to end s"], rows)
    procs = (8,) if args.quick else (8, 64)
    lines += ["", "## Built-in graphs the exact search solves", "",
              f"Exact: `pase.plan` (with repeated blocks). Approximate: `plan(approx=ENTRIES)` with the default "
              f"tables ({DEFAULT_TABLE_ENTRIES:,} entries) and with small ones ({args.small:,}); the same costed "
              "graph. A plan dearer than the optimum shows the excess.", ""]
    lines += markdown_table(
        ["graph", "p", "exact optimum", "exact s", "approx cost", "lower bound", "gap", "s",
         f"cost, {args.small:,} entries", "lower bound", "gap", "s"],
        builtin_rows(procs, args.small), "lrrrrrrrrrrr")
    path = os.path.join(RESULTS, "approx.md")
    write_text(path, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
