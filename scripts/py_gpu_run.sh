#!/usr/bin/env bash
# scripts/py_gpu_run.sh — the Python package on a GPU machine, one command:
#   1. pip install . from this tree (CUDA backend, sm_90a only, no build isolation: the machine has
#      no network; scikit-build-core, nanobind, cmake and ninja are already installed there);
#   2. pytest tests/python (numpy, torch CPU + CUDA, HF tiny-Llama tests);
#   3. bench/compare.py (SDPA flash / cuDNN, FlexAttention on crisp's layout, crisp), table last.
# Logs and JSON go to $OUT (default ./out/py_gpu_run).
#
# Environment knobs:
#   PREBUILT_WHEEL=path.whl   install this wheel instead of building (e.g. one built here with
#                             `pip wheel . -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a` on Python 3.12)
#   CUDA_ARCHS=90a            CMAKE_CUDA_ARCHITECTURES of the build
#   JOBS=16                   build parallelism
#   SKIP_TESTS=1              no pytest;  PYTEST_TIMEOUT=150 (seconds, whole run)
#   PYTEST_K="gpu or cuda"    a pytest -k expression (e.g. only the GPU tests)
#   COMPARE_ARGS="--seq 8192,32768,131072 --long"   arguments of bench/compare.py ("skip" skips it)
#   COMPARE_TIMEOUT=240       wall-clock cap of bench/compare.py (seconds)
#   .whl/*.whl                wheels carried along (e.g. gguf for eval/hf_niah.py) are installed
#                             into /tmp/crisp-site first
#   HF_NIAH_SAMPLES=file.jsonl  also run eval/hf_niah.py on these samples (from `crisp eval niah
#                             --dry-run --dump-samples`), outputs in $OUT/hf_niah_outputs.jsonl for
#                             `crisp eval niah --score`; needs the gguf wheel in .whl/ and the model:
#   HF_NIAH_MODEL=.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf   HF_NIAH_ARGS="--policies crisp,dense"
#   HF_NIAH_TIMEOUT=300
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out/py_gpu_run}
mkdir -p "$OUT"
JOBS=${JOBS:-16}
CUDA_ARCHS=${CUDA_ARCHS:-90a}
COMPARE_ARGS=${COMPARE_ARGS:---seq 8192,32768,131072 --long}
PY=${PYTHON:-python3}
SUMMARY=()
note() { echo "== $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1
$PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'

if ls .whl/*.whl >/dev/null 2>&1; then
  note "carried wheels: $(ls .whl)"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/crisp-site .whl/*.whl \
    && export PYTHONPATH=/tmp/crisp-site${PYTHONPATH:+:$PYTHONPATH}
fi

# ---------------------------------------------------------------- install
T0=$(date +%s)
if [ -n "${PREBUILT_WHEEL:-}" ]; then
  note "pip install $PREBUILT_WHEEL (prebuilt)"
  $PY -m pip install --no-deps --no-index --force-reinstall "$PREBUILT_WHEEL" >"$OUT/pip_install.log" 2>&1
else
  note "pip install . (CUDA archs $CUDA_ARCHS, -j$JOBS)"
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS $PY -m pip install -v --no-build-isolation --no-deps --force-reinstall \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" . >"$OUT/pip_install.log" 2>&1
fi
RC=$?
if [ $RC -ne 0 ]; then
  grep -E "error|Error" "$OUT/pip_install.log" | head -30
  tail -20 "$OUT/pip_install.log"
  echo "py_gpu_run.sh: install failed (rc=$RC)"; exit 1
fi
SUMMARY+=("install: ok in $(( $(date +%s) - T0 )) s")
# Import from outside the tree (the tree's python/crisp has no native module).
(cd /tmp && $PY -c 'import crisp; print("crisp", crisp.__version__, "built_with_cuda", crisp.built_with_cuda, "cuda_available", crisp.cuda_available())') \
  | tee -a "$OUT/pip_install.log"

# ---------------------------------------------------------------- tests
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  note "pytest tests/python"
  T0=$(date +%s)
  timeout "${PYTEST_TIMEOUT:-150}" $PY -m pytest -q -rs -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} tests/python >"$OUT/pytest.log" 2>&1
  RC=$?
  grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUT/pytest.log" | tail -25
  SUMMARY+=("pytest tests/python: rc=$RC, $(tail -1 "$OUT/pytest.log") ($(( $(date +%s) - T0 )) s)")
fi

# ---------------------------------------------------------------- compare
if [ "$COMPARE_ARGS" != skip ]; then
  note "bench/compare.py $COMPARE_ARGS"
  T0=$(date +%s)
  timeout "${COMPARE_TIMEOUT:-240}" $PY bench/compare.py $COMPARE_ARGS --json "$OUT/compare.json" \
    >"$OUT/compare.txt" 2>"$OUT/compare_progress.log"
  RC=$?
  if [ $RC -eq 0 ]; then tail -4 "$OUT/compare_progress.log"; else cat "$OUT/compare_progress.log"; fi
  SUMMARY+=("bench/compare.py: rc=$RC in $(( $(date +%s) - T0 )) s (124 = stopped by COMPARE_TIMEOUT; progress in compare_progress.log)")
fi

# ---------------------------------------------------------------- NIAH through transformers
if [ -n "${HF_NIAH_SAMPLES:-}" ]; then
  note "eval/hf_niah.py --samples $HF_NIAH_SAMPLES ${HF_NIAH_ARGS:-}"
  T0=$(date +%s)
  timeout "${HF_NIAH_TIMEOUT:-300}" $PY eval/hf_niah.py --samples "$HF_NIAH_SAMPLES" \
    --model "${HF_NIAH_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}" --out "$OUT/hf_niah_outputs.jsonl" \
    ${HF_NIAH_ARGS:-} >"$OUT/hf_niah.log" 2>&1
  RC=$?
  tail -6 "$OUT/hf_niah.log"
  SUMMARY+=("eval/hf_niah.py: rc=$RC, $(wc -l <"$OUT/hf_niah_outputs.jsonl" 2>/dev/null || echo 0) outputs ($(( $(date +%s) - T0 )) s); score here: crisp eval niah --score hf_niah_outputs.jsonl")
fi

echo
echo "==================== summary ($(date -u +%Y-%m-%dT%H:%MZ))"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
[ -s "$OUT/compare.txt" ] && cat "$OUT/compare.txt"
exit 0
