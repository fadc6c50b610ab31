#!/usr/bin/env bash
# scripts/gpu_run.sh — THE script for a GPU machine: builds the CUDA backend, runs the GPU tests,
# compute-sanitizer (memcheck, racecheck) on a small filter, then `crisp bench`, and prints a
# short table last. Logs and JSON go to $OUT (default ./out/gpu_run).
#
# A machine without network: missing GoogleTest / CLI11 / nlohmann-json are taken from .deps/
# (made here by scripts/pack_gpu_deps.sh and carried along).
#
# Environment knobs:
#   BENCH_SEQ=8192,32768,131072,524288   sequence lengths of the bench ("" skips the bench)
#   BENCH_REPS=5  BENCH_TIMEOUT=300      bench repetitions and wall-clock cap (seconds)
#   RUN_CPU_TESTS=1                      also the CPU suite (ctest -L cpu)
#   SANITIZE=1 (default)                 compute-sanitizer memcheck + racecheck
#   JOBS=16                              build parallelism
#   SKIP_TESTS=1                         no ctest (sanitizers and bench only)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/gpu_run}
mkdir -p "$OUT"
JOBS=${JOBS:-16}
BENCH_SEQ=${BENCH_SEQ-8192,32768,131072,524288}
BENCH_REPS=${BENCH_REPS:-5}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
SANITIZE=${SANITIZE:-1}
BUILD=build-gpu
SUMMARY=()
note() { echo "== $*"; }

DEVICE=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)
echo "$DEVICE"

# ---------------------------------------------------------------- dependencies
PREFIX=""
if [ ! -f /usr/include/CLI/CLI.hpp ] || [ ! -f /usr/include/nlohmann/json.hpp ]; then
  [ -d .deps/prefix ] || { echo "CLI11/nlohmann-json missing and no .deps/ (run scripts/pack_gpu_deps.sh here and carry .deps)"; exit 1; }
  PREFIX="$PWD/.deps/prefix"
  note "CLI11 / nlohmann-json from .deps/prefix"
fi
if ! ls /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1; then
  [ -d .deps/googletest ] || { echo "GoogleTest missing and no .deps/googletest"; exit 1; }
  note "building GoogleTest from .deps/googletest"
  if ! { cmake -S .deps/googletest -B /tmp/crisp-gtest-build -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
           -DCMAKE_INSTALL_PREFIX=/tmp/crisp-gtest && cmake --build /tmp/crisp-gtest-build -j"$JOBS" \
           && cmake --install /tmp/crisp-gtest-build; } >"$OUT/build.log" 2>&1; then
    tail -20 "$OUT/build.log"; exit 1
  fi
  PREFIX="/tmp/crisp-gtest${PREFIX:+;$PREFIX}"
fi

# ---------------------------------------------------------------- build
note "configure + build ($BUILD, sm_90a, -j$JOBS)"
T0=$(date +%s)
if ! cmake -S . -B "$BUILD" -DCRISP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release \
     -DCRISP_BUILD_TESTS=ON ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} >>"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"; exit 1
fi
TARGETS="crisp_cli crisp_gpu_tests"
[ "${RUN_CPU_TESTS:-0}" = 1 ] && TARGETS="$TARGETS crisp_tests"
if ! cmake --build "$BUILD" -j"$JOBS" --target $TARGETS >>"$OUT/build.log" 2>&1; then
  grep -E "error" "$OUT/build.log" | head -30; exit 1
fi
grep -E "spill" "$OUT/build.log" | sort | uniq -c | head
SUMMARY+=("build: ok in $(( $(date +%s) - T0 )) s")

# ---------------------------------------------------------------- tests
GPU_TESTS=$BUILD/tests/crisp_gpu_tests
if [ "${SKIP_TESTS:-0}" != 1 ]; then
note "GPU tests (ctest -L gpu)"
T0=$(date +%s)
(cd "$BUILD" && timeout ${CTEST_TIMEOUT:-300} ctest -L gpu -j4 --output-on-failure --timeout 200) >"$OUT/ctest_gpu.log" 2>&1
RC=$?
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest_gpu.log" | head -40
SUMMARY+=("ctest -L gpu: rc=$RC, $(grep -E 'tests passed' "$OUT/ctest_gpu.log" | tail -1) ($(( $(date +%s) - T0 )) s)")
if [ "${RUN_CPU_TESTS:-0}" = 1 ]; then
  (cd "$BUILD" && timeout 300 ctest -L cpu -j"$JOBS" --output-on-failure --timeout 120) >"$OUT/ctest_cpu.log" 2>&1
  SUMMARY+=("ctest -L cpu: rc=$?, $(grep -E 'tests passed' "$OUT/ctest_cpu.log" | tail -1)")
fi
fi

# ---------------------------------------------------------------- sanitizers
if [ "$SANITIZE" = 1 ] && command -v compute-sanitizer >/dev/null; then
  FILTER=${SANITIZE_FILTER:-'*GpuPlanMatchesCpu*crisp_n3001*:*GpuPlanMatchesCpu*minference_n2500*:*GpuPlanMatchesCpu*flexprefill_varlen*'}
  for tool in memcheck racecheck; do
    note "compute-sanitizer --tool $tool ($FILTER)"
    timeout ${SANITIZER_TIMEOUT:-240} compute-sanitizer --tool "$tool" --error-exitcode 3 "$GPU_TESTS" --gtest_filter="$FILTER" \
      >"$OUT/sanitizer_$tool.log" 2>&1
    RC=$?
    tail -3 "$OUT/sanitizer_$tool.log"
    SUMMARY+=("compute-sanitizer $tool: rc=$RC, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)")
  done
fi

# ---------------------------------------------------------------- bench
if [ -n "$BENCH_SEQ" ]; then
  note "crisp bench --seq $BENCH_SEQ --reps $BENCH_REPS"
  timeout "$BENCH_TIMEOUT" "$BUILD/crisp" bench --seq "$BENCH_SEQ" --reps "$BENCH_REPS" --json "$OUT/bench.json" \
    >"$OUT/bench.txt" 2>"$OUT/bench_progress.log"
  RC=$?
  SUMMARY+=("crisp bench: rc=$RC (124 = stopped by BENCH_TIMEOUT; rows so far are in bench.txt/bench.json)")
  tail -5 "$OUT/bench_progress.log"
fi

echo
echo "==================== summary ($(date -u +%Y-%m-%dT%H:%MZ), $DEVICE)"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
[ -f "$OUT/bench.txt" ] && cat "$OUT/bench.txt"
