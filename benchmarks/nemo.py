"""Modelled step time of published low-precision runs (issue 31): NVIDIA NeMo / Megatron-Bridge
FP8 rows on H100 and B200, and llm-foundry's FP8/BF16 pairs on H100.

Each run is priced with its published configuration as a recipe (``pase.parse_recipe``: TP, PP,
CP, VP, EP, MBS, GBS and ``precision=fp8``) by ``pase.plan_training`` on a shipped preset
(``h100-sxm``, ``b200``), under two sets of constants:

1. the tool's defaults (nothing tuned);
2. the three global constants ``benchmarks/published.py`` fits on the BF16 Megatron-Core and
   torchtitan rows (:data:`PUBLISHED_FIT`; the GEMM ceiling applies to every format's peak).

Signed errors are model / published - 1 (negative: the model is faster). The llm-foundry
pairs compare speed-ups: published FP8 tokens/s over BF16 tokens/s against the modelled
BF16 step over the FP8 step. Written to ``benchmarks/results/nemo.md``.

Dependency: the Megatron engine profile (``--engine megatron``) and the recalibrated defaults
come from the ``calib`` branch; this script uses what is on its branch (the framework options
of ``benchmarks/published.py``), so its errors move when those land.

Run from the repository root: ``python3 benchmarks/nemo.py`` (a few minutes on two cores).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pase  # noqa: E402
from pase.machines.calibrated import PRESET_TABLES, load_description  # noqa: E402
from pase.sources.registry import load as load_source  # noqa: E402

PUBLISHED = "/work/shared/reference/published"
HF = os.path.join(ROOT, "examples", "hf")
SHARED_HF = "/work/shared/reference/hf-configs"
GiB = 2.0 ** 30

#: ``benchmarks/published.py``'s fitted constants (its results/published.md, table 2).
PUBLISHED_FIT = {"gemm_ceiling": 0.5, "attention_efficiency": 0.3, "overlap_efficiency": 0.75}
DEFAULTS = {"gemm_ceiling": None, "attention_efficiency": None, "overlap_efficiency": None}
#: Megatron-Core as ``benchmarks/published.py`` prices it (Transformer Engine's fused kernels,
#: the fused vocabulary-parallel loss, --tp-comm-overlap), a 4 us launch floor per kernel.
MEGATRON = {"eager": False, "loss_buffers": 2.0, "tp_overlap": True, "launch_seconds": 4e-6}
#: Composer + PyTorch FSDP with Transformer Engine layers for FP8 (llm-foundry): PyTorch's
#: cross entropy on fp32 logits (3 buffers), fused norms and flash attention.
FOUNDRY = {"eager": False, "loss_buffers": 3.0, "launch_seconds": 4e-6}

#: Model configs: the published architecture as a Hugging Face config.
GPT3_175B = {"model_type": "gpt2", "n_embd": 12288, "n_head": 96, "n_inner": 49152, "n_layer": 96,
             "n_positions": 2048, "vocab_size": 51200, "activation_function": "gelu", "tie_word_embeddings": True}


def mpt(d_model, heads, layers, seq):
    """An MPT (llm-foundry's mpt-<size>.yaml: GELU MLP 4x, LayerNorm, tied embeddings) as a GPT-2
    config of its shape (the hf: source on this branch reads no ``mpt``; ALiBi against learned
    positions changes no product)."""
    return {"model_type": "gpt2", "n_embd": d_model, "n_head": heads, "n_inner": 4 * d_model, "n_layer": layers,
            "n_positions": seq, "vocab_size": 50368, "activation_function": "gelu", "tie_word_embeddings": True}


def config_for(model: str, tmp: str, seq: int) -> str:
    files = {"LLAMA3_70B": os.path.join(HF, "llama-3.1-70b.json"), "LLAMA3_8B": os.path.join(HF, "llama-3.1-8b.json"),
             "Qwen3_30B_a3B": os.path.join(SHARED_HF, "qwen3-30b-a3b.json")}
    if model in files:
        return files[model]
    data = GPT3_175B if model == "GPT3-175B" else mpt(2560, 20, 32, seq) if model == "mpt-3b" else None
    if data is None:
        raise SystemExit(f"no architecture for {model}")
    path = os.path.join(tmp, f"{model}-{seq}.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def nemo_rows() -> list:
    with open(os.path.join(PUBLISHED, "nemo-megatron-bridge.json")) as f:
        return json.load(f)["rows"]


def nemo_recipe(row: dict) -> str:
    """The published configuration in recipe words: dp from the GPUs, Megatron's distributed
    optimizer (ZeRO-1) or FSDP (ZeRO-3) where the ``fsdp`` column says so, VP as interleaved
    virtual stages, EP, MBS, no recomputation (the 8B H100 recipe recomputes 5 of 32 layers,
    not priced), FP8 current scaling (the file: H100 rows are per-tensor, 'FP8-CS')."""
    tp, pp, cp = row["tp"], row["pp"], row["cp"]
    dp = row["gpus"] // (tp * pp * cp)
    parts = [f"dp={dp}", f"tp={tp}", f"pp={pp}", f"cp={cp}"]
    if row.get("vp"):
        parts += ["schedule=interleaved", f"vpp={row['vp']}"]
    if row.get("ep") and row["ep"] > 1:
        parts.append(f"ep={row['ep']}")
    parts += [f"zero={3 if row.get('fsdp') else 1}", "recompute=none", f"microbatch={row['mbs']}",
              "precision=fp8", "scaling=current"]
    if tp > 1:
        parts.append("tp_overlap=true")
    return ",".join(parts)


def foundry_rows() -> list:
    with open(os.path.join(PUBLISHED, "llm-foundry-mpt-h100.json")) as f:
        rows = json.load(f)["rows"]
    fp8 = [r for r in rows if r["precision"] == "amp_fp8"]
    pairs = []
    for r in fp8:
        twin = next(b for b in rows if b["precision"] == "amp_bf16" and b["model"] == r["model"]
                    and b["seq"] == r["seq"] and b["gpus"] == r["gpus"])
        pairs.append((r, twin))
    return pairs


def foundry_recipe(row: dict, precision: str) -> str:
    text = (f"dp={row['gpus']},tp=1,pp=1,zero={3 if row['sharding'] == 'FULL_SHARD' else 2},"
            f"recompute={'full' if row['activation_checkpointing'] else 'none'},microbatch={row['micro_batch']}")
    # amp_fp8: Transformer Engine's te.Linear under fp8_autocast with its default DelayedScaling.
    return text + (",precision=fp8,scaling=delayed" if precision == "fp8" else "")


_MACHINES: dict = {}


def machine(name: str, ceiling, tmp: str):
    key = (name, ceiling)
    if key not in _MACHINES:
        if ceiling is None:
            _MACHINES[key] = pase.load_machine(name)
        else:
            d = load_description(name)
            d["name"] = f"{name}-ceiling-{ceiling:g}"
            d["peak_tflops"] = d["peak_tflops"] * ceiling
            d["dtype_tflops"] = {k: v * ceiling for k, v in d.get("dtype_tflops", {}).items()}
            if "measured" in d:
                d["measured"] = PRESET_TABLES[name]
            path = os.path.join(tmp, d["name"] + ".json")
            with open(path, "w") as f:
                json.dump(d, f)
            _MACHINES[key] = pase.load_machine(path)
    return _MACHINES[key]


def price(config: str, seq: int, batch: int, gpus: int, machine_name: str, recipe: str, framework: dict,
          constants: dict, tmp: str, bucket: float) -> dict:
    ceiling = constants.get("gemm_ceiling")
    m = machine(machine_name, ceiling, tmp)
    opts = dict(framework, bucket_elements=bucket)
    if constants.get("overlap_efficiency") is not None:
        opts["overlap_efficiency"] = constants["overlap_efficiency"]
    if constants.get("attention_efficiency") is not None:
        opts["attention_efficiency"] = min(1.0, constants["attention_efficiency"] / (ceiling or 1.0))
    base = pase.TrainingOptions(**opts)
    spec = f"hf:{config}"
    build = lambda n: load_source(spec, n, seq)  # noqa: E731
    rec = pase.parse_recipe(recipe)
    plan = pase.plan_training(build, batch, gpus, m, m.memory_bytes, 2.0, rec, base=base, free=False)
    fits = plan.best is not None
    if not fits:
        plan = pase.plan_training(build, batch, gpus, m, None, 2.0, rec, base=base, free=False)
    c = plan.best
    return dict(step=c.summary.step_seconds, memory=c.summary.peak_memory_bytes, recipe=c.recipe(), fits=fits,
                time=dict(c.summary.time), flops=c.summary.model_flops_per_step)


def pct(x) -> str:
    return "" if x is None else f"{x:+.1%}"


def share(result: dict) -> str:
    t = result["time"]
    return ", ".join(f"{k} {v / result['step']:.0%}" for k, v in t.items() if v > 0.005 * result["step"])


def run_nemo(constants: dict, tmp: str) -> list:
    out = []
    for row in nemo_rows():
        machine_name = {"DGX-H100": "h100-sxm", "DGX-B200": "b200"}[row["system"]]
        config = config_for(row["model"], tmp, row["seq"])
        recipe = nemo_recipe(row)
        dp = row["gpus"] // (row["tp"] * row["pp"] * row["cp"])
        bucket = max(40e6, 1e6 * dp)
        fp8 = price(config, row["seq"], row["gbs"], row["gpus"], machine_name, recipe, MEGATRON, constants, tmp,
                    bucket)
        bf16 = price(config, row["seq"], row["gbs"], row["gpus"], machine_name,
                     recipe.replace(",precision=fp8,scaling=current", ""), MEGATRON, constants, tmp, bucket)
        published = row["gbs"] * row["seq"] / (row["tokens_per_s_per_gpu"] * row["gpus"])
        out.append(dict(row=row, machine=machine_name, fp8=fp8, bf16=bf16, published=published,
                        err=fp8["step"] / published - 1.0))
    return out


def run_foundry(constants: dict, tmp: str) -> list:
    out = []
    for fp8_row, bf16_row in foundry_rows():
        config = config_for(fp8_row["model"], tmp, fp8_row["seq"])
        args = (config, fp8_row["seq"], fp8_row["global_batch"], fp8_row["gpus"], "h100-sxm")
        fp8 = price(*args, foundry_recipe(fp8_row, "fp8"), FOUNDRY, constants, tmp, 0.0)
        bf16 = price(*args, foundry_recipe(bf16_row, "bf16"), FOUNDRY, constants, tmp, 0.0)
        published_speedup = fp8_row["tokens_per_s"] / bf16_row["tokens_per_s"]
        modelled_speedup = bf16["step"] / fp8["step"]
        steps = [r["global_batch_tokens"] / r["tokens_per_s"] for r in (fp8_row, bf16_row)]
        # Diagnostic: the speed-up if the BF16 time the model misses (published - modelled) were work
        # that FP8 leaves as it is (attention, data loading, communication): the modelled saving alone.
        saving = bf16["step"] - fp8["step"]
        anchored = steps[1] / (steps[1] - saving)
        out.append(dict(anchored=anchored, anchored_err=anchored / published_speedup - 1.0))
        out[-1].update(dict(fp8_row=fp8_row, bf16_row=bf16_row, fp8=fp8, bf16=bf16, published_speedup=published_speedup,
                        modelled_speedup=modelled_speedup, err=modelled_speedup / published_speedup - 1.0,
                        published_steps=steps, err_fp8=fp8["step"] / steps[0] - 1.0,
                        err_bf16=bf16["step"] / steps[1] - 1.0))
    return out


def nemo_table(results: list, title: str, constants: dict) -> list:
    lines = [f"### {title}", "", "Constants: " + ", ".join(
        f"`{k}` = {'default' if v is None else v}" for k, v in constants.items()) + ".", "",
        "| run | system | GPUs | recipe priced | step s pub | step s model (FP8) | err | step s model (BF16) "
        "| modelled FP8 speed-up | memory GiB model |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        row = r["row"]
        lines.append(
            f"| {row['model']} ({row['precision']}, {row['container']}) | {row['system']} | {row['gpus']} "
            f"| `{r['fp8']['recipe']}`{'' if r['fp8']['fits'] else ' (does not fit)'} | {r['published']:.3f} "
            f"| {r['fp8']['step']:.3f} | {pct(r['err'])} | {r['bf16']['step']:.3f} "
            f"| {r['bf16']['step'] / r['fp8']['step']:.2f}x | {r['fp8']['memory'] / GiB:.1f} |")
    errs = sorted(abs(r["err"]) for r in results)
    lines += ["", f"Absolute step-time error: median **{errs[len(errs) // 2]:.1%}**, worst **{errs[-1]:.1%}**; "
              f"{sum(e <= 0.15 for e in errs)} of {len(errs)} within 15 %.", "", "Where the modelled FP8 step goes:", ""]
    lines += [f"- **{r['row']['model']} on {r['row']['system']}**: {share(r['fp8'])}." for r in results]
    return lines + [""]


def foundry_table(results: list, title: str) -> list:
    lines = [f"### {title}", "",
             "| model | seq | GPUs | recipe (BF16; FP8 adds precision=fp8,scaling=delayed) | FP8/BF16 pub "
             "| FP8/BF16 model | err | step s pub FP8 / BF16 | step s model FP8 / BF16 | err FP8 / BF16 "
             "| FP8/BF16, modelled saving on the published BF16 step | err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        f = r["fp8_row"]
        lines.append(
            f"| {f['model']} | {f['seq']} | {f['gpus']} | `{r['bf16']['recipe']}` | {r['published_speedup']:.3f} "
            f"| {r['modelled_speedup']:.3f} | {pct(r['err'])} | {r['published_steps'][0]:.2f} / "
            f"{r['published_steps'][1]:.2f} | {r['fp8']['step']:.2f} / {r['bf16']['step']:.2f} "
            f"| {pct(r['err_fp8'])} / {pct(r['err_bf16'])} | {r['anchored']:.3f} | {pct(r['anchored_err'])} |")
    lines += ["", "Last two columns, a diagnostic: the published BF16 step less the modelled FP8 saving (the model's "
              "BF16 - FP8 step), i.e. the speed-up if the time the model misses in BF16 were work FP8 leaves as it "
              "is (attention with ALiBi, data loading, communication)."]
    return lines + [""]


def main() -> None:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        md = ["# Published low-precision runs, modelled (issue 31)", "",
              "Written by `benchmarks/nemo.py`. NeMo / Megatron-Bridge rows from "
              "`../shared/reference/published/nemo-megatron-bridge.json`, llm-foundry pairs from "
              "`llm-foundry-mpt-h100.json`, as published. Published step = GBS x sequence / (tokens/s per GPU x "
              "GPUs). Signed errors are model / published - 1 (negative: the model is faster). Machines: the "
              "`h100-sxm` preset (measured table) and the `b200` preset (public specifications, GEMMs carried over "
              "from the H100 table, docs/machines.md). Precision: docs/precision.md. The Megatron engine profile "
              "and recalibrated defaults of the `calib` branch are not on this branch: the framework options are "
              "`benchmarks/published.py`'s.", ""]
        summary = []
        for title, constants in (("1. Defaults", DEFAULTS), ("2. With published.py's fitted constants",
                                                            PUBLISHED_FIT)):
            nemo = run_nemo(constants, tmp)
            md += nemo_table(nemo, f"NeMo {title}", constants)
            foundry = run_foundry(constants, tmp)
            md += foundry_table(foundry, f"llm-foundry FP8/BF16 pairs, {title[3:].lower()}")
            errs = [abs(r["err"]) for r in nemo]
            summary.append(f"{title}: NeMo median |err| {sorted(errs)[len(errs) // 2]:.1%}, worst {max(errs):.1%}; "
                           "llm-foundry speed-up errors " + ", ".join(pct(r["err"]) for r in foundry))
            print(summary[-1], flush=True)
    md += ["### Summary", ""] + [f"- {s}" for s in summary] + ["", f"({time.perf_counter() - start:.0f} s)", ""]
    path = os.path.join(ROOT, "benchmarks", "results", "nemo.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(f"written {path}")


if __name__ == "__main__":
    main()
