"""The recomputation policy: which layers' forward runs again in the backward pass, and which
activations each layer keeps for it (stored) or holds while its block runs again (working)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pase.costing.training.options import TrainingOptions
from pase.costing.training.parts import PricedLayers
from pase.model.roles import input_roles, output_roles, roles_of

__all__ = ["OP_POLICY_KEEPS", "EAGER_NORM_SAVED", "ActivationPlaces", "activation_places", "op_roles",
           "RecomputePolicy"]

#: The operator-level policy (``recompute=op``) by what a weight product is in its block: kept
#: (True) or recomputed (False); a product the table does not name is recomputed. Source:
#: torchtitan's ``_custom_policy`` (``selective_ac_option = 'op'``,
#: torchtitan/parallelisms/parallelize_llama.py ``_apply_ac_to_transformer_block``) saves every
#: ``aten.mm`` of a block but every second one, counted per block; its Llama block runs them as
#: wq, wk, wv, wo, w1 (gate), w3 (up), w2 (down), so it keeps the query, the value, the gate and
#: the down projection and recomputes the key, the attention output and the up projection.
#: Said by role, the choice carries to other blocks: a fused q/k/v product is kept (it makes the
#: query), a plain MLP's one input product is its first (kept) and its output product is kept,
#: a low-rank latent projection (DeepSeek's q_a, kv_a) is kept (the latent is narrow).
#: Roles: ``query``, ``key``, ``value`` (a product feeding attention's scores as the queries or
#: the keys, or its context as the values, through layers without weights), ``attention_output``
#: (a product contracting the heads' width), ``mlp_first_input`` and ``mlp_input`` (the first and
#: the other products writing the ``mlp`` width), ``mlp_output`` (contracting it), ``latent``.
OP_POLICY_KEEPS = {
    "query": True, "key": False, "value": True, "attention_output": False,
    "mlp_first_input": True, "mlp_input": False, "mlp_output": True, "latent": True,
}
#: Activation bytes an eager RMSNorm keeps for its backward pass, in units of its bf16
#: output: autograd saves the fp32 copy of the input (4 bytes, for ``pow`` and the product)
#: and the cast output (2, for the weight's product): 6 bytes, 3 outputs' worth, where a fused
#: kernel keeps its output's worth (the tool's count of every layer).
EAGER_NORM_SAVED = 3.0


# ---------------------------------------------------------------------------------------
# The operator-level policy's roles


def _weight_product(layers: PricedLayers, v: int) -> bool:
    st = layers.structure
    return st.blocks[v] is not None and layers.network.layers[v].product and v not in st.cores and bool(
        layers.parts[v].params)


def _feeding_products(layers: PricedLayers, t, block) -> set:
    """The weight products of ``block`` whose outputs reach tensor ``t`` through layers
    without weights (a rotary embedding, a norm, a concatenation, a split)."""
    found, todo, seen = set(), [t], set()
    while todo:
        u = todo.pop().producer
        if u is None or u in seen or layers.structure.blocks[u] != block:
            continue
        seen.add(u)
        if _weight_product(layers, u):
            found.add(u)
        else:
            todo.extend(layers.network.layers[u].inputs)
    return found


def op_roles(layers: PricedLayers) -> dict:
    """``{vertex: roles}`` of every weight product of a repeated block, as
    :data:`OP_POLICY_KEEPS` names them, read off dimension roles and attention's cores."""
    network, blocks, cores = layers.network.layers, layers.structure.blocks, layers.structure.cores
    out = {v: set() for v in range(len(network)) if _weight_product(layers, v)}
    # Attention's inputs: what feeds the scores' queries and keys and the context's values.
    for v, role in sorted(cores.items()):
        layer, block = network[v], blocks[v]
        if role == "scores":
            for t, roles in zip(layer.inputs, input_roles(layer)):
                for u in _feeding_products(layers, t, block):
                    out[u].add("key" if "key_sequence" in roles else "query")
        elif role == "context":
            for t in layer.inputs:
                if t.producer is None or t.producer not in cores:
                    for u in _feeding_products(layers, t, block):
                        out[u].add("value")
    first: set = set()
    for v in sorted(out):
        written = set(output_roles(network[v])[0])
        contracted = set(roles_of(network[v])) - written
        if "head_width" in contracted:
            out[v].add("attention_output")
        if "mlp" in written:
            out[v].add("mlp_input" if blocks[v] in first else "mlp_first_input")
            first.add(blocks[v])
        if "mlp" in contracted:
            out[v].add("mlp_output")
        if "latent" in written and "head_width" not in written:
            out[v].add("latent")
    return {v: tuple(sorted(roles)) for v, roles in out.items()}


# ---------------------------------------------------------------------------------------
# Where each layer's output stands for the backward pass


@dataclass(frozen=True, eq=False)
class ActivationPlaces:
    """Per layer (boolean arrays), what its output is to the backward pass, under any options.

    ``read_back``: a backward pass reads it (``Layer.backward_reads`` of a reader, given which
    of the reader's inputs need a gradient: a layer's output or a weight, not a graph input); a
    layer no backward pass reads (a projection read only by a residual sum, a query read only by
    its rotary embedding) keeps nothing for it; one without readers keeps its output.
    ``op_saved``: the operator-level policy keeps it (a weight product of a repeated block whose
    role :data:`OP_POLICY_KEEPS` keeps: a Llama block keeps q, v, gate and down and recomputes
    k, out and up, as torchtitan). ``loss_only``: the loss, or read by the loss alone (the
    loss keeps its own logit-sized buffers: neither is kept as an activation besides).
    ``recomputable``: in a repeated block. ``attention_inner``: attention's scores or softmax.
    ``module_norm``: a norm of a repeated block that Megatron-Core runs as a module of its own,
    which ``recompute_modules`` ``layernorm`` discards and runs again: one feeding a mixture of
    experts or a low-rank latent projection (Transformer Engine's layer spec fuses every other
    norm into the linear after it: megatron-core 0.16.1 models/gpt/gpt_layer_specs.py, the
    ``input_layernorm`` a ``TENorm`` only under multi-latent attention, ``pre_mlp_layernorm``
    only before experts; transformer/transformer_layer.py:383-438 recomputes the norms that are
    not ``IdentityOp``). ``dense_mlp``: a dense MLP's layers, which ``mlp`` checkpoints at
    their input (transformer_layer.py:445-447, not in a mixture of experts' block): the
    products writing or contracting the ``mlp`` width, the point-wise layers between them and
    the norm before them (fused into the first product's linear). ``mla_up``: multi-latent
    attention's up projections and rotary embeddings, which ``mla_up_proj`` runs again from the
    latents (:func:`_mla_up_layers`); ``mla_up_input``: what they run again from, kept under it
    (the latents and the shared rotary key, the checkpoint's inputs).
    """

    read_back: np.ndarray
    op_saved: np.ndarray
    loss_only: np.ndarray
    recomputable: np.ndarray
    attention_inner: np.ndarray
    module_norm: np.ndarray
    dense_mlp: np.ndarray
    mla_up: np.ndarray
    mla_up_input: np.ndarray


def activation_places(layers: PricedLayers) -> ActivationPlaces:
    """The :class:`ActivationPlaces` of ``layers``."""
    network, st = layers.network.layers, layers.structure
    n = len(network)
    read = np.array([not st.consumers.get(v) for v in range(n)])
    for w, layer in enumerate(network):
        needs = tuple(t.producer is not None or t.is_param for t in layer.inputs)
        for i, t in enumerate(layer.inputs):
            if t.producer is not None and layer.backward_reads(i, needs):
                read[t.producer] = True
    saved = np.zeros(n, dtype=bool)
    roles = op_roles(layers)
    for v, roles_v in roles.items():
        saved[v] = any(OP_POLICY_KEEPS.get(role, False) for role in roles_v)
    loss = {v for v, layer in enumerate(network) if layer.loss}
    loss_only = np.array([v in loss or (bool(st.consumers.get(v)) and set(st.consumers[v]) <= loss)
                          for v in range(n)])
    recomputable = np.array([st.blocks[v] is not None for v in range(n)])
    inner = np.array([st.cores.get(v) in ("scores", "softmax") for v in range(n)])
    norms, mlp = _module_layers(layers, roles)
    up = _mla_up_layers(layers, roles)
    up_input = np.zeros(n, dtype=bool)
    for v in np.flatnonzero(up):
        for t in layers.network.layers[v].inputs:
            if t.producer is not None and not up[t.producer]:
                up_input[t.producer] = True
    return ActivationPlaces(read, saved, loss_only, recomputable, inner, norms, mlp, up, up_input)


def _module_layers(layers: PricedLayers, roles: dict) -> tuple:
    """``(module_norm, dense_mlp)`` masks of :class:`ActivationPlaces` (``roles``: :func:`op_roles`)."""
    network, st = layers.network.layers, layers.structure
    n = len(network)
    experts = st.experts
    moe_blocks = {st.blocks[v] for v in experts if st.blocks[v] is not None}
    mlp_inputs = {v for v, r in roles.items() if {"mlp_first_input", "mlp_input"} & set(r)}
    norms = np.zeros(n, dtype=bool)
    mlp = np.zeros(n, dtype=bool)
    for v, layer in enumerate(network):
        block = st.blocks[v]
        if block is None:
            continue
        readers = set(st.consumers.get(v, ()))
        if layer.normalisation:
            norms[v] = bool(readers & experts) or any("latent" in roles.get(u, ()) for u in readers)
            mlp[v] = block not in moe_blocks and bool(readers & mlp_inputs)
        elif block not in moe_blocks and v not in st.cores:
            written = set(output_roles(layer)[0])
            contracted = set(roles_of(layer)) - written
            mlp[v] = "mlp" in written or (v in roles and "mlp" in contracted)
    return norms, mlp


def _mla_up_layers(layers: PricedLayers, roles: dict) -> np.ndarray:
    """Per layer, whether Megatron-Core's ``mla_up_proj`` recomputation runs it again: in a block
    with multi-latent attention (a product of the ``latent`` role), every layer between the
    checkpoint's inputs and attention's core. megatron-core 0.16.1
    transformer/multi_latent_attention.py:714-845 checkpoints ``qkv_up_proj_and_rope_apply``
    (the query's up projection, or its whole projection without a query rank, the key-value up
    projection, each with the latent's norm fused in, and the rotary embeddings), its inputs the
    latents before their norms and the shared rotary key as the key-value down projection makes
    it, and discards its outputs once the core has run (:344-346). So: walking back from the
    core's inputs, every layer of the block up to a ``latent`` product, the norm before the
    block's attention (outside: it reads no latent) and a ``key`` product that reads no latent
    (the shared rotary key, a slice of the down projection's output in Megatron). ``roles``:
    :func:`op_roles`."""
    network, st = layers.network.layers, layers.structure
    n = len(network)
    out = np.zeros(n, dtype=bool)
    latent = {v for v, r in roles.items() if "latent" in r}
    if not latent:
        return out
    # Tensors made from a latent: what the up projections read.
    derived, todo = set(), list(latent)
    while todo:
        for w in st.consumers.get(todo.pop(), ()):
            if w not in derived and st.blocks[w] is not None and w not in st.cores:
                derived.add(w)
                todo.append(w)
    mla_blocks = {st.blocks[v] for v in latent}
    todo = [t.producer for v in st.cores for t in network[v].inputs
            if st.blocks[v] in mla_blocks and t.producer is not None and t.producer not in st.cores]
    while todo:
        u = todo.pop()
        if u is None or out[u] or st.blocks[u] not in mla_blocks or u in latent:
            continue
        if network[u].normalisation and u not in derived:
            continue  # the block's input norm
        if "key" in roles.get(u, ()) and u not in derived:
            continue  # the shared rotary key, made by the down projection
        out[u] = True
        todo.extend(t.producer for t in network[u].inputs)
    return out


# ---------------------------------------------------------------------------------------
# The policy


class RecomputePolicy:
    """Per layer, under a :class:`TrainingOptions`' ``recompute``: whether its forward runs
    again (:meth:`recomputed_mask`) and the activation elements it keeps
    (:meth:`stored_activations`) or holds while its block runs again (:meth:`working_activations`).
    """

    def __init__(self, layers: PricedLayers, places: ActivationPlaces):
        st = layers.structure
        self.places = places
        self.blocks, self.block_outputs, self.cores = st.blocks, st.block_outputs, st.cores
        self.configs = layers.configs
        #: Per layer, its output elements per device, per row.
        self.outputs = [parts.activations for parts in layers.parts]
        #: The RMSNorms run unfused under ``eager`` (:data:`EAGER_NORM_SAVED`).
        self.eager_norms = frozenset(v for v, layer in enumerate(layers.network.layers) if layer.eager_unfused)
        #: Elements a layer keeps inside itself besides its output (a mixture of experts'
        #: dispatched tokens, expert products and router probabilities), per row.
        #: The mixtures of experts (``moe_act`` discards their activation output).
        self.experts = {v: layers.network.layers[v] for v in sorted(layers.structure.experts)}
        self.internal = {v: np.asarray(layer.internal_activations(self.configs[v]), dtype=np.float64)
                         for v, layer in self.experts.items()}
        #: ``block_recomputed``'s masks by block count and chunks, and selective recomputation's
        #: by its modules.
        self._masks: dict = {}

    def block_order(self) -> list:
        """The repeated blocks' ids in the order their first layers come."""
        return list(dict.fromkeys(b for b in self.blocks if b is not None))

    def block_recomputed(self, layers: int, chunks=None) -> np.ndarray:
        """Per layer, whether ``recompute=block`` with ``recompute_layers=layers`` recomputes it:
        the layers of the first ``min(layers, c)`` repeated blocks of every chunk of ``c``
        consecutive blocks (Megatron-LM's ``--recompute-method block``, per pipeline stage and
        per model chunk of an interleaved schedule). ``chunks``: blocks per chunk in order
        (default one chunk of every block: no pipeline).

        Example: 4 blocks in chunks ``(2, 2)`` with ``layers=1`` recompute blocks 0 and 2."""
        order = self.block_order()
        chunks = (len(order),) if chunks is None else tuple(int(c) for c in chunks)
        key = (int(layers), chunks)
        masks = self._masks  # asked for layer by layer: each mask once
        if key in masks:
            return masks[key]
        if sum(chunks) != len(order):
            raise ValueError(f"chunks {chunks} hold {sum(chunks)} blocks; the network has {len(order)}")
        again, start = set(), 0
        for c in chunks:
            again.update(order[start: start + min(layers, c)])
            start += c
        mask = np.array([b is not None and b in again for b in self.blocks], dtype=bool)
        mask.setflags(write=False)
        masks[key] = mask
        return mask

    def recomputed_mask(self, options: TrainingOptions, chunks=None) -> np.ndarray:
        """Per layer, whether its forward runs again in the backward pass: every layer of a
        repeated block under full recomputation; under selective recomputation what its
        ``recompute_modules`` name (``core_attn``: attention's scores and softmax when attention
        is not fused, fused they are never stored; ``layernorm``: :attr:`ActivationPlaces.module_norm`;
        ``mlp``: :attr:`ActivationPlaces.dense_mlp`; ``moe_act`` reruns part of a layer,
        :meth:`expert_activation`); under ``op``
        every layer of a block but its output, the kept products and attention's core; under
        ``block`` :meth:`block_recomputed` (``chunks``: blocks per pipeline chunk)."""
        places = self.places
        if options.recompute == "full":
            return places.recomputable
        if options.recompute == "block":
            return self.block_recomputed(options.recompute_layers, chunks)
        if options.recompute == "selective":
            return self._selective_mask(options.recompute_modules, options.fused_attention, False)
        if options.recompute == "op":
            # Everything in a block but its output, the kept products and attention's core
            # (fused: one kernel whose output is kept; unfused: scores and softmax again).
            core = np.array([v in self.cores for v in range(len(places.recomputable))], dtype=bool)
            again = places.recomputable & ~places.op_saved & ~core & ~np.array(self.block_outputs, dtype=bool)
            return again | (places.attention_inner if not options.fused_attention else False)
        return np.zeros(len(places.recomputable), dtype=bool)

    def recomputed(self, v: int, options: TrainingOptions) -> bool:
        """Whether ``v``'s forward runs again in the backward pass (:meth:`recomputed_mask`)."""
        return bool(self.recomputed_mask(options)[v])

    def stored_activations(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Activation elements ``v`` keeps for the backward pass, per micro-batch (none for the
        loss and the logits only it reads; an eager RMSNorm :data:`EAGER_NORM_SAVED` times)."""
        places = self.places
        role = self.cores.get(v)
        policy = options.recompute
        if policy == "block":  # a recomputed block's layer as under full, any other as under none
            policy = "full" if self.recomputed_mask(options)[v] else "none"
        if places.loss_only[v]:
            return np.zeros(len(self.configs[v]))
        if role in ("scores", "softmax") and (options.fused_attention or policy in ("full", "op")
                                              or options.recomputes("core_attn")):
            return np.zeros(len(self.configs[v]))
        if policy == "full" and not self.block_outputs[v]:
            return np.zeros(len(self.configs[v]))
        if policy == "selective" and not self.block_outputs[v] and (
                (places.module_norm[v] and options.recomputes("layernorm"))
                or (places.dense_mlp[v] and options.recomputes("mlp"))
                or (places.mla_up[v] and options.recomputes("mla_up_proj"))
                or (v in self.experts and options.recomputes("moe"))):
            return np.zeros(len(self.configs[v]))
        if policy == "selective" and places.mla_up_input[v] and options.recomputes("mla_up_proj"):
            return self._kept(v, options)  # the checkpoint's input, read or not
        if policy == "op" and self.blocks[v] is not None and not (
                self.block_outputs[v] or places.op_saved[v] or role == "context"):
            return np.zeros(len(self.configs[v]))
        # No backward pass reads its output: nothing kept for it (an operator-level policy
        # keeps what it saves, read or not: PyTorch's selective checkpointing caches those
        # operators' outputs for the recomputation).
        if not (places.read_back[v] or self.block_outputs[v] or (policy == "op" and places.op_saved[v])):
            return self._internal(v, options)
        return self._kept(v, options)

    def working_activations(self, v: int, options: TrainingOptions) -> np.ndarray:
        """Activation elements alive while ``v``'s block runs its backward: under full
        recomputation what it keeps; under selective what it runs again (a module norm's or a
        dense MLP layer's output, a mixture of experts' activation under ``moe_act``), none else."""
        role = self.cores.get(v)
        zeros = np.zeros(len(self.configs[v]))
        if role in ("scores", "softmax") and options.fused_attention:
            return zeros
        if options.recompute == "selective":
            if v in self.experts and options.recomputes("moe"):  # the whole layer again
                return self.outputs[v] + self.internal[v]
            if v in self.experts and (options.recomputes("moe_act") or options.recomputes("shared_experts")):
                return self._rerun_inside(v, options)
            return self.outputs[v] if self.working_mask(options)[v] else zeros
        if not (self.places.read_back[v] or self.block_outputs[v]):
            return self._internal(v, options)
        return self._kept(v, options)

    def expert_activation(self, v: int) -> np.ndarray:
        """The routed experts' activation output of mixture of experts ``v`` per device, per
        row (``MoE.activation_elements``); zeros for any other layer."""
        if v not in self.experts:
            return np.zeros(len(self.configs[v]))
        return np.asarray(self.experts[v].activation_elements(self.configs[v]), dtype=np.float64)

    def shared_expert(self, v: int) -> np.ndarray:
        """The shared experts' products and activation of mixture of experts ``v`` per device,
        per row (``MoE.shared_elements``); zeros for any other layer."""
        if v not in self.experts:
            return np.zeros(len(self.configs[v]))
        return np.asarray(self.experts[v].shared_elements(self.configs[v]), dtype=np.float64)

    def working_mask(self, options: TrainingOptions, chunks=None) -> np.ndarray:
        """Per layer, whether it holds a working set while its block runs its backward: the
        layers :meth:`recomputed_mask` reruns (under selective only the modules beyond
        ``core_attn``: attention's recomputed scores are not counted, as before the modules),
        and under ``moe_act`` the mixtures of experts."""
        if options.recompute != "selective":
            return self.recomputed_mask(options, chunks)
        return self._selective_mask(options.recompute_modules, options.fused_attention, True)

    def _selective_mask(self, modules: tuple, fused: bool, working: bool) -> np.ndarray:
        """Per layer, what selective recomputation of ``modules`` reruns (``working``: the layers
        holding a working set, :meth:`working_mask`), kept by its arguments (asked for layer by
        layer: each mask once)."""
        key = ("selective", modules, fused, working)
        masks = self._masks
        if key in masks:
            return masks[key]
        places = self.places
        again = np.zeros(len(places.recomputable), dtype=bool)
        if "core_attn" in modules and not fused and not working:
            again = again | places.attention_inner
        if "layernorm" in modules:
            again = again | places.module_norm
        if "mla_up_proj" in modules:
            again = again | places.mla_up
        if "mlp" in modules:
            again = again | places.dense_mlp
        if self.experts and ("moe" in modules or (working and {"moe_act", "shared_experts"} & set(modules))):
            again[list(self.experts)] = True
        again.setflags(write=False)
        masks[key] = again
        return again

    def _internal(self, v: int, options: TrainingOptions) -> np.ndarray:
        """What ``v`` keeps inside itself besides its output (a mixture of experts', less what
        :meth:`_rerun_inside` runs again; nothing under ``moe``)."""
        if v not in self.internal or (v in self.experts and options.recomputes("moe")):
            return np.zeros(len(self.configs[v]))
        return self.internal[v] * np.ones(len(self.configs[v])) - self._rerun_inside(v, options)

    def _rerun_inside(self, v: int, options: TrainingOptions) -> np.ndarray:
        """What mixture of experts ``v`` no longer keeps inside itself and runs again: its experts'
        activation under ``moe_act``, its shared experts' outputs under ``shared_experts``."""
        out = np.zeros(len(self.configs[v]))
        if options.recomputes("moe_act"):
            out = out + self.expert_activation(v)
        if options.recomputes("shared_experts"):
            out = out + self.shared_expert(v)
        return out

    def _kept(self, v: int, options: TrainingOptions) -> np.ndarray:
        if options.eager and v in self.eager_norms:
            return EAGER_NORM_SAVED * self.outputs[v]
        if v in self.internal:
            return self.outputs[v] + self._internal(v, options)
        return self.outputs[v]
