#!/usr/bin/env bash
# scripts/setup.sh — installs the build dependencies of crisp that are missing (Debian/Ubuntu).
# Idempotent and quiet: does nothing when everything is present. Runs apt-get directly as root,
# through sudo otherwise (when sudo exists).
set -euo pipefail

# Debian package -> what it provides.
#   cmake, make, g++       build tools (g++ brings OpenMP's libgomp)
#   libgtest-dev           GoogleTest (the test suite)
#   nlohmann-json3-dev     JSON output of the CLI
#   libcli11-dev           command-line parsing of the CLI
packages=(cmake make g++ libgtest-dev nlohmann-json3-dev libcli11-dev)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: not a Debian/Ubuntu system; install these yourself: ${packages[*]}" >&2
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: missing packages (${missing[*]}) and neither root nor sudo; install them and retry" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq >/dev/null
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The CMake version check: the project needs 3.24 or newer.
cmake_version=$(cmake --version | head -n1 | awk '{print $3}')
if [ "$(printf '%s\n3.24\n' "$cmake_version" | sort -V | head -n1)" != "3.24" ]; then
  echo "setup: cmake $cmake_version is older than the 3.24 crisp needs" >&2
  exit 1
fi
