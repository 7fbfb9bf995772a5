"""The caching allocator's retry time (``allocator_retry_seconds``, ``ALLOCATOR_RETRY_SECONDS``),
fitted on the Ultra-Scale Playbook's visible runs (issue 41).

Each visible run is priced by the command line as a user types it (``benchmarks/playbook.py``'s
command: ``examples/machines/hf-h100-cluster.json``, ``--engine nanotron``) with a copy of the
nanotron profile whose retry time is 0. The runs the model calls "tight" (their tensors fit the
device only once the allocator gives its cached blocks back) lose, by the mechanism
(``pase.costing.training.allocator.retry_seconds``), a fixed time for every micro-batch; the fit is
the median over them of (measured step - modelled step) / micro-batches. The other runs' same
residual is shown beside it: the mechanism is the allocator's only where they stay near zero.

    python3 benchmarks/fit_retry.py [--out allocator_retry]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from playbook import CLUSTER, ROOT, load_runs, price, profile_with, recipe_of  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write benchmarks/results/OUT.md")
    args = parser.parse_args(argv)
    runs = load_runs()
    with tempfile.TemporaryDirectory() as folder:
        engine = profile_with(folder, allocator_retry_seconds=0.0)
        rows = [(run, price(run, CLUSTER, engine)) for run in runs]
    refused = [f"{run['id']}: {t['refused']}" for run, t in rows if t["refused"]]
    if refused:
        raise SystemExit(refused[0])
    residual = {run["id"]: (run["step_time_s"] - t["step"]) / run["grad_accum"] for run, t in rows}
    tight = [run["id"] for run, t in rows if t["tight"]]
    rest = np.array([v for k, v in residual.items() if k not in tight])
    fitted = float(np.median([residual[k] for k in tight])) if tight else float("nan")
    lines = ["# The caching allocator's retry time, fitted on the playbook's visible runs", "",
             "Written by `python3 benchmarks/fit_retry.py`. Residual: (measured step - modelled step without "
             "retries) / micro-batches, the step priced by `pase ... --machine examples/machines/hf-h100-cluster.json "
             "--engine nanotron --recipe ... --json` with the profile's `allocator_retry_seconds` 0.", "",
             f"- runs the model calls tight: {len(tight)} of {len(runs)}; fitted `allocator_retry_seconds` "
             f"(their median residual): **{fitted:.2f} s** a micro-batch",
             f"- the other {len(rest)} runs' residual a micro-batch: median {np.median(rest):+.3f} s, "
             f"10th-90th percentile {np.quantile(rest, 0.1):+.3f} to {np.quantile(rest, 0.9):+.3f} s", "",
             "| run | layout | micro-batches | measured step s | modelled without retries | residual a micro-batch s |",
             "| :--- | :--- | ---: | ---: | ---: | ---: |"]
    for run, t in rows:
        if run["id"] in tight:
            lines.append(f"| {run['id']} | {recipe_of(run)} | {run['grad_accum']} | {run['step_time_s']:.2f} | "
                         f"{t['step']:.2f} | {residual[run['id']]:.3f} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(os.path.join(ROOT, "benchmarks", "results", args.out + ".md"), "w", encoding="utf-8") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
