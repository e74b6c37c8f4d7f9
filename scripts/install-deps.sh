#!/usr/bin/env bash
# install-deps.sh: installs every build and test dependency of kcache on
# Debian 12 with apt-get. Idempotent; prints nothing when all is there.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git ca-certificates curl
  liblmdb-dev libzstd-dev lmdb-utils libmicrohttpd-dev libcurl4-openssl-dev libssl-dev
  libjansson-dev libcmocka-dev libexpat1-dev
  python3 python3-venv python3-jsonschema python3-yaml openssl locales
  wrk nginx-light valgrind clang clang-format libclang-rt-14-dev systemd debootstrap
  redis-tools python3-redis redis-server
  chromium
)

missing=()
for p in "${pkgs[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$st" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
