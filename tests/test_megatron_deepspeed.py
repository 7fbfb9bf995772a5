"""The Megatron-DeepSpeed profile (BigScience's fork, BLOOM's 2022 runs): ZeRO-1's bytes by hand,
BF16_Optimizer's kept gradients, attention without a fused kernel, no sequence parallelism."""

import json
import os

import pytest

from pase.planning.engine import load_engine

from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"model_type": "mpt", "d_model": 256, "n_heads": 4, "n_layers": 2, "expansion_ratio": 4, "vocab_size": 1024,
        "max_seq_len": 512, "no_bias": True, "attn_config": {"alibi": True}}


@pytest.fixture()
def tiny(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_zero1_bytes_per_parameter_by_hand():
    # DeepSpeed's ZeRO-1 (stage_1_and_2.py) under bf16: the bf16 weight (2) and its bf16 .grad
    # (2) whole on every rank, the fp32 master and two Adam moments (12) sharded over dp:
    # 2 + 2 + 12/8 = 5.5 bytes a parameter at dp 8.
    o = load_engine("megatron-deepspeed").base_options(zero=1)
    assert float(o.bytes_per_parameter(8)) == 5.5
    assert (o.grad_reduce_bytes, o.gather_bytes) == (2.0, 2.0)
    assert not o.overlap and not o.zero1_overlap and o.zero1_reduce == "reduce_scatter"


def test_bf16_optimizer_keeps_both_gradients():
    # BF16_Optimizer (optimizer=bf16): an fp32 gradient buffer the size of the whole bf16 group
    # (4) beside the bf16 .grad it zeroes but never frees (2), the weight (2), and 12/dp:
    # 2 + 4 + 2 + 12/8 = 9.5; its gradients all-reduced, not reduce-scattered.
    o = load_engine("megatron-deepspeed,optimizer=bf16").base_options(zero=1)
    assert float(o.bytes_per_parameter(8)) == 9.5
    assert o.zero1_reduce == "all_reduce"


def test_unfused_attention_holds_the_scores(tiny):
    # Without a fused attention kernel the scores Q K^T and their softmax are kept for the backward
    # pass, 2 bytes each (Korthikanti et al. 2022, "Reducing Activation Recomputation", 2as^2b +
    # 2as^2b; no attention dropout here): a = 4 heads, s = 512, b = 2 sequences, 2 layers:
    # 2 x 4 x 4 x 512^2 x 2 = 16,777,216 bytes more activations than with a fused kernel.
    figures = {}
    for engine in ("megatron-deepspeed", "megatron-deepspeed,attention_kernel=sdpa"):
        status, out, err = run("-g", f"hf:{tiny}", "-m", "512", "-p", "1", "-b", "2", "--training", "--machine",
                               "a100-sxm", "--engine", engine, "--recipe",
                               "dp=1,tp=1,zero=1,microbatch=2,recompute=none", "--json")
        assert status == 0, err
        t = json.loads(out)["training"]
        figures[engine] = (t["memory"]["activations"], t["fused_attention"])
    status, out, err = run("-g", f"hf:{tiny}", "-m", "512", "-p", "1", "-b", "2", "--training", "--machine", "a100-sxm",
                           "--engine", "megatron-deepspeed", "--recipe", "dp=1,tp=1,zero=1,microbatch=2,recompute=none")
    assert status == 0 and "model: docs/training.md (attention without a fused kernel," in out
    (unfused, u_flag), (fused, f_flag) = figures.values()
    assert (u_flag, f_flag) == (False, True)
    assert unfused - fused == pytest.approx(2 * 4 * 4 * 512 ** 2 * 2)


def test_no_sequence_parallelism_and_zero1_only(tiny):
    common = ("-g", f"hf:{tiny}", "-m", "512", "-p", "2", "-b", "4", "--training", "--machine", "a100-sxm",
              "--engine", "megatron-deepspeed", "--recipe")
    status, out, err = run(*common, "dp=1,tp=2,sp=true,zero=1,microbatch=1,recompute=full")
    assert status == 2 and "has no sequence parallelism" in err and len(err.strip().splitlines()) == 1
    status, out, err = run(*common, "dp=2,tp=1,zero=0,microbatch=1,recompute=full")
    assert status == 2 and "BF16_Optimizer" in err
    status, out, err = run(*common, "dp=1,tp=2,zero=1,microbatch=1,recompute=full", "--json")
    assert status == 0, err
    assert json.loads(out)["training"]["sequence_parallel"] is False


def test_the_bigscience_runs_file_prices_every_layout_that_ran():
    # The 20 layouts of BigScience's February 2022 search that ran: each priced by its recipe on
    # the cluster's machine file, none called "does not fit" (the search kept within A100 80GB).
    from pase.machines.registry import load_machine
    from pase.planning.calibrate_runs import price_runs
    from pase.planning.measured_runs import read_runs

    old = os.getcwd()
    os.chdir(ROOT)
    try:
        runs = read_runs(os.path.join("examples", "runs", "bigscience-tr11-search.json"))
        priced = price_runs(runs, load_machine(os.path.join("examples", "machines", "jz-a100-cluster.json")),
                            load_engine("megatron-deepspeed"))
    finally:
        os.chdir(old)
    assert len(priced) == 20 and all(p.fits for p in priced)
    assert all(p.mesh.devices == 384 for p in priced)
    # The order BigScience measured: every pair of layouts measured at least 1.25x apart in
    # sequences a second (21 pairs, chronicles-prequel.md) ordered the same way by the model, which
    # needs each data-parallel group priced on its own share of the node's network and the
    # pipeline's sends split over the tensor-parallel ranks (the a100-sxm preset's network orders 4).
    # All but one: bs-18 (tp 2, pp 12, measured 18.2 sequences a second) and bs-01 (tp 8, pp 6,
    # 13.9) tie within 0.01 % since the last stage holds its own copy of BLOOM's tied 250,880 x
    # 14,336 embedding (DeepSpeed's TiedLayerSpec): at tp 2 that is 1.8 billion elements a GPU,
    # whose gradient all-reduce with the first stage takes 5.7 s of a 150 s step on the 0.634
    # GB/s a GPU BigScience's own benchmark measured on Jean Zay (1.4 s at tp 8).
    from pase.planning.run_ranking import rank_runs
    measured = [run.batch / run.measured_step() for run in runs]
    modelled = [run.batch / p.step for run, p in zip(runs, priced)]
    ranking = rank_runs(["search"] * len(runs), measured, modelled)
    assert (ranking.pairs, ranking.right) == (21, 20)
    by_name = {run.name: run.batch / p.step for run, p in zip(runs, priced)}
    assert by_name["bs-18"] == pytest.approx(by_name["bs-01"], rel=1e-3)


def test_pipeline_sends_split_over_the_tensor_parallel_ranks(tiny):
    # DeepSpeed's pipeline engine sends each tensor-parallel rank's 1/tp part of the stage's output
    # (pipe_partitioned). One micro-batch of 2 sequences x 512 x 256 = 262,144 bf16 elements,
    # 524,288 bytes, whole on both tp ranks without sequence parallelism. Stages 2 devices apart
    # in one node of the a100-sxm preset (NVLink 300 GB/s, 3 us): forward and backward,
    # 2 x (524,288 / 300e9 + 3e-6) = 9.4953e-6 s whole, 2 x (262,144 / 300e9 + 3e-6) = 7.7476e-6 s
    # split.
    seconds = {}
    for engine in ("megatron-deepspeed", "megatron-deepspeed,pp_send_split=false"):
        status, out, err = run("-g", f"hf:{tiny}", "-m", "512", "-p", "4", "-b", "8", "--machine", "a100-sxm",
                               "--engine", engine, "--recipe",
                               "dp=1,tp=2,pp=2,sp=false,zero=1,microbatch=2,recompute=none", "--json")
        assert status == 0, err
        seconds[engine] = json.loads(out)["training"]["pipeline"]["p2p_seconds_per_microbatch"]
    split, whole = seconds.values()
    assert whole == pytest.approx(2 * (524288 / 300e9 + 3e-6))
    assert split == pytest.approx(2 * (262144 / 300e9 + 3e-6))


def test_the_pipeline_cut_is_deepspeeds_own():
    # DeepSpeed's partition_balanced on 'type:transformer' weights (1 for each transformer layer,
    # 0 for the embedding before them and the norm, head and loss after) gives the stages the
    # counts count_cut gives, and the profile cuts by count.
    from engine_checks import _need
    from pase.planning.engine_cut import count_cut
    _need("deepspeed", "deepspeed")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.runtime.utils import partition_balanced
    for blocks, pp in ((72, 6), (72, 24), (70, 8), (126, 16), (30, 4), (9, 4), (11, 3)):
        weights = [0, 0] + [1] * blocks + [0, 0, 0]
        parts = partition_balanced(weights, pp)
        assert count_cut(blocks, pp) == tuple(sum(weights[parts[i]:parts[i + 1]]) for i in range(pp))
    assert load_engine("megatron-deepspeed")["pipeline_cut"] == "layer_count"


def test_the_planner_cuts_by_count(tmp_path):
    # Six blocks on two stages under a vocabulary of 65,536: DeepSpeed puts three on each, whatever
    # the head costs; the search alone moves blocks off the head's stage (5 and 1).
    path = tmp_path / "six.json"
    path.write_text(json.dumps({**TINY, "n_layers": 6, "vocab_size": 65536}))
    cuts = []
    for engine in ("megatron-deepspeed", "megatron-deepspeed,pipeline_cut=search"):
        status, out, err = run("-g", f"hf:{path}", "-m", "512", "-p", "2", "-b", "8", "--machine", "a100-sxm",
                               "--engine", engine, "--recipe",
                               "dp=1,tp=1,pp=2,sp=false,zero=1,microbatch=2,recompute=none", "--json")
        assert status == 0, err
        cuts.append([s["blocks"] for s in json.loads(out)["training"]["pipeline"]["stages"]])
    assert cuts[0] == [3, 3] and cuts[1] != [3, 3]
    # The search line says which cuts the plan is optimal over.
    status, out, err = run("-g", f"hf:{path}", "-m", "512", "-p", "2", "-b", "8", "--machine", "a100-sxm",
                           "--engine", "megatron-deepspeed")
    assert status == 0, err
    assert "pipelines cut as the engine cuts them, an even count of blocks a stage" in out
    assert "pipelines cut between the source's repeated blocks" not in out
