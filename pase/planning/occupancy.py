"""How many of ``p`` devices a network's configurations can occupy at all.

A configuration splits each dimension of a layer's iteration space by a divisor of its size
(``pase.model.configs.allowed_splits``) and uses the product of its splits, at most ``p``: the
rest of the ``p`` devices hold replicas. When no configuration of any layer uses more than
``U < p`` devices, every strategy leaves ``p - U`` devices replicating work, and a search on
``p`` devices finds the plan of the paper's semantics (every configuration uses at most ``p``
devices), the same as on ``U``: the command line plans it with a note, and refuses only a count
whose search would take many minutes (``occupancy``; ``--allow-replication``, ``docs/cli.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pase.model.configs import allowed_splits, enumerate_configs

__all__ = ["largest_product", "useful_devices", "Occupancy", "occupancy", "LONG_IDLE_SEARCH_BYTES"]

#: Bytes of cost tables (``Network.least_table_bytes``, a lower bound known without enumerating a
#: configuration) beyond which a search on a count that leaves devices idle is not worth running:
#: gpt2-small at batch 128 needs 0.37 GB on 1,024 devices and searches in 15 s, 1.22 GB on 4,096
#: and 74 s, 8.46 GB on 100,000 (at most 98,304 used) and about 28 min (issue 35), measured on a
#: 2-core machine. 2 GB is a search of a few minutes.
LONG_IDLE_SEARCH_BYTES = 2 * 10**9


@dataclass(frozen=True)
class Occupancy:
    """How a network fills ``procs`` devices: ``useful``, the most devices any configuration of
    any layer uses, and ``table_bytes``, the least bytes of the search's cost tables (counted only
    when devices stay idle, else 0)."""

    procs: int
    useful: int
    table_bytes: int = 0

    @property
    def idle(self) -> int:
        """Devices no configuration uses: every strategy leaves at least that many replicating."""
        return self.procs - self.useful

    @property
    def long_search(self) -> bool:
        """Devices stay idle and the search would need over ``LONG_IDLE_SEARCH_BYTES`` of tables."""
        return self.idle > 0 and self.table_bytes > LONG_IDLE_SEARCH_BYTES


def occupancy(network, procs: int) -> Occupancy:
    """``Occupancy`` of ``network`` on ``procs`` devices, counted without enumerating every
    configuration (milliseconds even on 10^5 devices).

    >>> import graphs
    >>> found = occupancy(graphs.build("rnnlm", 128), 12)  # 128 = 2^7, 2048 = 2^11, 100000 = 2^5 x 5^5
    >>> found.useful, found.idle, found.long_search
    (10, 2, False)
    """
    useful = useful_devices(network, procs)
    table_bytes = network.least_table_bytes(procs)[0] if useful < procs else 0
    return Occupancy(procs, useful, int(table_bytes))


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
