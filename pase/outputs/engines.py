"""Mesh plans as the settings of the engines people run: torchtitan, Megatron-LM, DeepSpeed.

Each writer takes what :func:`pase.plan_training` returns (a ``TrainingPlan``: its plan, batch,
network, engine profile and machine's node size; :func:`engine_view`) or an
:class:`~pase.planning.engine_runs.EnginePlan`, and returns the engine's settings that run
exactly that plan, or raises :class:`EngineRefusal` with the reason when the engine cannot
(:func:`pase.planning.engine_runs.refusal`, or a model shape it has no argument for): nothing
is substituted. The command line's ``--export-ENGINE`` files are these functions' results. Every result keeps ``recipe`` (the plan in ``--recipe`` words,
with ``stages=`` where the pipeline stages differ), ``command_line`` (the engine's own
arguments) and ``launch`` (the command that runs it).

Field and argument names are the engines' own: torchtitan 0.3.0's launch and 0.2.2's job file
(:mod:`pase.outputs.titan_export`), Megatron-LM's ``pretrain_gpt.py`` arguments (megatron-core
0.16 configuration classes), DeepSpeed 0.19's ``ds_config.json``. The model's own settings are
written with it: for Megatron-LM every argument that changes what is built (shape, rotary base
and scaling, norm epsilon, grouped experts, vocabulary), for torchtitan the model named or built.

Low precision (``docs/precision.md``): Megatron-LM's Transformer Engine recipes
(``--fp8-format hybrid --fp8-recipe delayed|tensorwise|blockwise|mxfp8``, ``--fp4-format e2m1
--fp4-recipe nvfp4``, ``--fp8-param-gather``/``--fp4-param-gather`` for ``fp8_gather``);
torchtitan 0.2's converters. What an engine's file cannot say (its profile's ``runs.export``)
is refused.
"""

from __future__ import annotations

import shlex

from pase.core.checks import a_training_plan
from pase.outputs import titan_export
from pase.outputs.engine_base import DEVICES_PER_NODE, EngineRefusal, check_runs, setting, torchrun
from pase.outputs.titan_export import (TITAN_FLOAT8_RECIPES, TITAN_MIN_DIM, TITAN_MX_RECIPE, TORCHTITAN_VERSION,
                                       titan_precision_refusal, toml_text, torchtitan_fqns, torchtitan_settings)
from pase.planning.engine_runs import EnginePlan, engine_plan
from pase.planning.pipeline import extra_units, unit_split, virtual_order

__all__ = ["EngineRefusal", "torchtitan_settings", "megatron_settings", "deepspeed_settings", "WRITERS", "engine_view",
           "toml_text", "torchtitan_fqns", "megatron_layout", "TORCHTITAN_VERSION", "DEVICES_PER_NODE",
           "MEGATRON_PRECISION", "TITAN_FLOAT8_RECIPES", "TITAN_MX_RECIPE", "TITAN_MIN_DIM", "titan_precision_refusal",
           "megatron_model_settings", "megatron_pipeline_arguments", "megatron_dispatcher_arguments",
           "MEGATRON_DISPATCHER", "mtp_modules"]

#: Megatron-LM's arguments per format (``EnginePlan.precision_word``): Transformer Engine's
#: recipes, FP8 in its ``hybrid`` format (E4M3 forward, E5M2 gradients); then the switch that
#: keeps the converted weights (and so ZeRO's gathers of them) in the format.
MEGATRON_PRECISION = {
    "fp8/delayed": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")), "--fp8-param-gather"),
    "fp8/current": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")), "--fp8-param-gather"),
    "fp8/blockwise": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "blockwise")), "--fp8-param-gather"),
    "mxfp8": ((("--fp8-format", "hybrid"), ("--fp8-recipe", "mxfp8")), "--fp8-param-gather"),
    "nvfp4": ((("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")), "--fp4-param-gather"),
}
#: Megatron-Core's Llama 3 rotary scaling (``RotaryEmbedding._apply_scaling``: ``low_freq_factor``
#: 1, ``high_freq_factor`` 4, ``original_max_position_embeddings`` 8192 fixed; the factor is
#: ``--rope-scaling-factor``).
MEGATRON_ROPE_SCALING = {"type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}
#: YaRN under multi-latent attention, each of transformers' keys as megatron-core's
#: ``MLATransformerConfig`` field's flag (``YarnRotaryEmbedding`` and the attention's
#: ``_yarn_get_mscale``, transformer/multi_latent_attention.py:125-145: the same frequencies,
#: attention factor and softmax scale as transformers' ``yarn`` rope parameters); every key stated.
MEGATRON_YARN = {"factor": "--rotary-scaling-factor", "original_max_position_embeddings":
                 "--original-max-position-embeddings", "beta_fast": "--beta-fast", "beta_slow": "--beta-slow",
                 "mscale": "--mscale", "mscale_all_dim": "--mscale-all-dim"}


def yarn_of(a: dict) -> dict | None:
    """The graph's YaRN scaling where megatron-core builds it (multi-latent attention, every key
    of :data:`MEGATRON_YARN` stated), else None."""
    scaling = (a.get("rope") or {}).get("scaling") or {}
    if "mla" in a and scaling.get("type") == "yarn" and set(scaling) == set(MEGATRON_YARN) | {"type"}:
        return scaling
    return None


def engine_view(plan, engine: str, per_node: int | None = None, profile=None) -> tuple:
    """``(EnginePlan, devices per node, profile)`` the ``engine`` writer reads: of a
    ``TrainingPlan`` (``plan_training``'s result) its plan at its batch and network, its
    machine's node size and the profile it was priced for (``ValueError`` where nothing fits,
    where the plan is per-layer splits, or where it was priced for another engine, whose file
    would not run it as priced); an ``EnginePlan`` as it is (node size
    :data:`DEVICES_PER_NODE` unless given)."""
    if isinstance(plan, EnginePlan):
        return plan, per_node or DEVICES_PER_NODE, profile
    a_training_plan(plan, "plan")
    best = plan.best
    if best is None:
        raise ValueError("nothing fits: there is no plan to export (plan.least_memory needs the least)")
    if best.mesh is None:
        nearest = plan.mesh_search.best
        hint = (f"; the fastest mesh that fits is {nearest.recipe()} (step {nearest.summary.step_seconds:.4g} s "
                f"against {best.summary.step_seconds:.4g} s): fix it with a recipe to export it"
                if nearest is not None else "")
        raise ValueError("the plan is not a mesh, and engines run meshes" + hint)
    priced = profile if profile is not None else plan.engine_profile
    if priced is not None and priced.name != engine:
        raise ValueError(f"the plan is priced for {priced.name} (engine {priced.label()!r}), which a {engine} file "
                         f"would not run as priced: plan it with engine={engine!r} (--engine {engine})")
    per_node = per_node or plan.machine.devices_per_node or DEVICES_PER_NODE
    return engine_plan(best, plan.batch, plan.network), per_node, priced


def torchtitan_settings(plan, path: str = "train.sh", per_node: int | None = None, profile=None) -> dict:
    """torchtitan's files for the plan (:func:`pase.outputs.titan_export.torchtitan_settings`):
    ``text`` (the launch script, or with the profile's ``version=0.2`` the TOML job file),
    ``what``, ``command_line``, ``launch``. ``plan``: a ``TrainingPlan`` or an ``EnginePlan``
    (:func:`engine_view`)."""
    view, per_node, profile = engine_view(plan, "torchtitan", per_node, profile)
    return titan_export.torchtitan_settings(view, path, per_node, profile)


# ---------------------------------------------------------------------------------------
# Megatron-LM

def _model_arguments(plan: EnginePlan) -> list:
    a = plan.architecture
    # What this writer has no Megatron-LM arguments for: refused by name, never dropped.
    plain = {"norm_bias": a["norm"] == "layer", "post_norms": False, "window": 0, "sinks": False, "softcap": 0.0,
             "final_softcap": 0.0, "mla": "mla" in a}
    odd = [k for k, v in a.get("features", {}).items() if v != plain.get(k, v)]
    moe = a.get("moe") or {}
    odd += [f"moe {k}" for k in ("router_bias", "expert_bias") if moe.get(k)] + \
        (["moe groups"] if moe.get("groups", 1) > 1 and not _megatron_groups(moe) else []) + \
        ([f"moe activation {moe['activation']}"] if moe.get("activation", "swiglu") != "swiglu" else [])
    if odd:
        raise EngineRefusal("megatron", f"the model's {', '.join(odd)}: no Megatron-LM argument written for it yet")
    args = [("--num-layers", a["layers"]), ("--hidden-size", a["width"]), ("--num-attention-heads", a["heads"]),
            ("--kv-channels", a["head_dim"])]
    if a["kv_heads"] < a["heads"]:
        args += [("--group-query-attention", None), ("--num-query-groups", a["kv_heads"])]
    args.append(("--ffn-hidden-size", a["mlp_width"]))
    if a["gated"]:
        args.append(("--swiglu", None))
    args.append(("--normalization", "RMSNorm" if a["norm"] == "rms" else "LayerNorm"))
    args.append(("--position-embedding-type", "rope" if a["positions"] == "rotary" else "learned_absolute"))
    args += megatron_model_settings(a)
    args += [("--seq-length", a["sequence"]), ("--max-position-embeddings", a["max_positions"])]
    if not a["tied"]:
        args.append(("--untie-embeddings-and-output-weights", None))
    biases = a["biases"]
    if not any(biases.values()):
        args.append(("--disable-bias-linear", None))
    elif not biases["out"] and not biases["mlp"]:
        args += [("--disable-bias-linear", None), ("--add-qkv-bias", None)]
    elif not all(biases.values()):
        raise EngineRefusal("megatron", "Megatron-LM has biases on every linear layer or on none (or on the query, "
                                        "key and value projections alone): not on " +
                                        ", ".join(k for k, v in biases.items() if v) + " alone")
    if a["qk_norm"]:
        args.append(("--qk-layernorm", None))
    args += _megatron_mla(a)
    mtp = mtp_modules(a)
    if mtp:
        # DeepSeek-V3's multi-token prediction (megatron-core 0.16.1 multi_token_prediction.py):
        # each module's block built as the last decoder layer's (gpt_builders.py:72-92), on the
        # last pipeline stage beside the loss (mtp_on_this_rank, :447-488), as priced (the graph's
        # modules follow its head). Its loss weight (--mtp-loss-scaling-factor, default 0.1)
        # changes no cost: Megatron's default kept.
        args.append(("--mtp-num-layers", mtp))
    moe = a.get("moe")
    if moe:
        if moe["shared"] and moe.get("shared_gate"):
            raise EngineRefusal("megatron", "a gated shared expert has no Megatron-LM argument")
        # The tokens move between expert-parallel ranks by all-to-all, as priced (the MoE layer's
        # dispatch); megatron-core's default dispatcher (allgather) gathers every token instead.
        # Every expert's GEMMs as one grouped GEMM, as priced (the MoE layer's cost); without
        # --moe-grouped-gemm megatron-core runs the experts one after another (SequentialMLP).
        args += [("--num-experts", moe["experts"]), ("--moe-router-topk", moe["top_k"]),
                 ("--moe-ffn-hidden-size", moe["width"])] + megatron_dispatcher_arguments(plan) + \
            [("--moe-grouped-gemm", None)]
        if moe["shared"]:
            args.append(("--moe-shared-expert-intermediate-size", moe["shared"] * moe["shared_width"]))
        if moe["dense"]:
            dense = set(moe["dense"])
            args.append(("--moe-layer-freq", "[" + ",".join("0" if i in dense else "1"
                                                            for i in range(a["layers"])) + "]"))
        if moe["capacity"] is not None:
            args.append(("--moe-expert-capacity-factor", moe["capacity"]))
        args += _megatron_router(moe)
    # The vocabulary as priced: Megatron's null tokenizer has vocab-size + 1 entries (its
    # end-of-document token) and no padding beyond a multiple of tp (the plan's tp divides it).
    args += [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", a["vocab"] - 1),
             ("--make-vocab-size-divisible-by", 1), ("--bf16", None)]
    return args


def _megatron_groups(moe: dict) -> bool:
    """Whether Megatron-Core routes ``moe``'s groups as the model does: its group-limited top-k
    scores a group by the sum of its best ``top_k / group_top`` experts (megatron-core 0.16.1
    transformer/moe/moe_utils.py ``group_limited_topk``), DeepSeek-V3's ``noaux_tc`` by its best
    two; ``group_limited_greedy`` (DeepSeek-V2) by its best one."""
    router = moe.get("router") or {}
    return router.get("method") == "noaux_tc" and moe["top_k"] // moe["group_top"] == 2 \
        and moe["top_k"] % moe["group_top"] == 0


def _megatron_mla(a: dict) -> list:
    """Multi-latent attention as Megatron-Core builds it (``MLATransformerConfig``): the ranks and
    head widths, and ``--rope-type``: ``yarn`` where the graph declares YaRN (its factors written
    by :func:`megatron_model_settings`), else plain ``rope`` (megatron-core's default is YaRN)."""
    mla = a.get("mla")
    if not mla:
        return []
    args = [("--multi-latent-attention", None)]
    if mla["q_rank"]:  # none: the query's one projection (q_lora_rank None)
        args.append(("--q-lora-rank", mla["q_rank"]))
    args += [("--kv-lora-rank", mla["kv_rank"]), ("--qk-head-dim", mla["nope"]), ("--qk-pos-emb-head-dim", mla["rope"]),
             ("--v-head-dim", mla["value"]), ("--rope-type", "yarn" if yarn_of(a) else "rope")]
    return args


def _megatron_router(moe: dict) -> list:
    """The router's function as the model declares it (``MoEConfig.router``; none declared:
    Megatron's default, a softmax over the chosen experts' logits) in Megatron-Core's words
    (``moe_utils.topk_routing_with_score_function``: softmax over the top k, or before it with
    ``--moe-router-pre-softmax``, unnormalised; sigmoid scores normalised over the top k when
    k > 1; ``--moe-router-topk-scaling-factor``; ``--moe-router-enable-expert-bias``, the learnt
    score bias DeepSeek-V3's ``noaux_tc`` routes by)."""
    router = moe.get("router")
    if not router:
        return []
    args = []
    if router["score"] == "sigmoid":
        if not router["normalize"] and moe["top_k"] > 1:
            raise EngineRefusal("megatron", "Megatron-Core normalises sigmoid router scores over the top k: the "
                                            "model's are not (norm_topk_prob false)")
        args.append(("--moe-router-score-function", "sigmoid"))
    elif not router["normalize"]:
        args.append(("--moe-router-pre-softmax", None))
    if router["scale"] != 1.0:
        args.append(("--moe-router-topk-scaling-factor", router["scale"]))
    if router["method"] == "noaux_tc":
        args.append(("--moe-router-enable-expert-bias", None))
    if moe["groups"] > 1:
        args += [("--moe-router-num-groups", moe["groups"]), ("--moe-router-group-topk", moe["group_top"])]
    return args


def megatron_model_settings(a: dict) -> list:
    """The model's rotary base and scaling and its norms' epsilon as Megatron-LM arguments
    (megatron-core's ``GPTModel(rotary_base, rope_scaling, rope_scaling_factor)`` and
    ``TransformerConfig.layernorm_epsilon``): what changes the function built, not its cost.
    Refused where the graph does not declare them, or Megatron-Core cannot build them."""
    args = []
    if a["positions"] == "rotary":
        rope = a.get("rope")
        if rope is None:
            raise EngineRefusal("megatron", "the graph does not declare its rotary base (an hf: config of a Llama, "
                                            "Mistral or Qwen type, or a built-in decoder, does): Megatron-LM would "
                                            "build it with --rotary-base 10000")
        theta = rope["theta"]
        if theta != int(theta):
            raise EngineRefusal("megatron", f"Megatron-LM's --rotary-base is an integer, the model's is {theta}")
        args.append(("--rotary-base", int(theta)))
        scaling = rope["scaling"]
        if yarn_of(a):
            args += [(MEGATRON_YARN[k], int(v) if k == "original_max_position_embeddings" else float(v))
                     for k, v in sorted(scaling.items()) if k != "type"]
        elif scaling:
            if {k: v for k, v in scaling.items() if k != "factor"} != MEGATRON_ROPE_SCALING or "factor" not in scaling:
                raise EngineRefusal("megatron", "megatron-core scales rotary frequencies as Llama 3.1 does (low and "
                                                "high frequency factors 1 and 4, 8192 original positions; "
                                                f"--use-rope-scaling --rope-scaling-factor F), not as {scaling}")
            args += [("--use-rope-scaling", None), ("--rope-scaling-factor", float(scaling["factor"]))]
    if a.get("norm_eps") is None:
        raise EngineRefusal("megatron", "the graph does not declare its norms' epsilon: Megatron-LM would build it "
                                        "with --norm-epsilon 1e-5")
    return args + [("--norm-epsilon", float(a["norm_eps"]))]


#: Megatron-LM's arguments of each dispatcher (``EnginePlan.moe_dispatcher``): megatron-core 0.16.1
#: ``--moe-token-dispatcher-type``, and the flex dispatcher's backend (``--moe-flex-dispatcher-backend``,
#: which replaced the deprecated ``--moe-enable-deepep``, transformer_config.py:1063-1072).
MEGATRON_DISPATCHER = {
    "alltoall": (("--moe-token-dispatcher-type", "alltoall"),),
    "allgather": (("--moe-token-dispatcher-type", "allgather"),),
    "deepep": (("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")),
    "hybridep": (("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "hybridep")),
}


def megatron_dispatcher_arguments(plan: EnginePlan) -> list:
    """The token dispatcher and its overlaps as priced: :data:`MEGATRON_DISPATCHER`, then
    ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute`` (``ep_overlap``: the batch-level
    overlap; Megatron-Bridge's performance recipes set both, scripts/performance/utils/overrides.py)
    and ``--moe-shared-expert-overlap`` (``shared_overlap``)."""
    args = list(MEGATRON_DISPATCHER[plan.moe_dispatcher])
    if plan.ep_overlap:
        args += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
    if plan.shared_overlap:
        args.append(("--moe-shared-expert-overlap", None))
    return args


def _precision_arguments(plan: EnginePlan) -> list:
    """Transformer Engine's recipe for the plan's format (:data:`MEGATRON_PRECISION`; none for
    BF16): Megatron keeps the embedding and output layer out of it, as priced."""
    if plan.precision == "bf16":
        return []
    recipe, gather = MEGATRON_PRECISION[plan.precision_word]
    return list(recipe) + ([(gather, None)] if plan.fp8_gather else [])


def _parallel_arguments(plan: EnginePlan) -> list:
    args = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp),
            ("--context-parallel-size", plan.cp)]
    if plan.ep > 1:  # the experts split tp ways as priced, or etp ways under MoE parallel folding
        args += [("--expert-model-parallel-size", plan.ep), ("--expert-tensor-parallel-size", plan.expert_tp)]
    if plan.sp:
        args.append(("--sequence-parallel", None))
    args += [("--micro-batch-size", plan.microbatch), ("--global-batch-size", plan.batch)]
    if plan.zero == 1:
        args.append(("--use-distributed-optimizer", None))
    elif plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        args += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", strategy),
                 ("--use-distributed-optimizer", None), ("--no-gradient-accumulation-fusion", None),
                 ("--ckpt-format", "fsdp_dtensor")]
    if plan.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    elif plan.recompute == "block":  # the first N layers of each stage (each model chunk) recomputed whole
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                 ("--recompute-num-layers", plan.recompute_layers)]
    elif plan.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        modules = tuple(getattr(plan, "recompute_modules", ("core_attn",)))
        if modules != ("core_attn",):  # Megatron's default, written only where the plan differs
            args.append(("--recompute-modules", list(modules)))
    if plan.tp_overlap and plan.tp > 1:
        args.append(("--tp-comm-overlap", None))
    if plan.overlap:
        args.append(("--overlap-grad-reduce", None))
        if plan.zero >= 1:
            args.append(("--overlap-param-gather", None))
    if plan.pp > 1:
        args += megatron_pipeline_arguments(plan)
    return args + megatron_offload_arguments(plan)


def megatron_offload_arguments(plan: EnginePlan) -> list:
    """Megatron-Core 0.16.1's offload as priced: the whole optimizer on the CPU with its copies
    overlapped (``--optimizer-cpu-offload --optimizer-offload-fraction 1.0
    --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer``, the recommended set of
    megatron/core/optimizer/cpu_offloading/README.md; arguments.py:2059-2066); the stored
    activations of every layer but the last (``--cpu-offloading-num-layers``: fewer than the
    layers, no pipeline, no recomputation: transformer_config.py:1137-1152)."""
    args = []
    if "optimizer" in plan.offload:
        args += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", 1.0),
                 ("--overlap-cpu-optimizer-d2h-h2d", None), ("--use-precision-aware-optimizer", None)]
    if "activations" in plan.offload:
        layers = (plan.architecture or {}).get("layers")
        if not layers or layers < 2:
            raise EngineRefusal("megatron", "--cpu-offloading-num-layers needs the model's layer count (a graph "
                                            "that declares its shape, two layers at least)")
        args.append(("--cpu-offloading-num-layers", layers - 1))
    return args


def megatron_pipeline_arguments(plan: EnginePlan) -> list:
    """Megatron-LM's pipeline arguments of a plan's stages (``counts``), chunks (``vpp``) and
    ``pipeline_extra``: with the embedding and/or the loss counted as layers and the stages
    Megatron's even split of them (:func:`~pase.planning.pipeline.unit_split`),
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` (and
    ``--num-layers-per-virtual-pipeline-stage`` in those units, megatron/training/arguments.py
    counts them so); equal stages, the layers per chunk; chunks of two sizes, middle stages of
    different sizes or another split with extras, the explicit ``--pipeline-model-parallel-layout``;
    else the first and last stages' layer counts."""
    extra = extra_units(plan.pipeline_extra)
    units = sum(plan.counts) + sum(extra)
    if sum(extra) and tuple(plan.counts) == unit_split(sum(plan.counts), plan.pp, extra, plan.vpp):
        args = [(flag, None) for flag, on in (("--account-for-embedding-in-pipeline-split", extra[0]),
                                              ("--account-for-loss-in-pipeline-split", extra[1])) if on]
        if plan.vpp > 1:
            args.append(("--num-layers-per-virtual-pipeline-stage", units // (plan.pp * plan.vpp)))
        return args
    if plan.vpp > 1 and len(set(plan.counts)) == 1 and not sum(extra):
        return [("--num-layers-per-virtual-pipeline-stage", plan.counts[0] // plan.vpp)]
    if plan.vpp > 1 or len(set(plan.counts[1:-1])) > 1 or sum(extra):
        # Chunks of two sizes, middle stages of different sizes, or the embedding or loss in a
        # chunk of their own: Megatron-LM's explicit layout says every model chunk (megatron-core's
        # PipelineParallelLayerLayout).
        return [("--pipeline-model-parallel-layout",
                 megatron_layout(plan.counts, plan.vpp, extra, mtp_modules(plan.architecture)))]
    if len(set(plan.counts)) > 1:
        args = [("--decoder-first-pipeline-num-layers", plan.counts[0])]
        if plan.pp > 2:
            args.append(("--decoder-last-pipeline-num-layers", plan.counts[-1]))
        return args
    return []


def mtp_modules(a: dict | None) -> int:
    """The multi-token-prediction modules the graph declares (``--mtp``; 0 without)."""
    return int(((a or {}).get("features") or {}).get("mtp") or 0)


def megatron_layout(counts, vpp: int = 1, extra=(0, 0), mtp: int = 0) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` of blocks per pipeline stage (in
    ``vpp`` interleaved chunks each, :func:`pase.planning.pipeline.virtual_order`, the embedding
    and the loss counted in them where ``extra`` says): model chunks in the model's order split
    by ``|`` (chunk ``j`` on stage ``j mod pp``), ``t*N`` for N transformer layers, the embedding
    ``E`` before the first chunk's layers and the loss (output layer) ``L`` after the last
    chunk's, as priced (a chunk of neither layers holds one of them alone), ``mtp``
    multi-token-prediction modules ``m`` just before the loss, in its chunk, as priced.

    >>> megatron_layout((7, 8, 10, 7))
    'Et*7|t*8|t*10|t*7L'
    >>> megatron_layout((3, 4), 2)
    'Et*1|t*2|t*2|t*2L'
    >>> megatron_layout((1, 2, 1), 2, (1, 1))
    'E|t*1|t*1|t*1|t*1|L'
    >>> megatron_layout((4, 4, 1), mtp=1)
    'Et*4|t*4|t*1mL'
    """
    return "E" + "|".join(f"t*{c}" if c else "" for c in virtual_order(counts, vpp, extra)) + "m" * mtp + "L"


def megatron_settings(plan, per_node: int | None = None, profile=None) -> dict:
    """Megatron-LM's ``pretrain_gpt.py`` arguments for the plan (a ``TrainingPlan`` or an
    ``EnginePlan``: :func:`engine_view`), the model's own included: ``arguments`` (flag ->
    value, ``True`` for a switch), ``command_line``, ``launch``, ``data_parallel_size`` (what
    Megatron derives: ``p / (tp pp cp)``)."""
    plan, per_node, profile = engine_view(plan, "megatron", per_node, profile)
    check_runs("megatron", plan, profile)
    args = _model_arguments(plan) + _precision_arguments(plan) + _parallel_arguments(plan)
    if setting(profile, "grad_reduce") == "bf16":
        args.append(("--grad-reduce-in-bf16", None))  # the profile's switch, priced
    # Values quoted for the shell: a layout has | and *, a list value [ ] (shell patterns); a
    # list (--recompute-modules, nargs "+") one word each.
    line = " ".join(flag if value is None else f"{flag} {' '.join(shlex.quote(str(v)) for v in value)}"
                    if isinstance(value, list) else f"{flag} {shlex.quote(str(value))}" for flag, value in args)
    return {"engine": "megatron-lm", "arguments": {flag: (True if value is None else value) for flag, value in args},
            "command_line": line, "launch": f"{torchrun(plan, per_node)} pretrain_gpt.py {line} --data-path DATA",
            "data_parallel_size": plan.dp, "recipe": plan.recipe}


# ---------------------------------------------------------------------------------------
# DeepSpeed

def deepspeed_settings(plan, path: str = "ds_config.json", per_node: int | None = None, profile=None) -> dict:
    """DeepSpeed's ``ds_config.json`` for the plan (``config``; a ``TrainingPlan`` or an
    ``EnginePlan``: :func:`engine_view`): the ZeRO stage, the batch (``train_batch_size =
    micro-batch x accumulation x dp``), bf16; ZeRO-3 keeps no parameter unsharded
    (``stage3_param_persistence_threshold`` 0), as priced. ``command_line`` is the training
    script's DeepSpeed arguments; ``launch`` runs it."""
    plan, per_node, profile = engine_view(plan, "deepspeed", per_node, profile)
    check_runs("deepspeed", plan, profile)
    zero = {"stage": plan.zero, "overlap_comm": plan.overlap}
    if plan.zero == 3:
        zero["stage3_param_persistence_threshold"] = 0
    for kind, key in (("optimizer", "offload_optimizer"), ("nvme", "offload_optimizer"), ("params", "offload_param")):
        if kind in plan.offload:  # DeepSpeed's offload (offload_config.py:21-62): a drive's path is the user's
            zero[key] = {"device": "nvme" if kind == "nvme" else "cpu", "pin_memory": True}
            if kind == "nvme":
                zero[key]["nvme_path"] = "/local_nvme"
    config = {"train_batch_size": plan.batch, "train_micro_batch_size_per_gpu": plan.microbatch,
              "gradient_accumulation_steps": plan.microbatches, "zero_optimization": zero,
              "bf16": {"enabled": True}}
    if setting(profile, "communication_data_type") == "fp32":
        config["communication_data_type"] = "fp32"  # the profile's switch, priced
    line = f"--deepspeed --deepspeed_config {path}"
    per_node = min(plan.procs, per_node)
    launch = (f"deepspeed --num_nodes {-(-plan.procs // per_node)} --num_gpus {per_node} TRAIN_SCRIPT.py {line}")
    return {"engine": "deepspeed", "config": config, "command_line": line, "launch": launch, "recipe": plan.recipe}


#: Engine name -> writer.
WRITERS = {"torchtitan": torchtitan_settings, "megatron": megatron_settings, "deepspeed": deepspeed_settings}
