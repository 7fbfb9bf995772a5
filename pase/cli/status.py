"""Exit statuses of ``pase``, one ``IntEnum``, and what each means (``--help`` lists them).

Light on purpose: the process entry point (``pase._entry``) imports it before anything heavy.
"""

from enum import IntEnum

__all__ = ["ExitStatus", "EXIT_CODES"]


class ExitStatus(IntEnum):
    OK = 0
    INPUT = 1  # a file could not be read or written, or the strategy in it is invalid
    USAGE = 2  # the command line is wrong (argparse's own status for the same thing)
    TOO_LARGE = 3  # the search's tables would exceed the memory budget (nothing allocated)
    NOTHING_FITS = 4  # no strategy fits the --memory cap per device
    VERIFY = 5  # --verify: the sharded run's numbers differ from the unsharded run
    INTERNAL = 70  # a bug: please report it (EX_SOFTWARE of sysexits.h)
    INTERRUPTED = 130
    BROKEN_PIPE = 141


#: The statuses documented in --help and docs/cli.md, with their meaning.
EXIT_CODES = {
    int(ExitStatus.OK): "success",
    int(ExitStatus.INPUT): "a file could not be read or written, or a graph or strategy file is invalid",
    int(ExitStatus.USAGE): "bad command line: unknown flag, malformed or out-of-range value, a value the graph "
                           "cannot take, or a --machine that is neither a preset nor a readable, valid machine file",
    int(ExitStatus.TOO_LARGE): "the search's tables would not fit the memory budget (refused before allocating)",
    int(ExitStatus.NOTHING_FITS): "no strategy fits the --memory cap per device (the least any strategy needs is "
                                  "printed)",
    int(ExitStatus.VERIFY): "--verify: the plan run sharded (XLA devices, or torch processes) gave other numbers than the unsharded run",
    int(ExitStatus.INTERNAL): "internal error (a bug; set PASE_TRACEBACK=1 to see the traceback)",
    int(ExitStatus.INTERRUPTED): "interrupted (Ctrl-C)",
}
