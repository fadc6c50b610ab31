#!/usr/bin/env bash
# scripts/chunk_plan_density.py on a small structured prompt (2048 tokens, 4 query heads on 1 KV
# head, chunks of 1024): it exits 0 only when the last chunk's VS and dense heads keep exactly the
# whole prompt's rows (docs/algorithm.md §11), writes one entry per chunk whose densities are
# shares, and refuses a chunk that does not divide the prompt. Skips (77) without numpy.
set -euo pipefail
crisp=$1
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/numpy_scratch.sh"
"$crisp" gen --seq 2048 --heads-q 4 --heads-kv 1 --seed 7 --out-dir "$tmp/w" > /dev/null
script="$here/../../scripts/chunk_plan_density.py"
python3 "$script" --crisp "$crisp" --q "$tmp/w/q.npy" --k "$tmp/w/k.npy" --chunk 1024 --json "$tmp/d.json" > /dev/null
python3 - "$tmp/d.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert [c["chunk"] for c in d["chunks"]] == [0, 1], d["chunks"]
assert d["chunks"][1]["first_row"] == 8, d["chunks"][1]["first_row"]
for c in d["chunks"]:
    assert 0 < c["density"] <= 1 and 0 < c["prompt_density_same_rows"] <= 1, c
assert 0 < d["density_chunked"] <= 1 and 0 < d["density_prompt"] <= 1, d
assert len(d["chunks"][1]["heads"]) == 4
PY
if python3 "$script" --crisp "$crisp" --q "$tmp/w/q.npy" --k "$tmp/w/k.npy" --chunk 1000 > /dev/null 2> "$tmp/err"; then
  echo "FAIL: --chunk 1000 (not a divisor of 2048) was accepted"; exit 1
fi
grep -q -- "--chunk 1000" "$tmp/err" || { echo "FAIL: the refusal does not name --chunk: $(cat "$tmp/err")"; exit 1; }
echo "chunk_plan_density: ok"
