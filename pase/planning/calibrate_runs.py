"""Learn a cluster from its own measured runs (``pase calibrate --from-runs``): price every run
with its own layout, fit the few constants the model leaves free, and say how well it predicts.

Each run is priced once with the machine and engine as they are, without host times, and taken
apart into the terms each constant scales (:class:`RunTerms`): the device's compute (the in-step
compute efficiency, ``compute_efficiency``), collectives inside one node and across nodes
(``collective_scale`` ``intra_node`` and ``inter_node``) and the host time per repeated block and
micro-batch and, on a pipeline stage, the tensor-parallel ranks' wait per doubling of their group
(``block_overhead_seconds``, ``pipeline_tp_wait_seconds``: the blocks and micro-batches on the
critical path counted), and the wait of a tensor-parallel group spanning nodes per block,
micro-batch and doubling of the nodes (``tp_node_wait_seconds``: the same count times those
doublings).
The step is linear in those six; they are fitted by least squares of the relative error, each held
to its bounds (``pase.machines.fitted.FITTED_BOUNDS``), runs missed by far more than the rest
left out as outliers, and every run then priced again on the fitted machine. The leave-one-out
error predicts each run from the constants fitted on the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pase.machines.calibrated import CalibratedMachine
from pase.machines.fitted import FITTED_BOUNDS
from pase.costing.training.compute import activation_waits
from pase.costing.training.parts import FORWARD_SHARE
from pase.costing.training.structure import NetworkStructure
from pase.planning.host_floor import block_count, domain_of, expert_block_count, node_doublings
from pase.planning.mesh import parse_recipe
from pase.planning.run_ranking import rank_runs
from pase.planning.training_plan import NO_CAP, plan_training

__all__ = ["RunTerms", "PricedRun", "Fit", "price_runs", "run_terms", "fit_constants", "calibrate_from_runs",
           "PARAMETERS", "OUTLIER_FACTOR", "OUTLIER_MADS"]

#: The constants fitted, in the order of the least-squares columns.
PARAMETERS = ("compute_scale", "intra_node", "inter_node", "block_overhead_seconds", "pipeline_tp_wait_seconds",
              "tp_node_wait_seconds")
#: A run the first fit misses by more than this factor and by more than :data:`OUTLIER_MADS`
#: median absolute deviations (of the log ratio) is an outlier, left out of the second fit (a
#: failed or congested run: the playbook's sweep has runs at a twentieth of their group's best).
OUTLIER_FACTOR = 1.5
OUTLIER_MADS = 3.0
#: A constant whose terms add up to less than this share of the runs' steps is not determined
#: by them: it keeps the machine's or the engine's value.
UNDETERMINED_SHARE = 1e-3


@dataclass(frozen=True)
class PricedRun:
    """One run priced: its modelled step and tokens/s per device, its causes, peak memory, and
    the layout it was priced in (for :func:`run_terms`)."""

    name: str
    measured_step: float
    step: float
    tokens_per_second_per_device: float
    causes: dict
    peak_memory_bytes: float
    fits: bool
    mesh: object
    microbatches: int
    vpp: int
    stage_blocks: int
    #: The run's recomputation policy (``full`` issues every forward again from the host).
    recompute: str = "none"
    #: The share of the network's blocks that hold a mixture of experts.
    expert_share: float = 0.0
    #: The share of them whose activation stops the host again (``expert_activation_sync``):
    #: their MoE host time adds to the device's.
    waiting_share: float = 0.0


@dataclass(frozen=True)
class RunTerms:
    """A run's step taken apart into the terms the fitted constants scale, as the model adds them
    up: ``max(compute + tensor, units x host) + rest``. ``compute``: the device's kernels,
    recomputation, the bubble and the optimizer step (the compute efficiency scales them);
    ``tensor`` and ``rest``: exposed tensor-parallel collectives (inside the micro-batches) and
    the weight synchronisation and pipeline sends (after or between them), each as ``(inside one
    node, across nodes)`` (the collective scales); ``units``: repeated blocks times micro-batch
    slots on the critical path (what the host time per block multiplies); ``tp_wait``: ``log2
    tp`` on a pipelined run, else 0 (what the pipeline's wait per block multiplies); ``fixed``: what
    no fitted constant scales (the caching allocator's retries on a tight run); ``nodes``: the
    doublings of the nodes a tensor-parallel group spans, ``log2`` of them (what the wait across
    nodes per block multiplies, with ``units``: device time)."""

    compute: float
    tensor: tuple
    rest: tuple
    units: float
    tp_wait: float
    fixed: float = 0.0
    nodes: float = 0.0
    #: What the host time per block is counted by on each block (``1 + FORWARD_SHARE`` under
    #: ``recompute=full``, else 1), and the engine's stated host time of the MoE blocks on the
    #: critical path (seconds, not fitted: ``moe_block_overhead_seconds``).
    again: float = 1.0
    moe_host: float = 0.0
    #: The part of ``moe_host`` the device waits for, added to its time (MoE blocks whose
    #: activation stops the host again, ``expert_activation_sync``; seconds, not fitted).
    moe_wait: float = 0.0

    def step(self, p: np.ndarray) -> float:
        """The step under constants ``p`` (:data:`PARAMETERS` order)."""
        device = (p[0] * self.compute + p[1] * self.tensor[0] + p[2] * self.tensor[1]
                  + p[5] * self.units * self.nodes + self.moe_wait)
        host = self.units * (self.again * p[3] + p[4] * self.tp_wait) + self.moe_host
        return max(device, host) + p[1] * self.rest[0] + p[2] * self.rest[1] + self.fixed


def _builder(spec: str, sequence):
    from pase.sources import load

    @lru_cache(maxsize=None)
    def build(sequences: int):
        return load(spec, sequences, sequence)
    return build


def price_runs(runs, machine, engine, base_changes: dict | None = None) -> list:
    """Every run priced with its own recipe on ``machine`` for ``engine``, within the device's
    memory (a tight run pays its allocator's retries), and where nothing fits it without a cap:
    a layout that ran is priced whatever the model says of its memory; ``fits`` says it.
    ``base_changes``: options set on top of the engine's. ``ValueError`` naming the run that
    cannot be priced."""
    builders: dict = {}
    out = []
    for run in runs:
        key = (run.graph, run.sequence)
        if key not in builders:
            builders[key] = _builder(run.graph, run.sequence)
        try:
            recipe = parse_recipe(run.recipe)
            base = engine.base_options(machine, **(base_changes or {}))
            plan = _plan_run(builders[key], run, machine, recipe, base, engine)
        except (ValueError, MemoryError) as err:
            raise ValueError(f"run {run.name!r} cannot be priced: {err}") from None
        best = plan.best
        if best is None or best.mesh is None:
            raise ValueError(f"run {run.name!r} cannot be priced: no configuration of its recipe {run.recipe}")
        out.append(_priced(run, plan, best))
    return out


def _plan_run(build, run, machine, recipe, base, engine):
    """The run's plan within the device's memory, else (nothing fits) without a cap."""
    for cap in (None, NO_CAP):
        plan = plan_training(build, run.batch, run.devices, machine, cap, machine.act_bytes or 2.0, recipe,
                             base=base, engine=engine, keep_to=(engine,), free=False)
        if plan.best is not None or machine.memory_bytes is None:
            return plan
    return plan


def _priced(run, plan, best) -> PricedRun:
    summary = best.summary
    pipe = summary.extra.get("pipeline") or {}
    network = plan.network
    blocks = block_count(network.blocks) if network is not None and network.blocks else 0
    share = waiting = 0.0
    if blocks:
        st = NetworkStructure.of(network)
        counted = max(block_count(st.blocks), 1)
        waits = {v for v in st.experts if activation_waits(network.layers[v], best.options)}
        share = expert_block_count(st.blocks, st.experts) / counted
        waiting = expert_block_count(st.blocks, waits) / counted
    if pipe:
        slowest = max(pipe["stages"], key=lambda s: s["microbatch_seconds"])
        stage_blocks = slowest["blocks"]
    else:
        stage_blocks = blocks
    step = summary.step_seconds
    measured = run.measured_step()
    if measured is None:
        tokens = summary.tokens_per_step
        measured = tokens / (run.tokens_per_second_per_device * run.devices)
    device_memory = plan.device_memory_bytes
    return PricedRun(run.name, float(measured), float(step), float(summary.tokens_per_second_per_device or 0.0),
                     best.causes(), float(summary.peak_memory_bytes),
                     device_memory is None or summary.peak_memory_bytes <= device_memory, best.mesh,
                     int(best.options.microbatches), int(pipe.get("vpp", 1) or 1), int(stage_blocks),
                     best.options.recompute, float(share), float(waiting))


def run_terms(priced: PricedRun, machine, moe_seconds: float = 0.0) -> RunTerms:
    """The terms of a run priced with no host time per block: each collective's level by the
    span of the group that runs it (tensor parallelism across nodes when ``tp`` is more than a
    node's GPUs; data parallelism when its group spans more; pipeline sends when the stages span
    more than one node). ``moe_seconds``: the engine's host time per MoE block, which the fit
    keeps as stated (its share of the blocks on the critical path; the device waits for the part
    of it whose blocks' activation stops the host again, ``PricedRun.waiting_share``)."""
    c = priced.causes
    mesh = priced.mesh
    node = domain_of(machine)
    pp = mesh.pp
    units = (priced.microbatches + (pp - 1) / priced.vpp) * priced.stage_blocks if pp > 1 else \
        priced.microbatches * priced.stage_blocks
    compute = c.get("compute", 0.0) + c.get("recompute", 0.0) + c.get("bubble", 0.0) + c.get("optimizer", 0.0)
    tensor = c.get("activation_comm", 0.0) + c.get("redistribution", 0.0)
    sync_out = mesh.dp > 1 and mesh.dp * mesh.tp * mesh.cp > node
    sends_out = pp > 1 and mesh.devices > node
    rest = [0.0, 0.0]
    rest[int(sync_out)] += c.get("weight_sync", 0.0)
    rest[int(sends_out)] += c.get("p2p", 0.0)
    across = mesh.tp > node
    again = 1.0 + FORWARD_SHARE if priced.recompute == "full" else 1.0
    return RunTerms(compute, (0.0, tensor) if across else (tensor, 0.0), tuple(rest), units,
                    math.log2(mesh.tp) if pp > 1 else 0.0, c.get("allocator_retries", 0.0),
                    float(node_doublings(mesh.tp, node)), again, units * priced.expert_share * again * moe_seconds,
                    units * priced.waiting_share * again * moe_seconds)


@dataclass(frozen=True)
class Fit:
    """Fitted multipliers of the terms (``compute_scale``: of the compute priced at the engine's
    efficiency; ``intra_node``, ``inter_node``; ``block_overhead_seconds``), the runs fitted on,
    the outliers left out, and the constants not determined by the runs (kept as they were)."""

    values: dict
    fitted_on: tuple
    outliers: tuple
    undetermined: tuple


def _bounds(compute_efficiency: float) -> list:
    low, high = FITTED_BOUNDS["compute_efficiency"]
    return [(compute_efficiency / high, compute_efficiency / low), FITTED_BOUNDS["intra_node"],
            FITTED_BOUNDS["inter_node"], FITTED_BOUNDS["block_overhead_seconds"],
            FITTED_BOUNDS["pipeline_tp_wait_seconds"], FITTED_BOUNDS["tp_node_wait_seconds"]]


def _minimise(loss, start: np.ndarray, bounds: list, free: list, iterations: int = 600,
              restarts: int = 4) -> np.ndarray:
    """Nelder-Mead over the ``free`` constants, each held inside its bounds (a sine maps the
    whole line onto them); the others stay at ``start``. Started again from its best on a fresh
    simplex up to ``restarts`` times while that improves: a simplex of six constants can
    collapse before it reaches the minimum."""
    x, best = start, loss(start)
    for _ in range(max(restarts, 1)):
        y = _simplex_search(loss, x, bounds, free, iterations)
        value = loss(y)
        if not value < best:
            break
        gain, x, best = best - value, y, value
        if gain <= 1e-9 * best:
            break
    return x


def _simplex_search(loss, start: np.ndarray, bounds: list, free: list, iterations: int) -> np.ndarray:
    """One Nelder-Mead search from ``start`` (:func:`_minimise`)."""
    low = np.array([bounds[j][0] for j in free])
    high = np.array([bounds[j][1] for j in free])

    def unpack(u):
        x = start.copy()
        x[free] = low + (high - low) * (np.sin(u) + 1.0) / 2.0
        return x

    inside = np.clip((start[free] - low) / np.maximum(high - low, 1e-300), 0.0, 1.0)
    u0 = np.arcsin(2.0 * inside - 1.0)
    simplex = [u0] + [u0 + np.eye(len(free))[k] * 0.3 for k in range(len(free))]
    values = [loss(unpack(u)) for u in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[k] for k in order], [values[k] for k in order]
        centre = np.mean(simplex[:-1], axis=0)
        reflected = centre + (centre - simplex[-1])
        r = loss(unpack(reflected))
        if r < values[0]:
            expanded = centre + 2.0 * (centre - simplex[-1])
            e = loss(unpack(expanded))
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < values[-2]:
            simplex[-1], values[-1] = reflected, r
        else:
            contracted = centre + 0.5 * (simplex[-1] - centre)
            c = loss(unpack(contracted))
            if c < values[-1]:
                simplex[-1], values[-1] = contracted, c
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (u - simplex[0]) for u in simplex[1:]]
                values = [values[0]] + [loss(unpack(u)) for u in simplex[1:]]
        if max(values) - min(values) < 1e-12:
            break
    return unpack(simplex[int(np.argmin(values))])


def _steps(terms: list):
    """``steps(p)``: every run's step under constants ``p`` at once (:meth:`RunTerms.step`)."""
    a = np.array([[t.compute, t.tensor[0], t.tensor[1], t.rest[0], t.rest[1], t.units, t.tp_wait, t.fixed,
                   t.units * t.nodes, t.again, t.moe_host, t.moe_wait] for t in terms]).T

    def steps(p):
        device = p[0] * a[0] + p[1] * a[1] + p[2] * a[2] + p[5] * a[8] + a[11]
        host = a[5] * (a[9] * p[3] + p[4] * a[6]) + a[10]
        return np.maximum(device, host) + p[1] * a[3] + p[2] * a[4] + a[7]
    return steps


def _log_loss(terms: list, measured: np.ndarray):
    steps = _steps(terms)

    def loss(p):
        return float(np.mean(np.log(np.maximum(steps(p), 1e-300) / measured) ** 2))
    return loss


def fit_constants(terms: list, measured: np.ndarray, nominal: np.ndarray, bounds: list, names: list) -> Fit:
    """Fit the constants on ``terms`` (one :class:`RunTerms` per run, ``measured`` steps): least
    squares of ``log(modelled / measured)``, then again without the outliers; ``nominal``: the
    values a constant keeps when the runs do not determine it. ``ValueError`` when fewer runs
    than constants to fit, or when the runs cannot tell them apart."""
    n = len(PARAMETERS)
    columns = np.array([[t.compute, t.tensor[0] + t.rest[0], t.tensor[1] + t.rest[1], t.units * t.again,
                         t.units * t.tp_wait, t.units * t.nodes] for t in terms])
    share = columns.sum(axis=0) / max(float(measured.sum()), 1e-300)
    # The host times' terms are counts (blocks x micro-batches), not seconds: determined where any.
    undetermined = tuple(PARAMETERS[j] for j in range(n) if (columns[:, j].sum() <= 0 if j >= 3 else
                                                            share[j] < UNDETERMINED_SHARE))
    free = [j for j in range(n) if PARAMETERS[j] not in undetermined]
    if len(terms) < len(free) + 1:
        raise ValueError(f"{len(terms)} run{'s' if len(terms) != 1 else ''} cannot determine {len(free)} constants: "
                         f"a fit needs at least {len(free) + 1} runs")
    scaled = columns[:, free] / measured[:, None]
    scaled = scaled / np.maximum(np.abs(scaled).max(axis=0), 1e-300)
    if np.linalg.matrix_rank(scaled, tol=1e-6) < len(free):
        raise ValueError("the runs cannot tell the constants apart (their terms are proportional: vary the layouts, "
                         "e.g. runs inside one node and across nodes, with and without tensor parallelism)")
    start = np.array([min(max(v, b[0]), b[1]) for v, b in zip(nominal, bounds)], dtype=np.float64)
    x = _minimise(_log_loss(terms, measured), start, bounds, free)
    ratio = np.log(_steps(terms)(x) / measured)
    mad = float(np.median(np.abs(ratio - np.median(ratio)))) * 1.4826
    out = np.abs(ratio - np.median(ratio)) > max(OUTLIER_MADS * mad, math.log(OUTLIER_FACTOR))
    keep = np.ones(len(terms), dtype=bool)
    if out.any() and (~out).sum() >= len(free) + 1:
        keep = ~out
        x = _minimise(_log_loss([t for t, k in zip(terms, keep) if k], measured[keep]), x, bounds, free)
    return Fit(dict(zip(PARAMETERS, map(float, x))), tuple(nm for nm, k in zip(names, keep) if k),
               tuple(nm for nm, k in zip(names, keep) if not k), undetermined)


def _leave_one_out(terms: list, measured: np.ndarray, fit: Fit, bounds: list, names: list) -> np.ndarray:
    """Each fitted-on run's step predicted by the constants fitted on the other fitted-on runs."""
    x0 = np.array([fit.values[p] for p in PARAMETERS])
    free = [j for j, p in enumerate(PARAMETERS) if p not in fit.undetermined]
    keep = np.array([nm in fit.fitted_on for nm in names])
    out = np.full(len(terms), np.nan)
    for i in np.flatnonzero(keep):
        others = [k for k in np.flatnonzero(keep) if k != i]
        x = _minimise(_log_loss([terms[k] for k in others], measured[others]), x0, bounds, free, iterations=200,
                      restarts=1)
        out[i] = terms[i].step(x)
    return out


def fitted_description(machine: CalibratedMachine, engine, fit: Fit, nominal_efficiency: float, runs: int,
                       loo: dict, source: str) -> dict:
    """The machine's description with its ``fitted`` field."""
    d = machine.describe()
    v = fit.values
    d["fitted"] = {
        "engine": engine.name,
        "compute_efficiency": nominal_efficiency / v["compute_scale"],
        "block_overhead_seconds": v["block_overhead_seconds"],
        "pipeline_tp_wait_seconds": v["pipeline_tp_wait_seconds"],
        "tp_node_wait_seconds": v["tp_node_wait_seconds"],
        "collective_scale": {"intra_node": v["intra_node"], "inter_node": v["inter_node"]},
        "source": source,
        "runs": runs,
        "leave_one_out": loo,
    }
    return d


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate_from_runs` found: the fitted description, the fit, and per run its
    measured step, the step before and after the fit and left out (leave-one-out)."""

    description: dict
    fit: Fit
    names: tuple
    measured: np.ndarray
    before: np.ndarray
    after: np.ndarray
    left_out: np.ndarray
    fits_after: tuple
    #: How each set of steps orders the runs (:func:`pase.planning.run_ranking.rank_runs` over the
    #: groups of one graph, device count and sequence): ``before``, ``after``, ``left_out`` (an
    #: outlier, fitted on by none, predicted by the fit itself).
    ranking: dict


def calibrate_from_runs(runs, machine: CalibratedMachine, engine, source: str) -> Calibration:
    """Fit ``machine`` for ``engine`` on ``runs`` (:func:`pase.planning.measured_runs.read_runs`);
    a machine fitted before is fitted again from its unfitted self."""
    if machine.cost_unit != "seconds":
        raise ValueError("--from-runs fits a machine that prices in seconds (a preset or a machine file), "
                         "not the paper's reference machine")
    before = price_runs(runs, machine, engine)
    unfitted = machine.with_fitted(None)
    base = engine.base_options(unfitted)
    efficiency = base.compute_efficiency
    overheads = {"block_overhead_seconds": 0.0, "pipeline_tp_wait_seconds": 0.0, "tp_node_wait_seconds": 0.0,
                 "moe_block_overhead_seconds": 0.0}
    bare = price_runs(runs, unfitted, engine, overheads)
    names = [p.name for p in bare]
    measured = np.array([p.measured_step for p in bare])
    terms = [run_terms(p, unfitted, base.moe_block_overhead_seconds) for p in bare]
    bounds = _bounds(efficiency)
    nominal = np.array([1.0, 1.0, 1.0, base.block_overhead_seconds, base.pipeline_tp_wait_seconds,
                        base.tp_node_wait_seconds])
    fit = fit_constants(terms, measured, nominal, bounds, names)
    left = _leave_one_out(terms, measured, fit, bounds, names)
    kept = ~np.isnan(left)
    errors = np.abs(left[kept] / measured[kept] - 1.0)
    # Six significant digits: the leave-one-out fits' last bits move with the BLAS's threads,
    # and the file written is the same on every run.
    loo = {"median": float(f"{np.median(errors):.6g}"), "p90": float(f"{np.quantile(errors, 0.9):.6g}")}
    description = fitted_description(unfitted, engine, fit, efficiency, len(runs), loo, source)
    after = price_runs(runs, unfitted.with_fitted(description["fitted"]), engine)
    before_steps, after_steps = np.array([p.step for p in before]), np.array([p.step for p in after])
    ranking = ranking_of(runs, measured, {"before": before_steps, "after": after_steps,
                                          "left_out": np.where(np.isnan(left), after_steps, left)})
    return Calibration(description, fit, tuple(names), measured, before_steps, after_steps, left,
                       tuple(p.fits for p in after), ranking)


def ranking_of(runs, measured: np.ndarray, steps: dict) -> dict:
    """:func:`~pase.planning.run_ranking.rank_runs` of each set of modelled ``steps`` against the
    ``measured`` ones: the runs compete within one graph, device count and sequence, by sequences
    per second per device (their batches may differ)."""
    groups = [(r.graph, r.devices, r.sequence) for r in runs]
    per = np.array([r.batch / r.devices for r in runs], dtype=np.float64)
    return {key: rank_runs(groups, per / measured, per / np.asarray(values, dtype=np.float64))
            for key, values in steps.items()}
