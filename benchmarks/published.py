"""Modelled step time and memory next to every visible published run (issues 21, 30).

Each published run (``reference/published/*.json``: Megatron-Core, torchtitan, llm-foundry's
MPT on H100 in BF16 and FP8, NVIDIA NeMo / Megatron-Bridge in FP8 on H100 and B200) is priced by the command line exactly as a user would type it, with the
CLI's defaults and nothing else: ``-g hf:CONFIG -p GPUS -b BATCH -m SEQUENCE --machine MACHINE
--engine ENGINE --recipe PUBLISHED --json``. The command of every row is printed in the results.

- Megatron-Core: ``examples/hf/megatron-gpt-*.json`` on ``h100-sxm``, ``--engine megatron``,
  recipe ``dp,tp,pp,zero=1,recompute=none`` (+ ``tp_overlap=true`` where ``tp > 1``: published
  "--tp-comm-overlap"); micro-batch and pipeline schedule not published: searched.
- torchtitan: ``examples/hf/llama-3.1-8b.json`` on ``examples/machines/h100-96gb-500w.json``,
  ``--engine torchtitan``, ``dp=8,zero=3,recompute=op,microbatch=2``.
- llm-foundry (MPT, FSDP): ``benchmarks/configs/mpt-*.json`` (GPT-2-style configs of MPT's
  shapes until ``model_type: mpt`` is read: ALiBi not modelled; ``n_positions`` set to the row's
  sequence) on ``h100-sxm``, ``--engine fsdp``, ``dp=GPUS,tp=1,zero=3`` (FULL_SHARD),
  ``recompute=full`` where activation checkpointing is on, ``microbatch`` as published; its FP8
  rows (``amp_fp8``) the same plus ``precision=fp8,scaling=delayed``.
- NeMo / Megatron-Bridge: as ``benchmarks/nemo.py`` prices them (its configs and the published
  TP/PP/CP/VP/EP/MBS/GBS with ``precision=fp8``), ``--engine megatron`` on ``h100-sxm`` or ``b200``.

Errors are signed, model / published - 1, on tokens per second per GPU (negative: the model is
slower) and on memory where published. Per source: median and worst absolute error; the
trends: tokens/s per GPU against the sequence (MPT-1B on 8 GPUs, 512 .. 32768) and against the
device count (MPT-7B, 8 .. 512), as the ratio of the last to the first point, published and
modelled. ``--rows`` also writes ``benchmarks/results/published_rows.json`` (every row's
modelled and published figures), which ``benchmarks/fit_constants.py`` and the band read.

Run from the repository root: ``python3 benchmarks/published.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import nemo_runs  # noqa: E402
from pase.cli import main as pase_main  # noqa: E402
from pase.planning.engine import load_engine  # noqa: E402

GiB = 2.0 ** 30
#: Dense BF16 peak of an H100 SXM (NVIDIA datasheet); MFU is counted against it for every row.
SPEC_PEAK = 989e12
TITAN_MACHINE = os.path.join("examples", "machines", "h100-96gb-500w.json")


#: The torchtitan hardware's table, derived from the shipped H100 SXM one (nothing measured on
#: the 500 W part): GEMM times scaled by the clock ratio 1830/1640 (NVIDIA's dense peaks assume
#: 1830 MHz at 700 W on the SXM, 1545 MHz at 400 W on the 132-SM NVL; 500 W interpolated
#: linearly: 1640 MHz), memory-bound times by the bandwidth ratio 3350/2400 (HBM3 against HBM2e).
TITAN_TABLE = os.path.join(ROOT, "examples", "machines", "h100-96gb-500w-derived.json")
CLOCK_RATIO = 1830.0 / 1640.0
BANDWIDTH_RATIO = 3350.0 / 2400.0


def derive_titan_table(path: str = TITAN_TABLE) -> None:
    """Write the derived table of ``examples/machines/h100-96gb-500w.json`` (``--derive-table``)."""
    with open(os.path.join(ROOT, "pase", "machines", "data", "h100-sxm-measured.json")) as f:
        t = json.load(f)
    t["device"] = "H100 96 GB HBM2e, 500 W (derived from the H100 80GB HBM3 table, not measured)"
    t["software"] = (f"derived by benchmarks/published.py: GEMM seconds x {CLOCK_RATIO:.4f} (clock 1830 -> 1640 MHz), "
                     f"memory-bound seconds x {BANDWIDTH_RATIO:.4f} (3350 -> 2400 GB/s); source: " + t.get("software", ""))
    t["gemm"] = [r[:-1] + [float(f"{r[-1] * CLOCK_RATIO:.4g}")] for r in t["gemm"]]
    t["memory_bound"] = [r[:-1] + [float(f"{r[-1] * BANDWIDTH_RATIO:.4g}")] for r in t["memory_bound"]]
    with open(path, "w") as f:
        json.dump(t, f, separators=(",", ":"))


def published_dir() -> str:
    """``reference/published`` of the shared folder beside the checkout (``../shared``), or
    ``$PASE_PUBLISHED``."""
    env = os.environ.get("PASE_PUBLISHED")
    candidates = ([env] if env else []) + [os.path.join(ROOT, "..", "shared", "reference", "published"),
                                           os.path.join(ROOT, "..", "..", "shared", "reference", "published")]
    for c in candidates:
        if c and os.path.isdir(c):
            return os.path.normpath(c)
    raise SystemExit("cannot find reference/published (set PASE_PUBLISHED)")


def megatron_flops(r: dict) -> float:
    """Megatron's count: ``72 B s L h^2 (1 + s/(6h) + V/(12 L h))`` per step."""
    B, s, L, h, V = r["batch"], r["seq"], r["layers"], r["hidden"], r["vocab"]
    return 72.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * L * h))


def load_rows(folder: str) -> list:
    """Every visible H100 BF16 row as ``{name, source, argv pieces, published figures}``."""
    rows = []
    with open(os.path.join(folder, "megatron-core-h100.json")) as f:
        meg = json.load(f)
    for r in meg["rows"]:
        r = dict(r, seq=meg["seq"], vocab=meg["vocab"])
        recipe = f"dp={r['dp']},tp={r['tp']},pp={r['pp']},zero=1,recompute=none"
        if r["tp"] > 1:
            recipe += ",tp_overlap=true"
        step = megatron_flops(r) / (r["tflops_per_gpu"] * 1e12 * r["gpus"])
        rows.append(dict(name=f"Megatron {r['size']}", source="megatron", engine="megatron", machine="h100-sxm",
                         config=os.path.join("examples", "hf", f"megatron-gpt-{r['size'].lower()}.json"),
                         gpus=r["gpus"], batch=r["batch"], seq=r["seq"], recipe=recipe,
                         tokens=r["batch"] * r["seq"] / step / r["gpus"], memory=None))
    with open(os.path.join(folder, "torchtitan-h100.json")) as f:
        titan = json.load(f)
    for r in titan["rows"]:
        if r["model"] != "llama3.1-8b" or r.get("compile"):
            continue
        rows.append(dict(name="torchtitan Llama 3.1 8B", source="torchtitan", engine="torchtitan",
                         machine=TITAN_MACHINE, config=os.path.join("examples", "hf", "llama-3.1-8b.json"),
                         gpus=r["gpus"], batch=r["global_batch"], seq=titan["seq"],
                         recipe=f"dp={r['fsdp']},tp=1,pp=1,zero=3,recompute=op,microbatch={r['local_batch']}",
                         tokens=float(r["tokens_per_s_per_gpu"]), memory=r["memory_gib"] * GiB))
    with open(os.path.join(folder, "llm-foundry-mpt-h100.json")) as f:
        foundry = json.load(f)
    for r in foundry["rows"]:
        if not r["gpu"].startswith("h100") or r["precision"] != "amp_bf16":
            continue  # A100 rows: no A100 machine shipped; FP8 rows: the hardware issue's
        zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[r["sharding"]]
        recipe = (f"dp={r['gpus']},tp=1,pp=1,zero={zero},recompute={'full' if r['activation_checkpointing'] else 'none'}"
                  f",microbatch={r['micro_batch']}")
        rows.append(dict(name=f"llm-foundry {r['model'].upper()} {r['gpus']} GPUs seq {r['seq']}", source="llm-foundry",
                         engine="fsdp", machine="h100-sxm", config=os.path.join("benchmarks", "configs", f"{r['model']}.json"),
                         positions=r["seq"], gpus=r["gpus"], batch=r["global_batch"], seq=r["seq"], recipe=recipe,
                         tokens=float(r["tokens_per_s_per_gpu"]), memory=None, model=r["model"]))
    rows += nemo_rows(folder) + foundry_fp8_rows(folder)
    return rows


def nemo_rows(folder: str) -> list:
    """Every visible NeMo / Megatron-Bridge row (FP8, H100 and B200) as ``benchmarks/nemo.py``
    prices it: its published layout (``nemo_runs.nemo_recipe``), ``--engine megatron`` (with
    ``adam=apex`` for NeMo 1.x, ``nemo_runs.nemo_engine``), the search
    choosing recomputation and the rest."""
    return [dict(name=f"NeMo {r['published']['model']} {r['system_name']} {r['gpus']} GPUs FP8", source="nemo",
                 engine=r["engine"], machine=r["machine"], config=r["config"], gpus=r["gpus"], batch=r["batch"],
                 seq=r["seq"], recipe=nemo_runs.nemo_recipe(r["published"]),
                 tokens=float(r["published"]["tokens_per_s_per_gpu"]), memory=None)
            for r in nemo_runs.nemo_rows(folder)]


def foundry_fp8_rows(folder: str) -> list:
    """llm-foundry's visible FP8 rows (``amp_fp8`` on H100), priced as the BF16 ones plus
    ``precision=fp8,scaling=delayed`` (Transformer Engine's default recipe under Composer)."""
    with open(os.path.join(folder, "llm-foundry-mpt-h100.json")) as f:
        foundry = json.load(f)
    rows = []
    for r in foundry["rows"]:
        if not r["gpu"].startswith("h100") or r["precision"] != "amp_fp8":
            continue
        zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[r["sharding"]]
        recipe = (f"dp={r['gpus']},tp=1,pp=1,zero={zero},recompute={'full' if r['activation_checkpointing'] else 'none'}"
                  f",microbatch={r['micro_batch']},precision=fp8,scaling=delayed")
        rows.append(dict(name=f"llm-foundry {r['model'].upper()} {r['gpus']} GPUs seq {r['seq']} FP8",
                         source="llm-foundry", engine="fsdp", machine="h100-sxm",
                         config=os.path.join("benchmarks", "configs", f"{r['model']}.json"), positions=r["seq"],
                         gpus=r["gpus"], batch=r["global_batch"], seq=r["seq"], recipe=recipe,
                         tokens=float(r["tokens_per_s_per_gpu"]), memory=None, model=r["model"] + "-fp8"))
    return rows


def config_path(row: dict, tmp: str) -> str:
    """The row's config; MPT rows get ``n_positions`` = the row's sequence."""
    if "positions" not in row:
        return row["config"]
    with open(os.path.join(ROOT, row["config"])) as f:
        cfg = json.load(f)
    cfg["n_positions"] = cfg["n_ctx"] = row["positions"]
    path = os.path.join(tmp, f"{os.path.basename(row['config'])[:-5]}-{row['positions']}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def argv_of(row: dict, config: str, engine: str | None = None) -> list:
    """The command line of a row: its graph (and ``flags``, e.g. ``--mtp``), devices, batch,
    sequence, machine, engine, then its ``--recipe`` last."""
    return ["-g", f"hf:{config}", *row.get("flags", ()), "-p", str(row["gpus"]), "-b", str(row["batch"]), "-m",
            str(row["seq"]), "--machine", row["machine"], "--engine", engine or row["engine"], "--recipe", row["recipe"]]


def run_pase(argv: list) -> tuple:
    """``(status, stdout, stderr)`` of the command line run in-process from the repository root."""
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        status = pase_main(argv, stdout=out, stderr=err)
    finally:
        os.chdir(cwd)
    return status, out.getvalue(), err.getvalue()


def price(row: dict, tmp: str, engine: str | None = None) -> dict:
    """The row priced by the command line (in-process), ``--json`` read back."""
    config = config_path(row, tmp)
    argv = argv_of(row, config, engine) + ["--json"]
    status, out, err = run_pase(argv)
    if status not in (0, 4):
        raise SystemExit(f"{row['name']}: pase {' '.join(argv)} failed: {err.strip()}")
    fits = status == 0
    if status == 4:  # nothing fits: price it without the cap, say so
        status, out, err = run_pase(argv + ["--memory", "100000"])
    data = json.loads(out)
    t = data["training"]
    # The figure the engine's logs print (its profile's memory_reported: torchtitan's max_reserved).
    logged = {"allocated": "peak_memory_allocated_bytes", "reserved": "peak_memory_reserved_bytes"}.get(
        load_engine(engine)["memory_reported"] if engine else None, "peak_memory_bytes")
    return dict(step=t["step_seconds"], tokens=t["tokens_per_second_per_device"], mfu=t["mfu"],
                memory=t[logged], recipe=t["recipe"], fits=fits, time=t["time"],
                mem=t["memory"], band=t.get("step_seconds_band"), memory_band=t.get("peak_memory_bytes_band"),
                argv=argv_of(row, row["config"] if "positions" not in row else
                             f"{row['config']} (n_positions={row['positions']})", engine)[:-2]
                + ["--recipe", row["recipe"]])


def evaluate(rows: list, tmp: str, log=print) -> list:
    out = []
    for row in rows:
        m = price(row, tmp)
        err_t = m["tokens"] / row["tokens"] - 1.0
        err_m = None if row["memory"] is None else m["memory"] / row["memory"] - 1.0
        log(f"  {row['name']:<42} tokens/s/GPU pub {row['tokens']:>9,.0f} model {m['tokens']:>9,.0f} "
            f"({err_t:+.1%})" + ("" if err_m is None else f"; memory {err_m:+.1%}"))
        out.append(dict(row=row, model=m, err_tokens=err_t, err_memory=err_m))
    return out


def summary(results: list) -> dict:
    """Per source: count, median and worst absolute tokens/s error, memory errors."""
    by: dict = {}
    for r in results:
        by.setdefault(r["row"]["source"], []).append(r)
    out = {}
    for source, rs in by.items():
        e = [abs(r["err_tokens"]) for r in rs]
        mem = [abs(r["err_memory"]) for r in rs if r["err_memory"] is not None]
        out[source] = dict(rows=len(rs), median=statistics.median(e), worst=max(e),
                           memory_worst=max(mem) if mem else None)
    return out


def trends(results: list) -> list:
    """``(what, published ratio, modelled ratio)`` of the sequence sweep and the device count."""
    def pick(model, gpus=None, seq=None):
        return [r for r in results if r["row"].get("model") == model and (gpus is None or r["row"]["gpus"] == gpus)
                and (seq is None or r["row"]["seq"] == seq)]
    out = []
    a, b = pick("mpt-1b", 8, 512), pick("mpt-1b", 8, 32768)
    if a and b:
        out.append(("MPT-1B on 8 GPUs, tokens/s per GPU at sequence 32768 / 512", b[0]["row"]["tokens"] / a[0]["row"]["tokens"],
                    b[0]["model"]["tokens"] / a[0]["model"]["tokens"]))
    a, b = pick("mpt-7b", 8, 2048), pick("mpt-7b", 512, 2048)
    if a and b:
        out.append(("MPT-7B, tokens/s per GPU on 512 GPUs / on 8", b[0]["row"]["tokens"] / a[0]["row"]["tokens"],
                    b[0]["model"]["tokens"] / a[0]["model"]["tokens"]))
    return out


#: Rows an engine needs for a band of its own; with fewer, the band is the spread over every
#: visible row (docs/calibration.md).
OWN_BAND_ROWS = 5


def band_ratios(results: list) -> dict:
    """Per engine, ``{"step": [low, high], "memory": [low, high], "rows": n}``: published over
    modelled step time (= modelled over published tokens/s) and peak memory, the spread over the
    engine's visible rows (all visible rows where it has fewer than :data:`OWN_BAND_ROWS`); the
    memory band from every row that publishes memory."""
    def spread(values):
        return [math.floor(min(values) * 1e4) / 1e4, math.ceil(max(values) * 1e4) / 1e4] if values else None
    every = [r["model"]["tokens"] / r["row"]["tokens"] for r in results]
    memory = [r["row"]["memory"] / r["model"]["memory"] for r in results if r["row"]["memory"] is not None]
    out = {}
    for name in ("megatron", "torchtitan", "fsdp", "deepspeed"):
        own = [r["model"]["tokens"] / r["row"]["tokens"] for r in results if r["row"]["engine"] == name]
        rows = own if len(own) >= OWN_BAND_ROWS else every
        band = {"step": spread(rows), "rows": len(rows),
                "source": (f"benchmarks/published.py --write-bands: published / modelled over "
                           f"{'its' if rows is own else 'all'} {len(rows)} visible published rows"
                           + (f", memory over the {len(memory)} that publish memory" if memory else ""))}
        if memory:
            band["memory"] = spread(memory)
        out[name] = band
    return out


def write_bands(results: list) -> None:
    """Write each shipped engine profile's ``band`` section (pase/planning/engines/*.json)."""
    folder = os.path.join(ROOT, "pase", "planning", "engines")
    for name, band in band_ratios(results).items():
        path = os.path.join(folder, name + ".json")
        with open(path) as f:
            text = f.read()
        # Only the band section is rewritten (the last member of the profile, as written
        # before); the rest of the file keeps its layout.
        start = text.rfind('\n "band": {')
        body = json.dumps(band, indent=1).replace("\n", "\n ")
        if start < 0 or json.loads(text).get("band") is None:
            data = json.loads(text)
            data["band"] = band
            text = json.dumps(data, indent=1) + "\n"
        else:
            text = text[:start] + '\n "band": ' + body + "\n}\n"
        json.loads(text)  # still a profile
        with open(path, "w") as f:
            f.write(text)


def breakdown(m: dict) -> str:
    total = m["step"]
    parts = [f"{k} {v / total:.0%}" for k, v in m["time"].items() if v > 0.005 * total]
    return "; ".join(parts)


def write(results: list, out_dir: str, seconds: float) -> None:
    s = summary(results)
    md = ["# Modelled against published training runs (H100 BF16 and FP8, B200 FP8)", "",
          "Written by `benchmarks/published.py` (issue 30). Every row is priced by the command line with its defaults "
          "and nothing else: `pase -g hf:CONFIG -p GPUS -b BATCH -m SEQUENCE --machine MACHINE --engine ENGINE "
          "--recipe PUBLISHED` (the columns give each). Published figures as published; errors signed, model / "
          "published - 1 on tokens per second per GPU (negative: the model is slower) and on peak memory where "
          "published. MFU against the machine's BF16 peak. NeMo rows as `benchmarks/nemo.py` prices them. MPT rows are priced through GPT-2-style configs of MPT's shapes "
          "(`benchmarks/configs/`, ALiBi not modelled) until `model_type: mpt` is read.", "",
          "## Per source", "",
          "| source | rows | median abs error | worst abs error | memory worst |", "|---|---|---|---|---|"]
    for source, h in s.items():
        md.append(f"| {source} | {h['rows']} | {h['median']:.1%} | {h['worst']:.1%} | "
                  f"{'' if h['memory_worst'] is None else format(h['memory_worst'], '.1%')} |")
    md += ["", "## Trends", "", "| trend | published | modelled | modelled / published |", "|---|---|---|---|"]
    for what, p, m in trends(results):
        md.append(f"| {what} | {p:.3f} | {m:.3f} | {m / p - 1:+.1%} |")
    md += ["", "## Rows", "",
           "| run | engine | recipe | tok/s/GPU pub | tok/s/GPU model | err | MFU model | memory GiB pub | memory GiB model "
           "| err | band (step s) | where the step goes |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        row, m = r["row"], r["model"]
        band = "" if not m["band"] else f"{m['band'][0]:.3g}-{m['band'][1]:.3g} ({m['step']:.3g})"
        md.append(
            f"| {row['name']} | {row['engine']} | `{m['recipe']}`{'' if m['fits'] else ' (does not fit)'} "
            f"| {row['tokens']:,.0f} | {m['tokens']:,.0f} | {r['err_tokens']:+.1%} | {m['mfu']:.1%} "
            f"| {'' if row['memory'] is None else format(row['memory'] / GiB, '.1f')} | {m['memory'] / GiB:.1f} "
            f"| {'' if r['err_memory'] is None else format(r['err_memory'], '+.1%')} | {band} | {breakdown(m)} |")
    md += ["", "Commands (add `--json` for the figures above):", ""]
    md += [f"- `pase {' '.join(r['model']['argv'])}`" for r in results]
    md += ["", f"Run time {seconds:.0f} s."]
    with open(os.path.join(out_dir, "published.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    with open(os.path.join(out_dir, "published.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "source", "engine", "gpus", "batch", "sequence", "recipe", "tokens_pub", "tokens_model",
                    "err_tokens", "memory_gib_pub", "memory_gib_model", "err_memory", "step_s_model"])
        for r in results:
            row, m = r["row"], r["model"]
            w.writerow([row["name"], row["source"], row["engine"], row["gpus"], row["batch"], row["seq"], m["recipe"],
                        f"{row['tokens']:.1f}", f"{m['tokens']:.1f}", f"{r['err_tokens']:.4f}",
                        "" if row["memory"] is None else f"{row['memory'] / GiB:.2f}", f"{m['memory'] / GiB:.2f}",
                        "" if r["err_memory"] is None else f"{r['err_memory']:.4f}", f"{m['step']:.5f}"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--only", default=None, help="only rows whose source is this")
    parser.add_argument("--derive-table", action="store_true",
                        help="rewrite the torchtitan machine's derived table (examples/machines/)")
    parser.add_argument("--write-bands", action="store_true",
                        help="write each engine profile's band (published / modelled spread) from these rows")
    args = parser.parse_args(argv)
    start = time.time()
    if args.derive_table or not os.path.exists(TITAN_TABLE):
        derive_titan_table()
    rows = load_rows(published_dir())
    if args.only:
        rows = [r for r in rows if r["source"] == args.only]
    with tempfile.TemporaryDirectory() as tmp:
        results = evaluate(rows, tmp)
    for source, h in summary(results).items():
        print(f"{source}: {h['rows']} rows, median |error| {h['median']:.1%}, worst {h['worst']:.1%}"
              + ("" if h["memory_worst"] is None else f", memory worst {h['memory_worst']:.1%}"))
    for what, p, m in trends(results):
        print(f"{what}: published {p:.3f}, modelled {m:.3f} ({m / p - 1:+.1%})")
    if args.write_bands and not args.only:
        write_bands(results)
        print("wrote the band of every engine profile (pase/planning/engines/*.json)")
        from pase.outputs import training as training_output

        training_output._engine_bands.cache_clear()
        with tempfile.TemporaryDirectory() as tmp:  # the rows again, their bands as now written
            results = evaluate(rows, tmp, log=lambda *_: None)
    inside = [r for r in results if r["model"]["band"] and
              r["model"]["band"][0] <= r["row"]["batch"] * r["row"]["seq"] / r["row"]["tokens"] / r["row"]["gpus"]
              <= r["model"]["band"][1]]
    print(f"published step inside the printed band: {len(inside)} of {len(results)} rows")
    if not args.only:
        write(results, args.out, time.time() - start)
        print(f"wrote {args.out}/published.md and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
