"""The model a torchtitan export trains: one of torchtitan's own Llama 3.1 flavours where the
graph is exactly one, else (0.3) a config module that builds the graph's very decoder; a
mixture of experts only where it is exactly one of torchtitan 0.3's own (Qwen3-30B-A3B).

torchtitan defines its models in Python (``models/llama3``), not in its job files: 0.2.2's TOML
names one (``model.name``, ``model.flavor``), 0.3.0's command line one config function
(``--module``, ``--config``; ``Trainer.Config.model_spec`` is no command-line field). So a model
that is no flavour is built by a module the 0.3 launch script writes (:func:`module_text`).
"""

from __future__ import annotations

from pase.outputs.engine_base import EngineRefusal

__all__ = ["TITAN_LLAMA", "TITAN03_CONFIGS", "LLAMA31_SCALING", "TITAN_MODELS", "model_shape", "flavour_of", "llama_refusal",
           "shape_differences", "TITAN_MOE", "TITAN03_MOE_CONFIGS", "moe_shape", "moe_refusal", "config_module",
           "titan_model", "module_text", "MODULE_NAME", "MODULE_CONFIG"]

#: Llama 3.1's rotary scaling as both engines name it (torchtitan's ComplexRoPE ``scaling =
#: "llama"`` with these factors; Hugging Face's ``rope_scaling`` of the Llama-3.1 configs).
LLAMA31_SCALING = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "type": "llama3"}
_LLAMA31 = {"head_dim": 128, "vocab": 128256, "tied": False, "qk_norm": False, "rope_theta": 500000.0,
            "rope_scaling": LLAMA31_SCALING, "norm_eps": 1e-5}
#: torchtitan's Llama 3.1 flavours, the same in 0.2.2 (``models/llama3/__init__.py``,
#: ``llama3_args``: ``rope_theta=500000``, ``RoPEScalingArgs`` 8 / 1 / 4 / 8192, ``norm_eps``
#: 1e-5, the FFN width ``multiple_of`` x ceil(``ffn_dim_multiplier`` x 8 dim / 3 / multiple_of))
#: and 0.3.0 (``models/llama3/__init__.py``, ``llama3_configs``: ``ComplexRoPE.Config(theta=500000,
#: scaling="llama")``, ``compute_ffn_hidden_dim``, ``RMSNorm`` eps 1e-5). tests/test_engines_titan.py
#: checks the table against torchtitan 0.3's own configs.
TITAN_LLAMA = {
    "8B": dict(_LLAMA31, layers=32, width=4096, heads=32, kv_heads=8, mlp_width=14336),
    "70B": dict(_LLAMA31, layers=80, width=8192, heads=64, kv_heads=8, mlp_width=28672),
    "405B": dict(_LLAMA31, layers=126, width=16384, heads=128, kv_heads=8, mlp_width=53248),
}
#: torchtitan 0.3.0's config functions (``models/llama3/config_registry.py``) that train a flavour
#: in BF16: ``llama3_405b`` converts its linear layers to Float8, so the 405B is built by the
#: launch script's own module.
TITAN03_CONFIGS = {"8B": "llama3_8b", "70B": "llama3_70b"}
#: torchtitan 0.3.0's mixtures of experts the exporter writes, as its code builds them: Qwen3's
#: 30B-A3B (``models/qwen3/__init__.py`` ``_30b_a3b``: 48 layers of width 2048, 32 heads of 128
#: and 4 key/value heads with query/key RMSNorms, rotary base 1e6, vocabulary 151,936 untied,
#: norm epsilon 1e-6 (``_EPS``); ``_build_qwen3_moe_layers``: every layer a mixture of 128
#: experts of width 768, top 8 by softmax, the top scores renormalised (``route_norm``), no
#: shared expert). tests/test_engines_titan.py checks it against torchtitan 0.3's own config.
TITAN_MOE = {
    "30B-A3B": {"layers": 48, "width": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "vocab": 151936,
                "tied": False, "qk_norm": True, "rope_theta": 1000000.0, "rope_scaling": None, "norm_eps": 1e-6,
                "experts": 128, "top_k": 8, "expert_width": 768, "shared": 0},
}
#: Its config function (``models/qwen3/config_registry.py`` ``qwen3_30b_a3b``) and module.
TITAN03_MOE_CONFIGS = {"30B-A3B": ("qwen3", "qwen3_30b_a3b")}
#: The models of each release (0.3.0: ``models/__init__.py`` ``_supported_models``; 0.2.2: its
#: ``models`` package): none is Mixtral.
TITAN_MODELS = {"0.3": "deepseek_v3, flux, gpt_oss, kimi_k2_7, llama3, muse_glimmer, qwen3, qwen3_5",
                "0.2": "deepseek_v3, flux, gpt_oss, llama3, llama3_ft, llama4, qwen3"}
#: The module and config function a 0.3 launch script writes for a model that is no flavour.
MODULE_NAME = "pase_torchtitan_model"
MODULE_CONFIG = "pase_model"

_PLAIN = {"norm_bias": False, "post_norms": False, "window": 0, "sinks": False, "softcap": 0.0, "final_softcap": 0.0,
          "mla": False, "mtp": 0}
_SHOWN = {"layers": "layers", "width": "width", "heads": "heads", "kv_heads": "key/value heads",
          "head_dim": "head width", "mlp_width": "FFN width", "vocab": "vocabulary", "tied": "tied embeddings",
          "qk_norm": "query/key norms", "rope_theta": "rotary base", "rope_scaling": "rotary scaling",
          "norm_eps": "norm epsilon"}


def _unplain(arch) -> list:
    """The features (:data:`_PLAIN`) and biases of ``arch`` that torchtitan's decoders lack."""
    return ([k for k, v in arch.get("features", {}).items() if v != _PLAIN.get(k, v)]
            + [f"{k} bias" for k, v in arch.get("biases", {}).items() if v])


def llama_refusal(arch, version: str) -> str | None:
    """Why torchtitan's Llama decoder (RMSNorm, SwiGLU, grouped-query rotary attention, no
    biases) cannot be this graph's model, or ``None``."""
    if not arch:
        return ("the graph declares no decoder shape (an imported model or a graph file), and torchtitan builds "
                "its models from theirs")
    if arch.get("moe"):
        moe = arch["moe"]
        return (f"this exporter writes torchtitan {version}'s Llama decoder, not its mixtures of experts (this one "
                f"has {moe['experts']} experts, top-{moe['top_k']}; torchtitan's models: {TITAN_MODELS[version]}; "
                "torchtitan 0.3's launch writes its Qwen3-30B-A3B), so no export is written")
    odd = _unplain(arch)
    odd += [] if arch.get("gated") else ["plain (not gated) MLP"]
    odd += [] if arch.get("norm") == "rms" else [f"{arch.get('norm')} norm"]
    odd += [] if arch.get("positions") == "rotary" else [f"{arch.get('positions')} positions"]
    if odd:
        return (f"torchtitan's llama3 decoder (SwiGLU, RMSNorm, rotary positions, no biases) is not this model, with "
                f"its {', '.join(odd)}")
    if "rope" not in arch or "norm_eps" not in arch:
        return ("the graph does not declare its rotary base and norm epsilon (an hf: config of a Llama, Mistral or "
                "Qwen type, or a built-in decoder, does): torchtitan would build another model")
    scaling = arch["rope"]["scaling"]
    if scaling and (scaling.get("type") != "llama3" or set(scaling) - set(LLAMA31_SCALING)):
        return (f"torchtitan's llama3 rotary embedding scales as Llama 3.1 does (type llama3), not as this model's "
                f"{scaling}")
    return None


def model_shape(arch: dict) -> dict:
    """The model in the words of :data:`TITAN_LLAMA` (a Llama-architecture ``arch``)."""
    scaling = arch["rope"]["scaling"]
    return {"layers": arch["layers"], "width": arch["width"], "heads": arch["heads"], "kv_heads": arch["kv_heads"],
            "head_dim": arch["head_dim"], "mlp_width": arch["mlp_width"], "vocab": arch["vocab"],
            "tied": arch["tied"], "qk_norm": bool(arch.get("qk_norm")), "rope_theta": arch["rope"]["theta"],
            "rope_scaling": dict(scaling) if scaling else None, "norm_eps": arch["norm_eps"]}


def moe_shape(arch: dict) -> dict:
    """A mixture of experts in the words of :data:`TITAN_MOE`."""
    moe = arch["moe"]
    return {"layers": arch["layers"], "width": arch["width"], "heads": arch["heads"], "kv_heads": arch["kv_heads"],
            "head_dim": arch["head_dim"], "vocab": arch["vocab"], "tied": arch["tied"],
            "qk_norm": bool(arch.get("qk_norm")), "rope_theta": arch["rope"]["theta"],
            "rope_scaling": dict(arch["rope"]["scaling"]) if arch["rope"]["scaling"] else None,
            "norm_eps": arch["norm_eps"], "experts": moe["experts"], "top_k": moe["top_k"],
            "expert_width": moe["width"], "shared": moe["shared"]}


def moe_refusal(arch) -> str | None:
    """Why no mixture of experts torchtitan 0.3 builds from its config functions
    (:data:`TITAN_MOE`) is this graph's model, or ``None``."""
    moe = arch.get("moe") or {}
    odd = _unplain(arch)
    odd += [f"dense layers {moe['dense']}"] if moe.get("dense") else []
    odd += [f"capacity factor {moe['capacity']}"] if moe.get("capacity") else []
    odd += ["router bias"] if moe.get("router_bias") else []
    odd += ["expert bias"] if moe.get("expert_bias") else []
    odd += [f"{moe['activation']} experts"] if moe.get("activation", "swiglu") != "swiglu" else []
    odd += [f"{moe['groups']} expert groups"] if moe.get("groups", 1) > 1 else []
    plain = arch.get("gated") and arch.get("norm") == "rms" and arch.get("positions") == "rotary"
    odd += [] if plain else ["not a gated RMSNorm rotary decoder"]
    if odd or "rope" not in arch or "norm_eps" not in arch:
        return (f"torchtitan 0.3's mixture of experts the launch writes is its Qwen3 30B-A3B, and this model has "
                f"{', '.join(odd) or 'no declared rotary base and norm epsilon'}")
    shape = moe_shape(arch)
    if shape not in TITAN_MOE.values():
        return (f"torchtitan 0.3's mixture of experts the launch writes is its Qwen3 30B-A3B, and this model differs "
                f"in {'; '.join(_moe_differences(shape, TITAN_MOE['30B-A3B'])[:4])}")
    return None


def _moe_differences(shape: dict, other: dict) -> list:
    return [f"{k} {shape[k] if shape[k] is not None else 'none'} (not {other.get(k)})"
            for k in other if shape.get(k) != other.get(k)]


def config_module(config: str) -> str:
    """The torchtitan 0.3 module of one of its config functions the export names."""
    return next((module for module, name in TITAN03_MOE_CONFIGS.values() if name == config), "llama3")


def flavour_of(shape: dict) -> str | None:
    """The flavour of :data:`TITAN_LLAMA` that is exactly ``shape``, else ``None``."""
    return next((name for name, flavour in TITAN_LLAMA.items() if flavour == shape), None)


def _differences(shape: dict) -> str:
    """How ``shape`` differs from the nearest flavour (the fewest settings apart)."""
    def apart(name):
        return [k for k in _SHOWN if TITAN_LLAMA[name][k] != shape[k]]

    name = min(TITAN_LLAMA, key=lambda n: (len(apart(n)), abs(TITAN_LLAMA[n]["width"] - shape["width"])))
    words = [f"{_SHOWN[k]} {shape[k] if shape[k] is not None else 'none'} (not {TITAN_LLAMA[name][k]})"
             for k in apart(name)][:4]
    return f"the nearest, {name}, differs in {'; '.join(words)}"


def shape_differences(shape: dict, other: dict) -> list:
    """``"NAME A (not B)"`` for each setting of :data:`TITAN_LLAMA`'s words where ``shape`` is
    ``A`` and ``other`` is ``B``."""
    return [f"{_SHOWN[k]} {shape[k] if shape[k] is not None else 'none'} (not {other.get(k)})"
            for k in _SHOWN if shape[k] != other.get(k)]


def titan_model(arch, version: str, precision: str = "bf16") -> tuple:
    """``(kind, name, shape)`` of the model the export trains: ``("config", "llama3_8b", ...)``
    (0.3: a config function of torchtitan's), ``("flavour", "8B", ...)`` (0.2: ``model.flavor``)
    or ``("module", MODULE_NAME, ...)`` (0.3: the launch script's own module);
    :class:`EngineRefusal` with the reason when the release has no such model. A mixture of
    experts is trained by torchtitan 0.3's config function of the same model (:data:`TITAN_MOE`)
    and no other: ``("config", "qwen3_30b_a3b", shape)``."""
    if arch and arch.get("moe") and version == "0.3":
        reason = moe_refusal(arch)
        if reason is not None:
            raise EngineRefusal("torchtitan", reason)
        shape = moe_shape(arch)
        flavour = next(name for name, known in TITAN_MOE.items() if known == shape)
        if precision != "bf16":
            raise EngineRefusal("torchtitan", "torchtitan 0.3's launch script is written for BF16 plans")
        return "config", TITAN03_MOE_CONFIGS[flavour][1], shape
    reason = llama_refusal(arch, version)
    if reason is not None:
        raise EngineRefusal("torchtitan", reason)
    shape = model_shape(arch)
    flavour = flavour_of(shape)
    if version == "0.2":
        if flavour is None:
            raise EngineRefusal("torchtitan", "torchtitan 0.2's job file names one of its models (model.name, "
                                              "model.flavor: llama3 8B, 70B or 405B, Llama 3.1), and this is none: "
                                              f"{_differences(shape)}; torchtitan 0.3's launch script (the default, "
                                              "--engine torchtitan) builds the exact model")
        return "flavour", flavour, shape
    if flavour in TITAN03_CONFIGS and precision == "bf16":
        return "config", TITAN03_CONFIGS[flavour], shape
    return "module", MODULE_NAME, shape


#: The config module for torchtitan 0.3.0 (``--module pase_torchtitan_model --config pase_model``):
#: the model of ``MODEL`` built as torchtitan's own llama3 flavours are (models/llama3/__init__.py:
#: fused QKV, FlexAttention, its initializations), the rest of the job as ``llama3_8b``'s.
_MODULE = '''"""torchtitan 0.3.0 config of the model pase priced ({name}), written by pase: --module {module} --config {config}."""

import dataclasses

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.llama3 import (_EMBEDDING_INIT, _EMBEDDING_SKIP_INIT, _LINEAR_INIT, _NORM_INIT, _depth_init,
                                      _output_linear_init, model_registry)
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock

#: The decoder as priced (pase --recipe-from reads it back).
MODEL = {model!r}


def _norm(size):
    return RMSNorm.Config(normalized_shape=size, eps=MODEL["norm_eps"], param_init=_NORM_INIT)


def _rope():
    scaling = MODEL["rope_scaling"]
    if not scaling:
        return ComplexRoPE.Config(dim=MODEL["head_dim"], max_seq_len=MODEL["max_seq_len"], theta=MODEL["rope_theta"])
    return ComplexRoPE.Config(dim=MODEL["head_dim"], max_seq_len=MODEL["max_seq_len"], theta=MODEL["rope_theta"],
                              scaling="llama", scaling_factor=scaling["factor"],
                              low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"],
                              original_max_position_embeddings=scaling["original_max_position_embeddings"])


def _layer(layer_id):
    dim = MODEL["width"]
    return Llama3TransformerBlock.Config(
        attention_norm=_norm(dim), ffn_norm=_norm(dim),
        attention=make_gqa_config(dim=dim, n_heads=MODEL["heads"], n_kv_heads=MODEL["kv_heads"],
                                  head_dim=MODEL["head_dim"], wqkv_param_init=_LINEAR_INIT,
                                  wo_param_init=_depth_init(layer_id), inner_attention=get_attention_config("flex"),
                                  fuse_qkv=True, rope=_rope(),
                                  qk_norm=_norm(MODEL["head_dim"]) if MODEL["qk_norm"] else None),
        feed_forward=make_ffn_config(dim=dim, hidden_dim=MODEL["mlp_width"], w1_param_init=_LINEAR_INIT,
                                     w2w3_param_init=_depth_init(layer_id)))


def model():
    dim, vocab = MODEL["width"], MODEL["vocab"]
    return Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=MODEL["tied"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=_EMBEDDING_SKIP_INIT if MODEL["tied"] else _EMBEDDING_INIT),
        norm=_norm(dim), lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=[_layer(i) for i in range(MODEL["layers"])])


def {config}():
    config = llama3_8b()
    config.model_spec = dataclasses.replace(model_registry("8B"), flavor="pase", model=model())
    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=MODEL["vocab"]))
    return config
'''


def module_text(shape: dict, sequence: int, name: str) -> str:
    """The Python module a 0.3 launch script writes for a model that is no flavour (``shape``:
    :func:`model_shape`; ``sequence``: the rotary cache's length, the plan's sequence)."""
    model = dict(shape, max_seq_len=sequence)
    name = "".join(c if c.isprintable() and c not in '"\\' else "?" for c in name)
    return _MODULE.format(name=name, module=MODULE_NAME, config=MODULE_CONFIG, model=model)
