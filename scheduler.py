#!/usr/bin/env python3
"""PaSE's entry point as its README knows it: ``python3 scheduler.py -g transformer -p 64``.

The same program as the ``pase`` console script; everything is in ``pase.cli``.
"""

if __name__ == "__main__":
    from pase._entry import run

    run()
