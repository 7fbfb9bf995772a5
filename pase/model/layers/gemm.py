"""GEMM-shaped layers: fully connected, batched einsum and the embedding lookup."""

from __future__ import annotations

import math
import re

import numpy as np

from pase.model.tensor import Tensor
from .base import Layer, as_float, check_count, check_flag, check_positive, letters_of, check_tensor, GemmShaped
from .masks import band_density, halo_rows
from .work import Exchange, LayerWork, Pass

__all__ = ["FC", "Einsum", "Embedding"]


class FC(GemmShaped, Layer):
    """Fully-connected layer: input ``(x1..xj, k)``, ``n`` units.

    Iteration space ``(x1..xj, n, k)``; a GEMM with ``M = prod(x)``, ``N = n``, ``K = k``.
    ``bias``: a learnt vector of ``n`` (a parameter split like ``n``; its add is a fused
    epilogue, not priced).
    """

    op = "FC"
    product = True

    def forward_flops(self) -> float:
        """``2 x`` the iteration space: a multiply and an add per point."""
        return 2.0 * math.prod(self.domain)

    def __init__(self, x: Tensor, units: int, pw: int = 0, letters: str | None = None, bias: bool = False):
        x = check_tensor(x, "FC input")
        if x.rank < 2:
            raise ValueError(f"FC needs an input of rank >= 2, got shape {list(x.shape)}")
        n = check_positive(units, "FC unit count")
        j = x.rank - 1
        if letters is not None and not isinstance(letters, str):  # false or 0 must not mean "the default"
            raise ValueError(f"FC letters must be a string, got {letters!r}")
        letters = letters or (letters_of(x)[:-1] if x.letters else "b" + "stuvw"[: j - 1])
        if len(letters) != j:
            raise ValueError(f"FC letters {letters!r} must name the {j} leading input dims")
        self.pw = check_count(pw, "FC pw")
        self.bias = check_flag(bias, "FC bias")
        super().__init__(
            (x,), tuple(x.shape[:-1]) + (n, x.shape[-1]), letters + "nk", (tuple(x.shape[:-1]) + (n,),),
            (letters + "n",), batch_dim=0,
            args={"units": n, "pw": self.pw, "letters": letters, **({"bias": True} if self.bias else {})},
        )

    def input_configs(self, C):
        j = len(self.domain) - 2
        return [C[:, list(range(j)) + [j + 1]]]

    def output_configs(self, C):
        j = len(self.domain) - 2
        return [C[:, : j + 1]]

    def gemm_dims(self) -> tuple:
        j = len(self.domain) - 2
        return (), range(j), (j,), (j + 1,)

    def reduction_signature(self, i: int) -> tuple:
        """A GEMM's activation operand, whatever the layer: ``held`` follows the tensor's dims."""
        return ("gemm", len(self.inputs[i].shape))

    def parameters(self):
        j = len(self.domain) - 2
        bias = [((self.domain[j],), (j,))] if self.bias else []
        return [((self.domain[j], self.domain[j + 1]), (j, j + 1))] + bias


_EQUATION = re.compile(r"^([a-z]+),([a-z]+)->([a-z]+)$")


def _parse_equation(equation: str, a: Tensor, b: Tensor) -> tuple:
    """``(in_a, in_b, out, sizes)`` of a two-operand Einsum, with every check of the spec."""
    eq = equation.replace(" ", "") if isinstance(equation, str) else equation
    match = _EQUATION.match(eq) if isinstance(eq, str) else None
    if not match:
        raise ValueError(f"bad Einsum equation {equation!r}: expected 'ab,bc->ac' with lower-case letters")
    in_a, in_b, out = match.groups()
    for term in (in_a, in_b, out):
        if len(set(term)) != len(term):
            raise ValueError(f"bad Einsum equation {equation!r}: a letter repeats within {term!r}")
    for term, t, what in ((in_a, a, "A"), (in_b, b, "B")):
        if len(term) != t.rank:
            raise ValueError(f"Einsum {equation!r}: operand {what} has {t.rank} dims, the equation gives {len(term)}")
    sizes: dict = {}
    for term, t in ((in_a, a), (in_b, b)):
        for letter, size in zip(term, t.shape):
            if sizes.setdefault(letter, size) != size:
                raise ValueError(
                    f"Einsum {equation!r}: dimension {letter!r} is {sizes[letter]} in one operand and {size} in the other"
                )
    for letter in out:
        if letter not in sizes:
            raise ValueError(f"Einsum {equation!r}: output dimension {letter!r} is in neither operand")
    for letter in sizes:
        if letter not in out and not (letter in in_a and letter in in_b):
            raise ValueError(f"Einsum {equation!r}: dimension {letter!r} is in one operand only and not in the output")
    return eq, in_a, in_b, out, sizes


class Einsum(GemmShaped, Layer):
    """A two-operand Einsum such as ``ble,ef->blf``, costed as a batched GEMM.

    Iteration space: output dims in output order, then reduction dims in order of first
    appearance in ``A``. Batch dims are in ``A``, ``B`` and the output; ``M`` dims in ``A``
    and the output only; ``N`` dims in ``B`` and the output only; ``K`` dims in ``A`` and
    ``B`` only. ``bias``: a learnt tensor over the output dimensions of the weight operand
    (``N`` when ``B`` is the weight), a parameter split like them, its add not priced.

    ``window`` and ``band`` (two letters, the query and the key positions, of one length
    ``s``): a sliding-window causal attention product (``pase.model.layers.masks``). It does
    the work of its band only (``band_density``: compute, FLOPs and, when its output spans
    both letters, stored scores), and a split of the queries splits the keys alike: each
    device takes the ``w - 1`` keys before its own from its neighbour (a halo exchange,
    forward and backward), not the whole sequence.
    """

    op = "Einsum"
    product = True

    def forward_flops(self) -> float:
        """``2 x`` the iteration space: a multiply and an add per point (of the band, banded)."""
        return 2.0 * math.prod(self.domain) * self.density

    def __init__(self, equation: str, a: Tensor, b: Tensor, pw: int = 0, batch: str | None = None,
                 bias: bool = False, window: int = 0, band: str | None = None):
        a = check_tensor(a, "Einsum operand A")
        b = check_tensor(b, "Einsum operand B")
        eq, in_a, in_b, out, sizes = _parse_equation(equation, a, b)
        reduction = [letter for letter in in_a if letter not in out]
        space = list(out) + reduction
        self.batch_letters = [x for x in out if x in in_a and x in in_b]
        self.m_letters = [x for x in out if x in in_a and x not in in_b]
        self.n_letters = [x for x in out if x in in_b and x not in in_a]
        self.k_letters = reduction
        if not self.m_letters or not self.n_letters:
            raise ValueError(
                f"Einsum {equation!r} is not a GEMM: it needs a dimension of A only and one of B only in the output"
            )
        if batch is None:
            batch = "b" if "b" in space else space[0]
        if batch not in space:
            raise ValueError(f"Einsum {equation!r}: batch dimension {batch!r} is not in its iteration space")
        self.equation = eq
        self.terms = (in_a, in_b, out)
        self.pw = check_count(pw, "Einsum pw")
        self.bias = check_flag(bias, "Einsum bias")
        if self.bias and not (a.is_param or b.is_param):
            raise ValueError(f"Einsum {equation!r}: a bias needs a weight operand")
        self._cols = {letter: i for i, letter in enumerate(space)}
        self.window = check_count(window, "Einsum window")
        if (band is None) != (self.window == 0):
            raise ValueError(f"Einsum {equation!r}: window and band go together (got window={window!r}, band={band!r})")
        self.band = band
        #: Share of the iteration space done: the window's band, or all of it.
        self.density = 1.0
        masked = {}
        if band is not None:
            if not isinstance(band, str) or len(band) != 2 or any(x not in sizes for x in band) or band[0] == band[1]:
                raise ValueError(f"Einsum {equation!r}: band must be two of its letters (queries, keys), got {band!r}")
            if sizes[band[0]] != sizes[band[1]]:
                raise ValueError(f"Einsum {equation!r}: band letters {band!r} differ in length "
                                 f"({sizes[band[0]]} and {sizes[band[1]]})")
            self.density = band_density(sizes[band[0]], self.window)
            masked = {"window": self.window, "band": band}
        super().__init__(
            (a, b), tuple(sizes[x] for x in space), "".join(space), (tuple(sizes[x] for x in out),), (out,),
            batch_dim=space.index(batch),
            args={"equation": eq, "pw": self.pw, "batch": batch, **({"bias": True} if self.bias else {}), **masked},
        )

    @property
    def banded(self) -> bool:
        """Whether the window is shorter than the sequence (a band, not the whole square)."""
        return self.density < 1.0

    @property
    def output_density(self) -> float:
        """Share of the output stored: the band when the output spans queries and keys."""
        return self.density if self.banded and all(x in self.terms[2] for x in self.band) else 1.0

    def _key_operands(self) -> list:
        """Operands with the key letter and not the query letter (keys, values)."""
        q, k = self.band
        return [i for i, term in enumerate(self.terms[:2]) if k in term and q not in term]

    def _gemm_terms(self, C) -> tuple:
        """As a GEMM's, but a key operand's gradient is not reduced over the query split: each
        device holds its own keys (the halo's gradient goes back by the exchange)."""
        sizes, groups = super()._gemm_terms(C)
        if not self.banded:
            return sizes, groups
        query = self._cols[self.band[0]]
        dims = [list(d) for d in self.gemm_dims()]
        groups = list(groups)
        for i in self._key_operands():
            side = 1 if i == 1 else 2  # B's gradient is reduced over M's devices, A's over N's
            groups[side - 1] = self._groups(C, [d for d in dims[side] if d != query])[0]
        return sizes, tuple(groups)

    def work(self, C):
        work = super().work(C)
        if not self.banded:
            return work
        q, k = (self._cols[x] for x in self.band)
        Cf = as_float(C)
        s = self.domain[q]
        splits = Cf[:, q] * Cf[:, k]
        exchanged = np.zeros(len(Cf))
        for i in self._key_operands():
            others = [self._cols[x] for x in self.terms[i] if x != self.band[1]]
            rows = np.asarray(self.domain, dtype=np.float64)[others].prod() / Cf[:, others].prod(axis=1)
            exchanged = exchanged + halo_rows(s, splits, self.window) * rows
        (group,) = self._groups(C, (q, k))
        # The halo forward and its gradient backward.
        return LayerWork(work.compute * self.density, work.communication + Exchange(2.0 * exchanged, group))

    @classmethod
    def from_args(cls, operands, args):
        args = dict(args)
        if "equation" not in args:
            raise ValueError(f"{cls.op}: missing argument 'equation'")
        return cls(args.pop("equation"), *operands, **args)

    def _columns(self, letters) -> list:
        return [self._cols[x] for x in letters]

    def input_configs(self, C):
        configs = [C[:, self._columns(self.terms[0])], C[:, self._columns(self.terms[1])]]
        if self.banded:
            # Keys split like the queries: a device holds its own keys and trades the halo.
            q, k = (self._cols[x] for x in self.band)
            for i in self._key_operands():
                configs[i] = configs[i].copy()
                configs[i][:, self.terms[i].index(self.band[1])] = C[:, k] * C[:, q]
        return configs

    def output_configs(self, C):
        return [C[:, : len(self.terms[2])]]

    gemm_operands = (0, 1)

    def gemm_dims(self) -> tuple:
        return tuple(self._columns(x) for x in (self.batch_letters, self.m_letters, self.n_letters, self.k_letters))

    def weight_grads(self) -> tuple:
        return (self.inputs[0].is_param, self.inputs[1].is_param)

    def reduction_signature(self, i: int) -> tuple:
        """As ``FC``'s: ``held`` follows the operand's letters, so an FC and an Einsum reading
        one tensor compare."""
        return ("gemm", len(self.inputs[i].shape))

    def reduction_layout(self, i: int) -> tuple:
        held = self._columns(self.terms[i])
        other = self.n_letters if i == 0 else self.m_letters
        return held, self._columns(other)

    def parameters(self):
        weights = [
            (t.shape, tuple(self._columns(term)))
            for t, term in zip(self.inputs, self.terms[:2])
            if t.is_param
        ]
        if getattr(self, "bias", False):
            own = self.n_letters if self.inputs[1].is_param else self.m_letters
            weights.append((tuple(self.domain[self._cols[x]] for x in own), tuple(self._columns(own))))
        return weights


class Embedding(Einsum):
    """Embedding lookup, modelled as the Einsum of a one-hot ``(x.., V)`` with ``(V, D)``.

    Iteration space ``(x1..xj, D, V)``. The token ids (and so the one-hot) are a graph
    input: they make no edge. The reference prices it as that Einsum; a calibrated machine
    sees a gather and the scatter-add of its gradient, memory-bound work on the output.
    """

    op = "Embedding"
    product = False

    def forward_flops(self) -> float:
        """0: a lookup, not a product (MFU leaves embeddings out)."""
        return 0.0
    lookup_table = True

    def __init__(self, ids: Tensor, vocab: int, width: int, letters: str | None = None):
        ids = check_tensor(ids, "Embedding ids")
        if ids.producer is not None:
            raise ValueError("Embedding ids must be a graph input (token ids), not a layer output")
        vocab = check_positive(vocab, "Embedding vocabulary")
        width = check_positive(width, "Embedding width")
        j = ids.rank
        if letters is not None and not isinstance(letters, str):
            raise ValueError(f"Embedding letters must be a string, got {letters!r}")
        letters = letters or (ids.letters if len(ids.letters) == j else "b" + "stuw"[: j - 1])
        if len(letters) != j or "d" in letters or "v" in letters:
            raise ValueError(f"Embedding letters {letters!r} must name the {j} id dims without 'd' or 'v'")
        one_hot = Tensor(tuple(ids.shape) + (vocab,), None, ids.index, False, ids.name, ids.owner)
        weight = Tensor((vocab, width), None, -1, True, "embedding weight", ids.owner)
        super().__init__(f"{letters}v,vd->{letters}d", one_hot, weight, batch=letters[0])
        self.ids = ids
        self.vocab = vocab
        self.width = width
        self.args = {"vocab": vocab, "width": width, "letters": letters}
        # The table's width is the model's, its rows the vocabulary, in every graph.
        self.roles = (None,) * j + ("model", "vocab")

    @classmethod
    def from_args(cls, operands, args):
        return cls(*operands, **args)

    @property
    def operands(self) -> tuple:
        return (self.ids,)

    def reduced_inputs(self) -> tuple:
        """None: its only input is the token ids, which have no gradient."""
        return ()

    def work(self, C):
        einsum = super().work(C)
        # The reference counts the Einsum's FLOPs; a machine that measures sees the gather of
        # the per-device output and the scatter-add of its gradient (no GEMM of its own).
        outputs = self._E(C) / (self.domain[-1] / as_float(C[:, -1]))
        return LayerWork(Pass("copy", outputs, einsum.compute), einsum.communication)
