#!/usr/bin/env bash
# Make the compiler bundle of ../shared/gpu/pack fit the device tool's 64 MiB carry.
#
#   ../shared/gpu/pack --compiler && bash benchmarks/split_gpu_bundle.sh
#
# The bundle (~66 MB) and the working tree (~2.5 MB) together exceed what one device call
# carries. This rewrites .gpu/ smaller (TVM's Python sources without the web, tflite, onnx,
# stablehlo and C++ source folders; apache-tvm-ffi as a tar.xz instead of a wheel) and moves
# half of the compressed compiler library into .gpu_a/. Two calls in a row then install TVM on
# the GPU host (the machine keeps /tmp while it stays warm, 30 s after a call):
#
#   call 1: carry [".gpu_a"], command: cp .gpu_a/part /tmp/gpu_parta
#   call 2: carry [".gpu"],   command: source benchmarks/gpu_env.sh; ...  (TVM from .gpu/, the package staged)
#
# Later calls to the same warm machine carry .gpu without the part (setup.sh finds TVM installed).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
gpu="$root/.gpu"
[[ -f "$gpu/libtvm_compiler.so.xz" ]] || { echo "run ../shared/gpu/pack --compiler first" >&2; exit 1; }
grep -qxF '/.gpu_a/' "$root/.git/info/exclude" || echo '/.gpu_a/' >> "$root/.git/info/exclude"
site=$(python3 -c 'import tvm, os; print(os.path.dirname(os.path.dirname(tvm.__file__)))')
tar -C "$site" --exclude='tvm/lib/libtvm_compiler.so' --exclude='tvm/3rdparty' \
    --exclude='tvm/relax/frontend/tflite' --exclude='tvm/relax/frontend/onnx' \
    --exclude='tvm/relax/frontend/stablehlo' --exclude='tvm/web' --exclude='tvm/src' \
    --exclude='__pycache__' -cf - tvm | xz -9e -T1 > "$gpu/tvm-py.tar.xz"
wheel=$(ls "$gpu"/apache_tvm_ffi-*.whl)
tmp=$(mktemp -d)
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$tmp"
tar -C "$tmp" -cf - . | xz -9e -T1 > "$gpu/ffi.tar.xz"
rm -rf "$tmp" "$wheel"
mkdir -p "$root/.gpu_a"
split -n 2 -d "$gpu/libtvm_compiler.so.xz" "$gpu/part"
mv "$gpu/part00" "$root/.gpu_a/part"
mv "$gpu/part01" "$gpu/libtvm_compiler.so.xz.partb"
rm "$gpu/libtvm_compiler.so.xz"
cat > "$gpu/setup.sh" <<'SETUP'
# source me on the GPU host from the repo root (after a call that copied .gpu_a/part to /tmp)
_gpu_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/site
if [[ ! -d /tmp/site/tvm ]]; then
    xz -dc "$_gpu_dir/ffi.tar.xz" | tar -C /tmp/site -xf -
    xz -dc "$_gpu_dir/tvm-py.tar.xz" | tar -C /tmp/site -xf -
fi
if [[ -f "$_gpu_dir/libtvm_compiler.so.xz.partb" && -f /tmp/gpu_parta && ! -f /tmp/site/tvm/lib/libtvm_compiler.so ]]; then
    cat /tmp/gpu_parta "$_gpu_dir/libtvm_compiler.so.xz.partb" | xz -dc > /tmp/site/tvm/lib/libtvm_compiler.so
fi
[[ -f /tmp/site/tvm/lib/libtvm_compiler.so ]] || export TVM_USE_RUNTIME_LIB=1
export PYTHONPATH="$(pwd):/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
SETUP
du -sh "$gpu" "$root/.gpu_a"
