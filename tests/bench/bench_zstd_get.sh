#!/usr/bin/env bash
# bench_zstd_get.sh: what a client that does not send Accept-Encoding: zstd
# (curl, wget, Python urllib) pays for a blob kcached holds compressed,
# against the GET of an incompressible (raw-held) blob of the same size from
# the same server, in interleaved wrk runs. Per run: requests per server
# CPU-second (utime+stime of /proc/PID/stat over the run: steadier than req/s
# on a shared machine) and req/s; medians and the ratio compressible/raw.
# Target: per CPU-second, at least 0.8x.
#
# The compressible blob is PTX-like text (lines of instructions with
# changing registers: about a quarter of its size at level 3, so it is kept
# compressed); the raw one random bytes.
#
# Usage: tests/bench/bench_zstd_get.sh [path/to/kcached]
#   env: SIZES ("4096 16777216") RUNS (7) DUR (3s) CONNS (16).
#   wrk on CPU 0, kcached on CPU 1 (taskset), --threads 1.
# Needs: wrk, curl, sha256sum, python3, taskset. Loopback only; the
# temporary directory and the server are removed at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kcached=${1:-$here/../../build/server/kcached}
runs=${RUNS:-7} dur=${DUR:-3s} conns=${CONNS:-16}
read -ra sizes <<<"${SIZES:-4096 16777216}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-zget-XXXXXX")
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
taskset -c 1 "$kcached" --listen 127.0.0.1:0 --port-file "$tmp/port" \
  --data-dir "$tmp/data" --threads 1 --max-blob-bytes 64M >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port")
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
put() { # file -> digest (PUT raw; the server decides how to hold it)
  local d
  d=$(sha256sum "$1" | cut -c1-64)
  curl -sf -o /dev/null -X PUT --data-binary @"$1" "http://127.0.0.1:$port/v1/blobs/$d"
  echo "$d"
}
med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
printf '%-10s %-13s %16s %12s\n' size blob "req/CPU-s (med)" "req/s (med)"
for sz in "${sizes[@]}"; do
  head -c "$sz" /dev/urandom >"$tmp/raw"
  python3 -c '
import sys
n, out, i = int(sys.argv[1]), bytearray(), 0
while len(out) < n:
    out += b"ld.global.f32 %%f%d, [%%rd%d+%d];\n" % (i % 61, i % 17, (i * 4) % 4096)
    i += 1
sys.stdout.buffer.write(out[:n])' "$sz" >"$tmp/text"
  dr=$(put "$tmp/raw") dt=$(put "$tmp/text")
  enc=$(curl -s -o /dev/null -D - -H 'Accept-Encoding: zstd' "http://127.0.0.1:$port/v1/blobs/$dt" |
        tr -d '\r' | awk -F': ' 'tolower($1) == "content-encoding" { print $2 }')
  [ "$enc" = zstd ] || echo "bench_zstd_get: the text blob of $sz bytes is not held compressed" >&2
  declare -A pcs=() rps=()
  for _ in $(seq "$runs"); do
    for kind in text raw; do
      d=$([ $kind = text ] && echo "$dt" || echo "$dr")
      t0=$(ticks)
      out=$(taskset -c 0 wrk -t1 -c"$conns" -d"$dur" "http://127.0.0.1:$port/v1/blobs/$d")
      t1=$(ticks)
      n=$(awk '/requests in/ { print $1 }' <<<"$out")
      pcs[$kind]+="$(awk -v t=$((t1 - t0)) -v n="$n" -v hz="$hz" 'BEGIN { printf "%.0f", (t > 0 ? n * hz / t : 0) }') "
      rps[$kind]+="$(awk '/Requests\/sec/ { printf "%.0f", $2 }' <<<"$out") "
    done
  done
  for kind in text raw; do
    read -ra p <<<"${pcs[$kind]}"
    read -ra q <<<"${rps[$kind]}"
    printf '%-10s %-13s %16s %12s   runs: %s\n' "$sz" "$([ $kind = text ] && echo "compressible" || echo "random")" \
      "$(med "${p[@]}")" "$(med "${q[@]}")" "${pcs[$kind]}"
  done
  read -ra p <<<"${pcs[text]}"
  read -ra q <<<"${pcs[raw]}"
  awk -v a="$(med "${p[@]}")" -v b="$(med "${q[@]}")" -v s="$sz" \
    'BEGIN { printf "%-10s compressible/random per CPU-second: %.2fx (target >= 0.8x)\n", s, (b > 0 ? a / b : 0) }'
done
