"""Code generators: Triton kernels for compute-intensive chains (MCFuser)."""
