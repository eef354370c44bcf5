"""Analyses over the tensor dependency graph (return data, decide nothing)."""
