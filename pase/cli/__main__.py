"""``python3 -m pase.cli``: the ``pase`` command."""

from pase._entry import run

run()
