"""Megatron-Core's host time per mixture-of-experts block (``moe_block_overhead_seconds``),
fitted on the visible NeMo / Megatron-Bridge MoE rows (issue 42).

Each visible MoE row (``benchmarks/nemo_runs.py``: NVIDIA's two Qwen3-30B-A3B layouts on 16
H100, as its recipes ran them) is priced by the command line with a copy of the megatron profile
whose ``moe_block_overhead_seconds`` is set; for each row the script finds, by bisection, the host
time at which the modelled step equals the measured one, and the fit is their median. Where the
row's device work alone takes longer than measured, no host time helps: the row says so and is
left out. The mechanism (``pase.planning.host_floor``): Megatron-Core's token dispatcher stops the
host at every MoE layer until the device has counted the tokens each expert receives, so a
micro-batch takes at least its MoE blocks' host time however fast the device runs them.

    python3 benchmarks/fit_moe_host.py [--out moe_host]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import write_text  # noqa: E402
from nemo_runs import nemo_recipe, nemo_rows  # noqa: E402
from published import ROOT, price, published_dir  # noqa: E402

#: The bracket searched (seconds a block and micro-batch) and the bisection's steps.
BRACKET = (0.0, 0.05)
STEPS = 30


def megatron_with(folder: str, seconds: float) -> str:
    """A copy of the shipped megatron profile with ``moe_block_overhead_seconds`` set."""
    with open(os.path.join(ROOT, "pase", "planning", "engines", "megatron.json"), encoding="utf-8") as f:
        profile = json.load(f)
    profile["facts"]["moe_block_overhead_seconds"] = {"value": seconds, "source": "benchmarks/fit_moe_host.py"}
    path = os.path.join(folder, f"megatron-moe-host-{seconds:.9f}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(profile, f)
    return path


def solved(row: dict, tmp: str) -> tuple:
    """``(seconds or None, step with none)``: the host time at which the row's modelled step is
    its measured one (``None`` where the step without any is already slower)."""
    def step(seconds: float) -> float:
        return price(row, tmp, megatron_with(tmp, seconds))["step"]

    low, high = BRACKET
    bare = step(low)
    if bare >= row["step_pub"] or step(high) < row["step_pub"]:
        return None, bare
    for _ in range(STEPS):
        mid = (low + high) / 2.0
        if step(mid) < row["step_pub"]:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0, bare


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write benchmarks/results/OUT.md")
    args = parser.parse_args(argv)
    rows = [r for r in nemo_rows(published_dir()) if r["moe"]]
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            row["recipe"] = nemo_recipe(row["published"])
            seconds, bare = solved(row, tmp)
            found.append((row, seconds, bare))
            print(f"  {row['name']}: measured {row['step_pub']:.3f} s, modelled without {bare:.3f} s, "
                  + ("no host time fits" if seconds is None else f"host {seconds * 1e3:.2f} ms a block"), flush=True)
        fits = [s for _, s, _ in found if s is not None]
        if not fits:
            raise SystemExit("fit_moe_host.py: no visible MoE row is slower than its device work")
        fitted = statistics.median(fits)
        shipped = megatron_with(tmp, round(fitted, 4))
        after = [price(row, tmp, shipped)["step"] for row, _, _ in found]
    lines = ["# Megatron-Core's host time per mixture-of-experts block, fitted on the visible NeMo rows", "",
             "Written by `python3 benchmarks/fit_moe_host.py`. Each visible MoE row priced by `pase ... --engine "
             "megatron --recipe ... --json` (its published degrees and NVIDIA's recipe words, "
             "`benchmarks/nemo_runs.py`) with the profile's `moe_block_overhead_seconds` set; per row the host "
             "time at which the modelled step equals the measured one (bisection), the fit their median, rounded "
             "to 0.1 ms.", "",
             f"- fitted `moe_block_overhead_seconds`: **{round(fitted, 4) * 1e3:.1f} ms** a block and micro-batch "
             f"(rows fitted: {len(fits)} of {len(found)})", "",
             "| row | recipe | measured step s | modelled, no host time | host time matching it ms | modelled, fitted |",
             "| :--- | :--- | ---: | ---: | ---: | ---: |"]
    for (row, seconds, bare), step in zip(found, after):
        lines.append(f"| {row['name']} | `{row['recipe']}` | {row['step_pub']:.3f} | {bare:.3f} | "
                     + ("-" if seconds is None else f"{seconds * 1e3:.2f}") + f" | {step:.3f} |")
    if len(after) == 2:
        lines += ["", f"The two layouts modelled {max(after) / min(after):.3f}x apart with the fitted time "
                      f"(measured {max(r['step_pub'] for r, _, _ in found) / min(r['step_pub'] for r, _, _ in found):.3f}x)."]
    if args.out:
        write_text(os.path.join(ROOT, "benchmarks", "results", args.out + ".md"), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
