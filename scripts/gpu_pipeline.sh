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
#      runs at 8k (where the hook's fixed cost per op goes); then the short-prompt rule's TUNING
#      split (NIAH 2k/4k/8k and the pass-key copy probe, both models), which ends the first
#      pipeline with a pick table;
#   3. PIPE_PHASE=verdict PIPE_PICK=... PIPE_RESUME=1 (a second pipeline): the TEST split of the
#      pick beside the preset and FlexPrefill, then alone on the GPU the hook's timing, `crisp
#      bench` at 128k/512k, llama-bench of both small models and of the 8B-shaped model.
#   PIPE_PHASE=check: the GPU tests beside the short-prompt floor's tuning split (and the test
#      split of a pick that met the bar), then the planner at Gemma 3's shape, Gemma 3 in llama.cpp
#      on each kernel and against llama.cpp's flash attention, bench/compare.py, the 8B-shaped
#      model's chunked prefill at 64k.
#   PIPE_PHASE=hostdiag: the GPU tests and test-ggml-crisp, then paged against contiguous K/V
#      (`crisp bench --page-sizes`), then the 8B-shaped model: fa and crisp alternated three times
#      at 32k, 64k and 128k, summarised in llama8b_rounds.md (no models to carry; PIPE_HOSTDIAG_FULL=1 adds
#      the hook's host timing and every attention node timed at 64k).
#   PIPE_PHASE=diag: Gemma 3's 16k / 32k test split beside the GPU tests, then the planner's
#      kernel profile (128k x 32 heads; Gemma 3's shape), the crossover, the hook's timing and
#      `crisp bench` 128k / 512k.
#   PIPE_PHASE=fine: short prompts at finer blocks (Config fine_blocks_below, session 22): the
#      TUNING split of its candidates (NIAH 2k/4k/8k and the pass-key probe, both models) beside
#      the GPU tests and the hook's checks, the pick (issue 14's bar on every run), the TEST split of
#      a pick that met it, then `crisp bench` of the pick at short lengths. No 8B-shaped GGUF.
#   PIPE_PHASE=mask: the plan at 128k, then the 8B-shaped model with the patch's fast causal KQ mask
#      (A/B against llama.cpp's loop at 128k, fa and crisp alternated at 32k / 128k), then both small
#      models' CUDA checks and llama-bench of fa and crisp (session 23).
#   PIPE_PHASE=llama: llama.cpp against crisp as session 24 ran it (PIPE_BIN, PIPE_GPU_TESTS=0 for
#      a llama.cpp-only change): test-ggml-crisp, both models' CUDA checks (mask verification and
#      the causal notes checked), the hook's GPU stages on Gemma 3 at 32k, fa and crisp alternated
#      five times on both models at 8k-32k, Gemma 3 at 32k with and without the causal note, every
#      policy once with the attention nodes timed, then the 8B-shaped model's rounds at 32k / 128k.
#   PIPE_PHASE=window: Gemma 3's sliding-window layers through crisp's window (session 25): the
#      GPU tests (PIPE_BIN, CRISP_GPU_BIN), test-ggml-crisp on CUDA with and without the note check,
#      Gemma 3's CUDA llama.cpp test, its hook's GPU stages at 32k, fa and crisp alternated five
#      times at 8k-32k, every policy once with the attention nodes timed. Gemma 3 only.
#   PIPE_PHASE=density: the 8B-shaped model's attention nodes at 64k for fa, dense, crisp and top-k at
#      three budgets (attention time against density where the fixed cost per op is small).
#   PIPE_PHASE=outputs (session 27): test-ggml-crisp on CUDA (notes checked too); once crisp's
#      binaries are carried (CRISP_GPU_BIN), chunked and paged prefill at 128k (issue 16); once
#      Gemma 3 is carried, the lost-answer samples of the CUDA window path with every op's output
#      compared with llama.cpp's kernel and with an exact attention (CRISP_HOOK_CHECK_OUTPUT, each
#      CRISP_HOOK_CHECK_KEEP), Gemma 3's CUDA test and its NIAH test split at 2k-32k.
#   PIPE_PHASE=bench: steps 1-2's build and checks, then the kernels'
#      crossover on small calls, step 3's benchmarks with the preset, and Gemma 3's 16k / 32k
#      test split with the preset.
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
# Waits for both models (they arrive in later device calls); exits when the deadline comes first.
wait_for_models() {
  while [ ! -f "$GEMMA" ] || [ ! -f "$SMOL" ]; do
    [ $(( DEADLINE - ($(date +%s) - START) )) -lt 60 ] && { log "models never arrived"; exit 1; }
    sleep 5
  done
}
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
# are there; every eval resumes its JSON. PIPE_BIN=DIR: llama.cpp's CUDA binaries built elsewhere
# (scripts/llama_cpp.sh --cuda --pack DIR): no llama.cpp build here, and the crisp GPU tests run in
# the background beside the evaluations.
GGUF_8B=/tmp/crisp-llama3.1-8b-q4_0.gguf
BIN=${PIPE_BIN:-.deps/llama.cpp-build-cuda/bin}
# The outputs phase runs no GPU tests unless asked (its kernels did not change).
[ "${PIPE_PHASE:-tune}" = outputs ] && PIPE_GPU_TESTS=${PIPE_GPU_TESTS:-0}
if [ "${PIPE_RESUME:-0}" != 1 ]; then
# 1: the build, the crisp GPU tests and the 8B-shaped GGUF side by side.
[ "${PIPE_PHASE:-tune}" = fine ] || [ "${PIPE_PHASE:-tune}" = window ] || [ "${PIPE_PHASE:-tune}" = outputs ] || ( nice -n 5 timeout 900 python3 scripts/make_llama_gguf.py --shape llama3.1-8b \
    --out "$GGUF_8B" > "$PIPE/gguf_8b.log" 2>&1
  log "8B-shaped GGUF rc=$?" ) &
if [ -n "${PIPE_BIN:-}" ]; then
  log "llama.cpp binaries from $PIPE_BIN"
  [ "${PIPE_GPU_TESTS:-1}" = 0 ] || ( step gpu_tests 720 env OUT="$PIPE/gpu_tests" CRISP_GPU_DEADLINE_S=720 scripts/gpu.sh tests ) &
else
  ( JOBS=12 scripts/llama_cpp.sh --cuda > "$PIPE/llama_build.out" 2> "$PIPE/llama_build.log"
    echo $? > "$PIPE/llama_build.rc" ) &
  LLAMA_BUILD=$!
  log "llama.cpp build started"
  [ "${PIPE_GPU_TESTS:-1}" = 0 ] || step gpu_tests 720 env OUT="$PIPE/gpu_tests" CRISP_GPU_DEADLINE_S=720 scripts/gpu.sh tests
  wait "$LLAMA_BUILD"
  log "llama.cpp build rc=$(cat "$PIPE/llama_build.rc" 2>/dev/null)"
fi
fi

hook_timing() {  # hook_timing NAME MODEL POLICY [ENV...]
  local name=$1 model=$2 policy=$3
  shift 3
  step "hook_timing_$name" 120 env CRISP_HOOK_TIMING=1 "$@" "$BIN/llama-bench" -m "$model" -p 8192 -n 0 -fa 1 -b 8192 \
    -ub 8192 -ngl 99 -r 1 --sparse-prefill "$policy"
}

bench_8b() {  # bench_8b STEP TIMEOUT_S N fa|crisp [ENV...]: one llama-bench run, ubatches of 2048
  local name=$1 limit=$2 n=$3 policy=()
  [ "$4" = fa ] || policy=(--sparse-prefill crisp)
  shift 4
  step "$name" "$limit" env "$@" "$BIN/llama-bench" -m "$GGUF_8B" -p "$n" -n 0 -fa 1 -b "$n" -ub 2048 -ngl 99 \
    -r 1 --no-warmup "${policy[@]}"
}

# PIPE_PHASE=hostdiag (no small models needed): whether the 8B-shaped model's prefill through crisp
# is ever slower than llama.cpp's flash attention end to end (docs/llama_cpp.md, "Known problems
# on CUDA", item 7). After the GPU tests and paged K/V's bench: fa and crisp alternated three
# times per length (a machine's runs drift, so a run is compared with its neighbour); with
# PIPE_HOSTDIAG_FULL=1 also a crisp run with the hook's and the planner's host timing (no
# synchronisations added) and every attention node timed on its own for both.
if [ "${PIPE_PHASE:-tune}" = hostdiag ]; then
  step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda  # the hook, beside the GPU tests
  wait  # the GPU tests and the 8B-shaped GGUF
  log "GPU tests and the GGUF done"
  # Paged K/V against contiguous (issue 16), alone on the GPU: the ratio of each page size to
  # contiguous within one run is the figure (bench/RESULTS.md, session 12: pages of 16 1.49x).
  step crisp_cli_build 300 cmake --build build-gpu --target crisp_cli -j"$(nproc)"
  step paged_bench 240 build-gpu/crisp bench --seq 131072 --presets dense,crisp --kernels auto --reps 3 \
    --warmup 1 --chunks 16384 --page-sizes 16,32,128 --json "$PIPE/paged_bench.json"
  # PIPE_HOSTDIAG_FULL=1: the host timing and every attention node timed (session 15's diagnosis).
  if [ "${PIPE_HOSTDIAG_FULL:-0}" = 1 ]; then
    bench_8b llama8b_64k_crisp_host 120 65536 crisp CRISP_HOOK_TIMING=host CRISP_PLAN_TIMING=host
    for policy in fa crisp; do
      flag=(); [ $policy = crisp ] && flag=(--sparse-prefill crisp)
      step "attn_time_8b_64k_$policy" 150 "$BIN/llama-attn-time" -m "$GGUF_8B" --tokens 65536 --reps 1 -fa -ngl 99 \
        -b 65536 -ub 2048 --warmup-tokens 512 "${flag[@]}"
    done
  fi
  # The issue's lengths: fa and crisp alternated three times each (session 15: single runs of one
  # machine spread by up to 30% at 128k), ubatches of 2048, the short warm-up for every length;
  # the hook sets CUDA_SCALE_LAUNCH_QUEUES=4x for both. llama8b_rounds.md holds the summary.
  step llama8b_rounds 900 python3 scripts/llama_bench.py --bin "$BIN" --model "llama3.1-8b-shape=$GGUF_8B" \
    --lengths 32768,65536,131072 --policies fa,crisp --reps 1 --rounds 3 --max-ubatch 2048 --full-warmup-max 1 \
    --no-attn-time --json "$PIPE/llama8b_rounds.json" --md "$PIPE/llama8b_rounds.md"
  log "pipeline done (hostdiag)"
  exit 0
fi

# PIPE_PHASE=window (session 25): Gemma 3's sliding-window layers through crisp's window (docs/
# algorithm.md §12, docs/llama_cpp.md "The KQ mask"). Needs only Gemma 3 in /tmp/modelstore. The
# hook's tests on CUDA (its notes checked too), then, once the GPU tests are done, the window's
# kernels alone (portable against Hopper), Gemma 3's CUDA llama.cpp test, the hook's GPU stages at
# 32k, fa and crisp alternated five times at 8k-32k, and every policy once with the attention nodes
# timed.
if [ "${PIPE_PHASE:-tune}" = window ]; then
  step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
  step test_ggml_crisp_cuda_note_check 120 env CRISP_HOOK_MASK_NOTE=check "$BIN/test-ggml-crisp" cuda
  GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
  SMOL=$GEMMA  # wait_for_models waits for both names
  wait_for_models
  wait  # the GPU tests: nothing else on the GPU while llama.cpp is timed
  log "GPU tests done"
  # The window's kernels alone (session 26): the dense preset's band on the portable and the Hopper
  # kernel, at Gemma 3's local-layer shape and at an 8B shape with a 4096-token window.
  step window_kernels_gemma 120 "${CRISP_GPU_BIN:-build}/crisp" bench --seq 8192,32768 --heads 4 --kv-heads 1 \
    --dim 256 --block 128 --presets dense:window=512 --kernels portable,hopper --reps 20 --warmup 3 \
    --json "$PIPE/window_kernels_gemma.json"
  step window_kernels_8b 180 "${CRISP_GPU_BIN:-build}/crisp" bench --seq 32768,131072 --heads 32 --kv-heads 8 \
    --dim 128 --block 128 --presets dense:window=4096 --kernels portable,hopper --reps 10 --warmup 2 \
    --json "$PIPE/window_kernels_8b.json"
  step llama_gemma 300 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
  step hook_gpu_gemma_32k 120 env CRISP_HOOK_TIMING=gpu "$BIN/llama-bench" -m "$GEMMA" -p 32768 -n 0 -fa 1 \
    -b 32768 -ub 8192 -ngl 99 -r 3 --sparse-prefill crisp
  step gemma_rounds 480 python3 scripts/llama_bench.py --bin "$BIN" --model "gemma3=$GEMMA" \
    --lengths 8192,16384,32768 --policies fa,crisp --reps 3 --rounds 5 --no-attn-time \
    --json "$PIPE/gemma_rounds.json" --md "$PIPE/gemma_rounds.md"
  step gemma_all 300 python3 scripts/llama_bench.py --bin "$BIN" --model "gemma3=$GEMMA" \
    --lengths 8192,16384,32768 --reps 2 --json "$PIPE/gemma_all.json" --md "$PIPE/gemma_all.md"
  log "pipeline done (window)"
  exit 0
fi

# PIPE_PHASE=outputs (session 27): see the list at the top. Needs PIPE_BIN; no GPU tests (the
# kernels did not change since they last passed), no 8B-shaped GGUF. Its steps take up to about
# 45 minutes (the exact attention's runs and the 32k split are the long ones): give it
# PIPE_DEADLINE_S=1700 and expect to resume the NIAH JSON on a second machine.
if [ "${PIPE_PHASE:-tune}" = outputs ]; then
  step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
  step test_ggml_crisp_cuda_note_check 120 env CRISP_HOOK_MASK_NOTE=check "$BIN/test-ggml-crisp" cuda
  # Issue 16: 128k prefilled in chunks of 4k-32k against one shot, contiguous and pages of 16, when
  # crisp's binaries (CRISP_GPU_BIN) arrive before the model (they are carried first).
  until [ -x "${CRISP_GPU_BIN:?PIPE_PHASE=outputs needs CRISP_GPU_BIN}/crisp" ] || [ -f "$MODELS/gemma-3-270m-q4_k_m.gguf" ]; do
    [ $(( DEADLINE - ($(date +%s) - START) )) -lt 60 ] && { log "neither crisp's binaries nor the model arrived"; exit 1; }
    sleep 5
  done
  [ -x "$CRISP_GPU_BIN/crisp" ] && step chunks_128k 300 "$CRISP_GPU_BIN/crisp" bench --seq 131072 --presets dense,crisp \
    --kernels hopper --reps 5 --warmup 1 --chunks 4096,8192,16384,32768 --page-sizes 16 --json "$PIPE/chunks_128k.json"
  GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
  SMOL=$GEMMA  # wait_for_models waits for both names
  wait_for_models
  # The three samples session 26 saw lost in ubatches of 512 (docs/llama_cpp.md, "Gemma 3"): every
  # op against llama.cpp's kernel, then which output the answers follow, then the exact attention.
  for keep in crisp llama llama_f16; do
    step "outputs_gemma_ub512_keep_$keep" 240 env CRISP_HOOK_CUDA_WINDOW=1 CRISP_HOOK_CHECK_OUTPUT=1 \
      CRISP_HOOK_CHECK_KEEP=$keep "$BIN/crisp-llama-eval" niah --model "$GEMMA" --ngl 99 --seed 2001 --seeds 3 \
      --depths 0.15 --tasks passkey --lengths 8192 --policies llama_fa --json "$PIPE/outputs_gemma_ub512_$keep.json"
  done
  for keep in crisp exact; do
    step "outputs_gemma_ub512_exact_keep_$keep" 300 env CRISP_HOOK_CUDA_WINDOW=1 CRISP_HOOK_CHECK_OUTPUT=exact \
      CRISP_HOOK_CHECK_KEEP=$keep "$BIN/crisp-llama-eval" niah --model "$GEMMA" --ngl 99 --seed 2001 --seeds 3 \
      --depths 0.15 --tasks passkey --lengths 8192 --policies llama_fa --json "$PIPE/outputs_gemma_ub512_exact_$keep.json"
  done
  step llama_gemma 300 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
  # Issue 14: the test split at 2k-32k, the windowed layers on llama.cpp's kernel (the default).
  step gemma_test_split 560 "$BIN/crisp-llama-eval" niah --model "$GEMMA" --ngl 99 --split test \
    --lengths 2048,4096,8192,16384,32768 --tasks passkey,niah_single --policies llama_fa crisp flexprefill --quiet \
    --json "$PIPE/gemma3_test.json"
  log "pipeline done (outputs)"
  exit 0
fi

# PIPE_PHASE=density (session 25): whether crisp's attention time inside llama.cpp falls as 1/density
# where the fixed cost per op is small: the 8B-shaped model at 64k (32 heads, ubatches of 2048),
# every attention node timed (llama-attn-time) for fa, dense, crisp and MInference-style top-k at
# three budgets (densities from about 0.1 to 0.8 on random weights, whose other policies keep
# nearly every block). Run with PIPE_GPU_TESTS=0 (nothing to test) and no models to carry.
if [ "${PIPE_PHASE:-tune}" = density ]; then
  wait  # the 8B-shaped GGUF
  log "8B-shaped GGUF there"
  for spec in fa dense crisp minference minference:vertical_tokens=4000,slash_tokens=24000 \
      minference:vertical_tokens=250,slash_tokens=1000; do
    policy=${spec%%:*} name=${spec//[:=,]/_} flags=()
    [ "$policy" = fa ] || flags=(--sparse-prefill "$policy")
    if [ "$spec" != "$policy" ]; then
      IFS=, read -ra settings <<< "${spec#*:}"
      for setting in "${settings[@]}"; do flags+=(--sparse-prefill-set "$setting"); done
    fi
    step "attn_8b_64k_$name" 150 "$BIN/llama-attn-time" -m "$GGUF_8B" --tokens 65536 --reps 1 -fa -ngl 99 \
      -b 65536 -ub 2048 --warmup-tokens 512 "${flags[@]}" --json "$PIPE/attn_8b_64k_$name.json"
  done
  log "pipeline done (density)"
  exit 0
fi

# PIPE_PHASE=llama (session 24): see the list at the top. The 8B-shaped GGUF is written beside the
# small models' steps and used last.
if [ "${PIPE_PHASE:-tune}" = llama ]; then
  step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
  SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
  GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
  wait_for_models
  step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
  step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
  step hook_gpu_gemma_32k 120 env CRISP_HOOK_TIMING=gpu "$BIN/llama-bench" -m "$GEMMA" -p 32768 -n 0 -fa 1 \
    -b 32768 -ub 8192 -ngl 99 -r 3 --sparse-prefill crisp
  step llama_small_rounds 420 python3 scripts/llama_bench.py --bin "$BIN" --model "gemma3=$GEMMA" \
    --model "smollm2=$SMOL" --lengths 8192,16384,32768 --policies fa,crisp --reps 3 --rounds 5 --no-attn-time \
    --json "$PIPE/llama_small_rounds.json" --md "$PIPE/llama_small_rounds.md"
  for round in 1 2 3; do  # the causal note's A/B (docs/llama_cpp.md, "The KQ mask")
    for variant in fa crisp crisp_no_note; do
      args=(); [ "$variant" = fa ] || args=(--sparse-prefill crisp)
      note=1; [ "$variant" = crisp_no_note ] && note=0
      step "note_ab_${variant}_$round" 60 env CRISP_HOOK_MASK_NOTE=$note "$BIN/llama-bench" -m "$GEMMA" -p 32768 \
        -n 0 -fa 1 -b 32768 -ub 8192 -ngl 99 -r 3 "${args[@]}"
    done
  done
  step llama_small_all 420 python3 scripts/llama_bench.py --bin "$BIN" --model "gemma3=$GEMMA" \
    --model "smollm2=$SMOL" --lengths 8192,16384,32768 --reps 2 \
    --json "$PIPE/llama_small_all.json" --md "$PIPE/llama_small_all.md"
  wait  # the 8B-shaped GGUF
  step llama8b_rounds 600 python3 scripts/llama_bench.py --bin "$BIN" --model "llama3.1-8b-shape=$GGUF_8B" \
    --lengths 32768,131072 --policies fa,crisp --reps 1 --rounds 3 --max-ubatch 2048 --full-warmup-max 1 \
    --no-attn-time --json "$PIPE/llama8b_rounds.json" --md "$PIPE/llama8b_rounds.md"
  log "pipeline done (llama)"
  exit 0
fi

# PIPE_PHASE=mask (session 23; CRISP_GPU_BIN: crisp's prebuilt binaries, PIPE_BIN: llama.cpp's):
# the 8B-shaped model's prefill once llama.cpp fills its causal KQ mask by the patch's fast path
# (docs/llama_cpp.md, "Known problems on CUDA", item 7): first the plan at 128k x 32 heads (issue 14)
# while the GGUF is written, then at 128k each policy once with llama.cpp's own cell-by-cell loop
# (LLAMA_KQ_MASK_LOOP=1) for the A/B on this machine, then fa and crisp alternated three times at
# 32k and 128k; then, with the small models carried, both models' CUDA checks (the fast mask
# verified cell by cell) and llama-bench of fa and crisp at 8k-32k (attention nodes timed).
if [ "${PIPE_PHASE:-tune}" = mask ]; then
  step plan_128k 120 "${CRISP_GPU_BIN:?PIPE_PHASE=mask needs CRISP_GPU_BIN}/crisp" bench --seq 131072 --presets crisp \
    --kernels hopper --densities 0.1 --reps 30 --warmup 2 --json "$PIPE/plan_128k.json"
  step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
  wait  # the 8B-shaped GGUF
  log "the GGUF done"
  bench_8b llama8b_128k_fa_loop 150 131072 fa LLAMA_KQ_MASK_LOOP=1
  bench_8b llama8b_128k_crisp_loop 150 131072 crisp LLAMA_KQ_MASK_LOOP=1
  step llama8b_rounds 600 python3 scripts/llama_bench.py --bin "$BIN" --model "llama3.1-8b-shape=$GGUF_8B" \
    --lengths 32768,131072 --policies fa,crisp --reps 1 --rounds 3 --max-ubatch 2048 --full-warmup-max 1 \
    --no-attn-time --json "$PIPE/llama8b_rounds.json" --md "$PIPE/llama8b_rounds.md"
  SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
  GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
  wait_for_models
  step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
  step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
  step llama_bench_small 360 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=360 CRISP_GPU_LLAMA_BIN="$BIN" \
    CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="smollm2=$SMOL,gemma3=$GEMMA" CRISP_GPU_LLAMA_LENGTHS=8192,16384,32768 \
    CRISP_GPU_LLAMA_REPS=2 CRISP_GPU_LLAMA_POLICIES=fa,crisp scripts/gpu.sh llama
  log "pipeline done (mask)"
  exit 0
fi

# 2: the models.
SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=$MODELS/gemma-3-270m-q4_k_m.gguf
wait_for_models
log "models present"
if [ "${PIPE_RESUME:-0}" != 1 ] && [ "${PIPE_PHASE:-tune}" = fine ]; then
  # Beside the evaluations: the hook's own test and both models' checks (the hook's block size
  # now follows Config::for_keys).
  ( step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
    step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
    step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA" ) &
elif [ "${PIPE_RESUME:-0}" != 1 ]; then
step test_ggml_crisp_cuda 120 "$BIN/test-ggml-crisp" cuda
# docs/llama_cpp.md item 6: the variants that narrowed the session-10 fault (not reproduced in
# session 11) when PIPE_ITEM6=1.
if [ "${PIPE_ITEM6:-0}" = 1 ]; then
  step item6_graphs_off 120 env GGML_CUDA_DISABLE_GRAPHS=1 "$BIN/test-ggml-crisp" cuda
  step item6_portable_kernel 120 env CRISP_KERNEL=portable "$BIN/test-ggml-crisp" cuda
  step item6_no_verdict_cache 120 env CRISP_HOOK_VERDICT_CACHE=0 "$BIN/test-ggml-crisp" cuda
  step item6_launch_blocking 120 env CUDA_LAUNCH_BLOCKING=1 "$BIN/test-ggml-crisp" cuda
fi
step llama_smollm2 240 tests/llama_cpp/test_llama_cpp.sh --cuda "$BIN" "$SMOL"
step llama_gemma 240 tests/llama_cpp/test_llama_cpp_gemma.sh --cuda "$BIN" "$GEMMA"
# Where the hook's fixed cost per op goes (bench/RESULTS.md "Session 10"): CRISP_HOOK_TIMING=1
# prints each stage's totals at exit.
if [ "${PIPE_PHASE:-tune}" = tune ]; then  # the bench phase times the hook later, alone on the machine
  hook_timing smollm2_dense "$SMOL" dense
  hook_timing smollm2_crisp "$SMOL" crisp
  hook_timing gemma_crisp "$GEMMA" crisp
fi
fi

# 2: the short-prompt rule (issue 14, docs/evaluation.md "Short prompts"): PIPE_PHASE=tune (the
# default) runs the TUNING split of the candidates; PIPE_PHASE=verdict (a second pipeline on the
# same warm machine, PIPE_RESUME=1) runs the TEST split of the pick (PIPE_PICK, e.g.
# "crisp:uniform_floor_blocks=64") beside the preset and FlexPrefill, then the benchmarks.
# Candidates (session 11, second machine): `proxy_last_rows` (the last proxy rows scored on their
# own too; both planners since session 11) at 8, 16 and 32, and 16 with `uniform_floor_blocks=32`.
# The session's first machine ran `uniform_floor_blocks` 64 / 128 and dense_below on this split:
# they fixed the probe but cost 0.68-1.1x FlexPrefill's density on NIAH (docs/evaluation.md).
CANDIDATES=${PIPE_CANDIDATES:-"crisp:proxy_last_rows=8,crisp:proxy_last_rows=16,crisp:proxy_last_rows=32,crisp:proxy_last_rows=16;uniform_floor_blocks=32"}
PHASE=${PIPE_PHASE:-tune}
eval_pids=()
niah_run() {  # niah_run NAME TIMEOUT MODEL LENGTHS SPLIT POLICIES: resumed from its JSON
  local name=$1 limit=$2 model=$3 lengths=$4 split=$5 policies=$6
  if grep -qs '"complete": *true' "$PIPE/$name.json"; then log "$name: complete before"; return; fi
  ( timeout "$(left "$limit")" "$BIN/crisp-llama-eval" niah --model "$model" --ngl 99 --lengths "$lengths" \
      --tasks passkey,niah_single --split "$split" --policies "$policies" --json "$PIPE/$name.json" --quiet \
      > "$PIPE/$name.log" 2>&1
    log "$name rc=$?" ) &
  eval_pids+=($!)
}
probe_run() {  # probe_run NAME MODEL SPLIT POINTS
  local name=$1 model=$2 split=$3 points=$4
  ( timeout "$(left 500)" python3 scripts/passkey_copy_probe.py --bin "$BIN" --model "$model" --ngl 99 --split "$split" \
      --points "$points" --json "$PIPE/$name.json" > "$PIPE/$name.out" 2> "$PIPE/$name.log"
    log "$name rc=$?" ) &
  eval_pids+=($!)
}
# The portable / Hopper crossover of Kernel::automatic on small calls (SmolLM2's and Gemma 3's
# shapes in llama.cpp, and 32 heads), with the planner's stage times: alone on the GPU, at the end
# of the tuning phase (while the pick is made).
bench_small() {  # bench_small NAME SEQS "HEAD ARGS"
  step "crossover_$1" 120 env CRISP_PLAN_TIMING=1 OUT="$PIPE/crossover_$1" CRISP_GPU_DEADLINE_S=120 CRISP_GPU_BENCH_SEQ="$2" \
    CRISP_GPU_BENCH_PRESETS=dense,crisp CRISP_GPU_BENCH_DENSITIES=0.05,0.2,0.4 CRISP_GPU_BENCH_KERNELS=portable,hopper \
    CRISP_GPU_BENCH_REPS=10 CRISP_GPU_BENCH_ARGS="$3" scripts/gpu.sh bench
}
GEMMA_SHAPE="--heads 4 --kv-heads 1 --dim 256"  # crisp bench's flags for Gemma 3's global layers
crossover_benches() {  # after the GPU tests (background jobs) end
  wait
  bench_small smollm2 4096,8192,16384,32768 "--heads 9 --kv-heads 3 --dim 64"
  bench_small gemma3 8192,16384,32768 "$GEMMA_SHAPE"
  bench_small h32 2048,4096,8192 "--heads 32 --kv-heads 8 --dim 128"
}
plan_gemma() {  # plan_gemma KERNELS [NAME=VALUE...]: the planner's stages at Gemma 3's shape, 8k and 32k
  local kernels=$1
  shift
  step plan_gemma 120 env CRISP_PLAN_TIMING=1 OUT="$PIPE/plan_gemma" CRISP_GPU_DEADLINE_S=120 CRISP_GPU_BENCH_SEQ=8192,32768 \
    CRISP_GPU_BENCH_PRESETS=crisp CRISP_GPU_BENCH_KERNELS="$kernels" CRISP_GPU_BENCH_REPS=20 CRISP_GPU_BENCH_ARGS="$GEMMA_SHAPE" \
    "$@" scripts/gpu.sh bench
}
split_runs() {  # split_runs PREFIX SPLIT NIAH_POLICIES PROBE_POINTS: NIAH 2k-8k and the probe, both models
  niah_run "$1_smollm2" 420 "$SMOL" 2048,4096,8192 "$2" "$3"
  niah_run "$1_gemma" 420 "$GEMMA" 2048,4096,8192 "$2" "$3"
  probe_run "probe_$2_smollm2" "$SMOL" "$2" "$4"
  probe_run "probe_$2_gemma" "$GEMMA" "$2" "$4"
  wait "${eval_pids[@]}"
}
if [ "$PHASE" = tune ]; then
  split_runs tune tuning "crisp,$CANDIDATES,flexprefill" "crisp,$CANDIDATES,flexprefill"
  log "tuning split done"
  python3 scripts/pick_frontier_point.py "$PIPE"/tune_*.json > "$PIPE/pick.txt" 2>&1
  log "pick written"
  crossover_benches
  log "pipeline done (tune)"
  exit 0
fi
if [ "$PHASE" = fine ]; then
  # Session 22: short prompts at finer blocks (docs/algorithm.md, "Short prompts: finer blocks").
  # Candidates fixed before the run: blocks of 64 below 4096 keys (the preset's hold in tokens,
  # 32 x 128) with the hold doubled (the same 4096 tokens) or at 24 x 2 = 48 blocks (3072 tokens;
  # the session-21 CPU screen's sparsest point that kept Gemma 3's answers), and below 3072 keys.
  # The pick (scripts/pick_frontier_point.py --all: issue 14's bar on every NIAH run and probe)
  # reads the TEST split only when a candidate met it everywhere.
  FINE=${PIPE_FINE_CANDIDATES:-"crisp:fine_blocks_below=4096,crisp:fine_blocks_below=4096;uniform_floor_blocks=24,crisp:fine_blocks_below=3072"}
  split_by_length() {  # split_by_length PREFIX SPLIT LENGTHS POLICIES TIMEOUT_S: NIAH and the probe, both models
    local n
    for n in ${3//,/ }; do  # one process per (model, length), side by side: the small models leave the GPU mostly idle
      niah_run "$1_smollm2_$n" "$5" "$SMOL" "$n" "$2" "$4"
      niah_run "$1_gemma_$n" "$5" "$GEMMA" "$n" "$2" "$4"
    done
    probe_run "probe_$2_smollm2" "$SMOL" "$2" "$4"
    probe_run "probe_$2_gemma" "$GEMMA" "$2" "$4"
    wait "${eval_pids[@]}"
    eval_pids=()
  }
  split_by_length fine_tune tuning 2048,4096 "crisp,$FINE,flexprefill" 480
  log "the tuning split done"
  PICK=$(python3 scripts/pick_frontier_point.py "$PIPE"/fine_tune_*.json --probe "$PIPE"/probe_tuning_smollm2.json \
    --probe "$PIPE"/probe_tuning_gemma.json --all 2> "$PIPE/pick.txt")
  log "pick: ${PICK:-error, see pick.txt}"
  if [ -n "$PICK" ] && [ "$PICK" != none ] && [ "$PICK" != crisp ]; then
    # The verdict at 8k too: the rule plans the first ubatches of an 8k prompt (n_k < 4096) as well.
    split_by_length fine_test test 2048,4096,8192 "crisp,$PICK,flexprefill" 600
    log "the pick's test split done"
  fi
  wait  # the GPU tests and the hook's checks
  log "GPU tests and checks done"
  # The rule's speed where it applies: Gemma 3's global layers and 32 heads, 2k and 3k tokens.
  BENCH_FINE=${PICK:-crisp:fine_blocks_below=4096}
  [ "$BENCH_FINE" = none ] || [ "$BENCH_FINE" = crisp ] && BENCH_FINE=crisp:fine_blocks_below=4096
  for shape in gemma3 h32; do
    args=$GEMMA_SHAPE; [ $shape = h32 ] && args="--heads 32 --kv-heads 8 --dim 128"
    step "bench_fine_$shape" 120 env OUT="$PIPE/bench_fine_$shape" CRISP_GPU_DEADLINE_S=120 CRISP_GPU_BENCH_SEQ=2048,3072 \
      CRISP_GPU_BENCH_PRESETS="dense,crisp,${BENCH_FINE//;/:},flexprefill" CRISP_GPU_BENCH_KERNELS=auto \
      CRISP_GPU_BENCH_REPS=20 CRISP_GPU_BENCH_ARGS="$args" scripts/gpu.sh bench
  done
  log "pipeline done (fine)"
  exit 0
fi
if [ "$PHASE" = check ]; then
  # Session 14's machine (bench/RESULTS.md "Session 13" left these open): beside the GPU tests
  # (the first GPU run of session 13's held-floor options and of the tensor-core proxy at d = 256),
  # accuracy only: the TUNING split at 2k of the short-prompt floor's candidates (issue 14: the
  # preset's uniform_floor_blocks = 32 costs Gemma 3 0.87x FlexPrefill's density at 2k;
  # docs/evaluation.md "Gemma 3 at 2k"): the held floor for the last proxy rows' score only, the
  # slash side at the plain 1/N, held at 24 and 32 blocks (session 13's CPU forward: 0.74x / 0.76x
  # FlexPrefill's density at 2k, every answer on the tuning split, one short of FlexPrefill on the
  # test split; docs/rule_research.md), NIAH and the pass-key probe, both models. The pick
  # (scripts/pick_frontier_point.py --all, the rule fixed before: issue 14's bar on every NIAH run
  # and every probe) then reads the TEST split, only if a candidate met the bar everywhere.
  # Then alone on the GPU (issue 17): the planner at Gemma 3's shape (the d = 256 proxy now on
  # tensor cores), the hook's stage timing and llama-bench of Gemma 3 against llama.cpp's flash
  # attention on each kernel, bench/compare.py with the preset (issue 14), the 8B-shaped model's
  # chunked prefill at 64k if time is left.
  FLOORS=${PIPE_FLOORS:-"crisp,crisp:uniform_floor_last_rows=true;uniform_floor_slash_blocks=0;uniform_floor_blocks=24,crisp:uniform_floor_last_rows=true;uniform_floor_slash_blocks=0,flexprefill"}
  # bench/compare.py's crisp package, built beside the evaluations (gpu.sh compare takes the wheel).
  ( CMAKE_BUILD_PARALLEL_LEVEL=8 nice -n 5 timeout "$(left 900)" python3 -m pip wheel --no-build-isolation --no-deps \
      -w "$PIPE/wheel" -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a . > "$PIPE/wheel.log" 2>&1
    log "crisp wheel rc=$?" ) &
  niah_run tune2k_smollm2 420 "$SMOL" 2048 tuning "$FLOORS"
  niah_run tune2k_gemma 420 "$GEMMA" 2048 tuning "$FLOORS"
  probe_run probe_tuning_floors_smollm2 "$SMOL" tuning "$FLOORS"
  probe_run probe_tuning_floors_gemma "$GEMMA" tuning "$FLOORS"
  wait "${eval_pids[@]}"
  eval_pids=()
  log "the floors' tuning split done"
  PICK=$(python3 scripts/pick_frontier_point.py "$PIPE"/tune2k_smollm2.json "$PIPE"/tune2k_gemma.json \
    --probe "$PIPE"/probe_tuning_floors_smollm2.json --probe "$PIPE"/probe_tuning_floors_gemma.json --all \
    2> "$PIPE/pick.txt")
  log "pick: ${PICK:-error, see pick.txt}"
  if [ -n "$PICK" ] && [ "$PICK" != none ] && [ "$PICK" != crisp ]; then
    niah_run test2k_smollm2 420 "$SMOL" 2048 test "crisp,$PICK,flexprefill"
    niah_run test2k_gemma 420 "$GEMMA" 2048 test "crisp,$PICK,flexprefill"
    probe_run probe_test_floors_smollm2 "$SMOL" test "crisp,$PICK,flexprefill"
    probe_run probe_test_floors_gemma "$GEMMA" test "crisp,$PICK,flexprefill"
    wait "${eval_pids[@]}"
    log "the pick's test split done"
  fi
  wait  # the GPU tests
  log "GPU tests done"
  plan_gemma portable,hopper
  hook_timing gemma_crisp "$GEMMA" crisp
  for kernel in portable hopper; do
    step "gemma_${kernel}_8192" 90 env CRISP_KERNEL=$kernel CRISP_HOOK_TIMING=1 "$BIN/llama-bench" -m "$GEMMA" -p 8192 \
      -n 0 -fa 1 -b 8192 -ub 8192 -ngl 99 -r 1 --sparse-prefill crisp
  done
  step llama_bench_gemma 300 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=300 CRISP_GPU_LLAMA_BIN="$BIN" \
    CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="gemma3=$GEMMA" CRISP_GPU_LLAMA_LENGTHS=8192,16384,32768 \
    CRISP_GPU_LLAMA_REPS=2 CRISP_GPU_LLAMA_POLICIES=fa,crisp scripts/gpu.sh llama
  step compare 420 env OUT="$PIPE/compare" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_COMPARE_ARGS="--seq 32768,131072" \
    CRISP_GPU_WHEEL="$(ls "$PIPE"/wheel/*.whl 2>/dev/null | head -n 1)" scripts/gpu.sh compare
  # fa and crisp alternate (the host's share, the KQ mask, swings between runs), then crisp with
  # the hook's stage timing.
  for run in fa_1 crisp_1 fa_2 crisp_2 crisp_timing; do
    policy=(); [ "${run%_*}" = fa ] || policy=(--sparse-prefill crisp)
    timing=0; [ $run = crisp_timing ] && timing=1
    step "llama8b_64k_$run" 150 env CRISP_HOOK_TIMING=$timing "$BIN/llama-bench" -m "$GGUF_8B" -p 65536 -n 0 -fa 1 \
      -b 65536 -ub 2048 -ngl 99 -r 1 --no-warmup "${policy[@]}"
  done
  log "pipeline done (check)"
  exit 0
fi
if [ "$PHASE" = diag ]; then
  # Session 12's first machine: Gemma 3's 16k / 32k test split beside the GPU tests (both
  # correctness only), then alone on the GPU: the planner's kernels (Nsight Compute and
  # CRISP_PLAN_TIMING) at 128k x 32 heads and at Gemma 3's shape, the crossover, the hook's
  # timing, and `crisp bench` at 128k / 512k with the preset.
  niah_run test_gemma_long 480 "$GEMMA" 16384,32768 test "llama_fa,crisp,flexprefill"
  wait
  log "GPU tests and Gemma 3 16k/32k done"
  step plan_128k 150 env CRISP_PLAN_TIMING=1 OUT="$PIPE/plan_128k" CRISP_GPU_DEADLINE_S=150 CRISP_GPU_BENCH_SEQ=131072 \
    CRISP_GPU_BENCH_PRESETS=crisp,flexprefill CRISP_GPU_BENCH_KERNELS=hopper CRISP_GPU_BENCH_REPS=20 \
    CRISP_GPU_PLAN_PROFILE=1 scripts/gpu.sh bench
  plan_gemma portable CRISP_GPU_PLAN_PROFILE=1 CRISP_GPU_PROFILE_SEQ=8192 CRISP_GPU_PROFILE_ARGS="$GEMMA_SHAPE"
  crossover_benches
  hook_timing after_smollm2_crisp "$SMOL" crisp
  hook_timing after_gemma_crisp "$GEMMA" crisp
  step crisp_bench 300 env OUT="$PIPE/crisp_bench" CRISP_GPU_DEADLINE_S=300 CRISP_GPU_BENCH_SEQ=131072,524288 \
    CRISP_GPU_BENCH_PRESETS=dense,crisp,flexprefill CRISP_GPU_BENCH_KERNELS=auto scripts/gpu.sh bench
  log "pipeline done (diag)"
  exit 0
fi
if [ "$PHASE" = bench ]; then
  # What session 11 could not run (device time): the crossover benches first (after the GPU tests),
  # then the benchmarks below with the preset itself; then Gemma 3's 16k / 32k test split.
  crossover_benches
  PICK=crisp
else
  PICK=${PIPE_PICK:?PIPE_PHASE=verdict needs PIPE_PICK}
  split_runs test test "llama_fa,crisp,$PICK,flexprefill,minference" "crisp,$PICK,flexprefill"
  log "test split done"
fi

# 3: benchmarks, alone on the GPU: the hook's timing after session 11's changes, `crisp bench` at
# 128k and 512k with the pick beside the preset (issue 14), llama-bench of both small models and of
# the 8B-shaped model (32k, 128k; issue 17).
BENCH_PICK=${PICK//;/:}  # crisp bench separates a spec's knobs with ':'
BENCH_PRESETS="dense,crisp,flexprefill"
[ "$BENCH_PICK" = crisp ] || BENCH_PRESETS="dense,crisp,$BENCH_PICK,flexprefill"
hook_timing after_smollm2_crisp "$SMOL" crisp
hook_timing after_gemma_crisp "$GEMMA" crisp
step crisp_bench 300 env OUT="$PIPE/crisp_bench" CRISP_GPU_DEADLINE_S=300 CRISP_GPU_BENCH_SEQ=131072,524288 \
  CRISP_GPU_BENCH_PRESETS="$BENCH_PRESETS" CRISP_GPU_BENCH_KERNELS=auto scripts/gpu.sh bench
step llama_bench_small 300 env OUT="$PIPE/llama_bench" CRISP_GPU_DEADLINE_S=300 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=small CRISP_GPU_LLAMA_MODELS="smollm2=$SMOL,gemma3=$GEMMA" CRISP_GPU_LLAMA_LENGTHS=8192,16384,32768 \
  CRISP_GPU_LLAMA_REPS=2 CRISP_GPU_LLAMA_POLICIES=fa,crisp,flexprefill scripts/gpu.sh llama
step llama_bench_8b 420 env OUT="$PIPE/llama_bench_8b" CRISP_GPU_DEADLINE_S=420 CRISP_GPU_LLAMA_BIN="$BIN" \
  CRISP_GPU_LLAMA_PARTS=8b CRISP_GPU_LLAMA_POLICIES=fa,crisp CRISP_GPU_LLAMA_8B_LENGTHS=32768,131072 \
  CRISP_GPU_LLAMA_8B_PATH="$GGUF_8B" scripts/gpu.sh llama
if [ "$PHASE" = bench ]; then
  niah_run test_gemma_long 600 "$GEMMA" 16384,32768 test "llama_fa,crisp,flexprefill,minference"
  wait "${eval_pids[@]}"
fi
wait
log "pipeline done"
