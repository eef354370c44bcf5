#!/usr/bin/env bash
# On the GPU host (2 GPUs): the stitch pipeline of an earlier tree and of this one, built side by
# side (one GPU each, each with its own copy of the warm tuning database) and timed alternately
# in one process on one GPU (same_run.py).
#
#   bash benchmarks/studies/same_run_gpu.sh OUTDIR BASE [CASE ...]
#
# BASE: a folder holding an earlier commit's tvm_stitch/, passes/ and benchmarks/*.py, e.g.
#   git archive COMMIT tvm_stitch passes benchmarks | tar -x -C _base   (carry it with the tree)
set -uo pipefail
out=${1:?usage: same_run_gpu.sh OUTDIR BASE [CASE ...]}
base=${2:?usage: same_run_gpu.sh OUTDIR BASE [CASE ...]}
shift 2
source benchmarks/gpu_env.sh  # this tree, staged at /tmp/tvm-stitch-pkg
export TRITON_DEFAULT_FP_FUSION=1
staged=/tmp/tvm-stitch-base
stage_tvm_stitch "$base" "$staged"
new_path=$PYTHONPATH
base_path=$staged:${PYTHONPATH#/tmp/tvm-stitch-pkg:}
mkdir -p "$out"
xz -dc benchmarks/tuning/h100.json.xz > "$out/db_base.json"
cp "$out/db_base.json" "$out/db_new.json"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$base_path TVM_STITCH_TUNING_DB=$out/db_base.json \
    TVM_STITCH_CACHE=/tmp/cache_base timeout "${BUILD_S:-400}" \
    python3 benchmarks/studies/same_run.py build /tmp/sr_base "$@" > "$out/build_base.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$new_path TVM_STITCH_TUNING_DB=$out/db_new.json \
    TVM_STITCH_CACHE=/tmp/cache_new timeout "${BUILD_S:-400}" \
    python3 benchmarks/studies/same_run.py build /tmp/sr_new "$@" > "$out/build_new.log" 2>&1 &
wait
grep -h '^{' "$out/build_base.log" "$out/build_new.log"
python3 benchmarks/studies/same_run.py time /tmp/sr_base /tmp/sr_new "$@" 2>&1 \
    | tee "$out/time.log" | grep -v "^{"
