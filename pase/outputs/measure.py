"""``--measure`` and ``--profile``: repeated search timings and the hottest functions."""

from __future__ import annotations

import io
import pstats
import statistics

from pase.planning.planner import Measurement

__all__ = ["summary_stats", "format_measurement", "format_profile"]


def summary_stats(values) -> dict:
    values = list(values)
    return {
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def format_measurement(m: Measurement) -> str:
    """The ``--measure`` section: mean, spread and range of the timed searches."""
    s, w = summary_stats(m.search_seconds), summary_stats(m.wall_seconds)
    runs = len(m.search_seconds)
    ns = 1e9 * s["mean"] / max(m.table_entries, 1)
    return (
        f"measurement ({m.warmup} warm-up, {runs} timed searches):\n"
        f"  dynamic programme  mean {s['mean']:.4f} s, std dev {s['stdev']:.4f} s, "
        f"min {s['min']:.4f} s, max {s['max']:.4f} s ({ns:.1f} ns per entry)\n"
        f"  whole search       mean {w['mean']:.4f} s, std dev {w['stdev']:.4f} s, "
        f"min {w['min']:.4f} s, max {w['max']:.4f} s (ordering, tables, back-substitution, re-costing)\n"
    )


def format_profile(profiler, limit: int = 20) -> str:
    """The hottest functions of a ``cProfile.Profile`` run, by time spent in the function itself."""
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.sort_stats("tottime", "cumulative").print_stats(limit)
    text = buffer.getvalue().strip("\n")
    return f"profile (the {limit} functions with the most own time):\n{text}\n"
