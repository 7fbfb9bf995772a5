"""Reading a costed graph: each vertex's cost vector and each vertex pair's summed edge matrix,
checked once for both the exact programme (``solver``) and the approximate one (``approx``)."""

from __future__ import annotations

import numpy as np

from pase.search.ordering import vertex_order

__all__ = ["vertex_costs", "edge_matrices"]


def _bad(values: np.ndarray, finite: bool) -> str | None:
    """Why ``values`` cannot be priced: NaN (the exact programme takes an infinite cost, an
    impossible configuration), or anything not finite (``finite``)."""
    if finite:
        return None if np.isfinite(values).all() else "must be finite"
    return "contains NaN" if np.isnan(values).any() else None


def vertex_costs(G, finite: bool = False) -> dict:
    """``vertex -> cost vector`` (float64) of ``G``'s vertices; ``ValueError`` naming the first
    vertex without a non-empty 1-D cost (or with NaN; with ``finite``, anything not finite)."""
    costs = {}
    for v, data in G.nodes(data=True):
        cost = data.get("cost")
        if cost is None:
            raise ValueError(f"vertex {v!r} has no 'cost' vector")
        cost = np.asarray(cost, dtype=np.float64)
        if cost.ndim != 1 or cost.size == 0:
            raise ValueError(f"vertex {v!r}: the cost must be a non-empty 1-D array, got shape {cost.shape}")
        why = _bad(cost, finite)
        if why:
            raise ValueError(f"vertex {v!r}: the cost vector {why}")
        costs[v] = cost
    return costs


def edge_matrices(G, sizes: dict, finite: bool = False) -> dict:
    """``(u, v) -> matrix`` of ``G``'s edges, antiparallel ones summed, each pair oriented
    (earlier, later) in ``vertex_order``; ``sizes[v]`` is ``v``'s configuration count. A matrix
    shared by several edges (repeated blocks) is checked once."""
    rank = {v: i for i, v in enumerate(vertex_order(G))}
    pairs: dict = {}
    checked = {}  # id -> matrix already checked (held, so that the id stays its own)
    for u, v, data in G.edges(data=True):
        if u == v:
            raise ValueError(f"vertex {u!r} has an edge to itself")
        matrix = data.get("cost")
        if matrix is None:
            raise ValueError(f"edge {(u, v)!r} has no 'cost' matrix")
        matrix = np.asarray(matrix, dtype=np.float64)
        if matrix.shape != (sizes[u], sizes[v]):
            raise ValueError(f"edge {(u, v)!r}: the cost matrix has shape {matrix.shape}, expected "
                             f"{(sizes[u], sizes[v])}")
        if id(matrix) not in checked:
            why = _bad(matrix, finite)
            if why:
                raise ValueError(f"edge {(u, v)!r}: the cost matrix {why}")
            checked[id(matrix)] = matrix
        if rank[u] > rank[v]:
            u, v, matrix = v, u, matrix.T
        pairs[u, v] = pairs[u, v] + matrix if (u, v) in pairs else matrix
    return pairs
