"""The command line: ``scheduler.py`` and the ``pase`` console script (``docs/cli.md``).

``main(argv) -> exit status``: parse the flags into ``Options``, call the library
(``pase.sources.load`` -> ``pase.plan`` or ``pase.evaluate_plan``), render the result. It prints to
the streams it is given and never exits the interpreter itself."""

from __future__ import annotations

import os
import sys
from typing import IO, Sequence

from pase.core.errors import InputError, MissingDependency, TooLarge
from pase.core.fileio import recording_reads
from pase.search.solver import SearchTooLarge

from .errors import CliError, ParserExit
from .evaluate import run_evaluate
from .options import options_from_args
from .parser import build_parser
from .search import run_search
from .status import ExitStatus
from .sweep import run_sweep
from .training import check_training_flags, run_training_command, wants_training
from .budget import check_budget_flags
from .training_sweep import check_sweep_flags, run_training_sweep

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
    if argv[:1] == ["machines"]:
        from .machines import main as machines

        return machines(argv[1:], out, err, prog=f"{prog} machines")
    try:
        with recording_reads():  # no output may land on a file the run reads (pase.core.fileio)
            return _run_command(argv, out, err, prog)
    except (Exception, KeyboardInterrupt) as error:
        return _report(error, err, prog)


def _run_command(argv: list, out: IO, err: IO, prog: str) -> int:
    args = build_parser(out, err, prog).parse_args(argv)
    if args.evaluate is not None:
        check_budget_flags(args, False)
        return run_evaluate(args, out, err)
    training = wants_training(args)
    check_budget_flags(args, training)
    check_sweep_flags(args, training)
    if training:
        check_training_flags(args, lambda message: CliError(message, ExitStatus.USAGE))
    opts = options_from_args(args)
    if training:
        if opts.sweep is not None:  # the training plan at every count
            return run_training_sweep(opts, args, out, err)
        return run_training_command(opts, args, out, err)
    if opts.sweep is not None:
        return run_sweep(opts, out, err)
    return run_search(opts, out, err)


def _report(error: BaseException, err: IO, prog: str) -> int:
    """Say what ended the command (one line on ``err``) and return its exit status.

    The handler is the one of the error's most specific class in ``_HANDLERS`` (its method
    resolution order decides, not the order of the table).
    """
    handler = next(_HANDLERS[cls] for cls in type(error).__mro__ if cls in _HANDLERS)
    status, message = handler(error)
    if message is not None:
        err.write(f"{prog}: {message}\n")
    return status


def _too_large(error: TooLarge) -> tuple:
    hint = ""
    if isinstance(error, SearchTooLarge) and error.estimate.ordering != "generateseq":
        hint = " (GenerateSeq, --algo 0, needs far smaller tables)"
    return ExitStatus.TOO_LARGE, f"error: {error}{hint}"


def _internal(error: Exception) -> tuple:
    if os.environ.get("PASE_TRACEBACK"):
        raise error
    return ExitStatus.INTERNAL, f"internal error: {type(error).__name__}: {error} (set PASE_TRACEBACK=1 for the traceback)"


#: Error class -> ``handler(error) -> (exit status, message or None)``.
_HANDLERS = {
    ParserExit: lambda done: (done.status, None),  # --help, --version
    CliError: lambda error: (error.status, f"error: {error}"),
    InputError: lambda error: (ExitStatus.INPUT, f"error: {error}"),
    MissingDependency: lambda error: (ExitStatus.USAGE, f"error: {error}"),
    TooLarge: _too_large,
    MemoryError: lambda error: (ExitStatus.TOO_LARGE, f"error: out of memory ({str(error) or 'the process ran out of memory'})"),
    KeyboardInterrupt: lambda _: (ExitStatus.INTERRUPTED, "interrupted"),
    BrokenPipeError: lambda _: (ExitStatus.BROKEN_PIPE, None),
    # Writing the output failed (a full disk, a closed stream).
    OSError: lambda error: (ExitStatus.INPUT, f"error: cannot write the output: {error.strerror or error}"),
    Exception: _internal,  # a bug: one line, unless asked for the traceback
}
