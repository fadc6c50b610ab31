#!/usr/bin/env bash
# scripts/pick_frontier_point.py on hand-made frontier JSONs: the qualifying rule (share of
# dense's answers, at least the baseline's answers, density ratio), the tie-break, missing runs,
# and errors that name the argument.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pick="$here/../../scripts/pick_frontier_point.py"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# run FILE MODEL LENGTH then rows "point policy correct density [knob=v,...]"
write_run() {
  local file=$1 model=$2 length=$3; shift 3
  python3 - "$file" "$model" "$length" "$@" <<'PY'
import json, sys
path, model, length, *specs = sys.argv[1:]
rows = []
for s in specs:
    parts = s.split()
    point, policy, correct, density = parts[:4]
    knobs = dict(kv.split("=") for kv in parts[4].split(",")) if len(parts) > 4 else {}
    samples = int(parts[5]) if len(parts) > 5 else 40
    rows.append({"point": point, "policy": policy, "correct": int(correct), "length": int(length), "samples": samples,
                 "mean_density": None if density == "null" else float(density), "knobs": knobs})
json.dump({"settings": {"model": model}, "rows": rows}, open(path, "w"))
PY
}

# Run 1: dense 40; flex 39 at 0.60. a: 39 at 0.40 (ok, 0.67x); b: 40 at 0.30 (ok, 0.50x);
# c: 38 at 0.20 (fewer answers than flex: not ok).
write_run "$tmp/r1.json" m1 4096 "dense dense 40 1.0" "flexprefill flexprefill 39 0.60" \
  "crisp:min_budget=256 crisp 39 0.40 min_budget=256" "crisp:uniform_alpha=2 crisp 40 0.30 uniform_alpha=2" \
  "crisp:min_budget=128 crisp 38 0.20 min_budget=128"
# Run 2: dense 30, flex 28 at 0.40. need = max(ceil(0.97*30)=30, 28) = 30.
# a: 30 at 0.28 (ok 0.70x); b: 29 at 0.20 (not ok); c: 30 at 0.10 (ok).
write_run "$tmp/r2.json" m2 8192 "dense dense 30 1.0" "flexprefill flexprefill 28 0.40" \
  "crisp:min_budget=256 crisp 30 0.28 min_budget=256" "crisp:uniform_alpha=2 crisp 29 0.20 uniform_alpha=2" \
  "crisp:min_budget=128 crisp 30 0.10 min_budget=128"
out=$(python3 "$pick" "$tmp/r1.json" "$tmp/r2.json" 2>"$tmp/err")
[ "$out" = "crisp:min_budget=256" ] || fail "expected crisp:min_budget=256 (qualifies on both), got '$out'"
grep -q "qualifies on 2 of 2 runs" "$tmp/err" || fail "expected 2 of 2 in: $(cat "$tmp/err")"

# Stricter ratio: nobody qualifies on both; a (0.67x, 0.70x) fails both at 0.6, b qualifies on
# run 1 (0.50x), c on run 2 (0.25x): tie on one run each, broken by the worst ratio (c's 0.33x...
# b's worst 0.50x, c's worst 0.33x): c.
out=$(python3 "$pick" "$tmp/r1.json" "$tmp/r2.json" --max-ratio 0.6 2>/dev/null)
[ "$out" = "crisp:min_budget=128" ] || fail "expected crisp:min_budget=128 at --max-ratio 0.6, got '$out'"

# A candidate missing from a run does not qualify there.
write_run "$tmp/r3.json" m3 4096 "dense dense 10 1.0" "flexprefill flexprefill 10 0.5" \
  "crisp:min_budget=128 crisp 10 0.2 min_budget=128"
out=$(python3 "$pick" "$tmp/r2.json" "$tmp/r3.json" 2>"$tmp/err")
[ "$out" = "crisp:min_budget=128" ] || fail "expected crisp:min_budget=128 (only complete qualifier), got '$out'"
grep -q "missing" "$tmp/err" || fail "expected a 'missing' cell in: $(cat "$tmp/err")"

# A point cut short (fewer samples than dense) does not qualify there.
write_run "$tmp/r4.json" m4 4096 "dense dense 10 1.0" "flexprefill flexprefill 10 0.5" \
  "crisp:min_budget=128 crisp 10 0.2 min_budget=128 20" "crisp:min_budget=256 crisp 10 0.3 min_budget=256"
out=$(python3 "$pick" "$tmp/r4.json" 2>/dev/null)
[ "$out" = "crisp:min_budget=256" ] || fail "expected crisp:min_budget=256 (the other point is cut short), got '$out'"

# --probe: a pass-key probe JSON is one more run, answers only; --all prints `none` unless the
# pick qualifies on every run. Run 1 and 2 above: crisp:min_budget=256 qualifies on both. The
# probe names points by spec, knobs in any order and separator.
write_probe() {  # write_probe FILE "point kept correct" ...
  local file=$1; shift
  python3 - "$file" "$@" <<'PY'
import json, sys
path, *specs = sys.argv[1:]
summary = {}
for s in specs:
    point, kept, correct = s.split()
    summary[point] = {"correct": int(correct), "kept_of_dense": int(kept), "agrees_with_dense": int(kept)}
json.dump({"split": "tuning", "model": "probe-model", "points": list(summary), "rows": [], "summary": summary},
          open(path, "w"))
PY
}
# dense 15 right; flex keeps 12: need = max(ceil(0.97*15)=15, 12) = 15.
write_probe "$tmp/p1.json" "dense 15 15" "flexprefill 12 13" "crisp:min_budget=256 14 14" "crisp:min_budget=128 15 15"
out=$(python3 "$pick" "$tmp/r1.json" "$tmp/r2.json" --probe "$tmp/p1.json" 2>"$tmp/err")
# min_budget=256: 2 of 3 (probe 14 < 15); min_budget=128: run 2 and the probe (2 of 3), worst ratio
# 0.33x < 0.70x: min_budget=128.
[ "$out" = "crisp:min_budget=128" ] || fail "expected crisp:min_budget=128 with the probe, got '$out'"
grep -q "kept 14/15" "$tmp/err" || fail "expected the probe cell 'kept 14/15' in: $(cat "$tmp/err")"
out=$(python3 "$pick" "$tmp/r1.json" "$tmp/r2.json" --probe "$tmp/p1.json" --all 2>/dev/null)
[ "$out" = "none" ] || fail "expected none with --all (no point qualifies on all 3 runs), got '$out'"
out=$(python3 "$pick" "$tmp/r1.json" "$tmp/r2.json" --all 2>/dev/null)
[ "$out" = "crisp:min_budget=256" ] || fail "expected crisp:min_budget=256 with --all and no probe, got '$out'"
write_probe "$tmp/p2.json" "dense 15 15" "flexprefill 15 15" "crisp:min_budget=256 15 15"
out=$(python3 "$pick" "$tmp/r1.json" "$tmp/r2.json" --probe "$tmp/p2.json" --all 2>/dev/null)
[ "$out" = "crisp:min_budget=256" ] || fail "expected crisp:min_budget=256 (all 3 runs), got '$out'"
# Knob order and separator: a probe entry `crisp:b=2;a=1` is the frontier point `crisp:a=1:b=2`.
write_run "$tmp/r5.json" m5 2048 "dense dense 10 1.0" "flexprefill flexprefill 10 0.8" \
  "crisp:x=1:a=2 crisp 10 0.5 x=1,a=2"
write_probe "$tmp/p3.json" "dense 10 10" "flexprefill 10 10" "crisp:x=1;a=2 10 10"
out=$(python3 "$pick" "$tmp/r5.json" --probe "$tmp/p3.json" --all 2>"$tmp/err")
[ "$out" = "crisp:a=2;x=1" ] || fail "expected crisp:a=2;x=1 matched across spellings, got '$out': $(cat "$tmp/err")"
echo '{"rows": []}' > "$tmp/notprobe.json"
if python3 "$pick" "$tmp/r1.json" --probe "$tmp/notprobe.json" 2>"$tmp/err"; then fail "a probe without a summary was accepted"; fi
grep -q -- "--probe" "$tmp/err" || fail "the error does not name --probe: $(cat "$tmp/err")"

# Errors name the argument.
write_run "$tmp/nobase.json" m4 4096 "dense dense 10 1.0" "crisp crisp 10 0.2"
if python3 "$pick" "$tmp/nobase.json" 2>"$tmp/err"; then fail "a run without the baseline was accepted"; fi
grep -q -- "--baseline" "$tmp/err" || fail "the error does not name --baseline: $(cat "$tmp/err")"
if python3 "$pick" "$tmp/r1.json" --policy minference 2>"$tmp/err"; then fail "an absent policy was accepted"; fi
grep -q -- "--policy" "$tmp/err" || fail "the error does not name --policy: $(cat "$tmp/err")"
echo "not json" > "$tmp/bad.json"
if python3 "$pick" "$tmp/bad.json" 2>"$tmp/err"; then fail "a file that is not JSON was accepted"; fi
grep -q "RUN.json" "$tmp/err" || fail "the error does not name RUN.json: $(cat "$tmp/err")"
echo "pick_frontier_point: all checks passed"
