#!/usr/bin/env bash
# bench_resp.sh: kcached's Redis-protocol listener against redis-server, in
# one run, side by side (not a ctest entry).
#
# 1. redis-benchmark GET and SET of 4 KiB, 64 KiB and 1 MiB values at -c 50,
#    and 4 KiB with -P 16, against kcached (--resp-listen) and against
#    redis-server in three configurations: persistence off (--save ''
#    --appendonly no), AOF with the default fsync (--appendonly yes
#    --appendfsync everysec) and AOF synced before every answer (--appendonly
#    yes --appendfsync always; kcached always answers a write after its synced
#    LMDB commit). Each server starts on an empty data directory. Per test:
#    requests/s, and requests per CPU-second of the server (utime+stime of
#    /proc/PID/stat over the test; all its threads), since on a 2-CPU machine
#    redis-benchmark itself may be the bottleneck. SETs come first, so the
#    GETs that follow find their keys (-r: random keys in a keyspace).
#    Every size starts with FLUSHDB, so a GET finds only values of its size.
#    Note: redis-benchmark's values are the same bytes every time; kcached
#    stores a value once by its SHA-256, so its SETs here write a key record
#    and not the value, and once a key holds the value (after its first SET
#    of -r's keyspace) a SET of it again is answered from the committed
#    state without a commit (kc_store_kv_set_settled); every SET's value
#    is still hashed once (SHA-256: most of a 1M SET's CPU).
#    4K-new: nearly every SET a new key (a commit each). Step 2's fill uses
#    distinct values.
#    Two payloads for the GETs: redis-benchmark's own (printable bytes that
#    zstd shrinks by about a quarter, its literals entropy-coded) and random
#    bytes (-rand rows: resp_tool.py randkeys SETs the keyspace first, not
#    timed). Each at -c 50 with -P 1 and -P 16, and a single client (-c1
#    rows, -P 1: their req/s is the inverse of the latency, printed too).
#    The -rand and -c1 rows time only the GETs (their fill is not a row).
# 2. Restart: SET BENCH_FILL_COUNT (50000) distinct 64 KiB values (3.28 GB)
#    with resp_tool.py (pipelined), stop, start again, and time from the
#    start until the first GET returns a value, and the server's RSS then.
#    kcached: its LMDB store; redis-server: an RDB snapshot (SAVE) of the same
#    data, persistence otherwise off. The page cache is warm for both (the
#    files were just written).
#
# Fair share on a small machine: both servers on CPU 1, redis-benchmark and
# the Python client on CPU 0 (taskset); BENCH_PIN=0: unpinned. kcached gets
# --threads 1 (HTTP workers; the RESP listener is one epoll thread and one
# committer thread whatever --threads says).
#
# Usage: tests/bench/bench_resp.sh [path/to/kcached]
#   env: BENCH_DIR (a directory with 8 GB free; default $TMPDIR or /tmp)
#        BENCH_SCALE (1: multiplies every request count) BENCH_PIN (1)
#        BENCH_FILL_COUNT (50000) BENCH_SKIP_RESTART (0) REDIS_SERVER
#        BENCH_SERVERS ("kcached off everysec always"; add "base" with
#          BENCH_BASE_KCACHED=path: a second kcached build, e.g. main's, in
#          the same run, its column before kcached's)
#        BENCH_OPS ("set get"; "set": the SETs only)
#        BENCH_TESTS ("4K 64K 1M 4K-P16 4K-c1 4K-rand 4K-rand-P16
#          4K-rand-c1 4K-new": the tests to run, by
#          label; 4K-new: -r 100000000, nearly every SET a new key, so a
#          written key record each, where the other tests' SETs mostly
#          find the value already held under their key)
# Needs: redis-server, redis-benchmark, redis-cli, python3, taskset.
# Loopback only, on free ports; every loop is bounded; the temporary
# directory is removed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
kcached=${1:-${KCACHED:-$root/build/server/kcached}}
[ -x "$kcached" ] || { echo "bench_resp: no kcached binary at $kcached (give its path)" >&2; exit 2; }
base_kcached=${BENCH_BASE_KCACHED:-}
redis_bin=${REDIS_SERVER:-$(command -v redis-server || echo /usr/bin/redis-server)}
for tool in redis-benchmark redis-cli python3 "$redis_bin"; do
  command -v "$tool" >/dev/null || { echo "bench_resp: $tool not found (scripts/install-deps.sh)" >&2; exit 2; }
done

scale=${BENCH_SCALE:-1}
pin=${BENCH_PIN:-1}
fill_count=${BENCH_FILL_COUNT:-50000}
tick=$(getconf CLK_TCK)
client_cpu=() server_cpu=()
if [ "$pin" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  client_cpu=(taskset -c 0) server_cpu=(taskset -c 1)
fi

tmp=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/kcache-respbench-XXXXXX")
spid=""
cleanup() {
  for p in "$spid" "$(cat "$tmp/first.pid" 2>/dev/null || true)"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null && wait_gone "$p"
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Waits (120 s at most: a big AOF or RDB) for a process that may not be our
# child to end.
wait_gone() {
  for _ in $(seq 1 1200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  echo "bench_resp: pid $1 did not stop" >&2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until the server on $port answers INFO with OUR pid (a port another
# program took in between would answer with its own, or not at all).
wait_ours() {
  for _ in $(seq 1 200); do
    kill -0 "$spid" 2>/dev/null || { echo "bench_resp: server died:" >&2; tail -3 "$tmp/server.log" >&2; exit 1; }
    redis-cli -p "$port" info server 2>/dev/null | grep -q "^process_id:$spid" && return 0
    sleep 0.05
  done
  echo "bench_resp: nothing of ours answers on port $port" >&2
  exit 1
}

kcached_cmd() { # data dir [binary] -> argv in cmdv
  cmdv=("${server_cpu[@]}" "${2:-$kcached}" --listen 127.0.0.1:0 --data-dir "$1"
        --resp-listen "127.0.0.1:$port" --threads 1)
}

redis_cmd() { # dir, extra args... -> argv in cmdv
  local d=$1
  shift
  cmdv=("${server_cpu[@]}" "$redis_bin" --port "$port" --bind 127.0.0.1
        --dir "$d" --logfile "$d/redis.log" --daemonize no "$@")
}

start_server() { # kind: kcached | off | everysec | always | rdb
  port=$(free_port)
  local d="$tmp/data-$1"
  rm -rf "$d" && mkdir -p "$d"
  case $1 in
    kcached) kcached_cmd "$d" ;;
    base) [ -x "$base_kcached" ] || { echo "bench_resp: BENCH_BASE_KCACHED is not a kcached" >&2; exit 2; }
      kcached_cmd "$d" "$base_kcached" ;;
    off) redis_cmd "$d" --save '' --appendonly no ;;
    everysec) redis_cmd "$d" --save '' --appendonly yes --appendfsync everysec ;;
    always) redis_cmd "$d" --save '' --appendonly yes --appendfsync always ;;
    rdb) redis_cmd "$d" --save '' --appendonly no --dbfilename dump.rdb ;;
  esac
  "${cmdv[@]}" 2>"$tmp/server.log" &
  spid=$!
  wait_ours
}

stop_server() {
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  spid=""
}

cpu_ticks() { # pid -> utime+stime of every thread, in clock ticks
  awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

# name, args... -> "rps cpu_seconds avg_latency_ms" of one redis-benchmark
# test
bench_one() {
  local c0 c1 out rps
  c0=$(cpu_ticks "$spid")
  out=$(timeout 300 "${client_cpu[@]}" redis-benchmark -p "$port" --csv "$@" 2>"$tmp/rb.err") ||
    { echo "bench_resp: redis-benchmark $*: $(tail -2 "$tmp/rb.err")" >&2; exit 1; }
  c1=$(cpu_ticks "$spid")
  rps=$(awk -F'"' 'NR > 1 && $2 != "test" { print $4, $6; exit }' <<<"$out")
  [ -n "$rps" ] || { echo "bench_resp: no result from redis-benchmark $*: $out" >&2; exit 1; }
  read -r rps lat <<<"$rps"
  echo "$rps $(awk -v a="$c0" -v b="$c1" -v t="$tick" 'BEGIN { printf "%.2f", (b - a) / t }') $lat"
}

# Test table: label, -d, -n (x scale), -r, -P, -c, payload (bench:
# redis-benchmark's bytes, SET by the SET row; rand: random, SET untimed)
all_tests=(
  "4K 4096 100000 10000 1 50 bench"
  "64K 65536 20000 2000 1 50 bench"
  "1M 1048576 2000 200 1 50 bench"
  "4K-P16 4096 400000 10000 16 50 bench"
  "4K-c1 4096 20000 10000 1 1 bench"
  "4K-rand 4096 100000 10000 1 50 rand"
  "4K-rand-P16 4096 400000 10000 16 50 rand"
  "4K-rand-c1 4096 20000 10000 1 1 rand"
  "4K-new 4096 50000 100000000 1 50 bench"
)
want_tests=" ${BENCH_TESTS:-4K 64K 1M 4K-P16 4K-c1 4K-rand 4K-rand-P16 4K-rand-c1 4K-new} "
tests=()
for t in "${all_tests[@]}"; do
  [[ $want_tests == *" ${t%% *} "* ]] && tests+=("$t")
done
read -ra ops <<<"${BENCH_OPS:-set get}"
read -ra servers <<<"${BENCH_SERVERS:-kcached off everysec always}"
# A row's SET: timed for redis-benchmark's payload at -c 50; else the
# keyspace is filled first, untimed (random values, or a single client's
# row, whose SETs would take long and say nothing new).
timed_set() { [ "$1" = bench ] && [ "$2" = 50 ]; }
declare -A rps cpu lat
for s in "${servers[@]}"; do
  start_server "$s"
  for t in "${tests[@]}"; do
    read -r label size n keys pipe clients pay <<<"$t"
    n=$(awk -v n="$n" -v k="$scale" 'BEGIN { printf "%d", n * k }')
    # Only this size's keys: the GETs must not meet values of another test.
    redis-cli -p "$port" flushdb >/dev/null
    if [ "$pay" = rand ]; then
      "${client_cpu[@]}" python3 "$here/resp_tool.py" randkeys "$port" "$keys" "$size" >/dev/null
    elif ! timed_set "$pay" "$clients"; then
      bench_one -t set -d "$size" -n "$keys" -r "$keys" -c 50 -P 16 >/dev/null
    fi
    for op in "${ops[@]}"; do
      [ "$op:$label" = get:4K-new ] && continue # its keys: mostly misses
      [ "$op" = set ] && ! timed_set "$pay" "$clients" && continue
      read -r r c l < <(bench_one -t "$op" -d "$size" -n "$n" -r "$keys" -c "$clients" -P "$pipe")
      rps[$s,$op,$label]=$r cpu[$s,$op,$label]=$c lat[$s,$op,$label]=$l
      echo "bench_resp: $s $op $label: $r req/s, server CPU $c s for $n requests, avg latency $l ms" >&2
    done
  done
  stop_server
  rm -rf "$tmp/data-$s"
done

# ---- restart with >= 3 GB of 64 KiB values ----
# Sets res=(fill_bytes fill_s fill_cpu_s ms rss_kib disk_bytes) for a kind.
restart_one() {
  local kind=$1 fb fs c0 c1 d="$tmp/data-$1" ms rss
  start_server "$kind"
  c0=$(cpu_ticks "$spid")
  read -r fb fs < <("${client_cpu[@]}" python3 "$here/resp_tool.py" fill "$port" "$fill_count" 65536)
  [ "$kind" = rdb ] && redis-cli -p "$port" save >/dev/null
  c1=$(cpu_ticks "$spid")
  stop_server
  port=$(free_port)
  if [ "$kind" = kcached ]; then kcached_cmd "$d"; else
    redis_cmd "$d" --save '' --appendonly no --dbfilename dump.rdb; fi
  read -r ms rss < <(python3 "$here/resp_tool.py" firstget "$tmp/first.pid" 65536 \
    $((fill_count / 2)) "$port" -- "${cmdv[@]}")
  res=("$fb" "$fs" "$(awk -v a="$c0" -v b="$c1" -v t="$tick" 'BEGIN { printf "%.2f", (b - a) / t }')"
       "$ms" "$rss" "$(du -sb "$d" | cut -f1)")
  rm -rf "$d"
}
if [ "${BENCH_SKIP_RESTART:-0}" != 1 ]; then
  restart_one kcached
  read -r kfb kfs kfc kms krss kdisk <<<"${res[*]}"
  echo "bench_resp: kcached restart: first value after $kms ms, RSS $krss KiB" >&2
  restart_one rdb
  read -r rfb rfs rfc rms rrss rdisk <<<"${res[*]}"
  echo "bench_resp: redis restart: first value after $rms ms, RSS $rrss KiB" >&2
fi

# ---- report ----
pinned=$([ ${#client_cpu[@]} -gt 0 ] && echo "redis-benchmark on CPU 0, servers on CPU 1" || echo "unpinned")
echo
echo "$("$kcached" --version) vs redis-server $("$redis_bin" --version | sed 's/.*v=\([^ ]*\).*/\1/'); redis-benchmark -c 50 --csv, request counts x$scale; $pinned"
echo "req/s (requests per server CPU-second); ratios: kcached / redis, req/s then per CPU-second"
declare -A colname=([kcached]=kcached [base]="kcached base" [off]="redis off" [everysec]="redis everysec" [always]="redis always")
header=$(printf '%-12s' test)
for s in "${servers[@]}"; do header+=$(printf ' %22s' "${colname[$s]}"); done
echo "$header$(printf ' %17s %17s %s' "/off" "/always" target)"
for t in "${tests[@]}"; do
  read -r label _ n _ _ <<<"$t"
  n=$(awk -v n="$n" -v k="$scale" 'BEGIN { printf "%d", n * k }')
  for op in "${ops[@]}"; do
    [ "$op:$label" = get:4K-new ] && continue
    [ -n "${rps[${servers[0]},$op,$label]:-}" ] || continue
    line=$(printf '%-12s' "${op^^} $label")
    declare -A pcs=()
    for s in "${servers[@]}"; do
      c=${cpu[$s,$op,$label]:-0}
      pcs[$s]=$(awk -v n="$n" -v c="$c" 'BEGIN { printf "%.0f", (c > 0 ? n / c : 0) }')
      line+=$(awk -v r="${rps[$s,$op,$label]:-0}" -v p="${pcs[$s]}" 'BEGIN { printf " %11.0f (%8.0f)", r, p }')
    done
    target="-"
    [ "$op" = get ] && target=">=0.8 off"
    [ "$op" = set ] && target=">=0.3 off, >=1.0 always"
    line+=$(awk -v k="${rps[kcached,$op,$label]:-0}" -v o="${rps[off,$op,$label]:-0}" -v a="${rps[always,$op,$label]:-0}" \
      -v kc="${pcs[kcached]:-0}" -v oc="${pcs[off]:-0}" -v ac="${pcs[always]:-0}" -v t="$target" \
      'BEGIN { printf " %8s %8s %8s %8s  %s", x(k, o), x(kc, oc), x(k, a), x(kc, ac), t }
       function x(p, q) { return q > 0 ? sprintf("%.2fx", p / q) : "-" }')
    echo "$line"
  done
done
for t in "${tests[@]}"; do
  read -r label _ _ _ _ clients _ <<<"$t"
  [ "$clients" = 1 ] && [ -n "${lat[${servers[0]},get,$label]:-}" ] || continue
  line=$(printf '%-12s' "GET $label")
  for s in "${servers[@]}"; do line+=$(printf ' %19s ms' "${lat[$s,get,$label]:-}"); done
  echo "$line  avg latency (single client); /off: $(awk -v k="${lat[kcached,get,$label]:-0}" -v o="${lat[off,get,$label]:-0}" \
    'BEGIN { print (k > 0 ? sprintf("%.2fx", o / k) : "-") }') (redis / kcached, >= 0.8)"
done
if [ "${BENCH_SKIP_RESTART:-0}" != 1 ]; then
  echo
  echo "restart with $fill_count distinct 64 KiB values ($(awk -v b="$kfb" 'BEGIN { printf "%.2f GB", b / 1e9 }')), filled by resp_tool.py (one connection, pipelined):"
  printf '%-34s %14s %14s %10s\n' "" kcached "redis (RDB)" target
  awk -v a="$kfb" -v b="$kfs" -v c="$rfb" -v d="$rfs" 'BEGIN { printf "%-34s %9.0f MB/s %9.0f MB/s\n", "fill (distinct-value SETs)", a / b / 1e6, c / d / 1e6 }'
  awk -v a="$kfc" -v c="$rfc" 'BEGIN { printf "%-34s %12.1f s %12.1f s  (redis: with SAVE)\n", "server CPU during the fill", a, c }'
  printf '%-34s %11s ms %11s ms %10s\n' "start to first GET value" "$kms" "$rms" "< 100 ms"
  awk -v a="$krss" -v c="$rrss" 'BEGIN { printf "%-34s %10.1f MiB %10.1f MiB %10s\n", "RSS then", a / 1024, c / 1024, "< 100 MiB" }'
  awk -v a="$kdisk" -v c="$rdisk" 'BEGIN { printf "%-34s %11.2f GB %11.2f GB\n", "on disk", a / 1e9, c / 1e9 }'
fi
