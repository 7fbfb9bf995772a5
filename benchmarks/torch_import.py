"""Imported PyTorch models against the built-in graphs, and the import's speed end to end.

Three measurements (``pase.sources.torch.importer``, the factories of ``examples/``):

1. torchvision ResNet-101 (227 x 227, batch 128): its layer counts, and its optimum at
   p = 8 and 32 next to the built-in ``resnet101``'s (also AlexNet and Inception v3).
2. A Llama-3-8B-shaped Hugging Face model on the ``meta`` device, batch 16 x 2048 tokens:
   import and exact search on 64 devices, end to end in a fresh Python process (start-up,
   imports, model construction, ``torch.export``, mapping, costing, search).
3. Hugging Face GPT-2 (the gpt2-small configuration) and the built-in ``gpt2-small``,
   planned at p = 8 and 32 side by side, plus GPT-2 with its vocabulary padded to 50304
   (the built-in's) to isolate that difference.

Writes ``benchmarks/results/torch_import.md`` and ``torch_import.csv``. Needs torch,
torchvision and transformers (``pip install '.[torch]' torchvision transformers``).

    python benchmarks/torch_import.py                 # everything (~3 min on 2 cores)
    python benchmarks/torch_import.py --skip-llama    # without the 8B end-to-end runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter

from common import RESULTS, ROOT, machine_info, machine_lines, markdown_table, write_csv, write_text

import graphs  # noqa: E402
from pase.sources import load  # noqa: E402
import pase  # noqa: E402

# The end-to-end run, in a fresh interpreter so that every import is counted. It prints one
# JSON line of seconds per phase.
LLAMA_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
import graphs, pase
from pase.sources.torch import importer as torch_import
t1 = time.perf_counter()
import torch, transformers
t2 = time.perf_counter()
module, args, kwargs = torch_import.load_factory("examples/hf_llama.py:llama3_8b", {batch})
t3 = time.perf_counter()
net = torch_import.from_torch(module, args, kwargs, name="llama3_8b")
t4 = time.perf_counter()
plan = pase.plan(net, {procs})
t5 = time.perf_counter()
print(json.dumps({{"pase_imports": t1 - t0, "torch_imports": t2 - t1, "build": t3 - t2, "export_and_map": t4 - t3,
                  "plan": t5 - t4, "search": plan.search.seconds, "total": t5 - t0, "vertices": len(net.layers),
                  "cost": plan.total_cost, "table_entries": plan.search.table_entries,
                  "max_dependent_set": plan.search.max_dependent_set}}))
"""


def compare(imported, builtin, procs) -> list:
    rows = []
    for p in procs:
        a, b = pase.plan(imported, p), pase.plan(builtin, p)
        rows.append({"p": p, "imported": a.total_cost, "builtin": b.total_cost,
                     "difference": a.total_cost / b.total_cost - 1.0, "imported_search_s": a.search.seconds,
                     "builtin_search_s": b.search.seconds})
    return rows


def counts(network) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(Counter(layer.op for layer in network.layers).items()))


def timed_load(spec: str, batch: int):
    t = time.perf_counter()
    net = load(spec, batch)
    return net, time.perf_counter() - t


def llama_end_to_end(batch: int, procs: int, repeats: int) -> dict:
    script = LLAMA_SCRIPT.format(root=ROOT, batch=batch, procs=procs)
    best = None
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if best is None or result["total"] < best["total"]:
            best = result
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="8,32", help="device counts of the comparisons")
    parser.add_argument("--batch", type=int, default=128, help="batch of the CNN and GPT-2 comparisons")
    parser.add_argument("--skip-llama", action="store_true", help="skip the Llama-3-8B end-to-end runs")
    parser.add_argument("--repeats", type=int, default=2, help="end-to-end runs; the fastest is kept")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    os.makedirs(args.out, exist_ok=True)
    csv_rows = []
    md = ["# Imported PyTorch models", "", "Machine:", ""] + machine_lines(machine_info()) + [
        "",
        "Costs are the reference cost model's optimum (FLOP-equivalents, 10 TFLOPS and 16 GB/s per",
        "device). Timings are noisy: the machine is shared. Regenerate with",
        "`python benchmarks/torch_import.py`.",
        "",
    ]

    # 1. CNNs: torchvision against the built-in graphs.
    md += ["## torchvision CNNs against the built-in graphs", "",
           f"Batch {args.batch}; input 227 x 227 (AlexNet, ResNet-101), 299 x 299 (Inception v3).", ""]
    table = []
    for factory, builtin in (("resnet101", "resnet101"), ("inception_v3", "inception3"), ("alexnet", "alexnet")):
        net, seconds = timed_load(f"torch:examples/torchvision_cnns.py:{factory}", args.batch)
        ref = graphs.build(builtin, args.batch)
        md += [f"- `{factory}`: {len(net.layers)} vertices ({counts(net)}), imported in {seconds:.1f} s;"
               f" built-in `{builtin}`: {len(ref.layers)} vertices ({counts(ref)})."]
        for row in compare(net, ref, procs):
            table.append([factory, builtin, row["p"], f"{row['imported']:.6g}", f"{row['builtin']:.6g}",
                          f"{100 * row['difference']:+.3f} %"])
            csv_rows.append(["cnn", factory, builtin, row["p"], args.batch, row["imported"], row["builtin"],
                             row["difference"], seconds])
    md += [""] + markdown_table(["torchvision", "built-in", "p", "imported optimum", "built-in optimum",
                                 "difference"], table, "llrrrr") + [""]

    # 3. GPT-2.
    md += ["## Hugging Face GPT-2 against the built-in gpt2-small", "",
           f"Batch {args.batch} x 1024 tokens. `HF padded`: the same model with `vocab_size=50304`.", ""]
    gpt, seconds = timed_load("torch:examples/hf_gpt2.py:gpt2_small", args.batch)
    padded = _gpt2_padded(args.batch)
    ref = graphs.build("gpt2-small", args.batch)
    md += [f"- HF GPT-2: {len(gpt.layers)} vertices ({counts(gpt)}), imported in {seconds:.1f} s.",
           f"- built-in `gpt2-small`: {len(ref.layers)} vertices ({counts(ref)}).", ""]
    table = []
    for (row, row_padded) in zip(compare(gpt, ref, procs), compare(padded, ref, procs)):
        table.append([row["p"], f"{row['imported']:.6g}", f"{row_padded['imported']:.6g}", f"{row['builtin']:.6g}",
                      f"{100 * row['difference']:+.2f} %", f"{100 * row_padded['difference']:+.2f} %"])
        csv_rows.append(["gpt2", "gpt2_small", "gpt2-small", row["p"], args.batch, row["imported"], row["builtin"],
                         row["difference"], seconds])
        csv_rows.append(["gpt2", "gpt2_small_vocab50304", "gpt2-small", row_padded["p"], args.batch,
                         row_padded["imported"], row_padded["builtin"], row_padded["difference"], ""])
    md += markdown_table(["p", "HF GPT-2", "HF padded", "built-in", "HF vs built-in", "HF padded vs built-in"],
                         table) + [""]

    # 2. Llama-3-8B end to end.
    if not args.skip_llama:
        result = llama_end_to_end(16, 64, args.repeats)
        md += ["## Llama-3-8B shape on the meta device, end to end", "",
               f"Batch 16 x 2048 tokens, exact search on 64 devices, a fresh Python process (fastest of "
               f"{args.repeats}): {result['vertices']} vertices, optimum {result['cost']:.6g},"
               f" {result['table_entries']:.3g} table entries, largest dependent set {result['max_dependent_set']}.",
               ""]
        phases = [("start-up and `import pase`", "pase_imports"), ("`import torch, transformers`", "torch_imports"),
                  ("model construction (meta)", "build"), ("`torch.export` and mapping", "export_and_map"),
                  ("costing and search (`pase.plan`)", "plan"), ("of which the search", "search"),
                  ("**total**", "total")]
        md += markdown_table(["phase", "seconds"], [[name, f"{result[key]:.2f}"] for name, key in phases], "lr")
        md += [""]
        csv_rows.append(["llama", "llama3_8b", "", 64, 16, result["cost"], "", "", result["total"]])
    write_csv(os.path.join(args.out, "torch_import.csv"),
              ["kind", "model", "builtin", "procs", "batch", "imported_cost", "builtin_cost", "difference",
               "seconds"], csv_rows)
    write_text(os.path.join(args.out, "torch_import.md"), md)
    print("\n".join(md))
    return 0


def _gpt2_padded(batch: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50304, attn_implementation="sdpa", use_cache=False)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
        ids = torch.zeros(batch, config.n_positions, dtype=torch.long)
    from pase.sources.torch.importer import from_torch

    return from_torch(model, (ids,), name="gpt2_small_vocab50304")


if __name__ == "__main__":
    sys.exit(main())
