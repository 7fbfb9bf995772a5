"""Packaging stays consistent: the console script, the modules shipped and the dependencies.

(Installing into a fresh virtual environment is done by ``.ci/run``; these checks are the
fast part that needs no network.)
"""

from __future__ import annotations

import ast
import os
import re


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setup_keywords():
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    return {kw.arg: kw.value for kw in call.keywords}


def requirement_lines(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def test_console_script_points_at_the_light_entry_point():
    kw = setup_keywords()
    scripts = ast.literal_eval(kw["entry_points"])["console_scripts"]
    assert scripts == ["pase = pase._entry:run"]
    import pase._entry

    assert callable(pase._entry.run)


def test_packages_and_scheduler_module_are_shipped():
    kw = setup_keywords()
    on_disk = sorted(
        os.path.relpath(folder, ROOT).replace(os.sep, ".")
        for top in ("pase", "graphs")
        for folder, _, files in os.walk(os.path.join(ROOT, top))
        if "__init__.py" in files
    )
    assert sorted(ast.literal_eval(kw["packages"])) == on_disk
    assert ast.literal_eval(kw["py_modules"]) == ["scheduler"]
    assert os.path.exists(os.path.join(ROOT, "scheduler.py"))


def test_requirements_are_direct_dependencies_with_lower_bounds():
    lines = requirement_lines("requirements.txt")
    names = {re.split(r"[<>=!~ ]", line)[0].lower(): line for line in lines}
    assert set(names) == {"networkx", "numpy", "pydot", "tqdm"}
    assert all(">=" in line and "==" not in line for line in lines)  # lower bounds, not a freeze
    # setup.py declares the same set.
    install = ast.literal_eval(setup_keywords()["install_requires"])
    assert sorted(install) == sorted(lines)


def test_test_requirements_add_pytest_to_the_runtime_ones():
    lines = requirement_lines("requirements-test.txt")
    assert "-r requirements.txt" in lines
    assert any(line.startswith("pytest") for line in lines)


def test_measured_tables_ship_as_package_data():
    kw = setup_keywords()
    assert ast.literal_eval(kw["package_data"]) == {"pase.machines": ["data/*.json"],
                                                    "pase.planning": ["engines/*.json", "data/*.json"]}
    assert os.path.exists(os.path.join(ROOT, "pase", "machines", "data", "h100-sxm-measured.json"))
    assert os.path.exists(os.path.join(ROOT, "pase", "planning", "data", "parallel_rules.json"))


def test_optional_extras_are_declared():
    extras = ast.literal_eval(setup_keywords()["extras_require"])
    assert set(extras) == {"torch", "jax", "hf", "engines"}
    # torchtitan 0.3's launch is what --export-torchtitan writes (0.4 may change its command line again).
    assert any(r.startswith("torchtitan") and ">=0.3" in r and "<0.4" in r for r in extras["engines"])
