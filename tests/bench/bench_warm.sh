#!/usr/bin/env bash
# bench_warm.sh: the demo model's warmup, cold and from cache, against a plain
# parallel curl of the same bytes, and a startup storm, in one run.
#
# On deploy/examples/demo-mlp/warmup.json (16 bundles: 8 buckets x sm_80,
# sm_90a; 3 cubins each), each of BENCH_RUNS rounds starts a kcached on a fresh
# data directory (loopback, port 0, --port-file) and times, wall clock, each
# one process:
#   1. cold:   `kcache warm` with an empty KCACHE_DIR on the empty server:
#              NVRTC builds (3 per bundle) and uploads; the --json report
#              must say built == keys.
#   2. remote: `kcache warm` with another empty KCACHE_DIR on the now-filled
#              server: fetch only; the report must say 0 built and
#              hit-remote == keys.
#   3. curl:   the floor for the same bytes: every distinct blob digest of the
#              model's bundles (GET /v1/models/{model}, then each manifest,
#              outside the timing) fetched by ONE `curl --http1.1 --parallel
#              --parallel-max N` (N = BENCH_PARALLEL, also the client's
#              --parallel) over keep-alive connections into a temporary
#              directory, no verification; byte count checked afterwards.
#   4. local:  `kcache warm` again on the directory of step 2: hit-local == keys.
# Then BENCH_STORM_RUNS startup storms: BENCH_STORM (32) concurrent
# `kcache warm` processes, each with its own empty KCACHE_DIR, against a fresh
# empty kcached: the wall time from the first start to the last exit, and the
# counts summed over their --json reports. Builds must equal the number of
# keys (one builder per key fleet-wide) or the script exits 1.
#
# Prints medians (and every sample), the ratios cold / remote (target >= 50x)
# and remote / curl (target <= 2x) as ratios of the medians (what the targets
# are judged on) and as medians of the per-round ratios (steadier when other
# work shares the machine), and a Markdown table for the README with
# the command line. Every warm runs with --strict --deadline; any failed step
# (a warm exiting non-zero or reporting a failed key, wrong counts, a curl
# error, a byte count that differs) exits 1. A missed ratio target only
# prints MISSED, unless BENCH_STRICT=1 (then exit 1).
#
# Then, per BENCH_SHAPES entry, the file-system cost at scale:
# synthetic bundles (B bundles of F random files of K KiB), a warm from
# kcached into an empty local cache with --out (as the README runs it),
# against two yardsticks on the same file system: `tar x` of the very files
# the warm leaves (the floor; target: warm <= 1.5x) and one `curl
# --parallel` of the same blobs (target: warm <= 1x). Described at fs_shape
# below; its own table.
#
# Everything runs on the file system of $KCACHE_DIR as given (a scratch
# directory inside it, removed at the end), default $HOME/.cache/kcache,
# the library's own default: the disk a service's cache really is on. The
# first line of the output names the file system (df -T). For tmpfs, say so:
# KCACHE_DIR=/dev/shm/kcache-bench.
#
# Usage: tests/bench/bench_warm.sh [path/to/kcached [path/to/kcache]]
#   env: BENCH_RUNS (5) BENCH_PARALLEL (8: kcache --parallel and curl
#        --parallel-max) BENCH_STORM (32) BENCH_STORM_RUNS (1)
#        BENCH_DEADLINE (300: --deadline of each warm, seconds)
#        BENCH_STRICT (0) BENCH_MANIFEST (the demo model's warmup.json)
#        BENCH_DEMO (1; 0: skip the demo model, its NVRTC builds and the
#        storm) BENCH_SHAPES ("1024x4x16 16x300x48"; "": none)
#        KCACHED, KCACHE (binaries, when not given as arguments)
#        BENCH_KCACHE_BASE (another kcache binary: its warm --out joins each
#        round of the shapes, paired with this one's)
# Needs: a built kcached and kcache, NVRTC for the demo part
#        (/usr/local/cuda or $KCACHE_NVRTC; no GPU), curl >= 7.67
#        (--parallel; --no-progress-meter, as -s does not silence the
#        parallel meter), python3 (JSON), timeout, tar, split, sha256sum.
# Loopback only; every loop is bounded; every process it starts is stopped by
# PID; the temporary directory is removed.
#
# Measured on the 2-core development container, 2026-11-23 (no GPU, NVRTC
# 13.0, curl 7.88.1; fuzzers and valgrind of other sessions on the same cores,
# load average 6-12, so every number moves by 30% or more between runs).
# Three runs of BENCH_RUNS=5 (medians; the last is the one in the table):
#   cold warm (48 NVRTC builds + upload)   18.0 s    15.4 s    15.8 s
#   warm from kcached, empty local cache   263 ms    314 ms    264 ms
#   plain curl, 36 blobs, 316 KiB          151 ms    120 ms    133 ms
#   warm from the local cache              214 ms    182 ms    228 ms
#   cold / from kcached (>= 50x)           68.6x     49.0x     60.1x
#   from kcached / curl (<= 2x)            1.75x     2.62x     1.98x
#   storm, 32 warms on an empty kcached    21.5 s    16.8 s    23.2 s
#   storm builds (must be 16 = keys)       16        16        16
# Both ratio targets sit at their edges here: a warm's in-process time (the
# report's seconds) was about 105-155 ms of its 260-310 ms; the rest is
# process start (shared libraries, OpenSSL init, and about 40 ms to dlopen
# libnvrtc, which even an all-hit warm did) and exit.
# Since NVRTC's version (a key field) comes from the toolkit's install
# metadata without loading libnvrtc (gpu/nvrtc_meta.c), on the same container
# (load average 2.5-6), two runs of BENCH_RUNS=5: warm from kcached 66 ms and
# 84 ms (in-process 16-21 ms), curl 54 ms and 59 ms: 1.20x and 1.42x; the
# code before it, between them: 133 ms (in-process 63 ms), curl 58 ms, 2.29x.
# The same container, 2026-11-25, BENCH_RUNS=5 BENCH_DEMO=0
# (load average 2.5-5; the shared disk made ext4 figures swing 10x):
#   shape, TMPDIR        warm before  warm after  tar x   curl    after/tar  after/curl
#   1024x4x16, tmpfs     1.22 s       622 ms      167 ms  473 ms  3.7x       1.32x
#   16x300x48, tmpfs     1.13 s       849 ms      534 ms  1.00 s  1.6x       0.85x
#   1024x4x16, ext4      4.63 s       4.29 s      3.05 s  2.65 s  1.4x       1.6x
#   16x300x48, ext4      4.91 s       6.15 s      2.13 s  1.73 s  2.9x       3.6x
# (ext4 per-round ratios, after: 1.52x and 1.49x against tar x.)
# Then small blobs many per request (POST /v1/blobs/fetch: the 1024-bundle
# warm makes 8 POSTs instead of 4096 GETs), lookup manifests taken as
# parsed, and no per-key probe of a fresh cache; same container, same
# session, 2026-11-25, alternating the build of main and this one (each
# with its own kcached), BENCH_RUNS=5 BENCH_DEMO=0 TMPDIR=/dev/shm, load
# average about 1 (medians; per-round ratio medians in brackets):
#   shape, run   main: warm  tar x   curl    new: warm  tar x   curl    new/tar       new/curl
#   1024x4x16 1  371 ms      116 ms  277 ms  252 ms     118 ms  266 ms  2.13x (2.14)  0.95x (0.94)
#   1024x4x16 2  380 ms      118 ms  290 ms  248 ms     113 ms  265 ms  2.21x (2.20)  0.94x (0.94)
#   16x300x48 1  505 ms      222 ms  411 ms  403 ms     227 ms  417 ms  1.78x (1.76)  0.97x (0.94)
#   16x300x48 2  501 ms      232 ms  412 ms  389 ms     219 ms  410 ms  1.78x (1.77)  0.95x (0.93)
# (main against the same yardsticks: 3.2x / 2.2x tar x, 1.3x / 1.2x curl.)
# warm <= curl is met for both shapes; warm <= 1.5x tar x is not. The
# default TMPDIR (ext4 on a disk other sessions were loading) measured the
# disk: tar x of the same files took 0.17-4.2 s within one run.
# Then the warm's CPU work on two threads (keys, the lookup's manifest
# checks, verify-and-write of batched blobs, manifest writes; each joined
# before its phase ends); same container, same session, 2026-11-25,
# alternating main and this build, BENCH_RUNS=5 BENCH_DEMO=0
# TMPDIR=/dev/shm, load average 0.6-1.9 (medians; per-round in brackets):
#   shape, run   main: warm  tar x   new: warm  tar x   curl    new/tar       new/curl
#   1024x4x16 1  257 ms      117 ms  181 ms     117 ms  292 ms  1.54x (1.53)  0.62x (0.65)
#   1024x4x16 2  260 ms      118 ms  195 ms     118 ms  286 ms  1.65x (1.55)  0.68x (0.68)
#   16x300x48 1  401 ms      247 ms  302 ms     232 ms  457 ms  1.30x (1.30)  0.66x (0.71)
#   16x300x48 2  417 ms      248 ms  274 ms     221 ms  402 ms  1.24x (1.24)  0.68x (0.71)
# warm <= curl is met for both shapes; warm <= 1.5x tar x is met for
# 16x300x48 and just missed for 1024x4x16 (new/main 0.70-0.75x there).
# Then less CPU around the fetch: a 1024-key lookup as two requests parsed
# on two threads, canonical keys and manifests written without jansson
# objects, the writer's buffers reused; same container, 2026-11-25 (second
# session), BENCH_RUNS=9 (7 for 16x300x48) BENCH_DEMO=0 TMPDIR=/dev/shm,
# alternating main (1815841) and this build, load average 1-2:
#   shape, pair  main: warm  tar x   main/tar      new: warm  tar x   new/tar
#   1024x4x16 1  188 ms      110 ms  1.70x (1.70)  151 ms     111 ms  1.37x (1.38)
#   1024x4x16 2  175 ms      109 ms  1.60x (1.60)  151 ms     110 ms  1.37x (1.36)
#   1024x4x16 3  169 ms      109 ms  1.55x (1.54)  155 ms     114 ms  1.36x (1.35)
#   16x300x48 1  353 ms      214 ms  1.65x (1.47)  272 ms     221 ms  1.23x (1.23)
#   16x300x48 2  277 ms      222 ms  1.25x (1.24)  266 ms     214 ms  1.25x (1.25)
# new/curl 0.59x and 0.65-0.66x. Both targets met for both shapes; under
# load (load average past 2) single runs of the new build gave 1.54x and
# 1.61x for 1024x4x16 (a warm uses both cores, tar x one).
# Then --out on the real disk (ext4, KCACHE_DIR=/work/cwbench): files linked
# from the cache, out directories made during the fetch; same container,
# 2026-11-27, BENCH_RUNS=7 BENCH_DEMO=0 BENCH_KCACHE_BASE=<the build
# before>, load average 5.6-7.5 (other sessions' builds and tests; 4 of
# the 7 rounds of 1024x4x16 ran 3-10x slower than the other 3 for every
# step): medians, per-round ratio medians in brackets:
#   shape      warm --out  warm    tar x   curl    --out/tar     --out/curl    before: --out  new/before
#   1024x4x16  3.84 s      2.80 s  1.42 s  1.57 s  2.70x (1.17)  2.44x (1.03)  6.15 s         (0.72)
#   16x300x48  2.90 s      4.15 s  3.33 s  3.36 s  0.87x (0.96)  0.86x (0.70)  7.88 s         (0.42)
# The three quiet rounds of 1024x4x16: --out 0.69/0.62/0.98 s, curl
# 0.67/0.88/1.28 s, tar x 0.59/0.57/0.84 s. What is left there is inodes:
# a warm --out makes 4096 blob files, 1024 manifests, 256 fan-out and 1025
# out directories (6400 new inodes) where curl makes 4096.
# Then 2,020 fewer system calls per 1024x4x16 warm --out (no mkdir of, nor
# unlink in, a directory the warm made; 42,165 -> 40,145 by strace -c), the
# same inodes; same container, 2026-11-27, BENCH_RUNS=7 (5 for 16x300x48)
# BENCH_DEMO=0 BENCH_KCACHE_BASE=<the build before>, load average 3-5
# (6 agents' builds, tests and benchmarks): per-round medians
#   shape      warm --out  tar x   curl    --out/tar  --out/curl  new/before
#   1024x4x16  1.10 s      980 ms  794 ms  (0.66)     (0.79)      (0.99)
#   16x300x48  4.16 s      2.84 s  6.01 s  (1.14)     (0.58)      (0.86)
# with per-round --out/curl from 0.41x to 5.1x: no difference shows.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
kcached=${1:-${KCACHED:-}}
kcache=${2:-${KCACHE:-}}
kcache_base=${BENCH_KCACHE_BASE:-}
if [ -z "$kcached" ]; then
  for c in "$root/build/server/kcached" "$root/build-server/server/kcached"; do
    [ -x "$c" ] && kcached=$c && break
  done
fi
if [ -z "$kcache" ]; then
  for c in "$root/build/client/kcache" "$root/build-client/client/kcache"; do
    [ -x "$c" ] && kcache=$c && break
  done
fi
[ -n "$kcached" ] && [ -x "$kcached" ] || { echo "bench_warm: no kcached binary (give its path)" >&2; exit 2; }
[ -n "$kcache" ] && [ -x "$kcache" ] || { echo "bench_warm: no kcache binary (give its path)" >&2; exit 2; }
for tool in curl python3 timeout tar split sha256sum; do
  command -v "$tool" >/dev/null || { echo "bench_warm: $tool not found" >&2; exit 2; }
done
curl --help all 2>/dev/null | grep -- '--no-progress-meter' >/dev/null ||
  { echo "bench_warm: curl has no --parallel/--no-progress-meter (7.67 or later needed)" >&2; exit 2; }

manifest=${BENCH_MANIFEST:-$root/deploy/examples/demo-mlp/warmup.json}
runs=${BENCH_RUNS:-5}
par=${BENCH_PARALLEL:-8}
storm=${BENCH_STORM:-32}
storm_runs=${BENCH_STORM_RUNS:-1}
deadline=${BENCH_DEADLINE:-300}
strict=${BENCH_STRICT:-0}
demo=${BENCH_DEMO:-1}
shapes=${BENCH_SHAPES-1024x4x16 16x300x48}
[ "$demo" = 0 ] || [ -r "$manifest" ] || { echo "bench_warm: no manifest $manifest" >&2; exit 2; }
for shape in $shapes; do
  [[ $shape =~ ^[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*$ ]] ||
    { echo "bench_warm: BENCH_SHAPES: '$shape' is not BxFxK" >&2; exit 2; }
done
for v in runs par storm storm_runs deadline; do
  case ${!v} in '' | *[!0-9]*) echo "bench_warm: $v must be a positive integer" >&2; exit 2 ;; esac
  [ "${!v}" -ge 1 ] || { echo "bench_warm: $v must be >= 1" >&2; exit 2; }
done
# A hung warm is killed a little after its own deadline.
hard_limit=$((deadline + 30))

# The file system measured: $KCACHE_DIR's (see the top).
bench_fs=${KCACHE_DIR:-${HOME:?}/.cache/kcache}
mkdir -p "$bench_fs" || { echo "bench_warm: cannot make $bench_fs" >&2; exit 2; }

# Nothing from the caller's environment reaches the client but what we set.
unset KCACHE_URL KCACHE_TOKEN KCACHE_CACERT KCACHE_DIR KCACHE_ALLOW_PLAINTEXT

tmp=$(mktemp -d "$bench_fs/bench-warm-XXXXXX")
fs_desc=$(df -T "$tmp" 2>/dev/null | awk 'NR == 2 {print $2 " (" $1 ", mounted on " $7 ")"}')
echo "bench_warm: on $tmp: ${fs_desc:-unknown file system}" >&2
kpid=""
storm_pids=()
cleanup() {
  local p
  for p in "${storm_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${storm_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$kpid" ] && kill "$kpid" 2>/dev/null && wait "$kpid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

die() {
  echo "bench_warm: $*" >&2
  if [ -s "$tmp/kcached.log" ]; then
    echo "bench_warm: last kcached log lines:" >&2
    tail -n 5 "$tmp/kcached.log" >&2
  fi
  exit 1
}

# JSON helpers (python3, never timed).
cat >"$tmp/kjson.py" <<'EOF'
import json, sys, urllib.request

def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)

cmd = sys.argv[1]
if cmd == "model":            # MANIFEST -> model hash
    print(json.load(open(sys.argv[2]))["model"]["hash"])
elif cmd == "counts":         # REPORT... -> summed counts, one line of k=v
    keys = ("hit-local", "hit-remote", "built", "waited", "failed")
    tot = dict.fromkeys(keys, 0)
    tot.update(items=0, bytes=0, bytes_fetched=0, seconds=0.0, reports=0)
    for f in sys.argv[2:]:
        r = json.load(open(f))
        for k in keys:
            tot[k] += int(r["counts"][k])
        tot["items"] += len(r["items"])
        tot["bytes"] += int(r.get("bytes", 0))
        tot["bytes_fetched"] += int(r.get("bytes_fetched", 0))
        tot["seconds"] = max(tot["seconds"], float(r.get("seconds", 0)))
        tot["reports"] += 1
    print(" ".join("%s=%s" % (k.replace("-", "_"), v) for k, v in tot.items()))
elif cmd == "blobs":          # URL MODEL -> "digest size" per distinct blob
    url, model = sys.argv[2], sys.argv[3]
    seen, files, tc = {}, 0, {}
    for b in get("%s/v1/models/%s" % (url, model))["bundles"]:
        m = get("%s/v1/bundles/%s" % (url, b["key"]))
        tc = m.get("toolchain", tc)
        for f in m["files"]:
            files += 1
            seen[f["sha256"]] = int(f["size"])
    for d, s in sorted(seen.items()):
        print(d, s)
    sys.stderr.write("bundles=%d files=%d nvrtc=%s\n"
                     % (len(get("%s/v1/models/%s" % (url, model))["bundles"]),
                        files, tc.get("nvrtc", "?")))
EOF
kj() { python3 "$tmp/kjson.py" "$@"; }

model=$([ "$demo" = 0 ] || kj model "$manifest")

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.4f", b - a}'; }

# Waits (10 s at most) until a URL answers 200.
wait_http() {
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)" = 200 ] && return 0
    sleep 0.05
  done
  die "$1 did not come up"
}

start_kcached() { # data dir
  rm -f "$tmp/port"
  "$kcached" --listen 127.0.0.1:0 --port-file "$tmp/port" --data-dir "$1" \
    2>>"$tmp/kcached.log" &
  kpid=$!
  for _ in $(seq 1 200); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  [ -s "$tmp/port" ] || die "kcached wrote no port file"
  url="http://127.0.0.1:$(cat "$tmp/port")"
  wait_http "$url/healthz"
}

stop_kcached() {
  kill "$kpid" 2>/dev/null && wait "$kpid" 2>/dev/null || true
  kpid=""
}

# One timed `kcache warm`: label, cache dir, report file. Sets $dt.
warm() {
  local label=$1 dir=$2 report=$3 t0 t1 rc=0
  t0=$(now)
  timeout -k 5 "$hard_limit" "$kcache" warm "$manifest" --url "$url" \
    --cache-dir "$dir" --parallel "$par" --deadline "$deadline" \
    --json --strict --quiet >"$report" 2>"$report.err" || rc=$?
  t1=$(now)
  [ "$rc" = 0 ] || { tail -n 5 "$report.err" >&2; die "$label warm exited $rc"; }
  dt=$(elapsed "$t0" "$t1")
}

# Checks a report's counts: report, then name=value pairs that must hold.
expect() {
  local report=$1 c kv
  shift
  c=$(kj counts "$report")
  for kv in "$@"; do
    grep -qw -- "$kv" <<<"$c" || die "$report: expected $kv, got: $c"
  done
  echo "$c"
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
fmt() { # seconds -> human
  awk -v x="$1" 'BEGIN {
    if (x >= 10) printf "%.1f s", x; else if (x >= 1) printf "%.2f s", x;
    else printf "%.0f ms", x * 1000 }'
}
lastof() { awk '{print $NF}' <<<"$1"; }
kib() { awk -v b="$1" 'BEGIN {printf "%.0f KiB", b / 1024}'; }

load0=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
cold_s="" remote_s="" curl_s="" local_s="" remote_in="" local_in=""
keys="" nblobs="" blob_bytes="" nfiles="" nvrtc=""


# ---- file-system cost at scale ----
# Per shape BxFxK (B bundles of F files of K KiB, random bytes, one arch):
# the bundles are built once with a command builder and uploaded (not
# timed). Each of BENCH_RUNS rounds times, wall clock, one process each,
# into fresh directories (removed outside the timing), after a `sync` each
# (not timed, so that one step's writeback is not charged to the next):
#   warm --out: `kcache warm --no-build --out DIR` with an empty local cache
#               (hit-remote must equal B), as the README runs it;
#   warm:       the same without --out (only the local cache; a column for
#               what --out adds);
#   tar x:      the floor: `tar xf` of the very files a warm --out leaves
#               (the cache's blobs/ and bundles/ and DIR, tarred once, not
#               timed; DIR's files are hard links to the blobs where the
#               warm linked them, and tar keeps them links);
#   curl:       one `curl --parallel` of the same distinct blobs, as in step
#               3 above, into one directory.
# Nothing is deleted until the shape's rounds are over (each round and
# step writes its own directories): on ext4 a new inode costs a scan of its
# group's inodes freed in the last minute (recently_deleted; 5 minutes
# while their table block is dirty), and a round's rm -rf made the next
# step pay up to 10x for its creates. The order of the four steps still
# rotates from round to round, so that no step is always the first.
# Targets: warm --out / tar x <= 1.5x, warm --out / curl <= 1x.
fs_rows="" fs_missed=0
# The timed steps of a round (fs_shape's variables; each after a sync).
fs_warm_out() {
  sync
  t0=$(now)
  timeout -k 5 "$hard_limit" "$kcache" warm "$man" --url "$url" \
    --cache-dir "$tmp/fs-w1-$run" --out "$tmp/fs-o-$run" --parallel "$par" --no-build \
    --json --quiet --strict >"$tmp/fs-w.json" 2>"$tmp/fs-w.err" ||
    { tail -n 5 "$tmp/fs-w.err" >&2; die "fs $shape: warm --out failed"; }
  t1=$(now)
  w_s+="$(elapsed "$t0" "$t1") "
  expect "$tmp/fs-w.json" "hit_remote=$nb" "failed=0" >/dev/null
  local n
  n=$(find "$tmp/fs-o-$run" -type f | wc -l)
  [ "$n" = $((nb * nf)) ] || die "fs $shape: --out holds $n files, expected $((nb * nf))"
}
# BENCH_KCACHE_BASE: another kcache's warm --out in the same rounds (a
# build to compare with, paired round by round).
fs_warm_base() {
  sync
  t0=$(now)
  timeout -k 5 "$hard_limit" "$kcache_base" warm "$man" --url "$url" \
    --cache-dir "$tmp/fs-w3-$run" --out "$tmp/fs-o3-$run" --parallel "$par" \
    --no-build --json --quiet --strict >"$tmp/fs-w.json" 2>"$tmp/fs-w.err" ||
    { tail -n 5 "$tmp/fs-w.err" >&2; die "fs $shape: base warm --out failed"; }
  t1=$(now)
  b_s+="$(elapsed "$t0" "$t1") "
  expect "$tmp/fs-w.json" "hit_remote=$nb" "failed=0" >/dev/null
}
fs_warm_plain() {
  sync
  t0=$(now)
  timeout -k 5 "$hard_limit" "$kcache" warm "$man" --url "$url" \
    --cache-dir "$tmp/fs-w2-$run" --parallel "$par" --no-build --json --quiet \
    --strict >"$tmp/fs-w.json" 2>"$tmp/fs-w.err" ||
    { tail -n 5 "$tmp/fs-w.err" >&2; die "fs $shape: warm failed"; }
  t1=$(now)
  p_s+="$(elapsed "$t0" "$t1") "
  expect "$tmp/fs-w.json" "hit_remote=$nb" "failed=0" >/dev/null
}
fs_tar() {
  mkdir "$tmp/fs-t-$run"
  sync
  t0=$(now)
  timeout -k 5 "$hard_limit" tar xf "$tmp/fs.tar" -C "$tmp/fs-t-$run" || die "fs $shape: tar x failed"
  t1=$(now)
  t_s+="$(elapsed "$t0" "$t1") "
}
fs_curl() {
  mkdir "$tmp/fs-c-$run"
  sync
  t0=$(now)
  timeout -k 5 "$hard_limit" curl --http1.1 --parallel --parallel-max "$par" --fail --show-error \
    --no-progress-meter "${args[@]}" || die "fs $shape: curl failed"
  t1=$(now)
  c_s+="$(elapsed "$t0" "$t1") "
}
fs_shape() { # bundles files kib
  local nb=$1 nf=$2 kib=$3 shape="$1x$2x$3" run t0 t1 w_s="" p_s="" t_s="" c_s="" b_s=""
  local man="$tmp/fs-$shape.json" fsmodel d
  fsmodel=$(printf '%s' "fs-$shape" | sha256sum | cut -d' ' -f1)
  python3 - "$man" "$nb" "$nf" "$kib" "$fsmodel" <<'PYEOF'
import json, sys
man, nb, nf, kib, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cmd = "head -c %d /dev/urandom | split -b %d -a 4 - {out}/f" % (nf * kib * 1024, kib * 1024)
json.dump({"schema": "kcache.warmup/v1", "model": {"name": "fs-bench", "hash": model},
           "archs": ["sm_80"], "builder": {"command": ["sh", "-c", cmd], "timeout_s": 600},
           "buckets": [{"i": i} for i in range(nb)]}, open(man, "w"))
PYEOF
  start_kcached "$tmp/fs-data"
  timeout -k 5 "$hard_limit" "$kcache" warm "$man" --url "$url" \
    --cache-dir "$tmp/fs-seed" --no-compat --jobs 4 --json --quiet \
    --deadline "$deadline" >"$tmp/fs-seed.json" 2>"$tmp/fs-seed.err" ||
    { tail -n 5 "$tmp/fs-seed.err" >&2; die "fs $shape: building the bundles failed"; }
  expect "$tmp/fs-seed.json" "built=$nb" "failed=0" >/dev/null
  mkdir "$tmp/fs-ref"
  timeout -k 5 "$hard_limit" "$kcache" warm "$man" --url "$url" \
    --cache-dir "$tmp/fs-ref/cache" --out "$tmp/fs-ref/out" --no-build \
    --json --quiet --strict >"$tmp/fs-ref.json" 2>"$tmp/fs-ref.err" ||
    die "fs $shape: reference warm failed"
  tar cf "$tmp/fs.tar" -C "$tmp/fs-ref" cache/blobs cache/bundles out
  local files links bytes
  files=$(find "$tmp/fs-ref" -type f | wc -l)
  links=$(find "$tmp/fs-ref/out" -type f -links +1 | wc -l)
  bytes=$(du -sk "$tmp/fs-ref/cache/blobs" | cut -f1)
  kj blobs "$url" "$fsmodel" >"$tmp/fs-blobs" 2>/dev/null || die "fs $shape: listing blobs failed"
  local args=() run
  # fs_curl's arguments for each round's directory
  fs_curl_args() {
    args=()
    while read -r d _; do args+=(-o "$tmp/fs-c-$run/$d" "$url/v1/blobs/$d"); done <"$tmp/fs-blobs"
  }
  for run in $(seq 1 "$runs"); do
    # The four steps in a rotating order: on ext4 a new inode is slower
    # while the group holds recently freed ones (the last round's rm -rf),
    # and no step should always be the one that comes first.
    local order=(w p t c) k
    [ -z "$kcache_base" ] || order+=(b)
    fs_curl_args
    for k in $(seq 0 $((${#order[@]} - 1))); do
      case ${order[$(((k + run - 1) % ${#order[@]}))]} in
        b) fs_warm_base ;;
        w) fs_warm_out ;;
        p) fs_warm_plain ;;
        t) fs_tar ;;
        c) fs_curl ;;
      esac
    done
    echo "bench_warm: fs $shape run $run/$runs: warm --out $(fmt "$(lastof "$w_s")"), warm $(fmt "$(lastof "$p_s")"), tar x $(fmt "$(lastof "$t_s")"), curl $(fmt "$(lastof "$c_s")")" >&2
  done
  stop_kcached
  rm -rf "$tmp/fs-data" "$tmp/fs.tar" "$tmp"/fs-w1-* "$tmp"/fs-o-* \
    "$tmp"/fs-w2-* "$tmp"/fs-t-* "$tmp"/fs-c-* "$tmp/fs-seed" "$tmp/fs-ref" \
    "$tmp"/fs-w3-* "$tmp"/fs-o3-*
  local wm pm tm cm r1 r2 p1 p2 ok1 ok2
  wm=$(median <<<"$w_s") pm=$(median <<<"$p_s") tm=$(median <<<"$t_s") cm=$(median <<<"$c_s")
  r1=$(awk -v a="$wm" -v b="$tm" 'BEGIN {printf "%.2f", a / b}')
  r2=$(awk -v a="$wm" -v b="$cm" 'BEGIN {printf "%.2f", a / b}')
  p1=$(paired "$w_s" "$t_s" "%.2f")
  p2=$(paired "$w_s" "$c_s" "%.2f")
  ok1=$(awk -v r="$r1" 'BEGIN {print (r <= 1.5) ? "met" : "MISSED"}')
  ok2=$(awk -v r="$r2" 'BEGIN {print (r <= 1.0) ? "met" : "MISSED"}')
  [ "$ok1" = met ] && [ "$ok2" = met ] || fs_missed=1
  fs_rows+="| $shape: $nb bundles, $((nb * nf)) files ($files on disk after, $links of them links), $((bytes / 1024)) MiB | $(fmt "$wm") | $(fmt "$pm") | $(fmt "$tm") | $(fmt "$cm") | ${r1}x ($ok1; per round ${p1}x) | ${r2}x ($ok2; per round ${p2}x) |"$'\n'
  fs_rows+="|   samples (s) | $(samples "$w_s") | $(samples "$p_s") | $(samples "$t_s") | $(samples "$c_s") | | |"$'\n'
  if [ -n "$kcache_base" ]; then
    fs_rows+="|   BENCH_KCACHE_BASE warm --out: median $(fmt "$(median <<<"$b_s")"), this / base per round $(paired "$w_s" "$b_s" "%.2f")x; base / curl $(paired "$b_s" "$c_s" "%.2f")x, base / tar x $(paired "$b_s" "$t_s" "%.2f")x | $(samples "$b_s") | | | | | |"$'\n'
  fi
}

# Shared by both sections.
paired() { # numerator samples, denominator samples, printf format
  awk -v a="$1" -v b="$2" -v f="$3" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; i++) r[i] = x[i] / y[i];
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
    printf f, r[int((n + 1) / 2)] }'
}
samples() { awk '{for (i = 1; i <= NF; i++) printf "%s%.3f", (i > 1 ? " " : ""), $i}' <<<"$1"; }

if [ "$demo" = 1 ]; then
for run in $(seq 1 "$runs"); do
  start_kcached "$tmp/data$run"

  # 1. cold: empty server, empty local cache.
  warm cold "$tmp/cold$run" "$tmp/cold$run.json"
  cold_s+="$dt "
  n=$(kj counts "$tmp/cold$run.json" | tr ' ' '\n' | sed -n 's/^items=//p')
  [ -n "$keys" ] || keys=$n
  [ "$n" = "$keys" ] && [ "$keys" -ge 1 ] || die "run $run: $n keys, expected $keys"
  expect "$tmp/cold$run.json" "built=$keys" "failed=0" >/dev/null

  # 2. from kcached: empty local cache, filled server; fetch only.
  warm remote "$tmp/remote$run" "$tmp/remote$run.json"
  remote_s+="$dt "
  c=$(expect "$tmp/remote$run.json" "built=0" "hit_remote=$keys" "failed=0")
  remote_in+="$(tr ' ' '\n' <<<"$c" | sed -n 's/^seconds=//p') "
  fetched=$(tr ' ' '\n' <<<"$c" | sed -n 's/^bytes_fetched=//p')

  # 3. the floor: the same blobs, one parallel curl, no verification.
  kj blobs "$url" "$model" >"$tmp/blobs" 2>"$tmp/blobs.info" || die "listing the model's blobs failed"
  read -r nb nf nv < <(sed 's/[a-z]*=//g' "$tmp/blobs.info")
  [ "$nb" = "$keys" ] || die "server lists $nb bundles for $keys keys"
  nblobs=$(wc -l <"$tmp/blobs")
  blob_bytes=$(awk '{s += $2} END {print s + 0}' "$tmp/blobs")
  nfiles=$nf nvrtc=$nv
  [ "$blob_bytes" = "$fetched" ] ||
    echo "bench_warm: note: kcache fetched $fetched bytes, the distinct blobs are $blob_bytes" >&2
  mkdir -p "$tmp/curl$run"
  args=()
  while read -r d _; do
    args+=(-o "$tmp/curl$run/$d" "$url/v1/blobs/$d")
  done <"$tmp/blobs"
  t0=$(now)
  curl --http1.1 --parallel --parallel-max "$par" --fail --show-error \
    --no-progress-meter "${args[@]}" ||
    die "run $run: curl failed"
  t1=$(now)
  curl_s+="$(elapsed "$t0" "$t1") "
  got=$(cat "$tmp/curl$run"/* | wc -c)
  [ "$got" = "$blob_bytes" ] || die "run $run: curl got $got bytes, expected $blob_bytes"

  # 4. from the local cache (the directory step 2 filled).
  warm local "$tmp/remote$run" "$tmp/local$run.json"
  local_s+="$dt "
  c=$(expect "$tmp/local$run.json" "hit_local=$keys" "built=0" "failed=0")
  local_in+="$(tr ' ' '\n' <<<"$c" | sed -n 's/^seconds=//p') "

  stop_kcached
  rm -rf "$tmp/data$run" "$tmp/cold$run" "$tmp/remote$run" "$tmp/curl$run"
  echo "bench_warm: run $run/$runs: cold $(fmt "$(lastof "$cold_s")"), remote $(fmt "$(lastof "$remote_s")"), curl $(fmt "$(lastof "$curl_s")"), local $(fmt "$(lastof "$local_s")")" >&2
done

# ---- the startup storm ----
storm_s="" storm_counts=""
for srun in $(seq 1 "$storm_runs"); do
  start_kcached "$tmp/storm-data$srun"
  storm_pids=()
  t0=$(now)
  for i in $(seq 1 "$storm"); do
    timeout -k 5 "$hard_limit" "$kcache" warm "$manifest" --url "$url" \
      --cache-dir "$tmp/storm$srun-$i" --parallel "$par" --deadline "$deadline" \
      --json --strict --quiet >"$tmp/storm$srun-$i.json" 2>"$tmp/storm$srun-$i.err" &
    storm_pids+=($!)
  done
  bad=0
  for p in "${storm_pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
  t1=$(now)
  storm_pids=()
  storm_s+="$(elapsed "$t0" "$t1") "
  [ "$bad" = 0 ] || { tail -n 3 "$tmp"/storm"$srun"-*.err >&2 || true; die "storm $srun: $bad of $storm warms failed"; }
  reports=()
  for i in $(seq 1 "$storm"); do reports+=("$tmp/storm$srun-$i.json"); done
  c=$(kj counts "${reports[@]}")
  get() { tr ' ' '\n' <<<"$c" | sed -n "s/^$1=//p"; }
  built=$(get built) waited=$(get waited) hremote=$(get hit_remote) hlocal=$(get hit_local) failed=$(get failed)
  [ "$(get items)" = $((storm * keys)) ] || die "storm $srun: $(get items) items in the reports, expected $((storm * keys))"
  [ "$failed" = 0 ] || die "storm $srun: $failed keys failed"
  storm_counts+="built=$built,waited=$waited,hit-remote=$hremote,hit-local=$hlocal "
  [ "$built" = "$keys" ] || die "storm $srun: $built builds for $keys keys (waited $waited, hit-remote $hremote)"
  stop_kcached
  rm -rf "$tmp/storm-data$srun" "$tmp"/storm"$srun"-*
  echo "bench_warm: storm $srun/$storm_runs: $(fmt "$(lastof "$storm_s")"), $built builds for $keys keys (waited $waited, hit-remote $hremote)" >&2
done

# ---- report ----
cold_m=$(median <<<"$cold_s")
remote_m=$(median <<<"$remote_s")
curl_m=$(median <<<"$curl_s")
local_m=$(median <<<"$local_s")
storm_m=$(median <<<"$storm_s")
remote_in_m=$(median <<<"$remote_in")
local_in_m=$(median <<<"$local_in")
r1=$(awk -v a="$cold_m" -v b="$remote_m" 'BEGIN {printf "%.1f", a / b}')
r2=$(awk -v a="$remote_m" -v b="$curl_m" 'BEGIN {printf "%.2f", a / b}')
# The same ratios taken per round (the two runs of a round are seconds apart,
# so they share the machine's background load), then their median.
p1=$(paired "$cold_s" "$remote_s" "%.1f")
p2=$(paired "$remote_s" "$curl_s" "%.2f")
ok1=$(awk -v r="$r1" 'BEGIN {print (r >= 50) ? "met" : "MISSED"}')
ok2=$(awk -v r="$r2" 'BEGIN {print (r <= 2) ? "met" : "MISSED"}')

cmdline="BENCH_RUNS=$runs"
[ "$par" = 8 ] || cmdline+=" BENCH_PARALLEL=$par"
[ "$storm" = 32 ] || cmdline+=" BENCH_STORM=$storm"
[ "$storm_runs" = 1 ] || cmdline+=" BENCH_STORM_RUNS=$storm_runs"
cmdline+=" tests/bench/bench_warm.sh"

echo
echo "kcache warm $(basename "$(dirname "$manifest")"): $keys bundles ($nfiles files, $nblobs distinct blobs, $(kib "$blob_bytes")), NVRTC $nvrtc, $(nproc) CPUs (load average at the start: $load0), $(curl --version | head -n1 | cut -d' ' -f1-2), --parallel $par, median of $runs"
echo
echo "| run | median | samples (s) |"
echo "|---|---|---|"
echo "| cold warm: empty kcached, empty local cache ($keys built: $((nfiles)) NVRTC builds + upload) | $(fmt "$cold_m") | $(samples "$cold_s") |"
echo "| warm from kcached, empty local cache ($keys hit-remote, 0 built; in-process $(fmt "$remote_in_m")) | $(fmt "$remote_m") | $(samples "$remote_s") |"
echo "| plain curl of the same $nblobs blobs (one \`curl --parallel-max $par\`, HTTP/1.1 keep-alive, no verification) | $(fmt "$curl_m") | $(samples "$curl_s") |"
echo "| warm from the local cache ($keys hit-local; in-process $(fmt "$local_in_m")) | $(fmt "$local_m") | $(samples "$local_s") |"
echo "| cold / warm from kcached | ${r1}x (target >= 50x: $ok1) | median of per-round ratios: ${p1}x |"
echo "| warm from kcached / plain curl | ${r2}x (target <= 2x: $ok2) | median of per-round ratios: ${p2}x |"
echo "| startup storm: $storm concurrent \`kcache warm\`, each an empty local cache, empty kcached | $(fmt "$storm_m"); builds $built = keys $keys | $(samples "$storm_s"); ${storm_counts% } |"
echo
echo "command: $cmdline"
echo "  (kcached: $kcached; kcache: $kcache)"

fi


for shape in $shapes; do
  IFS=x read -r nb nf kib <<<"$shape"
  fs_shape "$nb" "$nf" "$kib"
done
if [ -n "$shapes" ]; then
  echo
  echo "kcache warm at scale: empty local cache, --parallel $par, median of $runs, on ${fs_desc:-?} ($(nproc) CPUs, load average at the start: $load0)"
  echo
  echo "| shape | warm --out DIR | warm (cache only) | floor: tar x of the same files | curl --parallel of the blobs | warm --out / tar x (<= 1.5x) | warm --out / curl (<= 1x) |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s' "$fs_rows"
  echo
  echo "command: KCACHE_DIR=$bench_fs BENCH_RUNS=$runs BENCH_DEMO=$demo BENCH_SHAPES=\"$shapes\" tests/bench/bench_warm.sh"
fi

if [ "$strict" = 1 ] && [ "$fs_missed" = 1 ]; then
  echo "bench_warm: a file-system target was missed (BENCH_STRICT=1)" >&2
  exit 1
fi
if [ "$demo" = 1 ] && [ "$strict" = 1 ] && { [ "$ok1" != met ] || [ "$ok2" != met ]; }; then
  echo "bench_warm: a target was missed (BENCH_STRICT=1)" >&2
  exit 1
fi
