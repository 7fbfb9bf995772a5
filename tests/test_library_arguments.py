"""Issue 35 item 2: the library says as much as the command line. Every public function of
``pase.__all__`` called with a wrong type or value of any one argument raises ``TypeError`` or
``ValueError`` whose message names that argument (or returns normally where the value is
acceptable): never an ``AttributeError`` or ``IndexError`` from inside."""

from __future__ import annotations

import inspect
import math

import pytest

import graphs
import pase
from pase.core.errors import TooLarge
from pase.planning.mesh import Recipe

#: A small network of each kind the functions take: a path (AlexNet) and a decoder.
_ALEXNET = graphs.build("alexnet", 8)
_GPT = graphs.build("gpt2-small", 2, 16)


def _dp(network, procs):
    return pase.data_parallel(network, procs)


def _training():
    return pase.plan_training(lambda b: graphs.build("gpt2-small", b, 16), 2, 2, "paper", free=False)


_PLAN = None


def _training_plan():
    global _PLAN
    if _PLAN is None:
        _PLAN = _training()
    return _PLAN


#: Public function -> a valid call: ``(args, kwargs)`` of keyword arguments by parameter name.
VALID = {
    "breadth_first": lambda: {"G": _ALEXNET.graph(4)},
    "generate_seq": lambda: {"G": _ALEXNET.graph(4)},
    "data_parallel": lambda: {"network": _ALEXNET, "procs": 4},
    "largest_divisor": lambda: {"size": 12, "limit": 5},
    "enumerate_configs": lambda: {"domain": (4, 6), "procs": 4},
    "is_contiguous": lambda: {"configs": pase.enumerate_configs((4, 6), 4), "domain": (4, 6)},
    "evaluate": lambda: {"network": _ALEXNET, "configs": _dp(_ALEXNET, 4), "procs": 4},
    "evaluate_plan": lambda: {"network": _ALEXNET, "configs": _dp(_ALEXNET, 4), "procs": 4},
    "expert_strategies": lambda: {"network": _ALEXNET, "procs": 4},
    "load_machine": lambda: {"spec": "paper"},
    "load_engine": lambda: {"spec": "megatron"},
    "make_layer": lambda: {"op": "Elementwise", "operands": [pase.Tensor((2, 3)), pase.Tensor((2, 3))], "args": {}},
    "network_to_json": lambda: {"network": _ALEXNET},
    "network_from_json": lambda: {"data": pase.network_to_json(_ALEXNET)},
    "parse_recipe": lambda: {"text": "dp=2"},
    "plan": lambda: {"network": _ALEXNET, "procs": 4},
    "plan_training": lambda: {"build": lambda b: graphs.build("gpt2-small", b, 16), "batch": 2, "procs": 2,
                              "machine": "paper", "free": False},
    "sweep_training": lambda: {"build": lambda b: graphs.build("gpt2-small", b, 16), "batch": 2, "counts": (1, 2),
                               "machine": "paper", "free": False},
    "search_meshes": lambda: {"build": lambda b: graphs.build("gpt2-small", b, 16), "batch": 2, "procs": 2,
                              "machine": "paper", "memory_cap": None, "act_bytes": 2.0},
    "evaluate_candidate": lambda: {"network": _GPT, "configs": _dp(_GPT, 2), "procs": 2, "machine": "paper",
                                   "options": pase.TrainingOptions(), "act_bytes": 2.0},
    "solve": lambda: {"G": _ALEXNET.graph(4)},
    "training_report": lambda: {"plan": _training_plan(), "network": _GPT},
    "export_shardings": lambda: {"network": _ALEXNET, "configs": _dp(_ALEXNET, 4), "procs": 4},
    "format_training": lambda: {"plan": _training_plan(), "network": _GPT},
    "html_report": lambda: {"plan": _training_plan(), "network": _GPT},
}

#: Arguments whose errors name them by what they are, as the function's documentation does
#: (an error inside ``network_from_json`` names its data by ``where``, "graph file").
ALIASES = {
    ("load_machine", "spec"): "machine",
    ("load_engine", "spec"): "engine",
    ("network_from_json", "data"): "graph file",
    ("parse_recipe", "text"): "recipe",
    ("evaluate", "configs"): "strategy",
    ("evaluate_plan", "configs"): "strategy",
    ("export_shardings", "configs"): "strategy",
}

#: Wrong values tried for every argument.
WRONG = [object(), "nonsense", -3, 2.5, math.nan, [], True]


def _functions() -> list:
    return sorted(name for name in pase.__all__ if inspect.isfunction(getattr(pase, name)))


#: Functions that run a child process or need an optional engine (the verifiers check their
#: network, configurations and device count with ``export_shardings``, fuzzed here).
OPTIONAL = {"from_torch", "to_dtensor", "verify", "verify_torch"}


def test_every_public_function_has_a_valid_call():
    assert set(_functions()) - OPTIONAL == set(VALID), "add the new public function's valid call to VALID"


def _cases() -> list:
    cases = []
    for name in sorted(VALID):
        for parameter in inspect.signature(getattr(pase, name)).parameters.values():
            if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                continue
            cases.append((name, parameter.name))
    return cases


@pytest.mark.parametrize("name, argument", _cases())
def test_a_wrong_argument_is_named(name, argument):
    function = getattr(pase, name)
    for wrong in WRONG:
        kwargs = VALID[name]()
        kwargs[argument] = wrong
        try:
            function(**kwargs)
        except TooLarge as error:  # a refusal of the work a budget argument allows
            assert "budget" in argument and "budget" in str(error), f"{name}({argument}={wrong!r}): {error}"
        except (TypeError, ValueError) as error:
            named = ALIASES.get((name, argument), argument)
            assert argument in str(error) or named in str(error), \
                f"{name}({argument}={wrong!r}): {type(error).__name__}: {error}"
        # Anything else (AttributeError, IndexError, KeyError, ZeroDivisionError) fails the test.


def test_a_machine_name_is_a_machine():
    # The call: pase.plan(net, 64, "h100-sxm") raised AttributeError: 'str' object has
    # no attribute 'check_procs'. A preset name is loaded through the machines registry.
    net = graphs.build("gpt2-small", 8, 16)
    by_name = pase.plan(net, 8, "h100-sxm")
    by_object = pase.plan(net, 8, pase.load_machine("h100-sxm"))
    assert by_name.machine.name == "h100-sxm" and by_name.total_cost == by_object.total_cost
    with pytest.raises(TypeError, match="machine must be a machine"):
        pase.plan(net, 8, 3)
    with pytest.raises(ValueError, match="unknown machine 'h100'"):
        pase.plan(net, 8, "h100")
