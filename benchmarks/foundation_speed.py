"""The training search's wall time against the revision before issue 29 (855edf6).

Writes ``benchmarks/results/foundation_speed.md`` (and prints it): for each command, the wall
time of a fresh process on this tree and on the base revision (checked out with ``git worktree``
in a temporary folder), run interleaved (base, this, base, this, ...) so that both meet the same
load, the fastest and the median of ``--rounds`` each, the ratio of the fastest (the least
disturbed by other work on the machine; the issue asks at most 0.7), and whether the two printed
the same plan (the lines naming it and its step and memory).

    python benchmarks/foundation_speed.py               # 3 rounds: about 10 minutes on 2 cores
    python benchmarks/foundation_speed.py --rounds 1
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, RESULTS, machine_info, machine_lines, markdown_table, write_text  # sets sys.path

BASE = "855edf6"
COMMANDS = [
    ["-g", "llama3-8b", "-p", "8", "-b", "512", "-m", "4096", "--machine", "h100-sxm", "--training"],
    ["-g", "hf:examples/hf/llama-3.1-70b.json", "-p", "256", "-b", "512", "-m", "8192", "--machine", "h100-sxm",
     "--training"],
]


def _plan_lines(text: str) -> list:
    """What names the plan: every line but the search's (its time)."""
    return [line for line in text.splitlines() if not line.startswith("search:")]


def _run(tree: str, argv: list) -> tuple:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "scheduler.py", *argv], cwd=tree, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {tree}: {done.stderr.strip()[-400:]}")
    return seconds, _plan_lines(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default=BASE)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="pase-base-")
    base = f"{folder}/tree"
    subprocess.run(["git", "worktree", "add", "--detach", base, args.base], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        rows = []
        for argv in COMMANDS:
            times: dict = {"base": [], "this": []}
            plans: dict = {}
            for _ in range(args.rounds):
                for name, tree in (("base", base), ("this", ROOT)):
                    seconds, plan = _run(tree, argv)
                    times[name].append(seconds)
                    plans[name] = plan
            b, t = min(times["base"]), min(times["this"])
            rows.append([" ".join(argv), f"{b:.1f} ({statistics.median(times['base']):.1f})",
                         f"{t:.1f} ({statistics.median(times['this']):.1f})", f"{t / b:.2f}",
                         "yes" if plans["base"] == plans["this"] else "no"])
            print(rows[-1], flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base], cwd=ROOT, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
    lines = ["# The training search against the revision before issue 29", "",
             f"Fresh processes, interleaved, {args.rounds} rounds each: the fastest (the median); base revision "
             f"{args.base}; the ratio of the fastest.", ""]
    lines += markdown_table(["command (pase ...)", f"{args.base} s", "this tree s", "ratio", "same plan"], rows,
                            "lrrrl")
    lines += ["", *machine_lines(machine_info())]
    write_text(f"{RESULTS}/foundation_speed.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
