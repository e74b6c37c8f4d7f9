#!/usr/bin/env bash
# fuzz.sh: build kcache's libFuzzer targets (clang, ASan+UBSan) in build-fuzz,
# replay every kept input (tests/fuzz/corpus and tests/fuzz/regressions), then
# fuzz each target for FUZZ_SECONDS on a scratch copy of its corpus.
# Exits non-zero if any input crashes, leaks, times out or breaks an
# invariant; a crashing input is copied into tests/fuzz/regressions/<target>/
# (its path is printed) so that it is replayed from then on.
#
#   FUZZ_SECONDS=60      fuzzing time per target (0: replay only)
#   FUZZ_JOBS=<cores>    targets fuzzed at once (default: the number of cores, at most 5)
#   FUZZ_TARGETS="manifest warmup key router auth resp"
#   FUZZ_BUILD=build-fuzz
#   FUZZ_KEEP=1          copy crashing inputs into tests/fuzz/regressions (0: only print)
#   FUZZ_MERGE=0         1: after fuzzing, add the inputs that found new coverage
#                        to tests/fuzz/corpus/<target> (libFuzzer -merge=1)
#
# Needs clang (Debian: apt-get install clang); no network.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
case $build in /*) ;; *) build=$root/$build ;; esac
secs=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"manifest warmup key router auth resp"}
cores=$(nproc 2>/dev/null || echo 2)
jobs=${FUZZ_JOBS:-$((cores < 5 ? cores : 5))}
keep=${FUZZ_KEEP:-1}
merge=${FUZZ_MERGE:-0}
fz=$root/tests/fuzz
cc=${FUZZ_CC:-clang}

command -v "$cc" >/dev/null || { echo "fuzz.sh: $cc not found (apt-get install clang)" >&2; exit 2; }

echo "== configure and build ($build)"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DKCACHE_FUZZ=ON \
  -DKCACHE_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/fuzz-configure.log" 2>&1 ||
  { cat "$build/fuzz-configure.log" >&2; exit 2; }
bins=()
for t in $targets; do bins+=(--target "fuzz_$t"); done
cmake --build "$build" -j"$cores" "${bins[@]}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -50 "$build/fuzz-build.log" >&2; exit 2; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

fail=0
out=$build/fuzz-out
rm -rf "$out"
mkdir -p "$out"

# Keeps the inputs libFuzzer wrote under $2 (crash-*, leak-*, timeout-*,
# oom-*) for target $1.
keep_artifacts() {
  local t=$1 dir=$2 f dest
  for f in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*; do
    [ -e "$f" ] || continue
    if [ "$keep" = 1 ]; then
      mkdir -p "$fz/regressions/$t"
      dest=$fz/regressions/$t/$(basename "$f")
      cp "$f" "$dest"
    else
      dest=$f
    fi
    echo "   crashing input: $dest"
    echo "   reproduce: $(bin_of "$t") $dest"
  done
}

bin_of() {
  local b
  b=$(find "$build" -name "fuzz_$1" -type f -perm -u+x | head -1)
  echo "$b"
}

echo "== replay corpus and regressions"
for t in $targets; do
  b=$(bin_of "$t")
  dirs=("$fz/corpus/$t")
  [ -d "$fz/regressions/$t" ] && dirs+=("$fz/regressions/$t")
  mkdir -p "$out/replay-$t"
  if "$b" -runs=0 -artifact_prefix="$out/replay-$t/" "${dirs[@]}" >"$out/replay-$t.log" 2>&1; then
    echo "   $t: ok ($(find "${dirs[@]}" -type f | wc -l) inputs)"
  else
    echo "FAIL $t: a kept input fails; log: $out/replay-$t.log"
    grep -E "ERROR|invariant|Running:|Test unit written" "$out/replay-$t.log" | tail -8 | sed 's/^/   /'
    fail=1
  fi
done

if [ "$secs" -gt 0 ]; then
  echo "== fuzz ${secs}s per target, $jobs at a time"
  run_one() {
    local t=$1 b work dict=()
    b=$(bin_of "$t")
    work=$out/corpus-$t
    mkdir -p "$work" "$out/art-$t"
    cp "$fz/corpus/$t"/* "$work"/
    case $t in
      manifest | warmup | key) dict=(-dict="$fz/schema.dict") ;;
      router) dict=(-dict="$fz/router.dict") ;;
      auth) dict=(-dict="$fz/auth.dict") ;;
      resp) dict=(-dict="$fz/resp.dict") ;;
    esac
    "$b" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -max_len=16384 \
      -print_final_stats=1 -artifact_prefix="$out/art-$t/" "${dict[@]}" \
      "$work" >"$out/fuzz-$t.log" 2>&1
  }
  declare -A pids
  pending=($targets)
  running=()
  while [ ${#pending[@]} -gt 0 ] || [ ${#running[@]} -gt 0 ]; do
    while [ ${#pending[@]} -gt 0 ] && [ ${#running[@]} -lt "$jobs" ]; do
      t=${pending[0]}
      pending=("${pending[@]:1}")
      run_one "$t" &
      pids[$t]=$!
      running+=("$t")
    done
    wait -n || true
    still=()
    for t in "${running[@]}"; do
      if kill -0 "${pids[$t]}" 2>/dev/null; then
        still+=("$t")
        continue
      fi
      rc=0
      wait "${pids[$t]}" || rc=$?
      log=$out/fuzz-$t.log
      stats=$(grep -E '^#[0-9]+.*(DONE|cov:)' "$log" | tail -1 | sed -E 's/^#([0-9]+)[[:space:]]+[A-Z]+[[:space:]]+//')
      eps=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}')
      n=$(find "$out/corpus-$t" -type f | wc -l)
      if [ "$rc" = 0 ]; then
        echo "   $t: ok  $stats  exec/s ${eps:-?}  corpus $n files"
        if [ "$merge" = 1 ]; then
          "$(bin_of "$t")" -merge=1 "$fz/corpus/$t" "$out/corpus-$t" >"$out/merge-$t.log" 2>&1 &&
            echo "   $t: merged into tests/fuzz/corpus/$t ($(find "$fz/corpus/$t" -type f | wc -l) files)"
        fi
      else
        echo "FAIL $t (exit $rc); log: $log"
        grep -E "ERROR: |invariant|SUMMARY" "$log" | head -6 | sed 's/^/   /'
        keep_artifacts "$t" "$out/art-$t"
        fail=1
      fi
    done
    running=("${still[@]}")
  done
fi

if [ "$fail" != 0 ]; then
  echo "fuzz.sh: FAILED (logs under $out)"
  exit 1
fi
echo "fuzz.sh: all targets passed"
