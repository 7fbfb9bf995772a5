"""The model zoo: architectures a Hugging Face or torchvision user trains, imported and planned.

Every factory builds its model from a configuration on the ``meta`` device (nothing is
downloaded, no weight is allocated) and returns ``(module, args)`` or ``(module, args,
kwargs)`` for ``pase -g torch:benchmarks/zoo.py:NAME``. The script imports each one, counts
its parameters against the model's own ``sum(p.numel() for p in model.parameters())``, and
plans it at p = 8 and 64 on the default machine; it writes ``benchmarks/results/zoo.md``.

    python benchmarks/zoo.py                  # every model (a few minutes on 2 cores)
    python benchmarks/zoo.py --only gpt2,bert # some of them
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

#: Tokens of the language models' example inputs, and the batch of every model.
TOKENS = 128
BATCH = 8


def _meta(build):
    import torch

    with torch.device("meta"):
        return build()


def _lm(model_cls, config, batch, tokens=TOKENS, **kwargs):
    """A language model reading ``tokens`` token ids per sequence."""
    import torch

    config.use_cache = False
    model = _meta(lambda: _build(model_cls, config))
    ids = _meta(lambda: torch.zeros(batch, tokens, dtype=torch.long))
    return model, (ids,), kwargs


def _build(model_cls, config):
    """The model with PyTorch's fused attention where it has it, else its own (eager)."""
    for implementation in ("sdpa", "eager"):
        config._attn_implementation = implementation
        try:
            return model_cls(config)
        except ValueError:
            if implementation == "eager":
                raise
    raise AssertionError("unreachable")


def _image(model, batch, size=224, channels=3):
    import torch

    return model, (_meta(lambda: torch.zeros(batch, channels, size, size)),)


def _hf(name):
    import transformers

    return getattr(transformers, name)


# ---------------------------------------------------------------------------------------
# Decoder-only language models


def gpt2(batch):
    """GPT-2 small (124M): learned positions, tied embedding."""
    return _lm(_hf("GPT2LMHeadModel"), _hf("GPT2Config")(), batch)


def llama(batch):
    """Llama-3.2-1B's shape: 16 layers, width 2048, 32 heads (8 KV), tied embedding."""
    config = _hf("LlamaConfig")(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                tie_word_embeddings=True, rope_theta=500000.0)
    return _lm(_hf("LlamaForCausalLM"), config, batch)


def mistral(batch):
    """Mistral-7B: 32 layers, width 4096, 32 heads (8 KV), MLP 14336."""
    config = _hf("MistralConfig")(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)
    return _lm(_hf("MistralForCausalLM"), config, batch)


def qwen2(batch):
    """Qwen2-0.5B: biased q/k/v projections, tied embedding."""
    config = _hf("Qwen2Config")(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                tie_word_embeddings=True)
    return _lm(_hf("Qwen2ForCausalLM"), config, batch)


def qwen3(batch):
    """Qwen3-0.6B: q/k norms over the head dimension, tied embedding."""
    config = _hf("Qwen3Config")(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                vocab_size=151936, tie_word_embeddings=True)
    return _lm(_hf("Qwen3ForCausalLM"), config, batch)


def gemma(batch):
    """Gemma-2B: multi-query attention, scaled embedding, tied embedding."""
    config = _hf("GemmaConfig")(hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                                num_attention_heads=8, num_key_value_heads=1, head_dim=256, vocab_size=256000)
    return _lm(_hf("GemmaForCausalLM"), config, batch)


def gemma2(batch):
    """Gemma-2-2B: soft-capped logits, sandwich norms, tied embedding."""
    config = _hf("Gemma2Config")(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                 num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000)
    return _lm(_hf("Gemma2ForCausalLM"), config, batch)


def pythia(batch):
    """Pythia-160M (GPT-NeoX): rotary on a quarter of each head, parallel residual."""
    config = _hf("GPTNeoXConfig")(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                  num_attention_heads=12, vocab_size=50304, rotary_pct=0.25,
                                  max_position_embeddings=2048, use_parallel_residual=True)
    return _lm(_hf("GPTNeoXForCausalLM"), config, batch)


def phi3(batch):
    """Phi-3-mini (3.8B): fused qkv and gate/up projections."""
    config = _hf("Phi3Config")(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return _lm(_hf("Phi3ForCausalLM"), config, batch)


def phi2(batch):
    """Phi-2 (2.7B): partial rotary (40 % of a head), parallel attention and MLP."""
    config = _hf("PhiConfig")(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                              num_attention_heads=32, vocab_size=51200, partial_rotary_factor=0.4)
    return _lm(_hf("PhiForCausalLM"), config, batch)


def falcon(batch):
    """Falcon-7B: multi-query attention fused as 71 + 1 + 1 heads, parallel attention."""
    config = _hf("FalconConfig")(hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
                                 multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                                 bias=False, vocab_size=65024, alibi=False)
    return _lm(_hf("FalconForCausalLM"), config, batch)


def opt(batch):
    """OPT-125M: learned positions with an offset, ReLU MLP, tied embedding."""
    config = _hf("OPTConfig")(hidden_size=768, ffn_dim=3072, num_hidden_layers=12, num_attention_heads=12,
                              vocab_size=50272, word_embed_proj_dim=768)
    return _lm(_hf("OPTForCausalLM"), config, batch)


def stablelm(batch):
    """StableLM-2-1.6B: partial rotary (25 %), layer norms."""
    config = _hf("StableLmConfig")(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                   num_attention_heads=32, num_key_value_heads=32, vocab_size=100352,
                                   partial_rotary_factor=0.25)
    return _lm(_hf("StableLmForCausalLM"), config, batch)


def starcoder2(batch):
    """StarCoder2-3B: grouped-query attention with biases, layer norms."""
    config = _hf("Starcoder2Config")(hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
                                     num_attention_heads=24, num_key_value_heads=2, vocab_size=49152)
    return _lm(_hf("Starcoder2ForCausalLM"), config, batch)


def olmo(batch):
    """OLMo-1B: layer norms without learnt parameters."""
    config = _hf("OlmoConfig")(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=16, vocab_size=50304, tie_word_embeddings=True)
    return _lm(_hf("OlmoForCausalLM"), config, batch)


def gpt_neo(batch):
    """GPT-Neo-125M: learned positions, local and global attention layers."""
    config = _hf("GPTNeoConfig")(hidden_size=768, num_layers=12, num_heads=12, vocab_size=50257,
                                 attention_types=[[["global", "local"], 6]], window_size=256)
    return _lm(_hf("GPTNeoForCausalLM"), config, batch)


def bloom(batch):
    """BLOOM-560M: ALiBi position biases, a norm after the embedding."""
    config = _hf("BloomConfig")(hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880)
    return _lm(_hf("BloomForCausalLM"), config, batch)


def gptj(batch):
    """GPT-J-6B: rotary on 64 of 256 head dimensions (interleaved), parallel residual."""
    config = _hf("GPTJConfig")(n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, vocab_size=50400)
    return _lm(_hf("GPTJForCausalLM"), config, batch)


def deepseek_v2_dense(batch):
    """DeepSeek-V2-Lite's attention (MLA: kv rank 512, rope 64 + nope 128) with dense MLPs in
    every layer (``first_k_dense_replace`` = the layer count): the MoE part left out."""
    config = _hf("DeepseekV2Config")(hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
                                     num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
                                     q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                     v_head_dim=128, vocab_size=102400, first_k_dense_replace=27,
                                     n_routed_experts=64, moe_intermediate_size=1408)
    return _lm(_hf("DeepseekV2ForCausalLM"), config, batch)


def deepseek_v2(batch):
    """DeepSeek-V2-Lite with its mixture of experts (each MoE block one MoE layer)."""
    config = _hf("DeepseekV2Config")(hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
                                     num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
                                     q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                     v_head_dim=128, vocab_size=102400, first_k_dense_replace=1,
                                     n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408)
    return _lm(_hf("DeepseekV2ForCausalLM"), config, batch)


def mixtral(batch):
    """Mixtral-8x7B's shape with 4 layers: its sparse blocks one MoE layer each."""
    config = _hf("MixtralConfig")(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                  num_local_experts=8, num_experts_per_tok=2)
    return _lm(_hf("MixtralForCausalLM"), config, batch)


def gpt_bigcode(batch):
    """SantaCoder's shape (GPT-BigCode) with 4 layers: multi-query attention fused in one c_attn."""
    config = _hf("GPTBigCodeConfig")(n_embd=2048, n_layer=4, n_head=16, multi_query=True, vocab_size=49280,
                                     bos_token_id=49152, eos_token_id=49152)
    return _lm(_hf("GPTBigCodeForCausalLM"), config, batch)


def codegen(batch):
    """CodeGen-350M's shape with 4 layers: qkv fused in model-parallel blocks, interleaved rotary."""
    config = _hf("CodeGenConfig")(n_embd=1024, n_layer=4, n_head=16, rotary_dim=32, vocab_size=51200)
    return _lm(_hf("CodeGenForCausalLM"), config, batch)


def mpt(batch):
    """MPT-7B's shape with 4 layers: ALiBi, fused Wqkv, bias-free layer norms."""
    config = _hf("MptConfig")(d_model=4096, n_layers=4, n_heads=32, vocab_size=50432, expansion_ratio=4)
    return _lm(_hf("MptForCausalLM"), config, batch)


def cohere(batch):
    """Command-R's layer (Cohere) at width 2048, 4 layers: parallel attention and MLP, logit scale."""
    config = _hf("CohereConfig")(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                                 num_attention_heads=16, num_key_value_heads=4, vocab_size=256000)
    return _lm(_hf("CohereForCausalLM"), config, batch)


def granite(batch):
    """Granite-3.0-2B's shape with 4 layers: embedding, residual and logit multipliers."""
    config = _hf("GraniteConfig")(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=49155,
                                  tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22,
                                  logits_scaling=8.0, attention_multiplier=0.015625)
    return _lm(_hf("GraniteForCausalLM"), config, batch)


def olmo2(batch):
    """OLMo-2-1B's shape with 4 layers: q/k norms over the whole width, norms after each block."""
    config = _hf("Olmo2Config")(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4,
                                num_attention_heads=16, num_key_value_heads=16, vocab_size=100352)
    return _lm(_hf("Olmo2ForCausalLM"), config, batch)


def gemma3(batch):
    """Gemma-3-1B (text) with 6 layers: sliding-window and global layers, q/k norms, tied embedding."""
    config = _hf("Gemma3TextConfig")(hidden_size=1152, intermediate_size=6912, num_hidden_layers=6,
                                     num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                     vocab_size=262144, sliding_window=512)
    return _lm(_hf("Gemma3ForCausalLM"), config, batch)


def smollm(batch):
    """SmolLM2-135M (Llama): 30 narrow layers (576 wide, 9 heads, 3 KV), tied embedding."""
    config = _hf("LlamaConfig")(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    return _lm(_hf("LlamaForCausalLM"), config, batch)


# ---------------------------------------------------------------------------------------
# Encoders and encoder-decoders


def bert(batch):
    """BERT-base: learned positions and token types, pooler."""
    return _lm(_hf("BertModel"), _hf("BertConfig")(), batch)


def roberta(batch):
    """RoBERTa-base, its position ids passed (computed from the ids they are data-dependent)."""
    import torch

    config = _hf("RobertaConfig")(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1)
    model, args, kwargs = _lm(_hf("RobertaModel"), config, batch)
    kwargs["position_ids"] = _meta(lambda: torch.arange(2, TOKENS + 2).expand(batch, TOKENS))
    kwargs["token_type_ids"] = _meta(lambda: torch.zeros(batch, TOKENS, dtype=torch.long))
    return model, args, kwargs


def roberta_ids_only(batch):
    """RoBERTa-base given token ids alone (refused: positions computed by cumsum of the ids)."""
    config = _hf("RobertaConfig")(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1)
    return _lm(_hf("RobertaModel"), config, batch)


def distilbert(batch):
    """DistilBERT-base: 6 layers."""
    return _lm(_hf("DistilBertModel"), _hf("DistilBertConfig")(), batch)


def albert(batch):
    """ALBERT-base: one layer's weights shared by 12 layers, a factorised embedding."""
    return _lm(_hf("AlbertModel"), _hf("AlbertConfig")(hidden_size=768, num_attention_heads=12,
                                                       intermediate_size=3072), batch)


def electra(batch):
    """ELECTRA-base discriminator."""
    return _lm(_hf("ElectraModel"), _hf("ElectraConfig")(hidden_size=768, num_attention_heads=12,
                                                         intermediate_size=3072, embedding_size=768), batch)


def t5(batch):
    """T5-small: one embedding shared by encoder, decoder and output head."""
    import torch

    model, args, kwargs = _lm(_hf("T5ForConditionalGeneration"), _hf("T5Config")(), batch)
    kwargs["decoder_input_ids"] = _meta(lambda: torch.zeros(batch, TOKENS, dtype=torch.long))
    return model, args, kwargs


def bart(batch):
    """BART-base: learned positions with an offset, tied embeddings."""
    import torch

    model, args, kwargs = _lm(_hf("BartModel"), _hf("BartConfig")(), batch)
    kwargs["decoder_input_ids"] = _meta(lambda: torch.zeros(batch, TOKENS, dtype=torch.long))
    return model, args, kwargs


def whisper(batch):
    """Whisper-base: two conv1d layers over the mel spectrogram, then an encoder-decoder."""
    import torch

    config = _hf("WhisperConfig")(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                                  decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                                  max_source_positions=1500, num_mel_bins=80, use_cache=False)
    config._attn_implementation = "sdpa"
    model = _meta(lambda: _hf("WhisperForConditionalGeneration")(config))
    features = _meta(lambda: torch.zeros(batch, 80, 3000))
    decoder = _meta(lambda: torch.zeros(batch, 32, dtype=torch.long))
    return model, (features,), {"decoder_input_ids": decoder}


def clip(batch):
    """CLIP ViT-B/32: text and image towers, normalised embeddings, argmax pooling of the text.

    The text tower pools at the end-of-text token, found by ``argmax`` of the ids: the model
    is given its vision tower alone (``clip_vision``) where that matters."""
    import torch

    config = _hf("CLIPConfig")()
    config._attn_implementation = "sdpa"
    model = _meta(lambda: _hf("CLIPModel")(config))
    ids = _meta(lambda: torch.zeros(batch, 77, dtype=torch.long))
    pixels = _meta(lambda: torch.zeros(batch, 3, 224, 224))
    return model, (), {"input_ids": ids, "pixel_values": pixels}


def clip_vision(batch):
    """CLIP ViT-B/32's image tower with its projection."""
    config = _hf("CLIPVisionConfig")()
    config._attn_implementation = "sdpa"
    return _image(_meta(lambda: _hf("CLIPVisionModelWithProjection")(config)), batch)


def vit(batch):
    """ViT-B/16 (Hugging Face): class token, separate q/k/v projections."""
    config = _hf("ViTConfig")()
    config._attn_implementation = "sdpa"
    return _image(_meta(lambda: _hf("ViTForImageClassification")(config)), batch)


def deit(batch):
    """DeiT-small with its distillation token."""
    config = _hf("DeiTConfig")(hidden_size=384, num_attention_heads=6, intermediate_size=1536)
    config._attn_implementation = "sdpa"
    return _image(_meta(lambda: _hf("DeiTForImageClassificationWithTeacher")(config)), batch)


def swin(batch):
    """Swin-T (Hugging Face): shifted windows (roll), patch merging (strided slices)."""
    config = _hf("SwinConfig")()
    return _image(_meta(lambda: _hf("SwinForImageClassification")(config)), batch)


def convnext_hf(batch):
    """ConvNeXt-T (Hugging Face): depthwise 7 x 7 convolutions, layer scale."""
    return _image(_meta(lambda: _hf("ConvNextForImageClassification")(_hf("ConvNextConfig")())), batch)


def llava(batch):
    """LLaVA-1.5's architecture, a 4-layer Llama with a CLIP ViT-L/14 tower at 336 pixels: the
    class token dropped, the projected patches put in place of the image tokens."""
    import torch

    vision = _hf("CLIPVisionConfig")(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                     num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)
    text = _hf("LlamaConfig")(hidden_size=4096, intermediate_size=11008, num_hidden_layers=4,
                              num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, use_cache=False)
    config = _hf("LlavaConfig")(vision_config=vision, text_config=text, image_token_index=32000)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    model = _meta(lambda: _hf("LlavaForConditionalGeneration")(config))
    tokens = 576 + 64
    ids = torch.zeros(batch, tokens, dtype=torch.long)
    ids[:, 1:577] = 32000
    pixels = _meta(lambda: torch.zeros(batch, 3, 336, 336))
    return model, (), {"input_ids": ids, "pixel_values": pixels}


def _ids(batch, tokens=TOKENS):
    import torch

    return _meta(lambda: torch.zeros(batch, tokens, dtype=torch.long))


def _seq2seq(model_cls, config, batch):
    model, args, kwargs = _lm(model_cls, config, batch)
    kwargs["decoder_input_ids"] = _ids(batch)
    return model, args, kwargs


def xlm_roberta(batch):
    """XLM-RoBERTa's layer with 4 layers and its 250k vocabulary, its position ids passed."""
    import torch

    config = _hf("XLMRobertaConfig")(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
                                     num_hidden_layers=4)
    model, args, kwargs = _lm(_hf("XLMRobertaModel"), config, batch)
    kwargs["position_ids"] = _meta(lambda: torch.arange(2, TOKENS + 2).expand(batch, TOKENS))
    kwargs["token_type_ids"] = _ids(batch)
    return model, args, kwargs


def deberta_v2(batch):
    """DeBERTa-v3-base's shape with 2 layers: disentangled relative-position attention."""
    config = _hf("DebertaV2Config")(vocab_size=128100, num_hidden_layers=2, relative_attention=True,
                                    position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                                    pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
                                    position_biased_input=False, type_vocab_size=0)
    return _lm(_hf("DebertaV2Model"), config, batch)


def mobilebert(batch):
    """MobileBERT with 4 layers: bottlenecks, stacked feed-forward networks, no-norm layers."""
    return _lm(_hf("MobileBertModel"), _hf("MobileBertConfig")(num_hidden_layers=4), batch)


def mpnet(batch):
    """MPNet-base's shape with 4 layers: a relative-position bias shared by the layers, its
    position ids passed (computed from the ids they are data-dependent)."""
    import torch

    model, args, kwargs = _lm(_hf("MPNetModel"), _hf("MPNetConfig")(num_hidden_layers=4), batch)
    kwargs["position_ids"] = _meta(lambda: torch.arange(2, TOKENS + 2).expand(batch, TOKENS))
    return model, args, kwargs


def marian(batch):
    """Marian (opus-mt-en-de) with 2 + 2 layers: sinusoidal positions, tied embeddings."""
    config = _hf("MarianConfig")(vocab_size=58101, d_model=512, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                                 decoder_ffn_dim=2048, pad_token_id=58100, decoder_start_token_id=58100)
    return _seq2seq(_hf("MarianMTModel"), config, batch)


def mbart(batch):
    """mBART-large's shape with 2 + 2 layers: norms before each block and after each stack."""
    config = _hf("MBartConfig")(vocab_size=250027, d_model=1024, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                                decoder_ffn_dim=4096)
    return _seq2seq(_hf("MBartModel"), config, batch)


def pegasus(batch):
    """Pegasus-large's shape with 2 + 2 layers: sinusoidal positions."""
    config = _hf("PegasusConfig")(vocab_size=96103, d_model=1024, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                                  decoder_ffn_dim=4096)
    return _seq2seq(_hf("PegasusModel"), config, batch)


def mt5(batch):
    """mT5-small with 2 + 2 layers: gated-GELU MLPs, an untied head over 250k tokens."""
    config = _hf("MT5Config")(num_layers=2, num_decoder_layers=2)
    return _seq2seq(_hf("MT5ForConditionalGeneration"), config, batch)


def umt5(batch):
    """UMT5-small with 2 + 2 layers: a relative-position bias in every layer."""
    config = _hf("UMT5Config")(num_layers=2, num_decoder_layers=2)
    return _seq2seq(_hf("UMT5ForConditionalGeneration"), config, batch)


def wav2vec2(batch):
    """Wav2Vec2-base with 2 layers: a 7-layer conv1d feature extractor, a grouped conv1d position
    embedding (weight-normalised), 1 s of 16 kHz audio (time masking and layer drop, training randomness, off)."""
    import torch

    config = _hf("Wav2Vec2Config")(num_hidden_layers=2, mask_time_prob=0.0, layerdrop=0.0)
    model = _meta(lambda: _build(_hf("Wav2Vec2Model"), config))
    return model, (_meta(lambda: torch.zeros(batch, 16000)),)


def hubert(batch):
    """HuBERT-base with 2 layers: Wav2Vec2's feature extractor and encoder."""
    import torch

    config = _hf("HubertConfig")(num_hidden_layers=2, mask_time_prob=0.0, layerdrop=0.0)
    model = _meta(lambda: _build(_hf("HubertModel"), config))
    return model, (_meta(lambda: torch.zeros(batch, 16000)),)


def _vision(model_name, config_name, batch, size=224, **config):
    return _image(_meta(lambda: _build(_hf(model_name), _hf(config_name)(**config))), batch, size)


def dinov2(batch):
    """DINOv2-small with 4 layers: layer scale, position embedding interpolated to the image, the
    patch mask of its (iBOT) training passed (so that its mask token is read)."""
    import torch

    model, args = _vision("Dinov2Model", "Dinov2Config", batch, hidden_size=384, num_hidden_layers=4,
                          num_attention_heads=6, image_size=518, patch_size=14)
    return model, args, {"bool_masked_pos": _meta(lambda: torch.zeros(batch, (224 // 14) ** 2, dtype=torch.bool))}


def beit(batch):
    """BEiT-base with 2 layers: a relative-position bias per layer, layer scale, mean pooling."""
    return _vision("BeitForImageClassification", "BeitConfig", batch, num_hidden_layers=2,
                   use_relative_position_bias=True, use_mean_pooling=True)


def data2vec_vision(batch):
    """Data2Vec-vision-base with 2 layers (BEiT's architecture)."""
    return _vision("Data2VecVisionForImageClassification", "Data2VecVisionConfig", batch, num_hidden_layers=2,
                   use_relative_position_bias=True, use_mean_pooling=True)


def swinv2(batch):
    """Swin-v2-T (Hugging Face) at 256 pixels: cosine attention, a continuous position-bias MLP."""
    return _vision("Swinv2ForImageClassification", "Swinv2Config", batch, 256, image_size=256, window_size=8)


def convnextv2(batch):
    """ConvNeXt-v2-T (Hugging Face): global response normalisation."""
    return _vision("ConvNextV2ForImageClassification", "ConvNextV2Config", batch, depths=[3, 3, 9, 3],
                   hidden_sizes=[96, 192, 384, 768])


def segformer(batch):
    """SegFormer-B0: overlapping patch embeddings, reduced-key attention, an all-MLP decoder."""
    return _vision("SegformerForSemanticSegmentation", "SegformerConfig", batch, 512)


def mobilevit(batch):
    """MobileViT-S at 256 pixels: unfolded patches through transformer blocks between convolutions."""
    return _vision("MobileViTForImageClassification", "MobileViTConfig", batch, 256)


def levit(batch):
    """LeViT-128S: attention with learnt position biases, subsampling attention, batch norms."""
    return _vision("LevitForImageClassification", "LevitConfig", batch)


def poolformer(batch):
    """PoolFormer-S12: average pooling in place of attention, group norms."""
    return _vision("PoolFormerForImageClassification", "PoolFormerConfig", batch)


# ---------------------------------------------------------------------------------------
# torchvision


def _tv(zoo_name, name, size=224, **kwargs):
    def factory(batch):
        import torchvision

        return _image(_meta(lambda: getattr(torchvision.models, name)(**kwargs)), batch, size)

    factory.__name__ = factory.__qualname__ = zoo_name
    factory.__doc__ = f"torchvision {name}, {size} x {size} images."
    return factory


resnet50 = _tv("resnet50", "resnet50")
resnext50 = _tv("resnext50", "resnext50_32x4d")
wide_resnet50 = _tv("wide_resnet50", "wide_resnet50_2")
vgg16 = _tv("vgg16", "vgg16")
mobilenet_v2 = _tv("mobilenet_v2", "mobilenet_v2")
mobilenet_v3 = _tv("mobilenet_v3", "mobilenet_v3_large")
efficientnet_b0 = _tv("efficientnet_b0", "efficientnet_b0")
convnext_tiny = _tv("convnext_tiny", "convnext_tiny")
def regnet_y(batch):
    """torchvision regnet_y_400mf (its initialisation cannot run on meta: built on the CPU, 4M weights)."""
    import torchvision

    return _image(torchvision.models.regnet_y_400mf().to("meta"), batch)
densenet121 = _tv("densenet121", "densenet121")
googlenet = _tv("googlenet", "googlenet", aux_logits=False, init_weights=False)
inception_v3 = _tv("inception_v3", "inception_v3", 299, aux_logits=False, init_weights=False)
shufflenet = _tv("shufflenet", "shufflenet_v2_x1_0")
squeezenet = _tv("squeezenet", "squeezenet1_1")
mnasnet = _tv("mnasnet", "mnasnet1_0")
vit_b16 = _tv("vit_b16", "vit_b_16")
swin_t = _tv("swin_t", "swin_t")

efficientnet_v2_s = _tv("efficientnet_v2_s", "efficientnet_v2_s", 384)


def regnet_x(batch):
    """torchvision regnet_x_400mf (built on the CPU like ``regnet_y``, 5M weights)."""
    import torchvision

    return _image(torchvision.models.regnet_x_400mf().to("meta"), batch)


vit_l32 = _tv("vit_l32", "vit_l_32")
swin_v2_t = _tv("swin_v2_t", "swin_v2_t", 256)
maxvit_t = _tv("maxvit_t", "maxvit_t")


def _tv_segmentation(zoo_name, name):
    def factory(batch):
        import torchvision

        return _image(_meta(lambda: getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, aux_loss=False)), batch, 520)

    factory.__name__ = factory.__qualname__ = zoo_name
    factory.__doc__ = f"torchvision segmentation {name}, 520 x 520 images."
    return factory


fcn_resnet50 = _tv_segmentation("fcn_resnet50", "fcn_resnet50")
deeplabv3 = _tv_segmentation("deeplabv3", "deeplabv3_resnet50")


#: The zoo in report order: (factory, family, what it shows).
ZOO = [
    gpt2, llama, mistral, qwen2, qwen3, gemma, gemma2, pythia, phi3, phi2, falcon, opt, stablelm, starcoder2,
    olmo, gpt_neo, bloom, gptj, deepseek_v2_dense, deepseek_v2, mixtral, gpt_bigcode, codegen, mpt, cohere,
    granite, olmo2, gemma3, smollm, bert, roberta, roberta_ids_only, distilbert, albert, electra, xlm_roberta,
    deberta_v2, mobilebert, mpnet, t5, bart, marian, mbart, pegasus, mt5, umt5, whisper, wav2vec2, hubert, clip,
    clip_vision, vit, deit, swin, convnext_hf, dinov2, beit, data2vec_vision, swinv2, convnextv2, segformer,
    mobilevit, levit, poolformer, llava, resnet50, resnext50, wide_resnet50, vgg16, mobilenet_v2, mobilenet_v3,
    efficientnet_b0, convnext_tiny, regnet_y, densenet121, googlenet, inception_v3, shufflenet, squeezenet,
    mnasnet, vit_b16, swin_t, efficientnet_v2_s, regnet_x, vit_l32, swin_v2_t, maxvit_t, fcn_resnet50, deeplabv3,
]


def _why(err) -> str:
    """The first reason of a refusal, short enough for a table cell."""
    from pase.sources.torch.errors import UnmappableOpsError

    if isinstance(err, UnmappableOpsError):
        return "; ".join(f"`{op}`: {reason.split(': ')[0].split(' (')[0]}" for op, _, reason, _ in err.ops[:3])
    return str(err).split(": ", 1)[-1][:120]


def run_one(factory, batch: int, procs) -> dict:
    """Import, count and plan one model; a dict of what the table shows."""
    from pase.costing.memory import parameter_count
    from pase.sources.torch.importer import from_torch
    import pase

    row = {"name": factory.__name__, "doc": (factory.__doc__ or "").split("\n")[0]}
    started = time.perf_counter()
    try:
        built = factory(batch)
        module, args = built[0], built[1]
        kwargs = built[2] if len(built) > 2 else {}
        row["own"] = sum(p.numel() for p in module.parameters())
        net = from_torch(module, args, kwargs, name=factory.__name__)
    except Exception as err:  # noqa: BLE001  a refusal is a result of the benchmark
        row["status"], row["why"] = "refused", _why(err)
        row["import_s"] = time.perf_counter() - started
        return row
    row["import_s"] = time.perf_counter() - started
    row["vertices"] = len(net.layers)
    row["params"] = parameter_count(net)
    row["status"] = "imports"
    for p in procs:
        started = time.perf_counter()
        try:
            found = pase.plan(net, p)
            row[f"cost{p}"] = found.total_cost
        except Exception as err:  # noqa: BLE001
            row[f"cost{p}"] = None
            row["status"], row["why"] = "imports, no plan", str(err)[:120]
        row[f"plan{p}_s"] = time.perf_counter() - started
    return row


def main(argv=None) -> int:
    from common import RESULTS, machine_info, machine_lines, markdown_table, write_text

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated factory names")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--procs", default="8,64")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    chosen = [f for f in ZOO if not args.only or f.__name__ in args.only.split(",")]
    rows = []
    for factory in chosen:
        row = run_one(factory, args.batch, procs)
        rows.append(row)
        print(f"{row['name']}: {row['status']} {row.get('why', '')}", flush=True)
    table = []
    for r in rows:
        error = (f"{100 * (r['params'] / r['own'] - 1):+.3f} %" if r.get("params") is not None and r.get("own")
                 else "")
        costs = [f"{r[f'cost{p}']:.4g}" if r.get(f"cost{p}") is not None else "" for p in procs]
        plan_s = sum(r.get(f"plan{p}_s", 0.0) for p in procs)
        table.append([f"`{r['name']}`", r["status"] + (f": {r['why']}" if r.get("why") else ""),
                      str(r.get("vertices", "")), f"{r['own'] / 1e6:.2f}M" if r.get("own") else "", error,
                      *costs, f"{r['import_s']:.1f}", f"{plan_s:.1f}" if plan_s else ""])
    imported = sum(1 for r in rows if r["status"] == "imports")
    worst = max((abs(r["params"] / r["own"] - 1) for r in rows if r.get("params") is not None and r.get("own")),
                default=0.0)
    md = ["# The model zoo", "", "Machine:", ""] + machine_lines(machine_info()) + [
        "",
        f"Every factory of `benchmarks/zoo.py`, built from its configuration on the `meta` device, imported with",
        f"`from_torch` (batch {args.batch}; language models {TOKENS} tokens) and planned with the exact search on",
        f"the default machine at p = {', '.join(map(str, procs))}. {imported} of {len(rows)} import and plan; the",
        f"largest parameter error against the model's own `sum(p.numel())` is {100 * worst:.3f} %.",
        "Regenerate with `python benchmarks/zoo.py`.", "",
    ]
    md += markdown_table(["model", "import", "vertices", "parameters", "error"] + [f"optimum p={p}" for p in procs]
                         + ["import s", "plan s"], table, "lllrr" + "r" * len(procs) + "rr")
    md += ["", "Descriptions:", ""] + [f"- `{r['name']}`: {r['doc']}" for r in rows] + [""]
    write_text(os.path.join(args.out, "zoo.md"), md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
