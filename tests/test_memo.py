"""OptionsMemo: results kept by the option fields a function read, and the training costing's
vectors taken from it equal to a fresh costing's under every option set."""

import numpy as np

from pase.core.memo import OptionsMemo, recording
from pase.costing.training import LAYER_VECTORS, TrainingCosting, TrainingOptions
from pase.planning.mesh_rows import PartsMemo

from pase.machines.calibrated import CalibratedMachine

from test_pipeline import _net, TOY


def test_kept_by_the_fields_read():
    memo = OptionsMemo()
    calls = []

    def state(o):  # reads the ZeRO stage only
        calls.append(o.zero)
        return [o.zero * 10]

    a = memo.get("state", TrainingOptions(zero=1, recompute="none"), state)
    b = memo.get("state", TrainingOptions(zero=1, recompute="full", microbatches=4), state)
    assert a is b and a == [10] and calls == [1]  # recompute and micro-batches were not read
    c = memo.get("state", TrainingOptions(zero=2), state)
    assert c == [20] and calls == [1, 2]
    # Another key is another function.
    assert memo.get("other", TrainingOptions(zero=1), lambda o: [o.microbatches]) == [1]


def test_methods_and_branches_are_recorded():
    memo = OptionsMemo()

    def per_parameter(o):  # bytes_per_parameter reads zero and the three element sizes
        return float(o.bytes_per_parameter(4))

    # 2 + 2 + 12 / 4 = 7 at ZeRO-1; 2 + (2 + 12) / 4 = 5.5 at ZeRO-2.
    assert memo.get("bpp", TrainingOptions(zero=1), per_parameter) == 7.0
    assert memo.get("bpp", TrainingOptions(zero=2), per_parameter) == 5.5
    assert memo.get("bpp", TrainingOptions(zero=1, optimizer_bytes=4.0), per_parameter) == 5.0  # 2 + 2 + 4/4

    def branch(o):  # BF16 reads no stage; another format does
        return "plain" if o.precision == "bf16" else f"{o.precision}-{o.zero}"

    assert memo.get("b", TrainingOptions(precision="bf16", zero=1), branch) == "plain"
    assert memo.get("b", TrainingOptions(precision="bf16", zero=3), branch) == "plain"
    assert memo.get("b", TrainingOptions(precision="fp8", zero=1), branch) == "fp8-1"
    assert memo.get("b", TrainingOptions(precision="fp8", zero=3), branch) == "fp8-3"
    # Every field read through __dict__: any difference is another result.
    whole = memo.get("d", TrainingOptions(), lambda o: [len(o.__dict__)])
    assert memo.get("d", TrainingOptions(engine="x"), lambda o: [len(o.__dict__)]) is not whole


def test_inside_a_computation_the_inner_fields_count():
    memo = OptionsMemo()
    seen, inner_calls = [], []

    def inner(p):
        inner_calls.append(p.zero)
        return [p.zero]

    def outer(o):  # reads nothing itself: what the inner result read is its dependency
        seen.append(recording(o))
        return memo.get("inner", o, inner) + [0]

    assert memo.get("outer", TrainingOptions(zero=1), outer) == [1, 0]
    assert memo.get("outer", TrainingOptions(zero=2), outer) == [2, 0]  # not the zero=1 result
    assert memo.get("outer", TrainingOptions(zero=2, recompute="full"), outer) == [2, 0]
    assert seen == [True, True] and inner_calls == [1, 2]
    assert memo.get("inner", TrainingOptions(zero=1), inner) == [1] and inner_calls == [1, 2]  # kept


def test_costing_vectors_equal_a_fresh_costings():
    machine = CalibratedMachine(TOY)
    net = _net(blocks=4)
    # Two rows per layer: one device, and the batch split over two.
    rows = [np.array([[1] * len(layer.domain), [2] + [1] * (len(layer.domain) - 1)], dtype=np.int64)
            for layer in net.layers]
    settings = [TrainingOptions(zero=z, recompute=r, microbatches=m, tp_overlap=t)
                for z in (0, 1, 2, 3) for r in ("none", "selective", "full") for m in (1, 4) for t in (False, True)]
    shared = TrainingCosting(net, rows, machine)
    edges, targets = PartsMemo(machine, 2).edge_seconds(net, rows)
    for options in settings:
        fresh = TrainingCosting(net, rows, machine)
        got, want = shared.layer_vectors(options, 2.0), fresh.layer_vectors(options, 2.0)
        # Every vector (the copies' only where a pipeline's last stage holds one: none here).
        assert set(got) == set(want) == {n for n in LAYER_VECTORS if not n.startswith("copy_")}
        for name in got:
            assert np.array_equal(got[name], want[name]), (options, name)
        assert np.array_equal(shared.edge_rows(edges, targets, options), fresh.edge_rows(edges, targets, options))
        assert np.array_equal(shared.transient_rows(got, options), fresh.transient_rows(want, options))
    # ZeRO-1 and ZeRO-2 hold other model state, and the same activations (one array).
    one = shared.layer_vectors(settings[0], 2.0)
    two = shared.layer_vectors(TrainingOptions(zero=1), 2.0)
    assert one["activations"] is two["activations"] and not np.array_equal(one["state"], two["state"])


def test_columns_of_a_larger_costing_price_as_a_costing_of_those_rows():
    """The mesh search prices each (stage count, micro-batch) on columns of one costing of every
    mesh of the network: the same numbers as a costing of those rows alone."""
    from pase.planning.pipeline import pipeline_rows_settings, stage_layout
    from pase.planning.mesh_rows import row_totals

    machine = CalibratedMachine(TOY)
    net = _net(blocks=4)
    # Three rows per layer: one device, the batch over two, the last dimension over two.
    rows = [np.array([[1] * len(layer.domain), [2] + [1] * (len(layer.domain) - 1),
                      [1] * (len(layer.domain) - 1) + [2]], dtype=np.int64) for layer in net.layers]
    scale = np.array([[1.0, 0.5, 1.0]] * len(net.layers))
    columns = np.array([0, 2])
    whole = TrainingCosting(net, rows, machine)
    whole.activation_scale = scale
    alone = TrainingCosting(net, [r[columns] for r in rows], machine)
    alone.activation_scale = scale[:, columns]
    edges, targets = PartsMemo(machine, 2).edge_seconds(net, [r[columns] for r in rows])
    settings = [TrainingOptions(zero=z, recompute=r, microbatches=4, tp_overlap=t)
                for z in (0, 3) for r in ("none", "full") for t in (False, True)]
    layout = stage_layout(whole.blocks)
    got = pipeline_rows_settings(whole, settings, 2.0, edges, targets, 2, 1, layout, columns=columns)
    want = pipeline_rows_settings(alone, settings, 2.0, edges, targets, 2, 1, layout)
    for (step, peak, plans), (step2, peak2, plans2) in zip(got, want):
        assert step.tolist() == step2.tolist() and peak.tolist() == peak2.tolist() and plans == plans2
    for options in settings:
        assert np.array_equal(whole.edge_rows(edges, targets, options, columns),
                              alone.edge_rows(edges, targets, options))
        a = row_totals(whole, options, 2.0, edges, targets, columns=columns)
        b = row_totals(alone, options, 2.0, edges, targets)
        assert all(x.tolist() == y.tolist() for x, y in zip(a, b))
    # Priced on other columns, the numbers differ (the test can tell them apart).
    other = pipeline_rows_settings(whole, settings, 2.0, edges, targets, 2, 1, layout, columns=np.array([0, 1]))
    assert any(x[0].tolist() != y[0].tolist() for x, y in zip(other, want))
