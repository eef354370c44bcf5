#!/usr/bin/env bash
# Run GPU work on the lent GPU host, step by step, logging everything under OUTDIR.
#
#   bash benchmarks/run_gpu.sh OUTDIR STEP...
#
# STEP: env | tests[:FILE] | bert:BATCHxSEQ | dynamic (benchmarks/dynamic.py; DYNAMIC_FLAGS) |
#       gate-up (benchmarks/gate_up.py; GATE_UP_FLAGS) |
#       compile (benchmarks/compile_time.py; COMPILE_FLAGS) | memory[:DTYPE] | plans[:DTYPE] | gemm-chains |
#       attention | mcfuser[:FAMILY] | run | zoo[:WORKLOAD[:KEY=VALUE,...]] |
#       profile:WORKLOAD[:KEY=VALUE,...] | timeline:WORKLOAD[:KEY=VALUE,...] | ncu:WORKLOAD[:KEY=VALUE,...] |
#       numerics:WORKLOAD[:KEY=VALUE,...] (each kernel's output on CUDA against llvm) | check:DIR (a folder from `tvm-stitch build`) |
#       sustained:WORKLOAD[:KEY=VALUE,...] (stitch and torch.compile each run alone for seconds: settled
#       time, SM clock, power; OPTION=lift_params=true: the stitch build's options) |
#       families[:mask] (the Hugging Face families through from_torch on the GPU, JOBS at a time;
#       FAMILY_FLAGS='--head-dim 128 --seq 130': other sizes; '--held': from the model held on the
#       GPU in float16; '--zoo': the zoo's models; '--compare explore=search':
#       that build judged too and both timed in turns) | fuzz[:COUNT] (the differential fuzzer's programs
#       built for and run on the GPU against llvm, JOBS at a time)
# Tuning results go to OUTDIR/tuning.json (shared by the steps; seeded from benchmarks/tuning/h100.json.xz)
# unless TVM_STITCH_TUNING_DB is set. VARIANT=fold_norms=true: bert, zoo and memory steps also time that stitch variant
# (several: VARIANT='fold_norms=true;dependent_launch=false'); ONLY='rotary rmsnorm': the memory,
# gemm-chains and attention steps run those workloads only;
# RETUNE=REGEX: records of the database matching REGEX dropped first (searched again);
# GRAPH=1: the bert and zoo steps also time the TVM builds as CUDA-graph replays (graph us), as PyTorch is;
# OPTION=fold_norms=true: profile steps compile with that option (BASELINE=1: and list torch.compile's
# kernels too). DTYPE=bfloat16: zoo, profile, timeline and numerics steps in that dtype; STEADY=N: timeline steps also
# profile N calls back to back.
# Needs .gpu/ (../shared/gpu/pack --compiler) carried with the working tree.
set -uo pipefail
out=${1:?usage: run_gpu.sh OUTDIR STEP...}
shift
mkdir -p "$out"
source benchmarks/gpu_env.sh
export PYTHONUNBUFFERED=1
# a warm start unless the call names its own database (or WARM=0): the measured searches of
# earlier sessions (benchmarks/tuning/h100.json.xz, xz-compressed to travel light; merge
# OUTDIR/tuning.json back into it)
if [[ -z "${TVM_STITCH_TUNING_DB:-}" && "${WARM:-1}" == 1 && ! -e "$out/tuning.json" \
      && -e benchmarks/tuning/h100.json.xz ]]; then
    xz -dc benchmarks/tuning/h100.json.xz > "$out/tuning.json"
fi
export TVM_STITCH_TUNING_DB=${TVM_STITCH_TUNING_DB:-$out/tuning.json}
# RETUNE=REGEX: the database's records whose key matches REGEX are dropped first, so the steps
# search those kernels again (a record is never searched again otherwise: a tiling seeded since
# it was stored is not tried). Keys are "kernel|extents by axis name|dtype|arch":
# RETUNE='^stitch_gemm_[^|]*\|4096x2048x' drops the GEMMs of 2048 rows and k = 4096.
if [[ -n "${RETUNE:-}" && -e "$TVM_STITCH_TUNING_DB" ]]; then
    python3 - "$TVM_STITCH_TUNING_DB" "$RETUNE" <<'PY'
import json, re, sys
path, pattern = sys.argv[1], re.compile(sys.argv[2])
data = json.load(open(path))
drop = [k for k in data["records"] if pattern.search(k)]
for k in drop:
    del data["records"][k]
json.dump(data, open(path, "w"))
print(f"RETUNE: {len(drop)} records dropped from {path}")
PY
fi
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
status=0
# VARIANT: variants separated by ';' (each KEY=VALUE,...)
variants=()
IFS=';' read -ra _vs <<< "${VARIANT:-}"
for v in ${_vs[@]+"${_vs[@]}"}; do [[ -n "$v" ]] && variants+=(--variant "$v"); done
# ONLY: workloads of the memory, gemm-chains and attention studies to run (names separated by
# spaces: ONLY='rotary rmsnorm'; a study outlasts one call otherwise)
only=()
for w in ${ONLY:-}; do only+=(-w "$w"); done
# STEP's WORKLOAD[:KEY=VALUE,...] after its "kind:" -> $name and the -p flags in $params
workload_spec() {
    local spec=${1#*:} kv
    [[ "$spec" == "$1" ]] && spec=""
    name=${spec%%:*}
    local shape=${spec#"$name"}
    shape=${shape#:}
    params=()
    for kv in ${shape//,/ }; do params+=(-p "$kv"); done
}
for step in "$@"; do
    echo "=== $step ($(date +%T))"
    case "$step" in
        env)
            nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
            python3 -c "import tvm, torch, triton, transformers; print('tvm', tvm.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
            ;;
        tests)
            python3 -m pytest -q -m gpu tests 2>&1 | tee "$out/pytest-gpu.log" || status=1
            ;;
        tests:*)  # one file (the whole suite outlasts one call): tests:tests/test_zoo.py
            python3 -m pytest -q -m gpu "${step#tests:}" --durations=5 2>&1 \
                | tee -a "$out/pytest-gpu.log" || status=1
            ;;
        check:*)
            python3 -m tvm_stitch check "${step#check:}" 2>&1 | tee -a "$out/check.log" || status=1
            ;;
        gate-up)  # SwiGLU's gate x up kernel against cuBLAS + SiLU x up (benchmarks/gate_up.py;
            # GATE_UP_FLAGS: its options)
            python3 -m tvm_stitch.benchmarks.gate_up ${GATE_UP_FLAGS:-} 2>&1 \
                | tee "$out/gate-up.log" || status=1
            ;;
        dynamic)  # one dynamic compile of BERT-base against static builds and
            # torch.compile(dynamic=True); DYNAMIC_FLAGS: benchmarks/dynamic.py's options
            python3 -m tvm_stitch.benchmarks.dynamic --target cuda ${DYNAMIC_FLAGS:-} 2>&1 \
                | tee "$out/dynamic.log" || status=1
            ;;
        compile)  # cold and warm compile times of BERT-base (benchmarks/compile_time.py;
            # COMPILE_FLAGS: its options)
            python3 -m tvm_stitch.benchmarks.compile_time ${COMPILE_FLAGS:-} 2>&1 \
                | tee "$out/compile.log" || status=1
            ;;
        bert:*)
            shape=${step#bert:}
            python3 -m tvm_stitch bench bert --target cuda -p "batch=${shape%x*}" -p "seq=${shape#*x}" \
                ${GRAPH:+--graph} ${variants[@]+"${variants[@]}"} --json-out "$out/bench.jsonl" 2>&1 \
                | tee "$out/bert-$shape.log" || status=1
            ;;
        memory|gemm-chains|attention)
            python3 -m tvm_stitch bench "$step" --target cuda ${variants[@]+"${variants[@]}"} \
                ${only[@]+"${only[@]}"} --json-out "$out/bench.jsonl" 2>&1 \
                | tee "$out/$step.log" || status=1
            ;;
        memory:*)
            python3 -m tvm_stitch bench memory --target cuda --dtype "${step#memory:}" \
                ${variants[@]+"${variants[@]}"} ${only[@]+"${only[@]}"} \
                --json-out "$out/bench.jsonl" 2>&1 | tee "$out/${step/:/-}.log" || status=1
            ;;
        plans|plans:*)
            dt=${step#plans}
            python3 -m tvm_stitch.benchmarks.stitch_plans ${dt:+--dtype ${dt#:}} \
                --json-out "$out/plans.jsonl" 2>&1 | tee "$out/${step/:/-}.log" || status=1
            ;;
        mcfuser|mcfuser:*)
            fam=${step#mcfuser}
            python3 -m tvm_stitch.benchmarks.mcfuser_kernels ${fam:+--family ${fam#:}} \
                --json-out "$out/mcfuser.jsonl" 2>&1 | tee "$out/mcfuser${fam/:/-}.log" || status=1
            ;;
        zoo|zoo:*)
            workload_spec "$step"
            args=(); [[ -n "$name" ]] && args+=(-w "$name")
            args+=("${params[@]}")
            python3 -m tvm_stitch bench zoo --target cuda ${DTYPE:+--dtype "$DTYPE"} "${args[@]}" \
                ${GRAPH:+--graph} ${variants[@]+"${variants[@]}"} --json-out "$out/bench.jsonl" 2>&1 | tee -a "$out/zoo.log" || status=1
            ;;
        profile:*)
            workload_spec "$step"
            python3 -m tvm_stitch.benchmarks.profile_tvm "$name" "${params[@]}" --cupti --top 20 \
                ${DTYPE:+--dtype "$DTYPE"} \
                ${OPTION:+--option "$OPTION"} ${BASELINE:+--baseline} \
                2>&1 | tee -a "$out/profile.log" || status=1
            ;;
        timeline:*)  # what each kernel adds to a CUDA-graph replay, one build per VARIANT
            workload_spec "$step"
            python3 -m tvm_stitch.benchmarks.timeline "$name" "${params[@]}" ${DTYPE:+--dtype "$DTYPE"} \
                ${STEADY:+--steady "$STEADY"} ${variants[@]+"${variants[@]}"} 2>&1 | tee -a "$out/timeline.log" || status=1
            ;;
        ncu:*)  # Nsight Compute on the workload's kernels matching $NCU_KERNELS (and PyTorch's)
            workload_spec "$step"
            python3 -m tvm_stitch.benchmarks.profile_tvm "$name" "${params[@]}" --ncu >/dev/null 2>&1
            ncu --target-processes all -k "regex:${NCU_KERNELS:-stitch_|flash|fmha|sdpa|gemm}" \
                --launch-count "${NCU_COUNT:-4}" --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
                --section ComputeWorkloadAnalysis \
                python3 -m tvm_stitch.benchmarks.profile_tvm "$name" "${params[@]}" --ncu \
                2>&1 | tee -a "$out/ncu-$name.log" || status=1
            ;;
        sustained:*)  # each implementation alone for seconds: settled time, clock, power
            # (benchmarks/studies/sustained.py; OPTION: the stitch build's options)
            workload_spec "$step"
            python3 benchmarks/studies/sustained.py -w "$name" "${params[@]}" \
                ${OPTION:+--option "$OPTION"} ${DTYPE:+--dtype "$DTYPE"} 2>&1 \
                | tee -a "$out/sustained.log" || status=1
            ;;
        numerics:*)
            workload_spec "$step"
            python3 -m tvm_stitch.benchmarks.numerics "$name" "${params[@]}" \
                ${OPTION:+--option "$OPTION"} ${DTYPE:+--dtype "$DTYPE"} 2>&1 | tee -a "$out/numerics-$name.log" || status=1
            ;;
        families|families:mask)  # hf_families --gpu, one process a family, JOBS (default 4) at once
            flags="--gpu ${FAMILY_FLAGS:-}"; [[ "$step" == *:mask ]] && flags="$flags --mask"
            tag=${step/:/-}; [[ -n "${FAMILY_FLAGS:-}" ]] && tag="$tag$(echo "$FAMILY_FLAGS" | tr -cd 'A-Za-z0-9')"
            mkdir -p "$out/$tag"
            rm -f "$out/$tag-failed.txt"
            names=$(python3 -m tvm_stitch.benchmarks.hf_families --names $flags)
            printf '%s\n' $names | xargs -P "${JOBS:-4}" -I{} sh -c "python3 -m \
                tvm_stitch.benchmarks.hf_families $flags --only {} > $out/$tag/{}.log 2> $out/$tag/{}.err \
                || echo {} >> $out/$tag-failed.txt"
            for n in $names; do tail -n +2 "$out/$tag/$n.log"; done | tee "$out/$tag.txt"
            tar -C "$out" -czf "$out/$tag-logs.tgz" "$tag" && rm -r "${out:?}/$tag"
            [[ -e "$out/$tag-failed.txt" ]] && status=1
            ;;
        fuzz|fuzz:*)
            count=${step#fuzz}; count=${count#:}
            python3 -m tvm_stitch.fuzz --gpu --count "${count:-300}" --seed "${SEED:-0}" \
                --jobs "${JOBS:-4}" --out "$out/fuzz" 2>&1 | tee -a "$out/fuzz.log" || status=1
            ;;
        run)
            python3 -m tvm_stitch run --target cuda 2>&1 | tee "$out/run.log" || status=1
            ;;
        *)
            echo "unknown step $step" >&2
            status=2
            ;;
    esac
done
exit $status
