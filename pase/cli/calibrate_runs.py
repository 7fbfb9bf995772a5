"""``pase calibrate --from-runs RUNS --machine M [--engine E] --out FITTED.json``: learn a cluster
from its own measured runs (``pase.planning.calibrate_runs``) and write the fitted machine."""

from __future__ import annotations

import json
import os
from typing import IO, Sequence

from pase.core.errors import InputError
from pase.core.fileio import check_writable, recording_reads, write_atomic
from pase.machines.fitted import at_bounds

from .errors import CliError, ParserExit
from .parser import StreamParser
from .status import ExitStatus

__all__ = ["main", "build_parser"]


def build_parser(out: IO, err: IO, prog: str) -> StreamParser:
    p = StreamParser(prog=prog, out=out, err=err, description=(
        "Fit the constants the model leaves free (in-step compute efficiency, the collectives' speed inside a "
        "node and across nodes, the host time per block) on measured runs of your cluster, and write a machine "
        "description with them (docs/calibration.md, 'Your own runs')."))
    p.add_argument("--from-runs", required=True, metavar="RUNS",
                   help="the measured runs: a JSON list or a CSV file (fields: graph, devices, batch, sequence, recipe, "
                   "tokens_per_second_per_device or step_seconds; optional name, peak_memory_gib, memory)")
    p.add_argument("--machine", required=True, metavar="M", help="the machine the runs ran on: a preset or a file")
    p.add_argument("--engine", metavar="E", help="the engine the runs ran with (default: the command line's default)")
    p.add_argument("--out", required=True, metavar="FITTED.json", help="the fitted machine description to write")
    p.add_argument("--json", action="store_true", help="print the fit as JSON")
    return p


def _machine_file_fields(description: dict, spec: str, out_path: str) -> dict:
    """The description with its measured table findable from ``out_path``: a preset's table as its
    ``gemm_reference``, a file's table path made relative to the new file."""
    from pase.machines.calibrated import PRESETS, PRESET_TABLES

    d = dict(description)
    if "measured" not in d:
        return d
    if spec in PRESETS:
        if spec in PRESET_TABLES and "sms" in d:
            d.pop("measured")
            d["gemm_reference"] = spec
        else:
            d["measured"] = os.path.abspath(PRESET_TABLES[spec])
        return d
    table = os.path.join(os.path.dirname(os.path.abspath(spec)), d["measured"])
    d["measured"] = os.path.relpath(table, os.path.dirname(os.path.abspath(out_path)))
    return d


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:+.1f} %"


def _report(result, engine, machine_spec: str) -> list:
    fit, f = result.fit, result.description["fitted"]
    lines = [f"fitted {machine_spec} for {engine.name} on {len(result.names)} runs "
             f"({len(fit.fitted_on)} fitted on, {len(fit.outliers)} left out as outliers):",
             f"  compute_efficiency {f['compute_efficiency']:.3f} (in-step kernels against the same kernels alone)",
             f"  collective_scale intra_node {f['collective_scale']['intra_node']:.3f}, inter_node "
             f"{f['collective_scale']['inter_node']:.3f} (collectives' seconds against the machine's own)",
             f"  block_overhead_seconds {1e3 * f['block_overhead_seconds']:.3f} ms (host time per block and micro-batch), "
             f"pipeline_tp_wait_seconds {1e3 * f['pipeline_tp_wait_seconds']:.3f} ms (per block, micro-batch and doubling of "
             "tp on a pipeline stage)",
             f"  tp_node_wait_seconds {1e3 * f['tp_node_wait_seconds']:.3f} ms (per block, micro-batch and doubling "
             "of the nodes a tensor-parallel group spans)"]
    if fit.undetermined:
        lines.append(f"  not determined by these runs, kept: {', '.join(fit.undetermined)}")
    pinned = at_bounds(f)
    if pinned:
        lines.append(f"  at a bound (pase.machines.fitted.FITTED_BOUNDS): {', '.join(pinned)} (the runs push past what "
                     "the mechanism allows: read the fit with care)")
    lines += ["", f"{'run':<24} {'measured s':>11} {'before':>9} {'after':>9} {'left out':>9}"]
    for i, name in enumerate(result.names):
        m = result.measured[i]
        tag = " (outlier)" if name in fit.outliers else ("" if result.fits_after[i] else " (does not fit)")
        lines.append(f"{name[:24]:<24} {m:11.4g} {_pct(result.before[i] / m - 1):>9} {_pct(result.after[i] / m - 1):>9} "
                     f"{_pct(result.left_out[i] / m - 1):>9}{tag}")
    err = lambda a: sorted(abs(x / m - 1) for x, m in zip(a, result.measured) if x == x)  # noqa: E731
    for label, values in (("before", err(result.before)), ("after", err(result.after)),
                          ("left out", err(result.left_out))):
        if values:
            lines.append(f"{label:>9}: median error {100 * values[len(values) // 2]:.1f} %, "
                         f"p90 {100 * values[min(len(values) - 1, int(0.9 * len(values)))]:.1f} %")
    from pase.planning.run_ranking import GOOD_PICK, PAIR_RATIO

    ranks = result.ranking
    first = ranks["before"]
    if first.groups:
        lines += ["", f"order, within each group of one graph, device count and sequence ({first.groups} "
                  f"group{'s' if first.groups != 1 else ''}): pairs measured {PAIR_RATIO:g}x apart ordered right, and "
                  f"groups whose first pick measured at least {100 * GOOD_PICK:.0f} % of their best"]
        for label in ("before", "after", "left_out"):
            r = ranks[label]
            lines.append(f"{label.replace('_', ' '):>9}: {r.right} of {r.pairs} pairs, {r.good_picks} of {r.groups} groups")
    return lines


def main(argv: Sequence[str], out: IO, err: IO, prog: str = "pase calibrate") -> int:
    """Returns the exit status: 0; 2 for a bad runs file, machine, engine or fit (one line on
    ``err``, nothing written); 1 when the file cannot be written."""
    from pase.machines.registry import load_machine
    from pase.planning.calibrate_runs import calibrate_from_runs
    from pase.planning.engine import load_engine
    from pase.planning.measured_runs import read_runs

    try:
        args = build_parser(out, err, prog).parse_args(argv)
    except ParserExit as done:
        return done.status
    try:
        with recording_reads():
            if not args.out.endswith(".json"):
                raise CliError(f"--out must name a .json file, got {args.out!r}", ExitStatus.USAGE)
            runs = read_runs(args.from_runs)
            machine = load_machine(args.machine)
            engine = load_engine(args.engine)
            check_writable(args.out, "fitted machine description")
            result = calibrate_from_runs(runs, machine, engine, f"pase calibrate --from-runs {args.from_runs}")
            text = json.dumps(_machine_file_fields(result.description, args.machine, args.out), indent=1) + "\n"
            write_atomic(args.out, text, "fitted machine description")
    except CliError as e:
        err.write(f"{prog}: error: {e}\n")
        return e.status
    except InputError as e:
        err.write(f"{prog}: error: {e}\n")
        return ExitStatus.INPUT if "cannot write" in str(e) else ExitStatus.USAGE
    except (ValueError, MemoryError) as e:
        err.write(f"{prog}: error: {e}\n")
        return ExitStatus.USAGE
    if args.json:
        out.write(json.dumps({"fitted": result.description["fitted"], "runs": [
            {"name": n, "measured_step": float(m), "before": float(b), "after": float(a),
             "left_out": None if x != x else float(x), "outlier": n in result.fit.outliers}
            for n, m, b, a, x in zip(result.names, result.measured, result.before, result.after, result.left_out)],
            "ranking": {k: r.as_dict() for k, r in result.ranking.items()},
            "at_bounds": at_bounds(result.description["fitted"])}, indent=1) + "\n")
    else:
        out.write("\n".join(_report(result, engine, args.machine)) + "\n")
        out.write(f"wrote {args.out}; use --machine {args.out} --engine {engine.name}\n")
    return 0
