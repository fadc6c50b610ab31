#!/usr/bin/env bash
# tests/llama_cpp/test_llama_bench.sh — the benchmark tools of crisp inside llama.cpp, on CPU with a
# shortened Llama-3.1-8B-shaped model:
#   1. scripts/make_llama_gguf.py writes a 2-layer, 512-token-vocabulary model at Llama-3.1-8B's
#      shape; the same arguments write the same bytes, another seed other bytes; a bad argument is
#      refused with an error naming it (exit 2);
#   2. llama-bench -p 256 -n 0 runs on it and reads the parameter count the shape implies;
#   3. llama-attn-time times its prompt: one flash-attention node per layer, finite logits that
#      differ from another prompt's (uncorrelated: the random weights do not map every prompt alike);
#   4. scripts/llama_bench.py runs fa and dense at 256 tokens and writes rows with a time and an
#      attention share each, and a markdown table.
# Usage: tests/llama_cpp/test_llama_bench.sh [BIN_DIR]
#   BIN_DIR: llama.cpp's binaries (default .deps/llama.cpp-build/bin, what scripts/llama_cpp.sh builds).
# Exits 77 (CTest's skip) when the llama.cpp build is absent: it is not built here.
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$repo_root/.deps/llama.cpp-build/bin}"
for tool in llama-bench llama-attn-time; do
  [ -x "$bin/$tool" ] || { echo "skip: no $tool in $bin (run scripts/llama_cpp.sh)"; exit 77; }
done
[ -d "$repo_root/.deps/llama.cpp-src/gguf-py" ] || { echo "skip: no llama.cpp source (run scripts/llama_cpp.sh)"; exit 77; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
make_gguf() { python3 "$repo_root/scripts/make_llama_gguf.py" --shape llama3.1-8b "$@"; }

# 1. the writer: deterministic, seeded, arguments checked
make_gguf --layers 2 --vocab 512 --out "$work/tiny.gguf" || fail "make_llama_gguf.py exited $?"
make_gguf --layers 2 --vocab 512 --out "$work/again.gguf" || fail "make_llama_gguf.py (again) exited $?"
make_gguf --layers 2 --vocab 512 --seed 1 --out "$work/seed1.gguf" || fail "make_llama_gguf.py --seed 1 exited $?"
cmp -s "$work/tiny.gguf" "$work/again.gguf" || fail "the same arguments wrote different files"
cmp -s "$work/tiny.gguf" "$work/seed1.gguf" && fail "seeds 0 and 1 wrote the same file"
rm -f "$work/again.gguf" "$work/seed1.gguf"
make_gguf --vocab 10 --out "$work/bad.gguf" 2> "$work/bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--vocab 10" "$work/bad.err" || fail "--vocab 10: exit $rc, $(cat "$work/bad.err")"
[ -e "$work/bad.gguf" ] && fail "--vocab 10 left a file"

# 2. llama-bench reads it, with the parameters of the shape (hidden 4096, 32:8 heads of 128, FFN
#    14336; 2 layers, vocabulary 512, separate output matrix, llama3 RoPE factors)
hidden=4096 kv=$((8 * 128)) ffn=14336 vocab=512 layers=2
expected=$(( vocab * hidden * 2 + hidden + 64 \
  + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden) ))
"$bin/llama-bench" -m "$work/tiny.gguf" -p 256 -n 0 -r 1 -t 2 -o jsonl > "$work/bench.jsonl" 2> "$work/bench.err" \
  || fail "llama-bench exited $?: $(tail -n 3 "$work/bench.err")"
python3 - "$work/bench.jsonl" "$expected" <<'PY' || fail "llama-bench's result"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
assert len(rows) == 1 and rows[0]["n_prompt"] == 256, rows
assert rows[0]["model_n_params"] == int(sys.argv[2]), (rows[0]["model_n_params"], sys.argv[2])
assert rows[0]["avg_ts"] > 0, rows[0]
PY

# 3. llama-attn-time: the flash-attention node of each layer timed, the logits finite
"$bin/llama-attn-time" -m "$work/tiny.gguf" --tokens 256 --warmup-tokens 16 -fa -t 2 -b 256 -ub 256 \
  --json "$work/attn.json" 2> "$work/attn.err" || fail "llama-attn-time exited $?: $(tail -n 3 "$work/attn.err")"
python3 - "$work/attn.json" "$layers" <<'PY' || fail "llama-attn-time's result"
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
assert run["attention_nodes"] == int(sys.argv[2]), run  # one ubatch: one op per layer
assert run["logits_finite"] and run["max_abs_logit"] > 0, run
assert abs(run["logit_correlation_to_previous"]) < 0.5, run  # against the warm-up prompt's
assert 0 < run["attention_ms"] < run["wall_ms"] and 0 < run["attention_share"] < 1, run
assert abs(run["ms_by_op"]["FLASH_ATTN_EXT"] - run["attention_ms"]) < 1e-3, run
PY
"$bin/llama-attn-time" -m "$work/tiny.gguf" -fa 2> "$work/attn_bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--tokens" "$work/attn_bad.err" || fail "llama-attn-time without --tokens: exit $rc"

# 4. the driver
python3 "$repo_root/scripts/llama_bench.py" --bin "$bin" --model tiny="$work/tiny.gguf" --lengths 256 \
  --policies fa,dense --reps 1 --threads 2 --json "$work/grid.json" --md "$work/grid.md" > "$work/grid.out" 2>&1 \
  || fail "llama_bench.py exited $?: $(tail -n 5 "$work/grid.out")"
python3 - "$work/grid.json" <<'PY' || fail "llama_bench.py's JSON"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["complete"] and [r["policy"] for r in doc["rows"]] == ["fa", "dense"], doc
for r in doc["rows"]:
    assert "error" not in r and "attn_error" not in r, r
    assert r["mean_ms"] > 0 and 0 < r["attention_share"] < 1 and r["n_ubatch"] == 256, r
    # --attn-reps 2 (the default): the row's figures from the second pass, the first's kept beside
    assert r["attn_passes"] == 2 and r["attention_ms_first_pass"] > 0, r
assert doc["rows"][1]["crisp_computed"] and not doc["rows"][1]["crisp_fallbacks"], doc["rows"][1]
assert doc["rows"][0]["speedup_vs_fa"] == 1.0
PY
grep -q "^| 256 | dense | 256 |" "$work/grid.md" || fail "llama_bench.py's markdown table: $(cat "$work/grid.md")"
# --rounds: the policies in turn, a row per round, the summary over rounds
python3 "$repo_root/scripts/llama_bench.py" --bin "$bin" --model tiny="$work/tiny.gguf" --lengths 256 \
  --policies fa,dense --reps 1 --rounds 2 --no-attn-time --threads 2 --json "$work/rounds.json" \
  --md "$work/rounds.md" > "$work/rounds.out" 2>&1 \
  || fail "llama_bench.py --rounds 2 exited $?: $(tail -n 5 "$work/rounds.out")"
python3 - "$work/rounds.json" <<'PY' || fail "llama_bench.py --rounds 2: its JSON"
import json, sys
doc = json.load(open(sys.argv[1]))
assert [(r["policy"], r["round"]) for r in doc["rows"]] == [("fa", 1), ("dense", 1), ("fa", 2), ("dense", 2)], doc["rows"]
by_policy = {e["policy"]: e for e in doc["summary"]}
assert set(by_policy) == {"fa", "dense"} and all(e["rounds"] == 2 for e in by_policy.values()), doc["summary"]
fa, dense = by_policy["fa"], by_policy["dense"]
assert fa["speedup_vs_fa_median"] == fa["speedup_vs_fa_min"] == fa["speedup_vs_fa_max"] == 1.0, fa
rates = [r["tokens_per_s"] for r in doc["rows"] if r["policy"] == "dense"]
assert dense["tokens_per_s_min"] == min(rates) and dense["tokens_per_s_max"] == max(rates), (dense, rates)
# each round's speedup against that round's fa row
pairs = [d["tokens_per_s"] / f["tokens_per_s"] for f, d in zip(doc["rows"][0::2], doc["rows"][1::2])]
assert abs(dense["speedup_vs_fa_min"] - min(pairs)) < 0.02 and abs(dense["speedup_vs_fa_max"] - max(pairs)) < 0.02, (dense, pairs)
PY
grep -q "^Over 2 rounds" "$work/rounds.md" && grep -q "^| 256 | dense | 2 |" "$work/rounds.md" \
  || fail "llama_bench.py --rounds 2: its summary table: $(cat "$work/rounds.md")"
python3 "$repo_root/scripts/llama_bench.py" --bin "$bin" --model "$work/tiny.gguf" --rounds 0 \
  --json "$work/bad.json" 2> "$work/grid_bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--rounds" "$work/grid_bad.err" || fail "llama_bench.py --rounds 0: exit $rc"
python3 "$repo_root/scripts/llama_bench.py" --bin "$bin" --model "$work/tiny.gguf" --policies fa,sparse \
  --json "$work/bad.json" 2> "$work/grid_bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "sparse" "$work/grid_bad.err" || fail "llama_bench.py --policies fa,sparse: exit $rc"
python3 "$repo_root/scripts/llama_bench.py" --bin "$bin" --model "$work/tiny.gguf" --attn-reps 0 \
  --json "$work/bad.json" 2> "$work/grid_bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--attn-reps" "$work/grid_bad.err" || fail "llama_bench.py --attn-reps 0: exit $rc"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
