"""What the JAX exporter, verifier and program share: the message for a missing jax and how
the sharded run's numbers are compared with the unsharded ones."""

from __future__ import annotations

import numpy as np

from pase.core.errors import MissingDependency

__all__ = ["INSTALL_HINT", "JaxMissing", "GRADIENT_FLOOR", "relative_error"]

#: What to tell a user without jax.
INSTALL_HINT = "jax is not installed: pip install '.[jax]'"


class JaxMissing(MissingDependency):
    """jax is not importable; the message says how to install it."""


#: A gradient is compared at its own scale, or at this fraction of the largest gradient element
#: of the model if that is larger (see ``relative_error``).
GRADIENT_FLOOR = 1e-3


def relative_error(value, reference, floor: float = 0.0) -> float:
    """``max |value - reference| / max(max |reference|, floor)``; the absolute error without a scale.

    A gradient that is mathematically zero (a bias right before a normalisation) holds only
    rounding noise, so its own scale means nothing: weights' gradients are compared at their
    own scale or at ``GRADIENT_FLOOR`` times the model's largest gradient element, whichever
    is larger. A wrong sharding changes a gradient by about its own size, so it is still
    caught in every gradient larger than ``1e-7`` of the largest one (at tolerance ``1e-4``).
    """
    value = np.asarray(value, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    scale = max(float(np.max(np.abs(reference))) if reference.size else 0.0, floor)
    diff = float(np.max(np.abs(value - reference))) if reference.size else 0.0
    return diff / scale if scale > 0 else diff
