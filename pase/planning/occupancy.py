"""How many of ``p`` devices a network's configurations can occupy at all.

A configuration splits each dimension of a layer's iteration space by a divisor of its size
(``pase.model.configs.allowed_splits``) and uses the product of its splits, at most ``p``: the
rest of the ``p`` devices hold replicas. When no configuration of any layer uses more than
``U < p`` devices, every strategy leaves ``p - U`` devices replicating work, and a search on
``p`` devices costs as much time as one on ``U`` without using the others: the command line
refuses it (``--allow-replication`` searches anyway, ``docs/cli.md``).
"""

from __future__ import annotations

import numpy as np

from pase.model.configs import allowed_splits, enumerate_configs

__all__ = ["largest_product", "useful_devices"]


def largest_product(domain, procs: int, cutoff: int = 1, unsplit=None) -> int:
    """The most devices one configuration of the iteration space ``domain`` uses on ``procs``
    devices: the largest product of allowed splits that is at most ``procs``. Counted over the
    distinct products (at most ``procs`` of them), not the configurations.

    >>> largest_product((4, 6), 4), largest_product((4, 6), 5), largest_product((7,), 6)
    (4, 4, 1)
    >>> largest_product((128, 1024, 768), 100000)  # 2^7 x 2^10 x 2^8 x 3 reach 3 x 2^15, not 10^5
    98304
    """
    unsplit = [False] * len(domain) if unsplit is None else list(unsplit)
    products = np.ones(1, dtype=np.int64)
    for size, fixed in zip(domain, unsplit):
        if fixed:
            continue
        splits = np.array(allowed_splits(int(size), procs, cutoff), dtype=np.int64)
        products = np.multiply.outer(products, splits).ravel()
        products = np.unique(products[products <= procs])
    return int(products.max())


def useful_devices(network, procs: int) -> int:
    """The most devices any configuration of any layer of ``network`` uses on ``procs``
    devices (at most ``procs``): beyond it, every strategy replicates.

    A layer that keeps only contiguous configurations (Ravel, Unravel) is enumerated when its
    bound could raise the count, so the count is exact.

    >>> import graphs
    >>> useful_devices(graphs.build("alexnet", 128), 7)  # no dimension of AlexNet has a factor 7
    6
    >>> useful_devices(graphs.build("alexnet", 128), 32)
    32
    """
    best = 0
    contiguous = {}
    seen = set()
    for layer in network.layers:
        key = (tuple(layer.domain), tuple(layer.unsplit), bool(layer.contiguous))
        if key in seen:
            continue
        seen.add(key)
        bound = largest_product(layer.domain, procs, network.cutoff, layer.unsplit)
        if layer.contiguous:
            contiguous[key] = bound
        else:
            best = max(best, bound)
        if best == procs:
            return procs
    for (domain, unsplit, _), bound in sorted(contiguous.items(), key=lambda item: -item[1]):
        if bound <= best:
            break
        configs = enumerate_configs(domain, procs, network.cutoff, unsplit, True)
        best = max(best, int(configs.prod(axis=1).max()))
    return best
