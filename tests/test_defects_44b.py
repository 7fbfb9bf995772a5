"""Issue 44, items 1-4, 7 and 8 (the planning and the library's part): --search-precision with
--top, the library priced as the command line prices, a default plan an engine runs, headroom
among ties, MFU against the plan's own format, and how many devices would fit. Each test fails
on the code before its fix."""

from __future__ import annotations

import os

import pytest

from cli_runner import run
import pase
from pase.planning.training_search import search_meshes
from pase.sources.registry import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = f"hf:{os.path.join(ROOT, 'examples', 'hf', 'llama-3.1-8b.json')}"


def gpt2(sequences):
    return load("gpt2-small", batch=sequences, model=128)


# 1. precision=search with alternatives -------------------------------------------------------

def test_precision_search_keeps_the_fastest_of_every_format():
    # _search_precisions sorted the formats' alternatives (Candidates) by e[:3], a slice of an
    # Offered tuple: TypeError. Now they merge in the order each format's list keeps.
    h100 = pase.load_machine("h100-sxm")  # runs bf16 and fp8
    found = search_meshes(gpt2, 8, 4, h100, None, 2.0, pase.parse_recipe("precision=search"), keep_best=4)
    steps = [(c.summary.step_seconds, c.summary.peak_memory_bytes) for c in found.fastest]
    assert len(found.fastest) == 4 and steps == sorted(steps)
    assert found.fastest[0].summary.step_seconds == found.best.summary.step_seconds
    # Each format's own fastest is no faster than the merged list's first.
    for precision in ("bf16", "fp8"):
        alone = search_meshes(gpt2, 8, 4, h100, None, 2.0, pase.parse_recipe(f"precision={precision}"), keep_best=1)
        assert alone.fastest[0].summary.step_seconds >= steps[0][0]


def test_precision_search_with_top_on_the_command_line():
    status, out, err = run("-g", "gpt2-small", "-p", 4, "-b", 8, "-m", 128, "--machine", "h100-sxm",
                           "--recipe", "precision=search", "--top", 3)
    assert status == 0 and "top 3:" in out, err
    status, out, err = run("-g", "gpt2-small", "-p", 4, "-b", 8, "-m", 128, "--machine", "h100-sxm",
                           "--search-precision", "--top", 2)
    assert status == 0 and "top 2:" in out, err
