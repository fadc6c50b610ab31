#!/usr/bin/env bash
# scripts/demo.sh — installs what is missing, builds the `crisp` command into build/ and runs
# `crisp demo` (extra arguments are passed on, e.g. ./scripts/demo.sh --seq 32768).
# The CUDA backend is compiled when nvcc is found (CRISP_CUDA=AUTO); the demo then runs on the
# GPU if one is present, on the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
jobs=${CRISP_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target crisp_cli
./build/crisp demo "$@"
