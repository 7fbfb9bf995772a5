"""Device meshes in practitioners' words (``dp x tp x cp``) and the per-layer splits they mean.

A mesh plan is what Megatron-LM and torchtitan run: the batch split ``dp`` ways, attention
heads, MLP columns and the vocabulary ``tp`` ways inside a node (with sequence parallelism for
the point-wise layers between them), the sequence ``cp`` ways. :func:`mesh_configs` maps a
mesh onto every layer from its dimension roles through the parallel rules
(:mod:`pase.planning.rules`); :func:`parse_recipe` reads
``--recipe KEY=VALUE,...``.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from pase.model.roles import roles_of
from pase.planning.rules import ParallelRules, default_rules
from pase.core.checks import arguments, text

__all__ = ["Mesh", "MeshMapper", "Recipe", "parse_recipe", "mesh_config", "mesh_configs", "RECIPE_KEYS",
           "check_offload"]

class ExpertGrid:
    """What a layout with ``dp``, ``tp``, ``ep`` and ``etp`` says of its expert layers (a
    :class:`Mesh`'s, an engine plan's)."""

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree (``--expert-tensor-parallel-size``): ``etp``,
        or ``tp`` when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def folded(self) -> bool:
        """Whether the expert layers have their own parallel grid (Megatron-Core's MoE parallel
        folding): expert parallelism with an expert tensor-parallel degree other than ``tp``, or
        one that does not divide ``dp``."""
        return self.ep > 1 and (self.expert_tp != self.tp or self.dp % self.ep != 0)


@dataclass(frozen=True)
class Mesh(ExpertGrid):
    """Degrees of data, tensor and context parallelism (and pipeline stages, 1 here).

    ``sp``: sequence parallelism for the layers between tensor-parallel products. ``ep``:
    expert parallelism, carved out of data parallelism (Megatron-LM's semantics): a
    mixture-of-experts layer splits its experts ``ep`` ways and the batch ``dp / ep`` ways,
    every other layer is as without it.

    ``etp``: expert tensor parallelism (Megatron-Core's MoE parallel folding,
    ``--expert-tensor-parallel-size``; ``None``: ``tp``). A folded mesh (``etp`` not ``tp``,
    or ``ep`` not dividing ``dp``) gives the expert layers their own grid ``etp x ep x edp =
    tp x cp x dp``: a mixture-of-experts layer splits the batch ``dp`` ways, the sequence
    ``cp x tp / etp`` ways, the expert width ``etp`` ways, then carves ``ep`` out of the batch
    split first and the sequence split after.
    """

    dp: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    sp: bool = True
    ep: int = 1
    etp: int | None = None

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    def as_dict(self) -> dict:
        out = {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp}
        if self.ep > 1:
            out["ep"] = self.ep
        return {**out, "etp": self.expert_tp} if self.folded else out

    def label(self) -> str:
        parts = [f"dp {self.dp}", f"tp {self.tp}"]
        if self.cp > 1:
            parts.append(f"cp {self.cp}")
        if self.ep > 1:
            parts.append(f"ep {self.ep}")
        if self.folded:
            parts.append(f"etp {self.expert_tp}")
        if self.pp > 1:
            parts.append(f"pp {self.pp}")
        if self.tp > 1:
            parts.append("sequence parallel" if self.sp else "no sequence parallel")
        return ", ".join(parts)


def _split(size: int, ways: int, what: str) -> int:
    if size % ways:
        raise ValueError(f"{what} of size {size} does not divide {ways} ways")
    return ways


def mesh_config(layer, mesh: Mesh, name: str = "", rules: ParallelRules | None = None) -> tuple:
    """The configuration of ``layer`` under ``mesh`` (``ValueError`` when it cannot be split so).

    Through ``rules`` (default :func:`pase.planning.rules.default_rules`) keyed by the layer's
    roles: ``dp`` to the batch; ``ep`` to the experts (taken out of the batch's split); ``cp``
    to the sequence; ``tp`` to the first alternative the layer has (key/value groups first,
    then queries per group; a layer of key/value heads only keeps the rest replicated), else
    with sequence parallelism to the sequence; a layer with none of these is replicated ``tp``
    ways.
    """
    rules = rules if rules is not None else default_rules()
    return _config(roles_of(layer), layer.domain, mesh, rules, f"layer {name}" if name else f"{layer.op} layer")


def _config(roles: tuple, dom: tuple, mesh: Mesh, rules: ParallelRules, where: str) -> tuple:
    c = [1] * len(dom)
    b = rules.first(roles, rules.dp)
    if b is None:
        if mesh.dp > 1 or mesh.ep > 1:
            raise ValueError(f"{where}: no dimension has a role data parallelism splits ({', '.join(rules.dp)})")
    else:
        c[b] = _split(dom[b], mesh.dp, f"{where}: the batch")
    x = rules.first(roles, rules.ep)
    if mesh.folded and x is not None:
        return _folded_config(roles, dom, mesh, rules, where, c, b, x)
    if mesh.ep > 1 and x is not None:
        if mesh.dp % mesh.ep:
            raise ValueError(f"{where}: expert parallelism {mesh.ep} does not divide data parallelism {mesh.dp}")
        c[x] = _split(dom[x], mesh.ep, f"{where}: the experts")
        c[b] //= mesh.ep
    s = rules.first(roles, rules.cp)
    if mesh.cp > 1 and s is not None:
        c[s] *= _split(dom[s] // c[s], mesh.cp, f"{where}: the sequence")
    t = mesh.tp
    if t > 1:
        dims = rules.tensor_alternative(roles)
        if dims is not None:
            rest = t
            for i in dims:  # in the rule's order: key/value groups first, then queries per group
                ways = rest if dom[i] >= rest else dom[i]
                if dom[i] % ways or rest % ways:
                    raise ValueError(f"{where}: its {roles[i]} ({dom[i]}) do not split {rest} ways")
                c[i] *= ways
                rest //= ways
                if rest == 1:
                    break
            # A layer of key/value heads only, fewer than tp: each is replicated over the
            # devices of its queries (as Megatron does); anything else must split whole.
            if rest > 1 and not all(roles[i] in rules.tp_partial for i in dims):
                raise ValueError(f"{where}: its {', '.join(roles[i] for i in dims)} do not split {t} ways")
        elif mesh.sp:
            s = rules.first(roles, rules.sp)
            if s is not None:
                c[s] *= _split(dom[s] // c[s], t, f"{where}: the sequence (sequence parallelism)")
    return tuple(c)


def _folded_config(roles: tuple, dom: tuple, mesh: Mesh, rules: ParallelRules, where: str, c: list, b: int,
                   x: int) -> tuple:
    """An expert layer under MoE parallel folding: batch ``dp``, sequence ``cp x tp / etp``
    (sequence parallelism), expert width ``etp``, then ``ep`` taken out of the batch split as
    far as it holds it (``gcd(dp, ep)``) and the rest out of the sequence split."""
    etp = mesh.expert_tp
    if etp < 1 or mesh.tp % etp:
        raise ValueError(f"{where}: expert tensor parallelism {etp} does not divide tensor parallelism {mesh.tp}")
    s = rules.first(roles, rules.cp)
    fold = mesh.cp * (mesh.tp // etp)
    if s is None:
        if fold > 1:
            raise ValueError(f"{where}: no dimension has a role context parallelism splits ({', '.join(rules.cp)})")
    else:
        c[s] *= _split(dom[s] // c[s], fold, f"{where}: the sequence")
    if etp > 1:
        dims = rules.tensor_alternative(roles)
        if not dims:
            raise ValueError(f"{where}: no dimension expert tensor parallelism splits")
        c[dims[0]] *= _split(dom[dims[0]], etp, f"{where}: its {roles[dims[0]]}")
    c[x] = _split(dom[x], mesh.ep, f"{where}: the experts")
    from_batch = math.gcd(c[b], mesh.ep)
    rest = mesh.ep // from_batch
    if rest > 1 and (s is None or c[s] % rest):
        raise ValueError(f"{where}: expert parallelism {mesh.ep} does not divide data x context x tensor / expert "
                         f"tensor parallelism {mesh.dp * fold}")
    c[b] //= from_batch
    if rest > 1:
        c[s] //= rest
    return tuple(c)


def _key(layer) -> tuple:
    """What the mapping reads of a layer: equal keys, equal configurations."""
    return (roles_of(layer), layer.domain)


def mesh_configs(network, mesh: Mesh, rules: ParallelRules | None = None) -> list:
    """One configuration per layer of ``network`` under ``mesh``."""
    return MeshMapper(network, rules).configs(mesh)


class MeshMapper:
    """:func:`mesh_configs` for one network and many meshes: each kind of layer (roles and
    sizes) is mapped once per mesh.

    >>> import graphs
    >>> net = graphs.build("gpt2-small", 8)
    >>> MeshMapper(net).configs(Mesh(2, 2))[3]  # block1.attn.qkv: batch 2 ways, heads 2 ways
    (1, 2, 2, 1, 1, 1)
    """

    def __init__(self, network, rules: ParallelRules | None = None):
        self.rules = rules if rules is not None else default_rules()
        keys: dict = {}
        self.network = network
        self.index = [keys.setdefault(_key(layer), len(keys)) for layer in network.layers]
        self.representative = {}
        for v, k in enumerate(self.index):
            self.representative.setdefault(k, v)

    def kind_configs(self, mesh: Mesh) -> dict:
        """``{kind: configuration}``: each kind of layer (``index``) under ``mesh``."""
        layers, names = self.network.layers, self.network.names
        return {k: mesh_config(layers[v], mesh, names[v], self.rules) for k, v in self.representative.items()}

    def configs(self, mesh: Mesh) -> list:
        mapped = self.kind_configs(mesh)
        return [mapped[k] for k in self.index]

    def tensor_parallel(self) -> bool:
        """Whether the rules give ``tp`` any dimension of this network."""
        return self.rules.tensor_parallel(self.network)

    def sequence_parallel(self, mesh: Mesh) -> list:
        """Per layer, whether sequence parallelism halves its activation collectives: a
        tensor-parallel product (a layer type whose output all-reduce becomes a reduce-scatter,
        ``Layer.product``, split ``tp`` ways over a role of the rules' ``tp``)
        of a mesh with ``sp``. Its all-reduce is a reduce-scatter there (Korthikanti et al. 2022)."""
        if not (mesh.sp and mesh.tp > 1):
            return [False] * len(self.index)
        tensor_roles = set(self.rules.tensor_roles())
        flags = {}
        for k, v in self.representative.items():
            layer = self.network.layers[v]
            config = mesh_config(layer, mesh, rules=self.rules)
            flags[k] = layer.product and any(
                role in tensor_roles and c > 1 for role, c in zip(roles_of(layer), config))
        return [flags[k] for k in self.index]


# ---------------------------------------------------------------------------------------
# Recipes

RECIPE_KEYS = ("dp", "tp", "pp", "cp", "zero", "recompute", "recompute_layers", "recompute_modules", "microbatch", "schedule", "vpp", "sp",
               "tp_overlap", "ep",
               "precision", "scaling", "fp8_gather",
               "stages", "etp", "pipeline_extra", "dispatcher", "ep_overlap", "shared_overlap", "offload")
#: ``precision=``: a number format of ``pase.costing.precision.PRECISIONS``, or ``search`` (the
#: search chooses among the machine's; ``--search-precision``). ``scaling=`` (FP8 only).
PRECISION_WORDS = ("bf16", "fp8", "mxfp8", "nvfp4", "search")
SCALING_WORDS = ("delayed", "current", "rowwise", "blockwise")
#: ``pipeline_extra=``: the embedding and/or the loss counted as pipeline layers
#: (``pase.planning.pipeline.PIPELINE_EXTRAS``; Megatron-LM's ``--account-for-embedding-in-pipeline-split``
#: and ``--account-for-loss-in-pipeline-split``).
PIPELINE_EXTRA_WORDS = ("none", "embedding", "loss", "embedding+loss")
#: ``dispatcher=``: how a mixture of experts moves its tokens
#: (``pase.costing.training.options.MOE_DISPATCHERS``).
DISPATCHER_WORDS = ("alltoall", "allgather", "deepep", "hybridep")
#: The recipe keys that take one word of a list, and their words.
_WORD_KEYS = {"recompute": ("none", "selective", "full", "op", "block"), "schedule": ("1f1b", "interleaved"),
              "precision": PRECISION_WORDS, "scaling": SCALING_WORDS, "pipeline_extra": PIPELINE_EXTRA_WORDS,
              "dispatcher": DISPATCHER_WORDS}
#: ``offload=``: what lives on the host, joined by ``+`` (``optimizer+params``), in this order
#: (``pase.costing.training.options.OFFLOAD_KINDS``), or ``none`` (nothing, and the search
#: tries no offload either).
OFFLOAD_WORDS = ("optimizer", "nvme", "params", "activations")
#: ``recompute_modules=``: what ``recompute=selective`` recomputes, joined by ``+``
#: (``pase.costing.training.options.RECOMPUTE_MODULES``; Megatron-Core's ``--recompute-modules``).
RECOMPUTE_MODULE_WORDS = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


@dataclass(frozen=True)
class Recipe:
    """Fixed choices of a training configuration; ``None`` means searched."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    zero: int | None = None
    recompute: str | None = None
    #: With ``recompute=block``: the blocks each pipeline chunk recomputes (Megatron's
    #: ``--recompute-num-layers``); ``None``: searched, the smallest count that fits.
    recompute_layers: int | None = None
    #: With ``recompute=selective``: what it recomputes (:data:`RECOMPUTE_MODULE_WORDS` in order;
    #: Megatron's ``--recompute-modules``); ``None``: Megatron's default, ``core_attn``.
    recompute_modules: tuple | None = None
    microbatch: int | None = None
    schedule: str | None = None
    vpp: int | None = None
    sp: bool | None = None
    #: Megatron's ``--tp-comm-overlap`` (activation collectives hidden behind their GEMMs);
    #: it needs sequence parallelism, so ``tp_overlap=true`` fixes ``sp`` on where ``tp > 1``.
    tp_overlap: bool | None = None
    ep: int | None = None
    #: Number format of the blocks' weight products (``None``: bf16, not searched; ``search``:
    #: chosen among the machine's), FP8 scaling, FP8 parameter all-gathers.
    precision: str | None = None
    scaling: str | None = None
    fp8_gather: bool | None = None
    #: Blocks per pipeline stage, first to last (``stages=19/21/21/19``): fixes ``pp`` and the cut.
    stages: tuple | None = None
    #: Expert tensor parallelism (Megatron-Core's ``--expert-tensor-parallel-size``; ``None``:
    #: ``tp`` where ``ep`` divides ``dp``, else 1): MoE parallel folding where it is not ``tp``.
    etp: int | None = None
    #: The embedding and/or the loss counted as pipeline layers (:data:`PIPELINE_EXTRA_WORDS`):
    #: the cut is Megatron's even split of blocks and these (``pase.planning.pipeline.unit_split``)
    #: unless ``stages`` gives one, and interleaved chunks count them.
    pipeline_extra: str | None = None
    #: The mixture of experts' token dispatcher (:data:`DISPATCHER_WORDS`; ``None``: the engine's),
    #: the expert all-to-alls overlapped across micro-batches (Megatron-Core's
    #: ``--overlap-moe-expert-parallel-comm``) and the shared experts' overlap with them
    #: (``--moe-shared-expert-overlap``).
    dispatcher: str | None = None
    ep_overlap: bool | None = None
    shared_overlap: bool | None = None
    #: What lives on the host (:data:`OFFLOAD_WORDS` in order; ``()``: ``offload=none``, nothing
    #: and not searched; ``None``: the search tries offload where nothing fits without it).
    offload: tuple | None = None

    def fixed(self) -> dict:
        return {k: getattr(self, k) for k in RECIPE_KEYS if getattr(self, k) is not None}

    def text(self) -> str:
        def word(k, v):
            if k in ("offload", "recompute_modules"):
                return "+".join(v) or "none"
            return str(v).lower() if isinstance(v, bool) else "/".join(map(str, v)) if isinstance(v, tuple) else v

        return ",".join(f"{k}={word(k, v)}" for k, v in self.fixed().items())

    def check(self, procs: int) -> None:
        """``ValueError`` when the fixed degrees cannot multiply to ``procs``."""
        degrees = [getattr(self, k) for k in ("dp", "tp", "pp", "cp")]
        product = int(np.prod([d for d in degrees if d is not None]))
        if all(d is not None for d in degrees) and product != procs:
            raise ValueError(f"recipe dp x tp x pp x cp = {product}, not the {procs} devices of -p")
        if procs % product:
            raise ValueError(f"recipe degrees multiply to {product}, which does not divide the {procs} devices of -p")
        if self.stages is not None and self.pp is not None and len(self.stages) != self.pp:
            raise ValueError(f"recipe stages has {len(self.stages)} stages, and pp={self.pp}")
        if self.recompute_layers is not None and self.recompute != "block":
            raise ValueError("recipe recompute_layers applies to recompute=block (Megatron's --recompute-num-layers): "
                             "add recompute=block")
        if self.recompute_modules is not None and self.recompute != "selective":
            raise ValueError("recipe recompute_modules applies to recompute=selective (Megatron's --recompute-modules "
                             "under --recompute-granularity selective): add recompute=selective")
        _check_experts(self.fixed())
        check_offload(self.fixed())
        if self.pipeline_extra not in (None, "none") and self.pp == 1:
            raise ValueError(f"recipe pipeline_extra={self.pipeline_extra} describes a pipeline, and the recipe has pp=1")
        if self.etp is not None and (self.ep is None or self.ep == 1) and self.etp != self.tp:
            raise ValueError(f"recipe etp={self.etp} needs ep > 1: expert tensor parallelism is modelled with "
                             "expert parallelism (MoE parallel folding)")
        if self.etp is not None and self.tp is not None and self.tp % self.etp:
            raise ValueError(f"recipe etp={self.etp} must divide tp={self.tp} (Megatron's MoE parallel folding)")
        if self.ep is not None and self.ep > 1 and None not in (self.dp, self.tp, self.cp):
            etp = self.etp if self.etp is not None else self.tp if self.dp % self.ep == 0 else 1
            if (self.dp * self.cp * self.tp) % (self.ep * etp):
                raise ValueError(f"recipe ep={self.ep} x etp={etp} must divide dp={self.dp} x cp={self.cp} x "
                                 f"tp={self.tp} (Megatron's MoE parallel folding: etp x ep x edp = tp x cp x dp)")
            if etp < self.tp and self.sp is False:
                raise ValueError(f"recipe etp={etp} < tp={self.tp} needs sequence parallelism (Megatron's MoE "
                                 "parallel folding does): drop sp=false")


def _check_experts(values: dict) -> None:
    """The combinations of the experts' keys Megatron-Core refuses (megatron-core 0.16.1
    transformer_config.py: the EP overlap needs the alltoall or flex dispatcher, :1866-1869, no
    full recomputation, :1871-1879, and no shared-expert overlap, :1886-1888; the shared-expert
    overlap needs the alltoall dispatcher, :1090-1095; the flex dispatcher refuses it,
    token_dispatcher.py:1371-1374)."""
    if values.get("ep_overlap"):
        if values.get("dispatcher") == "allgather":
            raise ValueError("recipe ep_overlap=true needs the alltoall, deepep or hybridep dispatcher "
                             "(Megatron-Core refuses --overlap-moe-expert-parallel-comm with allgather)")
        if values.get("recompute") in ("full", "block"):
            raise ValueError("recipe ep_overlap=true runs without full recomputation (Megatron-Core refuses "
                             "--overlap-moe-expert-parallel-comm with --recompute-granularity full)")
        if values.get("shared_overlap"):
            raise ValueError("recipe ep_overlap=true and shared_overlap=true: Megatron-Core runs one of them")
        if values.get("schedule") == "1f1b" and values.get("pp", 2) > 1:
            raise ValueError("recipe ep_overlap=true with a pipeline needs schedule=interleaved (Megatron-Core: "
                             "\"virtual pipeline must be set\" for --overlap-moe-expert-parallel-comm)")
    if values.get("shared_overlap") and values.get("dispatcher") not in (None, "alltoall"):
        raise ValueError("recipe shared_overlap=true needs the alltoall dispatcher (Megatron-Core's flex and "
                         "allgather dispatchers refuse --moe-shared-expert-overlap)")


def check_offload(values: dict) -> None:
    """The offload combinations PaSE prices (``pase.costing.training.offload``): ``params`` with
    ZeRO-3 only (DeepSpeed's ``offload_param`` is stage 3 only, DS offload_config.py:21-28),
    ``activations`` without a pipeline or recomputation (Megatron-Core's constraint,
    transformer_config.py:1137-1152), no offload on a pipeline (not priced there)."""
    kinds = values.get("offload") or ()
    if "params" in kinds and values.get("zero", 3) != 3:
        raise ValueError(f"recipe offload=params keeps ZeRO-3's parameter shards on the host: it needs zero=3, "
                         f"got zero={values['zero']}")
    if "activations" in kinds and values.get("recompute", "none") != "none":
        raise ValueError("recipe offload=activations runs without recomputation (Megatron-Core refuses "
                         "activation offloading with recompute): drop recompute or the offload")
    if kinds and values.get("pp", 1) > 1:
        raise ValueError("recipe offload with pp > 1: offload is priced without a pipeline (Megatron-Core "
                         "refuses activation offloading with pipeline parallelism); use pp=1")


def _joined_words(key: str, value: str, words: tuple, choices: str, item: str) -> list:
    """``value``'s words joined by ``+``, each one of ``words`` (``choices`` says which) and
    each once; ``ValueError`` naming ``key`` else."""
    given = value.split("+")
    if any(w not in words for w in given):
        raise ValueError(f"recipe {key} must be {choices} joined by +, got {value!r}"[:200])
    if len(set(given)) != len(given):
        raise ValueError(f"recipe {key} names {item} twice: {value!r}"[:200])
    return given


def _recompute_modules(value: str) -> tuple:
    """``recompute_modules=``'s words: modules joined by ``+``, each once, in canonical order."""
    words = _joined_words("recompute_modules", value, RECOMPUTE_MODULE_WORDS, ", ".join(RECOMPUTE_MODULE_WORDS),
                          "a module")
    return tuple(w for w in RECOMPUTE_MODULE_WORDS if w in words)


def _offload(value: str) -> tuple:
    """``offload=``'s words: ``none`` or kinds joined by ``+``, each once, in canonical order."""
    if value == "none":
        return ()
    words = _joined_words("offload", value, OFFLOAD_WORDS, "none or " + ", ".join(OFFLOAD_WORDS), "a kind")
    if "optimizer" in words and "nvme" in words:
        raise ValueError("recipe offload=optimizer+nvme: the optimizer state is on the host (optimizer) or on its "
                         "drive (nvme), not both")
    return tuple(w for w in OFFLOAD_WORDS if w in words)


def _positive(key: str, value: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < 1 or len(value) > 9:
        raise ValueError(f"recipe {key} must be a positive integer, got {value!r}")
    return int(value)


@arguments(text=text)
def parse_recipe(text: str) -> Recipe:
    """``KEY=VALUE,...`` with keys ``dp tp pp cp zero recompute recompute_layers recompute_modules microbatch
    schedule vpp sp tp_overlap ep precision scaling fp8_gather stages etp pipeline_extra
    dispatcher ep_overlap shared_overlap offload`` (``stages``: blocks per pipeline stage, ``A/B/...``;
    ``recompute_layers``: with ``recompute=block`` only; ``recompute_modules``: with
    ``recompute=selective`` only, ``core_attn``, ``moe_act``, ``layernorm``, ``mla_up_proj``, ``mlp``, ``moe``,
    ``shared_experts`` joined by ``+``; ``pipeline_extra``: ``none``,
    ``embedding``, ``loss`` or ``embedding+loss``, counted as pipeline layers; ``dispatcher``:
    ``alltoall``, ``allgather``, ``deepep`` or ``hybridep``; ``offload``: ``none`` or
    ``optimizer``, ``nvme``, ``params``, ``activations`` joined by ``+``).

    >>> parse_recipe("dp=32,tp=8,zero=3,recompute=full,microbatch=16").fixed()
    {'dp': 32, 'tp': 8, 'zero': 3, 'recompute': 'full', 'microbatch': 16}
    >>> parse_recipe("tp=3x")
    Traceback (most recent call last):
    ...
    ValueError: recipe tp must be a positive integer, got '3x'
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a recipe is KEY=VALUE,... with keys " + ", ".join(RECIPE_KEYS))
    values: dict = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"recipe item {item.strip()!r} is not KEY=VALUE (keys: {', '.join(RECIPE_KEYS)})")
        if key not in RECIPE_KEYS:
            raise ValueError(f"unknown recipe key {key!r} (keys: {', '.join(RECIPE_KEYS)})")
        if key in values:
            raise ValueError(f"recipe key {key!r} is given twice")
        if key in ("dp", "tp", "pp", "cp", "microbatch", "vpp", "ep", "etp", "recompute_layers"):
            values[key] = _positive(key, value)
        elif key == "zero":
            if value not in ("0", "1", "2", "3"):
                raise ValueError(f"recipe zero must be 0, 1, 2 or 3, got {value!r}")
            values[key] = int(value)
        elif key in _WORD_KEYS:
            words = _WORD_KEYS[key]
            if value not in words:
                raise ValueError(f"recipe {key} must be {', '.join(words[:-1])} or {words[-1]}, got {value!r}")
            values[key] = value
        elif key == "stages":
            parts = value.split("/")
            if len(parts) < 2 or len(parts) > 4096:
                raise ValueError(f"recipe stages must be two or more block counts A/B/..., got {value!r}")
            values[key] = tuple(_positive(key, part) for part in parts)
        elif key == "offload":
            values[key] = _offload(value)
        elif key == "recompute_modules":
            values[key] = _recompute_modules(value)
        elif key in ("sp", "tp_overlap", "fp8_gather", "ep_overlap", "shared_overlap"):
            if value not in ("true", "false", "on", "off", "1", "0"):
                raise ValueError(f"recipe {key} must be true or false, got {value!r}")
            values[key] = value in ("true", "on", "1")
        else:
            raise AssertionError(f"recipe key {key!r} has no reader")  # every RECIPE_KEYS entry has one
    if "recompute_layers" in values and values.get("recompute") != "block":
        raise ValueError("recipe recompute_layers applies to recompute=block (Megatron's --recompute-num-layers): "
                         "add recompute=block")
    if "recompute_modules" in values and values.get("recompute") != "selective":
        raise ValueError("recipe recompute_modules applies to recompute=selective (Megatron's --recompute-modules "
                         "under --recompute-granularity selective): add recompute=selective")
    if "scaling" in values and values.get("precision") not in ("fp8", "search"):
        raise ValueError("recipe scaling applies to precision=fp8 (MXFP8 and NVFP4 scale per block): add precision=fp8")
    if values.get("tp_overlap") and values.get("sp") is False:
        raise ValueError("recipe tp_overlap=true needs sequence parallelism (Megatron's --tp-comm-overlap does): "
                         "drop sp=false")
    _check_experts(values)
    check_offload(values)
    if "stages" in values:
        pp = values.setdefault("pp", len(values["stages"]))
        if pp != len(values["stages"]):
            raise ValueError(f"recipe stages has {len(values['stages'])} stages, and pp={pp}")
    return Recipe(**values)
