#!/usr/bin/env bash
# scripts/passkey_copy_probe.py: its prompts hold the key once, at the asked share of the lines, and
# end with the question; the answer is the first number after the prompt (not one inside it); the
# two splits share no (lines, position, key) prompt; a missing llama-cli is refused by name.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 - "$here/../../scripts" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import passkey_copy_probe as probe

failures = []
def check(ok, what):
    if not ok:
        failures.append(what)

prompt = probe.prompt_of(40, 0.5, 7364)
lines = prompt.split("\n")
check(prompt.endswith("\n" + probe.QUESTION), "the prompt ends with the question")
check(prompt.count("7364") == 2 and sum("7364" in l for l in lines) == 1, "one needle line holds the key")
needle = next(i for i, l in enumerate(lines) if "7364" in l)
check(needle == 21, f"the needle follows filler line 20 of 40 (line {needle})")
check(probe.answer_of(prompt + " 7364. The sky") == "7364", "the answer after the prompt")
check(probe.answer_of(prompt + " the other side.") == "", "no number after the prompt: no answer (not the key inside it)")
check(probe.answer_of(prompt + " 736.") == "736", "a truncated key is the model's answer as given")
tuning = {(l, p, k) for l in probe.SPLITS["tuning"]["lines"] for p in probe.SPLITS["tuning"]["positions"] for k in probe.SPLITS["tuning"]["keys"]}
test = {(l, p, k) for l in probe.SPLITS["test"]["lines"] for p in probe.SPLITS["test"]["positions"] for k in probe.SPLITS["test"]["keys"]}
check(not (tuning & test), "the splits share no prompt")
if failures:
    sys.exit("FAIL: " + "; ".join(failures))
print("ok: passkey_copy_probe prompts, answers and splits")
PY
out="$(python3 "$here/../../scripts/passkey_copy_probe.py" --bin /nonexistent --model x.gguf --split tuning --points crisp --json /dev/null 2>&1 || true)"
grep -q -- "--bin /nonexistent: no llama-cli there" <<<"$out" || { echo "FAIL: a missing llama-cli is not named: $out"; exit 1; }
echo "ok: a missing llama-cli is refused"
