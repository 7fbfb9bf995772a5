"""Baseline strategies as configuration choices, costed by the same model as the optimum.

Data parallelism splits each layer's batch dimension and nothing else. The configurations
need not be among the enumerated ones (the CNNs' cut-off can exclude them); ``evaluate``
costs them all the same.
"""

from __future__ import annotations

from pase.model.builder import Network
from pase.model.configs import allowed_splits
from pase.core.checks import a_network, arguments, positive_int

__all__ = ["data_parallel", "largest_divisor"]


@arguments(size=positive_int, limit=positive_int)
def largest_divisor(size: int, limit: int) -> int:
    """The largest divisor of ``size`` that is at most ``limit`` (the split data parallelism uses).

    >>> largest_divisor(128, 64), largest_divisor(96, 64), largest_divisor(7, 4)
    (64, 48, 1)
    """
    # allowed_splits tests the counts up to limit only: a huge batch dimension must not hang.
    return max(allowed_splits(size, limit, 1))


@arguments(network=a_network, procs=positive_int)
def data_parallel(network: Network, procs: int) -> list:
    """Data parallelism: every layer's batch dimension split ``largest_divisor(b, procs)`` ways.

    >>> from graphs import rnnlm
    >>> data_parallel(rnnlm(128), 32)[1]
    (1, 1, 32, 1, 1)
    """
    strategy = []
    for layer in network.layers:
        config = [1] * len(layer.domain)
        config[layer.batch_dim] = largest_divisor(layer.domain[layer.batch_dim], procs)
        strategy.append(tuple(config))
    return strategy
