"""Mixture-of-experts blocks found by their structure and traced as one opaque operation.

``torch.export`` cannot trace a router's data-dependent dispatch (``topk``, ``one_hot``,
``nonzero``, a loop over the experts hit, ``index_add_``) on ``meta``. So, before export,
every submodule that *is* a mixture of experts by its parameters (a router ``E x D``, ``E``
experts of one MLP shape, a top-k count, optionally a shared expert and its gate) is swapped
for a stand-in calling the custom operation ``pase::mixture_of_experts``, which carries the
block's sizes; the walk maps that operation onto one ``MoE`` layer (``handlers/moe.py``).
The model is put back as it was once the export is done.

How a block is recognised (by its weights, not its class, so that an expert loop over an
``nn.ModuleList``, fused ``(E, 2H, D)`` products or grouped products all read the same):

- a child named ``experts``: a list of ``E`` modules whose weights are matrices with one side
  ``D``, or a module whose weights are ``(E, D, X)`` / ``(E, X, D)`` tensors;
- a router: the child ``gate`` or ``router`` (else the one child with a single ``E x D``
  matrix), holding exactly one matrix ``E x D`` and nothing else;
- the top-k count: an integer attribute ``top_k`` or ``num_experts_per_tok`` of the block, its
  router, its experts or their ``config``;
- the experts' width ``H``: their matrices' other sides ``X`` sum to ``m H`` per expert, ``m``
  3 for gated (gate, up, down; gate and up fused or not) or 2 for plain (up, down) experts;
- optionally a shared expert (any other child made of matrices with one side ``D``, gated
  like the routed ones) and its gate (a child holding one ``1 x D`` matrix).

A module with an ``experts`` child and a router or a top-k count that does not fit is refused
with one line naming it and the reason; the model's parameters are then counted exactly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from .errors import TorchImportError

__all__ = ["MoEBlock", "OP_NAME", "find_blocks", "stand_ins", "moe_op"]

#: The custom operation's name (namespace ``pase``), which ``handlers/moe.py`` maps.
OP_NAME = "mixture_of_experts"

_SCHEMA = ("(Tensor x, int experts, int top_k, int hidden, bool gated, int shared, int shared_hidden, "
           "bool shared_gate) -> Tensor")

#: Attributes read for the number of experts each token is sent to.
_TOP_K_NAMES = ("top_k", "num_experts_per_tok")

#: Child names a router goes by.
_ROUTER_NAMES = ("gate", "router")


@dataclass(frozen=True)
class MoEBlock:
    """What the ``MoE`` layer needs of one recognised block (its arguments of the same names)."""

    path: str
    width: int  # D, the model width
    experts: int
    top_k: int
    hidden: int
    gated: bool
    shared: int = 0
    shared_hidden: int = 0
    shared_gate: bool = False

    @property
    def parameters(self) -> int:
        """``D E + m E D H + m D H_s (+ D)``: what the ``MoE`` layer counts."""
        m = 3 if self.gated else 2
        D = self.width
        return D * self.experts + m * self.experts * D * self.hidden + m * D * self.shared_hidden + (
            D if self.shared_gate else 0)


class _Refused(Exception):
    """A candidate block that cannot be read as a mixture of experts (the reason)."""


def _params(module) -> list:
    """The distinct parameters of ``module`` and its children, in a fixed order."""
    return list(module.parameters())


def _top_k(block, router, experts):
    for owner in (block, router, experts):
        for source in (owner, getattr(owner, "config", None)):
            if source is None:
                continue
            for name in _TOP_K_NAMES:
                value = getattr(source, name, None)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
    return None


def _widths(shapes, width: int, what: str) -> list:
    """The other side ``X`` of each matrix ``(D, X)`` or ``(X, D)`` of an MLP of width ``D``."""
    out = []
    for shape in shapes:
        if len(shape) == 1:
            raise _Refused(f"{what} have biases, which the MoE layer does not model")
        if len(shape) != 2 or width not in shape:
            raise _Refused(f"{what} hold a {'x'.join(map(str, shape))} tensor, not a matrix with a side of "
                           f"the model width {width}")
        out.append(shape[1] if shape[0] == width else shape[0])
    return out


def _mlp_shape(widths: list, what: str) -> tuple:
    """``(gated, H)`` of one MLP from its matrices' widths: they sum to 3 H or 2 H."""
    if not widths:
        raise _Refused(f"{what} have no weights")
    hidden = min(widths)
    total = sum(widths)
    if total == 3 * hidden and len(widths) in (2, 3):
        return True, hidden
    if total == 2 * hidden and len(widths) == 2:
        return False, hidden
    raise _Refused(f"{what} are not an MLP of gate, up and down (or up and down) matrices: widths {widths}")


def _expert_list(experts) -> list | None:
    """The experts as a list of modules, when they are children (a list, a dict, a sequence)."""
    children = list(experts.children())
    if children and not list(experts.parameters(recurse=False)):
        return children
    return None


def _read_experts(experts, width_of_router):
    """``(E, gated, H, D)`` of the experts; ``width_of_router(E)`` gives the model width."""
    listed = _expert_list(experts)
    if listed is not None:
        count = len(listed)
        width = width_of_router(count)
        shapes = [tuple(tuple(p.shape) for p in _params(e)) for e in listed]
        if any(s != shapes[0] for s in shapes):
            raise _Refused("its experts are not all of one shape")
        gated, hidden = _mlp_shape(_widths(shapes[0], width, "its experts"), "its experts")
        return count, gated, hidden, width
    shapes = [tuple(p.shape) for p in _params(experts)]
    if not shapes:
        raise _Refused("its experts have no weights")
    count = shapes[0][0]
    if any(len(s) < 2 or s[0] != count for s in shapes):
        raise _Refused("its experts' weights are not all stacked over one leading expert dimension "
                       f"(shapes {', '.join('x'.join(map(str, s)) for s in shapes)})")
    if any(len(s) == 2 for s in shapes):
        raise _Refused("its experts have biases, which the MoE layer does not model")
    width = width_of_router(count)
    gated, hidden = _mlp_shape(_widths([s[1:] for s in shapes], width, "its experts"), "its experts")
    return count, gated, hidden, width


def _expert_count(experts) -> int | None:
    """``E``: the number of listed experts, or the leading dimension of fused expert weights."""
    listed = _expert_list(experts)
    if listed is not None:
        return len(listed)
    first = next(iter(_params(experts)), None)
    return int(first.shape[0]) if first is not None and first.dim() >= 2 else None


def _router(block, experts, count):
    """The router child: by name, else the one other child (a weight and perhaps a bias) whose
    weight is a matrix with a side of ``count``, the number of experts."""
    for name in _ROUTER_NAMES:
        child = getattr(block, name, None)
        if child is not None and child is not experts and hasattr(child, "parameters"):
            return name, child
    found = []
    for name, child in block.named_children():
        params = _params(child)
        if child is experts or not 1 <= len(params) <= 2 or params[0].dim() != 2:
            continue
        if count in tuple(params[0].shape) and 1 not in tuple(params[0].shape):
            found.append((name, child))
    return found[0] if len(found) == 1 else (None, None)


def read_block(block, path: str) -> MoEBlock | None:
    """The ``MoEBlock`` of ``block``, ``None`` if it is no candidate; raises ``_Refused``.

    A candidate has an ``experts`` child and a router or a top-k count.
    """
    experts = getattr(block, "experts", None)
    if experts is None or not hasattr(experts, "parameters") or experts not in list(block.children()):
        return None
    router_name, router = _router(block, experts, _expert_count(experts))
    top_k = _top_k(block, router, experts)
    if router is None and top_k is None:
        return None
    if router is None:
        raise _Refused("it has experts and a top-k count but no router (a child 'gate' or 'router', or the one "
                       "other child whose weight is a matrix with a side of its expert count)")
    router_weights = [tuple(p.shape) for p in _params(router)]
    if len(router_weights) != 1 or len(router_weights[0]) != 2:
        what = "a bias" if len(router_weights) > 1 else f"weights {router_weights}"
        raise _Refused(f"its router {router_name!r} has {what}, not one E x D matrix")

    def width_of_router(count):
        shape = router_weights[0]
        if count not in shape:
            raise _Refused(f"its router {router_name!r} is {shape[0]}x{shape[1]}, not {count} experts by the "
                           "model width")
        return shape[1] if shape[0] == count else shape[0]

    count, gated, hidden, width = _read_experts(experts, width_of_router)
    if top_k is None:
        raise _Refused("it has no integer top_k or num_experts_per_tok (on the block, its router or its config)")
    if not 1 <= top_k <= count:
        raise _Refused(f"its top-k count {top_k} is not between 1 and its {count} experts")
    shared_hidden, shared_gate = 0, False
    for name, child in block.named_children():
        if child is experts or child is router:
            continue
        shapes = [tuple(p.shape) for p in _params(child)]
        if not shapes:
            continue  # an activation, a dropout: nothing to count
        if shapes == [(1, width)] or shapes == [(width, 1)]:
            if shared_gate:
                raise _Refused("it has two shared-expert gates")
            shared_gate = True
            continue
        if shared_hidden:
            raise _Refused(f"it has a second shared expert {name!r}")
        what = f"its shared expert {name!r}"
        shared_gated, shared_hidden = _mlp_shape(_widths(shapes, width, what), what)
        if shared_gated != gated:
            raise _Refused(f"{what} is {'gated' if shared_gated else 'plain'} and its routed experts are not")
    if list(block.parameters(recurse=False)):
        raise _Refused("it holds weights of its own besides its router and experts")
    if shared_gate and not shared_hidden:
        raise _Refused("it has a shared-expert gate but no shared expert")
    found = MoEBlock(path, width, count, top_k, hidden, gated, 1 if shared_hidden else 0, shared_hidden, shared_gate)
    total = sum(p.numel() for p in _params(block))
    if total != found.parameters:  # weights tied across its parts, or unaccounted ones
        raise _Refused(f"its {total} parameters are not the {found.parameters} of a mixture of {count} experts")
    return found


def find_blocks(module) -> list:
    """``[(parent, attribute, child, MoEBlock)]`` of every MoE block, outermost first.

    The module itself is a block when ``parent`` is ``None``. Raises ``TorchImportError``
    (one line) for a candidate block that cannot be read.
    """
    found = []

    def visit(parent, name, child, path):
        try:
            block = read_block(child, path or "the top-level module")
        except _Refused as why:
            raise TorchImportError(f"{path or 'the top-level module'} ({type(child).__name__}) looks like a mixture "
                                   f"of experts but cannot be read as one: {why}") from None
        if block is not None:
            found.append((parent, name, child, block))
            return
        for sub, grandchild in child.named_children():
            visit(child, sub, grandchild, f"{path}.{sub}" if path else sub)

    visit(None, None, module, "")
    return found


def moe_op(torch):
    """``torch.ops.pase.mixture_of_experts``, registered on first use.

    Its fake (and real) kernel returns a new tensor of the input's shape: what the block
    returns. The registration is global to the process, as every custom operation's is.
    """
    namespace = torch.ops.pase
    if not hasattr(namespace, OP_NAME):
        def mixture_of_experts(x, experts, top_k, hidden, gated, shared, shared_hidden, shared_gate):
            return torch.empty_like(x)

        op = torch.library.custom_op(f"pase::{OP_NAME}", mutates_args=(), schema=_SCHEMA)(mixture_of_experts)
        op.register_fake(mixture_of_experts)
    return getattr(namespace, OP_NAME)


def _stand_in_class(torch):
    class MixtureOfExperts(torch.nn.Module):
        """Stands in for a recognised block while ``torch.export`` traces the model."""

        def __init__(self, block: MoEBlock):
            super().__init__()
            self.block = block
            self.op = moe_op(torch)

        def forward(self, hidden_states, *args, **kwargs):
            b = self.block
            if hidden_states.shape[-1] != b.width:
                raise ValueError(f"{b.path} reads tokens of width {hidden_states.shape[-1]}, not its {b.width}")
            return self.op(hidden_states, b.experts, b.top_k, b.hidden, b.gated, b.shared, b.shared_hidden,
                           b.shared_gate)

    return MixtureOfExperts


@contextlib.contextmanager
def stand_ins(module, torch):
    """Yield the module to export: ``module`` with every MoE block swapped for a stand-in.

    The blocks are put back on exit (also on an error); a module that is itself a block is
    replaced by its stand-in, never modified.
    """
    found = find_blocks(module)
    if not found:
        yield module
        return
    cls = _stand_in_class(torch)
    swapped = []
    root = module
    try:
        for parent, name, child, block in found:
            stand_in = cls(block)
            if parent is None:
                root = stand_in
                continue
            # setattr on a Module replaces the entry of ``_modules`` in place: order is kept.
            setattr(parent, name, stand_in)
            swapped.append((parent, name, child))
        yield root
    finally:
        for parent, name, child in reversed(swapped):
            setattr(parent, name, child)

