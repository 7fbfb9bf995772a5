"""The plan a training search returns is priced as the search ranked it: its summary's step is
the step of one of the configurations priced, whatever other meshes were searched beside it."""

from pase.planning.engine import load_engine
from pase.planning.mesh import parse_recipe
from pase.planning.training_search import search_meshes
from pase.sources.registry import load


def _search(recipe):
    engine = load_engine("megatron")
    return search_meshes(lambda b: load("hf:examples/hf/llama-3.1-8b.json", b, 4096), 16, 8, "h100-sxm", None, 2.0,
                         parse_recipe(recipe), engine.base_options(), keep_all=True, engine=engine)


def test_summary_step_is_the_searched_step_whatever_else_is_searched():
    # Llama 3.1 8B on 8 H100s with Megatron's tensor-parallel overlap: the redistribution into
    # a layer hides behind what that layer's own collectives leave of its compute, which
    # differs from mesh to mesh. The summary once took the first mesh's leftover for every
    # mesh (0.0008 s off under dp=4, where other meshes come first), so the same plan printed
    # another step depending on the meshes searched beside it (--recipe-from's round trip).
    wide, narrow = _search("dp=4"), _search("dp=4,tp=2")
    assert wide.best.recipe() == narrow.best.recipe()
    for found in (wide, narrow):
        step = found.best.summary.step_seconds
        assert min(abs(p.step_seconds - step) for p in found.candidates) <= 1e-12 * step
    assert abs(wide.best.summary.step_seconds - narrow.best.summary.step_seconds) <= 1e-12 * narrow.best.summary.step_seconds
