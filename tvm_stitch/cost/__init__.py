"""Cost models: MCFuser's analytical model (later: delta- and latency-evaluators)."""
