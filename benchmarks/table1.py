"""Search time, the paper's Table I: GenerateSeq and breadth-first ordering per graph and p.

For every graph and device count: the seconds to build the costed graph, the seconds of the
exact search with GenerateSeq ordering (ordering + dynamic programme) and with breadth-first
ordering, the largest dependent set, the table entries (the search's inherent work) and the
nanoseconds per entry, beside the paper's Table I (BF / FlexFlow / Ours). Each time is the
best of ``--repeats`` runs (default 3): the machine is shared, and the minimum is the run
least disturbed by other work.

Breadth-first searches whose tables would not fit the memory budget are refused before
allocating (the library raises ``SearchTooLarge``: the paper's "OOM" cells); those that fit
but would process more than ``--work-limit`` table entries are skipped (they would run for
minutes to days). Both are recorded with their table-entry count.

Writes ``results/table1.md``, ``results/table1.csv`` and ``results/table1.png``.

    python benchmarks/table1.py [--graphs alexnet,rnnlm] [--procs 4,8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time

from common import (
    GRAPH_ORDER, PROCS, RESULTS, TITLES, machine_info, machine_lines, markdown_table, parse_list, pyplot,
    seconds_text, write_csv, write_text,
)

import graphs  # noqa: E402  (common puts the repository root on the path)
from pase import Machine, Search, SearchTooLarge  # noqa: E402
from pase.core.budget import DEFAULT_MEMORY_SHARE, available_memory  # noqa: E402

# The paper's Table I (unit mins:secs.msecs), transcribed from the text: per graph and p,
# (breadth-first, FlexFlow, ours). OOM: out of memory; NA: not available.
PAPER_TABLE1 = {
    "alexnet": {
        4: ("0:00.234", "0:02.54", "0:00.226"), 8: ("0:00.260", "0:02.77", "0:00.253"),
        16: ("0:00.303", "0:06.98", "0:00.295"), 32: ("0:00.385", "0:07.92", "0:00.361"),
        64: ("0:00.485", "4:17.30", "0:00.475"),
    },
    "inception3": {
        4: ("OOM", "1:09.21", "0:14.398"), 8: ("OOM", "2:26.51", "0:20.018"),
        16: ("OOM", "6:05.82", "0:39.791"), 32: ("OOM", "15:37.96", "1:26.039"),
        64: ("OOM", "37:17.04", "3:16.253"),
    },
    "rnnlm": {
        4: ("0:00.070", "1:47.07", "0:00.057"), 8: ("0:00.084", "2:44.29", "0:00.086"),
        16: ("0:00.109", "7:12.19", "0:00.069"), 32: ("0:00.167", "11:08.22", "0:00.131"),
        64: ("0:00.271", "17:21.98", "0:00.215"),
    },
    "transformer": {
        4: ("OOM", "NA", "0:09.752"), 8: ("OOM", "NA", "0:28.798"),
        16: ("OOM", "NA", "2:10.882"), 32: ("OOM", "NA", "9:13.022"),
        64: ("OOM", "NA", "31:23.187"),
    },
}


def paper_seconds(text: str | None) -> float | None:
    """``"1:09.21"`` -> 69.21; ``"OOM"``, ``"NA"`` or None -> None."""
    if not text or ":" not in text:
        return None
    minutes, seconds = text.split(":")
    return 60 * int(minutes) + float(seconds)


def best_of(repeats: int, run):
    """Run ``run()`` ``repeats`` times; return (best wall seconds, result of the best run)."""
    best = None
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        if best is None or seconds < best[0]:
            best = (seconds, result)
    return best


def search_once(G, ordering: str, budget: int):
    """Order the vertices and run the dynamic programme; returns the SearchResult."""
    return Search(G, ordering, blocks=False).run(memory_budget=budget)  # the paper's algorithm, no block reuse


def measure_cell(name: str, procs: int, args, machine: Machine, budget: int) -> dict:
    """Time one (graph, p) cell."""
    build_s, G = best_of(args.repeats, lambda: graphs.build(name, args.batch).graph(procs, machine))
    row = {"graph": name, "procs": procs, "batch": args.batch, "vertices": G.number_of_nodes(),
           "edges": G.number_of_edges(), "build_s": build_s}

    seq_s, seq = best_of(args.repeats, lambda: search_once(G, "generateseq", budget))
    row.update(seq_s=seq_s, seq_dp_s=seq.stats.seconds, seq_max_dependent=seq.stats.max_dependent_set,
               seq_entries=seq.stats.table_entries, seq_ns_per_entry=seq.stats.ns_per_entry,
               seq_peak_bytes=seq.stats.peak_bytes, optimum=seq.cost)

    bf = Search(G, "breadth-first")
    est = bf.estimate
    row.update(bf_max_dependent=est.max_dependent_set, bf_entries=est.table_entries,
               bf_s=None, bf_status="", bf_ns_per_entry=None)
    try:
        bf.check_budget(budget)
    except SearchTooLarge:
        row["bf_status"] = f"refused: {est.table_entries:.3g} table entries ({est.peak_bytes / 1e9:.3g} GB)"
        return row
    if est.table_entries > args.work_limit:
        row["bf_status"] = f"skipped: {est.table_entries:.3g} table entries > work limit {args.work_limit:.3g}"
        return row
    bf_s, result = best_of(args.repeats, lambda: search_once(G, "breadth-first", budget))
    if not math.isclose(result.cost, seq.cost, rel_tol=1e-9):
        raise AssertionError(
            f"{name} p={procs}: breadth-first optimum {result.cost!r} differs from GenerateSeq {seq.cost!r}"
        )
    row.update(bf_s=bf_s, bf_ns_per_entry=result.stats.ns_per_entry, bf_status="ran")
    return row


# ---------------------------------------------------------------------------------------
# Output


CSV_COLUMNS = (
    "graph", "procs", "batch", "vertices", "edges", "build_s",
    "seq_s", "seq_dp_s", "seq_max_dependent", "seq_entries", "seq_ns_per_entry", "seq_peak_bytes", "optimum",
    "bf_s", "bf_ns_per_entry", "bf_max_dependent", "bf_entries", "bf_status",
    "paper_bf", "paper_flexflow", "paper_ours", "paper_ours_s",
)


def paper_row(name: str, procs: int) -> tuple:
    return PAPER_TABLE1.get(name, {}).get(procs, ("", "", ""))


def write_outputs(rows: list, args, info: dict, budget: int) -> list:
    os.makedirs(args.out, exist_ok=True)
    csv_rows = []
    for r in rows:
        bf, ff, ours = paper_row(r["graph"], r["procs"])
        values = dict(r, paper_bf=bf, paper_flexflow=ff, paper_ours=ours, paper_ours_s=paper_seconds(ours))
        csv_rows.append(["" if values.get(c) is None else values.get(c) for c in CSV_COLUMNS])
    write_csv(os.path.join(args.out, "table1.csv"), list(CSV_COLUMNS), csv_rows)

    headers = ["graph", "p", "build s", "GenerateSeq s", "max \\|D\\|", "table entries", "ns/entry",
               "breadth-first s", "BF max \\|D\\|", "paper BF", "paper FlexFlow", "paper Ours",
               "paper Ours / (build + GenerateSeq)"]
    table = []
    for r in rows:
        bf, ff, ours = paper_row(r["graph"], r["procs"])
        ours_s = paper_seconds(ours)
        bf_cell = seconds_text(r["bf_s"]) if r["bf_s"] is not None else r["bf_status"]
        table.append([
            TITLES.get(r["graph"], r["graph"]), r["procs"], f"{r['build_s']:.3f}", seconds_text(r["seq_s"]),
            r["seq_max_dependent"], f"{r['seq_entries']:.3g}", f"{r['seq_ns_per_entry']:.2f}",
            bf_cell, r["bf_max_dependent"], bf or "—", ff or "—", ours or "—",
            f"{ours_s / (r['build_s'] + r['seq_s']):.0f}x" if ours_s else "—",
        ])
    slowest = max(rows, key=lambda r: r["seq_s"])
    refused = [r for r in rows if r["bf_status"].startswith("refused")]
    skipped = [r for r in rows if r["bf_status"].startswith("skipped")]
    lines = [
        "# Search time (the paper's Table I)",
        "",
        "Generated by `python benchmarks/table1.py`; do not edit by hand.",
        "",
        "## Machine",
        "",
        *machine_lines(info),
        f"- Memory budget of the searches: {budget / 1e9:.3g} GB ({DEFAULT_MEMORY_SHARE:.0%} of the memory "
        f"available at the start); breadth-first work limit: {args.work_limit:.3g} table entries",
        "",
        "## What is measured",
        "",
        f"- Batch {args.batch}, default machine (10 TFLOPS, 16 GB/s). Every time is the **best of "
        f"{args.repeats}** runs, in seconds (wall clock, `time.perf_counter`).",
        "- *build s*: building the network and its costed graph (configurations, layer-cost vectors, "
        "edge-cost matrices), `graphs.build(...).graph(p)`.",
        "- *GenerateSeq s*: `Search(G, 'generateseq', blocks=False).run()` (the paper's algorithm): the ordering, the dependent sets and the "
        "dynamic programme, i.e. the whole exact search on a costed graph.",
        "- *max |D|*: largest dependent set; *table entries*: `sum_i prod(K_u, u in D(i) ∪ {v(i)})`, the "
        "search's inherent work; *ns/entry*: dynamic-programme seconds per table entry.",
        "- *breadth-first s*: the same search with breadth-first ordering (paper III-A, `--algo 1`). "
        "*refused*: its tables would not fit the memory budget; the library raises `SearchTooLarge` "
        "before allocating (the paper's OOM). *skipped*: it would fit but exceeds the work limit above.",
        "- *paper*: the paper's Table I (its prototype in Python on an Intel Xeon E5 SandyBridge; "
        "mins:secs.msecs, FlexFlow's MCMC search stopped as in the paper). The paper's batch was 64 for "
        "RNNLM and the Transformer; at these p the configuration counts, and so the search, do not change. "
        "ResNet-101 is not in the paper's table.",
        "- *paper Ours / (build + GenerateSeq)*: how many times faster this implementation builds the costed "
        "graph and searches it than the paper's prototype did (different machines: a rough comparison).",
        "",
        "## Results",
        "",
        *markdown_table(headers, table, "lr" + "r" * (len(headers) - 2)),
        "",
        "## Summary",
        "",
        f"- Slowest search: {TITLES.get(slowest['graph'], slowest['graph'])} on p = {slowest['procs']}, "
        f"{slowest['seq_s']:.2f} s for {slowest['seq_entries']:.3g} table entries "
        f"({slowest['seq_ns_per_entry']:.2f} ns per entry).",
        f"- Breadth-first refused (tables over the memory budget): {len(refused)} of {len(rows)} cells"
        + (": " + ", ".join(f"{TITLES.get(r['graph'], r['graph'])} p={r['procs']} ({r['bf_entries']:.3g} entries)"
                            for r in refused) if refused else "") + ".",
        f"- Breadth-first skipped over the work limit: {len(skipped)} cells"
        + (": " + ", ".join(f"{TITLES.get(r['graph'], r['graph'])} p={r['procs']} ({r['bf_entries']:.3g} entries)"
                            for r in skipped) if skipped else "") + ".",
        "- Where both orderings ran they found the same optimum (checked by the script).",
    ]
    write_text(os.path.join(args.out, "table1.md"), lines)
    return lines


def plot(rows: list, path: str) -> None:
    plt = pyplot()
    names = [g for g in GRAPH_ORDER if any(r["graph"] == g for r in rows)]
    cols = min(len(names), 3)
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.7 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        mine = sorted((r for r in rows if r["graph"] == name), key=lambda r: r["procs"])
        ps = [r["procs"] for r in mine]
        ax.plot(ps, [r["seq_s"] for r in mine], "o-", color="C0", label="GenerateSeq (this implementation)")
        bf = [(r["procs"], r["bf_s"]) for r in mine if r["bf_s"] is not None]
        if bf:
            ax.plot(*zip(*bf), "s--", color="C1", label="breadth-first (this implementation)")
        paper = PAPER_TABLE1.get(name, {})
        for index, style, color, label in ((2, "o-", "C3", "paper: Ours (prototype)"),
                                           (0, "s--", "C4", "paper: breadth-first"),
                                           (1, "^:", "C2", "paper: FlexFlow")):
            points = [(p, paper_seconds(paper[p][index])) for p in ps if p in paper]
            points = [(p, s) for p, s in points if s is not None]
            if points:
                ax.plot(*zip(*points), style, color=color, alpha=0.75, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ps)
        ax.set_xticklabels([str(p) for p in ps])
        ax.set_yscale("log")
        ax.set_title(TITLES.get(name, name) + ("" if paper else " (not in the paper)"))
        ax.set_xlabel("devices p")
        ax.set_ylabel("search time (s)")
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles = {}
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower right" if len(names) % cols else "lower center",
               bbox_to_anchor=(0.98, 0.12) if len(names) % cols else (0.5, -0.02), fontsize=9, frameon=False)
    fig.suptitle("Search time vs devices (log scale); breadth-first missing where refused or skipped")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default=",".join(GRAPH_ORDER), help="comma-separated graph names")
    parser.add_argument("--procs", default=",".join(map(str, PROCS)), help="comma-separated device counts")
    parser.add_argument("--batch", type=int, default=128, help="mini-batch size (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per search; the best is kept")
    parser.add_argument("--work-limit", type=float, default=5e9,
                        help="skip breadth-first searches with more table entries (default 5e9)")
    parser.add_argument("--out", default=RESULTS, help="output directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    names = parse_list(args.graphs)
    procs_list = parse_list(args.procs, int)
    for name in names:
        if name not in graphs.GRAPHS:
            parser.error(f"unknown graph {name!r}")
    if args.repeats < 1 or args.batch < 1 or min(procs_list, default=0) < 1:
        parser.error("--repeats, --batch and --procs must be positive")

    from tqdm import tqdm

    info = machine_info()
    budget = int(DEFAULT_MEMORY_SHARE * available_memory())
    machine = Machine()
    cells = [(n, p) for n in names for p in procs_list]
    rows = []
    with tqdm(cells, desc="table1", unit="cell", file=sys.stderr) as bar:
        for name, procs in bar:
            bar.set_postfix_str(f"{name} p={procs}")
            rows.append(measure_cell(name, procs, args, machine, budget))
    lines = write_outputs(rows, args, info, budget)
    plot(rows, os.path.join(args.out, "table1.png"))
    print("\n".join(lines[lines.index("## Summary") + 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
