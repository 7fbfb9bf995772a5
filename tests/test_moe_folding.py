"""Megatron-Core's MoE parallel folding (``etp``, ``ep`` beyond ``dp``): the expert layer's
configuration, its token layout, the all-to-all group and the recipe checks, by hand."""

import json
import os

import numpy as np
import pytest

from graphs.decoder import DecoderConfig, MoEConfig, decoder
from pase.machines.base import Group, layout_strides
from pase.machines.calibrated import PRESETS, CalibratedMachine
from pase.model.builder import redistribution_seconds
from pase.model.layers import MoE, redistribution_volume
from pase.planning.mesh import Mesh, Recipe, mesh_config, parse_recipe
from pase.planning.training_search import expert_grids

from cli_runner import run

H100 = CalibratedMachine(PRESETS["h100-sxm"])


def deepseek_like(batch):
    """Two blocks, width 64, 4 heads, sequence 32; 8 experts of width 96, top 2."""
    cfg = DecoderConfig(2, 64, 4, 2, 16, 128, 256, sequence=32, moe=MoEConfig(8, 2, 96))
    return decoder(cfg, batch, "deepseek-like")


def moe_and_source(net):
    v = next(i for i, layer in enumerate(net.layers) if isinstance(layer, MoE))
    (u,) = [a for a, b in net.edges if b == v]
    return v, u


def test_folded_moe_layer_by_hand():
    net = deepseek_like(4)
    v, u = moe_and_source(net)
    moe = net.layers[v]
    mesh = Mesh(dp=4, tp=2, ep=8, etp=1)
    assert mesh.folded and mesh.expert_tp == 1
    # Folded: batch dp = 4, sequence cp x tp / etp = 1 x 2 / 1 = 2, expert width etp = 1; then
    # ep = 8 out of the token splits: gcd(4, 8) = 4 from the batch (4 -> 1), 8 / 4 = 2 from the
    # sequence (2 -> 1): (batch 1, sequence 1, experts 8, width 1, model 1).
    config = mesh_config(moe, mesh)
    assert config == (1, 1, 8, 1, 1)
    C = np.array([config])
    # Tokens: c_x = 8 on the batch as far as it holds it: batch 4 / c_b 1 = 4, g = gcd(8, 4) = 4,
    # the rest 8 / 4 = 2 on the sequence: (4, 2, 1), the attention side's layout (dp 4, sp 2).
    assert moe.input_configs(C)[0].tolist() == [[4, 2, 1]]
    assert moe.output_configs(C)[0].tolist() == [[4, 2, 1]]
    # The all-to-all: only the experts split, so its 8 devices are consecutive (stride 1),
    # all inside one 8-GPU node of h100-sxm.
    group = Group.of(C, layout_strides(C, moe.batch_dim), (moe.tokens,))
    assert group.size.tolist() == [8] and group.strides.tolist() == [[1]]
    assert group.members_per_node(8).tolist() == [8]
    # The preceding layer (a norm under sequence parallelism) is split batch 4, sequence 2, and
    # hands its output over with nothing to move.
    source = np.array([mesh_config(net.layers[u], mesh)])
    out = net.layers[u].output_configs(source)[0]
    assert out.tolist() == [[4, 2, 1]]
    shape = moe.inputs[0].shape
    assert redistribution_volume(shape, out, moe.input_configs(C)[0]).tolist() == [0.0]
    assert redistribution_seconds(H100, shape, out, moe.input_configs(C)[0], 8).tolist() == [0.0]


def test_folded_other_layers_unchanged():
    net = deepseek_like(4)
    v, _ = moe_and_source(net)
    for i, layer in enumerate(net.layers):
        if i != v and not isinstance(layer, MoE):
            assert mesh_config(layer, Mesh(4, 2, ep=8, etp=1)) == mesh_config(layer, Mesh(4, 2))


def test_folded_with_expert_tensor_parallelism_and_cp():
    net = deepseek_like(8)
    v, _ = moe_and_source(net)
    # dp 2, cp 2, tp 2, etp 2, ep 4 (ep does not divide dp: folded over cp): batch 2, sequence
    # cp x tp / etp = 2, width 2; ep 4: gcd(2, 4) = 2 off the batch (2 -> 1), 2 off the
    # sequence (2 -> 1).
    assert mesh_config(net.layers[v], Mesh(2, 2, 2, ep=4, etp=2)) == (1, 1, 4, 2, 1)
    with pytest.raises(ValueError, match="expert tensor parallelism 3 does not divide"):
        mesh_config(net.layers[v], Mesh(4, 2, ep=8, etp=3))


def test_token_config_keeps_todays_rule_where_the_batch_holds_it():
    net = deepseek_like(16)
    v, _ = moe_and_source(net)
    # c_b 2 x c_x 8 = 16 divides the batch 16: all on the batch, as before folding.
    assert net.layers[v].input_configs(np.array([[2, 1, 8, 1, 1]]))[0].tolist() == [[16, 1, 1]]


def test_folded_recipe_checks():
    r = parse_recipe("dp=32,tp=2,pp=16,ep=64")
    assert r.etp is None
    r.check(1024)  # 64 x etp 1 divides 32 x 1 x 2
    assert parse_recipe("dp=4,tp=2,cp=1,ep=8,etp=1").text() == "dp=4,tp=2,cp=1,ep=8,etp=1"
    with pytest.raises(ValueError, match=r"ep=16 x etp=1 must divide dp=4 x cp=1 x tp=2"):
        parse_recipe("dp=4,tp=2,cp=1,ep=16").check(8)
    with pytest.raises(ValueError, match="etp=3 must divide tp=2"):
        parse_recipe("dp=4,tp=2,ep=8,etp=3").check(8)
    with pytest.raises(ValueError, match="needs sequence parallelism"):
        parse_recipe("dp=4,tp=2,cp=1,ep=8,sp=false").check(8)
    with pytest.raises(ValueError, match="etp=1 needs ep > 1"):
        parse_recipe("dp=4,tp=2,etp=1").check(8)


def test_expert_grids():
    # No recipe ep: today's degrees (ep dividing dp), experts split tp ways.
    assert expert_grids(Mesh(4, 2), [8], Recipe()) == [(1, None), (2, None), (4, None)]
    # ep 8 over dp 4: folded, etp 1 by default; etp = tp is written as None.
    assert expert_grids(Mesh(4, 2), [8], Recipe(ep=8)) == [(8, 1)]
    assert expert_grids(Mesh(4, 2), [8], Recipe(ep=4, etp=1)) == [(4, 1)]
    assert expert_grids(Mesh(4, 2), [8], Recipe(ep=4, etp=2)) == [(4, None)]
    # 8 experts do not split 16 ways; 16 x 1 does not divide 4 x 2; no sp with etp < tp.
    assert expert_grids(Mesh(8, 2), [8], Recipe(ep=16)) == []
    assert expert_grids(Mesh(4, 2), [16], Recipe(ep=16)) == []
    assert expert_grids(Mesh(4, 2, sp=False), [8], Recipe(ep=8)) == []


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEPSEEK = ["-g", "hf:" + os.path.join(ROOT, "examples", "hf", "deepseek-v3.json"), "-p", "1024", "-b", "8192", "-m", "4096", "--machine", "h100-sxm"]


def test_deepseek_v3_nemo_recipe_is_priced_folded(tmp_path):
    # NeMo's DeepSeek-V3 recipe: ep 64 over dp 32 x tp 2 (etp 1 x ep 64 x edp 1 = tp 2 x dp 32),
    # refused before MoE parallel folding was modelled; the plan's recipe keeps etp=1 so that
    # --evaluate prices it again to the same step and peak.
    status, out, err = run(*DEEPSEEK, "--recipe", "dp=32,tp=2,pp=16,ep=64", "--json")
    assert status == 0, err
    first = json.loads(out)
    training = first["training"]
    assert training["mesh"] == {"dp": 32, "tp": 2, "pp": 16, "cp": 1, "ep": 64, "etp": 1}
    assert training["recipe"].startswith("dp=32,tp=2,ep=64,etp=1,pp=16,")
    assert "MoE parallel folding" in first["search"]["optimal_over"]
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    status, out, err = run("-g", DEEPSEEK[1], "--evaluate", plan, "--json")
    assert status == 0, err
    again = json.loads(out)["training"]
    assert again["step_seconds"] == training["step_seconds"]
    assert again["peak_memory_bytes"] == training["peak_memory_bytes"]


@pytest.mark.parametrize("recipe,reason", [
    ("dp=32,tp=2,pp=16,ep=128", "ep 128 x etp 1 does not divide dp 32 x cp 1 x tp 2 = 64 (MoE parallel folding)"),
    ("dp=32,tp=2,pp=16,ep=512", "ep 512 does not divide the 256 experts"),
    ("dp=32,tp=2,cp=1,pp=16,ep=64,sp=false", "recipe etp=1 < tp=2 needs sequence parallelism"),
])
def test_folding_refusals_are_one_line(recipe, reason):
    status, out, err = run(*DEEPSEEK, "--recipe", recipe)
    assert status == 2 and reason in err and "Traceback" not in err, err
