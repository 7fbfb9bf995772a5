"""Search speed, end to end: graph build (all cost tables) plus the exact search.

Measures the cases the project promises figures for and writes
``benchmarks/results/search_speed.md`` (and prints it). Each figure is the best of
``--repeats`` runs in one process; the command-line figure is one fresh process (Python
start-up and imports included).

    python benchmarks/bench_search.py            # all cases, best of 3
    python benchmarks/bench_search.py --quick    # the smaller cases only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from common import ROOT, RESULTS, machine_info, machine_lines  # also puts ROOT on sys.path

import graphs  # noqa: E402
from pase.planning.planner import plan  # noqa: E402
from pase.search.solver import Search  # noqa: E402

# (graph, procs, batch, memory cap in GB or None, promised seconds)
CASES = [
    ("transformer", 64, 128, None, 10.0),
    ("transformer", 32, 128, None, 3.0),
    ("inception3", 64, 128, None, 1.5),
    ("resnet101", 64, 128, None, 1.5),
    ("alexnet", 64, 128, None, None),
    ("rnnlm", 64, 128, None, None),
    ("gpt3-13b", 32, 128, None, 20.0),
    ("gpt3-6.7b", 32, 16, 80, 120.0),
    ("gpt3-6.7b", 32, 16, 40, 120.0),
    ("gpt3-6.7b", 32, 16, 20, 120.0),
]
QUICK = {("transformer", 32), ("inception3", 64), ("resnet101", 64), ("alexnet", 64), ("rnnlm", 64)}


def measure(graph: str, procs: int, batch: int, cap_gb, repeats: int) -> dict:
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        network = graphs.build(graph, batch)
        G = network.graph(procs)
        t1 = time.perf_counter()
        if cap_gb is None:
            result = Search(G).run()
            entries, searches, status = result.stats.table_entries, 1, "-"
            max_d = result.stats.max_dependent_set
        else:
            capped = plan(network, procs, memory_cap=cap_gb * 1e9, graph=G)
            entries, searches, status = capped.search.table_entries, capped.memory.searches, capped.memory.status
            max_d = capped.search.max_dependent_set
        t2 = time.perf_counter()
        row = {
            "build": t1 - t0, "search": t2 - t1, "total": t2 - t0, "entries": entries,
            "searches": searches, "status": status, "max_d": max_d, "vertices": len(network),
        }
        if best is None or row["total"] < best["total"]:
            best = row
    return best


def cli_seconds(args: list) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "scheduler.py"), *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the cases that take about a second")
    parser.add_argument("--output", default=os.path.join(RESULTS, "search_speed.md"))
    args = parser.parse_args(argv)
    lines = [
        "# Search speed, end to end",
        "",
        "Machine:",
        "",
        *machine_lines(machine_info()),
        "",
        f"Best of {args.repeats} runs in one process; build = graph and every cost table, search = the",
        "dynamic programme (for a memory cap: every dynamic programme of the Lagrangian search).",
        "Regenerate with `python benchmarks/bench_search.py`.",
        "",
        "| graph | p | batch | cap GB | vertices | M | build s | search s | total s | promised s | DPs | table entries | ns/entry | capped status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for graph, procs, batch, cap, promise in CASES:
        if args.quick and (graph, procs) not in QUICK:
            continue
        r = measure(graph, procs, batch, cap, args.repeats)
        ns = 1e9 * r["search"] / max(r["entries"], 1)
        lines.append(
            f"| {graph} | {procs} | {batch} | {cap or '-'} | {r['vertices']} | {r['max_d']} | {r['build']:.3f} | "
            f"{r['search']:.3f} | {r['total']:.3f} | {promise or '-'} | {r['searches']} | {r['entries']:.3g} | "
            f"{ns:.2f} | {r['status']} |"
        )
        print(lines[-1], flush=True)
    if not args.quick:
        seconds = min(cli_seconds(["-g", "transformer", "-p", "64", "--json"]) for _ in range(args.repeats))
        lines += [
            "",
            f"Command line, fresh process: `python scheduler.py -g transformer -p 64 --json` takes "
            f"{seconds:.2f} s (best of {args.repeats}), Python start-up and imports included.",
        ]
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
