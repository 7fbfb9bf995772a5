"""Llama 3 decoders (llama3-8b, llama3-70b, llama3-405b): RMSNorm, SwiGLU MLP, grouped-query attention.

A pre-norm decoder of ``L`` blocks, ``17 L + 4`` vertices. Token ids, the rotary tables and
all weights are graph inputs; the weights are parameters, ids and rotary tables are not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import Einsum, Elementwise, Embedding, RMSNorm, Softmax, SoftmaxCrossEntropy
from pase.model.tensor import Tensor

from .decoder import ROLES

__all__ = ["LlamaConfig", "LLAMA_CONFIGS", "llama", "parameter_count"]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama 3 model: layers, width, query heads, key/value heads, MLP width."""

    layers: int
    width: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int = 128256
    key: int = 128  # width per head

    @property
    def group(self) -> int:
        """Query heads per key/value head (``r``)."""
        return self.heads // self.kv_heads


#: Meta's published shapes (Llama 3 model card, ``params.json``).
LLAMA_CONFIGS = {
    "llama3-8b": LlamaConfig(32, 4096, 32, 8, 14336),
    "llama3-70b": LlamaConfig(80, 8192, 64, 8, 28672),
    "llama3-405b": LlamaConfig(126, 16384, 128, 8, 53248),  # Llama 3.1 405B
}

#: Default sequence length (CLI ``-m``).
SEQUENCE = 2048

#: The rotary base and the norms' epsilon of every Llama 3 and 3.1 model (Meta's ``params.json``:
#: ``"rope_theta": 500000.0``, ``"norm_eps": 1e-05``).
ROPE_THETA = 500000.0
NORM_EPS = 1e-5
#: Llama 3.1's rotary scaling (``params.json`` ``"use_scaled_rope": true``; Hugging Face's
#: ``rope_scaling`` of Llama-3.1 configs): frequencies scaled by 8 beyond the original 8192
#: positions, smoothly between wavelengths 8192 / 4 and 8192 / 1. The 8B and 70B built here are
#: Llama 3's (unscaled); the 405B is Llama 3.1's.
LLAMA31_ROPE_SCALING = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                        ("original_max_position_embeddings", 8192), ("type", "llama3"))
SCALED_ROPE = ("llama3-405b",)


def parameter_count(config: LlamaConfig) -> int:
    """Closed form ``2 V e + L (2 e^2 + 2 e g k + 3 e f) + (2 L + 1) e``.

    Embedding and output weight (``V e`` each, untied); per block Wq and Wo (``e^2`` each,
    ``heads * k = e``), Wk and Wv (``e g k`` each), the gate, up and down projections
    (``e f`` each); ``2 L + 1`` RMSNorms of one scale vector of length ``e`` each.
    """
    V, e, L, f = config.vocab, config.width, config.layers, config.hidden
    gk = config.kv_heads * config.key
    return 2 * V * e + L * (2 * e * e + 2 * e * gk + 3 * e * f) + (2 * L + 1) * e


def _block(g: GraphBuilder, name: str, x: Tensor, cfg: LlamaConfig, rotary_q: Tensor, rotary_k: Tensor) -> Tensor:
    """``r = x + attention(norm(x))``, then ``r + down(silu(gate(norm(r))) * up(norm(r)))``."""
    e, f, G, R, k = cfg.width, cfg.hidden, cfg.kv_heads, cfg.group, cfg.key
    y = g.add(f"{name}.attn.norm", RMSNorm(x, axis=-1))
    wq = g.weight((G, R, e, k), f"{name}.attn.wq", letters="grek")
    wk = g.weight((G, e, k), f"{name}.attn.wk", letters="gek")
    wv = g.weight((G, e, k), f"{name}.attn.wv", letters="gek")
    q = g.add(f"{name}.attn.q", Einsum("ble,grek->bgrlk", y, wq))
    key = g.add(f"{name}.attn.k", Einsum("ble,gek->bglk", y, wk))
    value = g.add(f"{name}.attn.v", Einsum("ble,gek->bglk", y, wv))
    # Rotary embedding: an element-wise product with a precomputed table (a graph input,
    # no edge); its sin/cos mixing of pairs of k is not modelled apart from that.
    q = g.add(f"{name}.attn.q_rotary", Elementwise(q, rotary_q))
    key = g.add(f"{name}.attn.k_rotary", Elementwise(key, rotary_k))
    scores = g.add(f"{name}.attn.scores", Einsum("bgrlk,bgmk->bgrlm", q, key))
    weights = g.add(f"{name}.attn.softmax", Softmax(scores, axis=-1, causal=True))
    context = g.add(f"{name}.attn.context", Einsum("bgrlm,bgmk->bgrlk", weights, value))
    wo = g.weight((G, R, e, k), f"{name}.attn.wo", letters="grek")
    out = g.add(f"{name}.attn.out", Einsum("bgrlk,grek->ble", context, wo))
    r = g.add(f"{name}.attn.residual", Elementwise(x, out, combine="add"))
    y = g.add(f"{name}.ff.norm", RMSNorm(r, axis=-1))
    w_gate = g.weight((e, f), f"{name}.ff.w_gate", letters="ef")
    w_up = g.weight((e, f), f"{name}.ff.w_up", letters="ef")
    w_down = g.weight((f, e), f"{name}.ff.w_down", letters="fe")
    gate = g.add(f"{name}.ff.gate", Einsum("ble,ef->blf", y, w_gate, pw=1))  # pw 1: the SiLU
    up = g.add(f"{name}.ff.up", Einsum("ble,ef->blf", y, w_up))
    h = g.add(f"{name}.ff.multiply", Elementwise(gate, up))
    down = g.add(f"{name}.ff.down", Einsum("blf,fe->ble", h, w_down))
    return g.add(f"{name}.ff.residual", Elementwise(r, down, combine="add"))


def llama(name: str, batch: int = 128, model: int | None = None) -> Network:
    """The Llama 3 graph ``name`` (a key of ``LLAMA_CONFIGS``); ``model`` is the sequence length.

    >>> net = llama("llama3-8b", 8)
    >>> len(net), net.names[2]
    (548, 'block1.attn.q')
    """
    if name not in LLAMA_CONFIGS:
        raise ValueError(f"unknown Llama model {name!r}; choose one of: {', '.join(LLAMA_CONFIGS)}")
    sequence = SEQUENCE if model is None else model
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
        raise ValueError(f"the Llama sequence length (-m) must be a positive integer, got {sequence!r}")
    cfg = LLAMA_CONFIGS[name]
    G, R, k = cfg.kv_heads, cfg.group, cfg.key
    g = GraphBuilder(name, cutoff=1, batch=batch, roles=ROLES)
    ids = g.input((batch, sequence), "ids", letters="bl")
    rotary_q = g.input((batch, G, R, sequence, k), "rotary table (queries)", letters="bgrlk")
    rotary_k = g.input((batch, G, sequence, k), "rotary table (keys)", letters="bglk")
    x = g.add("embedding", Embedding(ids, cfg.vocab, cfg.width, letters="bl"))
    for i in range(1, cfg.layers + 1):
        with g.block():  # one decoder layer: the repeated block pipelines and recomputation read
            x = _block(g, f"block{i}", x, cfg, rotary_q, rotary_k)
    y = g.add("final.norm", RMSNorm(x, axis=-1))
    w = g.weight((cfg.width, cfg.vocab), "output weight", letters="ev")
    logits = g.add("head.logits", Einsum("ble,ev->blv", y, w))
    g.add("loss", SoftmaxCrossEntropy(logits))
    shape = {"layers": cfg.layers, "width": cfg.width, "heads": cfg.heads, "kv_heads": cfg.kv_heads, "head_dim": k,
             "mlp_width": cfg.hidden, "vocab": cfg.vocab, "sequence": sequence, "max_positions": sequence,
             "gated": True, "norm": "rms", "positions": "rotary", "tied": False,
             "biases": {"qkv": False, "out": False, "mlp": False}, "qk_norm": False,
             "rope": {"theta": ROPE_THETA, "scaling": dict(LLAMA31_ROPE_SCALING) if name in SCALED_ROPE else None},
             "norm_eps": NORM_EPS}
    return replace(g.build(), architecture=shape)
