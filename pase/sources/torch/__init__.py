"""Importing PyTorch models (``-g torch:FILE_OR_MODULE:FUNCTION``) through ``torch.export``.

PyTorch is imported only when a model is. ``factory`` loads a model factory, ``walk`` visits
the exported graph with the views of ``values``, one handler per ATen operation (``handlers/``,
by family) records proto-layers (``protos``), and ``importer.from_torch`` builds the network.
"""

from __future__ import annotations

__all__ = ["load_torch_source"]

#: Batch size of an imported model when none is given (the built-in graphs' default).
DEFAULT_BATCH = 128


def load_torch_source(spec: str, batch: int | None, model: int | None, **options):
    """The network the factory ``spec`` (``FILE_OR_MODULE:FUNCTION``) builds."""
    from .importer import load_torch_graph

    if model is not None:
        raise ValueError("-m does not apply to an imported model: its factory sets its sizes")
    return load_torch_graph(spec, DEFAULT_BATCH if batch is None else batch, **options)
