"""Today's flagship decoders by name (``deepseek-v3``, ``qwen3-235b-a22b``, ``gpt-oss-120b``):
the ``graphs.decoder`` shapes their Hugging Face ``config.json`` files give
(``examples/hf/*.json``; ``tests/test_hf_models.py`` checks that ``-g hf:`` builds the same network).
``-m`` is the sequence length (2048 by default, as for ``-g hf:``).
"""

from __future__ import annotations

import dataclasses

from .decoder import SEQUENCE, DecoderConfig, MLAConfig, MoEConfig, decoder

__all__ = ["FLAGSHIP_CONFIGS", "flagship", "FLAGSHIP_FILES"]

_GPT_OSS_LAYERS = 36

#: Each built-in name's shape, field by field from its config file.
FLAGSHIP_CONFIGS = {
    # DeepSeek-V3 (671B): 61 blocks, the first 3 dense; MLA (q rank 1536, kv rank 512, heads of
    # 128 + 64 rotary, values 128); 256 routed experts of 2048 (top 8 in 4 of 8 groups) + 1 shared.
    "deepseek-v3": DecoderConfig(
        layers=61, width=7168, heads=128, kv_heads=128, head_dim=192, mlp_width=18432, vocab=129280,
        mla=MLAConfig(kv_rank=512, nope=128, rope=64, value=128, q_rank=1536),
        moe=MoEConfig(256, 8, 2048, shared=1, shared_width=2048, dense=(0, 1, 2), groups=8, group_top=4)),
    # Qwen3-235B-A22B: 94 blocks, 64 query heads of 128 (4 key/value), q/k norms, 128 experts of 1536, top 8.
    "qwen3-235b-a22b": DecoderConfig(
        layers=94, width=4096, heads=64, kv_heads=4, head_dim=128, mlp_width=12288, vocab=151936, qk_norm=True,
        moe=MoEConfig(128, 8, 1536)),
    # GPT-OSS-120B: 36 blocks alternating a 128-token window and full attention, sinks, biases,
    # 128 experts of 2880 (top 4) with biased router and experts, clamped quick-GeGLU.
    "gpt-oss-120b": DecoderConfig(
        layers=_GPT_OSS_LAYERS, width=2880, heads=64, kv_heads=8, head_dim=64, mlp_width=2880, vocab=201088,
        qkv_bias=True, out_bias=True, sinks=True, window=128, window_blocks=tuple(range(0, _GPT_OSS_LAYERS, 2)),
        moe=MoEConfig(128, 4, 2880, router_bias=True, expert_bias=True, activation="quick_geglu")),
}
#: The config file each name is read from by ``-g hf:`` (``examples/hf/``).
FLAGSHIP_FILES = {"deepseek-v3": "deepseek-v3.json", "qwen3-235b-a22b": "qwen3-235b-a22b.json",
                  "gpt-oss-120b": "gpt-oss-120b.json"}


def flagship(name: str, batch: int, sequence: int = SEQUENCE):
    """The network of ``name`` for ``batch`` sequences of ``sequence`` tokens."""
    return decoder(dataclasses.replace(FLAGSHIP_CONFIGS[name], sequence=sequence), batch, name)
