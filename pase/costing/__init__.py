"""Costs of a strategy: evaluating a given one (``strategy``) and the memory it needs per
device (``memory``)."""
