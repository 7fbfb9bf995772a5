"""The mixture-of-experts fields of Hugging Face configs (``mixtral``, ``qwen2_moe``,
``qwen3_moe``) for ``pase.sources.hf``: which blocks are sparse, how many experts, how wide.

Each reader returns the ``DecoderConfig`` fields that differ from a Llama-like decoder;
``REFUSED`` names MoE model types refused, and why (none now: DeepSeek's latent attention is
read by ``pase.sources.hf_types``).
"""

from __future__ import annotations

__all__ = ["MOE_TYPES", "REFUSED", "moe_fields"]

#: Mixture-of-experts ``model_type`` values read here.
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")

#: MoE model types refused, and why (one line each).
REFUSED: dict = {}


def _experts(fields) -> int:
    # Qwen's files say num_experts; transformers' own config objects num_local_experts.
    key = "num_experts" if "num_experts" in fields.data else "num_local_experts"
    return fields.positive(key)


def _sparse_blocks(fields, layers: int) -> tuple:
    """The dense blocks of a Qwen-MoE config: those in ``mlp_only_layers`` and those whose
    ``(index + 1)`` is not a multiple of ``decoder_sparse_step`` (transformers' rule)."""
    step = fields.positive("decoder_sparse_step", 1, required=False)
    only = fields.data.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in only):
        fields.fail(f"mlp_only_layers must be a list of layer indices, got {str(only)[:60]}")
    return tuple(i for i in range(layers) if i in only or (i + 1) % step)


def moe_fields(fields, model_type: str, layers: int) -> dict:
    """``DecoderConfig`` fields of a MoE config: ``moe``, and the attention's biases and norms.

    ``fields`` is the typed reader of the file (``pase.sources.hf_fields.Fields``: every error
    names the file and the field).
    """
    from graphs.decoder import MoEConfig

    top_k = fields.positive("num_experts_per_tok")
    experts = fields.positive("num_local_experts") if model_type == "mixtral" else _experts(fields)
    if top_k > experts:
        fields.fail(f"num_experts_per_tok ({top_k}) is more than the {experts} experts")
    if model_type == "mixtral":
        moe = MoEConfig(experts, top_k, fields.positive("intermediate_size"))
        return {"moe": moe, "qkv_bias": False, "out_bias": False, "mlp_bias": False}
    width = fields.positive("moe_intermediate_size")
    dense = _sparse_blocks(fields, layers)
    if model_type == "qwen2_moe":
        shared = fields.positive("shared_expert_intermediate_size", 0, required=False) or 0
        moe = MoEConfig(experts, top_k, width, shared=1 if shared else 0, shared_width=shared,
                        shared_gate=bool(shared), dense=dense)
        return {"moe": moe, "qkv_bias": fields.flag("qkv_bias", True), "out_bias": False, "mlp_bias": False}
    bias = fields.flag("attention_bias", False)
    moe = MoEConfig(experts, top_k, width, dense=dense)
    return {"moe": moe, "qkv_bias": bias, "out_bias": bias, "mlp_bias": False, "qk_norm": True}
