"""The argument parser of ``pase``: its flags, help texts and epilog, and ``StreamParser``
(argparse writing to given streams and raising instead of exiting; ``pase calibrate``'s too)."""

from __future__ import annotations

import argparse
import sys
from typing import IO

from pase import __version__
from pase.costing.memory import ASSUMPTIONS
from pase.machines.registry import MACHINE_NAMES
from pase.model.readers import READER_RULES
from pase.outputs.exporters import EXPORTERS
from pase.sources.builtin import GRAPHS
from pase.sources.registry import graph_help

from .training import add_training_flags
from .budget import add_budget_flags
from .argtypes import (
    byte_size, device_count, device_list, dimension_size, gigabytes, graph_spec, machine_rate, table_entries,
)
from .errors import CliError, ParserExit
from .options import (
    ALGOS, DEFAULT_BATCH, DEFAULT_BW, DEFAULT_FLOPS, DEFAULT_GRAPH, DEFAULT_PROCS, DEFAULT_TABLE_ENTRIES, DOT_FILE,
    LOSSES, MAX_PROCS, MEASURE_RUNS, MEASURE_WARMUP, VERIFIERS,
)
from .progress import PROGRESS_DELAY
from .status import EXIT_CODES, ExitStatus

__all__ = ["StreamParser", "build_parser"]


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
        raise CliError(f"{message} (see {self.prog} --help)", ExitStatus.USAGE)


def _model_help() -> str:
    sizes = [
        f"{name}: {entry.model_help} (default {entry.default_model})"
        for name, entry in GRAPHS.items()
        if entry.model_help
    ]
    return (
        "model size, for the graphs that have one: " + "; ".join(sizes)
        + ". Refused for every other graph."
    )


def _epilog() -> str:
    lines = ["graphs:"]
    width = max(len(name) for name in GRAPHS)
    lines += [f"  {name:<{width}}  {entry.description}" for name, entry in GRAPHS.items()]
    lines += ["", "costs are in FLOP-equivalents: compute, a multiply-add counting 1 (as in the paper;",
              "the usual count is 2), plus rho x 8-byte words communicated, rho = FLOPS /",
              "(bandwidth / 8); milliseconds shown are the cost at --flops x 1e12 per second.", "",
              "other commands:",
              "  pase calibrate --out FILE.json  measure this GPU (PyTorch) and write a machine",
              "                                  file for --machine (pase calibrate --help)", "",
              "exit status:"]
    lines += [f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items()]
    return "\n".join(lines)


def build_parser(out: IO | None = None, err: IO | None = None, prog: str = "pase") -> argparse.ArgumentParser:
    """The argument parser; the flags of ``docs/cli.md`` (the original PaSE's among them).

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
    _add_network_and_machine(add)
    _add_run_and_output(add)
    _add_imports_and_exports(add)
    _add_search_and_memory(add)
    add("--version", action="version", version=f"%(prog)s {__version__}")
    add_training_flags(parser)
    add_budget_flags(parser)
    return parser


def _add_network_and_machine(add) -> None:
    """-p, -b, -m, -g: the network and its size; --machine, --flops, --bw: what prices it."""
    add("-p", "--procs", type=device_count, default=None, metavar="PROCS",
        help=f"number of devices p, at most {MAX_PROCS}. (Default: {DEFAULT_PROCS})")
    add("-b", "--batch", type=dimension_size, default=None, metavar="BATCH",
        help=f"mini-batch size. (Default: {DEFAULT_BATCH})")
    add("-m", "--model", type=dimension_size, default=None, metavar="MODEL", help=_model_help())
    add("-g", "--graph", type=graph_spec, default=None, metavar="GRAPH",
        help=f"the network: {graph_help()}. (Default: {DEFAULT_GRAPH!r})")
    add("--machine", default=None, metavar="NAME|FILE",
        help=f"the machine that prices the work: {', '.join(MACHINE_NAMES)} (a preset), or a machine "
             "description FILE.json. paper is the reference model in FLOP-equivalents; the others are "
             "calibrated (measured compute, nodes, seconds), and --memory defaults to their device memory. "
             "(Default: paper)")
    add("--flops", type=machine_rate, default=None,
        help=f"peak FLOPS of each device in TFLOPS, paper machine. (Default: {DEFAULT_FLOPS})")
    add("--bw", type=machine_rate, default=None,
        help=f"peak interconnect bandwidth of each device in GB/s, paper machine. (Default: {DEFAULT_BW})")


def _add_run_and_output(add) -> None:
    """Timing the search, the DOT graph, the ordering, JSON, sweeps and --evaluate."""
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
        help="print one JSON object instead of the table (one per line with the per-layer --sweep).")
    add("--sweep", type=device_list, default=None, metavar="P1,P2,...",
        help="plan for each of these device counts: on a real machine (or with --training) the training plan at "
             "every count, each what -p N gives alone, as a table (step, tokens/s and MFU, memory, scaling "
             "efficiency, the plan), one JSON object (--json: sweep, a list of {devices, training}) or a --report; "
             "on the paper's machine (or with --per-layer) the per-layer search, one row (or JSON line) each.")
    add("--evaluate", metavar="FILE", default=None,
        help="cost the strategy in FILE (- for standard input) instead of searching: a previous --json "
             'output, or {"configs": [[...], ...]} with one configuration per layer in vertex-id order. '
             "Settings the file records are used; a flag given overrides them (with a note).")


def _add_imports_and_exports(add) -> None:
    """--loss for imported models, the --export-* files, --verify."""
    add("--loss", choices=LOSSES, default=None,
        help="for an imported model (-g torch:...): append a softmax cross-entropy over the last axis of its "
             "output, as the built-in graphs have, or none. (Default: cross-entropy)")
    add("--mtp", action="store_true",
        help="for a Hugging Face config (-g hf:...) with multi-token-prediction modules (DeepSeek-V3's "
             "num_nextn_predict_layers): build them too, each a block, the shared head and a loss of its own.")
    add("--readers", choices=READER_RULES, default=None,
        help="how several layers reading one tensor reduce its gradient: each its own (the paper's rule), or "
             "summed, once where they are split alike, as frameworks run separate q/k/v and gate/up projections; "
             "exact, and a larger search (one more vertex in the largest dependent sets). (Default: each; a graph "
             "file records its own)")
    for exporter in EXPORTERS:
        add(exporter.flag, metavar="FILE", default=None, help=exporter.help)
    add("--verify", choices=VERIFIERS, default=None,
        help="run the plan's training step (forward and backward) sharded on p XLA host devices and "
             "check the loss and every gradient against the unsharded run (jax: float32, jax64: float64); "
             "report the bytes XLA moves next to the modelled ones. Needs pip install '.[jax]'. "
             "torch: the same on p gloo CPU processes with DTensor, bytes counted with CommDebugMode; "
             "needs pip install '.[torch]'.")
    add("--exportable", action="store_true",
        help="search only configurations an engine can run: every layer's device count divides p (a JAX "
             "or PyTorch device mesh needs equal replicas of every part). (Default: on with --export-jax "
             "or --verify, else every configuration on at most p devices)")


def _add_search_and_memory(add) -> None:
    """The search's tables, the memory cap and model, progress bars."""
    add("--no-blocks", action="store_true",
        help="solve the plain dynamic programme on the whole graph. (Default: runs of identical blocks, "
             "such as a transformer's layers, are found and solved once; the optimum is the same)")
    add("--approx", type=table_entries, nargs="?", const=DEFAULT_TABLE_ENTRIES, default=None, metavar="ENTRIES",
        help="for graphs beyond the exact search (DenseNet's dense blocks): the approximate search, every table "
             "of at most ENTRIES entries. Prints a strategy, its cost, a lower bound on the optimum (mini-bucket "
             "elimination) and the gap (cost - bound) / bound; where the bounded tables hold the exact programme, "
             "the optimum with gap 0. No memory cap. (Default ENTRIES: 2**23; off: the exact search)")
    add("--allow-replication", action="store_true",
        help="search a count no configuration of any layer can fill (each dimension splits by its divisors) "
             "even when the search would take many minutes. (Default: such a count is planned, every "
             "configuration on at most p devices, with a note naming the largest count one uses; refused at once "
             "when its cost tables alone need over 2 GB)")
    add("--table-budget", type=gigabytes, default=None, metavar="GB",
        help="memory the search's tables may use, in GB (1e9 bytes); a larger search is refused "
             "before it starts. (Default: 80%% of the available memory)")
    add("--memory", type=gigabytes, default=None, metavar="GB",
        help="memory cap per device in GB (1e9 bytes): find the cheapest strategy that fits, "
             "or say that nothing does and how much the least any strategy needs. Memory model: "
             f"{ASSUMPTIONS}.")
    add("--param-bytes", type=byte_size, default=None, metavar="B",
        help="bytes per parameter element in the memory model: 16 = fp16 weight and gradient plus "
             "fp32 master weight and two Adam moments. (Default: 16)")
    add("--act-bytes", type=byte_size, default=None, metavar="B",
        help="bytes per activation element in the memory model. (Default: a machine file's "
             "act_bytes, else 2, fp16)")
    add("--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show (or hide) progress bars on stderr. (Default: shown when stderr is a terminal, "
             f"for searches longer than {PROGRESS_DELAY:g} s)")
