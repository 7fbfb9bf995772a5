"""Engine profiles (``--engine``): the loader, the facts each shipped profile states, the
options they imply, the overlap they let the search try, and bad input."""

import json
import os

import pytest

import graphs
from pase.machines.calibrated import CalibratedMachine
from pase.planning.engine import DEFAULT_ENGINE, ENGINE_NAMES, FACTS, engine_dir, load_engine
from pase.planning.mesh import parse_recipe
from pase.planning.training_search import search_meshes

from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_six_engines_ship_with_every_fact_sourced():
    assert ENGINE_NAMES == ("deepspeed", "fsdp", "megatron", "megatron-deepspeed", "nanotron", "torchtitan")
    for name in ENGINE_NAMES:
        p = load_engine(name)
        assert set(p.facts) == set(FACTS)
        assert all(p.sources[k].strip() for k in FACTS)
        with open(os.path.join(engine_dir(), name + ".json")) as f:
            assert json.load(f)["name"] == name
    assert load_engine(None).name == DEFAULT_ENGINE == "megatron"


def test_megatron_options_by_hand():
    # Megatron in bf16 keeps fp32 main gradients and reduces them in fp32 (its
    # dist_optimizer.md: 6 + 12/d bytes per parameter = 2 bf16 weight + 4 fp32 gradient +
    # 12/d); fused kernels (not eager); the vocab-parallel loss keeps one fp32 logit-sized
    # buffer (the softmax, then the gradient in place) beside one bf16 one: 1.5 fp32 buffers.
    o = load_engine("megatron").base_options(zero=1)
    assert (o.grad_bytes, o.grad_reduce_bytes, o.gather_bytes) == (4.0, 4.0, 2.0)
    assert float(o.bytes_per_parameter(8)) == 2.0 + 4.0 + 12.0 / 8  # 7.5
    assert not o.eager and o.loss_buffers == 1.5 and o.bucket_elements == 4e7
    assert o.engine == "megatron"
    # --grad-reduce-in-bf16: 2-byte gradients both in memory and on the wire.
    b = load_engine("megatron,grad_reduce=bf16").base_options(zero=1)
    assert (b.grad_bytes, b.grad_reduce_bytes) == (2.0, 2.0) and b.engine == "megatron,grad_reduce=bf16"


def test_attention_kernel_efficiency_is_the_engines():
    # Megatron runs Transformer Engine's cuDNN fused attention, FlashAttention-3's class on
    # Hopper: 3.5 / (1/620 + 2.5/450) = 3.5 / (0.0016129 + 0.0055556) = 488 TFLOP/s of 989,
    # stated as 0.5; the others PyTorch SDPA's or flash_attn's FlashAttention-2:
    # 3.5 / (1/340 + 2.5/285) = 3.5 / (0.0029412 + 0.0087719) = 299 of 989, 0.3.
    assert 3.5 / (1 / 620 + 2.5 / 450) / 989 == pytest.approx(0.5, abs=0.01)
    assert 3.5 / (1 / 340 + 2.5 / 285) / 989 == pytest.approx(0.3, abs=0.01)
    assert load_engine("megatron").base_options().attention_efficiency == 0.5
    for name in ("torchtitan", "fsdp", "deepspeed"):
        assert load_engine(name).base_options().attention_efficiency == 0.3
    # A key sets it (cuDNN off: NVTE_FUSED_ATTN=0 falls back to flash-attn 2).
    assert load_engine("megatron,attention_efficiency=0.3").base_options().attention_efficiency == 0.3


def test_torchtitan_eager_and_compiled():
    t = load_engine("torchtitan")
    o = t.base_options()
    assert o.eager and o.loss_buffers == 3.0 and o.wrap_unit == "block" and o.grad_reduce_bytes == 4.0
    assert o.optimizer_temp_bytes == 4.0  # foreach Adam: one fp32 sqrt of the second moments
    assert t.searched() == {"tp_overlap": (False,), "recompute": ("none", "op", "full")}
    c = load_engine("torchtitan,compile=true")
    assert not c.base_options().eager and c.searched()["tp_overlap"] == (False, True)
    assert c["rotary_kernel"] == "fused" and "compile=true" in c.sources["norm_kernel"]


def test_fsdp_and_deepspeed():
    f = load_engine("fsdp").base_options()
    assert f.wrap_unit == "block" and f.grad_reduce_bytes == 4.0 and not f.eager
    assert load_engine("fsdp").searched()["recompute"] == ("none", "full")
    d = load_engine("deepspeed").base_options()
    assert d.eager and d.grad_reduce_bytes == 2.0 and d.bucket_elements == 5e8


def test_a_fact_set_by_key():
    p = load_engine("megatron,comm_sm_share=0.2,tp_comm_overlap=false")
    assert p["comm_sm_share"] == 0.2 and p.searched()["tp_overlap"] == (False,)
    assert "command line" in p.sources["comm_sm_share"]


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown engine 'nope'"),
    ("megatron,colour=red", "has no key 'colour'"),
    ("megatron,grad_reduce=fp8", "grad_reduce must be one of fp32, bf16"),
    ("torchtitan,compile", "is not KEY=VALUE"),
    ("megatron,comm_sm_share=2", "must be below 1"),
    ("megatron,attention_efficiency=0", "attention_efficiency must be in"),
    ("megatron,attention_efficiency=1.5", "attention_efficiency must be in"),
    ("megatron,comm_sm_share=x", "must be a number"),
    ("megatron,tp_overlap=true,tp_overlap=false", "given twice"),
    ("", "an engine is NAME"),
])
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        load_engine(spec)


def test_profile_files(tmp_path):
    with open(os.path.join(engine_dir(), "fsdp.json")) as f:
        data = json.load(f)
    data["name"] = "mine"
    data["facts"]["loss_buffers"]["value"] = 1
    good = tmp_path / "mine.json"
    good.write_text(json.dumps(data))
    p = load_engine(str(good))
    assert p.name == "mine" and p.base_options().loss_buffers == 1.0
    bad = dict(data, facts={k: v for k, v in data["facts"].items() if k != "wrap_unit"})
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="fact 'wrap_unit' missing"):
        load_engine(str(tmp_path / "bad.json"))
    nosource = json.loads(json.dumps(data))
    nosource["facts"]["grad_dtype"]["source"] = ""
    (tmp_path / "nosource.json").write_text(json.dumps(nosource))
    with pytest.raises(ValueError, match="has no source"):
        load_engine(str(tmp_path / "nosource.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_engine(str(tmp_path / "broken.json"))
    with pytest.raises(ValueError, match="cannot read"):
        load_engine(str(tmp_path / "absent.json"))


TOY = {
    "name": "toy", "devices_per_node": 4, "memory_gb": 100, "peak_tflops": 1, "hbm_gbps": 1,
    "intra_node": {"gbps": 1, "latency_us": 0}, "inter_node": {"gbps": 1, "latency_us": 0},
    "act_bytes": 2, "grad_bytes": 4,
}


def test_tp_overlap_is_searched_where_the_engine_has_it():
    # Brute force: the search over both overlap settings equals the better of the two
    # searches with the setting fixed by a recipe (slow links: overlap must win at tp > 1).
    machine = CalibratedMachine(TOY)
    build = lambda n: graphs.build("gpt2-small", n)  # noqa: E731
    engine = load_engine("megatron")
    found = search_meshes(build, 8, 4, machine, None, 2.0, parse_recipe("tp=4"), engine=engine)
    fixed = [search_meshes(build, 8, 4, machine, None, 2.0, parse_recipe(f"tp=4,tp_overlap={v}"), engine=engine).best
             for v in ("true", "false")]
    assert found.best.summary.step_seconds == min(c.summary.step_seconds for c in fixed)
    assert found.best.options.tp_overlap
    # torchtitan in eager mode has no tensor-parallel overlap: never tried.
    titan = search_meshes(build, 8, 4, machine, None, 2.0, parse_recipe("tp=4"), engine=load_engine("torchtitan"))
    assert not titan.best.options.tp_overlap


def test_cli_names_the_engine():
    status, out, err = run("-g", "gpt2-small", "-p", "4", "-b", "8", "--training", "--machine", "h100-sxm")
    assert status == 0, err
    assert "engine: megatron" in out
    status, out, err = run("-g", "gpt2-small", "-p", "4", "-b", "8", "--engine", "torchtitan,compile=true",
                           "--machine", "h100-sxm", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["engine"] == "torchtitan,compile=true" and data["training"]["engine"] == "torchtitan,compile=true"


def test_cli_bad_engine_is_one_line():
    status, out, err = run("-g", "gpt2-small", "-p", "4", "--engine", "nope")
    assert status == 2 and "unknown engine 'nope'" in err and "Traceback" not in err


def test_the_chosen_engine_is_judged_with_its_switches():
    # torchtitan runs asynchronous tensor parallelism only under torch.compile
    # (--compile.enable_async_tensor_parallel needs --compile.enable): a plan priced for
    # torchtitan,compile=true that overlaps its tensor-parallel collectives runs on it, and the
    # plan's list of engines says so; judged by the plain profile it would not (the defect).
    status, out, err = run("-g", "gpt2-small", "-p", "8", "-b", "32", "--machine", "h100-sxm",
                           "--engine", "torchtitan,compile=true", "--recipe", "dp=2,tp=4,zero=3,microbatch=16",
                           "--json")
    assert status == 0, err
    data = json.loads(out)
    assert "tp_overlap=true" in data["training"]["recipe"]
    assert data["engines"]["torchtitan"] is None
    status, out, err = run("-g", "gpt2-small", "-p", "8", "-b", "32", "--machine", "h100-sxm",
                           "--engine", "torchtitan,compile=true", "--recipe", "dp=2,tp=4,zero=3,microbatch=16")
    assert status == 0, err
    assert "engines that run this configuration: megatron, torchtitan" in out
