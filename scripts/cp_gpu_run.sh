#!/usr/bin/env bash
# scripts/cp_gpu_run.sh — context parallelism (issue 7) on a machine with >= 2 GPUs, from binaries
# built elsewhere (a machine without a registry and a short lease): the GPU tests of context
# parallelism and of the attention kernel, then `crisp bench --gpus 2`, a short table last.
#
# Here (the build machine):
#   cmake -S . -B build-cp -DCRISP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-cp -j2 --target crisp_cli crisp_gpu_tests
#   bash scripts/cp_gpu_run.sh --pack        # copies the two binaries to .cpbin/
# There (carry .cpbin):
#   bash scripts/cp_gpu_run.sh
# NCCL: the binaries need libnccl.so.2 at run time; it is looked up in the CUDA toolkit and in the
# nvidia-nccl-cu* Python wheel. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
# Knobs: CP_SEQ_LONG (524288; empty skips), CP_PRESETS (dense,crisp), CP_REPS (3), CP_BENCH_TIMEOUT (100 s
# per bench), CP_DEADLINE_S (270: every step is cut to what is left of it).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.cpbin

if [ "${1:-}" = "--pack" ]; then
  rm -rf "$BIN"
  mkdir -p "$BIN"
  # Only the binaries: the C++/OpenMP/CUDA runtimes there are as new as here or newer (a carried
  # older libstdc++ could break libraries there that need a newer one).
  cp build-cp/crisp build-cp/tests/crisp_gpu_tests "$BIN/"
  grep -qsx '/.cpbin/' .git/info/exclude || echo '/.cpbin/' >> .git/info/exclude
  du -sh "$BIN"
  exit 0
fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out/cp_gpu_run}
mkdir -p "$OUT"
NCCL_LIB=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [ -e "$dir/libnccl.so.2" ] && { NCCL_LIB=$dir; break; }
done
if [ -z "$NCCL_LIB" ]; then
  NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
fi
export LD_LIBRARY_PATH="${NCCL_LIB}:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
SUMMARY=()
# Every step fits in what is left of CP_DEADLINE_S seconds (the lease's command limit, less a margin).
START=$(date +%s)
left() { local l=$(( ${CP_DEADLINE_S:-270} - ($(date +%s) - START) )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
echo "== $(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tr '\n' ';')"
echo "== NCCL from ${NCCL_LIB:-<not found>}"
nvidia-smi topo -m 2>/dev/null | head -4
ldd "$BIN/crisp" | grep -E "not found|nccl|cudart" 

echo "== GPU tests: context parallelism"
T0=$(date +%s)
timeout "$(left 90)" "$BIN/crisp_gpu_tests" --gtest_filter='GpuContextParallel*' >"$OUT/test_cp.log" 2>&1
RC=$?
grep -E "^\[  |Failure|differ|error" "$OUT/test_cp.log" | head -30
SUMMARY+=("crisp_gpu_tests GpuContextParallel*: rc=$RC, $(grep -E 'PASSED|FAILED  \]|SKIPPED' "$OUT/test_cp.log" | head -3 | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)")

run_bench() {  # $1 = sequence lengths, $2 = json name
  T0=$(date +%s)
  timeout "$(left ${CP_BENCH_TIMEOUT:-100})" "$BIN/crisp" bench --gpus 2 --seq "$1" --presets "${CP_PRESETS:-dense,crisp}" \
    --partition contiguous,zigzag --reps "${CP_REPS:-3}" --warmup 1 --json "$OUT/$2" >"$OUT/${2%.json}.txt" 2>"$OUT/${2%.json}_progress.log"
  local rc=$?
  cat "$OUT/${2%.json}.txt"
  tail -3 "$OUT/${2%.json}_progress.log"
  SUMMARY+=("crisp bench --gpus 2 --seq $1: rc=$rc ($(( $(date +%s) - T0 )) s)")
}
echo "== crisp bench --gpus 2 (128k)"
run_bench 131072 cp_bench_128k.json

echo "== GPU tests: attention kernel (the row-subset change must leave the full launch as it was)"
T0=$(date +%s)
timeout "$(left 60)" "$BIN/crisp_gpu_tests" --gtest_filter='GpuAttention*:GpuDevicePlan*' >"$OUT/test_attention.log" 2>&1
RC=$?
grep -E "Failure|FAILED" "$OUT/test_attention.log" | head -10
SUMMARY+=("crisp_gpu_tests GpuAttention*:GpuDevicePlan*: rc=$RC, $(grep -E '^\[  PASSED|^\[  FAILED|tests ran' "$OUT/test_attention.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)")

if [ -n "${CP_SEQ_LONG-524288}" ] && [ "$(left 1000)" -gt 20 ]; then
  echo "== crisp bench --gpus 2 (${CP_SEQ_LONG-524288})"
  run_bench "${CP_SEQ_LONG-524288}" cp_bench_512k.json
fi

echo
echo "==================== summary ($(date -u +%Y-%m-%dT%H:%MZ))"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
for f in "$OUT"/cp_bench_*.txt; do [ -f "$f" ] && grep -vE "^(context|1gpu|the same)" "$f"; done
