"""``--tokens``, ``--device-hour-price``, ``--days``: the time and cost to train a number of tokens
at a training plan's throughput (one plan, or every count of a sweep)."""

from __future__ import annotations

import argparse
import math

from .errors import CliError
from .status import ExitStatus

__all__ = ["add_budget_flags", "check_budget_flags", "budget_of", "check_budget", "token_count", "device_hour_price",
           "day_count", "MAX_TOKENS", "MAX_PRICE", "MAX_DAYS"]

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


def add_budget_flags(parser: argparse.ArgumentParser) -> None:
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


def budget_of(args):
    """The ``TrainingBudget`` of the flags (``pase.outputs.training_sweep``; ``None`` without ``--tokens``)."""
    tokens = getattr(args, "tokens", None)
    if tokens is None:
        return None
    from pase.outputs.training_sweep import TrainingBudget  # the outputs load with the command, not the parser

    return TrainingBudget(tokens, getattr(args, "device_hour_price", None), getattr(args, "days", None))


def check_budget(budget, machine, network) -> None:
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


def check_budget_flags(args, training: bool) -> None:
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
