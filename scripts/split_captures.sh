#!/usr/bin/env bash
# Captures the QA prompts of one split of eval/splits.json (`crisp capture`) and measures the
# policies on them: `crisp eval fidelity` (every preset), or with arguments after `--` a frontier
# `crisp eval pareto --captures ... ARGS` (e.g. --sweep 'crisp:alpha=1,2' --json F).
#
# Usage: scripts/split_captures.sh tuning|test [BUILD_DIR] [WORK_DIR] [-- PARETO_ARGS...]
#   BUILD_DIR: a build with the crisp command (default build); WORK_DIR: captures and JSON
#   (default BUILD_DIR/captures; about 0.4 GB per 8k capture). Environment: THREADS (0 = all).
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
scripts/fetch_model.sh >/dev/null

# "qa_index max_tokens" per line, from the splits file (an unknown split is an error there).
items=$(python3 - "$split" <<'PY'
import json, sys
splits = json.load(open("eval/splits.json"))["captures"]
if sys.argv[1] not in splits:
    sys.exit(f"split_captures.sh: error: no captures split '{sys.argv[1]}' in eval/splits.json; expected one of {', '.join(splits)}")
for item in splits[sys.argv[1]]:
    print(item["qa_index"], item["max_tokens"])
PY
)
dirs=()
while read -r qa tokens; do
  dir="$work/qa${qa}_${tokens}"
  [ -f "$dir/meta.json" ] || "$crisp" capture --qa-index "$qa" --max-tokens "$tokens" --threads "$threads" --out "$dir"
  dirs+=("$dir")
done <<< "$items"

if [ $# -gt 0 ]; then
  "$crisp" eval pareto --captures "${dirs[@]}" --threads "$threads" "$@"
else
  "$crisp" eval fidelity --captures "${dirs[@]}" --threads "$threads" --json "$work/fidelity_$split.json" \
    | tee "$work/fidelity_$split.txt"
fi
