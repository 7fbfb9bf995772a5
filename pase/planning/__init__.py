"""Planning: ``plan`` (search and summarise), ``evaluate_plan`` (cost a given strategy), the
``Plan`` they return, and the strategies compared with it (data parallelism, expert strategies)."""
