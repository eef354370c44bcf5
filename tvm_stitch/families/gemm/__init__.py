"""The gemm family: a contraction with its epilogue, grouped by shared A."""
