"""Engine profiles: what a training engine runs that is not a plan choice (docs/engines.md).

A profile is data, one JSON file per engine (``pase/planning/engines/NAME.json``), read by
:func:`load_engine` alone: which kernels are fused or eager (norms, rotary, activation, the
loss and its fp32 buffers), the gradient's and the reduction's element types, bucket and wrap
units, which overlaps exist, the names of its recomputation policies, the optimizer's
temporaries, the allocator's behaviour. Every fact carries its source (a file of the engine's
repository or its docs). ``--engine NAME[,KEY=VALUE...]`` picks one and switches keys (a
switch the profile names, such as ``torchtitan,compile=true``, or any scalar fact; a switch may
also change the ``runs`` section, as ``torchtitan,version=0.2`` does), ``--engine FILE.json``
reads a profile of one's own in the same format.

:meth:`EngineProfile.training_options` gives the :class:`TrainingOptions` fields it implies;
:meth:`EngineProfile.searched` the choices the search may try where the engine has them
(``tp_overlap`` where the engine overlaps tensor-parallel communication). The ``runs`` section
(what configurations the engine runs) is kept as read, for the engine-shaped search.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from types import MappingProxyType

from pase.costing.training import TrainingOptions
from pase.costing.training.allocator import ALLOCATOR_RETRY_SECONDS
from pase.costing.training.options import EXPERT_GEMMS, MOE_DISPATCHERS, RECOMPUTE_MODULES, TP_OVERLAP_KINDS
from pase.model.layers.moe import EXPERT_ACTIVATIONS
from pase.planning.engine_cut import PIPELINE_CUTS

__all__ = ["EngineProfile", "load_engine", "ENGINE_NAMES", "DEFAULT_ENGINE", "DTYPE_BYTES", "FACTS", "engine_dir",
           "STEP_COMPUTE_EFFICIENCY", "band_of", "BAND_FLOOR"]

#: The engine a plan assumes when none is named (docs/engines.md).
DEFAULT_ENGINE = "megatron"
#: What a kernel inside a training step reaches of the same kernel measured alone, beyond the
#: clock the machine sustains (``clock_ratio``): one global constant, the same for every engine,
#: fitted by ``benchmarks/fit_constants.py`` on the visible published rows (docs/calibration.md).
STEP_COMPUTE_EFFICIENCY = 0.84
#: Bytes of the element types a profile names.
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}

_KERNEL = ("fused", "eager")
#: Every fact a profile states, with the values it may take: a tuple of words, ``bool``, or
#: ``float`` (a non-negative number), ``list`` (of recomputation policy names), ``str``.
FACTS = {
    "norm_kernel": _KERNEL,
    "rotary_kernel": _KERNEL,
    "activation_kernel": _KERNEL,
    "cross_entropy": _KERNEL,
    "loss_buffers": float,
    "param_dtype": tuple(DTYPE_BYTES),
    "grad_dtype": tuple(DTYPE_BYTES),
    "lp_grad_kept": bool,
    "grad_reduce_dtype": tuple(DTYPE_BYTES),
    "param_gather_dtype": tuple(DTYPE_BYTES),
    "bucket_elements": float,
    "wrap_unit": ("layer", "block", "prefetch"),
    "prefetch_units": float,
    "overlap_grad_reduce": bool,
    "overlap_param_gather": bool,
    "tp_comm_overlap": bool,
    "pp_p2p_overlap": bool,
    "pp_send_split": bool,
    "recompute_policies": list,
    "recompute_modules": list,
    "optimizer": str,
    "optimizer_temp_bytes": float,
    "optimizer_master_bytes": float,
    "comm_sm_share": float,
    "comm_buffer_bytes": float,
    "tp_overlap_gather_buffers": float,
    "tp_overlap_scatter_buffers": float,
    "allocator_fragmentation": float,
    "allocator_interleave": float,
    "allocator_retry_seconds": float,
    "memory_reported": ("allocated", "reserved", "device"),
    "launch_seconds": float,
    "activation_grads": bool,
    "attention_efficiency": float,
    "attention_kernel": ("sdpa", "cudnn_fused", "unfused"),
    "zero1_gradient_collective": ("reduce_scatter", "all_reduce"),
    "overlap_grad_reduce_zero1": bool,
    "block_overhead_seconds": float,
    "moe_block_overhead_seconds": float,
    "expert_activation_sync": ("none",) + EXPERT_ACTIVATIONS,
    "chunk_overhead_seconds": float,
    "pipeline_tp_wait_seconds": float,
    "moe_dispatcher": MOE_DISPATCHERS,
    "expert_gemm": EXPERT_GEMMS,
    "tp_overlap_kind": TP_OVERLAP_KINDS,
    "pipeline_cut": PIPELINE_CUTS,
}
#: Facts a profile may leave out, with the value it then has: a profile written before the fact
#: existed stays valid.
OPTIONAL_FACTS = {"attention_kernel": "sdpa", "zero1_gradient_collective": "reduce_scatter",
                  "overlap_grad_reduce_zero1": True, "block_overhead_seconds": 0.0, "chunk_overhead_seconds": 0.0,
                  "moe_block_overhead_seconds": 0.0, "expert_activation_sync": "none",
                  "pipeline_tp_wait_seconds": 0.0, "moe_dispatcher": "alltoall", "expert_gemm": "grouped",
                  "tp_overlap_kind": "userbuffers", "allocator_interleave": 0.0,
                  "allocator_retry_seconds": ALLOCATOR_RETRY_SECONDS,
                  "tp_overlap_gather_buffers": 0.0, "tp_overlap_scatter_buffers": 0.0,
                  "optimizer_master_bytes": 4.0, "lp_grad_kept": False, "pp_send_split": False,
                  "pipeline_cut": "search", "recompute_modules": ("core_attn",)}
_POLICIES = ("none", "selective", "full", "op", "block")


def engine_dir() -> str:
    """The folder of the shipped profiles."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "engines")


def _shipped() -> tuple:
    return tuple(sorted(f[:-5] for f in os.listdir(engine_dir()) if f.endswith(".json")))


ENGINE_NAMES = _shipped()


def _check_value(name: str, value, where: str):
    kind = FACTS[name]
    if isinstance(kind, tuple):
        if value not in kind:
            raise ValueError(f"{where}: {name} must be one of {', '.join(kind)}, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {name} must be true or false, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {name} must be a non-negative number, got {value!r}")
        if name in ("comm_sm_share", "allocator_fragmentation", "allocator_interleave") and value >= 1:
            raise ValueError(f"{where}: {name} must be below 1, got {value!r}")
        if name == "attention_efficiency" and not 0 < value <= 1:
            raise ValueError(f"{where}: {name} must be in (0, 1] (a fraction of the device's peak), got {value!r}")
        return float(value)
    if kind is list:
        words = RECOMPUTE_MODULES if name == "recompute_modules" else _POLICIES
        if not isinstance(value, (list, tuple)) or not value or any(p not in words for p in value):
            raise ValueError(f"{where}: {name} must be a non-empty list of {', '.join(words)}, got {value!r}")
        return tuple(value)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {name} must be a string, got {value!r}")
    return value


def _parse_word(name: str, text: str):
    """A ``KEY=VALUE`` value in the type of fact ``name``."""
    kind = FACTS[name]
    if kind is bool:
        if text not in ("true", "false", "on", "off", "1", "0"):
            raise ValueError(f"engine key {name} must be true or false, got {text!r}")
        return text in ("true", "on", "1")
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"engine key {name} must be a number, got {text!r}") from None
    if kind is list:
        return text.split("+")
    return text


@dataclass(frozen=True)
class EngineProfile:
    """One engine's facts (``facts``: name to value; ``sources``: name to where it is stated),
    its switches as set (``settings``), its ``runs`` section as read."""

    name: str
    title: str
    facts: MappingProxyType
    sources: MappingProxyType
    settings: tuple = ()
    path: str | None = None
    runs: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    switches: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    #: ``{"step": (low, high), "memory": (low, high)}``: published over modelled, the spread
    #: over the visible published rows (:func:`band_of`); empty when the profile states none.
    band: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __getitem__(self, key: str):
        return self.facts[key]

    def label(self) -> str:
        """``name`` and its switches as given, e.g. ``torchtitan,compile=true``."""
        return ",".join([self.name] + [f"{k}={v}" for k, v in self.settings])

    def attention_efficiency(self, machine=None) -> float:
        """The fused attention kernel's fraction of peak: the machine's own measured figure
        (``pase calibrate`` times PyTorch's ``scaled_dot_product_attention``) where this engine
        runs that kernel (``attention_kernel`` ``sdpa``) and the user set no
        ``attention_efficiency`` switch; else the profile's (docs/engines.md, "Attention: the
        engine's figure or the machine's")."""
        own = self.facts["attention_efficiency"]
        measured = None if machine is None else machine.attention_efficiency
        if (measured is None or self.facts["attention_kernel"] != "sdpa"
                or "attention_efficiency" in dict(self.settings)):
            return own
        return float(measured)

    def training_options(self, machine=None) -> dict:
        """The :class:`TrainingOptions` fields this engine implies (on ``machine``, where given:
        its measured attention figure, :meth:`attention_efficiency`)."""
        f = self.facts
        return {
            "engine": self.label(),
            "eager": f["norm_kernel"] == "eager",
            "loss_buffers": f["loss_buffers"],
            # The stored parameter, and the optimizer's state: the two fp32 moments, and a
            # master copy where the parameter is kept in lower precision (``optimizer_master_bytes``:
            # fp32, 4; Apex's distributed Adam keeps the 16 bits a BF16 parameter lacks, 2).
            "weight_bytes": DTYPE_BYTES[f["param_dtype"]],
            "optimizer_bytes": 8.0 + (f["optimizer_master_bytes"] if f["param_dtype"] != "fp32" else 0.0),
            # A higher-precision gradient buffer beside the parameters' own ``.grad``, which
            # the engine keeps allocated until the step (``lp_grad_kept``: DeepSpeed's
            # BF16_Optimizer zeroes the bf16 gradients rather than freeing them).
            "grad_bytes": DTYPE_BYTES[f["grad_dtype"]] + (
                DTYPE_BYTES[f["param_dtype"]] if f["lp_grad_kept"] and f["grad_dtype"] != f["param_dtype"] else 0.0),
            "grad_reduce_bytes": DTYPE_BYTES[f["grad_reduce_dtype"]],
            "gather_bytes": DTYPE_BYTES[f["param_gather_dtype"]],
            "bucket_elements": f["bucket_elements"],
            "wrap_unit": f["wrap_unit"],
            "overlap": bool(f["overlap_grad_reduce"]),
            "p2p_overlap": bool(f["pp_p2p_overlap"]),
            "p2p_split": bool(f["pp_send_split"]),
            "launch_seconds": f["launch_seconds"],
            "optimizer_temp_bytes": f["optimizer_temp_bytes"],
            "comm_sm_share": f["comm_sm_share"],
            "comm_buffer_bytes": f["comm_buffer_bytes"],
            "tp_gather_buffers": f["tp_overlap_gather_buffers"],
            "tp_scatter_buffers": f["tp_overlap_scatter_buffers"],
            "fragmentation": f["allocator_fragmentation"],
            "interleave_fragmentation": f["allocator_interleave"],
            "retry_seconds": f["allocator_retry_seconds"],
            "activation_grads": bool(f["activation_grads"]),
            "compute_efficiency": STEP_COMPUTE_EFFICIENCY,
            "attention_efficiency": self.attention_efficiency(machine),
            "attention_shape": True,
            # Attention as separate kernels (scores, softmax, dropout, context; the scores held
            # for the backward pass) where the engine has no fused attention kernel.
            "fused_attention": f["attention_kernel"] != "unfused",
            "moe_dispatcher": f["moe_dispatcher"],
            "expert_gemm": f["expert_gemm"],
            "tp_overlap_kind": f["tp_overlap_kind"],
            "pipeline_cut": f["pipeline_cut"],
            "zero1_reduce": f["zero1_gradient_collective"],
            "zero1_overlap": bool(f["overlap_grad_reduce_zero1"]),
            "block_overhead_seconds": f["block_overhead_seconds"],
            "moe_block_overhead_seconds": f["moe_block_overhead_seconds"],
            "expert_activation_sync": f["expert_activation_sync"],
            "chunk_overhead_seconds": f["chunk_overhead_seconds"],
            "pipeline_tp_wait_seconds": f["pipeline_tp_wait_seconds"],
            **self.fitted_options(machine),
        }

    def fitted_options(self, machine=None) -> dict:
        """The options a machine fitted on this engine's runs replaces (``pase calibrate
        --from-runs``: its ``fitted`` in-step compute efficiency, host time per block and
        tensor parallelism's wait across nodes), or none: a fit on another engine's runs says
        nothing of this one's kernels."""
        fitted = None if machine is None else machine.fitted
        if not fitted or fitted.get("engine") != self.name:
            return {}
        return {key: fitted[key] for key in ("compute_efficiency", "block_overhead_seconds",
                                             "pipeline_tp_wait_seconds", "tp_node_wait_seconds") if key in fitted}

    def base_options(self, machine=None, **changes) -> TrainingOptions:
        """:class:`TrainingOptions` of this engine on ``machine`` (``changes`` on top)."""
        return TrainingOptions(**{**self.training_options(machine), **changes})

    def searched(self) -> dict:
        """Choices the search tries where the engine has them: ``tp_overlap`` (both ways when
        the engine overlaps tensor-parallel communication, else off) and the recomputation
        policies it names."""
        return {
            "tp_overlap": (False, True) if self.facts["tp_comm_overlap"] else (False,),
            "recompute": tuple(self.facts["recompute_policies"]),
        }

    def as_dict(self) -> dict:
        """The profile as JSON data: name, label, facts with sources."""
        return {"name": self.name, "label": self.label(), "title": self.title,
                "facts": {k: {"value": list(v) if isinstance(v, tuple) else v, "source": self.sources[k]}
                          for k, v in self.facts.items()}}


#: The narrowest band stated, as a fraction either side of the modelled value: the step's and
#: the memory's (published rows of memory are few; the issue's target for memory is 10 %).
BAND_FLOOR = {"step": 0.05, "memory": 0.10}


def band_of(profile: "EngineProfile", what: str) -> tuple:
    """``(low, high)`` multipliers of the modelled step (``what`` ``step``) or peak memory
    (``memory``): the profile's ``band`` (the spread of published / modelled over the visible
    rows, ``benchmarks/published.py --write-bands``), never narrower than :data:`BAND_FLOOR`
    either side; a profile without one gets the widest band of the shipped engines."""
    stated = profile.band.get(what)
    if stated is None:
        shipped = [load_engine(name).band.get(what) for name in ENGINE_NAMES]
        shipped = [b for b in shipped if b is not None]
        stated = (min(b[0] for b in shipped), max(b[1] for b in shipped)) if shipped else (1.0, 1.0)
    floor = BAND_FLOOR[what]
    return (min(float(stated[0]), 1.0 - floor), max(float(stated[1]), 1.0 + floor))


def _read(path: str, where: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise ValueError(f"{where}: cannot read it ({err.strerror or err})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: an engine profile is a JSON object")
    return data


def _profile(data: dict, where: str, path: str | None) -> EngineProfile:
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: 'name' must be a non-empty string")
    facts_in = data.get("facts")
    if not isinstance(facts_in, dict):
        raise ValueError(f"{where}: 'facts' must be an object of {{'value': ..., 'source': ...}}")
    unknown = sorted(set(facts_in) - set(FACTS))
    if unknown:
        raise ValueError(f"{where}: unknown fact {unknown[0]!r} (facts: {', '.join(FACTS)})")
    missing = [k for k in FACTS if k not in facts_in and k not in OPTIONAL_FACTS]
    if missing:
        raise ValueError(f"{where}: fact {missing[0]!r} missing")
    facts, sources = {}, {}
    for key in FACTS:
        entry = facts_in.get(key, {"value": OPTIONAL_FACTS.get(key), "source": "not stated: the default"})
        if not isinstance(entry, dict) or "value" not in entry:
            raise ValueError(f"{where}: fact {key!r} must be {{'value': ..., 'source': ...}}")
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{where}: fact {key!r} has no source")
        facts[key] = _check_value(key, entry["value"], where)
        sources[key] = source
    switches = data.get("switches", {})
    if not isinstance(switches, dict):
        raise ValueError(f"{where}: 'switches' must be an object")
    for key, table in switches.items():
        if not isinstance(table, dict) or not all(isinstance(v, dict) for k, v in table.items() if k != "source"):
            raise ValueError(f"{where}: switch {key!r} must map each value to an object of facts")
        for value, changes in table.items():
            if value == "source":
                continue
            for fact, v in changes.items():
                if fact == "runs":
                    if not isinstance(v, dict):
                        raise ValueError(f"{where}: switch {key}={value}: 'runs' must be an object")
                    continue
                if fact not in FACTS:
                    raise ValueError(f"{where}: switch {key}={value} sets unknown fact {fact!r}")
                _check_value(fact, v, where)
    runs = data.get("runs", {})
    if not isinstance(runs, dict):
        raise ValueError(f"{where}: 'runs' must be an object")
    title = data.get("title", name)
    band = data.get("band", {})
    if not isinstance(band, dict):
        raise ValueError(f"{where}: 'band' must be an object")
    bands = {}
    for key in ("step", "memory"):
        if key in band:
            v = band[key]
            if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                                   and 0 < x < 10 for x in v) or v[0] > v[1]):
                raise ValueError(f"{where}: band {key} must be [low, high] with 0 < low <= high < 10")
            bands[key] = (float(v[0]), float(v[1]))
    return EngineProfile(name, str(title), MappingProxyType(facts), MappingProxyType(sources), (), path,
                         MappingProxyType(runs), MappingProxyType(switches), MappingProxyType(bands))


def _merged_runs(runs, changes: dict) -> MappingProxyType:
    """``runs`` with a switch's ``runs`` changes: each key replaced, but ``why`` and ``export``
    (tables of their own) merged key by key."""
    merged = dict(runs)
    for key, value in changes.items():
        if key in ("why", "export") and isinstance(value, dict):
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    return MappingProxyType(merged)


def _switch(profile: EngineProfile, key: str, value: str) -> EngineProfile:
    switches = profile.switches
    facts, sources = dict(profile.facts), dict(profile.sources)
    runs = profile.runs
    if key in switches:
        table = switches[key]
        values = [v for v in table if v != "source"]
        if value not in values:
            raise ValueError(f"engine {profile.name}: {key} must be one of {', '.join(values)}, got {value!r}")
        for fact, v in table[value].items():
            if fact == "runs":
                runs = _merged_runs(runs, v)
                continue
            facts[fact] = _check_value(fact, v, f"engine {profile.name}")
            sources[fact] = f"switch {key}={value}: {table.get('source', '')}"
    elif key in FACTS:
        facts[key] = _check_value(key, _parse_word(key, value), f"engine {profile.name}")
        sources[key] = f"set on the command line ({key}={value})"
    else:
        names = sorted(switches) + list(FACTS)
        raise ValueError(f"engine {profile.name} has no key {key!r} (keys: {', '.join(names)})")
    return EngineProfile(profile.name, profile.title, MappingProxyType(facts), MappingProxyType(sources),
                         profile.settings + ((key, value),), profile.path, runs, switches, profile.band)


def load_engine(spec: str | None = None) -> EngineProfile:
    """The profile ``spec`` names: ``NAME[,KEY=VALUE...]`` (a shipped engine, :data:`ENGINE_NAMES`)
    or ``FILE.json[,KEY=VALUE...]``; ``None``: :data:`DEFAULT_ENGINE`. ``ValueError`` with one
    line on anything else.

    >>> load_engine("torchtitan,compile=true").label()
    'torchtitan,compile=true'
    >>> load_engine("megatron")["grad_reduce_dtype"]
    'fp32'
    """
    if spec is None:
        spec = DEFAULT_ENGINE
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"an engine is NAME[,KEY=VALUE...] or FILE.json (names: {', '.join(ENGINE_NAMES)})")
    head, *items = [part.strip() for part in spec.split(",")]
    if head.endswith(".json") or os.sep in head:
        profile = _profile(_read(head, f"engine profile {head}"), f"engine profile {head}", head)
    elif head in ENGINE_NAMES:
        path = os.path.join(engine_dir(), head + ".json")
        profile = _profile(_read(path, f"engine {head}"), f"engine {head}", None)
    else:
        raise ValueError(f"unknown engine {head!r} (engines: {', '.join(ENGINE_NAMES)}; or a profile FILE.json)")
    seen = set()
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"engine item {item!r} is not KEY=VALUE")
        if key in seen:
            raise ValueError(f"engine key {key!r} is given twice")
        seen.add(key)
        profile = _switch(profile, key, value)
    return profile
