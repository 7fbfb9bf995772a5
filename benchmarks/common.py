"""Helpers shared by the benchmark scripts: import path, machine description, tables, plots.

Benchmark-only: nothing in ``pase/`` or ``graphs/`` imports this module.
"""

from __future__ import annotations

import csv
import datetime
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

#: The paper's graphs in the order of its Table I and Fig. 6, then ResNet-101.
GRAPH_ORDER = ("alexnet", "inception3", "rnnlm", "transformer", "resnet101")
#: Device counts of the paper's evaluation.
PROCS = (4, 8, 16, 32, 64)
#: Display names.
TITLES = {
    "alexnet": "AlexNet", "inception3": "InceptionV3", "rnnlm": "RNNLM",
    "transformer": "Transformer", "resnet101": "ResNet-101",
}


def parse_list(text: str, cast=str) -> list:
    """``"4,8,16"`` -> ``[4, 8, 16]``."""
    return [cast(item.strip()) for item in text.split(",") if item.strip()]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_total() -> str:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024 ** 2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info() -> dict:
    """Where and when a benchmark ran: CPU, cores, memory, versions, date, revision."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory": _memory_total(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "revision": _git_revision(),
    }


def machine_lines(info: dict) -> list:
    """The machine description as Markdown list items."""
    return [
        f"- CPU: {info['cpu']} ({info['cores']} cores), memory {info['memory']}",
        f"- Python {info['python']}, NumPy {info['numpy']}, {info['platform']}",
        f"- Run on {info['date']}, repository revision {info['revision']}",
    ]


def markdown_table(headers: list, rows: list, align: str | None = None) -> list:
    """Lines of a Markdown table; ``align`` is one of ``l``/``r`` per column (default: right)."""
    align = align or "r" * len(headers)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def write_csv(path: str, headers: list, rows: list) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(rows)


def write_text(path: str, lines: list) -> None:
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seconds_text(s: float) -> str:
    """Seconds with three significant figures (``0.0123``, ``1.84``, ``123``)."""
    if s >= 100:
        return f"{s:.0f}"
    return f"{s:.3g}"
