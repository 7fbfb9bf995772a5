"""The walk over the graph ``torch.export`` produced: each node's arguments mapped to views
and proto-layers, its handler called, unmappable operations collected."""

from __future__ import annotations

import dataclasses
import operator
import re

from pase.model.builder import GraphBuilder, Network

from .aten import _EXPANDS, _IDENTITY, _LEAF_MODULE, _PERMUTES, _RESHAPES, _display_op, _flat, _norm_dim, _op_name
from .errors import TorchImportError, Unmappable
from ..blocks import structural_blocks
from .roles import name_roles
from .protos import Emitter, ProtoEmbedding, ProtoGemm, ProtoLoss, ProtoLayer, ProtoReduceMean, ProtoReshape, ProtoUnstack
from .values import Atom, SideOutput, TracedTensor, Replicated, LazyComplex, LazyPairs, LazySlice, LazyStatistic, LazyStrided, UNMAPPED, UnmappedValue, View, _big, _dependent, _freeze, _leaves, _regroup
from .handlers import HANDLED as _HANDLED, HANDLERS as _HANDLERS
from .handlers.common import _expand_view


class GraphWalk:
    """Walks an ``ExportedProgram``'s graph once, recording protos; then emits the network."""

    def __init__(self, program, torch, model_name: str, module=None):
        self.program = program
        self.torch = torch
        self.model_name = model_name
        self.module = module  # the traced nn.Module, to read a submodule's attributes (``module_of``)
        self.values: dict = {}
        self.protos: list = []
        self.names: set = set()
        self.blocks: dict = {}  # layer name -> the repeated block it belongs to (``_block_of``)
        self._containers: dict = {}  # module path -> whether it is a repeated block
        self.problems: dict = {}  # display op -> [module path, reason, count]
        self.unstacks: dict = {}  # (id(base), id(atom)) -> ProtoUnstack
        self.batch: int | None = None
        self.outputs: list = []
        self.has_conv = False
        self.parameters: dict = {}  # model parameter name -> shape, every one of the program
        self.homes: dict = {}  # parameter name -> the proto whose output it first met (or None)
        self._tensor_names = None  # id(parameter tensor) -> its first name
        #: A new tensor being written by slice assignment (``k[..., :a].copy_(x)``), not yet
        #: whole: its node name -> [dim, [(start, stop, value)]].
        self.fills: dict = {}

    # -- bookkeeping ----------------------------------------------------------------

    def _where(self, node) -> tuple:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return "", ""
        path, kind = list(stack.values())[-1]
        kind = kind if isinstance(kind, str) else getattr(kind, "__qualname__", str(kind))
        return str(path), kind.rsplit(".", 1)[-1]

    def module_of(self, node):
        """The submodule whose ``forward`` ran ``node`` (``None`` where it cannot be found)."""
        path, _ = self._where(node)
        if self.module is None:
            return None
        path = self._path(path)
        try:
            return self.module.get_submodule(path) if path else self.module
        except (AttributeError, TypeError, ValueError):
            return None

    def _path(self, path: str) -> str:
        # torch.export writes "model.layers.0.self_attn" (older versions "L['self'].model.layers[0]...").
        path = re.sub(r"^L\['self'\]\.?", "", path)
        return re.sub(r"\[(\d+)\]", r".\1", path)

    def _repeated(self, path: str) -> bool:
        """Whether the submodule at ``path`` is one of several alike in a module list (a
        ``ModuleList`` or ``Sequential`` holding at least two modules of its class, each made of
        modules of its own): a decoder layer, a bottleneck, a transformer block."""
        if path not in self._containers:
            found = False
            parent_path, _, _ = path.rpartition(".")
            try:
                parent = self.module.get_submodule(parent_path) if self.module is not None else None
                child = self.module.get_submodule(path) if self.module is not None else None
            except (AttributeError, TypeError, ValueError):
                parent = child = None
            nn = self.torch.nn
            if child is not None and isinstance(parent, (nn.ModuleList, nn.Sequential)) and any(child.children()):
                found = sum(type(c) is type(child) for c in parent.children()) >= 2
            self._containers[path] = found
        return self._containers[path]

    def _block_of(self, node):
        """The outermost repeated submodule (``_repeated``) whose forward ran ``node``, or None."""
        stack = (node.meta.get("nn_module_stack") or {}) if node is not None else {}
        for path, _ in stack.values():
            path = self._path(str(path))
            if path and self._repeated(path):
                return path
        return None

    def _name(self, node, suffix: str, leaf: bool = False) -> str:
        """A unique layer name: the module path, for the layer a leaf module (a Linear, a
        Conv2d, a norm) is made of (``leaf``); otherwise the path and what the layer does."""
        path, kind = self._where(node) if node is not None else ("", "")
        if leaf and path and _LEAF_MODULE.search(kind):
            base = path
        elif path:
            base = f"{path}.{suffix or 'layer'}"
        else:
            base = suffix or "layer"
        name, n = base, 2
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        self.blocks[name] = self._block_of(node)
        return name

    def _record(self, proto: ProtoLayer) -> ProtoLayer:
        self.protos.append(proto)
        for attr in ("x", "a", "b", "ids"):
            if isinstance(getattr(proto, attr, None), TracedTensor):
                getattr(proto, attr).consumed = True
        for item in getattr(proto, "items", ()):
            if isinstance(item, TracedTensor):
                item.consumed = True
        for op in getattr(proto, "operands", ()):
            if op[0] == "view":
                op[1].base.consumed = True
        return proto

    def _reorder(self, view: View) -> bool:
        """Lay a product's output out as ``view`` reads it, if no layer has read it yet.

        An Einsum may write its output in any order: a transpose read by a layer that
        needs its input in its own order (a norm, an Elementwise) then costs nothing.
        """
        base = view.base
        proto = base.proto
        if not isinstance(proto, ProtoGemm) or base.consumed:
            return False
        mine = [a for dim in view.dims for a in _leaves(dim)]
        leaves = base.leaves()
        big = [a for a in leaves if a.size > 1]
        if any(a.broadcast for a in mine) or len(mine) != len(big) or {id(a) for a in mine} != {id(a) for a in big}:
            return False
        for atom in base.atoms:  # the leaves inherit the source of their ancestor
            for leaf in atom.leaves():
                proto.sources.setdefault(id(leaf), proto.sources[id(atom)])
        base.atoms = mine + [a for a in leaves if a.size == 1]
        return True

    def _canonical(self, name: str) -> str:
        """The first name of a parameter tensor: a tied one (``lm_head.weight`` is
        ``wte.weight``) is one tensor under several names, each a placeholder of its own."""
        if self._tensor_names is None:
            self._tensor_names = {}
            for key, tensor in getattr(self.program, "state_dict", {}).items():
                self._tensor_names.setdefault(id(tensor), key)
        tensor = getattr(self.program, "state_dict", {}).get(name)
        return self._tensor_names.get(id(tensor), name) if tensor is not None else name

    def _claim(self, proto, entry: int, value) -> bool:
        """``value`` is entry ``entry`` of ``proto``'s parameters, if it is a model parameter."""
        if isinstance(value, Replicated) and value.param and len(value.params) == 1:
            proto.claims.append((entry, next(iter(value.params))))
            return True
        return False

    def _meet(self, flat) -> None:
        """Parameters combined with batch-dependent values: remember next to which layer."""
        first = next((v for v in flat if _dependent(v)), None)
        base = first if isinstance(first, View) else getattr(first, "source", None)
        proto = base.base.proto if isinstance(base, View) else None
        for v in flat:
            if isinstance(v, Replicated):
                for name in v.params:
                    if self.homes.get(name) is None:
                        self.homes[name] = proto

    def _problem(self, node, reason: str) -> None:
        op = _display_op(node.target)
        path, _ = self._where(node)
        entry = self.problems.setdefault(op, [path, reason, 0])
        entry[2] += 1

    def _meta_shape(self, node, index: int | None = None):
        val = node.meta.get("val")
        if index is not None and isinstance(val, (list, tuple)):
            val = val[index]
        shape = getattr(val, "shape", None)
        return tuple(int(d) for d in shape) if shape is not None else None

    # -- charging point-wise operations ---------------------------------------------

    def _charge(self, view: View) -> None:
        """A layer reads ``view``: its pending point-wise ops go to the layer that made it."""
        proto = view.base.proto
        if view.ops and proto is not None and proto.has_pw:
            proto.pw_ops |= view.ops

    # -- making views concrete --------------------------------------------------------

    def _view(self, value, node) -> View:
        """Any batch-dependent value as a view (slices become Unstack outputs, stats means)."""
        if isinstance(value, View):
            return value
        if isinstance(value, LazySlice):
            return self._unstack(value, node)
        if isinstance(value, LazyStatistic):
            reduced = self._reduce(value, node)
            return _expand_view(reduced, value.source.shape) if value.expanded else reduced
        if isinstance(value, LazyStrided):
            # Every step-th element: the element ``start`` of the refined dimension's inner factor.
            refined = self._refined(value.source, value.dim, value.step, node)
            return self._unstack(LazySlice(refined, value.dim + 1, value.start, value.start + 1, True, value.ops),
                                 node)
        if isinstance(value, LazyPairs):
            return self._refined(value.source, value.dim, value.step, node).with_ops(value.ops)
        if isinstance(value, LazyComplex):
            raise Unmappable("a layer reads a complex tensor (only point-wise operations and view_as_real do)")
        raise AssertionError(f"not a batch-dependent value: {value!r}")

    def _refined(self, value, dim: int, step: int, node) -> View:
        """``value`` with dimension ``dim`` seen as ``(size / step, step)``: its atoms refined,
        or, where an atom is frozen, a Reshape to that shape."""
        view = self._view(value, node)
        size = view.shape[dim]
        groups = _regroup(_big(view.dims[dim]), (size // step, step))
        if groups is None:
            shape = view.shape[:dim] + (size // step, step) + view.shape[dim + 1:]
            return self._reshape(view, node, shape)
        dims = list(view.dims)
        dims[dim:dim + 1] = groups
        return View(view.base, tuple(dims), view.ops)

    def _natural(self, view: View) -> bool:
        """The view lists its layer output's dimensions in order (merges allowed, no expand)."""
        flat = [a for dim in view.dims for a in _leaves(dim)]
        if any(a.broadcast for a in flat):
            return False
        mine = [a for a in flat if a.size > 1]
        theirs = [a for a in view.base.leaves() if a.size > 1]
        return len(mine) == len(theirs) and all(x is y for x, y in zip(mine, theirs))

    def _exact(self, view: View, node) -> View:
        """A view that *is* its layer output, dimension for dimension: or a Reshape to one."""
        if not self._natural(view):
            self._reorder(view)
        if self._natural(view) and view.base.shape() == view.shape:
            return view
        return self._reshape(view, node)

    def _axis_leaf(self, view: View, dim: int, node) -> tuple:
        """``(view, atom)``: a natural view whose ``dim`` is one atom of its layer output."""
        if not self._natural(view):
            self._reorder(view)
        if self._natural(view):
            big = _big(view.dims[dim])
            if len(big) == 1:
                return view, big[0]
        view = self._reshape(view, node)
        big = _leaves(view.dims[dim])
        return view, big[0]

    def _reshape(self, view: View, node, shape=None) -> View:
        """A Reshape pair (Ravel, Unravel) of the view's layer output to ``shape``.

        The fallback wherever no view expresses what a layer needs: the pair prices the data
        movement as the built-in AlexNet's flatten does. A permutation is not modelled.
        """
        if any(a.broadcast for dim in view.dims for a in _leaves(dim)):
            raise Unmappable("a layer reads an expanded (broadcast) tensor")
        self._charge(view)
        _freeze(view.base.atoms)
        shape = tuple(view.shape if shape is None else shape)
        proto = self._record(ProtoReshape(self._name(node, "reshape"), view.base, shape))
        atoms = [Atom(s, frozen=True) for s in shape]
        if shape == view.shape:  # dimension for dimension: keep the names and the batch mark
            for atom, dim in zip(atoms, view.dims):
                leaves = _leaves(dim)
                if leaves:
                    atom.hint = leaves[0].hint
                    atom.batch = leaves[0].batch and len(leaves) == 1
        else:
            first = next((a for dim in view.dims for a in _leaves(dim)), None)
            if first is not None and first.batch and atoms and atoms[0].size == first.size:
                atoms[0].batch = True
                atoms[0].hint = first.hint
        base = proto.output(atoms)
        return View(base, tuple((a,) if a.size > 1 else () for a in atoms))

    def _unstack(self, s: LazySlice, node) -> View:
        """A slice read by a layer: one output of an Unstack of the sliced atom."""
        src = s.source
        size = src.shape[s.dim]
        width = s.stop - s.start
        if width <= 0:
            raise Unmappable(f"an empty slice [{s.start}:{s.stop}] read by a layer")
        bounds = sorted({0, size, s.start, s.stop} | {c for c in s.cuts if 0 < c < size})
        unequal = any(b - a != width for a, b in zip(bounds, bounds[1:])) if s.cuts else s.start % width
        if size % width or unequal:
            # Pieces of different sizes (q, k and v of a multi-query fusion): one Unstack with sizes.
            return self._split(s, node)
        count = size // width
        dims = list(src.dims)
        groups = _regroup(_big(dims[s.dim]), (count, width))
        if groups is None or len(groups[0]) != 1:
            return self._split(s, node)
        atom = groups[0][0]
        rest = groups[1]
        if atom.broadcast:  # a slice of an expanded dimension is the tensor itself
            dims[s.dim] = rest
            if s.squeeze:
                del dims[s.dim]
            return View(src.base, tuple(dims), src.ops | s.ops)
        self._charge(src)
        key = (id(src.base), id(atom))
        if key not in self.unstacks:
            atom.frozen = True
            atom.hint = "s"
            proto = self._record(ProtoUnstack(self._name(node, "split"), src.base, atom))
            remaining = [a for a in src.base.leaves() if a is not atom]
            for i in range(count):
                proto.output(remaining, i)
            self.unstacks[key] = proto
        proto = self.unstacks[key]
        dims[s.dim] = rest
        if s.squeeze:
            if rest:
                raise AssertionError("a squeezed slice must be one wide")
            del dims[s.dim]
        return View(proto.outputs[s.start // width], tuple(dims), s.ops)

    def _split(self, s: LazySlice, node) -> View:
        """A slice of unequal pieces read by a layer: one output of an Unstack with sizes.

        The pieces are those of every slice taken of the same dimension (``s.cuts``: q, k
        and v of a fused projection, 71 + 1 + 1 heads), so one Unstack serves them all.
        """
        src = s.source
        big = _big(src.dims[s.dim])
        if len(big) != 1 or big[0].broadcast:
            src = self._reshape(src, node)
            big = _big(src.dims[s.dim])
        atom = big[0]
        if atom.batch:
            raise Unmappable("a slice of the batch")
        size = atom.size
        cuts = tuple(sorted({0, size, s.start, s.stop} | {c for c in s.cuts if 0 < c < size}))
        key = (id(src.base), id(atom), cuts)
        if key not in self.unstacks:
            self._charge(src)
            atom.frozen = True
            sizes = [b - a for a, b in zip(cuts, cuts[1:])]
            proto = self._record(ProtoUnstack(self._name(node, "split"), src.base, atom, sizes))
            leaves = src.base.leaves()
            for i, n in enumerate(sizes):
                piece = Atom(n, atom.hint, frozen=True)
                proto.output([piece if a is atom else a for a in leaves], i)
                proto.outputs[i].piece = piece
            self.unstacks[key] = proto
        proto = self.unstacks[key]
        i = cuts.index(s.start)
        if cuts[i + 1] != s.stop:
            raise AssertionError("a slice across two pieces")
        out = proto.outputs[i]
        dims = list(src.dims)
        dims[s.dim] = (out.piece,) if out.piece.size > 1 else ()
        if s.squeeze:
            del dims[s.dim]
        return View(out, tuple(dims), s.ops)

    def _reduce(self, stat: LazyStatistic, node, leaf: bool = False) -> View:
        """A statistic read by a layer: a ReduceMean of its source."""
        src = stat.source
        if not self._natural(src):
            src = self._reshape(src, node)
        self._charge(src)
        reduced = [a for i in stat.axes for a in _big(src.dims[i])]
        if not reduced:  # a mean over size-1 dimensions is the tensor itself
            dims = [d for i, d in enumerate(src.dims) if i not in stat.axes or stat.keepdim]
            dims = [() if i in stat.axes else d for i, d in enumerate(src.dims)] if stat.keepdim else dims
            return View(src.base, tuple(dims), stat.ops)
        for a in reduced:
            a.frozen = True
        proto = self._record(ProtoReduceMean(self._name(node, stat.kind, leaf), src.base, reduced))
        kept = [a for a in src.base.leaves() if all(a is not r for r in reduced)]
        base = proto.output(kept or [Atom(1)])
        dims = []
        for i, dim in enumerate(src.dims):
            if i in stat.axes:
                if stat.keepdim:
                    dims.append(())
            else:
                dims.append(dim)
        return View(base, tuple(dims), stat.ops)

    # -- the walk -----------------------------------------------------------------------

    def run(self) -> None:
        torch = self.torch
        graph = self.program.graph
        specs = {spec.arg.name: spec for spec in self.program.graph_signature.input_specs
                 if hasattr(spec.arg, "name")}
        kinds = torch.export.graph_signature.InputKind
        dependent_inputs = self._dependent_inputs(graph, specs, kinds)
        for node in graph.nodes:
            if node.op == "placeholder":
                self.values[node.name] = self._placeholder(node, specs.get(node.name), kinds, dependent_inputs)
            elif node.op == "call_function":
                self.values[node.name] = self._call(node)
            elif node.op == "get_attr":
                self.values[node.name] = Replicated(None)
            elif node.op == "output":
                results = node.args[0]
                results = results if isinstance(results, (list, tuple)) else (results,)
                out_specs = self.program.graph_signature.output_specs
                user = {spec.arg.name for spec in out_specs
                        if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT
                        and hasattr(spec.arg, "name")}
                for r in results:
                    if hasattr(r, "name") and r.name in user:
                        self.outputs.append(self.values.get(r.name))

    def _dependent_inputs(self, graph, specs, kinds) -> set:
        """User inputs that carry the batch: floating-point ones, and token ids of embeddings.

        Other integer or boolean inputs (attention masks, position ids) are replicated, like
        every tensor computed from weights and constants.
        """
        passthrough = _RESHAPES | _IDENTITY | _PERMUTES
        ids = set()
        for node in graph.nodes:
            if node.op == "call_function" and _op_name(node.target) == "embedding" and len(node.args) > 1:
                walk = node.args[1]
                while getattr(walk, "op", None) == "call_function" and _op_name(walk.target).rstrip("_") in passthrough:
                    walk = walk.args[0]
                if getattr(walk, "op", None) == "placeholder":
                    ids.add(walk.name)
        chosen = set()
        for node in graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            if spec is None or spec.kind != kinds.USER_INPUT:
                continue
            val = node.meta.get("val")
            shape = getattr(val, "shape", None)
            if shape is None or len(shape) == 0:
                continue
            if not (val.dtype.is_floating_point or val.dtype.is_complex or node.name in ids):
                continue
            if self.batch is None:
                self.batch = int(shape[0])
            if int(shape[0]) == self.batch:
                chosen.add(node.name)
        return chosen

    def _placeholder(self, node, spec, kinds, dependent):
        shape = self._meta_shape(node)
        if node.name in dependent:
            hints = "bl" if len(shape) == 2 else ("bchw" if len(shape) == 4 else "b" + "stuvwxyz")
            atoms = [Atom(s, hints[i] if i < len(hints) else "", batch=(i == 0)) for i, s in enumerate(shape)]
            base = TracedTensor(atoms, name=str(spec.arg.name) if spec is not None else node.name)
            return View(base, tuple((a,) if a.size > 1 else () for a in atoms))
        if spec is not None and spec.kind == kinds.PARAMETER:
            name = self._canonical(str(spec.target))
            if node.users:  # one no operation reads (a block a stand-in replaces) is not held
                self.parameters[name] = shape
            return Replicated(shape, True, frozenset({name}))
        return Replicated(shape)

    def _call(self, node):
        def value_of(arg):
            return self.values.get(arg.name, UNMAPPED)

        torch = self.torch
        partial = [n for n in node.all_input_nodes if n.name in self.fills]
        if partial and _op_name(node.target) != "slice":
            self._problem(node, "it reads a tensor only partly written by slice assignment")
            return self._opaque(node)
        args = torch.fx.node.map_arg(node.args, value_of)
        kwargs = torch.fx.node.map_arg(node.kwargs, value_of)
        if node.target is operator.getitem:
            seq, index = args
            if isinstance(seq, (list, tuple)):
                return seq[index]
            return seq if isinstance(seq, (UnmappedValue, Replicated)) else UNMAPPED
        flat = list(_flat(list(args) + [kwargs]))
        if any(v is UNMAPPED for v in flat):
            return UNMAPPED
        aux = next((v for v in flat if isinstance(v, SideOutput)), None)
        name = _op_name(node.target)
        inplace = name.endswith("_") and not name.endswith("__") and name[:-1] in _HANDLED
        if inplace:
            name = name[:-1]
        if aux is not None:
            self._problem(node, f"it reads the {aux.what}")
            return self._opaque(node)
        if not any(_dependent(v) for v in flat):
            result = self._replicated(node, name, args)
        else:
            self._meet(flat)
            handler = _HANDLERS.get(name)
            if handler is None:
                self._problem(node, "no PaSE layer expresses it")
                return self._opaque(node)
            try:
                result = handler(self, node, name, *args, **kwargs)
            except Unmappable as why:
                self._problem(node, str(why))
                return self._opaque(node)
        if inplace and node.args and hasattr(node.args[0], "name"):
            # The mutated tensor now holds the result: later readers of it see the result.
            self.values[node.args[0].name] = result
            if name == "copy":
                self._fill(node, result)
        return result

    def _fill(self, node, piece) -> None:
        """``copy_`` into a slice of a replicated tensor (a ``new_empty``): slice assignment.

        Once the slices written along one dimension cover it, the tensor is the concatenation
        of the pieces (MLA's key: the per-head part, then the shared rotary part); until then
        only slicing may read it (``_call`` refuses other readers).
        """
        dst = node.args[0]
        if getattr(dst, "op", None) != "call_function" or _op_name(dst.target) != "slice":
            return
        base = dst.args[0]
        if not isinstance(self.values.get(getattr(base, "name", None)), Replicated) and base.name not in self.fills:
            return
        shape = self._meta_shape(base)
        if shape is None:
            return
        dim = _norm_dim(dst.args[1] if len(dst.args) > 1 else 0, len(shape))
        start, stop, step = slice(*(list(dst.args[2:5]) + [None] * (3 - len(dst.args[2:5])))).indices(shape[dim])
        entry = self.fills.setdefault(base.name, [dim, []])
        if step != 1 or entry[0] != dim:
            self._problem(node, "slice assignment along several dimensions, or strided")
            return
        entry[1].append((start, stop, piece))
        spans = sorted(entry[1], key=lambda p: p[0])
        if spans[0][0] != 0 or spans[-1][1] != shape[dim] or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
            return
        del self.fills[base.name]
        pieces = [p for _, _, p in spans]
        if not any(_dependent(p) for p in pieces):
            return
        try:
            self.values[base.name] = _HANDLERS["cat"](self, base, "cat", pieces, dim)
        except Unmappable as why:
            self._problem(node, str(why))
            self.values[base.name] = self._opaque(base)

    def _opaque(self, node):
        """The result of an operation that could not be mapped: a stand-in of its shape.

        The walk goes on from it, so that every unmappable operation is found in one pass;
        the import fails at the end anyway.
        """
        val = node.meta.get("val")

        def one(v):
            if not hasattr(v, "shape"):
                return Replicated(None)
            atoms = [Atom(int(d), frozen=True) for d in v.shape]
            return View(TracedTensor(atoms, name="unmapped"), tuple((a,) if a.size > 1 else () for a in atoms))

        return [one(v) for v in val] if isinstance(val, (list, tuple)) else one(val)

    def _replicated(self, node, name, args):
        val = node.meta.get("val")
        params = frozenset().union(*(v.params for v in _flat(list(args)) if isinstance(v, Replicated)))
        if isinstance(val, (list, tuple)):
            return [Replicated(tuple(v.shape) if hasattr(v, "shape") else None, False, params) for v in val]
        shape = tuple(int(d) for d in val.shape) if hasattr(val, "shape") else None
        first = args[0] if args else None
        param = (isinstance(first, Replicated) and first.param
                 and name in (_RESHAPES | _PERMUTES | _IDENTITY | _EXPANDS))
        return Replicated(shape, param, params)

    # -- results ------------------------------------------------------------------------

    def output_view(self):
        """The first batch-dependent output of the model (what the loss reads)."""
        for value in self.outputs:
            if _dependent(value):
                return value
        return None

    def finish_outputs(self) -> None:
        """The model computes its outputs: lazy ones become layers, pending ops are charged."""
        try:
            for i, value in enumerate(self.outputs):
                if _dependent(value):
                    view = self._view(value, None)
                    self._charge(view)
                    self.outputs[i] = view
        except Unmappable as why:
            raise TorchImportError(f"{self.model_name}: an output of the model cannot be mapped: {why}") from None

    def add_loss(self) -> None:
        value = self.output_view()
        if value is None:
            raise TorchImportError(
                f"{self.model_name}: no output of the model depends on its batch input, so there is nothing to "
                "put a loss on (use loss=None / --loss none)")
        try:
            view = self._view(value, None)
            if not self._natural(view):
                self._reorder(view)
            if view.dims and self._natural(view):
                last = _big(view.dims[-1])
                leaves = view.base.leaves()
                if not (len(last) == 1 and leaves and leaves[-1] is last[0]):
                    view = self._reshape(view, None)
            else:
                view = self._reshape(view, None)
        except Unmappable as why:
            raise TorchImportError(f"{self.model_name}: the model's output cannot take a loss: {why}") from None
        for a in _leaves(view.dims[-1]) if view.dims else []:
            a.frozen = True
        # A model reading token ids predicts the vocabulary; any other, its classes.
        classes = "vocab" if any(isinstance(p, ProtoEmbedding) for p in self.protos) else "classes"
        self._record(ProtoLoss(self._name(None, "loss"), view.base, classes))

    def held_parameters(self) -> tuple:
        """``(claimers, held)`` for the Emitter: who holds each parameter as its own, and the
        parameters some operation reads but no layer holds (a position table, a class token,
        a layer scale), each carried by the layer it first met, else the first layer."""
        claimers: dict = {}
        for proto in self.protos:
            for _, name in proto.claims:
                holders = claimers.setdefault(name, [])
                if proto not in holders:
                    holders.append(proto)
        emitted = {id(p) for p in self.protos}
        held: dict = {}
        for name, shape in self.parameters.items():
            if name in claimers or shape is None:
                continue
            home = self.homes.get(name)
            home = home if home is not None and id(home) in emitted else self.protos[0]
            held.setdefault(id(home), []).append(tuple(shape) or (1,))
        return claimers, held

    def emit(self, cutoff: int) -> Network:
        g = GraphBuilder(self.model_name, cutoff=cutoff, batch=self.batch)
        em = Emitter(g, *self.held_parameters(), blocks=self.blocks)
        for proto in self.protos:
            proto.emit(em)
        network = g.build()
        # A transformer (token ids, or attention whose handler declared its roles) has MLPs
        # whose inner width tensor parallelism splits; a convolutional network does not.
        name_roles(network, any(isinstance(p, ProtoEmbedding) or (isinstance(p, ProtoGemm) and p.roles)
                                for p in self.protos))
        if network.blocks is None:  # no module list of repeated modules: runs of equal layers
            network = dataclasses.replace(network, blocks=structural_blocks(network))
        return network
