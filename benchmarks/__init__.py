"""Benchmark studies (installed as ``tvm_stitch.benchmarks``; ``tvm-stitch bench STUDY``).

Studies: ``bert`` (end to end), ``memory`` (memory-intensive subgraphs), ``gemm-chains`` (MCFuser
Table II) and ``attention`` (MCFuser Table III).  Each prints a table and can write JSON lines.
"""

from .bench import CASES, STUDIES, bench_instance, run_study

__all__ = ["CASES", "STUDIES", "bench_instance", "run_study"]
