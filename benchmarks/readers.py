"""The reader rules (``--readers each | summed``, issue 23 item 4): what summing a tensor's
gradient over its readers before one all-reduce changes, and what it costs the search.

For each graph and device count: the optimum under the paper's rule ``each`` and under
``summed``, the saving, the table entries both searches fill and their seconds (the median of
``--runs`` searches of the same costed graph, costing excluded; the costing's own seconds
beside). Writes ``benchmarks/results/readers.md`` (and prints it).

    python benchmarks/readers.py            # about 2 minutes on 2 cores
    python benchmarks/readers.py --quick    # the small cases only
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import RESULTS, machine_info, machine_lines, markdown_table, write_text  # sets sys.path

import graphs  # noqa: E402
from pase.planning.planner import plan  # noqa: E402
from pase.sources.hf import load_hf  # noqa: E402

def _torch_model(factory: str):
    """A ``benchmarks/zoo.py`` model (built on ``meta`` from its configuration), imported."""
    def build():
        import zoo
        from pase.sources.torch.importer import from_torch

        built = getattr(zoo, factory)(zoo.BATCH)
        return from_torch(built[0], built[1], built[2] if len(built) > 2 else {}, name=factory)
    return build


CASES = (  # (label, network factory, device counts)
    ("llama3-8b, batch 8", lambda: graphs.build("llama3-8b", 8), (8, 16, 32)),
    ("hf:gpt2, batch 8, sequence 1024", lambda: load_hf("examples/hf/gpt2.json", 8, 1024), (8, 16, 32)),
    ("transformer (paper), batch 128", lambda: graphs.build("transformer", 128), (8, 64)),
    ("ViT-B/16, Hugging Face (q, k, v apart)", _torch_model("vit"), (8, 64)),
    ("ViT-B/16, torchvision (q, k, v fused)", _torch_model("vit_b16"), (8, 64)),
)
QUICK = 3


def measure(network, procs: int, runs: int) -> tuple:
    """``(optimum, table entries, median search seconds, costing seconds)``."""
    start = time.perf_counter()
    graph = network.graph(procs)
    costing = time.perf_counter() - start
    found = plan(network, procs, graph=graph)
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        again = plan(network, procs, graph=graph)
        seconds.append(time.perf_counter() - start)
        assert again.total_cost == found.total_cost
    return found.total_cost, found.search.table_entries, statistics.median(seconds), costing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first two cases only")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for label, build, procs_list in CASES[:QUICK] if args.quick else CASES:
        network = build()
        for procs in procs_list:
            each = measure(network.with_readers("each"), procs, args.runs)
            summed = measure(network.with_readers("summed"), procs, args.runs)
            rows.append([label, str(procs), f"{each[0]:.4e}", f"{summed[0]:.4e}",
                         f"{100 * (1 - summed[0] / each[0]):.2f} %", f"{each[1]:,}", f"{summed[1]:,}",
                         f"{each[2]:.3f}", f"{summed[2]:.3f}", f"{each[3]:.2f} / {summed[3]:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
    lines = ["# Reader rules: each reader's reduction (`each`) or one of the sum (`summed`)", "",
             "`python benchmarks/readers.py`: the optimum (FLOP-equivalents, reference machine) under both",
             "rules, the table entries and the median seconds of the search (costing excluded; its seconds",
             "last, `each / summed`).", ""]
    lines += markdown_table(
        ["graph", "p", "optimum each", "optimum summed", "saving", "entries each", "entries summed",
         "search s each", "search s summed", "costing s"], rows)
    lines += [""] + machine_lines(machine_info())
    write_text(os.path.join(args.out, "readers.md"), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
