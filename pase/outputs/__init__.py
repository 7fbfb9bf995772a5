"""What a plan is turned into: the table, sweep rows, JSON and DOT (``report``), and the
JAX shardings and their verification run (``jax``)."""
