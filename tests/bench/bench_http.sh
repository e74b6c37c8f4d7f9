#!/usr/bin/env bash
# bench_http.sh: kcached against nginx and its own HTTP library's ceiling.
#
# Serves one 4 KiB and one 16 MiB blob from kcached, the same bytes from files
# through nginx (sendfile, access log off, a minimal nginx.conf written to a
# temporary directory, run as the current user), and through mhd_static (the
# ceiling: libmicrohttpd answering a static buffer, tests/bench/mhd_static.c,
# compiled here with cc), each on its own loopback port, and measures GETs
# with wrk, the three interleaved in every run; then PUTs of distinct 16 MiB
# blobs into kcached with curl (one connection, many uploads).
#
# Reports req/s and requests per server CPU-second (utime+stime from
# /proc/PID/stat of the server's processes, children included, over the wrk
# run), medians of BENCH_RUNS. The second is the one to compare: one wrk
# thread on one core saturates before a fast server does, and then req/s
# ratios say nothing about the server.
#
# Fair share on a small machine: wrk and curl run on CPU 0, both servers on
# CPU 1 (taskset), each server with one worker (kcached --threads 1, nginx
# worker_processes 1); set BENCH_PIN=0 to let the scheduler decide.
#
# Usage: tests/bench/bench_http.sh [path/to/kcached]
#   env: BENCH_DURATION (5s) BENCH_CONNS (16) BENCH_RUNS (3) BENCH_PUTS (8; 0: no PUTs)
#        BENCH_PIN (1) BENCH_THREADS (1: kcached --threads) NGINX (nginx)
#        KCACHED_ARGS (more kcached flags, e.g. "--access-log off")
#        NGINX_SENDFILE (on: Debian's default; off: read+write, which was the
#        faster of the two for 16 MiB on a 2-CPU VM)
# Needs: wrk, nginx, curl, python3 (a free port), sha256sum, taskset, cc and
# libmicrohttpd's headers (for mhd_static; BENCH_MHD=0 skips that column).
# Loopback only; every loop is bounded; the temporary directory is removed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
kcached=${1:-${KCACHED:-}}
if [ -z "$kcached" ]; then
  for c in "$root/build/server/kcached" "$root/build-server/server/kcached"; do
    [ -x "$c" ] && kcached=$c && break
  done
fi
[ -n "$kcached" ] && [ -x "$kcached" ] || { echo "bench_http: no kcached binary (give its path)" >&2; exit 2; }
nginx_bin=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
for tool in wrk curl python3 sha256sum "$nginx_bin"; do
  command -v "$tool" >/dev/null || { echo "bench_http: $tool not found" >&2; exit 2; }
done

duration=${BENCH_DURATION:-5s}
conns=${BENCH_CONNS:-16}
runs=${BENCH_RUNS:-3}
puts=${BENCH_PUTS:-8}
threads=${BENCH_THREADS:-1}
pin=${BENCH_PIN:-1}
sendfile=${NGINX_SENDFILE:-on}
client_cpu=() server_cpu=()
if [ "$pin" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  client_cpu=(taskset -c 0) server_cpu=(taskset -c 1)
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-bench-XXXXXX")
kpid="" npid="" mpid=""
cleanup() {
  # shellcheck disable=SC2086 # two pids
  [ -n "$mpid" ] && kill $mpid 2>/dev/null && wait $mpid 2>/dev/null || true
  [ -n "$kpid" ] && kill "$kpid" 2>/dev/null && wait "$kpid" 2>/dev/null || true
  [ -n "$npid" ] && kill "$npid" 2>/dev/null && wait "$npid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (10 s at most) until a URL answers 200.
wait_http() {
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)" = 200 ] && return 0
    sleep 0.05
  done
  echo "bench_http: $1 did not come up" >&2
  return 1
}

start_kcached() { # data dir
  rm -f "$tmp/port"
  # shellcheck disable=SC2086 # KCACHED_ARGS: words
  "${server_cpu[@]}" "$kcached" --listen 127.0.0.1:0 --port-file "$tmp/port" \
    --data-dir "$1" --threads "$threads" --max-blob-bytes 64M ${KCACHED_ARGS:-} \
    2>"$tmp/kcached.log" &
  kpid=$!
  for _ in $(seq 1 200); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  kport=$(cat "$tmp/port")
  wait_http "http://127.0.0.1:$kport/healthz"
}

stop_kcached() {
  kill "$kpid" && wait "$kpid" || true
  kpid=""
}

# ---- the bytes ----
mkdir -p "$tmp/www/v1/blobs" "$tmp/nginx"
head -c 4096 /dev/urandom >"$tmp/small"
head -c $((16 << 20)) /dev/urandom >"$tmp/large"
small=$(sha256sum "$tmp/small" | cut -c1-64)
large=$(sha256sum "$tmp/large" | cut -c1-64)
cp "$tmp/small" "$tmp/www/v1/blobs/$small"
cp "$tmp/large" "$tmp/www/v1/blobs/$large"

# ---- kcached ----
start_kcached "$tmp/data"
for f in small large; do
  d=$(sha256sum "$tmp/$f" | cut -c1-64)
  code=$(curl -s -o /dev/null -w '%{http_code}' -T "$tmp/$f" "http://127.0.0.1:$kport/v1/blobs/$d")
  case $code in 200|201) ;; *) echo "bench_http: PUT $f: HTTP $code" >&2; exit 1 ;; esac
done

# ---- nginx ----
nport=$(free_port)
user_line=""
[ "$(id -u)" = 0 ] && user_line="user $(id -un) $(id -gn);"
cat >"$tmp/nginx/nginx.conf" <<EOF
$user_line
worker_processes 1;
daemon off;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile $sendfile;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  default_type application/octet-stream;
  client_body_temp_path $tmp/nginx/body;
  proxy_temp_path $tmp/nginx/proxy;
  fastcgi_temp_path $tmp/nginx/fastcgi;
  uwsgi_temp_path $tmp/nginx/uwsgi;
  scgi_temp_path $tmp/nginx/scgi;
  server {
    listen 127.0.0.1:$nport;
    root $tmp/www;
  }
}
EOF
chmod 755 "$tmp"
"${server_cpu[@]}" "$nginx_bin" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" 2>"$tmp/nginx/stderr" &
npid=$!
wait_http "http://127.0.0.1:$nport/v1/blobs/$small"

# ---- mhd_static: one per size, each answering its file's bytes ----
servers="k n"
mport_small="" mport_large="" mpids=()
if [ "${BENCH_MHD:-1}" = 1 ]; then
  cc -O2 -o "$tmp/mhd_static" "$here/mhd_static.c" -lmicrohttpd
  for f in small large; do
    rm -f "$tmp/mport"
    "${server_cpu[@]}" "$tmp/mhd_static" "$tmp/$f" "$tmp/mport" &
    mpids+=($!)
    for _ in $(seq 1 200); do [ -s "$tmp/mport" ] && break; sleep 0.05; done
    eval "mport_$f=\$(cat \"\$tmp/mport\")"
  done
  mpid="${mpids[*]}"
  servers="k n m"
fi

# Every server must serve the same bytes.
url_of() { # server size -> url
  local d port
  d=$([ "$2" = small ] && echo "$small" || echo "$large")
  case $1 in
    k) port=$kport ;; n) port=$nport ;;
    m) [ "$2" = small ] && port=$mport_small || port=$mport_large ;;
  esac
  echo "http://127.0.0.1:$port/v1/blobs/$d"
}
for size in small large; do
  d=$([ $size = small ] && echo "$small" || echo "$large")
  for s in $servers; do
    a=$(curl -s "$(url_of $s $size)" | sha256sum | cut -c1-64)
    [ "$a" = "$d" ] || { echo "bench_http: $s serves other bytes for $size" >&2; exit 1; }
  done
done

# ---- GET with wrk ----
hz=$(getconf CLK_TCK)
cpu_ticks() { # server size -> utime+stime of its processes and their children
  local p pids ch t=0
  case $1 in
    k) pids=$kpid ;; n) pids=$npid ;;
    m) [ "$2" = small ] && pids=${mpids[0]} || pids=${mpids[1]} ;;
  esac
  for p in $pids; do
    ch=$(cat /proc/"$p"/task/*/children 2>/dev/null || true)
    for c in $p $ch; do
      # fields 14 and 15 after the ")" that ends the command name
      t=$((t + $(sed 's/.*) //' /proc/"$c"/stat | awk '{print $12 + $13}')))
    done
  done
  echo "$t"
}

# One wrk run -> "req/s req-per-CPU-second".
wrk_run() { # server size
  local t0 t1 out
  t0=$(cpu_ticks "$1" "$2")
  out=$("${client_cpu[@]}" wrk -t1 -c"$conns" -d"$duration" "$(url_of "$1" "$2")")
  t1=$(cpu_ticks "$1" "$2")
  awk -v hz="$hz" -v dt=$((t1 - t0)) '
    / requests in / {n = $1}
    /^Requests\/sec:/ {r = $2}
    END {printf "%s %.0f\n", r, (dt > 0 ? n * hz / dt : 0)}' <<<"$out"
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

declare -A samples cpus
for run in $(seq 1 "$runs"); do
  for size in small large; do
    for s in $servers; do
      read -r rps pcs < <(wrk_run "$s" "$size")
      samples[${s}_$size]+="$rps "
      cpus[${s}_$size]+="$pcs "
    done
  done
  echo "bench_http: GET run $run/$runs done" >&2
done

# ---- PUT of distinct 16 MiB blobs ----
stop_kcached
for i in $(seq 1 "$puts"); do
  head -c $((16 << 20)) /dev/urandom >"$tmp/put$i"
done
put_args=()
for i in $(seq 1 "$puts"); do
  d=$(sha256sum "$tmp/put$i" | cut -c1-64)
  put_args+=(-o /dev/null -T "$tmp/put$i" "http://127.0.0.1:PORT/v1/blobs/$d")
done
put_mbs=""
[ "$puts" -gt 0 ] || runs_put=0
for run in $(seq 1 "${runs_put:-$runs}"); do
  rm -rf "$tmp/putdata"
  start_kcached "$tmp/putdata"
  args=("${put_args[@]//PORT/$kport}")
  t0=$(date +%s.%N)
  codes=$("${client_cpu[@]}" curl -s -w '%{http_code}\n' "${args[@]}")
  t1=$(date +%s.%N)
  created=$(grep -c '^201$' <<<"$codes" || true)
  [ "$created" = "$puts" ] || { echo "bench_http: PUT answers: $codes" >&2; exit 1; }
  put_mbs+="$(awk -v n="$puts" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", n*16*1048576/(b-a)/1e6}') "
  stop_kcached
done

# ---- report ----
kver=$("$kcached" --version 2>/dev/null || echo kcached)
nver=$("$nginx_bin" -v 2>&1 | sed 's/.*version: //')
pinned=$([ ${#client_cpu[@]} -gt 0 ] && echo "wrk/curl on CPU 0, servers on CPU 1" || echo "unpinned")
echo
echo "$kver (--threads $threads${KCACHED_ARGS:+ $KCACHED_ARGS}) vs $nver (worker_processes 1, sendfile $sendfile) vs mhd_static; wrk -t1 -c$conns -d$duration; median of $runs; $pinned; $(nproc) CPUs, $(date -u +%F)"
med() { tr ' ' '\n' <<<"$1" | grep . | median; }
printf '%-11s %-9s %12s %12s %14s %14s\n' "" server "req/s" "bytes/s" "req/CPU-s" "vs nginx CPU-s"
for size in small large; do
  bytes=$([ $size = small ] && echo 4096 || echo $((16 << 20)))
  label=$([ $size = small ] && echo "GET 4 KiB" || echo "GET 16 MiB")
  nc=$(med "${cpus[n_$size]}")
  for s in $servers; do
    name=$(case $s in k) echo kcached ;; n) echo nginx ;; m) echo mhd_static ;; esac)
    r=$(med "${samples[${s}_$size]}")
    c=$(med "${cpus[${s}_$size]}")
    awk -v l="$label" -v n="$name" -v r="$r" -v c="$c" -v nc="$nc" -v b="$bytes" 'BEGIN {
      printf "%-11s %-10s %11.0f %12s %14.0f %13.2fx\n", l, n, r, h(r*b), c, (nc > 0 ? c/nc : 0) }
      function h(x) { return x >= 1e9 ? sprintf("%.2f GB/s", x/1e9) : sprintf("%.1f MB/s", x/1e6) }'
  done
  if [ "${cpus[m_$size]+x}" ]; then
    awk -v k="$(med "${cpus[k_$size]}")" -v m="$(med "${cpus[m_$size]}")" -v l="$label" \
      'BEGIN {printf "%-11s kcached/mhd_static per CPU-second: %.2fx\n", l, (m > 0 ? k/m : 0)}'
  fi
done
pm=$(tr ' ' '\n' <<<"$put_mbs" | grep . | median || true)
[ "$puts" -gt 0 ] && printf '%-11s %s MB/s (kcached; %d distinct blobs per run over one connection; runs: %s) target >= 500\n' \
  "PUT 16 MiB" "$pm" "$puts" "$put_mbs"
for key in "${!samples[@]}"; do
  echo "raw $key: req/s ${samples[$key]}| req/CPU-s ${cpus[$key]}"
done | sort
echo "targets: kcached >= 0.9x mhd_static per CPU-second, at 4 KiB and at 16 MiB"
