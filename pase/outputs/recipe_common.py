"""What the engine-file readers (``--recipe-from``) share: the error of a file that cannot be
read, the checks of a value, of the batch and sequence against the command line's, the recipe."""

from __future__ import annotations

from pase.planning.mesh import Recipe
from pase.planning.pipeline import chunks_priced

__all__ = ["RecipeFileError", "whole", "check_batch", "check_sequence", "folded_etp", "make_recipe", "blocks_of",
           "looped_stages"]


class RecipeFileError(ValueError):
    """The file cannot be read or parsed at all (not: it sets what cannot be priced)."""


def blocks_of(network) -> int | None:
    arch = getattr(network, "architecture", None)
    return arch["layers"] if arch else None


def whole(value, field: str, least: int = 1) -> int:
    """``value`` if it is an integer of at least ``least`` (and at most 2**30), else a one-line error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value > 1 << 30:
        raise ValueError(f"{field} must be an integer of at least {least}, got {value!r}")
    return value


def check_batch(given: int, batch: int, field: str) -> None:
    if given != batch:
        raise ValueError(f"{field} {given} differs from the batch of -b ({batch}): give -b {given}")


def check_sequence(given: int, network, field: str) -> None:
    arch = getattr(network, "architecture", None)
    if arch and given != arch["sequence"]:
        raise ValueError(f"{field} {given} differs from the graph's sequence length {arch['sequence']} "
                         f"(-m {given} builds it so)")


def folded_etp(dp: int, tp: int, ep: int, etp: int | None) -> int | None:
    """The recipe's ``etp``: said only where the experts are folded (``etp`` not ``tp``, or
    ``ep`` not dividing ``dp``: Megatron-Core's MoE parallel folding)."""
    if ep <= 1 or etp is None or (etp == tp and dp % ep == 0):
        return None
    return etp


def make_recipe(**values) -> Recipe:
    """The :class:`Recipe` of the values given (``None``: not fixed); its own errors in one line."""
    try:
        return Recipe(**{k: v for k, v in values.items() if v is not None})
    except (TypeError, ValueError) as err:
        raise ValueError(str(err)) from None


def looped_stages(chunks: list, pp: int, where: str) -> tuple:
    """``(blocks per stage, vpp)`` of model chunks given in the model's order (chunk ``j`` on
    stage ``j mod pp``), when they are the chunks the model prices, each stage's in any order
    (:func:`pase.planning.pipeline.chunk_sizes`: as even as they go on each stage, the largest
    stage or the mean one a multiple of ``vpp``); equal-sized chunks always are."""
    vpp = len(chunks) // pp
    totals = tuple(sum(chunks[s::pp]) for s in range(pp))
    if not chunks_priced(chunks, pp):
        raise ValueError(f"{where}: model parts of {'/'.join(map(str, chunks))} layers; interleaved chunks are "
                         "priced as even as they go on each stage, the largest stage or the mean one a multiple "
                         "of the chunks per stage")
    return totals, vpp
