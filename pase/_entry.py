"""The process entry point of ``pase``, ``python3 -m pase`` and ``scheduler.py``.

It imports nothing heavy itself, so that Ctrl-C or a missing dependency during the imports
gives the same one clean line as anywhere else, and it turns output errors (a closed or full
standard output) into exit status 1.
"""

import os
import sys

from pase.cli.status import ExitStatus


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null so the interpreter's last flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    except (OSError, ValueError):
        pass


def run(prog: str = "pase") -> None:
    """Import the CLI, run it on ``sys.argv[1:]`` and exit with its status."""
    try:
        from pase.cli.app import main
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.exit(ExitStatus.INTERRUPTED)
    except ModuleNotFoundError as missing:  # a dependency is not installed in this Python
        sys.stderr.write(
            f"{prog}: error: the module {missing.name!r} is missing from {sys.executable}; "
            "install the requirements first: python3 -m pip install .\n"
        )
        sys.exit(ExitStatus.INPUT)
    if sys.stdout is None:  # started with standard output closed (pase >&-)
        sys.stderr.write(f"{prog}: error: cannot write the output: standard output is closed\n")
        sys.exit(ExitStatus.INPUT)
    try:
        status = main(prog=prog)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        status = ExitStatus.INTERRUPTED
    if status == ExitStatus.BROKEN_PIPE:
        _silence_stdout()  # the reader went away (pase ... | head): stay quiet
        sys.exit(status)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(ExitStatus.BROKEN_PIPE)
    except OSError as err:  # a full disk, a device that refuses the write
        _silence_stdout()
        sys.stderr.write(f"{prog}: error: cannot write the output: {err.strerror or err}\n")
        sys.exit(ExitStatus.INPUT)
    sys.exit(status)
