"""Machine presets from public specifications, the GEMM transfer rule and NVLink domains
(docs/machines.md, "Presets from public specifications", "Levels")."""

import io
import json

import numpy as np
import pytest

from pase.cli.app import main
from pase.machines.base import Group
from pase.machines.calibrated import PRESETS, CalibratedMachine, load_calibrated, load_description
from pase.machines.measured import MeasuredTables
from pase.machines.registry import load_machine
from pase.machines.specs import DTYPES, GemmTransfer, domain_sizes

SPEC_PRESETS = ("h100-sxm", "a100-sxm", "h200-sxm", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi300x")
SOURCED = ("memory_gib", "peak_tflops", "dtype_tflops", "hbm_gbps", "intra_node", "inter_node", "nvlink_domain",
           "rail_optimized", "sms", "clock_mhz")


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out, err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", SPEC_PRESETS)
def test_every_preset_figure_names_its_source(name):
    d = load_description(name)
    for field in SOURCED:
        assert d["sources"].get(field, "").strip(), f"{name}: no source for {field}"
    assert d["peak_tflops"] > 0 and d["hbm_gbps"] > 0 and d["sms"] > 0
    # A machine without its own table carries the H100's over.
    assert ("measured" in d) != ("gemm_reference" in d)


def test_preset_figures_as_published():
    # Dense = the datasheet's "with sparsity" figure halved; GB/s one way = bidirectional halved.
    b200 = load_description("b200")  # HGX B200: BF16 36 PF, FP8 72 PF, FP4 144 PF sparse for 8 GPUs
    assert (b200["peak_tflops"], b200["dtype_tflops"]) == (36000 / 8 / 2, {"fp8": 72000 / 8 / 2, "mxfp8": 4500,
                                                                           "nvfp4": 144000 / 8 / 2})
    gb200 = load_description("gb200-nvl72")  # NVL72: BF16 360 PF sparse, 576 TB/s, 130 TB/s NVLink for 72
    assert gb200["peak_tflops"] == 360000 / 72 / 2 and gb200["hbm_gbps"] == 576000 / 72
    assert gb200["intra_node"]["gbps"] == 1800 / 2 and gb200["nvlink_domain"] == 72
    assert gb200["devices_per_node"] == 4  # 18 compute trays of 4 GPUs
    assert load_description("a100-sxm")["dtype_tflops"] == {}  # no FP8 on Ampere
    assert load_machine("a100-sxm").precisions == ("bf16",)
    assert load_machine("h100-sxm").precisions == ("bf16", "fp8")
    assert load_machine("gb300-nvl72").precisions == DTYPES
    assert load_machine("mi300x").precisions == ("bf16", "fp8")


# -- the transfer rule ---------------------------------------------------------------------


def _linear_table():
    # t = 1 us x B + 6e-15 s x B M N K: multilinear, so the table's interpolation is exact.
    rows = [[b, m, n, k, 1e-6 * b + 6e-15 * b * m * n * k]
            for b in (1, 2) for m in (256, 1024, 4096) for n in (256, 1024, 4096) for k in (256, 1024, 4096)]
    return MeasuredTables(rows)


def test_transfer_rule_by_hand():
    # Reference: 1000 TFLOPS, 1 TB/s, 100 SMs. Target: 2000 (bf16) / 4000 (fp8) TFLOPS, 2 TB/s, 200 SMs.
    t = GemmTransfer(_linear_table(), 1e15, 1e12, 100, {"bf16": 2e15, "fp8": 4e15}, 2e12, 200)
    floor = 1e-6 + 6e-15 * 256 ** 3  # the table's least time (B = 1, 256^3): 1.10066 us
    assert t.floor == pytest.approx(floor, rel=1e-12)
    # s = 100/200 = 0.5. 1024^3: base = the reference at M = 512, / s:
    # (1e-6 + 6e-15 * 512 * 1024^2) / 0.5 = 8.4425 us. Roofline of the reference: max(6.44e9 / 1e15,
    # 3 * 3 * 1024^2 * 2 / 1e12 = 18.874 us) = 18.874 us, above the (made-up) table: both rooflines x k =
    # 8.4425 / 18.874; target BF16 roofline 9.437 us x k = 4.2212 us = base / 2, nothing left over.
    base = (1e-6 + 6e-15 * 512 * 1024 ** 2) / 0.5
    assert float(t.gemm_seconds(1, 1024, 1024, 1024)) == pytest.approx(base / 2, rel=1e-9)
    # FP8: roofline max(6.44e9 / 4e15, 9437184 * 1 / 2e12 = 4.7186 us) x k = base / 4.
    assert float(t.gemm_seconds(1, 1024, 1024, 1024, "fp8")) == pytest.approx(base / 4, rel=1e-9)
    # 4096^3: base = 2 us + 6e-15 * 2048 * 4096^2 / 0.5 = 2 us + 412.32 us; reference roofline
    # 6 * 4096^3 / 1e15 = 412.32 us (compute-bound), left over 2 us: the floor 1.10066 us stays, the other
    # 0.89934 us moves with the peaks (x 1/2); target roofline 412.32 / 2 = 206.16 us:
    # 206.16 + 1.10066 + 0.44967 = 207.711 us.
    rest = 2e-6
    expected = 6 * 4096 ** 3 / 2e15 + floor + (rest - floor) / 2
    assert float(t.gemm_seconds(1, 4096, 4096, 4096)) == pytest.approx(expected, rel=1e-9)


def test_transfer_rule_is_the_table_on_the_reference():
    h100 = load_machine("h100-sxm")
    shapes = (1, [512, 4096, 8192], [1024, 4096, 8192], [4096, 8192, 1024])
    # In BF16 the reference prices from its own table, and the rule on itself is the identity.
    same = h100.transfer.gemm_seconds(*shapes, "bf16")
    assert np.allclose(np.maximum(same, 6.0 * np.prod(np.broadcast_arrays(*shapes), axis=0) / 989e12),
                       h100.gemm(*shapes))
    # FP8 of 8192^3 on H100: compute-bound in both formats; the roofline 6 * 8192^3 / 989e12 = 3.336 ms
    # of the measured 4.343 ms halves (x 989/1979), the table's launch floor stays, the rest of the
    # measured time moves with the peak too.
    bf16 = float(h100.gemm(1, 8192, 8192, 8192))
    roof = 6 * 8192 ** 3 / 989e12
    floor = h100.transfer.floor
    expected = roof * 989 / 1979 + floor + (bf16 - roof - floor) * 989 / 1979
    assert float(h100.gemm(1, 8192, 8192, 8192, dtype="fp8")) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="machine h100-sxm has no nvfp4 GEMMs"):
        h100.gemm(1, 64, 64, 64, dtype="nvfp4")


def test_h200_gemms_are_the_h100s_but_for_the_bandwidth():
    # Same die, same peaks and SMs (s = 1): a compute-bound GEMM is the H100's time; a latency-bound
    # one keeps its measured time but for its roofline part, which moves with the bandwidth.
    h100, h200 = load_machine("h100-sxm"), load_machine("h200-sxm")
    assert float(h200.gemm(1, 8192, 8192, 8192)) == pytest.approx(float(h100.gemm(1, 8192, 8192, 8192)))
    # M = N = K = 64: roofline max(6 * 64^3 / 989e12, 3 * 3 * 64^2 * 2 bytes / 3.35e12) = 22.0 ns on
    # the H100 (bandwidth), 15.4 ns at 4.8 TB/s; the rest of its measured ~5 us stays.
    traffic = 3 * 3 * 64 ** 2 * 2
    assert float(h200.gemm(1, 64, 64, 64)) == pytest.approx(
        float(h100.gemm(1, 64, 64, 64)) - traffic / 3.35e12 + traffic / 4.8e12, rel=1e-9)
    # Memory-bound: the measured launch floor stays, the rest x 3350 / 4800.
    floor = h200.transfer.memory_floor
    assert floor == 1.265e-06  # the shipped table's least memory-bound time (add, 4096 elements)
    t = float(h100.memory_bound("gelu", 1e8))
    assert float(h200.memory_bound("gelu", 1e8)) == pytest.approx(floor + (t - floor) * 3350 / 4800, rel=1e-12)


# -- NVLink domains ------------------------------------------------------------------------


def test_domain_sizes_by_hand():
    # 128 GPUs on NVL72 racks: 64 per rack (16 trays), the largest divisor <= 72 of whole trays.
    assert domain_sizes([16, 64, 72, 128, 144, 256, 100], 72, 4).tolist() == [16, 64, 72, 64, 72, 64, 20]


def test_all_reduce_over_16_gpus_of_one_nvl72_domain():
    m = load_machine("gb200-nvl72")  # 900 GB/s and 3 us in a domain, 50 GB/s and 10 us between
    # 5e8 elements x 2 bytes = 1e9 bytes, 16 GPUs of one domain: a ring over NVLink,
    # 2 * 15/16 * 1e9 / 900e9 + 2 * 15 * 3 us = 2.08333 ms + 90 us = 2.17333 ms.
    one = Group(np.array([[16]]), np.array([[1]]), np.array([16]))
    assert float(m.all_reduce(5e8, one)[0]) == pytest.approx(2 * 15 / 16 * 1e9 / 900e9 + 90e-6, rel=1e-12)
    # The same 16 GPUs on an H100 cluster span 2 nodes: 2 * 7/8 * 1e9 / 450e9 + 42 us
    # + 2 * 1/2 * (1e9 / 8) / 50e9 + 20 us = 3.889 + 0.042 + 2.5 + 0.020 = 6.451 ms.
    h100 = load_machine("h100-sxm")
    assert float(h100.all_reduce(5e8, Group.flat(16))[0]) == pytest.approx(
        2 * 7 / 8 * 1e9 / 450e9 + 42e-6 + 1e9 / 8 / 50e9 + 20e-6, rel=1e-12)


def test_all_reduce_over_16_gpus_of_two_nvl72_domains():
    m = load_machine("gb200-nvl72")
    # A job of 128 GPUs: 64 per rack. 16 GPUs at stride 8 span devices 0..120: 64 // 8 = 8 in each
    # of 2 domains. Reduce-scatter in the domain, all-reduce of the 1/8 shard across, all-gather:
    # 2 * 7/8 * 1e9 / 900e9 + 2 * 7 * 3 us + 2 * 1/2 * (1e9 / 8) / 50e9 + 2 * 1 * 10 us
    # = 1.94444 ms + 42 us + 2.5 ms + 20 us = 4.50644 ms.
    two = Group(np.array([[16]]), np.array([[8]]), np.array([128]))
    expected = 2 * 7 / 8 * 1e9 / 900e9 + 42e-6 + 1e9 / 8 / 50e9 + 20e-6
    assert float(m.all_reduce(5e8, two)[0]) == pytest.approx(expected, rel=1e-12)
    # All-to-all of 1e9 bytes over the same group: 7/16 of it over NVLink, 8/16 over the network:
    # max(7/16 * 1e9 / 900e9 + 3 us, 8/16 * 1e9 / 50e9 + 10 us) = 10.01 ms.
    assert float(m.all_to_all(5e8, two)[0]) == pytest.approx(0.5e9 / 50e9 + 10e-6, rel=1e-12)
    # Redistribution among 64 devices stays on NVLink; among 128 it crosses racks.
    assert float(m.redistribute(5e8, 64)) == pytest.approx(1e9 / 900e9 + 6e-6)
    assert float(m.redistribute(5e8, 128)) == pytest.approx(1e9 / 50e9 + 20e-6)


def test_check_procs_on_nvl72_takes_whole_trays():
    m = load_machine("gb200-nvl72")
    for p in (1, 2, 4, 6, 64, 70, 72, 128, 256):  # any count within one rack; beyond it whole trays
        m.check_procs(p)
    with pytest.raises(ValueError, match="do not fill whole nodes of 4"):
        m.check_procs(130)


# -- machine files and the command ---------------------------------------------------------


@pytest.mark.parametrize("field,value,message", [
    ("dtype_tflops", {"fp4": 9}, "dtype_tflops has no format 'fp4'"),
    ("dtype_tflops", {"fp8": -1}, "dtype_tflops.fp8 must be a positive number"),
    ("dtype_tflops", [1], "dtype_tflops must be an object"),
    ("nvlink_domain", 12, "nvlink_domain 12 must be a multiple of devices_per_node 8"),
    ("nvlink_domain", "72", "nvlink_domain must be a positive integer"),
    ("sms", 0, "sms must be a positive integer"),
    ("rail_optimized", "yes", "rail_optimized must be true or false"),
    ("clock_mhz", {"turbo": 1}, "clock_mhz must be an object"),
    ("clock_mhz", {"boost": -5}, "clock_mhz.boost must be a positive number or null"),
    ("clock_mhz", {"boost": 1000, "base": 1200}, "must not exceed the boost clock"),
    ("gemm_reference", "b200", "gemm_reference must name a preset with a measured table"),
    ("sources", {"sms": ""}, "sources must be an object"),
])
def test_bad_spec_fields_are_one_line(tmp_path, field, value, message):
    d = {k: v for k, v in load_description("b200").items()}
    d[field] = value
    path = tmp_path / "m.json"
    path.write_text(json.dumps(d))
    status, out, err = run("-g", "alexnet", "-p", "8", "--machine", str(path))
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_a_machine_file_with_the_new_fields(tmp_path):
    d = dict(load_description("gb200-nvl72"), name="my-rack")
    path = tmp_path / "rack.json"
    path.write_text(json.dumps(d))
    m = load_machine(str(path))
    assert m.nvlink_domain == 72 and m.reference == "h100-sxm" and m.precisions == DTYPES
    assert float(m.gemm(1, 4096, 4096, 4096)) == float(load_machine("gb200-nvl72").gemm(1, 4096, 4096, 4096))


def test_pase_machines_lists_every_preset():
    status, out, err = run("machines")
    assert status == 0 and err == ""
    lines = out.splitlines()
    for name in PRESETS:
        assert any(line.split()[:1] == [name] for line in lines)
    b200 = next(line for line in lines if line.startswith("b200 "))
    assert b200.split() == ["b200", "8", "8", "179.06", "8", "2250", "4500", "4500", "9000", "900", "50", "from",
                            "h100-sxm"]
    status, out, _ = run("machines", "--json")
    assert status == 0 and {r["machine"] for r in json.loads(out)} == set(PRESETS)
    status, out, _ = run("machines", "b300")
    assert status == 0 and "source: NVIDIA Blackwell Ultra technical blog (2025): 160 SMs" in out
    status, out, err = run("machines", "h300")
    assert status == 2 and out == "" and err.startswith("pase machines: error: unknown machine 'h300'")


def test_the_search_lets_tp_span_the_domain():
    # Brute force over the divisors: tp within the domain (72 on NVL72, the node of 8 on HGX).
    from pase.planning.training_search import mesh_candidates
    nvl = {m.tp for m in mesh_candidates(64, load_machine("gb200-nvl72"))}
    hgx = {m.tp for m in mesh_candidates(64, load_machine("h100-sxm"))}
    assert nvl == {d for d in range(1, 65) if 64 % d == 0}
    assert hgx == {1, 2, 4, 8}
    # A recipe's tp may cross the domain (issue 41: layouts that ran are priced): over the network.
    from pase.planning.mesh import Recipe
    assert {m.tp for m in mesh_candidates(64, load_machine("h100-sxm"), Recipe(tp=16))} == {16}
    status, out, err = run("-g", "llama3-8b", "-p", "16", "-b", "16", "-m", "512", "--machine", "h100-sxm",
                           "--recipe", "dp=1,tp=16")
    assert status == 0, err
    assert "  tp 16 crosses nodes: its collectives are priced over the network (2 domains of 8 GPUs)" in out


def test_a_layers_groups_know_their_job():
    # A configuration of 128 devices, batch 8 ways outermost (stride 16) and a dimension 16 ways
    # (stride 1), on NVL72 racks: 64 GPUs per rack. The 16-way group lies in one rack; the 8-way
    # group has 64 // 16 = 4 members in each of 2 racks.
    from pase.machines.base import layout_strides
    m = load_machine("gb200-nvl72")
    C = np.array([[8, 16]])
    strides = layout_strides(C, batch_dim=0)
    inner, outer = Group.of(C, strides, [1]), Group.of(C, strides, [0])
    assert inner.devices.tolist() == [128] and m.levels.members(inner).tolist() == [16]
    assert m.levels.members(outer).tolist() == [4]
    # 1e9 bytes over the 8-way group: 2 * 3/4 * 1e9 / 900e9 + 2 * 3 * 3 us + 2 * 1/2 * (1e9 / 4) / 50e9
    # + 2 * 1 * 10 us = 1.6667 ms + 18 us + 5 ms + 20 us = 6.7047 ms.
    assert float(m.all_reduce(5e8, outer)[0]) == pytest.approx(
        2 * 0.75 * 1e9 / 900e9 + 18e-6 + 1e9 / 4 / 50e9 + 20e-6, rel=1e-12)


def test_one_rule_for_the_sustained_clock():
    # clock_ratio = sustained / boost, else base / boost, where the boost clock and one of them
    # are stated; else 1. H100 SXM5 and H200 (the same GH100 die at 700 W): 1590 / 1980 =
    # 0.80303; the A100 (boost 1410, no base stated), Blackwell and MI300X state no pair: 1.
    from pase.machines.specs import clock_ratio_of
    assert clock_ratio_of({"boost": 1980, "base": 1590, "sustained": None}) == pytest.approx(0.80303, abs=1e-5)
    assert clock_ratio_of({"boost": 2000, "base": 1500, "sustained": 1800}) == pytest.approx(0.9)  # sustained first
    assert clock_ratio_of({"boost": None, "sustained": None}) is None
    assert clock_ratio_of({"boost": 1410, "sustained": None}) is None
    for name in ("h100-sxm", "h100-sxm-nccl", "h200-sxm"):
        assert load_calibrated(name).clock_ratio == pytest.approx(1590 / 1980)
    for name in ("a100-sxm", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi300x"):
        assert load_calibrated(name).clock_ratio == 1.0
    # A stated clock_ratio wins over the rule (a machine file measured at another clock).
    d = dict(load_description("h200-sxm"), clock_ratio=0.9)
    assert CalibratedMachine(d).clock_ratio == 0.9
