"""A training sweep against its counts' single runs (issue 43): Llama 3.1 70B on 64 to 1024 H100s.

Writes ``benchmarks/results/sweep.md`` (and prints it): the wall and CPU seconds and the peak
memory of a fresh process of ``pase ... --sweep 64,128,256,512,1024 --json`` and of each count's
``pase ... -p N --json`` alone, run interleaved (the sweep, then the singles, ``--rounds`` times)
so that they meet the same load; the fastest of the rounds (the least disturbed by other work
on the machine) and the median; the sweep against the five singles together and against the
largest alone; and whether every count's ``training`` object in the sweep is the one its single
run prints (its step to 1e-9 relative, and the whole object equal).

    python benchmarks/sweep.py                 # 2 rounds: about 3 minutes on 2 cores
    python benchmarks/sweep.py --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, RESULTS, machine_info, machine_lines, markdown_table, write_text  # sets sys.path

MODEL = ["-g", "hf:examples/hf/llama-3.1-70b.json", "-b", "512", "-m", "8192", "--machine", "h100-sxm"]
COUNTS = (64, 128, 256, 512, 1024)
#: The issue's bound on the whole sweep, on a 2-core machine.
LIMIT_SECONDS = 120.0


def _run(argv: list) -> tuple:
    """``(wall s, CPU s, peak RSS MB, stdout)`` of a fresh ``python3 -m pase argv``."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "pase", *argv], cwd=ROOT, stdout=out,
                                 stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        err = child.stderr.read().decode()
        child.stderr.close()
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"pase {' '.join(argv)} failed ({child.returncode}): {err.strip()[-400:]}")
        out.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read()


def _same(sweep: dict, singles: dict) -> list:
    """Per count: whether the sweep's plan is its single run's (step to 1e-9, the whole object)."""
    rows = []
    for entry in sweep["sweep"]:
        alone = singles[entry["devices"]]["training"]
        mine = entry["training"]
        step = abs(mine["step_seconds"] - alone["step_seconds"]) <= 1e-9 * abs(alone["step_seconds"])
        rows.append([str(entry["devices"]), mine["recipe"], f"{mine['step_seconds']:.6g}",
                     f"{mine['tokens_per_second_per_device']:,.0f}", f"{100 * mine['mfu']:.1f} %",
                     "yes" if step else "NO", "yes" if mine == alone else "NO"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    counts = ",".join(map(str, COUNTS))
    commands = {"sweep": MODEL + ["--sweep", counts, "--json"]}
    commands.update({n: MODEL + ["-p", str(n), "--json"] for n in COUNTS})
    runs: dict = {name: [] for name in commands}
    outputs: dict = {}
    for r in range(args.rounds):
        for name, argv in commands.items():
            wall, cpu, rss, out = _run(argv)
            runs[name].append((wall, cpu, rss))
            outputs[name] = json.loads(out)
            print(f"round {r + 1}: {name}: {wall:.1f} s wall, {cpu:.1f} s CPU, {rss:.0f} MB", flush=True)

    def fastest(name, k):
        return min(run[k] for run in runs[name])

    rows = []
    for name, argv in commands.items():
        label = f"--sweep {counts}" if name == "sweep" else f"-p {name}"
        rows.append([label, f"{fastest(name, 0):.1f} ({statistics.median(r[0] for r in runs[name]):.1f})",
                     f"{fastest(name, 1):.1f}", f"{max(r[2] for r in runs[name]):.0f}"])
    singles_wall = sum(fastest(n, 0) for n in COUNTS)
    singles_cpu = sum(fastest(n, 1) for n in COUNTS)
    largest = max(COUNTS)
    sweep_wall, sweep_cpu = fastest("sweep", 0), fastest("sweep", 1)
    rows.append(["five single runs", f"{singles_wall:.1f}", f"{singles_cpu:.1f}", "-"])
    same = _same(outputs["sweep"], {n: outputs[n] for n in COUNTS})
    lines = ["# A training sweep against its single runs (issue 43)", "",
             f"`pase {' '.join(MODEL)}`, then `--sweep {counts} --json` or `-p N --json`: fresh processes "
             f"(`python3 -m pase`), interleaved, {args.rounds} round{'s' if args.rounds > 1 else ''}; the fastest "
             "(the median) wall seconds, the fastest CPU seconds (user and system), the peak resident memory.", ""]
    lines += markdown_table(["command", "wall s", "CPU s", "peak MB"], rows, "lrrr")
    lines += ["",
              f"- The sweep: {sweep_wall:.1f} s wall ({sweep_cpu:.1f} s CPU), "
              f"{'within' if sweep_wall <= LIMIT_SECONDS else 'OVER'} the issue's {LIMIT_SECONDS:.0f} s.",
              f"- Against the five single runs: {singles_wall / sweep_wall:.2f}x faster in wall time "
              f"({singles_cpu / sweep_cpu:.2f}x in CPU time).",
              f"- Against the largest alone (`-p {largest}`): {sweep_wall / fastest(largest, 0):.2f}x its wall time "
              f"({sweep_cpu / fastest(largest, 1):.2f}x its CPU time).",
              "- What the searches share (`pase/planning/training_sweep.py`): the networks built per global "
              "micro-batch, their structures and mesh mappers, the edge tables of each pipeline stage's device "
              "count, one costing per network of the rows every count runs on it, and each group's prefix sums "
              "over the layers by settings. What each count does alone: its options priced on its rows, its "
              "pipelines' cuts and schedules, its plan and the per-layer stage's estimate.", "",
              "Every count's plan in the sweep against its single run:", ""]
    lines += markdown_table(["devices", "plan", "step s", "tokens/s per device", "MFU", "step to 1e-9",
                             "same training object"], same, "llrrrll")
    lines += ["", *machine_lines(machine_info())]
    write_text(f"{RESULTS}/sweep.md", lines)
    print("\n".join(lines))
    if any("NO" in row for row in same):
        raise SystemExit("a count of the sweep differs from its single run")


if __name__ == "__main__":
    main()
