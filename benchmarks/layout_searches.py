"""How the model orders the layouts of the published layout searches besides the playbook's
(issue 41): NVIDIA's two Qwen3-30B-A3B layouts on 16 H100 (measured 1.01x apart) and NVIDIA's
long-sequence table (Llama 2 7B, FP8, on H100: the best layout without context parallelism
against its context-parallel layout, 4K to 1M tokens).

Every layout is priced by the command line as a user would type it (``--json``); the
long-sequence rows (``--engine megatron,adam=apex``: NeMo 24.03 is NeMo 1.x) compare the model's
best plan with ``cp=1`` (the search over every other choice, the fastest over ZeRO 0-2: that
release had no fully sharded data parallelism) against NVIDIA's published context-parallel layout
as a ``--recipe``, at a global batch of about 4M tokens a step (the table states none). Writes ``benchmarks/results/layout_searches.md``.

    python3 benchmarks/layout_searches.py
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pase.cli import main as pase_main  # noqa: E402

LLAMA2 = "hf:examples/hf/llama-2-7b.json"
#: NeMo's long-sequence table (NVIDIA/NeMo docs/source/performance/performance_long_sequence.md,
#: NeMo 24.03.01, DGX-H100, FP8): sequence (K tokens), GPUs, TFLOPS/GPU without CP (its best layout
#: is not published), the layout with CP (tp, pp, dp, cp) and its TFLOPS/GPU.
LONG_SEQUENCE = [
    (4, 4, 768, (1, 1, 4, 1), 768), (8, 8, 730, (1, 2, 4, 1), 730), (16, 16, 660, (2, 1, 8, 1), 660),
    (32, 32, 595, (2, 1, 8, 2), 610), (64, 64, 534, (4, 1, 8, 2), 574), (128, 128, 424, (4, 1, 8, 4), 555),
    (256, 256, 392, (4, 1, 8, 8), 549), (512, 512, 104, (8, 1, 4, 16), 549), (1024, 1024, 26.5, (8, 1, 4, 32), 536),
]
TOKENS_PER_STEP = 2 ** 22


def _price(argv: list) -> dict | None:
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        status = pase_main(argv + ["--json"], stdout=out, stderr=err)
    finally:
        os.chdir(old)
    if status != 0:
        return {"refused": err.getvalue().strip().splitlines()[-1]}
    return json.loads(out.getvalue())["training"]


#: The engine of NeMo 24.03 (NeMo 1.x): Megatron-Core's layers with NeMo-Framework-Launcher's
#: ``optim.name: distributed_fused_adam`` (conf/training/llama/llama2_7b.yaml), Apex's distributed Adam.
NEMO_1 = "megatron,adam=apex"
#: ZeRO stages NeMo 24.03 could run: its Megatron had the distributed optimizer and NeMo's Apex
#: distributed Adam (ZeRO 1-2), no fully sharded data parallelism (Megatron FSDP, ZeRO-3, came in
#: Megatron-Core 0.10 and later).
ZERO_THEN = (0, 1, 2)


def _fastest(base: list, recipe: str) -> dict | None:
    """The fastest of ``recipe`` at each ZeRO stage of :data:`ZERO_THEN` (the others refused)."""
    found = [_price(base + ["--recipe", f"{recipe},zero={z}"]) for z in ZERO_THEN]
    priced = [t for t in found if t and not t.get("refused")]
    return min(priced, key=lambda t: t["step_seconds"]) if priced else found[-1]


def long_sequence_rows() -> list:
    rows = []
    for k, gpus, without, (tp, pp, dp, cp), with_cp in LONG_SEQUENCE:
        seq = k * 1024
        batch = max(TOKENS_PER_STEP // seq, dp)
        base = ["-g", LLAMA2, "-p", str(gpus), "-b", str(batch), "-m", str(seq), "--machine", "h100-sxm",
                "--engine", NEMO_1]
        cp_plan = _fastest(base, f"dp={dp},tp={tp},pp={pp},cp={cp},precision=fp8")
        plain = _fastest(base, "cp=1,precision=fp8")
        any_zero = _price(base + ["--recipe", "cp=1,precision=fp8"])
        rows.append({"k": k, "gpus": gpus, "batch": batch, "published": with_cp / without, "cp": cp_plan,
                     "plain": plain, "any_zero": any_zero, "layout": f"tp {tp}, pp {pp}, dp {dp}, cp {cp}"})
    return rows


QWEN = "hf:examples/hf/qwen3-30b-a3b.json"
#: NVIDIA's Qwen3-30B-A3B rows on 16 DGX-H100 GPUs (../shared/reference/published/nemo-megatron-bridge.json,
#: NeMo containers 26.04.01 and 26.02.01; benchmarks/nemo.py prices the same): the container, its layout in
#: NVIDIA's own words as a recipe, and the step it measured (GBS 1024 x 4096 tokens).
QWEN_LAYOUTS = [
    ("26.04.01", "dp=16,tp=1,pp=1,cp=1,zero=1,ep=16,microbatch=1,dispatcher=hybridep,precision=fp8,scaling=current",
     29.257),
    ("26.02.01", "dp=8,tp=1,pp=2,cp=1,zero=1,schedule=interleaved,vpp=12,ep=8,microbatch=1,ep_overlap=true,"
     "precision=fp8,scaling=current", 28.941),
]


def qwen_pair() -> list:
    base = ["-g", QWEN, "-p", "16", "-b", "1024", "-m", "4096", "--machine", "h100-sxm", "--engine", "megatron"]
    return [(container, recipe, measured, _price(base + ["--recipe", recipe])) for container, recipe, measured
            in QWEN_LAYOUTS]


def _band(t: dict) -> tuple:
    return tuple(t["step_seconds_band"]) if "step_seconds_band" in t else (t["step_seconds"], t["step_seconds"])


def _speed(t: dict) -> str:
    if t is None or t.get("refused"):
        return "refused" if t else "-"
    return f"{t['step_seconds']:.3g} s ({t['recipe']}){'' if t.get('fit') in (None, 'fits', 'tight') else ' (does not fit)'}"


def _qwen_lines(pair: list) -> list:
    lines = ["## NVIDIA's two Qwen3-30B-A3B layouts on 16 H100 (Megatron-Bridge, FP8)", "",
             "Measured 1.01x apart: a pair the model should call a tie (their step bands overlapping by more than "
             "half, as `--top` marks `=`).", "",
             "| container | layout | measured step s | modelled step s | band |", "| :--- | :--- | ---: | ---: | :--- |"]
    for container, recipe, measured, t in pair:
        if t is None or t.get("refused"):
            lines.append(f"| {container} | `{recipe}` | {measured} | refused | - |")
            continue
        low, high = _band(t)
        lines.append(f"| {container} | `{recipe}` | {measured} | {t['step_seconds']:.3g} | {low:.3g}-{high:.3g} |")
    priced = [t for *_, t in pair if t is not None and not t.get("refused")]
    if len(priced) == 2:
        (a_low, a_high), (b_low, b_high) = _band(priced[0]), _band(priced[1])
        overlap = max(0.0, min(a_high, b_high) - max(a_low, b_low))
        tie = overlap > 0.5 * (a_high - a_low) and overlap > 0.5 * (b_high - b_low)
        ratio = max(p["step_seconds"] for p in priced) / min(p["step_seconds"] for p in priced)
        lines += ["", f"Modelled {ratio:.2f}x apart; {'a tie' if tie else 'not a tie'} by the bands "
                  f"(measured 1.01x)."]
    return lines


def main() -> int:
    start = time.perf_counter()
    rows = long_sequence_rows()
    lines = ["# Layout searches beside the playbook's", "",
             "Written by `python3 benchmarks/layout_searches.py`; every figure from the command line's defaults and "
             "the published layouts as `--recipe`.", "",
             "## NVIDIA's long sequences: Llama 2 7B, FP8, H100 (NeMo 24.03)", "",
             "Priced with `--engine megatron,adam=apex` (NeMo 1.x's Apex distributed Adam). "
             "The best plan without context parallelism (`--recipe cp=1,zero=Z,precision=fp8`, the fastest over "
             "ZeRO 0-2, every other choice searched) against NVIDIA's context-parallel layout (its degrees as the "
             "recipe, the fastest over ZeRO 0-2): NeMo 24.03 had no fully sharded data parallelism, so ZeRO-3 is "
             "left out of both. A pair is ordered right where the faster one, as NVIDIA measured it, is the faster "
             "in the model (measured speed-ups under 1.05 are ties). The last column is the best plan without context "
             "parallelism where ZeRO-3 (Megatron FSDP, in Megatron-Core's current releases) may be searched too "
             "(`--recipe cp=1,precision=fp8`).", "",
             "| sequence | GPUs | batch | CP layout | measured speed-up of CP | modelled | CP plan | best without CP | ordered right | best without CP, ZeRO-3 allowed |",
             "| ---: | ---: | ---: | :--- | ---: | ---: | :--- | :--- | :--- | :--- |"]
    right = counted = 0
    for r in rows:
        cp, plain = r["cp"], r["plain"]
        modelled = None
        if cp and not cp.get("refused") and plain and not plain.get("refused"):
            modelled = plain["step_seconds"] / cp["step_seconds"]
        elif cp and not cp.get("refused"):
            modelled = float("inf")
        verdict = "tie" if r["published"] < 1.05 else "-"
        if r["published"] >= 1.05 and modelled is not None:
            counted += 1
            ok = modelled > 1.0
            right += ok
            verdict = "yes" if ok else "no"
        lines.append(f"| {r['k']}K | {r['gpus']} | {r['batch']} | {r['layout']} | {r['published']:.2f}x | "
                     f"{'-' if modelled is None else ('no plan without CP fits' if modelled == float('inf') else f'{modelled:.2f}x')} | "
                     f"{_speed(cp)} | {_speed(plain)} | {verdict} | {_speed(r['any_zero'])} |")
    lines += ["", f"Ordered right: {right} of {counted} rows where NVIDIA measured context parallelism at least "
              f"1.05x faster.", ""]
    lines += _qwen_lines(qwen_pair())
    lines += ["", f"({time.perf_counter() - start:.0f} s)"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(ROOT, "benchmarks", "results", "layout_searches.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
