"""Fit the one global constant left in the training model: ``STEP_COMPUTE_EFFICIENCY``.

What separates a kernel measured alone from the same kernel inside a training step is priced
by named mechanisms where it can be (the clock a GPU sustains at its power limit: the
machine's ``clock_ratio``; the SMs overlapped communication takes; a per-kernel launch floor;
attention's efficiency by sequence and head width; docs/calibration.md). What remains is one
number, the same for every engine, model and machine: the share of the measured kernel rate a
step reaches. It is fitted here on the visible published rows only (``benchmarks/published.py``
prices them with the command line's defaults), by a grid over :data:`GRID`, minimising the mean
absolute log error of tokens/s per GPU with each source weighted equally (Megatron-Core,
torchtitan, llm-foundry); the value found is printed and is the one written in
``pase/planning/engine.py``.

Run from the repository root: ``python3 benchmarks/fit_constants.py`` (a few minutes).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import published  # noqa: E402
import pase.planning.engine as engine  # noqa: E402

#: The values tried.
GRID = [round(0.70 + 0.01 * i, 2) for i in range(21)]


def objective(results: list) -> float:
    """Mean over sources of the mean absolute log error of tokens/s per GPU."""
    by: dict = {}
    for r in results:
        by.setdefault(r["row"]["source"], []).append(abs(math.log(r["model"]["tokens"] / r["row"]["tokens"])))
    return sum(sum(v) / len(v) for v in by.values()) / len(by)


def main() -> int:
    rows = published.load_rows(published.published_dir())
    best = None
    shipped = engine.STEP_COMPUTE_EFFICIENCY
    with tempfile.TemporaryDirectory() as tmp:
        for value in GRID:
            engine.STEP_COMPUTE_EFFICIENCY = value
            results = published.evaluate(rows, tmp, log=lambda *_: None)
            score = objective(results)
            worst = max(abs(r["err_tokens"]) for r in results)
            print(f"STEP_COMPUTE_EFFICIENCY {value:.2f}: mean |log error| per source {score:.4f}, worst {worst:.1%}")
            if best is None or score < best[0]:
                best = (score, value)
    engine.STEP_COMPUTE_EFFICIENCY = shipped
    print(f"fitted STEP_COMPUTE_EFFICIENCY = {best[1]:.2f} (objective {best[0]:.4f}); shipped {shipped:.2f}"
          + ("" if abs(best[1] - shipped) < 1e-9 else ": update pase/planning/engine.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
