"""The import rule of the package: imports point down the pipeline stages (pyproject.toml,
``[tool.importlinter]``), checked with import-linter so that no change can quietly add a cycle
or make the search depend on the model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The stages from the top down; "a | b" are independent siblings.
STAGES = [
    "pase.cli", "pase.outputs", "pase.planning", "pase.sources", "graphs", "pase.costing | pase.search",
    "pase.model", "pase.machines", "pase.core",
]


def _config() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11: the same check on the text
        return {}
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]


def test_the_layers_contract_lists_the_stages():
    config = _config()
    if not config:
        return
    layers = [c for c in config["contracts"] if c["type"] == "layers"]
    assert [c["layers"] for c in layers] == [STAGES]
    assert sorted(config["root_packages"]) == ["graphs", "pase"]


def test_lint_imports_keeps_every_contract():
    command = shutil.which("lint-imports")
    assert command, "lint-imports is missing: pip install -r requirements-test.txt (it installs import-linter)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))
    done = subprocess.run([command, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
