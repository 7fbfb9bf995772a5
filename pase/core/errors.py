"""The errors pase raises on purpose, one hierarchy under ``PaseError``.

Each keeps the built-in class it has always been (``ValueError``, ``MemoryError``,
``ImportError``) so that callers catching those still do. The command line maps a class to
its exit status by the class hierarchy, never by the order of ``except`` clauses.
"""

from __future__ import annotations

__all__ = ["PaseError", "InputError", "TooLarge", "MissingDependency"]


class PaseError(Exception):
    """Base of every error pase raises on purpose; the message is one line."""


class InputError(PaseError, ValueError):
    """A file (or its contents) the tool cannot use; the message names the file and the problem."""


class TooLarge(PaseError, MemoryError):
    """Work refused before it starts: its tables or its run would not fit the memory budget."""


class MissingDependency(PaseError, ImportError):
    """An optional dependency (PyTorch, jax) is not installed; the message says how to install it."""
