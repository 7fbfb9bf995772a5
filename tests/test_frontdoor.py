"""The front door (issue 34): the training plan by default on real machines, ``--top``,
``--compare``'s causes, ``--report``'s page and the library's memory rule."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402

import pase  # noqa: E402
from pase.outputs.report import html_report, pareto_front, schedule_ops  # noqa: E402
from pase.outputs.training import difference, explain_difference, format_training  # noqa: E402
from pase.planning.training_plan import NO_CAP, plan_training  # noqa: E402
from pase.sources.registry import load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = ["--machine", "h100-sxm"]
SMALL = ["-g", "gpt2-small", "-p", "8", "-b", "16"]


def gpt2(sequences):
    return load("gpt2-small", batch=sequences)


# -- the schedule the report draws --------------------------------------------------------------


def test_1f1b_schedule_by_hand():
    # pp 2, m 2, forward 1, backward 2, no sends. Stage 0 warms up with pp - 1 - 0 = 1 forward:
    # F0 [0,1], F1 [1,2]; stage 1: F0 [1,2] (after stage 0's F0), B0 [2,4], F1 [4,5], B1 [5,7];
    # stage 0: B0 after stage 1's B0: [4,6], B1 after stage 1's B1: [7,9]. Step 9 = (m + pp - 1) x 3.
    ops = schedule_ops(2, 2, 1, [1.0, 1.0], [2.0, 2.0], 0.0)
    got = {(s, k, mb): (a, b) for s, k, mb, _, a, b in ops}
    assert got == {(0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (1, "F", 0): (1, 2), (1, "B", 0): (2, 4),
                   (1, "F", 1): (4, 5), (1, "B", 1): (5, 7), (0, "B", 0): (4, 6), (0, "B", 1): (7, 9)}


@pytest.mark.parametrize("pp,m,vpp", [(2, 4, 1), (4, 8, 1), (2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 6, 2)])
def test_schedules_match_the_models_step(pp, m, vpp):
    # Equal stages, t = 3 per micro-batch (a chunk: 1/vpp forward, 2/vpp backward), no sends: the
    # drawn schedule ends at (m + (pp - 1) / vpp) t, the pipeline model's step (docs/training.md):
    # e.g. pp 4, m 8, vpp 2: (8 + 1.5) x 3 = 28.5.
    ops = schedule_ops(pp, m, vpp, [1.0 / vpp] * pp, [2.0 / vpp] * pp, 0.0)
    assert len(ops) == 2 * pp * m * vpp
    assert max(op[5] for op in ops) == pytest.approx((m + (pp - 1) / vpp) * 3.0)
    # Every stage runs one pass at a time.
    for s in range(pp):
        spans = sorted((a, b) for st, *_, a, b in ops if st == s)
        assert all(b1 <= a2 + 1e-12 for (_, b1), (a2, _) in zip(spans, spans[1:]))


def test_pareto_front_brute_force():
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(1, 12)
        step = np.array([float(rng.randint(1, 6)) for _ in range(n)])
        memory = np.array([float(rng.randint(1, 6)) for _ in range(n)])
        front = set(pareto_front(step, memory).tolist())
        # Brute force: not dominated (another point at most as large in both, smaller in one),
        # one point per distinct (memory, step) pair.
        undominated = {i for i in range(n) if not any(
            step[j] <= step[i] and memory[j] <= memory[i] and (step[j], memory[j]) != (step[i], memory[i])
            for j in range(n))}
        assert {(step[i], memory[i]) for i in front} == {(step[i], memory[i]) for i in undominated}
        assert len(front) == len({(step[i], memory[i]) for i in undominated})


# -- the library ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100():
    return pase.load_machine("h100-sxm")


@pytest.fixture(scope="module")
def piped(h100):
    """gpt2-small on 8 H100s with a two-stage interleaved pipeline, 3 alternatives, every
    configuration kept, and data parallelism compared; the bare model (no engine profile)."""
    return plan_training(gpt2, 16, 8, h100, recipe=pase.parse_recipe("pp=2,schedule=interleaved"),
                         compare=pase.parse_recipe("dp=8"), alternatives=3, keep_priced=True, engine=None)


def test_library_enforces_the_device_memory(h100):
    # No cap given: the device's memory is the cap, as in the CLI: 79.65 GiB (81,559 MiB).
    device = 79.65 * 2**30
    plan = plan_training(gpt2, 16, 8, h100, free=False)
    assert plan.memory_cap == h100.memory_bytes == device
    assert plan.best.summary.peak_memory_bytes <= device and not plan.exceeds_device
    assert plan.margin_bytes == pytest.approx(device - plan.best.summary.peak_memory_bytes)
    # A cap of 1 GB: nothing fits (gpt2-small's 162 M parameters at 16 bytes are 2.6 GB, over 8
    # devices at most ZeRO-3's 0.32 GB, plus the 2 GB reserve alone is over 1 GB).
    assert plan_training(gpt2, 16, 8, h100, memory_cap=1e9, free=False).best is None
    # No cap at all on a machine of 0.5 GB devices: the plan is returned and says it exceeds.
    small = pase.load_machine("h100-sxm")
    small.memory_bytes = 0.5e9
    over = plan_training(gpt2, 16, 8, small, memory_cap=NO_CAP, free=False)
    assert over.memory_cap is None and over.exceeds_device and over.margin_bytes < 0
    assert "WARNING: needs more than the device's 500 MB" in format_training(over)


def test_pipelined_causes_add_up(piped):
    best = piped.best
    pipe = best.summary.extra["pipeline"]
    causes = best.causes()
    assert sum(causes.values()) == pytest.approx(best.summary.step_seconds, rel=1e-12)
    slowest = max(st["microbatch_seconds"] for st in pipe["stages"])
    m, pp, vpp = pipe["microbatches"], pipe["pp"], pipe["vpp"]
    # The bubble: (pp - 1) / vpp slots of the slowest stage; the sends: m of its per-micro-batch sends.
    assert causes["bubble"] == pytest.approx((pp - 1) / vpp * slowest)
    assert causes["p2p"] == pytest.approx(m * pipe["p2p_seconds_per_microbatch"])
    # The slowest stage's work over the m micro-batches is m times its time per micro-batch.
    work = sum(causes[k] for k in ("compute", "recompute", "activation_comm", "redistribution", "p2p"))
    assert work == pytest.approx(m * slowest, rel=1e-9)
    # Memory by kind of the largest stage adds up to the peak.
    assert sum(best.memory_kinds().values()) == pytest.approx(best.summary.peak_memory_bytes, rel=1e-12)


def test_alternatives_are_the_fastest_fitting_distinct(piped):
    alts = piped.alternatives
    assert alts[0] is piped.best and len(alts) == 3
    steps = [c.summary.step_seconds for c in alts]
    assert steps == sorted(steps)
    assert len({c.recipe() for c in alts}) == 3
    assert all(c.summary.peak_memory_bytes <= piped.memory_cap for c in alts)
    # Brute force over every configuration priced: the alternatives are the smallest steps among
    # the fitting ones distinct in (step, memory) (selective recomputation that recomputes
    # nothing is the same plan as none).
    fitting = sorted({(round(p.step_seconds, 9), round(p.peak_memory_bytes)) for p in piped.priced
                      if p.peak_memory_bytes <= piped.memory_cap})
    assert [(round(c.summary.step_seconds, 9), round(c.summary.peak_memory_bytes)) for c in alts] == fitting[:3]


def test_alternatives_equal_their_recipes_priced_again(piped, h100):
    # Each alternative is kept from the search itself; priced again from its recipe with every
    # choice fixed, it costs the same.
    from pase.planning.training_search import search_meshes

    for c in piped.alternatives[1:]:
        again = search_meshes(gpt2, 16, 8, h100, piped.memory_cap, 2.0, c.as_recipe(),
                              engine=piped.engine_profile).best
        assert again.recipe() == c.recipe()
        assert again.summary.step_seconds == pytest.approx(c.summary.step_seconds, rel=1e-12)
        assert again.summary.peak_memory_bytes == pytest.approx(c.summary.peak_memory_bytes, rel=1e-12)
        assert again.causes() == pytest.approx(c.causes(), rel=1e-12)


def test_difference_in_recipe_words_and_causes(piped):
    best, other = piped.best, piped.compare
    words = difference(best, other)
    assert words.startswith("dp 8 instead of 4, pp 1 instead of 2")
    why = explain_difference(best, other)
    deltas = {k: v for k, v in why}
    a, b = best.causes(), other.causes()
    for k, v in why:
        assert v == pytest.approx(b.get(k, 0.0) - a.get(k, 0.0))
    assert [abs(v) for _, v in why] == sorted((abs(v) for _, v in why), reverse=True)
    # Data parallelism over 8 exposes more gradient synchronisation than the pipeline's.
    assert deltas["weight_sync"] > 0 and why[0][0] == "weight_sync"


def test_format_training_needs_only_the_plan(piped):
    text = format_training(piped)
    assert "pipeline: 2 stages, interleaved" in text and "by cause, largest first: exposed weight sync +" in text
    assert "top 3: the fastest distinct configurations that fit" in text


def test_report_page(piped):
    page = html_report(piped, piped.network)
    assert page.startswith("<!DOCTYPE html>") and page.count('class="chart"') == 5  # causes, memory, schedule, two scatters
    # Self-contained: nothing fetched when it opens.
    for ref in ("http://", "https://", "src=", "<link"):
        assert ref not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "Pipeline schedule" in page and "forward chunk 1" in page


# -- the command line -------------------------------------------------------------------------


def test_training_is_the_default_on_a_real_machine():
    status, out, err = run(*SMALL, *H100)
    assert status == 0, err
    assert out.splitlines()[0].endswith("training configuration")
    status, per_layer, _ = run(*SMALL, *H100, "--per-layer")
    assert status == 0 and "training configuration" not in per_layer
    # paper keeps the per-layer search; a sweep on a real machine is a training sweep (issue 43),
    # with --per-layer the paper's per-layer sweep.
    assert "training configuration" not in run(*SMALL)[1]
    assert run("-g", "gpt2-small", "-b", "16", "--sweep", "4,8", *H100)[1].startswith("PaSE training sweep")
    assert run("-g", "gpt2-small", "-b", "16", "--sweep", "4,8", "--per-layer", *H100)[1].startswith("PaSE sweep")


def test_per_layer_and_engine_flags_clash():
    # Issue 44.3: --per-layer with a training flag lets per-layer splits be the plan (they were
    # refused together); with a flag that keeps to what an engine runs it is refused.
    status, out, err = run(*SMALL, *H100, "--per-layer", "--top", "3")
    assert status == 0 and "per-layer splits (not a mesh)" in out, err
    for flags in (("--engine", "torchtitan"), ("--export-megatron", "m.json")):
        status, out, err = run(*SMALL, *H100, "--per-layer", "--top", "3", *flags)
        assert status == 2 and out == "" and len(err.splitlines()) == 1 and "--per-layer" in err


@pytest.mark.parametrize("value", ["0", "x", "51"])
def test_bad_top(value):
    status, _, err = run(*SMALL, *H100, "--top", value)
    assert status == 2 and len(err.splitlines()) == 1 and "--top" in err


def test_top_json_and_text():
    status, out, err = run(*SMALL, *H100, "--top", "3", "--json")
    assert status == 0, err
    alts = json.loads(out)["training"]["alternatives"]
    assert len(alts) == 3 and [a["step_seconds"] for a in alts] == sorted(a["step_seconds"] for a in alts)
    assert {"recipe", "step_seconds", "peak_memory_bytes"} <= set(alts[0])
    assert alts[0]["recipe"] == json.loads(out)["training"]["recipe"]
    status, text, _ = run(*SMALL, *H100, "--top", "3")
    assert "top 3" in text and "the plan" in text


def test_report_written_and_input_refused(tmp_path):
    path = tmp_path / "plan.html"
    status, out, err = run(*SMALL, *H100, "--report", path)
    assert status == 0, err
    assert f"HTML report written to {path}" in out and path.read_text().startswith("<!DOCTYPE html>")
    config = tmp_path / "gpt2.json"
    shutil.copy(os.path.join(ROOT, "examples", "hf", "gpt2.json"), config)
    before = config.read_text()
    status, out, err = run("-g", f"hf:{config}", "-p", "8", "-b", "16", "-m", "128", *H100, "--report", config)
    assert status == 2 and out == "" and len(err.splitlines()) == 1 and "would overwrite the input" in err
    assert config.read_text() == before
