"""``pase calibrate --out FILE.json [--quick] [--no-attention]``: measure this GPU (``pase.machines.calibration``)
and write a machine description that ``--machine`` accepts, with its table next to it.
``pase calibrate --collectives --out FILE.json``: measure NCCL collectives on this node's GPUs
(``pase.machines.collective_calibration``) into that description."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import IO, Sequence

from pase.machines.calibration import (CALIBRATED_DTYPES, DEFAULT_LINKS, TorchTimer, attention_grid, calibrate,
                                      calibrate_dtype, gemm_grid, gemm_grid_fp8, memory_grid)
from pase.machines.calibrated import load_calibrated, load_description
from pase.machines.collective_calibration import (calibrate_collectives, collective_groups, collective_sizes,
                                                  torchrun_world)
from pase.machines.collectives import COLLECTIVE_KINDS

from .errors import CliError, ParserExit
from .parser import StreamParser
from .status import ExitStatus

__all__ = ["build_parser", "main"]


def _positive(cast):
    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def _non_negative(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def build_parser(out: IO, err: IO, prog: str = "pase calibrate") -> argparse.ArgumentParser:
    p = StreamParser(prog=prog, out=out, err=err, description=(
        "Measure this GPU's GEMM, memory-bound and fused attention times with PyTorch (bf16, CUDA graphs) "
        "and write a machine description that --machine accepts, with its table next to it. "
        "pase calibrate --from-runs RUNS --machine M --out FITTED.json fits a machine on your cluster's "
        "measured runs instead (pase calibrate --from-runs X --help)."))
    p.add_argument("--out", required=True, metavar="FILE.json", help="the machine description to write")
    p.add_argument("--quick", action="store_true", help="a small grid (minutes) instead of the full one")
    p.add_argument("--no-attention", dest="attention", action="store_false",
                   help="skip the attention grid (the description then states no attention_efficiency; "
                   "fused attention is priced at the default 0.4 of peak)")
    p.add_argument("--collectives", action="store_true",
                   help="measure NCCL all-reduce, all-gather, reduce-scatter, all-to-all and send/receive bus bandwidths on "
                   "this node's GPUs (groups of 2, 4, 8; 1 MB to 1 GB) into the existing description --out, "
                   "nothing else; across nodes too when started by torchrun on several nodes")
    p.add_argument("--dtype", choices=("bf16",) + CALIBRATED_DTYPES, default="bf16",
                   help="bf16 (default): measure the description and its tables; fp8: measure FP8 GEMMs "
                   "(torch._scaled_mm, compute capability 8.9 or later) into the existing description --out's "
                   "table, which then prices FP8 GEMMs instead of the transfer rule")
    p.add_argument("--name", help="machine name (default: the file's stem)")
    p.add_argument("--devices-per-node", type=_positive(int), metavar="G",
                   help="GPUs per node (default 8)")
    p.add_argument("--memory-gb", type=_positive(float), help="device memory, the default --memory cap "
                   "(default: what the device reports)")
    p.add_argument("--peak-tflops", type=_positive(float), help="peak TFLOPS (default: the best measured)")
    p.add_argument("--hbm-gbps", type=_positive(float), help="memory bandwidth GB/s (default: the best measured)")
    p.add_argument("--intra-gbps", type=_positive(float),
                   help=f"GB/s per GPU inside a node (default {DEFAULT_LINKS['intra_node']['gbps']})")
    p.add_argument("--intra-latency-us", type=_non_negative,
                   help=f"latency inside a node, microseconds (default {DEFAULT_LINKS['intra_node']['latency_us']})")
    p.add_argument("--inter-gbps", type=_positive(float),
                   help=f"GB/s per GPU between nodes (default {DEFAULT_LINKS['inter_node']['gbps']})")
    p.add_argument("--inter-latency-us", type=_non_negative,
                   help=f"latency between nodes, microseconds (default {DEFAULT_LINKS['inter_node']['latency_us']})")
    return p


#: The description flags, which --collectives (it measures the collectives only) refuses.
_DESCRIPTION_FLAGS = ("name", "devices_per_node", "memory_gb", "peak_tflops", "hbm_gbps", "intra_gbps",
                      "intra_latency_us", "inter_gbps", "inter_latency_us")


def _link(value, link: str, field: str):
    return DEFAULT_LINKS[link][field] if value is None else value


def main(argv: Sequence[str] | None = None, out: IO | None = None, err: IO | None = None, *,
         prog: str = "pase calibrate", timer=None, collective_timer=None) -> int:
    """``pase calibrate``: returns the exit status (0; 1 no PyTorch, no GPU or a file error; 2 usage).

    Every error is one ``pase calibrate: error:`` line on ``err``. ``timer`` replaces the
    GPU, ``collective_timer`` the GPUs' collectives (tests: ``timer(kind, ranks, nodes, bytes)``).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--from-runs" or a.startswith("--from-runs=") for a in argv):
        from .calibrate_runs import main as from_runs

        return from_runs(argv, out, err, prog)
    try:
        args = build_parser(out, err, prog).parse_args(argv)
        if not args.out.endswith(".json"):
            raise CliError(f"--out must name a .json file, got {args.out!r}", ExitStatus.USAGE)
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder):
            raise CliError(f"--out: no such directory {folder}", ExitStatus.USAGE)
        if os.path.isdir(args.out):
            raise CliError(f"--out: {args.out} is a directory", ExitStatus.USAGE)
        if args.collectives and args.dtype != "bf16":
            raise CliError(f"--dtype {args.dtype} and --collectives measure different things: one at a time",
                           ExitStatus.USAGE)
        if args.dtype != "bf16":
            given = [f for f in _DESCRIPTION_FLAGS if getattr(args, f) is not None]
            if given or not args.attention:
                flag = "--" + (given[0] if given else "no_attention").replace("_", "-")
                raise CliError(f"{flag} sets a description field; --dtype {args.dtype} measures its GEMMs only "
                               "and keeps the description's fields", ExitStatus.USAGE)
            if not os.path.isfile(args.out):
                raise CliError(f"--dtype {args.dtype} adds to an existing machine description, and {args.out} is "
                               f"none (write one first: pase calibrate --out {args.out})", ExitStatus.USAGE)
        if args.collectives:
            given = [f for f in _DESCRIPTION_FLAGS if getattr(args, f) is not None]
            if given or not args.attention:
                flag = "--" + (given[0] if given else "no_attention").replace("_", "-")
                raise CliError(f"{flag} sets a description field; --collectives measures the collectives only "
                               "and keeps the description's fields", ExitStatus.USAGE)
            try:
                launched = torchrun_world() if collective_timer is None else None
            except ValueError as e:
                raise CliError(str(e), ExitStatus.USAGE) from None
            if not os.path.isfile(args.out) and (launched is None or launched[0] == 0):  # rank 0 writes it
                raise CliError(f"--collectives adds to an existing machine description, and {args.out} is none "
                               f"(write one first: pase calibrate --out {args.out})", ExitStatus.USAGE)
    except ParserExit as done:
        return done.status
    except CliError as e:
        err.write(f"{prog}: error: {e}\n")
        return e.status
    if not os.access(folder, os.W_OK):  # find out now, not after an hour of measuring
        err.write(f"{prog}: error: cannot write {args.out}: permission denied\n")
        return 1
    if args.collectives:
        return _collectives(args, out, err, prog, collective_timer)
    if args.dtype != "bf16":
        return _dtype(args, out, err, prog, timer)
    try:
        if timer is None:
            timer = TorchTimer()
        from tqdm import tqdm

        total = (len(gemm_grid(args.quick)) + len(memory_grid(args.quick))
                 + (len(attention_grid()) if args.attention else 0))
        bar = tqdm(total=total, desc="calibrate",
                   unit="shape", file=err, leave=False, disable=None)

        def progress(done, total):
            bar.update(done - bar.n)

        try:
            description = calibrate(
                args.out, args.quick, timer=timer, name=args.name,
                devices_per_node=args.devices_per_node if args.devices_per_node is not None else 8,
                memory_gb=args.memory_gb, peak_tflops=args.peak_tflops, hbm_gbps=args.hbm_gbps,
                intra_node={"gbps": _link(args.intra_gbps, "intra_node", "gbps"),
                            "latency_us": _link(args.intra_latency_us, "intra_node", "latency_us")},
                inter_node={"gbps": _link(args.inter_gbps, "inter_node", "gbps"),
                            "latency_us": _link(args.inter_latency_us, "inter_node", "latency_us")},
                progress=progress, attention=args.attention,
            )
        finally:
            bar.close()
        load_calibrated(args.out)  # what was written loads back
    except _FAILURES as e:
        return _failed(e, args.out, err, prog)
    attention = (f", fused attention at {description['attention_efficiency']:g} of peak"
                 if "attention_efficiency" in description else "")
    out.write(f"wrote {args.out} ({description['device']}: peak {description['peak_tflops']:g} TFLOPS, "
              f"{description['hbm_gbps']:g} GB/s{attention}; table {description['measured']}); "
              f"use --machine {args.out}\n")
    return 0


#: What a calibration run raises for one line and exit status 1: a file it cannot write, torch
#: or a GPU it lacks, a measurement or file that fails.
_FAILURES = (OSError, ImportError, RuntimeError, ValueError)


def _failed(e: Exception, out: str, err: IO, prog: str) -> int:
    if isinstance(e, OSError):
        err.write(f"{prog}: error: cannot write {e.filename or out}: {e.strerror or e}\n")
    else:
        err.write(f"{prog}: error: {e}\n")
    return 1


def _dtype(args, out: IO, err: IO, prog: str, timer) -> int:
    """``--dtype fp8``: its GEMMs measured into ``args.out``'s table; one line on ``out`` or one
    error line (a GPU or PyTorch without FP8 is refused before anything is measured)."""
    try:
        if timer is None:
            timer = TorchTimer()
        from tqdm import tqdm

        bar = tqdm(total=len(gemm_grid_fp8(args.quick)), desc=f"calibrate {args.dtype}", unit="shape", file=err,
                   leave=False, disable=None)

        def progress(done, total):
            bar.update(done - bar.n)

        try:
            description = calibrate_dtype(args.out, args.dtype, args.quick, timer=timer, progress=progress)
        finally:
            bar.close()
        load_calibrated(args.out)  # what was written loads back
    except _FAILURES as e:
        return _failed(e, args.out, err, prog)
    out.write(f"wrote the {args.dtype} GEMM table of {args.out} ({len(gemm_grid_fp8(args.quick))} shapes, "
              f"{args.dtype} peak {description['dtype_tflops'][args.dtype]:g} TFLOPS; table {description['measured']}); "
              f"use --machine {args.out}\n")
    return 0


def _collectives(args, out: IO, err: IO, prog: str, timer) -> int:
    """``--collectives``: measure into ``args.out``; one line on ``out`` or one error line."""
    try:
        progress = bar = None
        if timer is not None:  # measured here (spawned or torchrun ranks cannot share a bar)
            from tqdm import tqdm

            g = load_description(args.out)["devices_per_node"]
            total = len(COLLECTIVE_KINDS) * len(collective_groups(g)) * len(collective_sizes(args.quick))
            bar = tqdm(total=total, desc="collectives", unit="size", file=err, leave=False, disable=None)

            def progress(done, total):
                bar.update(done - bar.n)
        try:
            description, where = calibrate_collectives(args.out, args.quick, timer=timer, progress=progress)
        finally:
            if bar is not None:
                bar.close()
        if description is None:  # a torchrun rank other than 0: rank 0 reports
            return 0
        load_calibrated(args.out)  # what was written loads back
    except _FAILURES as e:
        return _failed(e, args.out, err, prog)
    rows = sum(len(r) for r in description["collectives"].values())
    big = [r for r in description["collectives"].get("all_reduce", []) if r[1] == 1]
    best = (f"; all-reduce up to {max(r[3] for r in big):g} GB/s bus bandwidth in a node" if big else "")
    out.write(f"wrote the collectives of {args.out} ({rows} rows, {where}{best}); use --machine {args.out}\n")
    return 0
