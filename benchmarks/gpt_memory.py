"""GPT models under a per-device memory cap: the capped optimum against data parallelism.

For every GPT graph, device count and cap: per-device memory of data parallelism and of the
strategy found, its modelled speedup over data parallelism (data-parallel cost / its
cost, both under the reference cost model), the Lagrangian lower bound and gap, the dynamic
programmes run, their table entries and the seconds taken. Writes
``benchmarks/results/gpt_memory.md`` and ``gpt_memory.csv``.

    python benchmarks/gpt_memory.py                  # batch 16, p = 8..64, caps 40 and 80 GB
    python benchmarks/gpt_memory.py --models gpt2-small,gpt3-6.7b --procs 32
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

from common import RESULTS, machine_info, machine_lines  # also puts the checkout on sys.path
from tqdm import tqdm

import graphs  # noqa: E402
from graphs.gpt import GPT_CONFIGS  # noqa: E402
from pase.planning.baselines import data_parallel  # noqa: E402
from pase.search.capped import NOTHING_FITS  # noqa: E402
from pase.planning.planner import plan  # noqa: E402
from pase.costing.memory import ASSUMPTIONS, MemoryModel  # noqa: E402
from pase.costing.strategy import evaluate  # noqa: E402

COLUMNS = [
    "model", "procs", "batch", "cap_gb", "dp_gb", "dp_fits", "status", "strategy_gb", "fits",
    "speedup_over_dp", "cost", "lower_bound", "gap", "min_gb", "searches", "table_entries", "seconds",
]


def run_case(name: str, procs: int, batch: int, cap_gb: float, memory: MemoryModel, network=None, graph=None) -> dict:
    network = network or graphs.build(name, batch)
    G = graph if graph is not None else network.graph(procs)
    dp = data_parallel(network, procs)
    dp_cost = evaluate(network, dp, procs=procs).total
    dp_bytes = memory.per_device(network, dp, procs)
    t0 = time.perf_counter()
    result = plan(network, procs, memory_cap=cap_gb * 1e9, memory_model=memory, graph=G)
    seconds = time.perf_counter() - t0
    m = result.memory
    nothing = m.status == NOTHING_FITS
    return {
        "model": name, "procs": procs, "batch": batch, "cap_gb": cap_gb,
        "dp_gb": dp_bytes / 1e9, "dp_fits": dp_bytes <= cap_gb * 1e9,
        "status": m.status, "strategy_gb": m.per_device_bytes / 1e9, "fits": m.fits,
        "speedup_over_dp": float("nan") if nothing else dp_cost / result.total_cost,
        "cost": float("nan") if nothing else result.total_cost,
        "lower_bound": float("nan") if m.lower_bound is None else m.lower_bound,
        "gap": float("nan") if result.gap is None else result.gap,
        "min_gb": (m.least_bytes / 1e9) if m.least_bytes is not None else float("nan"),
        "searches": m.searches, "table_entries": result.search.table_entries, "seconds": seconds,
    }


def markdown(rows: list, batch: int, memory: MemoryModel) -> str:
    lines = [
        "# GPT models under a memory cap",
        "",
        "Machine:",
        "",
        *machine_lines(machine_info()),
        "",
        f"Batch {batch}; {memory.param_bytes:g} bytes per parameter (mixed-precision Adam), "
        f"{memory.act_bytes:g} per activation element; {ASSUMPTIONS}. Reference cost model, "
        "10 TFLOPS and 16 GB/s per device. Speedup = data-parallel cost / cost of the strategy found "
        "(both modelled, whether or not data parallelism fits). Gap = (cost - lower bound) / cost: the "
        "true capped optimum lies between the bound and the cost. `unconstrained`: the unconstrained "
        "optimum fits; `capped`: Lagrangian search; `nothing-fits`: even the least-memory strategy "
        "(min GB) exceeds the cap. Regenerate with `python benchmarks/gpt_memory.py`.",
        "",
        "| model | p | cap GB | DP GB | DP fits | status | found GB | speedup over DP | lower bound | gap | min GB | DPs | table entries | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        nothing = r["status"] == NOTHING_FITS
        speedup = "-" if nothing else f"{r['speedup_over_dp']:.2f}"
        bound = "-" if nothing else f"{r['lower_bound']:.4g}"
        gap = "-" if nothing else f"{100 * r['gap']:.2f}%"
        least = "-" if r["min_gb"] != r["min_gb"] else f"{r['min_gb']:.1f}"  # NaN: not computed
        lines.append(
            f"| {r['model']} | {r['procs']} | {r['cap_gb']:g} | {r['dp_gb']:.1f} | {'yes' if r['dp_fits'] else 'no'} | "
            f"{r['status']} | {r['strategy_gb']:.1f} | {speedup} | {bound} | {gap} | {least} | "
            f"{r['searches']} | {r['table_entries']:.3g} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(GPT_CONFIGS))
    parser.add_argument("--procs", default="8,16,32,64")
    parser.add_argument("--caps", default="40,80", help="caps in GB (10^9 bytes) per device")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--output", default=os.path.join(RESULTS, "gpt_memory"))
    args = parser.parse_args(argv)
    models = args.models.split(",")
    procs = [int(p) for p in args.procs.split(",")]
    caps = [float(c) for c in args.caps.split(",")]
    memory = MemoryModel()
    rows = []
    cells = [(m, p) for m in models for p in procs]
    for model, p in tqdm(cells, desc="gpt memory", file=sys.stderr):
        network = graphs.build(model, args.batch)
        G = network.graph(p)
        for cap in caps:
            rows.append(run_case(model, p, args.batch, cap, memory, network, G))
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output + ".md", "w") as f:
        f.write(markdown(rows, args.batch, memory))
    with open(args.output + ".csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(markdown(rows, args.batch, memory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
