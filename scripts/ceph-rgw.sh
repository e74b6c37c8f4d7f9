#!/usr/bin/env bash
# ceph-rgw.sh: a throw-away single-node Ceph RADOS Gateway on loopback, the
# real S3 engine behind the S3 tier's tests.
#
#   scripts/ceph-rgw.sh start DIR   install if needed, start, print env lines
#   scripts/ceph-rgw.sh stop DIR    stop what `start DIR` started (pid files)
#   scripts/ceph-rgw.sh env DIR     print DIR/env again
#   scripts/ceph-rgw.sh rgw-stop DIR / rgw-start DIR
#                                   stop / restart radosgw alone (same port,
#                                   same data): "S3 is down" in tests
#
# One mon, one OSD on memstore (RAM; nothing survives `stop`), pools of size
# 1, radosgw on a free 127.0.0.1 port, one S3 user. Everything lives in DIR
# (config, logs, pid files, mon store); nothing outside it is touched except
# the Debian packages. DIR/env holds `export` lines:
#   KCACHE_S3_ENDPOINT=http://127.0.0.1:PORT  KCACHE_S3_REGION=us-east-1
#   AWS_ACCESS_KEY_ID=...  AWS_SECRET_ACCESS_KEY=...  AWS_REGION=...
#   AWS_ENDPOINT_URL=...  (the AWS CLI's name)
# DIR/env is mode 0600: it holds the secret key.
#
# Environment:
#   KCACHE_RGW_REGION    region (the zonegroup's api_name); default us-east-1
#   KCACHE_RGW_OWNER_PID when set, a watchdog stops the cluster once that
#                        process is gone (a test killed by its timeout leaves
#                        no daemons behind)
#   KCACHE_RGW_TIMEOUT   seconds each wait may take; default 60
#
# Exit status: 0 ok; 77 the packages are missing and cannot be installed
# (no apt-get, not root and no sudo, or apt failed): callers treat that as
# "skip"; 1 anything else (a daemon did not come up: the log tail is shown).
#
# Why these settings (Ceph 16.2.15, Debian 12):
#   ms_mon_client_mode = crc   radosgw otherwise waits 300 s for the mon
#   paxos_propose_interval 0.1 every pool radosgw creates is one osdmap
#                              proposal; the 1 s default makes start ~15 s
#   auth none                  a loopback test cluster; no keyrings to manage
#   pg_num 8, autoscale off    radosgw creates ~7 pools on one OSD: few PGs
#                              peer fast (and no mgr runs to autoscale)
#   api_name = region          SigV4 scopes and LocationConstraint use it
#   beast tcp_nodelay=1        else every small GET waits 40 ms (radosgw's
#                              Nagle against the client's delayed ACK):
#                              4 KiB GET 46 ms -> 2 ms here. Production RGWs
#                              in front of kcached want it too.
#   rgw_enable_lc_threads off  the lifecycle thread sleeps 5 s holding up
#                              radosgw's exit (tests set no lifecycle rules)
# Stop order is radosgw, OSD, mon (SIGTERM each, SIGKILL after 10 s):
# radosgw and the OSD block on a gone mon. A daemon counts as gone once it is
# a zombie: whatever init this machine runs may reap them seconds later.
# Timings here: install ~70 s (once), start 6-7 s, stop < 1 s.
set -euo pipefail

PKGS=(ceph-mon ceph-osd ceph-common radosgw)
TIMEOUT=${KCACHE_RGW_TIMEOUT:-60}
REGION=${KCACHE_RGW_REGION:-us-east-1}

die() { echo "ceph-rgw: $*" >&2; exit 1; }
skip() { echo "ceph-rgw: $*" >&2; exit 77; }

# --- install ---------------------------------------------------------------

install_pkgs() {
  local missing=() p st
  for p in "${PKGS[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || skip "no apt-get to install ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
      skip "not root and no passwordless sudo to install ${missing[*]}"
    sudo="sudo -n"
  fi
  echo "ceph-rgw: installing ${missing[*]}" >&2
  local t0=$SECONDS log
  log=$(mktemp)
  # The package lists may be stale or absent on a fresh machine: install
  # first, update and retry only if that fails (saves ~10 s when lists exist).
  local apt=($sudo env DEBIAN_FRONTEND=noninteractive apt-get -y -qq
             -o DPkg::Lock::Timeout=300 --no-install-recommends)
  if ! "${apt[@]}" install "${missing[@]}" >"$log" 2>&1; then
    if ! { $sudo apt-get update -qq -o DPkg::Lock::Timeout=300 >>"$log" 2>&1 &&
           "${apt[@]}" install "${missing[@]}" >>"$log" 2>&1; }; then
      tail -5 "$log" >&2; rm -f "$log"
      skip "apt-get could not install ${missing[*]}"
    fi
  fi
  rm -f "$log"
  echo "ceph-rgw: installed in $((SECONDS - t0)) s" >&2
}

# --- helpers ---------------------------------------------------------------

# A free loopback TCP port (the kernel picks; a tiny race with other
# programs is accepted, as for every test server here).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until "$@" succeeds, at most TIMEOUT seconds; $1 names what it waits for.
wait_for() {
  local what=$1 log=$2; shift 2
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "ceph-rgw: $what not up after ${TIMEOUT} s; last lines of $log:" >&2
      tail -20 "$log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.2
  done
}

# The pid in a pid file, if that process is alive and is one of ours: its
# command line names DIR's ceph.conf (guards against a recycled pid).
our_pid() {
  local f=$1 pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -F -- "$DIR/ceph.conf" >/dev/null || return 1
  echo "$pid"
}

ceph_() { timeout 20 ceph -c "$DIR/ceph.conf" --connect-timeout 10 "$@"; }
admin() { timeout 60 radosgw-admin -c "$DIR/ceph.conf" "$@"; }

# --- start -----------------------------------------------------------------

write_conf() {
  local mon_port=$1 rgw_port=$2 fsid=$3
  cat >"$DIR/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = v2:127.0.0.1:$mon_port
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
run_dir = $DIR/run
admin_socket = $DIR/run/\$name.asok
pid_file = $DIR/run/\$name.pid
log_file = $DIR/log/\$name.log
keyring = /dev/null
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_max_pg_per_osd = 1000
mon_warn_on_pool_no_redundancy = false
ms_bind_ipv6 = false

[mon.a]
public_addr = v2:127.0.0.1:$mon_port

[mon]
mon_data = $DIR/mon
mon_data_avail_crit = 0
mon_data_avail_warn = 0
paxos_propose_interval = 0.1
mon_allow_pool_delete = true

[osd]
osd_data = $DIR/osd
osd_objectstore = memstore
memstore_device_bytes = 2147483648
osd_class_load_list = *
osd_class_default_list = *

[client]
ms_mon_client_mode = crc
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
rgw_dns_name = localhost
rgw_enable_usage_log = false
rgw_enable_lc_threads = false
EOF
}

start_mon() {
  local mon_port=$1 fsid=$2
  # An explicit monmap: mon_host alone names the mon "noname-a", and mon.a
  # would not find itself in it.
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" \
    "$DIR/monmap" >>"$DIR/log/setup.log" 2>&1 || die "monmaptool failed"
  ceph-mon -c "$DIR/ceph.conf" -i a --mkfs --monmap "$DIR/monmap" >>"$DIR/log/setup.log" 2>&1 ||
    { tail -20 "$DIR/log/setup.log" >&2; die "ceph-mon --mkfs failed"; }
  ceph-mon -c "$DIR/ceph.conf" -i a >>"$DIR/log/setup.log" 2>&1 ||
    die "ceph-mon did not start (see $DIR/log/mon.a.log)"
  wait_for "mon" "$DIR/log/mon.a.log" ceph_ mon stat || exit 1
}

start_osd() {
  local id
  id=$(ceph_ osd create) || die "ceph osd create failed"
  [ "$id" = 0 ] || die "unexpected OSD id $id"
  ceph_ osd crush add osd.0 1 root=default host=localhost >>"$DIR/log/setup.log" 2>&1 ||
    die "ceph osd crush add failed"
  ceph-osd -c "$DIR/ceph.conf" -i 0 --mkfs >>"$DIR/log/setup.log" 2>&1 ||
    { tail -20 "$DIR/log/setup.log" >&2; die "ceph-osd --mkfs failed"; }
  ceph-osd -c "$DIR/ceph.conf" -i 0 >>"$DIR/log/setup.log" 2>&1 ||
    die "ceph-osd did not start (see $DIR/log/osd.0.log)"
  osd_up() { ceph_ osd dump 2>/dev/null | grep '^osd\.0 up' >/dev/null; }
  wait_for "osd.0" "$DIR/log/osd.0.log" osd_up || exit 1
}

# The default zonegroup's api_name becomes the region, before radosgw starts,
# so it never serves with the wrong one.
set_region() {
  admin zonegroup get --rgw-zonegroup=default >"$DIR/zonegroup.json" 2>>"$DIR/log/setup.log" ||
    die "radosgw-admin zonegroup get failed (see $DIR/log/setup.log)"
  python3 - "$DIR/zonegroup.json" "$REGION" <<'EOF'
import json, sys
path, region = sys.argv[1], sys.argv[2]
zg = json.load(open(path))
zg["api_name"] = region
json.dump(zg, open(path, "w"))
EOF
  admin zonegroup set --rgw-zonegroup=default --infile "$DIR/zonegroup.json" \
    >>"$DIR/log/setup.log" 2>&1 || die "radosgw-admin zonegroup set failed"
}

start_rgw() {
  local port=$1
  radosgw -c "$DIR/ceph.conf" -n client.rgw.a >>"$DIR/log/setup.log" 2>&1 ||
    die "radosgw did not start (see $DIR/log/client.rgw.a.log)"
  # Any HTTP answer (an anonymous ListBuckets) means the frontend serves.
  wait_for "radosgw" "$DIR/log/client.rgw.a.log" \
    curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$port/" || exit 1
}

make_user() {
  local port=$1 ak sk
  ak=$(head -c 15 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F | cut -c1-20)
  sk=$(head -c 30 /dev/urandom | od -An -tx1 | tr -d ' \n' | cut -c1-40)
  admin user create --uid=kcache --display-name=kcache \
    --access-key="$ak" --secret-key="$sk" >/dev/null 2>>"$DIR/log/setup.log" ||
    die "radosgw-admin user create failed (see $DIR/log/setup.log)"
  (umask 077
   cat >"$DIR/env" <<EOF
export KCACHE_S3_ENDPOINT=http://127.0.0.1:$port
export KCACHE_S3_REGION=$REGION
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_REGION=$REGION
export AWS_ACCESS_KEY_ID=$ak
export AWS_SECRET_ACCESS_KEY=$sk
EOF
  )
}

# Stops the cluster when the owner process is gone (see the header).
start_watchdog() {
  local owner=$1
  [[ $owner =~ ^[0-9]+$ ]] || die "KCACHE_RGW_OWNER_PID is not a pid: $owner"
  (
    trap '' HUP
    while kill -0 "$owner" 2>/dev/null && [ -e "$DIR/run" ]; do sleep 1; done
    "$0" stop "$DIR" >/dev/null 2>&1 || true
  ) </dev/null >/dev/null 2>&1 &
  echo $! >"$DIR/run/watchdog.pid"
}

cmd_start() {
  if our_pid "$DIR/run/client.rgw.a.pid" >/dev/null && [ -s "$DIR/env" ]; then
    grep -v SECRET "$DIR/env"; return 0   # already running: idempotent
  fi
  install_pkgs
  for b in ceph-mon ceph-osd ceph monmaptool radosgw radosgw-admin python3 curl; do
    command -v "$b" >/dev/null || die "$b not found after install"
  done
  local t0=$SECONDS
  mkdir -p "$DIR"
  [ -d "$DIR/run" ] && cmd_stop   # leftovers of an earlier start in DIR
  rm -rf "$DIR/mon" "$DIR/osd" "$DIR/run" "$DIR/log" "$DIR/env" "$DIR/monmap" \
    "$DIR/port"
  mkdir -p "$DIR/mon" "$DIR/osd" "$DIR/run" "$DIR/log"
  local mon_port rgw_port fsid
  mon_port=$(free_port); rgw_port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$mon_port" "$rgw_port" "$fsid"
  echo "$rgw_port" >"$DIR/port"
  # A failed start leaves nothing running.
  trap 'rc=$?; [ $rc -eq 0 ] || "$0" stop "$DIR" >/dev/null 2>&1; exit $rc' EXIT
  start_mon "$mon_port" "$fsid"
  start_osd
  make_user "$rgw_port"   # first: its full init creates the default zonegroup
  set_region
  start_rgw "$rgw_port"
  [ -n "${KCACHE_RGW_OWNER_PID:-}" ] && start_watchdog "$KCACHE_RGW_OWNER_PID"
  trap - EXIT
  echo "ceph-rgw: started in $((SECONDS - t0)) s at http://127.0.0.1:$rgw_port (logs: $DIR/log)" >&2
  grep -v SECRET "$DIR/env"
}

# --- stop ------------------------------------------------------------------

# A process that exited but is not reaped yet (a zombie: our daemons are
# children of whatever init this machine has, which may reap slowly) is gone.
alive() {
  local st
  st=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# Sends SIG, waits for the exit (10 s), then KILL.
stop_one() {
  local f=$1 sig=$2 pid i t0=$SECONDS
  pid=$(our_pid "$f") || { rm -f "$f"; return 0; }
  kill -"$sig" "$pid" 2>/dev/null || true
  for i in $(seq 100); do
    alive "$pid" || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  echo "stop $(basename "$f" .pid): $((SECONDS - t0)) s" >>"$DIR/log/setup.log"
  rm -f "$f"
}

cmd_stop() {
  [ -d "$DIR/run" ] || return 0
  local t0=$SECONDS
  stop_one "$DIR/run/client.rgw.a.pid" TERM
  stop_one "$DIR/run/osd.0.pid" TERM
  stop_one "$DIR/run/mon.a.pid" TERM
  # The watchdog is a shell of ours, not a ceph daemon: its command line does
  # not name the conf, so check it is still this script before killing it.
  local w
  if [ -s "$DIR/run/watchdog.pid" ]; then
    w=$(cat "$DIR/run/watchdog.pid")
    if [[ $w =~ ^[0-9]+$ ]] && [ "$w" != "$$" ] && [ "$w" != "$PPID" ] &&
       tr '\0' ' ' <"/proc/$w/cmdline" 2>/dev/null | grep -F "ceph-rgw" >/dev/null; then
      kill -TERM "$w" 2>/dev/null || true
    fi
    rm -f "$DIR/run/watchdog.pid"
  fi
  rm -rf "$DIR/run" "$DIR/env"
  echo "ceph-rgw: stopped in $((SECONDS - t0)) s" >&2
}

cmd_rgw_stop() {
  [ -d "$DIR/run" ] || die "no cluster started in $DIR"
  stop_one "$DIR/run/client.rgw.a.pid" TERM
}

cmd_rgw_start() {
  [ -s "$DIR/port" ] && our_pid "$DIR/run/mon.a.pid" >/dev/null ||
    die "no cluster started in $DIR"
  our_pid "$DIR/run/client.rgw.a.pid" >/dev/null && return 0
  start_rgw "$(cat "$DIR/port")"
}

# --- main ------------------------------------------------------------------

usage="usage: $0 start|stop|env|rgw-stop|rgw-start DIR"
[ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
mkdir -p "$2" 2>/dev/null || true
DIR=$(cd "$2" 2>/dev/null && pwd) || die "cannot use directory $2"
case $1 in
  start) cmd_start ;;
  stop) cmd_stop ;;
  env) [ -s "$DIR/env" ] || die "no cluster started in $DIR"; cat "$DIR/env" ;;
  rgw-stop) cmd_rgw_stop ;;
  rgw-start) cmd_rgw_start ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
