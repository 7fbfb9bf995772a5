"""Model factories for ``pase -g torch:examples/hf_gpt2.py:NAME``: Hugging Face GPT-2.

Built from a configuration (random weights, nothing downloaded) on the ``meta`` device;
``NAME(batch)`` returns ``(module, args)`` with a batch of token ids of the full context.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def gpt2_small(batch):
    """GPT-2 small (the ``gpt2`` configuration: 12 layers, width 768, 12 heads), 1024 tokens."""
    config = GPT2Config(attn_implementation="sdpa", use_cache=False)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
        ids = torch.zeros(batch, config.n_positions, dtype=torch.long)
    return model, (ids,)


def gpt2_tiny(batch):
    """GPT-2 scaled down for runs on a laptop: 2 layers, width 64, 4 heads, 32 tokens, 512 words."""
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=512,
                        bos_token_id=1, eos_token_id=2,
                        attn_implementation="sdpa", use_cache=False)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
        ids = torch.zeros(batch, config.n_positions, dtype=torch.long)
    return model, (ids,)
