"""The h100-sxm machine against the paper machine: the strategy each finds, priced on the H100.

For gpt3-2.7b and gpt3-13b (batch 16) and the Transformer (batch 128) at p = 8..64: the
optimum found on ``h100-sxm`` (under its default 80 GB cap) and the paper machine's optimum
re-priced on ``h100-sxm`` (what ``--evaluate`` does), each split into compute, communication
and edge seconds, data parallelism and the Megatron-style batch x model mesh
(``pase.planning.experts.mesh_tensorflow``) on ``h100-sxm``, per-device memory and search time; then,
for gpt3-13b at p = 64, the configurations each machine picks for one block, and where every
split of one block and of the embedding / head lands: inside a node of 8 or across nodes.
Writes ``benchmarks/results/machine_compare.md``.

    python benchmarks/machine_compare.py
    python benchmarks/machine_compare.py --cases transformer:128 --procs 8,64
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from common import RESULTS, machine_info, machine_lines, markdown_table, parse_list  # puts the checkout on sys.path

import graphs  # noqa: E402
from pase.machines.calibrated import CalibratedMachine  # noqa: E402
from pase.planning.experts import best_mesh, mesh_tensorflow, mesh_tensorflow_meshes  # noqa: E402
from pase.model.layers import Einsum, Norm, Softmax, SoftmaxCrossEntropy  # noqa: E402
from pase.machines.base import Group, layout_strides  # noqa: E402
from pase.machines.registry import load_machine
from pase.planning.planner import evaluate_plan, plan  # noqa: E402

CASES = ("gpt3-2.7b:16", "gpt3-13b:16", "transformer:128")
PROCS = (8, 16, 32, 64)
#: Layers of the placement section besides one block: everything outside the blocks.
OUTSIDE_BLOCKS = ("embedding", "position", "final.norm", "head.logits", "loss")


def split_ms(evaluation) -> tuple:
    """Milliseconds of compute, communication and edges, and the total."""
    compute = float(evaluation.compute.sum()) * 1e3
    comm = float(evaluation.communication.sum()) * 1e3
    edges = float(sum(evaluation.edge_costs.values())) * 1e3
    return compute, comm, edges, compute + comm + edges


def fits(p) -> bool:
    """Whether a plan's per-device memory is within its cap (no cap: fits)."""
    cap = p.memory.cap_bytes
    return cap is None or p.memory.per_device_bytes <= cap


def megatron(network, procs: int, machine) -> dict:
    """The Megatron-style expert on ``machine``: the mesh ``mesh_tensorflow`` picks, and every mesh.

    ``mesh_tensorflow(network, procs, machine)`` takes the fastest valid mesh on the machine
    whether it fits the memory or not; every mesh is also priced (with the machine's cap), so
    the fastest mesh that fits can be named when the chosen one does not.
    """
    chosen = best_mesh(network, procs, machine)
    configs = mesh_tensorflow(network, procs, machine)
    meshes = {}
    for m, n in mesh_tensorflow_meshes(network, procs):
        meshes[(m, n)] = evaluate_plan(network, mesh_tensorflow(network, procs, m=m), procs, machine,
                                       memory_cap=machine.memory_bytes)
    best = meshes[chosen]
    if best.configs != configs:  # pragma: no cover - the two calls must agree
        raise RuntimeError("mesh_tensorflow and best_mesh disagree")
    fitting = [(p.total_cost, -m, (m, n)) for (m, n), p in meshes.items() if fits(p)]
    return {"mesh": chosen, "plan": best, "meshes": meshes,
            "fitting": min(fitting)[2] if fitting else None}


def run_case(name: str, batch: int, procs: int, paper, h100) -> dict:
    network = graphs.build(name, batch)
    t0 = time.perf_counter()
    on_paper = plan(network, procs, paper)
    paper_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    on_h100 = plan(network, procs, h100, memory_cap=h100.memory_bytes)
    h100_seconds = time.perf_counter() - t0
    paper_on_h100 = evaluate_plan(network, on_paper.configs, procs, h100, memory_cap=h100.memory_bytes)
    return {
        "name": name, "batch": batch, "procs": procs, "network": network,
        "h100": on_h100, "paper": on_paper, "paper_on_h100": paper_on_h100,
        "paper_seconds": paper_seconds, "h100_seconds": h100_seconds,
        "megatron": megatron(network, procs, h100),
    }


def _gb(p) -> str:
    return f"{p.memory.per_device_bytes / 1e9:.1f}" + ("" if fits(p) else " (over)")


def summary_row(r: dict) -> list:
    h = split_ms(r["h100"].evaluation)
    p = split_ms(r["paper_on_h100"].evaluation)
    dp = split_ms(r["h100"].data_parallel)[3]
    mt = r["megatron"]["plan"]
    mt_ms = split_ms(mt.evaluation)[3]
    mem = r["h100"].memory
    # A gain over a strategy that does not fit the device is no gain: say so instead.
    gain = f"{p[3] / h[3]:.2f}x" if fits(r["paper_on_h100"]) and fits(r["h100"]) else "-"
    mt_gain = "-"
    fitting = r["megatron"]["fitting"]
    if fits(r["h100"]) and fitting is not None:
        # Against the chosen mesh when it fits, else against the fastest mesh that does.
        fit_ms = split_ms(r["megatron"]["meshes"][fitting].evaluation)[3]
        mt_gain = f"{fit_ms / h[3]:.2f}x" + ("" if fitting == r["megatron"]["mesh"] else f" (vs {fitting[0]}x{fitting[1]})")
    m, n = r["megatron"]["mesh"]
    return [
        r["name"], r["procs"],
        f"{h[3]:.2f}", f"{h[0]:.2f} / {h[1]:.2f} / {h[2]:.2f}",
        f"{p[3]:.2f}", f"{p[0]:.2f} / {p[1]:.2f} / {p[2]:.2f}",
        gain, f"{dp:.2f}", f"{dp / h[3]:.2f}x",
        f"{m}x{n}: {mt_ms:.2f}", mt_gain, _gb(mt),
        f"{mem.per_device_bytes / 1e9:.1f}", _gb(r["paper_on_h100"]),
        mem.status or "-", f"{r['paper_seconds']:.1f}", f"{r['h100_seconds']:.1f}",
    ]


def megatron_rows(r: dict) -> list:
    """Every mesh of the Megatron-style expert for one case: step time split, memory."""
    rows = []
    chosen, fitting = r["megatron"]["mesh"], r["megatron"]["fitting"]
    for (m, n), p in r["megatron"]["meshes"].items():
        c, comm, e, total = split_ms(p.evaluation)
        mark = ", ".join(x for x, on in (("chosen", (m, n) == chosen), ("fastest fitting", (m, n) == fitting)) if on)
        rows.append([r["name"], r["procs"], f"{m} x {n}", f"{total:.2f}", f"{c:.2f} / {comm:.2f} / {e:.2f}",
                     _gb(p), mark or ""])
    return rows


def nearest_mesh(r: dict, key: str) -> str:
    """The Megatron mesh whose configurations agree with a strategy's on the most layers."""
    configs = r[key].configs
    best = None
    for (m, n), p in r["megatron"]["meshes"].items():
        differ = sum(a != b for a, b in zip(configs, p.configs))
        if best is None or differ < best[0]:
            best = (differ, m, n)
    differ, m, n = best
    if differ == len(configs):
        return "none (every layer differs from every mesh)"
    return f"{m} x {n}" + (" (identical)" if differ == 0 else f" ({differ} of {len(configs)} layers differ)")


def block_rows(r: dict, block: str = "block1.") -> list:
    """Configurations of one block's layers under both machines, with the H100 split."""
    net = r["network"]
    rows = []
    for v, (layer, lname) in enumerate(zip(net.layers, net.names)):
        if not lname.startswith(block):
            continue
        h, p = r["h100"].evaluation, r["paper_on_h100"].evaluation
        rows.append([
            lname, layer.dims if hasattr(layer, "dims") else "",
            "x".join(map(str, r["paper"].configs[v])), "x".join(map(str, r["h100"].configs[v])),
            f"{(p.compute[v] + p.communication[v]) * 1e3:.3f}",
            f"{h.compute[v] * 1e3:.3f} / {h.communication[v] * 1e3:.3f}",
        ])
    return rows


# ---------------------------------------------------------------------------------------
# Where the splits land


def placements(layer, config, devices_per_node: int = 8) -> list:
    """Where every split dimension of one configuration lands in the device layout.

    The layout is that of ``docs/machines.md`` ("Placement"): the batch dimension outermost, then
    the others in iteration-space order, the last innermost. For each dimension ``j`` split
    ``c > 1`` ways: its letter, ``c``, its stride ``s`` (``pase.machines.paper.layout_strides``), the
    group of device 0 along it (``0, s, ..., (c-1) s``: the devices that share its collective),
    its members per node ``q_in`` (``Group.members_per_node``) and the nodes it spans.

    Returns
    -------
    list of dict
        Keys ``dim``, ``letter``, ``split``, ``stride``, ``members``, ``per_node``, ``nodes``,
        ``in_node``.
    """
    C = np.asarray([config], dtype=np.int64)
    strides = layout_strides(C, layer.batch_dim)
    out = []
    for j, c in enumerate(config):
        if c == 1:
            continue
        s = int(strides[0, j])
        q_in = int(Group.of(C, strides, [j]).members_per_node(devices_per_node)[0])
        out.append({
            "dim": j, "letter": layer.dims[j], "split": int(c), "stride": s,
            "members": [k * s for k in range(c)], "per_node": q_in, "nodes": int(c) // q_in,
            "in_node": q_in == c,
        })
    return out


def members_text(members: list) -> str:
    """``0,8,16,24`` for a short group, ``0,4,...,60`` for a long one."""
    if len(members) <= 4:
        return ",".join(map(str, members))
    return f"{members[0]},{members[1]},...,{members[-1]}"


def placement_text(pl: dict) -> str:
    if pl["in_node"]:
        return "in one node"
    return f"{pl['nodes']} nodes x {pl['per_node']}"


def collective_of(layer, dim: int) -> str:
    """Which communication of the layer's cost runs over dimension ``dim`` (``docs/cost-model.md``)."""
    letter = layer.dims[dim]
    if isinstance(layer, Einsum):  # Embedding too: priced as its Einsum's collectives
        a, b = (t.is_param for t in layer.inputs)
        if letter in layer.batch_letters:
            return "none (batched GEMMs)"
        if letter in layer.m_letters:
            return "AR grad of B" + (" (weight)" if b else "")
        if letter in layer.n_letters:
            return "AR grad of A" + (" (weight)" if a else "")
        return "AR output (partial sums)"
    if isinstance(layer, Norm):
        return "AR statistics" if dim == layer.axis else "AR scale/bias grads"
    if isinstance(layer, Softmax):
        return "AR max / sums" if dim == layer.axis else "none"
    if isinstance(layer, SoftmaxCrossEntropy):
        return "exchange (loss)" if dim == len(layer.dims) - 1 else "none"
    return "none"


def flat_machine(h100) -> CalibratedMachine:
    """``h100-sxm`` with every link as fast as NVLink: what crossing nodes costs, by difference."""
    d = h100.describe()
    d.update(name=d["name"] + "-flat", inter_node=dict(d["intra_node"]))
    return CalibratedMachine(d, h100.tables, "flat variant of " + d["name"])


def focus_vertices(net, block: str = "block1.") -> list:
    return [v for v, name in enumerate(net.names) if name.startswith(block) or name in OUTSIDE_BLOCKS]


def placement_rows(r: dict, key: str, flat_eval, g: int) -> list:
    """Per layer of the focus and per split dimension: split, stride, group, placement."""
    net, found = r["network"], r[key]
    ev = found.evaluation
    rows = []
    for v in focus_vertices(net):
        layer, config = net.layers[v], found.configs[v]
        comm = f"{ev.communication[v] * 1e3:.3f}"
        flat = f"{flat_eval.communication[v] * 1e3:.3f}"
        pls = placements(layer, config, g)
        head = [net.names[v], layer.dims, "x".join(map(str, config))]
        if not pls:
            rows.append(head + ["-", "", "", "", "", "", comm, flat])
        for i, pl in enumerate(pls):
            rows.append((head if i == 0 else ["", "", ""]) + [
                pl["letter"], pl["split"], pl["stride"], members_text(pl["members"]), placement_text(pl),
                collective_of(layer, pl["dim"]),
            ] + ([comm, flat] if i == 0 else ["", ""]))
    return rows


def letter_summary(r: dict, key: str, g: int) -> list:
    """Per dimension letter over the focus layers: how it is split and where it lands."""
    net, found = r["network"], r[key]
    seen = {}
    for v in focus_vertices(net):
        for pl in placements(net.layers[v], found.configs[v], g):
            k = (pl["letter"], pl["split"], pl["stride"], placement_text(pl))
            seen.setdefault(k, []).append(net.names[v])
    rows = []
    for (letter, c, s, where), names in sorted(seen.items()):
        rows.append([letter, c, s, where, len(names), ", ".join(n.replace("block1.", "") for n in names)])
    return rows


def placement_totals(r: dict, key: str, flat_eval, g: int) -> list:
    """One strategy's totals: communication on h100-sxm and with flat links, split counts."""
    net, found = r["network"], r[key]
    ev = found.evaluation
    whole = split_ms(ev)
    whole_flat = split_ms(flat_eval)
    vs = focus_vertices(net)
    inside = across = 0
    for v in vs:
        for pl in placements(net.layers[v], found.configs[v], g):
            inside += pl["in_node"]
            across += not pl["in_node"]
    comm_focus = float(ev.communication[vs].sum()) * 1e3
    flat_focus = float(flat_eval.communication[vs].sum()) * 1e3
    return [inside, across, f"{comm_focus:.3f}", f"{flat_focus:.3f}",
            f"{whole[1]:.2f} / {whole[2]:.2f}", f"{whole_flat[1]:.2f} / {whole_flat[2]:.2f}",
            f"{whole[3]:.2f}", f"{whole_flat[3]:.2f}"]


def summary_line(r: dict, key: str, label: str, flat_eval, g: int) -> str:
    """One sentence per strategy: which letters stay in a node, which cross, and the price."""
    net, found = r["network"], r[key]
    inside, across = {}, {}
    for v in focus_vertices(net):
        for pl in placements(net.layers[v], found.configs[v], g):
            bucket = inside if pl["in_node"] else across
            bucket.setdefault(pl["letter"], set()).add(net.names[v])
            if not pl["in_node"]:
                bucket.setdefault((pl["letter"], "where"), set()).add(f"{pl['split']} ways, {placement_text(pl)}")

    def listing(bucket):
        parts = []
        for letter in sorted(k for k in bucket if isinstance(k, str)):
            count = len(bucket[letter])
            text = f"`{letter}` ({count} layer{'s' if count > 1 else ''}"
            if (letter, "where") in bucket:
                text += ": " + "; ".join(sorted(bucket[(letter, "where")]))
            parts.append(text + ")")
        return ", ".join(parts) or "none"

    ev = split_ms(found.evaluation)
    flat = split_ms(flat_eval)
    return (f"- **{label}**: inside one node: {listing(inside)}. Across nodes: {listing(across)}. "
            f"Communication {ev[1]:.2f} ms + edges {ev[2]:.2f} ms per step; with NVLink-fast links "
            f"{flat[1]:.2f} + {flat[2]:.2f} ms, so crossing nodes costs "
            f"{ev[1] + ev[2] - flat[1] - flat[2]:.2f} ms of its {ev[3]:.2f} ms step.")


STRATEGIES = (
    ("h100", "h100 optimum"),
    ("paper_on_h100", "paper optimum on h100"),
    ("megatron_plan", "Megatron expert"),
)


def placement_section(r: dict, h100) -> list:
    g = h100.devices_per_node
    flat = flat_machine(h100)
    r = dict(r, megatron_plan=r["megatron"]["plan"])
    flat_evals = {key: r[key].reprice(flat).evaluation for key, _ in STRATEGIES}
    m, n = r["megatron"]["mesh"]
    lines = [
        "",
        f"## gpt3-13b, p = {r['procs']}, batch {r['batch']}: which splits land inside nodes and which across",
        "",
        f"Devices `0..{r['procs'] - 1}`, node = device // {g}. Every configuration is laid out row-major",
        "with the batch dimension outermost, then the others in iteration-space order (`dims`),",
        "the last innermost (`docs/machines.md`); a dimension's stride is the product of the splits laid",
        "inside it. The devices sharing a split (its collective) are device 0's group `0, s, ...,",
        "(c-1) s`; it lies in one node when `c s <= 8`, else it spans `nodes x members per node`.",
        "`collective`: what the layer's cost communicates over that dimension (AR: ring",
        "all-reduce; for an Einsum, the forward output over `K` dims, operand A's gradient over `N`",
        "dims, operand B's over `M` dims; batch dims of a batched GEMM need none). `comm ms`: the",
        "layer's communication on `h100-sxm`; `flat ms`: the same with every link as fast as NVLink",
        "(450 GB/s, 3 us: a machine identical but for `inter_node`), so the difference is what",
        "crossing nodes costs. A layer whose configuration uses `c < p` devices (the table of",
        "`pase` shows it as replicated `p / c` times) is laid out on its `c` devices as on",
        "`0..c-1`, so its groups may all lie in one node; edges are priced at the inter-node",
        "bandwidth whenever p > 8 (`docs/machines.md`).",
        "Layers: block 1 (every block is the same) and the layers outside the",
        f"blocks. Megatron expert: mesh {m} x {n} (batch {m} ways, heads / ff / vocabulary {n} ways).",
        "",
        "In short (dimension letters over the layers shown; `b` batch, `l` sequence, `h` heads, `f`",
        "feed-forward, `v` vocabulary, `e`/`d` model width, `k` key width, `s` q/k/v):",
        "",
        *[summary_line(r, key, label, flat_evals[key], g) for key, label in STRATEGIES],
        "",
        "Totals (split dims counted over the layers shown; communication / edges in ms):",
        "",
        *markdown_table(
            ["strategy", "splits in one node", "splits across nodes", "comm ms (shown layers)",
             "flat comm ms (shown)", "whole step comm / edges ms", "flat comm / edges ms", "step ms",
             "flat step ms"],
            [[label] + placement_totals(r, key, flat_evals[key], g) for key, label in STRATEGIES],
            "l" + "r" * 8,
        ),
    ]
    for key, label in STRATEGIES:
        lines += [
            "",
            f"### {label}: by dimension",
            "",
            "Each distinct (letter, split, stride, placement) over the layers shown:",
            "",
            *markdown_table(["dim", "split", "stride", "placement", "layers", "which"],
                            letter_summary(r, key, g), "lrrlrl"),
            "",
            f"### {label}: per layer",
            "",
            *markdown_table(["layer", "dims", "config", "dim", "split", "stride", "group of device 0",
                             "placement", "collective", "comm ms", "flat ms"],
                            placement_rows(r, key, flat_evals[key], g), "lllrrrlllrr"),
        ]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="graph:batch list (default %(default)s)")
    parser.add_argument("--procs", default=",".join(map(str, PROCS)), help="device counts (default %(default)s)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "machine_compare.md"))
    args = parser.parse_args(argv)
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in parse_list(args.cases)]
    procs = parse_list(args.procs, int)
    paper, h100 = load_machine("paper"), load_machine("h100-sxm")

    results = []
    for name, batch in cases:
        for p in procs:
            results.append(run_case(name, batch, p, paper, h100))
            print(f"{name} p={p}: done", flush=True)

    info = machine_info()
    lines = [
        "# h100-sxm against the paper machine",
        "",
        "Regenerate with `python benchmarks/machine_compare.py`. Step times are the calibrated",
        "model's (seconds of one training step on the modelled H100 cluster, shown in ms); search",
        "seconds are CPU time on a shared 2-core machine (noisy).",
        "",
        *machine_lines(info),
        "",
        "How each strategy was built (all priced on `h100-sxm`, 8 devices per node):",
        "",
        "- `h100 optimum`: `pase.plan(network, p, h100-sxm, memory_cap=80e9)`, the exact search on",
        "  the calibrated machine under its default cap (80 GB per device);",
        "- `paper optimum on h100`: `pase.plan(network, p)` on the paper machine (10 TFLOPS, 16 GB/s,",
        "  no cap), its configurations priced on `h100-sxm` with `pase.evaluate_plan` (what",
        "  `--evaluate` does);",
        "- `DP`: data parallelism (`pase.data_parallel`: the batch split `p` ways, or its largest",
        "  divisor), whether it fits or not;",
        "- `Megatron`: the Megatron-style batch x model mesh, `pase.planning.experts.mesh_tensorflow(network, p,",
        "  h100-sxm)`: every batch dimension split `m` ways, the heads `h`, feed-forward width `f` and",
        "  vocabulary `v` of the layers that have one split `n` ways (`m n = p`), nothing else split;",
        "  of the valid meshes (`n` must divide the heads: 32 for gpt3-2.7b, 40 for gpt3-13b, 8 for",
        "  the Transformer), the one of least step time on `h100-sxm`, whether it fits or not.",
        "  Shown as `m x n: ms`. Its model axis is laid out innermost, so `n <= 8` keeps tensor",
        "  parallelism inside a node, as Megatron-LM does.",
        "",
        "Splits are compute / communication / edges (ms).",
        "`gain`: how much faster the h100 optimum is than the paper one on the H100 (`-` where either",
        "needs more than 80 GB per device); `over DP`: against DP; `over Megatron`: against the",
        "Megatron mesh, or where it does not fit against the fastest mesh that does (named).",
        "Memory: GB per device (parameters with mixed-precision Adam and all activations,",
        "`docs/memory.md`); `(over)`: more than the 80 GB cap. `status`: the capped search's outcome",
        "(`capped`: the unconstrained optimum did not fit and a fitting strategy was found;",
        "`nothing-fits`: no strategy fits, the least-memory one is shown).",
        "",
        *markdown_table(
            ["graph", "p", "h100 optimum ms", "split", "paper optimum on h100 ms", "split", "gain",
             "DP ms", "over DP", "Megatron ms", "over Megatron", "Megatron GB", "h100 opt GB", "paper opt GB",
             "status", "paper search s", "h100 search s"],
            [summary_row(r) for r in results], "ll" + "r" * 15,
        ),
        "",
        "## The Megatron-style expert: every mesh",
        "",
        "`m x n`: batch `m` ways, heads / ff / vocabulary `n` ways. `chosen`: least step time on",
        "`h100-sxm` (what `mesh_tensorflow` returns); `fastest fitting`: least step time among the",
        "meshes within 80 GB per device.",
        "",
        *markdown_table(["graph", "p", "mesh", "ms", "compute / comm / edges", "GB", ""],
                        [row for r in results for row in megatron_rows(r)], "lllrrrl"),
        "",
        "How close each optimum is to a mesh: the mesh whose configurations agree with it on the",
        "most layers, and on how many layers they differ.",
        "",
        *markdown_table(["graph", "p", "paper optimum", "h100 optimum"],
                        [[r["name"], r["procs"], nearest_mesh(r, "paper"), nearest_mesh(r, "h100")]
                         for r in results], "llll"),
    ]
    focus = [r for r in results if r["name"] == "gpt3-13b" and r["procs"] == 64]
    if focus:
        r = focus[0]
        lines += [
            "",
            "## gpt3-13b, p = 64, batch 16: one block",
            "",
            "Configurations in iteration-space order (`dims`), the paper optimum's and the h100",
            "optimum's, and each layer's cost on `h100-sxm` (ms; the h100 optimum split into compute",
            "/ communication).",
            "",
            *markdown_table(["layer", "dims", "paper", "h100", "paper's on h100 ms", "h100's compute / comm ms"],
                            block_rows(r), "llllrr"),
        ]
        lines += placement_section(r, h100)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
