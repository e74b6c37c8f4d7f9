#!/usr/bin/env bash
# bench_s3.sh: a 4 KiB blob GET served from LMDB, read through from S3, and
# fetched from S3 directly, in one run (the S3 tier's targets).
#
# Starts a throw-away single-node Ceph RGW (scripts/ceph-rgw.sh, into a
# temporary directory, stopped at exit) and two kcached replicas A and B on
# one bucket (--s3-endpoint/--s3-bucket/--s3-prefix/--s3-path-style, separate
# data directories, credentials from the environment). Each of BENCH_ROUNDS
# rounds uploads BENCH_N (200) fresh random 4 KiB blobs through A, waits until
# A's write-through queue is empty (kcached_s3_queue_depth 0), then times
# three series of BENCH_N sequential GETs, one blob per request, each series
# ONE curl process over one keep-alive connection (`curl -w '%{time_total}'`
# with every URL on its command line; a first request for another blob opens
# the connection and is not counted):
#   (a) LMDB hit:     GET /v1/blobs/{d} on A, which holds every blob
#   (b) read-through: GET /v1/blobs/{d} on B, which holds none of them: each
#                     request misses LMDB, GETs the object from S3, verifies
#                     its SHA-256, stores it in LMDB and serves it
#   (c) plain S3:     GET of the same objects ({prefix}/blobs/{d}) from the
#                     RGW with curl's own SigV4 (--aws-sigv4, plus the
#                     x-amz-content-sha256 header RGW insists on)
# The order of (b) and (c) alternates between rounds (RGW and the OSD warm
# up). Afterwards, outside the timing, B's and the RGW's bytes are checked
# against the digests. Every request must answer 200 or the script exits 1.
#
# Prints the median and p90 of each series (all rounds' samples pooled), the
# ratios S3 / LMDB (target >= 10x) and read-through / plain S3 (target
# <= 1.2x) of the medians, and a Markdown table with the command line. A
# missed target prints MISSED, and exits 1 only with BENCH_STRICT=1.
#
# Placement (BENCH_PIN=1, the default, with 2+ CPUs and taskset): the Ceph
# daemons (mon, OSD, radosgw) on the last CPU, the replicas and every curl on
# the others, as a bucket is another machine in production. Sharing two CPUs
# unpinned, each request's three wakeups (curl, kcached, radosgw) queue
# behind the others' threads; BENCH_PIN=0 measures that too.
#
# Usage: tests/bench/bench_s3.sh [path/to/kcached (default build/server/kcached)]
#   env: BENCH_N (200) BENCH_ROUNDS (3) BENCH_STRICT (0) BENCH_PIN (1) KCACHED
#        KC_TEST_S3_ENV=FILE: use a running RGW (FILE: its env file from
#        ceph-rgw.sh) instead of starting one
# Needs: a kcached built with the S3 tier, curl >= 7.75 (--aws-sigv4),
#        python3, sha256sum, the Ceph packages (ceph-rgw.sh installs them;
#        exit 77 when it cannot).
# Loopback only; every wait is bounded; the processes it starts are stopped
# by PID; the temporary directory is removed.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
kcached=${1:-${KCACHED:-$root/build/server/kcached}}
[ -x "$kcached" ] || { echo "bench_s3: no kcached at $kcached (give its path)" >&2; exit 2; }
grep -q -- --s3-endpoint <<<"$("$kcached" --help 2>&1 || true)" ||
  { echo "bench_s3: $kcached has no S3 tier (--s3-endpoint)" >&2; exit 2; }
for tool in curl python3 sha256sum pgrep; do
  command -v "$tool" >/dev/null || { echo "bench_s3: $tool not found" >&2; exit 2; }
done
grep -q -- '--aws-sigv4' <<<"$(curl --help all 2>/dev/null || true)" ||
  { echo "bench_s3: curl has no --aws-sigv4 (7.75 or later needed)" >&2; exit 2; }

n=${BENCH_N:-200}
rounds=${BENCH_ROUNDS:-3}
pin=${BENCH_PIN:-1}
strict=${BENCH_STRICT:-0}
for v in n rounds; do
  case ${!v} in '' | *[!0-9]*) echo "bench_s3: $v must be a positive integer" >&2; exit 2 ;; esac
  [ "${!v}" -ge 1 ] || { echo "bench_s3: $v must be >= 1" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-bench-s3-XXXXXX")
rgw_dir="" apid="" bpid=""
ceph_pids=() near=()
cleanup() {
  local p
  for p in "$apid" "$bpid"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true
  done
  for p in "${ceph_pids[@]}"; do # a running RGW given to us: as it was
    taskset -a -p -c "$all_cpus" "$p" >/dev/null 2>&1 || true
  done
  [ -n "$rgw_dir" ] && KCACHE_RGW_OWNER_PID='' bash "$root/scripts/ceph-rgw.sh" stop "$rgw_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

die() {
  echo "bench_s3: $*" >&2
  for r in a b; do
    if [ -s "$tmp/kcached-$r.log" ]; then
      echo "bench_s3: last lines of replica ${r^^}'s log:" >&2
      tail -n 5 "$tmp/kcached-$r.log" >&2
    fi
  done
  exit 1
}

# ---- the RGW ----
if [ -n "${KC_TEST_S3_ENV:-}" ]; then
  envfile=$KC_TEST_S3_ENV
else
  rgw_dir=$tmp/rgw
  rc=0
  KCACHE_RGW_OWNER_PID=$$ bash "$root/scripts/ceph-rgw.sh" start "$rgw_dir" >/dev/null 2>"$tmp/rgw-start.log" || rc=$?
  if [ "$rc" = 77 ]; then
    cat "$tmp/rgw-start.log" >&2
    echo "bench_s3: no Ceph RGW here (packages cannot be installed)" >&2
    exit 77
  fi
  [ "$rc" = 0 ] || { cat "$tmp/rgw-start.log" >&2; die "the RGW did not start"; }
  envfile=$rgw_dir/env
fi
# shellcheck disable=SC1090
. "$envfile"

# ---- placement: Ceph on the last CPU, the rest of us on the others ----
ncpu=$(nproc)
all_cpus=0-$((ncpu - 1))
placement="unpinned"
if [ "$pin" = 1 ] && [ "$ncpu" -ge 2 ] && command -v taskset >/dev/null; then
  mapfile -t ceph_pids < <(pgrep -f -- "$(dirname "$envfile")/ceph.conf" || true)
  [ ${#ceph_pids[@]} -gt 0 ] || die "no Ceph process found to pin"
  for p in "${ceph_pids[@]}"; do
    taskset -a -p -c "$((ncpu - 1))" "$p" >/dev/null || die "taskset $p failed"
  done
  near=(taskset -c "0-$((ncpu - 2))")
  placement="Ceph daemons on CPU $((ncpu - 1)), replicas and curl on CPU 0-$((ncpu - 2))"
fi
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
endpoint=$KCACHE_S3_ENDPOINT
region=$KCACHE_S3_REGION
bucket=kcache-bench-$$
prefix=bench
empty_sha=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
# curl signs (SigV4) but does not send the payload hash RGW requires; the
# credentials go through a config file, never the command line.
printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$tmp/s3.curlrc"
chmod 600 "$tmp/s3.curlrc"
s3curl=(curl -K "$tmp/s3.curlrc" --aws-sigv4 "aws:amz:$region:s3"
        -H "x-amz-content-sha256: $empty_sha")
code=$("${s3curl[@]}" -s -o "$tmp/mb.out" -w '%{http_code}' -X PUT "$endpoint/$bucket") || true
[ "$code" = 200 ] || { cat "$tmp/mb.out" >&2; die "creating bucket $bucket: HTTP $code"; }

# ---- the replicas ----
start_replica() { # name -> sets ${name}pid, ${name}url
  local r=$1 port=""
  "${near[@]}" "$kcached" --listen 127.0.0.1:0 --port-file "$tmp/port-$r" --data-dir "$tmp/data-$r" \
    --s3-endpoint "$endpoint" --s3-bucket "$bucket" --s3-prefix "$prefix" \
    --s3-region "$region" --s3-path-style >>"$tmp/kcached-$r.log" 2>&1 &
  eval "${r}pid=$!"
  for _ in $(seq 1 200); do [ -s "$tmp/port-$r" ] && break; sleep 0.05; done
  port=$(cat "$tmp/port-$r" 2>/dev/null) || die "replica $r wrote no port file"
  eval "${r}url=http://127.0.0.1:$port"
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz" || true)" = 200 ] && return 0
    sleep 0.05
  done
  die "replica $r did not come up"
}
aurl="" burl=""
start_replica a
start_replica b

queue_depth() { # url
  curl -s "$1/metrics" | awk '$1 == "kcached_s3_queue_depth" {print $2}'
}

drain() { # url; 60 s at most
  local d=""
  for _ in $(seq 1 600); do
    d=$(queue_depth "$1")
    [ "$d" = 0 ] && return 0
    sleep 0.1
  done
  die "write-through queue of $1 still at '$d' after 60 s"
}

# ---- a series: one curl, a warm-up URL, then the timed ones ----
# series LABEL OUT CURL-ARGS... -- URLS... : writes one time_total per URL
# (warm-up dropped) to OUT; exits 1 on any status but 200.
series() {
  local label=$1 out=$2 args=() urls=() t
  shift 2
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  urls=("$@")
  local co=()
  for t in "${urls[@]}"; do co+=(-o /dev/null "$t"); done
  "${near[@]}" "${args[@]}" -s -w '%{http_code} %{time_total}\n' "${co[@]}" >"$tmp/series.raw" ||
    die "$label: curl failed"
  [ "$(wc -l <"$tmp/series.raw")" = "${#urls[@]}" ] || die "$label: $(wc -l <"$tmp/series.raw") answers for ${#urls[@]} requests"
  awk -v l="$label" '$1 != 200 {printf "bench_s3: %s: request %d answered %s\n", l, NR, $1; bad = 1}
                     END {exit bad}' "$tmp/series.raw" >&2 || die "$label: a request failed"
  tail -n +2 "$tmp/series.raw" | awk '{print $2}' >>"$out"
}

: >"$tmp/lmdb.s" ; : >"$tmp/rt.s" ; : >"$tmp/s3.s"
declare -a round_lines
for round in $(seq 1 "$rounds"); do
  # fresh blobs: index 0 is the warm-up of each series
  mkdir -p "$tmp/blobs$round"
  digests=()
  put=()
  for i in $(seq 0 "$n"); do
    f=$tmp/blobs$round/$i
    head -c 4096 /dev/urandom >"$f"
    d=$(sha256sum "$f" | cut -c1-64)
    digests+=("$d")
    put+=(-o /dev/null -T "$f" "$aurl/v1/blobs/$d")
  done
  codes=$(curl -s -w '%{http_code}\n' "${put[@]}") || die "round $round: uploads failed"
  [ "$(grep -c '^201$' <<<"$codes")" = $((n + 1)) ] || die "round $round: PUT answers: $(sort <<<"$codes" | uniq -c | tr '\n' ' ')"
  drain "$aurl"

  a_urls=() b_urls=() s_urls=()
  for d in "${digests[@]}"; do
    a_urls+=("$aurl/v1/blobs/$d")
    b_urls+=("$burl/v1/blobs/$d")
    s_urls+=("$endpoint/$bucket/$prefix/blobs/$d")
  done
  : >"$tmp/r.lmdb"; : >"$tmp/r.rt"; : >"$tmp/r.s3"
  series "LMDB hit (A)" "$tmp/r.lmdb" curl -- "${a_urls[@]}"
  if [ $((round % 2)) = 1 ]; then
    series "read-through (B)" "$tmp/r.rt" curl -- "${b_urls[@]}"
    series "plain S3" "$tmp/r.s3" "${s3curl[@]}" -- "${s_urls[@]}"
  else
    series "plain S3" "$tmp/r.s3" "${s3curl[@]}" -- "${s_urls[@]}"
    series "read-through (B)" "$tmp/r.rt" curl -- "${b_urls[@]}"
  fi
  cat "$tmp/r.lmdb" >>"$tmp/lmdb.s"; cat "$tmp/r.rt" >>"$tmp/rt.s"; cat "$tmp/r.s3" >>"$tmp/s3.s"

  # Outside the timing: B now holds every blob, and the bytes are right
  # from B and from the bucket.
  for i in 1 $((n / 2)) "$n"; do
    d=${digests[$i]}
    got=$(curl -s "$burl/v1/blobs/$d" | sha256sum | cut -c1-64)
    [ "$got" = "$d" ] || die "round $round: B served other bytes for $d"
    got=$("${s3curl[@]}" -s "$endpoint/$bucket/$prefix/blobs/$d" | sha256sum | cut -c1-64)
    [ "$got" = "$d" ] || die "round $round: the bucket holds other bytes for $d"
  done
  rm -rf "$tmp/blobs$round"
  med() { sort -g "$1" | awk '{v[NR]=$1} END {printf "%.3f", v[int((NR+1)/2)] * 1000}'; }
  round_lines+=("$(med "$tmp/r.lmdb") $(med "$tmp/r.rt") $(med "$tmp/r.s3")")
  echo "bench_s3: round $round/$rounds: median ms: LMDB $(med "$tmp/r.lmdb"), read-through $(med "$tmp/r.rt"), plain S3 $(med "$tmp/r.s3")" >&2
done
rt_count=$(curl -s "$burl/metrics" | awk '$1 == "kcached_s3_read_through_total{result=\"hit\"}" {print $2}')

# ---- report ----
summary() { # file -> "median p90" in ms
  sort -g "$1" | awk '{v[NR]=$1} END {
    p = int(NR * 0.9 + 0.999999); if (p < 1) p = 1; if (p > NR) p = NR;
    printf "%.3f %.3f\n", v[int((NR+1)/2)] * 1000, v[p] * 1000 }'
}
read -r a_med a_p90 < <(summary "$tmp/lmdb.s")
read -r b_med b_p90 < <(summary "$tmp/rt.s")
read -r c_med c_p90 < <(summary "$tmp/s3.s")
r1=$(awk -v a="$c_med" -v b="$a_med" 'BEGIN {printf "%.1f", a / b}')
r2=$(awk -v a="$b_med" -v b="$c_med" 'BEGIN {printf "%.2f", a / b}')
ok1=$(awk -v r="$r1" 'BEGIN {print (r >= 10) ? "met" : "MISSED"}')
ok2=$(awk -v r="$r2" 'BEGIN {print (r <= 1.2) ? "met" : "MISSED"}')
samples=$(wc -l <"$tmp/lmdb.s")

cmdline="tests/bench/bench_s3.sh"
[ "$rounds" = 3 ] || cmdline="BENCH_ROUNDS=$rounds $cmdline"
[ "$pin" = 1 ] || cmdline="BENCH_PIN=$pin $cmdline"
[ "$n" = 200 ] || cmdline="BENCH_N=$n $cmdline"
rgw_ver=$(radosgw --version 2>/dev/null | awk '{print $3}' || echo "?")
per_round=$(printf '%s; ' "${round_lines[@]}")

echo
echo "4 KiB blob GET, $n sequential requests per series x $rounds rounds ($samples samples each), one keep-alive curl per series; Ceph RGW $rgw_ver (one OSD on memstore, loopback); $(nproc) CPUs ($placement), load average $(cut -d' ' -f1-3 /proc/loadavg); $(curl --version | head -n1 | cut -d' ' -f1-2)"
echo
echo "| series | median | p90 |"
echo "|---|---|---|"
echo "| (a) LMDB hit: GET on replica A, which holds the blob | ${a_med} ms | ${a_p90} ms |"
echo "| (b) read-through: GET on replica B, which does not (S3 GET, SHA-256, LMDB write, serve; B counted $rt_count hits) | ${b_med} ms | ${b_p90} ms |"
echo "| (c) plain S3 GET of the same object (curl --aws-sigv4) | ${c_med} ms | ${c_p90} ms |"
echo "| plain S3 / LMDB hit | ${r1}x (target >= 10x: $ok1) | |"
echo "| read-through / plain S3 | ${r2}x (target <= 1.2x: $ok2) | |"
echo
echo "per-round medians, ms (LMDB, read-through, S3): ${per_round%; }"
echo "command: $cmdline"
echo "  (kcached: $kcached)"

if [ "$strict" = 1 ] && { [ "$ok1" != met ] || [ "$ok2" != met ]; }; then
  echo "bench_s3: a target was missed (BENCH_STRICT=1)" >&2
  exit 1
fi
