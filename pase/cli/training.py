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
             "schedule (1f1b, interleaved) and vpp (model chunks per device, interleaved).")
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


def wants_training(args) -> bool:
    return bool(getattr(args, "training", False) or args.recipe is not None or args.compare is not None
                or getattr(args, "rules", None) is not None
                or args.export_torchtitan is not None or args.export_megatron is not None)


def check_training_flags(args, error: Callable[[str], Exception]) -> None:
    """Refuse flags that do not apply to a training plan (``error(message)`` is raised)."""
    for flag, given in (("--sweep", args.sweep is not None), ("--evaluate", args.evaluate is not None),
                        ("--export-jax", getattr(args, "export_jax", None) is not None),
                        ("--verify", args.verify is not None),
                        ("--measure", args.measure), ("--no-blocks", args.no_blocks),
                        ("--approx", getattr(args, "approx", None) is not None),
                        ("--param-bytes", args.param_bytes is not None), ("-a/--algo", args.algo is not None)):
        if given:
            raise error(f"{flag} does not apply to a training configuration search (--training, --recipe, --compare)")


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
                     f"{plan.summary.step_seconds:.4g}")
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
    from pase.planning.training_plan import plan_training

    @lru_cache(maxsize=None)
    def build(sequences: int):
        return load_network(sequences)

    network = build(batch)
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
    try:
        found = plan_training(build, batch, opts.procs, machine, cap, opts.act_bytes, args.recipe, args.compare,
                              rebuild=rebuild, table_budget=opts.table_budget, rules=rules)
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

    if opts.json:
        out.write(format_json(training_report(found, shown, model, model_name)))
    else:
        out.write(format_training(found, shown, model, model_name))
        if exported:
            out.write("\n" + "\n".join(exported) + "\n")
    return 0


def run_training_command(opts, args, out: IO) -> int:
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
    network = load_network(opts)
    engines = (("--export-torchtitan", args.export_torchtitan, "torchtitan settings"),
               ("--export-megatron", args.export_megatron, "Megatron-LM arguments"))
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
