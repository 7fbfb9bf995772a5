#!/usr/bin/env python3
"""PaSE's entry point as its README knows it: ``python3 scheduler.py -g transformer -p 64``.

The same program as the ``pase`` console script; everything is in ``pase.cli``.
"""

import sys

if __name__ == "__main__":
    try:
        from pase.cli import main
    except ModuleNotFoundError as missing:  # a dependency is not installed in this Python
        sys.stderr.write(
            f"pase: error: the module {missing.name!r} is missing from {sys.executable}; "
            "install the requirements first: python3 -m pip install .\n"
        )
        sys.exit(1)
    sys.exit(main())
