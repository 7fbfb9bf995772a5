"""Training runs a user measured on their own cluster, read from a JSON list or a CSV file and
checked field by field: what ``pase calibrate --from-runs`` learns a machine from.

A run names how the command line prices it (``graph`` a ``-g`` spec, ``devices``, ``batch``
sequences per step, ``sequence``, ``recipe`` as ``--recipe`` takes it) and what was measured
(``tokens_per_second_per_device`` or ``step_seconds``; optionally ``peak_memory_gib`` and which
figure it is, ``memory``: ``reserved`` or ``allocated``).
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass

from pase.core.errors import InputError
from pase.core.fileio import note_read, read_json

__all__ = ["MeasuredRun", "read_runs", "RUN_FIELDS", "MEMORY_FIGURES"]

#: The fields of a run: required, then optional.
REQUIRED = ("graph", "devices", "batch", "recipe")
OPTIONAL = ("name", "sequence", "tokens_per_second_per_device", "step_seconds", "peak_memory_gib", "memory", "notes")
RUN_FIELDS = REQUIRED + OPTIONAL
#: What a measured peak is: PyTorch's ``max_memory_reserved()`` or ``max_memory_allocated()``.
MEMORY_FIGURES = ("reserved", "allocated")
#: Most runs a file may hold, and the largest file read (bytes): far beyond a calibration's needs.
MAX_RUNS = 100_000
MAX_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run (:func:`read_runs`)."""

    name: str
    graph: str
    devices: int
    batch: int
    recipe: str
    sequence: int | None = None
    tokens_per_second_per_device: float | None = None
    step_seconds: float | None = None
    peak_memory_gib: float | None = None
    memory: str | None = None

    def measured_step(self) -> float | None:
        """The step in seconds: as given, or ``batch x sequence / (tokens/s per device x devices)``;
        ``None`` where only tokens/s is given and the sequence is not (the graph's own then)."""
        if self.step_seconds is not None:
            return self.step_seconds
        if self.sequence is None:
            return None
        return self.batch * self.sequence / (self.tokens_per_second_per_device * self.devices)


def _number(value, where: str, field: str, integer: bool = False):
    """``value`` as a positive finite number (an int where ``integer``); CSV text is parsed."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            kind = "a positive integer" if integer else "a positive number"
            raise ValueError(f"{where}: {field} must be {kind}, got {text[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {field} must be a {'positive integer' if integer else 'positive number'}, "
                         f"got {value!r:.40}")
    if isinstance(value, int) and abs(value) > 2**40:  # an int beyond any float check's reach
        raise ValueError(f"{where}: {field} must be at most {2**40}, got {str(value)[:20]}...")
    if integer and (not isinstance(value, int) and not float(value).is_integer()):
        raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    if not math.isfinite(value) or value <= 0 or (integer and value > 2**40):
        raise ValueError(f"{where}: {field} must be a positive {'integer' if integer else 'finite number'}, "
                         f"got {value!r}")
    return int(value) if integer else float(value)


def _text(value, where: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 10_000:
        raise ValueError(f"{where}: {field} must be non-empty text, got {value!r:.40}")
    return value.strip()


def _run(record, where: str, index: int) -> MeasuredRun:
    """One run from a JSON object or a CSV row (text values), checked."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: each run must be an object of fields ({', '.join(RUN_FIELDS)}), "
                         f"got {type(record).__name__}")
    given = {k: v for k, v in record.items() if not (isinstance(v, str) and not v.strip()) and v is not None}
    unknown = [k for k in record if k not in RUN_FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown field {str(unknown[0])[:40]!r} (fields: {', '.join(RUN_FIELDS)})")
    for field in REQUIRED:
        if field not in given:
            raise ValueError(f"{where}: missing field {field!r}")
    name = _text(given["name"], where, "name") if "name" in given else f"run {index + 1}"
    measured = [f for f in ("tokens_per_second_per_device", "step_seconds") if f in given]
    if len(measured) != 1:
        raise ValueError(f"{where}: give the measured speed as exactly one of tokens_per_second_per_device and "
                         f"step_seconds" + ("" if measured else " (neither is given)"))
    memory = given.get("memory")
    if memory is not None and memory not in MEMORY_FIGURES:
        raise ValueError(f"{where}: memory must be one of {', '.join(MEMORY_FIGURES)} (which PyTorch figure "
                         f"peak_memory_gib is), got {str(memory)[:40]!r}")
    if memory is not None and "peak_memory_gib" not in given:
        raise ValueError(f"{where}: memory says which figure peak_memory_gib is, and peak_memory_gib is not given")
    return MeasuredRun(
        name=name,
        graph=_text(given["graph"], where, "graph"),
        devices=_number(given["devices"], where, "devices", integer=True),
        batch=_number(given["batch"], where, "batch", integer=True),
        recipe=_text(given["recipe"], where, "recipe"),
        sequence=_number(given["sequence"], where, "sequence", integer=True) if "sequence" in given else None,
        tokens_per_second_per_device=(_number(given["tokens_per_second_per_device"], where,
                                              "tokens_per_second_per_device")
                                      if "tokens_per_second_per_device" in given else None),
        step_seconds=_number(given["step_seconds"], where, "step_seconds") if "step_seconds" in given else None,
        peak_memory_gib=_number(given["peak_memory_gib"], where, "peak_memory_gib") if "peak_memory_gib" in given
        else None,
        memory=memory if memory is not None else ("reserved" if "peak_memory_gib" in given else None),
    )


def _csv_records(text: str, label: str) -> list:
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None:
        raise ValueError(f"{label}: empty CSV file: a header row of fields ({', '.join(RUN_FIELDS)}) is needed")
    records = []
    for row in reader:
        if None in row:
            raise ValueError(f"{label}: line {reader.line_num}: more values than the header's "
                             f"{len(reader.fieldnames)} fields")
        records.append(dict(row))
    return records


def read_runs(path: str) -> list:
    """The runs of a JSON file (a list of objects, or ``{"runs": [...]}``) or a CSV file (a header
    row of field names), checked: a ``ValueError`` of one line names the file, the run and the
    field. Names must be unique.

    >>> read_runs("/no/such/runs.json")
    Traceback (most recent call last):
    ...
    pase.core.errors.InputError: cannot read runs file /no/such/runs.json: No such file or directory
    """
    label = f"runs file {path}"
    if path.lower().endswith(".csv"):
        note_read(path, "runs file")
        try:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read(MAX_FILE_BYTES + 1)
        except OSError as err:
            raise InputError(f"cannot read {label}: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise InputError(f"{label} is not UTF-8 text") from None
        if len(text) > MAX_FILE_BYTES:
            raise InputError(f"{label} is larger than {MAX_FILE_BYTES // 2**20} MiB")
        records = _csv_records(text, label)
    else:
        data = read_json(path, "runs file")
        records = data.get("runs") if isinstance(data, dict) and set(data) <= {"runs", "notes"} else data
        if not isinstance(records, list):
            raise ValueError(f"{label}: expected a JSON list of runs (or {{\"runs\": [...]}}), "
                             f"got {type(records).__name__}")
    if not records:
        raise ValueError(f"{label}: no runs")
    if len(records) > MAX_RUNS:
        raise ValueError(f"{label}: {len(records)} runs, more than {MAX_RUNS}")
    runs = [_run(r, f"{label}: run {i + 1}", i) for i, r in enumerate(records)]
    seen: dict = {}
    for i, run in enumerate(runs):
        if run.name in seen:
            raise ValueError(f"{label}: run {i + 1}: name {run.name!r} is also run {seen[run.name] + 1}'s")
        seen[run.name] = i
    return runs
