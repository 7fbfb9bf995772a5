"""Today's models from their ``config.json`` (``examples/hf/``, the reference set) planned with
``--training`` on 64 ``h100-sxm`` devices: the parameter count beside transformers' and the plan.

Also the NeMo Qwen3-30B-A3B row (16 H100, EP 16, GBS 1024 x 4096; NeMo ran it in FP8, this
prices BF16: FP8 pricing belongs to the machine model). Writes ``benchmarks/results/models.md``
(one run; machine: two shared cores). Run from the repository root::

    python3 benchmarks/models.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import lru_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pase  # noqa: E402
from pase.core.units import format_bytes  # noqa: E402
from pase.sources.hf import load_hf, read_hf_config  # noqa: E402

OUT = os.path.join(ROOT, "benchmarks", "results", "models.md")
PROCS, MACHINE = 64, "h100-sxm"
#: The device capacity the plans are held to, as the preset states it (the driver's total).
CAP = f"{pase.load_machine(MACHINE).memory_bytes / 2**30:.2f} GiB"
#: transformers 5.24's counts on the meta device (the reference README's table).
REFERENCE = {
    "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
    "qwen3-8b": 8_190_735_360, "qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560,
    "deepseek-v3": 671_026_404_352, "gpt-oss-120b": 116_829_156_672, "nemotron-4-340b": 341_029_195_776,
    "mpt-7b": 6_649_286_656, "gemma-3-27b": 27_009_346_304, "phi-3-mini": 3_821_079_552,
}
#: Sequences per step: about a million tokens (256 x 4096; MPT's 2048-token context: 512 x 2048).
BATCH_TOKENS = 256 * 4096
SEQUENCE = 4096
#: NeMo's Qwen3-30B-A3B row (Megatron-Bridge performance summary, 26.04.01 container, DGX-H100).
NEMO = {"file": "qwen3-30b-a3b", "procs": 16, "batch": 1024, "sequence": 4096, "recipe": "dp=16,tp=1,ep=16",
        "tokens_per_s_per_gpu": 8960, "precision": "FP8"}


def transformers_count(path: str):
    """``sum(p.numel())`` of the model transformers builds on the meta device, or None without it."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    data = read_hf_config(path)
    fields = {k: v for k, v in data.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(data["model_type"],
                                                                                               **fields))
    return sum(p.numel() for p in model.parameters())


def plan(path: str, procs: int, batch: int, sequence: int, recipe: str | None = None):
    machine = pase.load_machine(MACHINE)

    @lru_cache(maxsize=None)
    def build(n):
        return load_hf(path, n, sequence)

    start = time.perf_counter()
    # engine=None: the bare model, as the results were recorded (the CLI prices for megatron).
    found = pase.plan_training(build, batch, procs, machine, machine.memory_bytes, 2.0, engine=None,
                               recipe=pase.parse_recipe(recipe) if recipe else None, free=False if recipe else None)
    return found, time.perf_counter() - start


def row(name: str, found, seconds: float, counted: int, theirs, batch: int, sequence: int) -> str:
    same = "=" if theirs == counted else ("?" if theirs is None else f"differs ({theirs:,})")
    head = f"| {name} | {counted:,} | {same} | {batch} x {sequence} |"
    if found.best is None:
        return head + f" no plan fits {CAP} |||| {seconds:.0f} |"
    s = found.best.summary
    return (head + f" `{found.best.recipe()}` | {s.step_seconds:.2f} | {s.tokens_per_second_per_device:,.0f} | "
            f"{100 * s.mfu:.1f} % | {format_bytes(s.peak_memory_bytes)} | {seconds:.0f} |")


def main(names=None) -> None:
    names = names or list(REFERENCE)
    rows = []
    for name in names:
        path = os.path.join(ROOT, "examples", "hf", f"{name}.json")
        data = read_hf_config(path)
        maximum = data.get("max_position_embeddings") or data.get("max_seq_len") or SEQUENCE
        sequence = min(SEQUENCE, maximum)
        batch = BATCH_TOKENS // sequence
        network = load_hf(path, 1, sequence)
        from pase.costing.training import parameter_elements_unique

        counted = parameter_elements_unique(network)
        theirs = transformers_count(path)
        found, seconds = plan(path, PROCS, batch, sequence)
        rows.append(row(name, found, seconds, counted, theirs, batch, sequence))
        print(rows[-1], flush=True)
    nemo_path = os.path.join(ROOT, "examples", "hf", f"{NEMO['file']}.json")
    nemo, nemo_seconds = plan(nemo_path, NEMO["procs"], NEMO["batch"], NEMO["sequence"], NEMO["recipe"])
    if nemo.best is not None:
        s = nemo.best.summary
        ours = s.tokens_per_second_per_device
        nemo_line = (f"`{nemo.best.recipe()}`: {s.step_seconds:.2f} s a step, {ours:,.0f} tokens/s per device "
                     f"(BF16 priced), MFU {100 * s.mfu:.1f} %, peak {format_bytes(s.peak_memory_bytes)}; NeMo "
                     f"{NEMO['tokens_per_s_per_gpu']:,} in {NEMO['precision']} ({100 * (ours / NEMO['tokens_per_s_per_gpu'] - 1):+.0f} %)")
    else:
        nemo_line = f"no plan fits {CAP} under that recipe"
    lines = [
        "# Today's models from their config.json on 64 H100s", "",
        f"Each config of `examples/hf/` (the reference set) read by `-g hf:` and planned with `--training` on "
        f"{PROCS} devices of `{MACHINE}` (8 a node, {CAP} cap: the driver's total) at about a million tokens a step. Parameters: "
        "pase's count; `=`: equal to the unit to `sum(p.numel() for p in model.parameters())` of the model "
        "transformers builds from the same config on the meta device. The plan: the fastest fitting training "
        "configuration over meshes (dp x tp x cp x pp, ep), ZeRO, recomputation and micro-batches "
        "(`docs/training.md`), BF16, balanced routing; sliding windows priced over their band (`docs/models.md`).", "",
        "| config | parameters | transformers | batch x tokens | plan | step (s) | tokens/s per device | MFU | peak "
        "memory | search (s) |", "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"A model whose weights, gradients and Adam state (16 bytes a parameter) do not fit 64 x {CAP} even fully "
        "sharded (DeepSeek-V3: 10.7 TB; Nemotron-4-340B: 5.5 TB) has no plan here; NeMo runs DeepSeek-V3 on "
        "1024 GPUs.", "",
        f"NeMo's Qwen3-30B-A3B row ({NEMO['procs']} H100, EP 16, GBS {NEMO['batch']} x {NEMO['sequence']}, "
        f"{NEMO['precision']}), priced in BF16 under its recipe: {nemo_line}. The same row priced in FP8 "
        "(`precision=fp8`, as NeMo ran it) is in `benchmarks/results/nemo.md`.", "",
        "Generated by `python3 benchmarks/models.py` (two shared CPU cores).",
    ]
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-6:]))


if __name__ == "__main__":
    main(sys.argv[1:] or None)
