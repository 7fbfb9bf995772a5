"""Human-readable quantities shared by messages and outputs (bytes, seconds, costs)."""

from __future__ import annotations

__all__ = ["format_bytes", "format_seconds", "format_cost"]


def format_bytes(n: float) -> str:
    """Bytes with a decimal unit (GB = 1e9 bytes, as ``--table-budget`` counts them).

    >>> format_bytes(1.5e9), format_bytes(2048)
    ('1.5 GB', '2.05 KB')
    """
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000.0
    return f"{n:.3g} PB"  # pragma: no cover


def format_seconds(seconds: float) -> str:
    """Seconds with a unit that keeps three or four significant digits.

    >>> format_seconds(0.0123), format_seconds(2.5), format_seconds(4e-6)
    ('12.3 ms', '2.5 s', '4 us')
    """
    if seconds >= 1.0:
        return f"{seconds:.4g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def format_cost(cost: float) -> str:
    """A cost in scientific notation, four significant digits after the point.

    >>> format_cost(53136349552.0)
    '5.3136e+10'
    """
    return f"{cost:.4e}"
