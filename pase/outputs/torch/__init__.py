"""Plans run in PyTorch: DTensor placements (program) and the checked run on gloo processes (verify)."""
