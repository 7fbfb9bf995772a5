"""``python3 -m pase``: the ``pase`` command."""

from pase._entry import run

run()
