"""``pase -g GRAPH -p P``: one search, its table or JSON, and the files asked for."""

from __future__ import annotations

from typing import IO

from pase.planning.planner import measure_search
from pase.search.capped import NOTHING_FITS

from .common import (
    answer_notes, machine_defaults, Profiler, check_distinct_outputs, check_occupancy, write_notes, check_outputs, write_exports, load_checked_machine, load_network, nothing_fits_message,
    plan_with_options, print_plan, run_verify, verified_status, write_dot,
)
from .errors import CliError
from .options import MEASURE_RUNS, MEASURE_WARMUP, Options
from .status import ExitStatus

__all__ = ["run_search"]


def run_search(opts: Options, out: IO, err: IO) -> int:
    check_distinct_outputs(opts)
    machine = load_checked_machine(opts, [opts.procs])
    opts = machine_defaults(opts, machine)
    network = load_network(opts, err=err)
    occupied = check_occupancy(network, opts.procs, opts)
    check_outputs(opts)
    write_exports(opts, "network", network)
    profiler = Profiler(opts.profile)
    with profiler:
        planned = plan_with_options(network, opts.procs, machine, opts, err)
    if planned.memory.status == NOTHING_FITS:
        raise CliError(nothing_fits_message(planned, opts), ExitStatus.NOTHING_FITS)
    measurement = measure_search(planned, MEASURE_WARMUP, MEASURE_RUNS, opts.blocks) if opts.measure else None
    if opts.dot_path is not None:
        write_dot(opts, network, planned.configs)
    write_exports(opts, "plan", planned)
    verified = run_verify(opts, planned)
    write_notes(err, answer_notes(network, opts, occupied, machine))
    print_plan(planned, opts, out, measurement, verified)
    profiler.write(opts, out, err)
    return verified_status(verified, err)
