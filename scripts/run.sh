#!/usr/bin/env bash
# run.sh: the main job. Installs what is needed, builds, starts kcached on
# ./kcache-data (loopback, no token file), warms the demo model against it
# (a cold warm builds with NVRTC and uploads; a second one, with an empty
# local cache, fetches everything), prints what a torch or Triton user
# pastes to use it (between the lines "#>>> kcache" and "#<<< kcache": the
# command that installs the Python package, and the environment of
# torch.compile's and Triton's caches; tests/python/test_firsthour.py runs
# exactly those lines), then serves until Ctrl-C. kcached also speaks the
# Redis protocol on loopback (--resp-listen) for Inductor's remote caches.
#   --once: print the lines, then stop kcached instead of serving on.
#   env: KCACHE_PORT (8080), KCACHE_RESP_PORT (6379; when unset and 6379 is
#        taken, a free port), KCACHED_DATA_DIR (./kcache-data),
#        KCACHED_LOG (./kcached.log), KCACHE_OUT (./kcache-out),
#        KCACHE_BUILD_DIR (build), KCACHE_RUN_REUSE_BUILD=1: no installs and
#        no build, use the binaries already in KCACHE_BUILD_DIR (tests)
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
[ "${1:-}" = --once ] && once=1
build=${KCACHE_BUILD_DIR:-build}
if [ "${KCACHE_RUN_REUSE_BUILD:-}" != 1 ]; then
  echo "== install what is missing (apt-get; nothing when all is there)"
  ./scripts/install-deps.sh
fi
# NVRTC builds the demo model: from the CUDA toolkit, else PyPI's wheel.
eval "$(./scripts/nvrtc.sh)"
if [ "${KCACHE_RUN_REUSE_BUILD:-}" != 1 ]; then
  echo "== build into $build/ (a few minutes the first time; one line per target)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  # make's progress, one line per target built (errors go to stderr)
  cmake --build "$build" -j "$(nproc)" |
    sed -un 's/^\[ *\([0-9]*%\)\] Built target \(.*\)/  [\1] \2/p'
fi

port=${KCACHE_PORT:-8080}
resp_port=${KCACHE_RESP_PORT:-6379}
# A local Redis may hold 6379: kcached would not start, so take a free port.
if [ -z "${KCACHE_RESP_PORT:-}" ] && ! python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1",int(sys.argv[1])))' "$resp_port" 2>/dev/null; then
  resp_port=0
fi
data=${KCACHED_DATA_DIR:-./kcache-data}
manifest=deploy/examples/demo-mlp/warmup.json
log=${KCACHED_LOG:-./kcached.log}
echo "run.sh: kcached on 127.0.0.1:$port, data in $data, log in $log"
log_start=$(stat -c %s "$log" 2>/dev/null || echo 0) # the log is appended to
"$build/server/kcached" --listen "127.0.0.1:$port" --data-dir "$data" \
  --resp-listen "127.0.0.1:$resp_port" 2>>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
trap 'exit 0' INT TERM
export KCACHE_URL="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
  curl -sf "$KCACHE_URL/healthz" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { echo "run.sh: kcached did not start:" >&2; tail -3 "$log" >&2; exit 1; }
  sleep 0.1
done
# The port the Redis protocol got: kcached logs it once bound (after HTTP).
want=$resp_port resp_port=""
for _ in $(seq 1 50); do
  resp_port=$(tail -c +$((log_start + 1)) "$log" |
    sed -n 's/.*RESP (Redis protocol) on 127\.0\.0\.1:\([0-9]*\).*/\1/p' | tail -1)
  [ -n "$resp_port" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$resp_port" ] || { echo "run.sh: no Redis protocol on 127.0.0.1:$want:" >&2; tail -3 "$log" >&2; exit 1; }

echo "== warm $manifest (local cache ${KCACHE_DIR:-~/.cache/kcache})"
"$build/client/kcache" warm "$manifest" --out "${KCACHE_OUT:-./kcache-out}"
fresh=$(mktemp -d)
echo "== warm again as a new host would (empty local cache): fetched, not built"
KCACHE_DIR=$fresh "$build/client/kcache" warm "$manifest"
rm -rf "$fresh"
"$build/client/kcache" stat
# What a torch user pastes: the lines between the markers are parsed and run,
# exactly, by tests/python/test_firsthour.py. Only lines that work on a CPU
# host with the pinned torch and triton: not the bundled-autotune cache
# (it fails every compile on the CPU) nor Triton's Redis backend (broken
# since Triton 3.4); the kcache package serves Triton instead.
cat <<EOF
== torch.compile and Triton: paste into the shell of the service's Python
   environment (pip builds libkcache with CMake: a C compiler, cmake,
   pkg-config and the -dev packages of ./scripts/install-deps.sh)
#>>> kcache
pip install $PWD/python redis
export KCACHE_URL=$KCACHE_URL
export TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1
export TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1
export TORCHINDUCTOR_REDIS_URL=redis://127.0.0.1:$resp_port
export TRITON_CACHE_MANAGER=kcache.triton:CacheManager
#<<< kcache
== then, in the service (README, "torch.compile"): import kcache.torch as kt;
   with kt.warm(model, name="my-service"): compile and run the warm-up inputs
EOF
if [ "$once" = 1 ]; then
  echo "run.sh: --once: kcached stops now; ./scripts/run.sh serves on"
  exit 0
fi
echo "run.sh: kcached serves $KCACHE_URL and redis://127.0.0.1:$resp_port from $data (log: $log); Ctrl-C stops it"
wait "$pid"
