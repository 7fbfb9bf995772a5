"""Reading JSON and writing files safely: one place for every file the tool reads or writes.

Input files are untrusted: anything malformed or hostile (deep nesting, huge numbers, NaN)
becomes an ``InputError`` with one clear line. Output files are written to a temporary file
in the same directory and renamed into place, so a failed write never destroys the old file.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile

from .errors import InputError

__all__ = ["InputError", "read_json", "parse_json", "write_atomic"]

#: Largest JSON input accepted, bytes: far above any real graph, plan or machine file.
MAX_JSON_BYTES = 256 * 1024 * 1024


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs):
    """``object_pairs_hook``: a key given twice in one object is an error, not "last wins"."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def parse_json(text: str, where: str):
    """Parse ``text`` as strict JSON; ``InputError`` naming ``where`` for anything else.

    Rejects NaN and Infinity, a key given twice in one object (two values for one field
    would leave it to the reader which one counts), nesting deep enough to exhaust the
    parser, and integers too long to convert, which ``json`` would otherwise raise as
    unrelated errors.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as err:
        raise InputError(f"{where}: key {str(err.args[0])[:80]!r} appears more than once") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{where} is not valid JSON: {err}") from None
    except RecursionError:
        raise InputError(f"{where} is nested too deeply to be a valid input") from None
    except ValueError as err:  # over-long integers, NaN/Infinity
        raise InputError(f"{where} is not valid input JSON: {err}") from None


def read_json(path: str, what: str, stdin: bool = True):
    """Read the JSON file ``path`` (``-`` for standard input unless ``stdin`` is false);
    ``what`` names it in messages."""
    stdin = stdin and path == "-"
    where = f"{what} {path}" if not stdin else f"{what} on standard input"
    if "\0" in path:
        raise InputError(f"cannot read {what} {path!r}: the name contains a NUL byte")
    try:
        if stdin:
            if sys.stdin is None:  # started with standard input closed (pase --evaluate - <&-)
                raise InputError(f"cannot read {where}: standard input is closed")
            text = sys.stdin.read(MAX_JSON_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_JSON_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read {where}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise InputError(f"{where} is not UTF-8 text") from None
    if len(text) > MAX_JSON_BYTES:
        raise InputError(f"{where} is larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB")
    return parse_json(text, where)


def _existing(path: str, what: str):
    """``os.stat`` of the file a write to ``path`` lands in (symlinks followed), or ``None``.

    ``InputError`` for a name that can never be written: a NUL byte in it, a symlink loop,
    a file where a directory belongs, a name too long.
    """
    if "\0" in path:
        raise InputError(f"cannot write the {what} to {path!r}: the name contains a NUL byte")
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None  # a new file, or a dangling symlink whose target is created
    except OSError as err:
        raise InputError(f"cannot write the {what} to {path}: {err.strerror or err}") from None


def write_atomic(path: str, text: str, what: str = "file") -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory.

    The old file (if any) is replaced only once the new one is complete; on any failure it
    is left as it was and ``InputError`` names the path and the reason. A symlink is
    followed (the file it names is replaced, the link stays); a device, pipe or socket
    (``/dev/null``, ``/dev/stdout``) is written in place, since renaming a file onto it
    would replace the device itself.
    """
    existing = _existing(path, what)
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise InputError(f"cannot write the {what} to {path}: it is a directory")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            raise InputError(f"cannot write the {what} to {path}: {err.strerror or err}") from None
        return
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise InputError(f"cannot write the {what} to {path}: directory {directory} does not exist")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if existing is not None:
            try:
                os.chmod(tmp, existing.st_mode & 0o7777)
            except OSError:
                pass
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        tmp = None
    except OSError as err:
        raise InputError(f"cannot write the {what} to {path}: {err.strerror or err}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def check_writable(path: str, what: str) -> None:
    """Refuse, before any work, a path the tool could not write (``InputError``)."""
    if not path.strip():
        raise InputError(f"the {what} needs a file name")
    existing = _existing(path, what)
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise InputError(f"cannot write the {what} to {path}: it is a directory")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        if not os.access(path, os.W_OK):
            raise InputError(f"cannot write the {what} to {path}: permission denied")
        return
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise InputError(f"cannot write the {what} to {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (existing is not None and not os.access(target, os.W_OK)):
        raise InputError(f"cannot write the {what} to {path}: permission denied")
