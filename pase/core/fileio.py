"""Reading JSON and writing files safely: one place for every file the tool reads or writes.

Input files are untrusted: anything malformed or hostile (deep nesting, huge numbers, NaN)
becomes an ``InputError`` with one clear line. Output files are written to a temporary file
in the same directory and renamed into place, so a failed write never destroys the old file.

Inputs are never outputs: inside ``recording_reads()`` (the command line runs every command
in one) every file read here is recorded, and ``write_atomic`` / ``check_writable`` refuse a
path that is one of them, links resolved. A reader that does not go through ``read_json``
(a Python module, a binary table) reports its file with ``note_read``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar

from .errors import InputError

__all__ = [
    "InputError", "read_json", "parse_json", "write_atomic", "check_writable", "Reads", "recording_reads",
    "note_read", "same_file", "current_reads",
]

#: Largest JSON input accepted, bytes: far above any real graph, plan or machine file.
MAX_JSON_BYTES = 256 * 1024 * 1024


def same_file(a: str, b: str) -> bool:
    """Whether the paths ``a`` and ``b`` name one file: symlinks resolved, hard links and
    names differing only in case (on such a file system) included."""
    if "\0" in a or "\0" in b:
        return False  # no file has such a name: reading or writing it is refused on its own
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


class Reads:
    """The files one run read: ``(what, path)`` in the order first read (``what`` names the
    file in messages: ``"machine file"``, ``"measured table"``)."""

    def __init__(self):
        self._files: dict = {}

    def add(self, path: str, what: str) -> None:
        if path and path != "-" and "\0" not in path:
            self._files.setdefault(os.path.realpath(path), (what, path))

    def items(self) -> list:
        return list(self._files.values())

    def find(self, path: str):
        """``(what, path)`` of the file read that ``path`` names, or ``None``."""
        if "\0" in path:
            return None
        hit = self._files.get(os.path.realpath(path))
        if hit is not None:
            return hit
        return next((entry for entry in self._files.values() if same_file(path, entry[1])), None)


_READS: ContextVar = ContextVar("pase_reads", default=None)


@contextmanager
def recording_reads():
    """Record every file read (``read_json``, ``note_read``) until the block ends; yields the
    ``Reads``. Writes through this module inside the block refuse any of those files."""
    reads = Reads()
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def current_reads() -> list:
    """``(what, path)`` of every file read so far in the recording block (empty outside one)."""
    reads = _READS.get()
    return [] if reads is None else reads.items()


def note_read(path: str, what: str) -> None:
    """Record that the run reads ``path`` (``what`` names it), when reads are recorded."""
    reads = _READS.get()
    if reads is not None:
        reads.add(path, what)


def _refuse_an_input(path: str, what: str) -> None:
    reads = _READS.get()
    hit = reads.find(path) if reads is not None else None
    if hit is not None:
        raise InputError(f"cannot write the {what} to {path}: it is the {hit[0]} {hit[1]} that this run reads "
                         "(choose another output file)")


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
    if not stdin:
        note_read(path, what)
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
    if existing is not None and stat.S_ISREG(existing.st_mode):
        _refuse_an_input(path, what)  # (a device or pipe is written in place: no input is lost)
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
    if existing is not None and stat.S_ISREG(existing.st_mode):
        _refuse_an_input(path, what)  # (a device or pipe is written in place: no input is lost)
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
