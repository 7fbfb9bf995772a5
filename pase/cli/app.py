"""The command line: ``scheduler.py`` and the ``pase`` console script (``docs/cli.md``).

``main(argv) -> exit status``: parse the flags into ``Options``, call the library
(``pase.sources.load`` -> ``pase.plan`` or ``pase.evaluate_plan``), render the result. It prints to
the streams it is given and never exits the interpreter itself."""

from __future__ import annotations

import os
import sys
from typing import IO, Sequence

from pase.core.fileio import InputError
from pase.model.builder import CostTablesTooLarge
from pase.search.solver import SearchTooLarge

from .errors import CliError, ParserExit
from .evaluate import run_evaluate
from .options import options_from_args
from .parser import build_parser
from .search import run_search
from .status import ExitStatus
from .sweep import run_sweep

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, stdout: IO | None = None, stderr: IO | None = None,
         prog: str = "pase") -> int:
    """Run the tool on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Output goes to ``stdout`` and ``stderr`` (default: ``sys.stdout`` and ``sys.stderr``
    at call time). Every error is one ``pase: error:`` line on stderr and a non-zero status
    (see ``EXIT_CODES``); the interpreter is never exited here.
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        from .calibrate import main as calibrate

        return calibrate(argv[1:], out, err, prog=f"{prog} calibrate")
    parser = build_parser(out, err, prog)
    try:
        args = parser.parse_args(argv)
        if args.evaluate is not None:
            return run_evaluate(args, out, err)
        opts = options_from_args(args)
        if opts.sweep is not None:
            return run_sweep(opts, out, err)
        return run_search(opts, out, err)
    except ParserExit as done:
        return done.status
    except CliError as error:
        err.write(f"{prog}: error: {error}\n")
        return error.status
    except InputError as error:
        err.write(f"{prog}: error: {error}\n")
        return ExitStatus.INPUT
    except SearchTooLarge as too_large:
        hint = " (GenerateSeq, --algo 0, needs far smaller tables)" if too_large.estimate.ordering != "generateseq" else ""
        err.write(f"{prog}: error: {too_large}{hint}\n")
        return ExitStatus.TOO_LARGE
    except CostTablesTooLarge as too_large:
        err.write(f"{prog}: error: {too_large}\n")
        return ExitStatus.TOO_LARGE
    except MemoryError as error:
        err.write(f"{prog}: error: out of memory ({error or 'the cost tables are too large'})\n")
        return ExitStatus.TOO_LARGE
    except KeyboardInterrupt:
        err.write(f"{prog}: interrupted\n")
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        return ExitStatus.BROKEN_PIPE
    except OSError as error:  # writing the output failed (a full disk, a closed stream)
        err.write(f"{prog}: error: cannot write the output: {error.strerror or error}\n")
        return ExitStatus.INPUT
    except Exception as bug:  # a bug: one line, unless asked for the traceback
        if os.environ.get("PASE_TRACEBACK"):
            raise
        err.write(f"{prog}: internal error: {type(bug).__name__}: {bug} (set PASE_TRACEBACK=1 for the traceback)\n")
        return ExitStatus.INTERNAL
