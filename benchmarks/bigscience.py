"""How the model ranks a second real layout search, on another GPU generation and engine family:
BigScience's February 2022 topology search for BLOOM (Megatron-DeepSpeed on A100 80GB).

The 20 layouts of a 181B model on 48 nodes of 8 A100 that ran (``examples/runs/bigscience-tr11-search.json``,
from bigscience-workshop/bigscience ``train/tr11-176B-ml/chronicles-prequel.md``, section "GBS
Variations", 2022-02-25) and the three that ran out of memory (:data:`OUT_OF_MEMORY`) are priced
exactly as a user would type them::

    pase -g hf:benchmarks/configs/bigscience-181b.json -p 384 -b GBS -m 2048 --machine MACHINE
         --engine ENGINE --recipe dp=..,tp=..,pp=..,sp=false,zero=1,microbatch=..,recompute=full[,schedule=1f1b] --json

and the model's order of the layouts that ran is set against the measured one (tokens/s per GPU):
pairs measured at least 25 % (and 10 %) apart put in the right order, the measured share of the
best of the layout the model ranks first, Spearman's rho, step errors; and whether each layout
that ran out of memory is called "does not fit" and each that ran is not. Five setups: the
``a100-sxm`` preset with the default engine (megatron), with ``--engine megatron-deepspeed``, the
cluster as BigScience measured its network (``examples/machines/jz-a100-cluster.json``), and
after ``pase calibrate --from-runs`` on the 20 runs from that file and from the shipped preset
alone (each run predicted from the constants fitted on the others).

    python3 benchmarks/bigscience.py     # writes benchmarks/results/bigscience.md
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from playbook import _run, price_argv, spearman  # noqa: E402
from pase.planning.run_ranking import PAIR_RATIO, rank_runs  # noqa: E402

RUNS_FILE = os.path.join("examples", "runs", "bigscience-tr11-search.json")
CLUSTER = os.path.join("examples", "machines", "jz-a100-cluster.json")
ENGINE = "megatron-deepspeed"
#: The layouts of the same search that ran out of memory (chronicles-prequel.md, 2022-02-25:
#: "48 | 181B | 48 | 8 | 1 | 1 | 2016 | OOM" and "32 | 2 | 6 | 2 / 1 | 2048 | OOM"); as
#: ``(dp, tp, pp, micro-batch, GBS)``.
OUT_OF_MEMORY = ((48, 8, 1, 1, 2016), (32, 2, 6, 2, 2048), (32, 2, 6, 1, 2048))
RATIOS = (PAIR_RATIO, 1.10)


def argv_of(run: dict, machine: str, engine: str | None) -> list:
    return ["-g", run["graph"], "-p", str(run["devices"]), "-b", str(run["batch"]), "-m", str(run["sequence"]),
            "--machine", machine, *(["--engine", engine] if engine else []), "--recipe", run["recipe"], "--json"]


def price(run: dict, machine: str, engine: str | None) -> dict:
    """``{tokens, step, memory_gb, fits}`` of the run as the command line prices it
    (``playbook.price_argv``: a layout the model calls "does not fit" priced without the cap)."""
    got = price_argv(argv_of(run, machine, engine))
    if got["refused"] is None:
        got["memory_gb"] = got["memory"] / 1e9
    return {"fits": False, **got}


def oom_run(dp: int, tp: int, pp: int, micro: int, gbs: int) -> dict:
    recipe = f"dp={dp},tp={tp},pp={pp},sp=false,zero=1,microbatch={micro},recompute=full" + (
        ",schedule=1f1b" if pp > 1 else "")
    return {"name": f"OOM dp{dp} tp{tp} pp{pp} mbs{micro}", "graph": "hf:benchmarks/configs/bigscience-181b.json",
            "devices": dp * tp * pp, "batch": gbs, "sequence": 2048, "recipe": recipe}


def measured_tokens(run: dict) -> float:
    return run["batch"] * run["sequence"] / (run["step_seconds"] * run["devices"])


def figures(rows: list) -> dict:
    """Ranking and error figures of the priced rows (``measured``, ``model``: tokens/s per GPU);
    a layout the model calls "does not fit" ranks last."""
    def score(r):
        return r["model"] if r["model"] and r["fits"] else -1.0
    best = max(r["measured"] for r in rows)
    measured, scores = [r["measured"] for r in rows], [score(r) for r in rows]
    out = {}
    for ratio in RATIOS:
        ranked = rank_runs([0] * len(rows), measured, scores, ratio=ratio)
        out[ratio] = (ranked.right, ranked.pairs)
    pick = max(rows, key=lambda r: (score(r), -rows.index(r)))
    errors = sorted(abs(r["model"] / r["measured"] - 1) for r in rows if r["model"])
    out.update(pick=pick, pick_share=pick["measured"] / best, rho=spearman(measured, scores),
               median=statistics.median(errors), p90=errors[min(len(errors) - 1, int(0.9 * len(errors) + 0.999) - 1)],
               no_fit=sum(not r["fits"] for r in rows))
    return out


def loo_rows(runs: list, machine: str, engine: str, ooms: list) -> tuple:
    """Rows predicted left-out by ``pase calibrate --from-runs --json`` on the runs themselves,
    the fit, and how the machine it writes calls the layouts that ran out of memory."""
    out_path = os.path.join(ROOT, "benchmarks", "results", ".bigscience-fitted.json")
    status, out, err = _run(["calibrate", "--from-runs", RUNS_FILE, "--machine", machine, "--engine", engine,
                             "--out", out_path, "--json"])
    if status != 0:
        raise SystemExit(f"calibrate --from-runs failed: {err.strip()}")
    oom_calls = [price(r, out_path, engine) for r in ooms]
    os.remove(out_path)
    fit = json.loads(out)
    by_name = {r["name"]: r for r in fit["runs"]}
    rows = []
    for run in runs:
        r = by_name[run["name"]]
        step = r["left_out"] if r.get("left_out") is not None else r["after"]
        rows.append({"name": run["name"], "recipe": run["recipe"], "batch": run["batch"],
                     "measured": measured_tokens(run), "model": measured_tokens(run) * run["step_seconds"] / step,
                     "fits": True})
    return rows, fit, oom_calls


def short(label: str) -> str:
    """A setup's label without its engine's wording: ``machine [+ engine]``."""
    return label.split(",")[0] + (" + " + label.split("--engine ")[1] if "--engine" in label else "")


def memory_line(runs, result) -> str:
    """The modelled peak of ``result``'s setup against the "Mem" each layout's table publishes
    (in the run's ``notes``), where it does."""
    label, rows, _ = result
    errors = []
    for run, row in zip(runs, rows):
        found = re.search(r"Mem (\d+) GB", run.get("notes", ""))
        if found and row.get("memory_gb"):
            errors.append(row["memory_gb"] / float(found.group(1)) - 1.0)
    if not errors:
        return ""
    return (f"Peak memory per GPU, {short(label)}, against the \"Mem\" the tables publish ({len(errors)} layouts; "
            f"one layout's two repeats read 44 and 38 GB): median {100 * statistics.median(errors):+.0f} %, "
            f"from {100 * min(errors):+.0f} % to {100 * max(errors):+.0f} %.")


def main() -> int:
    with open(os.path.join(ROOT, RUNS_FILE), encoding="utf-8") as f:
        runs = json.load(f)
    ooms = [oom_run(*layout) for layout in OUT_OF_MEMORY]
    setups = (("a100-sxm", None, "a100-sxm preset, default engine (megatron)"),
              ("a100-sxm", ENGINE, f"a100-sxm preset, --engine {ENGINE}"),
              (CLUSTER, ENGINE, f"jz-a100-cluster.json (BigScience's measured all-reduce), --engine {ENGINE}"))
    started = time.perf_counter()
    results = []
    for machine, engine, label in setups:
        rows = []
        for run in runs:
            got = price(run, machine, engine)
            rows.append({"name": run["name"], "recipe": run["recipe"], "batch": run["batch"],
                         "measured": measured_tokens(run), "model": got.get("tokens"), "fits": got["fits"],
                         "memory_gb": got.get("memory_gb")})
        oom_calls = [price(r, machine, engine) for r in ooms]
        results.append((label, rows, oom_calls))
    fitted_on = ((CLUSTER, "jz-a100-cluster.json fitted on the 20 runs (calibrate --from-runs), leave-one-out"),
                 ("a100-sxm", "a100-sxm preset fitted on the 20 runs (calibrate --from-runs), leave-one-out"))
    fits = [(label, *loo_rows(runs, machine, ENGINE, ooms)) for machine, label in fitted_on]
    seconds = time.perf_counter() - started
    lines = ["# BigScience's topology search for BLOOM, ranked (issue 41)", "",
             "Written by `python3 benchmarks/bigscience.py`. The 20 layouts of a 181B model on 48 nodes of 8 A100 80GB "
             "that ran (`examples/runs/bigscience-tr11-search.json`, from bigscience-workshop/bigscience "
             "`train/tr11-176B-ml/chronicles-prequel.md`, section \"GBS Variations\", 2022-02-25) and the three that "
             "ran out of memory, each priced as a user types it: `pase -g hf:benchmarks/configs/bigscience-181b.json "
             "-p 384 -b GBS -m 2048 --machine MACHINE [--engine ENGINE] --recipe LAYOUT --json`. Pairs count where the "
             "two layouts measured at least 1.25x (or 1.10x) apart in tokens/s per GPU.", "",
             "| setup | pairs 1.25x apart right | pairs 1.10x apart right | first pick (share of the best) | rho | "
             "step error median | p90 | ran, called \"does not fit\" | out of memory, called \"does not fit\" |",
             "| :--- | ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: |"]
    for label, rows, calls in results + [(label, rows, calls) for label, rows, _, calls in fits]:
        g = figures(rows)
        a, b = (g[ratio] for ratio in RATIOS)
        oom = f"{sum(not c['fits'] for c in calls)} of {len(calls)}"
        lines.append(f"| {label} | {a[0]} of {a[1]} | {b[0]} of {b[1]} | `{g['pick']['recipe']}` "
                     f"({100 * g['pick_share']:.0f} %) | {g['rho']:.2f} | {100 * g['median']:.0f} % | "
                     f"{100 * g['p90']:.0f} % | {g['no_fit']} of {len(rows)} | {oom} |")
    lines.append("")
    for (machine, _), (_, _, fit, _) in zip(fitted_on, fits):
        f = fit["fitted"]
        lines.append(f"`pase calibrate --from-runs {RUNS_FILE} --machine {machine} --engine {ENGINE}` fitted "
                     f"compute_efficiency {f['compute_efficiency']:.3f}, collective_scale intra_node "
                     f"{f['collective_scale']['intra_node']:.3f} and inter_node {f['collective_scale']['inter_node']:.3f}, "
                     f"block_overhead_seconds {1e3 * f['block_overhead_seconds']:.2f} ms, pipeline_tp_wait_seconds "
                     f"{1e3 * f['pipeline_tp_wait_seconds']:.2f} ms"
                     f"{' (at a bound: ' + ', '.join(fit['at_bounds']) + ')' if fit['at_bounds'] else ''}.")
    lines += ["", "One group of layouts on one cluster separates the network's levels poorly: the two collective "
              "scales trade against each other (every tensor-parallel group is inside a node, every data-parallel one "
              "across nodes), so read them together, not as the links' own efficiencies. The preset's network is "
              "about forty times faster than the one BigScience measured; the fit takes what it can of that "
              "(inter_node at its bound) and the per-block constants the rest, and still orders the layouts: "
              "what a user with a shipped preset and a handful of their own runs gets.", "",
              memory_line(runs, results[-1]), "",
              "| run | layout | GBS | measured tok/s per GPU | " + " | ".join(short(r[0]) for r in results)
              + " | jz-a100-cluster.json fitted, left out | a100-sxm fitted, left out |",
              "| :--- | :--- | ---: | ---: |" + " ---: |" * (len(results) + 2)]
    for i, run in enumerate(runs):
        cells = []
        for _, rows, _ in results:
            r = rows[i]
            cells.append("-" if r["model"] is None else f"{r['model']:,.0f} ({100 * (r['model'] / r['measured'] - 1):+.0f} %)"
                         + ("" if r["fits"] else " does not fit"))
        for _, loo, _, _ in fits:
            cells.append(f"{loo[i]['model']:,.0f} ({100 * (loo[i]['model'] / loo[i]['measured'] - 1):+.0f} %)")
        lines.append(f"| {run['name']} | `{run['recipe']}` | {run['batch']} | {measured_tokens(run):,.0f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Layouts that ran out of memory, as each setup calls them (modelled peak, GB):", ""]
    called = [(short(label), calls) for label, _, calls in results] + [
        (label.split(" (")[0], calls) for label, _, _, calls in fits]
    for k, layout in enumerate(ooms):
        calls = [f"{name}: {'does not fit' if not got[k]['fits'] else 'fits'} "
                 f"({got[k].get('memory_gb', 0):.1f})" for name, got in called]
        lines.append(f"- `{layout['recipe']}`, GBS {layout['batch']}: " + "; ".join(calls))
    lines += ["", f"Priced in {seconds:.0f} s on this machine. Generated by `python3 benchmarks/bigscience.py`."]
    path = os.path.join(ROOT, "benchmarks", "results", "bigscience.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
