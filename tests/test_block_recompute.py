"""recompute=block (Megatron-LM's --recompute-method block): the first N blocks of every pipeline
chunk recomputed whole, the others keeping everything. A case by hand, the search's pricing
against a reference summed layer by layer from a mask of the recomputed blocks, the search's
choice of N, recipes, the Megatron export read back, the other engines' refusals."""

from __future__ import annotations

import numpy as np
import pytest

from cli_runner import run

from pase.costing.training import LAYER_VECTORS, TrainingCosting, TrainingOptions
from pase.machines.calibrated import CalibratedMachine
from pase.planning.engine import load_engine
from pase.planning.engine_runs import mesh_refusal, policy_refusal
from pase.planning.mesh import Mesh, parse_recipe
from pase.planning.mesh_rows import PartsMemo, row_totals
from pase.planning.pipeline import pipeline_rows, stage_layout
from pase.planning.training_search import search_meshes

from test_training import TOY  # the toy machine of round numbers

from test_pipeline import _net  # embed, blocks of two FC layers of width 64, head, loss


def _ones(blocks=4, m=4):
    """One device, every layer unsplit: no redistribution."""
    machine = CalibratedMachine(TOY)
    net = _net(blocks=blocks)
    rows = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, rows, machine)
    edges, targets = PartsMemo(machine, 1).edge_seconds(net, rows)
    return costing, TrainingOptions(microbatches=m, reserve_bytes=0.0), edges, targets


def _split(blocks=4, m=4, procs=2, seed=0):
    """``procs`` devices, three random configurations per layer: redistributions on the edges,
    the rows priced side by side."""
    machine = CalibratedMachine(TOY)
    net = _net(blocks=blocks, batch=4)
    rng = np.random.default_rng(seed)
    rows = []
    for C in net.configs(procs):
        rows.append(C[rng.integers(0, len(C), 3)])
    costing = TrainingCosting(net, rows, machine)
    edges, targets = PartsMemo(machine, procs).edge_seconds(net, rows)
    return costing, TrainingOptions(microbatches=m, reserve_bytes=0.0, fragmentation=0.1, activation_grads=True), \
        edges, targets


# ---------------------------------------------------------------------------------------
# By hand


def test_one_chunk_by_hand():
    # 4 blocks of two FC layers 2 x 64 -> 64 on one device of the toy machine (1 TFLOP/s),
    # m = 4 micro-batches. A layer's step compute is 6 B N K / peak = 6 x 2 x 64 x 64 / 1e12
    # = 4.9152e-8 s; recomputing a block runs its forward again: 1/3 of its two layers'
    # compute, 2 x 4.9152e-8 / 3 = 3.2768e-8 s per micro-batch, 4 x that = 1.31072e-7 s a step.
    # Memory (2-byte activations): each layer's output is 2 x 64 = 128 elements = 256 B. Kept
    # everything, a block stores a's output (b's weight gradient reads it) and b's (the next
    # block reads it); recomputed, only its output b: 256 B less per block recomputed. The
    # block recomputed in the backward pass holds its working set, a and b: 512 B.
    costing, options, edges, targets = _ones()
    none_t, none_m, _ = row_totals(costing, options, 2.0, edges, targets)
    for n in (1, 2, 3, 4):
        block = options.but(recompute="block", recompute_layers=n)
        t, mem, layers = row_totals(costing, block, 2.0, edges, targets)
        assert t[0] - none_t[0] == pytest.approx(n * 1.31072e-7, rel=1e-9)
        assert mem[0] - none_m[0] == pytest.approx(-256.0 * n + 512.0)
        assert layers[0] == n
        # The layer-by-layer summary agrees (its own path through the costing).
        summary = costing.summarize([0] * len(costing.network.layers), block, 2.0, 0.0, 1)
        assert summary.step_seconds == pytest.approx(t[0], rel=1e-12)
        assert summary.peak_memory_bytes == pytest.approx(mem[0], rel=1e-12)
        assert summary.memory["recompute_working_set"] == 512.0
    # All four blocks recomputed is full recomputation; more than the blocks is all of them.
    full_t, full_m, _ = row_totals(costing, options.but(recompute="full"), 2.0, edges, targets)
    t, mem, layers = row_totals(costing, options.but(recompute="block", recompute_layers=9), 2.0, edges, targets)
    assert (t[0], mem[0], layers[0]) == (pytest.approx(full_t[0], rel=1e-12), pytest.approx(full_m[0]), 4)


def test_mask_of_chunks_by_hand():
    costing, *_ = _ones(blocks=6)
    # Layers: embed 0, blocks 1-2, 3-4, ..., 11-12, head 13, loss 14. Chunks of 3 blocks, 1
    # each: blocks 1 and 4 (layers 1, 2 and 7, 8).
    mask = costing.block_recomputed(1, (3, 3))
    assert np.flatnonzero(mask).tolist() == [1, 2, 7, 8]
    # Chunks 2 / 4 with 3 each: all of the first (layers 1-4), three of the second (5-10).
    assert np.flatnonzero(costing.block_recomputed(3, (2, 4))).tolist() == list(range(1, 11))
    with pytest.raises(ValueError, match="hold 5 blocks"):
        costing.block_recomputed(1, (2, 3))


# ---------------------------------------------------------------------------------------
# Against a reference summed layer by layer


class _Masked(TrainingCosting):
    """A costing whose layers are priced each under ``full`` (``mask``) or ``none``, one layer at
    a time through the per-layer methods: the reference block recomputation is checked against."""

    def __init__(self, costing, mask, act_bytes):
        self.__dict__.update(costing.__dict__)
        self.mask, self.act = mask, act_bytes
        self._memo = type(costing._memo)()

    def _each(self, options):
        return [options.as_policy("full" if self.mask[v] else "none") for v in range(len(self.mask))]

    def layer_vectors(self, options, act_bytes):
        each = self._each(options)
        K = len(self.configs[0])
        out = {name: np.zeros((len(each), K)) for name in LAYER_VECTORS}
        for v, o in enumerate(each):
            t = self.layer_time(v, o)
            mem = self.layer_memory(v, o, act_bytes)
            out["micro"][v] = (t["compute"] + t["recompute"] + t["activation_comm"]) / o.microbatches
            out["step"][v] = t["weight_sync"] + t["optimizer"]
            out["sync"][v] = self.exposed_sync(v, o)
            out["sync_raw"][v] = self.sync(v, o)
            out["state"][v] = mem["model_state"]
            # What tensors need: the allocator's stranded bytes give way under the cap
            # (allocator.released_within), so the search does not count them.
            out["activations"][v] = mem["activations"]
            out["logits"][v] = mem["logits"]
            out["gathered"][v] = self.gathered_bytes(v, o)
            out["working"][v] = act_bytes * self.working_activations(v, o)
            out["grads"][v] = self.output_gradient_bytes(v, o, act_bytes)
        return out

    def edge_rows(self, edges, targets, options, columns=None):
        each = self._each(options)
        return np.array([TrainingCosting.edge_rows(self, edges, targets, each[v], columns)[e]
                         for e, v in enumerate(targets)]).reshape(edges.shape)

    def transient_rows(self, vectors, options, layers=None):
        parts = self.transient_parts(vectors["gathered"], vectors["working"], vectors["grads"],
                                     options.but(recompute="full"), self.mask)
        return sum(parts.values(), np.full(vectors["gathered"].shape[1], float(options.reserve_bytes)))


def _chunks(counts, vpp):
    return tuple(c // vpp for c in counts for _ in range(vpp))


def _recomputed_by_hand(costing, chunks, n):
    """The mask written out: block k's layers are 1 + 2k and 2 + 2k (embed is layer 0)."""
    mask = np.zeros(len(costing.network.layers), dtype=bool)
    first = 0
    for c in chunks:
        for k in range(first, first + min(n, c)):
            mask[[1 + 2 * k, 2 + 2 * k]] = True
        first += c
    return mask


@pytest.mark.parametrize("seed", [0, 1])
def test_no_pipeline_equals_the_layer_by_layer_reference(seed):
    costing, options, edges, targets = _split(seed=seed)
    for n in (1, 2, 3, 4, 6):
        block = options.but(recompute="block", recompute_layers=n)
        t, mem, _ = row_totals(costing, block, 2.0, edges, targets)
        ref = _Masked(costing, _recomputed_by_hand(costing, (4,), n), 2.0)
        ref_t, ref_m, _ = row_totals(ref, options, 2.0, edges, targets)
        assert np.allclose(t, ref_t, rtol=1e-12, atol=0) and np.allclose(mem, ref_m, rtol=1e-12, atol=0)
        assert np.any(edges > 0)  # the edges are priced, some of them re-run


@pytest.mark.parametrize("counts,schedule,vpp,chunks", [
    ((2, 2), "1f1b", 1, None), ((1, 3), "1f1b", 1, None), ((3, 1), "1f1b", 1, None),
    ((2, 2), "interleaved", 2, None), ((4, 4), "interleaved", 2, None), ((4, 4), "interleaved", 4, None),
    # Chunks one block apart (pipeline.chunk_sizes), written out: a 3-block first stage runs
    # chunks of 1 then 2 (its short one first, beside the embedding), a 3-block last stage 2
    # then 1 (its short one last, beside the loss).
    ((3, 4), "interleaved", 2, (1, 2, 2, 2)), ((4, 3), "interleaved", 2, (2, 2, 2, 1)),
])
def test_pipelines_equal_the_layer_by_layer_reference(counts, schedule, vpp, chunks):
    blocks = sum(counts)
    costing, options, edges, targets = _split(blocks=blocks)
    layout = stage_layout(costing.blocks)
    for n in (1, 2, 3):
        block = options.but(recompute="block", recompute_layers=n)
        step, peak, plans = pipeline_rows(costing, block, 2.0, edges, targets, 2, 1, layout, schedules=[schedule],
                                          vpps=[vpp], fixed_counts=counts)
        ref = _Masked(costing, _recomputed_by_hand(costing, chunks or _chunks(counts, vpp), n), 2.0)
        ref_step, ref_peak, ref_plans = pipeline_rows(ref, options, 2.0, edges, targets, 2, 1, layout,
                                                      schedules=[schedule], vpps=[vpp], fixed_counts=counts)
        assert np.allclose(step, ref_step, rtol=1e-12, atol=0) and np.allclose(peak, ref_peak, rtol=1e-12, atol=0)
        for got, want in zip(plans, ref_plans):
            assert (got.vpp, got.counts, got.recompute_layers) == (vpp, counts, min(n, max(counts) // vpp))
            assert np.allclose(got.microbatch_seconds, want.microbatch_seconds, rtol=1e-12, atol=0)
            assert np.allclose(got.memory_bytes, want.memory_bytes, rtol=1e-12, atol=0)


def test_searched_counts_are_the_fastest_fitting_of_every_count():
    # Pipelines of 8 blocks on 2 stages: each count priced alone, the search's choice is the
    # fastest fitting (the smallest count of equals), under caps between the counts' peaks;
    # where the plan without recomputation fits, one block per chunk (no count is searched).
    costing, options, edges, targets = _split(blocks=8)
    layout = stage_layout(costing.blocks)
    for schedule, vpp, counts in (("1f1b", 1, (3, 5)), ("interleaved", 2, (4, 4))):
        priced = {n: pipeline_rows(costing, options.but(recompute="block", recompute_layers=n), 2.0, edges, targets,
                                   2, 1, layout, schedules=[schedule], vpps=[vpp], fixed_counts=counts)
                  for n in range(1, 6)}
        plain = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=[schedule], vpps=[vpp],
                              fixed_counts=counts)[1]
        peaks = sorted({float(p) for n in priced for p in priced[n][1]} | {float(p) for p in plain})
        for cap in [peaks[0] - 1.0] + [(a + b) / 2 for a, b in zip(peaks, peaks[1:])] + [peaks[-1] + 1.0]:
            step, peak, plans = pipeline_rows(costing, options.but(recompute="block", recompute_layers=1), 2.0, edges,
                                              targets, 2, 1, layout, cap, schedules=[schedule], vpps=[vpp],
                                              fixed_counts=counts, search_layers=True)
            for i in range(len(step)):
                fitting = [n for n in priced if priced[n][1][i] <= cap]
                if plain[i] <= cap:
                    want = 1
                elif fitting:
                    want = min(fitting, key=lambda n: (priced[n][0][i], n))
                else:
                    want = min(priced, key=lambda n: (priced[n][1][i], n))
                assert plans[i].recompute_layers == want
                assert step[i] == priced[want][0][i] and peak[i] == priced[want][1][i]


def test_search_picks_the_smallest_count_that_fits():
    # One device, 4 blocks by hand (test_one_chunk_by_hand): peak(n) = peak(none) + 512 - 256 n
    # for n >= 1 and the step grows with n. A cap 300 B under the peak kept-everything leaves
    # n = 3 (peak - 256) out and n = 4 (peak - 512) in... n = 3 is the smallest that fits.
    costing, options, edges, targets = _ones()
    _, none_m, _ = row_totals(costing, options, 2.0, edges, targets)
    block = options.but(recompute="block", recompute_layers=4)
    for cap, want in ((none_m[0] - 300.0, 4), (none_m[0] - 100.0, 3), (none_m[0] + 100.0, 2), (none_m[0] + 600, 1)):
        t, mem, layers = row_totals(costing, block, 2.0, edges, targets, memory_cap=cap, search_layers=True)
        assert layers[0] == want and mem[0] <= cap
    # The mesh search under a recipe pinning block: the same count, said in the recipe words.
    machine = CalibratedMachine(TOY)
    found = search_meshes(lambda n: _net(n), 2, 1, machine, none_m[0] - 100.0, 2.0,
                          parse_recipe("dp=1,microbatch=2,zero=0,recompute=block"),
                          base=TrainingOptions(reserve_bytes=0.0))
    assert found.best.options.recompute_layers == 3 and found.block_counts
    assert found.best.recipe().endswith("zero=0,recompute=block,recompute_layers=3,microbatch=2")
    pinned = search_meshes(lambda n: _net(n), 2, 1, machine, None, 2.0,
                           parse_recipe("dp=1,microbatch=2,zero=0,recompute=block,recompute_layers=2"),
                           base=TrainingOptions(reserve_bytes=0.0))
    assert pinned.best.options.recompute_layers == 2 and not pinned.block_counts


def test_pipelines_search_block_counts_where_a_recipe_asks():
    # Two stages of 4 blocks, a cap only some recomputation meets: the free search takes none,
    # selective or full there (block counts on pipelines are a recipe's), the recipe's
    # recompute=block searches the count.
    machine = CalibratedMachine(TOY)
    base = TrainingOptions(reserve_bytes=0.0)
    full = search_meshes(lambda n: _net(n, blocks=8), 8, 2, machine, None, 2.0,
                         parse_recipe("dp=1,pp=2,stages=4/4,schedule=1f1b,microbatch=1,zero=0,recompute=full"), base=base)
    none = search_meshes(lambda n: _net(n, blocks=8), 8, 2, machine, None, 2.0,
                         parse_recipe("dp=1,pp=2,stages=4/4,schedule=1f1b,microbatch=1,zero=0,recompute=none"), base=base)
    cap = (full.best.summary.peak_memory_bytes + none.best.summary.peak_memory_bytes) / 2
    free = search_meshes(lambda n: _net(n, blocks=8), 8, 2, machine, cap, 2.0,
                         parse_recipe("dp=1,pp=2,stages=4/4,schedule=1f1b,microbatch=1,zero=0"), base=base,
                         engine=load_engine("megatron"))
    assert free.best.options.recompute != "block"
    asked = search_meshes(lambda n: _net(n, blocks=8), 8, 2, machine, cap, 2.0,
                          parse_recipe("dp=1,pp=2,stages=4/4,schedule=1f1b,microbatch=1,zero=0,recompute=block"),
                          base=base)
    assert asked.best.options.recompute == "block" and asked.best.summary.peak_memory_bytes <= cap


def _pipelined(machine, blocks: int, recipe: str):
    """The plan of a batch of 8 on 2 devices in 2 stages under ``recompute=block`` and ``recipe``."""
    return search_meshes(lambda n: _net(n, blocks=blocks), 8, 2, machine, None, 2.0,
                         parse_recipe(f"dp=1,pp=2,microbatch=1,zero=0,recompute=block,{recipe}"),
                         base=TrainingOptions(reserve_bytes=0.0)).best


def test_pipelined_candidate_tells_its_causes_and_memory_per_chunk():
    # A pipelined plan's causes and memory by kind are priced with the cut's chunks: the
    # slowest stage's recomputation is its recomputed blocks' (2 per stage of 4 blocks).
    machine = CalibratedMachine(TOY)
    best = _pipelined(machine, 8, "stages=4/4,schedule=1f1b,recompute_layers=2")
    assert best.options.recompute_layers == 2
    causes = best.causes()
    costing = TrainingCosting(_net(1, blocks=8), [np.ones((1, len(layer.domain)), dtype=np.int64)
                                                   for layer in _net(1, blocks=8).layers], machine)
    o = best.options.as_policy("full")
    # Blocks of stage 0 are layers 1-8; two of them recomputed, m = 8 micro-batches.
    one = sum(float(costing.layer_time(v, o.but(microbatches=8))["recompute"][0]) for v in (1, 2))
    assert causes["recompute"] == pytest.approx(2 * one, rel=1e-9)
    assert sum(causes.values()) == pytest.approx(best.summary.step_seconds, rel=1e-9)
    assert sum(best.memory_kinds().values()) == pytest.approx(best.summary.peak_memory_bytes, rel=1e-12)


def test_interleaved_chunks_one_block_apart_tell_the_step_they_priced():
    # Stages of 3 and 4 blocks in 2 chunks each (1, 2 | 2, 2): the plan's causes and memory by
    # kind, priced again layer by layer with those chunks, add up to the pipeline's step and peak.
    best = _pipelined(CalibratedMachine(TOY), 7, "stages=3/4,schedule=interleaved,vpp=2,recompute_layers=1")
    pipe = best.summary.extra["pipeline"]
    assert [st["blocks"] for st in pipe["stages"]] == [3, 4] and pipe["vpp"] == 2
    assert sum(best.causes().values()) == pytest.approx(best.summary.step_seconds, rel=1e-9)
    assert sum(best.memory_kinds().values()) == pytest.approx(best.summary.peak_memory_bytes, rel=1e-12)


# ---------------------------------------------------------------------------------------
# Options and recipes


def test_options_and_recipes_refuse_bad_counts():
    with pytest.raises(ValueError, match="recompute=block needs recompute_layers >= 1"):
        TrainingOptions(recompute="block")
    with pytest.raises(ValueError, match="recompute_layers applies to recompute=block, not recompute=full"):
        TrainingOptions(recompute="full", recompute_layers=2)
    assert TrainingOptions(recompute="block", recompute_layers=5).label().startswith("ZeRO-0, recompute block 5")
    assert parse_recipe("recompute=block,recompute_layers=5").text() == "recompute=block,recompute_layers=5"
    with pytest.raises(ValueError, match="recipe recompute_layers applies to recompute=block"):
        parse_recipe("recompute=full,recompute_layers=5")
    with pytest.raises(ValueError, match="recipe recompute_layers must be a positive integer, got '0'"):
        parse_recipe("recompute=block,recompute_layers=0")


@pytest.mark.parametrize("recipe,message", [
    ("recompute_layers=3", "pase: error: argument --recipe: recipe recompute_layers applies to recompute=block"),
    ("recompute=block,recompute_layers=x",
     "pase: error: argument --recipe: recipe recompute_layers must be a positive integer"),
])
def test_command_line_refuses_bad_counts_in_one_line(recipe, message):
    status, out, err = run("-g", "llama3-8b", "-p", "8", "-b", "16", "-m", "1024", "--machine", "h100-sxm",
                           "--training", "--recipe", recipe)
    assert status != 0 and err.startswith(message) and err.count("\n") == 1


# ---------------------------------------------------------------------------------------
# Engines


def test_megatron_export_reads_back(tmp_path):
    import json

    args = ("-g", "llama3-8b", "-p", "8", "-b", "16", "-m", "1024", "--machine", "h100-sxm", "--training")
    path = tmp_path / "megatron.json"
    status, out, err = run(*args, "--recipe", "dp=2,tp=2,pp=2,microbatch=1,zero=1,recompute=block,recompute_layers=3",
                           "--export-megatron", path)
    assert status == 0, err
    plan = next(line for line in out.splitlines() if line.startswith("plan:"))
    assert "recompute=block,recompute_layers=3" in plan
    arguments = json.loads(path.read_text())["arguments"]
    assert (arguments["--recompute-granularity"], arguments["--recompute-method"],
            arguments["--recompute-num-layers"]) == ("full", "block", 3)
    status, again, err = run(*args, "--recipe-from", path)
    assert status == 0, err
    assert next(line for line in again.splitlines() if line.startswith("plan:")) == plan
    status, text, err = run(*args, "--recipe", "dp=8,zero=1,recompute=block,recompute_layers=2", "--json")
    assert status == 0, err
    data = json.loads(text)
    assert data["training"]["recompute"] == "block" and data["training"]["recompute_layers"] == 2


@pytest.mark.parametrize("engine,words", [("torchtitan", "not the first N"), ("fsdp", "no block recomputation"),
                                          ("deepspeed", "no block recomputation")])
def test_other_engines_refuse_block(engine, words):
    options = TrainingOptions(zero=3, recompute="block", recompute_layers=2)
    assert words in mesh_refusal(engine, Mesh(8, 1), options)
    assert words in policy_refusal(engine, "block")
    assert mesh_refusal("megatron", Mesh(8, 1), options.but(zero=1)) is None
    status, out, err = run("-g", "llama3-8b", "-p", "8", "-b", "16", "-m", "1024", "--machine", "h100-sxm",
                           "--training", "--engine", engine, "--recipe", "recompute=block,recompute_layers=2")
    assert status != 0 and err.count("\n") == 1 and "recompute=block" in err and words in err
