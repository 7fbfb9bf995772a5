"""The least total cost of a costed graph by enumerating every strategy: the reference the
searches are tested against (``itertools.product`` over every vertex's configurations)."""

import itertools

import numpy as np


def brute_force(G) -> float:
    """The least cost of any strategy of ``G``: vertex costs plus edge matrices, every joint
    choice enumerated (columns in ``list(G.nodes)`` order, summed in that order)."""
    nodes = list(G.nodes)
    column = {v: i for i, v in enumerate(nodes)}
    ranges = [range(len(G.nodes[v]["cost"])) for v in nodes]
    rows = np.array(list(itertools.product(*ranges)), dtype=np.intp).reshape(-1, len(nodes))
    totals = np.zeros(len(rows))
    for v in nodes:
        totals += np.asarray(G.nodes[v]["cost"])[rows[:, column[v]]]
    for u, v, m in G.edges(data="cost"):
        totals += np.asarray(m)[rows[:, column[u]], rows[:, column[v]]]
    return float(totals.min())
