#!/usr/bin/env bash
# bench/paged_ratios.py on hand-made bench rounds (single-round files and a file of rounds): each
# round's ratio, min / median / max, the rounds within the goal, and --build's selection.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ratios="$here/../../bench/paged_ratios.py"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# round FILE P16 P128: dense one shot, contiguous 100 ms, pages of 16 and 128 at these ratios
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def bench(p16, p128):
    base = {"preset": "dense", "chunks": 1, "chunk": 1024, "density": 1.0, "recall_mean": 1.0, "vs_one_shot": 1.0}
    return {"device": "TestGPU", "runs": [
        dict(base, kv_layout="head_major", page_size=0, total_ms=100.0),
        dict(base, page_size=16, page_order="shuffled", total_ms=100 * p16, vs_contiguous=p16),
        dict(base, page_size=128, page_order="shuffled", total_ms=100 * p128, vs_contiguous=p128)]}
json.dump(bench(1.02, 1.01), open(f"{tmp}/r1.json", "w"))
json.dump(bench(1.07, 1.03), open(f"{tmp}/r2.json", "w"))
json.dump({"device": "TestGPU", "rounds": [{"build": "main", "bench": bench(1.04, 1.00)},
                                           {"build": "other", "bench": bench(1.50, 1.50)}]}, open(f"{tmp}/ab.json", "w"))
PY
out="$(python3 "$ratios" "$tmp/r1.json" "$tmp/r2.json" "$tmp/ab.json" --build main)"
echo "$out"
grep -q "^3 rounds on TestGPU" <<<"$out" || fail "three rounds (the other build's left out)"
grep -qF "1.020 / 1.070 / 1.040 → 1.020 / **1.040** / 1.070 (2/3)" <<<"$out" || fail "pages of 16: each round, min / median / max, 2 of 3 within 1.05"
grep -qF "1.010 / 1.030 / 1.000 → 1.000 / **1.010** / 1.030 (3/3)" <<<"$out" || fail "pages of 128"
grep -qF "pages of 16 2/3 within 1.05x; pages of 128 3/3 within 1.05x" <<<"$out" || fail "the counts over every row"
out="$(python3 "$ratios" --goal 1.02 "$tmp/r1.json")"
grep -qF "pages of 16 1/1 within 1.02x; pages of 128 1/1 within 1.02x" <<<"$out" || fail "--goal"
echo "paged_ratios: ok"
