#!/usr/bin/env bash
# scripts/llama_cpp.sh — fetches llama.cpp (the copy vendored in PyPI's llama-cpp-python sdist,
# pinned by version and sha256), applies crisp's integration (integrations/llama.cpp/crisp.patch)
# and builds llama.cpp's tools linking crisp from this checkout, the hook's test
# (test-ggml-crisp), llama-attn-time (the attention share of prompt processing) and
# crisp-llama-eval (crisp's NIAH evaluation on llama.cpp, docs/evaluation.md).
# docs/llama_cpp.md explains the integration.
#
# Usage: scripts/llama_cpp.sh [--cuda] [--server] [--target NAME]... [--pack DIR]
#   --cuda        the GPU machine's build: GGML_CUDA=ON (ggml for sm_90, crisp for sm_90a), in .deps/llama.cpp-build-cuda,
#                 with crisp's CUDA backend (CRISP_CUDA=ON) and its hook in ggml-cuda
#   --server      also build llama-server (several minutes more on two cores)
#   --target T    build T too (repeatable), e.g. test-backend-ops
#   --pack DIR    then copy the build's runtime (bin/*.so, llama-cli, llama-bench, llama-server
#                 when built, test-ggml-crisp, llama-attn-time, crisp-llama-eval; stripped; they find each other by
#                 rpath $ORIGIN) into DIR (emptied first; e.g. .gpubin/llama-cuda, ignored) and print
#                 its size: binaries to carry to a machine that runs them without building (it needs
#                 the CUDA runtime and cuBLAS of the toolkit they were built with)
#   --update-patch  after editing .deps/llama.cpp-src: rewrite crisp.patch from it (the files the
#                 patch touches, plus LLAMA_CPP_PATCH_FILES, paths inside llama.cpp) and stop
# Prints the directory of the built binaries on stdout (and nothing else), so callers can write
# BIN=$(scripts/llama_cpp.sh). Progress goes to stderr, compiler output to a log in the build
# directory (its tail is printed on failure). JOBS (default 2) sets the build's parallelism.
#
# Idempotent: the sdist is kept in .deps/ and checked against its sha256 whenever a source tree is
# made from it (a machine holding the patched tree needs no sdist); the source tree in
# .deps/llama.cpp-src is extracted and patched again only when the sdist or the patch changed
# (a stamp file records both sha256s); the build is incremental (ccache when installed).
set -euo pipefail

readonly SDIST_SPEC="llama-cpp-python==0.3.16"
readonly SDIST_NAME="llama_cpp_python-0.3.16.tar.gz"
# The pinned artifact: sha256 of the sdist on PyPI when this script was written. A mismatch means
# a different file: refuse it.
readonly SDIST_SHA256="34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
readonly VENDORED_DIR="llama_cpp_python-0.3.16/vendor/llama.cpp"

die() { echo "llama_cpp: error: $*" >&2; exit 2; }
say() { echo "llama_cpp: $*" >&2; }

cuda=0
update_patch=0
pack_dir=""
targets=(llama-cli llama-bench llama-simple llama-perplexity)
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=1 ;;
    --server) targets+=(llama-server) ;;
    --target) [ $# -ge 2 ] || die "--target needs a target name"; targets+=("$2"); shift ;;
    --update-patch) update_patch=1 ;;
    --pack) [ $# -ge 2 ] || die "--pack needs a directory"; pack_dir="$2"; shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'; expected --cuda, --server, --target NAME, --pack DIR, --update-patch or --help" ;;
  esac
  shift
done
jobs="${JOBS:-2}"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "JOBS='$jobs'; expected a positive integer"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$repo_root/.deps"
patch_file="$repo_root/integrations/llama.cpp/crisp.patch"
src="$deps/llama.cpp-src"
if [ "$cuda" -eq 1 ]; then build="$deps/llama.cpp-build-cuda"; else build="$deps/llama.cpp-build"; fi
for tool in cmake tar sha256sum patch; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is not installed (scripts/setup.sh installs the build tools)"
done
[ -f "$patch_file" ] || die "missing $patch_file"
mkdir -p "$deps"

# ---- the sdist, verified (fetched only when a source tree must be made from it)
sdist="$deps/$SDIST_NAME"
ensure_sdist() {
  if [ -f "$sdist" ] && [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$SDIST_SHA256" ]; then
    say "removing $sdist: its sha256 is not the pinned one"
    rm -f "$sdist"
  fi
  if [ ! -f "$sdist" ]; then
    command -v python3 >/dev/null 2>&1 || die "python3 (with pip) is needed to download $SDIST_SPEC"
    say "downloading $SDIST_SPEC (sdist, about 50 MB) from PyPI"
    tmp="$(mktemp -d "$deps/download.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --no-binary :all: "$SDIST_SPEC" -d "$tmp" >&2 \
      || die "pip could not download $SDIST_SPEC"
    [ -f "$tmp/$SDIST_NAME" ] || die "pip did not produce $SDIST_NAME"
    got="$(sha256sum "$tmp/$SDIST_NAME" | cut -d' ' -f1)"
    [ "$got" = "$SDIST_SHA256" ] || die "$SDIST_NAME has sha256 $got; expected $SDIST_SHA256"
    mv "$tmp/$SDIST_NAME" "$sdist"
    rm -rf "$tmp"
    trap - EXIT
  fi
}

# ---- crisp.patch rewritten from an edited source tree
if [ "$update_patch" -eq 1 ]; then
  [ -d "$src" ] || die "no $src to make the patch from (run this script once first)"
  ensure_sdist
  pristine="$(mktemp -d)"
  trap 'rm -rf "$pristine"' EXIT
  tar -xzf "$sdist" -C "$pristine" --strip-components=3 "$VENDORED_DIR" || die "could not extract $VENDORED_DIR"
  files="$(sed -n 's|^+++ b/||p' "$patch_file") ${LLAMA_CPP_PATCH_FILES:-}"
  new_patch="$(mktemp)"
  for f in $(echo "$files" | tr ' ' '\n' | sort -u); do
    if [ ! -f "$src/$f" ]; then
      # a file the patch added and that is gone from the tree: dropped from the patch
      [ ! -f "$pristine/$f" ] && grep -q "^+++ b/$f\$" "$patch_file" && { say "dropping $f (removed)"; continue; }
      die "LLAMA_CPP_PATCH_FILES: no file $f in $src"
    fi
    # A file the patch adds (absent from the sdist) is diffed against /dev/null, as git writes it.
    old="$pristine/$f" old_label="a/$f"
    [ -f "$old" ] || old=/dev/null old_label=/dev/null
    diff -u --label "$old_label" --label "b/$f" "$old" "$src/$f" >> "$new_patch" || true
  done
  mv "$new_patch" "$patch_file"
  echo "sdist $SDIST_SHA256 patch $(sha256sum "$patch_file" | cut -d' ' -f1)" > "$src/.crisp-stamp"
  say "wrote $patch_file ($(grep -c '^+++ ' "$patch_file") files)"
  exit 0
fi

# ---- the patched source tree
stamp_want="sdist $SDIST_SHA256 patch $(sha256sum "$patch_file" | cut -d' ' -f1)"
if [ ! -f "$src/.crisp-stamp" ] || [ "$(cat "$src/.crisp-stamp")" != "$stamp_want" ]; then
  ensure_sdist
  say "extracting llama.cpp from $SDIST_NAME and applying crisp.patch"
  rm -rf "$src" "$src.tmp"
  mkdir -p "$src.tmp"
  tar -xzf "$sdist" -C "$src.tmp" --strip-components=3 "$VENDORED_DIR" || die "could not extract $VENDORED_DIR"
  # The sdist keeps a submodule's .git file pointing at a directory it does not ship; llama.cpp's
  # build asks git for its version and would warn about it.
  rm -f "$src.tmp/.git"
  patch -d "$src.tmp" -p1 --quiet --forward < "$patch_file" || die "crisp.patch does not apply to $SDIST_NAME"
  echo "$stamp_want" > "$src.tmp/.crisp-stamp"
  mv "$src.tmp" "$src"
fi

# ---- configure and build
cmake_args=(-S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON
  -DGGML_CRISP_SOURCE_DIR="$repo_root" -DCRISP_NCCL=OFF
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON)  # bin/ finds its libraries by $ORIGIN: --pack copies it as is
if command -v ninja >/dev/null 2>&1; then cmake_args+=(-G Ninja); fi
if command -v ccache >/dev/null 2>&1; then
  cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [ "$cuda" -eq 1 ]; then
  # crisp's CUDA backend for the hook in ggml-cuda. ggml's kernels for sm_90 (they use no
  # 90a-only instruction; 90 and 90a compile its mma flash-attention kernel alike), crisp's own
  # targets for 90a (its Hopper kernel needs wgmma); the hook's source is ggml-cuda's (90).
  cmake_args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCRISP_CUDA_ARCHITECTURES=90a -DCRISP_CUDA=ON)
else
  cmake_args+=(-DGGML_CUDA=OFF -DCRISP_CUDA=OFF)
fi
mkdir -p "$build"
log="$build/crisp-build.log"
if [ ! -f "$build/CMakeCache.txt" ] || [ "$src/.crisp-stamp" -nt "$build/CMakeCache.txt" ]; then
  say "configuring $build"
  if ! cmake "${cmake_args[@]}" > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "configuring llama.cpp failed (log: $log)"
  fi
fi
# A machine without the NVIDIA driver (this project's CPU development machine) has no libcuda.so.1,
# which libggml-cuda.so needs at link time of every executable: link against the toolkit's stub
# (GNU ld looks for a library's dependencies in LD_LIBRARY_PATH too). The binaries keep RUNPATH
# $ORIGIN only, so at run time the GPU machine's driver library is the one loaded.
if [ "$cuda" -eq 1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  driver_stub="$(sed -n 's/^CUDA_cuda_driver_LIBRARY:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)"
  toolkit_bin="$(sed -n 's/^CUDAToolkit_BIN_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)"
  stub=""
  for candidate in "$driver_stub" "$toolkit_bin/../lib64/stubs/libcuda.so"; do
    case "$candidate" in */stubs/libcuda.so) [ -f "$candidate" ] && { stub="$candidate"; break; } ;; esac
  done
  if [ -n "$stub" ]; then
    mkdir -p "$build/cuda-stub"
    ln -sf "$stub" "$build/cuda-stub/libcuda.so.1"
    export LD_LIBRARY_PATH="$build/cuda-stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "no libcuda.so.1 here: linking against the CUDA toolkit's stub"
  fi
fi
say "building ${targets[*]} (-j$jobs)"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >> "$log" 2>&1; then
  tail -n 30 "$log" >&2
  die "building llama.cpp failed (log: $log)"
fi

# The crisp archive's CUDA code needs its runtime where this build has crisp's CUDA backend (as
# CMake found it); the binaries linked by hand below add it.
crisp_cuda_libs=()
cuda_lib_dir="$(sed -n 's/^CUDAToolkit_LIBRARY_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)"
if [ "$cuda" -eq 1 ] && [ -n "$cuda_lib_dir" ]; then crisp_cuda_libs=(-L "$cuda_lib_dir" -lcudart); fi

# The hook's own test (integrations/llama.cpp/test_ggml_crisp.cpp), linked to the patched ggml;
# it also tests the hooks' shared rules (ggml-crisp-rules.cpp, compiled in with crisp's archive).
test_src="$repo_root/integrations/llama.cpp/test_ggml_crisp.cpp"
rules_src="$repo_root/integrations/llama.cpp/ggml-crisp-rules.cpp"
test_bin="$build/bin/test-ggml-crisp"
test_stale=0
for f in "$test_src" "$rules_src" "$repo_root/integrations/llama.cpp/ggml-crisp-rules.h" "$build/bin/libggml-cpu.so" \
         "$build/crisp/libcrisp.a"; do
  [ -x "$test_bin" ] && [ ! "$f" -nt "$test_bin" ] || test_stale=1
done
if [ "$test_stale" -eq 1 ]; then
  mkdir -p "$build/test-ggml-crisp"
  rules_obj="$build/test-ggml-crisp/ggml-crisp-rules.o"
  if ! "${CXX:-c++}" -O2 -std=c++17 -Wall -c "$rules_src" -o "$rules_obj" -I "$src/ggml/include" -I "$src/ggml/src" \
      -I "$repo_root/include" -I "$repo_root/src" >> "$log" 2>&1 \
    || ! "${CXX:-c++}" -O2 -std=c++17 -Wall -I "$src/ggml/include" -I "$repo_root/integrations/llama.cpp" \
      -I "$repo_root/include" "$test_src" "$rules_obj" -o "$test_bin" "$build/crisp/libcrisp.a" -fopenmp \
      -L "$build/bin" -lggml-cpu -lggml-base -lggml "${crisp_cuda_libs[@]}" -Wl,-rpath,'$ORIGIN' >> "$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "building test-ggml-crisp failed (log: $log)"
  fi
fi
# llama-attn-time (integrations/llama.cpp/llama_attn_time.cpp): the attention share of prompt
# processing, timed node by node (scripts/llama_bench.py); linked to llama.cpp's libllama and common.
attn_src="$repo_root/integrations/llama.cpp/llama_attn_time.cpp"
attn_bin="$build/bin/llama-attn-time"
if [ ! -x "$attn_bin" ] || [ "$attn_src" -nt "$attn_bin" ] || [ "$build/bin/libllama.so" -nt "$attn_bin" ] \
   || [ "$build/common/libcommon.a" -nt "$attn_bin" ]; then
  if ! "${CXX:-c++}" -O2 -std=c++17 -Wall -isystem "$src/common" -isystem "$src/include" -isystem "$src/ggml/include" \
      "$attn_src" -o "$attn_bin" "$build/common/libcommon.a" -L "$build/bin" -lllama -lggml -lggml-cpu -lggml-base -pthread \
      -Wl,-rpath,'$ORIGIN' >> "$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "building llama-attn-time failed (log: $log)"
  fi
fi

# crisp-llama-eval (integrations/llama.cpp/crisp_llama_eval.cpp): crisp's NIAH evaluation and
# frontier harness (src/eval) and the Q/K/V capture (crisp_llama_capture.cpp) on libllama, linked
# to the patched llama.cpp and the crisp library that build compiled. Needs the nlohmann-json and CLI11 headers (system, or .deps/prefix/include).
eval_bin="$build/bin/crisp-llama-eval"
eval_sources=("$repo_root/integrations/llama.cpp/crisp_llama_eval.cpp" "$repo_root/integrations/llama.cpp/crisp_llama_capture.cpp"
  "$repo_root"/src/eval/{json_file,niah,splits,sweep,frontier_file}.cpp "$repo_root/tools/io_util.cpp")
eval_stale=0
[ -x "$eval_bin" ] || eval_stale=1
for f in "${eval_sources[@]}" "$build/bin/libllama.so" "$build/crisp/libcrisp.a" "$repo_root"/src/eval/*.h \
  "$repo_root"/integrations/llama.cpp/crisp_llama_*.h; do
  [ "$f" -nt "$eval_bin" ] && eval_stale=1
done
if [ "$eval_stale" -eq 1 ]; then
  say "building crisp-llama-eval"
  objects=()
  launcher=()
  if command -v ccache >/dev/null 2>&1; then launcher=(ccache); fi
  mkdir -p "$build/crisp-llama-eval"
  for f in "${eval_sources[@]}"; do
    obj="$build/crisp-llama-eval/$(basename "${f%.cpp}").o"
    if ! "${launcher[@]}" "${CXX:-c++}" -O2 -std=c++17 -Wall -fopenmp -DCRISP_SOURCE_DIR="\"$repo_root\"" \
        -I "$repo_root/include" -I "$repo_root/src" -I "$repo_root/tools" -I "$src/include" -I "$src/ggml/include" \
        -isystem "$deps/prefix/include" -c "$f" -o "$obj" >> "$log" 2>&1; then
      tail -n 30 "$log" >&2
      die "building crisp-llama-eval failed (log: $log)"
    fi
    objects+=("$obj")
  done
  if ! "${CXX:-c++}" -fopenmp "${objects[@]}" -o "$eval_bin" "$build/crisp/libcrisp.a" -L "$build/bin" -lllama \
      -lggml -lggml-base -ldl "${crisp_cuda_libs[@]}" -Wl,-rpath,'$ORIGIN' >> "$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "linking crisp-llama-eval failed (log: $log)"
  fi
fi

# ---- the runtime, packed to be carried elsewhere
if [ -n "$pack_dir" ]; then
  rm -rf "$pack_dir"
  mkdir -p "$pack_dir"
  for f in "$build"/bin/*.so "$build"/bin/llama-cli "$build"/bin/llama-bench "$build"/bin/llama-server "$test_bin" "$attn_bin" "$eval_bin"; do
    [ -f "$f" ] || continue
    cp "$f" "$pack_dir/"
    strip --strip-unneeded "$pack_dir/$(basename "$f")"  # keeps the RUNPATH: $ORIGIN (see cmake_args)
  done
  say "packed $(ls "$pack_dir" | wc -l) files into $pack_dir: $(du -sh "$pack_dir" | cut -f1)"
fi
echo "$build/bin"
