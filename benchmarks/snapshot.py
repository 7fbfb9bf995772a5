"""Record what the command line prints for a fixed list of training commands, and compare two
records: the check that a change meant to move code only (issue 40) changes no output.

The list: every example of README.md and docs/ with ``--json`` (files they would write left
out), every published row of ``benchmarks/results/*.md`` with ``--json``, and a set of training
plans that reach every mechanism (pipelines 1F1B and interleaved, block recomputation, context
and expert parallelism, FP8, every engine, ``--top``, ``--compare``, the per-layer search, and
the training sweeps). Search timings are masked.

    python3 benchmarks/snapshot.py --out before.json          # record
    python3 benchmarks/snapshot.py --out after.json --compare before.json

``--compare`` exits 1 and names every command whose output differs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pase.cli import main as pase_main  # noqa: E402

LLAMA8 = "hf:examples/hf/llama-3.1-8b.json"
LLAMA70 = "hf:examples/hf/llama-3.1-70b.json"
QWEN_MOE = "hf:examples/hf/qwen3-30b-a3b.json"

#: Training plans beyond the documented examples, one per mechanism they reach.
EXTRA = [
    f"-g {LLAMA70} -p 256 -b 512 -m 8192 --machine h100-sxm --top 5",
    f"-g {LLAMA70} -p 64 -b 256 -m 8192 --machine h100-sxm --engine megatron --recipe pp=8,schedule=interleaved --top 3",
    f"-g {LLAMA70} -p 64 -b 256 -m 8192 --machine h100-sxm --engine megatron --recipe pp=4,recompute=block --top 3",
    f"-g {LLAMA70} -p 128 -b 256 -m 32768 --machine h100-sxm --recipe cp=4 --top 3",
    f"-g {LLAMA8} -p 8 -b 64 -m 4096 --machine h100-sxm --engine torchtitan --top 3",
    f"-g {LLAMA8} -p 16 -b 64 -m 4096 --machine h100-sxm --engine deepspeed --top 3",
    f"-g {LLAMA8} -p 8 -b 64 -m 4096 --machine h100-sxm --engine fsdp --recipe precision=fp8",
    f"-g {LLAMA8} -p 8 -b 64 -m 4096 --machine b200 --recipe precision=search --top 3",
    f"-g {LLAMA8} -p 8 -b 16 -m 2048 --machine h100-sxm --per-layer",
    f"-g {QWEN_MOE} -p 16 -b 256 -m 4096 --machine h100-sxm --engine megatron --top 3",
    f"-g {QWEN_MOE} -p 16 -b 1024 -m 4096 --machine h100-sxm --engine megatron "
    "--recipe dp=16,tp=1,pp=1,cp=1,zero=1,ep=16,microbatch=1,precision=fp8,scaling=current",
    "-g mixtral-8x7b -p 64 -b 256 -m 4096 --machine h100-sxm --top 3",
    f"-g {LLAMA8} -b 64 -m 4096 --machine h100-sxm --sweep 8,16,32",
    f"-g {LLAMA8} -p 8 -b 64 -m 4096 --machine a100-sxm --compare dp=8,zero=3,recompute=full",
    f"-g {LLAMA70} -p 64 -b 256 -m 8192 --machine gb200-nvl72 --recipe precision=mxfp8 --top 3",
    "-g gpt2-small -p 8 -b 16 --machine h100-sxm --training --recipe pp=2 --top 3",
]

_EXAMPLE = re.compile(r"<!-- example: pase (.*?) -->")
_RESULT = re.compile(r"`pase (-g [^`]*)`")
#: Flags that write files: dropped (the JSON holds what they would say).
_WRITERS = ("--report", "--export-torchtitan", "--export-megatron", "--export-deepspeed", "--export-jax",
            "--export-graph", "--dot-path")
_MASKS = [
    (re.compile(r'"(seconds|search_seconds)": [-0-9.e+]+'), r'"\1": <t>'),
    (re.compile(r"configurations in [0-9.]+ s"), "configurations in <t> s"),
    (re.compile(r"(?m)^( +[0-9]+ .* )[0-9]+\.[0-9]{4}$"), r"\1<t>"),
]


def _argv(text: str) -> list | None:
    words = shlex.split(text)
    if "(n_positions=" in text or any(w in ("GPUS", "CONFIG", "P") for w in words) or "--approx" in words:
        return None  # a templated or benchmark-only line
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in _WRITERS:
            skip = True
            continue
        out.append(w)
    return out + ["--json"]


def commands() -> list:
    found = []
    docs = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", f)
                                                for f in sorted(os.listdir(os.path.join(ROOT, "docs")))]
    for path in docs:
        with open(path, encoding="utf-8") as f:
            found += [m.group(1) for m in _EXAMPLE.finditer(f.read())]
    results = os.path.join(ROOT, "benchmarks", "results")
    for name in sorted(os.listdir(results)):
        if name.endswith(".md"):
            with open(os.path.join(results, name), encoding="utf-8") as f:
                found += [m.group(1) for m in _RESULT.finditer(f.read())]
    found += EXTRA
    out, seen = [], set()
    for text in found:
        argv = _argv(text)
        if argv is not None and tuple(argv) not in seen:
            seen.add(tuple(argv))
            out.append(argv)
    return out


def _mask(text: str) -> str:
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def record() -> dict:
    result = {}
    for argv in commands():
        out, err = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        old = os.getcwd()
        os.chdir(ROOT)
        try:
            status = pase_main(argv, stdout=out, stderr=err)
        finally:
            os.chdir(old)
        key = " ".join(argv)
        result[key] = {"status": int(status), "stdout": _mask(out.getvalue()), "stderr": _mask(err.getvalue()),
                       "wall": round(time.perf_counter() - start, 3)}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="where to write the record (JSON)")
    parser.add_argument("--compare", help="an earlier record: exit 1 if any output differs")
    parser.add_argument("--list", action="store_true", help="print the commands and stop")
    args = parser.parse_args(argv)
    if args.list:
        for a in commands():
            print("pase " + shlex.join(a))
        return 0
    if not args.out:
        parser.error("--out is needed (or --list)")
    now = record()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(now, f, indent=1, sort_keys=True)
    print(f"{len(now)} commands recorded in {args.out} ({sum(r['wall'] for r in now.values()):.1f} s)")
    if not args.compare:
        return 0
    with open(args.compare, encoding="utf-8") as f:
        before = json.load(f)
    differ = [k for k in sorted(set(now) | set(before))
              if k not in now or k not in before
              or any(now[k][f] != before[k][f] for f in ("status", "stdout", "stderr"))]
    for k in differ:
        print(f"DIFFERS: pase {k}")
    print(f"{len(differ)} of {len(now)} differ; wall {sum(r['wall'] for r in before.values()):.1f} s before, "
          f"{sum(r['wall'] for r in now.values()):.1f} s now")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
