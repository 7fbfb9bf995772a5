"""``pase --evaluate FILE``: cost a given strategy. The settings a strategy file records, how
flags given override them (with a note), and the plans priced on machines or graphs from files."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import IO

from pase.core.checks import is_int, is_number
from pase.core.fileio import InputError, read_json
from pase.machines.registry import MACHINE_NAMES, preset_of
from pase.model.readers import READER_RULES
from pase.planning.planner import evaluate_plan, strategy_from_json
from pase.sources.builtin import GRAPHS
from pase.sources.registry import source_of

from .common import (
    machine_defaults, Profiler, check_distinct_outputs, check_outputs, write_exports, load_checked_machine, load_network, memory_cap, print_plan,
    run_verify, verified_status, write_dot, answer_notes, write_notes,
)
from .errors import CliError
from .options import MACHINE_RANGE, MAX_DIMENSION, MAX_PROCS, options_from_args
from .status import ExitStatus

__all__ = ["run_evaluate"]


# Settings a strategy file may record (a previous --json output does), and their checks.
_FILE_SETTINGS = {
    "graph": lambda v: isinstance(v, str) and v in GRAPHS,
    "procs": lambda v: is_int(v) and 1 <= v <= MAX_PROCS,
    "batch": lambda v: is_int(v) and 1 <= v <= MAX_DIMENSION,
    "model": lambda v: v is None or (is_int(v) and 1 <= v <= MAX_DIMENSION),
    "flops": lambda v: is_number(v) and MACHINE_RANGE[0] <= v <= MACHINE_RANGE[1],
    "bw": lambda v: is_number(v) and MACHINE_RANGE[0] <= v <= MACHINE_RANGE[1],
    "param_bytes": lambda v: is_number(v) and 0 <= v <= 1e6,
    "act_bytes": lambda v: is_number(v) and 0 <= v <= 1e6,
    "cap_bytes": lambda v: is_number(v) and 0 < v < 1e30,
    "machine": lambda v: isinstance(v, str) and v in MACHINE_NAMES,
    "readers": lambda v: v in READER_RULES,
}


#: How a recorded setting is named on the command line, for the notes on overrides.
_FLAG_OF = {"graph": "-g", "procs": "-p", "batch": "-b", "model": "-m", "flops": "--flops", "bw": "--bw",
            "param_bytes": "--param-bytes", "act_bytes": "--act-bytes", "cap_bytes": "--memory",
            "machine": "--machine", "readers": "--readers"}


def _recorded_machine(recorded: dict):
    """``(name, None)`` for the reference machine or a preset recorded in a plan, else
    ``(None, name)``: a machine from a file (a file may reuse a preset's name with other figures)."""
    name = preset_of(recorded)
    return (name, None) if name is not None else (None, recorded.get("name"))


def _training_recipe(data, where: str):
    """The fully fixed recipe of a training plan's ``--json`` output (its ``training.recipe``
    with the degrees it leaves at 1 and the schedule said), or None for any other file."""
    from pase.planning.mesh import Recipe, parse_recipe

    training = data.get("training") if isinstance(data, dict) else None
    if not isinstance(training, dict):
        return None
    text, mesh = training.get("recipe"), training.get("mesh")
    if not isinstance(text, str) or not isinstance(mesh, dict):
        raise CliError(f"{where}: a training plan without a mesh (per-layer splits) cannot be read back; "
                       "price its nearest mesh plan (--recipe)")
    try:
        recipe = parse_recipe(text)
        fixed = recipe.fixed()
        for key in ("pp", "cp", "ep"):
            fixed.setdefault(key, 1)
        if fixed["tp"] > 1:
            fixed.setdefault("sp", True)
        if fixed["pp"] > 1:
            fixed.setdefault("schedule", "1f1b")
        fixed.setdefault("tp_overlap", False)
        return parse_recipe(Recipe(**fixed).text())  # its own words (modules and offload joined by +)
    except (ValueError, KeyError, TypeError) as err:
        raise CliError(f"{where}: invalid training recipe {json.dumps(text)[:80]}: {err}") from None


def _run_training_plan(args: argparse.Namespace, data: dict, recipe, where: str, out: IO) -> int:
    """Price a training plan read back: the recorded graph, devices, batch, sequence and
    machine (each overridden by its flag) under its recipe, every choice fixed."""
    from .training import run_training_command

    graph = data.get("graph")
    if args.graph is None:
        if not (isinstance(graph, str) and graph in GRAPHS):
            raise CliError(f"{where} records graph {str(graph)[:80]!r}, which is not a built-in graph: name its "
                           "source again with -g", ExitStatus.USAGE)
        args.graph = graph
    for key in ("procs", "batch", "model"):
        if getattr(args, key) is None and is_int(data.get(key)):
            setattr(args, key, data[key])
    if args.machine is None and isinstance(data.get("machine"), dict):
        name, file_name = _recorded_machine(data["machine"])
        if name is None:
            raise CliError(f"{where} was priced on machine {str(file_name)[:80]!r} from a machine file: name it "
                           "again with --machine FILE.json (or choose another machine)", ExitStatus.USAGE)
        args.machine = name
    if args.memory is None and isinstance(data.get("memory_cap_bytes"), (int, float)):
        args.memory = data["memory_cap_bytes"] / 1e9
    args.recipe, args.training, args.evaluate = recipe, True, None
    return run_training_command(options_from_args(args), args, out)


def _read_strategy_file(path: str, data=None) -> tuple:
    """``(configs, settings, where, extra)`` from a strategy file; ``CliError`` for anything malformed.

    ``where`` names the file in messages. ``extra`` may hold ``"file graph"`` and ``"file
    machine"``: the names of a graph and a machine that the plan was made with and that came
    from files (not built in), which the command line must name again; with a file graph,
    ``"file sizes"`` holds its recorded batch and width, which apply again when ``-g`` names
    a source that takes them (``torch:``, ``hf:``; a graph file fixes its own).
    """
    where = f"strategy file {path}" if path != "-" else "strategy file on standard input"
    try:
        configs, settings = strategy_from_json(read_json(path, "strategy file") if data is None else data, where)
    except InputError as err:
        raise CliError(str(err)) from None
    extra = {}
    recorded = settings.get("machine")
    if isinstance(recorded, dict):
        # The machine a plan was priced on: the reference machine or a preset by name; a
        # machine from a file must be named again with --machine.
        if not isinstance(recorded.get("name"), str):
            raise CliError(f"{where}: invalid 'machine': {json.dumps(recorded)[:80]}")
        settings["machine"], extra["file machine"] = _recorded_machine(recorded)
        if settings["machine"] is None:
            del settings["machine"]
    graph = settings.get("graph")
    if isinstance(graph, str) and graph not in GRAPHS:
        # A graph file's or an imported model's network name: -g must name its source again.
        # Its batch and width apply if that source takes them (run_evaluate decides).
        extra["file graph"] = graph
        settings.pop("graph")
        extra["file sizes"] = {key: settings.pop(key) for key in ("batch", "model") if key in settings}
        for key, value in extra["file sizes"].items():
            if value is not None and not _FILE_SETTINGS[key](value):
                raise CliError(f"{where}: invalid {key!r}: {json.dumps(value)[:80]}")
    for key, value in list(settings.items()):
        if key not in _FILE_SETTINGS:
            del settings[key]  # recorded, but not a setting this version takes
        elif not _FILE_SETTINGS[key](value):
            raise CliError(f"{where}: invalid {key!r}: {json.dumps(value)[:80]}")
    return configs, settings, where, extra


def _overrides(args: argparse.Namespace, settings: dict) -> list:
    """Notes on the flags that override settings recorded in a strategy file."""
    given = {"cap_bytes": None if args.memory is None else args.memory * 1e9}
    notes = []
    for key, recorded in settings.items():
        value = given[key] if key in given else getattr(args, key, None)
        if value is not None and value != recorded:
            shown = f"{value / 1e9:g} GB" if key == "cap_bytes" else value
            was = f"{recorded / 1e9:g} GB" if key == "cap_bytes" else recorded
            notes.append(f"pase: note: {_FLAG_OF[key]} {shown} overrides the file's {key.replace('_', ' ')} {was}")
    return notes


def run_evaluate(args: argparse.Namespace, out: IO, err: IO) -> int:
    where = f"strategy file {args.evaluate}" if args.evaluate != "-" else "strategy file on standard input"
    try:
        data = read_json(args.evaluate, "strategy file")
    except InputError as error:
        raise CliError(str(error)) from None
    recipe = _training_recipe(data, where)
    if recipe is not None:
        return _run_training_plan(args, data, recipe, where, out)
    configs, settings, where, extra = _read_strategy_file(args.evaluate, data)
    if "file graph" in extra and args.graph is None:
        raise CliError(f"{where} records graph {extra['file graph'][:80]!r}, which is not a built-in graph: name its "
                       "graph file (or torch:...) with -g", ExitStatus.USAGE)
    if "file graph" in extra and args.graph in GRAPHS:
        raise CliError(f"{where}: invalid 'graph': {json.dumps(extra['file graph'])[:80]} (not a built-in graph)")
    if args.machine is None and extra.get("file machine"):
        raise CliError(f"{where} was priced on machine {extra['file machine'][:80]!r} from a machine file: name it "
                       "again with --machine FILE.json (or choose another machine)", ExitStatus.USAGE)
    if args.graph is not None and args.graph != settings.get("graph", args.graph):
        # The recorded width belongs to the recorded graph, not to the one asked for.
        settings.pop("model", None)
    recorded_batch = settings.get("batch", extra.get("file sizes", {}).get("batch"))
    source = source_of(args.graph) if args.graph is not None else None
    if source is not None:
        # The sizes recorded for the plan's graph apply to a source that takes them (an
        # imported model or a Hugging Face config is rebuilt at the plan's batch); a graph
        # file fixes its own.
        for key, value in extra.get("file sizes", {}).items():
            if key in source.sizes and value is not None:
                settings[key] = value
        for key in ("batch", "model"):
            if key not in source.sizes:
                settings.pop(key, None)
    if args.machine is not None and args.machine != settings.get("machine", args.machine):
        # Recorded rates belong to the recorded machine: pricing on another one drops them.
        for key in ("flops", "bw"):
            settings.pop(key, None)
    if settings.get("machine", "paper") != "paper" and (args.flops is not None or args.bw is not None):
        settings.pop("machine")
    opts = options_from_args(args, settings)
    if args.memory is None and "cap_bytes" in settings:
        opts = replace(opts, memory_cap=float(settings["cap_bytes"]))
    for note in _overrides(args, settings):
        err.write(note + "\n")
    check_distinct_outputs(opts)
    machine = load_checked_machine(opts, [opts.procs])
    opts = machine_defaults(opts, machine)
    network = load_network(opts, model_from_file=args.model is None and "model" in settings, err=err)
    if args.batch is None and recorded_batch is not None and network.batch != recorded_batch:
        err.write(f"pase: note: {where} records batch {recorded_batch}, which {opts.graph} fixes at "
                  f"{network.batch}: the plan is priced at batch {network.batch}\n")
    check_outputs(opts)
    write_exports(opts, "network", network)
    with Profiler(opts.profile) as profiler:
        try:
            planned = evaluate_plan(network, configs, opts.procs, machine, opts.memory_model, memory_cap(opts, machine))
        except ValueError as error:
            raise CliError(f"{where}: {error}") from None
    if opts.dot_path is not None:
        write_dot(opts, network, planned.configs)
    write_exports(opts, "plan", planned)
    verified = run_verify(opts, planned)
    write_notes(err, answer_notes(network, opts, machine=machine))
    print_plan(planned, opts, out, verified=verified)
    profiler.write(opts, out, err)
    return verified_status(verified, err)
