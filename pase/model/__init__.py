"""Network models: tensors, layer types and their configurations (``layers``, ``configs``),
and the computation graph (``builder``: ``Network``, ``GraphBuilder``)."""
