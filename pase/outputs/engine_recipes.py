"""Recipes in: the configuration of a torchtitan launch script (0.3) or TOML job config (0.2),
a Megatron-LM argument file or command line, or a DeepSpeed JSON config, as a
:class:`~pase.planning.mesh.Recipe` that fixes every choice the file makes (``--recipe-from FILE``).

The reverse of :mod:`pase.outputs.engines`, in the same names (torchtitan's:
:mod:`pase.outputs.titan_recipes`). Whatever the file sets that the tool cannot price is
refused in one line naming the field; so is a file whose batch, sequence or model differs from
the command line's (``-b``, ``-m``, ``-g``). Settings that change nothing priced (data,
logging, checkpoints, learning rate) are read past.
"""

from __future__ import annotations

import json
import shlex

from pase.outputs.engines import MEGATRON_PRECISION, MEGATRON_ROPE_SCALING, MEGATRON_YARN, mtp_modules, yarn_of
from pase.outputs.recipe_common import (RecipeFileError, blocks_of, check_batch, check_sequence, folded_etp,
                                        make_recipe, whole)
from pase.outputs.titan_export import LAUNCH_MARK
from pase.outputs.titan_recipes import (launch_engine, recipe_from_launch, recipe_from_torchtitan,
                                        toml_engine)
from pase.planning.mesh import RECOMPUTE_MODULE_WORDS, Recipe
from pase.planning.pipeline import chunks_priced, extra_word, unit_split

__all__ = ["RecipeFileError", "recipe_from_file", "recipe_from_torchtitan", "recipe_from_launch",
           "recipe_from_megatron", "recipe_from_deepspeed", "MAX_RECIPE_FILE_BYTES"]

#: The largest engine file read (a torchtitan TOML or a ds_config.json is a few kB).
MAX_RECIPE_FILE_BYTES = 1 << 20


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECIPE_FILE_BYTES + 1)
    except OSError as err:
        raise RecipeFileError(f"cannot read it ({err.strerror or err})") from None
    if len(data) > MAX_RECIPE_FILE_BYTES:
        raise RecipeFileError(f"larger than {MAX_RECIPE_FILE_BYTES} bytes: not an engine configuration")
    return data


def _text(path: str) -> str:
    data = _read(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeFileError("not UTF-8 text: not an engine configuration") from None
    if "\0" in text:
        raise RecipeFileError("has NUL bytes: not an engine configuration")
    if not text.strip():
        raise RecipeFileError("empty: not an engine configuration")
    return text


def _json_file(text: str, procs: int, batch: int, network) -> tuple:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise RecipeFileError(f"malformed JSON ({getattr(err, 'msg', 'nested too deeply')})") from None
    if not isinstance(doc, dict):
        raise RecipeFileError("the JSON is not an object")
    if "command_line" in doc and "arguments" in doc:
        if not isinstance(doc["command_line"], str):
            raise ValueError("command_line must be a string of Megatron-LM arguments")
        return _megatron_engine(doc["command_line"]), recipe_from_megatron(doc["command_line"], procs, batch, network)
    recipe = recipe_from_deepspeed(doc, procs, batch)
    fp32 = doc.get("communication_data_type") == "fp32"
    return "deepspeed,communication_data_type=fp32" if fp32 else "deepspeed", recipe


def _is_launch(text: str) -> bool:
    """A torchtitan 0.3 launch: pase's, or any script whose command runs ``-m torchtitan.train``."""
    return text.lstrip().startswith(("#!", LAUNCH_MARK, "torchrun")) and "torchtitan.train" in text


def recipe_from_file(path: str, procs: int, batch: int, network) -> tuple:
    """``(engine, recipe)`` of an engine file, told apart by its contents: a torchtitan 0.3
    launch script (a shell script running ``-m torchtitan.train``), a TOML (torchtitan 0.2), JSON
    with ``command_line`` and ``arguments`` (a Megatron-LM export), other JSON (DeepSpeed), else
    Megatron-LM arguments (``--flag value`` ..., ``pretrain_gpt.py`` and what comes before it
    skipped). ``ValueError`` (one line) for anything else: :class:`RecipeFileError` when the file
    cannot be read or parsed at all."""
    text = _text(path)
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return _json_file(text, procs, batch, network)
    if stripped.startswith("["):
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            pass  # a TOML table
        else:
            raise RecipeFileError("a JSON list, not an engine configuration")
    if _is_launch(text):
        return launch_engine(text), recipe_from_launch(text, procs, batch, network)
    if stripped.startswith("--") or "pretrain_gpt" in text:
        return _megatron_engine(text), recipe_from_megatron(text, procs, batch, network)
    import tomllib

    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise RecipeFileError(f"neither Megatron-LM arguments, JSON, TOML nor a torchtitan launch (TOML: {err})") \
            from None
    return toml_engine(doc), recipe_from_torchtitan(doc, procs, batch, network)


def _megatron_engine(text: str) -> str:
    """The engine profile a Megatron-LM command line runs: its gradient reduction type."""
    return "megatron,grad_reduce=bf16" if "--grad-reduce-in-bf16" in _megatron_tokens(text) else "megatron"


# ---------------------------------------------------------------------------------------
# Megatron-LM

# Megatron-LM

#: Megatron-LM switches and valued arguments read past: data, logging, checkpoints, the
#: optimizer's numbers, the tokenizer, kernels that change nothing priced.
_MEGATRON_PASSIVE_VALUED = {
    "--data-path", "--split", "--train-iters", "--train-samples", "--lr", "--min-lr", "--lr-decay-style",
    "--lr-warmup-iters", "--lr-warmup-fraction", "--lr-decay-iters", "--weight-decay", "--clip-grad", "--adam-beta1",
    "--adam-beta2", "--adam-eps", "--init-method-std", "--seed", "--save", "--load", "--save-interval",
    "--log-interval", "--eval-interval", "--eval-iters", "--tensorboard-dir", "--tokenizer-model",
    "--tokenizer-type", "--vocab-file", "--merge-file", "--distributed-backend", "--ckpt-format",
    "--transformer-impl", "--attention-backend", "--attention-dropout",
    "--hidden-dropout", "--wandb-project", "--wandb-exp-name", "--exit-interval", "--distributed-timeout-minutes",
    "--make-vocab-size-divisible-by", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--moe-token-drop-policy", "--data-cache-path", "--num-workers",
}
_MEGATRON_PASSIVE_SWITCHES = {
    "--bf16", "--use-mcore-models", "--mock-data", "--no-gradient-accumulation-fusion", "--use-flash-attn",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion",
    "--no-rope-fusion", "--use-rotary-position-embeddings", "--log-throughput", "--moe-grouped-gemm",
    "--no-async-tensor-model-parallel-allreduce", "--use-megatron-fsdp", "--overlap-grad-reduce",
    "--overlap-param-gather", "--no-load-optim", "--no-load-rng", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--group-query-attention", "--sequence-parallel",
    "--use-distributed-optimizer", "--tp-comm-overlap", "--grad-reduce-in-bf16", "--fp8-param-gather",
    "--fp4-param-gather", "--use-rope-scaling", "--multi-latent-attention", "--moe-router-enable-expert-bias",
    "--moe-router-pre-softmax",
}
#: Switches read into the recipe that are not among the passive ones (the pipeline's extras).
_MEGATRON_SWITCHES = {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                      "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-shared-expert-overlap",
                      "--moe-enable-deepep"}
_MEGATRON_VALUED = {
    "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size", "--global-batch-size",
    "--data-parallel-sharding-strategy", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout", "--num-layers", "--hidden-size",
    "--num-attention-heads", "--kv-channels",
    "--num-query-groups", "--ffn-hidden-size", "--normalization", "--position-embedding-type", "--seq-length",
    "--max-position-embeddings", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--moe-expert-capacity-factor", "--vocab-size",
    "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--rotary-base", "--rope-scaling-factor", "--norm-epsilon",
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--rope-type",
    "--mtp-num-layers", *MEGATRON_YARN.values(), "--moe-router-score-function", "--moe-router-topk-scaling-factor",
    "--moe-router-num-groups", "--moe-router-group-topk",
}
#: Arguments of one or more words (Megatron-LM's ``nargs="+"``, a ``List[str]`` field).
_MEGATRON_LISTS = {"--recompute-modules"}
#: Model arguments checked against the graph's declared architecture (the key there).
_MEGATRON_MODEL = {"--num-layers": "layers", "--hidden-size": "width", "--num-attention-heads": "heads",
                   "--kv-channels": "head_dim", "--ffn-hidden-size": "mlp_width", "--seq-length": "sequence"}


def _megatron_tokens(text: str) -> list:
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as err:
        raise RecipeFileError(f"cannot split the arguments ({err})") from None
    for i, token in enumerate(tokens):
        if token.endswith("pretrain_gpt.py"):
            return tokens[i + 1:]
    return tokens


def _megatron_arguments(text: str) -> dict:
    tokens = _megatron_tokens(text)
    args: dict = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, eq, inline = token.partition("=")
        if not flag.startswith("--"):
            raise ValueError(f"expected a Megatron-LM argument (--name), got {token!r}")
        if flag in args:
            raise ValueError(f"argument {flag} is given twice")
        if flag in _MEGATRON_LISTS:  # nargs "+": every word up to the next flag
            words = [inline] if eq else []
            while not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                words.append(tokens[i + 1])
                i += 1
            if not words or not all(words):
                raise ValueError(f"argument {flag} needs one or more values")
            args[flag] = tuple(words)
        elif flag in _MEGATRON_VALUED or flag in _MEGATRON_PASSIVE_VALUED:
            if eq:
                args[flag] = inline
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                args[flag] = tokens[i + 1]
                i += 1
            else:
                raise ValueError(f"argument {flag} needs a value")
        elif flag in _MEGATRON_PASSIVE_SWITCHES or flag in _MEGATRON_SWITCHES:
            if eq:
                raise ValueError(f"argument {flag} is a switch: it takes no value")
            args[flag] = True
        else:
            raise ValueError(f"cannot express Megatron-LM argument {flag} (not one the tool prices or reads past)")
        i += 1
    return args


def _megatron_int(args: dict, flag: str, default: int | None = None, least: int = 1) -> int | None:
    if flag not in args:
        return default
    value = args[flag]
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or int(value) < least:
        raise ValueError(f"{flag} must be an integer of at least {least}, got {value!r}")
    return int(value)



def _megatron_number(args: dict, flag: str, zero: bool = False) -> float | None:
    """``flag``'s value as a finite positive number (``zero``: or 0), None where absent."""
    if flag not in args:
        return None
    try:
        value = float(args[flag])
    except ValueError:
        value = -1.0
    if not (0 <= value if zero else 0 < value) or value == float("inf"):
        raise ValueError(f"{flag} must be a {'non-negative' if zero else 'positive'} number, got {args[flag]!r}")
    return value


def _megatron_model(args: dict, arch) -> None:
    """The model arguments given, checked against the graph's declared shape and settings."""
    if not arch:
        return
    for flag, key in _MEGATRON_MODEL.items():
        value = _megatron_int(args, flag)
        if value is not None and value != arch[key]:
            raise ValueError(f"{flag} {value} differs from the graph's {key} {arch[key]}: a different model")
    experts = _megatron_int(args, "--num-experts")
    if experts is not None and experts != (arch.get("moe") or {}).get("experts"):
        raise ValueError(f"--num-experts {experts} differs from the graph's experts")
    mtp, declared = _megatron_int(args, "--mtp-num-layers") or 0, mtp_modules(arch)
    if mtp != declared:
        raise ValueError(f"--mtp-num-layers {mtp or '(absent)'} differs from the graph's {declared} multi-token-"
                         "prediction modules: a different model" + (" (-g hf:... --mtp builds them)" if mtp else ""))
    if experts is not None and "--moe-grouped-gemm" not in args:
        raise ValueError("without --moe-grouped-gemm megatron-core runs the experts one after another "
                         "(SequentialMLP), and they are priced as one grouped GEMM")
    rope = arch.get("rope") or {}
    scaling = rope.get("scaling") or {}
    given = {"--rotary-base": (_megatron_number(args, "--rotary-base"), rope.get("theta")),
             "--norm-epsilon": (_megatron_number(args, "--norm-epsilon"), arch.get("norm_eps")),
             "--rope-scaling-factor": (_megatron_number(args, "--rope-scaling-factor"), scaling.get("factor"))}
    for flag, (value, declared) in given.items():
        if value is not None and declared is not None and value != declared:
            raise ValueError(f"{flag} {args[flag]} differs from the graph's {declared}: a different model")
    yarn = yarn_of(arch)
    if "mla" in arch and args.get("--rope-type", "yarn") != ("yarn" if yarn else "rope"):
        raise ValueError(f"--rope-type {args.get('--rope-type', 'yarn (megatron-core default under latent attention)')} "
                         f"with the graph's rotary scaling ({scaling or 'none'}): a different model")
    if yarn:  # YaRN under multi-latent attention: every key as written (MEGATRON_YARN)
        for key, flag in MEGATRON_YARN.items():
            if _megatron_number(args, flag, zero=True) != scaling[key]:
                raise ValueError(f"{flag} {args.get(flag, '(absent)')} differs from the graph's {scaling[key]}: a "
                                 "different model")
        return
    if "rope" in arch and ("--use-rope-scaling" in args) != bool(scaling):
        raise ValueError("--use-rope-scaling " + ("without" if scaling else "with") + " the graph's rotary scaling "
                         f"({scaling or 'none'}): a different model")
    if scaling and {k: v for k, v in scaling.items() if k != "factor"} != MEGATRON_ROPE_SCALING:
        raise ValueError(f"the graph's rotary scaling {scaling} is not megatron-core's (Llama 3.1's)")


def _megatron_degrees(args: dict, procs: int) -> dict:
    """tp, pp, cp, ep, the experts' etp and the dp Megatron derives (``p / (tp pp cp)``)."""
    d = {k: _megatron_int(args, f"--{name}-parallel-size", 1) for k, name in (
        ("tp", "tensor-model"), ("pp", "pipeline-model"), ("cp", "context"), ("ep", "expert-model"))}
    if procs % (d["tp"] * d["pp"] * d["cp"]):
        raise ValueError(f"tp x pp x cp = {d['tp'] * d['pp'] * d['cp']} does not divide the {procs} devices of -p")
    d["dp"] = procs // (d["tp"] * d["pp"] * d["cp"])
    d["etp"] = _megatron_int(args, "--expert-tensor-parallel-size", d["tp"]) if d["ep"] > 1 else None
    if d["etp"] is not None and d["tp"] % d["etp"]:
        raise ValueError(f"cannot express --expert-tensor-parallel-size {d['etp']}: the experts are priced split by "
                         f"a divisor of tp ({d['tp']}) (MoE parallel folding)")
    return d


def _megatron_experts(args: dict, ep: int) -> dict:
    """``dispatcher``, ``ep_overlap`` and ``shared_overlap`` of the expert arguments
    (:data:`~pase.outputs.engines.MEGATRON_DISPATCHER` read back): the dispatcher type (megatron-core's
    default ``allgather``), the flex dispatcher's backend (``--moe-flex-dispatcher-backend``, or the
    deprecated ``--moe-enable-deepep``), the batch-level overlap and the shared experts' overlap."""
    dispatcher = args.get("--moe-token-dispatcher-type", "allgather")  # megatron-core's default
    if dispatcher not in ("allgather", "alltoall", "flex"):
        raise ValueError(f"--moe-token-dispatcher-type must be allgather, alltoall or flex, got {dispatcher!r}")
    backend = args.get("--moe-flex-dispatcher-backend", "deepep" if "--moe-enable-deepep" in args else None)
    if dispatcher == "flex":
        if backend not in ("deepep", "hybridep"):
            raise ValueError("--moe-token-dispatcher-type flex needs --moe-flex-dispatcher-backend deepep or hybridep"
                             + (f", got {backend!r}" if backend is not None else ""))
        dispatcher = backend
    elif backend is not None:
        raise ValueError(f"--moe-flex-dispatcher-backend {backend} needs --moe-token-dispatcher-type flex")
    overlap = "--overlap-moe-expert-parallel-comm" in args
    if overlap != ("--delay-wgrad-compute" in args):
        raise ValueError("--overlap-moe-expert-parallel-comm is priced with --delay-wgrad-compute (Megatron-Bridge's "
                         "recipes set both; one without the other is not priced)")
    if ep <= 1:
        return {}
    return {"dispatcher": None if dispatcher == "alltoall" else dispatcher, "ep_overlap": overlap or None,
            "shared_overlap": ("--moe-shared-expert-overlap" in args) or None}


def _megatron_batch(args: dict, dp: int, batch: int, network) -> int:
    """The micro-batch, the global batch checked against ``-b``."""
    micro = _megatron_int(args, "--micro-batch-size", 1)
    global_batch = _megatron_int(args, "--global-batch-size", micro * dp)
    check_batch(global_batch, batch, "--global-batch-size")
    if global_batch % (micro * dp):
        raise ValueError(f"--global-batch-size {global_batch} is not a multiple of micro-batch x dp = {micro * dp}")
    if "--seq-length" in args and not getattr(network, "architecture", None):
        check_sequence(_megatron_int(args, "--seq-length"), network, "--seq-length")
    return micro


def _megatron_zero(args: dict, dp: int, cp: int) -> int:
    """The ZeRO stage: Megatron FSDP's sharding strategy, else the distributed optimizer or none;
    the gradient reduction and weight gathers overlapped as priced."""
    if "--use-megatron-fsdp" in args:
        strategy = args.get("--data-parallel-sharding-strategy", "no_shard")
        zeros = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in zeros:
            raise ValueError(f"--data-parallel-sharding-strategy must be one of {', '.join(zeros)}, got {strategy!r}")
        zero = zeros[strategy]
    elif "--data-parallel-sharding-strategy" in args:
        raise ValueError("--data-parallel-sharding-strategy is Megatron FSDP's: give --use-megatron-fsdp")
    else:
        zero = 1 if "--use-distributed-optimizer" in args else 0
    if dp * cp > 1 and "--overlap-grad-reduce" not in args:
        raise ValueError("without --overlap-grad-reduce: the tool prices the gradient reduction overlapped with the "
                         "backward pass")
    if dp * cp > 1 and zero >= 1 and "--overlap-param-gather" not in args:
        raise ValueError("without --overlap-param-gather: the tool prices the weight gathers overlapped")
    return zero


def _megatron_recompute(args: dict) -> tuple:
    """``(recompute, recompute_layers, recompute_modules)`` of ``--recompute-granularity``, its
    method and its modules."""
    granularity = args.get("--recompute-granularity")
    modules = args.get("--recompute-modules")
    if modules is not None and granularity != "selective":
        raise ValueError("--recompute-modules applies under --recompute-granularity selective")
    if granularity is None:
        return "none", None, None
    if granularity == "selective":
        if modules is None:
            return "selective", None, None
        unknown = [m for m in modules if m not in RECOMPUTE_MODULE_WORDS]
        if unknown:
            raise ValueError(f"cannot express --recompute-modules {' '.join(unknown)} (priced: "
                             f"{', '.join(RECOMPUTE_MODULE_WORDS)})")
        if len(set(modules)) != len(modules):
            raise ValueError("--recompute-modules names a module twice")
        picked = tuple(m for m in RECOMPUTE_MODULE_WORDS if m in modules)
        return "selective", None, None if picked == ("core_attn",) else picked
    if granularity != "full":
        raise ValueError(f"--recompute-granularity must be full or selective, got {granularity!r}")
    method = args.get("--recompute-method")
    layers = _megatron_int(args, "--recompute-num-layers", 1)
    if method == "block":  # the first N layers of each stage (model chunk) recomputed, the rest kept
        return "block", layers, None
    if method != "uniform" or layers != 1:
        raise ValueError(f"cannot express --recompute-method {method} --recompute-num-layers {layers} (priced: "
                         "every layer recomputed, uniform 1; or block N)")
    return "full", None, None


def _megatron_first_last(first, last, blocks, pp: int) -> tuple:
    """Blocks per stage of ``--decoder-first/last-pipeline-num-layers``, the rest even."""
    if blocks is None:
        raise ValueError("--decoder-first/last-pipeline-num-layers need --num-layers")
    if pp == 2:
        first = first if first is not None else blocks - last
        counts = (first, blocks - first)
    else:
        rest = blocks - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        if rest < middle_stages or rest % middle_stages:
            raise ValueError(f"{rest} layers do not split evenly over the {middle_stages} other stages")
        each = rest // middle_stages
        counts = ((first if first is not None else each),) + (each,) * (pp - 2) + \
            ((last if last is not None else each),)
    if min(counts) < 1:
        raise ValueError("--decoder-first/last-pipeline-num-layers leave a stage without layers")
    return counts


def _megatron_pipeline(args: dict, pp: int, network) -> dict:
    """``schedule``, ``vpp``, ``stages`` and ``pipeline_extra`` of the pipeline arguments (none
    without pp)."""
    if pp == 1:
        return {}
    blocks = _megatron_int(args, "--num-layers") or blocks_of(network)
    per_chunk = _megatron_int(args, "--num-layers-per-virtual-pipeline-stage")
    virtual = _megatron_int(args, "--num-virtual-stages-per-pipeline-rank")
    first = _megatron_int(args, "--decoder-first-pipeline-num-layers")
    last = _megatron_int(args, "--decoder-last-pipeline-num-layers")
    extra = (int("--account-for-embedding-in-pipeline-split" in args),
             int("--account-for-loss-in-pipeline-split" in args))
    layout = args.get("--pipeline-model-parallel-layout")
    if per_chunk is not None and virtual is not None:
        raise ValueError("--num-layers-per-virtual-pipeline-stage with --num-virtual-stages-per-pipeline-rank: "
                         "Megatron-LM takes one of them")
    if layout is not None:
        if per_chunk is not None or virtual is not None or first is not None or last is not None or sum(extra):
            raise ValueError("--pipeline-model-parallel-layout with --num-layers-per-virtual-pipeline-stage, "
                             "--num-virtual-stages-per-pipeline-rank, --decoder-first/last-pipeline-num-layers or "
                             "--account-for-*-in-pipeline-split: Megatron-LM takes one of them")
        return _layout_pipeline(layout, pp, blocks, _megatron_int(args, "--mtp-num-layers") or 0)
    if sum(extra):
        if first is not None or last is not None:
            raise ValueError("--account-for-*-in-pipeline-split with --decoder-first/last-pipeline-num-layers: "
                             "Megatron-LM refuses them together")
        return _accounted_pipeline(blocks, pp, extra, per_chunk, virtual)
    if virtual is not None and virtual > 1:
        return {"schedule": "interleaved", "vpp": virtual}
    if per_chunk is not None:
        if first is not None or last is not None:
            raise ValueError("cannot express --decoder-first/last-pipeline-num-layers with interleaving")
        if blocks is None or blocks % (pp * per_chunk):
            raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the "
                             f"{blocks} layers into {pp} stages")
        vpp = blocks // (pp * per_chunk)
        if vpp >= 2:
            return {"schedule": "interleaved", "vpp": vpp}
    elif first is not None or last is not None:
        return {"schedule": "1f1b", "stages": _megatron_first_last(first, last, blocks, pp)}
    elif blocks is not None and blocks % pp:
        raise ValueError(f"{blocks} layers do not split evenly over {pp} stages (Megatron-LM needs "
                         "--decoder-first/last-pipeline-num-layers)")
    # Megatron's even split, fixed (not searched); one chunk per stage: 1F1B.
    return {"schedule": "1f1b", "stages": (blocks // pp,) * pp if blocks is not None else None}


def _accounted_pipeline(blocks, pp: int, extra: tuple, per_chunk, virtual) -> dict:
    """The pipeline of ``--account-for-embedding-in-pipeline-split`` and/or
    ``--account-for-loss-in-pipeline-split``: the embedding and the loss count as layers, the
    units split evenly over the stages (and their chunks: ``--num-layers-per-virtual-pipeline-stage``
    counts units, megatron/training/arguments.py; or ``--num-virtual-stages-per-pipeline-rank``)."""
    if blocks is None:
        raise ValueError("--account-for-*-in-pipeline-split needs --num-layers (or a graph that declares its layers)")
    units = blocks + sum(extra)
    vpp = virtual or 1
    if per_chunk is not None:
        if units % (pp * per_chunk):
            raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the {units} "
                             f"pipeline layers (the embedding and the loss counted) into {pp} stages")
        vpp = units // (pp * per_chunk)
    stages = unit_split(blocks, pp, extra, vpp)
    if stages is None:
        raise ValueError(f"{blocks} layers + {sum(extra)} (--account-for-*-in-pipeline-split) do not split evenly "
                         f"into {pp} stages" + (f" of {vpp} chunks" if vpp > 1 else "") + " (Megatron-LM refuses it)")
    out = {"schedule": "interleaved" if vpp > 1 else "1f1b", "stages": stages, "pipeline_extra": extra_word(extra)}
    return dict(out, vpp=vpp) if vpp > 1 else out


def _layout_pipeline(layout: str, pp: int, blocks, mtp: int = 0) -> dict:
    """The pipeline of a ``--pipeline-model-parallel-layout`` (:func:`_megatron_layout`): 1F1B
    stages, or interleaved chunks as the model prices them (:func:`~pase.planning.pipeline.chunk_sizes`),
    the embedding and the loss counted in the chunks where they sit alone or make a chunk one
    layer short (``pipeline_extra``); ``mtp``: the ``--mtp-num-layers`` its ``m`` must count."""
    chunks = _megatron_layout(layout, pp, mtp)
    where = "--pipeline-model-parallel-layout"
    if blocks is not None and sum(chunks) != blocks:
        raise ValueError(f"{where} has {sum(chunks)} transformer layers, the model {blocks}")
    if len(chunks) == pp:
        if min(chunks) < 1:
            raise ValueError(f"cannot express {where}: a pipeline stage without transformer layers")
        return {"schedule": "1f1b", "stages": tuple(chunks)}
    vpp = len(chunks) // pp
    totals = tuple(sum(chunks[s::pp]) for s in range(pp))
    for extra in ((0, 0), (1, 1), (1, 0), (0, 1)):
        if chunks_priced(chunks, pp, extra):
            out = {"schedule": "interleaved", "vpp": vpp, "stages": totals}
            return dict(out, pipeline_extra=extra_word(extra)) if sum(extra) else out
    raise ValueError(f"{where}: model parts of {'/'.join(map(str, chunks))} layers; interleaved chunks are priced "
                     "as even as they go on each stage, one block apart at most (the embedding or the loss counted "
                     "as one where a chunk holds it), the largest stage or the mean one a multiple of the chunks per "
                     "stage")


def recipe_from_megatron(text: str, procs: int, batch: int, network=None) -> Recipe:
    """The recipe of Megatron-LM ``pretrain_gpt.py`` arguments (a command line or an
    argument file; ``#`` comments and line breaks allowed)."""
    args = _megatron_arguments(text)
    _megatron_model(args, getattr(network, "architecture", None))
    d = _megatron_degrees(args, procs)
    micro = _megatron_batch(args, d["dp"], batch, network)
    zero = _megatron_zero(args, d["dp"], d["cp"])
    recompute, recompute_layers, recompute_modules = _megatron_recompute(args)
    sp = "--sequence-parallel" in args
    overlap_tp = "--tp-comm-overlap" in args
    if overlap_tp and not sp:
        raise ValueError("--tp-comm-overlap needs --sequence-parallel (Megatron-LM refuses it too)")
    return make_recipe(dp=d["dp"], tp=d["tp"], pp=d["pp"], cp=d["cp"], ep=d["ep"] if d["ep"] > 1 else None,
                       etp=folded_etp(d["dp"], d["tp"], d["ep"], d["etp"]), zero=zero, recompute=recompute,
                       recompute_layers=recompute_layers, recompute_modules=recompute_modules, microbatch=micro, sp=sp if d["tp"] > 1 else None,
                       tp_overlap=overlap_tp, **_megatron_pipeline(args, d["pp"], network),
                       **_megatron_experts(args, d["ep"]),
                       **_megatron_precision(args, zero))


#: The longest layout unrolled (layers and separators): far more than any model's layers.
_LAYOUT_MOST = 100_000


def _unroll(text: str, where: str) -> str:
    """A layout with its repeats written out: ``X*N`` (one letter) and ``(...)*N``; ``where``
    names the layout in the messages."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "(":
            end = text.find(")", i)
            if end < 0:
                raise ValueError(f"{where}: a '(' without its ')'")
            unit, i = _unroll(text[i + 1:end], where), end + 1
        elif text[i] in ")*":
            raise ValueError(f"{where}: a {text[i]!r} out of place")
        else:
            unit, i = text[i], i + 1
        if text[i:i + 1] == "*":
            digits = i + 1
            while digits < len(text) and text[digits].isdigit():
                digits += 1
            if digits == i + 1:
                raise ValueError(f"{where}: '*' needs a count")
            times, i = int(text[i + 1:digits]) if digits - i <= 7 else _LAYOUT_MOST + 1, digits
            if len(unit) * times > _LAYOUT_MOST:
                raise ValueError(f"{where}: more than {_LAYOUT_MOST} layers")
            unit *= times
        out.append(unit)
        if sum(map(len, out)) > _LAYOUT_MOST:
            raise ValueError(f"{where}: more than {_LAYOUT_MOST} layers")
    return "".join(out)


def _megatron_layout(text: str, pp: int, mtp: int = 0) -> list:
    """Transformer layers per model chunk of Megatron-LM's ``--pipeline-model-parallel-layout``
    (chunk ``i`` on pipeline rank ``i mod pp``): chunks split by ``|``; ``E`` the embedding,
    ``t`` a transformer layer, ``m`` a multi-token-prediction module, ``L`` the loss (output
    layer); ``X*N`` and ``(...)*N`` repeat; commas are only for the eye. The embedding must open
    the first chunk and the loss close the last, as priced (a chunk may hold one of them alone);
    the ``mtp`` modules (``--mtp-num-layers``) just before the loss, in its chunk, where the
    model prices them (megatron-core also runs them in a chunk of their own, "standalone")."""
    shown = text if len(text) <= 60 else text[:57] + "..."
    where = f"--pipeline-model-parallel-layout {shown!r}"
    chunks = _unroll(text.replace(",", ""), where).split("|")
    odd = sorted(set("".join(chunks)) - set("EtmL"))
    if odd:
        raise ValueError(f"cannot express {where}: unknown layer letters {''.join(odd)} (E, t, m, L)")
    joined = "".join(chunks)
    if joined.count("m") != mtp:
        raise ValueError(f"{where} places {joined.count('m')} multi-token-prediction module(s) (m) and "
                         f"--mtp-num-layers says {mtp or 'none'}: Megatron-LM refuses it")
    if mtp and not chunks[-1].endswith("m" * mtp + "L"):
        raise ValueError(f"cannot express {where}: the multi-token-prediction modules (m) are priced together just "
                         "before the loss L, in its chunk")
    chunks = [c.replace("m", "") for c in chunks]
    joined = "".join(chunks)
    if joined.count("E") != 1 or joined.count("L") != 1 or not chunks[0].startswith("E") or \
            not chunks[-1].endswith("L"):
        raise ValueError(f"{where}: the embedding E must open the first stage and the loss L close the last, once each")
    if len(chunks) % pp:
        raise ValueError(f"{where} has {len(chunks)} stages, not a multiple of pp {pp}")
    if any(not c for c in chunks):
        raise ValueError(f"cannot express {where}: a stage without transformer layers, the embedding or the loss")
    return [c.count("t") for c in chunks]


#: Megatron-LM's FP8 formats priced alike (E4M3 throughout or E5M2 gradients: one byte each).
_MEGATRON_FP8_FORMATS = ("hybrid", "e4m3")


def _megatron_precision(args: dict, zero: int) -> dict:
    """``precision``, ``scaling`` and ``fp8_gather`` of Megatron-LM's ``--fp8-*`` / ``--fp4-*``
    arguments (:data:`~pase.outputs.engines.MEGATRON_PRECISION`; none: BF16)."""
    fp8, fp4 = args.get("--fp8-format"), args.get("--fp4-format")
    if fp8 is not None and fp4 is not None:
        raise ValueError("--fp8-format with --fp4-format: Megatron-LM runs one of them")
    for low, flag in ((fp8, "--fp8-"), (fp4, "--fp4-")):
        if low is None:
            for name in ("recipe", "param-gather"):
                if flag + name in args:
                    raise ValueError(f"{flag}{name} needs {flag}format")
    if fp8 is None and fp4 is None:
        return {}
    if fp8 is not None and fp8 not in _MEGATRON_FP8_FORMATS:
        raise ValueError(f"--fp8-format must be {' or '.join(_MEGATRON_FP8_FORMATS)}, got {fp8!r}")
    if fp4 is not None and fp4 != "e2m1":
        raise ValueError(f"--fp4-format must be e2m1, got {fp4!r}")
    flag = "--fp8-recipe" if fp8 is not None else "--fp4-recipe"
    name = args.get(flag, "delayed" if fp8 is not None else "nvfp4")  # Megatron-LM's defaults
    words = {recipe[1][1]: (word, gather) for word, (recipe, gather) in MEGATRON_PRECISION.items()
             if recipe[1][0] == flag}
    if name not in words:
        raise ValueError(f"cannot express {flag} {name} (priced: {', '.join(words)})")
    word, gather_flag = words[name]
    gather = gather_flag in args
    if gather and zero == 0:
        raise ValueError(f"{gather_flag} without the distributed optimizer or Megatron FSDP: no gathers to run in "
                         "the format")
    precision, _, scaling = word.partition("/")
    return {"precision": precision, "scaling": scaling or None, "fp8_gather": gather or None}


# ---------------------------------------------------------------------------------------
# DeepSpeed

_DS_PASSIVE = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
               "zero_allow_untested_optimizer", "bf16", "fp16", "prescale_gradients",
               "gradient_predivide_factor", "dump_state", "tensorboard", "wandb", "csv_monitor", "flops_profiler",
               "comms_logger", "memory_breakdown", "pase"}
_DS_ZERO_READ = {"stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
                 "reduce_scatter", "allgather_partitions", "stage3_param_persistence_threshold",
                 "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                 "stage3_gather_16bit_weights_on_model_save", "round_robin_gradients", "sub_group_size",
                 "offload_optimizer", "offload_param"}


def recipe_from_deepspeed(doc: dict, procs: int, batch: int) -> Recipe:
    """The recipe of a DeepSpeed ``ds_config.json`` (a dict): data parallelism over every
    device, its ZeRO stage and batch (``train_batch_size = micro x accumulation x dp``)."""
    read = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "zero_optimization", "communication_data_type"}
    if doc.get("communication_data_type", "bf16") not in ("bf16", "fp32"):
        raise ValueError(f"cannot express communication_data_type {doc['communication_data_type']!r} (priced: bf16, "
                         "fp32)")
    for key in doc:
        if key not in read and key not in _DS_PASSIVE:
            if key in ("activation_checkpointing", "pipeline", "sequence_parallel_size", "tensor_parallel"):
                raise ValueError(f"cannot express {key}: set in the model code, not priced from ds_config.json")
            raise ValueError(f"unknown DeepSpeed field {key}")
    for key in ("bf16", "fp16"):
        if key in doc and not isinstance(doc[key], dict):
            raise ValueError(f"{key} must be an object")
    zero_section = doc.get("zero_optimization", {})
    if not isinstance(zero_section, dict):
        raise ValueError("zero_optimization must be an object")
    for key, value in zero_section.items():
        if key not in _DS_ZERO_READ:
            raise ValueError(f"unknown DeepSpeed field zero_optimization.{key}")
        if key in ("offload_optimizer", "offload_param") and isinstance(value, dict) and \
                value.get("device", "none") != "none":
            raise ValueError(f"cannot express zero_optimization.{key} (offloading is not priced)")
    zero = whole(zero_section.get("stage", 0), "zero_optimization.stage", 0)
    if zero > 3:
        raise ValueError(f"zero_optimization.stage must be 0-3, got {zero}")
    if zero == 3 and zero_section.get("stage3_param_persistence_threshold", 100000) != 0:
        raise ValueError("cannot express zero_optimization.stage3_param_persistence_threshold other than 0 (small "
                         "parameters kept whole are not priced)")
    dp = procs
    if dp > 1 and zero == 0:
        raise ValueError("zero_optimization.stage 0: DeepSpeed without ZeRO reduces the gradients after the backward "
                         "pass, and the tool prices them overlapped")
    if dp > 1 and zero in (1, 2) and zero_section.get("overlap_comm") is not True:
        raise ValueError("zero_optimization.overlap_comm must be true: the tool prices the gradient reduction "
                         "overlapped with the backward pass")
    train = doc.get("train_batch_size")
    micro = doc.get("train_micro_batch_size_per_gpu")
    accumulation = doc.get("gradient_accumulation_steps")
    if train is None and (micro is None or accumulation is None):
        raise ValueError("give train_batch_size, or train_micro_batch_size_per_gpu and gradient_accumulation_steps")
    if train is not None:
        train = whole(train, "train_batch_size")
    if micro is not None:
        micro = whole(micro, "train_micro_batch_size_per_gpu")
    if accumulation is not None:
        accumulation = whole(accumulation, "gradient_accumulation_steps")
    # DeepSpeed's own completion of the three (deepspeed/runtime/config.py).
    if train is None:
        train = micro * accumulation * dp
    elif micro is None:
        accumulation = accumulation or 1
        micro = train // (accumulation * dp)
    elif accumulation is None:
        accumulation = train // (micro * dp)
    if micro < 1 or accumulation < 1 or train != micro * accumulation * dp:
        raise ValueError(f"train_batch_size {train} is not train_micro_batch_size_per_gpu x "
                         f"gradient_accumulation_steps x the {dp} data-parallel devices")
    check_batch(train, batch, "train_batch_size")
    return make_recipe(dp=dp, tp=1, pp=1, cp=1, zero=zero, recompute="none", microbatch=micro)
