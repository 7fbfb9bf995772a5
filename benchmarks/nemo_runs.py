"""The NVIDIA NeMo / Megatron-Bridge published rows (``nemo-megatron-bridge.json``) as the command
line prices them: each row's config, machine and ``--recipe``, read by ``nemo.py`` and ``published.py``.
"""

from __future__ import annotations

import json
import os

CONFIGS = {"LLAMA3_70B": os.path.join("examples", "hf", "llama-3.1-70b.json"),
           "LLAMA3_8B": os.path.join("examples", "hf", "llama-3.1-8b.json"),
           "Qwen3_30B_a3B": os.path.join("examples", "hf", "qwen3-30b-a3b.json"),
           "GPT3-175B": os.path.join("benchmarks", "configs", "gpt3-175b.json")}
MACHINES = {"DGX-H100": "h100-sxm", "DGX-B200": "b200"}


def scaling(row: dict) -> str:
    """FP8's scaling of a row: ``delayed`` for NeMo 24.x (Transformer Engine's DelayedScaling, NeMo's
    default then), ``current`` for the others."""
    return "delayed" if row["container"].startswith("NeMo 24.") else "current"


def nemo_recipe(row: dict, precision: bool = True) -> str:
    """The published layout of a row as ``--recipe`` words (``precision``: with FP8 and its scaling)."""
    tp, pp, cp = row["tp"], row["pp"], row["cp"]
    parts = [f"dp={row['gpus'] // (tp * pp * cp)}", f"tp={tp}", f"pp={pp}", f"cp={cp}",
             f"zero={3 if row.get('fsdp') else 1}"]
    if row.get("vp") and row["vp"] > 1:
        parts += ["schedule=interleaved", f"vpp={row['vp']}"]
    parts += [f"ep={row.get('ep') or 1}", f"microbatch={row['mbs']}"]
    if precision:
        parts += ["precision=fp8", f"scaling={scaling(row)}"]
    return ",".join(parts)


def nemo_rows(folder: str) -> list:
    """Every row of ``nemo-megatron-bridge.json`` in ``folder``, with its config, machine and
    published step (GBS x sequence / (tokens/s per GPU x GPUs))."""
    with open(os.path.join(folder, "nemo-megatron-bridge.json")) as f:
        data = json.load(f)
    out = []
    for r in data["rows"]:
        if r["model"] not in CONFIGS or r["system"] not in MACHINES:
            raise SystemExit(f"nemo.py: no config or machine for {r['model']} on {r['system']}")
        base = dict(name=f"{r['model']} {r['system']} {r['gpus']} GPUs ({r['container']})", engine="megatron",
                    machine=MACHINES[r["system"]], system_name=r["system"], config=CONFIGS[r["model"]], gpus=r["gpus"], batch=r["gbs"],
                    seq=r["seq"], published=r, moe=bool(r.get("ep") and r["ep"] > 1),
                    step_pub=r["gbs"] * r["seq"] / (r["tokens_per_s_per_gpu"] * r["gpus"]))
        out.append(base)
    return out
