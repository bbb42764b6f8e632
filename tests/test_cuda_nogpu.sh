#!/usr/bin/env bash
# kvcached --backend cuda where CUDA cannot run (no driver: $KVCACHED_LIBCUDA
# points nowhere) exits 1 with one clear line, and so does a build without
# CUDA. Needs KVCACHED_BIN.
set -euo pipefail
dir=$(mktemp -d /tmp/kvt-nogpu.XXXXXX)
trap 'rm -rf "$dir"' EXIT
rc=0
KVCACHED_LIBCUDA=/nonexistent/libcuda.so.1 "$KVCACHED_BIN" --backend cuda \
	--socket "$dir/s" --pool-size 64MiB 2>"$dir/err" || rc=$?
cat "$dir/err"
[ "$rc" = 1 ] || { echo "FAIL: exit status $rc, want 1"; exit 1; }
grep -Eq "cuda backend: (cannot load the CUDA driver|this kvcached was built without CUDA)" \
	"$dir/err" || { echo "FAIL: no clear error"; exit 1; }
[ ! -e "$dir/s" ] || { echo "FAIL: socket left behind"; exit 1; }
