"""``--sweep ... --report FILE.html`` (issue 43): the sweep's page, self-contained, with its charts
against the device count, each count's plan and band, and the counts within ``--days`` marked."""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest

from pase.planning.mesh import Recipe

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402

from pase.machines.registry import load_machine
from pase.outputs.sweep_report import count_points, sweep_html
from pase.outputs.training import bands
from pase.outputs.training_sweep import TrainingBudget, time_to_train
from pase.planning.engine import load_engine
from pase.planning.training_sweep import sweep_training
from pase.sources.registry import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = load_machine("h100-sxm")


def _gpt2(batch):
    return load("gpt2-small", batch, 1024)


@pytest.fixture(scope="module")
def sweep():
    """GPT-2 small, batch 16, on 1, 2 and 4 H100s capped at 4 GB, priced for Megatron-LM (as the
    command line does by default: its band): nothing fits one device."""
    # offload=none: the 1-device count has no plan (with its optimizer on the host it would, issue 45).
    return sweep_training(_gpt2, 16, (1, 2, 4), H100, memory_cap=4e9, engine=load_engine("megatron"),
                          recipe=Recipe(offload=()))


#: 1e9 tokens within 0.02 days: 4 devices take 0.011 days, 2 devices 0.031 (tests/data/golden/training-sweep-budget).
BUDGET = TrainingBudget(1e9, 2.5, 0.02)


def test_points_are_the_plans_figures(sweep):
    points = count_points(sweep, BUDGET)
    assert [p[0] for p in points] == [2, 4]  # the count nothing fits is not drawn
    for p, entry in zip(points, sweep.planned):
        s = entry.best.summary
        step_band, memory_band = bands(entry.best)
        assert p[1:6] == (s.step_seconds, step_band, s.tokens_per_second_per_device, s.peak_memory_bytes, memory_band)
        fields = time_to_train(s.tokens_per_second_per_device, entry.devices, BUDGET)
        assert p[6] == (fields["time_to_train_seconds"] <= 0.02 * 86400)
        assert p[7] == entry.best.recipe()
    assert [p[6] for p in points] == [False, True]


def test_the_page_is_self_contained_with_three_charts(sweep):
    page = sweep_html(sweep, 1024, budget=BUDGET, engine="megatron")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # tokens/s per device, step time and memory per device, against the count.
    assert page.count('class="chart"') == 3
    for ref in ("http://", "https://", "src=", "<link", "<script"):
        assert ref not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # Two planned counts, a mark on each chart; the count within the deadline a star.
    assert page.count('class="mark"') == 3 and page.count('class="mark chosen"') == 3
    # Each count's row: the plan, its band; the count nothing fits says so.
    for entry in sweep.planned:
        assert re.sub("<wbr>", "", page).count(entry.best.recipe()) >= 1
        low, high = bands(entry.best)[0]
        assert f"{low:.3g} to {high:.3g}" in page
    assert "nothing fits in 4 GB per device" in page
    assert 'class="chosen"' in page and "smallest count within 0.02 days" in page
    # The device's memory as the memory chart's limit.
    assert "limit 85.5 GB" in page


def test_without_a_budget_and_without_a_plan(sweep):
    page = sweep_html(sweep)
    assert page.count('class="chart"') == 3 and 'class="chosen"' not in page and "mark chosen" not in page
    assert "time to train" not in page
    nothing = sweep_training(_gpt2, 16, (1,), H100, memory_cap=4e9, recipe=Recipe(offload=()))
    with pytest.raises(ValueError, match="no count of the sweep has a plan"):
        sweep_html(nothing)


def test_the_command_writes_the_page_and_refuses_an_input(tmp_path):
    path = tmp_path / "sweep.html"
    argv = ("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,4")
    status, out, err = run(*argv, "--tokens", "1e9", "--days", "0.01", "--report", path)
    assert status == 0, err
    assert out.rstrip().endswith(f"HTML report written to {path}") and "PaSE training sweep" in out
    assert path.read_text().count('class="chart"') == 3
    # An output onto an input file is refused before any work, the file intact.
    config = tmp_path / "gpt2.json"
    shutil.copy(os.path.join(ROOT, "examples", "hf", "gpt2.json"), config)
    before = config.read_text()
    status, out, err = run("-g", f"hf:{config}", "-b", "16", "-m", "128", "--machine", "h100-sxm", "--sweep", "2,4",
                           "--report", config)
    assert status == 2 and out == "" and len(err.splitlines()) == 1 and "would overwrite the input" in err
    assert config.read_text() == before


def test_no_page_where_no_count_has_a_plan(tmp_path):
    path = tmp_path / "sweep.html"
    status, out, err = run("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "1", "--memory", "4",
                           "--recipe", "offload=none", "--report", path)
    assert status == 4 and not path.exists()
    assert "no count has a plan: --report" in err and "nothing fits" in out
