"""The project's own documents: every document under ``docs/`` that code, tests or README cite exists."""

from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CITED = re.compile(r"docs/([a-z][a-z-]*\.md)")


def _tracked_text_files() -> list:
    done = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:  # not a git checkout: walk the tree instead
        return [os.path.relpath(os.path.join(d, f), ROOT) for top in ("pase", "graphs", "tests", "benchmarks")
                for d, _, files in os.walk(os.path.join(ROOT, top)) for f in files if f.endswith((".py", ".md"))]
    return done.stdout.split()


def test_every_cited_document_exists():
    cited = set()
    for path in _tracked_text_files() + ["README.md"]:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            cited |= set(CITED.findall(f.read()))
    assert cited >= {"cost-model.md", "search.md", "memory.md", "machines.md", "graphs.md", "cli.md"}
    missing = sorted(name for name in cited if not os.path.exists(os.path.join(ROOT, "docs", name)))
    assert not missing
