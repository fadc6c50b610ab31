#!/usr/bin/env bash
# scripts/split_model_for_gpu.sh — prepares model files (GGUF, hundreds of MB) for the GPU machine,
# which takes at most 64 MiB per `run` call (the working tree that travels with every call
# included): each model is cut into pieces, the pieces are packed into carry folders
# .modelcarry/c00, c01, ... of at most --part-mb MB each, and every folder also holds each model's
# name and sha256, so the join on the machine can check what arrived.
#
#   here:   scripts/split_model_for_gpu.sh [--part-mb MB] MODEL...   # default: the SmolLM2 model
#   call i (one per folder, each at once after the one before: a warm machine keeps /tmp for 30 s
#   after a call):
#           run(carry=[".modelcarry/c0i"], command="mkdir -p /tmp/modelstore && cp .modelcarry/c0i/* /tmp/modelstore/")
#   the last call also joins and runs, e.g.
#           "... && scripts/split_model_for_gpu.sh --join /tmp/modelstore && CRISP_MODEL_PATH=/tmp/modelstore/<name> ..."
#
# --join DIR concatenates DIR/<name>.part000, .part001, ... of every model whose manifest
# (DIR/<name>.parts: the number of pieces) is there into DIR/<name> and checks its sha256
# (DIR/<name>.sha256); it exits 1, removing the joined file, when a piece is missing or the sum
# differs, so a half-copied or stale piece never runs. The pieces are deleted after a good join.
#
# The pieces wait in /tmp on the machine: a folder inside the working tree that a call did not
# carry is not kept for the next call (seen 2026-11-29), /tmp of a warm machine is. .modelcarry/
# must be ignored (.gitignore) so that it travels only when carried.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "split_model_for_gpu: error: $1" >&2; exit "${2:-2}"; }

if [ "${1:-}" = "--join" ]; then
  DIR=${2:?usage: $0 --join DIR}
  joined=0
  for manifest in "$DIR"/*.parts; do
    [ -e "$manifest" ] || continue
    NAME=$(basename "$manifest" .parts)
    COUNT=$(cat "$manifest")
    pieces=()
    for ((i = 0; i < COUNT; i++)); do
      piece=$(printf '%s/%s.part%03d' "$DIR" "$NAME" "$i")
      [ -f "$piece" ] || die "$piece is missing: carry every .modelcarry folder first" 1
      pieces+=("$piece")
    done
    # Joined under another name and renamed once checked: a process waiting for the model file
    # (scripts/gpu_pipeline.sh) never sees it half written.
    cat "${pieces[@]}" >"$DIR/$NAME.joining"
    if [ "$(sha256sum "$DIR/$NAME.joining" | cut -d' ' -f1)" != "$(cut -d' ' -f1 "$DIR/$NAME.sha256")" ]; then
      rm -f "$DIR/$NAME.joining"
      die "sha256 mismatch: $DIR/$NAME is not the model file (a piece is stale)" 1
    fi
    mv "$DIR/$NAME.joining" "$DIR/$NAME"
    rm -f "${pieces[@]}" "$manifest"
    echo "model: $DIR/$NAME ($(stat -c %s "$DIR/$NAME") bytes, sha256 ok)"
    joined=$((joined + 1))
  done
  # Models joined by an earlier call stay usable: only a missing manifest AND model is an error.
  [ "$joined" -gt 0 ] || ls "$DIR"/*.gguf >/dev/null 2>&1 || die "no model manifest (*.parts) in $DIR" 1
  exit 0
fi

PART_MB=48  # NOTE: 48 MB of model per call leaves 16 MiB of the 64 MiB for the working tree (~8 MB).
models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --part-mb) [ $# -ge 2 ] || die "--part-mb needs a number of MB"; PART_MB=$2; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1'; expected --part-mb MB, --join DIR or model paths" ;;
    *) models+=("$1") ;;
  esac
  shift
done
[[ "$PART_MB" =~ ^[1-9][0-9]*$ ]] || die "--part-mb '$PART_MB': expected a positive whole number of MB"
[ ${#models[@]} -gt 0 ] || models=("${CRISP_MODEL_PATH:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}")
for m in "${models[@]}"; do [ -f "$m" ] || die "no model at $m (scripts/fetch_model.sh fetches them)" 1; done

LIMIT=$(( 64 * 1024 * 1024 ))
TREE=$(git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
PART=$(( PART_MB * 1000 * 1000 ))
[ $(( PART + TREE )) -le "$LIMIT" ] || die "--part-mb $PART_MB plus the working tree ($TREE bytes) exceeds the 64 MiB a call carries"
grep -qx "/.modelcarry/" .gitignore || die ".modelcarry/ is not ignored in .gitignore"

rm -rf .modelcarry
folder=0 used=0
folder_path() { printf '.modelcarry/c%02d' "$1"; }
mkdir -p "$(folder_path 0)"
manifests=()
for m in "${models[@]}"; do
  NAME=$(basename "$m")
  SIZE=$(stat -c %s "$m")
  offset=0 piece=0
  while [ "$offset" -lt "$SIZE" ]; do
    room=$(( PART - used ))
    if [ "$room" -le 0 ]; then folder=$((folder + 1)); used=0; room=$PART; mkdir -p "$(folder_path "$folder")"; fi
    take=$(( SIZE - offset < room ? SIZE - offset : room ))
    out=$(printf '%s/%s.part%03d' "$(folder_path "$folder")" "$NAME" "$piece")
    dd if="$m" of="$out" bs=1M iflag=skip_bytes,count_bytes skip="$offset" count="$take" status=none
    offset=$(( offset + take )); used=$(( used + take )); piece=$((piece + 1))
  done
  (cd "$(dirname "$m")" && sha256sum "$NAME") >".modelcarry/$NAME.sha256"
  echo "$piece" >".modelcarry/$NAME.parts"
  manifests+=(".modelcarry/$NAME.sha256" ".modelcarry/$NAME.parts")
  # Check the pieces here before anything travels.
  cat $(for ((i = 0; i < piece; i++)); do ls .modelcarry/c*/"$(printf '%s.part%03d' "$NAME" "$i")"; done) | cmp - "$m"
done
# Every folder carries the manifests (tiny), so the join works whichever call comes last.
for d in .modelcarry/c*; do cp "${manifests[@]}" "$d/"; done
rm -f "${manifests[@]}"
echo "working tree $TREE bytes; $((folder + 1)) calls, one per folder:"
for d in .modelcarry/c*; do echo "  $d $(du -cb "$d" | tail -1 | cut -f1) bytes"; done
