#!/usr/bin/env bash
# gpu-check.sh: proves kcache's GPU path on a real GPU in one call of at most
# 8 minutes, on a machine that can fetch nothing. Two halves:
#
#   scripts/gpu-check.sh pack   here: builds kcached, kcache, the gpu test
#                               programs (real driver path, by dlopen) and
#                               libkcache.so, and assembles .gpucarry/ (git
#                               ignored): bin/, lib/ (the shared libraries they
#                               need but glibc), the test fakes, tests/kernels,
#                               the demo model, the Python package, a redis-py
#                               wheel, SHA256SUMS. Prints its size.
#   scripts/gpu-check.sh run    there (repo root, .gpucarry carried): prints
#                               one markdown table, a row per check, each
#                               PASS, FAIL or SKIP with its numbers. Without a
#                               GPU the GPU rows are SKIP (exit 0); a GPU that
#                               is there but fails makes rows FAIL (exit 1).
#
# run writes the table to $OUT/gpu-check.md and everything it ran to
# $OUT/gpu-check.log when $OUT is set (else to a temp dir, named at the end).
# env: KC_GPU_CARRY (the carry dir, default ./.gpucarry), KC_GPU_CHECK_BUDGET
#      (seconds for the whole run, default 450), KC_GPU_CHECK_BUILD (pack's
#      build dir, default build; KC_GPU_CHECK_NO_BUILD=1: take it as built;
#      KC_GPU_CHECK_NO_WHEEL=1: no redis-py wheel), KC_GPU_TORCH_LIMIT
#      (seconds for the torch rows, default 300), KC_GPU_CHECK_ONLY=torch
#      (the carry, kcached and the torch rows alone),
#      KCACHE_NVRTC / KCACHE_LIBCUDA (as for
#      kcache; run finds NVRTC in the toolkit or python3's nvidia wheels).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
carry=${KC_GPU_CARRY:-$root/.gpucarry}
redis_pin=redis==8.1.0 # the Python package's test pin (scripts/pyenv.sh)
# glibc's own libraries and the loader: the target's must be used
skip_libs='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libstdc\+\+\.so|libgcc_s\.so)'

die() { echo "gpu-check: $*" >&2; exit 1; }

# ---- pack ----

pack_libs() { # FILE...: copy what ldd resolves, but glibc, into lib/
  ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    while read -r lib; do
      base=$(basename "$lib")
      [[ $base =~ $skip_libs ]] && continue
      [ -e "$carry/lib/$base" ] || cp -L "$lib" "$carry/lib/$base"
    done
}

pack() {
  local build=${KC_GPU_CHECK_BUILD:-build}
  [ "${KC_GPU_CHECK_NO_BUILD:-0}" = 1 ] ||
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="${KC_GPU_CHECK_BUILD_TYPE:-RelWithDebInfo}" >/dev/null ||
    die "cmake configure failed"
  local targets=(kcached kcache test_gpu gpu_launch_check gpu_fake_nvrtc
                 gpu_old_nvrtc gpu_wheel_nvrtc gpu_wheel_builtins gpu_fake_cuda)
  local shared=""
  # not grep -q: with pipefail, cmake's SIGPIPE would make the test false
  if cmake --build "$build" --target help 2>/dev/null | grep -c '\bkcache_shared\b' >/dev/null; then
    targets+=(kcache_shared)
    shared=yes
  fi
  if [ "${KC_GPU_CHECK_NO_BUILD:-0}" != 1 ]; then
    cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >/dev/null ||
      die "build failed: cmake --build $build --target ${targets[*]}"
  fi
  rm -rf "$carry"
  mkdir -p "$carry"/{bin,lib,test,whl}
  local bins=("$build/server/kcached" "$build/client/kcache"
              "$build/tests/test_gpu" "$build/tests/gpu_launch_check")
  for b in "${bins[@]}"; do
    objcopy --strip-debug "$b" "$carry/bin/$(basename "$b")" || die "strip $b"
  done
  # the test_gpu fakes, where KC_TEST_* point at them in run
  cp -a "$build/tests/gpu-test" "$carry/test/gpu-test"
  cp -a tests/kernels "$carry/test/kernels"
  mkdir -p "$carry/demo" && cp -a deploy/examples/demo-mlp "$carry/demo/"
  pack_libs "${bins[@]}"
  if [ -n "$shared" ] && [ -f "$build/client/libkcache.so" ]; then
    objcopy --strip-debug "$build/client/libkcache.so" "$carry/lib/libkcache.so"
    pack_libs "$build/client/libkcache.so"
  fi
  if [ -d python/kcache ]; then
    mkdir -p "$carry/python"
    cp -a python/kcache "$carry/python/kcache"
    find "$carry/python" -name __pycache__ -prune -exec rm -rf {} +
    [ -f "$carry/lib/libkcache.so" ] && cp "$carry/lib/libkcache.so" "$carry/python/kcache/"
  fi
  [ -f scripts/gpu_torch_check.py ] && cp scripts/gpu_torch_check.py "$carry/"
  if [ "${KC_GPU_CHECK_NO_WHEEL:-0}" != 1 ]; then
    timeout 180 python3 -m pip download -q --no-deps --only-binary=:all: \
      -d "$carry/whl" "$redis_pin" >&2 ||
      echo "gpu-check: warning: no $redis_pin wheel (the torch rows will say so)" >&2
  fi
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
    echo "built $(date -u +%FT%TZ) on $(uname -m), $(ldd --version | head -1)"
    echo "build type ${KC_GPU_CHECK_BUILD_TYPE:-RelWithDebInfo} (stripped of debug info)"
    echo "libkcache.so ${shared:-not built (no kcache_shared target)}"
  } >"$carry/INFO"
  (cd "$carry" && find . -type f ! -name SHA256SUMS -print0 | sort -z |
     xargs -0 sha256sum >SHA256SUMS)
  local bytes files
  bytes=$(du -sb "$carry" | cut -f1)
  files=$(find "$carry" -type f | wc -l)
  echo "gpu-check: packed $carry: $files files, $((bytes / 1024)) KiB ($(ls "$carry/lib" | wc -l) libraries)"
  [ "$bytes" -lt $((60 << 20)) ] || die "the carry is over 60 MiB"
  echo "gpu-check: on the GPU machine, from the repo root, with $(basename "$carry") carried:" \
    "scripts/gpu-check.sh run   (about 1-2 min plus the torch rows; budget ${KC_GPU_CHECK_BUDGET:-450} s)"
}

# ---- run: the table ----

declare -a row_names row_status row_detail
any_fail=0
add_row() { # NAME STATUS DETAIL
  row_names+=("$1"); row_status+=("$2"); row_detail+=("${3//|/\\|}")
  [ "$2" = FAIL ] && any_fail=1
  printf 'gpu-check: %-4s %s: %s\n' "$2" "$1" "$3" >&3
  log "ROW $2 $1: $3"
}
rows_from() { # FILE: the ROW lines a helper program printed; a name printed
  # again (a row updated after each round) keeps its place and its last line
  local name status detail
  while IFS=$'\t' read -r name status detail; do
    add_row "$name" "$status" "$detail"
  done < <(awk -F'\t' '$1 == "ROW" { if (!($2 in last)) order[++n] = $2
                                       last[$2] = $2 "\t" $3 "\t" $4 }
                         END { for (i = 1; i <= n; i++) print last[order[i]] }' "$1")
}
log() { printf '%s %s\n' "$(date -u +%T)" "$*" >>"$logf"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
left() { echo $(( budget - ($(now_ms) - t_start) / 1000 )); }
# limit N: N seconds, or what is left of the budget minus a margin
limit() {
  local l; l=$(( $(left) - 15 ))
  [ "$l" -lt "$1" ] && echo $(( l > 5 ? l : 5 )) || echo "$1"
}
# step LIMIT_S CMD...: runs with a timeout, output to the log
step() {
  local lim=$1; shift
  log "+ (timeout ${lim}s) $*"
  timeout -k 5 "$lim" "$@" >>"$logf" 2>&1
}
# stepo FILE LIMIT_S CMD...: the same, stdout to FILE
stepo() {
  local out=$1 lim=$2; shift 2
  log "+ (timeout ${lim}s) $* >$out"
  timeout -k 5 "$lim" "$@" >"$out" 2>>"$logf"
}
# stepall FILE LIMIT_S CMD...: stdout and stderr to FILE
stepall() {
  local out=$1 lim=$2; shift 2
  log "+ (timeout ${lim}s) $* >$out 2>&1"
  timeout -k 5 "$lim" "$@" >"$out" 2>&1
}
gpu_or_skip() { [ "$have_gpu" = 1 ] && echo FAIL || echo SKIP; }
json_get() { # FILE EXPR: a Python expression over r (the JSON)
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>>"$logf"
}

print_table() {
  local i
  {
    echo "## kcache GPU check"
    echo
    echo "$machine"
    echo
    echo "| # | check | result | detail |"
    echo "|---|---|---|---|"
    for i in "${!row_names[@]}"; do
      echo "| $((i + 1)) | ${row_names[$i]} | ${row_status[$i]} | ${row_detail[$i]} |"
    done
    echo
    echo "${#row_names[@]} rows: $(tr ' ' '\n' <<<"${row_status[*]}" | grep -c PASS) PASS, $(tr ' ' '\n' <<<"${row_status[*]}" | grep -c FAIL) FAIL, $(tr ' ' '\n' <<<"${row_status[*]}" | grep -c SKIP) SKIP; $(( ($(now_ms) - t_start) / 1000 )) s"
  } >"$tmp/table.md"
  cat "$tmp/table.md"
  [ -n "${OUT:-}" ] && cp "$tmp/table.md" "$OUT/gpu-check.md"
}

cleanup() {
  if [ -n "${kcached_pid:-}" ]; then
    kill "$kcached_pid" 2>/dev/null
    wait "$kcached_pid" 2>/dev/null
  fi
  # the log stays in $tmp only when it is there (no $OUT)
  if [ -n "${OUT:-}" ]; then
    rm -rf "${tmp:?}"
  else
    rm -rf "${tmp:?}/data" "$tmp"/kc-* "$tmp/site" "$tmp/libmin"
  fi
}

# ---- run: the checks ----

check_carry() {
  if [ ! -f "$carry/SHA256SUMS" ]; then
    add_row "carry: integrity" FAIL "no $carry/SHA256SUMS: run scripts/gpu-check.sh pack here and carry .gpucarry"
    return 1
  fi
  local n bad
  n=$(wc -l <"$carry/SHA256SUMS")
  if (cd "$carry" && step 60 sha256sum --quiet -c SHA256SUMS); then
    add_row "carry: integrity" PASS "$n files match SHA256SUMS, $(( $(du -sb "$carry" | cut -f1) / 1024 )) KiB; $(head -1 "$carry/INFO")"
  else
    bad=$(cd "$carry" && sha256sum --quiet -c SHA256SUMS 2>/dev/null | head -3 | tr '\n' ' ')
    add_row "carry: integrity" FAIL "$bad"
    return 1
  fi
  # every carried program resolves every library from lib/ or the system,
  # under a scrubbed environment
  local missing
  missing=$(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$carry/lib" \
    ldd "$carry"/bin/* "$carry"/lib/*.so* 2>&1 | grep -E 'not found|version .* not found' | sort -u | head -5 | tr '\n' ' ')
  if [ -n "$missing" ]; then
    add_row "carry: libraries resolve (scrubbed env)" FAIL "$missing"
    return 1
  fi
  if env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$carry/lib" "$carry/bin/kcached" --version >>"$logf" 2>&1 &&
     env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$carry/lib" "$carry/bin/kcache" --help >>"$logf" 2>&1; then
    add_row "carry: libraries resolve (scrubbed env)" PASS "$(ls "$carry/lib" | wc -l) carried libraries; kcached $(env -i LD_LIBRARY_PATH="$carry/lib" "$carry/bin/kcached" --version 2>&1 | awk '{print $2}'), kcache run; host $(ldd --version | head -1 | awk '{print $NF}') glibc"
  else
    add_row "carry: libraries resolve (scrubbed env)" FAIL "kcached --version or kcache --help failed (log)"
    return 1
  fi
}

start_kcached() {
  local t0 port="" resp=""
  t0=$(now_ms)
  # scrubbed: only the carried libraries, nothing from this shell
  env -i PATH=/usr/bin:/bin HOME="$tmp" LD_LIBRARY_PATH="$carry/lib" \
    "$carry/bin/kcached" --listen 127.0.0.1:0 --port-file "$tmp/port" \
    --data-dir "$tmp/data" --resp-listen 127.0.0.1:0 2>"$tmp/kcached.log" &
  kcached_pid=$!
  for _ in $(seq 1 150); do
    port=$(cat "$tmp/port" 2>/dev/null)
    resp=$(sed -n 's/.*RESP (Redis protocol) on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/kcached.log" | tail -1)
    [ -n "$port" ] && [ -n "$resp" ] && break
    kill -0 "$kcached_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ] || [ -z "$resp" ] || ! KCACHE_URL=http://127.0.0.1:$port "$KC" stat >>"$logf" 2>&1; then
    add_row "kcached starts (carried libs, scrubbed env)" FAIL "$(tail -2 "$tmp/kcached.log" | tr '\n' ' ')"
    cat "$tmp/kcached.log" >>"$logf"
    return 1
  fi
  export KCACHE_URL=http://127.0.0.1:$port
  resp_addr=127.0.0.1:$resp
  add_row "kcached starts (carried libs, scrubbed env)" PASS "HTTP 127.0.0.1:$port, RESP $resp_addr, answering in $(( $(now_ms) - t0 )) ms; data in a temp dir"
}

# NVRTC: as kcache finds it, else a wheel of python3's (torch's)
find_nvrtc() {
  local home=${CUDA_HOME:-/usr/local/cuda} f
  if [ -n "${KCACHE_NVRTC:-}" ]; then
    nvrtc_where="KCACHE_NVRTC=$KCACHE_NVRTC"
    return 0
  fi
  for f in "$home"/lib64/libnvrtc.so "$home"/lib64/libnvrtc.so.1[0-9] \
           /usr/local/cuda/lib64/libnvrtc.so \
           "${VIRTUAL_ENV:-/nonexistent}"/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 \
           "${CONDA_PREFIX:-/nonexistent}"/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13; do
    [ -e "$f" ] && { nvrtc_where=$f; return 0; } # where kcache looks itself
  done
  f=$(python3 - 2>/dev/null <<'EOF'
import glob, os, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for d in dirs:
    for rel in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"):
        p = os.path.join(d, rel)
        if os.path.exists(p):
            print(p); sys.exit(0)
EOF
)
  if [ -n "$f" ]; then
    export KCACHE_NVRTC=$f
    nvrtc_where="python3's wheel: $f"
    return 0
  fi
  if /sbin/ldconfig -p 2>/dev/null | grep -c 'libnvrtc\.so' >/dev/null; then
    nvrtc_where="the loader path ($(/sbin/ldconfig -p | grep -m1 'libnvrtc\.so' | awk '{print $NF}'))"
    return 0
  fi
  nvrtc_where=""
  return 1
}

check_gpu_tests() {
  local k="$carry/test/gpu-test" rc=0
  # the build-tree paths compiled into test_gpu, moved to the carry
  KC_TEST_GPU_KERNELS="$carry/test/kernels" \
  KC_TEST_FAKE_NVRTC="$k/fake-cuda/lib64/libnvrtc.so" \
  KC_TEST_FAKE_CUDA_HOME="$k/fake-cuda" \
  KC_TEST_OLD_NVRTC="$k/libgpu_old_nvrtc.so" \
  KC_TEST_WHEEL_NVRTC="$k/wheel/nvidia/cu13/lib/libnvrtc.so.13" \
    stepall "$tmp/test_gpu.out" "$(limit 200)" "$carry/bin/test_gpu" || rc=$?
  cat "$tmp/test_gpu.out" >>"$logf"
  local passed skipped failed dev loads refused
  passed=$(grep -c '^\[       OK \] test_' "$tmp/test_gpu.out")
  skipped=$(grep '^\[  SKIPPED \] test_' "$tmp/test_gpu.out" | sort -u | wc -l)
  failed=$(grep '^\[  FAILED  \] test_' "$tmp/test_gpu.out" | awk '{print $4}' | sort -u | tr '\n' ' ')
  dev=$(grep -m1 '^  GPU 0: ' "$tmp/test_gpu.out" | sed 's/^  //')
  loads=$(grep -c '^  load .*: KC_OK' "$tmp/test_gpu.out")
  refused=$(grep -c '^  load .*: KC_GPU' "$tmp/test_gpu.out")
  gpu_name=$(sed -n 's/^  GPU 0: \([^,]*\), .*/\1/p' "$tmp/test_gpu.out" | head -1)
  if [ -n "$dev" ]; then
    have_gpu=1
  elif command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi -L >>"$logf" 2>&1; then
    have_gpu=1 # nvidia-smi sees one, kcache does not: the rows must fail
  fi
  local extra=""
  KCACHE_LIBCUDA="$k/fake-driver/libcuda.so.1" step 30 "$carry/bin/test_gpu" --fake-driver ||
    extra="; the fake-driver tests FAILED"
  if [ "$rc" != 0 ] || [ -n "$failed" ] || [ -n "$extra" ]; then
    add_row "gpu/ tests, real driver (test_gpu)" FAIL "exit $rc; failed: ${failed:-none}${extra}; ${dev:-no GPU detected}"
  elif [ "$have_gpu" = 1 ] && [ -z "$dev" ]; then
    add_row "gpu/ tests, real driver (test_gpu)" FAIL "nvidia-smi sees a GPU, kc_gpu_detect does not: $(grep -m1 'no CUDA driver\|cuInit' "$tmp/test_gpu.out")"
  elif [ -n "$dev" ]; then
    if grep -q 'SKIPPED \] test_load_check_gpu' "$tmp/test_gpu.out"; then
      add_row "gpu/ tests, real driver (test_gpu)" FAIL "$dev; the load check was skipped (no NVRTC?); $passed passed, $skipped skipped"
    else
      add_row "gpu/ tests, real driver (test_gpu)" PASS "$dev; $passed passed, $skipped skipped; cuModuleLoadData: $loads targets loaded and $refused refused, each as kc_gpu_arch_runs_on predicts"
    fi
  else
    add_row "gpu/ tests, real driver (test_gpu)" SKIP "no GPU ($(grep -m1 -o 'no CUDA driver ([^:;]*' "$tmp/test_gpu.out" | sed 's/ (/: /')); $passed passed, $skipped skipped; with the fake driver (test_gpu --fake-driver) detection and the load check pass"
  fi
}

manifest() { echo "$carry/demo/demo-mlp/warmup.json"; }

check_cold_warm() {
  if [ -z "$nvrtc_where" ]; then
    add_row "demo: cold warm (NVRTC builds, upload)" "$(gpu_or_skip)" "no NVRTC found (toolkit, python3's nvidia wheels, loader path)"
    return 1
  fi
  local t0 rc=0 built
  t0=$(now_ms)
  KCACHE_DIR=$tmp/kc-cold stepo "$tmp/cold.json" "$(limit 150)" "$KC" warm "$(manifest)" --json --strict --quiet || rc=$?
  built=$(json_get "$tmp/cold.json" "r['counts']['built']")
  if [ "$rc" = 0 ] && [ -n "$built" ]; then
    demo_ready=1
    add_row "demo: cold warm (NVRTC builds, upload)" PASS "$built bundles of 3 kernels (sm_80, sm_90a) built with NVRTC and uploaded in $(( $(now_ms) - t0 )) ms; NVRTC: $nvrtc_where"
  else
    add_row "demo: cold warm (NVRTC builds, upload)" FAIL "kcache warm exit $rc: $(json_get "$tmp/cold.json" "next((i.get('message','') for i in r['items'] if i['status']=='failed'), '')" | cut -c1-200)"
    return 1
  fi
}

# The demo model's warm start: an empty local cache, kcache warm from kcached
# (what an initContainer does), then every module that runs on this GPU
# loaded with cuModuleLoadData (kcache verify, from the local cache): 3 runs.
check_warm_start() {
  if [ "$demo_ready" != 1 ]; then
    add_row "demo: warm start, empty local cache to modules loaded" "$(gpu_or_skip)" "no demo bundles on kcached (the cold warm did not build them)"
    return 0
  fi
  local i t0 t1 t2 rc vrc runs=() warms=() loads=() got
  for i in 1 2 3; do
    rm -rf "$tmp/kc-start"
    t0=$(now_ms)
    rc=0; vrc=0
    KCACHE_DIR=$tmp/kc-start stepo "$tmp/start.json" "$(limit 60)" "$KC" warm "$(manifest)" --json --strict --no-build --quiet || rc=$?
    t1=$(now_ms)
    if [ "$have_gpu" = 1 ]; then
      KCACHE_DIR=$tmp/kc-start stepo "$tmp/start-verify.out" "$(limit 60)" "$KC" verify "$(manifest)" || vrc=$?
    fi
    t2=$(now_ms)
    got=$(json_get "$tmp/start.json" "r['counts']['hit-remote']")
    if [ "$rc" != 0 ] || [ "$vrc" != 0 ]; then
      add_row "demo: warm start, empty local cache to modules loaded" FAIL "run $i: warm exit $rc, verify exit $vrc: $(tail -2 "$tmp/start-verify.out" 2>/dev/null | tr '\n' ' ')"
      return 1
    fi
    warms+=($((t1 - t0))); loads+=($((t2 - t1))); runs+=($((t2 - t0)))
  done
  local med bytes
  med() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
  bytes=$(json_get "$tmp/start.json" "r['bytes_fetched']")
  if [ "$have_gpu" = 1 ]; then
    add_row "demo: warm start, empty local cache to modules loaded" PASS "median $(med "${runs[@]}") ms (runs ${runs[*]} ms): fetch $(med "${warms[@]}") ms ($got bundles, $bytes bytes from kcached) + load $(med "${loads[@]}") ms ($(grep -o '^[0-9]* files' "$tmp/start-verify.out") with cuInit, primary context, cuModuleLoadData)"
  else
    add_row "demo: warm start, empty local cache to modules loaded" SKIP "no GPU to load on; the fetch alone: median $(med "${warms[@]}") ms (runs ${warms[*]} ms; $got bundles, $bytes bytes from kcached)"
  fi
}

# kcache verify: every demo module that runs on this GPU, from kcached (an
# empty local cache), loaded with cuModuleLoadData and its entries resolved.
check_verify() {
  if [ "$demo_ready" != 1 ]; then
    add_row "kcache verify: every demo cubin loads" "$(gpu_or_skip)" "no demo bundles on kcached (the cold warm did not build them)"
    return 0
  fi
  if [ "$have_gpu" != 1 ]; then
    local rc=0
    KCACHE_DIR=$tmp/kc-verify stepo "$tmp/verify.out" 30 "$KC" verify "$(manifest)" || rc=$?
    add_row "kcache verify: every demo cubin loads" SKIP "no GPU: kcache verify exits $rc ($(grep -m1 -o 'no CUDA driver' "$tmp/verify.out" "$logf" | head -1 | sed 's/.*://'))"
    return 0
  fi
  local rc=0 t0
  t0=$(now_ms)
  KCACHE_DIR=$tmp/kc-verify stepo "$tmp/verify.out" "$(limit 90)" "$KC" verify "$(manifest)" || rc=$?
  local summary fails
  summary=$(tail -1 "$tmp/verify.out")
  fails=$(grep -c '^FAIL' "$tmp/verify.out")
  cat "$tmp/verify.out" >>"$logf"
  if [ "$rc" = 0 ] && [ "$fails" = 0 ] && grep -q '^[1-9][0-9]* files of' <<<"$summary"; then
    add_row "kcache verify: every demo cubin loads" PASS "$summary, fetched from kcached with an empty local cache, in $(( $(now_ms) - t0 )) ms"
  else
    add_row "kcache verify: every demo cubin loads" FAIL "exit $rc, $fails FAIL lines: $(grep -m1 '^FAIL' "$tmp/verify.out" | cut -c1-200) $summary"
  fi
}

# Compat on real silicon: gpu_launch_check's rows (build, load, launch).
check_launch() {
  local rc=0
  stepo "$tmp/launch.out" "$(limit 150)" "$carry/bin/gpu_launch_check" "$carry/test/kernels" || rc=$?
  cat "$tmp/launch.out" >>"$logf"
  rows_from "$tmp/launch.out"
  if [ "$rc" -ge 124 ]; then
    add_row "compat: gpu_launch_check" FAIL "timed out or killed (exit $rc)"
  elif [ "$have_gpu" = 1 ] && ! grep -q 'compat: loaded code runs' "$tmp/launch.out"; then
    add_row "compat: gpu_launch_check" FAIL "a GPU, but no launch row (exit $rc; log)"
  fi
}

# The demo as PTX (compute_80) JIT-compiled on this GPU, and warm's fallback
# choosing a stand-in that runs here. The PTX key holds the driver version,
# so this needs a driver.
check_compat_ptx() {
  if [ "$have_gpu" != 1 ] || [ -z "$nvrtc_where" ]; then
    add_row "compat: demo as compute_80 PTX, JIT-loaded here" SKIP "needs a GPU and NVRTC"
    return 0
  fi
  local rc=0 vrc=0 t0
  t0=$(now_ms)
  KCACHE_DIR=$tmp/kc-ptx stepo "$tmp/ptx.json" "$(limit 120)" "$KC" warm "$(manifest)" --arch compute_80 --no-compat --json --strict --quiet || rc=$?
  local built; built=$(json_get "$tmp/ptx.json" "r['counts']['built']")
  KCACHE_DIR=$tmp/kc-ptx stepo "$tmp/ptx-verify.out" "$(limit 90)" "$KC" verify "$(manifest)" --arch compute_80 || vrc=$?
  cat "$tmp/ptx-verify.out" >>"$logf"
  if [ "$rc" = 0 ] && [ "$vrc" = 0 ]; then
    add_row "compat: demo as compute_80 PTX, JIT-loaded here" PASS "$built PTX bundles built; verify: $(tail -1 "$tmp/ptx-verify.out") (driver JIT); $(( $(now_ms) - t0 )) ms"
  else
    add_row "compat: demo as compute_80 PTX, JIT-loaded here" FAIL "warm exit $rc, verify exit $vrc: $(grep -m1 '^FAIL' "$tmp/ptx-verify.out" | cut -c1-200)"
  fi
  # kcache verify --arch sm_80 on this GPU: the rules leave nothing to load
  local s80=0
  KCACHE_DIR=$tmp/kc-ptx stepall "$tmp/s80.err" 60 "$KC" verify "$(manifest)" --arch sm_80 || s80=$?
  cat "$tmp/s80.err" >>"$logf"
  if [ "$gpu_arch" = sm_90a ]; then
    if [ "$s80" = 1 ] && grep -q 'no bundle of this manifest runs on' "$tmp/s80.err"; then
      add_row "compat: kcache verify --arch sm_80 on 9.0" PASS "refused: $(grep -m1 -o 'no bundle.*' "$tmp/s80.err")"
    else
      add_row "compat: kcache verify --arch sm_80 on 9.0" FAIL "exit $s80 (want 1, nothing loaded): $(tail -2 "$tmp/s80.err" | tr '\n' ' ')"
    fi
  fi
}

# Warm's fallback by device: an sm_90a bundle stands in only for a 9.0
# device. The server holds sm_80 and sm_90a bundles (and compute_80 with a
# GPU); --no-build warms for other devices from an empty local cache.
check_compat_device_arch() {
  if [ "$demo_ready" != 1 ]; then
    add_row "compat: sm_90a stands in for 9.0 only (warm --device-arch)" SKIP "no demo bundles on kcached (the cold warm did not build them)"
    return 0
  fi
  local out=() ok=1 dev arch want rc used
  for spec in "sm_90:9.0:sm_90a" "sm_89:8.9:sm_80" "sm_100a:10.0:" "sm_120:12.0:"; do
    IFS=: read -r arch dev want <<<"$spec"
    rm -rf "$tmp/kc-dev"
    rc=0
    KCACHE_DIR=$tmp/kc-dev stepo "$tmp/dev.json" 60 "$KC" warm "$(manifest)" --arch "$arch" --device-arch "$dev" --no-build --json --quiet || rc=$?
    used=$(json_get "$tmp/dev.json" "' '.join(sorted(set(i['compat']['arch'] for i in r['items'] if i['status']=='hit-compat'))) or 'none'")
    out+=("$arch on $dev: $used")
    case " $used " in *" sm_90a "*) [ "$dev" = 9.0 ] || ok=0 ;; esac
    if [ -n "$want" ]; then
      case " $used " in *" $want "*) ;; *) ok=0 ;; esac
    fi
  done
  add_row "compat: sm_90a stands in for 9.0 only (warm --device-arch)" "$([ $ok = 1 ] && echo PASS || echo FAIL)" "stand-ins used: $(IFS=';'; echo "${out[*]}")"
}

# torch.compile on CUDA through kcached: scripts/gpu_torch_check.py's rows.
check_torch() {
  local script=$root/scripts/gpu_torch_check.py
  [ -f "$script" ] || script=$carry/gpu_torch_check.py
  if [ ! -f "$script" ]; then
    add_row "torch.compile through kcached" SKIP "scripts/gpu_torch_check.py is not in this tree"
    return 0
  fi
  if [ ! -d "$carry/python/kcache" ]; then
    add_row "torch.compile through kcached" SKIP "the Python package (python/kcache) was not packed"
    return 0
  fi
  if [ ! -f "$carry/lib/libkcache.so" ]; then
    add_row "torch.compile through kcached" SKIP "libkcache.so was not packed (this tree has no kcache_shared target)"
    return 0
  fi
  # redis-py from the carried wheel (nothing can be fetched there)
  local whl pyp="$carry/python"
  whl=$(ls "$carry"/whl/redis-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ] && step 60 python3 -m pip install -q --no-index --no-deps --no-compile \
       --target "$tmp/site" "$whl"; then
    pyp="$pyp:$tmp/site"
  fi
  # only the carried libraries this system lacks, so that torch keeps its own
  mkdir -p "$tmp/libmin"
  local f
  for f in "$carry"/lib/*.so*; do
    /sbin/ldconfig -p 2>/dev/null | grep -c "^[[:space:]]*$(basename "$f") " >/dev/null ||
      ln -sf "$f" "$tmp/libmin/"
  done
  local lim rc=0
  lim=$(limit "${KC_GPU_TORCH_LIMIT:-300}")
  log "torch check: ${lim}s, PYTHONPATH=$pyp"
  PYTHONPATH="$pyp${PYTHONPATH:+:$PYTHONPATH}" KCACHE_LIB="$carry/lib/libkcache.so" \
  LD_LIBRARY_PATH="$tmp/libmin${orig_ld:+:$orig_ld}" PYTHONUNBUFFERED=1 \
    stepo "$tmp/torch.out" "$lim" python3 "$script" --url "$KCACHE_URL" \
      --resp "redis://$resp_addr" --device cuda --runs 3 || rc=$?
  cat "$tmp/torch.out" >>"$logf"
  local n
  n=$(grep -c $'^ROW\t' "$tmp/torch.out")  # lines, not rows: 0 means none
  rows_from "$tmp/torch.out"
  if [ "$rc" -ge 124 ]; then
    add_row "torch.compile through kcached" FAIL "gpu_torch_check.py ran past ${lim}s (exit $rc) after $n rows"
  elif [ "$n" = 0 ]; then
    add_row "torch.compile through kcached" FAIL "gpu_torch_check.py exit $rc, no ROW lines: $(tail -1 "$logf" | cut -c1-200)"
  fi
}

run() {
  budget=${KC_GPU_CHECK_BUDGET:-450}
  t_start=$(now_ms)
  tmp=$(mktemp -d /tmp/gpu-check.XXXXXX)
  [ -z "${OUT:-}" ] || mkdir -p "$OUT" || die "cannot make \$OUT=$OUT"
  logf=${OUT:+$OUT/gpu-check.log}
  logf=${logf:-$tmp/gpu-check.log}
  : >"$logf"
  exec 3>&2
  trap cleanup EXIT
  have_gpu=0 demo_ready=0 gpu_name="" gpu_arch="" nvrtc_where="" resp_addr="" kcached_pid=""
  orig_ld=${LD_LIBRARY_PATH:-}
  KC=$carry/bin/kcache
  log "gpu-check run in $root, carry $carry, budget ${budget}s"
  {
    uname -a; ldd --version | head -1; python3 --version
    timeout 20 nvidia-smi 2>&1 | head -15
    /sbin/ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc' ; env | grep -E '^(LD_LIBRARY_PATH|CUDA_HOME|KCACHE_)' || true
    cat "$carry/INFO" 2>/dev/null
  } >>"$logf" 2>&1
  local smi
  smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/, /, driver /')
  machine="$(date -u '+%F %H:%M UTC'); $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}'); nvidia-smi: ${smi:-none}"
  if ! check_carry; then
    print_table; return 1
  fi
  export LD_LIBRARY_PATH="$carry/lib${orig_ld:+:$orig_ld}"
  if ! start_kcached; then
    print_table; return 1
  fi
  if find_nvrtc; then
    log "NVRTC: $nvrtc_where"
  fi
  # KC_GPU_CHECK_ONLY=torch: the torch rows alone (a second call, when the
  # first ran out of time there)
  if [ "${KC_GPU_CHECK_ONLY:-}" != torch ]; then
    check_gpu_tests
    gpu_arch=$(sed -n 's/^  GPU 0: [^,]*, [0-9.]*, \(sm_[0-9a-z]*\),.*/\1/p' "$tmp/test_gpu.out" | head -1)
    [ -n "$gpu_name" ] && machine="$machine; kcache sees GPU 0: $gpu_name ($gpu_arch)"
    machine="$machine; NVRTC: ${nvrtc_where:-none found}"
    check_cold_warm
    check_warm_start
    check_verify
    check_launch
    check_compat_ptx
    check_compat_device_arch
  fi
  check_torch
  print_table
  echo "gpu-check: log in $logf" >&3
  return $any_fail
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check.sh pack|run   (pack here, run on the GPU machine)" >&2; exit 2 ;;
esac
