"""``--sweep N1,N2,...`` on a real machine (or with ``--training``): the training plan at every
count, as a table, JSON or a report; and ``--tokens``, ``--device-hour-price``, ``--days``."""

from __future__ import annotations

import argparse
import math
from typing import IO

from pase.outputs.training_sweep import TrainingBudget

from .errors import CliError
from .status import ExitStatus

__all__ = ["add_scaling_flags", "check_scaling_flags", "budget_of", "check_budget", "run_training_sweep",
           "token_count", "device_hour_price", "day_count", "MAX_TOKENS", "MAX_PRICE", "MAX_DAYS"]

#: Largest --tokens: a million times the 15T tokens of Llama 3's pre-training, yet finite in any sum.
MAX_TOKENS = 1e19
#: Largest --device-hour-price (a price in any currency per device-hour).
MAX_PRICE = 1e9
#: Largest --days: over two thousand years.
MAX_DAYS = 1e6


def _number(text: str, what: str, low: float, high: float, low_included: bool) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    above = value >= low if low_included else value > low
    if not (math.isfinite(value) and above and value <= high):
        bound = "at least" if low_included else "above"
        raise argparse.ArgumentTypeError(f"expected {what}, {bound} {low:g} and at most {high:g}, got {text!r}")
    return value


def token_count(text: str) -> float:
    """--tokens: how many tokens to train, such as ``15e12``."""
    return _number(text, "a number of tokens such as 15e12", 1.0, MAX_TOKENS, True)


def device_hour_price(text: str) -> float:
    """--device-hour-price: what one device costs an hour (any currency), such as ``2.5``."""
    return _number(text, "a price per device-hour such as 2.5", 0.0, MAX_PRICE, True)


def day_count(text: str) -> float:
    """--days: a deadline in days, such as ``60``."""
    return _number(text, "a number of days such as 60", 0.0, MAX_DAYS, False)


def add_scaling_flags(parser: argparse.ArgumentParser) -> None:
    """The time-and-cost flags (a group of their own in ``--help``); ``--sweep`` is a run flag."""
    group = parser.add_argument_group(
        "time and cost to train",
        "How long a training plan takes to train a number of tokens, on how many device-hours and at what cost "
        "(with --sweep: at every count, and which counts meet a deadline).")
    add = group.add_argument
    add("--tokens", type=token_count, default=None, metavar="T",
        help="tokens to train, such as 15e12: adds the time to train them at the plan's tokens/s on all its devices, "
             "in days and hours, and the device-hours (JSON: training.time_to_train_seconds, training.device_hours).")
    add("--device-hour-price", type=device_hour_price, default=None, metavar="P",
        help="what a device costs per hour (any currency), with --tokens: adds the cost to train (JSON: "
             "training.cost).")
    add("--days", type=day_count, default=None, metavar="D",
        help="with --sweep and --tokens: mark the counts that train the tokens within D days and name the smallest.")


def check_scaling_flags(args, training: bool) -> None:
    """Refuse (usage status) the time-and-cost flags where they do not apply, before any work."""
    tokens = getattr(args, "tokens", None)
    if getattr(args, "device_hour_price", None) is not None and tokens is None:
        raise CliError("--device-hour-price prices the time to train: give --tokens too", ExitStatus.USAGE)
    if getattr(args, "days", None) is not None:
        if tokens is None:
            raise CliError("--days is a deadline for the time to train: give --tokens too", ExitStatus.USAGE)
        if args.sweep is None:
            raise CliError("--days marks the counts of a sweep that train within it: give --sweep N1,N2,...",
                           ExitStatus.USAGE)
    if tokens is not None and (not training or args.evaluate is not None):
        raise CliError("--tokens takes a training plan's tokens/s: it applies to the training plan (the default on a "
                       "real machine; --training on the paper's), not to the per-layer search or --evaluate",
                       ExitStatus.USAGE)
    if training and args.sweep is not None:
        for flag, given in (("--recipe-from", getattr(args, "recipe_from", None)),
                            ("--export-torchtitan", getattr(args, "export_torchtitan", None)),
                            ("--export-megatron", getattr(args, "export_megatron", None)),
                            ("--export-deepspeed", getattr(args, "export_deepspeed", None)),
                            ("-d/--dot-path", args.dot_path or args.dump_graph or None)):
            if given is not None:
                raise CliError(f"{flag} is about one plan, and a sweep makes one per count: give -p N for it",
                               ExitStatus.USAGE)


def budget_of(args) -> TrainingBudget | None:
    """The :class:`TrainingBudget` of the flags (``None`` without ``--tokens``)."""
    tokens = getattr(args, "tokens", None)
    if tokens is None:
        return None
    return TrainingBudget(tokens, getattr(args, "device_hour_price", None), getattr(args, "days", None))


def check_budget(budget: TrainingBudget | None, machine, network) -> None:
    """Refuse ``--tokens`` where a plan has no tokens/s: a machine that does not price in seconds,
    a network whose source declares no tokens."""
    if budget is None:
        return
    from pase.model.builder import tokens_of

    if machine.cost_unit != "seconds":
        raise CliError(f"--tokens needs the plan's tokens/s, and machine {machine.name} prices in "
                       f"{machine.cost_unit}, not seconds: name a real machine (--machine h100-sxm; pase machines)",
                       ExitStatus.USAGE)
    if tokens_of(network) is None:
        raise CliError(f"--tokens needs the plan's tokens/s, and {network.name} has no tokens per sequence (its "
                       "source declares none): --tokens applies to language models", ExitStatus.USAGE)


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
                               rules=rules, each=bar.step)
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
    write_notes(err, answer_notes(network, opts))
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
