"""How right the long-search notice is: the estimate against the measured search time.

Before a dynamic programme estimated to run longer than ``pase.cli.progress.NOTICE_SECONDS``,
the command line prints "expect roughly T" with ``T = table entries x SECONDS_PER_ENTRY``
(issue 25, item 4: right within a factor of two). This script runs searches of 1e8 to 1e11
table entries, measures each one's CPU seconds (``time.process_time``: a shared machine
slows the wall clock, not the work), prints the median seconds per entry (the value
``SECONDS_PER_ENTRY`` is set from) and writes ``benchmarks/results/notice.md`` with each
search's estimate / measured ratio.

    python benchmarks/notice.py            # the cases under a minute each
    python benchmarks/notice.py --large    # also gpt3-175b on 1024 devices (~3 min)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import RESULTS, machine_info, machine_lines, markdown_table, write_text  # also puts ROOT on sys.path

import graphs  # noqa: E402
from pase.cli.progress import SECONDS_PER_ENTRY  # noqa: E402
from pase.machines.registry import load_machine  # noqa: E402
from pase.search.solver import Search  # noqa: E402

# (graph, procs, batch, machine)
CASES = [
    ("llama3-8b", 64, 64, "h100-sxm"),
    ("transformer", 64, 128, "paper"),
    ("transformer", 128, 256, "paper"),
    ("transformer", 256, 512, "paper"),
    ("gpt3-13b", 64, 128, "paper"),
]
LARGE = [("gpt3-175b", 1024, 1536, "h100-sxm")]


def measure(name: str, procs: int, batch: int, machine: str) -> dict:
    graph = graphs.build(name, batch).graph(procs, load_machine(machine))
    search = Search(graph, "generateseq")
    started = time.process_time()
    search.run()
    seconds = time.process_time() - started
    entries = float(search.estimate.table_entries)
    return {"case": f"{name} p={procs} b={batch} ({machine})", "entries": entries, "seconds": seconds,
            "per_entry": seconds / entries, "estimate": entries * SECONDS_PER_ENTRY}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="also the gpt3-175b search (about 3 minutes)")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    rows = []
    for case in CASES + (LARGE if args.large else []):
        row = measure(*case)
        rows.append(row)
        print(f"{row['case']}: {row['entries']:.3g} entries, {row['seconds']:.2f} s, "
              f"{row['per_entry'] * 1e9:.2f} ns/entry, notice {row['estimate']:.1f} s", flush=True)
    fitted = statistics.median(r["per_entry"] for r in rows)
    ratios = [r["estimate"] / r["seconds"] for r in rows]
    print(f"median seconds per entry: {fitted:.3g} (SECONDS_PER_ENTRY = {SECONDS_PER_ENTRY:.3g}); "
          f"estimate / measured from {min(ratios):.2f} to {max(ratios):.2f}")
    table = markdown_table(
        ["search", "table entries", "CPU s", "ns/entry", "notice s", "notice / measured"],
        [[r["case"], f"{r['entries']:.3g}", f"{r['seconds']:.2f}", f"{r['per_entry'] * 1e9:.2f}",
          f"{r['estimate']:.2f}", f"{r['estimate'] / r['seconds']:.2f}"] for r in rows])
    lines = [
        "# The long-search notice against measured search time",
        "",
        "Written by `benchmarks/notice.py`. The notice says `table entries x SECONDS_PER_ENTRY` "
        f"(= {SECONDS_PER_ENTRY:.3g} s, `pase/cli/progress.py`); the goal is within a factor of two.",
        "",
        *machine_lines(machine_info()),
        "",
        *table,
        "",
        f"Median measured seconds per entry: **{fitted:.3g}**; estimate / measured from "
        f"**{min(ratios):.2f}** to **{max(ratios):.2f}**.",
    ]
    write_text(os.path.join(args.out, "notice.md"), lines)


if __name__ == "__main__":
    main()
