"""Model factories for ``pase -g torch:examples/hf_mixtral.py:NAME``: Hugging Face mixtures of
experts (Mixtral, Qwen2-MoE, Qwen3-MoE).

Built from a configuration (random weights, nothing downloaded) on the ``meta`` device, so
Mixtral-8x7B's 46.7 billion parameters cost no memory; ``NAME(batch)`` returns
``(module, args)`` with a batch of token ids. The importer reads each sparse MLP block
(router, top-k, experts, weighted sum) as one ``MoE`` vertex, whichever experts
implementation (``eager``, ``grouped_mm``, ``batched_mm``) the model was built with.
"""

import torch
import transformers


def _build(model_class, config, batch, tokens):
    with torch.device("meta"):
        model = model_class(config)
        ids = torch.zeros(batch, tokens, dtype=torch.long)
    return model, (ids,)


def mixtral_8x7b(batch):
    """Mixtral-8x7B-v0.1's shape: 32 layers, width 4096, 32 heads (8 KV heads), 8 experts of
    width 14336, top-2, vocabulary 32000; 4096 tokens."""
    config = transformers.MixtralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
        max_position_embeddings=32768, rope_theta=1e6, attn_implementation="sdpa", use_cache=False,
    )
    return _build(transformers.MixtralForCausalLM, config, batch, 4096)


def tiny_mixtral(batch):
    """A two-layer Mixtral (4 experts of width 128, top-2, width 64), 16 tokens."""
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
        max_position_embeddings=64, attn_implementation="sdpa", use_cache=False,
    )
    return _build(transformers.MixtralForCausalLM, config, batch, 16)


def tiny_qwen2_moe(batch):
    """A two-layer Qwen2-MoE: 8 experts of width 32, top-2, a gated shared expert of width 64."""
    config = transformers.Qwen2MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, num_experts=8,
        num_experts_per_tok=2, vocab_size=256, max_position_embeddings=64, attn_implementation="sdpa",
        use_cache=False,
    )
    return _build(transformers.Qwen2MoeForCausalLM, config, batch, 16)


def tiny_qwen3_moe(batch):
    """A two-layer Qwen3-MoE (per-head query/key norms): 8 experts of width 32, top-2."""
    config = transformers.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        vocab_size=256, max_position_embeddings=64, attn_implementation="sdpa", use_cache=False,
    )
    return _build(transformers.Qwen3MoeForCausalLM, config, batch, 16)
