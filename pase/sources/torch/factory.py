"""Model factories (``FILE.py:FUNCTION`` or ``package.module:FUNCTION``): importing one and
calling it for a module and its example inputs, with one clear error for each way it fails."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sys

from pase.core.checks import is_positive_int

from .errors import FactoryError, TorchImportError, TorchNotInstalledError, _import_torch


def load_factory(spec: str, batch: int):
    """Call a model factory ``FILE.py:FUNCTION`` or ``package.module:FUNCTION`` with ``batch``.

    ``FUNCTION(batch)`` must return ``(module, args)`` or ``(module, args, kwargs)``.
    Returns ``(module, args, kwargs)`` (``kwargs`` a dict, possibly empty). Raises
    ``FactoryError`` naming the factory and the problem in one line.

    Examples
    --------
    >>> load_factory("examples/no_such_file.py:build", 8)
    Traceback (most recent call last):
    ...
    pase.sources.torch.errors.FactoryError: factory examples/no_such_file.py:build: file examples/no_such_file.py does not exist
    """
    torch = None
    if not isinstance(spec, str) or ":" not in spec:
        raise FactoryError(f"a model factory is FILE.py:FUNCTION or package.module:FUNCTION, got {spec!r}")
    where, _, func = spec.rpartition(":")
    label = f"factory {spec}"
    if not where or not func or not func.isidentifier():
        raise FactoryError(f"{label}: expected FILE.py:FUNCTION or package.module:FUNCTION")
    if not is_positive_int(batch):
        raise FactoryError(f"{label}: the batch size must be a positive integer, got {batch!r}")
    if where.endswith(".py") or os.sep in where or "/" in where:
        if os.path.isdir(where):
            raise FactoryError(f"{label}: {where} is a directory, not a Python file")
        if not os.path.isfile(where):
            raise FactoryError(f"{label}: file {where} does not exist")
        module_name = "_pase_factory_" + re.sub(r"\W", "_", os.path.abspath(where))
        loader_spec = importlib.util.spec_from_file_location(module_name, where)
        if loader_spec is None or loader_spec.loader is None:
            raise FactoryError(f"{label}: {where} is not a Python file")
        source = importlib.util.module_from_spec(loader_spec)
        directory = os.path.dirname(os.path.abspath(where))
        added = directory not in sys.path
        if added:  # so that the file can import its neighbours
            sys.path.insert(0, directory)
        try:
            loader_spec.loader.exec_module(source)
        except (TorchNotInstalledError, KeyboardInterrupt):
            raise
        except ImportError as err:
            raise _missing(label, err, f"importing {where} failed") from None
        except BaseException as err:  # noqa: BLE001  the user's code: sys.exit() must not end the tool
            raise FactoryError(f"{label}: importing {where} failed: {_raised(err)}") from None
        finally:
            if added:
                sys.path.remove(directory)
    else:
        try:
            source = importlib.import_module(where)
        except KeyboardInterrupt:
            raise
        except ImportError as err:
            raise _missing(label, err, f"cannot import module {where}") from None
        except BaseException as err:  # noqa: BLE001
            raise FactoryError(f"{label}: importing {where} failed: {_raised(err)}") from None
    factory = getattr(source, func, None)
    if factory is None:
        raise FactoryError(f"{label}: {where} has no function {func!r}")
    if not callable(factory):
        raise FactoryError(f"{label}: {func!r} in {where} is not a function")
    try:
        result = factory(batch)
    except (TorchNotInstalledError, KeyboardInterrupt):
        raise
    except ImportError as err:
        raise _missing(label, err, "raised") from None
    except SystemExit as err:
        raise FactoryError(f"{label} {_raised(err)}") from None
    except BaseException as err:  # noqa: BLE001
        raise FactoryError(f"{label} raised {_raised(err)}") from None
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise FactoryError(f"{label} must return (module, args) or (module, args, kwargs), "
                           f"got {type(result).__name__}")
    torch = _import_torch()
    module, args = result[0], result[1]
    kwargs = result[2] if len(result) == 3 else None
    if not isinstance(module, torch.nn.Module):
        raise FactoryError(f"{label} returned {type(module).__name__} where a torch.nn.Module belongs")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise FactoryError(f"{label} returned args of type {type(args).__name__}; expected a tuple of inputs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise FactoryError(f"{label} returned kwargs of type {type(kwargs).__name__}; expected a dict")
    return module, tuple(args), dict(kwargs or {})


def _missing(label: str, err: ImportError, what: str) -> TorchImportError:
    """The error for a factory whose imports fail: torch itself, or a package it needs."""
    missing = getattr(err, "name", None)
    if missing == "torch":
        return TorchNotInstalledError()
    hint = f" (pip install {missing})" if missing and "." not in missing and isinstance(err, ModuleNotFoundError) else ""
    return FactoryError(f"{label}: {what}: {type(err).__name__}: {_one_line(err)}{hint}")


@contextlib.contextmanager
def _quiet_logging():
    """No log records while torch traces: on a model it cannot trace, torch logs the failure
    with a traceback on stderr, and the error it raises already says it in one line."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def _raised(err: BaseException) -> str:
    """What the user's code did, in a few words: ``called sys.exit(2)``, ``ValueError: ...``."""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r})"
    return f"{type(err).__name__}: {_one_line(err)}"


def _one_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
