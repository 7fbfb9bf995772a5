"""Tables of times measured on one device, and their interpolation to any shape.

A calibrated machine (``docs/machines.md``) prices per-device GEMMs and memory-bound work from
these tables; this module loads and checks them and interpolates between their points.

The model, and why (the measured points are a grid of powers of two; real layers are not):

- **Linear in the sizes, not in their logarithms.** Between two grid points the time is
  interpolated multilinearly in ``B``, ``M``, ``N`` and ``K`` themselves. A GEMM's time is,
  to first order, a launch floor plus work plus traffic, ``a + b BMNK + c B(MK + KN + MN) +
  d B``: a function that is affine in each size separately, which multilinear
  interpolation reproduces exactly (log-log interpolation does not; held-out tests in
  ``benchmarks/machine_accuracy.py`` prefer the linear form, most of all along ``B``,
  whose grid points are 8x apart).
- **Holes are filled first.** Rows the table lacks (no tensor over 4 GB at ``B = 2048``,
  sizes above 2048 at ``B > 1``) are filled from their neighbours along one axis: linear
  between two neighbours, else extrapolated from the two below, else copied.
- **Beyond the grid**, along each axis, time grows from the last point at the marginal
  rate of the last interval, bounded below by zero (never cheaper than the largest
  measured size) and above by the average rate at that point (efficiency never drops
  beyond the grid). Below the smallest size the time stays at its value there: a
  launch-latency floor.

Examples
--------
>>> rows = [[b, m, n, k, b * (1e-6 + 1e-9 * m * n * k)]
...         for b in (1, 4) for m in (1, 2) for n in (1, 2) for k in (1, 2)]
>>> table = MeasuredTables.from_dict({"gemm": rows})
>>> float(table.gemm_seconds(1, 2, 2, 2))     # a grid point: the measurement itself
1.008e-06
>>> round(float(table.gemm_seconds(2, 1, 1, 1)) * 1e9, 6)   # between B = 1 and 4: linear in B
2002.0
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Mapping

import numpy as np

from pase.core.checks import is_int, is_number

__all__ = ["MeasuredTables", "ELEMENT_TRAFFIC"]

#: Elements read plus written per element of the tensor, forward and backward together:
#: the traffic that prices a kind the table lacks (bytes over the table's bandwidth).
#: ``add``: read a, b, write a + b (its gradient passes through unchanged); ``gelu``,
#: ``layer_norm``, ``softmax``: read x, write y; backward read dy and x (or y), write dx;
#: ``pool``, ``loss``, ``copy``: read and write once each way (``elements`` counts the
#: larger of the input and the output).
ELEMENT_TRAFFIC = {
    "add": 3.0, "gelu": 5.0, "layer_norm": 5.0, "softmax": 5.0, "pool": 4.0, "loss": 4.0, "copy": 4.0,
}

#: An axis of a table is extended to ``last * _FAR`` so that extrapolation is an ordinary
#: interpolation inside one more cell (the line through the last point at the bounded rate).
_FAR = 2.0 ** 20


#: Largest size in a table (exact in float64: 10**400 was an OverflowError), and largest time
#: (11 days for one kernel: past it, extrapolation could overflow to infinity).
MAX_SIZE = 2**53
MAX_SECONDS = 1e6
#: Most cells the full grid of a table may have, and how many times its rows (the grid is
#: filled hole by hole: a diagonal of 40 rows made a 40**4 grid that took minutes). The
#: shipped table has 16,875 cells for 10,102 rows, pase calibrate --quick 3,993 for 762.
MAX_GRID_CELLS = 2**17
MAX_GRID_PER_ROW = 16
SMALL_GRID = 4096


def _is_size(x) -> bool:
    return is_int(x, numpy=True) and 1 <= x <= MAX_SIZE


def _is_seconds(x) -> bool:
    # The range test first: math.isfinite(10**400) raises OverflowError.
    return (is_number(x, numpy=True) and 0 < x <= MAX_SECONDS
            and math.isfinite(x))


def _extend_axis(axis: np.ndarray, values: np.ndarray, dim: int):
    """Append one far point along ``dim`` carrying the bounded marginal rate (module doc)."""
    x0, x1 = axis[-2], axis[-1]
    far = x1 * _FAR
    a = np.take(values, -2, axis=dim)
    b = np.take(values, -1, axis=dim)
    rate = np.clip((b - a) / (x1 - x0), 0.0, b / x1)
    extra = b + rate * (far - x1)
    return np.append(axis, far), np.concatenate([values, np.expand_dims(extra, dim)], axis=dim)


def _fill_holes(axes: list, values: np.ndarray) -> np.ndarray:
    """Fill the NaN entries of a grid from their neighbours along one axis at a time.

    Each pass estimates every hole, per axis, by the best rule available there: linear
    between its two neighbours; else extrapolated from the two points below it (bounded
    marginal rate); else the value of its neighbour above (a floor); else of the one below.
    Holes with estimates of the best class on several axes take their geometric mean. Each
    pass fills only the holes whose best rule is the best of the pass (an interpolation
    waits for its neighbours rather than copying one); passes repeat until the grid is full.
    """
    values = values.copy()
    while np.isnan(values).any():
        best_class = np.full(values.shape, 99)
        log_sum = np.zeros(values.shape)
        count = np.zeros(values.shape)
        hole = np.isnan(values)
        for dim, axis in enumerate(axes):
            n = len(axis)
            if n < 2:
                continue
            v = np.moveaxis(values, dim, 0)
            x = axis.reshape((n,) + (1,) * (values.ndim - 1))
            est = [np.full(v.shape, np.nan) for _ in range(4)]
            # 0: between neighbours, linear in the size.
            t = (x[1:-1] - x[:-2]) / (x[2:] - x[:-2])
            est[0][1:-1] = (1 - t) * v[:-2] + t * v[2:]
            # 1: above two known points, the bounded marginal rate.
            if n >= 3:
                rate = np.clip((v[1:-1] - v[:-2]) / (x[1:-1] - x[:-2]), 0.0, v[1:-1] / x[1:-1])
                est[1][2:] = v[1:-1] + rate * (x[2:] - x[1:-1])
            # 2: below a known point, its value (launch floor); 3: above one known point.
            est[2][:-1] = v[1:]
            est[3][1:] = v[:-1]
            for cls, e in enumerate(est):
                e = np.moveaxis(e, 0, dim)
                ok = hole & np.isfinite(e) & (e > 0)
                log_e = np.log(np.where(ok, e, 1.0))
                better = ok & (cls < best_class)
                same = ok & (cls == best_class)
                log_sum = np.where(better, log_e, np.where(same, log_sum + log_e, log_sum))
                count = np.where(better, 1, np.where(same, count + 1, count))
                best_class = np.where(better, cls, best_class)
        if not (count > 0).any():  # cannot happen on a grid built from the table's own rows
            raise ValueError("measured table: cannot fill the grid")
        # Only the holes of the best class this pass: a hole next to other holes waits
        # until they are filled and it can be interpolated rather than copied.
        filled = (count > 0) & (best_class == best_class[count > 0].min())
        values[filled] = np.exp(log_sum[filled] / count[filled])
    return values


class _Grid:
    """A full grid of positive values over positive axes, multilinear in the raw sizes."""

    def __init__(self, axes: list, values: np.ndarray):
        axes = [np.asarray(a, dtype=np.float64) for a in axes]
        values = _fill_holes(axes, np.asarray(values, dtype=np.float64))
        for dim in range(len(axes)):
            axes[dim], values = _extend_axis(axes[dim], values, dim)
        for a in axes:
            a.flags.writeable = False
        values.flags.writeable = False
        self.axes = tuple(axes)
        self.values = values

    def __call__(self, points: list) -> np.ndarray:
        """Values at ``points``: one flat float array per axis, all of one length."""
        lows, weights = [], []
        for axis, x in zip(self.axes, points):
            i = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, len(axis) - 2)
            # t < 0 below the grid is clamped (launch floor); t > 1 past the far point
            # continues the same line.
            t = np.maximum((x - axis[i]) / (axis[i + 1] - axis[i]), 0.0)
            lows.append(i)
            weights.append(t)
        out = np.zeros(len(points[0]))
        for corner in itertools.product((0, 1), repeat=len(self.axes)):
            w = np.ones(len(points[0]))
            index = []
            for c, i, t in zip(corner, lows, weights):
                w = w * (t if c else 1.0 - t)
                index.append(i + c)
            out += w * self.values[tuple(index)]
        return out


def _broadcast_sizes(names: str, arrays, what: str):
    arrays = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in arrays])
    for name, a in zip(names, arrays):
        bad = ~np.isfinite(a) | (a <= 0)
        if bad.any():
            raise ValueError(f"{what}: {name} must be positive and finite, got {a[bad].flat[0]!r}")
    return arrays


def _short_row(row) -> str:
    """A row for a message, its long numbers shortened."""
    return "[" + ", ".join(repr(x) if len(repr(x)) <= 20 else repr(x)[:8] + f"...({len(repr(x))} digits)"
                           for x in row) + "]"


class MeasuredTables:
    """Measured GEMM and memory-bound times of one device, interpolated (module doc).

    Parameters
    ----------
    gemm : sequence of ``[B, M, N, K, seconds]``
        One training step (forward and two backward products) of ``B`` batched GEMMs of
        ``M x K`` by ``K x N``. Sizes form a grid, possibly with holes; every axis needs
        at least two values.
    memory_bound : sequence of ``[op, elements, seconds]``, optional
        Forward and backward of a memory-bound op on a tensor of ``elements`` elements;
        at least two sizes per op.
    source : str
        Named in error messages (a file name).

    Examples
    --------
    >>> rows = [[b, m, n, k, 1e-5 * b * m] for b in (1, 2) for m in (1, 4) for n in (1, 2) for k in (1, 2)]
    >>> t = MeasuredTables(rows, [["add", 1024, 2e-6], ["add", 4096, 5e-6]])
    >>> [round(float(s) * 1e6, 6) for s in t.gemm_seconds(1, [2, 8], 2, 2)]  # M = 8: past the grid
    [20.0, 80.0]
    >>> round(float(t.memory_bound_seconds("add", 2048)) * 1e6, 6)
    3.0
    """

    def __init__(self, gemm, memory_bound=(), source: str = "measured table"):
        self.source = source
        #: ``{dtype: MeasuredTables}``: GEMM tables measured in other number formats
        #: (``gemm_fp8`` rows, ``pase calibrate --dtype fp8``).
        self.by_dtype = {}
        self._gemm_rows = self._check_gemm(gemm)
        self._memory_rows = self._check_memory(memory_bound)
        rows = self._gemm_rows
        axes = [np.unique(rows[:, j]) for j in range(4)]
        for name, axis in zip("BMNK", axes):
            if len(axis) < 2:
                raise ValueError(f"{source}: gemm needs at least two values of {name}, got {axis.astype(int).tolist()}")
        cells = math.prod(len(a) for a in axes)
        if cells > SMALL_GRID and (cells > MAX_GRID_CELLS or cells > MAX_GRID_PER_ROW * len(rows)):
            raise ValueError(
                f"{source}: gemm rows span a grid of {cells} shapes ({' x '.join(str(len(a)) for a in axes)} values "
                f"of B, M, N, K) for {len(rows)} rows; at most {MAX_GRID_CELLS} shapes, and at most "
                f"{MAX_GRID_PER_ROW} per row")
        grid = np.full([len(a) for a in axes], np.nan)
        index = tuple(np.searchsorted(a, rows[:, j]) for j, a in enumerate(axes))
        grid[index] = rows[:, 4]
        self._gemm = _Grid(axes, grid)
        self._memory = {}
        for op in sorted({r[0] for r in self._memory_rows}):
            pts = sorted((e, s) for o, e, s in self._memory_rows if o == op)
            sizes = np.array([e for e, _ in pts], dtype=np.float64)
            if len(sizes) < 2:
                raise ValueError(f"{source}: memory_bound op {op!r} needs at least two sizes, got {len(sizes)}")
            self._memory[op] = _Grid([sizes], np.array([s for _, s in pts]))

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "measured table") -> "MeasuredTables":
        """Build from the JSON layout of ``h100-sxm-measured.json`` (``gemm``, ``memory_bound``)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: expected a JSON object with 'gemm' and 'memory_bound' rows")
        if "gemm" not in data:
            raise ValueError(f"{source}: missing field 'gemm' (rows [B, M, N, K, seconds])")
        tables = cls(data["gemm"], data.get("memory_bound", ()), source)
        for dtype in ("fp8", "mxfp8", "nvfp4"):
            if f"gemm_{dtype}" in data:
                tables.by_dtype[dtype] = cls(data[f"gemm_{dtype}"], (), f"{source} (gemm_{dtype})")
        return tables

    @classmethod
    def load(cls, path: str) -> "MeasuredTables":
        """Read a measured-table JSON file; every problem is a ``ValueError`` naming it."""
        from pase.core.fileio import read_json  # every unreadable, malformed or hostile file is one line

        return cls.from_dict(read_json(path, "measured table"), f"measured table {os.path.basename(path)}")

    def _check_gemm(self, rows) -> np.ndarray:
        if isinstance(rows, (str, bytes)) or not hasattr(rows, "__len__") or len(rows) == 0:
            raise ValueError(f"{self.source}: gemm must be a non-empty list of [B, M, N, K, seconds] rows")
        seen = set()
        for i, row in enumerate(rows):
            if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != 5:
                raise ValueError(f"{self.source}: gemm row {i} must be [B, M, N, K, seconds], got {row!r}")
            if not all(_is_size(x) for x in row[:4]):
                raise ValueError(f"{self.source}: gemm row {i}: B, M, N, K must be positive integers up to 2**53, "
                                 f"got {_short_row(row)}")
            if not _is_seconds(row[4]):
                raise ValueError(f"{self.source}: gemm row {i}: seconds must be a positive number up to "
                                 f"{MAX_SECONDS:g}, got {row[4]!r}")
            key = tuple(int(x) for x in row[:4])
            if key in seen:
                raise ValueError(f"{self.source}: gemm row {i} repeats the shape {list(key)}")
            seen.add(key)
        return np.array([[float(x) for x in row] for row in rows], dtype=np.float64)

    def _check_memory(self, rows) -> list:
        if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
            raise ValueError(f"{self.source}: memory_bound must be a list of [op, elements, seconds] rows")
        out, seen = [], set()
        for i, row in enumerate(rows):
            if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != 3:
                raise ValueError(f"{self.source}: memory_bound row {i} must be [op, elements, seconds], got {row!r}")
            op, elements, seconds = row
            if not isinstance(op, str) or not op:
                raise ValueError(f"{self.source}: memory_bound row {i}: op must be a name such as 'gelu', got {op!r}")
            if op not in ELEMENT_TRAFFIC:
                # A misspelt op would silently join the ops whose best rate prices the others.
                raise ValueError(f"{self.source}: memory_bound row {i}: unknown op {op[:40]!r}; one of: "
                                 f"{', '.join(ELEMENT_TRAFFIC)}")
            if not _is_size(elements):
                raise ValueError(f"{self.source}: memory_bound row {i}: elements must be a positive integer up to "
                                 f"2**53, got {_short_row([elements])[1:-1]}")
            if not _is_seconds(seconds):
                raise ValueError(f"{self.source}: memory_bound row {i}: seconds must be a positive number up to "
                                 f"{MAX_SECONDS:g}, got {seconds!r}")
            if (op, int(elements)) in seen:
                raise ValueError(f"{self.source}: memory_bound row {i} repeats {op!r} at {int(elements)} elements")
            seen.add((op, int(elements)))
            out.append((op, int(elements), float(seconds)))
        return out

    # -- queries -------------------------------------------------------------------------

    @property
    def floors(self) -> tuple:
        """``(gemm, memory-bound)``: the least time of any row of each table (its launch floor;
        ``0.0`` for a table without memory-bound rows)."""
        memory = min((seconds for _, _, seconds in self._memory_rows), default=0.0)
        return float(self._gemm_rows[:, 4].min()), float(memory)

    @property
    def kinds(self) -> tuple:
        """The memory-bound op kinds the table measured."""
        return tuple(self._memory)

    def gemm_seconds(self, B, M, N, K) -> np.ndarray:
        """Seconds of one training step of ``B`` batched ``M x K`` by ``K x N`` GEMMs.

        Arguments broadcast (integers or floats >= 1 in practice; any positive size is
        accepted); the result has their broadcast shape.
        """
        arrays = _broadcast_sizes("BMNK", (B, M, N, K), "gemm_seconds")
        shape = arrays[0].shape
        return self._gemm([a.ravel() for a in arrays]).reshape(shape)

    def memory_bound_seconds(self, kind: str, elements) -> np.ndarray:
        """Seconds of the forward and backward of ``kind`` on ``elements`` elements.

        Zero where ``elements`` is 0. ``kind`` must be one the table measured
        (:attr:`kinds`); :meth:`streaming_seconds` prices any other kind.
        """
        if kind not in self._memory:
            raise ValueError(f"{self.source}: no memory_bound rows for {kind!r}; it has {', '.join(self.kinds) or 'none'}")
        return self._memory_query(self._memory[kind], elements)

    def streaming_seconds(self, traffic: float, elements) -> np.ndarray:
        """Seconds to read and write ``traffic`` elements per element of ``elements``.

        At the best rate (elements moved per second) that any measured kind reaches at
        that size, so an unmeasured kind inherits the measured launch floor and the
        bandwidth the device really reaches at that size. Zero where ``elements`` is 0.
        """
        if not self._memory:
            raise ValueError(f"{self.source}: no memory_bound rows to take a bandwidth from")
        best = None
        for op, grid in self._memory.items():
            per_traffic = self._memory_query(grid, elements) / ELEMENT_TRAFFIC.get(op, 4.0)
            best = per_traffic if best is None else np.minimum(best, per_traffic)
        return traffic * best

    @staticmethod
    def _memory_query(grid: _Grid, elements) -> np.ndarray:
        e = np.asarray(elements, dtype=np.float64)
        bad = ~np.isfinite(e) | (e < 0)
        if bad.any():
            raise ValueError(f"memory-bound work: elements must be non-negative and finite, got {e[bad].flat[0]!r}")
        flat = e.ravel()
        out = grid([np.maximum(flat, 1.0)])
        return np.where(flat > 0, out, 0.0).reshape(e.shape)

    def to_dict(self) -> dict:
        """The rows as JSON-able lists, in the layout :meth:`from_dict` reads."""
        gemm = [[int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4])] for r in self._gemm_rows]
        memory = [[op, e, s] for op, e, s in self._memory_rows]
        return {
            "gemm_columns": ["B", "M", "N", "K", "seconds"],
            "gemm": gemm,
            "memory_bound_columns": ["op", "elements", "seconds"],
            "memory_bound": memory,
        }
