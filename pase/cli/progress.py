"""What the user sees while a search runs: a progress bar once it runs a while, and a note
before a search estimated to take long."""

from __future__ import annotations

from typing import IO

from tqdm import tqdm

from .options import Options

__all__ = ["PROGRESS_DELAY", "NOTICE_SECONDS", "SECONDS_PER_ENTRY", "show_progress", "Progress", "notice"]


#: A search's progress bar appears only once it has run this long (seconds).
PROGRESS_DELAY = 1.0


def show_progress(opts: Options, err: IO) -> bool:
    if opts.progress is not None:
        return opts.progress
    isatty = getattr(err, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):
        return False


class Progress:
    """A ``progress(done, total)`` callback drawing a tqdm bar once a search runs a while.

    An uncapped search counts table entries; the capped search counts dynamic programmes.
    """

    def __init__(self, stream: IO, desc: str, unit: str = "entry"):
        self.stream = stream
        self.desc = desc
        self.unit = unit
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, file=self.stream, delay=PROGRESS_DELAY, desc=self.desc,
                            unit=self.unit, unit_scale=self.unit == "entry", leave=False, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


#: A search estimated to take longer than this (seconds) says so before it starts.
NOTICE_SECONDS = 10.0

#: Dynamic-programme CPU seconds per table entry, for that estimate: the median measured by
#: ``benchmarks/notice.py`` (results/notice.md), on a 2-core x86 machine.
SECONDS_PER_ENTRY = 1.2e-9


def notice(err: IO, label: str):
    """``notice(estimate, searches)`` for ``pase.plan``: a line on stderr for a long search."""

    def notice(estimate, searches: int) -> None:
        seconds = estimate.table_entries * SECONDS_PER_ENTRY
        if seconds > NOTICE_SECONDS:
            each = f" each, up to {searches} of them under the memory cap" if searches > 1 else ""
            err.write(f"pase: note: {label}: the search fills {estimate.table_entries:.3g} table entries; expect "
                      f"roughly {_duration(seconds)}{each} (Ctrl-C stops it)\n")
            err.flush()

    return notice


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
