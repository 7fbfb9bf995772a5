"""Any Hugging Face ``config.json`` that ``pase.sources.hf`` does not read field by field:
``transformers`` builds the causal language model from the config on the ``meta`` device (no
weights, nothing downloaded) and ``from_torch`` imports it, as ``-g torch:`` would.
"""

from __future__ import annotations

from pase.core.errors import MissingDependency
from pase.core.optional import import_optional

from .errors import TorchImportError, _import_torch
from .factory import _quiet_logging, _raised

__all__ = ["HF_INSTALL_HINT", "TransformersNotInstalledError", "from_hf_config"]

#: The extra that brings PyTorch and transformers.
HF_INSTALL_HINT = "pip install '.[hf]'"


class TransformersNotInstalledError(TorchImportError, MissingDependency):
    """PyTorch or transformers is missing for a model type read through them."""

    def __init__(self, source: str, model_type: str):
        super().__init__(f"hf config {source}: model_type {model_type!r} is built by transformers and imported "
                         f"through PyTorch, which are not installed: {HF_INSTALL_HINT}")


def from_hf_config(data: dict, source: str, batch: int, sequence: int, name: str):
    """The network of the causal language model ``transformers`` builds from ``data`` (a parsed
    ``config.json``), for ``batch`` sequences of ``sequence`` token ids."""
    model_type = data.get("model_type")
    try:
        torch = _import_torch()
        transformers = import_optional("transformers", missing=ImportError)
    except ImportError:
        raise TransformersNotInstalledError(source, model_type) from None
    from .importer import from_torch

    fields = {k: v for k, v in data.items() if k != "model_type"}
    try:
        with _quiet_logging():
            config = transformers.AutoConfig.for_model(model_type, **fields)
            config.use_cache = False
            model = None
            for implementation in ("sdpa", "eager"):  # PyTorch's fused attention where the model has it
                config._attn_implementation = implementation
                try:
                    with torch.device("meta"):
                        model = transformers.AutoModelForCausalLM.from_config(config)
                    break
                except ValueError:
                    if implementation == "eager":
                        raise
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001  transformers raises many types
        raise TorchImportError(f"hf config {source}: transformers cannot build model_type {model_type!r} as a "
                               f"causal language model: {_raised(err)}") from None
    ids = torch.zeros(batch, sequence, dtype=torch.long, device="meta")
    return from_torch(model.train(), (ids,), name=name)
