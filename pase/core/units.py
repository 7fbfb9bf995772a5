"""Human-readable quantities shared by messages and outputs (bytes, seconds, costs)."""

from __future__ import annotations

__all__ = ["format_bytes", "format_seconds", "format_cost", "BYTE_UNITS"]


#: Decimal byte units, each 1000 times the one before (``--memory`` and ``--table-budget`` count GB).
BYTE_UNITS = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")


def format_bytes(n: float) -> str:
    """Bytes with a decimal unit (GB = 1e9 bytes, as ``--table-budget`` counts them), three
    significant digits; the unit is chosen after rounding, so the figure stays under 1000.
    Beyond yottabytes (or not finite), bytes in scientific notation.

    >>> format_bytes(1.5e9), format_bytes(2048), format_bytes(999.7e9), format_bytes(1e18)
    ('1.5 GB', '2.05 KB', '1 TB', '1 EB')
    """
    value = float(n)
    for unit in BYTE_UNITS:
        shown = float(f"{value:.3g}")  # rounded as printed: 999.7 shows as 1e+03, so it moves up a unit
        if abs(shown) < 1000:
            return f"{shown:.3g} {unit}"
        value /= 1000.0
    return f"{float(n):.3g} B"


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
