#!/usr/bin/env bash
# run.sh: the main job. Installs what is needed, builds, starts kcached on
# ./kcache-data (loopback, no token file), warms the demo model against it
# (a cold warm builds with NVRTC and uploads; a second one, with an empty
# local cache, fetches everything), then serves until Ctrl-C. It also speaks
# the Redis protocol on loopback (--resp-listen) and prints the environment
# a torch.compile (Inductor) or Triton user pastes to use it as their remote
# cache (README, "torch.compile and Triton").
#   --once: stop kcached after the warmups instead of serving on.
#   env: KCACHE_PORT (8080), KCACHE_RESP_PORT (6379; when unset and 6379 is
#        taken, a free port), KCACHED_DATA_DIR (./kcache-data)
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
[ "${1:-}" = --once ] && once=1
./scripts/install-deps.sh
# NVRTC builds the demo model: from the CUDA toolkit, else PyPI's wheel.
eval "$(./scripts/nvrtc.sh)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

port=${KCACHE_PORT:-8080}
resp_port=${KCACHE_RESP_PORT:-6379}
# A local Redis may hold 6379: kcached would not start, so take a free port.
if [ -z "${KCACHE_RESP_PORT:-}" ] && ! python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1",int(sys.argv[1])))' "$resp_port" 2>/dev/null; then
  resp_port=0
fi
data=${KCACHED_DATA_DIR:-./kcache-data}
manifest=deploy/examples/demo-mlp/warmup.json
log=./kcached.log
echo "run.sh: kcached on 127.0.0.1:$port, data in $data, log in $log"
log_start=$(stat -c %s "$log" 2>/dev/null || echo 0) # the log is appended to
build/server/kcached --listen "127.0.0.1:$port" --data-dir "$data" \
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

echo "== warm $manifest (local cache ~/.cache/kcache)"
build/client/kcache warm "$manifest" --out ./kcache-out
fresh=$(mktemp -d)
echo "== warm again as a new host would (empty local cache): fetched, not built"
KCACHE_DIR=$fresh build/client/kcache warm "$manifest"
rm -rf "$fresh"
build/client/kcache stat
[ "$once" = 1 ] && exit 0
cat <<EOF
== torch.compile and Triton: paste into the shell that runs them (pip install redis)
export TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1
export TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1
export TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1
export TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE=1
export TORCHINDUCTOR_REDIS_HOST=127.0.0.1
export TORCHINDUCTOR_REDIS_PORT=$resp_port
export TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
export TRITON_REMOTE_CACHE_BACKEND=triton.runtime.cache:RedisRemoteCacheBackend
export TRITON_REDIS_HOST=127.0.0.1
export TRITON_REDIS_PORT=$resp_port
EOF
echo "run.sh: kcached serves $KCACHE_URL and redis://127.0.0.1:$resp_port from $data (log: $log); Ctrl-C stops it"
wait "$pid"
