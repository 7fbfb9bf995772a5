"""docs/python-api.md stays true: its code blocks run, and what they print is checked."""

from __future__ import annotations

import io
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "docs", "python-api.md"), encoding="utf-8") as f:
    DOC = f.read()
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)


def run_block(code: str) -> tuple:
    printed = io.StringIO()
    namespace = {"print": lambda *a: printed.write(" ".join(map(str, a)) + "\n")}
    old = os.getcwd()
    os.chdir(ROOT)  # the examples name files relative to the repository root
    try:
        exec(compile(code, "docs/python-api.md", "exec"), namespace)
    finally:
        os.chdir(old)
    return namespace, printed.getvalue()


def test_the_page_has_both_examples():
    assert len(BLOCKS) == 2


def test_training_plan_example_runs():
    ns, printed = run_block(BLOCKS[0])
    plan = ns["plan"]
    best = plan.best
    # Memory enforced without a cap given: the H100's 79.65 GiB (81,559 MiB, the driver's total).
    device = 79.65 * 2**30
    assert plan.memory_cap == pytest.approx(device, rel=1e-12)
    assert best.summary.peak_memory_bytes <= device and not plan.exceeds_device
    assert sum(best.causes().values()) == pytest.approx(best.summary.step_seconds, rel=1e-12)
    assert sum(best.memory_kinds().values()) == pytest.approx(best.summary.peak_memory_bytes, rel=1e-12)
    assert len(plan.alternatives) == 3 and plan.alternatives[0] is best
    assert plan.compare is not None
    assert best.recipe() in printed and "training configuration" in printed


def test_per_layer_example_runs():
    ns, printed = run_block(BLOCKS[1])
    assert ns["best"].total_cost > 0 and printed
