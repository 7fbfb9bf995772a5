"""The caching allocator's two constants of the nanotron profile, fitted on the Ultra-Scale
Playbook's visible runs (issue 45): ``allocator_fragmentation`` and ``allocator_interleave``.

Each visible run of ``reference/published/ultrascale-playbook/runs.json`` is priced by the command
line as a user types it (``benchmarks/playbook.py``'s command, ``--engine nanotron``) and its
``training.peak_memory_reserved_bytes`` set against the measured ``max_memory_reserved()``: on
the first pipeline stage's devices (``training.pipeline.stages[0]``, nanotron logs global rank 0),
and the plan's peak over its stages. Priced without the device's cap, the reserved figure is
linear in the two constants (``pase.costing.training.allocator.stranded_bytes``), so three
pricings per run give it for any pair; the pair fitted minimises the larger of median/15 % and
p90/30 % of the relative error
over a grid of steps of 0.02. The leave-one-out figures fit the pair again without each run.

With ``--write-band`` the nanotron profile's memory band becomes the 10th and 90th percentiles of
measured over modelled (first stage, the shipped constants): where the model is that uncertain,
its band says so.

    python3 benchmarks/fit_memory.py [--machine h100-sxm] [--out memory_playbook] [--write-band]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import playbook  # noqa: E402
from playbook import GiB, ROOT, _run, argv_of, load_runs, profile_with  # noqa: E402

#: The grid both constants are searched on.
GRID = np.round(np.arange(0.0, 0.96, 0.02), 2)
#: The targets the fit weighs against each other: median and p90 of the relative error.
TARGETS = (0.15, 0.30)
#: The same runs before issue 45 (revision fe78b4c): one memory figure, the device's peak over the
#: stages of the search's own cut, `allocator_fragmentation` 0.08.
BEFORE = ("before (revision fe78b4c: one figure, `training.peak_memory_bytes`, the search's own pipeline cut, "
          "fragmentation 0.08): median 26.4 %, p90 42.1 %, 119 of the 125 runs under the measured figure")


def reserved(run: dict, machine: str, engine: str, capped: bool = True) -> tuple:
    """``(first stage, peak over stages)`` of the run's reserved memory in GiB: priced on the
    device (``capped``: its capacity bounds what the allocator holds, ``released_within``), or
    without a cap (where the figure is linear in the two constants, for the fit)."""
    status, out, err = _run(argv_of(run, machine, engine) + ([] if capped else ["--memory", "100000"]))
    if status == 4:  # nothing fits the device: priced without its cap (the run did not fail)
        status, out, err = _run(argv_of(run, machine, engine) + ["--memory", "100000"])
    if status != 0:
        raise SystemExit(f"{run['id']}: {err.strip()}")
    t = json.loads(out)["training"]
    stages = (t.get("pipeline") or {}).get("stages")
    first = stages[0]["peak_memory_reserved_bytes"] if stages else t["peak_memory_reserved_bytes"]
    return first / GiB, t["peak_memory_reserved_bytes"] / GiB


def errors_of(base, a, b, measured, pair) -> np.ndarray:
    return np.abs((base + pair[0] * a + pair[1] * b) / measured - 1.0)


def score(errors: np.ndarray) -> float:
    return max(float(np.median(errors)) / TARGETS[0], float(np.quantile(errors, 0.9)) / TARGETS[1])


def fit(base, a, b, measured) -> tuple:
    """The grid's pair of least :func:`score`, ties to the smaller constants."""
    best = None
    for f in GRID:
        for i in GRID:
            s = score(errors_of(base, a, b, measured, (f, i)))
            if best is None or s < best[0] - 1e-12:
                best = (s, float(f), float(i))
    return best[1], best[2]


def summary(errors: np.ndarray) -> str:
    return f"median {np.median(errors):.1%}, p90 {np.quantile(errors, 0.9):.1%}, worst {errors.max():.1%}"


def write_band(memory: list, rows: int) -> None:
    """The nanotron profile's ``band`` section, ``memory`` only (its step band stays unstated)."""
    path = os.path.join(ROOT, "pase", "planning", "engines", "nanotron.json")
    with open(path, encoding="utf-8") as f:
        profile = json.load(f)
    profile["band"] = {"memory": memory, "rows": rows,
                       "source": "benchmarks/fit_memory.py --write-band: measured / modelled reserved memory on the "
                                 f"first stage over the playbook's {rows} visible runs, 10th and 90th percentiles"}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(profile, indent=1, ensure_ascii=False) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--machine", default="h100-sxm")
    parser.add_argument("--out", default=None, help="write benchmarks/results/OUT.md")
    parser.add_argument("--write-band", action="store_true", help="write the nanotron profile's memory band")
    args = parser.parse_args(argv)
    runs = load_runs()
    measured = np.array([r["peak_memory_gib"] for r in runs])
    with tempfile.TemporaryDirectory() as folder:
        priced = {pair: [reserved(r, args.machine, profile_with(folder, allocator_fragmentation=pair[0],
                                                                allocator_interleave=pair[1]), capped=False)
                         for r in runs]
                  for pair in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.5))}
        shipped = [reserved(r, args.machine, "nanotron") for r in runs]
    lines = [f"# Reserved memory of the Ultra-Scale Playbook's visible runs ({len(runs)} runs, --engine nanotron, "
             f"--machine {args.machine})", "",
             "Written by `python3 benchmarks/fit_memory.py`. Measured: `torch.cuda.max_memory_reserved()` on global "
             "rank 0 (the first pipeline stage). Modelled: `training.peak_memory_reserved_bytes` of "
             "`pase -g hf:benchmarks/configs/nanotron-*.json ... --engine nanotron --recipe ... --json`.", "",
             f"- {BEFORE}", ""]
    fitted = {}
    for k, where in ((0, "the first stage (pipeline.stages[0])"), (1, "the peak over the stages (training.)")):
        base = np.array([p[k] for p in priced[(0.0, 0.0)]])
        a = (np.array([p[k] for p in priced[(0.5, 0.0)]]) - base) / 0.5
        b = (np.array([p[k] for p in priced[(0.0, 0.5)]]) - base) / 0.5
        pair = fit(base, a, b, measured)
        loo = []
        for j in range(len(runs)):
            keep = np.arange(len(runs)) != j
            other = fit(base[keep], a[keep], b[keep], measured[keep])
            loo.append(errors_of(base[j:j + 1], a[j:j + 1], b[j:j + 1], measured[j:j + 1], other)[0])
        ship = np.abs(np.array([p[k] for p in shipped]) / measured - 1.0)
        fitted[k] = pair
        lines += [f"## Against {where}", "",
                  f"- fitted: allocator_fragmentation {pair[0]:.2f}, allocator_interleave {pair[1]:.2f}; "
                  f"in sample {summary(errors_of(base, a, b, measured, pair))}",
                  f"- leave-one-out (each run from the pair fitted on the others): {summary(np.array(loo))}",
                  f"- the shipped profile, priced on the device (what the allocator holds within its capacity): "
                  f"{summary(ship)}", ""]
    lines += ["| run | model | GPUs | layout | measured GiB | modelled, first stage | peak over stages |",
              "| :--- | :--- | ---: | :--- | ---: | ---: | ---: |"]
    for r, (first, peak) in zip(runs, shipped):
        lines.append(f"| {r['id']} | {r['model']['label_in_source']} | {r['gpus']} | {playbook.recipe_of(r)} | "
                     f"{r['peak_memory_gib']:.1f} | {first:.1f} ({first / r['peak_memory_gib'] - 1:+.0%}) | "
                     f"{peak:.1f} ({peak / r['peak_memory_gib'] - 1:+.0%}) |")
    ratios = measured / np.array([first for first, _ in shipped])
    band = [round(float(np.quantile(ratios, 0.1)), 4), round(float(np.quantile(ratios, 0.9)), 4)]
    lines[4:4] = [f"- measured / modelled (first stage, shipped profile): 10th percentile {band[0]:.3f}, "
                  f"90th {band[1]:.3f} (the profile's memory band)", ""]
    if args.write_band:
        write_band(band, len(runs))
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(os.path.join(ROOT, "benchmarks", "results", args.out + ".md"), "w", encoding="utf-8") as f:
            f.write(text)
    print(text if not args.out else "\n".join(lines[:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
