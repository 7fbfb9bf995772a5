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
             "zero (0-3), recompute (none, selective, full; op: torchtitan's operator policy), microbatch "
             "(sequences per micro-batch per data-parallel rank), sp (sequence parallelism, true/false), "
             "tp_overlap (Megatron's --tp-comm-overlap, true/false), ep (expert parallelism, dividing dp), "
             "schedule (1f1b, interleaved) and vpp (model chunks per device, interleaved); precision (bf16, fp8, "
             "mxfp8, nvfp4: the blocks' weight products; search: --search-precision), scaling (fp8: delayed, "
             "current, rowwise, blockwise) and fp8_gather (ZeRO all-gathers in FP8, true/false).")
    add("--search-precision", action="store_true",
        help="let the search choose the number format among those the machine runs (bf16 unless asked: a "
             "format changes the numerics); the same as --recipe precision=search.")
    add("--engine", type=_engine, default=None, metavar="NAME[,KEY=VALUE...]|FILE.json",
        help="the training engine the plan runs on: megatron (the default), torchtitan, fsdp (plain PyTorch FSDP, "
             "as llm-foundry runs it), deepspeed, or a profile file; keys switch its kernels and settings, e.g. "
             "torchtitan,compile=true (docs/engines.md).")
    add("--compare", type=_recipe, default=None, metavar="KEY=VALUE,...",
        help="also price this recipe (its fastest fitting variant) next to the plan.")
    add("--rules", metavar="FILE.json", default=None,
        help="parallel rules: which mesh axis (dp, tp, cp, ep, sp) splits which dimension role (batch, heads, "
             "mlp, vocab, sequence, ...); default pase/planning/data/parallel_rules.json (docs/roles.md). "
             "Implies --training.")
    add("--export-torchtitan", metavar="FILE", default=None,
        help="write the plan's mesh as torchtitan settings (parallelism, activation checkpointing, batch) in JSON, "
             "with the same as one line of its command-line options.")
    add("--export-megatron", metavar="FILE", default=None,
        help="write the plan's mesh as Megatron-LM arguments (JSON, and one command line).")
    _add_front_door_flags(add)


# --- the front door (issue 34): --report, --top, --per-layer; the training plan by default on
# --- a real machine (a preset other than paper, or a machine file).

#: Flags that only the per-layer (paper-style) search takes: given on a real machine, they ask
#: for it as --per-layer does.
PER_LAYER_ONLY = ("sweep", "evaluate", "export_jax", "verify", "measure", "no_blocks", "approx", "param_bytes", "algo")


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
             "on --machine paper the per-layer search is the default).")
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


def asks_training(args) -> bool:
    """Flags that only a training plan takes (--training itself among them)."""
    return bool(getattr(args, "training", False) or args.recipe is not None or args.compare is not None
                or args.export_torchtitan is not None or args.export_megatron is not None
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
    if getattr(args, "per_layer", False):
        raise error("--per-layer asks for the per-layer search; --training, --recipe, --compare, --top, --report and "
                    "the engine exports ask for a training plan: choose one")
    for flag, given in (("--sweep", args.sweep is not None), ("--evaluate", args.evaluate is not None),
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


def _export_engines(found, network, batch: int, args, write: Callable) -> list:
    """Write --export-torchtitan / --export-megatron; returns the lines to print about them."""
    from pase.outputs.engines import megatron_settings, torchtitan_settings
    from pase.planning.training_search import tokens_of

    targets = [(args.export_torchtitan, torchtitan_settings, "torchtitan settings"),
               (args.export_megatron, megatron_settings, "Megatron-LM arguments")]
    if all(path is None for path, _, _ in targets):
        return []
    plan = found.best
    lines = []
    if plan.mesh is None:
        nearest = found.mesh_search.best
        if nearest is None:
            raise ValueError("the plan is not a mesh and no mesh fits: nothing to export")
        differ = _differing_layers(network, plan.configs, nearest.configs) if len(nearest.configs) == len(
            plan.configs) else list(network.names)
        lines.append(f"the plan is not a mesh: {len(differ)} layers differ from the nearest mesh "
                     f"({', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''}); exported that mesh, "
                     f"{nearest.recipe()}: step {nearest.summary.step_seconds:.4g} against the plan's "
                     f"{plan.summary.step_seconds:.4g} {_unit(found.machine)}")
        plan = nearest
    tokens = tokens_of(network)
    sequence = None if tokens is None or not network.batch else tokens // network.batch
    for path, writer, what in targets:
        if path is not None:
            write(path, json.dumps(writer(plan, batch, sequence), indent=1) + "\n", what)
            lines.append(f"{what} written to {path}")
    return lines


def run_training(opts, args, machine, load_network: Callable, batch: int, out: IO, error: Callable,
                 model=None, model_name: str = "sequence length", rebuild: bool = True,
                 write: Callable | None = None) -> int:
    """Plan the training configuration and print it; returns the exit status (0, or 4 when
    nothing fits)."""
    from pase.core.errors import InputError
    from pase.outputs.plan_json import format_json
    from pase.outputs.training import format_training, training_report
    from pase.planning.engine import load_engine
    from pase.planning.training_plan import plan_training

    @lru_cache(maxsize=None)
    def build(sequences: int):
        return load_network(sequences)

    network = build(batch)
    if getattr(args, "search_precision", False):
        from pase.planning.mesh import Recipe

        if args.recipe is not None and args.recipe.precision not in (None, "search"):
            raise error(f"--search-precision searches the number format, and --recipe fixes "
                        f"precision={args.recipe.precision}: give one of them", 2)
        args = argparse.Namespace(**{**vars(args), "recipe": Recipe(**{**(args.recipe or Recipe()).fixed(),
                                                                          "precision": "search"})})
    for r in (args.recipe, args.compare):
        if r is not None:
            try:
                r.check(opts.procs)
            except ValueError as err:
                raise error(str(err), 2) from None
    rules = None
    if getattr(args, "rules", None) is not None:
        from pase.planning.rules import load_rules

        try:
            rules = load_rules(args.rules)
        except InputError as err:
            raise error(str(err), 2) from None
    cap = opts.memory_cap if opts.memory_cap is not None else machine.memory_bytes
    report = getattr(args, "report", None)
    top = getattr(args, "top", None)
    try:
        engine = getattr(args, "engine", None) or load_engine(None)
        found = plan_training(build, batch, opts.procs, machine, cap, opts.act_bytes, args.recipe, args.compare,
                              rebuild=rebuild, table_budget=opts.table_budget, engine=engine, rules=rules,
                              alternatives=top or (REPORT_TOP if report is not None else 0),
                              keep_priced=report is not None)
    except ValueError as err:  # no mesh applies, a recipe no mesh meets
        raise error(str(err), 2) from None
    if found.best is None:
        least = found.least_memory
        from pase.core.units import format_bytes

        raise error(
            f"nothing fits in {format_bytes(cap)} per device: {network.name} on {opts.procs} devices, batch {batch}, "
            f"needs at least {format_bytes(least.summary.peak_memory_bytes)} with any configuration searched "
            f"({least.recipe()}); {found.optimal_over}",
            4,
        )
    shown = build(batch // found.best.options.microbatches)
    try:
        exported = _export_engines(found, shown, batch, args, write)
    except InputError as err:  # the file could not be written (a full disk): status 1
        raise error(str(err), 1) from None
    except ValueError as err:  # a per-layer plan with no mesh beside it that fits
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

    if opts.json:
        out.write(format_json(training_report(found, shown, model, model_name)))
    else:
        out.write(format_training(found, shown, model, model_name))
        if exported:
            out.write("\n" + "\n".join(exported) + "\n")
    return 0


def run_training_command(opts, args, out: IO, err: IO | None = None) -> int:
    """The command: load the machine and network, check the output paths, plan and print."""
    from pase.core.fileio import write_atomic
    from pase.sources.registry import source_of

    from .common import check_outputs, effective_model, load_checked_machine, load_network, model_name, write_exports
    from .errors import CliError
    from .status import ExitStatus

    if opts.readers == "summed":
        raise CliError("--readers summed applies to the per-layer search; the training model prices each reader's "
                       "gradient reductions itself (docs/training.md)", ExitStatus.USAGE)
    machine = load_checked_machine(opts, [opts.procs])
    network = load_network(opts, err=err)
    engines = (("--export-torchtitan", args.export_torchtitan, "torchtitan settings"),
               ("--export-megatron", args.export_megatron, "Megatron-LM arguments"),
               ("--report", getattr(args, "report", None), "HTML report"))
    check_outputs(opts, [entry for entry in engines if entry[1] is not None])
    write_exports(opts, "network", network)
    # A graph file fixes its batch; every other source rebuilds at any micro-batch.
    source = source_of(opts.graph)
    rebuild = network.batch is not None and not (source is not None and source.name == "graph file")

    def load(sequences: int):
        return network if sequences == network.batch else load_network(replace(opts, batch=sequences))

    if source is not None and source.name == "torch":
        from pase.sources.rebatch import Rebatcher

        load = Rebatcher(load)  # an imported model: traced twice, then re-batched (pase/sources/rebatch.py)

    return run_training(opts, args, machine, load, network.batch or 1, out, CliError, effective_model(opts),
                        model_name(opts), rebuild=rebuild, write=write_atomic)
