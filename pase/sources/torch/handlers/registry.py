"""The op handlers by ATen operation name, filled by ``@handles(names)`` where each handler is
defined."""

from __future__ import annotations

__all__ = ["HANDLERS", "handles"]

#: ATen operation name -> ``handler(imp, node, name, *args, **kwargs)``.
HANDLERS: dict = {}


def handles(names):
    """Register the decorated handler for every operation name in ``names``."""

    def register(handler):
        for name in names:
            HANDLERS[name] = handler
        return handler

    return register
