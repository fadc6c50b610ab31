#!/usr/bin/env bash
# tests/llama_cpp/test_llama_cpp_gemma.sh — crisp inside llama.cpp on Gemma 3 270M (base), the
# model with head dim 256, 4 query heads on 1 KV head, and sliding-window (512) layers between
# every sixth, global one (docs/llama_cpp.md):
#   1. --sparse-prefill dense gives the same greedy continuation as llama.cpp's own flash
#      attention on a needle-in-a-haystack prompt of about 2.5k tokens; crisp computed every
#      layer's attention, the sliding-window layers' through crisp's window (their masks noted by
#      the patch), none left to llama.cpp; the same in ubatches of 1024, where the sliding-window
#      cache (1536 cells) wraps around as a ring; the patch's fast KQ masks (causal, and windowed)
#      and their notes checked cell by cell;
#   2. --sparse-prefill crisp runs through crisp; its continuation is printed (not checked: a
#      sparse policy may change the answer of a 270M base model).
# Usage: tests/llama_cpp/test_llama_cpp_gemma.sh [--cuda] [BIN_DIR [MODEL]]
#   --cuda: on the CUDA backend (every layer offloaded, -ngl 99; crisp's CUDA hook computes the
#   global layers, its log line ends "(CUDA)"); BIN_DIR then defaults to .deps/llama.cpp-build-cuda/bin.
#   BIN_DIR: llama.cpp's binaries (default .deps/llama.cpp-build/bin); MODEL: the GGUF (default:
#   `scripts/fetch_model.sh gemma3`'s cached file, which CI does not fetch).
# Exits 77 (CTest's skip) when the llama.cpp build or the model is absent.
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
offload=()
computes_suffix=""
default_bin="$repo_root/.deps/llama.cpp-build/bin"
if [ "${1:-}" = "--cuda" ]; then
  shift
  offload=(-ngl 99)
  computes_suffix=" (CUDA)"
  default_bin="$repo_root/.deps/llama.cpp-build-cuda/bin"
fi
bin="${1:-$default_bin}"
model="${2:-${CRISP_MODEL_DIR:-$repo_root/.cache/model}/gemma-3-270m-q4_k_m.gguf}"
cli="$bin/llama-cli"
[ -x "$cli" ] || { echo "skip: no llama.cpp build in $bin (run scripts/llama_cpp.sh)"; exit 77; }
[ -f "$model" ] || { echo "skip: no model at $model (run scripts/fetch_model.sh gemma3)"; exit 77; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A completion-style needle in a haystack (a base model: no chat template). NOTE: 100 haystack
# lines of ~25 tokens make ~2.5k tokens, well past the 512-token window; the needle sits in the
# middle, so only attention across the window finds it.
haystack_line="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
prompt=""
for i in $(seq 1 100); do
  [ "$i" -eq 50 ] && prompt+="The special magic number is 48213. Remember it."$'\n'
  prompt+="$haystack_line"$'\n'
done
prompt+="The special magic number is"

# Greedy; the whole prompt in one ubatch.
. "$(dirname "${BASH_SOURCE[0]}")/kq_mask_checks.sh"  # check_kq_masks
run_cli() {  # run_cli NAME ARGS... -> $work/NAME.out (stdout), $work/NAME.err (stderr), returns rc
  local name="$1"; shift
  "$cli" -m "$model" -no-cnv -p "$prompt" -n 8 --temp 0 --seed 1 -c 4096 -b 4096 -ub 4096 -t 2 \
    --no-warmup "${offload[@]}" "$@" < /dev/null > "$work/$name.out" 2> "$work/$name.err"
}
continuation() { tail -c 60 "$work/$1.out" | tr '\n' ' '; }

# 1. dense through crisp == llama.cpp's flash attention; global layers crisp's, windowed ones not
run_cli fa -fa || fail "llama-cli -fa exited $?: $(tail -n 3 "$work/fa.err")"
run_cli dense --sparse-prefill dense || fail "llama-cli --sparse-prefill dense exited $?: $(tail -n 3 "$work/dense.err")"
grep -q "crisp: sparse prefill 'dense' computes.*$computes_suffix" "$work/dense.err" || fail "dense: crisp computed no layer's attention"
# The sliding-window layers too: crisp's window over the cells the patch's note names (on the CPU;
# on CUDA they are opt-in, CRISP_HOOK_CUDA_WINDOW=1, and fall back by name otherwise: docs/llama_cpp.md).
falls_back_other() {  # falls_back_other ERR_FILE: a fallback other than CUDA's opt-in window
  grep "crisp: sparse prefill falls back" "$1" | grep -v "a sliding-window layer (crisp's CUDA window path is opt-in" | head -n 1
}
if [ -n "$(falls_back_other "$work/dense.err")" ]; then
  fail "dense: some layer fell back to llama.cpp: $(falls_back_other "$work/dense.err")"
fi
if [ -z "$computes_suffix" ] && grep -q "crisp: sparse prefill falls back" "$work/dense.err"; then
  fail "dense (CPU): a sliding-window layer fell back: $(grep -m1 "falls back" "$work/dense.err")"
fi
[ -s "$work/fa.out" ] || fail "llama-cli -fa printed nothing"
if ! cmp -s "$work/fa.out" "$work/dense.out"; then
  fail "dense output differs from llama.cpp's flash attention"
  diff "$work/fa.out" "$work/dense.out" | tail -n 4
fi
grep "crisp:" "$work/dense.err" | sed 's/^/  hook (dense): /'

# 1b. the patch's KQ masks (the global layers' causal one and the sliding-window layers' windowed
#     one, and the causal notes) checked in ubatches of 1024 over the cache (kq_mask_checks.sh)
run_cli fa_ub1024 -fa -ub 1024 || fail "llama-cli -fa -ub 1024 exited $?: $(tail -n 3 "$work/fa_ub1024.err")"
check_kq_masks 1024 fa_ub1024
#     dense through crisp in ubatches of 1024: the third ubatch's sliding-window cells wrap around
#     the ring; the continuation is llama.cpp's, no layer falls back
run_cli dense_ub1024 --sparse-prefill dense -ub 1024 || fail "llama-cli --sparse-prefill dense -ub 1024 exited $?: $(tail -n 3 "$work/dense_ub1024.err")"
cmp -s "$work/fa_ub1024.out" "$work/dense_ub1024.out" || fail "dense -ub 1024 output differs from llama.cpp's flash attention"
if [ -n "$(falls_back_other "$work/dense_ub1024.err")" ]; then
  fail "dense -ub 1024: some layer fell back to llama.cpp: $(falls_back_other "$work/dense_ub1024.err")"
fi
#     and in ubatches of 512 (llama.cpp's default; the window's size): a ring of 1024 cells. On CUDA
#     with the window path opted in this is where Gemma 3 lost answers (session 26); here the
#     continuation must be llama.cpp's.
run_cli fa_ub512 -fa -ub 512 || fail "llama-cli -fa -ub 512 exited $?: $(tail -n 3 "$work/fa_ub512.err")"
run_cli dense_ub512 --sparse-prefill dense -ub 512 || fail "llama-cli --sparse-prefill dense -ub 512 exited $?: $(tail -n 3 "$work/dense_ub512.err")"
cmp -s "$work/fa_ub512.out" "$work/dense_ub512.out" || fail "dense -ub 512 output differs from llama.cpp's flash attention"
#     and in ubatches of 256, whose first two fit the 512-token window: their sliding-window masks are
#     plain causal, noted, and the hook takes those layers and checks their notes too
run_cli fa_ub256 -fa -ub 256 || fail "llama-cli -fa -ub 256 exited $?: $(tail -n 3 "$work/fa_ub256.err")"
check_kq_masks 256 fa_ub256

# 2. the crisp policy runs
run_cli crisp --sparse-prefill crisp || fail "llama-cli --sparse-prefill crisp exited $?: $(tail -n 3 "$work/crisp.err")"
grep -q "crisp: sparse prefill 'crisp' computes.*$computes_suffix" "$work/crisp.err" || fail "crisp: crisp computed no layer's attention"
echo "flash attention: ...$(continuation fa)"
echo "dense (crisp):   ...$(continuation dense)"
echo "crisp:           ...$(continuation crisp)"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "llama.cpp integration on Gemma 3: all checks passed"
