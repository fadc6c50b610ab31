#!/usr/bin/env bash
# Reproduces the "Fidelity and calibration" section of docs/evaluation.md on the CPU:
#   1. captures the post-RoPE Q/K/V of all 30 layers of SmolLM2-135M-Instruct for real prompts
#      (data/long_qa_prompts.json) at 2k, 4k and 8k tokens (`crisp-llama-eval capture`:
#      llama.cpp's dense prefill);
#   2. evaluates every policy and both routings on every layer and head, and calibrates
#      tau_proxy / rho against the JSD decisions (`crisp eval fidelity`);
#   3. runs the synthetic workload at several lengths (`crisp demo --json`);
#   4. draws the figures (scripts/plot_fidelity.py -> docs/fidelity_*.png).
#
# Usage: scripts/fidelity_report.sh [BUILD_DIR] [WORK_DIR]
#   BUILD_DIR: a CPU build with the crisp command (default build); WORK_DIR: where captures and
#   JSON go (default BUILD_DIR/fidelity; the captures take about 2.5 GB).
# Environment: THREADS (default 0 = all), DEMO_SEQS (default "4096 8192 16384 32768"), LLAMA_BIN
# (crisp-llama-eval's directory; default: built by scripts/llama_cpp.sh), MODEL (default:
# scripts/fetch_model.sh's SmolLM2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=${2:-$build/fidelity}
threads=${THREADS:-0}
crisp="$build/crisp"
mkdir -p "$work"
model=${MODEL:-$(scripts/fetch_model.sh)}
llama_bin=${LLAMA_BIN:-$(scripts/llama_cpp.sh)}
thread_args=()
[ "$threads" != 0 ] && thread_args=(--threads "$threads")

capture() {  # name qa_index max_tokens
  [ -f "$work/$1/meta.json" ] || "$llama_bin/crisp-llama-eval" capture --model "$model" --qa-index "$2" --max-tokens "$3" \
    "${thread_args[@]}" --out "$work/$1"
}
# NOTE: qa prompt 0 is about 4k tokens, 1 about 8k (the model's trained context), 2 about 16k: the
# 2k and 4k captures of prompts 1 and 2 are their first tokens (slices of real prose).
capture qa0_2k 0 2048
capture qa1_2k 1 2048
capture qa2_2k 2 2048
capture qa0_4k 0 4096
capture qa2_4k 2 4096
capture qa1_8k 1 8192

# Every policy against dense on every layer and head of the 2k and 4k captures (the dense
# attention of all 30 layers dominates: about 1 min per 2k capture, 5 min per 4k one on 2 cores).
"$crisp" eval fidelity --threads "$threads" --json "$work/fidelity.json" --layouts 0:0,3:4,14:2,27:6 \
  --captures "$work"/qa0_2k "$work"/qa1_2k "$work"/qa2_2k "$work"/qa0_4k "$work"/qa2_4k \
  | tee "$work/fidelity.txt"
# The routing comparison and the calibration at every length, 8k included (plans only: cheap).
"$crisp" eval fidelity --routing-only --threads "$threads" --json "$work/calibration.json" \
  --captures "$work"/qa0_2k "$work"/qa1_2k "$work"/qa2_2k "$work"/qa0_4k "$work"/qa2_4k "$work"/qa1_8k \
  | tee "$work/calibration.txt"

demos=()
for n in ${DEMO_SEQS:-4096 8192 16384 32768}; do
  "$crisp" demo --seq "$n" --threads "$threads" --backend cpu --json "$work/demo_$n.json" --quiet >/dev/null
  demos+=("$work/demo_$n.json")
done

python3 scripts/plot_fidelity.py --fidelity "$work/fidelity.json" --calibration "$work/calibration.json" --demo "${demos[@]}" --out docs
