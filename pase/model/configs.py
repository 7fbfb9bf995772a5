"""Stage 1: the configurations a layer allows (``docs/cost-model.md``, "Iteration spaces").

A configuration says into how many equal parts each dimension of an iteration space is
split; configuration arrays have one row per configuration and one column per dimension.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from pase.core.checks import arguments, bool_sequence, config_array, int_sequence, optional, positive_int

__all__ = [
    "count_configs",
    "divisors",
    "allowed_splits",
    "enumerate_configs",
    "is_contiguous",
    "check_config",
]


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n`` in increasing order.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    if n < 1:
        raise ValueError(f"divisors need a positive integer, got {n}")
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def allowed_splits(size: int, procs: int, cutoff: int) -> list[int]:
    """Split counts ``e`` of one dimension: divisors of ``size`` with ``size / e >= cutoff``.

    Counts above ``procs`` can never appear in a configuration and are dropped. When no
    divisor qualifies the dimension stays unsplit (``[1]``).

    >>> allowed_splits(96, 8, 4)
    [1, 2, 3, 4, 6, 8]
    >>> allowed_splits(3, 8, 4)
    [1]
    """
    # Only counts up to limit = min(procs, size // cutoff) qualify (size // e >= cutoff is
    # e <= size // cutoff). Those up to sqrt(size) are tested directly; those above are
    # size // d for the divisors d in [size / limit, sqrt(size)]. Together at most
    # min(limit, 2 sqrt(size)) tests: never every divisor of a huge dimension (a graph file's
    # 2**62 hung), nor a million tests for a small one on 2**20 devices.
    limit = min(procs, size // cutoff)
    if limit < 1:
        return [1]
    root = math.isqrt(size)
    low = max(1, -(-size // limit))  # ceil(size / limit)

    def dividing(first: int, last: int) -> list:
        if first > last:
            return []
        if size < 2**62:
            d = np.arange(first, last + 1, dtype=np.int64)
            return d[size % d == 0].tolist()
        return [d for d in range(first, last + 1) if size % d == 0]

    small = dividing(1, min(limit, root))
    large = [size // d for d in reversed(dividing(low, root)) if size // d > root]
    return small + large


@arguments(domain=int_sequence, procs=positive_int, cutoff=positive_int, unsplit=optional(bool_sequence))
def enumerate_configs(
    domain: Sequence[int],
    procs: int,
    cutoff: int = 1,
    unsplit: Sequence[bool] | None = None,
    contiguous: bool = False,
) -> np.ndarray:
    """Valid configurations of an iteration space, one per row.

    Parameters
    ----------
    domain : sequence of int
        The iteration space (dimension sizes).
    procs : int
        Number of devices ``p``; a configuration's product must be ``<= procs``.
    cutoff : int
        Cut-off ``t``: a split ``e`` of a dimension ``d`` needs ``d / e >= t``.
    unsplit : sequence of bool, optional
        Dimensions forced unsplit (treated as if of size 1).
    contiguous : bool
        Keep only contiguous configurations (Ravel and Unravel).

    Returns
    -------
    numpy.ndarray
        ``int64`` array of shape ``(K, len(domain))`` in lexicographic order (first
        dimension slowest, split counts increasing), so configuration index ties break the
        same way on every run.

    Examples
    --------
    >>> enumerate_configs((4, 6), 4).tolist()
    [[1, 1], [1, 2], [1, 3], [2, 1], [2, 2], [4, 1]]
    """
    if procs < 1:
        raise ValueError(f"the number of devices must be positive, got {procs}")
    if cutoff < 1:
        raise ValueError(f"the cut-off must be positive, got {cutoff}")
    unsplit = [False] * len(domain) if unsplit is None else list(unsplit)
    configs = np.ones((1, 0), dtype=np.int64)
    for size, fixed in zip(domain, unsplit):
        splits = np.array([1] if fixed else allowed_splits(size, procs, cutoff), dtype=np.int64)
        product = configs.prod(axis=1)
        # Cartesian product, first dimension slowest, pruned by the device count.
        rows = np.repeat(np.arange(len(configs)), len(splits))
        cols = np.tile(splits, len(configs))
        keep = product[rows] * cols <= procs
        configs = np.column_stack([configs[rows[keep]], cols[keep]])
    if contiguous:
        configs = configs[is_contiguous(configs, domain)]
    return configs


def count_configs(domain: Sequence[int], procs: int, cutoff: int = 1, unsplit: Sequence[bool] | None = None) -> int:
    """How many rows ``enumerate_configs`` would give (before the contiguity filter), counted
    by product instead of enumerated: memory in the number of distinct device counts, not in
    the number of configurations, so a bound can be checked before anything is built.

    >>> count_configs((4, 6), 4), len(enumerate_configs((4, 6), 4))
    (6, 6)
    """
    unsplit = [False] * len(domain) if unsplit is None else list(unsplit)
    products, counts = np.ones(1, dtype=np.int64), [1]
    for size, fixed in zip(domain, unsplit):
        splits = np.array([1] if fixed else allowed_splits(size, procs, cutoff), dtype=np.int64)
        grid = products[:, None] * splits[None, :]
        keep = grid <= procs
        rows = np.nonzero(keep)[0]
        values = grid[keep]
        merged: dict = {}
        for value, row in zip(values.tolist(), rows.tolist()):
            merged[value] = merged.get(value, 0) + counts[row]
        products = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
        counts = list(merged.values())
    return int(sum(counts))


@arguments(configs=config_array, domain=int_sequence)
def is_contiguous(configs: np.ndarray, domain: Sequence[int]) -> np.ndarray:
    """Which rows are contiguous: fully split dims, then one free dim, then unsplit dims.

    Scanning from the first dimension, every dimension is fully split (``c_i = d_i``) up to
    the first one that is not; that one may be split any way; all later ones are unsplit.

    >>> is_contiguous(np.array([[2, 1, 1], [4, 2, 1], [2, 2, 1]]), (4, 3, 2)).tolist()
    [True, True, False]
    """
    configs = np.asarray(configs)
    full = configs == np.asarray(domain)
    # Position of the first dimension that is not fully split (n if all are).
    first_partial = np.where(full.all(axis=1), configs.shape[1], np.argmin(full, axis=1))
    after = np.arange(configs.shape[1])[None, :] > first_partial[:, None]
    return ~np.any(after & (configs != 1), axis=1)


def check_config(config: Sequence[int], domain: Sequence[int], procs: int | None = None) -> None:
    """Raise ``ValueError`` unless ``config`` is a well-formed split of ``domain``.

    It must have one positive integer per dimension, each dividing its dimension, and (when
    ``procs`` is given) a product of at most ``procs``. The enumeration's cut-off and
    forced-unsplit rules are not applied: any such configuration can be costed.
    """
    if len(config) != len(domain):
        raise ValueError(
            f"configuration {list(config)} has {len(config)} entries, the iteration space "
            f"{list(domain)} has {len(domain)}"
        )
    for c, d in zip(config, domain):
        if isinstance(c, bool) or int(c) != c or c < 1:
            raise ValueError(f"configuration {list(config)} has a non-positive or non-integer split {c!r}")
        if d % int(c):
            raise ValueError(f"configuration {list(config)}: split {c} does not divide dimension {d}")
    if procs is not None:
        total = int(np.prod([int(c) for c in config]))
        if total > procs:
            raise ValueError(f"configuration {list(config)} needs {total} devices, more than p = {procs}")
