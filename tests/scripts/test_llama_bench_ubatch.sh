#!/usr/bin/env bash
# scripts/llama_bench.py's -ub: the prompt length up to --max-ubatch, cut down (halved) only as far
# as llama.cpp's F32 KQ mask of the last ubatch needs to fit INT_MAX bytes (its CUDA copy aborts
# beyond: the 32k rows of the H200 run); a failed run's message keeps the assertion, not the
# backtrace after it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 - "$here/../../scripts" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import llama_bench as lb

INT_MAX = 2**31 - 1
def mask_bytes(n, ubatch):  # llama.cpp's mask: KV cells padded to 256 by rows padded to 64, F32
    return 4 * (-(-n // 256) * 256) * (-(-ubatch // 64) * 64)

failures = []
for n in (256, 1000, 8192, 16384, 32768, 50000, 65536, 131072, 524288):
    for max_ubatch in (512, 4096, 32768, 10**6):
        ub = lb.ubatch_for(n, max_ubatch)
        wanted = min(n, max_ubatch)
        if not 1 <= ub <= wanted:
            failures.append(f"n {n}, max {max_ubatch}: -ub {ub} outside 1..{wanted}")
        if mask_bytes(n, ub) > INT_MAX:
            failures.append(f"n {n}, max {max_ubatch}: -ub {ub} leaves a mask of {mask_bytes(n, ub)} bytes")
        if ub != wanted and mask_bytes(n, min(2 * ub, wanted)) <= INT_MAX:
            failures.append(f"n {n}, max {max_ubatch}: -ub {ub} cut further than the mask needs")
if lb.ubatch_for(32768, 32768) == 32768:
    failures.append("n 32768: the whole prompt in one ubatch (a 4 GiB mask)")

backtrace = ("ggml_cuda_init: found 1 CUDA devices:\n"
             "/src/ggml/src/ggml-cuda/cpy.cu:285: GGML_ASSERT(ggml_nbytes(src0) <= INT_MAX) failed\n"
             "/lib/x86_64-linux-gnu/libc.so.6(+0x2a1ca)[0x7f]\n"
             "/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x8b)[0x7f]\n"
             "bin/llama-bench(+0x41bd5)[0x56]\n")
if "GGML_ASSERT(ggml_nbytes(src0) <= INT_MAX) failed" not in lb.failure_lines(backtrace):
    failures.append(f"failure_lines dropped the assertion: {lb.failure_lines(backtrace)!r}")
plain = lb.failure_lines("one\ntwo\nthree\nfour\n")
if plain != "two | three | four":
    failures.append(f"failure_lines without an error line: {plain!r}")
for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
PY
echo "ok: llama_bench.py -ub within llama.cpp's KQ-mask limit"
