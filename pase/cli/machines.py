"""``pase machines [NAME] [--json]``: the machine presets with their key figures, or one machine
(a preset or a machine file) in full with the source of every figure (``docs/machines.md``)."""

from __future__ import annotations

import json
import sys
from typing import IO, Sequence

from pase.machines.calibrated import GIB, PRESETS, load_calibrated, load_description, memory_bytes_of
from pase.machines.specs import DTYPES

from .errors import CliError, ParserExit
from .parser import StreamParser

__all__ = ["build_parser", "main", "machines_table"]

_COLUMNS = ("machine", "GPUs/node", "NVLink domain", "memory GiB", "HBM TB/s") + tuple(
    f"{d.upper()} TFLOPS" for d in DTYPES) + ("NVLink GB/s", "NIC GB/s", "GEMMs")


def build_parser(out: IO, err: IO, prog: str = "pase machines") -> StreamParser:
    p = StreamParser(prog=prog, out=out, err=err, description=(
        "List the machine presets with their key figures (per GPU, dense peaks, GB/s one way), or show one "
        "machine (a preset or a machine file) in full with the source of every figure."))
    p.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help="a preset name or a machine description file to show in full")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _row(name: str) -> dict:
    d = load_description(name)
    rates = {"bf16": d["peak_tflops"], **d.get("dtype_tflops", {})}
    gemms = "measured" if "measured" in d else (f"from {d['gemm_reference']}" if "gemm_reference" in d else "peak")
    return {
        "machine": name, "GPUs/node": d["devices_per_node"], "NVLink domain": d.get("nvlink_domain", d["devices_per_node"]),
        "memory GiB": round(memory_bytes_of(d) / GIB, 2), "HBM TB/s": d["hbm_gbps"] / 1000,
        **{f"{k.upper()} TFLOPS": rates.get(k) for k in DTYPES},
        "NVLink GB/s": d["intra_node"]["gbps"], "NIC GB/s": d["inter_node"]["gbps"], "GEMMs": gemms,
    }


def machines_table() -> list:
    """One row of key figures per calibrated preset (``_COLUMNS``; ``None`` where a format is absent)."""
    return [_row(name) for name in PRESETS]


def _cell(v) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _text(rows: list) -> str:
    cells = [list(_COLUMNS)] + [[_cell(r[c]) for c in _COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 or i == len(widths) - 1 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in cells]
    return ("\n".join(lines) + "\n\nper GPU; peaks dense (no sparsity); GB/s one way; GEMMs measured, or carried "
            "over from h100-sxm's measured table (docs/machines.md); paper (the reference model) is not listed; "
            "'pase machines NAME' shows one with its sources\n")


def main(argv: Sequence[str] | None = None, out: IO | None = None, err: IO | None = None, *,
         prog: str = "pase machines") -> int:
    """``pase machines``: returns the exit status (0; 2 an unknown name or an invalid file)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        args = build_parser(out, err, prog).parse_args(argv)
    except ParserExit as done:
        return done.status
    except CliError as e:
        err.write(f"{prog}: error: {e}\n")
        return e.status
    if args.name is None:
        rows = machines_table()
        out.write(json.dumps(rows, indent=1) + "\n" if args.json else _text(rows))
        return 0
    try:
        machine = load_calibrated(args.name)
    except ValueError as e:
        err.write(f"{prog}: error: {e}\n")
        return 2
    d = machine.describe()
    if args.json:
        out.write(json.dumps(d, indent=1) + "\n")
        return 0
    sources = d.pop("sources", {})
    lines = [machine.header_line(), f"formats: {', '.join(machine.precisions)}"]
    for key, value in d.items():
        shown = json.dumps(value) if not isinstance(value, str) else value
        if key == "collectives":
            shown = f"measured bus bandwidths for {', '.join(value)}"
        lines.append(f"  {key}: {shown}" + (f"\n      source: {sources[key]}" if key in sources else ""))
    out.write("\n".join(lines) + "\n")
    return 0
