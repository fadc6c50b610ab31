#!/usr/bin/env bash
# scripts/chunk_pe_rules.py on a small structured prompt (4096 tokens, 8 query heads on 2 KV heads,
# seed 3: one head routes PE): with one chunk the three rules are the prompt's walk; with chunks of
# 1024 the chunk rule covers at least gamma_pe of the mass, as the prompt's walk does, and every
# figure is a share. Refuses a chunk that is no multiple of the block size. Skips (77) without numpy.
set -euo pipefail
crisp=$1
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/numpy_scratch.sh"
"$crisp" gen --seq 4096 --heads-q 8 --heads-kv 2 --seed 3 --out-dir "$tmp/w" > /dev/null
"$crisp" plan --q "$tmp/w/q.npy" --k "$tmp/w/k.npy" --json "$tmp/w/plan.json" > /dev/null
script="$here/../../scripts/chunk_pe_rules.py"
python3 "$script" --dir "$tmp/w" --chunk 4096 --json "$tmp/one.json" > /dev/null
python3 "$script" --dir "$tmp/w" --chunk 1024 --json "$tmp/four.json" > /dev/null
python3 - "$tmp/one.json" "$tmp/four.json" <<'PY'
import json, sys
one, four = (json.load(open(f)) for f in sys.argv[1:3])
assert one["heads"] and len(one["heads"]) == len(four["heads"]), "the prompt should have a PE head"
gamma = one["pe_gamma"]
for h in one["heads"]:
    assert h["chunk"] == h["whole"] == h["prefix"], h
for h in four["heads"]:
    for rule in ("whole", "chunk", "prefix"):
        assert 0 < h[rule]["density"] <= 1 and 0 < h[rule]["mass_covered"] <= 1 + 1e-9, h
    assert h["whole"]["mass_covered"] >= gamma - 1e-9 and h["chunk"]["mass_covered"] >= gamma - 1e-9, h
    assert h["chunk"]["density"] >= h["whole"]["density"], h  # the gap issue 16 measures
PY
if python3 "$script" --dir "$tmp/w" --chunk 1000 > /dev/null 2> "$tmp/err"; then
  echo "FAIL: --chunk 1000 (not a multiple of 128) was accepted"; exit 1
fi
grep -q -- "--chunk 1000" "$tmp/err" || { echo "FAIL: the refusal does not name --chunk: $(cat "$tmp/err")"; exit 1; }
echo "chunk_pe_rules: ok"
