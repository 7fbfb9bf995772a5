"""``--training``, ``--recipe``, ``--compare`` (and the engine exports): the training
configuration search, its table or JSON, and the files asked for."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from functools import lru_cache
from typing import IO, Callable

from pase.planning.mesh import parse_recipe

__all__ = ["add_training_flags", "wants_training", "check_training_flags", "run_training", "run_training_command"]


def _recipe(text: str):
    try:
        return parse_recipe(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _engine(text: str):
    from pase.planning.engine import load_engine

    try:
        return load_engine(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """The training-configuration flags (a group of their own in ``--help``)."""
    group = parser.add_argument_group(
        "training configuration",
        "Search the whole training configuration around the per-layer splits: device mesh (dp, tp, cp), "
        "ZeRO stage, activation recomputation, micro-batches; fused attention and overlapped gradient "
        "reduction priced (docs/training.md). Decoders built in, from hf: configs or with dimension letters.")
    add = group.add_argument
    add("--training", action="store_true",
        help="search the training configuration (implied by --recipe and --compare).")
    add("--recipe", type=_recipe, default=None, metavar="KEY=VALUE,...",
        help="fix parts of the training configuration, the rest searched: dp, tp, pp, cp (dp x tp x pp x cp = p), "
             "zero (0-3), recompute (none, selective, full; op: torchtitan's operator policy; block: Megatron's, "
             "the first recompute_layers blocks of each pipeline chunk, searched when not given; selective with "
             "recompute_modules: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts joined by +, "
             "Megatron's --recompute-modules), "
             "microbatch "
             "(sequences per micro-batch per data-parallel rank), sp (sequence parallelism, true/false), "
             "tp_overlap (Megatron's --tp-comm-overlap, true/false), ep (expert parallelism, dividing dp, or "
             "folded onto tp with etp, the experts' tensor parallelism), "
             "schedule (1f1b, interleaved), vpp (model chunks per device, interleaved), stages (blocks per pipeline "
             "stage, A/B/...); precision (bf16, fp8, "
             "mxfp8, nvfp4: the blocks' weight products; search: --search-precision), scaling (fp8: delayed, "
             "current, rowwise, blockwise) and fp8_gather (ZeRO all-gathers in FP8, true/false).")
    add("--search-precision", action="store_true",
        help="let the search choose the number format among those the machine runs (bf16 unless asked: a "
             "format changes the numerics); the same as --recipe precision=search.")
    add("--engine", type=_engine, default=None, metavar="NAME[,KEY=VALUE...]|FILE.json",
        help="the training engine the plan runs on: megatron (the default), torchtitan, fsdp (plain PyTorch FSDP, "
             "as llm-foundry runs it), deepspeed, or a profile file; keys switch its kernels and settings, e.g. "
             "torchtitan,compile=true (docs/engines.md). The search keeps to the configurations it runs (its "
             "profile's runs section); unnamed, megatron's where it builds the graph, with a faster per-layer plan "
             "shown beside; the output says which engines run the plan's configuration.")
    add("--compare", type=_recipe, default=None, metavar="KEY=VALUE,...",
        help="also price this recipe (its fastest fitting variant) next to the plan.")
    add("--rules", metavar="FILE.json", default=None,
        help="parallel rules: which mesh axis (dp, tp, cp, ep, sp) splits which dimension role (batch, heads, "
             "mlp, vocab, sequence, ...); default pase/planning/data/parallel_rules.json (docs/roles.md). "
             "Implies --training.")
    add("--recipe-from", metavar="FILE", default=None,
        help="price exactly the configuration of an engine's file: a torchtitan 0.3 launch script or 0.2 TOML job "
             "config, a Megatron-LM "
             "argument file or command line (pretrain_gpt.py arguments), or a DeepSpeed JSON config, for that engine; "
             "what the tool cannot express is refused naming the field (docs/engines.md).")
    for flag, engine, what in ENGINE_EXPORTS:
        add(flag, metavar="FILE", default=None, help=_EXPORT_HELP[engine])

    _add_front_door_flags(add)


# --- the front door (issue 34): --report, --top, --per-layer; the training plan by default on
# --- a real machine (a preset other than paper, or a machine file).

#: Flags that only the per-layer (paper-style) search takes: given on a real machine, they ask
#: for it as --per-layer does.
PER_LAYER_ONLY = ("evaluate", "export_jax", "verify", "measure", "no_blocks", "approx", "param_bytes", "algo")


def _top(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"--top takes a whole number from 1 to {MAX_TOP}, got {text!r}")
    return int(text)


#: Largest --top: the search keeps that many candidates (and their costings) as it runs.
MAX_TOP = 50
#: Alternatives the report lists when --top is not given.
REPORT_TOP = 5


def _add_front_door_flags(add) -> None:
    add("--per-layer", action="store_true",
        help="on a real machine, run the paper's per-layer search instead of the training plan (the default there; "
             "on --machine paper the per-layer search is the default). With a training flag (--training, --recipe, "
             "--top, ...): let the training plan be per-layer splits where they are faster, which no engine runs "
             "(by default they are shown beside a plan an engine runs).")
    add("--top", type=_top, default=None, metavar="K",
        help="list the K fastest distinct configurations that fit, each with its step, memory and how it differs "
             "from the plan and why it is slower (JSON: training.alternatives).")
    add("--report", metavar="FILE.html", default=None,
        help="write one self-contained HTML page of the plan: step time by cause, memory against the device, "
             "the pipeline schedule, the alternatives and every configuration priced (step against memory).")


def real_machine(args) -> bool:
    """A calibrated preset or a machine file: anything but the paper's model."""
    return args.machine is not None and args.machine != "paper"
# --- end of the front door flags


#: (flag, engine, what messages call the file), in the order of --help.
ENGINE_EXPORTS = (("--export-torchtitan", "torchtitan", "torchtitan export"),
                  ("--export-megatron", "megatron", "Megatron-LM arguments"),
                  ("--export-deepspeed", "deepspeed", "DeepSpeed config"))
_EXPORT_HELP = {
    "torchtitan": "write the plan as a torchtitan 0.3 launch script (torchrun -m torchtitan.train --module --config "
                  "and its overrides, the model named or built) that runs it as priced; with --engine "
                  "torchtitan,version=0.2 a torchtitan 0.2 TOML job config instead; refused with the reason when "
                  "torchtitan cannot run the plan (docs/engines.md).",
    "megatron": "write the plan as Megatron-LM's pretrain_gpt.py arguments, the model's own included (JSON: "
                "arguments, command_line, launch); refused with the reason when Megatron-LM cannot run it.",
    "deepspeed": "write the plan as a DeepSpeed ds_config.json (ZeRO stage, micro-batch, accumulation, bf16; the "
                 "recipe and launch command under the key 'pase'); refused with the reason when DeepSpeed cannot "
                 "run it.",
}


def pricing_engine(args, file_engine: str | None = None) -> tuple:
    """``(profile, keep_to)``: the engine the plan is priced for (``--engine``, else the one
    engine of the --export-ENGINE files and the --recipe-from file, else the default) and the
    engines the search keeps to: that engine where one was named or implied, else ``None``
    (``plan_training``'s default: the engine priced where it runs the graph). ``ValueError``
    when an export is for another engine than the one priced."""
    from pase.planning.engine import load_engine

    implied = list(dict.fromkeys([engine for _, _, engine, _ in _given_exports(args)]
                                 + ([file_engine] if file_engine else [])))
    given = getattr(args, "engine", None)
    if given is None and len(implied) > 1:
        raise ValueError(f"the exports and --recipe-from are for {' and '.join(implied)}: a plan is priced for one "
                         "engine (--engine NAME); export for one at a time")
    profile = given if given is not None else load_engine(implied[0] if implied else None)
    for spec in implied:
        name = spec.split(",")[0]
        if name != profile.name:
            raise ValueError(f"the plan is priced for {profile.name} (--engine {profile.label()}), which a "
                             f"{name} file would not run as priced: give --engine {spec}")
    return profile, ((profile,) if given is not None or implied else None)


def _given_exports(args) -> list:
    return [(flag, getattr(args, flag[2:].replace("-", "_")), engine, what) for flag, engine, what in ENGINE_EXPORTS
            if getattr(args, flag[2:].replace("-", "_"), None) is not None]


def asks_training(args) -> bool:
    """Flags that only a training plan takes (--training itself among them)."""
    return bool(getattr(args, "training", False) or args.recipe is not None or args.compare is not None
                or getattr(args, "recipe_from", None) is not None or bool(_given_exports(args))
                or getattr(args, "top", None) is not None or getattr(args, "report", None) is not None
                or getattr(args, "engine", None) is not None or getattr(args, "search_precision", False)
                or getattr(args, "rules", None) is not None)


def wants_training(args) -> bool:
    """The training plan: asked for, or by default on a real machine unless --per-layer or a
    flag of the per-layer search (--sweep, --evaluate, ...) is given."""
    if asks_training(args):
        return True
    if getattr(args, "per_layer", False) or not real_machine(args):
        return False
    if getattr(args, "readers", None) == "summed":  # a rule of the per-layer search
        return False
    return not any(getattr(args, name, None) not in (None, False) for name in PER_LAYER_ONLY)


def check_training_flags(args, error: Callable[[str], Exception]) -> None:
    """Refuse flags that do not apply to a training plan (``error(message)`` is raised)."""
    if args.recipe is not None and getattr(args, "recipe_from", None) is not None:
        raise error("--recipe and --recipe-from both fix the configuration: give one")
    if getattr(args, "per_layer", False) and (getattr(args, "engine", None) is not None or _given_exports(args)
                                              or getattr(args, "recipe_from", None) is not None):
        raise error("--per-layer with a training flag lets per-layer splits, which no engine runs, be the plan; "
                    "--engine, --recipe-from and the engine exports keep to what an engine runs: choose one")
    for flag, given in (("--evaluate", args.evaluate is not None),
                        ("--export-jax", getattr(args, "export_jax", None) is not None),
                        ("--verify", args.verify is not None),
                        ("--measure", args.measure), ("--no-blocks", args.no_blocks),
                        ("--approx", getattr(args, "approx", None) is not None),
                        ("--param-bytes", args.param_bytes is not None), ("-a/--algo", args.algo is not None)):
        if given:
            raise error(f"{flag} does not apply to a training configuration search (--training, --recipe, --compare, "
                        "--top, --report; the default on a real machine: add --per-layer for the per-layer search)")


def stage_of_layers(candidate, network) -> list | None:
    """The pipeline stage of every layer of a pipelined plan (None without pipelines): the
    layers before the first block on stage 0, each stage's blocks, the rest on the last."""
    pipe = candidate.summary.extra.get("pipeline")
    if not pipe:
        return None
    from pase.costing.training import NetworkStructure
    from pase.planning.pipeline import stage_layout

    layout = stage_layout(NetworkStructure.of(network).blocks)
    stages = [0] * len(network.layers)
    block = 0
    for s, count in enumerate(st["blocks"] for st in pipe["stages"]):
        for members in layout.blocks[block:block + count]:
            for v in members:
                stages[v] = s
        block += count
    for v in layout.post:
        stages[v] = pipe["pp"] - 1
    return stages


def _differing_layers(network, configs, mesh_configs) -> list:
    return [network.names[v] for v, (a, b) in enumerate(zip(configs, mesh_configs)) if tuple(a) != tuple(b)]


def _unit(machine) -> str:
    """How a figure of ``machine``'s costs is labelled: ``s``, or its own unit."""
    unit = getattr(machine, "cost_unit", "seconds")
    return "s" if unit == "seconds" else unit


def _export_engines(found, args, write: Callable) -> list:
    """Write --export-torchtitan / --export-megatron / --export-deepspeed; returns the lines to
    print about them. Every file is made (by the library's writers, from the plan itself) before
    any is written: a refusal writes none."""
    from pase.outputs import engines

    targets = _given_exports(args)
    texts = []
    for flag, path, engine, what in targets:
        if engine == "torchtitan":
            settings = engines.torchtitan_settings(found, path)
            text, what = settings["text"], settings["what"]
        elif engine == "deepspeed":
            settings = engines.deepspeed_settings(found, path)
            text = json.dumps({**settings["config"], "pase": {k: settings[k] for k in
                                                              ("recipe", "command_line", "launch")}}, indent=1) + "\n"
        else:
            text = json.dumps(engines.megatron_settings(found), indent=1) + "\n"
        texts.append((path, text, what))
    for path, text, what in texts:
        write(path, text, what)
    return [f"{what} written to {path}" for path, _, what in texts]


def search_inputs(args, error: Callable) -> tuple:
    """``(args, rules)``: the flags with ``--search-precision`` made the recipe's
    ``precision=search``, and the ``--rules`` file read (``None``: the shipped rules); a
    conflict or an unreadable file raises ``error(message, 2)``."""
    from pase.core.errors import InputError

    if getattr(args, "search_precision", False):
        from pase.planning.mesh import Recipe

        if args.recipe is not None and args.recipe.precision not in (None, "search"):
            raise error(f"--search-precision searches the number format, and --recipe fixes "
                        f"precision={args.recipe.precision}: give one of them", 2)
        args = argparse.Namespace(**{**vars(args), "recipe": Recipe(**{**(args.recipe or Recipe()).fixed(),
                                                                          "precision": "search"})})
    rules = None
    if getattr(args, "rules", None) is not None:
        from pase.planning.rules import load_rules

        try:
            rules = load_rules(args.rules)
        except InputError as err:
            raise error(str(err), 2) from None
    return args, rules


def run_training(opts, args, machine, load_network: Callable, batch: int, out: IO, error: Callable,
                 model=None, model_name: str = "sequence length", rebuild: bool = True,
                 write: Callable | None = None) -> int:
    """Plan the training configuration and print it; returns the exit status (0, or 4 when
    nothing fits)."""
    from pase.core.errors import InputError
    from pase.outputs.plan_json import format_json
    from pase.outputs.training import format_training, training_report
    from pase.outputs.training_sweep import with_time_to_train, with_time_to_train_line
    from pase.planning.training_plan import plan_training

    from .budget import budget_of

    @lru_cache(maxsize=None)
    def build(sequences: int):
        return load_network(sequences)

    network = build(batch)
    args, rules = search_inputs(args, error)
    for r in (args.recipe, args.compare):
        if r is not None:
            try:
                r.check(opts.procs)
            except ValueError as err:
                raise error(str(err), 2) from None
    report = getattr(args, "report", None)
    top = getattr(args, "top", None)
    try:
        engine, keep_to = getattr(args, "priced", None) or pricing_engine(args)
        found = plan_training(build, batch, opts.procs, machine, opts.memory_cap, opts.act_bytes, args.recipe,
                              args.compare,
                              rebuild=rebuild, table_budget=opts.table_budget, engine=engine, keep_to=keep_to,
                              exporting=bool(_given_exports(args)), per_layer=bool(getattr(args, "per_layer", False)),
                              rules=rules,
                              alternatives=top or (REPORT_TOP if report is not None else 0),
                              keep_priced=report is not None)
    except ValueError as err:  # no mesh applies, a recipe no mesh meets
        raise error(str(err), 2) from None
    if found.best is None:
        least = found.least_memory
        from pase.core.units import format_bytes
        from pase.outputs.training import devices_to_fit_text, offload_fit_text

        more = devices_to_fit_text(found)
        offload = offload_fit_text(found)
        more = f"{offload}; {more}" if offload and more else offload or more
        raise error(
            f"nothing fits in {format_bytes(found.memory_cap)} per device: {network.name} on {opts.procs} devices, "
            f"batch {batch}, needs at least {format_bytes(least.summary.peak_memory_bytes)} with any configuration "
            f"searched ({least.recipe()}); " + (f"{more}; " if more else "") + found.optimal_over,
            4,
        )
    shown = build(batch // found.best.options.microbatches)
    try:
        exported = _export_engines(found, args, write)
    except InputError as err:  # the file could not be written (a full disk): status 1
        raise error(str(err), 1) from None
    except ValueError as err:  # a per-layer plan, or a plan the engine cannot run: nothing written
        raise error(str(err), 2) from None
    if opts.dot_path is not None:
        from pase.outputs.dot import dot_graph

        write(opts.dot_path, dot_graph(shown, found.best.configs, stage_of_layers(found.best, shown)).to_string(),
              "DOT graph")
        exported.append(f"DOT graph written to {opts.dot_path}")
    if report is not None:
        from pase.outputs.report import html_report

        write(report, html_report(found, shown, model, model_name), "HTML report")
        exported.append(f"HTML report written to {report}")
    if top is None:  # the report's alternatives are its own; the text and JSON show them for --top only
        found = replace(found, alternatives=[])

    budget = budget_of(args)  # --tokens: the time and cost to train (pase/cli/budget.py)
    if opts.json:
        data = training_report(found, shown, model, model_name)
        with_time_to_train(data["training"], opts.procs, budget)
        out.write(format_json(data))
    else:
        out.write(with_time_to_train_line(format_training(found, shown, model, model_name), found, budget))
        if exported:
            out.write("\n" + "\n".join(exported) + "\n")
    return 0


def run_training_command(opts, args, out: IO, err: IO | None = None) -> int:
    """The command: load the machine and network, check the output paths, plan and print."""
    from pase.core.fileio import write_atomic

    from .budget import budget_of, check_budget
    from .common import (
        answer_notes, check_outputs, effective_model, load_checked_machine, load_network, model_name, write_exports,
        write_notes,
    )
    from .errors import CliError
    from .status import ExitStatus

    if opts.readers == "summed":
        raise CliError("--readers summed applies to the per-layer search; the training model sums the readers of a "
                       "mesh plan itself and prices its per-layer search under each (docs/training.md)",
                       ExitStatus.USAGE)
    machine = load_checked_machine(opts, [opts.procs])
    network = load_network(opts, err=err)
    check_budget(budget_of(args), machine, network)
    recipe_from = getattr(args, "recipe_from", None)
    if recipe_from is not None:
        from pase.core.fileio import note_read

        note_read(recipe_from, "--recipe-from file")
    outputs = [(flag, path, what) for flag, path, _, what in _given_exports(args)]
    if getattr(args, "report", None) is not None:
        outputs.append(("--report", args.report, "HTML report"))
    check_outputs(opts, outputs)
    file_engine = None
    if recipe_from is not None:
        from pase.outputs.engine_recipes import RecipeFileError, recipe_from_file

        try:
            file_engine, args.recipe = recipe_from_file(recipe_from, opts.procs, network.batch or 1, network)
        except RecipeFileError as err:  # unreadable or unparsable: a bad input file
            raise CliError(f"--recipe-from {recipe_from}: {err}", ExitStatus.INPUT) from None
        except ValueError as err:  # what the file sets cannot be priced, or is not this run's
            raise CliError(f"--recipe-from {recipe_from}: {err}", ExitStatus.USAGE) from None
    try:
        args.priced = pricing_engine(args, file_engine)
    except ValueError as err:
        raise CliError(str(err), ExitStatus.USAGE) from None
    write_exports(opts, "network", network)
    load, rebuild = network_builder(opts, network)
    status = run_training(opts, args, machine, load, network.batch or 1, out, CliError, effective_model(opts),
                          model_name(opts), rebuild=rebuild, write=write_atomic)
    if err is not None:
        write_notes(err, answer_notes(network, opts, machine=machine))
    return status


def network_builder(opts, network) -> tuple:
    """``(load, rebuild)``: ``load(sequences)`` builds the network ``-g`` names at that batch
    (``network`` itself at its own), and whether it can (a graph file fixes its batch)."""
    from pase.sources.registry import source_of

    from .common import load_network

    # A graph file fixes its batch; every other source rebuilds at any micro-batch.
    source = source_of(opts.graph)
    rebuild = network.batch is not None and not (source is not None and source.name == "graph file")

    def load(sequences: int):
        return network if sequences == network.batch else load_network(replace(opts, batch=sequences))

    if source is not None and source.name == "torch":
        from pase.sources.rebatch import Rebatcher

        load = Rebatcher(load)  # an imported model: traced twice, then re-batched (pase/sources/rebatch.py)

    return load, rebuild
