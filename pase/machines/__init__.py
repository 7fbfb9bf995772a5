"""Machines price the work of a configuration: the protocol (``base``), the reference machine
of the paper (``paper``), calibrated machines and their measured tables, calibration, and the
registry by name (``registry.load_machine``)."""
