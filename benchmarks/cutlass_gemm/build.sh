#!/usr/bin/env bash
# Build benchmarks/cutlass_gemm/libstitch_cutlass.so (the CUTLASS GEMM study's kernels) with nvcc.
#
#   CUTLASS_INCLUDE=/path/to/cutlass/include bash benchmarks/cutlass_gemm/build.sh
#
# CUTLASS_INCLUDE: a complete CUTLASS 3/4 include folder. TVM's wheel ships CUTLASS 4.1's headers
# (tvm/3rdparty/cutlass/include) but not the collective builders' .inl files, which this needs.
# One translation unit per epilogue, two compiled at a time (~2 min each on 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
inc=${CUTLASS_INCLUDE:-$(python3 -c "import os, tvm; print(os.path.join(os.path.dirname(tvm.__file__), '3rdparty/cutlass/include'))")}
if [[ ! -e "$inc/cutlass/gemm/collective/builders/sm90_gmma_builder.inl" ]]; then
    echo "$inc has no CUTLASS collective builders (.inl): set CUTLASS_INCLUDE to a full CUTLASS include folder" >&2
    exit 2
fi
build=$(mktemp -d)
compile() {
    nvcc -std=c++17 -O3 -DNDEBUG -DFUSION="$1" -gencode arch=compute_90a,code=sm_90a \
        --expt-relaxed-constexpr -diag-suppress 177 -Xcompiler -Wno-deprecated-declarations \
        -Xcompiler -fPIC -I"$inc" -c -o "$build/gemm$1.o" "$here/gemm.cu"
}
compile 0 & compile 1; wait
compile 2 & compile 3; wait
nvcc -shared -o "$here/libstitch_cutlass.so" "$build"/gemm[0-3].o
rm -rf "$build"
echo "built $here/libstitch_cutlass.so"
