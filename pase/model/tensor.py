"""Tensors flowing between layers: graph inputs, parameters and layer outputs.

A tensor knows its shape and which layer output it is; the builder turns every read of
a layer output into a graph edge (``docs/cost-model.md``, "Edge (redistribution) cost").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Tensor"]


@dataclass(frozen=True)
class Tensor:
    """A tensor of a computation graph.

    Attributes
    ----------
    shape : tuple of int
        Dimension sizes.
    producer : int or None
        Vertex id of the layer that outputs it; ``None`` for a graph input.
    index : int
        Which output of the producer it is (graph inputs: a serial number).
    is_param : bool
        A trainable parameter (a weight); graph inputs only. Counts in the memory model.
    name : str
        Readable name, for messages.
    owner : int
        Identity of the builder that created it, so tensors of two graphs never mix.
    letters : str
        One display letter per dimension (``"bchw"``), or empty when unknown.
    """

    shape: tuple
    producer: int | None = None
    index: int = 0
    is_param: bool = False
    name: str = ""
    owner: int = 0
    letters: str = ""

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def key(self):
        """What identifies the tensor within its graph."""
        return (self.producer, self.index, self.name if self.producer is None else "")

    def __repr__(self) -> str:
        where = "input" if self.producer is None else f"output {self.index} of vertex {self.producer}"
        return f"Tensor({self.name or '?'}: {list(self.shape)}, {where})"
