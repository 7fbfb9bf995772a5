"""torchtitan's own configuration code run on pase's exports, in a process of its own (so that
torchtitan 0.3 and 0.2 can be checked from one test run): reads a JSON list of jobs on stdin,
writes a JSON list of results on stdout. Run by tests/engine_checks.py (``titan_run``).

Jobs: ``{"kind": "launch", "script": TEXT, "world": N}`` (a 0.3 launch script: its model
module written out and put on the path, the arguments of ``-m torchtitan.train`` parsed by
``ConfigManager``, the degrees by ``ParallelDims``); ``{"kind": "toml", "path": P,
"command_line": C, "world": N}`` (a 0.2 job file: ``ConfigManager`` on ``--job.config_file``
and on the command line); ``{"kind": "config", "argv": [...]}`` (0.3: what a config function
sets, parsed with no overrides); ``{"kind": "flavours"}`` (0.3: its llama3 flavours' shapes). Each result: ``ok``, ``error`` (the engine's own message),
``version`` and what torchtitan made of the file (``parallelism``, ``training``, ``compile``,
``activation_checkpoint``, ``model``).
"""

import contextlib
import dataclasses
import io
import json
import logging
import os
import shlex
import sys
import tempfile


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not callable(getattr(value, f.name))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def launch_argv(script: str) -> list:
    """The arguments after ``-m torchtitan.train`` of a launch script's torchrun line."""
    joined = script.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if x.lstrip().startswith("torchrun "))
    tokens = shlex.split(line)
    return tokens[tokens.index("torchtitan.train") + 1:]


def _module(script: str, folder: str) -> None:
    """Write the module of a launch script's here-document (if it has one) into ``folder``."""
    lines = script.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("cat > ") and line.endswith("<<'PASE_MODEL'"):
            name = line.split("/")[-1].split('"')[0]
            end = lines.index("PASE_MODEL", i)
            with open(os.path.join(folder, name), "w") as f:
                f.write("\n".join(lines[i + 1:end]) + "\n")


def _moe03(layer) -> dict | None:
    """A block's mixture of experts as torchtitan 0.3 configures it (None for a dense block)."""
    moe = getattr(layer, "moe", None)
    if moe is None:
        return None
    router, experts = moe.router, moe.routed_experts.inner_experts
    return {"experts": moe.num_experts, "top_k": router.top_k, "expert_width": experts.hidden_dim,
            "score": router.score_func, "route_norm": router.route_norm,
            "shared": 0 if moe.shared_experts is None else 1}


def _model03(spec) -> dict:
    m = spec.model
    layer = m.layers[0]
    qkv, rope = layer.attention.qkv_linear, layer.attention.rope
    moe = _moe03(layer)
    return {"name": spec.name, "flavor": spec.flavor, "width": m.dim, "vocab": m.vocab_size,
            "tied": m.enable_weight_tying, "layers": len(m.layers), "heads": qkv.n_heads, "kv_heads": qkv.n_kv_heads,
            "head_dim": qkv.head_dim, "moe": moe,
            "moe_layers": sum(_moe03(x) is not None for x in m.layers),
            "mlp_width": None if moe is not None else layer.feed_forward.w1.out_features,
            "qk_norm": layer.attention.qk_norm is not None, "rope_theta": float(rope.theta),
            "rope_scaling": None if rope.scaling == "none" else {
                "type": rope.scaling, "factor": rope.scaling_factor, "low_freq_factor": rope.low_freq_factor,
                "high_freq_factor": rope.high_freq_factor,
                "original_max_position_embeddings": rope.original_max_position_embeddings},
            "norm_eps": layer.attention_norm.eps, "final_norm_eps": m.norm.eps,
            "biases": [None if moe is not None else layer.feed_forward.w1.bias, layer.attention.wo.bias,
                       qkv.wqkv.bias if hasattr(qkv, "wqkv") else None],
            "attention": type(layer.attention.inner_attention).__qualname__}


def _parse(argv: list):
    """``ConfigManager().parse_args(argv)``; tyro's exit and its message caught."""
    from torchtitan.config import ConfigManager

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return ConfigManager().parse_args(argv), ""
        except SystemExit as exit_:
            return None, (err.getvalue().strip() or f"exit {exit_.code}")


def _launch(job: dict) -> dict:
    from torchtitan.distributed.parallel_dims import ParallelDims

    with tempfile.TemporaryDirectory() as folder:
        _module(job["script"], folder)
        sys.path.insert(0, folder)
        try:
            config, error = _parse(launch_argv(job["script"]))
        finally:
            sys.path.remove(folder)
            sys.modules.pop("pase_torchtitan_model", None)
    if config is None:
        return {"ok": False, "error": error}
    dims = ParallelDims.from_config(config.parallelism, job.get("world", 1))
    return {"ok": True, "parallelism": _plain(config.parallelism), "training": _plain(config.training),
            "compile": _plain(config.compile), "dims": {k: getattr(dims, k) for k in ("dp_replicate", "dp_shard", "cp",
                                                                                        "tp", "pp", "ep")},
            "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
            "model": _model03(config.model_spec)}


def _toml(job: dict) -> dict:
    from torchtitan.distributed.parallel_dims import ParallelDims

    config, error = _parse(["--job.config_file", job["path"]])
    if config is None:
        return {"ok": False, "error": error}
    line, _ = _parse(shlex.split(job["command_line"]))
    p = config.parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=job["world"])
    sections = {}
    for section in ("parallelism", "training", "activation_checkpoint", "model", "compile", "quantize"):
        sections[section] = _plain(getattr(config, section))
    same = line is not None and all(_plain(getattr(line, s)) == _plain(getattr(config, s)) or s == "parallelism"
                                    for s in sections)
    out = {"ok": True, "command_line_agrees": same, "dims": {k: getattr(dims, k) for k in ("dp_replicate", "dp_shard",
                                                                                           "cp", "tp", "pp", "ep")}}
    out.update(sections)
    try:  # the flavour's shape (its model code imports torchtitan's data and logging packages)
        from torchtitan.models.llama3 import llama3_args

        a = llama3_args[config.model.flavor]
        out["flavour"] = {"width": a.dim, "layers": a.n_layers, "heads": a.n_heads, "kv_heads": a.n_kv_heads,
                          "vocab": a.vocab_size, "rope_theta": float(a.rope_theta), "norm_eps": a.norm_eps,
                          "multiple_of": a.multiple_of, "ffn_dim_multiplier": a.ffn_dim_multiplier,
                          "rope_scaling": _plain(a.rope_scaling_args), "attention": a.attn_type}
    except ImportError as err:
        out["flavour_error"] = str(err)
    return out


def _config(job: dict) -> dict:
    config, error = _parse(job["argv"])
    if config is None:
        return {"ok": False, "error": error}
    return {"ok": True, "parallelism": _plain(config.parallelism), "training": _plain(config.training),
            "compile": _plain(config.compile), "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
            "model": _model03(config.model_spec)}


def _enter_package() -> None:
    """Import torchtitan; where its ``__init__`` cannot run here (0.2.2's imports its Float8 and
    MoE kernels, which need triton), enter the package without it: the configuration modules
    used import torch alone."""
    import importlib.util

    try:
        import torchtitan  # noqa: F401
    except ImportError:
        import types

        spec = importlib.util.find_spec("torchtitan")
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["torchtitan"] = package


def _flavours(job: dict) -> dict:
    """0.3's llama3 flavours as its model_registry builds them (no converters)."""
    from torchtitan.models.llama3 import llama3_configs, model_registry

    return {"ok": True, "flavours": {name: _model03(model_registry(name)) for name in llama3_configs}}


def main() -> None:
    logging.disable(logging.WARNING)
    import importlib.metadata

    _enter_package()

    version = importlib.metadata.version("torchtitan")
    results = []
    for job in json.load(sys.stdin):
        try:
            result = {"launch": _launch, "toml": _toml, "config": _config, "flavours": _flavours}[job["kind"]](job)
        except Exception as err:  # the engine refused it: its message is the result
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        results.append(dict(result, version=version))
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
