"""Repeated blocks solved once (issue 12): search time and work, with and without blocks.

Writes ``benchmarks/results/blocks.md`` (and prints it):

1. the promised cases end to end (graph build + search, in one process, best of
   ``--repeats``; and the command line in a fresh process): gpt3-175b, llama3-70b and
   gpt3-13b at p = 64, batch 16, and gpt3-13b under a 40 GB cap, the capped search also
   run without blocks for its cost and gap;
2. the largest p (of 64, 128, ..., 1024, 1536, 2048, ...) at which gpt3-175b still solves in
   under a minute, end to end;
3. for every graph of the benchmark (the paper's five, the GPT family, Llama 3) at
   ``--procs``: table entries computed with blocks against the plain programme's, and,
   where the plain programme is affordable (``--plain-limit`` entries), its time and the
   relative difference of the two optima.

    python benchmarks/bench_blocks.py              # everything (about 15 min on 2 cores)
    python benchmarks/bench_blocks.py --quick      # no plain capped search, no p sweep
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from common import ROOT, RESULTS, machine_info, machine_lines, markdown_table, write_text  # sets sys.path

import graphs  # noqa: E402
from pase.planning.planner import plan  # noqa: E402
from pase.search.solver import Search, SearchTooLarge  # noqa: E402
from pase.search.solver import indexed_cost  # noqa: E402

# (graph, p, batch, cap GB or None, promised seconds end to end)
PROMISED = [
    ("gpt3-175b", 64, 16, None, 10.0),
    ("llama3-70b", 64, 16, None, 10.0),
    ("gpt3-13b", 64, 16, None, 2.0),
    ("gpt3-13b", 64, 16, 40, 15.0),
]
PAPER = ("alexnet", "inception3", "rnnlm", "transformer", "resnet101")
FAMILY = tuple(n for n in graphs.GRAPHS if n.startswith(("gpt", "llama")))


def end_to_end(graph: str, procs: int, batch: int, cap_gb, blocks=True) -> dict:
    t0 = time.perf_counter()
    network = graphs.build(graph, batch)
    G = network.graph(procs)
    t1 = time.perf_counter()
    if cap_gb is None:
        search = Search(G, blocks=blocks)
        result = search.run()
        row = {"entries": result.stats.table_entries, "plain": search.plain_estimate.table_entries,
               "cost": result.cost, "blocks": result.stats.blocks_description, "searches": 1}
    else:
        found = plan(network, procs, memory_cap=cap_gb * 1e9, graph=G, blocks=blocks)
        row = {"entries": found.search.table_entries, "plain": found.search.plain_table_entries,
               "cost": found.total_cost, "blocks": found.search.blocks_description,
               "searches": found.memory.searches, "bound": found.memory.lower_bound, "gap": found.gap,
               "status": found.memory.status, "memory": found.memory.per_device_bytes}
    t2 = time.perf_counter()
    row.update(build=t1 - t0, search=t2 - t1, total=t2 - t0)
    return row


def best_of(repeats: int, *args, **kwargs) -> dict:
    return min((end_to_end(*args, **kwargs) for _ in range(repeats)), key=lambda r: r["total"])


def cli_seconds(args: list) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "scheduler.py"), *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def promised(args) -> list:
    lines = ["## 1. The promised cases, end to end", "",
             f"In one process, best of {args.repeats}: build = graph and every cost table; search = "
             "`Search(G)` (block detection, orderings) and its run, or `pase.planning.planner.plan` with `memory_cap` "
             "(every Lagrangian dynamic programme). CLI = `python scheduler.py -g G -p 64 -b 16 [--memory 40]` "
             "in a fresh process (start-up, imports, evaluation and the printed table included), best of "
             f"{args.repeats}.", ""]
    rows = []
    capped = {}
    for graph, procs, batch, cap, target in PROMISED:
        r = best_of(args.repeats, graph, procs, batch, cap)
        command = ["-g", graph, "-p", str(procs), "-b", str(batch)] + (["--memory", str(cap)] if cap else [])
        cli = min(cli_seconds(command) for _ in range(args.repeats))
        plain = "-" if args.quick else end_to_end(graph, procs, batch, cap, blocks=False)
        rows.append([graph, procs, batch, cap or "-", f"{r['build']:.2f}", f"{r['search']:.2f}", f"{r['total']:.2f}",
                     f"{cli:.2f}", target, "-" if args.quick else f"{plain['search']:.1f}", r["searches"],
                     f"{r['entries']:.3g}", f"{r['plain']:.3g}", f"{r['plain'] / r['entries']:.0f}x", r["blocks"]])
        print(rows[-1], flush=True)
        if cap:
            capped[(graph, procs, batch, cap)] = (r, plain)
    lines += markdown_table(
        ["graph", "p", "batch", "cap GB", "build s", "search s", "total s", "CLI s", "promised s",
         "plain search s", "DPs", "table entries", "plain entries", "fewer", "blocks"], rows, "lrrrrrrrrrrrrrl")
    lines += ["", "plain search s: the same search with `blocks=False` (one run), for comparison."]
    for (graph, procs, batch, cap), (r, p) in capped.items():
        lines += ["", f"Capped search, {graph} p={procs} batch {batch} at {cap} GB, with and without blocks:", ""]
        table = [["blocks", r["status"], f"{r['cost']:.6e}", f"{r['bound']:.6e}", f"{100 * r['gap']:.3f}%",
                  f"{r['memory'] / 1e9:.2f}", r["searches"], f"{r['entries']:.3g}", f"{r['search']:.1f}"]]
        if p != "-":
            table.append(["plain", p["status"], f"{p['cost']:.6e}", f"{p['bound']:.6e}", f"{100 * p['gap']:.3f}%",
                          f"{p['memory'] / 1e9:.2f}", p["searches"], f"{p['entries']:.3g}", f"{p['search']:.1f}"])
        lines += markdown_table(["search", "status", "cost", "lower bound", "gap", "GB", "DPs", "table entries",
                                 "search s"], table, "llrrrrrrr")
    return lines


def largest_p(args) -> list:
    lines = ["", "## 2. gpt3-175b: the largest p solved in under a minute", "",
             "Batch 16, one run each, end to end (build + search) in one process; the sweep stops at the first "
             "p over a minute.", ""]
    rows = []
    largest = None
    for p in (64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096):
        if p > args.max_procs:
            break
        try:
            r = end_to_end("gpt3-175b", p, 16, None)
        except SearchTooLarge as too_large:
            rows.append([p, "-", "-", "-", "-", "-", f"refused: {too_large}"])
            break
        rows.append([p, f"{r['build']:.2f}", f"{r['search']:.2f}", f"{r['total']:.2f}", f"{r['entries']:.3g}",
                     f"{r['plain']:.3g}", r["blocks"]])
        print(rows[-1], flush=True)
        if r["total"] >= 60:
            break
        largest = p
    lines += markdown_table(["p", "build s", "search s", "total s", "table entries", "plain entries", "blocks"],
                            rows, "rrrrrrl")
    lines += ["", f"Largest p under a minute: **{largest}**." if largest else "", ""]
    return lines


def every_graph(args) -> list:
    lines = ["## 3. Table entries with blocks against the plain programme", "",
             f"p = {args.procs}; batch 128 for the paper's graphs, 16 for GPT and Llama. Plain entries come from "
             "the plain programme's estimate (exact: the tables it would fill); it is run too where it fills at "
             f"most {args.plain_limit:.2g} entries, and the two optima compared (relative difference).", ""]
    rows = []
    for graph in PAPER + FAMILY:
        batch = 128 if graph in PAPER else 16
        network = graphs.build(graph, batch)
        t0 = time.perf_counter()
        G = network.graph(args.procs)
        t1 = time.perf_counter()
        search = Search(G)
        result = search.run()
        t2 = time.perf_counter()
        plain_entries = search.plain_estimate.table_entries
        plain_s = diff = "-"
        if plain_entries <= args.plain_limit:
            t3 = time.perf_counter()
            plain = Search(G, blocks=False).run()
            plain_s = f"{time.perf_counter() - t3:.2f}"
            diff = f"{abs(result.cost - plain.cost) / plain.cost:.1e}"
            recost = abs(indexed_cost(G, result.choice) - result.cost) / result.cost
            diff += f" ({recost:.0e})"
        rows.append([graph, len(network), f"{t1 - t0:.2f}", f"{t2 - t1:.2f}", f"{result.stats.table_entries:.3g}",
                     f"{plain_entries:.3g}", f"{plain_entries / result.stats.table_entries:.1f}x", plain_s, diff,
                     result.stats.blocks_description])
        print(rows[-1], flush=True)
    lines += markdown_table(["graph", "vertices", "build s", "search s", "table entries", "plain entries", "fewer",
                             "plain search s", "optimum rel. diff (re-costed)", "blocks"], rows, "lrrrrrrrrl")
    lines += ["", "Optimum rel. diff: |blocks - plain| / plain; in brackets the block strategy re-costed from the "
              "graph's tables against the reported optimum. `-`: the plain programme was not run."]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="skip the plain capped search and the p sweep")
    parser.add_argument("--procs", type=int, default=64, help="p for the every-graph table")
    parser.add_argument("--plain-limit", type=float, default=2.5e10,
                        help="run the plain programme up to this many entries")
    parser.add_argument("--max-procs", type=int, default=4096)
    parser.add_argument("--output", default=os.path.join(RESULTS, "blocks.md"))
    args = parser.parse_args(argv)
    lines = ["# Repeated blocks solved once", "", "Machine:", "", *machine_lines(machine_info()), "",
             "Regenerate with `python benchmarks/bench_blocks.py`. The machine is shared: times are noisy.", ""]
    lines += promised(args)
    if not args.quick:
        lines += largest_p(args)
    lines += [""] + every_graph(args)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    write_text(args.output, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
