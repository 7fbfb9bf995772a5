"""The command line: ``scheduler.py`` and the ``pase`` console script (``cli.md``).

``main(argv) -> exit status``: parse the flags into ``Options``, call the library
(``graphs.load`` -> ``pase.plan`` or ``pase.evaluate_plan``), render the result. It prints to
the streams it is given and never exits the interpreter itself.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import sys
from dataclasses import dataclass, replace
from typing import IO, Sequence

from tqdm import tqdm

import graphs

from . import __version__, graph_json
from .baselines import data_parallel
from .builder import CostTablesTooLarge
from .fileio import InputError, check_writable, read_json, write_atomic
from .calibrated import MACHINE_NAMES
from .machine import load_machine
from .memory import ASSUMPTIONS, NOTHING_FITS, MemoryModel
from .ordering import ORDERINGS
from .planner import Plan, evaluate_plan, measure_search, plan, strategy_from_json
from .report import (
    dot_graph,
    format_bytes,
    format_json,
    format_measurement,
    format_profile,
    format_sweep_header,
    format_sweep_refusal,
    format_sweep_row,
    format_table,
    refusal_dict,
    report_dict,
)
from .solver import SearchTooLarge

__all__ = ["main", "run", "build_parser", "Options", "CliError", "EXIT_CODES"]

# Exit statuses (documented in --help and the README).
EXIT_OK = 0
EXIT_INPUT = 1  # a file could not be read or written, or the strategy in it is invalid
EXIT_USAGE = 2  # the command line is wrong (argparse's own status for the same thing)
EXIT_TOO_LARGE = 3  # the search's tables would exceed the memory budget (nothing allocated)
EXIT_NOTHING_FITS = 4  # no strategy fits the --memory cap per device
EXIT_VERIFY = 5  # --verify: the sharded run's numbers differ from the unsharded run
EXIT_INTERNAL = 70  # a bug: please report it (EX_SOFTWARE of sysexits.h)
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_INPUT: "a file could not be read or written, or a graph or strategy file is invalid",
    EXIT_USAGE: "bad command line: unknown flag, malformed or out-of-range value, a value the graph cannot take, "
                "or a --machine that is neither a preset nor a readable, valid machine file",
    EXIT_TOO_LARGE: "the search's tables would not fit the memory budget (refused before allocating)",
    EXIT_NOTHING_FITS: "no strategy fits the --memory cap per device (the least any strategy needs is printed)",
    EXIT_VERIFY: "--verify: the plan run sharded (XLA devices, or torch processes) gave other numbers than the "
                 "unsharded run",
    EXIT_INTERNAL: "internal error (a bug; set PASE_TRACEBACK=1 to see the traceback)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}

DEFAULT_GRAPH = "alexnet"
DEFAULT_PROCS = 32
DEFAULT_BATCH = graphs.DEFAULT_BATCH
DEFAULT_FLOPS = 10.0
DEFAULT_BW = 16.0
#: --algo values: the ordering registry, in order (paper Fig. 3 and Section III-A first).
ALGOS = dict(enumerate(ORDERINGS))
#: --measure: warm-up and timed searches.
MEASURE_WARMUP = 2
MEASURE_RUNS = 5
#: A search's progress bar appears only once it has run this long (seconds).
PROGRESS_DELAY = 1.0
#: Functions listed by --profile.
PROFILE_LIMIT = 20
DOT_FILE = "graph.dot"
#: --verify engines: JAX in float32 or float64; PyTorch DTensor on gloo CPU processes (float32).
VERIFIERS = ("jax", "jax64", "torch")
#: --loss values for imported models.
LOSSES = ("cross-entropy", "none")
#: Largest batch size or model width accepted (a dimension's splits are enumerated in
#: sqrt(size) steps, once per layer).
MAX_DIMENSION = 2**31 - 1
#: Largest device count accepted: far beyond any machine, yet its configurations enumerate.
MAX_PROCS = 2**20
#: Accepted --flops (TFLOPS) and --bw (GB/s): far beyond any real device either way, yet
#: rho and every cost stay finite in float64.
MACHINE_RANGE = (1e-6, 1e9)


class CliError(Exception):
    """A problem with the user's input: printed as one ``pase: error:`` line, then ``status``."""

    def __init__(self, message: str, status: int = EXIT_INPUT):
        super().__init__(message)
        self.status = status


class ParserExit(Exception):
    """argparse finished early (``--help``, ``--version``) with ``status``."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


# ---------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class Options:
    """One run of the tool, after parsing and cross-checking the flags.

    ``None`` in ``model`` means the graph's default width; in ``table_budget`` the
    search's own default (most of the available memory); in ``progress`` "a bar when
    stderr is a terminal".
    """

    graph: str = DEFAULT_GRAPH  # -g: a registry name, a graph file or torch:...
    procs: int = DEFAULT_PROCS  # -p: devices
    batch: int | None = None  # -b: mini-batch size (None: the graph's own)
    model: int | None = None  # -m: width of graphs that have one
    machine: str = "paper"  # --machine: a preset name or a machine description file
    flops: float | None = None  # --flops: peak TFLOPS per device (paper machine)
    bw: float | None = None  # --bw: peak GB/s per device (paper machine)
    algo: str = "generateseq"  # --algo: ordering heuristic
    json: bool = False  # --json: one JSON object (per line with --sweep)
    sweep: tuple | None = None  # --sweep: device counts
    evaluate: str | None = None  # --evaluate: a strategy file to cost instead of searching
    dot_path: str | None = None  # -d / --dot-path: where to write the DOT graph
    export_graph: str | None = None  # --export-graph: where to write the JSON graph file
    loss: str | None = None  # --loss: the loss appended to an imported model (None: its default)
    blocks: bool = True  # --no-blocks: the plain dynamic programme on the whole graph
    export_jax: str | None = None  # --export-jax: where to write the plan's JAX shardings
    verify: str | None = None  # --verify: run the plan on an engine and check it ("jax", "jax64")
    profile: bool = False  # --profile: cProfile the search
    measure: bool = False  # --measure: time repeated searches
    progress: bool | None = None  # --progress / --no-progress
    table_budget: int | None = None  # --table-budget: bytes the search's tables may use
    memory_cap: float | None = None  # --memory: bytes per device the strategy must fit
    param_bytes: float = 16.0  # --param-bytes: bytes per parameter element
    act_bytes: float = 2.0  # --act-bytes: bytes per activation element

    @property
    def memory_model(self) -> MemoryModel:
        return MemoryModel(self.param_bytes, self.act_bytes)


def _positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _bounded_int(limit: int):
    def parse(text: str) -> int:
        if len(text.strip()) > 30:
            raise argparse.ArgumentTypeError(f"{text[:20]}... is larger than the largest supported value, {limit}")
        value = _positive_int(text)
        if value > limit:
            # Enumerating a dimension's splits takes sqrt(size) steps; p bounds every product.
            raise argparse.ArgumentTypeError(f"{text} is larger than the largest supported value, {limit}")
        return value

    return parse


_dimension_size = _bounded_int(MAX_DIMENSION)
_device_count = _bounded_int(MAX_PROCS)


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _float(text, "a positive finite number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _byte_size(text: str) -> float:
    """--param-bytes / --act-bytes: a non-negative number of bytes per element."""
    value = _float(text, "a number of bytes between 0 and 1e6")
    if not 0 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"expected a number of bytes between 0 and 1e6, got {text!r}")
    return value


def _machine_rate(text: str) -> float:
    """--flops / --bw: a positive number in ``MACHINE_RANGE`` (outside it costs overflow)."""
    value = _positive_float(text)
    low, high = MACHINE_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected a number between {low:g} and {high:g}, got {text!r}")
    return value


def _device_list(text: str) -> tuple:
    """``"4,8,16"`` -> ``(4, 8, 16)``; every entry a distinct positive integer."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of device counts such as 4,8,16, got {text!r}"
        )
    counts = []
    for item in items:
        try:
            count = _device_count(item)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"device count {item!r} in {text!r}: {err}") from None
        if count in counts:
            raise argparse.ArgumentTypeError(f"device count {count} appears twice in {text!r}")
        counts.append(count)
    return tuple(counts)


def _graph_spec(text: str) -> str:
    """-g: a registry name, a ``.json`` graph file or ``prefix:...`` of a model source."""
    prefix, sep, _ = text.partition(":")
    if text in graphs.GRAPHS or text.endswith(".json") or (sep and prefix in graphs.SOURCES):
        return text
    raise argparse.ArgumentTypeError(
        f"unknown graph {text!r}: choose one of {', '.join(graphs.GRAPHS)}, a graph file FILE.json, "
        "or torch:FILE_OR_MODULE:FUNCTION"
    )


class StreamParser(argparse.ArgumentParser):
    """argparse writing to the given streams and raising instead of exiting (also ``pase calibrate``'s)."""

    def __init__(self, *args, out: IO, err: IO, **kwargs):
        super().__init__(*args, **kwargs)
        self._out = out
        self._err = err

    def _print_message(self, message, file=None):
        if message:
            (self._err if file is sys.stderr else self._out).write(message)

    def exit(self, status=0, message=None):
        if message:
            self._err.write(message)
        raise ParserExit(status)

    def error(self, message):
        # One line, not argparse's usage block: every bad input gets one clear line.
        raise CliError(f"{message} (see {self.prog} --help)", EXIT_USAGE)


def _model_help() -> str:
    sizes = [
        f"{name}: {entry.model_help} (default {entry.default_model})"
        for name, entry in graphs.GRAPHS.items()
        if entry.model_help
    ]
    return (
        "model size, for the graphs that have one: " + "; ".join(sizes)
        + ". Refused for every other graph."
    )


def _epilog() -> str:
    lines = ["graphs:"]
    width = max(len(name) for name in graphs.GRAPHS)
    lines += [f"  {name:<{width}}  {entry.description}" for name, entry in graphs.GRAPHS.items()]
    lines += ["", "costs are in FLOP-equivalents: FLOPs plus rho x 8-byte words communicated,",
              "rho = FLOPS / (bandwidth / 8); divide by the device's FLOP/s for seconds.", "", "exit status:"]
    lines += [f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items()]
    return "\n".join(lines)


def build_parser(out: IO | None = None, err: IO | None = None, prog: str = "pase") -> argparse.ArgumentParser:
    """The argument parser; flags of the PaSE README plus the ones of ``cli.md``.

    Flags whose value may also come from an ``--evaluate`` file default to ``None`` here;
    ``options_from_args`` fills in the defaults stated in the help.
    """
    parser = StreamParser(
        prog=prog,
        description=(
            "PaSE: find the parallelization strategy of a DNN's layers over p devices that\n"
            "minimises the modelled cost of a training step (Elango, IPDPS 2021), exactly,\n"
            "by dynamic programming over the computation graph."
        ),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        out=out or sys.stdout,
        err=err or sys.stderr,
    )
    add = parser.add_argument
    add("-p", "--procs", type=_device_count, default=None, metavar="PROCS",
        help=f"number of devices p, at most {MAX_PROCS}. (Default: {DEFAULT_PROCS})")
    add("-b", "--batch", type=_dimension_size, default=None, metavar="BATCH",
        help=f"mini-batch size. (Default: {DEFAULT_BATCH})")
    add("-m", "--model", type=_dimension_size, default=None, metavar="MODEL", help=_model_help())
    add("-g", "--graph", type=_graph_spec, default=None, metavar="GRAPH",
        help=f"the network: a built-in graph ({', '.join(graphs.GRAPHS)}), a graph file FILE.json "
             f"(see --export-graph), or a PyTorch model torch:FILE_OR_MODULE:FUNCTION. (Default: {DEFAULT_GRAPH!r})")
    add("--machine", default=None, metavar="NAME|FILE",
        help=f"the machine that prices the work: {', '.join(MACHINE_NAMES)} (a preset), or a machine "
             "description FILE.json. paper is the reference model in FLOP-equivalents; the others are "
             "calibrated (measured compute, nodes, seconds), and --memory defaults to their device memory. "
             "(Default: paper)")
    add("--flops", type=_machine_rate, default=None,
        help=f"peak FLOPS of each device in TFLOPS, paper machine. (Default: {DEFAULT_FLOPS})")
    add("--bw", type=_machine_rate, default=None,
        help=f"peak interconnect bandwidth of each device in GB/s, paper machine. (Default: {DEFAULT_BW})")
    add("--profile", action="store_true",
        help="run the search under cProfile and print the hottest functions after the result "
             "(to stderr with --json).")
    add("--measure", action="store_true",
        help=f"time the search: {MEASURE_WARMUP} warm-up and {MEASURE_RUNS} timed runs; report mean and spread.")
    add("-d", "--dump-graph", action="store_true",
        help=f"write the graph in DOT format to {DOT_FILE} in the working directory "
             "(with each layer's chosen configuration).")
    add("--dot-path", metavar="PATH", default=None, help="write the DOT graph to PATH instead (implies -d).")
    add("-a", "--algo", type=int, choices=sorted(ALGOS), default=None,
        help="algorithm computing the strategy: 0 = GenerateSeq ordering (Eq. 4), "
             "1 = breadth-first ordering (paper III-A). (Default: 0)")
    add("--json", action="store_true",
        help="print one JSON object instead of the table (one per line with --sweep).")
    add("--sweep", type=_device_list, default=None, metavar="P1,P2,...",
        help="search for each of these device counts; one row (or JSON line) each.")
    add("--evaluate", metavar="FILE", default=None,
        help="cost the strategy in FILE (- for standard input) instead of searching: a previous --json "
             'output, or {"configs": [[...], ...]} with one configuration per layer in vertex-id order. '
             "Settings the file records are used; a flag given overrides them (with a note).")
    add("--loss", choices=LOSSES, default=None,
        help="for an imported model (-g torch:...): append a softmax cross-entropy over the last axis of its "
             "output, as the built-in graphs have, or none. (Default: cross-entropy)")
    add("--export-graph", metavar="FILE", default=None,
        help="also write the graph (built-in or imported) as a JSON graph file that -g FILE.json reads back.")
    add("--export-jax", metavar="FILE", default=None,
        help="also write the plan's device mesh and the PartitionSpec of every layer's inputs, outputs "
             "and weights as JSON, for JAX (no JAX needed to write it).")
    add("--verify", choices=VERIFIERS, default=None,
        help="run the plan's training step (forward and backward) sharded on p XLA host devices and "
             "check the loss and every gradient against the unsharded run (jax: float32, jax64: float64); "
             "report the bytes XLA moves next to the modelled ones. Needs pip install '.[jax]'. "
             "torch: the same on p gloo CPU processes with DTensor, bytes counted with CommDebugMode; "
             "needs pip install '.[torch]'.")
    add("--no-blocks", action="store_true",
        help="solve the plain dynamic programme on the whole graph. (Default: runs of identical blocks, "
             "such as a transformer's layers, are found and solved once; the optimum is the same)")
    add("--table-budget", type=_positive_float, default=None, metavar="GB",
        help="memory the search's tables may use, in GB (1e9 bytes); a larger search is refused "
             "before it starts. (Default: 80%% of the available memory)")
    add("--memory", type=_positive_float, default=None, metavar="GB",
        help="memory cap per device in GB (1e9 bytes): find the cheapest strategy that fits, "
             "or say that nothing does and how much the least any strategy needs. Memory model: "
             f"{ASSUMPTIONS}.")
    add("--param-bytes", type=_byte_size, default=None, metavar="B",
        help="bytes per parameter element in the memory model: 16 = fp16 weight and gradient plus "
             "fp32 master weight and two Adam moments. (Default: 16)")
    add("--act-bytes", type=_byte_size, default=None, metavar="B",
        help="bytes per activation element in the memory model. (Default: 2, fp16)")
    add("--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show (or hide) progress bars on stderr. (Default: shown when stderr is a terminal, "
             f"for searches longer than {PROGRESS_DELAY:g} s)")
    add("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


#: Flags whose value an --evaluate file may record, with the file's key for each.
_RECORDED = {"graph": "graph", "procs": "procs", "batch": "batch", "model": "model", "flops": "flops", "bw": "bw",
             "param_bytes": "param_bytes", "act_bytes": "act_bytes"}


def options_from_args(args: argparse.Namespace, recorded: dict | None = None) -> Options:
    """``Options`` from parsed flags; ``recorded`` (an ``--evaluate`` file's settings) fills
    the flags left out, before the built-in defaults.

    Raises ``CliError`` (usage status) for flags that cannot go together.
    """
    recorded = recorded or {}

    def pick(name, builtin):
        value = getattr(args, name)
        if value is not None:
            return value
        return recorded.get(name, builtin)

    if args.sweep is not None:
        if args.evaluate is not None:
            raise CliError("--sweep and --evaluate cannot be combined", EXIT_USAGE)
        if args.procs is not None:
            raise CliError("--sweep sets the device counts; drop -p/--procs", EXIT_USAGE)
    if args.measure and (args.sweep is not None or args.evaluate is not None):
        raise CliError("--measure times a single search; it cannot be combined with --sweep or --evaluate",
                       EXIT_USAGE)
    if args.evaluate is not None:
        for flag, given in (("-a/--algo", args.algo is not None), ("--table-budget", args.table_budget is not None),
                            ("--no-blocks", args.no_blocks)):
            if given:
                raise CliError(f"{flag} applies to a search; --evaluate costs a given strategy without one",
                               EXIT_USAGE)
    if args.sweep is not None and args.verify is not None:
        raise CliError("--verify runs one plan; it cannot be combined with --sweep", EXIT_USAGE)
    if args.sweep is not None and args.export_jax is not None:
        raise CliError("--export-jax writes one plan; it cannot be combined with --sweep", EXIT_USAGE)
    if args.measure and args.memory is not None:
        raise CliError("--measure times the unconstrained search; drop --memory", EXIT_USAGE)
    dot_path = args.dot_path if args.dot_path is not None else (DOT_FILE if args.dump_graph else None)
    if dot_path is not None and not dot_path.strip():
        raise CliError("--dot-path needs a file name", EXIT_USAGE)
    return Options(
        graph=pick("graph", DEFAULT_GRAPH),
        procs=pick("procs", DEFAULT_PROCS),
        batch=pick("batch", None),
        model=pick("model", None),
        machine=pick("machine", "paper"),
        flops=pick("flops", None),
        bw=pick("bw", None),
        algo=ALGOS[args.algo if args.algo is not None else 0],
        json=args.json,
        sweep=args.sweep,
        evaluate=args.evaluate,
        dot_path=dot_path,
        export_graph=args.export_graph,
        loss=args.loss,
        blocks=not args.no_blocks,
        export_jax=args.export_jax,
        verify=args.verify,
        profile=args.profile,
        measure=args.measure,
        progress=args.progress,
        table_budget=None if args.table_budget is None else int(args.table_budget * 1e9),
        memory_cap=None if args.memory is None else args.memory * 1e9,
        param_bytes=pick("param_bytes", 16.0),
        act_bytes=pick("act_bytes", 2.0),
    )


# ---------------------------------------------------------------------------------------
# Pieces shared by the commands


def _load_network(opts: Options, model_from_file: bool = False):
    options = {} if opts.loss is None else {"loss": None if opts.loss == "none" else opts.loss}
    if options and not opts.graph.startswith("torch:"):
        raise CliError(f"--loss applies only to imported models (-g torch:...), not to {opts.graph!r}", EXIT_USAGE)
    try:
        return graphs.load(opts.graph, opts.batch, opts.model, **options)
    except InputError as err:
        raise CliError(str(err), EXIT_INPUT) from None
    except ValueError as err:
        message = str(err)
        if model_from_file and "has no model size" in message:
            message = (f"the strategy file records model width {opts.model}, which graph {opts.graph!r} "
                       "does not take (it has no width); drop -g or give the file of a graph with a width")
        raise CliError(message, EXIT_USAGE) from None


def _load_machine(opts: Options, procs) -> object:
    """The machine of ``--machine``, checked against every device count before any work."""
    try:
        machine = load_machine(opts.machine, opts.flops, opts.bw)
        for p in procs:
            machine.check_procs(p)
    except ValueError as err:  # an unknown name, or a machine file or its table that is missing or invalid
        raise CliError(str(err), EXIT_USAGE) from None
    return machine


def _memory_cap(opts: Options, machine) -> float | None:
    """``--memory``, or on a calibrated machine its device memory (not while timing with --measure)."""
    if opts.memory_cap is not None or opts.measure:
        return opts.memory_cap
    return machine.memory_bytes


def _effective_model(opts: Options) -> int | None:
    """The ``-m`` value the graph was built with (given or the graph's default), if it has one."""
    entry = graphs.GRAPHS.get(opts.graph)
    if entry is None or entry.model_help is None:
        return None
    return opts.model if opts.model is not None else entry.default_model


def _model_name(opts: Options) -> str:
    """How outputs name the ``-m`` value of the graph (``model width``, ``sequence length``)."""
    entry = graphs.GRAPHS.get(opts.graph)
    return entry.model_name if entry is not None else "model width"


def _show_progress(opts: Options, err: IO) -> bool:
    if opts.progress is not None:
        return opts.progress
    isatty = getattr(err, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):
        return False


class _Progress:
    """A ``progress(done, total)`` callback drawing a tqdm bar once a search runs a while.

    An uncapped search counts table entries; the capped search counts dynamic programmes.
    """

    def __init__(self, stream: IO, desc: str, unit: str = "entry"):
        self.stream = stream
        self.desc = desc
        self.unit = unit
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, file=self.stream, delay=PROGRESS_DELAY, desc=self.desc,
                            unit=self.unit, unit_scale=self.unit == "entry", leave=False, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


#: A search estimated to take longer than this (seconds) says so before it starts.
NOTICE_SECONDS = 10.0
#: Rough dynamic-programme speed on a two-core machine, for that estimate (seconds per entry).
SECONDS_PER_ENTRY = 2e-9


def _notice(err: IO, label: str):
    """``notice(estimate, searches)`` for ``pase.plan``: a line on stderr for a long search."""

    def notice(estimate, searches: int) -> None:
        seconds = estimate.table_entries * SECONDS_PER_ENTRY
        if seconds > NOTICE_SECONDS:
            each = f" each, up to {searches} of them under the memory cap" if searches > 1 else ""
            err.write(f"pase: note: {label}: the search fills {estimate.table_entries:.3g} table entries; expect "
                      f"roughly {_duration(seconds)}{each} (Ctrl-C stops it)\n")
            err.flush()

    return notice


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _plan(network, procs: int, machine, opts: Options, err: IO, bar: bool = True) -> Plan:
    """``pase.plan`` with the options' machine, ordering, budget, cap and progress bar."""
    progress = None
    cap = _memory_cap(opts, machine)
    if bar and _show_progress(opts, err):
        if cap is None:
            progress = _Progress(err, f"{network.name} p={procs}")
        else:
            progress = _Progress(err, f"{network.name} p={procs} capped", "DP")
    try:
        return plan(network, procs, machine, cap, opts.algo, progress,
                    memory_model=opts.memory_model, table_budget=opts.table_budget, blocks=opts.blocks,
                    notice=_notice(err, f"{network.name} on {procs} devices"))
    finally:
        if progress is not None:
            progress.close()


def _nothing_fits_message(found: Plan, opts: Options) -> str:
    m = found.memory
    return (
        f"nothing fits in {format_bytes(m.cap_bytes)} per device: {found.network.name} on {found.procs} devices, "
        f"batch {opts.batch if opts.batch is not None else found.network.batch}, needs at least "
        f"{format_bytes(m.least_bytes)} per device with any strategy "
        f"(data parallelism: {format_bytes(m.data_parallel_per_device_bytes)}); memory model: {m.param_bytes:g} "
        f"bytes per parameter, {m.act_bytes:g} per activation, {ASSUMPTIONS}"
    )


class _Profiler:
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


def _write_dot(opts: Options, network, configs=None) -> None:
    write_atomic(opts.dot_path, dot_graph(network, configs).to_string(), "DOT graph")


def _print_plan(found: Plan, opts: Options, out: IO, measure=None, verified=None) -> None:
    model = _effective_model(opts)
    if opts.json:
        data = report_dict(found, model, measure)
        if verified is not None:
            data["verify"] = verified.to_dict()
        out.write(format_json(data))
        return
    out.write(format_table(found, model, model_name=_model_name(opts)))
    if measure is not None:
        out.write("\n" + format_measurement(measure))
    if verified is not None:
        out.write("\n" + verified.table().rstrip("\n") + "\n")
    if opts.dot_path is not None:
        out.write(f"\nDOT graph written to {opts.dot_path}\n")


def _check_outputs(opts: Options) -> None:
    """Refuse unwritable output paths before any work."""
    if opts.dot_path is not None:
        check_writable(opts.dot_path, "DOT graph")
    if opts.export_graph is not None:
        check_writable(opts.export_graph, "graph file")
    if opts.export_jax is not None:
        check_writable(opts.export_jax, "JAX shardings")


def _export_jax(opts: Options, found: Plan) -> None:
    """--export-jax: the plan's mesh and shardings (pure Python: no JAX needed)."""
    if opts.export_jax is None:
        return
    from .jax_export import export_shardings

    try:
        text = json.dumps(export_shardings(found), indent=1)
    except ValueError as error:  # a configuration on a number of devices that does not divide p
        raise CliError(f"--export-jax: {error}") from None
    write_atomic(opts.export_jax, text + "\n", "JAX shardings")


def _verify(opts: Options, found: Plan):
    """--verify: run the plan on XLA host devices in a child process (``pase.jax_verify``)."""
    if opts.verify is None:
        return None
    if opts.verify == "torch":
        return _verify_torch(opts, found)
    from .jax_verify import JaxMissing, verify  # imports no JAX here: the run is a child process

    try:
        return verify(found, dtype="float64" if opts.verify == "jax64" else "float32")
    except JaxMissing as error:
        raise CliError(str(error), EXIT_USAGE) from None
    except (ValueError, RuntimeError) as error:
        raise CliError(f"--verify {opts.verify}: {error}") from None


def _verify_torch(opts: Options, found: Plan):
    """--verify torch: run the plan on p gloo CPU processes with DTensor (``pase.torch_verify``)."""
    from .torch_verify import TorchMissing, verify_torch  # imports no torch here: the run is p child processes

    try:
        return verify_torch(found)
    except TorchMissing as error:
        raise CliError(str(error), EXIT_USAGE) from None
    except (ValueError, RuntimeError) as error:
        raise CliError(f"--verify torch: {error}") from None


def _export_graph(opts: Options, network) -> None:
    if opts.export_graph is not None:
        write_atomic(opts.export_graph, graph_json.dumps(network), "graph file")


# ---------------------------------------------------------------------------------------
# Commands


def _run_search(opts: Options, out: IO, err: IO) -> int:
    machine = _load_machine(opts, [opts.procs])
    network = _load_network(opts)
    _check_outputs(opts)
    _export_graph(opts, network)
    profiler = _Profiler(opts.profile)
    with profiler:
        found = _plan(network, opts.procs, machine, opts, err)
    if found.memory.status == NOTHING_FITS:
        raise CliError(_nothing_fits_message(found, opts), EXIT_NOTHING_FITS)
    measurement = measure_search(found, MEASURE_WARMUP, MEASURE_RUNS, opts.blocks) if opts.measure else None
    if opts.dot_path is not None:
        _write_dot(opts, network, found.configs)
    _export_jax(opts, found)
    verified = _verify(opts, found)
    _print_plan(found, opts, out, measurement, verified)
    profiler.write(opts, out, err)
    return _verified_status(verified, err)


def _verified_status(verified, err: IO) -> int:
    if verified is not None and not verified.ok:
        err.write("pase: error: --verify: the sharded run's numbers differ from the unsharded run (see the report)\n")
        return EXIT_VERIFY
    return EXIT_OK


def _run_sweep(opts: Options, out: IO, err: IO) -> int:
    machine = _load_machine(opts, opts.sweep)
    network = _load_network(opts)
    _check_outputs(opts)
    _export_graph(opts, network)
    model = _effective_model(opts)
    if not opts.json:
        out.write(format_sweep_header(network.name, network.batch, machine, model, _model_name(opts)))
    status = EXIT_OK
    profiler = _Profiler(opts.profile)
    bar = tqdm(opts.sweep, desc=f"{network.name} sweep", unit="search", file=err, leave=False,
               disable=not _show_progress(opts, err))
    try:
        for procs in bar:
            try:
                with profiler:
                    found = _plan(network, procs, machine, opts, err, bar=False)
            except (SearchTooLarge, CostTablesTooLarge) as too_large:
                # Like the paper's "OOM" cells: say so for this p and go on with the others.
                status = EXIT_TOO_LARGE
                dp = evaluate_plan(network, data_parallel(network, procs), procs, machine, opts.memory_model)
                bar.write(f"pase: error: p={procs}: {too_large}", file=err)
                if opts.json:
                    line = format_json(refusal_dict(dp, "too_large", model, too_large=too_large), one_line=True)
                else:
                    line = format_sweep_refusal(procs, dp.total_cost, unit=machine.cost_unit)
                bar.write(line, file=out, end="")
                continue
            if found.memory.status == NOTHING_FITS:
                status = EXIT_NOTHING_FITS
                bar.write(f"pase: error: p={procs}: {_nothing_fits_message(found, opts)}", file=err)
                if opts.json:
                    line = format_json(refusal_dict(found, "nothing_fits", model), one_line=True)
                else:
                    line = format_sweep_refusal(procs, found.data_parallel.total, "nothing fits", found.memory,
                                                machine.cost_unit)
                bar.write(line, file=out, end="")
                continue
            line = format_json(report_dict(found, model), one_line=True) if opts.json else format_sweep_row(found)
            bar.write(line, file=out, end="")
    finally:
        bar.close()
    if opts.dot_path is not None:
        _write_dot(opts, network)
    profiler.write(opts, out, err)
    return status


# Settings a strategy file may record (a previous --json output does), and their checks.
_FILE_SETTINGS = {
    "graph": lambda v: isinstance(v, str) and v in graphs.GRAPHS,
    "procs": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_PROCS,
    "batch": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_DIMENSION,
    "model": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_DIMENSION),
    "flops": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and MACHINE_RANGE[0] <= v <= MACHINE_RANGE[1],
    "bw": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and MACHINE_RANGE[0] <= v <= MACHINE_RANGE[1],
    "param_bytes": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1e6,
    "act_bytes": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1e6,
    "cap_bytes": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e30,
    "machine": lambda v: isinstance(v, str) and v in MACHINE_NAMES,
}

#: How a recorded setting is named on the command line, for the notes on overrides.
_FLAG_OF = {"graph": "-g", "procs": "-p", "batch": "-b", "model": "-m", "flops": "--flops", "bw": "--bw",
            "param_bytes": "--param-bytes", "act_bytes": "--act-bytes", "cap_bytes": "--memory",
            "machine": "--machine"}


def _recorded_machine(recorded: dict):
    """``(name, None)`` for the reference machine or a preset recorded in a plan, else
    ``(None, name)``: a machine from a file (a file may reuse a preset's name with other figures)."""
    from .calibrated import PRESETS, load_description

    name = recorded.get("name")
    if name == "paper" and set(recorded) <= {"name", "flops", "bw", "rho"}:
        return name, None
    if name in PRESETS and recorded == load_description(name):
        return name, None
    return None, name


def _read_strategy_file(path: str) -> tuple:
    """``(configs, settings, where, extra)`` from a strategy file; ``CliError`` for anything malformed.

    ``where`` names the file in messages. ``extra`` may hold ``"file graph"`` and ``"file
    machine"``: the names of a graph and a machine that the plan was made with and that came
    from files (not built in), which the command line must name again.
    """
    where = f"strategy file {path}" if path != "-" else "strategy file on standard input"
    try:
        configs, settings = strategy_from_json(read_json(path, "strategy file"), where)
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
    if isinstance(graph, str) and graph not in graphs.GRAPHS:
        # A graph file's or an imported model's network name: -g must name its source again.
        # Its batch is the file's own, and a width applies to built-in graphs only.
        extra["file graph"] = graph
        for key in ("graph", "batch", "model"):
            settings.pop(key, None)
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


def _run_evaluate(args: argparse.Namespace, out: IO, err: IO) -> int:
    configs, settings, where, extra = _read_strategy_file(args.evaluate)
    if "file graph" in extra and args.graph is None:
        raise CliError(f"{where} records graph {extra['file graph'][:80]!r}, which is not a built-in graph: name its "
                       "graph file (or torch:...) with -g", EXIT_USAGE)
    if "file graph" in extra and args.graph in graphs.GRAPHS:
        raise CliError(f"{where}: invalid 'graph': {json.dumps(extra['file graph'])[:80]} (not a built-in graph)")
    if args.machine is None and extra.get("file machine"):
        raise CliError(f"{where} was priced on machine {extra['file machine'][:80]!r} from a machine file: name it "
                       "again with --machine FILE.json (or choose another machine)", EXIT_USAGE)
    if args.graph is not None and args.graph != settings.get("graph", args.graph):
        # The recorded width belongs to the recorded graph, not to the one asked for.
        settings.pop("model", None)
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
    machine = _load_machine(opts, [opts.procs])
    network = _load_network(opts, model_from_file=args.model is None and "model" in settings)
    _check_outputs(opts)
    _export_graph(opts, network)
    with _Profiler(opts.profile) as profiler:
        try:
            found = evaluate_plan(network, configs, opts.procs, machine, opts.memory_model, _memory_cap(opts, machine))
        except ValueError as error:
            raise CliError(f"{where}: {error}") from None
    if opts.dot_path is not None:
        _write_dot(opts, network, found.configs)
    _export_jax(opts, found)
    verified = _verify(opts, found)
    _print_plan(found, opts, out, verified=verified)
    profiler.write(opts, out, err)
    return _verified_status(verified, err)


# ---------------------------------------------------------------------------------------
# Entry points


def main(argv: Sequence[str] | None = None, stdout: IO | None = None, stderr: IO | None = None,
         prog: str = "pase") -> int:
    """Run the tool on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Output goes to ``stdout`` and ``stderr`` (default: ``sys.stdout`` and ``sys.stderr``
    at call time). Every error is one ``pase: error:`` line on stderr and a non-zero status
    (see ``EXIT_CODES``); the interpreter is never exited here.
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        from .calibrate import main as calibrate

        return calibrate(argv[1:], out, err, prog=f"{prog} calibrate")
    parser = build_parser(out, err, prog)
    try:
        args = parser.parse_args(argv)
        if args.evaluate is not None:
            return _run_evaluate(args, out, err)
        opts = options_from_args(args)
        if opts.sweep is not None:
            return _run_sweep(opts, out, err)
        return _run_search(opts, out, err)
    except ParserExit as done:
        return done.status
    except CliError as error:
        err.write(f"{prog}: error: {error}\n")
        return error.status
    except InputError as error:
        err.write(f"{prog}: error: {error}\n")
        return EXIT_INPUT
    except SearchTooLarge as too_large:
        hint = " (GenerateSeq, --algo 0, needs far smaller tables)" if too_large.estimate.ordering != "generateseq" else ""
        err.write(f"{prog}: error: {too_large}{hint}\n")
        return EXIT_TOO_LARGE
    except CostTablesTooLarge as too_large:
        err.write(f"{prog}: error: {too_large}\n")
        return EXIT_TOO_LARGE
    except MemoryError as error:
        err.write(f"{prog}: error: out of memory ({error or 'the cost tables are too large'})\n")
        return EXIT_TOO_LARGE
    except KeyboardInterrupt:
        err.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_BROKEN_PIPE
    except OSError as error:  # writing the output failed (a full disk, a closed stream)
        err.write(f"{prog}: error: cannot write the output: {error.strerror or error}\n")
        return EXIT_INPUT
    except Exception as bug:  # a bug: one line, unless asked for the traceback
        if os.environ.get("PASE_TRACEBACK"):
            raise
        err.write(f"{prog}: internal error: {type(bug).__name__}: {bug} (set PASE_TRACEBACK=1 for the traceback)\n")
        return EXIT_INTERNAL


def run() -> None:
    """Run the tool as a process (``python3 -m pase.cli``): exit with its status."""
    from ._entry import run as run_process

    run_process()


if __name__ == "__main__":
    run()
