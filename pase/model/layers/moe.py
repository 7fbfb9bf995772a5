"""A mixture-of-experts layer: a router, top-k dispatch to expert MLPs and the weighted
combine, as one vertex whose iteration space splits tokens, experts and the experts' width.

Expert parallelism moves tokens with all-to-alls over the devices that split the experts;
``docs/cost-model.md`` ("Mixture of experts") states every formula below.
"""

from __future__ import annotations

import math

import numpy as np

from pase.core.checks import is_number
from pase.model.tensor import Tensor
from .base import Layer, as_float, check_count, check_positive, check_tensor, gemm_work, letters_of
from .work import AllToAll, LayerWork, Pass

__all__ = ["MoE", "EXPERT_LETTER", "EXPERT_WIDTH_LETTER", "EXPERT_ACTIVATIONS"]

#: Iteration-space letter of the experts (expert parallelism splits it).
EXPERT_LETTER = "x"
#: The gated experts' activations a network declares: ``swiglu`` (``silu(gate) * up``, Mixtral,
#: Qwen, DeepSeek) and ``quick_geglu`` (GPT-OSS: ``gate * sigmoid(1.702 gate) * (up + 1)``, both
#: halves clamped; transformers' ``modeling_gpt_oss.GptOssExperts``). They cost alike on the
#: device; an engine's implementation may differ (``TrainingOptions.expert_activation_sync``).
EXPERT_ACTIVATIONS = ("swiglu", "quick_geglu")
#: Letter of each expert's hidden width: the decoder's MLP letter, so tensor parallelism maps
#: onto it as onto a dense MLP (``pase.planning.mesh``).
EXPERT_WIDTH_LETTER = "f"


def _factor(value, what: str, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if not is_number(value) or not math.isfinite(value) or value < 1:
        raise ValueError(f"MoE {what} must be a finite number of at least 1, got {value!r}")
    return float(value)


class MoE(Layer):
    """Mixture of experts on tokens ``x`` of shape ``(t1..tj, D)``: a router ``D x E`` and
    softmax, each token sent to ``top_k`` of ``experts`` expert MLPs of width ``hidden``
    (gated: gate, up and down matrices, SwiGLU; plain: up and down), their outputs summed with
    the router's weights; optionally ``shared`` always-on experts of width ``shared_hidden``
    (and, ``shared_gate``, a ``D x 1`` sigmoid gate on their output, as Qwen2-MoE).

    Iteration space ``(t1..tj, x, f, e)``: the token dims, the experts ``E``, each expert's
    width ``H`` and the model width ``D`` (``e``, kept unsplit by the enumeration; its
    splits are costed all the same). A configuration's input and output hold
    ``T / (c_t c_x)`` tokens per device (``T = prod(t)``, ``c_t`` the token splits, ``c_x``
    the expert split, placed on the first token dim, the batch): the
    devices of one expert group hold different tokens and trade them by all-to-all, as
    Megatron-LM's expert parallelism carved out of data parallelism.

    ``capacity``: the capacity factor (each expert's buffer holds ``capacity`` times its
    balanced share, tokens beyond are dropped; ``None``: dropless). ``imbalance``: the busiest
    device's load over the balanced share. The expert work and the all-to-all volume of the
    busiest device, which set the step time, are ``min(imbalance, capacity)`` times the
    balanced ones.

    ``router_bias`` and ``expert_bias``: learnt biases on the router's logits and on every
    expert projection's outputs (GPT-OSS; parameters, their adds fused). ``activation``: the
    gated experts' activation, one of :data:`EXPERT_ACTIVATIONS` (GPT-OSS: ``quick_geglu``). ``groups`` and
    ``group_top``: group-limited routing (DeepSeek-V3): the experts fall in ``groups`` equal
    groups and a token's ``top_k`` lie in ``group_top`` of them, so the dispatch sends each
    token once per device it reaches (as DeepEP does), at most ``min(k, c_x, group_top
    max(1, c_x / groups))`` copies instead of ``k``.
    """

    op = "MoE"

    def __init__(self, x: Tensor, experts: int, top_k: int, hidden: int, gated: bool = True,
                 capacity: float | None = None, imbalance: float = 1.0, shared: int = 0, shared_hidden: int = 0,
                 shared_gate: bool = False, router_bias: bool = False, expert_bias: bool = False, groups: int = 1,
                 group_top: int = 1, activation: str = "swiglu"):
        x = check_tensor(x, "MoE input")
        if x.rank < 2:
            raise ValueError(f"MoE needs an input of rank >= 2 (tokens, width), got shape {list(x.shape)}")
        E = check_positive(experts, "MoE expert count")
        k = check_positive(top_k, "MoE top_k")
        if k > E:
            raise ValueError(f"MoE top_k ({k}) is more than its {E} experts")
        H = check_positive(hidden, "MoE expert width")
        for name, flag in (("gated", gated), ("shared_gate", shared_gate), ("router_bias", router_bias),
                           ("expert_bias", expert_bias)):
            if not isinstance(flag, bool):
                raise ValueError(f"MoE {name} must be true or false, got {flag!r}")
        self.shared = check_count(shared, "MoE shared expert count")
        self.shared_hidden = check_count(shared_hidden, "MoE shared expert width")
        if bool(self.shared) != bool(self.shared_hidden):
            raise ValueError("MoE shared experts need both a count and a width (or neither), got "
                             f"shared={self.shared}, shared_hidden={self.shared_hidden}")
        if shared_gate and not self.shared:
            raise ValueError("MoE shared_gate needs shared experts")
        self.capacity = _factor(capacity, "capacity", allow_none=True)
        self.imbalance = _factor(imbalance, "imbalance")
        self.experts, self.top_k, self.hidden, self.gated, self.shared_gate = E, k, H, gated, shared_gate
        self.router_bias, self.expert_bias = router_bias, expert_bias
        if activation not in EXPERT_ACTIVATIONS:
            raise ValueError(f"MoE activation must be one of {', '.join(EXPERT_ACTIVATIONS)}, got {activation!r:.40}")
        if activation != "swiglu" and not gated:
            raise ValueError(f"MoE activation {activation} is gated: it needs gated experts")
        self.activation = activation
        self.groups = check_positive(groups, "MoE groups")
        self.group_top = check_positive(group_top, "MoE group_top")
        if E % self.groups or self.group_top > self.groups:
            raise ValueError(f"MoE groups ({self.groups}) must divide its {E} experts and group_top "
                             f"({self.group_top}) be at most the groups")
        extra = {}
        if router_bias or expert_bias:
            extra.update(router_bias=router_bias, expert_bias=expert_bias)
        if self.groups > 1:
            extra.update(groups=self.groups, group_top=self.group_top)
        if activation != "swiglu":
            extra.update(activation=activation)
        token_letters = letters_of(x)[:-1]
        width_letter = letters_of(x)[-1]
        dims = token_letters + EXPERT_LETTER + EXPERT_WIDTH_LETTER + width_letter
        if len(set(dims)) != len(dims):  # the input's letters clash with x or f: generic ones
            dims = "bcdghijklm"[: x.rank - 1] + EXPERT_LETTER + EXPERT_WIDTH_LETTER + "e"
        self.tokens = x.rank - 1
        D = x.shape[-1]
        unsplit = (False,) * (self.tokens + 2) + (True,)
        super().__init__(
            (x,), tuple(x.shape[:-1]) + (E, H, D), dims, (tuple(x.shape),), (dims[: self.tokens] + dims[-1],),
            batch_dim=0, unsplit=unsplit,
            args={"experts": E, "top_k": k, "hidden": H, "gated": gated, "capacity": self.capacity,
                  "imbalance": self.imbalance, "shared": self.shared, "shared_hidden": self.shared_hidden,
                  "shared_gate": shared_gate, **extra},
        )
        # Experts, each expert's width and the model width mean the same in every graph.
        self.roles = (None,) * self.tokens + ("experts", "expert_width", "model")
        names = ["router"] + (["gate", "up", "down"] if gated else ["up", "down"])
        if self.shared:
            names += ["shared_gate_proj", "shared_up", "shared_down"] if gated else ["shared_up", "shared_down"]
            if shared_gate:
                names.append("shared_expert_gate")
        if router_bias:
            names.append("router_bias")
        if expert_bias:
            names += ["gate_bias", "up_bias", "down_bias"] if gated else ["up_bias", "down_bias"]
        #: Weight names for the exporters, in ``parameters()`` order.
        self.weight_names = tuple(names)

    # -- the load and the configurations ---------------------------------------------------

    @property
    def load(self) -> float:
        """The busiest device's work over the balanced share: ``min(imbalance, capacity)``."""
        return min(self.imbalance, self.capacity) if self.capacity is not None else self.imbalance

    @property
    def matrices(self) -> int:
        """Weight matrices per expert: 3 gated (gate, up, down), 2 plain."""
        return 3 if self.gated else 2

    def _token_config(self, C) -> np.ndarray:
        """Splits of the ``(t1..tj, D)`` tensor: the token splits times the expert split
        ``c_x``, placed on the first token dim (the batch) as far as the batch holds it
        (``g = gcd(c_x, t1 / c_t1)``) and the rest ``c_x / g`` on the next token dim (the
        sequence; MoE parallel folding with one sequence per rank). Where ``c_t1 c_x`` divides
        the batch all of ``c_x`` lies on it. One rule for every row, so that exporters read the
        same placement off any configuration; where the rest does not divide the next dim (or
        there is none) it stays on the batch and the volumes are fractional, as for any uneven
        split."""
        C = np.asarray(C, dtype=np.int64)
        j = self.tokens
        out = np.concatenate([C[:, :j], C[:, j + 2: j + 3]], axis=1)
        cx = C[:, j]
        on_batch = cx
        if j > 1:
            g = np.gcd(cx, np.maximum(self.domain[0] // np.maximum(C[:, 0], 1), 1))
            rest = cx // g
            fits = (self.domain[1] % (C[:, 1] * rest) == 0) & (self.domain[0] % (C[:, 0] * g) == 0)
            on_batch = np.where(fits, g, cx)
            out[:, 1] = out[:, 1] * np.where(fits, rest, 1)
        out[:, 0] = out[:, 0] * on_batch
        return out

    def input_configs(self, C):
        return [self._token_config(C)]

    def output_configs(self, C):
        return [self._token_config(C)]

    def per_device_tokens(self, C) -> np.ndarray:
        """``T / (c_t c_x)``: tokens a device holds at the layer's input and output."""
        Cf = as_float(C)
        j = self.tokens
        return math.prod(self.domain[:j]) / (Cf[:, :j].prod(axis=1) * Cf[:, j])

    def expert_rows(self, C) -> np.ndarray:
        """Rows each local expert multiplies on the busiest device:
        ``load k T / (c_t E)`` (the ``c_x`` devices of a token group hold ``T / c_t`` tokens,
        ``k`` copies each, spread over ``E`` experts)."""
        Cf = as_float(C)
        j = self.tokens
        return self.load * self.top_k * math.prod(self.domain[:j]) / (Cf[:, :j].prod(axis=1) * self.experts)

    def copies(self, C) -> np.ndarray:
        """Copies of each token the dispatch sends: ``k``; group-limited, one per device
        reached, ``min(k, c_x, group_top max(1, c_x / groups))``."""
        k = np.full(len(C), float(self.top_k))
        if self.groups == 1:
            return k
        cx = as_float(C)[:, self.tokens]
        return np.minimum(np.minimum(k, cx), self.group_top * np.maximum(1.0, cx / self.groups))

    def dispatched(self, C) -> np.ndarray:
        """Elements one all-to-all moves per device: ``load copies (T / (c_t c_x)) D / c_e``."""
        j = self.tokens
        return self.load * self.copies(C) * self.per_device_tokens(C) * self.domain[-1] / as_float(C)[:, j + 2]

    def internal_activations(self, C) -> np.ndarray:
        """Elements per device the layer keeps inside itself for its backward pass, besides its
        output (``docs/training.md``, *Mixture of experts*): per routed token copy (``load k
        t_loc`` rows on the busiest device) the permuted input and the expert output before the
        weighted sum (``D / c_e`` each), the gate and up products and the activation (``3 H /
        c_f``; plain experts ``2 H / c_f``); per token the router's ``E`` probabilities; the
        shared experts' products and activation (``3 W / c_f``, plain ``2 W / c_f``) per token."""
        Cf = as_float(C)
        j = self.tokens
        D, H, E = self.domain[-1], self.hidden, self.experts
        cf, ce = Cf[:, j + 1], Cf[:, j + 2]
        t_loc = self.per_device_tokens(C)
        rows = self.load * self.top_k * t_loc
        out = rows * (2.0 * D / ce + self.matrices * H / cf) + t_loc * E
        if self.shared:
            out = out + t_loc * self.matrices * self.shared * self.shared_hidden / cf
        return out

    def activation_elements(self, C) -> np.ndarray:
        """The routed experts' activation output among :meth:`internal_activations`: ``load k
        t_loc H / c_f`` per device (what Megatron-Core's ``moe_act`` recomputation discards and
        runs again from the first products' output)."""
        Cf = as_float(C)
        return self.load * self.top_k * self.per_device_tokens(C) * self.hidden / Cf[:, self.tokens + 1]

    def shared_elements(self, C) -> np.ndarray:
        """The shared experts' products and activation among :meth:`internal_activations`:
        ``m S W / c_f`` per token, ``t_loc m S W / c_f`` per device (none without shared
        experts: what Megatron-Core's ``shared_experts`` recomputation discards and runs again
        from the layer's input)."""
        if not self.shared:
            return np.zeros(len(np.asarray(C)))
        Cf = as_float(C)
        return (self.per_device_tokens(C) * self.matrices * self.shared * self.shared_hidden
                / Cf[:, self.tokens + 1])

    # -- what the engines' dispatchers and grouped GEMMs read (pase.costing.training.experts) -

    def token_exchange(self, C) -> tuple:
        """``(elements, group)``: what one of the layer's four all-to-alls moves per device
        (:meth:`dispatched`) and the devices that split the experts (the all-to-all's group)."""
        C = np.asarray(C, dtype=np.int64)
        j = self.tokens
        group, = self._groups(C, (j,))
        return self.dispatched(C), group

    def expert_gemms(self, C) -> list:
        """``[(B, M, N, K), ...]``: the experts' products per device as :meth:`work` prices them,
        ``B`` local experts of ``M`` rows each (:meth:`expert_rows`): the fused gate and up
        product, then the down product (arrays over the rows)."""
        Cf = as_float(C)
        j = self.tokens
        cx, cf, ce = Cf[:, j], Cf[:, j + 1], Cf[:, j + 2]
        rows, local, D, H = self.expert_rows(C), self.experts / cx, float(self.domain[-1]), float(self.hidden)
        return [(local, rows, (self.matrices - 1) * H / cf, D / ce), (local, rows, D / ce, H / cf)]

    def shared_gemms(self, C) -> list:
        """``[(B, M, N, K), ...]``: the shared experts' products per device (none without)."""
        if not self.shared:
            return []
        Cf = as_float(C)
        j = self.tokens
        cf, ce = Cf[:, j + 1], Cf[:, j + 2]
        t_loc, D, width = self.per_device_tokens(C), float(self.domain[-1]), float(self.shared * self.shared_hidden)
        return [(1.0, t_loc, (self.matrices - 1) * width / cf, D / ce), (1.0, t_loc, D / ce, width / cf)]

    # -- costs ------------------------------------------------------------------------------

    def work(self, C):
        C = np.asarray(C, dtype=np.int64)
        Cf = as_float(C)
        j = self.tokens
        E, H, D = self.experts, self.hidden, self.domain[-1]
        cx, cf, ce = Cf[:, j], Cf[:, j + 1], Cf[:, j + 2]
        tok = list(range(j))
        g_tok, g_tok_x, g_x, g_f, g_e, g_none = self._groups(C, tok, tok + [j], (j,), (j + 1,), (j + 2,), ())
        t_loc = self.per_device_tokens(C)
        # The router: (t_loc x D) by (D x E), replicated over the experts' devices; its weight
        # gradient reduced over every device holding other tokens. Then the softmax over E.
        router = gemm_work((1.0, t_loc, float(E), D / ce), (g_tok_x, g_none, g_e))
        scores = t_loc * E
        compute = router.compute + Pass("softmax", scores, 5.0 * scores)
        communication = router.communication
        # The experts: E / c_x batched products of expert_rows tokens; gate and up fused into one
        # column-parallel product (one input-gradient all-reduce over f), the activation (and
        # the gated product) one point-wise pass over its 2H-wide (or H-wide) output; down is
        # row-parallel over f. Weight gradients are reduced over the token splits only.
        rows = self.expert_rows(C)
        local = E / cx
        up = gemm_work((local, rows, (self.matrices - 1) * H / cf, D / ce), (g_tok, g_f, g_e), pw=1)
        down = gemm_work((local, rows, D / ce, H / cf), (g_tok, g_e, g_f))
        compute = compute + up.compute + down.compute
        communication = communication + up.communication + down.communication
        # Permute into expert order and back, and the weighted sum of the k outputs.
        moved = self.dispatched(C)
        compute = compute + 2.0 * Pass("copy", moved, moved) + Pass("add", moved, moved)
        # Dispatch and combine, forward, and their gradients backward: four all-to-alls.
        communication = communication + 4.0 * AllToAll(moved, g_x)
        if self.shared:
            width = self.shared * self.shared_hidden
            s_up = gemm_work((1.0, t_loc, (self.matrices - 1) * width / cf, D / ce), (g_tok_x, g_f, g_e),
                             pw=1)
            s_down = gemm_work((1.0, t_loc, D / ce, width / cf), (g_tok_x, g_e, g_f))
            added = t_loc * D / ce
            compute = compute + s_up.compute + s_down.compute + Pass("add", added, added)
            communication = communication + s_up.communication + s_down.communication
            if self.shared_gate:
                gate = gemm_work((1.0, t_loc, 1.0, D / ce), (g_tok_x, g_none, g_e))
                compute = compute + gate.compute
                communication = communication + gate.communication
        return LayerWork(compute, communication)

    def forward_flops(self) -> float:
        """FLOPs of one balanced forward pass (for MFU): ``2 T D E`` (router) ``+ 2 k T m D H``
        (experts, ``m`` matrices each) ``+ 2 T m D S H_s`` (shared experts)."""
        T, D = math.prod(self.domain[: self.tokens]), self.domain[-1]
        flops = 2.0 * T * D * self.experts + 2.0 * self.top_k * T * self.matrices * D * self.hidden
        return flops + 2.0 * T * self.matrices * D * self.shared * self.shared_hidden

    def parameters(self):
        """Router ``(D, E)`` split by ``e`` only; each expert matrix ``(E, D, H)`` split by the
        experts, the width and ``e``; shared experts ``(D, S H_s)`` by the width and ``e``."""
        j = self.tokens
        x, f, e = j, j + 1, j + 2
        E, H, D = self.experts, self.hidden, self.domain[-1]
        out = [((D, E), (e,))]
        out += [((E, D, H), (x, e, f))] * self.matrices
        if self.shared:
            width = self.shared * self.shared_hidden
            out += [((D, width), (e, f))] * self.matrices
            if self.shared_gate:
                out.append(((D, 1), (e,)))
        if self.router_bias:
            out.append(((E,), ()))
        if self.expert_bias:
            out += [((E, H), (x, f))] * (self.matrices - 1) + [((E, D), (x, e))]
        return out
