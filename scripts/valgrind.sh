#!/usr/bin/env bash
# valgrind.sh: runs the unit and integration test binaries of a build under
# Valgrind's memcheck (kcached too: the integration tests start it through a
# wrapper), then fails if any process reported an error or a definite leak.
# Tests that run NVRTC (gpu; client_keys, _cli, _build, _faults, _fetch) are
# left out: its JIT is not ours.
#   usage: scripts/valgrind.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/kcache-vg-XXXXXX")
chmod 1777 "$logs" # the reliability test runs kcached as nobody too
trap 'rm -rf "$logs"' EXIT
# --fair-sched: Valgrind runs one thread at a time, and its default lock
# let store_concurrency's readers starve its writer (838 s instead of ~60 s).
vg=(valgrind -q --fair-sched=yes --error-exitcode=99 --leak-check=full
    --errors-for-leak-kinds=definite --show-leak-kinds=definite)

# kcached started by tests/testsrv.c runs under memcheck too. Its log has a
# name of its own: valgrind already made "<pid>.log" for the forked child
# that execs it (as root, which a kcached run as nobody cannot reopen).
wrapper="$logs/kcached"
printf '#!/bin/sh\nexec %s --log-file=%q %q "$@"\n' "${vg[*]}" \
  "$logs/kcached-%p.log" "$build/server/kcached" >"$wrapper"
chmod +x "$wrapper"
export KCACHED_BIN=$wrapper

status=0
run() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  if "${vg[@]}" --log-file="$logs/%p.log" "$@" >"$logs/$name.out" 2>&1; then
    echo "valgrind: $name passed ($((SECONDS - t0)) s)"
  else
    echo "valgrind: $name FAILED ($((SECONDS - t0)) s)"; tail -30 "$logs/$name.out"; status=1
  fi
}
run error "$build/tests/test_error"
run schema "$build/tests/test_schema" tests
# The 256 MiB blob test is slow under memcheck and only exercises LMDB.
KC_TEST_SKIP=test_large_blob_256mib run store_blob "$build/tests/test_store_blob"
for t in bundle evict crash concurrency scrub; do
  run "store_$t" "$build/tests/test_store_$t"
done
# Opening the store's environment with raw LMDB (an old store made by hand)
# fails under Valgrind (EINVAL: the store's large map); the ASan build runs it.
KC_TEST_SKIP=test_key_bytes_recounted_at_open run store_kv "$build/tests/test_store_kv"
for t in blob bundle lease auth ops http auth_reload demand models fetch; do
  run "server_$t" "$build/tests/test_server_$t"
done
# The client's tests that build with a command, not NVRTC (the kcache CLI
# they run is not under memcheck; libkcache in the test process is).
for t in hostile models compat warm; do
  run "client_$t" "$build/tests/test_client_$t"
done
run suggest "$build/tests/test_suggest"
run s3 "$build/tests/test_s3"
run scaleout "$build/tests/test_scaleout"
run scaleout_once "$build/tests/test_scaleout_once"
KC_RELIABILITY_ITERS=3 run reliability "$build/tests/test_reliability"

# Every process's log: an error summary above 0 or a definite leak fails.
bad=$(grep -lE 'ERROR SUMMARY: [1-9]|definitely lost: [1-9]' "$logs"/*.log 2>/dev/null || true)
if [ -n "$bad" ]; then
  for f in $bad; do echo "== $f"; head -60 "$f"; done
  status=1
fi
n=$(ls "$logs"/*.log 2>/dev/null | wc -l)
echo "valgrind: $n processes checked, $([ $status = 0 ] && echo 'no errors' || echo 'errors above')"
exit $status
