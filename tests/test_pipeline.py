"""Pipelines by hand: stage times, the schedules' steps and bubbles, memory per stage,
point-to-point sends, uneven cuts; the mesh search with stages against brute force."""

import numpy as np
import pytest

from pase.model.builder import GraphBuilder
from pase.machines.calibrated import CalibratedMachine
from pase.model.layers import FC, SoftmaxCrossEntropy
from pase.planning.mesh import parse_recipe
from pase.planning.pipeline import cuts, pipeline_rows, stage_layout
from pase.costing.training import TrainingCosting, TrainingOptions
from pase.planning.mesh_rows import PartsMemo
from pase.planning.training_search import search_meshes

from test_training import TOY  # the toy machine of round numbers

WIDTH = 64


def _net(batch=2, blocks=4):
    """embed -> block1.a -> block1.b -> ... -> head -> loss, FC layers of width 64."""
    g = GraphBuilder("chain", 1, batch=batch)
    x = g.input((batch, WIDTH), "x", letters="bk")
    x = g.add("embed", FC(x, WIDTH))
    for i in range(1, blocks + 1):
        with g.block():
            x = g.add(f"block{i}.a", FC(x, WIDTH))
            x = g.add(f"block{i}.b", FC(x, WIDTH))
    x = g.add("head", FC(x, WIDTH))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def _setup(micro_batches=4, blocks=4):
    machine = CalibratedMachine(TOY)
    net = _net(blocks=blocks)  # one micro-batch of 2 sequences
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, machine)
    options = TrainingOptions(microbatches=micro_batches, reserve_bytes=0.0)
    edges, targets = PartsMemo(machine, 1).edge_seconds(net, ones)
    return machine, net, costing, options, edges, targets


def _by_hand(costing, options, stages):
    """Per stage: one micro-batch's time, the per-step time, state, activations, logits."""
    out = []
    for members in stages:
        t = sum(costing.layer_time(v, options)["compute"][0] for v in members) / options.microbatches
        step = sum(costing.layer_time(v, options)["weight_sync"][0] + costing.layer_time(v, options)["optimizer"][0]
                   for v in members)
        mem = [costing.layer_memory(v, options, 2.0) for v in members]
        out.append((t, step, sum(m["model_state"][0] for m in mem), sum(m["activations"][0] for m in mem),
                    sum(m["logits"][0] for m in mem)))
    return out


# Sends between stages: the block output, 2 x 64 elements of 2 bytes, forward and backward,
# within a node at 100 GB/s.
P2P = 2 * (2 * WIDTH * 2) / 100e9


def test_two_stages_1f1b_by_hand():
    machine, net, costing, options, edges, targets = _setup()
    layout = stage_layout(costing.blocks)
    assert layout.pre == (0,) and layout.post == (9, 10) and len(layout.blocks) == 4
    step, peak, plans = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=["1f1b"],
                                      fixed_counts=(2, 2))
    stages = _by_hand(costing, options, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    t = [s[0] + P2P for s in stages]
    m, pp = 4, 2
    assert plans[0].microbatch_seconds == pytest.approx(t)
    # Stage s may synchronise during the drain: the last micro-batch's backward pass runs from the
    # last stage to the first, so stage s ends s backward slots (2/3 of t each) before stage 0.
    exposed = [max(0.0, s[1] - i * 2 / 3 * t[i]) for i, s in enumerate(stages)]
    assert step[0] == pytest.approx((m + pp - 1) * max(t) + max(exposed))
    assert plans[0].bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    # 1F1B: stage s holds min(pp - s, m) micro-batches of activations.
    memory = [stages[0][2] + 2 * stages[0][3] + stages[0][4], stages[1][2] + 1 * stages[1][3] + stages[1][4]]
    assert plans[0].memory_bytes == pytest.approx(memory)
    assert peak[0] == pytest.approx(max(memory))
    assert plans[0].p2p_seconds == pytest.approx(P2P)


def _tied_net(blocks=4, tied=True):
    """``_net`` with the embedding and the head sharing one 64 x 64 weight (``tied``), as a
    tied embedding and output head do; ``tied=False``: each its own."""
    g = GraphBuilder("tied chain", 1, batch=2)
    x = g.input((2, WIDTH), "x", letters="bk")
    names = ["table"] if tied else None
    x = g.add("embed", FC(x, WIDTH).share(tied=names))
    for i in range(1, blocks + 1):
        with g.block():
            x = g.add(f"block{i}.a", FC(x, WIDTH))
            x = g.add(f"block{i}.b", FC(x, WIDTH))
    x = g.add("head", FC(x, WIDTH).share(tied=names))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def _priced_pipeline(net, pp, counts):
    machine = CalibratedMachine(TOY)
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, machine)
    options = TrainingOptions(microbatches=4, reserve_bytes=0.0)
    edges, targets = PartsMemo(machine, 1).edge_seconds(net, ones)
    layout = stage_layout(costing.blocks)
    return pipeline_rows(costing, options, 2.0, edges, targets, pp, 1, layout, schedules=["1f1b"],
                         fixed_counts=counts)


def test_tied_weights_held_on_both_end_stages_by_hand():
    """Megatron-Core, nanotron and DeepSpeed keep a tied embedding on the first stage and a copy
    on the last, and all-reduce the copy's gradient between the two once a step. So a pipeline's
    stages hold what they hold with the weights untied (each end stage its own 64 x 64 weight,
    16 bytes an element: bf16 weight and gradient, fp32 master and moments), and its step is
    the untied step plus the all-reduce: two devices (1 device a stage, adjacent: inside a toy
    node, 100 GB/s, no latency), a ring of 2 moves the whole gradient once, 64 x 64 x 2 bytes
    (the options' bf16 gradient) / 100e9 = 8.192e-8 s."""
    step_t, peak_t, plans_t = _priced_pipeline(_tied_net(), 2, (2, 2))
    step_u, peak_u, plans_u = _priced_pipeline(_tied_net(tied=False), 2, (2, 2))
    assert plans_t[0].memory_bytes == pytest.approx(plans_u[0].memory_bytes, rel=1e-12)
    assert step_t[0] - step_u[0] == pytest.approx(64 * 64 * 2 / 100e9, rel=1e-9)
    # Without a pipeline the tied weight is one weight: 4,096 elements x 16 bytes fewer.
    machine = CalibratedMachine(TOY)
    options = TrainingOptions(microbatches=4, reserve_bytes=0.0)
    state = {}
    for tied in (True, False):
        net = _tied_net(tied=tied)
        ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
        costing = TrainingCosting(net, ones, machine)
        state[tied] = sum(costing.layer_memory(v, options, 2.0)["model_state"][0] for v in range(len(net.layers)))
    assert state[False] - state[True] == pytest.approx(64 * 64 * 16)


def test_each_stage_drains_as_the_schedule_runs_it():
    """The drain the model gives stage s (the backward passes it ends before the first stage,
    where its weight synchronisation may run) is what the 1F1B and interleaved schedules, run
    pass by pass (the report's ``schedule_ops``), show: the first stage ends last, stage s that
    many chunk backward passes (2/3 of t / v each) earlier."""
    from pase.outputs.report import schedule_ops
    for pp, m, v in ((2, 2, 1), (4, 8, 1), (4, 8, 2), (2, 4, 4)):
        t = 3.0  # a micro-batch's forward (1) and backward (2) on every stage, all chunks
        ends = {}
        for stage, _, _, _, _, end in schedule_ops(pp, m, v, [1.0 / v] * pp, [2.0 / v] * pp, 0.0):
            ends[stage] = max(ends.get(stage, 0.0), end)
        assert [ends[0] - ends[s] for s in range(pp)] == pytest.approx([s * 2 / 3 * t / v for s in range(pp)])


def test_interleaved_by_hand():
    machine, net, costing, options, edges, targets = _setup()
    layout = stage_layout(costing.blocks)
    step, peak, plans = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout,
                                      schedules=["interleaved"], fixed_counts=(2, 2))
    v, m, pp = 2, 4, 2
    stages = _by_hand(costing, options, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    t = [s[0] + v * P2P for s in stages]  # a micro-batch crosses v boundaries per stage each way
    assert plans[0].vpp == 2
    # Stage i ends i chunk backward passes (2/3 of t / v each) before stage 0.
    exposed = [max(0.0, s[1] - i * 2 / 3 * t[i] / v) for i, s in enumerate(stages)]
    assert step[0] == pytest.approx((m + (pp - 1) / v) * max(t) + max(exposed))
    factor = 1 + (pp - 1) / (pp * v)  # Korthikanti et al. 2022
    assert plans[0].memory_bytes[0] == pytest.approx(stages[0][2] + 2 * factor * stages[0][3] + stages[0][4])


def test_interleaved_sends_overlapped_by_hand():
    """Megatron's --overlap-p2p-communication: with two chunks per device, a stage's sends of
    a micro-batch (2 chunks x P2P, forward and backward) hide behind its compute of that
    micro-batch; what is hidden slows that compute by comm_sm_share. 1F1B still waits."""
    machine, net, costing, options, edges, targets = _setup()
    layout = stage_layout(costing.blocks)
    overlapped = options.but(p2p_overlap=True, comm_sm_share=0.1)
    stages = _by_hand(costing, overlapped, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    v = 2
    _, _, plans = pipeline_rows(costing, overlapped, 2.0, edges, targets, 2, 1, layout,
                                schedules=["interleaved"], fixed_counts=(2, 2))
    sends = v * P2P
    # Each stage computes far longer than it sends (checked): every send hidden, 0.1 of it
    # added, so t = compute + 0.1 x 2 x P2P.
    assert all(s[0] > sends for s in stages)
    assert plans[0].microbatch_seconds == pytest.approx([s[0] + 0.1 * sends for s in stages])
    assert plans[0].p2p_seconds == pytest.approx(0.1 * sends)
    _, _, one = pipeline_rows(costing, overlapped, 2.0, edges, targets, 2, 1, layout, schedules=["1f1b"],
                              fixed_counts=(2, 2))
    assert one[0].microbatch_seconds == pytest.approx([s[0] + P2P for s in stages])


def test_sends_longer_than_compute_stay_partly_exposed():
    from pase.planning.pipeline import exposed_sends
    o = TrainingOptions(p2p_overlap=True, comm_sm_share=0.1, overlap_efficiency=0.5)
    # compute 1 s hides at most 0.5 s of 2 s of sends: 1.5 exposed + 0.1 x 0.5 = 1.55.
    assert float(exposed_sends(np.array(1.0), np.array(2.0), 4, o)) == pytest.approx(1.55)
    assert float(exposed_sends(np.array(1.0), np.array(2.0), 4, o.but(p2p_overlap=False))) == pytest.approx(2.0)


def test_interleaved_stages_one_chunk_short_by_hand():
    """Stages of 2 and 4 blocks in 2 chunks each: chunks of 1, 1 | 2, 2 (one block apart at
    most: Megatron's layout runs them). Priced as equal chunks are: each stage its blocks, the
    micro-batch crossing 2 boundaries per stage each way, (m + (pp - 1)/v) x the slowest."""
    machine, net, costing, options, edges, targets = _setup(blocks=6)
    layout = stage_layout(costing.blocks)
    step, peak, plans = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout,
                                      schedules=["interleaved"], fixed_counts=(2, 4))
    assert plans[0].vpp == 2 and plans[0].counts == (2, 4)
    # Layers: embed 0, blocks 1-12 (two each), head 13, loss 14.
    stages = _by_hand(costing, options, [[0, 1, 2, 3, 4], list(range(5, 15))])
    v, m, pp = 2, 4, 2
    t = [s[0] + v * P2P for s in stages]
    assert plans[0].microbatch_seconds == pytest.approx(t)
    # Stage i ends i chunk backward passes (2/3 of t / v each) before stage 0.
    exposed = [max(0.0, s[1] - i * 2 / 3 * t[i] / v) for i, s in enumerate(stages)]
    assert step[0] == pytest.approx((m + (pp - 1) / v) * max(t) + max(exposed))
    # Stages of 1 and 5 blocks run no interleaving: 5 chunks of 1 would leave the first stage
    # four empty ones.
    _, _, none = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=["interleaved"],
                               fixed_counts=(1, 5))
    assert none[0] is None


def test_four_stages_and_uneven_cuts():
    machine, net, costing, options, edges, targets = _setup(micro_batches=8)
    layout = stage_layout(costing.blocks)
    step, peak, plans = pipeline_rows(costing, options, 2.0, edges, targets, 4, 1, layout, schedules=["1f1b"],
                                      fixed_counts=(1, 1, 1, 1))
    stages = _by_hand(costing, options, [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9, 10]])
    t = [s[0] + P2P for s in stages]
    exposed = [max(0.0, s[1] - (3 - i) * 2 / 3 * t[i]) for i, s in enumerate(stages)]
    assert step[0] == pytest.approx((8 + 3) * max(t) + max(exposed))
    assert plans[0].memory_bytes[3] == pytest.approx(stages[3][2] + 1 * stages[3][3] + stages[3][4])
    assert plans[0].memory_bytes[0] == pytest.approx(stages[0][2] + 4 * stages[0][3] + stages[0][4])
    # Uneven: the first stage with 1 block, the last with 3.
    step, peak, plans = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=["1f1b"],
                                      fixed_counts=(1, 3))
    stages = _by_hand(costing, options, [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9, 10]])
    assert plans[0].microbatch_seconds == pytest.approx([s[0] + P2P for s in stages])
    assert cuts(4, 2, 1) == [(2, 2), (1, 3), (3, 1)]


def test_stage_search_equals_brute_force_over_cuts_and_schedules():
    machine, net, costing, options, edges, targets = _setup()
    layout = stage_layout(costing.blocks)
    step, _, plans = pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout)
    best = min(
        pipeline_rows(costing, options, 2.0, edges, targets, 2, 1, layout, schedules=[s], fixed_counts=c)[0][0]
        for c in cuts(4, 2) for s in ("1f1b", "interleaved")
        if s == "1f1b" or len(set(c)) == 1
    )
    assert step[0] == pytest.approx(best)


def test_mesh_search_with_pipelines_and_bad_values():
    machine = CalibratedMachine(TOY)
    found = search_meshes(lambda n: _net(n), 8, 4, machine, None, 2.0, parse_recipe("pp=2,tp=1"))
    pipe = found.best.summary.extra["pipeline"]
    assert found.best.mesh.pp == 2 and pipe["pp"] == 2 and sum(st["blocks"] for st in pipe["stages"]) == 4
    assert [st["devices"] for st in pipe["stages"]] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="does not divide"):
        search_meshes(lambda n: _net(n), 8, 4, machine, None, 2.0, parse_recipe("pp=3"))
    with pytest.raises(ValueError, match="needs schedule=interleaved"):
        search_meshes(lambda n: _net(n), 8, 4, machine, None, 2.0, parse_recipe("pp=2,vpp=2,schedule=1f1b"))
    for text in ("pp=0", "vpp=x", "microbatch=-1", "schedule=gpipe"):
        with pytest.raises(ValueError):
            parse_recipe(text)


def test_dot_graph_colours_layers_by_stage(tmp_path):
    from cli_runner import run

    path = tmp_path / "g.dot"
    status, out, err = run("-g", "gpt2-small", "-p", 8, "-b", 16, "--machine", "h100-sxm",
                           "--recipe", "pp=2,tp=1,zero=1,recompute=none", "--dot-path", str(path))
    assert status == 0, err
    text = path.read_text()
    # The embedding on the first stage, the loss on the last, each stage its own fill.
    first = next(line for line in text.splitlines() if 'label="embedding' in line)
    last = next(line for line in text.splitlines() if 'label="loss' in line)
    assert "stage 0" in first and "stage 1" in last
    assert first.split("fillcolor=")[1] != last.split("fillcolor=")[1]
