"""Plans for JAX: the mesh and PartitionSpecs (``export``, no jax needed), the program that
runs them (``program``), the verification in a child process (``verify``, ``child``) and the
collectives in its compiled HLO (``hlo``)."""
