"""Proto-layers: the layers recorded during the walk, built into PaSE layers once every
refinement of their dimensions is known."""

from __future__ import annotations

from pase.model import layers as L
from pase.model.builder import GraphBuilder

from .errors import Unmappable
from .values import Atom, TracedTensor


class ProtoLayer:
    """A layer recorded while walking the graph; ``emit`` builds the PaSE layer at the end."""

    has_pw = False

    def __init__(self, name: str):
        self.name = name
        self.pw_ops: set = set()
        self.outputs: list = []
        #: ``(entry, name)``: the model parameter ``name`` is entry ``entry`` of the layer's
        #: ``parameters()`` (its weight, bias, scale).
        self.claims: list = []

    def output(self, atoms, index: int = 0) -> TracedTensor:
        base = TracedTensor(atoms, self, index)
        self.outputs.append(base)
        return base

    @property
    def pw(self) -> int:
        return len(self.pw_ops)


class Emitter:
    """Builds the PaSE layers of the protos, in order, with one GraphBuilder.

    ``claimers``: per model parameter, the protos that hold it as their own (several: a
    tied tensor); ``held``: per proto, the shapes of the parameters no layer holds that it
    carries for the memory models (``Layer.share``).
    """

    def __init__(self, builder: GraphBuilder, claimers=None, held=None, blocks=None):
        self.g = builder
        self.blocks = blocks or {}  # layer name -> its repeated block (a module path), if any
        self.tensors: dict = {}  # id(TracedTensor) -> pase Tensor
        self.claimers = claimers or {}
        self.held = held or {}

    def shared(self, proto) -> tuple:
        """``(tied, held)`` of the layer of ``proto``: see ``Layer.share``."""
        tied = None
        if any(len(self.claimers.get(name, ())) > 1 for _, name in proto.claims):
            tied = [None] * (1 + max(entry for entry, _ in proto.claims))
            for entry, name in proto.claims:
                if len(self.claimers[name]) > 1:
                    tied[entry] = name
        return tied, self.held.get(id(proto), [])

    def tensor(self, base: TracedTensor):
        if id(base) not in self.tensors:
            if base.proto is not None:
                raise AssertionError(f"layer output {base.name!r} read before it was built")
            leaves = base.leaves()
            self.tensors[id(base)] = self.g.input(tuple(a.size for a in leaves), base.name, _letters(leaves))
        return self.tensors[id(base)]

    def constant(self, shape, name: str):
        """A replicated operand of a data-movement layer (a Concat): a graph input."""
        return self.g.input(tuple(shape), name)

    def add(self, proto: ProtoLayer, layer, roles=None) -> None:
        tied, held = self.shared(proto)
        if tied is not None:
            tied = (tied + [None] * len(layer.parameters()))[:len(layer.parameters())]
        if tied is not None or held:
            layer.share(tied, held)
        outs = self.g.add(proto.name, layer, roles=roles, block=self.blocks.get(proto.name))
        outs = outs if isinstance(outs, tuple) else (outs,)
        for base, t in zip(proto.outputs, outs):
            self.tensors[id(base)] = t


_PREFERRED = "bcdefghijklmnopqrstuvwxyza"


def _letters(atoms, avoid: str = "", keys=None) -> str:
    """One display letter per atom, from the atoms' hints, distinct per distinct key.

    ``keys`` (default: the atoms themselves) says which entries are the same dimension.
    """
    keys = [id(a) for a in atoms] if keys is None else list(keys)
    given: dict = {}
    used = set(avoid)
    out = []
    for atom, key in zip(atoms, keys):
        if key not in given:
            letter = atom.hint if atom.hint and atom.hint not in used else next(
                (c for c in _PREFERRED if c not in used), None)
            if letter is None:
                raise Unmappable("more than 26 distinct dimensions in one layer")
            used.add(letter)
            given[key] = letter
        out.append(given[key])
    return "".join(out)


def _batch_position(leaves) -> int | None:
    return next((i for i, a in enumerate(leaves) if a.batch), None)


def _index_of(leaves, atom) -> int:
    for i, leaf in enumerate(leaves):
        if leaf is atom:
            return i
    raise AssertionError("atom not among the leaves")


class ProtoGemm(ProtoLayer):
    """linear, matmul, bmm, addmm, einsum, attention's two products: an FC or an Einsum.

    ``operands``: two entries, ``("view", View)`` (a batch-dependent tensor, read as its
    layer output) or ``("weight", [(atom, side)], param, suffix)`` (a replicated operand: a
    graph input whose dimensions are the atoms, each named as in operand ``side``).

    Letters are *keys* ``(side, atom)``: the same atom read by both operands (q and k are
    two outputs of one Unstack) is two letters unless the product pairs it. ``alias`` maps
    the key of one paired atom to the other's; ``sources`` says, per output atom, the key it
    copies (``("copy", key)``) or that it is a weight's own dimension (``("own", side)``).
    """

    has_pw = True

    def __init__(self, name, operands, alias, sources):
        super().__init__(name)
        self.operands = operands
        self.alias = alias
        self.sources = sources
        self.atoms: dict = {}  # key -> atom, for sizes and hints
        self.hints: dict = {}  # key -> display letter wanted for it
        self.roles: dict = {}  # key -> dimension role its handler declared (pase.model.roles)
        self.bias = False  # a learnt bias is added to its output

    def _key(self, side, atom):
        key = (side, id(atom))
        self.atoms.setdefault(key, atom)
        key = self.alias.get(key, key)
        return key

    def terms(self) -> tuple:
        """The keys of A, of B and of the output, in each tensor's dimension order."""
        terms = []
        for side, op in enumerate(self.operands):
            if op[0] == "view":
                terms.append([self._key(side, leaf) for leaf in op[1].base.leaves()])
            else:
                terms.append([self._key(src, leaf) for atom, src in op[1] for leaf in atom.leaves()
                              if not leaf.broadcast])
        out = []
        for atom in self.outputs[0].atoms:
            how, what = self.sources[id(atom)]
            if how == "copy":
                out.append(self.alias.get(what, what))
            else:
                out.extend(self._key(what, leaf) for leaf in atom.leaves())
        terms.append(out)
        return tuple(terms)

    def check(self) -> None:
        """Raise ``Unmappable`` unless the letters make a valid Einsum (spec, Einsum row)."""
        a, b, out = self.terms()
        sa, sb, so = set(a), set(b), set(out)
        if len(so | sa | sb) > 26:
            raise Unmappable("more than 26 distinct dimensions in one product")
        if len(sa) != len(a) or len(sb) != len(b) or len(so) != len(out):
            raise Unmappable("a dimension repeats within one operand (a diagonal)")
        if (sa - sb - so) or (sb - sa - so) or (so - sa - sb):
            raise Unmappable("a dimension that is summed over in one operand only")
        if not (so & sa) - sb or not (so & sb) - sa:
            raise Unmappable("a matrix-vector product of two batch-dependent tensors")

    def emit(self, em: Emitter) -> None:
        ta, tb, to = self.terms()
        atom = self.atoms.__getitem__
        if [op[0] for op in self.operands] == ["view", "weight"] and self._is_fc(ta, tb, to):
            x = em.tensor(self.operands[0][1].base)
            em.add(self, L.FC(x, atom(to[-1]).size, pw=self.pw, bias=self.bias,
                              letters=_letters([self._hinted(k) for k in ta[:-1]], avoid="nk", keys=ta[:-1])),
                   roles=self._roles(list(ta[:-1]) + [to[-1], ta[-1]]))
            return
        order = list(dict.fromkeys(to + ta + tb))
        letters = dict(zip(order, _letters([self._hinted(k) for k in order], keys=order)))
        tensors = []
        for op, term in zip(self.operands, (ta, tb)):
            word = "".join(letters[k] for k in term)
            if op[0] == "view":
                tensors.append(em.tensor(op[1].base))
            else:
                shape = tuple(atom(k).size for k in term)
                name = f"{self.name}.{op[3]}"
                tensors.append(em.g.weight(shape, name, word) if op[2] else em.g.input(shape, name, word))
        words = ["".join(letters[k] for k in term) for term in (ta, tb, to)]
        position = _batch_position([atom(k) for k in to])
        batch = words[2][position] if position is not None else None
        layer = L.Einsum(f"{words[0]},{words[1]}->{words[2]}", tensors[0], tensors[1], pw=self.pw, batch=batch,
                         bias=self.bias)
        key_of = {letter: key for key, letter in letters.items()}
        em.add(self, layer, roles=self._roles([key_of[d] for d in layer.dims]))

    def _roles(self, keys) -> tuple | None:
        """The declared role of every key in ``keys`` (None where none was), or None if none was."""
        roles = tuple(self.roles.get(k) for k in keys)
        return roles if any(roles) else None

    def _hinted(self, key):
        """The atom of ``key``, or a stand-in with the hint the product asked for."""
        atom = self.atoms[key]
        hint = self.hints.get(key)
        return atom if not hint else Atom(atom.size, hint)

    def _is_fc(self, ta, tb, to) -> bool:
        """An FC reads its input as laid out, contracts its last dim and appends one unit dim."""
        if len(ta) < 2 or len(tb) != 2 or len(to) != len(ta):
            return False
        k, n = ta[-1], to[-1]
        if set(tb) != {k, n} or k == n or ta[:-1] != to[:-1]:
            return False
        return _batch_position([self.atoms[x] for x in ta]) in (0, None)


class ProtoConv(ProtoLayer):
    has_pw = True

    def __init__(self, name, x, filters, kernel, stride, pad, groups=1):
        super().__init__(name)
        self.x, self.filters, self.kernel, self.stride, self.pad = x, filters, kernel, stride, pad
        self.groups = groups
        self.bias = False

    def emit(self, em):
        em.add(self, L.Conv(em.tensor(self.x), self.filters, self.kernel, self.stride, self.pad, pw=self.pw,
                            bias=self.bias, groups=self.groups))


class ProtoPooling(ProtoLayer):
    def __init__(self, name, x, window, stride, pad):
        super().__init__(name)
        self.x, self.window, self.stride, self.pad = x, window, stride, pad

    def emit(self, em):
        em.add(self, L.Pooling(em.tensor(self.x), self.window, self.stride, self.pad))


class ProtoEmbedding(ProtoLayer):
    def __init__(self, name, ids, vocab, width):
        super().__init__(name)
        self.ids, self.vocab, self.width = ids, vocab, width

    def emit(self, em):
        ids = em.tensor(self.ids)
        letters = _letters(self.ids.leaves(), avoid="dv")
        layer = L.Embedding(ids, self.vocab, self.width, letters=letters)
        # Token ids of shape (batch, tokens), as language models take them: their second
        # dimension is the sequence (the layer type names its width and vocabulary).
        roles = ("batch", "sequence", None, None) if len(self.ids.leaves()) == 2 else None
        em.add(self, layer, roles=roles)


class ProtoElementwise(ProtoLayer):
    """``combine``: ``add`` for a sum or difference (``aten.add``, ``sub``, ``rsub``: the gradient
    passes through, its backward reads no operand), ``multiply`` for the rest (a product or
    quotient reads its operands)."""

    has_pw = True

    def __init__(self, name, a, b, combine: str = "multiply"):
        super().__init__(name)
        self.a, self.b = a, b
        self.combine = combine

    def emit(self, em):
        em.add(self, L.Elementwise(em.tensor(self.a), em.tensor(self.b), pw=self.pw, combine=self.combine))


class ProtoNorm(ProtoLayer):
    """Norm, RMSNorm (over the atom ``axis``) or BatchNorm (axis 0 by definition)."""

    has_pw = True

    def __init__(self, name, kind, x, axis=None):
        super().__init__(name)
        self.kind, self.x, self.axis = kind, x, axis

    def emit(self, em):
        x = em.tensor(self.x)
        learnt = len(self.claims)  # the learnt vectors the model has (none, a scale, and a shift)
        if self.kind == "BatchNorm":
            em.add(self, L.BatchNorm(x, pw=self.pw, learnt=min(learnt, 2)))
        else:
            cls = L.RMSNorm if self.kind == "RMSNorm" else L.Norm
            em.add(self, cls(x, axis=_index_of(self.x.leaves(), self.axis), pw=self.pw,
                             learnt=min(learnt, cls.n_params)))


class ProtoSoftmax(ProtoLayer):
    """A Softmax over the atom ``axis``, or over several atoms together (a list); ``causal``:
    an attention softmax masked to the keys at or before each query."""

    def __init__(self, name, x, axis, causal: bool = False):
        super().__init__(name)
        self.x, self.axis, self.causal = x, axis, causal

    def emit(self, em):
        leaves = self.x.leaves()
        if isinstance(self.axis, list):
            axis = [_index_of(leaves, a) for a in self.axis]
            axis = axis[0] if len(axis) == 1 else axis
        else:
            axis = _index_of(leaves, self.axis)
        em.add(self, L.Softmax(em.tensor(self.x), axis=axis, causal=self.causal))


class ProtoReduceMean(ProtoLayer):
    def __init__(self, name, x, axes):
        super().__init__(name)
        self.x, self.axes = x, axes

    def emit(self, em):
        leaves = self.x.leaves()
        axes = sorted(_index_of(leaves, a) for a in self.axes)
        em.add(self, L.ReduceMean(em.tensor(self.x), axes))


class ProtoLoss(ProtoLayer):
    """The loss over the model's output; ``classes``: the role of its last dimension (the
    vocabulary of a language model, else ``classes``)."""

    def __init__(self, name, x, classes: str = "classes"):
        super().__init__(name)
        self.x = x
        self.classes = classes

    def emit(self, em):
        layer = L.SoftmaxCrossEntropy(em.tensor(self.x))
        em.add(self, layer, roles=(None,) * (len(layer.domain) - 1) + (self.classes,))


class ProtoConcat(ProtoLayer):
    """Concat (``stack`` false) or Stack of layer outputs and replicated operands."""

    def __init__(self, name, items, axis, stack):
        super().__init__(name)
        self.items, self.axis, self.stack = items, axis, stack

    def emit(self, em):
        tensors = [
            em.tensor(item) if isinstance(item, TracedTensor) else em.constant(item, f"{self.name}.input{i}")
            for i, item in enumerate(self.items)
        ]
        if self.stack:
            leaves = self.outputs[0].leaves()
            position = _batch_position(leaves)
            em.add(self, L.Stack(tensors, self.axis, batch_dim=position))
        else:
            em.add(self, L.Concat(tensors, self.axis))


class ProtoUnstack(ProtoLayer):
    """An Unstack of the atom ``atom`` of ``x``: into its elements, or pieces of ``sizes``."""

    def __init__(self, name, x, atom, sizes=None):
        super().__init__(name)
        self.x, self.atom, self.sizes = x, atom, sizes

    def emit(self, em):
        leaves = self.x.leaves()
        position = _batch_position(leaves)
        em.add(self, L.Unstack(em.tensor(self.x), _index_of(leaves, self.atom), batch_dim=position,
                               sizes=self.sizes))


class ProtoReshape(ProtoLayer):
    """A reshape no view can express: a Ravel and an Unravel (two vertices)."""

    def __init__(self, name, x, shape):
        super().__init__(name)
        self.x, self.shape = x, shape

    def emit(self, em):
        out = em.g.reshape(self.name, em.tensor(self.x), self.shape)
        em.tensors[id(self.outputs[0])] = out


class ProtoRoll(ProtoLayer):
    """A cyclic shift of ``x`` along the atoms ``axes`` by ``shifts``: a Roll."""

    def __init__(self, name, x, shifts, axes):
        super().__init__(name)
        self.x, self.shifts, self.axes = x, shifts, axes

    def emit(self, em):
        leaves = self.x.leaves()
        position = _batch_position(leaves)
        em.add(self, L.Roll(em.tensor(self.x), list(self.shifts), [_index_of(leaves, a) for a in self.axes],
                            batch_dim=position if position is not None else 0))
