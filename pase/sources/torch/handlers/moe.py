"""Handler of ``pase::mixture_of_experts``, the operation a recognised mixture-of-experts block
is traced as (``pase.sources.torch.moe``): one ``MoE`` layer on the block's tokens."""

from __future__ import annotations

from pase.model import layers as L

from ..errors import Unmappable
from ..moe import OP_NAME
from ..protos import ProtoLayer
from ..values import View, _freeze
from .registry import handles


class ProtoMoE(ProtoLayer):
    """A mixture of experts on the tokens ``x`` (a layer output or input, width last)."""

    def __init__(self, name, x, args: dict):
        super().__init__(name)
        self.x, self.args = x, args

    def emit(self, em):
        em.add(self, L.MoE(em.tensor(self.x), **self.args))


@handles({OP_NAME})
def handle_moe(imp, node, name, x, experts, top_k, hidden, gated, shared, shared_hidden, shared_gate):
    view = imp._view(x, node)
    if len(view.shape) < 2:
        raise Unmappable("a mixture of experts on a tensor of rank < 2 (tokens, width)")
    imp._charge(view)
    # The layer reads its tokens in their own order, the width last: a Reshape where no view fits.
    view = imp._exact(view, node)
    _freeze(view.base.atoms)
    args = {"experts": experts, "top_k": top_k, "hidden": hidden, "gated": gated, "shared": shared,
            "shared_hidden": shared_hidden, "shared_gate": shared_gate}
    proto = imp._record(ProtoMoE(imp._name(node, "moe"), view.base, args))
    return View(proto.output(view.base.atoms), view.dims)
