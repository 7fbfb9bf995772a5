"""Fit the one global constant left in the training model: ``STEP_COMPUTE_EFFICIENCY``.

What separates a kernel measured alone from the same kernel inside a training step is priced
by named mechanisms where it can be (the clock a GPU sustains at its power limit: the
machine's ``clock_ratio``; the SMs overlapped communication takes; a per-kernel launch floor;
attention's efficiency by sequence and head width; docs/calibration.md). What remains is one
number, the same for every engine, model, machine and number format: the share of the
measured kernel rate a step reaches. It is fitted here on every visible published row
(``benchmarks/published.py`` prices them with the command line's defaults: Megatron-Core,
torchtitan, llm-foundry in BF16 and FP8, NeMo / Megatron-Bridge in FP8 on H100 and B200), each
source weighing equally whatever its number of rows:

- per source, the median absolute log error of tokens/s per GPU;
- the value kept minimises the sum of those medians (every source counts once, as the mean over
  sources did before NeMo's rows were visible), ties broken by the largest of them. The largest
  per-source median is printed beside it: where the two criteria disagree the report says so
  (docs/calibration.md).

A coarse grid over :data:`GRID`, then the neighbours of the best point at :data:`FINE`. Every
point is printed with each source's median and worst signed error; the value found is the one
to write in ``pase/planning/engine.py``.

Run from the repository root: ``python3 benchmarks/fit_constants.py`` (several minutes).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import published  # noqa: E402
import pase.planning.engine as engine  # noqa: E402

#: The values tried first.
GRID = [round(0.72 + 0.02 * i, 2) for i in range(15)]
#: Then the best coarse point's neighbours at this step.
FINE = 0.01


def per_source(results: list) -> dict:
    """``{source: (median |log error|, worst signed error, rows)}`` of tokens/s per GPU."""
    by: dict = {}
    for r in results:
        by.setdefault(r["row"]["source"], []).append(r)
    out = {}
    for source, rs in by.items():
        logs = [abs(math.log(r["model"]["tokens"] / r["row"]["tokens"])) for r in rs]
        worst = max((r["err_tokens"] for r in rs), key=abs)
        out[source] = (statistics.median(logs), worst, len(rs))
    return out


def objective(results: list) -> tuple:
    """``(sum of the per-source median |log error|, the largest of them)``: compared as a tuple."""
    medians = [m for m, _, _ in per_source(results).values()]
    return sum(medians), max(medians)


def describe(results: list) -> str:
    return "; ".join(f"{s} median {math.exp(m) - 1:.1%} worst {w:+.1%}" for s, (m, w, _) in per_source(results).items())


def main() -> int:
    rows = published.load_rows(published.published_dir())
    shipped = engine.STEP_COMPUTE_EFFICIENCY
    scores: dict = {}

    def score(value: float, tmp: str):
        if value not in scores:
            engine.STEP_COMPUTE_EFFICIENCY = value
            results = published.evaluate(rows, tmp, log=lambda *_: None)
            scores[value] = (objective(results), results)
            total, worst = scores[value][0]
            print(f"STEP_COMPUTE_EFFICIENCY {value:.2f}: sum of source medians |log error| {total:.4f}, largest {worst:.4f}"
                  f" ({describe(results)})", flush=True)
        return scores[value][0]

    with tempfile.TemporaryDirectory() as tmp:
        try:
            score(shipped, tmp)
            best = min(GRID, key=lambda v: score(v, tmp))
            for value in (round(best - FINE, 2), round(best + FINE, 2)):
                score(value, tmp)
            best = min(scores, key=lambda v: scores[v][0])
        finally:
            engine.STEP_COMPUTE_EFFICIENCY = shipped
    print(f"before (shipped {shipped:.2f}): {describe(scores[shipped][1])}")
    print(f"after  (fitted {best:.2f}): {describe(scores[best][1])}")
    minimax = min(scores, key=lambda v: (scores[v][0][1], scores[v][0][0]))
    print(f"fitted STEP_COMPUTE_EFFICIENCY = {best:.2f} (sum of source medians {scores[best][0][0]:.4f}, "
          f"largest {scores[best][0][1]:.4f}; the least largest median of the points tried: {minimax:.2f}); "
          f"shipped {shipped:.2f}"
          + ("" if abs(best - shipped) < 1e-9 else ": update pase/planning/engine.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
