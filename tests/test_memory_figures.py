"""The three memory figures (allocated, reserved, what the device needs), the allocator's stranded
bytes and nanotron's own pipeline cut (issue 45), against values worked out by hand."""

import json
import os
import subprocess
import sys

import pytest

from pase.costing.training.allocator import MemoryFigures, hold_within, memory_figures, released_within, stranded_bytes
from pase.planning.engine import load_engine
from pase.planning.engine_cut import balanced_cut, representable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_figures_by_kind():
    # Device: every kind, 10 + 6 + 2 + 1 + 0.5 + 1 = 20.5; reserved: less the context and NCCL's
    # buffers (1 + 0.5) = 19; allocated: less the stranded 1 = 18.
    kinds = {"model_state": 10.0, "activations": 6.0, "logits": 2.0, "fragmentation": 1.0,
             "comm_buffers": 0.5, "reserve": 1.0}
    assert memory_figures(kinds) == MemoryFigures(allocated=18.0, reserved=19.0, device=20.5)
    # The search's own peak (a pipeline stage's sum) stands for the device figure: 25 - 1.5 - 1.
    assert memory_figures(kinds, 25.0) == MemoryFigures(allocated=22.5, reserved=23.5, device=25.0)
    assert memory_figures(kinds).figure("reserved") == 19.0
    with pytest.raises(ValueError, match="one of allocated, reserved, device"):
        memory_figures(kinds).figure("nvidia-smi")


def test_stranded_bytes():
    # 3 micro-batches of 4 bytes of activations in flight: 0.5 x 3 x 4 = 6 by fragmentation,
    # 0.25 x (3 - 1) x 4 = 2 by the interleaving of the two further micro-batches.
    assert stranded_bytes(4.0, 3.0, 0.5, 0.25) == pytest.approx(8.0)
    # One micro-batch in flight (no pipeline): the interleaving strands nothing.
    assert stranded_bytes(4.0, 1.0, 0.5, 0.25) == pytest.approx(0.5 * 4.0)


def test_balanced_cut_nanotron_8b():
    # nanotron's costs for the 8B of the playbook (models/llama.py:938-950): a decoder layer
    # 4 x 32 x 128 x 4096 + 3 x 14336 x 4096 = 243,269,632; the lm_head 131072 x 4096 = 536,870,912.
    # Total 32 layers + head = 34.207 layers; a rank's threshold (r + 1) x 4.276 layers. Rank 0 takes
    # layers 1-5 (5 > 4.276), rank 1 6-9 (9 > 8.55), rank 2 10-13 (13 > 12.83), rank 3 14-18
    # (17 < 17.10, 18 > it), ranks 4-6 four each (22 > 21.38, 26 > 25.66, 30 > 29.93), rank 7
    # layers 31-32 and the head.
    assert balanced_cut([243_269_632.0] * 32, 536_870_912.0, 8) == (5, 4, 4, 5, 4, 4, 4, 2)


def test_balanced_cut_leaves_the_last_rank_the_loss():
    # 4 blocks of 1 and a head of 2 over 2 ranks: thresholds 3 and 6; blocks 1-4 all on rank 0
    # (cum 4 > 3 only after the fourth), the head on rank 1 with no block.
    assert balanced_cut([1.0] * 4, 2.0, 2) == (4, 0)
    # The playbook's 1B (16 layers of 67,112,960, tied head 268,437,504 ~ 4 layers) over 8 ranks:
    # thresholds every 2.5 layers; rank 0 takes 1-3, rank 1 4-5 (5 layers pass 2 x 2.5 by the
    # head's 3,584 elements under 4 layers), rank 2 6-8, rank 3 9-10, rank 4 11-13, rank 5 14-15,
    # rank 6 layer 16 and the head (passing 17.5), rank 7 only the loss.
    assert balanced_cut([67_112_960.0] * 16, 268_437_504.0, 8) == (3, 2, 3, 2, 3, 2, 1, 0)
    # The planner's stages each hold a block: the empty one takes one from the nearest stage
    # before it with two (rank 5), the first stages as nanotron has them.
    assert representable((3, 2, 3, 2, 3, 2, 1, 0)) == (3, 2, 3, 2, 3, 1, 1, 1)
    assert representable((4, 0)) == (3, 1)
    assert representable((1, 0)) is None


def test_profiles_name_their_figure_and_cut():
    assert load_engine("nanotron")["memory_reported"] == "reserved"
    assert load_engine("nanotron")["pipeline_cut"] == "compute_balanced"
    assert load_engine("megatron")["pipeline_cut"] == "search"  # the optional fact's default
    assert load_engine("torchtitan")["memory_reported"] == "reserved"


def test_bad_allocator_facts_refused(tmp_path):
    with open(os.path.join(ROOT, "pase", "planning", "engines", "nanotron.json"), encoding="utf-8") as f:
        profile = json.load(f)
    profile["facts"]["allocator_interleave"]["value"] = 1.5
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="allocator_interleave must be below 1"):
        load_engine(str(path))
    profile["facts"]["allocator_interleave"]["value"] = 0.1
    profile["facts"]["pipeline_cut"]["value"] = "greedy"
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="pipeline_cut must be one of search, compute_balanced"):
        load_engine(str(path))


def _plan(*extra) -> dict:
    argv = [sys.executable, os.path.join(ROOT, "scheduler.py"), "-g", "hf:benchmarks/configs/nanotron-8b.json",
            "-p", "64", "-b", "256", "-m", "4096", "--machine", "h100-sxm", "--memory", "100000", "--json", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(done.stdout)["training"]


def test_nanotron_pipeline_runs_its_own_cut_and_reports_each_stage():
    t = _plan("--engine", "nanotron", "--recipe", "dp=4,tp=2,pp=8,zero=1,microbatch=2,recompute=none,schedule=1f1b")
    stages = t["pipeline"]["stages"]
    assert [s["blocks"] for s in stages] == [5, 4, 4, 5, 4, 4, 4, 2]  # test_balanced_cut_nanotron_8b
    for s in stages:
        assert s["peak_memory_allocated_bytes"] <= s["peak_memory_reserved_bytes"] <= s["memory_bytes"]
    # The first stage holds 8 micro-batches of 5 blocks: the plan's peak, in all three figures.
    assert t["peak_memory_bytes"] == pytest.approx(stages[0]["memory_bytes"])
    assert t["peak_memory_reserved_bytes"] == pytest.approx(stages[0]["peak_memory_reserved_bytes"])
    assert t["peak_memory_allocated_bytes"] == pytest.approx(stages[0]["peak_memory_allocated_bytes"])
    # Reserved is the device figure less the reserve and NCCL's buffers the profile names.
    assert t["peak_memory_bytes"] - t["peak_memory_reserved_bytes"] == pytest.approx(1e9 + 5e8)


def test_stranded_bytes_give_way_under_the_cap():
    # 90 at the peak, 30 of them stranded, on a device of 80: tensors need 60, the allocator
    # keeps 80 - 60 = 20 of the stranded; with room to spare all 30; when tensors alone need
    # more than the device (85 of 80), none; without a cap, all.
    assert released_within(90.0, 30.0, 80.0) == 20.0
    assert released_within(70.0, 30.0, 80.0) == 30.0
    assert released_within(115.0, 30.0, 80.0) == 0.0
    assert released_within(90.0, 30.0, None) == 30.0


def test_hold_within_a_summary():
    class S:
        memory = {"activations": 40.0, "fragmentation": 30.0, "model_state": 20.0}
        peak_memory_bytes = 90.0
        extra: dict = {}
    s = S()
    hold_within(s, 80.0)  # as above: 20 of the 30 stay, the peak is the device's 80
    assert s.memory["fragmentation"] == 20.0 and s.peak_memory_bytes == 80.0
    assert s.extra["released_bytes"] == 10.0  # what the allocator gives back: a tight plan


def test_a_run_whose_allocator_gives_way_is_tight_not_refused():
    # The playbook's usp-1050 (3B, dp 2, pp 16, micro-batch 4) ran and measured 73.0 GiB reserved
    # on its first stage. Its tensors need less than the H100 holds, its stranded bytes would
    # pass it: the figure is the device's capacity, the plan "tight", never "does not fit".
    argv = [sys.executable, os.path.join(ROOT, "scheduler.py"), "-g", "hf:benchmarks/configs/nanotron-3b.json",
            "-p", "32", "-b", "256", "-m", "4096", "--machine", "h100-sxm", "--engine", "nanotron", "--json",
            "--recipe", "dp=2,tp=1,pp=16,zero=1,microbatch=4,recompute=none,schedule=1f1b"]
    t = json.loads(subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True).stdout)["training"]
    assert t["fit"] == "tight"
    assert t["peak_memory_bytes"] == pytest.approx(79.65 * 2 ** 30, rel=1e-3)  # the H100's capacity as PyTorch sees it
    assert t["peak_memory_allocated_bytes"] < t["peak_memory_reserved_bytes"] < t["peak_memory_bytes"]


def test_retry_seconds_by_hand():
    from pase.costing.training.allocator import retry_seconds
    # Tensors need 70 of a device of 80 and 15 are stranded beside them: 85 > 80, so each of the
    # 4 micro-batches reaches its peak by giving cached blocks back: 4 x 1.5 = 6 s.
    assert float(retry_seconds(70.0, 15.0, 80.0, 4, 1.5)) == 6.0
    # 60 + 15 = 75 fits: no retries. 85 needed does not fit at all: not "tight", no time either.
    assert float(retry_seconds(60.0, 15.0, 80.0, 4, 1.5)) == 0.0
    assert float(retry_seconds(85.0, 15.0, 80.0, 4, 1.5)) == 0.0
    # No cap, or a profile that states no retry time: none. Elementwise over rows.
    assert float(retry_seconds(70.0, 15.0, None, 4, 1.5)) == 0.0
    assert float(retry_seconds(70.0, 15.0, 80.0, 4, 0.0)) == 0.0
    assert retry_seconds([70.0, 60.0], [15.0, 15.0], 80.0, 2, 1.0).tolist() == [2.0, 0.0]


def _tight_run(retry: float | None, tmp_path) -> dict:
    engine = "nanotron"
    if retry is not None:
        with open(os.path.join(ROOT, "pase", "planning", "engines", "nanotron.json"), encoding="utf-8") as f:
            profile = json.load(f)
        profile["facts"]["allocator_retry_seconds"]["value"] = retry
        engine = str(tmp_path / f"nanotron-{retry}.json")
        with open(engine, "w", encoding="utf-8") as f:
            json.dump(profile, f)
    argv = [sys.executable, os.path.join(ROOT, "scheduler.py"), "-g", "hf:benchmarks/configs/nanotron-3b.json",
            "-p", "32", "-b", "256", "-m", "4096", "--machine", "h100-sxm", "--engine", engine, "--json",
            "--recipe", "dp=2,tp=1,pp=16,zero=1,microbatch=4,recompute=none,schedule=1f1b"]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True).stdout)["training"]


def test_a_tight_run_pays_its_retries(tmp_path):
    # usp-1050 (above) is tight: 256 sequences / dp 2 / micro-batch 4 = 32 micro-batches, each
    # losing the profile's retry time: 32 x 1.26 = 40.32 s more than the same plan without it
    # (measured 43.5 s a step against 5.7 s modelled without retries: benchmarks/fit_retry.py).
    assert load_engine("nanotron").facts["allocator_retry_seconds"] == 1.26
    with_retries, without = _tight_run(None, tmp_path), _tight_run(0.0, tmp_path)
    assert with_retries["step_seconds"] - without["step_seconds"] == pytest.approx(32 * 1.26, rel=1e-9)
    assert with_retries["causes"]["allocator_retries"] == pytest.approx(32 * 1.26, rel=1e-9)
    assert sum(with_retries["causes"].values()) == pytest.approx(with_retries["step_seconds"], rel=1e-9)
    assert "allocator_retries" not in without["causes"]


def _plan_3b(recipe: str, *more: str) -> dict:
    argv = [sys.executable, os.path.join(ROOT, "scheduler.py"), "-g", "hf:benchmarks/configs/nanotron-3b.json",
            "-p", "8", "-b", "256", "-m", "4096", "--machine", "h100-sxm", "--engine", "nanotron", "--json",
            "--recipe", recipe, *more]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True).stdout)["training"]


def test_the_search_weighs_retries_against_recomputation():
    # The playbook's 3B on 8 H100s, dp 8, micro-batch 2: 256 / 8 / 2 = 16 micro-batches. Its
    # tensors need about 72 GB without recomputation (74.8 GB with the stranded bytes), so on a
    # device capped at 72 GB it is tight: 16 x 1.26 = 20.16 s of retries on top of its 7.80 s.
    roomy = _plan_3b("dp=8,tp=1,zero=1,microbatch=2,recompute=none")
    tight = _plan_3b("dp=8,tp=1,zero=1,microbatch=2,recompute=none", "--memory", "72")
    assert roomy["fit"] == "fits" and "allocator_retries" not in roomy["causes"]
    assert tight["fit"] == "tight"
    assert tight["step_seconds"] == pytest.approx(roomy["step_seconds"] + 16 * 1.26, rel=1e-9)
    # Searched, full recomputation (a third more compute, no retries) beats the tight plan.
    searched = _plan_3b("dp=8,tp=1,zero=1,microbatch=2", "--memory", "72")
    assert "recompute=full" in searched["recipe"] and searched["fit"] == "fits"
    assert roomy["step_seconds"] < searched["step_seconds"] < tight["step_seconds"]


def test_expandable_segments_engines_state_no_retry_time():
    # Megatron's and torchtitan's runs set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    # (NVIDIA's perf recipes, torchtitan's launch script): their profiles state no retry time.
    assert load_engine("megatron").facts["allocator_retry_seconds"] == 0.0
    assert load_engine("torchtitan").facts["allocator_retry_seconds"] == 0.0
    # The 3B on 8 H100s under Megatron needs 58.3 GB for its tensors and 59.3 GB with the
    # allocator's 5 % of the activations stranded (1.13 GB): on 58.8 GB it is tight, gives
    # 0.5 GB back, and its step is the roomy one, 6.97 s, with no retry cause.
    def plan(*more):
        argv = [sys.executable, os.path.join(ROOT, "scheduler.py"), "-g", "hf:benchmarks/configs/nanotron-3b.json",
                "-p", "8", "-b", "256", "-m", "4096", "--machine", "h100-sxm", "--engine", "megatron",
                "--recipe", "dp=8,tp=1,zero=1,microbatch=2,recompute=none", *more]
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    roomy = json.loads(plan("--json"))["training"]
    tight = json.loads(plan("--json", "--memory", "58.8"))["training"]
    assert roomy["fit"] == "fits" and tight["fit"] == "tight"
    assert tight["step_seconds"] == pytest.approx(roomy["step_seconds"], rel=1e-12)
    assert "allocator_retries" not in tight["causes"]
    assert "without a stalling retry" in plan("--memory", "58.8")
