"""Handlers of the GEMM-shaped operations: linear, matmul, addmm, einsum, attention and
embedding."""

from __future__ import annotations

import math

from ..errors import Unmappable
from .common import _softmax_view
from ..protos import ProtoEmbedding, ProtoGemm
from ..values import Atom, View, _big, _dependent, _freeze, _leaves, _regroup, _unify
from .registry import handles


def _dim_atoms(view: View, dim: int) -> list:
    """The atoms of ``view``'s dimension ``dim``, with its size-1 atom when it has one.

    A view that is exactly its layer output knows which size-1 dimension of the output is
    which (a batch of 1, a kept dimension); other views drop them.
    """
    if view.base.shape() == view.shape and all(len(_leaves(d)) <= 1 for d in view.dims):
        leaves = view.base.leaves()
        if all(not d or _leaves(d)[0] is leaves[i] for i, d in enumerate(view.dims)):
            return [leaves[dim]]
    return _big(view.dims[dim])


def _pairable(xs: list, ys: list) -> bool:
    """Whether two atom sequences pair (``_unify``) without touching the atoms themselves."""
    stand_in = [[Atom(a.size, frozen=a.frozen) for a in atoms if a.size > 1] for atoms in (xs, ys)]
    return _unify(*stand_in) is not None


def _align(imp, node, operands, views) -> list:
    """Two batch-dependent operands sharing a dimension that one has merged into a single frozen
    atom (a Reshape's output: a norm of heads laid out anew) and the other keeps as the frozen
    atoms it merged (Swin-v2's windows times heads): the finer operand reshaped as well, so that
    both read the dimension as one atom (and the other too, where it is split otherwise)."""
    if len(views) != 2 or any(v is None for v in views):
        return views
    (_, spec_a), (_, spec_b) = operands
    dims_b = {letter: dim for letter, dim in spec_b}
    for letter, dim_a in spec_a:
        dim_b = dims_b.get(letter)
        if not isinstance(dim_a, int) or not isinstance(dim_b, int):
            continue
        atoms = [[a for a in _dim_atoms(v, d) if a.size > 1] for v, d in zip(views, (dim_a, dim_b))]
        sizes = [math.prod(a.size for a in side) for side in atoms]
        if sizes[0] != sizes[1] or _pairable(*atoms):
            continue
        views = list(views)
        finer = 0 if len(atoms[0]) > len(atoms[1]) else 1
        for side in (finer, 1 - finer):
            if len(atoms[side]) > 1:
                views[side] = imp._reshape(views[side], node)
                atoms[side] = [a for a in _dim_atoms(views[side], (dim_a, dim_b)[side]) if a.size > 1]
                if _pairable(*atoms):
                    break
    return views


def _contract(imp, node, suffix, operands, out_letters, pw=0, hints=None, roles=None):
    """Record the product of two operands given as ``(value, [(letter, dim)])``.

    ``dim`` is a dimension index of the operand or, for a view, an explicit tuple of its
    atoms. Letters name torch-level dimensions: a batch-dependent operand's dimension brings
    its atoms (the same letter in both operands pairs their atoms, refining them where the
    sizes differ); a replicated operand (a weight) takes the other operand's atoms, or fresh
    ones for its own dimensions. The output has fresh atoms. Returns the output view, its
    dimensions in ``out_letters`` order. ``roles``: the dimension role (``pase.model.roles``)
    of a letter, declared by the handler.
    """
    hints = hints or {}
    views = _align(imp, node, operands, _operand_views(imp, node, operands))
    letters = _Letters()
    for side, ((value, spec), view) in enumerate(zip(operands, views)):
        for letter, dim in spec:
            letters.add(letter, dim, side, value, view, hints)
    key_roles = _key_roles(roles or {}, letters.atoms_of)
    weight_side = next((i for i, v in enumerate(views) if v is None), None)
    for letter, size in letters.sizes.items():
        if letter not in letters.atoms_of:
            # A weight's own dimension: a fresh atom, refinable (its weight is ours to shape).
            letters.atoms_of[letter] = [(Atom(size, hints.get(letter, "n")), weight_side)] if size > 1 else []
    specs = []
    for side, ((value, spec), view) in enumerate(zip(operands, views)):
        if view is not None:
            specs.append(["view", view])
        else:
            specs.append(["weight", [pair for letter, _ in spec for pair in letters.atoms_of[letter]],
                          bool(value.param), "weight"])
    sources: dict = {}
    out_dims = _output_dims(out_letters, letters, views, hints, sources)
    proto = ProtoGemm(None, specs, letters.alias, sources)
    proto.hints = letters.key_hints
    proto.roles = key_roles
    base = proto.output([a for dim in out_dims for a in dim])
    _keep_unit_dims(proto, views, base, sources)
    if weight_side is not None:
        _own_dimension(proto, specs, weight_side, base, sources)
    proto.check()
    if weight_side is not None:
        imp._claim(proto, 0, operands[weight_side][0])
    proto.name = imp._name(node, suffix, leaf=True)
    proto.pw_ops = {f"{node.name}#{i}" for i in range(pw)}
    imp._record(proto)
    return View(base, tuple(tuple(a for a in dim if a.size > 1) for dim in out_dims))


def _operand_views(imp, node, operands) -> list:
    """Each operand's view (its pending point-wise ops charged), ``None`` for a replicated one."""
    views = []
    for value, _ in operands:
        if _dependent(value):
            view = imp._view(value, node)
            imp._charge(view)
            views.append(view)
        else:
            if value.shape is None:
                raise Unmappable("a product with a non-tensor operand")
            views.append(None)
    return views


class _Letters:
    """The letters of a product (:func:`_contract`) as its operands name them: per letter its
    size and its atoms as ``(atom, side)`` pairs; ``alias`` pairs the keys ``(side, id(atom))``
    of atoms two operands share; ``key_hints`` the hints the handler gave the atoms' letters."""

    def __init__(self):
        self.sizes: dict = {}
        self.atoms_of: dict = {}
        self.alias: dict = {}
        self.key_hints: dict = {}

    def add(self, letter, dim, side: int, value, view, hints: dict) -> None:
        """Operand ``side``'s dimension ``dim`` named ``letter``."""
        sizes = self.sizes
        if view is None:
            size = value.shape[dim]
            if letter in sizes and size not in (1, sizes[letter]) and sizes[letter] != 1:
                raise Unmappable(f"a dimension is {sizes[letter]} in one operand and {size} in the other")
            sizes[letter] = max(size, sizes.get(letter, 1))
            return
        atoms = _dim_atoms(view, dim) if isinstance(dim, int) else list(dim)
        size = math.prod(a.size for a in atoms)
        if letter in hints:
            for a in atoms:
                self.key_hints[(side, id(a))] = hints[letter]
                if a.hint in ("", "n"):  # name the producer's letters too (display only)
                    a.hint = hints[letter]
        if letter in sizes and size not in (1, sizes[letter]) and sizes[letter] != 1:
            raise Unmappable(f"a dimension is {sizes[letter]} in one operand and {size} in the other")
        if size < sizes.get(letter, 1) or (size == 1 and not atoms):
            sizes.setdefault(letter, size)
            return  # broadcast against the other operand, which names the dimension
        if size > sizes.get(letter, 1):
            self.atoms_of.pop(letter, None)
        sizes[letter] = size
        if letter not in self.atoms_of:
            self.atoms_of[letter] = [(a, side) for a in atoms]
            return
        self._pair(letter, atoms, side, size)

    def _pair(self, letter, atoms: list, side: int, size: int) -> None:
        """The letter's atoms in the other operand and ``atoms`` paired (refined alike)."""
        mine = [a for a, _ in self.atoms_of[letter]]
        other_side = self.atoms_of[letter][0][1] if self.atoms_of[letter] else side
        if size > 1:
            mine, atoms = [a for a in mine if a.size > 1], [a for a in atoms if a.size > 1]
        pairs = _unify(mine, atoms)
        if pairs is None:
            raise Unmappable("a dimension is split differently in its two operands")
        chosen = []
        for x, y in pairs:
            kx, ky = (other_side, id(x)), (side, id(y))
            if x.broadcast and not y.broadcast:
                self.alias[kx] = ky
                chosen.append((y, side))
            else:
                self.alias[ky] = kx
                chosen.append((x, other_side))
            for a in (x, y):
                if not a.broadcast:
                    a.frozen = True
        self.atoms_of[letter] = chosen


def _key_roles(roles: dict, atoms_of: dict) -> dict:
    """The dimension role of each atom key ``(side, id(atom))`` of a letter the handler declared."""
    key_roles: dict = {}
    for letter, role in roles.items():
        # A tuple names the letter's atoms one by one (grouped heads: groups, then heads).
        pairs = [(a, side) for a, side in atoms_of.get(letter, []) if a.size > 1]
        for i, (a, side) in enumerate(pairs):
            key_roles[(side, id(a))] = role if isinstance(role, str) else role[min(i, len(role) - 1)]
    return key_roles


def _output_dims(out_letters, letters: _Letters, views: list, hints: dict, sources: dict) -> list:
    """The output's atoms per letter: a fresh copy of every operand atom it keeps (frozen, with
    the original), the weight's own atoms themselves (``sources``: where each came from)."""
    out_dims = []
    for letter in out_letters:
        dim = []
        for atom, side in letters.atoms_of[letter]:
            if views[side] is None:
                sources[id(atom)] = ("own", side)
                dim.append(atom)
            else:
                atom.frozen = True
                hint = hints.get(letter) or letters.key_hints.get((side, id(atom))) or atom.hint
                copy = Atom(atom.size, hint, frozen=True, batch=atom.batch)
                sources[id(copy)] = ("copy", (side, id(atom)))
                dim.append(copy)
        out_dims.append(dim)
    return out_dims


def _keep_unit_dims(proto, views: list, base, sources: dict) -> None:
    """Size-1 dimensions of the operands that no letter names stay in the output."""
    terms = proto.terms()
    for side, view in enumerate(views):
        if view is None:
            continue
        named = set(terms[1 - side]) | set(terms[2])
        for leaf in view.base.leaves():
            key = proto._key(side, leaf)
            if leaf.size == 1 and key not in named:
                copy = Atom(1, leaf.hint, frozen=True, batch=leaf.batch)
                sources[id(copy)] = ("copy", key)
                base.atoms.append(copy)
                named.add(key)


def _own_dimension(proto, specs: list, weight_side: int, base, sources: dict) -> None:
    """A GEMM needs a dimension of each operand alone in the output (its M and N): a product
    with a replicated vector gets a size-1 one in the vector and the output."""
    terms = proto.terms()
    own = set(terms[weight_side]) - set(terms[1 - weight_side])
    if not own & set(terms[2]):
        unit = Atom(1, "u")
        specs[weight_side][1].append((unit, weight_side))
        sources[id(unit)] = ("own", weight_side)
        base.atoms.append(unit)


def _dims_spec(value, letters):
    return [(letter, i) for i, letter in enumerate(letters)]


@handles({"linear"})
def handle_linear(imp, node, name, x, weight, bias=None):
    if _dependent(bias):
        raise Unmappable("a batch-dependent bias")
    rank = len(x.shape)
    lead = [f"x{i}" for i in range(rank - 1)]
    out = _contract(imp, node, "linear", [(x, _dims_spec(x, lead + ["K"])), (weight, _dims_spec(weight, ["N", "K"]))],
                    lead + ["N"])
    _bias(imp, out, bias)
    return out


def _bias(imp, out: View, bias) -> None:
    """A learnt bias added to a product's output: a parameter of the product's layer."""
    proto = out.base.proto
    if bias is not None and proto.claims and imp._claim(proto, 1, bias):
        proto.bias = True


def _matmul_letters(ra: int, rb: int):
    if ra < 1 or rb < 1:
        raise Unmappable("a product with a scalar")
    batch = max(ra, rb) - 2
    names = [f"B{i}" for i in range(max(batch, 0))]
    if ra == 1:
        a = ["K"]
    else:
        a = names[len(names) - (ra - 2):] + ["M", "K"] if ra >= 2 else []
    if rb == 1:
        b = ["K"]
    else:
        b = names[len(names) - (rb - 2):] + ["K", "N"]
    out = list(names) if ra >= 2 and rb >= 2 else []
    if ra >= 2 and rb >= 2:
        out += ["M", "N"]
    elif ra >= 2:
        out = a[:-1]
    else:
        out = b[:-2] + ["N"]
    return a, b, out


@handles({"matmul", "mm", "bmm"})
def handle_matmul(imp, node, name, a, b, *rest):
    ra, rb = len(a.shape), len(b.shape)
    la, lb, lo = _matmul_letters(ra, rb)
    return _contract(imp, node, "matmul", [(a, _dims_spec(a, la)), (b, _dims_spec(b, lb))], lo)


@handles({"addmm", "baddbmm", "addbmm_identity"})
def handle_addmm(imp, node, name, bias, a, b, *rest, **kwargs):
    if _dependent(bias):
        raise Unmappable("a batch-dependent bias")
    out = handle_matmul(imp, node, "matmul", a, b)
    _bias(imp, out, bias)
    return out


@handles({"einsum"})
def handle_einsum(imp, node, name, equation, operands, *rest):
    operands = list(operands)
    if len(operands) != 2:
        raise Unmappable(f"an einsum of {len(operands)} operands")
    eq = equation.replace(" ", "")
    if "->" not in eq:
        inputs = eq
        counts = {}
        for c in inputs.replace(",", ""):
            counts[c] = counts.get(c, 0) + 1
        eq = inputs + "->" + "".join(sorted(c for c, n in counts.items() if n == 1))
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if "." in eq:
        raise Unmappable("an einsum with an ellipsis")
    if len(terms) != 2 or any(len(t) != len(v.shape) for t, v in zip(terms, operands)):
        raise Unmappable(f"an einsum {equation!r} that does not match its operands")
    return _contract(imp, node, "einsum", [(operands[0], _dims_spec(operands[0], list(terms[0]))),
                                            (operands[1], _dims_spec(operands[1], list(terms[1])))], list(out))


@handles({"scaled_dot_product_attention"})
def handle_sdpa(imp, node, name, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):
    """Attention: the scores Einsum, a Softmax over the keys, the context Einsum.

    The scale and a mask (or causality) are point-wise operations on the scores; dropout
    acts on the softmax's output and is dropped, as after any softmax.
    """
    if _dependent(attn_mask):
        raise Unmappable("an attention mask that depends on the batch")
    if not (_dependent(q) and _dependent(k) and _dependent(v)):
        raise Unmappable("attention with a replicated query, key or value")
    q, k, v = (imp._view(t, node) for t in (q, k, v))
    rank = len(q.dims)
    if rank < 3 or len(k.dims) != rank or len(v.dims) != rank:
        raise Unmappable("attention operands without a batch dimension, or of different ranks")
    batch = [f"B{i}" for i in range(rank - 3)]
    gqa = False
    q_spec = [(x, i) for i, x in enumerate(batch)]
    k_spec = [(x, i) for i, x in enumerate(batch)]
    v_spec = [(x, i) for i, x in enumerate(batch)]
    out_batch = list(batch)
    if rank >= 3:
        heads_q, heads_k = q.shape[rank - 3], k.shape[rank - 3]
        if heads_q == heads_k:
            q_spec.append(("H", rank - 3))
            k_spec.append(("H", rank - 3))
            v_spec.append(("H", rank - 3))
            out_batch.append("H")
        else:
            if heads_k == 0 or heads_q % heads_k or v.shape[rank - 3] != heads_k:
                raise Unmappable(f"grouped-query attention with {heads_q} query heads and {heads_k} key heads")
            groups = _regroup(_big(q.dims[rank - 3]), (heads_k, heads_q // heads_k))
            if groups is None:
                raise Unmappable("grouped-query attention whose query heads cannot be grouped")
            q_spec += [("H", groups[0]), ("R", groups[1])]
            k_spec.append(("H", rank - 3))
            v_spec.append(("H", rank - 3))
            out_batch += ["H", "R"]
            gqa = True
    pw = 1 + (1 if attn_mask is not None or is_causal else 0)
    hints = {"B0": "b", "H": "g" if gqa else "h", "R": "r", "L": "l", "S": "m", "E": "k", "V": "k"}
    # What attention's dimensions are (pase.model.roles): grouped heads are key/value groups
    # and query heads per group; the projections around take these roles along the tensors.
    # Key/value heads repeated to the query heads (``repeat_kv``): the key's head dimension is
    # its groups then a broadcast of the heads per group.
    repeated = [a.broadcast for a in _big(k.dims[rank - 3]) if a.size > 1] == [False, True]
    heads = "heads" if not repeated else ("kv_groups", "heads")
    roles = {"B0": "batch", "H": "kv_groups" if gqa else heads, "R": "heads", "L": "sequence",
             "S": "key_sequence", "E": "head_width", "V": "head_width"}
    scores = _contract(imp, node, "scores", [(q, q_spec + [("L", rank - 2), ("E", rank - 1)]),
                                              (k, k_spec + [("S", rank - 2), ("E", rank - 1)])],
                       out_batch + ["L", "S"], pw=pw, hints=hints, roles=roles)
    # Causal: asked for (is_causal), or a mask over square scores that an attention module
    # declaring itself causal built (Hugging Face attentions carry ``is_causal``; under
    # torch.export they pass the causal mask as a tensor).
    owner = imp.module_of(node) if attn_mask is not None and not is_causal else None
    causal = bool(is_causal) or (getattr(owner, "is_causal", None) is True and q.shape[rank - 2] == k.shape[rank - 2])
    weights = _softmax_view(imp, node, scores, len(scores.dims) - 1, causal=causal)
    # The weights' dimensions, in the letters of the scores.
    w_spec = [(x, tuple(weights.dims[i])) for i, x in enumerate(out_batch + ["L", "S"])]
    context = _contract(imp, node, "context", [(weights, w_spec),
                                               (v, v_spec + [("S", rank - 2), ("V", rank - 1)])],
                        out_batch + ["L", "V"], hints=hints, roles=roles)
    if not gqa:
        return context
    # Grouped heads: (..., g, r, l, v) back to the (..., h, l, v) of the torch output.
    dims = list(context.dims)
    merged = dims[len(batch)] + dims[len(batch) + 1]
    return View(context.base, tuple(dims[: len(batch)] + [merged] + dims[len(batch) + 2:]), context.ops)


@handles({"embedding"})
def handle_embedding(imp, node, name, weight, indices, *rest):
    if _dependent(weight):
        raise Unmappable("an embedding table that depends on the batch")
    view = imp._view(indices, node)
    if view.base.proto is not None:
        raise Unmappable("token ids computed by a layer (PaSE's Embedding reads graph inputs)")
    if any(a.broadcast for dim in view.dims for a in _leaves(dim)):
        raise Unmappable("expanded token ids")
    # The lookup reads the ids as given; a view of them (a flatten, a transpose) is a view
    # of the lookup's output, which is the ids' shape and the embedding width.
    _freeze(view.base.atoms)
    vocab, width = weight.shape
    proto = imp._record(ProtoEmbedding(imp._name(node, "embedding", leaf=True), view.base, vocab, width))
    imp._claim(proto, 0, weight)
    out = proto.output(view.base.leaves() + [Atom(width, "e", frozen=True)])
    return View(out, tuple(view.dims) + ((out.atoms[-1],),))
