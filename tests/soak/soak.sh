#!/usr/bin/env bash
# soak.sh: a bounded load soak of kcached: wrk on loopback with a
# mix of GET blob, POST /v1/lookup and PUT blob (distinct bodies), after a
# warm-up; passes when every response is 2xx, wrk saw no socket error, the
# server's memory is flat and it holds no more file descriptors than before.
#
#   memory: RssAnon (heap; what a leak grows) after the warm-up vs at the end,
#           within SOAK_RSS_TOL_MB (20; 48 for an ASan build, run with its
#           quarantine of freed memory capped at 32 MiB). VmRSS is printed too: it also
#           counts LMDB's file-backed map pages, which grow with the data the
#           PUTs add and are not a leak.
#   fds:    /proc/PID/fd after the warm-up vs at the end (wrk gone), within
#           SOAK_FD_TOL (2).
#
# Usage: tests/soak/soak.sh [path/to/kcached]
#   env: SOAK_SECONDS (60) SOAK_WARMUP (SOAK_SECONDS/6, at least 3)
#        SOAK_CONNS (16) SOAK_THREADS (2: wrk threads) SOAK_RSS_TOL_MB
#        SOAK_FD_TOL KCACHED_ARGS (extra kcached flags)
# Needs wrk (exit 77, "skipped", without it), curl, python3.
# Loopback only; bounded; the temporary directory is removed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
kcached=${1:-${KCACHED:-}}
if [ -z "$kcached" ]; then
  for c in "$root/build/server/kcached" "$root/build-rel/server/kcached"; do
    [ -x "$c" ] && kcached=$c && break
  done
fi
if [ -z "$kcached" ] || [ ! -x "$kcached" ]; then
  echo "soak: no kcached binary (give its path)" >&2
  exit 2
fi
command -v wrk >/dev/null || { echo "soak: wrk not found: skipped (scripts/install-deps.sh)"; exit 77; }
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "soak: $tool not found" >&2; exit 2; }
done

secs=${SOAK_SECONDS:-60}
warm=${SOAK_WARMUP:-$((secs / 6 > 3 ? secs / 6 : 3))}
conns=${SOAK_CONNS:-16}
wthreads=${SOAK_THREADS:-2}
fd_tol=${SOAK_FD_TOL:-2}
# Not `ldd | grep -q`: grep -q exits at its first match, ldd may then die of
# SIGPIPE, and under pipefail the test would read "not ASan".
asan=0
case "$(ldd "$kcached" 2>/dev/null || true)" in *libasan*) asan=1 ;; esac
# ASan's quarantine holds freed memory (256 MiB by default) and would hide a
# leak; capped at 32 MiB here, the flat-memory check still means something.
if [ "$asan" = 1 ]; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=32"
fi
rss_tol=${SOAK_RSS_TOL_MB:-$([ "$asan" = 1 ] && echo 48 || echo 20)}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-soak-XXXXXX")
kpid=""
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  if [ -n "$kpid" ] && kill -0 "$kpid" 2>/dev/null; then
    kill "$kpid" 2>/dev/null || true
    wait "$kpid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck disable=SC2086
"$kcached" --listen 127.0.0.1:0 --port-file "$tmp/port" --data-dir "$tmp/data" \
  --max-blob-bytes 16M ${KCACHED_ARGS:-} 2>"$tmp/kcached.log" &
kpid=$!
for _ in $(seq 1 600); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "soak: kcached did not start" >&2; cat "$tmp/kcached.log" >&2; exit 1; }
url="http://127.0.0.1:$(cat "$tmp/port")"
for _ in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz" || true)" = 200 ] && break
  sleep 0.05
done

# Preload: 64 blobs (1..64 KiB) and 32 bundles of 2 of them; the digests
# and keys go to files wrk's script reads.
python3 - "$url" "$tmp" <<'PY'
import hashlib, json, random, sys, urllib.request
url, tmp = sys.argv[1], sys.argv[2]
rng = random.Random(6)
def canon(o):
    return json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
def put(path, body):
    req = urllib.request.Request(url + path, data=body, method="PUT")
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status not in (200, 201):
            sys.exit("preload %s: %d" % (path, r.status))
blobs = []
for i in range(64):
    data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1024, 65536)))
    d = hashlib.sha256(data).hexdigest()
    put("/v1/blobs/" + d, data)
    blobs.append((d, len(data)))
model = hashlib.sha256(b"kcache soak").hexdigest()
keys = []
for b in range(32):
    fields = {"v": 1, "model": model, "bucket": {"batch": b + 1}, "arch": "sm_90a",
              "toolchain": {"cuda": "13.0"}, "build": "b" * 64}
    key = hashlib.sha256(canon(fields).encode()).hexdigest()
    files = [{"path": "k%d.cubin" % j, "sha256": blobs[(b * 2 + j) % 64][0],
              "size": blobs[(b * 2 + j) % 64][1], "kind": "cubin", "entries": ["gemm"]}
             for j in range(2)]
    m = dict(fields)
    del m["v"]
    m.update({"schema": "kcache.bundle/v1", "key": key, "files": files})
    put("/v1/bundles/" + key, canon(m).encode())
    keys.append(key)
open(tmp + "/blobs.txt", "w").write("\n".join(d for d, _ in blobs) + "\n")
open(tmp + "/keys.txt", "w").write("\n".join(keys) + "\n")
PY

proc_field() { # field of /proc/PID/status in kB
  awk -v f="$1:" '$1 == f { print $2 }' "/proc/$kpid/status"
}
fds() { find "/proc/$kpid/fd" -mindepth 1 -maxdepth 1 | wc -l; }

run_wrk() { # phase seconds out
  wrk -t"$wthreads" -c"$conns" -d"$2s" --timeout 10s -s "$here/soak.lua" "$url" \
    -- "$tmp/blobs.txt" "$tmp/keys.txt" "$1" >"$3" 2>&1 || {
    echo "soak: wrk failed" >&2; cat "$3" >&2; exit 1; }
}

# Settles after wrk: connections closed and counted down by the server.
settle_fds() { # baseline
  local n
  for _ in $(seq 1 50); do
    n=$(fds)
    [ "$n" -le $(($1 + fd_tol)) ] && break
    sleep 0.1
  done
}

run_wrk warmup "$warm" "$tmp/warm.txt"
sleep 0.5
fd0=$(fds)
settle_fds "$fd0"
fd0=$(fds)
rss0=$(proc_field VmRSS) anon0=$(proc_field RssAnon)

run_wrk main "$secs" "$tmp/main.txt"
settle_fds "$fd0"
fd1=$(fds)
rss1=$(proc_field VmRSS) anon1=$(proc_field RssAnon)
kill -0 "$kpid" 2>/dev/null || { echo "soak: kcached died" >&2; tail -20 "$tmp/kcached.log" >&2; exit 1; }
health=$(curl -s -o /dev/null -w '%{http_code}' "$url/healthz" || true)

statuses=$(sed -n 's/^SOAK_STATUS //p' "$tmp/main.txt")
read -r e_conn e_read e_write e_status e_timeout < <(sed -n 's/^SOAK_ERRORS //p' "$tmp/main.txt")
read -r requests duration_us bytes < <(sed -n 's/^SOAK_SUMMARY //p' "$tmp/main.txt")
warm_statuses=$(sed -n 's/^SOAK_STATUS //p' "$tmp/warm.txt")
read -r w_conn w_read w_write _ w_timeout < <(sed -n 's/^SOAK_ERRORS //p' "$tmp/warm.txt")
bad=0
for kv in $statuses $warm_statuses; do
  case "${kv%%=*}" in 200|201|304) ;; *) bad=$((bad + ${kv#*=})) ;; esac
done
sock=$((e_conn + e_read + e_write + e_timeout + w_conn + w_read + w_write + w_timeout))
rps=$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
drss=$(( (rss1 - rss0) / 1024 )) danon=$(( (anon1 - anon0) / 1024 ))

# A graceful stop, exit 0.
kill -TERM "$kpid"
stop_rc=0
wait "$kpid" || stop_rc=$?
kpid=""
log_errors=$(grep -c ' error ' "$tmp/kcached.log" || true)

echo "soak: ${secs}s (+${warm}s warm-up), $conns connections: $requests requests, $rps rps," \
  "$((bytes / 1048576)) MiB read, statuses [$statuses], non-2xx $bad (wrk: $e_status)," \
  "socket errors $sock (connect $e_conn read $e_read write $e_write timeout $e_timeout), VmRSS ${rss0}->${rss1} kB (${drss} MiB)," \
  "RssAnon ${anon0}->${anon1} kB (${danon} MiB, tolerance ${rss_tol} MiB)," \
  "fds ${fd0}->${fd1} (tolerance $fd_tol), healthz $health, stop rc $stop_rc, log errors $log_errors"

fail=0
[ "$requests" -gt 0 ] || { echo "soak: FAIL: no requests" >&2; fail=1; }
[ "$((bad + e_status))" -eq 0 ] || { echo "soak: FAIL: $bad non-2xx responses (wrk: $e_status)" >&2; fail=1; }
[ "$sock" -eq 0 ] || { echo "soak: FAIL: $sock socket errors" >&2; fail=1; }
[ "$danon" -le "$rss_tol" ] || { echo "soak: FAIL: RssAnon grew $danon MiB" >&2; fail=1; }
[ "$fd1" -le $((fd0 + fd_tol)) ] || { echo "soak: FAIL: fds $fd0 -> $fd1" >&2; fail=1; }
[ "$health" = 200 ] || { echo "soak: FAIL: /healthz $health after the soak" >&2; fail=1; }
[ "$stop_rc" -eq 0 ] || { echo "soak: FAIL: kcached exited $stop_rc on SIGTERM" >&2; fail=1; }
[ "$log_errors" -eq 0 ] || { echo "soak: FAIL: errors in the log:" >&2; grep ' error ' "$tmp/kcached.log" | head -5 >&2; fail=1; }
[ "$fail" -eq 0 ] && echo "soak: PASS"
exit "$fail"
