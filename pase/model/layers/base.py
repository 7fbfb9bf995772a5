"""What every layer type shares: the ``Layer`` base class, its registry by ``op`` name, the
cost pieces several families use and the checks of their arguments.

Each family module of this package defines its layer classes; a class with its own ``op``
registers itself here when it is defined (see ``docs/cost-model.md``).
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from pase.core.checks import is_int, is_positive_int
from pase.machines.base import Group, layout_strides
from pase.model.roles import check_roles
from pase.model.tensor import Tensor
from .work import AllReduce, Gemm, LayerCost, LayerWork, Nothing, Pass, Work
from pase.core.checks import a_mapping, arguments, tensor_sequence, text

__all__ = [
    "Layer", "LayerCost", "LayerWork", "LAYER_TYPES", "layer_type", "make_layer", "gemm_cost", "gemm_work",
    "redistribution_volume",
    "as_float", "check_shape", "check_positive", "check_count", "check_axis", "check_letters", "check_pair",
    "check_padding", "check_tensor", "generic_letters", "letters_of", "SHARED_ARGS", "check_flag",
    "BroadcastOperands", "GemmShaped", "operand_gradient_reductions",
]

#: Arguments every layer type takes besides its own, kept in ``args`` (so the JSON graph
#: format carries them) and applied by ``make_layer``: ``tied``, one entry per ``parameters()``
#: entry, the name of the tensor it is (entries of several layers naming one tensor are one
#: parameter, counted once by the memory models) or None; ``held``, shapes of parameters the
#: layer holds that its cost never reads (a position table, a class token, a layer scale),
#: replicated on every device.
SHARED_ARGS = ("tied", "held")

#: Every layer type by its ``op`` name. Filled as the classes below are defined (a class with
#: its own ``op`` registers itself); read by the JSON graph format and the documentation.
LAYER_TYPES: dict = {}


# ---------------------------------------------------------------------------------------
# Shared cost pieces


def gemm_work(per_device, groups, pw: int = 0, weight_grads=(False, True)) -> LayerWork:
    """The work of ``Bp`` per-device GEMMs ``Mp x Kp`` by ``Kp x Np`` with ``pw`` fused point-wise ops.

    Parameters
    ----------
    per_device : tuple
        ``(Bp, Mp, Np, Kp)``: per-device sizes, arrays over the configurations.
    groups : tuple of Group
        ``(m, n, k)``: the devices that split ``M``, ``N`` and ``K``.
    pw : int
        Point-wise operations fused after the GEMM (each a memory-bound pass over its output).
    weight_grads : tuple of bool
        Whether operand A's and operand B's gradients are weight gradients.

    Compute: ``gemm(Bp, Mp, Np, Kp)`` (one product forward, two backward) plus ``pw`` passes over
    the ``Bp Mp Np`` outputs (``3 pw Mp Np`` FLOPs each in the reference). Communication: the
    forward output all-reduced over ``k``, operand A's gradient over ``n`` and operand B's (the
    weight's) over ``m``: ``AR(Bp Mp Np, k) + AR(Bp Mp Kp, n) + AR(Bp Np Kp, m)``.
    """
    Bp, Mp, Np, Kp = (np.asarray(x, dtype=np.float64) for x in per_device)
    group_m, group_n, group_k = groups
    compute = Gemm(Bp, Mp, Np, Kp)
    if pw > 0:
        outputs = Bp * Mp * Np
        compute = compute + pw * Pass("gelu", outputs, 3.0 * outputs)
    gradient_a, gradient_b = operand_gradient_reductions((Bp, Mp, Np, Kp), groups, weight_grads)
    return LayerWork(compute, AllReduce(Bp * Mp * Np, group_k) + gradient_a + gradient_b)


def gemm_cost(machine, per_device, groups, pw: int = 0, weight_grads=(False, True)) -> LayerCost:
    """:func:`gemm_work` priced by ``machine`` (``pase.machines.paper``)."""
    return gemm_work(per_device, groups, pw, weight_grads).cost(machine)


def operand_gradient_reductions(per_device, groups, weight_grads=(False, True)) -> tuple:
    """The last two terms of ``gemm_work``: operand A's gradient all-reduced over the devices
    splitting ``N`` (``AR(Bp Mp Kp, n)``) and operand B's over those splitting ``M``
    (``AR(Bp Np Kp, m)``); ``weight_grads`` says which is a weight's gradient."""
    Bp, Mp, Np, Kp = (np.asarray(x, dtype=np.float64) for x in per_device)
    group_m, group_n, _ = groups
    return (AllReduce(Bp * Mp * Kp, group_n, weight=weight_grads[0]),
            AllReduce(Bp * Np * Kp, group_m, weight=weight_grads[1]))


def redistribution_volume(shape, source, target):
    """Elements a device lacks when a tensor split ``source`` is needed split ``target``.

    ``max(prod(tgt) - overlap, 0)`` with ``tgt = shape / target``, ``src = shape / source``
    and ``overlap = prod(min(tgt, src))``, or 0 when the target uses more devices than the
    source. ``source`` and ``target`` broadcast against each other (last axis: tensor dims).
    """
    shape = np.asarray(shape, dtype=np.float64)
    source = np.asarray(source)
    target = np.asarray(target)
    src = shape / source
    tgt = shape / target
    tgt_block = tgt.prod(axis=-1)
    overlap = np.minimum(tgt, src).prod(axis=-1)
    overlap = np.where(target.prod(axis=-1) > source.prod(axis=-1), 0.0, overlap)
    return np.maximum(tgt_block - overlap, 0.0)


def as_float(configs: np.ndarray) -> np.ndarray:
    return np.asarray(configs, dtype=np.float64)


def check_shape(shape, what: str) -> tuple:
    shape = tuple(shape)
    for d in shape:
        if not is_positive_int(d, numpy=True):
            raise ValueError(f"{what}: every size must be a positive integer, got {list(shape)}")
    return tuple(int(d) for d in shape)


def check_positive(value, what: str) -> int:
    if not is_positive_int(value, numpy=True):
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def check_count(value, what: str) -> int:
    """A count that may be zero (``pw``)."""
    if not is_int(value, numpy=True) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


def check_flag(value, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} must be true or false, got {value!r}")
    return bool(value)


def check_axis(axis, rank: int, what: str) -> int:
    if not is_int(axis, numpy=True) or not -rank <= axis < rank:
        raise ValueError(f"{what}: axis {axis!r} is out of range for rank {rank}")
    return int(axis) % rank


def check_letters(letters, count: int, what: str) -> str:
    if not isinstance(letters, str) or len(letters) != count:
        raise ValueError(f"{what}: letters {letters!r} must name the {count} dimensions, one letter each")
    return letters


def check_pair(value, what: str, check=check_positive) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{what} must be one integer or a pair, got {value!r}")
        return tuple(check(v, what) for v in value)
    return (check(value, what),) * 2


def check_padding(value, what: str) -> tuple:
    def non_negative(v, _):
        if not is_int(v, numpy=True) or v < 0:
            raise ValueError(f"{what} must be non-negative integers, got {value!r}")
        return int(v)

    return check_pair(value, what, non_negative)


def check_tensor(x, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a Tensor, got {type(x).__name__}")
    return x


def generic_letters(rank: int) -> str:
    return "bcdefghijklmnopqrstuvwxyz"[:rank] if rank <= 25 else "?" * rank


def letters_of(t: Tensor) -> str:
    """Display letters of a tensor's dimensions: its own, or generic ones."""
    return t.letters if len(t.letters) == t.rank else generic_letters(t.rank)


# ---------------------------------------------------------------------------------------
# Base class and registry


class Layer:
    """A vertex of the computation graph: one layer type is one subclass.

    A subclass sets ``op`` (its registry name) and, in ``__init__``, calls
    ``Layer.__init__`` with everything a layer declares:

    - ``inputs``: the tensors it reads (graph inputs make no edges);
    - ``domain``: the iteration space, and ``dims``: one display letter per dimension;
    - ``output_shapes`` and ``output_letters``: shape and letters of every output tensor;
    - ``batch_dim``: the dimension data parallelism splits (outermost in the device layout);
    - ``unsplit``: dimensions the enumeration treats as size 1 (default none);
    - ``args``: its JSON-able constructor arguments other than the tensors, so that
      ``make_layer(op, operands, args)`` rebuilds it.

    It implements ``input_configs``, ``output_configs`` and ``work`` for an array of
    configurations ``C`` of shape ``(K, len(domain))``, and ``parameters`` if it has weights.
    ``work`` describes what the layer does (``pase.model.layers.work``); ``costs`` is that work
    priced by a machine.
    ``check()`` validates the declaration; ``GraphBuilder.add`` calls it once.
    """

    op: ClassVar[str | None] = None
    #: Keep only contiguous configurations (Ravel, Unravel).
    contiguous: ClassVar[bool] = False
    #: Names of the layer's own weights, in ``parameters()`` order, for the exporters
    #: (``NAME.scale``); None: ``NAME.weight`` (``NAME.weight0``, ... for several).
    weight_names: ClassVar[tuple | None] = None
    #: A table lookup (Embedding): its first input is a one-hot of token ids over its last
    #: axis, which runners feed as the ids, and its weight input is its own table.
    lookup_table: ClassVar[bool] = False
    #: A product whose tensor-parallel output all-reduce becomes a reduce-scatter under
    #: sequence parallelism (Korthikanti et al. 2022): FC and Einsum, not the lookup.
    product: ClassVar[bool] = False
    #: The training loss: it keeps logit-sized buffers of its own (``pase.costing.training``).
    loss: ClassVar[bool] = False
    #: A normalisation (Norm and its kinds): Megatron's ``layernorm`` recompute module reruns
    #: the ones it runs as modules of their own (``pase.costing.training.recompute``).
    normalisation: ClassVar[bool] = False
    #: A normalisation PyTorch runs unfused in eager mode, one aten kernel per operation
    #: (RMSNorm as torchtitan writes it; ``pase.costing.training.EAGER_NORM_BYTES``).
    eager_unfused: ClassVar[bool] = False
    #: See ``SHARED_ARGS``: the tensor names of ``parameters()`` entries, and held shapes.
    tied: tuple | None = None
    held: tuple = ()
    #: One role per dimension of the iteration space (``pase.model.roles``), or None where
    #: nobody declared them: set by the layer type where its dimensions mean the same in every
    #: graph, else by whoever builds the layer (``GraphBuilder.add``).
    roles: tuple | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        op = cls.__dict__.get("op")
        if op is None:
            return  # an abstract helper class, not a layer type
        if op in LAYER_TYPES and LAYER_TYPES[op] is not cls:
            raise TypeError(f"layer type {op!r} is defined twice ({LAYER_TYPES[op].__qualname__} and {cls.__qualname__})")
        LAYER_TYPES[op] = cls

    def __init__(self, inputs, domain, dims, output_shapes, output_letters=None, batch_dim=0, unsplit=None,
                 args=None):
        self.inputs = tuple(inputs)
        self.domain = tuple(int(d) for d in domain)
        self.dims = dims
        self.output_shapes = tuple(tuple(int(d) for d in shape) for shape in output_shapes)
        self.output_letters = (
            tuple(output_letters) if output_letters is not None
            else tuple(generic_letters(len(shape)) for shape in self.output_shapes)
        )
        self.batch_dim = int(batch_dim)
        self.unsplit = (False,) * len(self.domain) if unsplit is None else tuple(bool(u) for u in unsplit)
        self.args = dict(args or {})

    def check(self) -> None:
        """Raise ``ValueError`` unless the declared attributes are consistent."""
        name = type(self).__name__
        for attr in ("inputs", "domain", "dims", "output_shapes", "output_letters", "batch_dim", "unsplit", "args"):
            if not hasattr(self, attr):
                raise ValueError(f"{name} does not declare {attr!r} (call Layer.__init__)")
        if not self.op:
            raise ValueError(f"{name} has no op name")
        rank = len(self.domain)
        if rank == 0 or any(d < 1 for d in self.domain):
            raise ValueError(f"{self.op}: the iteration space {list(self.domain)} must have positive sizes")
        if len(self.dims) != rank:
            raise ValueError(f"{self.op}: dims {self.dims!r} must give one letter per dimension of {list(self.domain)}")
        if len(self.unsplit) != rank:
            raise ValueError(f"{self.op}: unsplit must have one flag per dimension")
        if not 0 <= self.batch_dim < rank:
            raise ValueError(f"{self.op}: batch_dim {self.batch_dim} is outside the iteration space")
        if self.roles is not None:
            check_roles(self.roles, rank, self.op)
        if not self.output_shapes or len(self.output_letters) != len(self.output_shapes):
            raise ValueError(f"{self.op}: every output needs a shape and letters")
        for t in self.inputs:
            check_tensor(t, f"{self.op} input")
        one = np.ones((1, rank), dtype=np.int64)
        for what, shapes, configs in (("input", [t.shape for t in self.inputs], self.input_configs(one)),
                                      ("output", self.output_shapes, self.output_configs(one))):
            if len(configs) != len(shapes):
                raise ValueError(f"{self.op}: {len(configs)} {what} configurations for {len(shapes)} {what}s")
            for shape, config in zip(shapes, configs):
                if np.asarray(config).shape != (1, len(shape)):
                    raise ValueError(f"{self.op}: an {what} configuration does not match the {what} shape {list(shape)}")

    @classmethod
    def from_args(cls, operands: Sequence[Tensor], args: dict) -> "Layer":
        """Rebuild a layer from its operand tensors and ``args`` (the JSON graph format)."""
        return cls(*operands, **args)

    @property
    def operands(self) -> tuple:
        """The tensors its constructor takes (usually ``inputs``)."""
        return self.inputs

    def backward_reads(self, i: int, needs_grad: Sequence[bool]) -> bool:
        """Whether its backward pass reads input ``i`` (so that input must be kept from the
        forward pass), given which inputs need a gradient (``needs_grad``, one flag per input).
        By default every input is read (a product reads each operand for the other's gradient,
        a normalisation or activation function its input)."""
        return True

    def input_configs(self, C: np.ndarray) -> list:
        """Tensor configuration of every input, one ``(K, rank)`` array each."""
        raise NotImplementedError

    def output_configs(self, C: np.ndarray) -> list:
        """Tensor configuration of every output, one ``(K, rank)`` array each."""
        raise NotImplementedError

    def work(self, C: np.ndarray) -> LayerWork:
        """What the layer does for every configuration row of ``C``, in parts: its GEMMs and
        memory-bound passes (compute) and its collectives (communication), each with its sizes
        and device group (``pase.model.layers.work``)."""
        raise NotImplementedError(f"layer type {type(self).__name__} describes no work (work(C))")

    def costs(self, C: np.ndarray, machine) -> LayerCost:
        """Compute and communication cost of every configuration row of ``C``: its
        :meth:`work` priced by ``machine``."""
        return self.work(C).cost(machine, len(C))

    def cost(self, C: np.ndarray, machine) -> np.ndarray:
        """Layer cost (compute plus communication) of every configuration row of ``C``."""
        return self.costs(C, machine).total

    def reduced_inputs(self) -> tuple:
        """Positions of the inputs whose gradient ``costs`` all-reduces in a way another reader
        of the same tensor, laid out alike, could share: the readers sum their partial
        gradients and reduce once (``pase.model.readers``; ``docs/cost-model.md``, "Several
        readers of one tensor"). Default: none."""
        return ()

    def gradient_reductions(self, C: np.ndarray, machine) -> dict:
        """``input position -> cost vector`` of that all-reduce, for every ``reduced_inputs``."""
        return {}

    def reduction_signature(self, i: int) -> tuple:
        """What two readers of one tensor must have in common for their ``reduction_layout``
        columns to mean the same: by default the layer type, the input position and the
        iteration-space rank."""
        return (self.op, i, len(self.domain))

    def reduction_layout(self, i: int) -> tuple:
        """``(held, group)`` for an input in ``gradient_reductions``: the iteration-space
        columns that say which block of the input (and of its partial gradient) a device
        holds, and those the gradient is all-reduced over."""
        raise NotImplementedError

    def forward_flops(self) -> float:
        """FLOPs of one forward pass as MFU counts them (Narayanan et al. 2021): the products
        only (``2 x`` the iteration space of a GEMM-like layer); 0 for every other layer."""
        return 0.0

    #: Share of its outputs a layer stores (a sliding-window attention's scores: their band).
    output_density: float = 1.0

    def parameters(self) -> list:
        """Parameter tensors as ``(shape, spanned iteration-space dims)`` pairs.

        A parameter tensor is split by the product of the splits of the dimensions it
        spans and replicated across the others (``docs/memory.md``).
        """
        return []

    def share(self, tied=None, held=None) -> "Layer":
        """Name the tensors of its parameters (``tied``) and add ``held`` ones (``SHARED_ARGS``).

        Returns the layer itself; ``ValueError`` for a malformed argument.
        """
        if tied is not None:
            entries = len(self.parameters())
            if not isinstance(tied, (list, tuple)) or len(tied) != entries or not all(
                    t is None or (isinstance(t, str) and t) for t in tied):
                raise ValueError(f"{self.op}: tied must give one tensor name (or null) per parameter, "
                                 f"{entries} here, got {tied!r}")
            self.tied = tuple(tied) if any(t is not None for t in tied) else None
        if held is not None:
            if not isinstance(held, (list, tuple)):
                raise ValueError(f"{self.op}: held must be a list of shapes, got {held!r}")
            self.held = tuple(check_shape(shape, f"{self.op} held parameter") for shape in held)
        self.args = {k: v for k, v in self.args.items() if k not in SHARED_ARGS}
        if self.tied is not None:
            self.args["tied"] = list(self.tied)
        if self.held:
            self.args["held"] = [list(shape) for shape in self.held]
        return self

    def parameter_tensors(self) -> list:
        """``(shape, dims, key)`` of every parameter tensor the layer holds, held ones last.

        ``key`` identifies a tensor several layers read (the memory models count it once):
        ``("tied", name)`` for a named one, ``("input", id)`` for a weight read as a graph
        input (the same ``Tensor`` object), else None.
        """
        entries = self.parameters()
        read = [t for t in self.inputs if t.is_param]
        # Weights read as inputs are known tensors only when they are all its parameters (a
        # built-in graph's biased projection keeps its own, unshared, accounting).
        keys = [("input", id(t)) for t in read] if len(read) == len(entries) else [None] * len(entries)
        if self.tied is not None:
            keys = [("tied", name) if name is not None else key for key, name in zip(keys, self.tied)]
        out = [(tuple(shape), tuple(dims), key) for (shape, dims), key in zip(entries, keys)]
        return out + [(shape, (), None) for shape in self.held]

    # Helpers for subclasses ------------------------------------------------------------

    def _per_device(self, C: np.ndarray) -> np.ndarray:
        """``dpp = dom / c``: per-device size of every dimension."""
        return np.asarray(self.domain, dtype=np.float64) / as_float(C)

    def _E(self, C: np.ndarray) -> np.ndarray:
        return self._per_device(C).prod(axis=1)

    def _groups(self, C: np.ndarray, *dim_lists) -> tuple:
        """The devices a collective over each of ``dim_lists`` involves (``docs/machines.md``)."""
        strides = layout_strides(C, self.batch_dim)
        return tuple(Group.of(C, strides, dims) for dims in dim_lists)

    def __repr__(self) -> str:
        return f"{self.op}(domain={list(self.domain)})"


def layer_type(op: str) -> type:
    """The layer class registered as ``op``; ``ValueError`` naming the known ones otherwise."""
    try:
        return LAYER_TYPES[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown layer type {op!r}; known: {', '.join(sorted(LAYER_TYPES))}") from None


@arguments(op=text, operands=tensor_sequence, args=a_mapping)
def make_layer(op: str, operands: Sequence[Tensor], args: dict) -> Layer:
    """Build a layer of type ``op`` from its operand tensors and JSON-able ``args``.

    Unknown or missing arguments raise ``ValueError`` naming the layer type.
    """
    cls = layer_type(op)
    if not isinstance(args, dict):
        raise ValueError(f"{op}: args must be an object, got {type(args).__name__}")
    own = {k: v for k, v in args.items() if k not in SHARED_ARGS}
    try:
        layer = cls.from_args(list(operands), own)
        if any(k in args for k in SHARED_ARGS):
            layer.share(args.get("tied"), args.get("held"))
        return layer
    except TypeError as err:
        # A wrong argument name or count: say which, without the Python signature noise.
        message = str(err).split(") ", 1)[-1] if ") " in str(err) else str(err)
        raise ValueError(f"{op}: {message} ({len(operands)} operands given)") from None


class GemmShaped:
    """A layer priced as one batched GEMM by ``gemm_cost``.

    A subclass gives ``gemm_dims()``: its iteration-space columns that are the GEMM's batch,
    ``M``, ``N`` and ``K`` dimensions; ``gemm_operands``: the input positions of operand A and
    operand B (``None`` for a weight the layer owns); ``weight_grads``: which operand's gradient
    is a weight's; and ``pw``."""

    pw: int = 0
    gemm_operands: tuple = (0, None)

    def gemm_dims(self) -> tuple:
        raise NotImplementedError

    def weight_grads(self) -> tuple:
        return (False, True)

    def _gemm_terms(self, C) -> tuple:
        """``gemm_cost``'s per-device sizes and groups."""
        dims = [list(d) for d in self.gemm_dims()]
        Cf = as_float(C)
        domain = np.asarray(self.domain, dtype=np.float64)
        sizes = tuple(domain[d].prod() / Cf[:, d].prod(axis=1) for d in dims)
        return sizes, self._groups(C, *dims[1:])

    def work(self, C):
        sizes, groups = self._gemm_terms(C)
        return gemm_work(sizes, groups, self.pw, self.weight_grads())

    def reduced_inputs(self) -> tuple:
        """The activation operands (not a weight's)."""
        return tuple(i for i, weight in zip(self.gemm_operands, self.weight_grads()) if i is not None and not weight)

    def gradient_reductions(self, C, machine) -> dict:
        """The all-reduce of each activation operand's gradient (``gemm_cost``'s terms)."""
        sizes, groups = self._gemm_terms(C)
        terms = operand_gradient_reductions(sizes, groups, self.weight_grads())
        return {i: term.priced(machine) for i, term in zip(self.gemm_operands, terms) if i in self.reduced_inputs()}

    def reduction_layout(self, i: int) -> tuple:
        """``(held, group)``: operand A's columns (batch, ``M``, ``K``) and ``N``; B's (batch,
        ``N``, ``K``) and ``M``."""
        batch, m, n, k = (list(d) for d in self.gemm_dims())
        if i == self.gemm_operands[0]:
            return batch + m + k, n
        return batch + n + k, m


class BroadcastOperands:
    """For a layer whose operands may broadcast: ``self.broadcast`` holds, per operand, the
    dimensions of the iteration space along which it is size 1 where the output is not
    (Elementwise; Concat off its axis)."""

    broadcast: tuple = ()

    def _operand(self, C, i):
        """The configurations of operand ``i``: unsplit along the dimensions it is broadcast along."""
        if not self.broadcast[i]:
            return C
        C = C.copy()
        C[:, list(self.broadcast[i])] = 1
        return C

    def broadcast_gradients(self, C) -> Work:
        """Each broadcast operand's gradient, summed over the dimensions it was broadcast along:
        an all-reduce of its per-device elements over the devices splitting those dimensions."""
        communication = Nothing()
        for i, dims in enumerate(self.broadcast):
            if dims:
                shape = np.asarray(self.inputs[i].shape, dtype=np.float64)
                elements = (shape / as_float(self._operand(C, i))).prod(axis=1)
                (group,) = self._groups(C, dims)
                communication = communication + AllReduce(elements, group)
        return communication
