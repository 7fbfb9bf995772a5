"""A generic decoder-only transformer from a shape (``DecoderConfig``): Llama, Mistral, Qwen2, GPT-2.

The block is ``graphs/llama.py``'s: the same layer types, the same vertex names
(``block3.attn.q``, ``block3.ff.up``, ...) and grouped-query attention written as
``(g, r)`` heads, so a Llama shape gives exactly the built-in ``llama3-*`` network. What
varies with the config:

- MLP: gated (SwiGLU: ``ff.gate`` with the activation as one point-wise op, ``ff.up``,
  ``ff.multiply``, ``ff.down``) or plain (``ff.up`` with the activation, ``ff.down``);
- norms: ``RMSNorm`` (one scale vector) or ``Norm`` (layer norm: scale and bias);
- positions: rotary (two tables, graph inputs, applied by ``attn.q_rotary`` and
  ``attn.k_rotary``) or learned (``position.embedding``, an Embedding of the position ids
  whose table of ``max_positions x width`` is a parameter, added to the token embedding by
  the Elementwise ``position``, as ``graphs/gpt.py`` adds its position input);
- biases of the q/k/v projections, of the attention output and of the MLP: counted as
  parameters of the projection (see ``BiasedEinsum``), not priced (a fused epilogue);
- queries' and keys' norms over each head (``qk_norm``, Qwen3): ``attn.q_norm``, ``attn.k_norm``;
- mixture of experts (``DecoderConfig.moe``, a ``MoEConfig``): the MLP of every block but the
  dense ones is one ``MoE`` vertex ``blockN.ff.moe`` (Mixtral, Qwen-MoE);
- the output head: its own weight ``(e, V)`` (``ble,ev->blv``), or, tied, the embedding's
  very table ``(V, e)`` (``ble,ve->blv``): the same ``Tensor`` object the Embedding reads.

Tied weights: ``network.layers[head].inputs[1] is network.layers[embedding].inputs[1]``.
Tensors compare by value and every Embedding's table has the same key, so object identity
is what tells a shared tensor; ``shared_parameters`` lists the sharing and
``distinct_parameter_count`` counts each tensor once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import Einsum, Elementwise, Embedding, MoE, Norm, RMSNorm, Softmax, SoftmaxCrossEntropy
from pase.model.tensor import Tensor

__all__ = [
    "MoEConfig", "DecoderConfig", "BiasedEinsum", "decoder", "parameter_count", "distinct_parameter_count",
    "shared_parameters", "SEQUENCE",
]

#: Default sequence length when neither ``-m`` nor the config limits it.
SEQUENCE = 2048

#: The most blocks a decoder may have: the largest published decoders have about 128, and a
#: config asking for a million (a typo) would take minutes to build before any answer.
MAX_LAYERS = 1024

NORMS = ("rms", "layer")
POSITIONS = ("rotary", "learned")


@dataclass(frozen=True)
class MoEConfig:
    """The mixture of experts of a decoder's MLPs: ``experts`` experts of width ``width``,
    ``top_k`` per token, ``shared`` always-on experts of width ``shared_width`` (with a sigmoid
    gate on their output, ``shared_gate``, as Qwen2-MoE), and the 0-based block indices
    ``dense`` that keep the dense MLP of ``DecoderConfig.mlp_width``. ``capacity`` and
    ``imbalance`` are the ``MoE`` layer's."""

    experts: int
    top_k: int
    width: int
    shared: int = 0
    shared_width: int = 0
    shared_gate: bool = False
    dense: tuple = ()
    capacity: float | None = None
    imbalance: float = 1.0

    def __post_init__(self):
        for name in ("experts", "top_k", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"decoder moe {name} must be a positive integer, got {value!r}")
        if not isinstance(self.dense, tuple) or not all(isinstance(i, int) and i >= 0 for i in self.dense):
            raise ValueError(f"decoder moe dense must be a tuple of block indices, got {self.dense!r}")

    def parameters(self, width: int, gated: bool) -> int:
        """Parameters of one MoE MLP: ``e E`` (router) ``+ E m e H`` ``+ m e S H_s`` ``(+ e)``."""
        m = 3 if gated else 2
        total = width * self.experts + self.experts * m * width * self.width
        return total + m * width * self.shared * self.shared_width + (width if self.shared_gate else 0)


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of a decoder-only transformer.

    ``heads`` query heads and ``kv_heads`` key/value heads (``kv_heads`` divides ``heads``)
    of width ``head_dim`` each; ``heads * head_dim`` need not equal ``width``. ``mlp_width``
    is the MLP's inner width (``f``). ``max_positions`` is the learned position table's
    length (learned positions only; at least ``sequence``).
    """

    layers: int
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp_width: int
    vocab: int
    sequence: int = SEQUENCE
    gated: bool = True
    norm: str = "rms"
    positions: str = "rotary"
    max_positions: int | None = None
    tied: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    moe: MoEConfig | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "moe":
                if value is not None and not isinstance(value, MoEConfig):
                    raise ValueError(f"decoder moe must be a MoEConfig, got {type(value).__name__}")
            elif f.name in ("gated", "tied", "qkv_bias", "out_bias", "mlp_bias", "qk_norm"):
                if not isinstance(value, bool):
                    raise ValueError(f"decoder {f.name} must be true or false, got {value!r}")
            elif f.name in ("norm", "positions"):
                choices = NORMS if f.name == "norm" else POSITIONS
                if value not in choices:
                    raise ValueError(f"decoder {f.name} must be one of {', '.join(choices)}, got {value!r}")
            elif f.name == "max_positions" and value is None:
                if self.positions == "learned":
                    raise ValueError("decoder max_positions must be given for learned positions")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"decoder {f.name} must be a positive integer, got {value!r}")
        if self.layers > MAX_LAYERS:
            raise ValueError(f"decoder layers must be at most {MAX_LAYERS} (the largest published decoders have "
                             f"about 128), got {self.layers}")
        if self.heads % self.kv_heads:
            raise ValueError(f"decoder kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.positions == "learned" and self.sequence > self.max_positions:
            raise ValueError(f"decoder sequence {self.sequence} is longer than its {self.max_positions} "
                             "learned positions")

    @property
    def group(self) -> int:
        """Query heads per key/value head (``r``)."""
        return self.heads // self.kv_heads

    def is_sparse(self, index: int) -> bool:
        """Whether block ``index`` (0-based) has a mixture of experts for its MLP."""
        return self.moe is not None and index not in self.moe.dense


def parameter_count(config: DecoderConfig) -> int:
    """Trainable parameters in closed form, each tensor once (a tied table once).

    ``V e`` (embedding) ``+ V e`` (untied head) ``+ P e`` (learned positions) ``+ L [e h k``
    (q) ``+ 2 e g k`` (k, v) ``+ h k e`` (out) ``+ (h k + 2 g k)`` (q/k/v biases) ``+ e`` (out
    bias) ``+ 3 e f`` (gated) or ``2 e f`` (plain) ``+ 2 f + e`` or ``f + e`` (MLP biases)``]
    + (2 L + 1) e`` per norm vector (1 for RMSNorm, 2 for LayerNorm).

    >>> from graphs.llama import LLAMA_CONFIGS
    >>> c = LLAMA_CONFIGS["llama3-8b"]
    >>> parameter_count(DecoderConfig(c.layers, c.width, c.heads, c.kv_heads, c.key, c.hidden, c.vocab))
    8030261248
    """
    c = config
    V, e, L, f = c.vocab, c.width, c.layers, c.mlp_width
    hk, gk = c.heads * c.head_dim, c.kv_heads * c.head_dim
    total = V * e * (1 if c.tied else 2)
    if c.positions == "learned":
        total += c.max_positions * e
    attention = 2 * e * hk + 2 * e * gk + (hk + 2 * gk if c.qkv_bias else 0) + (e if c.out_bias else 0)
    if c.gated:
        mlp = 3 * e * f + (2 * f + e if c.mlp_bias else 0)
    else:
        mlp = 2 * e * f + (f + e if c.mlp_bias else 0)
    norms = (2 * L + 1) * e * (1 if c.norm == "rms" else 2) + (2 * L * c.head_dim if c.qk_norm else 0)
    if c.moe is not None:
        sparse = sum(1 for i in range(L) if c.is_sparse(i))
        total += sparse * (c.moe.parameters(e, c.gated) - mlp)
    return total + L * (attention + mlp) + norms


class BiasedEinsum(Einsum):
    """An Einsum whose weight has a bias over its output dimensions (``N``): a projection with bias.

    Priced exactly as the Einsum (the bias add is a fused epilogue, not a point-wise pass);
    ``parameters()`` adds the bias, split like the output dimensions it spans, so the memory
    model counts it. It is not a layer type of its own (``op`` stays ``"Einsum"``): a graph
    file, which has no field for a bias, writes it as a plain Einsum (same costs, the bias
    left out).
    """

    def __init__(self, equation: str, a: Tensor, b: Tensor, pw: int = 0):
        super().__init__(equation, a, b, pw=pw)
        self.bias_shape = tuple(self.domain[self._cols[x]] for x in self.n_letters)

    def parameters(self):
        return super().parameters() + [(self.bias_shape, tuple(self._columns(self.n_letters)))]


def _project(g: GraphBuilder, name: str, equation: str, x: Tensor, w: Tensor, bias: bool, pw: int = 0) -> Tensor:
    return g.add(name, (BiasedEinsum if bias else Einsum)(equation, x, w, pw=pw))


def _norm(x: Tensor, cfg: DecoderConfig):
    return RMSNorm(x, axis=-1) if cfg.norm == "rms" else Norm(x, axis=-1)


def _block(g: GraphBuilder, name: str, x: Tensor, cfg: DecoderConfig, rotary, sparse: bool = False) -> Tensor:
    """``r = x + attention(norm(x))``, then ``r + mlp(norm(r))`` (``graphs/llama.py``'s block)."""
    e, f, G, R, k = cfg.width, cfg.mlp_width, cfg.kv_heads, cfg.group, cfg.head_dim
    y = g.add(f"{name}.attn.norm", _norm(x, cfg))
    wq = g.weight((G, R, e, k), f"{name}.attn.wq", letters="grek")
    wk = g.weight((G, e, k), f"{name}.attn.wk", letters="gek")
    wv = g.weight((G, e, k), f"{name}.attn.wv", letters="gek")
    q = _project(g, f"{name}.attn.q", "ble,grek->bgrlk", y, wq, cfg.qkv_bias)
    key = _project(g, f"{name}.attn.k", "ble,gek->bglk", y, wk, cfg.qkv_bias)
    value = _project(g, f"{name}.attn.v", "ble,gek->bglk", y, wv, cfg.qkv_bias)
    if cfg.qk_norm:  # Qwen3: an RMSNorm over each head's width of the queries and keys
        q = g.add(f"{name}.attn.q_norm", RMSNorm(q, axis=-1))
        key = g.add(f"{name}.attn.k_norm", RMSNorm(key, axis=-1))
    if rotary is not None:
        # As graphs/llama.py: a product with a precomputed table (a graph input, no edge).
        q = g.add(f"{name}.attn.q_rotary", Elementwise(q, rotary[0]))
        key = g.add(f"{name}.attn.k_rotary", Elementwise(key, rotary[1]))
    scores = g.add(f"{name}.attn.scores", Einsum("bgrlk,bgmk->bgrlm", q, key))
    weights = g.add(f"{name}.attn.softmax", Softmax(scores, axis=-1, causal=True))
    context = g.add(f"{name}.attn.context", Einsum("bgrlm,bgmk->bgrlk", weights, value))
    wo = g.weight((G, R, e, k), f"{name}.attn.wo", letters="grek")
    out = _project(g, f"{name}.attn.out", "bgrlk,grek->ble", context, wo, cfg.out_bias)
    r = g.add(f"{name}.attn.residual", Elementwise(x, out))
    y = g.add(f"{name}.ff.norm", _norm(r, cfg))
    if sparse:
        m = cfg.moe
        out = g.add(f"{name}.ff.moe", MoE(y, m.experts, m.top_k, m.width, gated=cfg.gated, capacity=m.capacity,
                                          imbalance=m.imbalance, shared=m.shared, shared_hidden=m.shared_width,
                                          shared_gate=m.shared_gate))
        return g.add(f"{name}.ff.residual", Elementwise(r, out))
    if cfg.gated:
        w_gate = g.weight((e, f), f"{name}.ff.w_gate", letters="ef")
        w_up = g.weight((e, f), f"{name}.ff.w_up", letters="ef")
        w_down = g.weight((f, e), f"{name}.ff.w_down", letters="fe")
        gate = _project(g, f"{name}.ff.gate", "ble,ef->blf", y, w_gate, cfg.mlp_bias, pw=1)  # pw 1: the activation
        up = _project(g, f"{name}.ff.up", "ble,ef->blf", y, w_up, cfg.mlp_bias)
        h = g.add(f"{name}.ff.multiply", Elementwise(gate, up))
    else:
        w_up = g.weight((e, f), f"{name}.ff.w_up", letters="ef")
        w_down = g.weight((f, e), f"{name}.ff.w_down", letters="fe")
        h = _project(g, f"{name}.ff.up", "ble,ef->blf", y, w_up, cfg.mlp_bias, pw=1)  # pw 1: the activation
    down = _project(g, f"{name}.ff.down", "blf,fe->ble", h, w_down, cfg.mlp_bias)
    return g.add(f"{name}.ff.residual", Elementwise(r, down))


def decoder(config: DecoderConfig, batch: int, name: str = "decoder") -> Network:
    """The network of ``config`` for ``batch`` sequences of ``config.sequence`` tokens.

    ``17 L + 4`` vertices with rotary positions and a gated MLP (``graphs/llama.py``), ``13 L +
    6`` with learned positions and a plain MLP (GPT-2).

    >>> net = decoder(DecoderConfig(2, 64, 4, 2, 16, 128, 100, sequence=8), 2)
    >>> len(net), net.names[2]
    (38, 'block1.attn.q')
    """
    if not isinstance(config, DecoderConfig):
        raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"the batch size must be a positive integer, got {batch!r}")
    cfg, s = config, config.sequence
    G, R, k = cfg.kv_heads, cfg.group, cfg.head_dim
    g = GraphBuilder(name, cutoff=1, batch=batch)
    ids = g.input((batch, s), "ids", letters="bl")
    rotary = None
    if cfg.positions == "rotary":
        rotary = (g.input((batch, G, R, s, k), "rotary table (queries)", letters="bgrlk"),
                  g.input((batch, G, s, k), "rotary table (keys)", letters="bglk"))
    embedding = Embedding(ids, cfg.vocab, cfg.width, letters="bl")
    x = g.add("embedding", embedding)
    if cfg.positions == "learned":
        positions = g.input((batch, s), "position ids", letters="bl")
        table = g.add("position.embedding", Embedding(positions, cfg.max_positions, cfg.width, letters="bl"))
        x = g.add("position", Elementwise(x, table))
    for i in range(1, cfg.layers + 1):
        x = _block(g, f"block{i}", x, cfg, rotary, cfg.is_sparse(i - 1))
    y = g.add("final.norm", _norm(x, cfg))
    if cfg.tied:
        # The embedding's own table (V, e): the very Tensor the Embedding reads.
        logits = g.add("head.logits", Einsum("ble,ve->blv", y, embedding.inputs[1]))
    else:
        w = g.weight((cfg.width, cfg.vocab), "output weight", letters="ev")
        logits = g.add("head.logits", Einsum("ble,ev->blv", y, w))
    g.add("loss", SoftmaxCrossEntropy(logits))
    return replace(g.build(), architecture=architecture(cfg))


def architecture(config: DecoderConfig) -> dict:
    """The shape ``config`` declares, in ``Network.architecture``'s words.

    >>> architecture(DecoderConfig(2, 64, 4, 2, 16, 128, 100, sequence=8))["kv_heads"]
    2
    """
    c = config
    out = {"layers": c.layers, "width": c.width, "heads": c.heads, "kv_heads": c.kv_heads, "head_dim": c.head_dim,
           "mlp_width": c.mlp_width, "vocab": c.vocab, "sequence": c.sequence,
           "max_positions": c.max_positions if c.positions == "learned" else c.sequence, "gated": c.gated,
           "norm": c.norm, "positions": c.positions, "tied": c.tied,
           "biases": {"qkv": c.qkv_bias, "out": c.out_bias, "mlp": c.mlp_bias}, "qk_norm": c.qk_norm}
    if c.moe is not None:
        m = c.moe
        out["moe"] = {"experts": m.experts, "top_k": m.top_k, "width": m.width, "shared": m.shared,
                      "shared_width": m.shared_width, "dense": list(m.dense), "capacity": m.capacity}
    return out


def _parameter_tensors(layer) -> list:
    """The layer's parameter tensors that are ``Tensor`` objects it reads (Einsum, Embedding)."""
    return [t for t in layer.inputs if t.is_param]


def shared_parameters(network: Network) -> list:
    """Parameter tensors read by more than one layer: ``[(tensor, [(layer id, input position), ...])]``.

    Identity (``is``), not equality, tells them apart: every Embedding's table compares equal.
    """
    readers: dict = {}
    for v, layer in enumerate(network.layers):
        for i, t in enumerate(layer.inputs):
            if t.is_param:
                readers.setdefault(id(t), (t, []))[1].append((v, i))
    return [(t, where) for t, where in readers.values() if len(where) > 1]


def distinct_parameter_count(network: Network) -> int:
    """Trainable parameters with every parameter tensor counted once (a tied table once).

    ``pase.memory.parameter_count`` sums every layer's ``parameters()``, so a table two
    layers read counts twice there.
    """
    seen: set = set()
    total = 0
    for layer in network.layers:
        read = _parameter_tensors(layer)
        params = layer.parameters()
        # Einsum and Embedding list the weights they read first, then any of their own (a bias).
        for t in read:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.size
        total += sum(math.prod(shape) for shape, _ in params[len(read):])
    return total
