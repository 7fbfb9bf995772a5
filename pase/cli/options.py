"""One run of the tool as ``Options``: the defaults and limits of the flags, and the checks
of flags that cannot go together."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pase.costing.memory import MemoryModel
from pase.outputs.exporters import EXPORTERS
from pase.search.approx import DEFAULT_TABLE_ENTRIES
from pase.search.ordering import ORDERINGS
from pase.sources.builtin import DEFAULT_BATCH as BUILTIN_BATCH

from .errors import CliError
from .status import ExitStatus

__all__ = [
    "Options", "options_from_args", "DEFAULT_GRAPH", "DEFAULT_PROCS", "DEFAULT_BATCH", "DEFAULT_FLOPS", "DEFAULT_BW",
    "ALGOS", "MEASURE_WARMUP", "MEASURE_RUNS", "PROFILE_LIMIT", "DOT_FILE", "VERIFIERS", "LOSSES", "MAX_DIMENSION",
    "MAX_PROCS", "MACHINE_RANGE", "MAX_GIGABYTES", "DEFAULT_TABLE_ENTRIES", "MIN_TABLE_ENTRIES", "MAX_TABLE_ENTRIES",
]

DEFAULT_GRAPH = "alexnet"
DEFAULT_PROCS = 32
DEFAULT_BATCH = BUILTIN_BATCH
DEFAULT_FLOPS = 10.0
DEFAULT_BW = 16.0
#: --algo values: the ordering registry, in order (paper Fig. 3 and Section III-A first).
ALGOS = dict(enumerate(ORDERINGS))
#: --measure: warm-up and timed searches.
MEASURE_WARMUP = 2
MEASURE_RUNS = 5
#: Functions listed by --profile.
PROFILE_LIMIT = 20
DOT_FILE = "graph.dot"
#: --verify engines: JAX in float32 or float64.
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
#: Largest --memory and --table-budget (GB): a zettabyte, 10^10 times any device's memory, yet
#: its bytes stay finite (1e300 GB overflowed to infinity: an internal error, or no cap at all).
MAX_GIGABYTES = 1e12
#: --approx tables (entries): below 1024 the bound is too weak to be worth a plan; 2^34
#: float64 entries are 128 GiB, beyond any budget.
MIN_TABLE_ENTRIES = 1 << 10
MAX_TABLE_ENTRIES = 1 << 34


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
    machine_given: bool = False  # --machine given (or recorded by an --evaluate file): no note on the paper machine
    flops: float | None = None  # --flops: peak TFLOPS per device (paper machine)
    bw: float | None = None  # --bw: peak GB/s per device (paper machine)
    algo: str = "generateseq"  # --algo: ordering heuristic
    json: bool = False  # --json: one JSON object (per line with --sweep)
    sweep: tuple | None = None  # --sweep: device counts
    evaluate: str | None = None  # --evaluate: a strategy file to cost instead of searching
    dot_path: str | None = None  # -d / --dot-path: where to write the DOT graph
    loss: str | None = None  # --loss: the loss appended to an imported model (None: its default)
    mtp: bool = False  # --mtp: an hf: config's multi-token-prediction modules (DeepSeek-V3)
    blocks: bool = True  # --no-blocks: the plain dynamic programme on the whole graph
    exports: tuple = ()  # (Exporter, path) of every --export-* flag given
    verify: str | None = None  # --verify: run the plan on an engine and check it ("jax", "jax64")
    exportable: bool = False  # --exportable (or implied by --export-jax, --verify): engine-runnable configurations
    profile: bool = False  # --profile: cProfile the search
    measure: bool = False  # --measure: time repeated searches
    progress: bool | None = None  # --progress / --no-progress
    table_budget: int | None = None  # --table-budget: bytes the search's tables may use
    memory_cap: float | None = None  # --memory: bytes per device the strategy must fit
    param_bytes: float = 16.0  # --param-bytes: bytes per parameter element
    act_bytes: float = 2.0  # --act-bytes: bytes per activation element
    act_bytes_given: bool = False  # --act-bytes given (or recorded): a machine file's act_bytes does not apply
    approx: int | None = None  # --approx: the approximate search with tables of at most this many entries
    readers: str | None = None  # --readers: the reader rule (None: the source's own)
    allow_replication: bool = False  # --allow-replication: search when no layer can use all p devices

    @property
    def memory_model(self) -> MemoryModel:
        return MemoryModel(self.param_bytes, self.act_bytes)


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
            raise CliError("--sweep and --evaluate cannot be combined", ExitStatus.USAGE)
        if args.procs is not None:
            raise CliError("--sweep sets the device counts; drop -p/--procs", ExitStatus.USAGE)
    if args.measure and (args.sweep is not None or args.evaluate is not None):
        raise CliError("--measure times a single search; it cannot be combined with --sweep or --evaluate",
                       ExitStatus.USAGE)
    if args.evaluate is not None:
        for flag, given in (("-a/--algo", args.algo is not None), ("--table-budget", args.table_budget is not None),
                            ("--no-blocks", args.no_blocks), ("--approx", args.approx is not None)):
            if given:
                raise CliError(f"{flag} applies to a search; --evaluate costs a given strategy without one",
                               ExitStatus.USAGE)
    if args.sweep is not None and args.verify is not None:
        raise CliError("--verify runs one plan; it cannot be combined with --sweep", ExitStatus.USAGE)
    exports = tuple((e, getattr(args, e.dest)) for e in EXPORTERS if getattr(args, e.dest) is not None)
    for exporter, _ in exports:
        if args.sweep is not None and exporter.of == "plan":
            raise CliError(f"{exporter.flag} writes one plan; it cannot be combined with --sweep", ExitStatus.USAGE)
    if args.approx is not None:
        for flag, given in (("--memory", args.memory is not None), ("--measure", args.measure),
                            ("--no-blocks", args.no_blocks)):
            if given:
                raise CliError(f"--approx cannot be combined with {flag}: the approximate search runs without a memory "
                               "cap, once, and solves no repeated blocks", ExitStatus.USAGE)
    if args.measure and args.memory is not None:
        raise CliError("--measure times the unconstrained search; drop --memory", ExitStatus.USAGE)
    dot_path = args.dot_path if args.dot_path is not None else (DOT_FILE if args.dump_graph else None)
    if dot_path is not None and not dot_path.strip():
        raise CliError("--dot-path needs a file name", ExitStatus.USAGE)
    return Options(
        graph=pick("graph", DEFAULT_GRAPH),
        procs=pick("procs", DEFAULT_PROCS),
        batch=pick("batch", None),
        model=pick("model", None),
        machine=pick("machine", "paper"),
        machine_given=args.machine is not None or "machine" in recorded,
        flops=pick("flops", None),
        bw=pick("bw", None),
        algo=ALGOS[args.algo if args.algo is not None else 0],
        json=args.json,
        sweep=args.sweep,
        evaluate=args.evaluate,
        dot_path=dot_path,
        loss=args.loss,
        mtp=bool(getattr(args, "mtp", False)),
        blocks=not args.no_blocks,
        exports=exports,
        verify=args.verify,
        exportable=bool(getattr(args, "exportable", False)) or args.verify is not None
        or any(exporter.engine for exporter, _ in exports),
        profile=args.profile,
        measure=args.measure,
        progress=args.progress,
        table_budget=None if args.table_budget is None else int(args.table_budget * 1e9),
        memory_cap=None if args.memory is None else args.memory * 1e9,
        param_bytes=pick("param_bytes", 16.0),
        act_bytes=pick("act_bytes", 2.0),
        act_bytes_given=args.act_bytes is not None or "act_bytes" in recorded,
        approx=args.approx,
        readers=pick("readers", None),
        allow_replication=bool(getattr(args, "allow_replication", False)),
    )
