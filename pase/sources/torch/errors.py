"""Errors of the PyTorch importer, and PyTorch itself imported on demand."""

from __future__ import annotations

from pase.core.errors import MissingDependency, PaseError
from pase.core.optional import import_optional


#: How to install the optional dependency (printed in ``TorchNotInstalledError``).
INSTALL_HINT = "pip install '.[torch]'"


class TorchImportError(PaseError, ValueError):
    """A model that cannot be imported; the message says why in one line."""


class TorchNotInstalledError(TorchImportError, MissingDependency):
    """PyTorch is missing: the message tells how to install it."""

    def __init__(self):
        super().__init__(f"importing a PyTorch model needs PyTorch, which is not installed: {INSTALL_HINT}")


class UnmappableOpsError(TorchImportError):
    """Operations of the traced graph that no PaSE layer expresses.

    ``ops`` lists ``(op, module_path, reason, count)`` for every distinct operation, in the
    order of their first occurrence; the message names each once, with the module path
    (from ``torch.export``'s module stack) where it first occurs.
    """

    def __init__(self, model: str, ops: list):
        self.ops = list(ops)
        parts = []
        for op, where, reason, count in self.ops:
            more = f"; {count - 1} more" if count > 1 else ""
            parts.append(f"{op} in {where or 'the top-level module'} ({reason}{more})")
        super().__init__(f"cannot map {len(self.ops)} operation(s) of {model} onto PaSE layers: " + "; ".join(parts))


class FactoryError(TorchImportError):
    """A model factory (``FILE.py:FUNCTION`` or ``package.module:FUNCTION``) that cannot be used."""


class Unmappable(Exception):
    """Raised inside a handler: this operation cannot be mapped (the reason is the message)."""


def _import_torch():
    # torch.export is a separate submodule in some releases.
    return import_optional("torch", "torch.export", missing=TorchNotInstalledError)
