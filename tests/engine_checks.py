"""The engines' own configuration code, run on the exports (shared by the engine tests).

Each ``*_accepts`` hands an export to the engine's own classes and returns what they made of
it; each skips the test cleanly when the engine's package is not installed (the ``engines``
extra: ``pip install '.[engines]'``).

- torchtitan (:func:`titan_run`): its ``ConfigManager`` and ``ParallelDims`` run in a process of
  their own (``tests/titan_check.py``), so that 0.3 (the launch scripts: the exact arguments of
  ``-m torchtitan.train``) and 0.2 (the TOML job files) are both checked from one test run.
  The interpreter is ``PASE_TORCHTITAN_PYTHON`` (else this one); ``PASE_TORCHTITAN_0_3`` and
  ``PASE_TORCHTITAN_0_2`` name folders put first on its path for each release (``.ci/run``
  installs 0.3 in its environment and 0.2.2 into a ``--target`` folder). A release that is not
  found skips the test.
- megatron-core (``TransformerConfig``, ``DistributedDataParallelConfig``, ``OptimizerConfig``):
  imports on a CPU. Megatron-LM's own argument parser (``megatron/training/arguments.py``) is
  not in the megatron-core package: every exported flag must be the flag of one of those
  classes' fields (``--`` + its name, or the ``arg_names`` it states), its value of the field's
  type, or be in :data:`MEGATRON_LM_ONLY` (the parser's own names, each with the reason); the
  arguments are then mapped onto the fields as Megatron-LM's ``core_transformer_config_from_args``
  does, and the vocabulary built by megatron-core's ``build_tokenizer``.
- DeepSpeed (``deepspeed.runtime.config.DeepSpeedConfig``): its data-parallel size is given by a
  model-parallel unit (``mpu.get_data_parallel_world_size``), DeepSpeed's own interface for it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import typing
import warnings

import pytest


def _need(module: str, package: str):
    try:
        found = module in sys.modules or importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        found = False
    if not found:
        pytest.skip(f"{package} is not installed (pip install '.[engines]')")


TITAN_CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "titan_check.py")


def titan_run(jobs: list, release: str) -> list:
    """``tests/titan_check.py``'s results for ``jobs`` under torchtitan ``release`` (``"0.3"`` or
    ``"0.2"``), or a skip when that release is not found."""
    python = os.environ.get("PASE_TORCHTITAN_PYTHON") or sys.executable
    folder = os.environ.get(f"PASE_TORCHTITAN_{release.replace('.', '_')}")
    env = dict(os.environ)
    if folder:
        env["PYTHONPATH"] = os.pathsep.join([folder] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('torchtitan'))"],
                           env=env, capture_output=True, text=True)
    found = probe.stdout.strip()
    if probe.returncode or not found.startswith(release + "."):
        pytest.skip(f"torchtitan {release} is not found (found: {found or 'none'}): install it, or point "
                    f"PASE_TORCHTITAN_{release.replace('.', '_')} at a folder that has it (.ci/run does)")
    done = subprocess.run([python, TITAN_CHECK], input=json.dumps(jobs), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def titan_launch(script: str, procs: int) -> dict:
    """torchtitan 0.3's reading of a launch script for ``procs`` ranks (its ConfigManager on the
    exact arguments of ``-m torchtitan.train``, then ParallelDims); asserts it accepted them."""
    result = titan_run([{"kind": "launch", "script": script, "world": procs}], "0.3")[0]
    assert result["ok"], result["error"]
    return result


def titan_accepts(toml_path, command_line: str, procs: int) -> dict:
    """torchtitan 0.2's job config of the TOML (its ConfigManager), the same parsed from the
    command line, its degrees accepted by its ParallelDims for ``procs`` ranks."""
    result = titan_run([{"kind": "toml", "path": str(toml_path), "command_line": command_line, "world": procs}],
                       "0.2")[0]
    assert result["ok"], result["error"]
    assert result["command_line_agrees"], "the command line differs from the TOML"
    dims, p = result["dims"], result["parallelism"]
    # torchtitan's parallelize functions (llama3, deepseek_v3): "DDP has not supported > 1D parallelism".
    assert not (dims["dp_replicate"] > 1 and dims["dp_shard"] == 1 and dims["cp"] == 1
                and (dims["tp"] > 1 or dims["pp"] > 1 or dims["ep"] > 1))
    # Its pipeline code: local_batch_size must divide into micro-batches of pipeline_parallel_microbatch_size.
    assert result["training"]["local_batch_size"] % p["pipeline_parallel_microbatch_size"] == 0
    return result


def megatron_modules():
    _need("megatron.core", "megatron-core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig, DistributedDataParallelConfig, OptimizerConfig


#: Flags of Megatron-LM's own parser (``megatron/training/arguments.py``, which the
#: megatron-core package does not ship) under a name no megatron-core configuration field
#: states: flag -> (what checks its value: a megatron-core field or constructor argument
#: ``(owner, name)`` whose type the value must fit, else the value's type or its choices;
#: why the name is Megatron-LM's alone). megatron-core 0.16 ships no generator of the
#: parser either (no ``argparse_meta`` reader in the package): a field's flag is taken as
#: Megatron-LM's ``ArgumentGroupFactory`` makes it, ``--`` + the field name with ``-`` for
#: ``_``, or the ``argparse_meta`` ``arg_names`` the field states.
MEGATRON_LM_ONLY = {
    "--micro-batch-size": (int, "the training loop's batch; megatron-core takes it as an argument of "
                                "init_num_microbatches_calculator, in no configuration class"),
    "--global-batch-size": (int, "the same as --micro-batch-size"),
    "--seq-length": (int, "the data's sequence length (megatron-core's GPTDatasetConfig.sequence_length, a dataset "
                          "setting Megatron-LM names --seq-length)"),
    "--max-position-embeddings": (("GPTModel", "max_sequence_length"), "an argument of GPTModel's constructor, in no "
                                                                       "configuration class"),
    "--position-embedding-type": (("GPTModel", "position_embedding_type"), "the same"),
    "--untie-embeddings-and-output-weights": (bool, "Megatron-LM's switch for GPTModel("
                                                    "share_embeddings_and_output_weights=False)"),
    "--tokenizer-type": (str, "read by megatron-core's build_tokenizer(args), which has no configuration class: the "
                              "value is checked by building the tokenizer (megatron_tokenizer_vocabulary)"),
    "--vocab-size": (int, "the same (the null tokenizer's size)"),
    "--make-vocab-size-divisible-by": (int, "Megatron-LM's vocabulary padding (_vocab_size_with_padding), not in "
                                            "megatron-core"),
    "--rotary-base": (("GPTModel", "rotary_base"), "an argument of GPTModel's constructor, in no configuration "
                                                   "class"),
    "--use-rope-scaling": (bool, "Megatron-LM's switch for GPTModel(rope_scaling=True), Llama 3.1's frequency "
                                 "scaling"),
    "--rope-scaling-factor": (("GPTModel", "rope_scaling_factor"), "an argument of GPTModel's constructor"),
    "--swiglu": (bool, "Megatron-LM's switch for two fields at once: gated_linear_unit and activation_func = silu"),
    "--group-query-attention": (bool, "Megatron-LM reads --num-query-groups only with it; megatron-core has the "
                                      "group count alone"),
    "--num-experts": (("TransformerConfig", "num_moe_experts"), "Megatron-LM's name for num_moe_experts (the field "
                                                                "states no arg_names)"),
    "--num-layers-per-virtual-pipeline-stage": (int, "Megatron-LM derives virtual_pipeline_model_parallel_size = "
                                                     "num_layers / (pp x this)"),
    "--decoder-first-pipeline-num-layers": (("TransformerConfig", "num_layers_in_first_pipeline_stage"),
                                            "Megatron-LM's name for the field (it states no arg_names)"),
    "--decoder-last-pipeline-num-layers": (("TransformerConfig", "num_layers_in_last_pipeline_stage"),
                                           "the same"),
    "--no-gradient-accumulation-fusion": (bool, "Megatron-LM fuses by default and names the negation; the field "
                                                "gradient_accumulation_fusion defaults to off"),
    "--ckpt-format": (("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"),
                      "the training loop's checkpoint format (these choices are Megatron-LM's parser's, not in "
                      "megatron-core); under Megatron FSDP megatron-core's DistributedOptimizer saves only "
                      "fsdp_dtensor (sharded_state_dict)"),
    "--grad-reduce-in-bf16": (bool, "Megatron-LM's switch for DistributedDataParallelConfig.grad_reduce_in_fp32 = "
                                    "False"),
}


def megatron_flag_fields() -> dict:
    """Megatron-LM flag -> ``[(owner, field, type, default, named)]`` of every field of
    megatron-core's TransformerConfig (with ModelParallelConfig), DistributedDataParallelConfig
    and OptimizerConfig (``named``: the field states its flag in ``arg_names``)."""
    import dataclasses

    flags: dict = {}
    base = {f.name for f in dataclasses.fields(megatron_modules()[0])}
    mla = megatron_mla_config()
    for cls in megatron_modules() + (mla,):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if cls is mla and f.name in base:
                continue  # MLATransformerConfig's own fields only (its defaults of the others differ)
            stated = f.metadata.get("argparse_meta", {}).get("arg_names")
            for flag in stated or ["--" + f.name.replace("_", "-")]:
                flags.setdefault(flag, []).append((cls.__name__, f.name, hints[f.name], f.default, bool(stated)))
    return flags


def megatron_mla_config():
    """megatron-core's ``MLATransformerConfig`` (the configuration of multi-latent attention)."""
    megatron_modules()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import MLATransformerConfig
    return MLATransformerConfig


def _fits(hint, value) -> bool:
    """Whether an exported value (``True`` for a switch) is one a field of type ``hint`` takes
    from Megatron-LM's command line."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return value is True  # a switch: written without a value
    if origin is typing.Literal:
        return value in args
    if origin is typing.Union or (origin is not None and origin.__name__ == "UnionType"):
        return any(_fits(a, value) for a in args if a is not type(None))
    if origin is list:
        # Megatron-LM evaluates a list value written as text ("[0,1,1]", --moe-layer-freq).
        import json

        try:
            items = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return False
        return isinstance(items, list) and all(_fits(args[0], v) for v in items)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return False


def megatron_flag_problems(arguments: dict) -> list:
    """What is wrong with exported ``pretrain_gpt.py`` arguments against megatron-core's field
    names and types (:func:`megatron_flag_fields`) and :data:`MEGATRON_LM_ONLY`: one line per
    flag that names no field and is not in the list, or whose value the field's type (or the
    list's) does not take. Empty: every flag checked."""
    fields = megatron_flag_fields()
    # A field Megatron-LM names otherwise (MEGATRON_LM_ONLY) has no flag of its own name there.
    renamed = {"--" + home[1].replace("_", "-"): flag for flag, (home, _) in MEGATRON_LM_ONLY.items()
               if isinstance(home, tuple) and home[0] == "TransformerConfig"}
    problems = []
    for flag, value in arguments.items():
        if flag in renamed:
            problems.append(f"{flag}: Megatron-LM names this field {renamed[flag]}")
        elif flag in fields:
            for owner, name, hint, default, named in fields[flag]:
                if not _fits(hint, value):
                    problems.append(f"{flag} {value!r}: {owner}.{name} is {hint}")
                elif hint is bool and default is True and not named:
                    problems.append(f"{flag}: {owner}.{name} is on by default, the switch changes nothing")
        elif flag in MEGATRON_LM_ONLY:
            home = MEGATRON_LM_ONLY[flag][0]
            if isinstance(home, tuple) and len(home) == 2 and home[0] in ("GPTModel", "TransformerConfig"):
                owner, name = home
                hint = typing.get_type_hints(_megatron_owner(owner).__init__ if owner == "GPTModel"
                                             else _megatron_owner(owner))[name]
            elif isinstance(home, tuple):
                hint = typing.Literal[home]
            else:
                hint = home
            if not _fits(hint, value):
                problems.append(f"{flag} {value!r}: Megatron-LM's argument takes {hint}")
        else:
            problems.append(f"{flag}: no megatron-core field has this flag, and it is not in MEGATRON_LM_ONLY")
    return problems


def _megatron_owner(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "GPTModel":
            from megatron.core.models.gpt.gpt_model import GPTModel

            return GPTModel
    return dict(zip(("TransformerConfig", "DistributedDataParallelConfig", "OptimizerConfig"),
                    megatron_modules()))[name]


def megatron_tokenizer_vocabulary(arguments: dict, tp: int) -> int:
    """The vocabulary Megatron-LM builds the model with from the exported arguments: the
    tokenizer megatron-core's ``build_tokenizer`` makes of ``--tokenizer-type`` and
    ``--vocab-size`` (the null tokenizer adds its end-of-document token), padded as Megatron-LM's
    ``_vocab_size_with_padding`` does: up to a multiple of ``--make-vocab-size-divisible-by``
    x tp (that padding is Megatron-LM's, not megatron-core's: written out here)."""
    from types import SimpleNamespace

    _need("megatron.core", "megatron-core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer

        tokenizer = build_tokenizer(SimpleNamespace(tokenizer_type=arguments["--tokenizer-type"],
                                                    vocab_size=arguments["--vocab-size"]))
    multiple = arguments["--make-vocab-size-divisible-by"] * tp
    return -(-tokenizer.vocab_size // multiple) * multiple


def _int(args: dict, flag: str, default=None):
    return int(args[flag]) if flag in args else default


def megatron_accepts(arguments: dict, procs: int) -> tuple:
    """Megatron-Core's configurations built from exported ``pretrain_gpt.py`` arguments (their
    ``__post_init__`` validation runs): ``(TransformerConfig, DDP config, OptimizerConfig)``."""
    import torch

    TransformerConfig, DDPConfig, OptimizerConfig = megatron_modules()
    a = arguments
    problems = megatron_flag_problems(a)
    assert not problems, "; ".join(problems)
    tp, pp, cp = (_int(a, f"--{n}-parallel-size", 1) for n in ("tensor-model", "pipeline-model", "context"))
    layers = _int(a, "--num-layers")
    chunk = _int(a, "--num-layers-per-virtual-pipeline-stage")
    # Megatron-LM counts the embedding and the loss in the chunk's layers when it accounts for them.
    extras = int(bool(a.get("--account-for-embedding-in-pipeline-split"))) + \
        int(bool(a.get("--account-for-loss-in-pipeline-split")))
    fields = dict(
        num_layers=layers, hidden_size=_int(a, "--hidden-size"), num_attention_heads=_int(a, "--num-attention-heads"),
        kv_channels=_int(a, "--kv-channels"), num_query_groups=_int(a, "--num-query-groups"),
        ffn_hidden_size=_int(a, "--ffn-hidden-size"), gated_linear_unit=bool(a.get("--swiglu")),
        normalization=a.get("--normalization", "LayerNorm"), add_bias_linear=not a.get("--disable-bias-linear"),
        add_qkv_bias=bool(a.get("--add-qkv-bias")), qk_layernorm=bool(a.get("--qk-layernorm")),
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
        sequence_parallel=bool(a.get("--sequence-parallel")), tp_comm_overlap=bool(a.get("--tp-comm-overlap")),
        expert_model_parallel_size=_int(a, "--expert-model-parallel-size", 1),
        expert_tensor_parallel_size=_int(a, "--expert-tensor-parallel-size"),
        num_moe_experts=_int(a, "--num-experts"), moe_router_topk=_int(a, "--moe-router-topk", 2),
        moe_ffn_hidden_size=_int(a, "--moe-ffn-hidden-size"),
        moe_shared_expert_intermediate_size=_int(a, "--moe-shared-expert-intermediate-size"),
        recompute_granularity=a.get("--recompute-granularity"), recompute_method=a.get("--recompute-method"),
        recompute_num_layers=_int(a, "--recompute-num-layers"),
        recompute_modules=list(a["--recompute-modules"]) if "--recompute-modules" in a else None,
        virtual_pipeline_model_parallel_size=None if chunk is None else (layers + extras) // (pp * chunk),
        account_for_embedding_in_pipeline_split=bool(a.get("--account-for-embedding-in-pipeline-split")),
        account_for_loss_in_pipeline_split=bool(a.get("--account-for-loss-in-pipeline-split")),
        num_layers_in_first_pipeline_stage=_int(a, "--decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=_int(a, "--decoder-last-pipeline-num-layers"),
        pipeline_model_parallel_layout=a.get("--pipeline-model-parallel-layout"),
        bf16=bool(a.get("--bf16")), params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        # Megatron-LM's --fp8-format / --fp4-format and their recipes; --fp8-param-gather is
        # DistributedDataParallelConfig.fp8_param_gather, which Megatron-LM also sets fp8_param from.
        fp8=a.get("--fp8-format"), fp8_recipe=a.get("--fp8-recipe"), fp8_param=bool(a.get("--fp8-param-gather")),
        fp4=a.get("--fp4-format"), fp4_recipe=a.get("--fp4-recipe"), fp4_param=bool(a.get("--fp4-param-gather")),
        layernorm_epsilon=a.get("--norm-epsilon"), moe_grouped_gemm=bool(a.get("--moe-grouped-gemm")),
        moe_router_score_function=a.get("--moe-router-score-function"),
        moe_router_topk_scaling_factor=a.get("--moe-router-topk-scaling-factor"),
        moe_router_enable_expert_bias=bool(a.get("--moe-router-enable-expert-bias")),
        moe_router_pre_softmax=bool(a.get("--moe-router-pre-softmax")),
        moe_router_num_groups=_int(a, "--moe-router-num-groups"), moe_router_group_topk=_int(a, "--moe-router-group-topk"),
        mtp_num_layers=_int(a, "--mtp-num-layers"),
    )
    mla = bool(a.get("--multi-latent-attention"))
    if mla:  # Megatron-LM builds MLATransformerConfig; an absent --q-lora-rank is None (one projection)
        fields.update(q_lora_rank=_int(a, "--q-lora-rank"), kv_lora_rank=_int(a, "--kv-lora-rank"),
                      qk_head_dim=_int(a, "--qk-head-dim"), qk_pos_emb_head_dim=_int(a, "--qk-pos-emb-head-dim"),
                      v_head_dim=_int(a, "--v-head-dim"), rope_type=a.get("--rope-type"),
                      rotary_base=a.get("--rotary-base"), rotary_scaling_factor=a.get("--rotary-scaling-factor"),
                      original_max_position_embeddings=_int(a, "--original-max-position-embeddings"),
                      beta_fast=a.get("--beta-fast"), beta_slow=a.get("--beta-slow"), mscale=a.get("--mscale"),
                      mscale_all_dim=a.get("--mscale-all-dim"))
    # TransformerConfig declares its formats and recipes as Literal choices but does not check them.
    hints = typing.get_type_hints(TransformerConfig)
    for name in ("fp8", "fp8_recipe", "fp4", "fp4_recipe"):
        if fields[name] is not None:
            choices = [c for arg in typing.get_args(hints[name]) for c in typing.get_args(arg)]
            assert fields[name] in choices, f"{name} {fields[name]!r} is not one of Megatron-Core's {choices}"
    if fields["gated_linear_unit"]:
        fields["activation_func"] = torch.nn.functional.silu
    if "--moe-expert-capacity-factor" in a:
        fields["moe_expert_capacity_factor"] = float(a["--moe-expert-capacity-factor"])
    fields["moe_token_dispatcher_type"] = a.get("--moe-token-dispatcher-type")
    fields["moe_flex_dispatcher_backend"] = a.get("--moe-flex-dispatcher-backend")
    for flag in ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-shared-expert-overlap"):
        if a.get(flag):
            fields[flag[2:].replace("-", "_")] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = {k: v for k, v in fields.items() if v is not None or (mla and k == "q_lora_rank")}
        config = (megatron_mla_config() if mla else TransformerConfig)(**kept)
        fsdp = bool(a.get("--use-megatron-fsdp"))
        ddp = DDPConfig(use_distributed_optimizer=bool(a.get("--use-distributed-optimizer")),
                        overlap_grad_reduce=bool(a.get("--overlap-grad-reduce")),
                        overlap_param_gather=bool(a.get("--overlap-param-gather")), use_megatron_fsdp=fsdp,
                        fp8_param_gather=bool(a.get("--fp8-param-gather")),
                        data_parallel_sharding_strategy=a.get("--data-parallel-sharding-strategy", "no_shard"))
        optimizer = OptimizerConfig(optimizer="adam", bf16=True,
                                    use_distributed_optimizer=bool(a.get("--use-distributed-optimizer")),
                                    fp8_recipe=a.get("--fp8-recipe") if "--fp8-format" in a else None)
    megatron_microbatches(a, procs)
    return config, ddp, optimizer


def megatron_microbatches(arguments: dict, procs: int) -> int:
    """The micro-batches of a step as megatron-core's own calculator counts them for the
    exported batch arguments (Megatron-LM's training loop sets it up so: global batch, micro
    batch, data-parallel size ``procs / (tp pp cp)``); it refuses a global batch that is not
    whole micro-batches of every data-parallel rank."""
    megatron_modules()
    from megatron.core import num_microbatches_calculator as calculator

    a = arguments
    model = _int(a, "--tensor-model-parallel-size", 1) * _int(a, "--pipeline-model-parallel-size", 1) * \
        _int(a, "--context-parallel-size", 1)
    dp = procs // model
    assert dp * model == procs
    calculator.init_num_microbatches_calculator(0, None, _int(a, "--global-batch-size"), _int(a, "--micro-batch-size"),
                                                dp)
    try:
        return calculator.get_num_microbatches()
    finally:
        calculator.unset_num_microbatches_calculator()


def deepspeed_accepts(config: dict, dp: int, monkeypatch):
    """DeepSpeed's DeepSpeedConfig of the JSON for ``dp`` data-parallel ranks."""
    _need("deepspeed", "deepspeed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import deepspeed.runtime.config as ds_config

    class DataParallelUnit:  # DeepSpeed's model-parallel-unit interface (mpu)
        def get_data_parallel_world_size(self):
            return dp

        def get_model_parallel_world_size(self):
            return 1

    # No process group here: DeepSpeed asks for the rank before it asks the mpu for dp.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    return ds_config.DeepSpeedConfig(config, mpu=DataParallelUnit())
