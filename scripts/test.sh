#!/usr/bin/env bash
# test.sh: installs what is needed, builds kcache twice (normal, and with
# ASan+UBSan), runs every test of both builds with ctest, then the unit and
# integration tests of the normal build again under Valgrind's memcheck, and
# every fuzz target for FUZZ_SECONDS (default 60) after replaying its corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# the Python tests' environment (torch==2.13.0 CPU, triton, redis-py, pytest)
# (a failure here is not fatal: the Python tests then fail when CI=true)
./scripts/pyenv.sh >/dev/null || echo "test.sh: scripts/pyenv.sh failed" >&2

jobs=$(nproc)
build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
}

build build
build build-san -DKCACHE_SANITIZE=ON

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for dir in build build-san; do
  echo "== ctest ($dir)"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900 || status=1
done
echo "== valgrind (build)"
./scripts/valgrind.sh build || status=1
echo "== fuzz"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}" ./scripts/fuzz.sh || status=1
exit $status
