"""Search loops and measurement."""
