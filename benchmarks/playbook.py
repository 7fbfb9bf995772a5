"""How the model ranks the layouts of a real layout search: the Ultra-Scale Playbook's nanotron
sweep (issue 41), each visible run priced by the command line with its own layout.

Every run of ``reference/published/ultrascale-playbook/runs.json`` (a Llama-shaped model of
nanotron's sweep on H100 nodes, with its dp, tp, pp, ZeRO stage, micro-batch and accumulation)
is priced exactly as a user would type it::

    pase -g hf:benchmarks/configs/nanotron-1b.json -p GPUS -b SEQUENCES -m 4096 --machine MACHINE
         --engine ENGINE --recipe dp=..,tp=..,pp=..,zero=..,microbatch=..,recompute=none[,schedule=1f1b] --json

and, per (model, GPU count) group of layouts, the model's order is set against the measured one:
pairs of layouts measured at least 25 % apart in tokens/s put in the right order, the measured
share of the group's best of the layout the model ranks first, Spearman's rho; and tokens/s and
reserved-memory errors over the runs. "Healthy" leaves out the runs that measured under a fifth
of their group's best (the sweep's failed or congested runs). A run the model calls "does not
fit", or refuses, counts as ranked last and is listed.

    python3 benchmarks/playbook.py [--machine M] [--engine E] [--out NAME]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pase.cli import main as pase_main  # noqa: E402
from pase.planning.run_ranking import GOOD_PICK, PAIR_RATIO, rank_runs  # noqa: E402

GiB = 2.0 ** 30
#: A run measuring under this share of its group's best is left out of the "healthy" figures.
#: (Pairs count where two runs measured PAIR_RATIO apart; a first pick is good at GOOD_PICK of
#: the best: pase.planning.run_ranking, as ``pase calibrate --from-runs`` counts them.)
HEALTHY_SHARE = 0.2
CONFIGS = {"1B": "nanotron-1b.json", "3B": "nanotron-3b.json", "8B": "nanotron-8b.json",
           "80B": "nanotron-80b.json", "469B": "nanotron-469b.json"}


def playbook_dir() -> str:
    """``reference/published/ultrascale-playbook`` of the shared folder beside the checkout, or
    under ``$PASE_PUBLISHED``."""
    base = os.environ.get("PASE_PUBLISHED") or os.path.join(os.path.dirname(ROOT), "shared", "reference", "published")
    return os.path.join(base, "ultrascale-playbook")


def load_runs(folder: str | None = None) -> list:
    with open(os.path.join(folder or playbook_dir(), "runs.json"), encoding="utf-8") as f:
        return json.load(f)


def recipe_of(run: dict) -> str:
    """The run's layout as a ``--recipe``: its degrees, ZeRO stage, micro-batch, no recomputation,
    1F1B where it has a pipeline."""
    text = (f"dp={run['dp']},tp={run['tp']},pp={run['pp']},zero={run['zero_stage']},"
            f"microbatch={run['micro_batch_size']},recompute=none")
    return text + (",schedule=1f1b" if run["pp"] > 1 else "")


def argv_of(run: dict, machine: str, engine: str | None) -> list:
    config = os.path.join("benchmarks", "configs", CONFIGS[run["model"]["label_in_source"]])
    argv = ["-g", f"hf:{config}", "-p", str(run["gpus"]), "-b", str(run["global_batch_sequences"]),
            "-m", str(run["model"]["seq_len"]), "--machine", machine, "--recipe", recipe_of(run), "--json"]
    return argv + (["--engine", engine] if engine else [])


def runs_file_rows(runs: list) -> list:
    """The runs in ``pase calibrate --from-runs``'s format: graph, devices, batch, sequence,
    recipe, the measured tokens/s per device and reserved memory."""
    return [{"name": run["id"], "graph": f"hf:benchmarks/configs/{CONFIGS[run['model']['label_in_source']]}",
             "devices": run["gpus"], "batch": run["global_batch_sequences"], "sequence": run["model"]["seq_len"],
             "recipe": recipe_of(run), "tokens_per_second_per_device": run["tokens_per_sec_per_gpu"],
             "peak_memory_gib": run["peak_memory_gib"], "memory": "reserved"} for run in runs]


def profile_with(folder: str, **facts) -> str:
    """A copy of the shipped nanotron profile with ``facts`` (name: value) set, written in
    ``folder``: the engine a fitting script prices with (``--engine FILE``)."""
    with open(os.path.join(ROOT, "pase", "planning", "engines", "nanotron.json"), encoding="utf-8") as f:
        profile = json.load(f)
    for name, value in facts.items():
        profile["facts"][name]["value"] = value
    path = os.path.join(folder, "nanotron-" + "-".join(f"{k}={v:g}" for k, v in sorted(facts.items())) + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(profile, f)
    return path


def price(run: dict, machine: str, engine: str | None) -> dict:
    """The run priced in-process: ``{tokens, step, memory, reserved, fits, tight, refused}``."""
    return price_argv(argv_of(run, machine, engine))


def price_argv(argv: list) -> dict:
    """``pase argv`` (a ``--json`` training command) in-process, as :func:`price` returns it: a
    layout the model calls "does not fit" priced again without the device's cap and marked."""
    status, out, err = _run(argv)
    fits = True
    if status != 0 and "nothing fits" in err:
        # The layout ran: priced without the device's cap, and called "does not fit".
        status, out, err = _run(argv + ["--memory", "100000"])
        fits = False
    if status != 0:
        return {"refused": err.strip().splitlines()[-1] if err.strip() else f"exit {status}"}
    t = json.loads(out)["training"]
    return {"tokens": t["tokens_per_second_per_device"], "step": t["step_seconds"],
            "memory": t["peak_memory_bytes"], "reserved": t.get("peak_memory_reserved_bytes"),
            "fits": fits, "tight": t.get("fit") == "tight", "refused": None}


def _run(argv: list) -> tuple:
    """``(status, stdout, stderr)`` of ``pase argv`` run in-process from the repository root."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        status = pase_main(argv, stdout=out, stderr=err)
    finally:
        os.chdir(old)
    return status, out.getvalue(), err.getvalue()


def group_table(s: dict, rows: list) -> list:
    """The per-(model, GPU count) table of a :func:`summary` ``s`` of ``rows``, as Markdown lines."""
    lines = ["| model | GPUs | layouts | pairs right | healthy pairs right | first pick | its share of the best | rho |",
             "| :--- | ---: | ---: | ---: | ---: | :--- | ---: | ---: |"]
    for (model, gpus), g in s["groups"].items():
        n = sum(1 for r in rows if r["model"] == model and r["gpus"] == gpus)
        lines.append(f"| {model} | {gpus} | {n} | {g['all'][1]}/{g['all'][0]} | {g['healthy'][1]}/{g['healthy'][0]} | "
                     f"{g['pick']} | {_pct(g['pick_share'])} | {_rho(g['rho'])} |")
    return lines


def spearman(xs: list, ys: list) -> float | None:
    if len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    a, b = ranks(xs), ranks(ys)
    ma, mb = statistics.mean(a), statistics.mean(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    den = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return num / den if den else None


def modelled_score(r: dict) -> float:
    """The model's tokens/s, a run it refuses or calls "does not fit" ranked last."""
    return r["model_tokens"] if r.get("model_tokens") and r.get("fits") else -1.0


def group_figures(rows: list) -> dict:
    """Ranking figures of one (model, GPU count) group."""
    best = max(r["measured"] for r in rows)
    healthy = [r for r in rows if r["measured"] >= HEALTHY_SHARE * best]
    out = {}
    for name, subset in (("all", rows), ("healthy", healthy)):
        ranked = rank_runs([0] * len(subset), [r["measured"] for r in subset], [modelled_score(r) for r in subset])
        out[name] = (ranked.pairs, ranked.right)
    pick = max(rows, key=lambda r: (modelled_score(r), -rows.index(r)))
    out["pick_share"] = pick["measured"] / best
    out["pick"] = pick["recipe"]
    out["rho"] = spearman([r["measured"] for r in rows], [modelled_score(r) for r in rows])
    return out


def evaluate(runs: list, machine: str, engine: str | None, log=print) -> list:
    rows = []
    for run in runs:
        got = price(run, machine, engine)
        rows.append({"id": run["id"], "model": run["model"]["label_in_source"], "gpus": run["gpus"],
                     "recipe": recipe_of(run), "measured": run["tokens_per_sec_per_gpu"],
                     "measured_gib": run["peak_memory_gib"], "model_tokens": got.get("tokens"),
                     "model_gib": None if got.get("memory") is None else got["memory"] / GiB,
                     "model_reserved_gib": None if got.get("reserved") is None else got["reserved"] / GiB,
                     "fits": got.get("fits", False), "refused": got.get("refused"),
                     "argv": argv_of(run, machine, engine)})
    return rows


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _rho(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _err(model, measured) -> str:
    return "-" if model is None else f"{100 * (model / measured - 1):+.0f} %"


def summary(rows: list) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["gpus"]), []).append(r)
    per = {k: group_figures(v) for k, v in sorted(groups.items(), key=lambda kv: (float(kv[0][0][:-1]), kv[0][1]))}
    tot = {name: [sum(g[name][0] for g in per.values()), sum(g[name][1] for g in per.values())]
           for name in ("all", "healthy")}
    priced = [r for r in rows if r["model_tokens"]]
    best = {k: max(r["measured"] for r in v) for k, v in groups.items()}
    errs = [abs(r["model_tokens"] / r["measured"] - 1) for r in priced]
    herrs = [abs(r["model_tokens"] / r["measured"] - 1) for r in priced
             if r["measured"] >= HEALTHY_SHARE * best[(r["model"], r["gpus"])]]
    mem = [abs((r["model_reserved_gib"] or r["model_gib"]) / r["measured_gib"] - 1) for r in priced if r["model_gib"]]

    def q(v, p):
        if not v:
            return None
        v = sorted(v)
        return v[min(len(v) - 1, int(math.ceil(p * len(v))) - 1)]

    return {
        "groups": per,
        "pairs": tot,
        "good_picks": sum(g["pick_share"] >= GOOD_PICK for g in per.values()),
        "group_count": len(per),
        "refused": [r for r in rows if r["refused"]],
        "does_not_fit": [r for r in rows if not r["refused"] and not r["fits"]],
        "tokens_error": (statistics.median(errs) if errs else None, q(errs, 0.9)),
        "healthy_tokens_error": (statistics.median(herrs) if herrs else None, q(herrs, 0.9)),
        "memory_error": (statistics.median(mem) if mem else None, q(mem, 0.9)),
        "rho_median": statistics.median([g["rho"] for g in per.values() if g["rho"] is not None]),
    }


def report(rows: list, s: dict, machine: str, engine: str | None, seconds: float) -> str:
    a, h = s["pairs"]["all"], s["pairs"]["healthy"]
    lines = [f"# The Ultra-Scale Playbook's layouts ranked: machine {machine}, engine {engine or '(default)'}", "",
             f"{len(rows)} visible runs in {s['group_count']} (model, GPU count) groups, priced in {seconds:.0f} s.", "",
             f"- pairs measured {PAIR_RATIO:g}x apart ordered right: {a[1]} of {a[0]} ({_pct(a[1] / a[0] if a[0] else None)});"
             f" among healthy runs {h[1]} of {h[0]} ({_pct(h[1] / h[0] if h[0] else None)})",
             f"- first pick at least {GOOD_PICK:.0%} of the group's best: {s['good_picks']} of {s['group_count']} groups",
             f"- Spearman's rho, median over groups: {s['rho_median']:.2f}",
             f"- tokens/s error: median {_pct(s['tokens_error'][0])}, p90 {_pct(s['tokens_error'][1])}; healthy runs: "
             f"median {_pct(s['healthy_tokens_error'][0])}, p90 {_pct(s['healthy_tokens_error'][1])}",
             f"- peak memory against the measured reserved memory: median {_pct(s['memory_error'][0])}, "
             f"p90 {_pct(s['memory_error'][1])}",
             f"- refused: {len(s['refused'])}; called \"does not fit\": {len(s['does_not_fit'])}", "",
             *group_table(s, rows)]
    lines += ["", "| run | model | GPUs | layout | measured tok/s | modelled | error | measured GiB | modelled GiB |",
              "| :--- | :--- | ---: | :--- | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: (float(r["model"][:-1]), r["gpus"], -r["measured"])):
        mt = r["model_tokens"]
        gib = r["model_reserved_gib"] or r["model_gib"]
        lines.append(f"| {r['id']} | {r['model']} | {r['gpus']} | {r['recipe']} | {r['measured']:,.0f} | "
                     f"{'-' if mt is None else f'{mt:,.0f}'}{'' if r['fits'] or r['refused'] else ' (does not fit)'} | "
                     f"{_err(mt, r['measured'])} | "
                     f"{r['measured_gib']:.1f} | {'-' if gib is None else f'{gib:.1f}'} |")
    if s["refused"]:
        lines += ["", "Refused:", ""] + [f"- {r['id']} ({r['recipe']}): {r['refused']}" for r in s["refused"]]
    lines += ["", f"Command of each run: `pase {' '.join(rows[0]['argv'])}` with its own graph, devices, batch and recipe."]
    return "\n".join(lines) + "\n"


CLUSTER = os.path.join("examples", "machines", "hf-h100-cluster.json")
RUNS_FILE = os.path.join("examples", "runs", "playbook-visible.json")
FITTED = os.path.join("benchmarks", "results", "hf-h100-cluster-fitted.json")


def _from_calibration(base_rows: list, fit: dict, key: str) -> list:
    """Rows priced by ``pase calibrate --from-runs --json``'s ``key`` step of each run (``after``,
    or ``left_out``: predicted from the constants fitted on the others; an outlier, left out of
    the fit, by the fit itself)."""
    by_name = {r["name"]: r for r in fit["runs"]}
    out = []
    for row in base_rows:
        r = by_name[row["id"]]
        step = r[key] if r.get(key) is not None else r["after"]
        tokens = row["measured"] * r["measured_step"] / step
        out.append({**row, "model_tokens": tokens})
    return out


def study() -> str:
    """The playbook's visible runs ranked four ways: ``h100-sxm`` with the default engine, the
    book's cluster with nanotron, and after ``pase calibrate --from-runs`` on themselves, in
    sample and left out (each run predicted from the constants fitted on the others)."""
    runs = load_runs()
    setups = []
    for machine, engine, label in (("h100-sxm", None, "h100-sxm, default engine (megatron)"),
                                   (CLUSTER, "nanotron", "hf-h100-cluster.json, --engine nanotron")):
        start = time.perf_counter()
        rows = evaluate(runs, machine, engine)
        setups.append((label, rows, time.perf_counter() - start))
    with open(os.path.join(ROOT, RUNS_FILE), "w", encoding="utf-8") as f:
        json.dump(runs_file_rows(runs), f, indent=1)
    start = time.perf_counter()
    status, out, err = _run_calibrate(["--from-runs", RUNS_FILE, "--machine", CLUSTER, "--engine", "nanotron",
                                       "--out", FITTED, "--json"])
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"pase calibrate --from-runs failed: {err.strip()}")
    fit = json.loads(out)
    base = setups[1][1]
    setups.append(("fitted (pase calibrate --from-runs on these runs), in sample", _from_calibration(base, fit, "after"),
                   None))
    setups.append(("fitted, leave-one-out (each run from the constants fitted on the others)",
                   _from_calibration(base, fit, "left_out"), None))
    return _study_text(setups, fit, seconds)


def _run_calibrate(argv: list) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        status = pase_main(["calibrate"] + argv, stdout=out, stderr=err)
    finally:
        os.chdir(old)
    return status, out.getvalue(), err.getvalue()


def _study_text(setups: list, fit: dict, seconds: float) -> str:
    f = fit["fitted"]
    lines = ["# The Ultra-Scale Playbook's visible layouts, ranked", "",
             "Written by `python3 benchmarks/playbook.py --study`: the 125 visible runs of "
             "`reference/published/ultrascale-playbook/runs.json` (nanotron on 8-64 H100s; Llama-shaped 1B, 3B, 8B), each "
             "priced by the command line with its own layout (`--recipe`), in 12 (model, GPU count) groups. Pairs "
             f"count where the two runs measured at least {PAIR_RATIO:g}x apart; healthy runs measured at least "
             f"{HEALTHY_SHARE:.0%} of their group's best.", "",
             "| setup | pairs right | healthy pairs right | first pick >= 90 % of best | rho (median) | tokens/s error median | p90 | healthy median | healthy p90 | refused | does not fit |",
             "| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, rows, _ in setups:
        s = summary(rows)
        a, h = s["pairs"]["all"], s["pairs"]["healthy"]
        lines.append(f"| {label} | {_pct(a[1] / a[0])} ({a[1]}/{a[0]}) | {_pct(h[1] / h[0])} | "
                     f"{s['good_picks']} of {s['group_count']} | {s['rho_median']:.2f} | {_pct(s['tokens_error'][0])} | "
                     f"{_pct(s['tokens_error'][1])} | {_pct(s['healthy_tokens_error'][0])} | "
                     f"{_pct(s['healthy_tokens_error'][1])} | {len(s['refused'])} | {len(s['does_not_fit'])} |")
    outliers = [r["name"] for r in fit["runs"] if r["outlier"]]
    lines += ["", f"`pase calibrate --from-runs {RUNS_FILE} --machine {CLUSTER} --engine nanotron --out {FITTED}` "
              f"took {seconds:.1f} s here; it fitted on {len(fit['runs']) - len(outliers)} runs and left "
              f"{len(outliers)} out as outliers ({', '.join(outliers)}):", "",
              f"- compute_efficiency {f['compute_efficiency']:.3f}",
              f"- collective_scale: intra_node {f['collective_scale']['intra_node']:.3f}, inter_node "
              f"{f['collective_scale']['inter_node']:.3f}",
              f"- block_overhead_seconds {1e3 * f['block_overhead_seconds']:.2f} ms, pipeline_tp_wait_seconds "
              f"{1e3 * f['pipeline_tp_wait_seconds']:.2f} ms, tp_node_wait_seconds "
              f"{1e3 * f.get('tp_node_wait_seconds', 0.0):.2f} ms",
              f"- leave-one-out step error over the runs fitted on: median {_pct(f['leave_one_out']['median'])}, p90 "
              f"{_pct(f['leave_one_out']['p90'])}", ""]
    label, rows, _ = setups[-1]
    s = summary(rows)
    lines += [f"Per group, {label}:", "", *group_table(s, rows)]
    lines += ["", "| run | model | GPUs | layout | measured tok/s | " + " | ".join(
        ["h100-sxm", "cluster + nanotron", "fitted", "left out"]) + " |", "| :--- | :--- | ---: | :--- | ---: | ---: | ---: | ---: | ---: |"]
    columns = [rows_ for _, rows_, _ in setups]
    for i, r in enumerate(setups[0][1]):
        cells = []
        for rows_ in columns:
            x = rows_[i]
            cells.append("refused" if x.get("refused") and x["model_tokens"] is None else _err(x["model_tokens"], x["measured"]))
        lines.append(f"| {r['id']} | {r['model']} | {r['gpus']} | {r['recipe']} | {r['measured']:,.0f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="h100-sxm")
    parser.add_argument("--engine", default=None)
    parser.add_argument("--out", default=None, help="write benchmarks/results/OUT.md and OUT.json")
    parser.add_argument("--write-runs", metavar="FILE.json",
                        help="write the visible runs as a pase calibrate --from-runs file and stop")
    parser.add_argument("--study", action="store_true",
                        help="rank the runs four ways (before and after --from-runs) into benchmarks/results/playbook.md")
    args = parser.parse_args(argv)
    if args.study:
        text = study()
        with open(os.path.join(ROOT, "benchmarks", "results", "playbook.md"), "w", encoding="utf-8") as f:
            f.write(text)
        print(text)
        return 0
    if args.write_runs:
        with open(args.write_runs, "w", encoding="utf-8") as f:
            json.dump(runs_file_rows(load_runs()), f, indent=1)
        return 0
    start = time.perf_counter()
    rows = evaluate(load_runs(), args.machine, args.engine)
    s = summary(rows)
    text = report(rows, s, args.machine, args.engine, time.perf_counter() - start)
    print(text)
    if args.out:
        base = os.path.join(ROOT, "benchmarks", "results", args.out)
        with open(base + ".md", "w", encoding="utf-8") as f:
            f.write(text)
        with open(base + ".json", "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
