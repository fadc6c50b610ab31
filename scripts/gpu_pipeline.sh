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
#   2. once the models are in /tmp/modelstore: the hook's checks on both models (CUDA graphs left
#      on), then issue 14's real-model sweep: the TUNING split (crisp knob points from
#      PIPE_TUNING_SWEEPS against flexprefill and dense; Gemma 3 and SmolLM2 at 4k and 8k, one
#      process per run, side by side on the GPU), scripts/pick_frontier_point.py's pick, then
#      the TEST split with the pick beside the presets (Gemma 4k/8k/16k, SmolLM2 4k/8k)
#   3. llama-bench of both models (8k/16k/32k, every policy, then the pick) and of the 8B-shaped
#      model; on the CPU beside 2–3 the structured frontier at 512k (test split).
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
[ -x build-gpu/crisp ] || step crisp_cli_build 240 cmake --build build-gpu -j 8 --target crisp_cli
BIN=.deps/llama.cpp-build-cuda/bin

# 2: the models.
SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
while [ ! -f "$GEMMA" ] || [ ! -f "$SMOL" ]; do
  [ $(( DEADLINE - ($(date +%s) - START) )) -lt 60 ] && { log "models never arrived"; exit 1; }
  sleep 5
done
log "models present"
( OMP_NUM_THREADS=4 nice -n 10 timeout "$(left 1200)" build-gpu/crisp eval pareto --structured --split test \
    --lengths 524288 --workload-set background_scale=1.5 --workload-set no_local_head_share=0.5 \
    --sweep crisp "crisp:rho=0.5;uniform_alpha=0.75" "flexprefill:gamma=0.9" --json "$PIPE/structured_test_512k.json" > "$PIPE/structured_512k.log" 2>&1
  log "structured 512k rc=$?" ) &
if [ "${PIPE_RESUME:-0}" != 1 ]; then
step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
fi

# The real-model sweep of issue 14: tuning runs side by side, the pick, then the test split.
# NOTE: the knob points are candidates written before any tuning result was seen: the preset's
# min_budget (tokens every row keeps, which dominates density at 4k) and floor level, the PE
# coverage, and the structured-input candidates of the tuning split (docs/rule_research.md: VS
# routing of heads without local structure, rho 0.5, with a higher uniform floor); more via
# PIPE_EXTRA_SWEEPS.
TUNING_SWEEPS=${PIPE_TUNING_SWEEPS:-"crisp:min_budget=512,256,128;uniform_alpha=0.5,1|crisp:min_budget=256;uniform_alpha=1;pe_gamma=0.9|crisp:rho=0.5;uniform_alpha=0.75;min_budget=512,256|crisp:rho=0.5;uniform_alpha=0.6;min_budget=256"}
[ -n "${PIPE_EXTRA_SWEEPS:-}" ] && TUNING_SWEEPS="$TUNING_SWEEPS|$PIPE_EXTRA_SWEEPS"
IFS='|' read -r -a sweep_list <<< "$TUNING_SWEEPS"
sweep_args=()
for s in "${sweep_list[@]}"; do sweep_args+=(--sweep "$s"); done
eval_run() {  # eval_run NAME TIMEOUT MODE MODEL LENGTH ARGS... (background; its own log)
  local name=$1 limit=$2 mode=$3 model=$4 length=$5
  shift 5
  if grep -qs '"complete": *true' "$PIPE/$name.json"; then log "$name: complete before"; return; fi
  if pgrep -f -- "--json $PIPE/$name.json" > /dev/null; then  # an earlier pipeline's run: wait for it
    log "$name: still running from before"
    ( while pgrep -f -- "--json $PIPE/$name.json" > /dev/null; do sleep 3; done ) &
    eval_pids+=($!)
    return
  fi
  ( timeout "$(left "$limit")" "$BIN/crisp-llama-eval" "$mode" --model "$model" --ngl 99 --lengths "$length" \
      --tasks passkey,niah_single --json "$PIPE/$name.json" --quiet "$@" > "$PIPE/$name.log" 2>&1
    log "$name rc=$?" ) &
  eval_pids+=($!)
}
eval_pids=()
log "tuning split: ${sweep_list[*]}"
eval_run tuning_gemma_4096 300 pareto "$GEMMA" 4096 --split tuning --policies flexprefill "${sweep_args[@]}"
eval_run tuning_gemma_8192 420 pareto "$GEMMA" 8192 --split tuning --policies flexprefill "${sweep_args[@]}"
eval_run tuning_smollm2_4096 300 pareto "$SMOL" 4096 --split tuning --policies flexprefill "${sweep_args[@]}"
eval_run tuning_smollm2_8192 420 pareto "$SMOL" 8192 --split tuning --policies flexprefill "${sweep_args[@]}"
wait "${eval_pids[@]}"
eval_pids=()
python3 scripts/pick_frontier_point.py "$PIPE"/tuning_*.json > "$PIPE/pick.txt" 2> "$PIPE/pick.log"
PICK=$(cat "$PIPE/pick.txt")
log "pick: ${PICK:-none} ($(tail -1 "$PIPE/pick.log"))"
test_policies="llama_fa,crisp,flexprefill,minference${PICK:+,$PICK}"
for L in 4096 8192 16384; do
  eval_run "test_gemma_$L" 360 niah "$GEMMA" "$L" --split test --policies "$test_policies"
done
for L in 4096 8192; do
  eval_run "test_smollm2_$L" 360 niah "$SMOL" "$L" --split test --policies "$test_policies"
done
wait "${eval_pids[@]}"
log "test split done"

# 3: llama-bench (alone on the GPU).
step llama_bench_small 360 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=360 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="smollm2=$SMOL,gemma3=$GEMMA" scripts/gpu.sh llama
if [ -n "$PICK" ] && [ "$PICK" != crisp ]; then
  pick_sets=()
  IFS=';' read -r -a kvs <<< "${PICK#crisp:}"
  for kv in "${kvs[@]}"; do pick_sets+=(--sparse-prefill-set "$kv"); done
  step llama_bench_pick 180 python3 scripts/llama_bench.py --bin "$BIN" --model smollm2="$SMOL" --model gemma3="$GEMMA" \
    --lengths 8192,16384,32768 --policies crisp "${pick_sets[@]}" --json "$PIPE/llama_bench_pick.json" --md "$PIPE/llama_bench_pick.md"
fi
step llama_bench_8b 420 env OUT="$PIPE/llama_bench_8b" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=8b CRISP_GPU_LLAMA_8B_LENGTHS=32768,131072 CRISP_GPU_LLAMA_8B_PATH="$GGUF_8B" scripts/gpu.sh llama
wait
log "pipeline done"
