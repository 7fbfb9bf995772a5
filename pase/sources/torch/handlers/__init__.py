"""One handler per ATen operation (or family of them), receiving the mapped arguments and
returning the view of its output; each module registers its handlers where it defines them.
A new operation is one ``@handles({...})`` function in the module of its family.
"""

from . import conv, gemm, moe, movement, pointwise, shape  # noqa: F401  (they register their handlers)
from .registry import HANDLERS

__all__ = ["HANDLERS", "HANDLED"]

#: Every operation some handler maps.
HANDLED = set(HANDLERS)
