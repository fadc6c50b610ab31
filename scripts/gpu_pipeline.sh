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
#   1. scripts/llama_cpp.sh --cuda (JOBS=12), beside it `gpu.sh tests` and the Llama-3.1-8B-shaped
#      GGUF (scripts/make_llama_gguf.py, CPU)
#   2. once the models are in /tmp/modelstore: the hook's checks on both models and
#      test-ggml-crisp, CUDA graphs on (docs/llama_cpp.md "Known problems on CUDA" 1, 3, 5); then
#      the crisp preset's verdict on issue 14's TEST split (llama_fa, crisp, flexprefill,
#      minference; Gemma 3 at 4k–32k, SmolLM2 at 4k and 8k; up to three runs side by side on the
#      GPU, graphs on; a run that crashes is resumed once with GGML_CUDA_DISABLE_GRAPHS=1 and
#      CRISP_HOOK_SYNC_CHECK=1, which names the failing stage)
#   3. alone on the GPU, after every evaluation: llama-bench of both models (8k/16k/32k, every
#      policy) and of the 8B-shaped model (32k, 128k), and `crisp bench` at 128k (dense, crisp,
#      flexprefill; the attention kernels' figures with the preset).
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
step gpu_tests 720 env OUT="$PIPE/gpu_tests" CRISP_GPU_DEADLINE_S=720 scripts/gpu.sh tests
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
step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
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
eval_run test_smollm2_4096 300 "$SMOL" 4096
eval_run test_smollm2_8192 300 "$SMOL" 8192
eval_run test_gemma_4096 300 "$GEMMA" 4096
wait "${eval_pids[@]}"; eval_pids=()
eval_run test_gemma_8192 360 "$GEMMA" 8192
eval_run test_gemma_16384 480 "$GEMMA" 16384
eval_run test_gemma_32768 600 "$GEMMA" 32768
wait "${eval_pids[@]}"
log "test split done"

# 3: benchmarks, alone on the GPU.
step llama_bench_small 420 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="smollm2=$SMOL,gemma3=$GEMMA" scripts/gpu.sh llama
step llama_bench_8b 480 env OUT="$PIPE/llama_bench_8b" CRISP_GPU_DEADLINE_S=480 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=8b CRISP_GPU_LLAMA_8B_LENGTHS=32768,131072 CRISP_GPU_LLAMA_8B_PATH="$GGUF_8B" scripts/gpu.sh llama
step crisp_bench_128k 240 env OUT="$PIPE/crisp_bench" CRISP_GPU_DEADLINE_S=240 CRISP_GPU_BENCH_SEQ=131072 \
  CRISP_GPU_BENCH_PRESETS=dense,crisp,flexprefill CRISP_GPU_BENCH_KERNELS=auto scripts/gpu.sh bench
wait
log "pipeline done"
