"""The CLI's own exceptions: a bad input to report in one line, and argparse finishing early."""

from __future__ import annotations

from pase.core.errors import PaseError

from .status import ExitStatus

__all__ = ["CliError", "ParserExit"]


class CliError(PaseError):
    """A problem with the user's input: printed as one ``pase: error:`` line, then ``status``."""

    def __init__(self, message: str, status: int = ExitStatus.INPUT):
        super().__init__(message)
        self.status = status


class ParserExit(Exception):
    """argparse finished early (``--help``, ``--version``) with ``status``."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status
