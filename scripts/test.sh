#!/usr/bin/env bash
# test.sh: installs what is needed, refuses run files committed by mistake
# and C and Python files not in the committed style (scripts/format.sh),
# builds kcache three times with warnings as errors (RelWithDebInfo, ASan+UBSan,
# and the Release build that the container and the CI example use), runs every
# test of the first two with ctest, then the unit and integration tests of the
# normal build again under Valgrind's memcheck, and every fuzz target for
# FUZZ_SECONDS (default 60) after replaying its corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

# A live LMDB data directory, a log or a port file must never be committed.
if git rev-parse --git-dir >/dev/null 2>&1; then
  junk=$(git ls-files | grep -E '\.mdb$|(^|/)kcached\.lock$|\.log$|\.port$' || true)
  if [ -n "$junk" ]; then
    echo "test.sh: run files are tracked by git (git rm --cached them):" >&2
    echo "$junk" >&2
    exit 1
  fi
fi

./scripts/install-deps.sh
# NVRTC for the build tests: the CUDA toolkit's, else PyPI's wheel (a new
# machine may have the toolkit without it); CI=true fails those tests without.
eval "$(./scripts/nvrtc.sh)"
# the Python tests' environment (torch==2.13.0 CPU, triton, redis-py, pytest,
# ruff) (a failure here is not fatal: the Python tests then fail when CI=true)
./scripts/pyenv.sh >/dev/null || echo "test.sh: scripts/pyenv.sh failed" >&2
# The style (.clang-format for C, ruff.toml for Python), so that no commit
# re-wraps another's lines.
./scripts/format.sh --check

jobs=$(nproc)
build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKCACHE_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
}

build build
build build-san -DKCACHE_SANITIZE=ON
# The documented Release build (deploy/container, deploy/ci): -O3 brings
# warnings that -O2 does not, so it must build too. Its tests are the first's.
echo "== build (Release)"
build build-rel -DCMAKE_BUILD_TYPE=Release -DKCACHE_TESTS=OFF

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
