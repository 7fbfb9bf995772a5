"""The command line, one module per job: exit statuses (``status``) and errors, the flags'
types (``argtypes``), ``Options`` and their defaults (``options``), the parser (``parser``),
the steps the commands share (``common``, ``progress``), one module per command (``search``,
``sweep``, ``evaluate``, ``calibrate``) and ``app.main``, which dispatches to them.

The names below load on first use: the process entry point imports ``status`` alone first.
"""

from importlib import import_module


#: Public name -> the module of this package that defines it.
_EXPORTS = {
    "main": "app", "build_parser": "parser", "Options": "options", "CliError": "errors",
    "EXIT_CODES": "status", "ExitStatus": "status",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pase.cli' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
