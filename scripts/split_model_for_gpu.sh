#!/usr/bin/env bash
# scripts/split_model_for_gpu.sh — prepares the real model (SmolLM2-135M-Instruct Q4_1 GGUF, 98 MB)
# for the GPU machine, which takes at most 64 MiB of working tree per `run` call (the tree itself
# included), split unevenly so that the second call also has room for the binaries.
#
# The file goes over in two consecutive `run` calls (a warm machine keeps its disk for 30 s after a
# call, so the second call must follow the first at once):
#
#   here:   scripts/split_model_for_gpu.sh          # -> .modelcarry/part_a/, .modelcarry/part_b/
#   call 1: run(carry=[".modelcarry/part_a"], command=
#             "mkdir -p /tmp/modelstore && cp .modelcarry/part_a/* /tmp/modelstore/")
#   call 2 (at once): run(carry=[".modelcarry/part_b", ".gpubin", ".whl"], command=
#             "cp .modelcarry/part_b/* /tmp/modelstore/ && scripts/split_model_for_gpu.sh --join /tmp/modelstore &&
#              CRISP_MODEL_PATH=/tmp/modelstore/SmolLM2-135M-Instruct.Q4_1.gguf CRISP_GPU_BIN=.gpubin scripts/gpu.sh model")
#
# --join DIR concatenates DIR/model.part_a + DIR/model.part_b into DIR/<model file name> and checks
# its sha256 against DIR/model.sha256; it exits 1 (and removes the joined file) on a mismatch, so a
# half-copied or stale part is never run.
#
# The first part waits in /tmp on the machine: a folder inside the working tree that a call did not
# carry is not kept for the next call (seen 2026-11-29), /tmp of a warm machine is. .modelcarry/
# must be ignored (.git/info/exclude) so that it travels only when carried; this script adds it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--join" ]; then
  DIR=${2:?usage: $0 --join DIR}
  NAME=$(cat "$DIR/model.name")
  cat "$DIR/model.part_a" "$DIR/model.part_b" >"$DIR/$NAME"
  if ! (cd "$DIR" && sha256sum -c model.sha256); then
    echo "sha256 mismatch: $DIR/$NAME is not the model file (a part is missing or stale)" >&2
    rm -f "$DIR/$NAME"
    exit 1
  fi
  echo "model: $DIR/$NAME ($(stat -c %s "$DIR/$NAME") bytes, sha256 ok)"
  exit 0
fi

MODEL=${CRISP_MODEL_PATH:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "no model at $MODEL (run scripts/fetch_model.sh)" >&2; exit 1; }
NAME=$(basename "$MODEL")
SIZE=$(stat -c %s "$MODEL")
# The first part takes what call 1 can carry: 64 MiB less the working tree that travels with every
# call (tracked + untracked-not-ignored files) and a 2 MiB margin; the second part the rest, which
# leaves call 2 room for the binaries (.gpubin: crisp + long_qa_prompts.json, ~13 MB) and .whl.
LIMIT=$(( 64 * 1024 * 1024 ))
TREE=$(git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
MARGIN=$(( 2 * 1024 * 1024 ))
HALF=${PART_A_BYTES:-$(( LIMIT - TREE - MARGIN ))}
[ "$HALF" -ge "$SIZE" ] && HALF=$(( (SIZE + 1) / 2 ))
[ "$HALF" -le 0 ] && { echo "the working tree ($TREE bytes) leaves no room for a model part" >&2; exit 1; }
for ignored in /.modelcarry/; do
  grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >>.git/info/exclude
done
rm -rf .modelcarry
mkdir -p .modelcarry/part_a .modelcarry/part_b
head -c "$HALF" "$MODEL" >.modelcarry/part_a/model.part_a
tail -c +"$((HALF + 1))" "$MODEL" >.modelcarry/part_b/model.part_b
(cd "$(dirname "$MODEL")" && sha256sum "$NAME") >.modelcarry/part_b/model.sha256
echo "$NAME" >.modelcarry/part_b/model.name
cp .modelcarry/part_b/model.sha256 .modelcarry/part_b/model.name .modelcarry/part_a/
# Check the split here before anything travels.
cat .modelcarry/part_a/model.part_a .modelcarry/part_b/model.part_b | cmp - "$MODEL"
B=$(( SIZE - HALF ))
BIN_BYTES=$(du -cb .gpubin .whl 2>/dev/null | tail -1 | cut -f1)
echo "working tree $TREE bytes; call 1 carries $HALF + tree = $(( HALF + TREE )) bytes; call 2 carries $B + tree +" \
     "binaries/wheels $BIN_BYTES = $(( B + TREE + BIN_BYTES )) bytes (limit $LIMIT each)"
if [ $(( HALF + TREE )) -gt "$LIMIT" ] || [ $(( B + TREE + BIN_BYTES )) -gt "$LIMIT" ]; then
  echo "a call would exceed the 64 MiB limit: carry less (e.g. only crisp in .gpubin) or set PART_A_BYTES" >&2
  exit 1
fi
echo "ok: carry .modelcarry/part_a in one call and .modelcarry/part_b in the next (see the header)"
