"""Run the command line in-process with captured streams (shared by the CLI tests)."""

from __future__ import annotations

import io
import os
import sys

from pase.cli import main


def run(*argv, cwd=None, stdin: str | None = None, stderr: io.StringIO | None = None) -> tuple:
    """``(status, stdout, stderr)`` of ``pase argv``, run in ``cwd`` with ``stdin`` as its
    standard input when given; ``stderr`` replaces the captured error stream (a fake terminal)."""
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    old_dir, old_stdin = os.getcwd(), sys.stdin
    if cwd is not None:
        os.chdir(cwd)
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        status = main([str(a) for a in argv], stdout=out, stderr=err)
    finally:
        os.chdir(old_dir)
        sys.stdin = old_stdin
    return status, out.getvalue(), err.getvalue()
