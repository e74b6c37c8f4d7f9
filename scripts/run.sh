#!/usr/bin/env bash
# run.sh: the main job. Installs what is needed, builds, starts kcached on
# ./kcache-data (loopback, no token file), warms the demo model against it
# (a cold warm builds with NVRTC and uploads; a second one, with an empty
# local cache, fetches everything), then serves until Ctrl-C.
#   --once: stop kcached after the warmups instead of serving on.
#   env: KCACHE_PORT (8080), KCACHED_DATA_DIR (./kcache-data)
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
[ "${1:-}" = --once ] && once=1
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

port=${KCACHE_PORT:-8080}
data=${KCACHED_DATA_DIR:-./kcache-data}
manifest=deploy/examples/demo-mlp/warmup.json
log=./kcached.log
echo "run.sh: kcached on 127.0.0.1:$port, data in $data, log in $log"
build/server/kcached --listen "127.0.0.1:$port" --data-dir "$data" 2>>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
trap 'exit 0' INT TERM
export KCACHE_URL="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
  curl -sf "$KCACHE_URL/healthz" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { echo "run.sh: kcached did not start:" >&2; tail -3 "$log" >&2; exit 1; }
  sleep 0.1
done

echo "== warm $manifest (local cache ~/.cache/kcache)"
build/client/kcache warm "$manifest" --out ./kcache-out
fresh=$(mktemp -d)
echo "== warm again as a new host would (empty local cache): fetched, not built"
KCACHE_DIR=$fresh build/client/kcache warm "$manifest"
rm -rf "$fresh"
build/client/kcache stat
[ "$once" = 1 ] && exit 0
echo "run.sh: kcached serves $KCACHE_URL from $data (log: $log); Ctrl-C stops it"
wait "$pid"
