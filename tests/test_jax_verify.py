"""Tests of ``pase.outputs.jax`` (verify, hlo): modelled bytes, the HLO collective parser, the result, and runs.

The first part needs no jax (byte formulas, parsing hand-written HLO, assembling a result).
The runs at the end execute plans on XLA host devices and are skipped without jax.
"""

import importlib.util
import json
import os

import numpy as np
import pytest

from graphs.transformer import multi_head
from pase import (
    FC,
    LSTM,
    BatchNorm,
    Concat,
    Conv,
    Einsum,
    Elementwise,
    Embedding,
    GraphBuilder,
    Machine,
    Norm,
    Pooling,
    ReduceMean,
    SoftmaxCrossEntropy,
    evaluate,
    plan,
)
from pase.planning.baselines import data_parallel
from pase.machines.base import Group
from pase.outputs.jax.common import INSTALL_HINT, JaxMissing, relative_error
from pase.outputs.jax.hlo import Collective, _attribution, _group_size, collective_bytes, parse_collectives
from pase.outputs.jax.verify import (
    TrafficMachine,
    VerifyTooLarge,
    _result,
    estimated_bytes,
    modelled_bytes,
    verify,
)


def _mlp(units=32):
    g = GraphBuilder("mlp")
    x = g.input((8, 16), "x", letters="bk")
    h = g.add("fc", FC(x, units))
    g.add("loss", SoftmaxCrossEntropy(h))
    return g.build()


# ---------------------------------------------------------------------------------------
# Modelled bytes


def test_traffic_machine_by_hand():
    m = TrafficMachine()
    # Ring all-reduce of 100 elements over 4 devices: 2 * 3/4 * 100 = 150 elements = 600 bytes.
    assert m.all_reduce(100.0, Group.flat(4)).tolist() == [600.0]
    assert m.all_reduce(100.0, Group.flat(1)).tolist() == [0.0]
    # Two configurations: 8 elements over 2 devices (8 elements, 32 bytes) and over 8 (14, 56).
    assert m.all_reduce(np.array([8.0, 8.0]), Group.flat(np.array([2, 8]))).tolist() == [32.0, 56.0]
    # An exchange moves its elements when the group has more than one device; redistribution always.
    assert m.exchange(np.array([10.0, 10.0]), Group.flat(np.array([1, 2]))).tolist() == [0.0, 40.0]
    assert float(m.redistribute(10.0, 8)) == 40.0
    # Computation is free.
    assert float(np.sum(m.gemm(2.0, 3.0, 4.0, 5.0))) == 0.0
    assert float(np.sum(m.memory_bound("add", np.array([5.0]), np.array([5.0])))) == 0.0


def test_modelled_bytes_by_hand():
    net = _mlp()
    # FC (b, n, k) = (8, 32, 16) split (2, 1, 1): only the weight gradient is reduced, over
    # m = 2: AR(Np Kp = 512, 2) = 2 * 1/2 * 512 = 512 elements = 2048 bytes.
    # Edge fc -> loss: output (8, 32) split (2, 1) needed whole: tgt 256, overlap 4 * 32 = 128,
    # volume 128 elements, forward and backward: 256 elements = 1024 bytes.
    layer, edge = modelled_bytes(net, [(2, 1, 1), (1, 1)], 2)
    assert layer.tolist() == [2048.0, 0.0]
    assert edge.tolist() == [0.0, 1024.0]
    # k split 2: the forward output (8 x 32 = 256 elements) is reduced: 256 elements = 1024 bytes.
    layer, edge = modelled_bytes(net, [(1, 1, 2), (1, 1)], 2)
    assert layer.tolist() == [1024.0, 0.0]
    assert edge.tolist() == [0.0, 0.0]


def test_modelled_bytes_agree_with_the_reference_cost_model():
    # Independent route: the communication part of a cost is linear in rho, so two machines
    # that differ only in bandwidth give words = (cost1 - cost2) / (rho1 - rho2).
    import graphs

    net = graphs.build("alexnet", 8)
    configs = plan(net, 8).configs
    fast, slow = Machine(10.0, 16.0), Machine(10.0, 8.0)
    a, b = evaluate(net, configs, slow), evaluate(net, configs, fast)
    words = (a.layer_costs - b.layer_costs) / (slow.rho - fast.rho)
    edge_words = (a.incident_edge_costs() - b.incident_edge_costs()) / (slow.rho - fast.rho)
    layer, edge = modelled_bytes(net, configs, 8)
    np.testing.assert_allclose(layer, 4.0 * words, rtol=1e-9, atol=1e-3)
    np.testing.assert_allclose(edge, 4.0 * edge_words, rtol=1e-9, atol=1e-3)
    assert layer.sum() > 0 and edge.sum() > 0


# ---------------------------------------------------------------------------------------
# Collectives in HLO text

HLO = """\
HloModule m, entry_computation_layout={(f32[16,8]{1,0})->f32[]}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %h = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %cp = f32[4,8]{1,0} collective-permute(%h), channel_id=1, source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(f)/jvp(L2.lstm)/while/body/pad"}
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %cp)
}

%cond (p.1: (s32[], f32[4,8])) -> pred[] {
  %p.1 = (s32[], f32[4,8]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[16,8], b: f32[8], x1: f32[8,8], x2: f32[8,8], init: (s32[], f32[4,8])) -> f32[] {
  %a = f32[16,8]{1,0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %x1 = f32[8,8]{1,0} parameter(2)
  %x2 = f32[8,8]{1,0} parameter(3)
  %init = (s32[], f32[4,8]{1,0}) parameter(4)
  %ar = f32[16,8]{1,0} all-reduce(%a), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(f)/jvp(L0.fc)/dot_general" stack_frame_id=3}
  %ag = f32[16,32]{1,0} all-gather(%ar), channel_id=3, replica_groups=[2,4]<=[8], dimensions={1}, metadata={op_name="jit(f)/transpose(jvp(L1.fc2))/out0/sharding_constraint"}
  %rs = f32[4,8]{1,0} reduce-scatter(%a), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, to_apply=%add, metadata={op_name="jit(f)/jvp(L1.fc2)/in0/sharding_constraint"}
  %a2a = (f32[8,8]{1,0}, f32[8,8]{1,0}) all-to-all(%x1, %x2), channel_id=5, replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]T(0,2,1)) {'axis_1':(2)2}, metadata={op_name="jit(f)/jvp(L1.fc2)/in0/sharding_constraint"}
  %s0 = f32[] constant(1)
  %tup = (f32[], f32[8]{0}) all-reduce(%s0, %b), channel_id=6, replica_groups={}, to_apply=%add, metadata={op_name="jit(f)/(jvp()/reduce_sum:transpose(jvp(L1.fc2))/dot_general)"}
  %g0 = f32[] get-tuple-element(%tup), index=0, metadata={op_name="jit(f)/jvp()/reduce_sum"}
  %g1 = f32[8]{0} get-tuple-element(%tup), index=1, metadata={op_name="jit(f)/transpose(jvp(L1.fc2))/dot_general"}
  %self = f32[16,8]{1,0} collective-permute(%a), channel_id=7, source_target_pairs={{0,0},{1,1}}, metadata={op_name="jit(f)/jvp(L0.fc)/out0/sharding_constraint"}
  %w = (s32[], f32[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %r = f32[] add(%g0, %g0)
}
"""


def test_parse_collectives_by_hand():
    got = {c.name: c for c in parse_collectives(HLO, 8)}
    assert set(got) == {"ar", "ag", "rs", "a2a", "tup#0", "tup#1", "self", "cp"}
    # %ar: 16 x 8 f32 = 512 bytes over groups of 4: 2 * 3/4 * 512 = 768.
    assert (got["ar"].kind, got["ar"].bytes, got["ar"].group) == ("all-reduce", 768.0, 4)
    assert (got["ar"].layer, got["ar"].backward, got["ar"].role) == (0, False, "layer")
    # %ag: 512 bytes in, groups of 4 ([2,4]: 2 groups of 4): (q-1) n_in = 1536 = 3/4 of the 2048 out.
    assert (got["ag"].bytes, got["ag"].group) == (1536.0, 4)
    assert (got["ag"].layer, got["ag"].backward, got["ag"].role, got["ag"].slot) == (1, True, "out", 0)
    # %rs: 512 bytes in over the 4 devices of axis_1: 3/4 * 512 = 384.
    assert (got["rs"].kind, got["rs"].bytes, got["rs"].group) == ("reduce-scatter", 384.0, 4)
    assert (got["rs"].role, got["rs"].slot) == ("in", 0)
    # %a2a: two 256-byte operands (512) over a sub-axis of 2: 1/2 * 512 = 256.
    assert (got["a2a"].kind, got["a2a"].bytes, got["a2a"].group) == ("all-to-all", 256.0, 2)
    # %tup: over all 8 devices ({}): the scalar 2 * 7/8 * 4 = 7, the f32[8] 2 * 7/8 * 32 = 56;
    # each attributed by the get-tuple-element that reads it.
    assert (got["tup#0"].bytes, got["tup#0"].layer) == (7.0, None)
    assert (got["tup#1"].bytes, got["tup#1"].layer, got["tup#1"].backward) == (56.0, 1, True)
    # Every device keeps its own data: nothing moves.
    assert got["self"].bytes == 0.0
    # Inside the loop body: 4 x 8 f32 = 128 bytes, five times.
    assert (got["cp"].bytes, got["cp"].count, got["cp"].layer, got["cp"].total) == (128.0, 5, 2, 640.0)
    assert all(got[n].count == 1 for n in got if n != "cp")


@pytest.mark.parametrize(
    "attrs, q",
    [
        ("replica_groups={{0,2,4,6},{1,3,5,7}}, to_apply=%add", 4),
        ("replica_groups={{0},{1}}", 1),
        ("replica_groups={}, to_apply=%add", 8),
        ("channel_id=1, to_apply=%add", 8),
        ("replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true", 2),
        ("replica_groups=[1,8]<=[8]", 8),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}, use_global_device_ids=true", 2),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0','axis_2'}", 8),
        ("replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}, x=1", 2),
    ],
)
def test_group_size_formats(attrs, q):
    assert _group_size(attrs, 8) == q


def test_attribution_of_op_names():
    assert _attribution("jit(f)/jvp(L12.enc1.ff.up)/dot_general") == (12, False, "layer", None)
    assert _attribution("jit(f)/transpose(jvp(L3.x))/in1/add_any") == (3, True, "in", 1)
    assert _attribution("jit(f)/transpose(jvp(L3.x))/out0/sharding_constraint") == (3, True, "out", 0)
    # A layer whose name looks like a scope is still the outer one; w<i> is the layer's own.
    assert _attribution("jit(f)/jvp(L7.L3.x)/w0/sharding_constraint") == (7, False, "layer", None)
    assert _attribution("jit(f)/jvp()/reduce_sum") == (None, False, "layer", None)
    assert _attribution(None) == (None, False, "layer", None)


def test_collective_bytes_puts_edges_on_the_reader():
    net = _mlp()  # fc (0) -> loss (1)
    records = [
        Collective("all-reduce", 100.0, 1, 2, 0, False, "layer", None, "a"),  # fc's own, forward
        Collective("all-reduce", 10.0, 3, 2, 0, True, "layer", None, "b"),  # fc's own, backward, 3 times
        Collective("all-gather", 50.0, 1, 2, 1, False, "in", 0, "c"),  # loss's input: edge fc -> loss
        Collective("all-gather", 7.0, 1, 2, 0, True, "out", 0, "d"),  # fc's output gradient: same edge
        Collective("all-to-all", 5.0, 1, 2, None, False, "layer", None, "e"),  # no scope
        Collective("collective-permute", 0.0, 1, 2, 1, False, "in", 0, "f"),  # moves nothing: not counted
    ]
    sums = collective_bytes(records, net)
    assert sums["layer_forward"].tolist() == [100.0, 0.0]
    assert sums["layer_backward"].tolist() == [30.0, 0.0]
    assert sums["edge_forward"].tolist() == [0.0, 50.0]
    assert sums["edge_backward"].tolist() == [0.0, 7.0]
    assert sums["unattributed"] == 5.0
    assert sums["kinds"] == [{"all-reduce": 4}, {"all-gather": 2}]


# ---------------------------------------------------------------------------------------
# The result


def testrelative_error_by_hand():
    # max |diff| = 0.5, max |reference| = 2.
    assert relative_error([1.0, 2.5], [1.0, 2.0]) == 0.25
    assert relative_error(3.0, 3.0) == 0.0
    assert relative_error([0.0, 1e-3], [0.0, 0.0]) == 1e-3  # no scale: the absolute error
    # A tiny reference is compared at the floor: |diff| 1e-8 over max(1e-8, 1e-6) = 1e-2.
    assert relative_error([2e-8], [1e-8], floor=1e-6) == pytest.approx(1e-2)
    assert relative_error([1.5], [1.0], floor=1e-6) == 0.5  # the floor is below the scale: no effect


def _fake_output(errors):
    return {
        "loss": 2.0, "loss_reference": 2.0, "loss_error": 0.0,
        "gradients": [[f"w{i}", [4, 4], e] for i, e in enumerate(errors)],
        "seconds": {"compile": 1.0, "run": 0.5, "reference": 0.5, "total": 3.0},
        "jax_version": "test", "notes": ["a note"],
        "collectives": [Collective("all-reduce", 96.0, 1, 2, 0, False, "layer", None, "x").__dict__],
    }


def test_result_fails_on_any_gradient_over_the_tolerance():
    net = _mlp()
    layer, edge = modelled_bytes(net, [(2, 1, 1), (1, 1)], 2)
    good = _result(net, [(2, 1, 1), (1, 1)], 2, _fake_output([1e-6, 5e-5]), layer, edge, 0, 1e-4)
    bad = _result(net, [(2, 1, 1), (1, 1)], 2, _fake_output([1e-6, 2e-4]), layer, edge, 0, 1e-4)
    assert good.ok and not bad.ok
    assert bad.max_error == 2e-4
    assert "FAILED" in bad.table() and "gradient of w1" in bad.table()
    assert "OK" in good.table() and "note: a note" in good.table()
    d = bad.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["ok"] is False and d["worst_gradient"] == {"name": "w1", "error": 2e-4}
    assert d["modelled_bytes"] == 2048.0 + 1024.0 and d["xla_bytes"] == 96.0
    assert d["layers"][0]["xla_layer_bytes"] == {"forward": 96.0, "backward": 0.0}
    assert d["by_op"]["FC"]["modelled_layer"] == 2048.0


def test_verify_says_how_to_install_jax(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))
    with pytest.raises(JaxMissing, match=r"pip install '\.\[jax\]'"):
        verify(_mlp(), [(1, 1, 1), (1, 1)], 2)
    assert INSTALL_HINT == "jax is not installed: pip install '.[jax]'"


def test_estimated_bytes_by_hand():
    # mlp: FC output (8, 32) = 256 elements, loss output (8, 32) = 256; weight (32, 16) = 512.
    # Plan: FC split (2, 1, 1) (each device 128 output elements, the whole weight), loss unsplit,
    # on 2 devices. Sharded outputs: (128 + 256) * 2 devices = 768 > the reference's 512.
    # Weights: 512 on each of 2 devices plus the reference's 512 = 1536.
    # 4 bytes * 2 * (768 + 1536) = 18432.
    assert estimated_bytes(_mlp(), [(2, 1, 1), (1, 1)], 2) == 18432.0


def test_verify_refuses_a_run_over_the_memory_budget(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "jax" else real(name, *a))
    with pytest.raises(VerifyTooLarge, match=r"needs about 18\.4 KB .* over the budget of 1 KB; shrink"):
        verify(_mlp(), [(2, 1, 1), (1, 1)], 2, memory_budget=1000)


@pytest.mark.parametrize(
    "code, stderr, message",
    [(-9, b"", r"was killed \(out of memory\?\); shrink"), (1, b"Traceback\nValueError: boom", "failed:\nTraceback\nValueError: boom")],
)
def test_a_failed_child_is_one_clear_error(monkeypatch, code, stderr, message):
    import subprocess

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "jax" else real(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, code, b"", stderr))
    with pytest.raises(RuntimeError, match=message):
        verify(_mlp(), [(2, 1, 1), (1, 1)], 2)


# ---------------------------------------------------------------------------------------
# Runs on XLA host devices (jax needed)


def _cnn():
    """Every CNN layer type: Conv (stride, padding, pw), BatchNorm, Pooling, Concat,
    Elementwise, ReduceMean, a Reshape (Ravel, Unravel), FC and the loss."""
    g = GraphBuilder("cnn", cutoff=1)
    x = g.input((8, 4, 12, 12), "image", letters="bchw")
    x = g.add("conv1", Conv(x, 8, 3, stride=2, pad=1, pw=1))  # (8, 8, 6, 6)
    x = g.add("bn", BatchNorm(x))
    pool = g.add("pool", Pooling(x, 3, stride=1, pad=1))
    b1 = g.add("b1", Conv(pool, 4, 1))
    b2 = g.add("b2", Conv(pool, 4, 3, pad=1))
    cat = g.add("cat", Concat([b1, b2], axis=1))
    y = g.add("add", Elementwise(cat, pool, pw=1))
    mean = g.add("mean", ReduceMean(y, (2, 3)))
    flat = g.reshape("flat", y, (8, 8 * 6 * 6), letters="bk")
    f1 = g.add("fc1", FC(flat, 10))
    f2 = g.add("fc2", FC(mean, 10, pw=1))
    logits = g.add("logits", Elementwise(f1, f2))
    g.add("loss", SoftmaxCrossEntropy(logits))
    return g.build()


def _attention():
    """Embedding, Elementwise, Norm, Einsum with weights and without, Stack, Unstack, Softmax."""
    g = GraphBuilder("attn", cutoff=1)
    ids = g.input((4, 8), "ids", letters="bl")
    pos = g.input((4, 8, 16), "position", letters="ble")
    x = g.add("emb", Embedding(ids, 40, 16, letters="bl"))
    x = g.add("pos", Elementwise(x, pos))
    x = g.add("norm", Norm(x, axis=-1))
    a = multi_head(g, "self", [x], 2, 8)
    a = g.add("res", Elementwise(x, a))
    c = multi_head(g, "cross", [a, x, x], 2, 8)
    w = g.weight((16, 40), "out", letters="ev")
    logits = g.add("logits", Einsum("ble,ev->blv", c, w))
    g.add("loss", SoftmaxCrossEntropy(logits))
    return g.build()


def _lstm():
    g = GraphBuilder("lm", cutoff=1)
    ids = g.input((4, 6), "ids", letters="bs")
    x = g.add("emb", Embedding(ids, 30, 8))
    x = g.add("lstm", LSTM(x, 2))
    x = g.add("fc", FC(x, 30))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def _random_plan(net, procs, seed):
    """A random configuration per layer among those whose device count divides ``procs``,
    preferring ones that use every device (a stress test of the layouts)."""
    rng = np.random.RandomState(seed)
    plan = []
    for C in net.configs(procs):
        used = C.prod(axis=1)
        full = C[used == procs]
        pool = full if len(full) and rng.rand() < 0.8 else C[procs % used == 0]
        plan.append(tuple(int(c) for c in pool[rng.randint(len(pool))]))
    return plan


@pytest.fixture(scope="module")
def jax_available():
    pytest.importorskip("jax")


@pytest.mark.parametrize("build", [_cnn, _attention, _lstm], ids=["cnn", "attention", "lstm"])
def test_plans_run_and_match_the_unsharded_numbers(jax_available, build):
    from concurrent.futures import ThreadPoolExecutor

    net = build()
    flags = os.environ.get("XLA_FLAGS")
    plans = (plan(net, 4).configs, _random_plan(net, 4, 1))
    with ThreadPoolExecutor(len(plans)) as pool:  # each verify is a child process: run both at once
        results = list(pool.map(lambda configs: verify(net, configs, 4, seed=3), plans))
    for result in results:
        assert result.ok, result.table()
        assert result.max_error <= 1e-4
        assert len(result.gradients) == sum(len(layer.parameters()) for layer in net.layers)
        assert np.isfinite(result.loss) and result.loss > 0
    assert os.environ.get("XLA_FLAGS") == flags  # the device count stays in the child


def test_lstm_layer_split_is_a_pipeline(jax_available):
    # L split 2 with n and k split too: the wavefront's shift between layers, the hand-over
    # inside a layer, all under a loop.
    net = _lstm()
    configs = [(1, 1, 1, 1), (2, 1, 1, 1, 2), (1, 1, 1, 1), (1, 1, 1)]  # emb, lstm (L s b n k), fc, loss
    result = verify(net, configs, 4)
    assert result.ok, result.table()
    lstm = result.layers[1]
    assert lstm.xla_layer > 0 and "collective-permute" in lstm.collectives


def test_fc_collectives_match_the_model_by_hand(jax_available):
    # FC (b, n, k) = (8, 32, 16) split k = 2 on 2 devices. The model: the forward output is
    # all-reduced, AR(8 x 32 = 256 elements, 2) = 256 elements = 1024 bytes; the input and
    # weight gradients stay local. XLA must insert exactly that all-reduce.
    net = _mlp()
    result = verify(net, [(1, 1, 2), (1, 1)], 2)
    assert result.ok
    fc, loss = result.layers
    assert fc.modelled_layer == 1024.0
    assert (fc.xla_layer_forward, fc.xla_layer_backward) == (1024.0, 0.0)
    assert fc.collectives == {"all-reduce": 1}
    assert loss.xla == 0.0 and result.unattributed == 0.0
    # In float64 every element is 8 bytes, on both sides, and the numbers agree far closer.
    wide = verify(net, [(1, 1, 2), (1, 1)], 2, dtype="float64")
    assert wide.dtype == "float64" and wide.ok and wide.max_error < 1e-12
    assert (wide.layers[0].modelled_layer, wide.layers[0].xla_layer_forward) == (2048.0, 2048.0)


def test_verify_rejects_an_unknown_dtype():
    with pytest.raises(ValueError, match="dtype must be one of float32, float64"):
        verify(_mlp(), [(1, 1, 2), (1, 1)], 2, dtype="bfloat16")


def test_edge_redistribution_lands_on_the_reader(jax_available):
    # fc1 splits the batch (its output (8, 32) split (2, 1)); fc2 splits its units, so it reads
    # the whole (8, 32): XLA all-gathers it, 1/2 of 1024 bytes = 512, on fc2's edge. The model
    # charges the 128 missing elements forward and backward: 256 elements = 1024 bytes.
    g = GraphBuilder("two")
    h = g.add("fc1", FC(g.input((8, 16), "x"), 32))
    h = g.add("fc2", FC(h, 16))
    g.add("loss", SoftmaxCrossEntropy(h))
    result = verify(g.build(), [(2, 1, 1), (1, 2, 1), (1, 1)], 2)
    assert result.ok
    fc2 = result.layers[1]
    assert fc2.modelled_edge == 1024.0
    assert fc2.xla_edge_forward == 512.0


def test_data_parallel_alexnet_small(jax_available):
    import graphs

    net = graphs.build("alexnet", 4)
    result = verify(net, data_parallel(net, 4), 4)
    assert result.ok, result.table()
    # Data parallelism: only weight gradients are reduced, once each, as the model says.
    for layer in result.layers:
        if layer.op in ("Conv", "FC"):
            assert layer.ratio == pytest.approx(1.0, rel=1e-9), layer


def test_verify_refuses_a_plan_jax_cannot_shard(jax_available):
    g = GraphBuilder("wide")
    h = g.add("fc", FC(g.input((6, 4), "x"), 4))
    g.add("loss", SoftmaxCrossEntropy(h))
    with pytest.raises(ValueError, match="does not divide 4"):
        verify(g.build(), [(3, 1, 1), (1, 1)], 4)


SNIPPET = """
import json, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

plan = json.load(open(sys.argv[1]))
mesh = Mesh(np.array(jax.devices()[: plan["procs"]]).reshape(plan["mesh"]["axis_sizes"]),
            plan["mesh"]["axis_names"])

def sharding(spec):
    return NamedSharding(mesh, PartitionSpec(*(tuple(e) if e else None for e in spec)))

fc = {layer["name"]: layer for layer in plan["layers"]}["fc"]
w = jax.device_put(np.zeros(fc["weights"][0]["shape"], np.float32), sharding(fc["weights"][0]["spec"]))
print(sorted({tuple(s.data.shape) for s in w.addressable_shards}), len(w.addressable_shards))
"""


def test_readme_snippet_applies_an_export(jax_available, tmp_path):
    # The README's way of applying an export, on 4 devices: FC (b, n, k) split (1, 2, 2) puts
    # its (32, 16) weight in (16, 8) blocks, one per device.
    import subprocess
    import sys

    from pase.outputs.jax.export import export_shardings

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(export_shardings(_mlp(), [(1, 2, 2), (1, 1)], 4)))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SNIPPET, str(path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[(16,", "8)]", "4"]


def test_a_network_read_from_a_graph_file_runs(jax_available):
    # A model source other than the built-in builders (a JSON graph file, the format the
    # PyTorch importer's graphs are written in) rebuilds every layer from its args.
    from pase.sources.graph_json import network_from_json, network_to_json

    net = network_from_json(json.loads(json.dumps(network_to_json(_lstm()))))
    result = verify(net, plan(net, 4).configs, 4)
    assert result.ok, result.table()
    assert [l.op for l in result.layers] == ["Embedding", "LSTM", "FC", "SoftmaxCrossEntropy"]


def test_verify_takes_a_plan(jax_available):
    found = plan(_mlp(), 2)
    result = verify(found)
    assert result.ok and result.procs == 2
    assert [l.config for l in result.layers] == [tuple(c) for c in found.configs]
