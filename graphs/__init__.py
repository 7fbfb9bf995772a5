"""The built-in networks (``docs/graphs.md``) and their registry by name.

Each entry builds a ``pase.Network`` from a batch size and, where the graph has one, a
model width (CLI ``-m``). The default width gives exactly the graphs of the spec. They use
``pase.model`` only; ``pase.sources.load`` reads them, graph files and PyTorch models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pase.model.builder import Network

from functools import partial

from .alexnet import alexnet
from .flagships import FLAGSHIP_CONFIGS, flagship
from .gpt import GPT_CONFIGS, gpt
from .inception import inception3
from .llama import LLAMA_CONFIGS, llama
from .mixtral import MIXTRAL_CONFIGS, mixtral
from .resnet import resnet101
from .rnnlm import rnnlm
from .transformer import transformer

__all__ = [
    "GraphEntry", "GRAPHS", "build", "DEFAULT_BATCH", "alexnet", "resnet101", "inception3", "rnnlm", "transformer", "gpt",
    "GPT_CONFIGS", "llama", "LLAMA_CONFIGS", "mixtral", "MIXTRAL_CONFIGS", "flagship", "FLAGSHIP_CONFIGS",
]


@dataclass(frozen=True)
class GraphEntry:
    """A built-in graph: its builder and what ``-m`` means for it."""

    name: str
    builder: Callable
    description: str
    model_help: str | None = None  # what -m sets; None: the graph takes no -m
    default_model: int | None = None
    model_name: str = "model width"  # how outputs name the -m value


GRAPHS = {
    entry.name: entry
    for entry in (
        GraphEntry("alexnet", alexnet, "AlexNet, 14 vertices (a path)"),
        GraphEntry("resnet101", resnet101, "ResNet-101, 245 vertices"),
        GraphEntry("inception3", inception3, "InceptionV3, 219 vertices"),
        GraphEntry("rnnlm", rnnlm, "two-layer LSTM language model, 4 vertices",
                   "embedding width and LSTM units", 2048),
        GraphEntry("transformer", transformer, "encoder-decoder Transformer, 204 vertices",
                   "model width e (8 heads of e/8, feed-forward 4e)", 512),
    )
}
for _name, _cfg in GPT_CONFIGS.items():
    GRAPHS[_name] = GraphEntry(
        _name, partial(gpt, _name),
        f"GPT decoder, {_cfg.layers} layers, width {_cfg.width}, {12 * _cfg.layers + 5} vertices",
        "sequence length", _cfg.sequence, "sequence length",
    )
for _name, _cfg in LLAMA_CONFIGS.items():
    GRAPHS[_name] = GraphEntry(
        _name, partial(llama, _name),
        f"Llama 3 decoder, {_cfg.layers} layers, width {_cfg.width}, {_cfg.heads} heads "
        f"({_cfg.kv_heads} key/value), {17 * _cfg.layers + 4} vertices",
        "sequence length", 2048, "sequence length",
    )
for _name, _cfg in MIXTRAL_CONFIGS.items():
    GRAPHS[_name] = GraphEntry(
        _name, partial(mixtral, _name),
        f"Mixtral decoder, {_cfg.layers} layers, width {_cfg.width}, {_cfg.moe.experts} experts (top "
        f"{_cfg.moe.top_k}) of width {_cfg.moe.width}, {14 * _cfg.layers + 4} vertices",
        "sequence length", 4096, "sequence length",
    )
for _name, _cfg in FLAGSHIP_CONFIGS.items():
    _kind = "MLA, " if _cfg.mla is not None else ""
    GRAPHS[_name] = GraphEntry(
        _name, partial(flagship, _name),
        f"{_name} decoder (its config.json), {_cfg.layers} layers, width {_cfg.width}, {_kind}{_cfg.moe.experts} experts "
        f"(top {_cfg.moe.top_k})", "sequence length", 2048, "sequence length",
    )
del _name, _cfg, _kind


#: The batch size of a built-in graph when none is given.
DEFAULT_BATCH = 128


def build(name: str, batch: int = DEFAULT_BATCH, model: int | None = None) -> Network:
    """Build the graph ``name`` for mini-batch ``batch`` (and width ``model`` if it has one).

    Raises ``ValueError`` for an unknown name, a non-positive batch, or a ``model`` given
    to a graph that has no width.
    """
    if name not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; choose one of: {', '.join(GRAPHS)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"the batch size must be a positive integer, got {batch!r}")
    entry = GRAPHS[name]
    if model is None:
        return entry.builder(batch)
    if entry.model_help is None:
        raise ValueError(f"graph {name!r} has no model size; -m applies to: "
                         + ", ".join(n for n, e in GRAPHS.items() if e.model_help))
    return entry.builder(batch, model)
