"""A training sweep (``--sweep`` on a real machine) as a table and as JSON, and the time and cost to
train a number of tokens (``--tokens``, ``--device-hour-price``, ``--days``) of any training plan."""

from __future__ import annotations

from dataclasses import dataclass

from pase.core.units import format_bytes
from pase.planning.training_sweep import TrainingSweep, scaling_efficiency

from .training import step_band, training_report

__all__ = ["TrainingBudget", "time_to_train", "duration_text", "time_to_train_line", "with_time_to_train",
           "with_time_to_train_line",
           "within_days", "sweep_dict", "format_training_sweep", "refusal_text"]

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class TrainingBudget:
    """What a run is asked to train: ``tokens`` in all, at ``price`` per device-hour (``None``:
    no cost), within ``days`` (``None``: no deadline)."""

    tokens: float
    price: float | None = None
    days: float | None = None


def time_to_train(tokens_per_second_per_device: float, devices: int, budget: TrainingBudget) -> dict:
    """The ``training`` fields of ``budget.tokens`` at a plan's throughput: the seconds (the tokens
    over the tokens per second of all ``devices``), the device-hours and, with a price, the cost.

    >>> time_to_train(1000.0, 100, TrainingBudget(3.6e9, 2.0))
    {'time_to_train_seconds': 36000.0, 'device_hours': 1000.0, 'cost': 2000.0}
    """
    seconds = budget.tokens / (tokens_per_second_per_device * devices)
    fields = {"time_to_train_seconds": seconds, "device_hours": seconds * devices / SECONDS_PER_HOUR}
    if budget.price is not None:
        fields["cost"] = fields["device_hours"] * budget.price
    return fields


def duration_text(seconds: float) -> str:
    """A time to train in days and hours.

    >>> duration_text(3.5 * 86400), duration_text(5400.0)
    ('3.5 days (84 hours)', '0.0625 days (1.5 hours)')
    >>> duration_text(1.45e7)
    '168 days (4,028 hours)'

    """
    return f"{_amount(seconds / SECONDS_PER_DAY)} days ({_amount(seconds / SECONDS_PER_HOUR)} hours)"


def _amount(value: float) -> str:
    """A figure to read, not to compute with: whole from 100 on, else three significant digits.

    >>> _amount(4106761.4), _amount(15.93), _amount(0.0625)
    ('4,106,761', '15.9', '0.0625')
    """
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def time_to_train_line(fields: dict, devices: int, budget: TrainingBudget) -> str:
    """The table's line of :func:`time_to_train`'s fields."""
    line = (f"  time to train {budget.tokens:.3g} tokens on {devices:,} devices: "
            f"{duration_text(fields['time_to_train_seconds'])}; {_amount(fields['device_hours'])} device-hours")
    if "cost" in fields:
        line += f"; cost {_amount(fields['cost'])} at {budget.price:g} per device-hour"
    return line


def with_time_to_train(training: dict | None, devices: int, budget: TrainingBudget | None) -> dict | None:
    """The ``training`` object with :func:`time_to_train`'s fields added (where the plan has a
    throughput in tokens: a machine that prices in seconds, a network with tokens)."""
    if training is None or budget is None or training.get("tokens_per_second_per_device") is None:
        return training
    training.update(time_to_train(training["tokens_per_second_per_device"], devices, budget))
    return training


def with_time_to_train_line(text: str, plan, budget: TrainingBudget | None) -> str:
    """A training plan's table (``format_training``) with :func:`time_to_train_line` after the
    plan's tokens/s line (where it has one)."""
    best = None if budget is None or plan.best is None else plan.best
    tps = None if best is None else best.summary.tokens_per_second_per_device
    if tps is None or plan.machine.cost_unit != "seconds":
        return text
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("  tokens/s per device:")), None)
    if at is None:
        return text
    lines.insert(at + 1, time_to_train_line(time_to_train(tps, plan.procs, budget), plan.procs, budget))
    return "\n".join(lines)


def within_days(fields: dict | None, budget: TrainingBudget | None) -> bool | None:
    """Whether a plan's time to train is at most the budget's days (``None`` without either)."""
    if budget is None or budget.days is None or not fields or "time_to_train_seconds" not in fields:
        return None
    return fields["time_to_train_seconds"] <= budget.days * SECONDS_PER_DAY


def refusal_text(entry) -> str:
    """Why a count of a sweep has no plan: nothing fits (and how little the search could do
    with), or why no search applies there."""
    if entry.plan is None:
        return f"no plan: {entry.refused}"
    least = entry.plan.least_memory
    cap = entry.plan.memory_cap
    text = "nothing fits" + (f" in {format_bytes(cap)} per device" if cap is not None else "")
    if least is not None:
        text += f": the least any configuration searched needs is {format_bytes(least.summary.peak_memory_bytes)} " \
                f"({least.recipe()})"
    return text


# ---------------------------------------------------------------------------------------
# JSON


def _entry_dict(entry, efficiency, model, model_name: str, budget: TrainingBudget | None) -> dict:
    """One count of the sweep: the ``training`` object its single run prints, and the rest of
    that run's JSON that is about the count (engines, the compared recipe, the search)."""
    if entry.best is None:
        return {"devices": entry.devices, "status": "nothing-fits" if entry.plan is not None else "refused",
                "reason": refusal_text(entry), "training": None, "scaling_efficiency": None}
    report = training_report(entry.plan, entry.plan.network, model, model_name)
    training = with_time_to_train(report["training"], entry.devices, budget)
    out = {"devices": entry.devices, "status": report["status"], "training": training,
           "scaling_efficiency": efficiency}
    if budget is not None and budget.days is not None:
        out["within_days"] = within_days(training, budget)
    for key in ("engines", "compare", "search"):
        if key in report:
            out[key] = report[key]
    return out


def sweep_dict(sweep: TrainingSweep, model=None, model_name: str = "sequence length",
               budget: TrainingBudget | None = None, memory_cap=None, engine: str | None = None) -> dict:
    """The JSON object of a training sweep: ``sweep``, a list of ``{"devices": N, "training":
    {...}}`` (each ``training`` the object ``pase -p N --json`` prints), and the smallest count
    within ``--days``."""
    entries = [_entry_dict(e, x, model, model_name, budget)
               for e, x in zip(sweep.entries, scaling_efficiency(sweep.entries))]
    data = {
        "graph": sweep.network_name,
        "batch": sweep.batch,
        "model": model,
        "machine": sweep.machine.describe(),
        "cost_unit": sweep.machine.cost_unit,
        "memory_cap_bytes": memory_cap,
        "engine": engine,
        "tokens": None if budget is None else budget.tokens,
        "device_hour_price": None if budget is None else budget.price,
        "days": None if budget is None else budget.days,
        "sweep": entries,
        "search": {"counts": len(entries), "seconds": sweep.seconds},
    }
    if budget is not None and budget.days is not None:
        within = [e["devices"] for e in entries if e.get("within_days")]
        data["smallest_within_days"] = min(within) if within else None
    return data


# ---------------------------------------------------------------------------------------
# The table

#: Columns: heading, alignment, width (the plan's recipe last, as wide as it is).
_COLUMNS = (("devices", ">", 7), ("step s (band)", "<", 26), ("tokens/s/device", ">", 15), ("MFU", ">", 6),
            ("memory/device", ">", 13), ("scaling", ">", 7))
_BUDGET_COLUMNS = (("time to train", ">", 13), ("device-hours", ">", 12))
_COST_COLUMN = (("cost", ">", 12),)


def _columns(budget: TrainingBudget | None, seconds: bool = True) -> tuple:
    # On a machine that prices in FLOP-equivalents the step is no time: its heading says so.
    columns = _COLUMNS if seconds else ((_COLUMNS[0], ("step (flop-equivalents)",) + _COLUMNS[1][1:]) + _COLUMNS[2:])
    if budget is None:
        return columns
    return columns + _BUDGET_COLUMNS + (_COST_COLUMN if budget.price is not None else ())


def _line(cells: list, columns: tuple) -> str:
    return "  ".join(f"{c:{a}{w}}" for c, (_, a, w) in zip(cells, columns)) + "  " + cells[-1]


def _step_cell(candidate, seconds: bool) -> str:
    step = candidate.summary.step_seconds
    band = step_band(candidate) if seconds else None
    return f"{step:.4g}" + (f" ({band[0]:.3g}-{band[1]:.3g})" if band is not None else "")


def _row(entry, efficiency, columns: tuple, budget: TrainingBudget | None, seconds: bool) -> str:
    best = entry.best
    if best is None:
        return f"{entry.devices:>7}  " + refusal_text(entry)
    s = best.summary
    tps = s.tokens_per_second_per_device if seconds else None
    cells = [str(entry.devices), _step_cell(best, seconds), "-" if tps is None else f"{tps:,.0f}",
             "-" if s.mfu is None or not seconds else f"{100 * s.mfu:.1f} %", format_bytes(s.peak_memory_bytes),
             "-" if efficiency is None else f"{100 * efficiency:.1f} %"]
    if budget is not None:
        fields = time_to_train(tps, entry.devices, budget) if tps is not None else None
        mark = "*" if within_days(fields, budget) else " " if budget.days is not None else ""
        cells += ["-", "-"] if fields is None else [
            f"{_amount(fields['time_to_train_seconds'] / SECONDS_PER_DAY)} d{mark}", _amount(fields["device_hours"])]
        if budget.price is not None:
            cells.append("-" if fields is None else _amount(fields["cost"]))
    return _line(cells + [best.recipe()], columns)


def _budget_line(sweep: TrainingSweep, budget: TrainingBudget) -> str:
    """What the budget's columns mean, and with ``--days`` the counts within them and the smallest."""
    line = (f"time to train {budget.tokens:.3g} tokens at each plan's tokens/s on all its devices (d: days"
            + (f"; cost: device-hours x {budget.price:g}" if budget.price is not None else "") + ")")
    if budget.days is None:
        return line
    timed = [(e, time_to_train(e.best.summary.tokens_per_second_per_device, e.devices, budget))
             for e in sweep.entries if e.best is not None and e.best.summary.tokens_per_second_per_device]
    within = [(e, f) for e, f in timed if within_days(f, budget)]
    if within:
        e, f = min(within, key=lambda ef: ef[0].devices)
        line += (f"; within {budget.days:g} days (*): {', '.join(str(x.devices) for x, _ in within)}; the smallest: "
                 f"{e.devices} devices, {duration_text(f['time_to_train_seconds'])}, "
                 f"{_amount(f['device_hours'])} device-hours" + (f", cost {_amount(f['cost'])}" if "cost" in f else ""))
    elif timed:
        e, f = min(timed, key=lambda ef: ef[1]["time_to_train_seconds"])
        line += (f"; no count trains them within {budget.days:g} days; the fastest: {e.devices} devices, "
                 f"{duration_text(f['time_to_train_seconds'])}")
    return line


def format_training_sweep(sweep: TrainingSweep, model=None, model_name: str = "sequence length",
                          budget: TrainingBudget | None = None, engine: str | None = None) -> str:
    """The table of a training sweep: per count its plan's step (and band), tokens/s per device,
    MFU, memory per device, scaling efficiency against the first planned count, with a budget
    the time and device-hours (and cost) to train it, and the plan's recipe; a count without a
    plan says why on its row."""
    machine = sweep.machine
    seconds = machine.cost_unit == "seconds"
    size = f", {model_name} {model}" if model is not None else ""
    columns = _columns(budget, seconds)
    head = [f"PaSE training sweep: {sweep.network_name}, batch {sweep.batch}{size}; {machine.header_line()}"
            + (f"; engine {engine}" if engine else "")]
    head.append(_line([h for h, _, _ in columns] + ["plan"], columns))
    rows = [_row(e, x, columns, budget, seconds) for e, x in zip(sweep.entries, scaling_efficiency(sweep.entries))]
    evaluated = sum(e.plan.mesh_search.evaluated for e in sweep.entries if e.plan is not None)
    tail = [] if budget is None else [_budget_line(sweep, budget)]
    tail.append(f"search: {evaluated} configurations in {sweep.seconds:.2f} s over {len(sweep.entries)} counts, each "
                "row the plan -p N gives alone (scaling: tokens/s per device against the first count's); model: "
                "docs/training.md")
    return "\n".join(head + rows + tail) + "\n"
