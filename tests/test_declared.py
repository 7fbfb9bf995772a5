"""The training model reads what a network is from what its source declared (roles, blocks,
layer-type flags) and the machine through its protocol: no layer-name regex, op-name test,
letter test or ``getattr(machine, ...)`` in pase/costing and pase/planning (docs/roles.md)."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The paper's expert strategies (``--baselines``) are written in the paper's own terms, per
#: layer type and dimension letter (Elango 2021, section VI): the one module left out.
EXEMPT = {os.path.join("pase", "planning", "experts.py")}

FORBIDDEN = [
    (re.compile(r"\bre\.(compile|match|search|fullmatch)\("), "a regular expression (on layer names)"),
    (re.compile(r"\.op\s*(==|!=|in\b|not in\b)"), "a test on a layer's op name"),
    (re.compile(r"\.op\s*\)\s*(==|!=|in\b)"), "a test on a layer's op name"),
    (re.compile(r"\.dims\b"), "a layer's dimension letters"),
    (re.compile(r"_LETTERS?\b"), "a letter constant"),
    (re.compile(r"\bblock_of\b|\.names\[[^]]*\]\s*(==|\.startswith|\.endswith)"), "a layer name test"),
    (re.compile(r"getattr\([\w.]*machine\w*\s*,\s*[\"']"), "a machine attribute outside the protocol"),
]


def _sources():
    for folder in ("costing", "planning"):
        for top, dirs, files in os.walk(os.path.join(ROOT, "pase", folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")  # sub-packages: costing/training/
            for name in sorted(files):
                path = os.path.relpath(os.path.join(top, name), ROOT)
                if name.endswith(".py") and path not in EXEMPT:
                    yield path


@pytest.mark.parametrize("path", list(_sources()))
def test_no_guesses_about_what_a_network_is(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found = [f"{path}:{i}: {why}: {line.strip()}" for i, line in enumerate(lines, 1)
             for pattern, why in FORBIDDEN if pattern.search(line.split("#", 1)[0])]
    assert not found, "\n".join(found)


def test_the_patterns_catch_what_they_are_for():
    samples = ['if layer.op == "Softmax":', 'm = re.compile(r"block(\\d+)")', 'if "h" in layer.dims:',
               'peak = getattr(self.machine, "peak_flops", None)', 'x = HEAD_LETTERS']
    for sample in samples:
        assert any(p.search(sample) for p, _ in FORBIDDEN), sample
    assert not any(p.search("if layer.loss and layer.product:") for p, _ in FORBIDDEN)
