"""The walk over the graph ``torch.export`` produced: each node's arguments mapped to views
and proto-layers, its handler called, unmappable operations collected."""

from __future__ import annotations

import dataclasses
import operator

from pase.model.builder import GraphBuilder, Network

from .aten import _EXPANDS, _IDENTITY, _PERMUTES, _RESHAPES, _display_op, _flat, _norm_dim, _op_name
from .errors import TorchImportError, Unmappable
from ..blocks import structural_blocks
from .roles import name_roles
from .protos import Emitter, ProtoEmbedding, ProtoGemm, ProtoLoss, ProtoLayer
from .values import Atom, SideOutput, TracedTensor, Replicated, UNMAPPED, UnmappedValue, View, _big, _dependent, _leaves
from .handlers import HANDLED as _HANDLED, HANDLERS as _HANDLERS
from .walk_parameters import HeldParameters
from .walk_places import ModulePlaces
from .walk_views import ConcreteViews


class GraphWalk(ModulePlaces, ConcreteViews, HeldParameters):
    """Walks an ``ExportedProgram``'s graph once, recording protos; then emits the network.

    Its parts, one concern each: where a node sits in the model (:class:`ModulePlaces`), the
    views made concrete for the layers that read them (:class:`ConcreteViews`), which layer
    holds each parameter (:class:`HeldParameters`); here, the walk itself: each node's
    arguments mapped and its handler called (``handlers``), then the outputs, loss and network.
    """

    def __init__(self, program, torch, model_name: str, module=None):
        ModulePlaces.__init__(self, torch, module)
        ConcreteViews.__init__(self)
        HeldParameters.__init__(self)
        self.program = program
        self.model_name = model_name
        self.values: dict = {}
        self.protos: list = []
        self.problems: dict = {}  # display op -> [module path, reason, count]
        self.batch: int | None = None
        self.outputs: list = []
        self.has_conv = False
        #: A new tensor being written by slice assignment (``k[..., :a].copy_(x)``), not yet
        #: whole: its node name -> [dim, [(start, stop, value)]].
        self.fills: dict = {}

    # -- bookkeeping ----------------------------------------------------------------

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
