"""Costs of a strategy: evaluating a given one (``strategy``), the memory it needs per device
(``memory``), and a training configuration's time and memory (``training/``, ``precision``)."""
