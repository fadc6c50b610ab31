#!/usr/bin/env bash
# scripts/hopper_gpu_run.sh — the Hopper kernel on an H200 from binaries built elsewhere (a machine
# without a registry and a short lease): the GPU tests, then `crisp bench` of dense, crisp and a
# 10% random layout for every scheduling variant of the Hopper kernel (CRISP_HOPPER_SCHEDULE x
# CRISP_HOPPER_PINGPONG) in one run, the table last.
#
# Here (the build machine):
#   cmake -S . -B build-hopper -DCRISP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-hopper -j2 --target crisp_cli crisp_gpu_tests
#   bash scripts/hopper_gpu_run.sh --pack        # copies the two binaries (stripped) to .hopperrun/
# There (carry .hopperrun):
#   bash scripts/hopper_gpu_run.sh
# Knobs: HR_SEQ (131072,32768), HR_KERNELS (the four hopper-{persistent,grid}-{pp,nopp} variants),
# HR_PRESETS (dense,crisp), HR_DENSITIES (0.1), HR_REPS (3), HR_TESTS (1: run the GPU tests first),
# HR_GTEST_FILTER (*), HR_BENCH_TIMEOUT (240 s per bench), HR_EXTRA (more bench flags),
# HR_DIM64_SEQ (lengths of an extra d = 64 bench, portable and hopper; empty skips it).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.hopperrun

if [ "${1:-}" = "--pack" ]; then
  rm -rf "$BIN"
  mkdir -p "$BIN"
  cp build-hopper/crisp build-hopper/tests/crisp_gpu_tests "$BIN/"
  strip "$BIN"/*
  grep -qsx '/.hopperrun/' .git/info/exclude || echo '/.hopperrun/' >> .git/info/exclude
  du -sh "$BIN"
  exit 0
fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out/hopper_gpu_run}
mkdir -p "$OUT"
SEQ=${HR_SEQ:-131072,32768}
KERNELS=${HR_KERNELS:-hopper-persistent-pp,hopper-persistent-nopp,hopper-grid-pp,hopper-grid-nopp}
REPS=${HR_REPS:-3}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | head -1
date -u +"%Y-%m-%d %H:%M UTC"

if [ "${HR_TESTS:-1}" = 1 ]; then
  echo "== GPU tests"
  timeout 300 "$BIN/crisp_gpu_tests" --gtest_filter="${HR_GTEST_FILTER:-*}" --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
  echo "crisp_gpu_tests exit $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests ran" "$OUT/gpu_tests.log" | tail -25
fi

echo "== bench: kernels $KERNELS"
timeout "${HR_BENCH_TIMEOUT:-240}" "$BIN/crisp" bench --seq "$SEQ" --presets "${HR_PRESETS:-dense,crisp}" \
  --densities "${HR_DENSITIES:-0.1}" --reps "$REPS" --warmup 1 --kernels "$KERNELS" ${HR_EXTRA:-} \
  --json "$OUT/bench_variants.json" >"$OUT/bench_variants.txt" 2>"$OUT/bench_variants.err"
echo "exit $?"
tail -5 "$OUT/bench_variants.err"
cat "$OUT/bench_variants.txt"

# Optional: head dim 64 (HR_DIM64_SEQ, e.g. 131072; empty skips), the Hopper kernel's default
# variant against the portable kernel.
if [ -n "${HR_DIM64_SEQ:-}" ]; then
  echo "== bench: d = 64"
  timeout "${HR_BENCH_TIMEOUT:-240}" "$BIN/crisp" bench --seq "$HR_DIM64_SEQ" --dim 64 --presets "${HR_PRESETS:-dense,crisp}" \
    --densities "${HR_DENSITIES:-0.1}" --reps "$REPS" --warmup 1 --kernels portable,hopper \
    --json "$OUT/bench_d64.json" >"$OUT/bench_d64.txt" 2>"$OUT/bench_d64.err"
  echo "exit $?"
  tail -3 "$OUT/bench_d64.err"
  cat "$OUT/bench_d64.txt"
fi
