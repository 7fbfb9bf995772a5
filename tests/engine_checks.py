"""The engines' own configuration code, run on the exports (shared by the engine tests).

Each ``*_accepts`` hands an export to the engine's own classes and returns what they made of
it; each skips the test cleanly when the engine's package is not installed (the ``engines``
extra: ``pip install '.[engines]'``).

- torchtitan 0.2 (``torchtitan.config.ConfigManager``, ``torchtitan.distributed.parallel_dims
  .ParallelDims``): its package ``__init__`` imports its Float8/MoE kernels (triton, a GPU
  compiler), so the package is entered without running that ``__init__``; the two modules
  used import torch only.
- megatron-core (``TransformerConfig``, ``DistributedDataParallelConfig``, ``OptimizerConfig``):
  imports on a CPU. Megatron-LM's own argument parser (``megatron/training/arguments.py``) is
  not in the megatron-core package: the arguments are mapped onto the configuration fields as
  Megatron-LM's ``core_transformer_config_from_args`` does (same names, the few renames below).
- DeepSpeed (``deepspeed.runtime.config.DeepSpeedConfig``): its data-parallel size is given by a
  model-parallel unit (``mpu.get_data_parallel_world_size``), DeepSpeed's own interface for it.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
import types
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


def titan_modules():
    """``(ConfigManager, ParallelDims)`` of torchtitan, or a skip."""
    _need("torchtitan", "torchtitan")
    if "torchtitan.config" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if "torchtitan" not in sys.modules:
            package = types.ModuleType("torchtitan")  # its modules, without its __init__'s kernel imports
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules["torchtitan"] = package
    try:
        from torchtitan.config import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError as err:
        pytest.skip(f"torchtitan's configuration code does not import here: {err}")
    if not hasattr(ConfigManager, "_maybe_load_toml"):
        pytest.skip("this torchtitan reads no TOML job files (0.3 and later): the export is for 0.2")
    return ConfigManager, ParallelDims


def titan_accepts(toml_path: str, command_line: str, procs: int):
    """torchtitan's job config of the TOML (its ConfigManager), checked against the same
    parsed from the command line, its degrees accepted by its ParallelDims for ``procs``
    ranks. Returns the job config."""
    ConfigManager, ParallelDims = titan_modules()
    config = ConfigManager().parse_args(["--job.config_file", str(toml_path)])
    from_line = ConfigManager().parse_args(shlex.split(command_line))
    for section in ("parallelism", "training", "activation_checkpoint", "model", "quantize.linear.float8",
                    "quantize.linear.mx"):
        a, b = config, from_line
        for name in section.split("."):
            a, b = getattr(a, name), getattr(b, name)
        a, b = vars(a), vars(b)
        differ = {k for k in a if a[k] != b[k] and k != "module_fqns_per_model_part"}
        assert not differ, f"{section}: the command line differs from the TOML in {differ}"
    p = config.parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=procs)
    # torchtitan's parallelize functions (llama3, deepseek_v3): "DDP has not supported > 1D parallelism".
    assert not (dims.dp_replicate > 1 and dims.dp_shard == 1 and dims.cp == 1
                and (dims.tp > 1 or dims.pp > 1 or dims.ep > 1))
    # Its pipeline code: local_batch_size must divide into micro-batches of pipeline_parallel_microbatch_size.
    assert config.training.local_batch_size % p.pipeline_parallel_microbatch_size == 0
    return config


def megatron_modules():
    _need("megatron.core", "megatron-core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig, DistributedDataParallelConfig, OptimizerConfig


def _int(args: dict, flag: str, default=None):
    return int(args[flag]) if flag in args else default


def megatron_accepts(arguments: dict, procs: int) -> tuple:
    """Megatron-Core's configurations built from exported ``pretrain_gpt.py`` arguments (their
    ``__post_init__`` validation runs): ``(TransformerConfig, DDP config, OptimizerConfig)``."""
    import torch

    TransformerConfig, DDPConfig, OptimizerConfig = megatron_modules()
    a = arguments
    tp, pp, cp = (_int(a, f"--{n}-parallel-size", 1) for n in ("tensor-model", "pipeline-model", "context"))
    layers = _int(a, "--num-layers")
    chunk = _int(a, "--num-layers-per-virtual-pipeline-stage")
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
        virtual_pipeline_model_parallel_size=None if chunk is None else layers // (pp * chunk),
        num_layers_in_first_pipeline_stage=_int(a, "--decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=_int(a, "--decoder-last-pipeline-num-layers"),
        bf16=bool(a.get("--bf16")), params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        # Megatron-LM's --fp8-format / --fp4-format and their recipes; --fp8-param-gather is fp8_param.
        fp8=a.get("--fp8-format"), fp8_recipe=a.get("--fp8-recipe"), fp8_param=bool(a.get("--fp8-param-gather")),
        fp4=a.get("--fp4-format"), fp4_recipe=a.get("--fp4-recipe"), fp4_param=bool(a.get("--fp4-param-gather")),
    )
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
        fields["moe_token_dispatcher_type"] = "alltoall"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(**{k: v for k, v in fields.items() if v is not None})
        fsdp = bool(a.get("--use-megatron-fsdp"))
        ddp = DDPConfig(use_distributed_optimizer=bool(a.get("--use-distributed-optimizer")),
                        overlap_grad_reduce=bool(a.get("--overlap-grad-reduce")),
                        overlap_param_gather=bool(a.get("--overlap-param-gather")), use_megatron_fsdp=fsdp,
                        data_parallel_sharding_strategy=a.get("--data-parallel-sharding-strategy", "no_shard"))
        optimizer = OptimizerConfig(optimizer="adam", bf16=True,
                                    use_distributed_optimizer=bool(a.get("--use-distributed-optimizer")))
    # Megatron-LM's validate_args: the global batch is whole micro-batches of every data-parallel rank.
    dp = procs // (tp * pp * cp)
    assert dp * tp * pp * cp == procs
    assert _int(a, "--global-batch-size") % (_int(a, "--micro-batch-size") * dp) == 0
    return config, ddp, optimizer


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
