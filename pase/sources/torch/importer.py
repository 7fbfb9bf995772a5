"""Bring your own model: a PyTorch ``nn.Module`` traced by ``torch.export``, as a PaSE network.

The ATen graph is mapped onto the layer types of ``docs/cost-model.md``; views, transposes and
reshapes become Einsum letters rather than vertices. torch is imported only in here, lazily.

How the mapping works
---------------------
Every traced tensor that depends on the mini-batch is a *view* of one layer output (or of a
user input): for each of its dimensions, the list of *atoms* it is made of. An atom is a
dimension of the underlying layer output, or a piece of one: when a reshape splits a
dimension of a projection's output (``(b, l, 3e) -> (b, l, 3, h, k)``), the atom is refined
and the projection is emitted as an Einsum with one letter per piece. A consumer that
contracts (linear, matmul, attention) reads any view, since its letters absorb the
permutation and the merges; a layer that needs its input in its own order (a convolution, a
norm, a concatenation) reads the layer output itself, or, where no view fits, a Reshape pair.

Tensors that do not depend on the batch (weights, masks, position ids, rotary tables) are
*replicated*: they are graph inputs, never vertices, and make no edges. Point-wise operations
ride along: each one adds 1 to the fused point-wise count ``pw`` of the layer that produced
its operand. Unsupported operations are collected and reported together (``UnmappableOpsError``).
"""

from __future__ import annotations

from pase.model.builder import Network
from pase.model.readers import READER_RULES
from pase.core.checks import is_positive_int

from .errors import (
    INSTALL_HINT, FactoryError, TorchImportError, TorchNotInstalledError, UnmappableOpsError, _import_torch, Unmappable,
)
from .factory import _quiet_logging, _raised, load_factory
from .moe import stand_ins
from .walk import GraphWalk

__all__ = [
    "from_torch", "load_factory", "load_torch_graph", "TorchImportError", "TorchNotInstalledError",
    "UnmappableOpsError", "FactoryError", "LOSSES", "INSTALL_HINT",
]


#: Values of ``loss``: a softmax cross-entropy over the output's last axis, or none.
LOSSES = ("cross-entropy", None)


def from_torch(module, args, kwargs=None, name: str | None = None, loss: str | None = "cross-entropy",
               cutoff: int | None = None, readers: str = "each") -> Network:
    """The PaSE network of a PyTorch module, traced with ``torch.export``.

    Parameters
    ----------
    module : torch.nn.Module
        The model, in the mode (train or eval) it should be planned in. Built on the
        ``meta`` device it imports without allocating its weights.
    args : tuple
        Positional example inputs (a single tensor is taken as a one-tuple); their leading
        dimension is the mini-batch. Floating-point inputs, and the integer inputs that
        feed an embedding (token ids), carry the batch; other inputs are replicated.
    kwargs : dict, optional
        Keyword example inputs.
    name : str, optional
        The network's name; defaults to the module's class name.
    loss : {"cross-entropy", None}
        Append a softmax cross-entropy over the last axis of the model's (first
        batch-dependent) output, as the built-in graphs have; ``None`` (or ``"none"``) omits it.
    cutoff : int, optional
        Configuration cut-off; default 4 when the model has convolutions (like the built-in
        CNNs), otherwise 1.
    readers : {"each", "summed"}
        How several readers of one tensor reduce its gradient (``pase.model.readers``):
        ``"each"`` its own, the paper's rule (default), or ``"summed"`` once where they are
        laid out alike, as PyTorch runs them (exact, and a larger search).

    Returns
    -------
    pase.Network

    Raises
    ------
    TorchNotInstalledError
        torch is not installed (the message says ``pip install '.[torch]'``).
    UnmappableOpsError
        Some operations have no PaSE layer: every one is named once, with its module path.
    TorchImportError
        Bad arguments, a model ``torch.export`` cannot trace, or no batch-dependent input.

    Examples
    --------
    >>> import torch                                                     # doctest: +SKIP
    >>> net = from_torch(torch.nn.Linear(64, 10), (torch.randn(32, 64),))  # doctest: +SKIP
    >>> [layer.op for layer in net.layers]                               # doctest: +SKIP
    ['FC', 'SoftmaxCrossEntropy']
    """
    torch = _import_torch()
    if not isinstance(module, torch.nn.Module):
        raise TorchImportError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise TorchImportError(f"the example inputs must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TorchImportError(f"the keyword inputs must be a dict, got {type(kwargs).__name__}")
    if isinstance(loss, str) and loss.lower() == "none":
        loss = None
    if loss not in LOSSES:
        raise TorchImportError(f"loss must be 'cross-entropy' or None, got {loss!r}")
    if readers not in READER_RULES:
        raise TorchImportError(f"readers must be one of {', '.join(READER_RULES)}, got {readers!r}")
    if cutoff is not None and (not is_positive_int(cutoff)):
        raise TorchImportError(f"the cut-off must be a positive integer, got {cutoff!r}")
    model_name = name or type(module).__name__
    if not isinstance(model_name, str) or not model_name:
        raise TorchImportError(f"the network name must be a non-empty string, got {name!r}")
    try:
        # Mixture-of-experts blocks are traced as one operation each (``moe.py``).
        with _quiet_logging(), stand_ins(module, torch) as traced:
            program = torch.export.export(traced, tuple(args), kwargs=dict(kwargs or {}), strict=False)
    except TorchImportError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001  torch raises many types, the model's forward anything
        raise TorchImportError(f"torch.export could not trace {model_name}: {_raised(err)}") from err
    importer = GraphWalk(program, torch, model_name, traced)
    importer.run()
    if importer.batch is None:
        raise TorchImportError(
            f"{model_name}: no input carries a batch (a floating-point tensor or token ids read by an embedding)")
    if importer.problems:
        ops = [(op, where, reason, count) for op, (where, reason, count) in importer.problems.items()]
        raise UnmappableOpsError(model_name, ops)
    importer.finish_outputs()
    if loss is not None:
        importer.add_loss()
    if not importer.protos:
        raise TorchImportError(f"{model_name}: no layer depends on the batch input; there is nothing to plan")
    chosen = cutoff if cutoff is not None else (4 if importer.has_conv else 1)
    try:
        return importer.emit(chosen).with_readers(readers)
    except Unmappable as why:
        raise TorchImportError(f"{model_name}: {why}") from None


def load_torch_graph(spec: str, batch: int, loss: str | None = "cross-entropy", cutoff: int | None = None,
                     name: str | None = None) -> Network:
    """``from_torch`` of the model a factory ``spec`` (without the ``torch:`` prefix) builds.

    The network is named after the factory function unless ``name`` is given.
    """
    module, args, kwargs = load_factory(spec, batch)
    return from_torch(module, args, kwargs, name=name or spec.rpartition(":")[2], loss=loss, cutoff=cutoff)
