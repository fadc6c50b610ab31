#!/usr/bin/env bash
# scripts/gpu.sh — the one driver for a GPU machine: one build, the named suites, every output
# under one folder, and a summary table (suite, status, key figures) printed last.
#
#   scripts/gpu.sh [suite ...]          # no suite: tests sanitizers bench
#
# Suites:
#   tests       the GPU tests (ctest -L gpu; with CRISP_GPU_BIN the crisp_gpu_tests binary)
#   sanitizers  compute-sanitizer memcheck and racecheck on a selected set of GPU tests
#   bench       crisp bench: plan time, attention time and TFLOP/s of dense, crisp and flexprefill
#               (Hq 32 / Hkv 8, d 128, bf16); with CRISP_GPU_BASELINE the same bench of a second
#               source tree and a before/after table
#   python      pip install . (the Python package) and pytest tests/python
#   compare     bench/compare.py: crisp against SDPA flash / cuDNN and FlexAttention (installs the
#               Python package first unless the python suite did)
#   cp          context parallelism over 2 GPUs: its tests and crisp bench --gpus 2 (skipped with
#               fewer than 2 GPUs)
#   llama       crisp inside llama.cpp: builds llama.cpp for CUDA (scripts/llama_cpp.sh --cuda) and
#               runs scripts/llama_bench.py (llama-bench prompt processing, llama.cpp's flash attention
#               against each crisp policy, attention share from llama-attn-time) on the models of
#               CRISP_GPU_LLAMA_MODELS and on a Llama-3.1-8B-shaped model with random weights written
#               here by scripts/make_llama_gguf.py (docs/llama_cpp.md, "Benchmarks")
# docs/gpu.md says how to bring the tree (and a model or prebuilt binaries) to a GPU machine. The
# real-model evaluations run on llama.cpp (crisp-llama-eval niah|pareto|capture of the llama.cpp
# --cuda build, docs/evaluation.md "On llama.cpp"); the model and frontier suites of the retired
# home-made runner are gone.
#
# Knobs (environment; defaults in brackets):
#   OUT or CRISP_GPU_OUT     output folder [out/gpu]: the summary, the main JSON of each suite,
#                            details.tgz (every log and table)
#   CRISP_GPU_DEADLINE_S     every step is cut to what is left of this many seconds from the start
#                            [570: a 10-minute command less a margin]
#   CRISP_GPU_ARCH [90a]  CRISP_GPU_JOBS [all cores]  CRISP_GPU_BUILD [build-gpu]
#   CRISP_GPU_BIN            a folder with prebuilt `crisp` and `crisp_gpu_tests`: no build
#   CRISP_GPU_CPU_TESTS=1    tests: also the CPU suite (ctest -L cpu)
#   CRISP_GPU_TEST_FILTER    tests: a gtest filter [* ; with a build, ctest -L gpu takes -R from
#                            CRISP_GPU_TEST_REGEX instead]
#   CRISP_GPU_SANITIZE_TOOLS [memcheck,racecheck]  CRISP_GPU_SANITIZE_FILTER [three GpuPlanMatchesCpu cases,
#                            two GpuChunkedAttention cases]
#   CRISP_GPU_BENCH_SEQ [32768,131072]  CRISP_GPU_BENCH_PRESETS [dense,crisp,flexprefill]
#   CRISP_GPU_BENCH_DENSITIES [none; e.g. 0.1 for a 10% random layout]
#   CRISP_GPU_BENCH_KERNELS  [bench's default: portable and hopper on sm_90; e.g.
#                            hopper-persistent-pp,hopper-grid-nopp,hopper-gqa-pack for the variants]
#   CRISP_GPU_BENCH_REPS [5]  CRISP_GPU_BENCH_ARGS (more flags, e.g. "--dim 64" or "--block 64";
#                            not --reps / --warmup, which the suite sets: refused)
#   CRISP_GPU_BASELINE       bench: a second source tree (e.g. `git archive main`) built into
#                            <build>-baseline and benched with the same flags
#   CRISP_GPU_BASELINE_BIN   bench: a prebuilt baseline `crisp` benched with the same flags (no build)
#   CRISP_GPU_PLAN_PROFILE=1 bench: Nsight Compute times the planner kernels of one crisp plan at
#                            CRISP_GPU_PROFILE_SEQ [131072] tokens (table by kernel name), with the
#                            bench flags of CRISP_GPU_PROFILE_ARGS (e.g. "--heads 4 --kv-heads 1 --dim 256")
#   CRISP_GPU_PROFILE_DETAIL with the profile: a kernel-name regex (e.g. 'pe_logit|layout_kernel');
#                            Nsight Compute's throughput, occupancy and warp-stall sections for the
#                            first CRISP_GPU_PROFILE_DETAIL_LAUNCHES [4] launches it matches
#   CRISP_GPU_WHEEL          python/compare: install this wheel instead of building the package
#   CRISP_GPU_PYTEST_K       python: a pytest -k expression
#   CRISP_GPU_COMPARE_ARGS   compare [--seq 8192,32768,131072 --long]
#   CRISP_GPU_CP_SEQ [131072]  CRISP_GPU_CP_PRESETS [dense,crisp]  CRISP_GPU_CP_REPS [3]
#   CRISP_GPU_LLAMA_BIN      llama: a folder with prebuilt llama-bench, llama-attn-time and their
#                            libraries (scripts/llama_cpp.sh --cuda's bin/): no build [build with
#                            scripts/llama_cpp.sh --cuda, which needs .deps/llama_cpp_python-0.3.16.tar.gz
#                            carried, or .deps/llama.cpp-src]
#   CRISP_GPU_LLAMA_PARTS [small,8b]  small: CRISP_GPU_LLAMA_MODELS; 8b: the Llama-3.1-8B-shaped model
#   CRISP_GPU_LLAMA_MODELS   NAME=PATH,... GGUFs (e.g. smollm2=/tmp/modelstore/SmolLM2-135M-Instruct.Q4_1.gguf)
#   CRISP_GPU_LLAMA_LENGTHS [8192,16384,32768]  CRISP_GPU_LLAMA_REPS [3]
#   CRISP_GPU_LLAMA_8B_LENGTHS [32768,131072]  CRISP_GPU_LLAMA_8B_REPS [1] (llama-bench runs and llama-attn-time passes)
#   CRISP_GPU_LLAMA_8B_PATH [/tmp/crisp-llama3.1-8b-q4_0.gguf: written when absent, kept on a warm machine]
#   CRISP_GPU_LLAMA_POLICIES [fa,dense,crisp,flexprefill,minference]  CRISP_GPU_LLAMA_MAX_UBATCH [32768]
#   CRISP_GPU_LLAMA_ATTN [1; 0: no llama-attn-time pass, no attention share]
#   CRISP_GPU_LLAMA_ARGS     more scripts/llama_bench.py flags (e.g. "--sparse-prefill-set alpha=2")
# Python wheels in .whl/ (e.g. numpy and PyYAML, which scripts/make_llama_gguf.py needs) are
# installed into /tmp/crisp-site first.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# NVLink multicast stays off on shared multi-GPU hosts (NCCL, PyTorch, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

ALL_SUITES="tests sanitizers bench python compare cp llama"
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(tests sanitizers bench)
for s in "${SUITES[@]}"; do
  case " $ALL_SUITES " in
    *" $s "*) ;;
    *) echo "gpu.sh: error: unknown suite \"$s\" (expected one or more of: $ALL_SUITES)" >&2; exit 2 ;;
  esac
done
wants() { case " ${SUITES[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

OUT=${OUT:-${CRISP_GPU_OUT:-$ROOT/out/gpu}}
# The device tool brings back at most 8 files: the summary, each suite's main JSON and details.tgz
# (everything else, packed at the end from $DETAIL).
DETAIL=$OUT/detail
mkdir -p "$OUT" "$DETAIL"
JOBS=${CRISP_GPU_JOBS:-$(nproc)}
ARCH=${CRISP_GPU_ARCH:-90a}
BUILD=${CRISP_GPU_BUILD:-build-gpu}
PY=${PYTHON:-python3}
START=$(date +%s)
# Seconds a step may take: at most $1, and no more than is left of CRISP_GPU_DEADLINE_S.
left() {
  local l=$(( ${CRISP_GPU_DEADLINE_S:-570} - ($(date +%s) - START) ))
  [ "$l" -lt 1 ] && l=1
  [ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}
note() { echo "== $*"; }
ROWS=()  # "suite|status|figures"
BASELINE_TABLE=""  # bench: this tree against CRISP_GPU_BASELINE, printed under the summary
record() { ROWS+=("$1|$2|$3"); }

DEVICE=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
echo "${DEVICE:-no GPU} (x$GPUS); $(date -u +%Y-%m-%dT%H:%M:%SZ); suites: ${SUITES[*]}"

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/crisp-site .whl/*.whl \
    && export PYTHONPATH=/tmp/crisp-site${PYTHONPATH:+:$PYTHONPATH}
fi

# ---------------------------------------------------------------- build (shared by every suite)
# Binaries built elsewhere may miss libraries this machine has only in Python wheels (cuBLAS, the
# runtime, NCCL): add those folders.
use_wheel_libraries() {
  local pkg dir
  for pkg in nvidia.cublas nvidia.cuda_runtime nvidia.nccl; do
    dir=$($PY -c "import $pkg, os; print(os.path.join(list($pkg.__path__)[0], 'lib'))" 2>/dev/null) \
      && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
}
build_tree() {  # source dir, build dir, targets...: configure + build, log to $DETAIL/build_<name>.log
  local src=$1 dir=$2
  shift 2
  local log=$DETAIL/build_$(basename "$dir").log prefix=""
  # A machine without a package registry: CLI11 / nlohmann-json / GoogleTest from .deps/
  # (scripts/pack_gpu_deps.sh) when the system has none.
  if [ ! -f /usr/include/CLI/CLI.hpp ] || [ ! -f /usr/include/nlohmann/json.hpp ]; then
    [ -d "$ROOT/.deps/prefix" ] && prefix="$ROOT/.deps/prefix"
  fi
  if ! ls /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1 \
     && [ -d "$ROOT/.deps/googletest" ]; then
    if [ ! -d /tmp/crisp-gtest ]; then
      { cmake -S "$ROOT/.deps/googletest" -B /tmp/crisp-gtest-build -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
          -DCMAKE_INSTALL_PREFIX=/tmp/crisp-gtest && cmake --build /tmp/crisp-gtest-build -j"$JOBS" \
          && cmake --install /tmp/crisp-gtest-build; } >>"$log" 2>&1
    fi
    prefix="/tmp/crisp-gtest${prefix:+;$prefix}"
  fi
  cmake -S "$src" -B "$dir" -DCRISP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_BUILD_TYPE=Release \
    -DCRISP_BUILD_TESTS=ON ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} >>"$log" 2>&1 \
    && timeout "$(left 600)" cmake --build "$dir" -j"$JOBS" --target "$@" >>"$log" 2>&1
}

TARGETS=()
{ wants bench || wants cp; } && TARGETS+=(crisp_cli)
{ wants tests || wants sanitizers || wants cp; } && TARGETS+=(crisp_gpu_tests)
wants tests && [ "${CRISP_GPU_CPU_TESTS:-0}" = 1 ] && TARGETS+=(crisp_tests)
if [ -n "${CRISP_GPU_BIN:-}" ]; then
  CRISP=$CRISP_GPU_BIN/crisp
  GPU_TESTS=$CRISP_GPU_BIN/crisp_gpu_tests
  for bin in "$CRISP" "$GPU_TESTS"; do
    [ -x "$bin" ] && ldd "$bin" 2>/dev/null | grep -q "not found" && use_wheel_libraries
  done
  record build "prebuilt" "$CRISP_GPU_BIN"
elif [ ${#TARGETS[@]} -gt 0 ]; then
  note "configure + build ($BUILD, sm_$ARCH, -j$JOBS): ${TARGETS[*]}"
  T0=$(date +%s)
  if build_tree "$ROOT" "$BUILD" "${TARGETS[@]}"; then
    # ptxas -v reports every kernel's spills: count the kernels that spill.
    record build ok "$(( $(date +%s) - T0 )) s; kernels with spills: $(grep -E 'bytes spill stores' \
      "$DETAIL/build_$(basename "$BUILD").log" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads')"
  else
    grep -E "error" "$DETAIL/build_$(basename "$BUILD").log" | head -30
    tail -20 "$DETAIL/build_$(basename "$BUILD").log"
    record build FAILED "see detail/build_$(basename "$BUILD").log"
    SUITES=()  # nothing to run
  fi
  CRISP=$ROOT/$BUILD/crisp
  GPU_TESTS=$ROOT/$BUILD/tests/crisp_gpu_tests
fi

# ---------------------------------------------------------------- tests
suite_tests() {
  note "GPU tests"
  local T0=$(date +%s) rc
  if [ -z "${CRISP_GPU_BIN:-}" ]; then
    (cd "$BUILD" && timeout "$(left 300)" ctest -L gpu -j4 --output-on-failure --timeout 200 \
       ${CRISP_GPU_TEST_REGEX:+-R "$CRISP_GPU_TEST_REGEX"}) >"$DETAIL/tests_gpu.log" 2>&1
    rc=$?
    grep -E "tests passed|tests failed|Failed|\*\*\*" "$DETAIL/tests_gpu.log" | head -30
    record tests "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" \
      "$(grep -E 'tests passed' "$DETAIL/tests_gpu.log" | tail -1) ($(( $(date +%s) - T0 )) s)"
  else
    timeout "$(left 300)" "$GPU_TESTS" --gtest_filter="${CRISP_GPU_TEST_FILTER:-*}" --gtest_brief=1 \
      >"$DETAIL/tests_gpu.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests ran" "$DETAIL/tests_gpu.log" | tail -25
    record tests "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" \
      "$(grep -E '^\[  PASSED|^\[  FAILED' "$DETAIL/tests_gpu.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
  fi
  if [ "${CRISP_GPU_CPU_TESTS:-0}" = 1 ] && [ -z "${CRISP_GPU_BIN:-}" ]; then
    (cd "$BUILD" && timeout "$(left 300)" ctest -L cpu -j"$JOBS" --output-on-failure --timeout 120) \
      >"$DETAIL/tests_cpu.log" 2>&1
    rc=$?
    record "tests cpu" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" "$(grep -E 'tests passed' "$DETAIL/tests_cpu.log" | tail -1)"
  fi
}

# ---------------------------------------------------------------- sanitizers
suite_sanitizers() {
  if ! command -v compute-sanitizer >/dev/null; then
    record sanitizers SKIPPED "no compute-sanitizer on PATH"
    return
  fi
  # The planner's cases, and since session 20 (when racecheck stopped reporting the Hopper kernel's
  # item handoff) two attention cases of both kernels: paged chunks and an unaligned chunk.
  local filter=${CRISP_GPU_SANITIZE_FILTER:-'*GpuPlanMatchesCpu*crisp_n3001*:*GpuPlanMatchesCpu*minference_n2500*:*GpuPlanMatchesCpu*flexprefill_varlen*:*GpuChunkedAttention*paged16_shuffled_vllm_layout*:*GpuChunkedAttention*unaligned_gqa8*'}
  local tool rc figures="" status=ok
  local tools=${CRISP_GPU_SANITIZE_TOOLS:-memcheck,racecheck}
  for tool in ${tools//,/ }; do
    note "compute-sanitizer --tool $tool ($filter)"
    timeout "$(left 240)" compute-sanitizer --tool "$tool" --error-exitcode 3 "$GPU_TESTS" --gtest_filter="$filter" \
      >"$DETAIL/sanitizer_$tool.log" 2>&1
    rc=$?
    tail -3 "$DETAIL/sanitizer_$tool.log"
    [ $rc = 0 ] || status="FAILED"
    figures+="$tool rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$DETAIL/sanitizer_$tool.log" | tail -1 | sed 's/^=* *//'); "
  done
  record sanitizers "$status" "$figures"
}

# ---------------------------------------------------------------- bench
# TFLOP/s and plan time per (n, layout, kernel) of a bench JSON, one line each; with a second
# JSON, before -> after side by side. Chunked runs (--chunks, rows with a "chunk"): the whole
# prefill's total ms per (n, preset, kernel, chunk, page size), and its ratio to contiguous K/V.
bench_table() {
  $PY - "$@" <<'PY'
import json, sys
def chunked(r):
    return "chunk" in r
def key(r):
    if chunked(r):
        # contiguous rows: head_major or token_major in the order column
        return (r["n"], r["preset"], r["kernel"], r["chunk"], r["page_size"],
                r.get("page_order", r.get("kv_layout", "-")))
    return (r["n"], r["layout"], r["kernel"])
def rows(path):
    return {key(r): r for r in json.load(open(path)).get("runs", [])}
def paging(r):
    text = "vs contiguous %.3fx" % r["vs_contiguous"] if "vs_contiguous" in r else ""
    return text + (", vs token-major %.3fx" % r["vs_token_major"] if "vs_token_major" in r else "")
after = rows(sys.argv[1])
before = rows(sys.argv[2]) if len(sys.argv) > 2 else None
if any(chunked(r) for r in after.values()):
    if before is None:
        print("%8s %-12s %-10s %7s %5s %-11s %10s  %s" % ("n", "preset", "kernel", "chunk", "page", "order", "total_ms",
              ""))
        for k, r in after.items():
            print("%8d %-12s %-10s %7d %5d %-11s %10.3f  %s" % (*k, r["total_ms"], paging(r)))
    else:
        print("%8s %-12s %-10s %7s %5s %-11s %12s %12s %7s  %s" % ("n", "preset", "kernel", "chunk", "page", "order",
              "baseline ms", "this ms", "change", "baseline -> this"))
        for k, r in after.items():
            b = before.get(k)
            if b is None:
                continue
            print("%8d %-12s %-10s %7d %5d %-11s %12.3f %12.3f %+6.1f%%  %s -> %s" % (*k, b["total_ms"], r["total_ms"],
                  100.0 * (r["total_ms"] / b["total_ms"] - 1.0), paging(b) or "-", paging(r) or "-"))
elif before is None:
    print("%8s %-14s %-22s %9s %9s %8s" % ("n", "layout", "kernel", "plan_ms", "attn_ms", "TFLOP/s"))
    for k, r in after.items():
        print("%8d %-14s %-22s %9.3f %9.3f %8.1f" % (*k, r["plan_ms"], r["attention_ms"], r["effective_tflops"]))
else:
    print("%8s %-14s %-22s %14s %14s %7s" % ("n", "layout", "kernel", "baseline TF/s", "this TF/s", "change"))
    for k, r in after.items():
        b = before.get(k)
        if b is None:
            continue
        print("%8d %-14s %-22s %14.1f %14.1f %+6.1f%%" % (*k, b["effective_tflops"], r["effective_tflops"],
              100.0 * (r["effective_tflops"] / b["effective_tflops"] - 1.0)))
PY
}
# The suite's key figures: TFLOP/s of each kernel on each layout at the longest n, and the plan
# time; chunked runs: the paged runs' ratio to contiguous K/V at the longest n.
bench_figures() {
  $PY - "$1" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1])).get("runs", [])
if runs and "chunk" in runs[0]:
    n = max(r["n"] for r in runs)
    parts = ["%s/%s chunk %d %s%s %.3fx" % (r["preset"], r["kernel"], r["chunk"],
                                            "page %d" % r["page_size"] if r["page_size"] else "token-major",
                                            " in order" if r.get("page_order") == "in_order" else "", r["vs_contiguous"])
             for r in runs if r["n"] == n and "vs_contiguous" in r]
    print("n=%d paged vs contiguous: %s" % (n, ", ".join(parts)))
elif runs:
    n = max(r["n"] for r in runs)
    parts = ["%s/%s %.0f" % (r["layout"], r["kernel"], r["effective_tflops"]) for r in runs if r["n"] == n]
    plans = {r["layout"]: r["plan_ms"] for r in runs if r["n"] == n and r["plan_ms"] > 0 and r["layout"] != "dense"}
    print("n=%d TFLOP/s %s; plan ms %s" % (n, ", ".join(parts), ", ".join("%s %.2f" % p for p in plans.items())))
PY
}
run_bench() {  # binary, json path, log name
  case " ${CRISP_GPU_BENCH_ARGS:-} " in
    *" --reps"*|*" --warmup"*)
      echo "gpu.sh: error: CRISP_GPU_BENCH_ARGS='$CRISP_GPU_BENCH_ARGS' sets --reps or --warmup, which the bench suite sets itself; expected CRISP_GPU_BENCH_REPS for the repetitions" >&2
      return 2 ;;
  esac
  timeout "$(left 300)" "$1" bench --seq "${CRISP_GPU_BENCH_SEQ:-32768,131072}" \
    --presets "${CRISP_GPU_BENCH_PRESETS:-dense,crisp,flexprefill}" \
    ${CRISP_GPU_BENCH_DENSITIES:+--densities "$CRISP_GPU_BENCH_DENSITIES"} \
    ${CRISP_GPU_BENCH_KERNELS:+--kernels "$CRISP_GPU_BENCH_KERNELS"} \
    --reps "${CRISP_GPU_BENCH_REPS:-5}" --warmup 1 ${CRISP_GPU_BENCH_ARGS:-} --json "$2" \
    >"$DETAIL/$3.txt" 2>"$DETAIL/$3_progress.log"
}
# The bench suite's baseline: the same bench by another binary (T0 set by the caller), its table
# against this build's and its summary row.
bench_baseline_with() {  # baseline crisp binary
  run_bench "$1" "$OUT/bench_baseline.json" bench_baseline
  local rc=$?
  BASELINE_TABLE=$(bench_table "$OUT/bench.json" "$OUT/bench_baseline.json")
  echo "$BASELINE_TABLE"
  record "bench baseline" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" \
    "$(bench_figures "$OUT/bench_baseline.json" 2>/dev/null) ($(( $(date +%s) - T0 )) s)"
}
suite_bench() {
  note "crisp bench"
  local T0=$(date +%s) rc status
  run_bench "$CRISP" "$OUT/bench.json" bench
  rc=$?
  cat "$DETAIL/bench.txt"
  tail -3 "$DETAIL/bench_progress.log"
  status=$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc$([ $rc = 124 ] && echo ' (deadline; rows so far kept)')")
  record bench "$status" "$(bench_figures "$OUT/bench.json" 2>/dev/null) ($(( $(date +%s) - T0 )) s)"
  if [ -n "${CRISP_GPU_BASELINE_BIN:-}" ]; then
    note "baseline binary $CRISP_GPU_BASELINE_BIN: the same bench"
    T0=$(date +%s)
    bench_baseline_with "$CRISP_GPU_BASELINE_BIN"
  elif [ -n "${CRISP_GPU_BASELINE:-}" ]; then
    note "baseline $CRISP_GPU_BASELINE: build ${BUILD}-baseline and the same bench"
    T0=$(date +%s)
    if build_tree "$CRISP_GPU_BASELINE" "$ROOT/${BUILD}-baseline" crisp_cli; then
      bench_baseline_with "$ROOT/${BUILD}-baseline/crisp"
    else
      record "bench baseline" FAILED "build of $CRISP_GPU_BASELINE failed (detail/build_${BUILD}-baseline.log)"
    fi
  fi
  if [ "${CRISP_GPU_PLAN_PROFILE:-0}" = 1 ]; then
    # Nsight Compute times every planner kernel (and the work order's key kernel and cub sort) of
    # one crisp plan, kernels serialised, clocks left alone; the attention kernels run unprofiled.
    note "plan profile (ncu), n=${CRISP_GPU_PROFILE_SEQ:-131072}"
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout "$(left 240)" "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
      --kernel-name-base demangled --kernel-name regex:'planner|work_key|Radix' "$CRISP" bench \
      --seq "${CRISP_GPU_PROFILE_SEQ:-131072}" --presets crisp --densities 0.1 --reps 1 --warmup 0 --kernels hopper \
      ${CRISP_GPU_PROFILE_ARGS:-} --quiet >"$DETAIL/plan_profile.csv" 2>"$DETAIL/plan_profile.err"
    rc=$?
    $PY scripts/plan_profile_table.py "$DETAIL/plan_profile.csv" | tee "$DETAIL/plan_profile.txt"
    record "plan profile" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" "$(tail -1 "$DETAIL/plan_profile.txt")"
    if [ -n "${CRISP_GPU_PROFILE_DETAIL:-}" ]; then
      # Nsight Compute's sections (throughputs, occupancy and its limits, warp stalls) for the
      # planner kernels the regex names, one launch each; the headline lines go to the log.
      note "plan kernel detail (ncu), kernels ${CRISP_GPU_PROFILE_DETAIL}"
      timeout "$(left 240)" "$ncu" --clock-control none --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --kernel-name regex:"${CRISP_GPU_PROFILE_DETAIL}" \
        --launch-count "${CRISP_GPU_PROFILE_DETAIL_LAUNCHES:-4}" "$CRISP" bench \
        --seq "${CRISP_GPU_PROFILE_SEQ:-131072}" --presets crisp --densities 0.1 --reps 1 --warmup 0 --kernels hopper \
        ${CRISP_GPU_PROFILE_ARGS:-} --quiet >"$DETAIL/plan_kernel_detail.txt" 2>&1
      rc=$?
      grep -E "^  [A-Za-z_:<>0-9 ]+\(|Duration|Throughput|Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued" \
        "$DETAIL/plan_kernel_detail.txt" | tee "$DETAIL/plan_kernel_detail_summary.txt"
      record "plan kernel detail" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" \
        "$(grep -c "Duration" "$DETAIL/plan_kernel_detail.txt") launches (detail/plan_kernel_detail.txt)"
    fi
  fi
}

# ---------------------------------------------------------------- python / compare
PY_INSTALLED=0
install_python_package() {
  [ "$PY_INSTALLED" = 1 ] && return 0
  local T0=$(date +%s) rc
  if [ -n "${CRISP_GPU_WHEEL:-}" ]; then
    note "pip install $CRISP_GPU_WHEEL (prebuilt)"
    $PY -m pip install --no-deps --no-index --force-reinstall "$CRISP_GPU_WHEEL" >"$DETAIL/pip_install.log" 2>&1
  else
    # No build isolation: the machine has no network; scikit-build-core, nanobind, cmake and ninja
    # are installed there.
    note "pip install . (CUDA arch $ARCH, -j$JOBS)"
    CMAKE_BUILD_PARALLEL_LEVEL=$JOBS timeout "$(left 400)" $PY -m pip install -v --no-build-isolation --no-deps \
      --force-reinstall -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH" . >"$DETAIL/pip_install.log" 2>&1
  fi
  rc=$?
  if [ $rc != 0 ]; then
    grep -E "error|Error" "$DETAIL/pip_install.log" | head -20
    record "python install" "FAILED rc=$rc" "see detail/pip_install.log"
    return 1
  fi
  # Imported from outside the tree: the tree's python/crisp has no native module.
  (cd /tmp && $PY -c 'import crisp; print("crisp", crisp.__version__, "cuda", crisp.cuda_available())') \
    | tee -a "$DETAIL/pip_install.log"
  record "python install" ok "$(( $(date +%s) - T0 )) s"
  PY_INSTALLED=1
}
suite_python() {
  install_python_package || return
  note "pytest tests/python"
  local T0=$(date +%s) rc
  timeout "$(left 150)" $PY -m pytest -q -rs -p no:cacheprovider ${CRISP_GPU_PYTEST_K:+-k "$CRISP_GPU_PYTEST_K"} \
    tests/python >"$DETAIL/pytest.log" 2>&1
  rc=$?
  grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$DETAIL/pytest.log" | tail -20
  record python "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" "$(tail -1 "$DETAIL/pytest.log") ($(( $(date +%s) - T0 )) s)"
}
suite_compare() {
  install_python_package || return
  local args=${CRISP_GPU_COMPARE_ARGS:---seq 8192,32768,131072 --long}
  note "bench/compare.py $args"
  local T0=$(date +%s) rc
  timeout "$(left 240)" $PY bench/compare.py $args --json "$OUT/compare.json" >"$DETAIL/compare.txt" \
    2>"$DETAIL/compare_progress.log"
  rc=$?
  cat "$DETAIL/compare.txt"
  [ $rc = 0 ] || tail -5 "$DETAIL/compare_progress.log"
  local figures
  figures=$($PY - "$OUT/compare.json" <<'PY' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
n = max(r["n"] for r in rows if r["Hq"] == rows[0]["Hq"])
print("n=%d TFLOP/s " % n + ", ".join("%s %.0f" % (r["method"], r["tflops"]) for r in rows if r["n"] == n and r.get("tflops")))
PY
)
  record compare "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc$([ $rc = 124 ] && echo ' (deadline)')")" \
    "${figures:-no rows} ($(( $(date +%s) - T0 )) s)"
}

# ---------------------------------------------------------------- cp
suite_cp() {
  if [ "$GPUS" -lt 2 ]; then
    record cp SKIPPED "$GPUS GPU(s); context parallelism needs 2"
    return
  fi
  # NCCL at run time: the CUDA toolkit's, else the nvidia-nccl-cu* Python wheel's.
  local dir nccl=""
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$dir/libnccl.so.2" ] && { nccl=$dir; break; }
  done
  [ -z "$nccl" ] && nccl=$($PY -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH="${nccl:+$nccl:}${LD_LIBRARY_PATH:-}"
  nvidia-smi topo -m 2>/dev/null | head -4
  note "cp: GPU tests of context parallelism"
  local T0=$(date +%s) rc status=ok figures=""
  timeout "$(left 90)" "$GPU_TESTS" --gtest_filter='GpuContextParallel*' >"$DETAIL/cp_tests.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED)|Failure" "$DETAIL/cp_tests.log" | head -10
  [ $rc = 0 ] || status=FAILED
  figures+="tests rc=$rc $(grep -E '^\[  PASSED' "$DETAIL/cp_tests.log" | tr -s ' ' | head -1); "
  note "cp: crisp bench --gpus 2"
  timeout "$(left 200)" "$CRISP" bench --gpus 2 --seq "${CRISP_GPU_CP_SEQ:-131072}" --presets "${CRISP_GPU_CP_PRESETS:-dense,crisp}" \
    --partition contiguous,zigzag --reps "${CRISP_GPU_CP_REPS:-3}" --warmup 1 --json "$OUT/cp_bench.json" \
    >"$DETAIL/cp_bench.txt" 2>"$DETAIL/cp_bench_progress.log"
  rc=$?
  cat "$DETAIL/cp_bench.txt"
  [ $rc = 0 ] || status=FAILED
  figures+="bench rc=$rc $($PY - "$OUT/cp_bench.json" <<'PY' 2>/dev/null
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
print(", ".join("%s/%s x%.2f" % (r["preset"], r["partition"], r["speedup"]) for r in runs if r["n"] == max(x["n"] for x in runs)))
PY
) ($(( $(date +%s) - T0 )) s)"
  record cp "$status" "$figures"
}

# ---------------------------------------------------------------- llama
# The key figures of a llama_bench.py JSON: per model at its longest length, each policy's
# tokens/s speedup over llama.cpp's flash attention, the attention share and the density.
llama_figures() {
  $PY - "$@" <<'PY'
import json, sys
parts = []
for path in sys.argv[1:]:
    try:
        rows = json.load(open(path))["rows"]
    except (OSError, ValueError, KeyError):
        continue
    for model in dict.fromkeys(r["model"] for r in rows):
        done = [r for r in rows if r["model"] == model and "mean_ms" in r]
        if not done:
            parts.append("%s: no rows" % model)
            continue
        n = max(r["n_prompt"] for r in done)
        cells = []
        for r in (r for r in done if r["n_prompt"] == n):
            cell = r["policy"] + (" %.0f tok/s" % r["tokens_per_s"] if r["policy"] == "fa" else " x%.2f" % r.get("speedup_vs_fa", 0))
            if r.get("attention_share") is not None:
                cell += " attn %.0f%%" % (100 * r["attention_share"])
            if r.get("density") is not None:
                cell += " d %.2f" % r["density"]
            cells.append(cell)
        parts.append("%s n=%d: %s" % (model, n, ", ".join(cells)))
print("; ".join(parts))
PY
}
suite_llama() {
  local T0=$(date +%s) rc status=ok bin parts=${CRISP_GPU_LLAMA_PARTS:-small,8b} jsons=() figures=""
  local common=(--policies "${CRISP_GPU_LLAMA_POLICIES:-fa,dense,crisp,flexprefill,minference}"
                --max-ubatch "${CRISP_GPU_LLAMA_MAX_UBATCH:-32768}")
  [ "${CRISP_GPU_LLAMA_ATTN:-1}" = 0 ] && common+=(--no-attn-time)
  if [ -n "${CRISP_GPU_LLAMA_BIN:-}" ]; then
    bin=$CRISP_GPU_LLAMA_BIN
    record "llama build" prebuilt "$bin"
  else
    note "llama: scripts/llama_cpp.sh --cuda (-j$JOBS)"
    bin=$(JOBS=$JOBS timeout "$(left 540)" scripts/llama_cpp.sh --cuda 2>"$DETAIL/llama_build.log")
    rc=$?
    if [ $rc != 0 ]; then
      cp .deps/llama.cpp-build-cuda/crisp-build.log "$DETAIL/llama_build_compiler.log" 2>/dev/null
      tail -15 "$DETAIL/llama_build.log"
      record "llama build" "FAILED rc=$rc" "$([ $rc = 124 ] && echo 'deadline: run again, the build resumes; ')see detail/llama_build.log"
      return
    fi
    record "llama build" ok "$(( $(date +%s) - T0 )) s"
  fi
  if [[ ",$parts," == *,small,* ]]; then
    if [ -z "${CRISP_GPU_LLAMA_MODELS:-}" ]; then
      figures+="small: skipped (CRISP_GPU_LLAMA_MODELS names no model); "
    else
      local models=() m
      IFS=',' read -r -a m <<<"$CRISP_GPU_LLAMA_MODELS"
      for spec in "${m[@]}"; do models+=(--model "$spec"); done
      note "llama: llama_bench.py ${m[*]} at ${CRISP_GPU_LLAMA_LENGTHS:-8192,16384,32768}"
      $PY scripts/llama_bench.py --bin "$bin" "${models[@]}" --lengths "${CRISP_GPU_LLAMA_LENGTHS:-8192,16384,32768}" \
        --reps "${CRISP_GPU_LLAMA_REPS:-3}" "${common[@]}" --deadline-s "$(left 600)" ${CRISP_GPU_LLAMA_ARGS:-} \
        --json "$OUT/llama_bench.json" --md "$DETAIL/llama_bench.md" >"$DETAIL/llama_bench.txt" 2>"$DETAIL/llama_bench_progress.log"
      rc=$?
      cat "$DETAIL/llama_bench.md" 2>/dev/null
      [ $rc = 0 ] || { status="FAILED"; figures+="small rc=$rc ($(tail -1 "$DETAIL/llama_bench_progress.log")); "; }
      jsons+=("$OUT/llama_bench.json")
    fi
  fi
  if [[ ",$parts," == *,8b,* ]] && [ "$(left 1000)" -gt 5 ]; then
    local model=${CRISP_GPU_LLAMA_8B_PATH:-/tmp/crisp-llama3.1-8b-q4_0.gguf}
    if [ ! -f "$model" ]; then
      # Random weights at Llama-3.1-8B's shape (4.5 GB Q4_0), written by the tree's own script.
      note "llama: make_llama_gguf.py --shape llama3.1-8b -> $model"
      timeout "$(left 300)" $PY scripts/make_llama_gguf.py --shape llama3.1-8b --out "$model" >"$DETAIL/llama_8b_gguf.log" 2>&1
      rc=$?
      tail -2 "$DETAIL/llama_8b_gguf.log"
      [ $rc = 0 ] || { status="FAILED"; figures+="8b model rc=$rc (detail/llama_8b_gguf.log: numpy and PyYAML needed, .whl/); "; }
    fi
    if [ -f "$model" ]; then
      note "llama: llama_bench.py llama3.1-8b-random at ${CRISP_GPU_LLAMA_8B_LENGTHS:-32768,131072}"
      $PY scripts/llama_bench.py --bin "$bin" --model llama3.1-8b-random="$model" \
        --lengths "${CRISP_GPU_LLAMA_8B_LENGTHS:-32768,131072}" --reps "${CRISP_GPU_LLAMA_8B_REPS:-1}" \
        --attn-reps "${CRISP_GPU_LLAMA_8B_REPS:-1}" "${common[@]}" \
        --deadline-s "$(left 600)" ${CRISP_GPU_LLAMA_ARGS:-} --json "$OUT/llama_bench_8b.json" \
        --md "$DETAIL/llama_bench_8b.md" >"$DETAIL/llama_bench_8b.txt" 2>"$DETAIL/llama_bench_8b_progress.log"
      rc=$?
      cat "$DETAIL/llama_bench_8b.md" 2>/dev/null
      [ $rc = 0 ] || { status="FAILED"; figures+="8b rc=$rc ($(tail -1 "$DETAIL/llama_bench_8b_progress.log")); "; }
      jsons+=("$OUT/llama_bench_8b.json")
    fi
  fi
  [ ${#jsons[@]} -gt 0 ] && figures+="$(llama_figures "${jsons[@]}" 2>/dev/null)"
  record llama "$status" "$figures ($(( $(date +%s) - T0 )) s)"
}

for s in "${SUITES[@]}"; do
  if [ "$(left 1000)" -le 5 ]; then
    record "$s" SKIPPED "CRISP_GPU_DEADLINE_S reached"
    continue
  fi
  "suite_$s"
done

[ -d "$DETAIL" ] && tar czf "$OUT/details.tgz" -C "$OUT" detail && rm -rf "$DETAIL"
{
  echo
  echo "==================== summary ($(date -u +%Y-%m-%dT%H:%MZ), ${DEVICE:-no GPU} x$GPUS, $(( $(date +%s) - START )) s)"
  printf "%-16s %-10s %s\n" suite status "key figures"
  for row in "${ROWS[@]}"; do
    IFS='|' read -r suite status figures <<<"$row"
    printf "%-16s %-10s %s\n" "$suite" "$status" "$figures"
  done
  [ -n "$BASELINE_TABLE" ] && printf "\nbench against the baseline (%s):\n%s\n" "${CRISP_GPU_BASELINE:-${CRISP_GPU_BASELINE_BIN:-}}" "$BASELINE_TABLE"
} | tee "$OUT/summary.txt"
# Exit status: 1 when any suite failed.
for row in "${ROWS[@]}"; do case "$row" in *"|FAILED"*) exit 1 ;; esac; done
exit 0
