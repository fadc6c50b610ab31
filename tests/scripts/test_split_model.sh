#!/usr/bin/env bash
# tests/scripts/test_split_model.sh — scripts/split_model_for_gpu.sh: two files cut into pieces
# over several carry folders join back bit-identical; a missing piece and a stale piece are
# refused (exit 1) without leaving a joined file. Runs on a copy of the repository's scripts in a
# scratch git repository, so the checkout's .modelcarry/ is never touched.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$work/repo/scripts" "$work/models"
cp "$repo/scripts/split_model_for_gpu.sh" "$work/repo/scripts/"
printf '/.modelcarry/\n' >"$work/repo/.gitignore"
git -C "$work/repo" init -q
head -c 2500000 /dev/urandom >"$work/models/a.gguf"
head -c 1200000 /dev/urandom >"$work/models/b.gguf"
(cd "$work/repo" && scripts/split_model_for_gpu.sh --part-mb 1 "$work/models/a.gguf" "$work/models/b.gguf") >"$work/split.log"
folders=$(ls -d "$work/repo/.modelcarry"/c* | wc -l)
[ "$folders" -eq 4 ] || fail "expected 4 carry folders of at most 1 MB for 3.7 MB, got $folders"
for d in "$work/repo/.modelcarry"/c*; do
  [ "$(du -cb "$d"/*.part[0-9]* | tail -1 | cut -f1)" -le 1000000 ] || fail "$d holds more than 1 MB of pieces"
done

# Every folder arrives: both files come back bit-identical, pieces removed.
mkdir "$work/store"
for d in "$work/repo/.modelcarry"/c*; do cp "$d"/* "$work/store/"; done
"$work/repo/scripts/split_model_for_gpu.sh" --join "$work/store" >/dev/null
cmp "$work/store/a.gguf" "$work/models/a.gguf" || fail "a.gguf differs after the join"
cmp "$work/store/b.gguf" "$work/models/b.gguf" || fail "b.gguf differs after the join"
! ls "$work/store"/*.part[0-9]* >/dev/null 2>&1 || fail "pieces left after a good join"

# The last folder missing: refused, exit 1, no joined b.gguf.
rm -rf "$work/store2" && mkdir "$work/store2"
last=$(ls -d "$work/repo/.modelcarry"/c* | tail -1)
for d in "$work/repo/.modelcarry"/c*; do [ "$d" = "$last" ] || cp "$d"/* "$work/store2/"; done
set +e
"$work/repo/scripts/split_model_for_gpu.sh" --join "$work/store2" 2>"$work/err.log" >/dev/null
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "a missing piece gave exit $rc, expected 1"
grep -q "is missing" "$work/err.log" || fail "no 'is missing' message: $(cat "$work/err.log")"
[ ! -f "$work/store2/b.gguf" ] || fail "a joined b.gguf exists although a piece is missing"

# A stale piece (one byte changed): the sha256 check refuses it and removes the joined file. The
# byte is replaced by a different value (writing a fixed 'X' left the piece unchanged whenever the
# random byte was already 'X': a 1-in-256 flake, seen in CI on 2026-12-03).
rm -rf "$work/store3" && mkdir "$work/store3"
for d in "$work/repo/.modelcarry"/c*; do cp "$d"/* "$work/store3/"; done
piece="$work/store3/a.gguf.part001"
old_byte=$(dd if="$piece" bs=1 skip=10 count=1 status=none | od -An -tu1 | tr -d ' ')
printf "\\$(printf '%03o' $(((old_byte + 1) % 256)))" | dd of="$piece" bs=1 seek=10 conv=notrunc status=none
new_byte=$(dd if="$piece" bs=1 skip=10 count=1 status=none | od -An -tu1 | tr -d ' ')
[ "$new_byte" != "$old_byte" ] || fail "the test could not change byte 10 of a piece"
set +e
"$work/repo/scripts/split_model_for_gpu.sh" --join "$work/store3" 2>"$work/err3.log" >/dev/null
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "a stale piece gave exit $rc, expected 1"
grep -q "sha256 mismatch" "$work/err3.log" || fail "no sha256 message: $(cat "$work/err3.log")"
[ ! -f "$work/store3/a.gguf" ] || fail "a joined a.gguf exists although its sha256 differs"
echo "split_model_for_gpu: ok"
