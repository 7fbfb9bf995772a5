"""The Hugging Face model types beyond Llama's shape, for ``pase.sources.hf``: ``qwen3``,
``phi3``, ``nemotron``, ``gemma2``, ``gemma3_text``, ``gpt_oss``, ``mpt``, ``deepseek_v3`` and
``deepseek_v2``,
and the sliding windows of every type.

Each reader takes the typed reader of the file (``pase.sources.hf_fields.Fields``: every error
names the file and the field) and the Llama-like fields already read (``base``, None for ``mpt``), and
returns the ``graphs.decoder.DecoderConfig`` fields. A field that changes the network but is
not modelled is added to ``fields.notes`` (one line each; the CLI prints them, the library
returns them), never dropped silently.
"""

from __future__ import annotations

from pase.sources.hf_fields import ACTIVATIONS, block_count, sequence_length

__all__ = ["TYPES", "LLAMA_LIKE", "READERS", "read_type", "windows"]

#: ``model_type`` values read here whose base fields are Llama's (``hidden_size``, ...).
LLAMA_LIKE = ("qwen3", "phi3", "nemotron", "gemma2", "gemma3_text", "gpt_oss", "deepseek_v3", "deepseek_v2")
#: Every ``model_type`` read here.
TYPES = LLAMA_LIKE + ("mpt",)

SLIDING, FULL = "sliding_attention", "full_attention"


def _layer_types(fields, layers: int, default) -> tuple:
    """The 0-based blocks whose ``layer_types`` entry is sliding (``default(i)`` when absent)."""
    kinds = fields.data.get("layer_types")
    if kinds is None:
        return tuple(i for i in range(layers) if default(i))
    if not isinstance(kinds, list) or len(kinds) != layers or not all(k in (SLIDING, FULL) for k in kinds):
        fields.fail(f"layer_types must be a list of {layers} entries, each {SLIDING!r} or {FULL!r}, "
                    f"got {str(kinds)[:60]}")
    return tuple(i for i, k in enumerate(kinds) if k == SLIDING)


def _window(fields, key: str = "sliding_window", default=None) -> int:
    value = fields.positive(key, default, required=False)
    return value or 0


def windows(fields, model_type: str, layers: int) -> dict:
    """``window`` and ``window_blocks`` of the types read by ``pase.sources.hf`` itself:
    Mistral's ``sliding_window`` on every block; Qwen2/Qwen3's with ``use_sliding_window``
    from block ``max_window_layers`` on (transformers' rule)."""
    if model_type == "mistral":
        return {"window": _window(fields)}
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not fields.flag("use_sliding_window", False):
            return {}
        first = fields.positive("max_window_layers", 28, required=False)
        return {"window": _window(fields, default=4096), "window_blocks": tuple(range(first, layers))}
    return {}


def _qwen3(fields, base: dict) -> dict:
    bias = fields.flag("attention_bias", False)
    return dict(base, qkv_bias=bias, out_bias=bias, qk_norm=True, **windows(fields, "qwen3", base["layers"]))


def _phi3(fields, base: dict) -> dict:
    _partial_rotary(fields)
    return dict(base, window=_window(fields))


def _partial_rotary(fields) -> None:
    """A share of each head rotated: transformers rotates that part and concatenates the rest,
    one pass over the whole head as the decoder prices it."""
    value = fields.data.get("partial_rotary_factor")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
        fields.fail(f"partial_rotary_factor must be a number in (0, 1], got {value!r}")


def _nemotron(fields, base: dict) -> dict:
    fields.number("norm_eps")
    _partial_rotary(fields)
    bias = fields.flag("attention_bias", False)
    return dict(base, gated=False, norm="layer", qkv_bias=bias, out_bias=bias, mlp_bias=fields.flag("mlp_bias", False))


def _softcap(fields, key: str, default) -> float:
    value = fields.data.get(key, default)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        fields.fail(f"{key} must be a positive number or null, got {value!r}")
    return float(value)


def _gemma(fields, base: dict, version: int) -> dict:
    layers = base["layers"]
    fields.choice("hidden_activation", "gelu_pytorch_tanh", ("gelu_pytorch_tanh", "gelu", "gelu_new", "gelu_fast"))
    if version == 2:
        blocks = _layer_types(fields, layers, lambda i: (i + 1) % 2)
        caps = (_softcap(fields, "attn_logit_softcapping", 50.0), _softcap(fields, "final_logit_softcapping", 30.0))
    else:
        pattern = fields.positive("sliding_window_pattern", 6, required=False)
        blocks = _layer_types(fields, layers, lambda i: (i + 1) % pattern)
        caps = (_softcap(fields, "attn_logit_softcapping", None), _softcap(fields, "final_logit_softcapping", None))
    if fields.data.get("use_bidirectional_attention"):
        fields.notes.append("use_bidirectional_attention is ignored: the attention is priced causal")
    bias = fields.flag("attention_bias", False)
    return dict(base, tied=fields.flag("tie_word_embeddings", True), post_norms=True, qk_norm=version == 3,
                qkv_bias=bias, out_bias=bias, window=_window(fields, default=4096), window_blocks=blocks,
                softcap=caps[0], final_softcap=caps[1])


def _gpt_oss(fields, base: dict) -> dict:
    from graphs.decoder import MoEConfig

    layers = base["layers"]
    experts = fields.positive("num_local_experts")
    top_k = fields.positive("num_experts_per_tok")
    if top_k > experts:
        fields.fail(f"num_experts_per_tok ({top_k}) is more than the {experts} experts")
    # GptOssExperts: gate * sigmoid(1.702 gate) * (up + 1), both halves clamped at swiglu_limit.
    moe = MoEConfig(experts, top_k, base["mlp_width"], router_bias=True, expert_bias=True, activation="quick_geglu")
    bias = fields.flag("attention_bias", True)
    return dict(base, moe=moe, sinks=True, qkv_bias=bias, out_bias=bias, window=_window(fields, default=128),
                window_blocks=_layer_types(fields, layers, lambda i: (i + 1) % 2))


def _deepseek_v3(fields, base: dict, mtp: bool, version: int = 3) -> dict:
    from graphs.decoder import MLAConfig, MoEConfig

    layers = base["layers"]
    q_rank = fields.positive("q_lora_rank", 0, required=False) or 0
    mla = MLAConfig(fields.positive("kv_lora_rank"), fields.positive("qk_nope_head_dim"),
                    fields.positive("qk_rope_head_dim"), fields.positive("v_head_dim"), q_rank)
    experts = fields.positive("n_routed_experts")
    top_k = fields.positive("num_experts_per_tok")
    if top_k > experts:
        fields.fail(f"num_experts_per_tok ({top_k}) is more than the {experts} experts")
    groups = fields.positive("n_group", 1, required=False)
    if experts % groups:
        fields.fail(f"n_group must be a positive integer dividing n_routed_experts ({experts}), got {groups}")
    group_top = fields.positive("topk_group", groups, required=False)
    if group_top > groups:
        fields.fail(f"topk_group must be a positive integer at most n_group ({groups}), got {group_top}")
    first = fields.data.get("first_k_dense_replace", 0)
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first <= layers:
        fields.fail(f"first_k_dense_replace must be an integer from 0 to num_hidden_layers ({layers}), got {first!r}")
    step = fields.positive("moe_layer_freq", 1, required=False)
    shared = fields.data.get("n_shared_experts") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        fields.fail(f"n_shared_experts must be a non-negative integer, got {shared!r}")
    width = fields.positive("moe_intermediate_size")
    depth = fields.data.get("num_nextn_predict_layers") or 0
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        fields.fail(f"num_nextn_predict_layers must be a non-negative integer, got {depth!r}")
    if depth and not mtp:
        fields.notes.append(f"num_nextn_predict_layers {depth}: the multi-token-prediction module is left out "
                            "(--mtp adds it)")
    # transformers: block i is sparse when i >= first_k_dense_replace and i % moe_layer_freq == 0.
    dense = tuple(i for i in range(layers) if i < first or i % step)
    moe = MoEConfig(experts, top_k, width, shared=1 if shared else 0, shared_width=shared * width, dense=dense,
                    groups=groups, group_top=group_top, router=_deepseek_router(fields, version))
    bias = fields.flag("attention_bias", False)
    if bias:
        fields.notes.append("attention_bias is ignored: latent attention is priced without biases")
    return dict(base, kv_heads=base["heads"], head_dim=mla.nope + mla.rope, mla=mla, moe=moe,
                mtp=depth if mtp else 0)


def _deepseek_router(fields, version: int) -> tuple:
    """The router's function as transformers builds it (``MoEConfig.router``). DeepSeek-V3
    (transformers models/deepseek_v3/modeling_deepseek_v3.py ``DeepseekV3TopkRouter``): sigmoid
    scores, a learnt bias on them for the choice (``noaux_tc``; the config's ``scoring_func`` and
    ``topk_method`` are not read), groups by their best two, ``norm_topk_prob`` (default true),
    ``routed_scaling_factor`` (default 2.5). DeepSeek-V2 (``DeepseekV2Moe``): softmax scores,
    ``topk_method`` ``greedy`` or ``group_limited_greedy`` (default greedy), never normalised,
    ``routed_scaling_factor`` (default 1)."""
    scale = fields.data.get("routed_scaling_factor", 2.5 if version == 3 else 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < 1e6:
        fields.fail(f"routed_scaling_factor must be a positive number, got {scale!r}")
    if version == 3:
        return (("score", "sigmoid"), ("normalize", fields.flag("norm_topk_prob", True)), ("scale", float(scale)),
                ("method", "noaux_tc"))
    method = fields.choice("topk_method", "greedy", ("greedy", "group_limited_greedy"))
    return (("score", "softmax"), ("normalize", False), ("scale", float(scale)), ("method", method))


def _mpt(fields, sequence) -> dict:
    width = fields.positive("d_model")
    heads = fields.positive("n_heads", condition=" dividing d_model")
    if width % heads:
        fields.fail(f"n_heads must be a positive integer dividing d_model ({width}), got {heads}")
    ratio = fields.data.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0 or int(ratio * width) < 1:
        fields.fail(f"expansion_ratio must be a positive number, got {ratio!r}")
    attn = fields.data.get("attn_config", {}) or {}
    if not isinstance(attn, dict):
        fields.fail(f"attn_config must be an object, got {str(attn)[:60]}")
    if attn.get("alibi", False) is not True:
        fields.fail("attn_config.alibi must be true (transformers' MPT has ALiBi positions only)")
    for key in ("qk_ln", "clip_qkv"):
        if attn.get(key):
            fields.notes.append(f"attn_config.{key} is ignored (transformers' MPT does not apply it)")
    if attn.get("attn_type", "multihead_attention") != "multihead_attention":
        fields.notes.append(f"attn_config.attn_type {attn['attn_type']!r} is priced as multi-head attention "
                            "(transformers' MPT has no other)")
    fields.choice("activation_function", "gelu", ACTIVATIONS)
    biased = not fields.flag("no_bias", True)
    layers = block_count(fields, "n_layers")
    return dict(layers=layers, width=width, heads=heads, kv_heads=heads, head_dim=width // heads,
                mlp_width=int(ratio * width), vocab=fields.positive("vocab_size"), gated=False, norm="layer",
                norm_bias=biased, positions="alibi", tied=fields.flag("tie_word_embeddings", True), qkv_bias=biased,
                out_bias=biased, mlp_bias=biased, sequence=sequence_length(fields, sequence, "max_seq_len", learned=False))


#: The reader of each type: ``(fields, base, sequence, mtp) -> DecoderConfig fields``.
READERS = {
    "qwen3": lambda fields, base, sequence, mtp: _qwen3(fields, base),
    "phi3": lambda fields, base, sequence, mtp: _phi3(fields, base),
    "nemotron": lambda fields, base, sequence, mtp: _nemotron(fields, base),
    "gemma2": lambda fields, base, sequence, mtp: _gemma(fields, base, 2),
    "gemma3_text": lambda fields, base, sequence, mtp: _gemma(fields, base, 3),
    "gpt_oss": lambda fields, base, sequence, mtp: _gpt_oss(fields, base),
    "deepseek_v3": lambda fields, base, sequence, mtp: _deepseek_v3(fields, base, mtp, version=3),
    # DeepSeek-V2 has V3's shape (latent attention, shared and group-limited experts), no MTP.
    "deepseek_v2": lambda fields, base, sequence, mtp: _deepseek_v3(fields, base, mtp, version=2),
    "mpt": lambda fields, base, sequence, mtp: _mpt(fields, sequence),
}


def read_type(fields, model_type: str, base: dict | None, sequence, mtp: bool = False) -> dict:
    """The ``DecoderConfig`` fields of ``model_type`` (one of ``TYPES``)."""
    return READERS[model_type](fields, base, sequence, mtp)
