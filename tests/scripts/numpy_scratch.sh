# tests/scripts/numpy_scratch.sh — sourced by the script tests that run crisp and a numpy script:
# skips the test (exit 77, ctest's SKIP_RETURN_CODE) without python3 + numpy, and makes a scratch
# folder $tmp removed on exit.
python3 -c "import numpy" 2>/dev/null || { echo "skip: python3 with numpy is needed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
