"""Tables of ATen operations by what they do (identity, reshapes, permutes, point-wise,
statistics), and how an operation is named in messages."""

from __future__ import annotations

import re

from .errors import Unmappable


#: Operations that change nothing the cost model sees (copies, casts, aliases, asserts).
_IDENTITY = {
    "clone", "contiguous", "alias", "detach", "_to_copy", "to", "type_as", "lift_fresh_copy",
    "lift_fresh", "resolve_conj", "resolve_neg", "_conj", "positive", "_assert_tensor_metadata",
    "dropout_identity", "_unsafe_index_put_identity", "requires_grad_", "copy",
}


#: Operations with no tensor output, or an output that ignores the batch-dependent input's
#: values (only its shape): the result is replicated.
_SHAPE_ONLY = {
    "new_ones", "new_zeros", "new_empty", "new_full", "zeros_like", "ones_like", "empty_like",
    "full_like", "rand_like", "randn_like", "randint_like", "sym_size", "sym_numel", "sym_stride",
    "size", "dim", "numel", "_assert_async", "_assert_scalar", "sym_constrain_range_for_size",
    "_is_all_true", "_is_any_true",  # checks of the input's values: an assert, not a computation
}


#: Views whose result is the input's elements in order, in the output's shape.
_RESHAPES = {
    "view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as",
    "reshape_as", "view_copy", "_reshape_alias", "squeeze_copy", "unsqueeze_copy", "atleast_1d",
    "atleast_2d", "atleast_3d",
}


_PERMUTES = {"permute", "transpose", "t", "swapaxes", "swapdims", "movedim", "numpy_T", "permute_copy",
             "transpose_copy", "adjoint", "mT"}


_EXPANDS = {"expand", "expand_as", "broadcast_to", "expand_copy"}


#: Point-wise operations on one batch-dependent tensor (other operands replicated or scalars).
_POINTWISE = {
    "relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log1p", "log2",
    "neg", "abs", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "erf", "erfc", "hardtanh", "hardswish",
    "hardsigmoid", "leaky_relu", "elu", "selu", "celu", "softplus", "mish", "clamp", "clamp_min",
    "clamp_max", "square", "sign", "floor", "ceil", "round", "trunc", "frac", "logical_not", "bitwise_not",
    "logit", "nan_to_num", "threshold", "glu_identity", "fill", "add", "sub", "mul", "div", "rsub",
    "true_divide", "floor_divide", "remainder", "fmod", "maximum", "minimum", "pow", "atan2", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "__and__", "__or__", "__xor__", "where", "masked_fill", "lerp", "addcmul", "addcdiv",
    "copysign", "hypot", "xlogy", "heaviside", "isnan", "isinf", "isfinite", "prelu",
}


#: Of those, the ones combining operands: two batch-dependent operands make an Elementwise.
_BINARY = {
    "add", "sub", "mul", "div", "rsub", "true_divide", "floor_divide", "remainder", "fmod", "maximum",
    "minimum", "pow", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__", "where",
    "masked_fill", "lerp", "addcmul", "addcdiv", "copysign", "hypot", "xlogy", "heaviside", "prelu",
}


#: Statistics over axes: lazy until combined with their source (a norm) or read (ReduceMean).
_STATS = {"mean": "mean", "sum": "sum", "var": "var", "std": "std", "amax": "max", "amin": "min", "nansum": "sum",
          "nanmean": "mean", "logsumexp": "max"}


_NORM_STATS = {"mean", "var", "std", "norm"}


#: Module classes whose layer takes the module's own path as its name.
_LEAF_MODULE = re.compile(r"(Linear|Conv|Norm|Embedding|Pool|LayerNorm|BatchNorm|Softmax)")


_DROPOUTS = {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}


def _op_name(target) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        name = schema.name
        return name.split("::", 1)[1] if "::" in name else name
    return getattr(target, "__name__", str(target))


def _display_op(target) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        ns, _, name = schema.name.partition("::")
        return f"{ns}.{name}" if name else ns
    return getattr(target, "__name__", str(target))


def _norm_dim(dim: int, rank: int) -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise Unmappable(f"dimension {dim} is out of range for rank {rank}")
    return dim % max(rank, 1)


def _ints(value, count: int, what: str) -> tuple:
    """``value`` (an int or a list) as ``count`` ints."""
    if isinstance(value, (list, tuple)):
        value = [int(v) for v in value]
        if len(value) == 1:
            value = value * count
        if len(value) != count:
            raise Unmappable(f"{what} {value} is not {count} integers")
        return tuple(value)
    return (int(value),) * count


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        elif isinstance(v, dict):
            yield from _flat(list(v.values()))
        else:
            yield v
