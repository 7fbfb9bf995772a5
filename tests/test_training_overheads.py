"""Hand-worked values of the mechanisms the published runs need (issue 21): torchtitan's
operator-level recomputation, eager RMSNorm, tensor-parallel overlap, interleaved chunks'
gradient queue, gradient buckets, loss buffers, the launch floor, and their recipe keys."""

import numpy as np
import pytest

from pase.costing.training import (
    EAGER_NORM_BYTES, EAGER_NORM_SAVED, KERNELS_PER_LAYER, TrainingCosting, TrainingOptions,
)
from pase.machines.calibrated import CalibratedMachine
from pase.model.builder import GraphBuilder
from pase.model.layers import FC, RMSNorm, SoftmaxCrossEntropy
from pase.planning.mesh import parse_recipe
from pase.planning.pipeline import chunk_sync

#: Round numbers, as tests/test_training.py's toy: 1 TFLOPS, 1 GB/s of memory, 2-byte
#: activations, 4-byte gradients; links and latencies set per test.
BASE = {"name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
        "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
        "act_bytes": 2, "grad_bytes": 4}


def machine(**links):
    return CalibratedMachine({**BASE, **links})


def _ones(net):
    return [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]


#: An MLP's input product (batch, mlp, model) and its output product (batch, model, mlp).
MLP_IN, MLP_OUT = ("batch", "mlp", "model"), ("batch", "model", "mlp")


def _blocks_of_four(roles=(MLP_IN, MLP_OUT, MLP_IN, MLP_OUT)):
    """Two blocks of four FC layers of width 64 (batch 8), then the loss; each block two MLPs
    (in, out, in, out) unless ``roles`` says otherwise."""
    g = GraphBuilder("four", 1, batch=8)
    x = g.input((8, 64), "x", letters="bk")
    for i in (1, 2):
        with g.block():
            for name, r in zip("abcd", roles):
                x = g.add(f"block{i}.{name}", FC(x, 64), roles=r)
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def test_op_recomputation_keeps_products_by_role():
    net = _blocks_of_four()
    costing = TrainingCosting(net, _ones(net), machine())
    op = TrainingOptions(recompute="op")
    # By OP_POLICY_KEEPS: a is the block's first MLP input product (kept), b and d MLP output
    # products (kept), c another MLP input product (recomputed, as torchtitan's Llama up
    # projection); d is the block's output, kept as the next block's input anyway; block2.d is
    # read by the loss alone (its buffers stand for it).
    assert costing.op_roles()[0] == ("mlp_first_input",) and costing.op_roles()[2] == ("mlp_input",)
    assert list(costing.op_saved) == [True, True, False, True] * 2 + [False]
    kept = [costing.stored_activations(v, op)[0] for v in range(9)]
    assert kept == [512.0, 512.0, 0.0, 512.0, 512.0, 512.0, 0.0, 0.0, 0.0]  # 8 x 64 each
    again = costing.recomputed_mask(op)
    assert list(again) == [False, False, True, False] * 2 + [False]
    # c's forward again: one third of 6 x 8 x 64 x 64 / 1e12 s = 6.5536e-8 s; nothing else.
    assert costing.layer_time(2, op)["recompute"][0] == pytest.approx(6 * 8 * 64 * 64 / 1e12 / 3)
    assert costing.layer_time(0, op)["recompute"][0] == 0.0
    # The working set while a block runs again: c's 512 outputs at 2 bytes.
    assert costing.transient_bytes([0] * 9, op, act_bytes=2.0)["recompute_working_set"] == 1024.0
    vectors = costing.layer_vectors(op, 2.0)
    # The search's vectors (one representative per group of equal layers) agree: a and c are
    # the same kind of layer and differ only in what the policy keeps.
    assert list(vectors["activations"][:, 0]) == [2.0 * k for k in kept]
    assert costing.transient_rows(vectors, op)[0] == pytest.approx(op.reserve_bytes + 1024.0)


def _op_choice(spec, model):
    """``{name in the first block: kept}`` of every weight product of ``spec`` under ``op``."""
    from pase.sources.registry import load
    net = load(spec, 2, model)
    costing = TrainingCosting(net, _ones(net), machine())
    roles = costing.op_roles()
    first = costing.blocks[min(roles)]
    return {net.names[v].rsplit(".", 1)[-1]: bool(costing.op_saved[v]) for v in sorted(roles)
            if costing.blocks[v] == first}


def test_op_policy_on_a_llama_block_is_torchtitans():
    # torchtitan counts a Llama block's mm's wq, wk, wv, wo, w1, w3, w2 and keeps the odd ones:
    # q, v, gate (w1) and down (w2); by role: query, value, the MLP's first input product and its
    # output product kept; key, attention output and the other input product recomputed.
    expected = {"q": True, "k": False, "v": True, "out": False, "gate": True, "up": False, "down": True}
    assert _op_choice("llama3-8b", 64) == expected
    assert _op_choice("hf:examples/hf/llama-3.1-8b.json", 64) == expected


def test_op_policy_on_a_fused_qkv_block_and_latent_attention():
    # GPT-2: the fused q/k/v product makes the query (kept), the output projection is
    # recomputed, the plain MLP's one input product is its first (kept), its output kept.
    assert _op_choice("gpt2-small", 64) == {"qkv": True, "out": False, "up": True, "down": True}
    # DeepSeek-V3's first (dense) block: the latent projections q_a and kv_a kept, q (query) and
    # v (value) kept, both key products (the rotary part from the model width, the rest from
    # the latent) recomputed, then as Llama.
    assert _op_choice("deepseek-v3", 64) == {
        "q_a": True, "q": True, "kv_a": True, "k_rope": False, "k_nope": False, "v": True, "out": False,
        "gate": True, "up": False, "down": True}


def test_op_policy_recomputes_products_it_does_not_name():
    # FCs with no roles at all: no role the table names, so nothing is kept but the block's
    # output (which every policy keeps).
    net = _blocks_of_four(roles=(None,) * 4)
    costing = TrainingCosting(net, _ones(net), machine())
    assert set(costing.op_roles().values()) == {()}
    assert not costing.op_saved.any()
    op = TrainingOptions(recompute="op")
    assert list(costing.recomputed_mask(op)) == [True, True, True, False] * 2 + [False]


def _norm_net():
    g = GraphBuilder("norm", 1, batch=8)
    x = g.input((8, 64), "x", letters="bd")
    g.add("norm", RMSNorm(x, axis=1))
    return g.build()


def test_eager_rmsnorm_moves_its_unfused_bytes():
    net = _norm_net()
    costing = TrainingCosting(net, _ones(net), machine())
    fused, eager = TrainingOptions(), TrainingOptions(eager=True)
    # Fused: 5 element passes of 512 elements at 2 bytes over 1 GB/s = 5.12e-6 s. Eager: 100
    # bytes per element = 5.12e-5 s (priced as copies: 4 passes x 2 bytes of 6400 elements).
    assert costing.compute(0, fused)[0] == pytest.approx(5 * 512 * 2 / 1e9)
    assert EAGER_NORM_BYTES == 100.0
    assert costing.compute(0, eager)[0] == pytest.approx(100 * 512 / 1e9)
    # Its backward keeps the fp32 input and the cast output: 3 outputs' worth.
    assert costing.stored_activations(0, eager)[0] == EAGER_NORM_SAVED * 512 == 1536.0


def test_launch_floor():
    net = _norm_net()
    costing = TrainingCosting(net, _ones(net), machine())
    # 5.12e-6 s of work; 3 kernels x 4 us = 1.2e-5 s floor; eager: 19 x 4 us = 7.6e-5 s.
    assert costing.compute(0, TrainingOptions(launch_seconds=4e-6))[0] == pytest.approx(KERNELS_PER_LAYER * 4e-6)
    assert costing.compute(0, TrainingOptions(launch_seconds=4e-6, eager=True))[0] == pytest.approx(19 * 4e-6)
    assert costing.compute(0, TrainingOptions(launch_seconds=1e-7))[0] == pytest.approx(5.12e-6)


def _fc_net():
    g = GraphBuilder("fc", 1, batch=8)
    x = g.input((8, 1000), "x", letters="bk")
    g.add("fc", FC(x, 500))
    return g.build()


def test_tp_overlap_hides_collectives_behind_their_gemm():
    # FC 8 x 1000 -> 500 with its 1000 inputs split 2 ways: per device 8 x 500 x 500, 6 BMNK /
    # 1e12 = 1.2e-5 s; its output all-reduced over 2 devices at 1 GB/s: 2 (1/2) 4000 x 2 B /
    # 1e9 = 8e-6 s.
    costing = TrainingCosting(_fc_net(), [np.array([[1, 1, 2]])], machine(intra_node={"gbps": 1, "latency_us": 0}))
    assert costing.compute(0, TrainingOptions())[0] == pytest.approx(1.2e-5)
    assert costing.exposed_activation(0, TrainingOptions())[0] == pytest.approx(8e-6)
    half = TrainingOptions(tp_overlap=True, overlap_efficiency=0.5)
    assert costing.exposed_activation(0, half)[0] == pytest.approx(8e-6 - 0.5 * 1.2e-5)  # 2e-6
    whole = TrainingOptions(tp_overlap=True)
    assert costing.exposed_activation(0, whole)[0] == 0.0
    # What is left of the GEMM (1.2e-5 - 8e-6 = 4e-6 s per micro-batch) hides the edge into it:
    # an edge of 1e-5 s over 2 micro-batches (factor 2: 2e-5 s) leaves 2e-5 - 2 x 4e-6 = 1.2e-5 s.
    two = TrainingOptions(tp_overlap=True, microbatches=2)
    assert costing.overlap_leftover(0, two)[0] == pytest.approx(4e-6)
    assert costing.edge_rows(np.array([[1e-5]]), [0], two)[0, 0] == pytest.approx(1.2e-5)
    assert costing.edge_rows(np.array([[1e-5]]), [0], TrainingOptions(microbatches=2))[0, 0] == pytest.approx(2e-5)


def test_gradient_buckets_share_the_latency():
    # FC weight 5e5 elements, batch split 4 ways in one node at 100 GB/s, 10 us a step: ring
    # all-reduce 2 (3/4) 5e5 x 4 B / 1e11 = 3e-5 s of bandwidth, 2 x 3 x 1e-5 = 6e-5 s of latency.
    costing = TrainingCosting(_fc_net(), [np.array([[4, 1, 1]])], machine(intra_node={"gbps": 100, "latency_us": 10}))
    assert costing.sync(0, TrainingOptions())[0] == pytest.approx(9e-5)
    # Buckets of 1e6 elements: the layer is half a bucket, pays half the latency: 3e-5 + 3e-5.
    assert costing.sync(0, TrainingOptions(bucket_elements=1e6))[0] == pytest.approx(6e-5)
    # A layer larger than a bucket pays all of it.
    assert costing.sync(0, TrainingOptions(bucket_elements=1e5))[0] == pytest.approx(9e-5)


def test_loss_buffers():
    g = GraphBuilder("loss", 1, batch=2)
    x = g.input((2, 10), "x", letters="bk")
    g.add("loss", SoftmaxCrossEntropy(x))
    net = g.build()
    costing = TrainingCosting(net, _ones(net), machine())
    # 20 logits: 2 fp32 buffers (fused loss) 160 bytes; 3 (torchtitan's .float() loss) 240.
    assert costing.layer_memory(0, TrainingOptions(), 2.0)["logits"][0] == 160.0
    assert costing.layer_memory(0, TrainingOptions(loss_buffers=3), 2.0)["logits"][0] == 240.0
    assert costing.layer_memory(0, TrainingOptions(), 2.0)["activations"][0] == 0.0


@pytest.mark.parametrize("sync, t, pp, vpp, efficiency, exposed", [
    (8.0, 3.0, 2, 4, 1.0, 5.0),    # g = 2 x 2/3 x 3 / 4 = 1: max(8/4, 8 - 3 x 1)
    (8.0, 3.0, 2, 4, 0.25, 7.25),  # g = 0.25: 8 - 0.75
    (8.0, 30.0, 2, 4, 1.0, 2.0),   # g = 10: the last chunk's share 8 / 4 alone
    (8.0, 3.0, 2, 1, 1.0, 8.0),    # one chunk: all of it
    (8.0, 3.0, 2, 4, 0.0, 8.0),    # no overlap: all of it
])
def test_interleaved_chunks_queue_their_gradient_sync(sync, t, pp, vpp, efficiency, exposed):
    assert float(chunk_sync(np.array(sync), np.array(t), pp, vpp, efficiency)) == pytest.approx(exposed)


def test_recipe_keys():
    r = parse_recipe("tp=4,tp_overlap=true,recompute=op")
    assert r.tp_overlap is True and r.recompute == "op"
    assert r.text() == "tp=4,recompute=op,tp_overlap=true"
    with pytest.raises(ValueError, match="tp_overlap=true needs sequence parallelism"):
        parse_recipe("tp=4,sp=false,tp_overlap=true")
    with pytest.raises(ValueError, match="recipe recompute must be none, selective, full, op or block"):
        parse_recipe("recompute=ops")
    with pytest.raises(ValueError, match="recipe tp_overlap must be true or false"):
        parse_recipe("tp_overlap=maybe")


def test_engine_exports_of_op_and_tp_overlap(tmp_path):
    import json
    import tomllib
    from cli_runner import run
    titan, megatron = tmp_path / "titan.toml", tmp_path / "megatron.json"
    import os

    # torchtitan's job file names one of its models: Llama 3.1 8B (it has no GPT-3).
    llama = "hf:" + os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "hf",
                                 "llama-3.1-8b.json")
    status, out, err = run("-g", llama, "-p", "8", "-b", "8", "--machine", "h100-sxm", "--engine",
                           "torchtitan,version=0.2", "--recipe", "dp=2,tp=4,zero=3,recompute=op,microbatch=1",
                           "--export-torchtitan", str(titan))
    assert status == 0, err
    t = tomllib.loads(titan.read_text())
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "recompute=op" in t["job"]["description"]
    status, out, err = run("-g", "gpt3-2.7b", "-p", "8", "-b", "8", "--machine", "h100-sxm",
                           "--recipe", "dp=2,tp=4,zero=1,recompute=selective,tp_overlap=true,microbatch=1",
                           "--export-megatron", str(megatron))
    assert status == 0, err
    m = json.loads(megatron.read_text())
    assert m["arguments"]["--tp-comm-overlap"] is True and m["arguments"]["--sequence-parallel"] is True
    assert m["arguments"]["--recompute-granularity"] == "selective" and "tp_overlap=true" in m["recipe"]
    # Neither engine runs the other's policy: refused, not substituted with a note.
    status, out, err = run("-g", "gpt3-2.7b", "-p", "8", "-b", "8", "--machine", "h100-sxm",
                           "--recipe", "dp=2,tp=4,zero=1,recompute=op,microbatch=1", "--export-megatron", str(megatron))
    assert status == 2 and "megatron has no recomputation policy 'op'" in err
