"""Package discovery (everything else is in pyproject.toml).

Every package under ``tvm_stitch/`` is found by setuptools; ``passes/`` and ``benchmarks/`` sit at
the top of the repository and are mapped to ``tvm_stitch.passes`` and ``tvm_stitch.benchmarks`` by
``[tool.setuptools.package-dir]``.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["tvm_stitch", "tvm_stitch.*"]),
        "tvm_stitch.passes",
        "tvm_stitch.benchmarks",
    ]
)
