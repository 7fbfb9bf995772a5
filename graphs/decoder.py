"""A generic decoder-only transformer from a shape (``DecoderConfig``): Llama, Mistral, Qwen2/3, GPT-2,
Gemma, Phi-3, Nemotron, MPT, GPT-OSS, DeepSeek-V2/V3.

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
  very table ``(V, e)`` (``ble,ve->blv``): the same ``Tensor`` object the Embedding reads;
- what a fused attention kernel does to the scores, declared on the three attention layers
  (``_attention_core``), none between them: sliding windows (``window``, ``window_blocks``:
  ``Einsum`` ``window``/``band`` and ``Softmax`` ``window``), ALiBi (``positions="alibi"``),
  soft-capping, attention sinks; Gemma's four norms a block (``post_norms``);
- multi-head latent attention (``MLAConfig``, DeepSeek-V2/V3: ``_mla_attention``) and the
  multi-token-prediction modules (``mtp``: ``_mtp_module``); ``docs/models.md``.

Tied weights: ``network.layers[head].inputs[1] is network.layers[embedding].inputs[1]``.
Tensors compare by value and every Embedding's table has the same key, so object identity
is what tells a shared tensor; ``shared_parameters`` lists the sharing and
``distinct_parameter_count`` counts each tensor once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from pase.model.builder import GraphBuilder, Network
from pase.model.layers import Concat, Einsum, Elementwise, Embedding, MoE, Norm, RMSNorm, Softmax, SoftmaxCrossEntropy
from pase.model.tensor import Tensor

__all__ = [
    "MoEConfig", "MLAConfig", "DecoderConfig", "BiasedEinsum", "decoder", "parameter_count", "distinct_parameter_count",
    "shared_parameters", "SEQUENCE",
]

#: Default sequence length when neither ``-m`` nor the config limits it.
SEQUENCE = 2048

#: The most blocks a decoder may have: the largest published decoders have about 128, and a
#: config asking for a million (a typo) would take minutes to build before any answer.
MAX_LAYERS = 1024

#: What this module's letters mean (``pase.model.roles``): every layer of a decoder takes its
#: dimensions' roles from here (the Embedding and MoE layers declare their own width, vocabulary
#: and expert dimensions). ``g`` key/value heads and ``r`` query heads per group; ``m`` the keys'
#: positions in attention's two products. ``graphs/llama.py`` builds with the same letters.
ROLES = {
    "b": "batch", "l": "sequence", "m": "key_sequence", "g": "kv_groups", "r": "heads", "k": "head_width",
    "e": "model", "d": "model", "f": "mlp", "v": "vocab",
    # Latent attention's compressed widths (query ``c``, key/value ``a``): the down-projections
    # into them are replicated under tensor parallelism, as Megatron-Core runs them.
    "c": "latent", "a": "latent",
}

NORMS = ("rms", "layer")
POSITIONS = ("rotary", "learned", "alibi")


#: The keys of ``MoEConfig.router``.
ROUTER_KEYS = ("score", "normalize", "scale", "method")


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
    #: A bias on the router's logits and on every expert's projections (GPT-OSS).
    router_bias: bool = False
    expert_bias: bool = False
    #: Group-limited routing (DeepSeek-V3): the experts in ``groups`` groups, each token's
    #: ``top_k`` chosen within ``group_top`` of them (1, 1: unlimited).
    groups: int = 1
    group_top: int = 1
    #: The gated experts' activation (``pase.model.layers.moe.EXPERT_ACTIVATIONS``): ``swiglu``,
    #: or GPT-OSS's clamped ``quick_geglu``.
    activation: str = "swiglu"
    #: The router's function, where the model declares it (``None``: not declared): what
    #: changes the function built, not its cost, as ``(key, value)`` pairs (:data:`ROUTER_KEYS`):
    #: ``score`` (``softmax`` or ``sigmoid``), ``normalize`` (the top k probabilities summed to
    #: one), ``scale`` (their factor), ``method`` (transformers' ``topk_method``: ``greedy``,
    #: ``group_limited_greedy`` or ``noaux_tc``, a learnt bias on the scores for the choice alone,
    #: groups scored by the sum of their best two). The engine exports write them.
    router: tuple | None = None

    def __post_init__(self):
        for name in ("experts", "top_k", "width", "groups", "group_top"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"decoder moe {name} must be a positive integer, got {value!r}")
        if self.router is not None:
            given = dict(self.router) if isinstance(self.router, tuple) and all(
                isinstance(p, tuple) and len(p) == 2 for p in self.router) else None
            if (given is None or set(given) != set(ROUTER_KEYS) or given["score"] not in ("softmax", "sigmoid")
                    or not isinstance(given["normalize"], bool) or isinstance(given["scale"], bool)
                    or not isinstance(given["scale"], (int, float)) or not given["scale"] > 0
                    or given["method"] not in ("greedy", "group_limited_greedy", "noaux_tc")):
                raise ValueError(f"decoder moe router must be ((key, value), ...) of {', '.join(ROUTER_KEYS)}, "
                                 f"got {self.router!r}"[:200])
        if not isinstance(self.dense, tuple) or not all(isinstance(i, int) and i >= 0 for i in self.dense):
            raise ValueError(f"decoder moe dense must be a tuple of block indices, got {self.dense!r}")

    def parameters(self, width: int, gated: bool) -> int:
        """Parameters of one MoE MLP: ``e E`` (router) ``+ E m e H`` ``+ m e S H_s`` ``(+ e)``."""
        m = 3 if gated else 2
        total = width * self.experts + self.experts * m * width * self.width
        total += self.experts if self.router_bias else 0
        # Expert biases: one per output of each projection (gate and up H each, down D).
        total += self.experts * ((m - 1) * self.width + width) if self.expert_bias else 0
        return total + m * width * self.shared * self.shared_width + (width if self.shared_gate else 0)


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a rank-``q_rank``
    compression with its RMSNorm (``q_rank`` 0: one projection), keys and values through one
    rank-``kv_rank`` compression with its RMSNorm; each query/key head is ``nope`` wide
    without rotary positions and ``rope`` wide with them (the rotary key one head shared by
    all), each value head ``value`` wide."""

    kv_rank: int
    nope: int
    rope: int
    value: int
    q_rank: int = 0

    def __post_init__(self):
        for name in ("kv_rank", "nope", "rope", "value", "q_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "q_rank" else 1):
                raise ValueError(f"decoder mla {name} must be a positive integer, got {value!r}")

    def parameters(self, width: int, heads: int) -> int:
        """``e q + q + q h (n + r)`` (or ``e h (n + r)``) ``+ e (c + r) + c + c h (n + v) + h v e``."""
        e, h, q, c = width, heads, self.q_rank, self.kv_rank
        query = e * q + q + q * h * (self.nope + self.rope) if q else e * h * (self.nope + self.rope)
        return query + e * (c + self.rope) + c + c * h * (self.nope + self.value) + h * self.value * e


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
    #: Layer norms with a bias (``norm="layer"``); MPT's have none.
    norm_bias: bool = True
    #: Gemma: a norm on the attention's and on the MLP's output too (four norms a block).
    post_norms: bool = False
    #: Sliding-window attention of ``window`` keys (0: none) in the blocks ``window_blocks``
    #: (0-based; None: every block).
    window: int = 0
    window_blocks: tuple | None = None
    #: Attention sinks (a learnt logit per head, GPT-OSS); soft-capping of the attention
    #: scores and of the logits (``c tanh(x / c)``, Gemma 2; 0: none).
    sinks: bool = False
    softcap: float = 0.0
    final_softcap: float = 0.0
    mla: MLAConfig | None = None
    #: Multi-token prediction modules (DeepSeek-V3), each a block predicting one more token.
    mtp: int = 0
    #: What changes the function built but not its cost, declared where known (``None``: not
    #: declared): the rotary base, the rotary scaling (``(key, value)`` pairs, e.g. Llama 3.1's
    #: ``(("factor", 8.0), ..., ("type", "llama3"))``; ``()``: none) and the norms' epsilon.
    #: The engine exports write them, so that the engine builds this very model.
    rope_theta: float | None = None
    rope_scaling: tuple | None = None
    norm_eps: float | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("moe", "mla"):
                kind = MoEConfig if f.name == "moe" else MLAConfig
                if value is not None and not isinstance(value, kind):
                    raise ValueError(f"decoder {f.name} must be a {kind.__name__}, got {type(value).__name__}")
            elif f.name in ("window", "mtp"):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"decoder {f.name} must be a non-negative integer, got {value!r}")
            elif f.name in ("softcap", "final_softcap"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                    raise ValueError(f"decoder {f.name} must be a non-negative number, got {value!r}")
            elif f.name == "window_blocks":
                if value is not None and (not isinstance(value, tuple) or not all(
                        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)):
                    raise ValueError(f"decoder window_blocks must be a tuple of block indices, got {value!r}")
            elif f.name in ("gated", "tied", "qkv_bias", "out_bias", "mlp_bias", "qk_norm", "norm_bias", "post_norms",
                            "sinks"):
                if not isinstance(value, bool):
                    raise ValueError(f"decoder {f.name} must be true or false, got {value!r}")
            elif f.name in ("norm", "positions"):
                choices = NORMS if f.name == "norm" else POSITIONS
                if value not in choices:
                    raise ValueError(f"decoder {f.name} must be one of {', '.join(choices)}, got {value!r}")
            elif f.name in ("rope_theta", "norm_eps"):
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or not 0 < value < math.inf):
                    raise ValueError(f"decoder {f.name} must be a positive number, got {value!r}")
            elif f.name == "rope_scaling":
                if value is not None and (not isinstance(value, tuple) or not all(
                        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value)):
                    raise ValueError(f"decoder rope_scaling must be a tuple of (name, value) pairs, got {value!r}")
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

    def window_of(self, index: int) -> int:
        """The sliding window of block ``index`` (0-based; MTP blocks count on from ``layers``), 0 if none."""
        if not self.window or (self.window_blocks is not None and index not in self.window_blocks):
            return 0
        return self.window


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
    if c.mla is not None:
        attention = c.mla.parameters(e, c.heads)
    else:
        attention = 2 * e * hk + 2 * e * gk + (hk + 2 * gk if c.qkv_bias else 0) + (e if c.out_bias else 0)
    attention += c.heads if c.sinks else 0
    if c.gated:
        mlp = 3 * e * f + (2 * f + e if c.mlp_bias else 0)
    else:
        mlp = 2 * e * f + (f + e if c.mlp_bias else 0)
    vector = 1 if c.norm == "rms" or not c.norm_bias else 2
    per_block = (4 if c.post_norms else 2) * e * vector + (2 * c.head_dim if c.qk_norm else 0)
    blocks = L + c.mtp
    norms = blocks * per_block + e * vector
    if c.moe is not None:
        sparse = sum(1 for i in range(blocks) if c.is_sparse(i))
        total += sparse * (c.moe.parameters(e, c.gated) - mlp)
    # Each MTP module: its two input norms, the 2e x e projection and its output norm.
    total += c.mtp * (2 * e * vector + 2 * e * e + e * vector)
    return total + blocks * (attention + mlp) + norms


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
    if cfg.norm == "rms":
        return RMSNorm(x, axis=-1)
    return Norm(x, axis=-1) if cfg.norm_bias else Norm(x, axis=-1, learnt=1)


def _attention_core(g: GraphBuilder, name: str, q: Tensor, key: Tensor, value: Tensor, cfg: DecoderConfig,
                    window: int) -> Tensor:
    """Scores, softmax and context of ``(g, r)`` heads: what a fused kernel does between them
    (mask, window, ALiBi, soft-capping, sinks) declared on the three layers, no layer between."""
    banded = {"window": window, "band": "lm"} if window and window < q.shape[3] else {}
    scores = g.add(f"{name}.attn.scores", Einsum("bgrlk,bgmk->bgrlm", q, key, **banded))
    weights = g.add(f"{name}.attn.softmax", Softmax(scores, axis=-1, causal=True, window=window,
                                                    alibi=cfg.positions == "alibi", softcap=float(cfg.softcap),
                                                    sinks=(1, 2) if cfg.sinks else None))
    return g.add(f"{name}.attn.context", Einsum("bgrlm,bgmk->bgrlk", weights, value, **banded))


def _mla_attention(g: GraphBuilder, name: str, y: Tensor, cfg: DecoderConfig, rotary, window: int) -> Tensor:
    """Multi-head latent attention (``MLAConfig``) of the normed input ``y``: ``h`` heads as
    ``(g, r) = (h, 1)``, the queries' and keys' heads ``nope + rope`` wide, the values'
    ``value`` wide. The rotary key is one head (``g = 1``) joined to every head's key by a
    broadcasting ``Concat``; the query rotary product runs over the whole head (transformers
    rotates the ``rope`` part and concatenates, one pass over it all)."""
    m, e, G = cfg.mla, cfg.width, cfg.heads
    k = m.nope + m.rope
    if m.q_rank:
        wqa = g.weight((e, m.q_rank), f"{name}.attn.wq_a", letters="ec")
        qa = g.add(f"{name}.attn.q_a", Einsum("ble,ec->blc", y, wqa))
        qa = g.add(f"{name}.attn.q_a_norm", RMSNorm(qa, axis=-1))
        wqb = g.weight((G, 1, m.q_rank, k), f"{name}.attn.wq_b", letters="grck")
        q = g.add(f"{name}.attn.q", Einsum("blc,grck->bgrlk", qa, wqb))
    else:
        wq = g.weight((G, 1, e, k), f"{name}.attn.wq", letters="grek")
        q = g.add(f"{name}.attn.q", Einsum("ble,grek->bgrlk", y, wq))
    wkva = g.weight((e, m.kv_rank), f"{name}.attn.wkv_a", letters="ea")
    kva = g.add(f"{name}.attn.kv_a", Einsum("ble,ea->bla", y, wkva))
    kva = g.add(f"{name}.attn.kv_a_norm", RMSNorm(kva, axis=-1))
    wkr = g.weight((1, e, m.rope), f"{name}.attn.wk_rope", letters="gek")
    k_rope = g.add(f"{name}.attn.k_rope", Einsum("ble,gek->bglk", y, wkr))
    wkn = g.weight((G, m.kv_rank, m.nope), f"{name}.attn.wk_nope", letters="gak")
    k_nope = g.add(f"{name}.attn.k_nope", Einsum("bla,gak->bglk", kva, wkn))
    wv = g.weight((G, m.kv_rank, m.value), f"{name}.attn.wv", letters="gak")
    value = g.add(f"{name}.attn.v", Einsum("bla,gak->bglk", kva, wv))
    q = g.add(f"{name}.attn.q_rotary", Elementwise(q, rotary[0]))
    k_rope = g.add(f"{name}.attn.k_rotary", Elementwise(k_rope, rotary[1]))
    key = g.add(f"{name}.attn.k", Concat([k_nope, k_rope], axis=-1))
    context = _attention_core(g, name, q, key, value, cfg, window)
    wo = g.weight((G, 1, e, m.value), f"{name}.attn.wo", letters="grek")
    return g.add(f"{name}.attn.out", Einsum("bgrlk,grek->ble", context, wo))


def _block(g: GraphBuilder, name: str, x: Tensor, cfg: DecoderConfig, rotary, sparse: bool = False,
           window: int = 0) -> Tensor:
    """``r = x + attention(norm(x))``, then ``r + mlp(norm(r))`` (``graphs/llama.py``'s block);
    with ``post_norms`` each branch's output normed too before its residual (Gemma)."""
    e, f, G, R, k = cfg.width, cfg.mlp_width, cfg.kv_heads, cfg.group, cfg.head_dim
    y = g.add(f"{name}.attn.norm", _norm(x, cfg))
    if cfg.mla is not None:
        return _mlp_half(g, name, x, _mla_attention(g, name, y, cfg, rotary, window), cfg, sparse)
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
    context = _attention_core(g, name, q, key, value, cfg, window)
    wo = g.weight((G, R, e, k), f"{name}.attn.wo", letters="grek")
    out = _project(g, f"{name}.attn.out", "bgrlk,grek->ble", context, wo, cfg.out_bias)
    return _mlp_half(g, name, x, out, cfg, sparse)


def _mlp_half(g: GraphBuilder, name: str, x: Tensor, out: Tensor, cfg: DecoderConfig, sparse: bool) -> Tensor:
    """The attention's residual, then the MLP (dense or experts) and its residual."""
    e, f = cfg.width, cfg.mlp_width
    if cfg.post_norms:
        out = g.add(f"{name}.attn.post_norm", _norm(out, cfg))
    r = g.add(f"{name}.attn.residual", Elementwise(x, out, combine="add"))
    y = g.add(f"{name}.ff.norm", _norm(r, cfg))
    if sparse:
        m = cfg.moe
        out = g.add(f"{name}.ff.moe", MoE(y, m.experts, m.top_k, m.width, gated=cfg.gated, capacity=m.capacity,
                                          imbalance=m.imbalance, shared=m.shared, shared_hidden=m.shared_width,
                                          shared_gate=m.shared_gate, **_moe_extras(m)))
        if cfg.post_norms:
            out = g.add(f"{name}.ff.post_norm", _norm(out, cfg))
        return g.add(f"{name}.ff.residual", Elementwise(r, out, combine="add"))
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
    if cfg.post_norms:
        down = g.add(f"{name}.ff.post_norm", _norm(down, cfg))
    return g.add(f"{name}.ff.residual", Elementwise(r, down, combine="add"))


def _moe_extras(m: MoEConfig) -> dict:
    """The ``MoE`` arguments only some configs set (biases, group-limited routing)."""
    out = {}
    if m.router_bias or m.expert_bias:
        out.update(router_bias=m.router_bias, expert_bias=m.expert_bias)
    if m.groups > 1:
        out.update(groups=m.groups, group_top=m.group_top)
    if m.activation != "swiglu":
        out.update(activation=m.activation)
    return out


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
    g = GraphBuilder(name, cutoff=1, batch=batch, roles=ROLES)
    ids = g.input((batch, s), "ids", letters="bl")
    rotary = None
    if cfg.positions == "rotary" and cfg.mla is not None:
        rope = cfg.mla.nope + cfg.mla.rope
        rotary = (g.input((batch, cfg.heads, 1, s, rope), "rotary table (queries)", letters="bgrlk"),
                  g.input((batch, 1, s, cfg.mla.rope), "rotary table (keys)", letters="bglk"))
    elif cfg.positions == "rotary":
        rotary = (g.input((batch, G, R, s, k), "rotary table (queries)", letters="bgrlk"),
                  g.input((batch, G, s, k), "rotary table (keys)", letters="bglk"))
    embedding = Embedding(ids, cfg.vocab, cfg.width, letters="bl")
    x = g.add("embedding", embedding)
    if cfg.positions == "learned":
        positions = g.input((batch, s), "position ids", letters="bl")
        table = g.add("position.embedding", Embedding(positions, cfg.max_positions, cfg.width, letters="bl"))
        x = g.add("position", Elementwise(x, table, combine="add"))
    embedded = x
    for i in range(1, cfg.layers + 1):
        with g.block():  # one decoder layer: the repeated block pipelines and recomputation read
            x = _block(g, f"block{i}", x, cfg, rotary, cfg.is_sparse(i - 1), cfg.window_of(i - 1))
    y = g.add("final.norm", _norm(x, cfg))
    # The embedding's own table (V, e) when tied: the very Tensor the Embedding reads.
    head = embedding.inputs[1] if cfg.tied else g.weight((cfg.width, cfg.vocab), "output weight", letters="ev")
    _head(g, "head.logits", "loss", y, head, cfg)
    for depth in range(1, cfg.mtp + 1):
        x = _mtp_module(g, f"mtp{depth}", x, embedded, cfg, rotary, cfg.layers + depth - 1, head)
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
           "biases": {"qkv": c.qkv_bias, "out": c.out_bias, "mlp": c.mlp_bias}, "qk_norm": c.qk_norm,
           # Features beyond a Llama/GPT decoder, at their plain values when unused.
           "features": {"norm_bias": c.norm_bias if c.norm == "layer" else False, "post_norms": c.post_norms,
                        "window": c.window, "sinks": c.sinks, "softcap": c.softcap, "final_softcap": c.final_softcap,
                        "mla": c.mla is not None, "mtp": c.mtp}}
    if c.rope_theta is not None and c.positions == "rotary":
        out["rope"] = {"theta": float(c.rope_theta), "scaling": dict(c.rope_scaling) if c.rope_scaling else None}
    if c.norm_eps is not None:
        out["norm_eps"] = float(c.norm_eps)
    if c.moe is not None:
        m = c.moe
        out["moe"] = {"experts": m.experts, "top_k": m.top_k, "width": m.width, "shared": m.shared,
                      "shared_width": m.shared_width, "shared_gate": m.shared_gate, "dense": list(m.dense),
                      "capacity": m.capacity, "router_bias": m.router_bias, "expert_bias": m.expert_bias,
                      "groups": m.groups, "group_top": m.group_top, "activation": m.activation,
                      "router": dict(m.router) if m.router is not None else None}
    if c.mla is not None:
        a = c.mla
        out["mla"] = {"q_rank": a.q_rank, "kv_rank": a.kv_rank, "nope": a.nope, "rope": a.rope, "value": a.value}
    return out


def _head(g: GraphBuilder, name: str, loss: str, y: Tensor, weight: Tensor, cfg: DecoderConfig) -> None:
    """The logits (soft-capped: one fused point-wise pass) and the loss."""
    equation = "ble,ve->blv" if cfg.tied else "ble,ev->blv"
    logits = g.add(name, Einsum(equation, y, weight, pw=1 if cfg.final_softcap else 0))
    g.add(loss, SoftmaxCrossEntropy(logits))


def _mtp_module(g: GraphBuilder, name: str, h: Tensor, embedded: Tensor, cfg: DecoderConfig, rotary, index: int,
                head: Tensor) -> Tensor:
    """One multi-token-prediction module (DeepSeek-V3): the previous depth's hidden states and
    the embedding (of the tokens one further on: the same lookup, shifted, so the main
    embedding's output is read) normed, joined, projected ``2e -> e``, one block, its own
    norm, then the shared head and a loss of its own."""
    hn = g.add(f"{name}.hnorm", _norm(h, cfg))
    en = g.add(f"{name}.enorm", _norm(embedded, cfg))
    joined = g.add(f"{name}.join", Concat([en, hn], axis=-1))
    w = g.weight((2 * cfg.width, cfg.width), f"{name}.w_proj", letters="fe")
    x = g.add(f"{name}.proj", Einsum("blf,fe->ble", joined, w))
    x = _block(g, name, x, cfg, rotary, cfg.is_sparse(index), cfg.window_of(index))
    y = g.add(f"{name}.norm", _norm(x, cfg))
    _head(g, f"{name}.logits", f"{name}.loss", y, head, cfg)
    return x


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
