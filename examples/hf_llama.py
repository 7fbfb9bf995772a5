"""Model factories for ``pase -g torch:examples/hf_llama.py:NAME``: Hugging Face Llama.

Built from a configuration (random weights, nothing downloaded) on the ``meta`` device, so
an 8-billion-parameter model costs no memory; ``NAME(batch)`` returns ``(module, args)``
with a batch of token ids.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def _llama(config, batch, tokens):
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        ids = torch.zeros(batch, tokens, dtype=torch.long)
    return model, (ids,)


def llama3_8b(batch):
    """Llama-3-8B's shape: 32 layers, width 4096, 32 heads (8 KV heads), MLP 14336, 2048 tokens."""
    config = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
        attn_implementation="sdpa", use_cache=False,
    )
    return _llama(config, batch, 2048)


def tiny_llama(batch):
    """A two-layer Llama with every feature of the big one (RMSNorm, GQA, rotary, SwiGLU), 16 tokens."""
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, attn_implementation="sdpa", use_cache=False,
    )
    return _llama(config, batch, 16)
