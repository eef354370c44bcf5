# Source on the GPU host from the repository root: TVM from .gpu/ (../shared/gpu/pack), and the
# package laid out as its wheel lays it out (passes/ as tvm_stitch.passes, benchmarks/ as
# tvm_stitch.benchmarks, benchmarks/studies/ left out), since the host has no package index to
# install it from.
#
#   source benchmarks/gpu_env.sh; python3 -m pytest -q -m gpu tests/test_zoo.py
source .gpu/setup.sh
_stage=/tmp/tvm-stitch-pkg
rm -rf "$_stage" && mkdir -p "$_stage"
cp -r tvm_stitch "$_stage/tvm_stitch"
cp -r passes "$_stage/tvm_stitch/passes"
mkdir -p "$_stage/tvm_stitch/benchmarks" && cp benchmarks/*.py "$_stage/tvm_stitch/benchmarks/"
export PYTHONPATH="$_stage${PYTHONPATH:+:$PYTHONPATH}"
unset _stage
export PYTHONSAFEPATH=1  # python -m from the repository root must not find the unstaged tvm_stitch/
