"""This machine's memory: what is available now, and the share of it the search's tables
and a verification run may use by default."""

from __future__ import annotations

import os

__all__ = ["available_memory", "DEFAULT_MEMORY_SHARE", "memory_budget", "default_table_budget"]

#: Share of the available memory that the default budget allows the search to use.
DEFAULT_MEMORY_SHARE = 0.8


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable`` if known)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def memory_budget(share: float) -> float:
    """Bytes that ``share`` of the memory available comes to."""
    return share * available_memory()


def default_table_budget() -> int:
    """Bytes the search's tables may use by default: a share of the memory available."""
    return int(memory_budget(DEFAULT_MEMORY_SHARE))
