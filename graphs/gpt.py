"""GPT-style decoder-only language models (``docs/graphs.md``): gpt2-small ... gpt3-175b.

A pre-LayerNorm decoder of ``L`` blocks, ``12 L + 5`` vertices. Token ids, the position
embedding and all weights are graph inputs; the weights are parameters (``docs/memory.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import Einsum, Elementwise, Embedding, Norm, SoftmaxCrossEntropy
from pase.model.tensor import Tensor

from .transformer import ROLES, multi_head

__all__ = ["GPTConfig", "GPT_CONFIGS", "gpt", "parameter_count"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT model: layers, width, heads, sequence length, vocabulary."""

    layers: int
    width: int
    heads: int
    sequence: int
    vocab: int = 50304  # the GPT-2 vocabulary padded to a multiple of 128

    @property
    def key(self) -> int:
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        return 4 * self.width


GPT_CONFIGS = {
    "gpt2-small": GPTConfig(12, 768, 12, 1024),
    "gpt2-medium": GPTConfig(24, 1024, 16, 1024),
    "gpt2-large": GPTConfig(36, 1280, 20, 1024),
    "gpt2-xl": GPTConfig(48, 1600, 25, 1024),
    "gpt3-2.7b": GPTConfig(32, 2560, 32, 2048),
    "gpt3-6.7b": GPTConfig(32, 4096, 32, 2048),
    "gpt3-13b": GPTConfig(40, 5120, 40, 2048),
    "gpt3-175b": GPTConfig(96, 12288, 96, 2048),  # GPT-3 paper, Table 2.1 (key width 128)
}


def parameter_count(config: GPTConfig) -> int:
    """Closed form ``2 V e + L (12 e^2 + 4 e) + 2 e``: embeddings, blocks, final norm."""
    V, e, L = config.vocab, config.width, config.layers
    return 2 * V * e + L * (12 * e * e + 4 * e) + 2 * e


def _block(g: GraphBuilder, name: str, x: Tensor, cfg: GPTConfig) -> Tensor:
    """Pre-norm block: ``r = x + attention(norm(x))``, then ``r + ff(norm(r))``."""
    e, f = cfg.width, cfg.hidden
    y = g.add(f"{name}.attn.norm", Norm(x, axis=-1))
    out = multi_head(g, f"{name}.attn", [y], cfg.heads, cfg.key, causal=True)
    r = g.add(f"{name}.attn.residual", Elementwise(x, out, combine="add"))
    y = g.add(f"{name}.ff.norm", Norm(r, axis=-1))
    w1 = g.weight((e, f), f"{name}.ff.w1", letters="ef")
    w2 = g.weight((f, e), f"{name}.ff.w2", letters="fe")
    up = g.add(f"{name}.ff.up", Einsum("ble,ef->blf", y, w1, pw=1))
    down = g.add(f"{name}.ff.down", Einsum("blf,fe->ble", up, w2))
    return g.add(f"{name}.ff.residual", Elementwise(r, down, combine="add"))


def gpt(name: str, batch: int = 128, model: int | None = None) -> Network:
    """The GPT graph ``name`` (a key of ``GPT_CONFIGS``) for mini-batch ``batch``; ``model``
    is the sequence length (default: the model's context, ``GPTConfig.sequence``).

    >>> net = gpt("gpt2-small", 8)
    >>> len(net), net.names[3]
    (149, 'block1.attn.qkv')
    """
    if name not in GPT_CONFIGS:
        raise ValueError(f"unknown GPT model {name!r}; choose one of: {', '.join(GPT_CONFIGS)}")
    cfg = GPT_CONFIGS[name]
    if model is not None:
        if isinstance(model, bool) or not isinstance(model, int) or model < 1:
            raise ValueError(f"the GPT sequence length (-m) must be a positive integer, got {model!r}")
        # The position embedding is a graph input (b, l, e): any length prices alike.
        cfg = replace(cfg, sequence=model)
    g = GraphBuilder(name, cutoff=1, batch=batch, roles=ROLES)
    ids = g.input((batch, cfg.sequence), "ids", letters="bl")
    position = g.input((batch, cfg.sequence, cfg.width), "position embedding", letters="ble")
    x = g.add("embedding", Embedding(ids, cfg.vocab, cfg.width, letters="bl"))
    x = g.add("position", Elementwise(x, position, combine="add"))
    for i in range(1, cfg.layers + 1):
        with g.block():  # one decoder layer: the repeated block pipelines and recomputation read
            x = _block(g, f"block{i}", x, cfg)
    y = g.add("final.norm", Norm(x, axis=-1))
    w = g.weight((cfg.width, cfg.vocab), "output weight", letters="ev")
    logits = g.add("head.logits", Einsum("ble,ev->blv", y, w))
    g.add("loss", SoftmaxCrossEntropy(logits))
    # Positions are a graph input here (no table priced); an engine builds its learned table.
    shape = {"layers": cfg.layers, "width": cfg.width, "heads": cfg.heads, "kv_heads": cfg.heads,
             "head_dim": cfg.key, "mlp_width": cfg.hidden, "vocab": cfg.vocab, "sequence": cfg.sequence,
             "max_positions": cfg.sequence, "gated": False, "norm": "layer", "positions": "learned", "tied": False,
             "biases": {"qkv": False, "out": False, "mlp": False}, "qk_norm": False,
             "norm_eps": 1e-5}  # GPT-2's and GPT-3's LayerNorm epsilon (GPT-2's layer_norm_epsilon)
    return replace(g.build(), architecture=shape)
