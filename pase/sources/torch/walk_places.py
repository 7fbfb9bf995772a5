"""Where a node of the exported graph sits in the model: its module path, the repeated block
(a decoder layer, a bottleneck) whose forward ran it, and the unique layer names made from them.
"""

from __future__ import annotations

import re

from .aten import _LEAF_MODULE


class ModulePlaces:
    """The module paths of the walk's nodes (``nn_module_stack``), the repeated blocks they run
    in and the layer names given out: a part of :class:`~pase.sources.torch.walk.GraphWalk`."""

    def __init__(self, torch, module=None):
        self.torch = torch
        self.module = module  # the traced nn.Module, to read a submodule's attributes (``module_of``)
        self.names: set = set()
        self.blocks: dict = {}  # layer name -> the repeated block it belongs to (``_block_of``)
        self._containers: dict = {}  # module path -> whether it is a repeated block

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
