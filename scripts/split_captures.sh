#!/usr/bin/env bash
# Captures the QA prompts of one split of eval/splits.json (`crisp-llama-eval capture --split`, on
# llama.cpp) and measures the policies on them: `crisp eval fidelity` (every preset), or with
# arguments after `--` a frontier `crisp eval pareto --captures ... ARGS` (e.g. --sweep
# 'crisp:alpha=1,2' --json F).
#
# Usage: scripts/split_captures.sh tuning|test [BUILD_DIR] [WORK_DIR] [-- PARETO_ARGS...]
#   BUILD_DIR: a build with the crisp command (default build); WORK_DIR: captures and JSON
#   (default BUILD_DIR/captures; about 0.4 GB per 8k capture). Environment: THREADS (0 = all),
#   LLAMA_BIN (crisp-llama-eval's directory; default: built by scripts/llama_cpp.sh),
#   MODEL (default: scripts/fetch_model.sh's SmolLM2), LLAMA_ARGS (e.g. "--ngl 99" with a --cuda build).
# Only the test split's figures go into docs/evaluation.md; tune on the tuning split.
set -euo pipefail
cd "$(dirname "$0")/.."
split=${1:?usage: scripts/split_captures.sh tuning|test [BUILD_DIR] [WORK_DIR] [-- PARETO_ARGS...]}
shift
build=build
work=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then build=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then work=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
work=${work:-$build/captures}
threads=${THREADS:-0}
crisp="$build/crisp"
mkdir -p "$work"
model=${MODEL:-$(scripts/fetch_model.sh)}
llama_bin=${LLAMA_BIN:-$(scripts/llama_cpp.sh)}
thread_args=()
[ "$threads" != 0 ] && thread_args=(--threads "$threads")
# Every prompt of the split into $work/qa<I>_<N> (one that exists is kept).
# shellcheck disable=SC2086  # LLAMA_ARGS: several words
"$llama_bin/crisp-llama-eval" capture --model "$model" --split "$split" "${thread_args[@]}" --out "$work" ${LLAMA_ARGS:-}

# "qa_index max_tokens" per line, from the splits file.
items=$(python3 - "$split" <<'PY'
import json, sys
for item in json.load(open("eval/splits.json"))["captures"][sys.argv[1]]:
    print(item["qa_index"], item["max_tokens"])
PY
)
dirs=()
while read -r qa tokens; do dirs+=("$work/qa${qa}_${tokens}"); done <<< "$items"

if [ $# -gt 0 ]; then
  "$crisp" eval pareto --captures "${dirs[@]}" --threads "$threads" "$@"
else
  "$crisp" eval fidelity --captures "${dirs[@]}" --threads "$threads" --json "$work/fidelity_$split.json" \
    | tee "$work/fidelity_$split.txt"
fi
