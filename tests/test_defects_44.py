"""Issue 44, items 6 and 8 (the command line's part): no silent wrong machine, sane byte units,
--mtp refused where there is nothing to add, implausible plans flagged, and a recipe that does not
fit never called a tie. Each test fails on the code before its fix."""

from __future__ import annotations

import json
import os
import re
import shutil
from types import SimpleNamespace

import pytest

from cli_runner import run
from pase.core.units import format_bytes
from pase.outputs.training import LONG_STEP_SECONDS, LOW_MFU, plan_warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = f"hf:{os.path.join(ROOT, 'examples', 'hf', 'llama-3.1-8b.json')}"
DEEPSEEK = os.path.join(ROOT, "examples", "hf", "deepseek-v3.json")


# 1. A real model on the paper's machine, silently -------------------------------------------

def test_a_real_model_without_machine_gets_a_note():
    # The command: a Llama config planned on the paper's 10 TFLOPS machine, exit 0, no hint.
    status, out, err = run("-g", LLAMA, "-p", 8, "-b", 64, "-m", 4096)
    assert status == 0 and "machine paper" in out, err
    assert err.count("\n") == 1 and err.startswith("pase: note: hf:llama-3.1-8b is priced on the paper's machine"), err
    assert "--machine" in err
    # Named on purpose, or a paper graph: no note.
    status, _, err = run("-g", LLAMA, "-p", 8, "-b", 64, "-m", 4096, "--machine", "paper")
    assert status == 0 and err == "", err
    status, _, err = run("-g", "alexnet", "-p", 4)
    assert status == 0 and err == "", err


@pytest.mark.parametrize("argv", [
    ("-g", "gpt2-small", "-p", 2, "-b", 2, "-m", 16),  # a built-in LLM
    ("-g", "gpt2-small", "--sweep", "1,2", "-b", 2, "-m", 16),
    ("-g", "gpt2-small", "-p", 2, "-b", 2, "-m", 16, "--training"),
])
def test_the_built_in_llms_get_the_note_on_every_command(argv):
    status, _, err = run(*argv)
    assert status == 0 and err.count("priced on the paper's machine (10 TFLOPS and 16 GB/s") == 1, err


def test_the_note_names_the_rates_given_and_a_refusal_stays_one_line():
    status, _, err = run("-g", "gpt2-small", "-p", 2, "-b", 2, "-m", 16, "--flops", 400, "--bw", 900)
    assert status == 0 and "(400 TFLOPS and 900 GB/s per device" in err, err
    status, out, err = run("-g", "gpt2-small", "-p", 8, "-b", 15, "--recipe", "dp=8")
    assert status == 2 and out == "" and err.count("\n") == 1 and "pase: error:" in err, err


def test_an_imported_pytorch_model_gets_the_note(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "tiny.py").write_text("import torch\n\ndef model(batch):\n"
                                      "    return torch.nn.Linear(4, 4), (torch.randn(batch, 4),)\n")
    status, _, err = run("-g", f"torch:{tmp_path / 'tiny.py'}:model", "-p", 2, "-b", 4)
    assert status == 0 and "priced on the paper's machine" in err, err


# 2. Byte units -----------------------------------------------------------------------------

def test_format_bytes_by_hand():
    # --memory 1e9 GB = 1e9 x 1e9 B = 1e18 B = 1 EB (was "1e+03 PB", PB the last unit).
    assert format_bytes(1e18) == "1 EB"
    # 999.7 GB has three significant digits 1.00e3 GB = 1 TB (was "1e+03 GB"); 999.4 GB stays.
    assert format_bytes(999.7e9) == "1 TB" and format_bytes(999.4e9) == "999 GB"
    # 1e12 GB, the largest --memory: 1e21 B = 1 ZB; 1.5e27 B is beyond the units: bytes.
    assert format_bytes(1e21) == "1 ZB" and format_bytes(1.5e27) == "1.5e+27 B"
    assert format_bytes(0) == "0 B" and format_bytes(2048) == "2.05 KB"


def test_a_huge_memory_cap_reads_sanely():
    status, out, err = run("-g", "alexnet", "-p", 8, "--memory", "1e9")
    assert status == 0 and "(fits the 1 EB cap)" in out and "e+" not in out.split("memory per device")[1], err
    # 1e300 GB overflowed to an infinite cap: an internal error (exit 70). Now a usage error.
    for flag in ("--memory", "--table-budget"):
        status, out, err = run("-g", "alexnet", "-p", 8, flag, "1e300")
        assert status == 2 and out == "" and err.count("\n") == 1 and "at most 1e+12 GB" in err, err


# 3. --mtp where there is no multi-token prediction ------------------------------------------

def test_mtp_on_a_model_without_it_is_refused():
    status, out, err = run("-g", LLAMA, "-p", 2, "-b", 2, "-m", 16, "--mtp")
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "--mtp" in err and "hf:llama-3.1-8b has none" in err, err


def test_mtp_on_a_deepseek_config_without_the_module_is_refused(tmp_path):
    with open(DEEPSEEK, encoding="utf-8") as f:
        config = json.load(f)
    config["num_nextn_predict_layers"] = 0
    (tmp_path / "ds.json").write_text(json.dumps(config))
    status, _, err = run("-g", f"hf:{tmp_path / 'ds.json'}", "-p", 2, "-b", 2, "-m", 16, "--mtp")
    assert status == 2 and "has none" in err, err
    shutil.copy(DEEPSEEK, tmp_path / "ds.json")  # num_nextn_predict_layers 1: the module is added
    status, out, err = run("-g", f"hf:{tmp_path / 'ds.json'}", "-p", 2, "-b", 2, "-m", 16, "--mtp", "--json")
    assert status == 0 and any(layer["name"].startswith("mtp1.") for layer in json.loads(out)["layers"]), err


# 4. Implausible plans ----------------------------------------------------------------------

def _candidate(step, mfu):
    return SimpleNamespace(summary=SimpleNamespace(step_seconds=step, mfu=mfu))


def test_plan_warnings_at_their_thresholds():
    assert LONG_STEP_SECONDS == 24 * 3600 and LOW_MFU == 0.05
    assert plan_warnings(_candidate(86400.0, 0.05)) == []
    long, low = plan_warnings(_candidate(86400.0 * 3, 0.0499))
    # 259,200 s / 86,400 s a day = 3 days; 0.0499 = 4.99 %, three digits.
    assert long.startswith("a step of 2.592e+05 s (3 days) is over a day") and low.startswith("MFU 4.99 % is below 5 %")
    assert plan_warnings(_candidate(1e9, 0.0), seconds=False) == []  # FLOP-equivalents: not times


def test_a_day_long_step_is_flagged():
    # A batch of 10^9 sequences on one H100 (recipe fixed to keep the search short): 28.6 days.
    argv = ("-g", "gpt2-small", "--machine", "h100-sxm", "-p", 1, "-b", 1000000000, "--recipe",
            "microbatch=16,zero=0,recompute=none")
    status, out, err = run(*argv, "--json")
    assert status == 0, err
    training = json.loads(out)["training"]
    assert training["step_seconds"] > 86400 and len(training["warnings"]) == 1, training["warnings"]
    assert "is over a day" in training["warnings"][0]
    status, out, err = run(*argv)
    assert status == 0 and "\n  WARNING: a step of " in out, err


def test_a_plan_that_leaves_the_devices_waiting_is_flagged():
    # llama3-8b, one sequence on 1,024 H100s: 9.88e13 model FLOPs / (0.0321 s x 1024 x 989e12) = 0.304 %.
    status, out, err = run("-g", "llama3-8b", "--machine", "h100-sxm", "-p", 1024, "-b", 1, "--json")
    assert status == 0, err
    (warning,) = json.loads(out)["training"]["warnings"]
    assert re.match(r"MFU 0\.\d+ % is below 5 %", warning), warning
    # A plain plan: no warning, an empty list.
    status, out, err = run("-g", "llama3-8b", "--machine", "h100-sxm", "-p", 8, "-b", 8, "-m", 512, "--json")
    assert status == 0 and json.loads(out)["training"]["warnings"] == [], err


# 5. --compare: a recipe that does not fit is no tie ------------------------------------------

COMPARE = ("-g", "llama3-8b", "--machine", "h100-sxm", "-p", 8, "-b", 8, "-m", 2048, "--memory", 60)


def test_a_compared_recipe_that_does_not_fit_is_never_a_tie():
    # dp=4,tp=2,zero=0 needs 86.2 GB against the 60 GB cap; its step band (0.199-0.291 s) overlaps
    # the plan's (0.173-0.253 s) by more than half, which made it "a tie".
    status, out, err = run(*COMPARE, "--compare", "dp=4,tp=2,zero=0", "--json")
    assert status == 0, err
    compare = json.loads(out)["compare"]
    assert compare["training"]["peak_memory_bytes"] > 60e9
    assert compare["training"]["fit"] == "does-not-fit" and compare["tie"] is False, compare["training"]["fit"]
    status, out, err = run(*COMPARE, "--compare", "dp=4,tp=2,zero=0")
    assert status == 0 and "(does NOT fit)" in out and "a tie" not in out, err


def test_a_compared_recipe_that_fits_can_still_tie():
    status, out, err = run(*COMPARE, "--compare", "tp=8,zero=0", "--json")
    assert status == 0, err
    compare = json.loads(out)["compare"]
    assert compare["training"]["fit"] == "fits" and compare["tie"] is True
