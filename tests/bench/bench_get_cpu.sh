#!/usr/bin/env bash
# bench_get_cpu.sh: kcached CPU time per GET of one blob, for two or more
# kcached binaries side by side (old vs new), in interleaved wrk runs. On a
# shared machine req/s swings with the neighbours' load; the server's own
# utime+stime per request (from /proc) is steadier. Prints per binary the CPU
# us per GET and req/s of each run and their medians.
#
# Usage: tests/bench/bench_get_cpu.sh KCACHED_A KCACHED_B ...
#   env: SIZE (4096 bytes) RUNS (7) DUR (3s). wrk on CPU 0, servers on CPU 1
#   (taskset), --threads 1. Needs wrk, curl, sha256sum, taskset.
set -euo pipefail
runs=${RUNS:-7} dur=${DUR:-3s} sz=${SIZE:-4096}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-getcpu-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill $p 2>/dev/null; wait $p 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
ports=(); i=0
for b in "$@"; do
  mkdir -p $tmp/$i
  taskset -c 1 $b --listen 127.0.0.1:0 --port-file $tmp/$i/port --data-dir $tmp/$i/data --threads 1 --max-blob-bytes 64M >$tmp/$i/log 2>&1 &
  pids+=($!)
  for k in $(seq 100); do [ -s $tmp/$i/port ] && break; sleep 0.1; done
  ports+=($(cat $tmp/$i/port)); i=$((i+1))
done
head -c $sz /dev/urandom > $tmp/b; d=$(sha256sum $tmp/b | cut -c1-64)
for p in "${ports[@]}"; do curl -s -o /dev/null -X PUT --data-binary @$tmp/b http://127.0.0.1:$p/v1/blobs/$d; done
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
declare -A us rps
hz=$(getconf CLK_TCK)
for r in $(seq $runs); do
  for j in "${!ports[@]}"; do
    t0=$(ticks ${pids[$j]})
    out=$(taskset -c 0 wrk -t1 -c16 -d$dur http://127.0.0.1:${ports[$j]}/v1/blobs/$d)
    t1=$(ticks ${pids[$j]})
    n=$(echo "$out" | awk '/requests in/{print $1}')
    us[$j]+="$(awk -v t=$((t1-t0)) -v n=$n -v hz=$hz 'BEGIN{printf "%.2f", t/hz*1e6/n}') "
    rps[$j]+="$(echo "$out" | awk '/Requests\/sec/{printf "%.0f", $2}') "
  done
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for j in "${!ports[@]}"; do
  echo "[$j] $(basename ${@:$((j+1)):1}) size $sz: server CPU us/GET ${us[$j]}median $(med ${us[$j]}); req/s ${rps[$j]}median $(med ${rps[$j]})"
done
