"""What a checked run (``--verify jax``, ``--verify torch``) reports whatever ran it: the
numbers of the sharded run against the unsharded one, as its JSON ``"verify"`` object begins."""

from __future__ import annotations

__all__ = ["numerics_dict"]


def numerics_dict(result) -> dict:
    """``ok`` to ``gradients`` of a verify result (``gradients``: ``(name, shape, error)``)."""
    worst = max(result.gradients, key=lambda g: g[2]) if result.gradients else None
    return {
        "ok": result.ok,
        "procs": result.procs,
        "tolerance": result.tolerance,
        "seed": result.seed,
        "dtype": result.dtype,
        "loss": result.loss,
        "loss_reference": result.loss_reference,
        "loss_error": result.loss_error,
        "max_error": result.max_error,
        "worst_gradient": None if worst is None else {"name": worst[0], "error": worst[2]},
        "gradients": [{"name": n, "shape": list(s), "error": e} for n, s, e in result.gradients],
    }
