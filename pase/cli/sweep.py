"""``pase --sweep P1,P2,...``: one search per device count, a row (or JSON line) each; a
count that is refused gets its row, one that leaves devices idle a note, and the sweep goes on."""

from __future__ import annotations

from typing import IO

from tqdm import tqdm

from pase.model.builder import CostTablesTooLarge
from pase.outputs.plan_json import format_json, refusal_dict, report_dict
from pase.outputs.sweep import format_sweep_header, format_sweep_refusal, format_sweep_row
from pase.planning.baselines import data_parallel
from pase.planning.occupancy import occupancy
from pase.planning.planner import evaluate_plan
from pase.search.capped import NOTHING_FITS
from pase.search.solver import SearchTooLarge

from .common import (
    answer_notes, idle_note, machine_defaults, Profiler, check_outputs, effective_model, write_exports, load_checked_machine,
    load_network, model_name, nothing_fits_message, plan_with_options, write_dot, write_notes,
)
from .options import Options
from .progress import show_progress
from .status import ExitStatus

__all__ = ["run_sweep"]


def run_sweep(opts: Options, out: IO, err: IO) -> int:
    machine = load_checked_machine(opts, opts.sweep)
    opts = machine_defaults(opts, machine)
    network = load_network(opts, err=err)
    check_outputs(opts)
    write_exports(opts, "network", network)
    model = effective_model(opts)
    if not opts.json:
        out.write(format_sweep_header(network.name, network.batch, machine, model, model_name(opts),
                                      network.readers))
    status = ExitStatus.OK
    profiler = Profiler(opts.profile)
    bar = tqdm(opts.sweep, desc=f"{network.name} sweep", unit="search", file=err, leave=False,
               disable=not show_progress(opts, err))
    try:
        for procs in bar:
            try:
                with profiler:
                    planned = plan_with_options(network, procs, machine, opts, err, bar=False)
            except (SearchTooLarge, CostTablesTooLarge) as too_large:
                # Like the paper's "OOM" cells: say so for this p and go on with the others.
                status = ExitStatus.TOO_LARGE
                dp = evaluate_plan(network, data_parallel(network, procs), procs, machine, opts.memory_model)
                bar.write(f"pase: error: p={procs}: {too_large}", file=err)
                if opts.json:
                    line = format_json(refusal_dict(dp, "too_large", model, too_large=too_large), one_line=True)
                else:
                    line = format_sweep_refusal(procs, dp.total_cost, machine=machine)
                bar.write(line, file=out, end="")
                continue
            if planned.memory.status == NOTHING_FITS:
                status = ExitStatus.NOTHING_FITS
                bar.write(f"pase: error: p={procs}: {nothing_fits_message(planned, opts)}", file=err)
                if opts.json:
                    line = format_json(refusal_dict(planned, "nothing_fits", model), one_line=True)
                else:
                    line = format_sweep_refusal(procs, planned.data_parallel.total, "nothing fits", planned.memory,
                                                machine)
                bar.write(line, file=out, end="")
                continue
            # A count that leaves devices idle is planned all the same (every configuration on at most p).
            idle = idle_note(network, occupancy(network, procs))
            if idle is not None:
                bar.write(idle, file=err)
            line = format_json(report_dict(planned, model), one_line=True) if opts.json else format_sweep_row(planned)
            bar.write(line, file=out, end="")
    finally:
        bar.close()
    if opts.dot_path is not None:
        write_dot(opts, network)
    write_notes(err, answer_notes(network, opts, machine=machine))  # the paper machine's and the machine's, once
    profiler.write(opts, out, err)
    return status
