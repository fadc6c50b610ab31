#!/usr/bin/env bash
# scripts/chunk_pe_rules.py on a small structured prompt (4096 tokens, 8 query heads on 2 KV heads,
# seed 3: one head routes PE; planned with pe_rule=coverage, the rule the script studies): with one chunk the three chunk rules are the prompt's walk; with chunks
# of 1024 the chunk rule covers at least gamma_pe of the mass, as the prompt's walk does, the
# row-by-row rules give what they give with one chunk (per row at least gamma_pe), and every figure
# is a share. --check-plan: the script's whole-prompt walk is the CPU planner's (crisp plan's
# PE blocks, the section 4 additions aside) on this prompt and a 16k one, and a plan with one walked
# block removed is reported (exit 1). Refuses a chunk that is no multiple of the block size. Skips
# (77) without numpy.
set -euo pipefail
crisp=$1
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/numpy_scratch.sh"
"$crisp" gen --seq 4096 --heads-q 8 --heads-kv 2 --seed 3 --out-dir "$tmp/w" > /dev/null
"$crisp" plan --q "$tmp/w/q.npy" --k "$tmp/w/k.npy" --set pe_rule=coverage --json "$tmp/w/plan.json" > /dev/null
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
    # The row-by-row rules do not see the chunks: the same with one chunk and with four.
    other = next(o for o in one["heads"] if o["head"] == h["head"])
    for rule in ("rowprefix", "perrow"):
        assert h[rule] == other[rule], (rule, h[rule], other[rule])
        assert 0 < h[rule]["density"] <= 1 and 0 < h[rule]["mass_covered"] <= 1 + 1e-9, h
    assert h["perrow"]["mass_covered"] >= gamma - 1e-9, h
PY
python3 "$script" --dir "$tmp/w" --chunk 1024 --check-plan > "$tmp/check" ||
  { echo "FAIL: the whole walk differs from the planner's: $(cat "$tmp/check")"; exit 1; }
grep -q "1 of 1 PE heads agree" "$tmp/check" || { echo "FAIL: $(cat "$tmp/check")"; exit 1; }
"$crisp" gen --seq 16384 --heads-q 8 --heads-kv 2 --seed 11 --out-dir "$tmp/w16" > /dev/null
"$crisp" plan --q "$tmp/w16/q.npy" --k "$tmp/w16/k.npy" --set pe_rule=coverage --json "$tmp/w16/plan.json" > /dev/null
python3 "$script" --dir "$tmp/w16" --chunk 4096 --check-plan > "$tmp/check16" ||
  { echo "FAIL: the whole walk differs from the planner's at 16k: $(cat "$tmp/check16")"; exit 1; }
# The check can fail: drop from the plan a block of the PE head that section 4 does not add (so
# one the walk kept, the check above having passed).
python3 - "$tmp/w/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
head = next(h for h in plan["heads"] if h["route"] == "pe")
verticals, slashes = set(head["vertical"]) | {0}, set(head["slash"]) | {0}
row_ptr, col = head["row_ptr"], head["col"]
for r in range(len(row_ptr) - 1):
    i = next((i for i in range(row_ptr[r], row_ptr[r + 1]) if col[i] not in verticals
              and r - col[i] not in slashes and r - col[i] - 1 not in slashes), None)
    if i is not None:
        del col[i]
        for j in range(r + 1, len(row_ptr)):
            row_ptr[j] -= 1
        break
else:
    sys.exit("no walked block to drop")
json.dump(plan, open(sys.argv[1], "w"))
PY
if python3 "$script" --dir "$tmp/w" --chunk 1024 --check-plan > /dev/null 2> "$tmp/err"; then
  echo "FAIL: a plan without one of its blocks passed --check-plan"; exit 1
fi
grep -q "differ from the whole walk" "$tmp/err" || { echo "FAIL: no difference named: $(cat "$tmp/err")"; exit 1; }
if python3 "$script" --dir "$tmp/w" --chunk 1000 > /dev/null 2> "$tmp/err"; then
  echo "FAIL: --chunk 1000 (not a multiple of 128) was accepted"; exit 1
fi
grep -q -- "--chunk 1000" "$tmp/err" || { echo "FAIL: the refusal does not name --chunk: $(cat "$tmp/err")"; exit 1; }
echo "chunk_pe_rules: ok"
