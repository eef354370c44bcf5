# Source on the GPU host from the repository root: TVM from .gpu/ (../shared/gpu/pack), and the
# package laid out as its wheel lays it out (passes/ as tvm_stitch.passes, benchmarks/ as
# tvm_stitch.benchmarks, benchmarks/studies/ left out), since the host has no package index to
# install it from.
#
#   source benchmarks/gpu_env.sh; python3 -m pytest -q -m gpu tests/test_zoo.py
source .gpu/setup.sh

# stage_tvm_stitch TREE DEST: TREE's tvm_stitch/, passes/ and benchmarks/*.py as DEST/tvm_stitch
stage_tvm_stitch() {
    rm -rf "$2" && mkdir -p "$2/tvm_stitch/benchmarks"
    cp -r "$1/tvm_stitch/." "$2/tvm_stitch/"
    cp -r "$1/passes" "$2/tvm_stitch/passes"
    cp "$1"/benchmarks/*.py "$2/tvm_stitch/benchmarks/"
}

stage_tvm_stitch . /tmp/tvm-stitch-pkg
export PYTHONPATH="/tmp/tvm-stitch-pkg${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1  # python -m from the repository root must not find the unstaged tvm_stitch/
