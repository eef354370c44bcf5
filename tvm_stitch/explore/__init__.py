"""Search spaces and fusion-plan exploration."""
