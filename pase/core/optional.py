"""Optional dependencies (PyTorch, jax): imported where they are used, one clear error when
they are missing."""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["import_optional"]


def import_optional(*modules: str, missing: Callable[[], Exception]):
    """Import ``modules`` in order and return the first; ``missing()`` is raised if one fails.

    >>> import_optional("json", missing=RuntimeError).__name__
    'json'
    """
    try:
        imported = [importlib.import_module(name) for name in modules]
    except ImportError:
        raise missing() from None
    return imported[0]
