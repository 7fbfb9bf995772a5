"""Parallel rules: which mesh axis splits which dimension role, as data.

The shape of JAX's logical-axis rules (``("mlp", "tp")``): a small table keyed by the roles of
``pase.model.roles``, read by the mesh mapping (:mod:`pase.planning.mesh`) and so by what the
exporters write, since they write the mesh that was priced. The default table is
``pase/planning/data/parallel_rules.json`` (Megatron-LM's and torchtitan's layout); a user
passes their own for a model family with ``--rules FILE.json``:

.. code-block:: json

    {"format": "pase-parallel-rules", "version": 1,
     "dp": ["batch"], "ep": ["experts"], "cp": ["sequence"],
     "tp": [["kv_groups", "heads"], ["mlp"], ["expert_width"], ["vocab"]],
     "tp_partial": ["kv_groups"], "sp": ["sequence"]}

``dp``, ``ep``, ``cp``, ``sp``: the roles each axis may split, the first a layer has taking
it. ``tp``: alternatives in order; the first a layer has any role of takes ``tp``, split over
its roles in the order given (each as many ways as it divides, the rest passed on);
``tp_partial``: roles that may take fewer than ``tp`` ways when a layer has no other role of
its alternative (its data is then replicated over the rest). ``sp``: with sequence
parallelism, where a layer has no ``tp`` alternative.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from pase.core.fileio import InputError, read_json
from pase.model.roles import ROLES, roles_of

__all__ = ["ParallelRules", "DEFAULT_RULES_PATH", "default_rules", "load_rules", "rules_from_json"]

DEFAULT_RULES_PATH = os.path.join(os.path.dirname(__file__), "data", "parallel_rules.json")
FORMAT = "pase-parallel-rules"
_FIELDS = ("format", "version", "about", "dp", "ep", "cp", "tp", "tp_partial", "sp")


@dataclass(frozen=True)
class ParallelRules:
    """Mesh axes to roles (see the module's docstring)."""

    dp: tuple = ("batch",)
    ep: tuple = ("experts",)
    cp: tuple = ("sequence",)
    tp: tuple = (("kv_groups", "heads"), ("mlp",), ("expert_width",), ("vocab",))
    tp_partial: tuple = ("kv_groups",)
    sp: tuple = ("sequence",)

    @staticmethod
    def first(roles: tuple, wanted) -> int | None:
        """The first dimension whose role is in ``wanted`` (in ``wanted``'s order), or None."""
        for role in wanted:
            if role in roles:
                return roles.index(role)
        return None

    def tensor_alternative(self, roles: tuple) -> tuple | None:
        """The ``tp`` alternative a layer of ``roles`` takes: its dimensions in split order (the
        alternative's roles in order, a role on several dimensions in their order)."""
        for alternative in self.tp:
            dims = [j for role in alternative for j, r in enumerate(roles) if r == role]
            if dims:
                return tuple(dims)
        return None

    def tensor_parallel(self, network) -> bool:
        """Whether any layer of ``network`` has a role ``tp`` splits."""
        return any(self.tensor_alternative(roles_of(layer)) is not None for layer in network.layers)

    def tensor_roles(self) -> tuple:
        return tuple(role for alternative in self.tp for role in alternative)


def _roles(value, what: str, where: str) -> tuple:
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise InputError(f"{where}: field {what!r} must be a list of role names")
    for role in value:
        if role not in ROLES:
            raise InputError(f"{where}: field {what!r} names unknown role {role!r}; known: {', '.join(ROLES)}")
    return tuple(value)


def rules_from_json(data, where: str = "rules file") -> ParallelRules:
    """The rules of a parsed rules file; ``InputError`` naming the field otherwise."""
    if not isinstance(data, dict):
        raise InputError(f"{where} must hold a JSON object")
    if data.get("format") != FORMAT:
        raise InputError(f"{where}: field 'format' must be {FORMAT!r} (is it a rules file?)")
    if data.get("version") != 1:
        raise InputError(f"{where}: version {data.get('version')!r} is not supported (this tool reads version 1)")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    base = ParallelRules()
    values = {}
    for key in ("dp", "ep", "cp", "tp_partial", "sp"):
        values[key] = _roles(data[key], key, where) if key in data else getattr(base, key)
    if "tp" in data:
        tp = data["tp"]
        if not isinstance(tp, list):
            raise InputError(f"{where}: field 'tp' must be a list of alternatives, each a list of role names")
        values["tp"] = tuple(_roles(alt, "tp", where) for alt in tp)
    else:
        values["tp"] = base.tp
    if not values["dp"]:
        raise InputError(f"{where}: field 'dp' must name at least one role (the batch)")
    return ParallelRules(**values)


def load_rules(path: str) -> ParallelRules:
    """The rules file at ``path`` (``--rules FILE.json``)."""
    return rules_from_json(read_json(path, "rules file"), f"rules file {path}")


def default_rules() -> ParallelRules:
    """The shipped table (``pase/planning/data/parallel_rules.json``)."""
    with open(DEFAULT_RULES_PATH, encoding="utf-8") as f:
        return rules_from_json(json.load(f), DEFAULT_RULES_PATH)
