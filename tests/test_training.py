"""Training configurations: every term against a value worked out by hand, the searches
against brute force, recipes and the command line."""

import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import graphs
from graphs.decoder import DecoderConfig, decoder
from pase.model.builder import GraphBuilder
from pase.machines.calibrated import CalibratedMachine
from pase.model.layers import FC, Einsum, Elementwise, Softmax, SoftmaxCrossEntropy
from pase.planning.mesh import Mesh, Recipe, mesh_config, mesh_configs, parse_recipe
from pase.costing.training import (
    DEFAULT_ATTENTION_EFFICIENCY, FLASH_BACKWARD_FACTOR, OPTIMIZER_STEP_BYTES, TrainingCosting, TrainingOptions,
    attention_cores, layer_parts, model_flops, parameter_elements_unique,
)
from pase.planning.training_search import evaluate_candidate, search_free, search_meshes

from cli_runner import run as _run


def run_cli(argv):
    return _run(*argv)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A machine with round numbers and no measured table: 4 devices a node at 100 GB/s, 10 GB/s
#: between nodes, no latency, 1 TFLOPS, 1 GB/s of memory bandwidth; 2-byte activations,
#: 4-byte gradient reductions.
TOY = {
    "name": "toy", "devices_per_node": 4, "memory_gb": 1, "peak_tflops": 1, "hbm_gbps": 1,
    "intra_node": {"gbps": 100, "latency_us": 0}, "inter_node": {"gbps": 10, "latency_us": 0},
    "act_bytes": 2, "grad_bytes": 4,
}


@pytest.fixture(scope="module")
def toy():
    return CalibratedMachine(TOY)


def _fc_net():
    g = GraphBuilder("fc", 1, batch=8)
    x = g.input((8, 1000), "x", letters="bk")
    g.add("fc", FC(x, 500))
    return g.build()


# ---------------------------------------------------------------------------------------
# Terms by hand


def test_parts_of_a_data_parallel_fc(toy):
    # FC 8 x 1000 -> 500, batch split 4 ways: per device 2 x 1000 x 500.
    layer = _fc_net().layers[0]
    parts = layer_parts(layer, np.array([[4, 1, 1]]), toy)
    assert parts.compute[0] == pytest.approx(6 * 2 * 500 * 1000 / 1e12)  # 6 BMNK / peak
    assert parts.activation[0] == 0.0  # nothing split but the batch
    # Ring all-reduce of the 5e5-element weight gradient over 4 devices: 2 (3/4) n / B.
    assert parts.gradient[0] == pytest.approx(2 * 0.75 * 5e5 * 4 / 100e9)
    assert parts.gather[0] == pytest.approx(2 * 0.75 * 5e5 * 2 / 100e9)
    (elements, r), = parts.params
    assert elements[0] == 5e5 and r[0] == 4
    assert parts.activations[0] == 8 * 500 / 4


@pytest.mark.parametrize("zero, micro, sync, hide", [
    (0, 1, 3e-5, 4e-6),                     # AR; backward = 2/3 of 6e-6
    (1, 1, 1.5e-5 + 0.75e-5, 6e-6),         # RS (grad) + AG (weights); + next forward
    (2, 2, 2 * 1.5e-5 + 0.75e-5, 1e-5),     # RS every micro-batch + AG
    (3, 2, 2 * (1.5e-5 + 1.5e-5), 1.2e-5),  # per micro-batch RS + 2 AG
])
def test_weight_sync_by_zero_stage(toy, zero, micro, sync, hide):
    net = _fc_net()
    costing = TrainingCosting(net, [np.array([[4, 1, 1]])], toy)
    options = TrainingOptions(zero=zero, microbatches=micro)
    assert costing.sync(0, options)[0] == pytest.approx(sync)
    assert costing.hiding(0, options)[0] == pytest.approx(hide)
    assert costing.exposed_sync(0, options)[0] == pytest.approx(sync - hide)
    assert costing.exposed_sync(0, TrainingOptions(zero=zero, microbatches=micro, overlap=False))[0] == \
        pytest.approx(sync)


@pytest.mark.parametrize("zero, per_element", [(0, 16.0), (1, 4 + 12 / 4), (2, 2 + 14 / 4), (3, 16 / 4)])
def test_model_state_by_zero_stage(toy, zero, per_element):
    costing = TrainingCosting(_fc_net(), [np.array([[4, 1, 1]])], toy)
    memory = costing.layer_memory(0, TrainingOptions(zero=zero), act_bytes=2.0)
    assert memory["model_state"][0] == pytest.approx(per_element * 5e5)
    assert memory["activations"][0] == pytest.approx(2.0 * 1000)


def test_optimizer_step_reads_the_local_state(toy):
    costing = TrainingCosting(_fc_net(), [np.array([[4, 1, 1]])], toy)
    assert costing.optimizer_seconds(0, TrainingOptions())[0] == pytest.approx(OPTIMIZER_STEP_BYTES * 5e5 / 1e9)
    assert costing.optimizer_seconds(0, TrainingOptions(zero=1))[0] == pytest.approx(OPTIMIZER_STEP_BYTES * 5e5 / 4 / 1e9)


ATTENTION_ROLES = {"b": "batch", "h": "heads", "l": "sequence", "m": "key_sequence", "k": "head_width"}


def _attention_net(causal=True, mask=False):
    g = GraphBuilder("attention", 1, batch=2, roles=ATTENTION_ROLES)
    q = g.input((2, 2, 8, 4), "q", letters="bhlk")
    k = g.input((2, 2, 8, 4), "k", letters="bhmk")
    v = g.input((2, 2, 8, 4), "v", letters="bhmk")
    scores = g.add("block1.scores", Einsum("bhlk,bhmk->bhlm", q, k))
    if mask:  # an additive bias (ALiBi) between the scores and the softmax
        bias = g.input((2, 2, 8, 8), "bias", letters="bhlm")
        scores = g.add("block1.bias", Elementwise(scores, bias))
    weights = g.add("block1.softmax", Softmax(scores, axis=3, causal=causal))
    g.add("block1.context", Einsum("bhlm,bhmk->bhlk", weights, v))
    return g.build()


def test_attention_core_with_a_bias_between_the_products(toy):
    net = _attention_net(mask=True)
    assert attention_cores(net) == {0: "scores", 1: "softmax", 2: "softmax", 3: "context"}
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, toy)
    fused = TrainingOptions()
    # Fused, the bias's s^2 output is not a stored activation either (2 x 2 x 8 x 8 unfused).
    assert costing.stored_activations(1, fused)[0] == 0.0
    assert costing.stored_activations(1, TrainingOptions(fused_attention=False))[0] == 2 * 2 * 8 * 8
    # Causal, declared by the softmax after the bias: half the products (as without the bias).
    assert costing.compute(0, fused)[0] == pytest.approx(TrainingCosting(
        _attention_net(), ones[:1] + ones[2:], toy).compute(0, fused)[0])
    # Without roles there is no core: nothing is guessed from op names.
    plain = GraphBuilder("attention", 1, batch=2)
    q = plain.input((2, 2, 8, 4), "q", letters="bhlk")
    s = plain.add("scores", Einsum("bhlk,bhmk->bhlm", q, q))
    plain.add("context", Einsum("bhlm,bhmk->bhlk", plain.add("softmax", Softmax(s, axis=3)), q))
    assert attention_cores(plain.build()) == {}


@pytest.mark.parametrize("causal", [True, False])
def test_fused_attention_time(toy, causal):
    net = _attention_net(causal)
    assert attention_cores(net) == {0: "scores", 1: "softmax", 2: "context"}
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, toy)
    fused = TrainingOptions()
    # Two products of 2 x 2 x 8 x 8 x 4 multiply-adds, 2 FLOPs each, forward; the backward
    # 2.5 times that; causal halves it; at 40 % of 1 TFLOPS.
    flops = 2 * 2 * (2 * 2 * 8 * 8 * 4) * (0.5 if causal else 1.0) * (1 + FLASH_BACKWARD_FACTOR)
    assert costing.compute(0, fused)[0] == pytest.approx(flops / (1e12 * DEFAULT_ATTENTION_EFFICIENCY))
    # An engine's kernel at its own efficiency (Megatron's cuDNN fused attention, 0.5):
    # the same FLOPs at 50 % of 1 TFLOPS, 0.3 / 0.5 = 0.6 of the default's time.
    assert costing.compute(0, TrainingOptions(attention_efficiency=0.5))[0] == pytest.approx(flops / 0.5e12)
    assert costing.compute(1, fused)[0] == 0.0 and costing.compute(2, fused)[0] == 0.0
    # Fused: neither the scores nor the softmax output is stored; unfused, both are.
    assert costing.stored_activations(0, fused)[0] == 0.0 and costing.stored_activations(1, fused)[0] == 0.0
    plain = TrainingOptions(fused_attention=False)
    assert costing.stored_activations(1, plain)[0] == 2 * 2 * 8 * 8
    assert costing.compute(2, plain)[0] == pytest.approx(costing.parts[2].compute[0])
    # Selective recomputation without fusion: scores and softmax run forward again.
    selective = TrainingOptions(fused_attention=False, recompute="selective")
    assert costing.recomputed(0, selective) and costing.recomputed(1, selective)
    assert not costing.recomputed(2, selective)
    assert costing.stored_activations(0, selective)[0] == 0.0


def _chain(blocks=2):
    """block1.a -> block1.b -> block2.a -> block2.b -> loss, FC layers of width 64."""
    g = GraphBuilder("chain", 1, batch=8)
    x = g.input((8, 64), "x", letters="bk")
    for i in range(1, blocks + 1):
        with g.block():
            x = g.add(f"block{i}.a", FC(x, 64))
            x = g.add(f"block{i}.b", FC(x, 64))
    g.add("loss", SoftmaxCrossEntropy(x))
    return g.build()


def test_full_recomputation_by_hand(toy):
    net = _chain()
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, toy)
    full = TrainingOptions(recompute="full", microbatches=2)
    assert net.blocks == (0, 0, 1, 1, None)
    # Only outputs that leave their block are kept: block1.b (read by block2.a); block2.b is
    # read by the loss alone, whose own logit buffers stand for it, and the loss keeps none.
    kept = [costing.stored_activations(v, full)[0] for v in range(5)]
    assert kept == [0.0, 8 * 64, 0.0, 0.0, 0.0]
    parts = costing.parts[0]
    times = costing.layer_time(0, full)
    assert times["compute"][0] == pytest.approx(2 * parts.compute[0])
    assert times["recompute"][0] == pytest.approx(2 * (parts.compute[0] / 3 + parts.activation[0] / 2))
    assert costing.layer_time(4, full)["recompute"][0] == 0.0  # the loss is outside the blocks
    # The working set of the block running again: both its outputs.
    transient = costing.transient_bytes([0] * 5, full, act_bytes=2.0)
    assert transient["recompute_working_set"] == 2.0 * 2 * 8 * 64
    assert costing.edge_factor(1, full) == 2 * 1.5 and costing.edge_factor(4, full) == 2


def test_logits_in_fp32_and_tied_weights(toy):
    g = GraphBuilder("tied", 1, batch=2)
    from pase.model.layers import Embedding
    ids = g.input((2, 4), "ids", letters="bl")
    embedding = Embedding(ids, 10, 6, letters="bl")
    x = g.add("embedding", embedding)
    logits = g.add("head", Einsum("ble,ve->blv", x, embedding.inputs[1]))
    g.add("loss", SoftmaxCrossEntropy(logits))
    net = g.build()
    assert parameter_elements_unique(net) == 60  # the 10 x 6 table once
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, toy)
    options = TrainingOptions()
    state = [costing.layer_memory(v, options, 2.0)["model_state"][0] for v in range(3)]
    assert state == [16.0 * 60, 0.0, 0.0]
    assert costing.layer_memory(2, options, 2.0)["logits"][0] == 2 * 4.0 * 2 * 4 * 10


def test_model_flops_is_three_forward_passes():
    net = graphs.build("gpt2-small", 2)
    # 72 B s L h^2 (1 + s/(6h) + V/(12 L h)) (Narayanan et al. 2021) with s = 1024, h = 768.
    B, s, L, h, V = 2, 1024, 12, 768, 50304
    assert model_flops(net) == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))


# ---------------------------------------------------------------------------------------
# Meshes and recipes


def test_mesh_of_a_llama_block():
    net = graphs.build("llama3-8b", 16, 64)
    names = list(net.names)
    layer = {n: l for n, l in zip(names, net.layers)}
    mesh = Mesh(dp=2, tp=16, sp=True)
    # 8 key/value heads, 4 queries each: q splits g 8 and r 2; k keeps its 8 heads, replicated twice.
    assert mesh_config(layer["block1.attn.q"], mesh) == (2, 8, 2, 1, 1, 1)
    assert mesh_config(layer["block1.attn.k"], mesh) == (2, 8, 1, 1, 1)
    assert mesh_config(layer["block1.ff.down"], mesh) == (2, 1, 1, 16)  # f is the reduction: row-parallel
    assert mesh_config(layer["block1.attn.norm"], mesh) == (2, 16, 1)  # sequence parallel
    assert mesh_config(layer["block1.attn.norm"], Mesh(dp=2, tp=16, sp=False)) == (2, 1, 1)
    assert mesh_config(layer["head.logits"], mesh) == (2, 1, 16, 1)  # vocabulary
    assert mesh_config(layer["block1.attn.scores"], Mesh(dp=1, tp=4, cp=8)) == (1, 4, 1, 8, 1, 1)
    with pytest.raises(ValueError, match="kv_groups"):
        mesh_config(layer["block1.attn.q"], Mesh(dp=1, tp=3))
    assert len(mesh_configs(net, mesh)) == len(net)


@pytest.mark.parametrize("text, message", [
    ("tp=0", "tp must be a positive integer"),
    ("zero=4", "zero must be 0, 1, 2 or 3"),
    ("recompute=some", "recompute must be none, selective, full, op or block"),
    ("dp=2,dp=4", "given twice"),
    ("fsdp=8", "unknown recipe key 'fsdp'"),
    ("dp", "is not KEY=VALUE"),
    ("", "a recipe is KEY=VALUE"),
])
def test_bad_recipes(text, message):
    with pytest.raises(ValueError, match=message):
        parse_recipe(text)


def test_recipe_degrees_must_multiply_to_p():
    with pytest.raises(ValueError, match="not the 8 devices"):
        Recipe(dp=2, tp=2, pp=1, cp=1).check(8)
    Recipe(dp=2, tp=4, pp=1, cp=1).check(8)


# ---------------------------------------------------------------------------------------
# Searches against brute force


@pytest.mark.parametrize("options", [
    TrainingOptions(),
    TrainingOptions(zero=3, recompute="full", microbatches=2),
    TrainingOptions(zero=2, overlap=False),
    TrainingOptions(zero=1, recompute="full"),
])
def test_per_layer_search_equals_brute_force(toy, options):
    net = _chain()
    found = search_free(net, 2, toy, options, 2.0)
    brute = min(
        evaluate_candidate(net, list(c), 2, toy, options, 2.0).summary.step_seconds
        for c in itertools.product(*[[tuple(r) for r in C] for C in net.configs(2)])
    )
    assert found.optimum == pytest.approx(brute, rel=1e-12)
    assert found.candidate.summary.step_seconds == pytest.approx(brute, rel=1e-12)


def test_capped_per_layer_search_fits_and_is_bounded(toy):
    net = _chain()
    options = TrainingOptions(zero=0, reserve_bytes=0.0)
    all_plans = [evaluate_candidate(net, list(c), 2, toy, options, 2.0).summary
                 for c in itertools.product(*[[tuple(r) for r in C] for C in net.configs(2)])]
    cap = sorted(s.peak_memory_bytes for s in all_plans)[len(all_plans) // 3]
    found = search_free(net, 2, toy, options, 2.0, memory_cap=cap)
    best = min(s.step_seconds for s in all_plans if s.peak_memory_bytes <= cap)
    assert found.candidate.summary.peak_memory_bytes <= cap
    assert found.candidate.summary.step_seconds >= best - 1e-18


TINY = DecoderConfig(layers=2, width=64, heads=4, kv_heads=2, head_dim=16, mlp_width=128, vocab=256, sequence=32)


def test_mesh_search_equals_brute_force_over_meshes(toy):
    def build(micro):
        return decoder(TINY, micro, "tiny")

    found = search_meshes(build, 8, 4, toy, None, 2.0, keep_all=True)
    best = None
    for mesh in (Mesh(4), Mesh(2, 2), Mesh(2, 2, sp=False), Mesh(1, 4), Mesh(1, 4, sp=False), Mesh(2, 1, 2),
                 Mesh(1, 1, 4), Mesh(1, 2, 2), Mesh(1, 2, 2, sp=False)):
        for micro in (1, 2, 4, 8):
            if (8 // mesh.dp) % micro:
                continue
            net = build(micro * mesh.dp)
            configs = mesh_configs(net, mesh)
            for zero, policy in itertools.product(range(4), ("none", "selective", "full")):
                options = TrainingOptions(zero=zero, recompute=policy, microbatches=8 // (micro * mesh.dp))
                step = evaluate_candidate(net, configs, 4, toy, options, 2.0, mesh=mesh).summary.step_seconds
                best = step if best is None else min(best, step)
    assert found.best.summary.step_seconds == pytest.approx(best, rel=1e-9)
    assert found.evaluated == len(found.candidates)


# ---------------------------------------------------------------------------------------
# The command line


def test_training_json_keys_and_bad_input():
    status, out, err = run_cli(["-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", "h100-sxm",
                                "--recipe", "tp=2,zero=1", "--json"])
    assert status == 0, err
    data = json.loads(out)
    t = data["training"]
    for key in ("step_seconds", "tokens_per_second_per_device", "model_flops_per_step", "mfu",
                "peak_memory_bytes", "parameters", "zero", "recompute", "microbatches", "mesh"):
        assert key in t
    assert t["mesh"]["tp"] == 2 and t["zero"] == 1
    assert t["mesh"]["dp"] * t["mesh"]["tp"] * t["mesh"]["pp"] * t["mesh"]["cp"] == 8
    assert t["peak_memory_bytes"] <= 80e9
    for argv, message in (
        (["--recipe", "tp=3x"], "tp must be a positive integer"),
        (["--recipe", "dp=3"], "does not divide the 8 devices"),
        (["--recipe", "dp=2,vpp=2,schedule=1f1b"], "vpp (virtual stages) needs schedule=interleaved"),
        (["--training", "--sweep", "2,4"], "drop -p/--procs"),
    ):
        status, out, err = run_cli(["-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", "h100-sxm"] + argv)
        assert status == 2 and out == "" and err.count("\n") == 1 and message in err, (argv, err)


def test_training_json_is_deterministic_under_hash_seeds():
    outputs = set()
    for seed in ("0", "1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "scheduler.py"), "-g", "gpt2-small", "-p", "4", "-b", "8",
             "--machine", "h100-sxm", "--training", "--json"],
            capture_output=True, text=True, env=env, cwd=ROOT, check=True,
        )
        data = json.loads(result.stdout)
        data["search"].pop("seconds")
        outputs.add(json.dumps(data, sort_keys=True))
    assert len(outputs) == 1


def test_engine_exports_read_back(tmp_path):
    import tomllib

    titan, megatron = tmp_path / "titan.toml", tmp_path / "megatron.json"
    base = ["-g", "gpt3-2.7b", "-p", "32", "-b", "64", "--machine", "h100-sxm"]
    # torchtitan's job file names one of its models: Llama 3.1 8B (it has no GPT-3).
    llama = ["-g", "hf:" + os.path.join(ROOT, "examples", "hf", "llama-3.1-8b.json"), "-p", "32", "-b", "64",
             "--machine", "h100-sxm", "--engine", "torchtitan,version=0.2"]
    status, out, err = run_cli(llama + ["--recipe", "dp=4,tp=4,pp=2,zero=3,recompute=full,microbatch=1",
                                        "--export-torchtitan", str(titan)])
    assert status == 0, err
    t = tomllib.loads(titan.read_text())
    par = t["parallelism"]
    degrees = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]
               * par["pipeline_parallel_degree"] * par["context_parallel_degree"])
    assert degrees == 32
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (4, 2)
    assert par["data_parallel_shard_degree"] == 4 and par["fsdp_reshard_after_forward"] == "always"  # ZeRO-3: FSDP
    # The batch of a data-parallel rank (64 / 4), cut into pipeline micro-batches of 1.
    assert t["activation_checkpoint"]["mode"] == "full" and t["training"]["local_batch_size"] == 16
    assert par["pipeline_parallel_microbatch_size"] == 1
    assert t["training"]["global_batch_size"] == 64 and t["training"]["seq_len"] == 2048
    assert "--parallelism.tensor_parallel_degree 4" in titan.read_text()
    status, out, err = run_cli(base + ["--recipe", "dp=4,tp=4,pp=2,zero=1,recompute=full,microbatch=1",
                                       "--export-megatron", str(megatron)])
    assert status == 0, err
    m = json.loads(megatron.read_text())
    a = m["arguments"]
    assert a["--tensor-model-parallel-size"] * a["--pipeline-model-parallel-size"] * a["--context-parallel-size"] \
        * m["data_parallel_size"] == 32
    assert a["--use-distributed-optimizer"] is True and a["--recompute-granularity"] == "full"
    assert a["--micro-batch-size"] == 1 and a["--global-batch-size"] == 64
    assert "Megatron-LM arguments written to" in out


def test_sequence_parallelism_halves_tensor_parallel_collectives(toy):
    from pase.planning.mesh import MeshMapper

    net = decoder(TINY, 4, "tiny")
    mapper = MeshMapper(net)
    flags = dict(zip(net.names, mapper.sequence_parallel(Mesh(1, 4, sp=True))))
    # Products split over heads, MLP width or vocabulary: a reduce-scatter, not an all-reduce.
    assert flags["block1.attn.q"] and flags["block1.attn.out"] and flags["block1.ff.down"] and flags["head.logits"]
    assert not flags["block1.attn.norm"] and not flags["loss"]
    assert not any(mapper.sequence_parallel(Mesh(1, 4, sp=False)))
    configs = mesh_configs(net, Mesh(1, 4))
    # Every reader's own collective (the reader rule "each"; sharing: tests/test_shared_readers.py).
    on = evaluate_candidate(net, configs, 4, toy, TrainingOptions(), 2.0, mesh=Mesh(1, 4, sp=True),
                            readers="each").summary
    off = evaluate_candidate(net, configs, 4, toy, TrainingOptions(), 2.0).summary
    costing = TrainingCosting(net, [np.asarray([c]) for c in configs], toy)
    each = [costing.parts[v].activation[0] for v in range(len(net))]
    assert off.time["activation_comm"] == pytest.approx(sum(each))
    halved = mapper.sequence_parallel(Mesh(1, 4, sp=True))
    assert on.time["activation_comm"] == pytest.approx(sum(a / 2 if h else a for a, h in zip(each, halved)))
    assert each[net.names.index("loss")] > 0  # the vocabulary-parallel loss's exchange stays whole


def test_tensor_parallelism_only_where_a_language_model_names_it():
    status, out, err = run_cli(["-g", "alexnet", "-p", "8", "--machine", "h100-sxm", "--recipe", "tp=2"])
    assert status == 2 and out == "" and "tensor parallelism splits the dimension roles" in err
    status, out, err = run_cli(["-g", "alexnet", "-p", "8", "--machine", "h100-sxm", "--recipe", "dp=8", "--json"])
    assert status == 0, err
    assert json.loads(out)["training"]["mesh"] == {"dp": 8, "tp": 1, "pp": 1, "cp": 1}


def test_engine_exports_never_overwrite_an_input_or_each_other(tmp_path):
    config = tmp_path / "gpt2.json"
    config.write_text(open(os.path.join(ROOT, "examples", "hf", "gpt2.json")).read())
    before = config.read_text()
    base = ["-g", f"hf:{config}", "-p", "8", "-b", "8", "-m", "64", "--machine", "h100-sxm", "--training"]
    status, out, err = run_cli(base + ["--export-megatron", str(config)])
    assert status == 2 and "would overwrite the input file" in err and config.read_text() == before
    same = str(tmp_path / "x.json")
    status, out, err = run_cli(base + ["--export-megatron", same, "--export-torchtitan", same])
    assert status == 2 and "name the same file" in err and not os.path.exists(same)


def test_outputs_no_backward_reads_are_not_kept(toy):
    # x (8 x 64) -> a = x W (a product) -> r = x + a (a residual sum) -> q = r * table (a rotary
    # embedding: times a constant graph input) -> s = q * q2 (a product of two layer outputs,
    # q2 = r V) -> loss. Backward passes read: the products their input (x, r: kept), the sum
    # nothing (a not kept), the rotary its table only (q kept only because s reads it: s's
    # other operand q2 needs a gradient), s its two operands.
    g = GraphBuilder("reads", 1, batch=8)
    x = g.input((8, 64), "x", letters="bk")
    table = g.input((8, 64), "table", letters="bk")
    with g.block():
        a = g.add("block1.a", FC(x, 64))
        r = g.add("block1.r", Elementwise(x, a, combine="add"))
        q = g.add("block1.q", Elementwise(r, table))
        q2 = g.add("block1.q2", FC(r, 64))
        s = g.add("block1.s", Elementwise(q, q2))
    with g.block():
        t = g.add("block2.t", FC(s, 64))
    g.add("loss", SoftmaxCrossEntropy(t))
    net = g.build()
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, toy)
    o = TrainingOptions()
    kept = [float(costing.stored_activations(v, o)[0]) for v in range(5)]
    # a: 0 (read by the sum only); r: 8 x 64 = 512 (the product q2 = r V needs r for V's
    # gradient); q: 512 (s reads it); q2: 512; s: 512 (block output, read by block2.t).
    assert kept == [0.0, 512.0, 512.0, 512.0, 512.0]
    assert costing.read_back.tolist()[:5] == [False, True, True, True, True]
    # The rotary alone reads nothing of r: r read only by a product with a constant table is
    # not kept (and a product's operands are kept when the other operand needs a gradient).
    h = GraphBuilder("rotary", 1, batch=8)
    x = h.input((8, 64), "x", letters="bk")
    table = h.input((8, 64), "table", letters="bk")
    with h.block():
        p = h.add("block1.p", FC(x, 64))
        rot = h.add("block1.rot", Elementwise(p, table))
    with h.block():
        h.add("block2.u", FC(rot, 64))
    net = h.build()
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    c = TrainingCosting(net, ones, toy)
    assert float(c.stored_activations(0, o)[0]) == 0.0 and float(c.stored_activations(1, o)[0]) == 512.0
    with pytest.raises(ValueError, match="combine must be one of multiply, add"):
        Elementwise(x, table, combine="max")


def test_a_llama_block_keeps_by_hand(toy):
    # TINY's block on one device, batch 1, 32 tokens, width 64, 4 query heads and 2 key-value
    # heads of 16, MLP 128; fused attention, no recomputation. Kept, elements per token:
    # attn.norm 64 (the products' input), v 2 x 16 = 32, q_rotary 64 and k_rotary 32 (the
    # kernel's inputs), context 64 (the kernel's output, the projection's input), attn.residual
    # 64 (the next norm's input), ff.norm 64, gate 128 and up 128 (SwiGLU reads both),
    # multiply 128 (down's input), ff.residual 64 (the block's output):
    # 64+32+64+32+64+64+64+128+128+128+64 = 832. Not kept: q, k (read by their rotary
    # embeddings only, times a constant table), out and down (read by the residual sums
    # only), scores and softmax (fused). 832 x 32 tokens = 26,624 elements; before, q 64, k 32,
    # out 64 and down 64 more per token: 1,056 x 32 = 33,792.
    net = decoder(TINY, 1, "tiny")
    ones = [np.ones((1, len(layer.domain)), dtype=np.int64) for layer in net.layers]
    costing = TrainingCosting(net, ones, toy)
    o = TrainingOptions()
    block = [v for v in range(len(net.layers)) if costing.blocks[v] == costing.blocks[1]]
    assert sum(float(costing.stored_activations(v, o)[0]) for v in block) == 832 * 32
