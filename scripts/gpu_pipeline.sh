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
# Steps, in order (each cut by its own timeout and by PIPE_DEADLINE_S from the start, default 1440):
#   1. scripts/llama_cpp.sh --cuda --server (in parallel with 2)
#   2. gpu.sh tests sanitizers bench (the chunked/paged bench at 128k), gpu.sh bench --dim 256, the
#      planner's stage times of a chunked prefill
#   3. once the models are in /tmp/modelstore: the llama.cpp checks on SmolLM2 and Gemma 3 (CUDA),
#      llama-bench of both models, crisp-llama-eval NIAH on Gemma 3 (test split, 32k first), the
#      Llama-3.1-8B-shaped model at 32k; and, on the CPU beside them, the structured frontier at
#      128k (test split).
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
DEADLINE=${PIPE_DEADLINE_S:-1440}
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

# 1 + 2: the builds in parallel, then the crisp GPU suites.
( JOBS=8 scripts/llama_cpp.sh --cuda --server > "$PIPE/llama_build.out" 2> "$PIPE/llama_build.log"
  echo $? > "$PIPE/llama_build.rc" ) &
LLAMA_BUILD=$!
log "llama.cpp build started"
step gpu_tests 900 env OUT="$PIPE/gpu_tests" CRISP_GPU_DEADLINE_S=900 CRISP_GPU_BENCH_SEQ=131072 \
  CRISP_GPU_BENCH_PRESETS=dense,crisp CRISP_GPU_BENCH_KERNELS=auto CRISP_GPU_BENCH_REPS=3 \
  CRISP_GPU_BENCH_ARGS="--chunks 16384 --page-sizes 16,32,128" \
  CRISP_GPU_SANITIZE_FILTER='*GpuChunkedAttention*paged16_shuffled_vllm_layout*:*GpuChunkedAttention*long_rows*:*d256_B128_paged16*:*bf16_d256_crisp_gqa4*' \
  scripts/gpu.sh tests sanitizers bench
step gpu_bench_d256 300 env OUT="$PIPE/gpu_bench_d256" CRISP_GPU_DEADLINE_S=300 CRISP_GPU_BENCH_SEQ=32768,131072 \
  CRISP_GPU_BENCH_ARGS="--dim 256" scripts/gpu.sh bench
step plan_stages_chunked 120 env CRISP_PLAN_TIMING=1 build-gpu/crisp bench --seq 131072 --presets crisp \
  --chunks 16384 --reps 1 --warmup 1
wait "$LLAMA_BUILD"
log "llama.cpp build rc=$(cat "$PIPE/llama_build.rc" 2>/dev/null)"
BIN=.deps/llama.cpp-build-cuda/bin

# 3: the models.
SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
while [ ! -f "$GEMMA" ] || [ ! -f "$SMOL" ]; do
  [ $(( DEADLINE - ($(date +%s) - START) )) -lt 60 ] && { log "models never arrived"; exit 1; }
  sleep 5
done
log "models present"
( OMP_NUM_THREADS=6 nice -n 10 timeout "$(left 900)" build-gpu/crisp eval pareto --structured --split test \
    --lengths 131072 --workload-set background_scale=1.5 --workload-set no_local_head_share=0.5 \
    --sweep crisp "flexprefill:gamma=0.9" --json "$PIPE/structured_test_128k.json" > "$PIPE/structured_128k.log" 2>&1
  log "structured 128k rc=$?" ) &
step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
step llama_bench_small 420 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="smollm2=$SMOL,gemma3=$GEMMA" scripts/gpu.sh llama
for L in 32768 8192; do
  step "niah_gemma_test_$L" 240 "$BIN/crisp-llama-eval" niah --model "$GEMMA" --ngl 99 --split test --lengths "$L" \
    --tasks niah_single,passkey,niah_prose --prose .gpubin/long_qa_prompts.json \
    --policies llama_fa,crisp,flexprefill,minference --json "$PIPE/niah_gemma_test_$L.json"
done
step llama_bench_8b 420 env OUT="$PIPE/llama_bench_8b" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=8b CRISP_GPU_LLAMA_8B_LENGTHS=32768 scripts/gpu.sh llama
wait
log "pipeline done"
