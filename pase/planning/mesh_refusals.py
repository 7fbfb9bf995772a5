"""Why no mesh applies: the reasons ``search_meshes`` gives when a recipe or a device count
leaves it nothing to price (``docs/training.md``).

Each reason is the arithmetic that fails, in the user's numbers: ``batch 15 is not divisible
by dp 8``, ``micro-batch 3 does not divide the per-rank batch 2``, ``pp 8 x vpp 5 = 40 chunks >
12 blocks``, and for a device count no mesh occupies, the largest count one does.
"""

from __future__ import annotations

import numpy as np

from pase.model.configs import divisors
from pase.model.roles import roles_of
from pase.planning.mesh import Mesh, MeshMapper, Recipe
from pase.planning.pipeline import chunk_sizes, cuts, extra_units, unit_split

__all__ = ["recipe_refusal", "microbatch_refusal", "occupancy_refusal", "fold_refusal"]


def recipe_refusal(recipe: Recipe, batch: int, blocks: int | None) -> str | None:
    """The reason no mesh can meet ``recipe``'s fixed numbers (``None``: they may), known
    before any mesh is built: ``blocks`` is the network's repeated blocks (``None``: none).

    >>> recipe_refusal(Recipe(dp=8), 15, 12)
    'batch 15 is not divisible by dp 8'
    >>> recipe_refusal(Recipe(dp=8, microbatch=3), 16, 12)
    'micro-batch 3 does not divide the per-rank batch 2 (batch 16 / dp 8)'
    >>> recipe_refusal(Recipe(pp=8, vpp=5), 16, 12)
    'pp 8 x vpp 5 = 40 chunks > 12 blocks'
    >>> recipe_refusal(Recipe(pp=16, vpp=8), 16, 126)
    'pp 16 x vpp 8 = 128 chunks > 126 blocks'
    >>> recipe_refusal(Recipe(pp=16, vpp=8, pipeline_extra="embedding+loss"), 16, 126) is None
    True
    """
    if recipe.dp is not None and batch % recipe.dp:
        return f"batch {batch} is not divisible by dp {recipe.dp}"
    if recipe.dp is not None and recipe.microbatch is not None and (batch // recipe.dp) % recipe.microbatch:
        return (f"micro-batch {recipe.microbatch} does not divide the per-rank batch {batch // recipe.dp} "
                f"(batch {batch} / dp {recipe.dp})")
    if recipe.pp is not None and recipe.pp > 1:
        extra = extra_units(recipe.pipeline_extra)
        chunks = recipe.pp * (recipe.vpp or 1)
        units = (blocks or 0) + sum(extra) if blocks is not None else None
        if units is None or chunks > units or (recipe.pp > blocks):
            what = "pipeline stages" if recipe.vpp is None else "chunks"
            shown = f"pp {recipe.pp}" if recipe.vpp is None else f"pp {recipe.pp} x vpp {recipe.vpp} = {chunks}"
            counted = f"{blocks or 0} blocks" + (f" + {extra_word_of(extra)}" if sum(extra) and blocks else "")
            return f"{shown} {what} > {counted}"
        if sum(extra) and recipe.stages is None and unit_split(blocks, recipe.pp, extra, recipe.vpp or 1) is None:
            return (f"{blocks} blocks + {extra_word_of(extra)} = {units} pipeline layers do not split evenly into pp "
                    f"{recipe.pp}" + (f" x vpp {recipe.vpp}" if recipe.vpp and recipe.vpp > 1 else "")
                    + " (Megatron-LM's --account-for-*-in-pipeline-split needs it)")
        if recipe.vpp is not None and recipe.vpp > 1:
            tried = [recipe.stages] if recipe.stages is not None else (
                [unit_split(blocks, recipe.pp, extra, recipe.vpp)] if sum(extra) else cuts(blocks, recipe.pp))
            if not any(chunk_sizes(c, recipe.vpp, extra) is not None for c in tried):
                return (f"interleaving needs chunks of at most two sizes, one block apart: {blocks} blocks do not "
                        f"split into pp {recipe.pp} x vpp {recipe.vpp} = {chunks} such chunks")
    return None


def extra_word_of(extra) -> str:
    """``the embedding``, ``the loss`` or ``the embedding and the loss``."""
    return " and ".join(w for w, e in zip(("the embedding", "the loss"), extra) if e)


def fold_refusal(mesh: Mesh, expert_counts, ep: int, etp: int) -> str | None:
    """Why expert parallelism ``ep`` with expert tensor parallelism ``etp`` does not fold onto
    ``mesh`` (Megatron-Core's MoE parallel folding: ``etp x ep x edp = tp x cp x dp``), or
    ``None`` when it does.

    >>> fold_refusal(Mesh(32, 2), [256], 128, 1)
    'ep 128 x etp 1 does not divide dp 32 x cp 1 x tp 2 = 64 (MoE parallel folding)'
    >>> fold_refusal(Mesh(32, 2, sp=False), [256], 64, 1)
    'etp 1 < tp 2 needs sequence parallelism (MoE parallel folding), and the mesh has sp=false'
    """
    odd = [n for n in expert_counts if n % ep]
    if not expert_counts or odd:
        return f"ep {ep} does not divide the {odd[0] if odd else 0} experts of a mixture-of-experts layer"
    if mesh.tp % etp:
        return f"etp {etp} does not divide tp {mesh.tp} (MoE parallel folding)"
    ranks = mesh.dp * mesh.cp * mesh.tp
    if ranks % (ep * etp):
        return (f"ep {ep} x etp {etp} does not divide dp {mesh.dp} x cp {mesh.cp} x tp {mesh.tp} = {ranks} "
                "(MoE parallel folding)")
    if etp < mesh.tp and not mesh.sp:
        return f"etp {etp} < tp {mesh.tp} needs sequence parallelism (MoE parallel folding), and the mesh has sp=false"
    return None


def microbatch_refusal(recipe: Recipe, batch: int, dps) -> str | None:
    """With a fixed micro-batch, the reason none of the data-parallel degrees ``dps`` tried
    leaves a per-rank batch it divides (``None``: one does)."""
    micro = recipe.microbatch
    dps = sorted(set(int(d) for d in dps if batch % d == 0))
    if micro is None or not dps or any((batch // d) % micro == 0 for d in dps):
        return None
    if len(dps) == 1:
        return f"micro-batch {micro} does not divide the per-rank batch {batch // dps[0]} (batch {batch} / dp {dps[0]})"
    listed = ", ".join(f"{batch // d} (dp {d})" for d in dps)
    return f"micro-batch {micro} does not divide the per-rank batch of any mesh: {listed}"


def _mapped(mapper: MeshMapper, mesh: Mesh) -> bool:
    try:
        mapper.configs(mesh)
    except ValueError:
        return False
    return True


def _tp_degrees(network, mapper: MeshMapper, node: int, recipe: Recipe) -> list:
    """Tensor-parallel degrees within a node that map onto every layer (dp 1, no cp)."""
    if recipe.tp is not None:
        return [recipe.tp]
    # A degree that maps divides the product of the dimensions a layer's tensor-parallel rule
    # splits (its heads, MLP width, expert width or vocabulary).
    sizes = set()
    for layer in network.layers:
        dims = mapper.rules.tensor_alternative(roles_of(layer))
        if dims:
            sizes.add(int(np.prod([layer.domain[j] for j in dims])))
    candidates = {1} | {t for size in sizes for t in divisors(size) if t <= node}
    # A degree maps only if it divides every such dimension's split: try each once.
    return sorted(t for t in candidates if t == 1 or _mapped(mapper, Mesh(1, t)))


def occupancy_refusal(network, batch: int, procs: int, machine, recipe: Recipe, blocks: int | None,
                      sequence: int | None, max_cp: int, rules=None) -> str | None:
    """The reason no mesh of ``procs`` devices exists at all, with the largest device count
    that one occupies (``None`` when the degrees can multiply to ``procs``).

    A mesh is ``dp x tp x cp x pp`` devices: ``dp`` dividing the batch, ``tp`` within a node
    mapping onto the heads, MLP width or vocabulary, ``cp`` dividing the sequence (at most
    ``max_cp``), ``pp`` stages of the ``blocks`` repeated blocks. The products are an upper
    bound on the meshes the search builds, so a count outside them has none.
    """
    mapper = MeshMapper(network, rules)
    node = int(min(machine.nvlink_domain or machine.devices_per_node or procs, procs))
    dps = [recipe.dp] if recipe.dp is not None else [d for d in divisors(batch) if d <= procs]
    tps = _tp_degrees(network, mapper, node, recipe)
    if recipe.cp is not None:
        cps = [recipe.cp]
    elif sequence:
        cps = [c for c in divisors(sequence) if c <= max_cp and (c == 1 or _mapped(mapper, Mesh(1, 1, c)))]
    else:
        cps = [1]
    if recipe.pp is not None:
        pps = [recipe.pp]
    else:
        pps = [1] + [pp for pp in range(2, min(blocks or 1, procs) + 1) if cuts(blocks, pp)]
    products = np.multiply.outer(np.multiply.outer(np.array(dps, dtype=np.int64), np.array(tps, dtype=np.int64)),
                                 np.multiply.outer(np.array(cps, dtype=np.int64), np.array(pps, dtype=np.int64)))
    if (products == procs).any():
        return None
    usable = products[products <= procs]
    where = f"batch {batch}" + (f" and sequence {sequence}" if sequence else "")
    rule = (f"dp dividing the batch, tp up to {node} within a node, "
            + ("cp dividing the sequence up to " + str(max_cp) if sequence else "no cp") + ", "
            + (f"pp up to {blocks} blocks" if blocks else "no pipeline"))
    if not usable.size:
        return f"{where} cannot occupy {procs:,} devices with a mesh dp x tp x cp x pp ({rule})"
    best = int(usable.max())
    i, j, k, m = (int(x[0]) for x in np.nonzero(products == best))
    return (f"{where} cannot occupy {procs:,} devices with a mesh dp x tp x cp x pp ({rule}); the largest usable "
            f"count is {best:,} (dp {dps[i]} x tp {tps[j]} x cp {cps[k]} x pp {pps[m]})")
