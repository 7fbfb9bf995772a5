"""The steps the commands share: loading the network and the machine, planning with the
options, profiling, printing a plan and writing the requested files."""

from __future__ import annotations

import cProfile
from dataclasses import replace
from typing import IO

from pase.core.fileio import InputError, check_writable, current_reads, same_file, write_atomic
from pase.costing.memory import ASSUMPTIONS
from pase.machines.registry import MACHINE_NAMES, load_machine
from pase.core.units import format_bytes
from pase.outputs.dot import dot_graph
from pase.outputs.measure import format_measurement, format_profile
from pase.outputs.plan_json import format_json, report_dict
from pase.outputs.table import format_table
from pase.planning.occupancy import occupancy
from pase.planning.planner import Plan, plan
from pase.sources.builtin import entry as builtin_entry
from pase.sources.registry import load, source_of

from .errors import CliError
from .options import DEFAULT_BW, DEFAULT_FLOPS, PROFILE_LIMIT, Options
from .progress import Progress, notice, show_progress
from .status import ExitStatus

__all__ = [
    "load_network", "load_checked_machine", "memory_cap", "effective_model", "model_name", "plan_with_options",
    "nothing_fits_message", "Profiler", "write_dot", "print_plan", "check_outputs", "write_exports", "run_verify",
    "verified_status", "check_distinct_outputs", "machine_defaults", "INPUTS", "check_occupancy", "answer_notes",
    "write_notes", "declares_real_model", "idle_note", "paper_machine_note",
]


def load_network(opts: Options, model_from_file: bool = False, err: IO | None = None):
    """The network ``-g`` names; ``err``: where its source's notes go (fields left out)."""
    options = {} if opts.loss is None else {"loss": None if opts.loss == "none" else opts.loss}
    if options and not opts.graph.startswith("torch:"):
        raise CliError(f"--loss applies only to imported models (-g torch:...), not to {opts.graph!r}", ExitStatus.USAGE)
    if opts.mtp:
        if not opts.graph.startswith("hf:"):
            raise CliError(f"--mtp applies only to Hugging Face configs (-g hf:...), not to {opts.graph!r}",
                           ExitStatus.USAGE)
        options["mtp"] = True
    try:
        network = load(opts.graph, opts.batch, opts.model, **options)
        if opts.mtp and not (network.architecture or {}).get("features", {}).get("mtp"):
            raise CliError(f"--mtp adds DeepSeek-V3's multi-token-prediction module, and {network.name} has none "
                           "(its config sets no num_nextn_predict_layers): drop --mtp", ExitStatus.USAGE)
        if err is not None:
            for note in network.notes:
                err.write(f"pase: note: {note}\n")
        return network if opts.readers is None else network.with_readers(opts.readers)
    except InputError as err:
        raise CliError(str(err), ExitStatus.INPUT) from None
    except ValueError as err:
        message = str(err)
        if model_from_file and "has no model size" in message:
            message = (f"the strategy file records model width {opts.model}, which graph {opts.graph!r} "
                       "does not take (it has no width); drop -g or give the file of a graph with a width")
        raise CliError(message, ExitStatus.USAGE) from None


def declares_real_model(network, spec: str) -> bool:
    """A network its source declares as a real model: an architecture (``hf:`` configs and the
    built-in GPT, Llama, Mixtral and flagship graphs declare one) or a PyTorch model imported
    with ``torch:``. The paper's graphs and graph files declare none."""
    source = source_of(spec)
    return network.architecture is not None or (source is not None and source.name == "torch")


def answer_notes(network, opts: Options, found=None, machine=None) -> list:
    """The ``pase: note:`` lines that go with an answer (written once it is found, so that a
    refusal stays one line): ``idle_note``, ``paper_machine_note`` and the machine's own notes
    (``Machine.notes``) where they apply."""
    own = [f"pase: note: {line}" for line in (machine.notes if machine is not None else ())]
    return [note for note in (idle_note(network, found), paper_machine_note(network, opts)) if note] + own


def idle_note(network, found) -> str | None:
    """The note of a count that leaves devices idle (``found``: its ``Occupancy``), else None."""
    if found is None or not found.idle:
        return None
    what = f"{network.name}{'' if network.batch is None else f' (batch {network.batch})'}"
    return (f"pase: note: {what} on {found.procs:,} devices: no configuration of any layer uses more than "
            f"{found.useful:,} (each dimension splits by its divisors), so the plan, the best on at most "
            f"{found.procs:,} devices, leaves at least {found.idle:,} replicating work")


def paper_machine_note(network, opts: Options) -> str | None:
    """The note of a real model priced on the paper's machine because ``--machine`` was left
    out (a plan of terabytes per device is no error there), else None."""
    if opts.machine_given or not declares_real_model(network, opts.graph):
        return None
    flops = opts.flops if opts.flops is not None else DEFAULT_FLOPS
    bw = opts.bw if opts.bw is not None else DEFAULT_BW
    return (f"pase: note: {network.name} is priced on the paper's machine ({flops:g} TFLOPS and {bw:g} GB/s per "
            "device, no device memory, costs in FLOP-equivalents) since no --machine was given; name a real one "
            "with --machine (pase machines lists the presets)")


def write_notes(err: IO, notes: list) -> None:
    for note in notes:
        err.write(note + "\n")


def machine_defaults(opts: Options, machine) -> Options:
    """``opts`` with the memory model's bytes per activation taken from a machine that states
    them (a machine file's ``act_bytes``) when ``--act-bytes`` was not given."""
    act_bytes = machine.act_bytes
    if opts.act_bytes_given or act_bytes is None:
        return opts
    return replace(opts, act_bytes=float(act_bytes))


def load_checked_machine(opts: Options, procs) -> object:
    """The machine of ``--machine``, checked against every device count before any work."""
    try:
        machine = load_machine(opts.machine, opts.flops, opts.bw)
        for p in procs:
            machine.check_procs(p)
    except ValueError as err:  # an unknown name, or a machine file or its table that is missing or invalid
        raise CliError(str(err), ExitStatus.USAGE) from None
    return machine


def memory_cap(opts: Options, machine) -> float | None:
    """``--memory``, or on a calibrated machine its device memory (not while timing with --measure)."""
    if opts.memory_cap is not None or opts.measure:
        return opts.memory_cap
    return machine.memory_bytes


def effective_model(opts: Options) -> int | None:
    """The ``-m`` value the graph was built with (given or the graph's default), if it has one."""
    entry = builtin_entry(opts.graph)
    if entry is None:  # another source records -m when it takes one (hf: its sequence length)
        source = source_of(opts.graph)
        return opts.model if source is not None and "model" in source.sizes else None
    if entry.model_help is None:
        return None
    return opts.model if opts.model is not None else entry.default_model


def model_name(opts: Options) -> str:
    """How outputs name the ``-m`` value of the graph (``model width``, ``sequence length``)."""
    entry = builtin_entry(opts.graph)
    if entry is not None:
        return entry.model_name
    source = source_of(opts.graph)
    return source.model_name if source is not None else "model width"


def plan_with_options(network, procs: int, machine, opts: Options, err: IO, bar: bool = True) -> Plan:
    """``pase.plan`` with the options' machine, ordering, budget, cap and progress bar."""
    progress = None
    # The approximate search runs without a cap (an explicit --memory is refused with it).
    cap = None if opts.approx is not None else memory_cap(opts, machine)
    if bar and show_progress(opts, err):
        if cap is None:
            progress = Progress(err, f"{network.name} p={procs}")
        else:
            progress = Progress(err, f"{network.name} p={procs} capped", "DP")
    try:
        return plan(network, procs, machine, cap, opts.algo, progress,
                    memory_model=opts.memory_model, table_budget=opts.table_budget, blocks=opts.blocks,
                    exportable=opts.exportable, approx=opts.approx,
                    notice=notice(err, f"{network.name} on {procs} devices"))
    finally:
        if progress is not None:
            progress.close()


def check_occupancy(network, procs: int, opts: Options):
    """The ``Occupancy`` of ``procs`` devices (``pase.planning.occupancy``). A count no
    configuration of any layer can fill is planned with the paper's semantics (every
    configuration uses at most ``procs`` devices; ``answer_notes`` says so); refused (usage
    status) only when its search would take many minutes, unless ``--allow-replication``."""
    found = occupancy(network, procs)
    if found.long_search and not opts.allow_replication:
        raise CliError(
            f"{network.name}{'' if network.batch is None else f' (batch {network.batch})'} cannot occupy {procs:,} "
            f"devices: no configuration of any layer uses more than {found.useful:,} (each dimension splits by its "
            f"divisors), and the search would need at least {format_bytes(found.table_bytes)} of cost tables (many "
            f"minutes) for a plan that leaves {found.idle:,} devices replicating work; search fewer devices, or pass "
            "--allow-replication", ExitStatus.USAGE)
    return found


def nothing_fits_message(planned: Plan, opts: Options) -> str:
    m = planned.memory
    return (
        f"nothing fits in {format_bytes(m.cap_bytes)} per device: {planned.network.name} on {planned.procs} devices, "
        f"batch {opts.batch if opts.batch is not None else planned.network.batch}, needs at least "
        f"{format_bytes(m.least_bytes)} per device with any strategy "
        f"(data parallelism: {format_bytes(m.data_parallel_per_device_bytes)}); memory model: {m.param_bytes:g} "
        f"bytes per parameter, {m.act_bytes:g} per activation, {ASSUMPTIONS}; "
        "--training also searches ZeRO, recomputation, micro-batches and pipelines"
    )


class Profiler:
    """``--profile``: cProfile the blocks run ``with`` it, print the hottest functions after."""

    def __init__(self, enabled: bool):
        self.profile = cProfile.Profile() if enabled else None

    def __enter__(self):
        if self.profile is not None:
            self.profile.enable()
        return self

    def __exit__(self, *exc) -> bool:
        if self.profile is not None:
            self.profile.disable()
        return False

    def write(self, opts: Options, out: IO, err: IO) -> None:
        if self.profile is not None:
            (err if opts.json else out).write(format_profile(self.profile, PROFILE_LIMIT))


def write_dot(opts: Options, network, configs=None) -> None:
    write_atomic(opts.dot_path, dot_graph(network, configs).to_string(), "DOT graph")


def print_plan(planned: Plan, opts: Options, out: IO, measure=None, verified=None) -> None:
    model = effective_model(opts)
    if opts.json:
        data = report_dict(planned, model, measure)
        if verified is not None:
            data["verify"] = verified.to_dict()
        out.write(format_json(data))
        return
    out.write(format_table(planned, model, model_name=model_name(opts)))
    if measure is not None:
        out.write("\n" + format_measurement(measure))
    if verified is not None:
        out.write("\n" + verified.table().rstrip("\n") + "\n")
    if opts.dot_path is not None:
        out.write(f"\nDOT graph written to {opts.dot_path}\n")


def _flag_inputs(opts: Options) -> list:
    """``(flag, path)`` of the files the flags name as inputs: the strategy, graph and machine
    files (known before they are read)."""
    inputs = []
    if opts.evaluate is not None and opts.evaluate != "-":
        inputs.append(("--evaluate", opts.evaluate))
    source = source_of(opts.graph)
    if source is not None and source.name != "built-in":
        path = opts.graph.partition(":")[2] if source.prefix is not None else opts.graph
        if source.name == "torch":  # FILE.py:FUNCTION (a module name is no file)
            path = path.rpartition(":")[0]
        if path:
            inputs.append(("-g", path))
    if opts.machine not in MACHINE_NAMES:
        inputs.append(("--machine", opts.machine))
    return inputs


#: The inputs every output is checked against: ``inputs(opts) -> [(label, path)]``, where
#: ``label`` says what the file is in the refusal. The files a flag names, and every file read
#: so far in this run (``pase.core.fileio.recording_reads``, which ``main`` opens around every
#: command: a machine file's measured table, an hf: config, a recipe file read with
#: ``read_json``). A new input read through ``read_json`` (or reported with ``note_read``) needs
#: nothing here; one that must be refused before it is read adds a function.
INPUTS = [
    lambda opts: [(f"input file of {flag}", path) for flag, path in _flag_inputs(opts)],
    lambda opts: [(f"{what}", path) for what, path in current_reads()],
]


def _input_files(opts: Options) -> list:
    """``(label, path)`` of every input of the run known now (``INPUTS``)."""
    return [entry for inputs in INPUTS for entry in inputs(opts)]


def _output_files(opts: Options, extra=()) -> list:
    """``(flag, path)`` of every file the run writes (``extra``: a command's own outputs)."""
    outputs = [("--dot-path", opts.dot_path)] if opts.dot_path is not None else []
    return outputs + [(exporter.flag, path) for exporter, path in opts.exports] + list(extra)


def check_distinct_outputs(opts: Options, extra=()) -> None:
    """Refuse (usage status) an output path that is an input's or another output's, links
    resolved, before anything is written; ``extra``: ``(flag, path)`` of outputs a command
    writes beside the shared ones (``--export-megatron``, a report). Called before the inputs
    are loaded (the files the flags name) and again by ``check_outputs`` after (every file
    they read, too)."""
    outputs = _output_files(opts, extra)
    inputs = _input_files(opts)
    for i, (flag, path) in enumerate(outputs):
        for label, in_path in inputs:
            if same_file(path, in_path):
                raise CliError(f"{flag} {path} would overwrite the {label} ({in_path}), an input of this run: "
                               "choose another output file", ExitStatus.USAGE)
        for other_flag, other in outputs[:i]:
            if same_file(path, other):
                raise CliError(f"{other_flag} {other} and {flag} {path} name the same file: choose one file "
                               "per output", ExitStatus.USAGE)


def check_outputs(opts: Options, extra=()) -> None:
    """Refuse unwritable output paths, and outputs over inputs or over each other, before any
    work; ``extra``: ``(flag, path, what)`` of a command's own outputs."""
    check_distinct_outputs(opts, [(flag, path) for flag, path, _ in extra])
    for _, path, what in extra:
        check_writable(path, what)
    if opts.dot_path is not None:
        check_writable(opts.dot_path, "DOT graph")
    for exporter, path in opts.exports:
        check_writable(path, exporter.what)


def write_exports(opts: Options, of: str, value) -> None:
    """Write the file of every ``--export-*`` flag given that exports ``of`` (a network or a plan)."""
    for exporter, path in opts.exports:
        if exporter.of == of:
            try:
                text = exporter.text(value)
            except ValueError as error:  # a configuration on a number of devices that does not divide p
                raise CliError(f"{exporter.flag}: {error}") from None
            write_atomic(path, text, exporter.what)


def run_verify(opts: Options, planned: Plan):
    """--verify: run the plan on XLA host devices in a child process (``pase.outputs.jax.verify``)."""
    if opts.verify is None:
        return None
    if opts.verify == "torch":
        return _verify_torch(planned)
    from pase.outputs.jax.common import JaxMissing
    from pase.outputs.jax.verify import verify  # imports no JAX here: the run is a child process

    try:
        return verify(planned, dtype="float64" if opts.verify == "jax64" else "float32")
    except JaxMissing as error:
        raise CliError(str(error), ExitStatus.USAGE) from None
    except (ValueError, RuntimeError) as error:
        raise CliError(f"--verify {opts.verify}: {error}") from None


def _verify_torch(planned: Plan):
    """--verify torch: run the plan on p gloo CPU processes with DTensor (``pase.outputs.torch.verify``)."""
    from pase.outputs.torch.verify import TorchMissing, verify_torch  # no torch here: the run is p children

    try:
        return verify_torch(planned)
    except TorchMissing as error:
        raise CliError(str(error), ExitStatus.USAGE) from None
    except (ValueError, RuntimeError) as error:
        raise CliError(f"--verify torch: {error}") from None


def verified_status(verified, err: IO) -> int:
    if verified is not None and not verified.ok:
        err.write("pase: error: --verify: the sharded run's numbers differ from the unsharded run (see the report)\n")
        return ExitStatus.VERIFY
    return ExitStatus.OK
