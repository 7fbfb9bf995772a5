"""Training configurations on h100-sxm: the cases the training and pipeline issues name.

Writes ``benchmarks/results/training.md``: for each case the plan the search finds, the
practitioners' recipe priced the same way, and the wall time of the whole search (fresh
process state, one run each; machine: two cores). Run from the repository root::

    python3 benchmarks/training.py
"""

from __future__ import annotations

import os
import sys
import time
from functools import lru_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pase.sources.registry import load  # noqa: E402
import pase  # noqa: E402
from pase.core.units import format_bytes  # noqa: E402

OUT = os.path.join(ROOT, "benchmarks", "results", "training.md")

#: (title, graph, devices, batch, sequence, recipe to compare, machine)
CASES = [
    ("Llama 3.1 70B from its Hugging Face config, torchtitan's recipe", "hf:examples/hf/llama-3.1-70b.json", 256, 512,
     8192, "dp=32,tp=8,zero=3,recompute=full,microbatch=16", "h100-sxm"),
    ("GPT-3 175B (built in)", "gpt3-175b", 1024, 1536, None, "tp=8,pp=8,zero=1,recompute=full", "h100-sxm"),
    ("Llama 3.1 405B (built in)", "llama3-405b", 2048, 2048, 8192, "tp=8,pp=16,zero=1,recompute=full,microbatch=1",
     "h100-sxm"),
    ("Llama 3.1 8B, torchtitan's recipe", "hf:examples/hf/llama-3.1-8b.json", 8, 16, 8192,
     "dp=8,zero=3,recompute=selective,microbatch=2", "h100-sxm"),
]


def _row(label: str, c) -> str:
    s = c.summary
    return (f"| {label} | `{c.recipe()}` | {s.step_seconds:.3f} | {s.tokens_per_second_per_device:,.0f} | "
            f"{100 * s.mfu:.1f} % | {format_bytes(s.peak_memory_bytes)} |")


def run_case(title, spec, procs, batch, sequence, recipe, machine_name) -> list:
    machine = pase.load_machine(machine_name)

    source = "hf:" + os.path.join(ROOT, spec[3:]) if spec.startswith("hf:") else spec

    @lru_cache(maxsize=None)
    def build(n):
        return load(source, n, sequence)

    start, cpu = time.perf_counter(), time.process_time()
    # engine=None: the bare model, as the results were recorded (the CLI prices for megatron).
    found = pase.plan_training(build, batch, procs, machine, machine.memory_bytes, 2.0, engine=None)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    compared = pase.plan_training(build, batch, procs, machine, machine.memory_bytes, 2.0, engine=None,
                                  recipe=pase.parse_recipe(recipe), free=False).best
    fits = compared is not None
    if not fits:  # the recipe's fastest variant, though it does not fit
        compared = pase.plan_training(build, batch, procs, machine, pase.NO_CAP, 2.0, engine=None,
                                      recipe=pase.parse_recipe(recipe), free=False).best
    no_pipeline = pase.plan_training(build, batch, procs, machine, machine.memory_bytes, 2.0, engine=None,
                                     recipe=pase.parse_recipe("pp=1"), free=False).best
    seq = f", sequence {sequence}" if sequence else ""
    lines = [f"### {title}: `{spec}`, {procs} devices, batch {batch}{seq}", "",
             f"Search: {seconds:.1f} s wall, {cpu:.1f} s of CPU, graph building included "
             f"({found.mesh_search.evaluated} configurations; {found.optimal_over}).",
             "", "| plan | recipe | step (s) | tokens/s/device | MFU | peak memory |", "|---|---|---|---|---|---|"]
    if found.best is not None:
        lines.append(_row("optimum", found.best))
    if no_pipeline is not None:
        lines.append(_row("optimum without pipelines", no_pipeline))
    if compared is not None:
        lines.append(_row(f"recipe `{recipe}`" + ("" if fits else " (does not fit)"), compared))
    pipe = found.best.summary.extra.get("pipeline") if found.best is not None else None
    if pipe:
        stages = ", ".join(f"{st['blocks']} blocks {format_bytes(st['memory_bytes'])}" for st in pipe["stages"])
        lines += ["", f"Stages of the optimum ({pipe['schedule']}, v = {pipe['vpp']}, {pipe['microbatches']} "
                      f"micro-batches, bubble {100 * pipe['bubble_fraction']:.1f} %): {stages}."]
    lines.append("")
    return lines


def main() -> None:
    lines = ["# Training configurations on h100-sxm", "",
             "Modelled with `docs/training.md` (no constant fitted); `benchmarks/training.py` on two cores "
             "shared with other jobs: the CPU seconds are the figure to compare.", ""]
    for case in CASES:
        lines += run_case(*case)
        print("\n".join(lines[-12:]), flush=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
