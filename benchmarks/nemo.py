"""Modelled step time of published low-precision runs (issue 31), priced by the command line.

Every visible NVIDIA NeMo / Megatron-Bridge FP8 row (``reference/published/nemo-megatron-bridge.json``
of the shared folder beside the checkout, found as ``benchmarks/published.py`` finds it) is priced
exactly as a user would type it, with the CLI's defaults and no other constants::

    pase -g hf:CONFIG -p GPUS -b GBS -m SEQ --machine h100-sxm|b200 --engine megatron
         --recipe dp=..,tp=..,pp=..,cp=..,zero=1|3,[schedule=interleaved,vpp=VP,]ep=..,
                  microbatch=MBS,precision=fp8,scaling=current|delayed --json

- configs: ``examples/hf/llama-3.1-70b.json`` / ``llama-3.1-8b.json`` (Llama 3 70B / 8B: the same
  shapes), ``examples/hf/qwen3-30b-a3b.json``, ``benchmarks/configs/gpt3-175b.json`` (GPT-3 175B);
- ``zero`` from the published FSDP column (0: Megatron's distributed optimizer, ZeRO-1; >0: FSDP,
  ZeRO-3); ``vpp`` and the interleaved schedule where VP > 1; ``ep`` as published;
- scaling: ``current`` where the row says FP8-CS and for Megatron-Bridge's (26.x) H100 "FP8" rows
  (per-tensor current scaling, the file's note); ``delayed`` for NeMo 24.07 (Transformer Engine's
  DelayedScaling, NeMo's default then);
- ``--engine megatron,adam=apex`` for NeMo 24.x (NeMo 1.x's Apex distributed Adam,
  ``nemo_runs.nemo_engine``), ``--engine megatron`` for the rest;
- ``tp_overlap=true`` where NVIDIA's recipe turns TP communication overlap on
  (``nemo_runs.TP_OVERLAP_PRESETS``: Llama 3 70B on H100, GPT-3 175B);
- recomputation and everything else: the CLI's defaults / search.

Rows whose published layout does not fit the modelled memory are priced again with
``--memory 100000`` (no cap) and marked so. Recomputation is not published: each row is priced
as the search picks it and again with ``recompute=none`` (uncapped where it does not fit).

llm-foundry's FP8/BF16 pairs (``llm-foundry-mpt-h100.json``): both precisions priced as
``benchmarks/published.py`` prices the BF16 rows (``--engine fsdp``, ``benchmarks/configs/mpt-*.json``
with ``n_positions`` = the sequence), the FP8 one with ``precision=fp8,scaling=delayed`` added
(Transformer Engine's default recipe under Composer's amp_fp8); compared as speed-ups, published FP8
tokens/s over BF16 tokens/s against the modelled BF16 step over the FP8 step.

Issue 42: a pipeline without virtual stages is priced 1F1B (``schedule=1f1b``), and a MoE row
with NVIDIA's recipe words of its experts where the recipe sets them (``nemo_runs.MOE_PRESETS``:
the token dispatcher, the EP overlap); the rows also carry NVIDIA's second Qwen3-30B-A3B layout
on 16 H100 (``nemo_runs.EXTRA_ROWS``). A section prices the two Qwen3 layouts with and without
those words, and NVIDIA's Llama 3.1 405B layout on 256 GB200 (tp 4, pp 16, vp 8, MXFP8) with the
embedding and the loss counted as pipeline layers (``pipeline_extra=embedding+loss``).

Signed errors: model / published - 1 on the step time (negative: the model is faster); on the
speed-up for the pairs. Written to ``benchmarks/results/nemo.md``.

Run from the repository root: ``python3 benchmarks/nemo.py`` (seconds).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from nemo_runs import nemo_recipe, nemo_rows  # noqa: E402
from published import GiB, price, published_dir  # noqa: E402
from pase.machines.calibrated import load_description  # noqa: E402

#: Targets of issue 31 (absolute signed error).
TARGETS = {"dense": 0.15, "moe": 0.20, "speedup": 0.10}


def foundry_pairs(folder: str) -> list:
    with open(os.path.join(folder, "llm-foundry-mpt-h100.json")) as f:
        rows = json.load(f)["rows"]
    pairs = []
    for r in rows:
        if r["precision"] != "amp_fp8":
            continue
        twin = next(b for b in rows if b["precision"] == "amp_bf16" and b["model"] == r["model"]
                    and b["seq"] == r["seq"] and b["gpus"] == r["gpus"] and b["gpu"] == r["gpu"])
        pairs.append((r, twin))
    return pairs


def foundry_row(r: dict, fp8: bool) -> dict:
    zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[r["sharding"]]
    recipe = (f"dp={r['gpus']},tp=1,pp=1,zero={zero},recompute={'full' if r['activation_checkpointing'] else 'none'}"
              f",microbatch={r['micro_batch']}") + (",precision=fp8,scaling=delayed" if fp8 else "")
    return dict(name=f"llm-foundry {r['model']} seq {r['seq']} {'FP8' if fp8 else 'BF16'}", engine="fsdp",
                machine="h100-sxm", config=os.path.join("benchmarks", "configs", f"{r['model']}.json"),
                positions=r["seq"], gpus=r["gpus"], batch=r["global_batch"], seq=r["seq"], recipe=recipe)


def pct(x) -> str:
    return "" if x is None else f"{x:+.1%}"


def share(m: dict) -> str:
    return ", ".join(f"{k} {v / m['step']:.0%}" for k, v in m["time"].items() if v > 0.005 * m["step"])


def command(m: dict) -> str:
    return "pase " + " ".join(m["argv"])


#: NVIDIA's Llama 3.1 405B on 256 GB200 (Megatron-Bridge LLAMA31_405B_PRETRAIN_CONFIG_GB200_*_V2:
#: tp 4, pp 16, vp 8, GBS 1536, the account-for-embedding/loss flags on; research note moe.md
#: section 7), MXFP8, priced from its published degrees.
LAYOUT_405B = dict(name="Llama 3.1 405B, 256 GB200, tp 4 pp 16 vp 8, MXFP8", engine="megatron", machine="gb200-nvl72",
                   config=os.path.join("examples", "hf", "llama-3.1-405b.json"), gpus=256, batch=1536, seq=8192,
                   recipe="dp=4,tp=4,pp=16,cp=1,zero=1,schedule=interleaved,vpp=8,microbatch=1,precision=mxfp8,"
                          "pipeline_extra=embedding+loss")


#: NVIDIA's DeepSeek-V3 on 256 B200 (Megatron-Bridge perf_recipes/deepseek/b200/deepseek_v3.py:32-43
#: BF16 and :80-91 FP8 current scaling: tp 1, pp 16, ep 8, micro-batch 1, GBS 4096, recompute
#: modules ["mla_up_proj"]; its cut recipes/deepseek/h100/deepseek_v3.py:58, four decoder layers a
#: stage and one on the last, beside the multi-token prediction and the loss: ``--mtp``), priced
#: from its published degrees, and with Megatron's default module (core_attn) in their place.
DEEPSEEK_B200 = [dict(name=f"DeepSeek-V3, 256 B200, tp 1 pp 16 ep 8, {label}", engine="megatron", machine="b200",
                      config=os.path.join("examples", "hf", "deepseek-v3.json"), flags=["--mtp"], gpus=256,
                      batch=4096, seq=4096,
                      recipe="dp=16,tp=1,pp=16,cp=1,zero=1,schedule=1f1b,ep=8,microbatch=1,stages="
                             + "/".join(["4"] * 15 + ["1"]) + ",recompute=selective" + modules + precision)
                 for label, precision in (("BF16", ""), ("FP8-CS", ",precision=fp8,scaling=current"))
                 for modules in (",recompute_modules=mla_up_proj", "")]


def deepseek_section(tmp: str) -> list:
    """NVIDIA's DeepSeek-V3 layouts on B200 with and without the modules its recipes recompute."""
    md = ["", "NVIDIA's **DeepSeek-V3 on 256 B200** as its performance recipes run it (tp 1, pp 16, ep 8, "
          "micro-batch 1, its cut of four decoder layers a stage and one on the last, its multi-token "
          "prediction module beside the loss: `--mtp`), with the modules those recipes recompute (`mla_up_proj`) and with "
          "Megatron's default (`core_attn`) in their place:", "",
          "| layout | recompute modules | step s | tokens/s per GPU | peak GB of 192 | fits |", "|---|---|---|---|---|---|"]
    priced = [price(row, tmp) for row in DEEPSEEK_B200]
    for row, m in zip(DEEPSEEK_B200, priced):
        modules = "mla_up_proj" if "mla_up_proj" in row["recipe"] else "core_attn (Megatron's default)"
        md.append(f"| {row['name']} | `{modules}` | {m['step']:.2f} | {m['tokens']:,.0f} | {m['memory'] / 1e9:.1f} | "
                  f"{'yes' if m['fits'] else 'no (priced with --memory 100000)'} |")
    md += ["", f"- `{command(priced[0])}`"]
    return md


def layouts_section(nemo: list, tmp: str) -> list:
    """Issue 42's checks: the two Qwen3-30B-A3B layouts with and without NVIDIA's expert words,
    and the 405B layout on GB200 (with its stages)."""
    qwen = [r for r in nemo if r["row"]["published"]["model"] == "Qwen3_30B_a3B"
            and r["row"]["published"]["system"] == "DGX-H100" and r["row"]["gpus"] == 16]
    md = ["", "## Issue 42: NVIDIA's layouts as its recipes run them", "",
          "NVIDIA's two Qwen3-30B-A3B layouts on 16 H100, measured equal, priced with the expert settings "
          "of NVIDIA's recipes (`nemo_runs.MOE_PRESETS`: HybridEP for ep 16 over two nodes, the EP overlap for "
          "pp 2 x vp 12) and without them (every routed copy by NCCL all-to-all, nothing overlapped, as "
          "before issue 42):", "",
          "| layout | step s pub | recipe words | step s model | err | step s model, without | err |",
          "|---|---|---|---|---|---|---|"]
    bare_steps, steps = [], []
    for r in qwen:
        row = r["row"]
        bare = price(dict(row, recipe=nemo_recipe(row["published"], preset=False)), tmp)
        plain = nemo_recipe(row["published"], preset=False).split(",")
        words = ",".join(w for w in row["recipe"].split(",") if w not in plain) or "-"
        steps.append(r["fp8"]["step"])
        bare_steps.append(bare["step"])
        md.append(f"| {row['name']} | {row['step_pub']:.3f} | `{words}` | {r['fp8']['step']:.3f} | {pct(r['err'])} "
                  f"| {bare['step']:.3f} | {pct(bare['step'] / row['step_pub'] - 1.0)} |")
    if len(steps) == 2:
        md += ["", f"Modelled ratio of the two: **{max(steps) / min(steps):.2f}x** with NVIDIA's settings "
               f"(target: within 1.15x), {max(bare_steps) / min(bare_steps):.2f}x without; measured "
               f"{max(r['row']['step_pub'] for r in qwen) / min(r['row']['step_pub'] for r in qwen):.2f}x."]
    m = price(LAYOUT_405B, tmp)
    with open(os.devnull, "w") as devnull:
        from pase.cli import main as pase_main
        import io
        err = io.StringIO()
        plain = LAYOUT_405B["recipe"].replace(",pipeline_extra=embedding+loss", "")
        status = pase_main(["-g", "hf:" + LAYOUT_405B["config"], "-p", "256", "-b", "1536", "-m", "8192",
                            "--machine", "gb200-nvl72", "--engine", "megatron", "--recipe", plain],
                           stdout=devnull, stderr=err)
    md += ["", f"**{LAYOUT_405B['name']}** (`{m['recipe']}`): step {m['step']:.2f} s, "
           f"{m['tokens']:,.0f} tokens/s per GPU, peak {m['memory'] / GiB:.1f} GiB"
           + ("" if m["fits"] else " (does not fit: priced with --memory 100000)")
           + ". The embedding and the loss count as pipeline layers (Megatron's "
           "`--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`): 128 units over "
           "16 ranks x 8 virtual stages, the first virtual stage of rank 0 the embedding alone, the last of rank 15 "
           "the loss alone, ranks 0 and 15 seven decoder layers, the others eight. Without "
           f"`pipeline_extra` the same degrees are refused (exit {status}): `{err.getvalue().strip()}`.",
           "", f"- `{command(m)}`"]
    return md + deepseek_section(tmp)


def main() -> int:
    start = time.perf_counter()
    folder = published_dir()
    nemo, foundry = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for row in nemo_rows(folder):
            row["recipe"] = nemo_recipe(row["published"])
            fp8 = price(row, tmp)
            bf16 = price(dict(row, recipe=nemo_recipe(row["published"], precision=False)), tmp)
            bare = price(dict(row, recipe=row["recipe"] + ",recompute=none"), tmp)
            err = fp8["step"] / row["step_pub"] - 1.0
            nemo.append(dict(row=row, fp8=fp8, bf16=bf16, bare=bare, err=err, err_bare=bare["step"] / row["step_pub"] - 1.0))
            print(f"  {row['name']:<58} step pub {row['step_pub']:.3f} s model {fp8['step']:.3f} s ({err:+.1%})"
                  + ("" if fp8["fits"] else " (does not fit: no cap)"), flush=True)
        # The H100 rows again on the h100-sxm preset without its clock derate (clock_ratio 1, a
        # machine file a user can write: docs/calibration.md, "What one constant cannot reconcile").
        undrated = os.path.join(tmp, "h100-sxm-clock-1.json")
        with open(undrated, "w") as f:
            json.dump(dict(load_description("h100-sxm"), name="h100-sxm-clock-1", clock_ratio=1.0,
                           measured=os.path.join(ROOT, "pase", "machines", "data", "h100-sxm-measured.json")), f)
        for r in nemo:
            if r["row"]["machine"] == "h100-sxm":
                r["clock_1"] = price(dict(r["row"], machine=undrated), tmp)
        layouts = layouts_section(nemo, tmp)
        for f8, b16 in foundry_pairs(folder):
            m8, m16 = price(foundry_row(f8, True), tmp), price(foundry_row(b16, False), tmp)
            pub = f8["tokens_per_s"] / b16["tokens_per_s"]
            mod = m16["step"] / m8["step"]
            steps = [r["global_batch_tokens"] / r["tokens_per_s"] for r in (f8, b16)]
            foundry.append(dict(fp8_row=f8, fp8=m8, bf16=m16, pub=pub, mod=mod, err=mod / pub - 1.0, steps=steps))
            print(f"  llm-foundry {f8['model']} seq {f8['seq']}: FP8/BF16 pub {pub:.3f} model {mod:.3f} "
                  f"({mod / pub - 1:+.1%})", flush=True)
    md = ["# Published low-precision runs, modelled (issue 31)", "",
          "Written by `benchmarks/nemo.py`. Every row is priced by the command line with its defaults and nothing "
          "else (the commands are listed below): NeMo / Megatron-Bridge rows from "
          "`../shared/reference/published/nemo-megatron-bridge.json`, llm-foundry pairs from "
          "`llm-foundry-mpt-h100.json`, as published, with NVIDIA's recipe words where its recipe sets them "
          "(`tp_overlap=true` for Llama 3 70B on H100 and GPT-3 175B; the MoE rows' expert settings). Published step = GBS x sequence / (tokens/s per GPU x GPUs). "
          "Signed errors: model / published - 1 (negative: the model is faster). Machines: the `h100-sxm` preset "
          "and the `b200` preset. Scaling: `current` for FP8-CS and Megatron-Bridge 26.x rows, `delayed` for "
          "NeMo 24.07. Targets: dense NeMo rows within 15 %, Qwen3-30B-A3B within 20 %, llm-foundry speed-up "
          "within 10 %.", "", "## NeMo / Megatron-Bridge (FP8)", "",
          "| run | GPUs | recipe priced | step s pub | step s model | err | target | band (step s) "
          "| BF16 step s model | modelled FP8 speed-up | memory GiB model | MFU model |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in nemo:
        row, m = r["row"], r["fp8"]
        target = TARGETS["moe" if row["moe"] else "dense"]
        band = "" if not m["band"] else f"{m['band'][0]:.3g}-{m['band'][1]:.3g}"
        md.append(f"| {row['name']} | {row['gpus']} | `{m['recipe']}`{'' if m['fits'] else ' (does not fit; priced with --memory 100000)'} "
                  f"| {row['step_pub']:.3f} | {m['step']:.3f} | {pct(r['err'])} "
                  f"| {'met' if abs(r['err']) <= target else 'MISSED'} ({target:.0%}) | {band} "
                  f"| {r['bf16']['step']:.3f} | {r['bf16']['step'] / m['step']:.2f}x | {m['memory'] / GiB:.1f} "
                  f"| {m['mfu']:.1%} |")
    errs = [abs(r["err"]) for r in nemo]
    md += ["", f"Absolute step-time error: median **{statistics.median(errs):.1%}**, worst **{max(errs):.1%}**.", "",
           "Where the modelled FP8 step goes:", ""]
    md += [f"- **{r['row']['name']}**: {share(r['fp8'])}." for r in nemo]
    md += ["", "### Without recomputation", "",
           "The tables publish no recomputation; the search above picks the fastest that fits the modelled memory. "
           "the published file's notes name it only for the Llama 3 8B H100 recipe (5 of 32 layers, not a recipe "
           "word); the same rows with `recompute=none` added, priced with `--memory 100000` (no cap) where "
           "the modelled peak exceeds the device:", "",
           "| run | step s pub | step s model, recompute=none | err | memory GiB model | fits the device |",
           "|---|---|---|---|---|---|"]
    for r in nemo:
        b = r["bare"]
        md.append(f"| {r['row']['name']} | {r['row']['step_pub']:.3f} | {b['step']:.3f} | {pct(r['err_bare'])} "
                  f"| {b['memory'] / GiB:.1f} | {'yes' if b['fits'] else 'no: priced without the cap'} |")
    md += ["", "### H100 without its clock derate", "",
           "The H100 rows on a machine file equal to the `h100-sxm` preset but with `clock_ratio` 1 (the preset's "
           "0.803, base over boost clock, taken out; no Blackwell preset has one): what the derate is worth on "
           "NeMo's rows (docs/calibration.md, \"What one constant cannot reconcile\"). Not the default.", "",
           "| run | step s pub | step s model, clock_ratio 1 | err |", "|---|---|---|---|"]
    for r in nemo:
        if "clock_1" in r:
            md.append(f"| {r['row']['name']} | {r['row']['step_pub']:.3f} | {r['clock_1']['step']:.3f} "
                      f"| {pct(r['clock_1']['step'] / r['row']['step_pub'] - 1.0)} |")
    md += layouts
    md += ["", "## llm-foundry FP8/BF16 pairs (H100)", "",
           "| model | seq | GPUs | recipe (BF16; FP8 adds precision=fp8,scaling=delayed) | FP8/BF16 pub | FP8/BF16 model "
           "| err | target | step s pub FP8 / BF16 | step s model FP8 / BF16 | err FP8 / BF16 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in foundry:
        f = r["fp8_row"]
        md.append(f"| {f['model']} | {f['seq']} | {f['gpus']} | `{r['bf16']['recipe']}` | {r['pub']:.3f} | {r['mod']:.3f} "
                  f"| {pct(r['err'])} | {'met' if abs(r['err']) <= TARGETS['speedup'] else 'MISSED'} (10%) "
                  f"| {r['steps'][0]:.2f} / {r['steps'][1]:.2f} | {r['fp8']['step']:.2f} / {r['bf16']['step']:.2f} "
                  f"| {pct(r['fp8']['step'] / r['steps'][0] - 1)} / {pct(r['bf16']['step'] / r['steps'][1] - 1)} |")
    md += ["", "## Commands", "", "Each with `--json`; the BF16 companions drop `precision` and `scaling`.", ""]
    md += [f"- `{command(r['fp8'])}`" for r in nemo]
    md += [f"- `{command(r['bare'])}`" + ("" if r["bare"]["fits"] else " `--memory 100000`") for r in nemo]
    md += [f"- `{command(r[k])}`" for r in foundry for k in ("fp8", "bf16")]
    md += ["", f"Run time {time.perf_counter() - start:.0f} s.", ""]
    path = os.path.join(ROOT, "benchmarks", "results", "nemo.md")
    with open(path, "w") as fh:
        fh.write("\n".join(md))
    print(f"NeMo median |err| {statistics.median(errs):.1%}, worst {max(errs):.1%}; llm-foundry speed-up errors "
          + ", ".join(pct(r["err"]) for r in foundry))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
