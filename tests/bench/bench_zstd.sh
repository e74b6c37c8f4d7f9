#!/usr/bin/env bash
# bench_zstd.sh: what zstd at rest and on the wire buys, in one run.
#
# 1. Warm over a shaped link. The bench makes a network namespace and a veth
#    pair (host side 10.231.7.1, namespace side 10.231.7.2), shapes both
#    directions with `tc qdisc ... tbf rate R burst 256k latency 50ms`, and
#    runs two kcached in the namespace: A with --compress-level 3 (blobs held
#    compressed, sent as frames to clients that accept zstd), B with
#    --compress-level 0 (raw, as before the feature). A is filled by a cold
#    `kcache warm` (NVRTC builds, uploads) of each model; B gets the same
#    bundles copied over HTTP (content, raw). Then, per rate (1gbit, 10gbit)
#    and model, BENCH_RUNS warms from each server into an empty cache,
#    interleaved A/B, timed wall clock (process start to exit); medians.
#    Models: the demo model (deploy/examples/demo-mlp: 16 bundles, 48 NVRTC
#    cubins of ~12 KiB) and a synthetic one written here: SYN_BUCKETS shape
#    buckets x sm_80, sm_90a of one kernel with a long unrolled body (-DU=300
#    -lineinfo): real NVRTC cubins of ~95 KiB each.
# 2. Stored bytes: per model, the sum of its distinct blobs as held by A (the
#    length of a GET with Accept-Encoding: zstd) against their content's
#    size; /v1/stats bytes_used and bytes_raw of A and B.
# 3. GET throughput of incompressible 16 MiB blobs on loopback: 4 distinct
#    blobs, 3 GETs of each in one curl over keep-alive, from a kcached with
#    compression (request with Accept-Encoding: zstd) and, without the
#    feature, from BENCH_BASE_KCACHED (a kcached built before it; plain
#    request) when given, else from this kcached with --compress-level 0;
#    BENCH_GET_ROUNDS rounds, the order alternating, medians of MB/s. Also a
#    compressible 16 MiB blob from the compressing server, sent as the frame
#    and decoded on the fly.
#
# Targets: at 1 Gbit/s the warm of compressible cubins at least
# 2x faster with zstd; no more than 5% loss on incompressible blobs; stored
# bytes of the demo model's cubins at most 40% of raw. Printed with MET or
# MISSED; a missed target exits 1 only with BENCH_STRICT=1.
#
# Usage (root: netns, veth, tc): tests/bench/bench_zstd.sh [kcached [kcache]]
#   env: BENCH_RUNS (5) SYN_BUCKETS (48) BENCH_GET_ROUNDS (9) BENCH_PARALLEL
#        (8: kcache --parallel) BENCH_STRICT (0) BENCH_BASE_KCACHED (none)
# Needs: ip, tc, curl, python3, NVRTC (/usr/local/cuda). Everything it makes
# (the namespace, the veth pair, the servers by PID, the temporary
# directory) is removed at exit by a trap; it touches nothing else.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
kcached=${1:-$root/build/server/kcached}
kcache=${2:-$root/build/client/kcache}
runs=${BENCH_RUNS:-5}
syn_buckets=${SYN_BUCKETS:-48}
get_rounds=${BENCH_GET_ROUNDS:-9}
base=${BENCH_BASE_KCACHED:-}
par=${BENCH_PARALLEL:-8}
strict=${BENCH_STRICT:-0}
[ -x "$kcached" ] && [ -x "$kcache" ] || { echo "bench_zstd: need kcached and kcache binaries" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench_zstd: needs root (netns, tc)" >&2; exit 2; }
for t in ip tc curl python3; do
  command -v $t >/dev/null || { echo "bench_zstd: $t not found" >&2; exit 2; }
done
unset KCACHE_URL KCACHE_TOKEN KCACHE_CACERT KCACHE_DIR KCACHE_ALLOW_PLAINTEXT \
  KCACHED_TOKENS KCACHED_ALLOW_PLAINTEXT KCACHED_COMPRESS_LEVEL

ns=kcz$$ vh=kczh$$ vn=kczn$$
hip=10.231.7.1 nip=10.231.7.2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-bench-zstd-XXXXXX")
pids=()
made_ns=0 made_veth=0
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ $made_veth = 1 ] && ip link del "$vh" 2>/dev/null || true
  [ $made_ns = 1 ] && ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
die() { echo "bench_zstd: $*" >&2; exit 1; }

# ---- the link ----
ip -4 addr show | grep -q "10\.231\.7\." && die "10.231.7.0/30 is in use here"
ip netns add "$ns"; made_ns=1
ip link add "$vh" type veth peer name "$vn"; made_veth=1
ip link set "$vn" netns "$ns"
ip addr add $hip/30 dev "$vh"; ip link set "$vh" up
ip netns exec "$ns" ip addr add $nip/30 dev "$vn"
ip netns exec "$ns" ip link set "$vn" up
ip netns exec "$ns" ip link set lo up
shape() { # rate: both directions
  tc qdisc replace dev "$vh" root tbf rate "$1" burst 256k latency 50ms
  ip netns exec "$ns" tc qdisc replace dev "$vn" root tbf rate "$1" burst 256k latency 50ms
}

# ---- servers ----
# Off loopback kcached wants tokens: an admin token for the bench (the
# client sends it over plain HTTP on the private veth: --allow-plaintext).
"$kcached" token admin bench >"$tmp/tok"
export KCACHE_TOKEN=$(sed -n 1p "$tmp/tok") KCACHE_ALLOW_PLAINTEXT=1
sed -n 2p "$tmp/tok" >"$tmp/tokens"
start() { # name where(ns|lo) level -> sets url_<name>
  local name=$1 where=$2 level=$3 host=127.0.0.1 pre=(env)
  [ "$where" = ns ] && host=$nip &&
    pre=(ip netns exec "$ns" env KCACHED_TOKENS="$tmp/tokens" KCACHED_ALLOW_PLAINTEXT=1)
  mkdir -p "$tmp/$name"
  local bin=$kcached lv=(--compress-level "$level")
  [ "$level" = base ] && bin=$base && lv=()
  "${pre[@]}" "$bin" --listen $host:0 --port-file "$tmp/$name/port" \
    --data-dir "$tmp/$name/data" "${lv[@]}" \
    --max-blob-bytes 64M --scrub-rate 0 >>"$tmp/$name/log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do [ -s "$tmp/$name/port" ] && break; sleep 0.05; done
  [ -s "$tmp/$name/port" ] || die "kcached $name did not start"
  eval "url_$name=http://$host:$(cat "$tmp/$name/port")"
}

cat >"$tmp/kz.py" <<'EOF'
import json, os, sys, urllib.request
AUTH = {"Authorization": "Bearer " + os.environ.get("KCACHE_TOKEN", "")}
def get(url, hdrs=None):
    with urllib.request.urlopen(urllib.request.Request(url, headers=dict(AUTH, **(hdrs or {}))),
                                timeout=60) as r:
        return r.read()
def put(url, body):
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT",
                                                  headers=AUTH), timeout=60).read()
def blobs(url, model):
    seen = {}
    keys = [b["key"] for b in json.loads(get("%s/v1/models/%s" % (url, model)))["bundles"]]
    for k in keys:
        for f in json.loads(get("%s/v1/bundles/%s" % (url, k)))["files"]:
            seen[f["sha256"]] = int(f["size"])
    return keys, seen
cmd = sys.argv[1]
if cmd == "hash":        # MANIFEST -> model hash
    print(json.load(open(sys.argv[2]))["model"]["hash"])
elif cmd == "copy":      # FROM TO MODEL: bundles and blobs, content raw
    src, dst, model = sys.argv[2:5]
    keys, seen = blobs(src, model)
    for d in seen:
        put("%s/v1/blobs/%s" % (dst, d), get("%s/v1/blobs/%s" % (src, d)))
    for k in keys:
        put("%s/v1/bundles/%s" % (dst, k), get("%s/v1/bundles/%s" % (src, k)))
elif cmd == "stored":    # URL MODEL -> "held raw n" over its distinct blobs
    url, model = sys.argv[2:4]
    keys, seen = blobs(url, model)
    held = sum(len(get("%s/v1/blobs/%s" % (url, d), {"Accept-Encoding": "zstd"}))
               for d in seen)
    print(held, sum(seen.values()), len(seen))
elif cmd == "stats":     # URL -> "bytes_used bytes_raw"
    s = json.loads(get(sys.argv[2] + "/v1/stats"))
    print(s["bytes_used"], s.get("bytes_raw", s["bytes_used"]))
elif cmd == "report":    # REPORT -> "hit_remote built failed"
    r = json.load(open(sys.argv[2]))["counts"]
    print(r["hit-remote"], r["built"], r["failed"])
EOF
kz() { python3 "$tmp/kz.py" "$@"; }
now() { date +%s.%N; }
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

# ---- the synthetic model ----
syn=$tmp/syn
mkdir -p "$syn/kernels"
cat >"$syn/kernels/big.cu" <<'EOF'
// A synthetic kernel: the unrolled body makes a real cubin of ~95 KiB.
extern "C" __global__ void big(float *__restrict__ o,
                               const float *__restrict__ a) {
  int t = threadIdx.x + blockIdx.x * blockDim.x;
  float acc = a[t & 1023];
#pragma unroll
  for (int i = 0; i < U; i++)
    acc = fmaf(acc, a[(i * 37 + t * BATCH) & 1023],
               (float)(i % 13) * (float)SEQ);
  o[t] = acc;
}
EOF
python3 - "$syn/warmup.json" "$syn_buckets" <<'EOF'
import json, sys
n = int(sys.argv[2])
json.dump({"schema": "kcache.warmup/v1",
           "model": {"name": "syn", "hash": "5" * 63 + "a"},
           "archs": ["sm_80", "sm_90a"], "toolchain": {"app": "syn-1"},
           "kernels": [{"name": "big", "source": "kernels/big.cu",
                        "entries": ["big"], "options": ["-DU=300", "-lineinfo"]}],
           "buckets": [{"batch": 1 + i % 4, "seq": 64 * (i + 1)} for i in range(n)]},
          open(sys.argv[1], "w"))
EOF
demo=$root/deploy/examples/demo-mlp/warmup.json
models=(demo syn)
declare -A man=([demo]=$demo [syn]=$syn/warmup.json)

warm() { # manifest url dir -> prints "wall cpu" seconds (cpu: the client's
  # user+sys); checks all came from the server
  local rc=0 TIMEFORMAT='%3R %3U %3S'
  { time "$kcache" warm "$1" --url "$2" --cache-dir "$3" --parallel "$par" \
      --deadline 600 --json --strict --quiet >"$3.json" 2>"$3.err" || rc=$?; } 2>"$3.time"
  [ $rc = 0 ] || { tail -3 "$3.err" >&2; die "warm $1 from $2 exited $rc"; }
  awk '{printf "%.4f %.4f\n", $1, $2 + $3}' "$3.time"
}

start A ns 3
start B ns 0
echo "bench_zstd: filling A (NVRTC builds: the synthetic model takes a minute or two)" >&2
for m in "${models[@]}"; do
  "$kcache" warm "${man[$m]}" --url "$url_A" --cache-dir "$tmp/fill-$m" \
    --parallel 2 --deadline 1200 --strict --quiet >"$tmp/fill-$m.log" 2>&1 ||
    { tail -5 "$tmp/fill-$m.log" >&2; die "the cold warm of $m failed"; }
  kz copy "$url_A" "$url_B" "$(kz hash "${man[$m]}")"
done

declare -A res cpu
for rate in 1gbit 10gbit; do
  shape $rate
  for m in "${models[@]}"; do
    ta=() tb=() ca=() cb=()
    for r in $(seq "$runs"); do
      w= c=
      read -r w c < <(warm "${man[$m]}" "$url_A" "$tmp/w-$rate-$m-A-$r")
      [ -n "$c" ] || die "a warm from A failed"
      ta+=($w) ca+=($c)
      w= c=
      read -r w c < <(warm "${man[$m]}" "$url_B" "$tmp/w-$rate-$m-B-$r")
      [ -n "$c" ] || die "a warm from B failed"
      tb+=($w) cb+=($c)
      read -r hit built failed < <(kz report "$tmp/w-$rate-$m-A-$r.json")
      [ "$built" = 0 ] && [ "$failed" = 0 ] || die "a warm built or failed ($m)"
    done
    res[$rate,$m,A]=$(med "${ta[@]}") res[$rate,$m,B]=$(med "${tb[@]}")
    cpu[$rate,$m,A]=$(med "${ca[@]}") cpu[$rate,$m,B]=$(med "${cb[@]}")
    echo "bench_zstd: $rate $m: zstd ${ta[*]} (cpu ${ca[*]}) | raw ${tb[*]} (cpu ${cb[*]})" >&2
  done
done
tc qdisc del dev "$vh" root 2>/dev/null || true

declare -A held raw nb
for m in "${models[@]}"; do
  read -r held[$m] raw[$m] nb[$m] < <(kz stored "$url_A" "$(kz hash "${man[$m]}")")
done
read -r a_used a_raw < <(kz stats "$url_A")
read -r b_used b_raw < <(kz stats "$url_B")

# ---- GET throughput on loopback ----
start C lo 3
pid_C=${pids[-1]}
if [ -n "$base" ]; then start D lo base; else start D lo 0; fi
pid_D=${pids[-1]}
for i in 1 2 3 4; do
  head -c $((16 << 20)) /dev/urandom >"$tmp/r$i"
  d=$(sha256sum "$tmp/r$i" | cut -c1-64); rd[$i]=$d
  for u in "$url_C" "$url_D"; do
    curl -sf -o /dev/null -X PUT --data-binary @"$tmp/r$i" "$u/v1/blobs/$d"
  done
done
python3 - >"$tmp/c1" <<'EOF'
import sys
w = b"".join(b"mov.u32 %%r%d, %%tid.x; // %d\n" % (i % 97, i % 113)
             for i in range(700000))
sys.stdout.buffer.write(w[:16 << 20])
EOF
cd1=$(sha256sum "$tmp/c1" | cut -c1-64)
curl -sf -o /dev/null -X PUT --data-binary @"$tmp/c1" "$url_C/v1/blobs/$cd1"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# url pid header digests... -> "MB/s ms": MB/s of content (16 MiB each) over
# 3 GETs of each, and the server's CPU ms per GET (utime+stime from /proc:
# steadier than wall time when other work shares the CPUs)
tput() {
  local u=$1 pid=$2 h=$3 args=() n=0 c0 c1
  shift 3
  for _ in 1 2 3; do for d in "$@"; do args+=(-o /dev/null "$u/v1/blobs/$d"); n=$((n + 1)); done; done
  c0=$(ticks "$pid")
  curl -s ${h:+-H "$h"} -w '%{time_total}\n' "${args[@]}" >"$tmp/tput"
  c1=$(ticks "$pid")
  awk -v n=$n -v c=$((c1 - c0)) -v hz="$hz" '{t += $1}
    END {printf "%.1f %.2f\n", n * 16777216 / t / 1e6, c / hz * 1000 / n}' "$tmp/tput"
}
gz=() gr=() gc=() gd=() kz_=() kr=() kc=() kd=()
getz() { read -r a b < <(tput "$url_C" "$pid_C" "Accept-Encoding: zstd" "${rd[@]}"); gz+=($a) kz_+=($b); }
getr() { read -r a b < <(tput "$url_D" "$pid_D" "" "${rd[@]}"); gr+=($a) kr+=($b); }
for r in $(seq "$get_rounds"); do
  if [ $((r % 2)) = 1 ]; then getz; getr; else getr; getz; fi
  read -r a b < <(tput "$url_C" "$pid_C" "Accept-Encoding: zstd" "$cd1"); gc+=($a) kc+=($b)
  read -r a b < <(tput "$url_C" "$pid_C" "" "$cd1"); gd+=($a) kd+=($b)
done
echo "bench_zstd: GET MB/s incompressible zstd-server ${gz[*]} (cpu ms/GET ${kz_[*]}) | without ${gr[*]} (cpu ${kr[*]})" >&2

# ---- results ----
ok=1
verdict() { if [ "$1" = 1 ]; then echo MET; else ok=0; echo MISSED; fi; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", 100 * a / b}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }
ms() { awk -v a="$1" 'BEGIN{printf "%.0f ms", a * 1000}'; }
sp1=$(ratio "${res[1gbit,syn,B]}" "${res[1gbit,syn,A]}")
loss=$(awk -v z="$(med "${gz[@]}")" -v r="$(med "${gr[@]}")" 'BEGIN{printf "%.1f", 100 * (r - z) / r}')
closs=$(awk -v z="$(med "${kz_[@]}")" -v r="$(med "${kr[@]}")" 'BEGIN{printf "%.1f", 100 * (z - r) / r}')
demo_pct=$(pct "${held[demo]}" "${raw[demo]}")
echo
echo "| measure | with zstd | without | ratio |"
echo "|---|---|---|---|"
for rate in 1gbit 10gbit; do
  for m in "${models[@]}"; do
    echo "| warm, $m model (${nb[$m]} cubins, $((raw[$m] / 1024)) KiB), $rate: wall (client CPU) | $(ms "${res[$rate,$m,A]}") ($(ms "${cpu[$rate,$m,A]}")) | $(ms "${res[$rate,$m,B]}") ($(ms "${cpu[$rate,$m,B]}")) | $(ratio "${res[$rate,$m,B]}" "${res[$rate,$m,A]}")x faster |"
  done
done
for m in "${models[@]}"; do
  echo "| stored bytes, $m model's cubins | ${held[$m]} | ${raw[$m]} | $(pct "${held[$m]}" "${raw[$m]}")% |"
done
echo "| store bytes_used (all blobs and manifests) | $a_used | $b_used | $(pct "$a_used" "$b_used")% |"
echo "| GET 16 MiB incompressible, loopback, MB/s (without: ${base:+the kcached before the feature}${base:-this kcached, --compress-level 0}) | $(med "${gz[@]}") | $(med "${gr[@]}") | ${loss}% loss |"
echo "| the same, server CPU ms per GET | $(med "${kz_[@]}") | $(med "${kr[@]}") | ${closs}% more |"
echo "| GET 16 MiB compressible held as a frame: MB/s of content, frame sent / decoded by the server | $(med "${gc[@]}") | $(med "${gd[@]}") | |"
echo "| the same, server CPU ms per GET | $(med "${kc[@]}") | $(med "${kd[@]}") | |"
echo
echo "targets: warm of compressible cubins at 1 Gbit/s >= 2x faster: ${sp1}x $(verdict "$(awk -v s="$sp1" 'BEGIN{print (s >= 2)}')")"
echo "         loss on incompressible GETs <= 5%: ${loss}% in MB/s $(verdict "$(awk -v l="$loss" 'BEGIN{print (l <= 5)}')"), ${closs}% in server CPU per GET $(verdict "$(awk -v l="$closs" 'BEGIN{print (l <= 5)}')")"
echo "         demo cubins stored <= 40% of raw: ${demo_pct}% $(verdict "$(awk -v p="$demo_pct" 'BEGIN{print (p <= 40)}')")"
echo "(runs $runs; synthetic buckets $syn_buckets; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F))"
[ $ok = 1 ] || [ "$strict" != 1 ] || exit 1
