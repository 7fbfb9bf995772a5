"""``--sweep N1,N2,...`` on a real machine (or with ``--training``): the training plan at every
count, as a table, JSON or a report (its time and cost to train: ``pase/cli/budget.py``)."""

from __future__ import annotations

from typing import IO

from .budget import budget_of, check_budget
from .errors import CliError
from .status import ExitStatus

__all__ = ["check_sweep_flags", "run_training_sweep"]


def check_sweep_flags(args, training: bool) -> None:
    """Refuse (usage status) the flags about one plan with a training sweep, before any work."""
    if training and args.sweep is not None:
        for flag, given in (("--recipe-from", getattr(args, "recipe_from", None)),
                            ("--export-torchtitan", getattr(args, "export_torchtitan", None)),
                            ("--export-megatron", getattr(args, "export_megatron", None)),
                            ("--export-deepspeed", getattr(args, "export_deepspeed", None)),
                            ("-d/--dot-path", args.dot_path or args.dump_graph or None)):
            if given is not None:
                raise CliError(f"{flag} is about one plan, and a sweep makes one per count: give -p N for it",
                               ExitStatus.USAGE)


def run_training_sweep(opts, args, out: IO, err: IO) -> int:
    """The command: the training plan at every count of ``--sweep``, printed as a table or JSON,
    and the sweep's report; status 4 where a count has nothing that fits, 2 where no search
    applies to one (each said on its row and on stderr), else 0."""
    from pase.core.fileio import write_atomic
    from pase.outputs.plan_json import format_json
    from pase.outputs.training_sweep import format_training_sweep, refusal_text, sweep_dict
    from pase.planning.training_sweep import sweep_training

    from .common import (
        answer_notes, check_outputs, effective_model, load_checked_machine, load_network, model_name, write_exports,
        write_notes,
    )
    from .progress import show_progress
    from .training import MAX_TOP, network_builder, pricing_engine, search_inputs

    if opts.readers == "summed":
        raise CliError("--readers summed applies to the per-layer search (--per-layer --sweep); the training model "
                       "sums the readers of a mesh plan itself (docs/training.md)", ExitStatus.USAGE)
    machine = load_checked_machine(opts, opts.sweep)
    network = load_network(opts, err=err)
    report = getattr(args, "report", None)
    check_outputs(opts, [("--report", report, "HTML report")] if report is not None else [])
    budget = budget_of(args)
    check_budget(budget, machine, network)
    try:
        engine, keep_to = pricing_engine(args)
    except ValueError as error:
        raise CliError(str(error), ExitStatus.USAGE) from None
    args, rules = search_inputs(args, lambda message, status: CliError(message, status))
    write_exports(opts, "network", network)
    load, rebuild = network_builder(opts, network)
    cap = opts.memory_cap if opts.memory_cap is not None else machine.memory_bytes
    model = effective_model(opts)
    bar = _CountsBar(len(opts.sweep), err, network.name, show_progress(opts, err))
    try:
        sweep = sweep_training(load, network.batch or 1, opts.sweep, machine, cap, opts.act_bytes, args.recipe,
                               args.compare, rebuild=rebuild, table_budget=opts.table_budget, engine=engine,
                               keep_to=keep_to, alternatives=min(getattr(args, "top", None) or 0, MAX_TOP),
                               rules=rules, per_layer=bool(getattr(args, "per_layer", False)), each=bar.step)
    finally:
        bar.close()
    label = engine.label() if engine is not None else None
    for entry in sweep.entries:
        if entry.best is None:  # said on its row too; the sweep went on
            err.write(f"pase: error: p={entry.devices}: {refusal_text(entry)}\n")
    status = (ExitStatus.NOTHING_FITS if any(e.plan is not None and e.best is None for e in sweep.entries)
              else ExitStatus.USAGE if any(e.plan is None for e in sweep.entries) else ExitStatus.OK)
    if report is not None:
        from pase.outputs.sweep_report import sweep_html

        if sweep.planned:
            write_atomic(report, sweep_html(sweep, model, model_name(opts), budget, label), "HTML report")
        else:
            err.write(f"pase: error: no count has a plan: --report {report} not written\n")
    if opts.json:
        out.write(format_json(sweep_dict(sweep, model, model_name(opts), budget, cap, label)))
    else:
        out.write(format_training_sweep(sweep, model, model_name(opts), budget, label))
        if report is not None and sweep.planned:
            out.write(f"\nHTML report written to {report}\n")
    write_notes(err, answer_notes(network, opts, machine=machine))
    return status


class _CountsBar:
    """A progress bar over the counts of a sweep (shown where progress bars are)."""

    def __init__(self, counts: int, err: IO, name: str, shown: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=counts, desc=f"{name} sweep", unit="count", file=err, leave=False, disable=not shown)
        self.started = False

    def step(self, devices: int) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_postfix_str(f"p={devices}")

    def close(self) -> None:
        self.bar.close()
