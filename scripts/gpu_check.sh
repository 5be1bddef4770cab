#!/usr/bin/env bash
# Builds (and runs) the TensorFlow-free functor harness: a plain C++/CUDA
# program that runs every GPU functor and its CPU counterpart on generated
# inputs, compares them bit for bit, and prints each op's throughput next to
# the device's memory-copy bandwidth measured in the same run.
#
# Usage: scripts/gpu_check.sh [--compile-only | --cpu-only] [harness options]
#
#   (default)       compile with nvcc and run the full check (needs a GPU);
#   --compile-only  compile with nvcc only (what CI runs on machines without
#                   a GPU, so that the CUDA code never rots);
#   --cpu-only      compile the same check sources with the host C++ compiler
#                   (no CUDA, no GOOGLE_CUDA) and run their CPU halves: the
#                   CPU functors, serial vs threaded, against the expectations
#                   each check file states (round trips, references).
#   harness options are passed to the program: --sizes N,N,... --repeats R
#   --only NAME,... --list (see custom_ops/gpu_check/gpu_check_main.cu.cc).
#
# What is compiled: every custom_ops/gpu_check/*.cu.cc (the main program and
# one <domain>_check.cu.cc per domain; each check file registers itself with
# TFC_GPU_CHECK(name, fn), so a new file is picked up with no edit here) and,
# for nvcc, every custom_ops/<domain>/cc/kernels/*_gpu.cu.cc (the GPU functor
# definitions). Include paths are relative to custom_ops/ (-Icustom_ops), as
# in the op library build. No TensorFlow header is used.
#
# Environment: NVCC (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc),
# CXX (default g++), GPU_CHECK_ARCH (default 90: sm_90 code plus compute_90
# PTX), GPU_CHECK_BUILD_DIR (default build/gpu_check), GPU_CHECK_JOBS
# (parallel compiles; default the number of CPUs), GPU_CHECK_HOST_OPT (the
# optimisation flag of the --cpu-only build; default -O2).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=run
if [ "${1:-}" = "--compile-only" ] || [ "${1:-}" = "--cpu-only" ]; then
  mode="${1#--}"
  shift
fi

build_dir="${GPU_CHECK_BUILD_DIR:-build/gpu_check}"
mkdir -p "$build_dir"
jobs="${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 2)}"
check_sources=(custom_ops/gpu_check/*.cu.cc)

# Compiles "$1" (a source) to "$2" (an object) with the rest of the arguments
# as the compiler command; run in the background, at most $jobs at a time.
pids=()
compile() {
  local source="$1" object="$2"
  shift 2
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  "$@" -c "$source" -o "$object" &
  pids+=($!)
}
wait_all() {
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  return "$failed"
}
object_name() {
  local path="${1#custom_ops/}"
  echo "$build_dir/${path//\//_}.o"
}

if [ "$mode" = cpu-only ]; then
  cxx="${CXX:-g++}"
  flags=(-std=c++17 "${GPU_CHECK_HOST_OPT:--O2}" -Wall -Wextra -pthread -Icustom_ops -x c++)
  objects=()
  for source in "${check_sources[@]}"; do
    object="$(object_name "$source")"
    objects+=("$object")
    compile "$source" "$object" "$cxx" "${flags[@]}"
  done
  wait_all
  "$cxx" -pthread "${objects[@]}" -o "$build_dir/gpu_check_cpu"
  echo "gpu_check: built $build_dir/gpu_check_cpu with $cxx (CPU halves only)"
  exec "$build_dir/gpu_check_cpu" --cpu-only "$@"
fi

nvcc="${NVCC:-}"
if [ -z "$nvcc" ]; then
  if command -v nvcc >/dev/null; then
    nvcc=nvcc
  elif [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
    nvcc="$CUDA_HOME/bin/nvcc"
  else
    echo "gpu_check: nvcc not found (set NVCC or CUDA_HOME, or install nvidia-cuda-nvcc-cu12)" >&2
    exit 3
  fi
fi
arch="${GPU_CHECK_ARCH:-90}"
# --fmad=false: the CPU functors round a * b + c twice; a fused multiply-add
# would round once and break the bit-for-bit comparison.
# Compile-only builds nothing that runs: host code at -O0 (half the build
# time on a small machine); device code is always optimised by ptxas.
host_opt=-O3
if [ "$mode" = compile-only ]; then host_opt=-O0; fi
flags=(-std=c++17 "$host_opt" -DGOOGLE_CUDA=1 --fmad=false -Icustom_ops -x cu
  -gencode "arch=compute_${arch},code=sm_${arch}"
  -gencode "arch=compute_${arch},code=compute_${arch}")
gpu_sources=(custom_ops/*/cc/kernels/*_gpu.cu.cc)
objects=()
for source in "${check_sources[@]}" "${gpu_sources[@]}"; do
  [ -e "$source" ] || continue
  object="$(object_name "$source")"
  objects+=("$object")
  compile "$source" "$object" "$nvcc" "${flags[@]}"
done
wait_all
"$nvcc" "${objects[@]}" -o "$build_dir/gpu_check"
echo "gpu_check: built $build_dir/gpu_check with $nvcc (sm_${arch} + compute_${arch} PTX)"
if [ "$mode" = compile-only ]; then
  exit 0
fi
exec "$build_dir/gpu_check" "$@"
