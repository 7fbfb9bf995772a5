"""The model's parameters in the walk: each one's first name (tied weights are one tensor), the
layer that holds it, and the parameters no layer holds, carried by the layer they first met.
"""

from __future__ import annotations

from .values import Replicated, View, _dependent


class HeldParameters:
    """Which layer holds each model parameter: a part of
    :class:`~pase.sources.torch.walk.GraphWalk` (its ``program`` the exported one, its
    ``protos`` the layers)."""

    def __init__(self):
        self.parameters: dict = {}  # model parameter name -> shape, every one of the program
        self.homes: dict = {}  # parameter name -> the proto whose output it first met (or None)
        self._tensor_names = None  # id(parameter tensor) -> its first name

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
