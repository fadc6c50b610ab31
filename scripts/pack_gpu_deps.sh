#!/usr/bin/env bash
# scripts/pack_gpu_deps.sh — copies the header-only / source dependencies of the build into .deps/
# so they can travel to a GPU machine that has no package registry (scripts/gpu.sh uses them
# when the machine lacks them): GoogleTest sources (built there), CLI11 and nlohmann-json headers
# with their CMake package files. Run here, on a machine where the Debian packages libgtest-dev,
# libcli11-dev and nlohmann-json3-dev are installed; .deps/ is kept out of git
# (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.deps
# Only what this script writes: .deps/ also holds llama.cpp's sdist, source tree and builds.
rm -rf "$DEST/prefix" "$DEST/googletest"
mkdir -p "$DEST/prefix/include" "$DEST/prefix/share/cmake"
need() { [ -e "$1" ] || { echo "pack_gpu_deps: missing $1 (install $2)" >&2; exit 1; }; }
need /usr/src/googletest/CMakeLists.txt libgtest-dev
need /usr/include/CLI/CLI.hpp libcli11-dev
need /usr/include/nlohmann/json.hpp nlohmann-json3-dev
cp -r /usr/src/googletest "$DEST/googletest"
cp -r /usr/include/CLI "$DEST/prefix/include/"
cp -r /usr/include/nlohmann "$DEST/prefix/include/"
# Package files: their paths are relative to their own location (prefix/share/cmake/<name>).
for pkg in CLI11 nlohmann_json; do
  src=""
  for dir in /usr/share/cmake/$pkg /usr/lib/cmake/$pkg /usr/lib/x86_64-linux-gnu/cmake/$pkg; do
    [ -d "$dir" ] && { src=$dir; break; }
  done
  [ -n "$src" ] || { echo "pack_gpu_deps: no CMake package files for $pkg" >&2; exit 1; }
  cp -r "$src" "$DEST/prefix/share/cmake/$pkg"
done
grep -qsx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >> .git/info/exclude
echo "pack_gpu_deps: $(du -shc "$DEST/prefix" "$DEST/googletest" | tail -n 1 | cut -f1) in $DEST/prefix and $DEST/googletest (carry both: run(..., carry=[\".deps/prefix\", \".deps/googletest\"]))"
