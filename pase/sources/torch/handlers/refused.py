"""Operations that are genuinely data-dependent: refused with the reason, and what to pass
instead where the model offers a way (its position ids)."""

from __future__ import annotations

from ..errors import Unmappable
from ..values import _dependent
from .registry import handles

#: Why each is refused; the walk prefixes the operation and where it is.
REASONS = {
    "cumsum": "a running sum of batch-dependent values, such as positions counted from the token ids: "
              "data-dependent; pass the model its position_ids (and token_type_ids) instead",
    "cumprod": "a running product of batch-dependent values: data-dependent",
    "argmax": "positions found from the input's values (pooling at the end-of-text token): data-dependent; "
              "plan the tower that does not pool by position (e.g. the vision tower), or pool in the model",
    "argmin": "positions found from the input's values: data-dependent",
    "masked_scatter": "writes at positions a mask computed from the input gives (image tokens placed by "
                      "the ids): data-dependent",
    "masked_select": "selects at positions a mask computed from the input gives: data-dependent",
    "nonzero": "positions of the input's non-zero values: data-dependent",
    "gather": "reads at positions given by a batch-dependent tensor: data-dependent; pass the model the "
              "ids it gathers by (position_ids, token_type_ids) instead",
    "scatter": "writes at positions given by a batch-dependent tensor: data-dependent",
    "scatter_add": "writes at positions given by a batch-dependent tensor: data-dependent",
    "index_put": "writes at positions given by a batch-dependent tensor: data-dependent",
    "topk": "ranks the input's values (mixture-of-experts routing): data-dependent",
    "sort": "ranks the input's values (mixture-of-experts routing): data-dependent",
    "histc": "counts the input's values (mixture-of-experts routing): data-dependent",
    "bincount": "counts the input's values: data-dependent",
    "item": "reads a value of the input as a Python number: data-dependent",
}


#: A gather whose positions do not depend on the batch (a relative-position table): not
#: data-dependent, but no PaSE layer reads a tensor at arbitrary positions either.
CONSTANT_GATHER = ("reads at positions a constant index table gives (relative-position attention's scores "
                   "looked up by distance): not data-dependent, but no PaSE layer expresses a gather; "
                   "use the model's variant without it (e.g. relative_attention=False) where it has one")


@handles(set(REASONS))
def handle_refused(imp, node, name, *args, **kwargs):
    if name == "gather":
        index = args[2] if len(args) > 2 else kwargs.get("index")
        if index is not None and not _dependent(index):
            raise Unmappable(CONSTANT_GATHER)
    raise Unmappable(REASONS[name])
