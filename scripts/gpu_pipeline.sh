#!/usr/bin/env bash
# scripts/gpu_pipeline.sh — one GPU session's work as a background pipeline, so that the device
# calls after the first one can carry model pieces (docs/gpu.md, "The models") while it builds.
# A warm machine keeps processes started in their own session (setsid) between calls; each step
# writes its log and outputs under $PIPE (default /tmp/pipe), and `--collect` packs them for $OUT.
#
#   call 1:  setsid nohup scripts/gpu_pipeline.sh > /dev/null 2>&1 < /dev/null &
#   calls 2…: carry the model folders into /tmp/modelstore (the last one joins them), then poll
#            with `scripts/gpu_pipeline.sh --status`, and end with `scripts/gpu_pipeline.sh --collect`.
#
# Steps, in order (each cut by its own timeout and by PIPE_DEADLINE_S from the start, default 1500):
#   1. scripts/llama_cpp.sh --cuda (JOBS=12), beside it `gpu.sh tests` (PIPE_GPU_TESTS=0 skips
#      them: nothing under src/cuda changed since they last passed) and the Llama-3.1-8B-shaped GGUF
#      (scripts/make_llama_gguf.py, CPU)
#   2. once the models are in /tmp/modelstore: test-ggml-crisp on CUDA, graphs on, and its variants
#      that narrow docs/llama_cpp.md item 6 (graphs off, the portable kernel, no verdict cache,
#      CUDA_LAUNCH_BLOCKING); the hook's checks on both models; CRISP_HOOK_TIMING=1 llama-bench
#      runs at 8k (where the hook's fixed cost per op goes); then issue 14's TEST split where
#      session 10 left it (Gemma 3 16k and 32k resumed from their JSONs, SmolLM2 8k again with the
#      verdict cache), side by side, graphs on; a run that crashes is resumed once with
#      GGML_CUDA_DISABLE_GRAPHS=1 and CRISP_HOOK_SYNC_CHECK=1, which names the failing stage; beside
#      them the short-prompt pass-key probe (scripts/passkey_copy_probe.py) on SmolLM2
#   3. alone on the GPU, after every evaluation: `crisp bench` at 128k (dense, crisp, flexprefill:
#      the preset's kernel figures, issue 14), llama-bench of the 8B-shaped model (32k, 128k) and of
#      both small models (8k/16k/32k, every policy; issue 17).
set -u
cd "$(dirname "$0")/.."
PIPE=${PIPE:-/tmp/pipe}
MODELS=${PIPE_MODELS:-/tmp/modelstore}

if [ "${1:-}" = "--status" ]; then
  cat "$PIPE/pipeline.log" 2>/dev/null
  tail -n 3 "$PIPE"/current.log 2>/dev/null
  exit 0
fi
if [ "${1:-}" = "--collect" ]; then
  : "${OUT:?--collect writes into \$OUT}"
  tar -czf "$OUT/pipeline.tgz" -C "$(dirname "$PIPE")" "$(basename "$PIPE")" 2>/dev/null
  cp "$PIPE/pipeline.log" "$OUT/" 2>/dev/null
  for f in "$PIPE"/*/summary.txt; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done
  ls -la "$OUT"
  exit 0
fi

mkdir -p "$PIPE"
START=$(date +%s)
DEADLINE=${PIPE_DEADLINE_S:-1500}
log() { echo "$(date +%T) [+$(( $(date +%s) - START ))s] $*" >> "$PIPE/pipeline.log"; }
left() { local l=$(( DEADLINE - ($(date +%s) - START) )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
step() {  # step NAME TIMEOUT_S COMMAND... : runs it with its output in $PIPE/NAME.log
  local name=$1 limit=$2
  shift 2
  if [ $(( DEADLINE - ($(date +%s) - START) )) -lt 20 ]; then log "$name: skipped (deadline)"; return; fi
  log "$name: start"
  ln -sf "$PIPE/$name.log" "$PIPE/current.log"
  timeout "$(left "$limit")" "$@" > "$PIPE/$name.log" 2>&1
  log "$name: rc=$?"
}

# PIPE_RESUME=1: a second pipeline on the same warm machine: the build, the GPU tests and the GGUF
# are there; every eval resumes its JSON.
if [ "${PIPE_RESUME:-0}" != 1 ]; then
# 1: the build, the crisp GPU tests and the 8B-shaped GGUF side by side.
( JOBS=12 scripts/llama_cpp.sh --cuda > "$PIPE/llama_build.out" 2> "$PIPE/llama_build.log"
  echo $? > "$PIPE/llama_build.rc" ) &
LLAMA_BUILD=$!
log "llama.cpp build started"
GGUF_8B=/tmp/crisp-llama3.1-8b-q4_0.gguf
( nice -n 5 timeout 900 python3 scripts/make_llama_gguf.py --shape llama3.1-8b --out "$GGUF_8B" > "$PIPE/gguf_8b.log" 2>&1
  log "8B-shaped GGUF rc=$?" ) &
[ "${PIPE_GPU_TESTS:-1}" = 0 ] || step gpu_tests 720 env OUT="$PIPE/gpu_tests" CRISP_GPU_DEADLINE_S=720 scripts/gpu.sh tests
wait "$LLAMA_BUILD"
log "llama.cpp build rc=$(cat "$PIPE/llama_build.rc" 2>/dev/null)"
fi
GGUF_8B=/tmp/crisp-llama3.1-8b-q4_0.gguf
BIN=.deps/llama.cpp-build-cuda/bin

# 2: the models.
SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
while [ ! -f "$GEMMA" ] || [ ! -f "$SMOL" ]; do
  [ $(( DEADLINE - ($(date +%s) - START) )) -lt 60 ] && { log "models never arrived"; exit 1; }
  sleep 5
done
log "models present"
if [ "${PIPE_RESUME:-0}" != 1 ]; then
step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
# docs/llama_cpp.md item 6 (a CUDA graph captured after crisp ran eagerly faults): which variant
# still faults. Each prints its own checks; the one that passes is the lead.
step item6_graphs_off 120 env GGML_CUDA_DISABLE_GRAPHS=1 "$BIN/test-ggml-crisp" cuda
step item6_portable_kernel 120 env CRISP_KERNEL=portable "$BIN/test-ggml-crisp" cuda
step item6_no_verdict_cache 120 env CRISP_HOOK_VERDICT_CACHE=0 "$BIN/test-ggml-crisp" cuda
step item6_launch_blocking 120 env CUDA_LAUNCH_BLOCKING=1 "$BIN/test-ggml-crisp" cuda
step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
# Where the hook's fixed cost per op goes (bench/RESULTS.md "Session 10"): CRISP_HOOK_TIMING=1
# prints each stage's totals at exit; with the verdict cache on and off.
hook_timing() {  # hook_timing NAME MODEL POLICY [ENV...]
  local name=$1 model=$2 policy=$3
  shift 3
  step "hook_timing_$name" 120 env CRISP_HOOK_TIMING=1 "$@" "$BIN/llama-bench" -m "$model" -p 8192 -n 0 -fa 1 -b 8192 \
    -ub 8192 -ngl 99 -r 1 --sparse-prefill "$policy"
}
hook_timing smollm2_dense "$SMOL" dense
hook_timing smollm2_crisp "$SMOL" crisp
hook_timing smollm2_crisp_no_cache "$SMOL" crisp CRISP_HOOK_VERDICT_CACHE=0
hook_timing gemma_crisp "$GEMMA" crisp
fi

# 2: the preset's verdict on the test split (issue 14), runs side by side.
eval_pids=()
eval_run() {  # eval_run NAME TIMEOUT MODEL LENGTH: the test split, resumed; once more without graphs on a crash
  local name=$1 limit=$2 model=$3 length=$4
  if grep -qs '"complete": *true' "$PIPE/$name.json"; then log "$name: complete before"; return; fi
  ( args=(niah --model "$model" --ngl 99 --lengths "$length" --tasks passkey,niah_single --split test
                --policies llama_fa,crisp,flexprefill,minference --json "$PIPE/$name.json" --quiet)
    timeout "$(left "$limit")" "$BIN/crisp-llama-eval" "${args[@]}" > "$PIPE/$name.log" 2>&1
    rc=$?
    log "$name rc=$rc"
    if [ $rc = 134 ] || [ $rc = 139 ]; then
      GGML_CUDA_DISABLE_GRAPHS=1 CRISP_HOOK_SYNC_CHECK=1 timeout "$(left "$limit")" "$BIN/crisp-llama-eval" "${args[@]}" \
        > "$PIPE/$name.retry.log" 2>&1
      log "$name (graphs off, sync check) rc=$?"
    fi ) &
  eval_pids+=($!)
}
# Session 10 completed SmolLM2 4k/8k and Gemma 3 4k/8k (eval/results/llama_cpp/*_test_preset_h200_20261202s10.json);
# Gemma 3 16k and 32k resume from their partial JSONs (26 and 9 of 40 samples), and SmolLM2 8k
# runs again with the verdict cache on (built after session 10) to show it changes no answer.
for partial in gemma_16384 gemma_32768; do
  seed=eval/results/llama_cpp/${partial}_test_preset_h200_20261202s10.json
  [ -f "$PIPE/test_$partial.json" ] || cp "$seed" "$PIPE/test_$partial.json" 2>/dev/null
done
# The short-prompt pass-key probe (docs/evaluation.md "Short prompts"), both splits, on the GPU's
# forward (the CPU's answered differently at 4k): beside the evaluations, small.
( for split in tuning test; do
    timeout "$(left 400)" python3 scripts/passkey_copy_probe.py --bin "$BIN" --model "$SMOL" --ngl 99 --split "$split" \
      --points "crisp,flexprefill,crisp:uniform_floor_blocks=32" --json "$PIPE/probe_${split}_smollm2.json" \
      > "$PIPE/probe_${split}_smollm2.out" 2> "$PIPE/probe_${split}_smollm2.log"
    log "probe $split rc=$?"
  done ) &
eval_pids+=($!)
eval_run test_gemma_16384 360 "$GEMMA" 16384
eval_run test_gemma_32768 480 "$GEMMA" 32768
eval_run test_smollm2_8192 300 "$SMOL" 8192
wait "${eval_pids[@]}"
log "test split done"

# 3: benchmarks, alone on the GPU.
step crisp_bench_128k 240 env OUT="$PIPE/crisp_bench" CRISP_GPU_DEADLINE_S=240 CRISP_GPU_BENCH_SEQ=131072 \
  CRISP_GPU_BENCH_PRESETS=dense,crisp,flexprefill CRISP_GPU_BENCH_KERNELS=auto scripts/gpu.sh bench
step llama_bench_8b 480 env OUT="$PIPE/llama_bench_8b" CRISP_GPU_DEADLINE_S=480 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=8b CRISP_GPU_LLAMA_8B_LENGTHS=32768,131072 CRISP_GPU_LLAMA_8B_PATH="$GGUF_8B" scripts/gpu.sh llama
step llama_bench_small 420 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="smollm2=$SMOL,gemma3=$GEMMA" scripts/gpu.sh llama
wait
log "pipeline done"
