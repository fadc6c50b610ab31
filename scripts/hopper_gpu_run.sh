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
# HR_DIM64_SEQ (lengths of an extra d = 64 bench, portable and hopper; empty skips it),
# HR_BLOCK64_SEQ (lengths of an extra block-size-64 bench, portable and hopper; empty skips it).
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

# An extra bench of the Hopper kernel's default variant against the portable kernel:
# compare_portable NAME SEQ FLAGS... (outputs bench_NAME.{json,txt,err}).
compare_portable() {
  local name=$1 seq=$2
  shift 2
  echo "== bench: $name"
  timeout "${HR_BENCH_TIMEOUT:-240}" "$BIN/crisp" bench --seq "$seq" "$@" --presets "${HR_PRESETS:-dense,crisp}" \
    --densities "${HR_DENSITIES:-0.1}" --reps "$REPS" --warmup 1 --kernels portable,hopper \
    --json "$OUT/bench_$name.json" >"$OUT/bench_$name.txt" 2>"$OUT/bench_$name.err"
  echo "exit $?"
  tail -3 "$OUT/bench_$name.err"
  cat "$OUT/bench_$name.txt"
}
# Optional: head dim 64 (HR_DIM64_SEQ, e.g. 131072; empty skips).
if [ -n "${HR_DIM64_SEQ:-}" ]; then compare_portable d64 "$HR_DIM64_SEQ" --dim 64; fi
# Optional: block size 64 (HR_BLOCK64_SEQ, e.g. 131072,32768; empty skips): the Hopper kernel runs
# one consumer warpgroup per CTA, two CTAs per SM.
if [ -n "${HR_BLOCK64_SEQ:-}" ]; then compare_portable b64 "$HR_BLOCK64_SEQ" --block 64; fi

# Optional: where the plan's time goes (HR_PLAN_PROFILE=1): Nsight Compute times every planner
# kernel (and the work order's key kernel and cub sort) of one crisp-preset plan at
# HR_PROFILE_SEQ tokens (131072), kernels serialised, clocks left alone; the table sums the
# kernel durations by name. The attention kernels run unprofiled.
if [ "${HR_PLAN_PROFILE:-0}" = 1 ]; then
  echo "== plan profile (ncu), n=${HR_PROFILE_SEQ:-131072}"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout "${HR_BENCH_TIMEOUT:-240}" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    --kernel-name-base demangled --kernel-name regex:'planner|work_key|Radix' "$BIN/crisp" bench --seq "${HR_PROFILE_SEQ:-131072}" \
    --presets crisp --densities 0.1 --reps 1 --warmup 0 --kernels hopper --quiet \
    >"$OUT/plan_profile.csv" 2>"$OUT/plan_profile.err"
  echo "exit $?"
  tail -3 "$OUT/plan_profile.err"
  python3 scripts/plan_profile_table.py "$OUT/plan_profile.csv"
fi
