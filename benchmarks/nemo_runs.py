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
#: What NVIDIA's performance recipe of a MoE row sets beyond the published columns, in recipe
#: words, keyed (model, system, GPUs, EP): Megatron-Bridge scripts/performance/configs/qwen/
#: qwen3_workload_base_configs.py (01b2977e) QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: 16 GPUs,
#: EP 16, ``moe_flex_dispatcher_backend="hybridep"``, ``moe_a2a_overlap=False``; the same file at
#: 953aabf75 (Dec 2025, research note moe.md section 5): the H100 preset of PP 2 x VP 12 with EP 8
#: sets ``moe_a2a_overlap`` (Megatron-Core's --overlap-moe-expert-parallel-comm).
MOE_PRESETS = {("Qwen3_30B_a3B", "DGX-H100", 16, 16): "dispatcher=hybridep",
               ("Qwen3_30B_a3B", "DGX-H100", 16, 8): "ep_overlap=true"}
#: Dense rows whose NVIDIA recipe turns on tensor-parallel communication overlap (Transformer
#: Engine's userbuffers), keyed (model, system): Megatron-Bridge's performance scripts map
#: ``llama3_70b`` on ``h100`` to ``userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192`` under
#: ``CommOverlapConfig(tp_comm_overlap=True)`` (COMM_OVERLAP_CONFIG_MAP; the shared file's
#: ``recompute_and_overlap`` note: "70B uses TP comm overlap userbuffers"); NeMo 24.07's GPT-3 175B
#: sets ``ub_tp_comm_overlap: True`` (NeMo-Framework-Launcher launcher_scripts/conf/training/gpt3/175b.yaml).
TP_OVERLAP_PRESETS = {("LLAMA3_70B", "DGX-H100"), ("GPT3-175B", "DGX-H100")}


#: Rows of the same tables read here, beside the shared file's: NVIDIA's other Qwen3-30B-A3B layout
#: on 16 H100 (Megatron-Bridge performance-summary-archive.md (its docs folder), "26.02.01 NeMo Container",
#: DGX-H100 Qwen3_30B_a3B: FP8, GBS 1024, MBS 1, seq 4096, TP 1, PP 2, VP 12, EP 8, 9058 tokens/s/GPU),
#: measured equal to the EP 16 row of 26.04.01 (28.9 s and 29.3 s a step; issue 42).
EXTRA_ROWS = [
    {"source_file": "NVIDIA-NeMo/Megatron-Bridge performance-summary-archive.md (its docs folder) (26.02.01 NeMo Container)",
     "container": "26.02.01 NeMo Container", "system": "DGX-H100", "model": "Qwen3_30B_a3B", "gpus": 16,
     "precision": "FP8", "gbs": 1024, "mbs": 1, "seq": 4096, "fsdp": 0, "tp": 1, "pp": 2, "cp": 1, "vp": 12, "ep": 8,
     "tokens_per_s_per_gpu": 9058, "model_tflops_per_gpu": 208, "variant": "second layout"},
]


def nemo_engine(row: dict) -> str:
    """The engine a row is priced with: ``megatron,adam=apex`` for NeMo 1.x (the 24.x containers:
    NeMo-Framework-Launcher's configs run ``optim.name: distributed_fused_adam``, Apex's distributed
    Adam, e.g. ``conf/training/gpt3/175b.yaml``), ``megatron`` (Megatron-Core's distributed optimizer)
    for NeMo 2 and Megatron-Bridge."""
    return "megatron,adam=apex" if row["container"].startswith("NeMo 24.") else "megatron"


def scaling(row: dict) -> str:
    """FP8's scaling of a row: ``delayed`` for NeMo 24.x (Transformer Engine's DelayedScaling, NeMo's
    default then), ``current`` for the others."""
    return "delayed" if row["container"].startswith("NeMo 24.") else "current"


def nemo_recipe(row: dict, precision: bool = True, preset: bool = True) -> str:
    """The published layout of a row as ``--recipe`` words (``precision``: with FP8 and its
    scaling; ``preset``: with what NVIDIA's recipe sets of the experts, :data:`MOE_PRESETS`, and of
    the tensor-parallel overlap, :data:`TP_OVERLAP_PRESETS`). A
    pipeline without virtual stages (VP ``n/a`` or 1) runs 1F1B: Megatron interleaves only when
    told (``--num-layers-per-virtual-pipeline-stage``)."""
    tp, pp, cp = row["tp"], row["pp"], row["cp"]
    parts = [f"dp={row['gpus'] // (tp * pp * cp)}", f"tp={tp}", f"pp={pp}", f"cp={cp}",
             f"zero={3 if row.get('fsdp') else 1}"]
    if row.get("vp") and row["vp"] > 1:
        parts += ["schedule=interleaved", f"vpp={row['vp']}"]
    elif pp > 1:
        parts.append("schedule=1f1b")
    parts += [f"ep={row.get('ep') or 1}", f"microbatch={row['mbs']}"]
    extra = MOE_PRESETS.get((row["model"], row["system"], row["gpus"], row.get("ep") or 1))
    if preset and extra:
        parts.append(extra)
    if preset and tp > 1 and (row["model"], row["system"]) in TP_OVERLAP_PRESETS:
        parts.append("tp_overlap=true")
    if precision:
        parts += ["precision=fp8", f"scaling={scaling(row)}"]
    return ",".join(parts)


def nemo_rows(folder: str) -> list:
    """Every row of ``nemo-megatron-bridge.json`` in ``folder``, with its config, machine and
    published step (GBS x sequence / (tokens/s per GPU x GPUs))."""
    with open(os.path.join(folder, "nemo-megatron-bridge.json")) as f:
        data = json.load(f)
    out = []
    for r in data["rows"] + EXTRA_ROWS:
        if r["model"] not in CONFIGS or r["system"] not in MACHINES:
            raise SystemExit(f"nemo.py: no config or machine for {r['model']} on {r['system']}")
        base = dict(name=f"{r['model']} {r['system']} {r['gpus']} GPUs ({r['container']})", engine=nemo_engine(r),
                    machine=MACHINES[r["system"]], system_name=r["system"], config=CONFIGS[r["model"]], gpus=r["gpus"], batch=r["gbs"],
                    seq=r["seq"], published=r, moe=bool(r.get("ep") and r["ep"] > 1),
                    step_pub=r["gbs"] * r["seq"] / (r["tokens_per_s_per_gpu"] * r["gpus"]))
        out.append(base)
    return out
