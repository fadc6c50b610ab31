#!/usr/bin/env bash
# tests/llama_cpp/test_llama_capture.sh — `crisp-llama-eval capture` (Q/K/V of llama.cpp's dense
# prefill through its eval callback, docs/evaluation.md) on SmolLM2, 300 tokens of a QA prompt:
#   1. meta.json and the .npy files have the capture format's fields and shapes (Q [9, n, 64],
#      K/V [3, n, 64] for every layer; no sliding-window layer), and `crisp eval fidelity` reads it;
#   2. the captured q/k/v are what each layer's attention read: dense causal attention computed
#      from them in float64 reproduces llama.cpp's flash-attention output of the same layer
#      (captured by --with-output) within sqrt(n) * 2^-11 relative (Frobenius) error: the CPU kernel
#      accumulates the softmax-weighted F16 V in F16 (unit roundoff 2^-11), n additions whose
#      rounding errors add up as a random walk. The same check must fail for plausible capture
#      mistakes: no causal mask, query heads mapped to KV heads the wrong way (h % n_head_kv
#      instead of h / (n_head / n_head_kv)), and the q of the next layer;
#   3. --layers keeps only the chosen layers; --max-tokens slices the prompt;
#   4. bad input exits 2 with an error naming the argument.
#   5. where Gemma 3 270M is cached: its local layers are recorded as sliding-window (size 512 in
#      its GGUF) and reproduce only with that window, its global layers with the causal mask.
# Usage: tests/llama_cpp/test_llama_capture.sh [--cuda] CRISP_BIN [BIN_DIR [MODEL]] (CRISP_BIN: the
# crisp command for `crisp eval fidelity`; the others as test_llama_cpp.sh).
#   --cuda: every capture with --ngl 99 on the CUDA build (BIN_DIR then defaults to
#   .deps/llama.cpp-build-cuda/bin): the same checks against llama.cpp's CUDA attention output.
# Exits 77 (CTest's skip) when the llama.cpp build, the model or numpy is absent, or with --cuda
# where no CUDA device exists.
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
default_bin="$repo_root/.deps/llama.cpp-build/bin"
offload=()  # capture arguments that put the layers on the backend under test
if [ "${1:-}" = "--cuda" ]; then
  shift
  default_bin="$repo_root/.deps/llama.cpp-build-cuda/bin"
  offload=(--ngl 99)
  nvidia-smi -L > /dev/null 2>&1 || { echo "skip: no CUDA device"; exit 77; }
fi
crisp="${1:?usage: test_llama_capture.sh [--cuda] CRISP_BIN [BIN_DIR [MODEL]]}"
bin="${2:-$default_bin}"
model_dir="${CRISP_MODEL_DIR:-$repo_root/.cache/model}"
model="${3:-${CRISP_MODEL_PATH:-$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf}}"
gemma="$model_dir/gemma-3-270m-q4_k_m.gguf"
tool="$bin/crisp-llama-eval"
[ -x "$tool" ] || { echo "skip: no crisp-llama-eval in $bin (run scripts/llama_cpp.sh)"; exit 77; }
[ -f "$model" ] || { echo "skip: no model at $model (run scripts/fetch_model.sh)"; exit 77; }
python3 -c "import numpy" 2>/dev/null || { echo "skip: python3 with numpy is needed to check the arrays"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The prompt: a file of prose (the repository's README), so the test needs no data directory.
n=300
common=(--model "$model" --prompt-file "$repo_root/README.md" --max-tokens "$n" --threads 2 --quiet "${offload[@]}")
"$tool" capture "${common[@]}" --with-output --out "$work/all" > "$work/all.out" 2> "$work/all.err" \
  || fail "capture exited $?: $(tail -n 3 "$work/all.err")"
cat "$work/all.out"
"$tool" capture "${common[@]}" --layers 3,1 --out "$work/some" > /dev/null 2> "$work/some.err" \
  || fail "capture --layers 3,1 exited $?: $(tail -n 3 "$work/some.err")"

# The checks of the arrays (1, 2, 3, 5), in float64. Prints one line per failed check.
check_py="$work/check.py"
cat > "$check_py" <<'EOF'
import json, os, sys
import numpy as np

def attention(q, k, v, window=None, causal=True, interleaved=False):
    heads, n, d = q.shape
    group = heads // k.shape[0]
    kk = np.tile(k, (group, 1, 1)) if interleaved else np.repeat(k, group, axis=0)
    vv = np.tile(v, (group, 1, 1)) if interleaved else np.repeat(v, group, axis=0)
    s = q @ kk.transpose(0, 2, 1) / np.sqrt(d)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = np.ones((n, n), bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= i - j < window
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ vv

def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)

def load(d, layer, which):
    return np.load(os.path.join(d, "layer_%02d_%s.npy" % (layer, which))).astype(np.float64)

bad = []
def check(cond, what):
    if not cond:
        bad.append(what)

mode, d = sys.argv[1], sys.argv[2]
meta = json.load(open(os.path.join(d, "meta.json")))
n = meta["tokens"]
tol = np.sqrt(n) * 2.0 ** -11
if mode == "smollm2":
    expect_n = int(sys.argv[3])
    check(meta["engine"] == "llama.cpp" and meta["architecture"] == "llama", "engine/architecture: %s %s" % (meta["engine"], meta["architecture"]))
    check(n == expect_n and meta["sliced"] and meta["prompt_tokens"] > n and len(meta["token_ids"]) == n,
          "tokens %s of %s, %d ids" % (n, meta["prompt_tokens"], len(meta["token_ids"])))
    check(meta["layers"] == list(range(30)) and [f["layer"] for f in meta["files"]] == list(range(30)), "layers %s" % meta["layers"])
    check((meta["n_head"], meta["n_head_kv"], meta["head_dim"]) == (9, 3, 64), "heads %s %s %s" % (meta["n_head"], meta["n_head_kv"], meta["head_dim"]))
    check(meta["sliding_window"] is None and all(f["window"] is None for f in meta["files"]), "sliding window: %s" % meta["sliding_window"])
    worst = 0.0
    for f in meta["files"]:
        l = f["layer"]
        q, k, v, o = (load(d, l, w) for w in "qkvo")
        check(q.shape == (9, n, 64) and k.shape == (3, n, 64) and v.shape == (3, n, 64) and o.shape == (9, n, 64),
              "layer %d shapes %s %s %s %s" % (l, q.shape, k.shape, v.shape, o.shape))
        err = rel(o, attention(q, k, v))
        worst = max(worst, err)
        check(err <= tol, "layer %d: dense attention of the captured q/k/v is %.2e from llama.cpp's output (tolerance %.2e)" % (l, err, tol))
        controls = {"no causal mask": attention(q, k, v, causal=False),
                    "interleaved GQA": attention(q, k, v, interleaved=True)}
        if l + 1 < 30:
            controls["next layer's q"] = attention(load(d, l + 1, "q"), k, v)
        for name, wrong in controls.items():
            check(rel(o, wrong) > tol, "layer %d: the control '%s' passes too (%.2e): the check cannot fail" % (l, name, rel(o, wrong)))
    print("dense attention of the captured q/k/v vs llama.cpp's output: worst relative error %.2e over 30 layers (tolerance %.2e)" % (worst, tol))
    some = json.load(open(os.path.join(sys.argv[4], "meta.json")))
    check(some["layers"] == [1, 3] and sorted(os.listdir(sys.argv[4])) == sorted(
        ["meta.json"] + ["layer_%02d_%s.npy" % (l, w) for l in (1, 3) for w in "qkv"]), "--layers 3,1: %s" % sorted(os.listdir(sys.argv[4])))
    for l in (1, 3):
        for w in "qkv":
            check(np.array_equal(load(d, l, w), load(sys.argv[4], l, w)), "--layers 3,1: layer %d %s differs from the full capture" % (l, w))
elif mode == "gemma3":
    window = meta["sliding_window"]
    check(window is not None and window["size"] == 512, "sliding window: %s" % window)
    local = set(window["layers"]) if window else set()
    check(local and len(local) < meta["n_layer"], "local layers %s of %d" % (sorted(local), meta["n_layer"]))
    for f in meta["files"]:
        l = f["layer"]
        q, k, v, o = (load(d, l, w) for w in "qkvo")
        w = 512 if l in local else None
        check(f["window"] == w, "layer %d window %s" % (l, f["window"]))
        err = rel(o, attention(q, k, v, window=w))
        check(err <= tol, "gemma3 layer %d (window %s): %.2e from llama.cpp's output (tolerance %.2e)" % (l, w, err, tol))
        if w is not None:
            check(rel(o, attention(q, k, v)) > tol, "gemma3 layer %d: causal attention without the window passes too" % l)
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
EOF
if [ -f "$work/all/meta.json" ] && [ -f "$work/some/meta.json" ]; then
  python3 "$check_py" smollm2 "$work/all" "$n" "$work/some" || fail "the array checks (above)"
fi

# 1: `crisp eval fidelity` reads the capture
if [ -f "$work/all/meta.json" ]; then
  "$crisp" eval fidelity --captures "$work/all" --layers 0,15 --threads 2 --quiet --json "$work/fidelity.json" > "$work/fidelity.out" 2>&1 \
    || fail "crisp eval fidelity exited $?: $(tail -n 3 "$work/fidelity.out")"
  python3 -c "
import json, sys
doc = json.load(open(sys.argv[1]))
layers = [l['layer'] for l in doc['captures'][0]['layers']]
sys.exit(0 if layers == [0, 15] else 'fidelity layers %s' % layers)" "$work/fidelity.json" || fail "the fidelity JSON"
fi

# 4: bad input
expect_error() {  # expected-text args...
  local expected="$1"
  shift
  "$tool" capture "$@" > "$work/bad.out" 2> "$work/bad.err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "'$*' exited $rc, expected 2"
  grep -q -e "$expected" "$work/bad.err" || fail "'$*': error does not mention '$expected': $(cat "$work/bad.err")"
}
expect_error "--layers" "${common[@]}" --layers 30 --out "$work/bad"
expect_error "--layers" "${common[@]}" --layers 1,x --out "$work/bad"
expect_error "--model" --model "$work/none.gguf" --prompt-file "$repo_root/README.md" --out "$work/bad"
expect_error "--prompt-file" --model "$model" --out "$work/bad"
expect_error "--prompt-file" --model "$model" --prompt-file "$work/none.txt" --out "$work/bad"
echo '[{"prompt": "Who?", "answer": "Me."}]' > "$work/qa.json"
expect_error "--qa-index" --model "$model" --qa-index 1 --qa-file "$work/qa.json" --out "$work/bad"
expect_error "--max-tokens" --model "$model" --split test --max-tokens 10 --out "$work/bad"
CRISP_DATA_DIR="$work/no_data_here" expect_error "--qa-file: not given.*no_data_here.*CRISP_DATA_DIR" \
  --model "$model" --qa-index 0 --out "$work/bad"
expect_error "--cache-type-k" "${common[@]}" --cache-type-k q4_9 --out "$work/bad"

# 5: Gemma 3, where cached
if [ -f "$gemma" ]; then
  "$tool" capture --model "$gemma" --prompt-file "$repo_root/README.md" --max-tokens 700 --threads 2 --quiet --with-output "${offload[@]}" \
    --layers 0,4,5,6 --out "$work/gemma" > /dev/null 2> "$work/gemma.err" || fail "gemma capture exited $?: $(tail -n 3 "$work/gemma.err")"
  [ -f "$work/gemma/meta.json" ] && { python3 "$check_py" gemma3 "$work/gemma" || fail "the Gemma 3 checks (above)"; }
else
  echo "note: no Gemma 3 at $gemma: its sliding-window part is not run (scripts/fetch_model.sh gemma3)"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "crisp-llama-eval capture: all checks passed"
