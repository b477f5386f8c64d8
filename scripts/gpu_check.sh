#!/usr/bin/env bash
# The GPU check (issue 21): build with the CUDA backend on a machine with an NVIDIA GPU,
# run the GPU tests, and print one JSON document on stdout (logs on stderr, and in
# $OUT/gpu_check.log when OUT is set). Meant for a short time on a borrowed GPU: it
# builds with every core and stays well inside 8 minutes.
#
#   scripts/gpu_check.sh [BUILD_DIR]        (default build-cuda)
#
# Today it checks every op the CUDA backend builds against the CPU backend
# (tests/gpu/test_cuda_ops.c); the transaction on the GPU (capture tokens/s at 128K-1M,
# a GRPO update at 128K and 1M, the comparison with HF transformers and cuBLAS's own
# rate) comes once the backend builds every op, and the JSON says so.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-cuda}
log=${OUT:+$OUT/gpu_check.log}
log=${log:-/dev/null}
say() { echo "$@" | tee -a "$log" >&2; }
json_str() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))' 2>/dev/null || echo '""'; }
t0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
say "gpu: ${gpu:-none found}"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
build_ok=false
if cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLS_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" >>"$log" 2>&1 &&
   cmake --build "$dir" -j "$(nproc)" --target ls_gpu_tests >>"$log" 2>&1; then
  build_ok=true
fi
say "build: $build_ok ($(( $(date +%s) - t0 )) s)"
ops_rc=-1
ops_out=""
if $build_ok; then
  ops_out=$(timeout 300 "$dir/ls_gpu_tests" 2>&1)
  ops_rc=$?
  echo "$ops_out" | tee -a "$log" >&2
fi
ops_json=$(echo "$ops_out" | grep '^{' | tail -1)
[ -n "$ops_json" ] || ops_json=null
cat <<JSON
{"gpu": $(echo "$gpu" | json_str), "build": $build_ok, "gpu_ops_exit": $ops_rc, "gpu_ops": $ops_json,
 "transaction": "not measured: the CUDA backend does not build every op yet (see gpu_ops.missing)",
 "seconds": $(( $(date +%s) - t0 ))}
JSON
