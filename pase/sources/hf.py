"""Hugging Face ``config.json`` files as decoder graphs (``-g hf:FILE.json``), without torch.

``decoder_config_from_hf`` reads the fields of a ``model_type`` it supports (``llama``,
``mistral``, ``qwen2``, ``gpt2``; the mixtures of experts ``mixtral``, ``qwen2_moe`` and
``qwen3_moe`` through ``pase.sources.hf_moe``; ``qwen3``, ``phi3``, ``nemotron``, ``gemma2``,
``gemma3_text``, ``gpt_oss``, ``mpt`` and ``deepseek_v3`` through ``pase.sources.hf_types``)
into a ``graphs.decoder.DecoderConfig``; ``load_hf`` builds the network (``docs/models.md``). Anything missing, malformed or unsupported is a ``ValueError`` of one
line naming the file and the field: an ``InputError`` (a ``ValueError``; exit status 1 on the
command line, as for an invalid graph file), like a file that cannot be read, is not JSON or
repeats a key; a sequence length (``-m``) the config cannot take is a plain ``ValueError``
(exit status 2, a bad command-line value).

Any other ``model_type`` is built by ``transformers`` from the config on the ``meta`` device
and imported through the ``torch:`` path (``pase.sources.torch.hf``); without PyTorch and
transformers, one line names the model type and the extra to install.

The sequence length is ``-m``; by default ``min(max_position_embeddings, 2048)`` (GPT-2:
``n_positions``), or 2048 when the config gives no maximum. Learned position tables cap
``-m`` at their length; rotary models take any ``-m``.
"""

from __future__ import annotations

import math
import os

from pase.core.fileio import InputError, read_json
from pase.sources.hf_fields import ACTIVATIONS, DEFAULT_SEQUENCE, Fields, block_count, sequence_length, shown
from pase.sources.hf_moe import MOE_TYPES, REFUSED, moe_fields
from pase.sources.hf_types import LLAMA_LIKE as _MORE_LLAMA_LIKE, TYPES as MORE_TYPES, read_type, windows

__all__ = ["SUPPORTED", "DEFAULT_SEQUENCE", "read_hf_config", "decoder_config_from_hf", "read_decoder_config", "load_hf",
           "network_name"]

#: Model types whose configs describe another type's architecture under a name of their own, read
#: as that type: ``kimi_k2`` (Moonshot AI's Kimi K2: its config.json names
#: ``DeepseekV3ForCausalLM`` and its ``configuration_deepseek.py``; DeepSeek-V3's fields, with 384
#: routed experts and 64 heads).
ALIASES = {"kimi_k2": "deepseek_v3"}
#: The ``model_type`` values read, and how.
SUPPORTED = ("gpt2", "llama", "mistral", "qwen2") + MOE_TYPES + MORE_TYPES + tuple(ALIASES)
#: ``head_dim`` when a config of these types does not give it (transformers' defaults).
HEAD_DIM_DEFAULTS = {"gemma2": 256, "gemma3_text": 256}

_LLAMA_LIKE = ("llama", "mistral", "qwen2") + MOE_TYPES

#: ``(rope_theta, rms_norm_eps)`` of a config that does not give them: transformers' defaults
#: (LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen3Config and their MoE configs,
#: DeepseekV3Config and DeepseekV2Config).
#: The rotary base, its scaling and the norms' epsilon are declared on the network for these
#: types (the engine exports write them); other types leave them undeclared.
NUMERICS_DEFAULTS = {"llama": (10000.0, 1e-6), "mistral": (10000.0, 1e-6), "mixtral": (1e6, 1e-5),
                     "qwen2": (10000.0, 1e-6), "qwen3": (10000.0, 1e-6), "qwen2_moe": (10000.0, 1e-6),
                     "qwen3_moe": (10000.0, 1e-6), "deepseek_v3": (10000.0, 1e-6), "deepseek_v2": (10000.0, 1e-6)}


def read_hf_config(path: str) -> dict:
    """The JSON of ``path`` (a Hugging Face ``config.json``); ``InputError`` in one line otherwise.

    Strict JSON (no NaN or Infinity) with no key given twice: two values for one field
    would leave it to the reader which one counts.
    """
    if not isinstance(path, str) or not path:
        raise InputError("hf: needs a file name (-g hf:FILE.json)")
    return read_json(path, "hf config", stdin=False)


def _positive_number(fields: Fields, key: str, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        fields.fail(f"{key} must be a positive number, got {shown(value)}")
    return float(value)


def numerics(fields: Fields, model_type: str) -> dict:
    """``rope_theta``, ``rope_scaling`` and ``norm_eps`` of a config of a type in
    :data:`NUMERICS_DEFAULTS` (``rope_theta`` and ``rope_scaling``, or transformers 5's
    ``rope_parameters``; ``rms_norm_eps``), the type's defaults where absent; ``{}`` for other
    types. ``rope_scaling`` is a tuple of ``(name, value)`` pairs, ``type`` for ``rope_type``,
    ``()`` when unscaled."""
    if model_type not in NUMERICS_DEFAULTS:
        return {}
    theta, eps = NUMERICS_DEFAULTS[model_type]
    data = fields.data
    parameters = data.get("rope_parameters")
    if parameters is not None and not isinstance(parameters, dict):
        fields.fail(f"rope_parameters must be an object, got {shown(parameters)}")
    scaling = data.get("rope_scaling")
    if scaling is None and parameters and parameters.get("rope_type", "default") != "default":
        scaling = parameters
    if scaling is not None and not isinstance(scaling, dict):
        fields.fail(f"rope_scaling must be an object or null, got {shown(scaling)}")
    pairs = []
    for key, value in sorted((scaling or {}).items()):
        if key == "rope_theta":
            continue
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            fields.fail(f"rope_scaling {key} must be a number or a name, got {shown(value)}")
        pairs.append(("type" if key == "rope_type" else key, value))
    pairs = tuple(sorted(pairs))
    if dict(pairs).get("type") == "default":
        pairs = ()
    if data.get("rope_theta") is not None:
        theta = _positive_number(fields, "rope_theta", data["rope_theta"])
    elif parameters and parameters.get("rope_theta") is not None:
        theta = _positive_number(fields, "rope_parameters.rope_theta", parameters["rope_theta"])
    if data.get("rms_norm_eps") is not None:
        eps = _positive_number(fields, "rms_norm_eps", data["rms_norm_eps"])
    return {"rope_theta": theta, "rope_scaling": pairs, "norm_eps": eps}


def decoder_config_from_hf(data: dict, sequence: int | None = None, source: str = "config.json", mtp: bool = False):
    """The ``DecoderConfig`` of a Hugging Face config (a parsed ``config.json``).

    ``sequence`` is the sequence length (``-m``); ``source`` names the file in messages;
    ``mtp``: with DeepSeek-V3's multi-token-prediction modules. ``read_decoder_config`` also
    returns the fields left out.

    >>> cfg = decoder_config_from_hf({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    ...     "vocab_size": 128256})
    >>> cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.sequence, cfg.tied
    (32, 8, 128, 2048, False)
    >>> decoder_config_from_hf({"model_type": "bert"}, source="x.json")
    Traceback (most recent call last):
    ...
    pase.core.errors.InputError: hf config x.json: model_type "bert" is not supported; supported: gpt2, llama, mistral, qwen2, mixtral, qwen2_moe, qwen3_moe, qwen3, phi3, nemotron, gemma2, gemma3_text, gpt_oss, deepseek_v3, deepseek_v2, mpt, kimi_k2
    """
    return read_decoder_config(data, sequence, source, mtp)[0]


def read_decoder_config(data: dict, sequence: int | None = None, source: str = "config.json", mtp: bool = False):
    """``(DecoderConfig, notes)``: ``decoder_config_from_hf``'s config and, one line each, the
    fields that change the network but are not modelled (the CLI prints them; never dropped
    silently)."""
    from graphs.decoder import DecoderConfig

    fields = Fields(data, source)
    if not isinstance(data, dict):
        raise InputError(f"hf config {source}: expected a JSON object, got {type(data).__name__}")
    if "model_type" not in data:
        fields.fail(f"model_type is missing; supported: {', '.join(SUPPORTED)}")
    model_type = data["model_type"]
    if isinstance(model_type, str) and model_type in REFUSED:
        fields.fail(f"model_type {shown(model_type)} is not supported: {REFUSED[model_type]}")
    if model_type not in SUPPORTED:
        fields.fail(f"model_type {shown(model_type)} is not supported; supported: {', '.join(SUPPORTED)}")
    model_type = ALIASES.get(model_type, model_type)
    if model_type == "mpt":
        config = read_type(fields, model_type, None, sequence)
    elif model_type == "gpt2":
        width = fields.positive("n_embd")
        layers = fields.positive("n_layer")
        heads = fields.positive("n_head", condition=" dividing n_embd")
        if width % heads:
            fields.fail(f"n_head must be a positive integer dividing n_embd ({width}), got {heads}")
        if data.get("add_cross_attention"):
            fields.fail("add_cross_attention is not supported (a decoder-only model has no cross-attention)")
        fields.number("layer_norm_epsilon")
        eps = data.get("layer_norm_epsilon")
        fields.choice("activation_function", "gelu_new", ACTIVATIONS)
        config = dict(
            layers=layers, width=width, heads=heads, kv_heads=heads, head_dim=width // heads,
            mlp_width=fields.positive("n_inner", 4 * width, required=False), vocab=fields.positive("vocab_size"),
            gated=False, norm="layer", positions="learned", max_positions=fields.positive("n_positions"),
            tied=fields.flag("tie_word_embeddings", True), qkv_bias=True, out_bias=True, mlp_bias=True,
            sequence=sequence_length(fields, sequence, "n_positions", learned=True),
            norm_eps=1e-5 if eps is None else float(eps),  # transformers' GPT2Config default
        )
    else:
        width = fields.positive("hidden_size")
        layers = block_count(fields, "num_hidden_layers")
        head_dim = fields.positive("head_dim", HEAD_DIM_DEFAULTS.get(model_type), required=False)
        if model_type in ("deepseek_v3", "deepseek_v2"):
            head_dim = 1  # latent attention: its head widths are its own fields
        heads = fields.positive("num_attention_heads", condition="" if head_dim else " dividing hidden_size")
        if head_dim is None:
            if width % heads:
                fields.fail(f"num_attention_heads must be a positive integer dividing hidden_size ({width}), "
                            f"got {heads}")
            head_dim = width // heads
        kv_heads = fields.positive("num_key_value_heads", heads, required=False,
                                   condition=" dividing num_attention_heads")
        if heads % kv_heads:
            fields.fail(f"num_key_value_heads must be a positive integer dividing num_attention_heads ({heads}), "
                        f"got {kv_heads}")
        fields.number("rms_norm_eps")
        fields.choice("hidden_act", "silu", ACTIVATIONS)
        if model_type == "llama":
            attention_bias = fields.flag("attention_bias", False)
            qkv_bias, out_bias, mlp_bias = attention_bias, attention_bias, fields.flag("mlp_bias", False)
        elif model_type == "qwen2":
            qkv_bias, out_bias, mlp_bias = True, False, False  # Qwen2: q, k and v have biases, nothing else
        else:
            qkv_bias = out_bias = mlp_bias = False
        config = dict(
            layers=layers, width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
            mlp_width=fields.positive("intermediate_size"), vocab=fields.positive("vocab_size"),
            gated=True, norm="rms", positions="rotary", tied=fields.flag("tie_word_embeddings", False),
            qkv_bias=qkv_bias, out_bias=out_bias, mlp_bias=mlp_bias,
            sequence=sequence_length(fields, sequence, "max_position_embeddings", learned=False),
        )
        config.update(numerics(fields, model_type))
        if model_type in MOE_TYPES:
            config.update(moe_fields(fields, model_type, layers))
        if model_type in _MORE_LLAMA_LIKE:
            config = read_type(fields, model_type, config, sequence, mtp)
        else:
            config.update(windows(fields, model_type, layers))
    try:
        return DecoderConfig(**config), tuple(fields.notes)
    except ValueError as err:  # anything the reading above let through
        fields.fail(str(err))


def network_name(path: str) -> str:
    """``hf:`` and the file's stem (``hf:llama-3.1-8b``); a ``config.json`` is named by its folder."""
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem == "config":
        folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
        stem = folder or stem
    return f"hf:{stem}"


def load_hf(path: str, batch: int, sequence: int | None = None, mtp: bool = False):
    """The decoder network of the Hugging Face config ``path`` for ``batch`` sequences.

    ``sequence`` is the sequence length (``-m``); see ``decoder_config_from_hf``. The
    network's ``notes`` name the fields left out.
    """
    import dataclasses

    from graphs.decoder import decoder

    data = read_hf_config(path)
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if isinstance(model_type, str) and model_type not in SUPPORTED:
        # Any other model type: transformers builds it on the meta device, the torch: importer reads it.
        from pase.sources.torch.hf import from_hf_config

        if mtp:
            raise ValueError(f"hf config {path}: --mtp applies to deepseek_v3 configs, not to model_type {model_type!r}")
        maximum = data.get("max_position_embeddings")
        if sequence is None:
            sequence = min(maximum, DEFAULT_SEQUENCE) if isinstance(maximum, int) and maximum > 0 else DEFAULT_SEQUENCE
        elif isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
            raise ValueError(f"the sequence length (-m) must be a positive integer, got {sequence!r}")
        return from_hf_config(data, path, batch, sequence, network_name(path))
    config, notes = read_decoder_config(data, sequence, path, mtp)
    network = decoder(config, batch, network_name(path))
    return dataclasses.replace(network, notes=tuple(f"hf config {path}: {note}" for note in notes))


def load_hf_source(path: str, batch: int | None, model: int | None, mtp: bool = False) -> object:
    """The ``hf:`` source of ``pase.sources``: ``-b`` sequences of ``-m`` tokens."""
    from graphs import DEFAULT_BATCH  # sequences per step when -b is not given, as for the built-in graphs

    return load_hf(path, DEFAULT_BATCH if batch is None else batch, model, mtp)
