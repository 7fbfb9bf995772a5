"""What a plan is turned into: the layer table (``table``), sweep rows (``sweep``), the JSON
object (``plan_json``), the DOT graph (``dot``), timings (``measure``), all rendered from the
rows of ``rows``; the files of ``--export-*`` (``exporters``) and the JAX shardings and their
verification run (``jax``). Nothing here prints."""
