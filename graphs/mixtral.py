"""Mixtral 8x7B (Jiang et al. 2024): a Mistral decoder whose every MLP is a mixture of 8 SwiGLU
experts, 2 per token. Built by ``graphs/decoder.py``; ``-m`` is the sequence length.
"""

from __future__ import annotations

from pase.model.builder import Network

from .decoder import DecoderConfig, MoEConfig, decoder

__all__ = ["MIXTRAL_CONFIGS", "mixtral", "SEQUENCE"]

#: Default sequence length (CLI ``-m``): Mixtral's training context.
SEQUENCE = 4096

#: Mistral AI's published shape (``config.json`` of Mixtral-8x7B-v0.1): 32 layers, width 4096,
#: 32 heads of 128 (8 key/value), 8 experts of width 14336, top-2, vocabulary 32000; rotary base
#: ``rope_theta`` 1e6 unscaled, ``rms_norm_eps`` 1e-5.
MIXTRAL_CONFIGS = {
    "mixtral-8x7b": DecoderConfig(32, 4096, 32, 8, 128, 14336, 32000, sequence=SEQUENCE, moe=MoEConfig(8, 2, 14336),
                                  rope_theta=1e6, rope_scaling=(), norm_eps=1e-5),
}


def mixtral(name: str, batch: int = 128, model: int | None = None) -> Network:
    """The Mixtral graph ``name`` for ``batch`` sequences of ``model`` tokens (default 4096).

    >>> net = mixtral("mixtral-8x7b", 2, 16)
    >>> len(net), net.names[13]
    (452, 'block1.ff.moe')
    """
    if name not in MIXTRAL_CONFIGS:
        raise ValueError(f"unknown Mixtral model {name!r}; choose one of: {', '.join(MIXTRAL_CONFIGS)}")
    sequence = SEQUENCE if model is None else model
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
        raise ValueError(f"the sequence length must be a positive integer, got {sequence!r}")
    config = MIXTRAL_CONFIGS[name]
    return decoder(DecoderConfig(**{**config.__dict__, "sequence": sequence}), batch, name)
