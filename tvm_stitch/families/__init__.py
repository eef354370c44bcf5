"""Kernel families: one folder each (gemm, attention, chain) with its recognizer and its code
generators."""
