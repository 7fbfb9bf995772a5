"""The per-chunk cost of Megatron's interleaved schedule, bracketed by NVIDIA's tuned depths.

NVIDIA tunes the virtual pipeline size of every layout in its performance tables. Each visible
NeMo / Megatron-Bridge row that interleaves (``nemo-megatron-bridge.json``, VP > 1) is priced by
the command line exactly as ``benchmarks/nemo.py`` prices it, once for every other depth its
pipeline allows (``vpp`` dividing the blocks a stage holds), with the engine's per-chunk cost set
from the command line::

    pase -g hf:CONFIG -p GPUS -b GBS -m SEQ --machine h100-sxm
         --engine megatron,chunk_overhead_seconds=C --recipe ...,schedule=interleaved,vpp=V --json

A depth whose layout does not fit the device is no alternative and is skipped. The step is linear
in ``C`` (each chunk adds ``C`` to a stage's time per micro-batch: ``pipeline.PipelineTimes``), so
two prices per depth give its line; NVIDIA's depth beating a deeper one bounds ``C`` from below,
beating a shallower one from above. A bound that holds for no ``C`` >= 0 is reported with its
cause and not used, as is one from a depth modelled within :data:`TIE` of NVIDIA's at ``C`` = 0. The largest lower bound, rounded up to 50 us, is the value
``pase/planning/engines/megatron.json`` states (``chunk_overhead_seconds``): the smallest per-chunk
cost at which the model, given NVIDIA's own degrees, keeps NVIDIA's depth rather than interleaving
deeper.

Written to ``benchmarks/results/chunk_cost.md``. Run from the repository root:
``python3 benchmarks/chunk_cost.py`` (about a minute).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, ROOT)

from nemo_runs import nemo_recipe, nemo_rows  # noqa: E402
from published import argv_of, config_path, published_dir, run_pase  # noqa: E402

#: The two per-chunk costs each depth is priced at (seconds); the line through them is checked at
#: a third.
PROBES = (0.0, 0.001)
CHECK = 0.0004
#: The stated value is the largest lower bound rounded up to this step (seconds).
ROUND_TO = 50e-6
#: Depths modelled within this share of NVIDIA's own step at no per-chunk cost are a tie: NVIDIA's
#: choice between them says nothing of the chunks' cost (a run whose step the host floor sets at
#: every depth, as Megatron's MoE rows: ``moe_block_overhead_seconds``).
TIE = 1e-3


def step_seconds(row: dict, tmp: str, engine: str) -> float | str:
    """The row's step priced by the command line, or why it is no alternative: nothing fits the
    device (exit 4) or the engine does not run it (exit 2, the refusal's line)."""
    argv = argv_of(row, config_path(row, tmp), engine) + ["--json"]
    status, out, err = run_pase(argv)
    if status == 4:
        return "does not fit the device"
    if status == 2:
        return err.strip().split("--recipe: ")[-1].split(" (see pase")[0]
    if status != 0:
        raise SystemExit(f"chunk_cost.py: pase {' '.join(argv)} failed: {err.strip()}")
    return json.loads(out)["training"]["step_seconds"]


def with_depth(recipe: str, vpp: int) -> str:
    """``recipe`` with its schedule words replaced by ``vpp`` chunks (1: plain 1F1B)."""
    words = [w for w in recipe.split(",") if not w.startswith(("schedule=", "vpp="))]
    return ",".join(words + (["schedule=1f1b"] if vpp == 1 else ["schedule=interleaved", f"vpp={vpp}"]))


def depth_line(row: dict, tmp: str, vpp: int) -> tuple | str:
    """``(intercept, slope)`` of the step against the per-chunk cost at ``vpp`` chunks, or why it
    has none."""
    base = dict(row, recipe=with_depth(row["recipe"], vpp))
    steps = [step_seconds(base, tmp, f"{row['engine']},chunk_overhead_seconds={c!r}") for c in PROBES + (CHECK,)]
    for s in steps:
        if isinstance(s, str):
            return s
    slope = (steps[1] - steps[0]) / (PROBES[1] - PROBES[0])
    line = steps[0] + slope * (CHECK - PROBES[0])
    if abs(line - steps[2]) > 1e-6 * steps[2]:
        raise SystemExit(f"chunk_cost.py: {row['name']} at vpp {vpp}: the step is not linear in the per-chunk cost")
    return steps[0], slope


def bracket(row: dict, tmp: str) -> dict:
    """Every other depth of ``row``'s pipeline, its line and the bound it puts on the cost."""
    pub = row["published"]
    with open(os.path.join(ROOT, row["config"])) as fh:
        cfg = json.load(fh)
    blocks = cfg.get("num_hidden_layers") or cfg["n_layer"]
    per_stage = blocks // pub["pp"]
    own = depth_line(row, tmp, pub["vp"])
    if isinstance(own, str):
        raise SystemExit(f"chunk_cost.py: {row['name']}: NVIDIA's own depth is not priced: {own}")
    out = dict(name=row["name"], vp=pub["vp"], pp=pub["pp"], blocks=blocks, own=own, others=[])
    for v in (d for d in range(1, per_stage + 1) if per_stage % d == 0 and d != pub["vp"]):
        line = depth_line(row, tmp, v)
        entry = dict(vpp=v, line=line, bound=None, kind=None, note="")
        if isinstance(line, str):
            entry.update(line=None, note=line)
        else:
            # own wins where a0 + s0 c <= a + s c, i.e. (s0 - s) c <= a - a0.
            gap, ds = line[0] - own[0], own[1] - line[1]
            if abs(gap) < TIE * own[0]:
                entry["note"] = (f"modelled within {TIE:.1%} of NVIDIA's depth at no per-chunk cost: a tie, "
                                 "no bound")
            elif ds < 0:  # a deeper pipeline: c >= -gap / -ds
                c = gap / ds
                entry.update(kind="lower", bound=max(c, 0.0))
            elif ds > 0:
                c = gap / ds
                entry.update(kind="upper", bound=c)
                if c < 0:
                    entry["note"] = "this depth is modelled faster at any per-chunk cost: not the chunks' cost"
            else:
                entry["note"] = "the same slope"
        out["others"].append(entry)
    return out


def main() -> int:
    started = time.time()
    rows = [dict(r, recipe=nemo_recipe(r["published"])) for r in nemo_rows(published_dir())
            if (r["published"].get("vp") or 1) > 1]
    with tempfile.TemporaryDirectory() as tmp:
        found = [bracket(r, tmp) for r in rows]
    lows = [e["bound"] for f in found for e in f["others"] if e["kind"] == "lower"]
    highs = [e["bound"] for f in found for e in f["others"] if e["kind"] == "upper" and e["bound"] >= 0]
    low = max(lows) if lows else 0.0
    stated = math.ceil(low / ROUND_TO - 1e-9) * ROUND_TO
    high = min(highs) if highs else math.inf
    lines = ["# The per-chunk cost of interleaving, bracketed by NVIDIA's tuned depths", "",
             "Written by `python3 benchmarks/chunk_cost.py`: every visible NeMo / Megatron-Bridge row that "
             "interleaves, priced by the command line as `benchmarks/nemo.py` prices it, at every other depth "
             "its pipeline allows, with `--engine megatron,chunk_overhead_seconds=C`. Each depth's step is a "
             "line in C; NVIDIA's depth beating a deeper one bounds C from below, a shallower one from above.",
             "", "| row | NVIDIA's vp | other vp | step at C=0 (s) | s per s of C | NVIDIA's vp wins for | note |",
             "| :--- | ---: | ---: | ---: | ---: | :--- | :--- |"]
    for f in found:
        lines.append(f"| {f['name']} | {f['vp']} | (own) | {f['own'][0]:.4f} | {f['own'][1]:,.0f} | | |")
        for e in f["others"]:
            if e["line"] is None:
                lines.append(f"| | | {e['vpp']} | - | - | | {e['note']} |")
                continue
            cond = ("C >= %.0f us" % (e["bound"] * 1e6) if e["kind"] == "lower" else
                    "C <= %.0f us" % (e["bound"] * 1e6) if e["kind"] == "upper" and e["bound"] >= 0 else "no C")
            lines.append(f"| | | {e['vpp']} | {e['line'][0]:.4f} | {e['line'][1]:,.0f} | {cond} | {e['note']} |")
    lines += ["", f"Largest lower bound: **{low * 1e6:.0f} us**; smallest usable upper bound: "
              + ("none" if math.isinf(high) else f"**{high * 1e6:.0f} us**")
              + f". Stated (`megatron.json` `chunk_overhead_seconds`, the lower bound rounded up to "
              f"{ROUND_TO * 1e6:.0f} us): **{stated * 1e6:.0f} us** per chunk and micro-batch, forward and backward.",
              "", f"Took {time.time() - started:.0f} s here."]
    path = os.path.join(ROOT, "benchmarks", "results", "chunk_cost.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
