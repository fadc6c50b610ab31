# tests/llama_cpp/kq_mask_checks.sh — sourced by test_llama_cpp.sh and test_llama_cpp_gemma.sh, which
# define run_cli, fail and $work. The patch's KQ mask (docs/llama_cpp.md, "The KQ mask") on a real
# prompt in ubatches of UB over the cache:
#   - LLAMA_KQ_MASK_VERIFY=1: every cell of every filled mask (causal and windowed, the threaded
#     fill included) against llama.cpp's own rules, aborting at the first that differs; the output
#     is that of the same run without it ($work/PLAIN.out);
#   - CRISP_HOOK_MASK_NOTE=check (with LLAMA_KQ_MASK_VERIFY): every causal note against the mask's
#     cells, by the hook and by llama.cpp, aborting where they disagree.
# Usage: check_kq_masks UB PLAIN   (PLAIN: run_cli's name of an earlier `-fa -ub UB` run)
check_kq_masks() {
  local ub="$1" plain="$2"
  LLAMA_KQ_MASK_VERIFY=1 run_cli fa_mask_verify -fa -ub "$ub" \
    || fail "llama-cli -fa -ub $ub with LLAMA_KQ_MASK_VERIFY=1 exited $?: $(grep -m1 -i "KQ_MASK\|error" "$work/fa_mask_verify.err")"
  cmp -s "$work/$plain.out" "$work/fa_mask_verify.out" || fail "LLAMA_KQ_MASK_VERIFY=1 changed llama-cli's output"
  CRISP_HOOK_MASK_NOTE=check LLAMA_KQ_MASK_VERIFY=1 run_cli dense_note_check --sparse-prefill dense -ub "$ub" \
    || fail "--sparse-prefill dense -ub $ub with CRISP_HOOK_MASK_NOTE=check exited $?: $(grep -m1 -i "note\|error" "$work/dense_note_check.err")"
  grep -q "crisp: sparse prefill 'dense' computes" "$work/dense_note_check.err" || fail "CRISP_HOOK_MASK_NOTE=check: crisp computed no op"
}
